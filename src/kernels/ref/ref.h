/* The reference kernels (this folder): for every op of the op table (ir/ops.def) its shape
 * function and its reference kernel, the plain ONNX semantics that every fast kernel is tested
 * against. Invariant: nothing here uses vector code, checks the ISA or calls a fast kernel; a
 * kernel computes in the simplest order that is exact enough to serve as the oracle (double
 * accumulation where ONNX Runtime would accumulate in float). Forms only the lowering makes
 * (packed weights, channels-last tensors) are not reference forms: the dispatcher
 * (fast/dispatch.c) never sends them here, and these kernels refuse them. */
#ifndef AF_KERNELS_REF_H
#define AF_KERNELS_REF_H

#include "kernels/kernel.h"

#include <math.h>
#include <string.h>

/* Declare every shape function and kernel named in ops.def. */
#define AF_OP(id, name, cls, shape, kernel, props)                                           \
    af_status shape(const af_node *, const af_tensor *const *, af_tensor *, af_error *);    \
    af_status kernel(const af_node *, const af_tensor *const *, af_tensor *, af_exec *,     \
                     af_error *);
#include "ir/ops.def"
#undef AF_OP

/* The shape function and reference kernel of each op (ops.c), indexed by af_op. */
typedef struct af_ref_op {
    af_shape_fn shape;
    af_kernel_fn kernel;
} af_ref_op;
extern const af_ref_op af_ref_ops[AF_OP_COUNT];

/* The error a reference kernel gives a node in a form only the fast kernels run. */
af_status af_ref_refuse_lowered(const af_node *n, af_error *err);

#endif
