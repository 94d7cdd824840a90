/* What the fused kernels (fused_conv.c, fused_matmul.c, fused_misc.c) share: the direct
 * convolution of one output row, used by FusedConv and ConvPoolFc, and input checks.
 *
 * Invariant: fk_conv_setup accepts only float32 operands whose shapes agree with the node's Conv
 * attributes, so fk_conv_row reads only inside X, W and B. */
#ifndef AF_KERNELS_FUSED_H
#define AF_KERNELS_FUSED_H

#include "kernels/ref/epilogue.h"
#include "kernels/ref/nn_common.h"

/* True when t (may be NULL) has all dims known and data covering them. */
bool fk_has_data(const af_tensor *t);

/* A float32 convolution ready to run: Conv's geometry over X [N, C, spatial...] and
 * W [M, C/group, k...] (spatial dims padded in front to NN_MAXSP), plus bias [M] or NULL, and
 * the scratch of fk_conv_row. */
typedef struct fk_conv {
    nn_window w;
    int64_t batch, cin, cout, group, cg, mg;
    int64_t row; /* output row length: w.out[NN_MAXSP - 1] */
    const float *x, *wt, *b;
    af_tensor y; /* output type [N, M, out...] (no data) */
    double *acc; /* one output row of accumulators */
    int64_t *kw_lo, *kw_hi; /* per kernel column kw: the output columns [lo, hi) it reaches */
    int64_t in_lo, in_hi;   /* the columns every kernel column reaches (in_lo == in_hi: none) */
    bool grouped_taps;      /* interior long enough for taps to share passes (fused_conv.c) */
} fk_conv;

/* Check X = in[0], W = in[1], B = in[2] (optional) with the node's Conv attributes (group,
 * strides, dilations, pads, auto_pad, kernel_shape) at run time, fill c and allocate its
 * scratch. Call fk_conv_release afterwards, also when this fails. */
af_status fk_conv_setup(const af_node *n, const af_tensor *const *in, fk_conv *c, af_error *err);
void fk_conv_release(fk_conv *c);

/* Output row (b, m, od, oh, all ow) of the convolution, bias added, into row[0..c->row). */
void fk_conv_row(const fk_conv *c, int64_t b, int64_t m, int64_t od, int64_t oh, float *row);

#endif
