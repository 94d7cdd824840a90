/* What every reference kernel file shares: the function types of ops.def and small helpers for
 * axes, broadcasting and strided iteration. Kernels receive tensors whose dims are all known. */
#ifndef AF_KERNEL_H
#define AF_KERNEL_H

#include "ir/ir.h"
#include "ir/plugin.h"

#include <math.h>
#include <string.h>

/* Declare every shape function and kernel named in ops.def. */
#define AF_OP(id, name, cls, shape, kernel)                                                  \
    af_status shape(const af_node *, const af_tensor *const *, af_tensor *, af_error *);    \
    af_status kernel(const af_node *, const af_tensor *const *, af_tensor *, af_exec *,     \
                     af_error *);
#include "ir/ops.def"
#undef AF_OP

/* Normalise axis in [-rank, rank) to [0, rank); false when out of range. */
bool af_axis(int64_t axis, int rank, int *out);
/* Numpy broadcast of a and b dims into out (rank = max); false when incompatible.
 * Unknown dims (-1) broadcast to -1 unless the other side fixes them. */
bool af_broadcast_dims(const af_tensor *a, const af_tensor *b, af_tensor *out);
/* Row-major strides of t (in elements). Broadcast strides of t against shape `to`: stride 0
 * where t's (right-aligned) dim is 1 and to's is not. */
void af_strides(const af_tensor *t, int64_t *strides);
void af_broadcast_strides(const af_tensor *t, const af_tensor *to, int64_t *strides);
/* Copy type (dtype, rank, dims) without data. */
void af_tensor_type_copy(af_tensor *dst, const af_tensor *src);
/* Set dtype/rank/dims of a type-only tensor. */
void af_tensor_set_type(af_tensor *t, af_dtype dtype, int rank, const int64_t *dims);
/* Read an int64/int32 1-D tensor (e.g. a shape input) into v[0..n); false if too long/bad type. */
bool af_tensor_to_ints(const af_tensor *t, int64_t *v, int max, int *n);

#endif
