/* The lowering stage (this folder): after fusion, the graph is rewritten for the fast kernels.
 * Conv, MatMul and Gemm cores become FusedConv / FusedMatMul, 2-D convolution regions run
 * channels-last, GEMM cores are marked with the precision they run in, and constant weights are
 * packed in the GEMM core's panel order. The driver (driver/compile.c) runs these in order, and
 * not at all under AUTOFUSION_ISA=reference. Each pass keeps the invariants of passes/passes.h,
 * visits the bodies of If, Loop and Scan as graphs of their own (recursively), and reads the
 * values a body captures from enclosing graphs like inputs, never rewriting them.
 */
#ifndef AF_LOWER_H
#define AF_LOWER_H

#include "ir/ir.h"

/* Lowering (lower.c): Conv, MatMul and Gemm become FusedConv / FusedMatMul with an empty
 * epilogue, inference BatchNormalization a FusedElementwise scale-and-shift. */
af_status af_pass_lower(af_graph *g, af_error *err);
/* Layout (layout.c): 2-D convolutions and the ops between them channels-last (NHWC), with
 * reorders only at the edges of each channels-last region. */
af_status af_pass_layout(af_graph *g, af_error *err);
/* Packing (lower.c): constant GEMM weights of FusedMatMul and channels-last FusedConv in the
 * panel order of kernels/fast/gemm.h (depthwise weights [KH * KW][M]); then a channels-last
 * SqueezeExcite read only by a packed 1x1 conv hands its gate to that conv, which applies it to
 * its weights (when they are smaller than X), so that X * gate is never written; and when X
 * comes from a depthwise conv, that conv also writes X's means for the SqueezeExcite. */
af_status af_pass_pack(af_graph *g, af_error *err);

/* Precision modes (precision.c): --precision_mode's names and ATC's aliases. */
/* int8 is not a lowering decision: the graph itself is quantized before fusion (QDQ form,
 * passes/quantize.c, calibrated by driver/calibrate.c); the precision pass leaves it alone. */
typedef enum af_precision {
    AF_PREC_FP32,
    AF_PREC_BF16,
    AF_PREC_FP16,
    AF_PREC_MIXED,
    AF_PREC_INT8
} af_precision;
/* The mode a name means ("fp32", "bf16", "fp16", "mixed", "int8", "force_fp32", "allow_mix_precision",
 * ...); -1 when unknown. */
int af_precision_parse(const char *name);
const char *af_precision_name(af_precision p);
/* False (with the reason) when this CPU cannot run the mode's low-precision arithmetic. */
bool af_precision_supported(af_precision p, const char **why);
typedef struct af_precision_cfg {
    af_precision mode;
    const char *keep_fp32; /* "A,B": rules, node names or op types that stay fp32 (may be NULL) */
    /* the machine's calibrated GEMM rates (runtime/machine.c), FLOP/s (int8: operations/s);
     * 0 when not measured */
    double gemm_flops, gemm_bf16_flops, gemm_int8_ops;
} af_precision_cfg;
/* Mark each GEMM core with the precision it runs in (see precision.c); cfg NULL: fp32. An
 * unknown --keep_fp32 name is AF_ERR_INVALID_ARG. */
af_status af_pass_precision(af_graph *g, const af_precision_cfg *cfg, af_error *err);

/* Does g (or a body in it) hold a FusedConv / FusedMatMul in the int8 form (quant = 1)? */
bool af_graph_has_quant(const af_graph *g);
/* Where each int8-form node runs (int8.c): "precision" = "int8" on the U8S8 GEMM core when this
 * CPU has AVX512_VNNI, cfg's int8 rate is at least 1.2x its fp32 rate (cfg NULL or rates 0: not
 * measured, VNNI decides) and the kernels take the node; else rewritten to float32 (W
 * dequantized, X through a QuantizeDequantize) with "precision_why". Runs before the layout
 * pass. */
af_status af_pass_int8(af_graph *g, const af_precision_cfg *cfg, af_error *err);
/* Does p's epilogue program end with a fake quantization? Its scale and zero point then. */
bool af_last_fq(const af_node *p, float *s, int *z);
/* Codes (codes.c): an activation between int8 convolutions stored as its uint8 codes when its
 * producer's epilogue ends with its readers' input quantization and every kernel involved
 * takes codes (y_codes = 1 on the producer, the value UINT8). Runs last. */
af_status af_pass_codes(af_graph *g, af_error *err);

#endif
