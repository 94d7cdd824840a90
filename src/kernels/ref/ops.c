/* The reference half of the op table: each op's shape function and reference kernel, from the
 * columns of ir/ops.def.
 *
 * Invariant: every op has both a shape function and a reference kernel. */
#include "kernels/ref/ref.h"

const af_ref_op af_ref_ops[AF_OP_COUNT] = {
#define AF_OP(id, name, cls, shape, kernel, props) [AF_OP_##id] = {shape, kernel},
#include "ir/ops.def"
#undef AF_OP
};

af_status af_ref_refuse_lowered(const af_node *n, af_error *err) {
    return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                        "a lowered form (packed weights or channels-last tensors) runs on the "
                        "fast kernels only");
}
