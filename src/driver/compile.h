/* The compile driver (compile.c): every stage between an imported graph and the graph the
 * executor runs, in one function, af_compile. The session (session.c) calls it for an ONNX
 * model and runs the result; `autofusion compile` writes the result as an .afm file.
 *
 *   shapes  ->  simplify  ->  [quantize]  ->  canonicalize, fuse, simplify  ->  lower, layout, simplify,
 *   precision, pack  ->  plan
 *   (passes/)   (passes/)     (passes/, fusion/)                 (lower/)          (runtime/)
 *
 * The unfused graph (no_fusion: the baseline of `bench --compare` and of verify) runs every
 * stage but the fusion ones (canonicalize, fuse and the simplify after them).
 *
 * Ownership: an af_compiled owns its report (when fused) and its plan.
 *
 * Invariant: the stages run in the order of compile.c's table and nowhere else; after af_compile
 * the graph is what the executor runs and the plan belongs to it. */
#ifndef AF_DRIVER_COMPILE_H
#define AF_DRIVER_COMPILE_H

#include "autofusion.h"
#include "fusion/fusion.h"
#include "lower/lower.h"
#include "passes/passes.h"
#include "runtime/plan.h"

/* What a compile made besides the graph itself. */
typedef struct af_compiled {
    bool fused;              /* the optimisation ran: report holds what it did */
    af_fusion_report report;
    const char *precision;   /* the mode's canonical name (static) */
    af_plan *plan;           /* the memory plan of the final graph */
} af_compiled;

/* Compile g (imported from `file`) in place with the options of the session API: input shapes,
 * the fusion switches (--fusion_switch_file, then the environment, then --disable_fusion), the
 * precision mode; no_fusion skips the fusion stages (not the first simplify) and no_lower the
 * lowering. On error nothing is left to free in out. */
af_status af_compile(af_graph *g, const char *file, const af_options *opt, af_compiled *out,
                     af_error *err);
/* The same with the calibrated ranges of --precision_mode=int8 (driver/calibrate.h; NULL for
 * other modes, an error under int8): after the first simplify the graph is quantized (QDQ form,
 * passes/quantize.c), then fused and lowered as any other. */
af_status af_compile_with(af_graph *g, const char *file, const af_options *opt,
                          const af_quant_table *calib, af_compiled *out, af_error *err);
void af_compiled_free(af_compiled *c);

/* The stages in two halves, for tests and tools that run part of the order: the optimisation
 * (simplify, canonicalize, fuse, simplify; cfg NULL: every rule on; rep may be NULL), and the
 * lowering (lower, layout, simplify, precision, pack; prec NULL: fp32), which does nothing
 * under AUTOFUSION_ISA=reference. Both need shapes inferred first (af_graph_infer_shapes). */
af_status af_optimize(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                      af_error *err);
/* The optimisation without the fusion: what the unfused graph gets (folding, copies, dead code). */
af_status af_simplify(af_graph *g, af_error *err);
af_status af_lower(af_graph *g, const af_precision_cfg *prec, af_error *err);

/* Fix the declared dims of g's inputs from "name:1,3,224,224;name2:4,5" (--input_shape) and
 * infer shapes again. */
af_status af_apply_input_shape(af_graph *g, const char *spec, af_error *err);

#endif
