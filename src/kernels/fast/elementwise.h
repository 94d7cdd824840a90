/* Fast paths of the float32 elementwise ops (eltwise_fast.c), called by the reference kernels
 * before their own loops: each returns false when it does not take the case (another dtype, a
 * broadcast the vector epilogue cannot read, AF_ISA_REFERENCE), and then the reference kernel
 * computes it. */
#ifndef AF_KERNELS_ELTWISE_FAST_H
#define AF_KERNELS_ELTWISE_FAST_H

#include "kernels/simd/vec.h"

/* y = x through the vector epilogue v, for a tensor of numel floats (rows of v->cols); x may be
 * y (in place) or NULL (y already holds the values). In parallel on ex. */
void fk_ep_run(af_exec *ex, const af_vep *v, const float *x, float *y, int64_t numel);
/* y = op(x) for an epilogue activation or an af_vun_op, elementwise, in parallel. */
bool fk_fast_map(int op, float p0, float p1, const af_tensor *x, af_tensor *y, af_exec *ex);
/* Unary ONNX ops (Relu, Sigmoid, Tanh, Erf, Exp, Sqrt, Gelu, Silu, ...). */
bool fk_fast_unary(const af_node *n, const af_tensor *x, af_tensor *y, af_exec *ex);
/* Add, Sub, Mul, Div, and Pow by a constant 2 or 0.5, with a and b checked against y. */
bool fk_fast_binary(const af_node *n, const af_tensor *a, const af_tensor *b, af_tensor *y,
                    af_exec *ex);

/* LayerNormalization of `rows` rows of `len` floats, scale and bias (may be NULL) of len
 * elements each (a full row, in order). */
bool fk_fast_layernorm(const af_tensor *x, const af_tensor *scale, const af_tensor *bias,
                       float eps, int64_t rows, int64_t len, af_tensor *y, af_exec *ex);
/* Softmax along rows of len contiguous floats. */
bool fk_fast_softmax(const af_tensor *x, int64_t rows, int64_t len, af_tensor *y, af_exec *ex);

/* Transpose by perm (checked by the caller) when it moves whole rows: X seen as [R, C] or
 * [B, R, C] (dims of 1 ignored, neighbouring axes merged) becomes [C, R] or [B, C, R]; e.g.
 * NCHW <-> NHWC. In parallel, in 16 x 16 blocks. */
bool fk_fast_transpose(const af_tensor *x, const int *perm, af_tensor *y, af_exec *ex);

/* Sum (or mean) of each of `rows` rows of len contiguous floats into y[rows]. */
bool fk_fast_row_sums(const af_tensor *x, int64_t rows, int64_t len, bool mean, af_tensor *y,
                      af_exec *ex);

#endif
