/* Channels-last FusedConv (conv_fast.c): geometry shared by its shape function and kernel, and
 * the entry points fused_conv.c hands a node with channels_last = 1 to. */
#ifndef AF_KERNELS_CONV_FAST_H
#define AF_KERNELS_CONV_FAST_H

#include "kernels/ref/fused.h"
#include "kernels/simd/vec.h"

typedef struct fk_conv_cl {
    af_tensor y; /* output type [N, OH, OW, M] (rank -1 while X's rank is unknown) */
    int64_t n, h, w, c, m, cg, mg, group;
    int64_t oh, ow, kh, kw, sh, sw, dh, dw, ph, pw; /* pads at the beginning */
    int packed; /* w_packed: 0 not yet, 1 GEMM panels, 2 depthwise */
    af_gemm_type wt_type; /* packed GEMM panels in half or bfloat16 (--precision_mode) */
    const float *x, *wt, *b;
    /* in_scale: X's channels are multiplied by gate[n][c] (input in_scale, [N, 1, 1, C]; a
     * squeeze-excite gate folded into this 1x1 conv), applied to the weights per image */
    const float *gate;
    /* pro_w >= 0: a depthwise conv whose 1x1 expand conv was merged in (passes/lower.c). X
     * (input 0) is the expand's input [N, H, W, pro_c]; the C = E channels the depthwise conv
     * reads are computed from it row by row (pro_wt packed pro_c x C, bias pro_b or NULL, then
     * the program in pro_epilogue) and never stored whole. x is NULL then. */
    const float *pro_x, *pro_wt, *pro_b;
    int64_t pro_c;
} fk_conv_cl;

/* Check the node and its inputs (types only when data is absent) and fill g. */
af_status fk_conv_cl_setup(const af_node *n, const af_tensor *const *in, fk_conv_cl *g,
                           af_error *err);
af_status fk_shape_conv_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err);
af_status fk_kernel_conv_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err);

/* ConvPoolFc with channels_last = 1: the conv as above (output in scratch only), its mean over
 * positions, then the FC on the GEMM core (Wfc packed when fc_packed = 1, fc_shape [M, classes]). */
af_status fk_shape_cpf_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err);
af_status fk_kernel_cpf_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err);

#endif
