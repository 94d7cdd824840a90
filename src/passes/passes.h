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

/* Shapes (shapes.c): shape and dtype inference over g and its subgraphs with what is known
 * (declared types, constant values), through each op's shape function (kernels/fast/dispatch.h);
 * unknown dims stay -1. A dim the model declares is kept where inference cannot tell; a
 * contradiction between the two is an error. */
af_status af_graph_infer_shapes(af_graph *g, af_error *err);
/* The same for one node (its subgraphs included), from its inputs' types as they are now. */
af_status af_node_infer_shape(af_node *n, af_error *err);

/* Simplify (simplify.c, fold.c, fold_if.c): constant folding, including Shape/Size of values
 * whose dims are all known (so shape arithmetic disappears once shapes are static); an If whose
 * condition is then a constant replaced by the branch it takes; removal of copies
 * (Identity, inference-mode Dropout, Cast to the input's own type); removal of dead nodes.
 * Repeats until nothing changes. */
af_status af_pass_simplify(af_graph *g, af_error *err);
/* The same; with keep_qweights, a DequantizeLinear of 8-bit constant weights read by a Conv,
 * MatMul or Gemm is not folded (the simplify before fusion: the int8 rule reads it). */
af_status af_pass_simplify_ex(af_graph *g, bool keep_qweights, af_error *err);
/* float16/bfloat16 values and ops computed in float32, the model's interface cast at its edges
 * (widen.c): the stage before shapes. */
af_status af_pass_widen_halves(af_graph *g, af_error *err);

/* Canonicalize (canonicalize.c): decomposed forms become one op each, so the fuser matches one
 * form: LayerNormalization from ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add], Gelu
 * (ai.autofusion) from its Erf and Tanh forms, Silu (ai.autofusion) from x*Sigmoid(x),
 * HardSwish from x*HardSigmoid(x) and x*Clip(x+3,0,6)/6, QuantizeDequantize (fake quantization)
 * from QuantizeLinear -> DequantizeLinear pairs (qdq.c). A rewrite fires only when every
 * shape, constant, attribute and consumer count it relies on checks out. */
af_status af_pass_canonicalize(af_graph *g, af_error *err);

/* ---- int8 quantization (quantize.c) ---------------------------------------------------------
 * --precision_mode=int8: the float32 graph in QDQ form from calibrated activation ranges. */

/* The ranges calibration measured (driver/calibrate.c), by value name. */
typedef struct af_quant_table {
    int n;
    char **names;   /* the activations af_quant_activations lists */
    float *lo, *hi; /* their calibrated ranges */
    int samples;    /* calibration samples run */
    char method[48]; /* "minmax", "percentile 99.99", "entropy" */
    /* Weight codes within [-weight_max, weight_max]: 127, or 63 (7 bits) for CPUs whose int8
     * products are exact only so (no AVX512_VNNI: lower/int8.c); 0 means 127. */
    int weight_max;
} af_quant_table;

/* What the pass decided for one op: the Conv/MatMul/Gemm nodes (quantized, or float32 with
 * why), the products of two activations, Softmax and LayerNormalization (float32, why). */
typedef struct af_quant_decision {
    char *node, *op, *why; /* owned; why NULL when quantized */
    bool int8;
} af_quant_decision;

typedef struct af_quant_result {
    af_quant_decision *e;
    int n, nint8;
    bool per_tensor_weights; /* opset < 13: one weight scale per tensor */
} af_quant_result;
void af_quant_result_free(af_quant_result *r);

/* The activations calibration observes in g (after the first simplify): the float input 0 of
 * every Conv/MatMul/Gemm with constant float32 weights (model inputs aside) and its output
 * after its Relu/Clip, and both inputs of each residual Add whose sum such an op reads. *out
 * is af_malloc'd (af_free it); the values belong to g. */
af_status af_quant_activations(const af_graph *g, const af_value ***out, int *n, af_error *err);
/* Rewrite g in QDQ form from the ranges in t; keep_fp32 (may be NULL) names nodes or op types
 * that stay float32 (an unknown name is AF_ERR_INVALID_ARG). res receives the decisions (free
 * with af_quant_result_free; nothing to free on error). */
af_status af_pass_quantize(af_graph *g, const af_quant_table *t, const char *keep_fp32,
                           af_quant_result *res, af_error *err);

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
