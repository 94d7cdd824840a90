/* The fast kernels (this folder), as the dispatcher (dispatch.c) sees them: a kernel per op or
 * family, and the shape functions of the forms only the lowering makes (packed weights,
 * channels-last tensors). A fast kernel has the reference kernel's contract (kernel.h) and may
 * answer AF_DECLINED for a case it does not take; it never checks the ISA (the dispatcher and
 * the vector tables of kernels/simd do).
 *
 * Invariant: a fast kernel that answers AF_DECLINED has written nothing. */
#ifndef AF_KERNELS_FAST_H
#define AF_KERNELS_FAST_H

#include "kernels/kernel.h"

#define AF_FAST_KERNEL(name)                                                                  \
    af_status name(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,  \
                   af_error *err)
#define AF_FAST_SHAPE(name)                                                                   \
    af_status name(const af_node *n, const af_tensor *const *in, af_tensor *out, af_error *err)

/* elementwise.c: float32 elementwise and row ops. fast_unary takes every op whose row of the
 * op table has a unary epilogue step or a vector function (ir/ops.def: .ep, .vec_unary). */
AF_FAST_KERNEL(fast_unary);
AF_FAST_KERNEL(fast_clip);
AF_FAST_KERNEL(fast_binary);
AF_FAST_KERNEL(fast_layernorm);
AF_FAST_KERNEL(fast_rmsnorm);
AF_FAST_KERNEL(fast_softmax);
AF_FAST_KERNEL(fast_log_softmax);
AF_FAST_KERNEL(fast_transpose);
/* reduce.c: Reduce* over any axes, ArgMax / ArgMin; InstanceNormalization and GroupNorm. */
AF_FAST_KERNEL(fast_reduce);
AF_FAST_KERNEL(fast_arg);
AF_FAST_KERNEL(fast_instancenorm);
AF_FAST_KERNEL(fast_group_norm);
AF_FAST_SHAPE(fast_shape_group_norm); /* the channels-last form: X [N, ..., C] */
/* rnn.c: RNN, GRU and LSTM in float32 (gemv per step). */
AF_FAST_KERNEL(fast_rnn);
/* index.c: TopK (partial selection), CumSum. */
AF_FAST_KERNEL(fast_topk);
AF_FAST_KERNEL(fast_cumsum);
/* quant.c: QuantizeLinear, DequantizeLinear (8-bit, per tensor or axis), DynamicQuantizeLinear. */
AF_FAST_KERNEL(fast_quantize);
AF_FAST_KERNEL(fast_dequantize);
AF_FAST_KERNEL(fast_dyn_quantize);
/* broadcast.c: ops whose inputs broadcast, walked as rows. fast_broadcast_binary takes the
 * float32 Add / Sub / Mul / Div / Pow / Mod that fast_binary's vector epilogue does not. */
af_status fast_broadcast_binary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_exec *x);
AF_FAST_KERNEL(fast_variadic);
AF_FAST_KERNEL(fast_compare);
AF_FAST_KERNEL(fast_logical);
AF_FAST_KERNEL(fast_not);
AF_FAST_KERNEL(fast_where);
/* resize.c: Resize and Upsample as separable passes. */
AF_FAST_KERNEL(fast_resize);
/* gridsample.c: GridSample, its taps found once per point for every channel. */
AF_FAST_KERNEL(fast_grid_sample);
/* copy.c: data movement by element size. */
AF_FAST_KERNEL(fast_pad);
AF_FAST_KERNEL(fast_slice);
AF_FAST_KERNEL(fast_expand);
AF_FAST_KERNEL(fast_tile);
AF_FAST_KERNEL(fast_concat);
AF_FAST_KERNEL(fast_split);
AF_FAST_KERNEL(fast_gather);
AF_FAST_KERNEL(fast_constant_of_shape);
AF_FAST_KERNEL(fast_cast);
AF_FAST_KERNEL(fast_trilu);
AF_FAST_KERNEL(fast_depth_space);
/* The (from, to) dtype pairs fast_cast converts (it declines the others). */
bool fast_cast_takes(af_dtype from, af_dtype to);
/* select.c: data-dependent indexing by element size. */
AF_FAST_KERNEL(fast_gather_elements);
AF_FAST_KERNEL(fast_scatter_elements);
AF_FAST_KERNEL(fast_gather_nd);
AF_FAST_KERNEL(fast_non_zero);
/* pool.c: channels-last pooling. */
AF_FAST_KERNEL(fast_maxpool);
AF_FAST_KERNEL(fast_avgpool);
AF_FAST_KERNEL(fast_global_maxpool);
AF_FAST_KERNEL(fast_global_avgpool);
/* pool_nchw.c: the plain (NCHW) form of every rank, and the entries of the pooling rows (the
 * channels-last form goes to the kernels above). */
AF_FAST_KERNEL(fast_maxpool_any);
AF_FAST_KERNEL(fast_avgpool_any);
AF_FAST_KERNEL(fast_lppool);
AF_FAST_KERNEL(fast_global_maxpool_any);
AF_FAST_KERNEL(fast_global_avgpool_any);
AF_FAST_KERNEL(fast_global_lppool);
AF_FAST_SHAPE(fast_shape_maxpool);
AF_FAST_SHAPE(fast_shape_avgpool);
AF_FAST_SHAPE(fast_shape_global_maxpool);
AF_FAST_SHAPE(fast_shape_global_avgpool);
/* Prepared state (dispatch.h: af_kernel_prepare) of the kernels that parse the most: a block
 * from af_malloc, or NULL when the node cannot be prepared for those types. */
typedef void *(*af_prepare_fn)(const af_node *n, const af_tensor *const *types);
void *fast_prepare_fused_conv(const af_node *n, const af_tensor *const *types);
void *fast_prepare_fused_matmul(const af_node *n, const af_tensor *const *types);
/* conv.c: channels-last FusedConv and ConvPoolFc on the GEMM core. */
AF_FAST_KERNEL(fast_fused_conv);
AF_FAST_KERNEL(fast_conv_pool_fc);
AF_FAST_SHAPE(fast_shape_fused_conv);
AF_FAST_SHAPE(fast_shape_conv_pool_fc);
/* matmul.c: FusedMatMul on the GEMM core (packed B too). */
AF_FAST_KERNEL(fast_fused_matmul);
AF_FAST_SHAPE(fast_shape_fused_matmul);
/* fused.c: FusedElementwise and SqueezeExcite. */
AF_FAST_KERNEL(fast_fused_elementwise);
AF_FAST_KERNEL(fast_squeeze_excite);
/* detect.c: NonMaxSuppression (the reference's selection; kept boxes found through a grid). */
AF_FAST_KERNEL(fast_nms);
/* detect.c: RoiAlign (the reference's double arithmetic, samples worked out once per roi). */
AF_FAST_KERNEL(fast_roi_align);
/* attention.c: FusedAttention. */
AF_FAST_KERNEL(fast_attention);

#endif
