/* The graph passes that run before and after fusion, and the pipeline that orders them.
 *
 * Every pass keeps the IR invariants of ir.h (af_graph_verify holds after it), keeps the names
 * and order of graph outputs, computes the same outputs as the graph it was given (up to float
 * rounding), and visits If/Loop/Scan bodies too. A pass never writes through the data of an
 * existing constant: that memory may be a read-only mapping of the model file.
 */
#ifndef AF_PASSES_H
#define AF_PASSES_H

#include "ir/ir.h"

struct af_fusion_config;
struct af_fusion_report;

/* Shapes (shapes.c): shape and dtype inference over g and its subgraphs with what is known
 * (declared types, constant values), through each op's shape function (kernels/fast/dispatch.h);
 * unknown dims stay -1. A dim the model declares is kept where inference cannot tell; a
 * contradiction between the two is an error. */
af_status af_graph_infer_shapes(af_graph *g, af_error *err);

/* Simplify (simplify.c, fold.c): constant folding, including Shape/Size of values whose dims
 * are all known (so shape arithmetic disappears once shapes are static); removal of copies
 * (Identity, inference-mode Dropout, Cast to the input's own type); removal of dead nodes.
 * Repeats until nothing changes. */
af_status af_pass_simplify(af_graph *g, af_error *err);

/* Canonicalize (canonicalize.c): decomposed forms become one op each, so the fuser matches one
 * form: LayerNormalization from ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add], Gelu
 * (ai.autofusion) from its Erf and Tanh forms, Silu (ai.autofusion) from x*Sigmoid(x),
 * HardSwish from x*HardSigmoid(x) and x*Clip(x+3,0,6)/6. A rewrite fires only when every
 * shape, constant, attribute and consumer count it relies on checks out. */
af_status af_pass_canonicalize(af_graph *g, af_error *err);

/* Lowering (lower.c): Conv, MatMul and Gemm become FusedConv / FusedMatMul with an empty
 * epilogue, inference BatchNormalization a FusedElementwise scale-and-shift. */
af_status af_pass_lower(af_graph *g, af_error *err);
/* Layout (layout.c): 2-D convolutions and the ops between them channels-last (NHWC), with
 * reorders only at the edges of each channels-last region. */
af_status af_pass_layout(af_graph *g, af_error *err);
/* Packing (lower.c): constant GEMM weights of FusedMatMul and channels-last FusedConv in the
 * panel order of kernels/gemm.h (depthwise weights [KH * KW][M]); then a channels-last
 * SqueezeExcite read only by a packed 1x1 conv hands its gate to that conv, which applies it to
 * its weights (when they are smaller than X), so that X * gate is never written; and when X
 * comes from a depthwise conv, that conv also writes X's means for the SqueezeExcite. */
af_status af_pass_pack(af_graph *g, af_error *err);

/* Precision modes (precision.c): --precision_mode's names and ATC's aliases. */
typedef enum af_precision { AF_PREC_FP32, AF_PREC_BF16, AF_PREC_FP16, AF_PREC_MIXED } af_precision;
/* The mode a name means ("fp32", "bf16", "fp16", "mixed", "force_fp32", "allow_mix_precision",
 * ...); -1 when unknown. */
int af_precision_parse(const char *name);
const char *af_precision_name(af_precision p);
/* False (with the reason) when this CPU cannot run the mode's low-precision arithmetic. */
bool af_precision_supported(af_precision p, const char **why);
typedef struct af_precision_cfg {
    af_precision mode;
    const char *keep_fp32; /* "A,B": rules, node names or op types that stay fp32 (may be NULL) */
} af_precision_cfg;
/* Mark each GEMM core with the precision it runs in (see precision.c); cfg NULL: fp32. An
 * unknown --keep_fp32 name is AF_ERR_INVALID_ARG. */
af_status af_pass_precision(af_graph *g, const af_precision_cfg *cfg, af_error *err);

/* The whole pipeline, in order (src/passes/pipeline.c). */
af_status af_optimize(af_graph *g, const struct af_fusion_config *cfg,
                      struct af_fusion_report *rep, af_error *err);
/* The lowering stage, after af_optimize or on its own for the unfused graph: lower, layout,
 * dead-code removal, precision (prec may be NULL: fp32), pack. Does nothing under
 * AF_ISA_REFERENCE (kernels/cpu.h). */
af_status af_lower(af_graph *g, af_error *err);
af_status af_lower_precision(af_graph *g, const af_precision_cfg *prec, af_error *err);

/* ---- opset-independent readers (rewrite.c) --------------------------------------------------
 * Kernels choose between an op's attribute form and its input form by the model's opset, so
 * the passes leave those forms as they are and read them through these instead. */

/* Clip's bounds: attributes "min"/"max" before opset 11, constant scalar inputs 1 and 2 from
 * it. An absent bound is -inf / +inf. False when a bound is present but not a constant scalar. */
bool af_node_clip_bounds(const af_node *n, double *lo, double *hi);

/* The "axes" of a Reduce*, Squeeze or Unsqueeze node: the attribute up to the opset where it
 * became input 1 (13 for ReduceSum, Squeeze and Unsqueeze, 18 for the other Reduce ops), that
 * constant input from then on. Fills axes[0..*count) as written (not normalised); *count = -1
 * when the node gives no axes. False for other ops, or axes that are not constant integers, or
 * more than `max` of them. */
bool af_node_axes(const af_node *n, int64_t *axes, int max, int *count);

#endif
