/* What the fused kernels (fused_conv.c, fused_matmul.c, fused_misc.c) share: the direct
 * convolution of one output row, used by FusedConv and ConvPoolFc, and input checks.
 *
 * Invariant: fused_conv_setup accepts only float32 operands whose shapes agree with the node's Conv
 * attributes, so fused_conv_row reads only inside X, W and B. */
#ifndef AF_KERNELS_FUSED_H
#define AF_KERNELS_FUSED_H

#include "kernels/ref/epilogue.h"
#include "kernels/ref/nn_common.h"

/* The int8 form of FusedConv / FusedMatMul (fused_quant.c): quant = 1, x_scale, x_zero_point
 * (uint8 domain) and w_scale (1 value or one per output channel) over an INT8 W. */
typedef struct fused_quant {
    bool on;
    float x_scale;
    int x_zero;           /* [0, 255] */
    const float *w_scale; /* the node's attribute (nw_scale values) */
    int nw_scale;
} fused_quant;


/* A float32 convolution ready to run: Conv's geometry over X [N, C, spatial...] and
 * W [M, C/group, k...] (spatial dims padded in front to NN_MAXSP), plus bias [M] or NULL, and
 * the scratch of fused_conv_row. */
typedef struct fused_conv {
    nn_window w;
    int64_t batch, cin, cout, group, cg, mg;
    int64_t row; /* output row length: w.out[NN_MAXSP - 1] */
    const float *x, *wt, *b;
    af_tensor y; /* output type [N, M, out...] (no data) */
    double *acc; /* one output row of accumulators */
    int64_t *kw_lo, *kw_hi; /* per kernel column kw: the output columns [lo, hi) it reaches */
    int64_t in_lo, in_hi;   /* the columns every kernel column reaches (in_lo == in_hi: none) */
    bool grouped_taps;      /* interior long enough for taps to share passes (fused_conv.c) */
} fused_conv;

/* Check X = in[0], W = in[1], B = in[2] (optional) with the node's Conv attributes (group,
 * strides, dilations, pads, auto_pad, kernel_shape) at run time, fill c and allocate its
 * scratch. Call fused_conv_release afterwards, also when this fails. */
af_status fused_conv_setup(const af_node *n, const af_tensor *const *in, fused_conv *c, af_error *err);
void fused_conv_release(fused_conv *c);

/* Output row (b, m, od, oh, all ow) of the convolution, bias added, into row[0..c->row). */
void fused_conv_row(const fused_conv *c, int64_t b, int64_t m, int64_t od, int64_t oh, float *row);

/* Inputs and geometry of one FusedMatMul. Batch dims are the output's leading `nb` dims; A and
 * B batch strides are 0 along broadcast dims. A is [.., M, K] (or [.., K, M] with trans_a),
 * B [.., K, N] (or [.., N, K] with trans_b); 1-D operands have no M or N dim. */
typedef struct fused_mm {
    const af_tensor *a, *b, *bias, *lns, *lnb;
    bool ta, tb, a1, b1; /* trans flags; A or B 1-D */
    bool rms;            /* ln_rms: the prologue is an RMSNorm (no mean, no ln_bias) */
    int64_t m, k, n;
    int nb;
    int64_t bdims[AF_MAX_RANK], astr[AF_MAX_RANK], bstr[AF_MAX_RANK];
    int rank; /* output rank */
    int64_t dims[AF_MAX_RANK];
    /* A packed B (b_packed: GEMM panels made by the pack pass, in float32, or in half or
     * bfloat16 after the precision pass): only the fast kernels read it. `b` is then their view
     * of it as the logical [K, N] and bdtype the panels' element type. */
    bool packed;
    af_dtype bdtype;
    float alpha, eps;   /* attributes alpha and ln_epsilon */
    bool prologue_fp32; /* --precision_mode=mixed: the LayerNorm prologue reads float32 A */
    fused_quant quant; /* quant = 1: the int8 form (fused_quant.c) */
} fused_mm;


/* Shapes, attributes and output type of a FusedMatMul; works with unknown dims (then g->rank may
 * be -1). b_view: NULL, or the logical [K, N] view of a packed B (the fast kernels'; without it a
 * packed B is refused). */
af_status fused_mm_setup(const af_node *n, const af_tensor *const *in, const af_tensor *b_view,
                      fused_mm *g, af_error *err);
/* What follows from the input types (every dim known): fused_mm_setup, the attributes the
 * kernels read, the epilogue decoded into ep (not yet bound to operands) and the batch
 * strides. A kernel prepared once per node keeps these. */
af_status fused_mm_decode(const af_node *n, const af_tensor *const *in, const af_tensor *b_view,
                          fused_mm *g, af_epilogue *ep, af_error *err);
/* A run's part: g's inputs and ep's operands pointed at in (of the types g was decoded for),
 * every input's data and the output's shape checked. */
af_status fused_mm_bind(const af_node *n, fused_mm *g, const af_tensor *const *in,
                        const af_tensor *b_view, af_tensor *out, af_epilogue *ep,
                        af_error *err);
/* Both at once, on a run's inputs. */
af_status fused_mm_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           const af_tensor *b_view, fused_mm *g, af_epilogue *ep,
                           af_error *err);

/* FusedElementwise at run time: its shape, the input's data, the output and the decoded
 * program. */
af_status fused_elementwise_prepare(const af_node *n, const af_tensor *const *in,
                                       af_tensor *out, af_epilogue *ep, af_error *err);

/* One activation attribute pair of SqueezeExcite ("act"/"act_params" or "gate"/"gate_params"). */
typedef struct se_act {
    af_ep_op op;
    float p0, p1;
} se_act;

/* A SqueezeExcite checked at run time: activations, channels C and C/r, X's batch and positions,
 * the weights, and the lowered forms (channels_last: X is [N, positions, C]; gate_only: the
 * output is the [N, C] gate; pooled: X already holds the means). */
typedef struct fused_se {
    se_act act, gate;
    int64_t c, cr, batch, hw;
    const af_tensor *x, *w1, *b1, *w2, *b2;
    bool gate_only, pooled, channels_last;
} fused_se;
af_status fused_se_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out, fused_se *s,
                        af_error *err);
/* s_out[o] = act(b[o] + sum_i w[o, i] * s_in[i]): one of SqueezeExcite's FCs (a 1x1 conv on
 * one pooled vector). */
typedef void (*fused_se_fc)(const float *w, const float *b, const float *s_in, int64_t nin,
                         int64_t nout, const se_act *a, float *s_out, af_exec *ex);
/* SqueezeExcite on [N, C, positions] into y, its FCs computed by fc: the means in double, the
 * gate, the scaling. Scratch from ex (NULL: allocated). */
af_status fused_se_run_nchw(const af_node *n, const fused_se *s, float *y, fused_se_fc fc, af_exec *ex,
                         af_error *err);



/* Whether n carries quant = 1 (or another nonzero value, which fused_quant_decode refuses). */
bool fused_quant_on(const af_node *n);
/* Check n's quant attributes against W (NULL: not known; else it must be INT8 when quant = 1,
 * and quant = 1 when it is INT8) and the output channel count (-1: unknown), into q; an error
 * names the node and the bad attribute. */
af_status fused_quant_decode(const af_node *n, const af_tensor *w, int64_t channels,
                             fused_quant *q, af_error *err);
/* The uint8 code of x the int8 kernels compute with: clamp(round_half_even(x / s) + z, 0, 255),
 * a NaN coded 0 (a code has no NaN). */
static inline float fused_quant_code(float x, float s, float z) {
    float r = nearbyintf(x / s) + z;
    return r > 0.0f ? (r < 255.0f ? r : 255.0f) : 0.0f;
}
/* fq(x) = (code - z) * s: the epilogue's fake quantization (AF_EP_FAKE_QUANT), the reference
 * semantics of the int8 form; a NaN stays NaN there. */
static inline float fused_quant_fq(float x, float s, float z) {
    return af_fake_quant(x, s, z);
}
/* The float operands of the reference: xf = fq(X) and wf = W * w_scale[channel], channel =
 * i / inner % channels for W's element i. Both allocated here (released by the caller, also
 * when this fails). */
af_status fused_quant_operands(const af_node *n, const fused_quant *q, const af_tensor *x,
                               const af_tensor *w, int64_t inner, int64_t channels,
                               af_tensor *xf, af_tensor *wf, af_error *err);
/* A copy of n's inputs with X and W replaced by xf and wf (af_free it), or NULL with *st set
 * when out of memory. */
const af_tensor **fused_quant_inputs(const af_node *n, const af_tensor *const *in,
                                     const af_tensor *xf, const af_tensor *wf, af_status *st,
                                     af_error *err);

#endif
