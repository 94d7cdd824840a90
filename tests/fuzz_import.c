/* libFuzzer target for the importer: any bytes are loaded as a model and freed. The importer
 * must never crash, leak or read outside the input, whatever the bytes (run under ASan+UBSan).
 *
 *     build-fuzz/tests/fuzz_import -max_total_time=60 CORPUS_DIR
 *
 * A corpus of small valid models makes the fuzzer reach deep quickly, e.g. the model.onnx files
 * of the conformance suite and of tests/gen_bad_models.py. */
#include "onnx/onnx.h"
#include "passes/passes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    af_model *m = NULL;
    af_error err;
    /* The importer, and the shapes stage that reads what it built. */
    if (af_model_load_bytes(data, size, "fuzz.onnx", &m, &err) == AF_OK) {
        (void)af_graph_infer_shapes(m->graph, &err);
        af_model_free(m);
    }
    return 0;
}
