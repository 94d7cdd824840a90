/* libFuzzer target for compilation: any bytes are imported, then simplified, canonicalized and
 * fused (the whole optimisation pipeline), lowered for the fast kernels (layout, packing),
 * memory-planned (the plan must pass its own checker) and freed. Passes are attack surface too: a rule must
 * check every shape and attribute it relies on, so no input may crash, leak or break the IR
 * (af_optimize verifies it after every pass in this debug build).
 *
 *     build-fuzz/tests/fuzz_compile -max_total_time=60 CORPUS_DIR
 */
#include "fusion/fusion.h"
#include "driver/compile.h"
#include "runtime/machine.h"
#include "onnx/onnx.h"
#include "passes/passes.h"
#include "runtime/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    af_model *m = NULL;
    af_error err;
    if (af_model_load_bytes(data, size, "fuzz.onnx", &m, &err) != AF_OK) return 0;
    if (af_graph_infer_shapes(m->graph, &err) != AF_OK) {
        af_model_free(m);
        return 0;
    }
    af_fusion_report rep;
    af_fusion_report_init(&rep, "fuzz.onnx", af_machine_get());
    if (af_optimize(m->graph, NULL, &rep, &err) == AF_OK && af_lower(m->graph, NULL, &err) == AF_OK) {
        af_plan *p = NULL;
        if (af_plan_build(m->graph, &p, &err) == AF_OK && af_plan_check(m->graph, p, &err))
            abort(); /* a plan that fails its own check is our bug */
        af_plan_free(p);
    }
    af_fusion_report_free(&rep);
    af_model_free(m);
    return 0;
}
