/* The op table built from ops.def, and lookup by ONNX name. */
#include "kernels/kernel.h"

#include <string.h>

const af_op_info af_ops[AF_OP_COUNT] = {
#define AF_OP(id, name, cls, shape, kernel) [AF_OP_##id] = {name, cls, shape, kernel},
#include "ir/ops.def"
#undef AF_OP
};

af_op af_op_lookup(const char *domain, const char *op_type) {
    if (domain && *domain && strcmp(domain, "ai.onnx")) return AF_OP_COUNT;
    for (int i = 0; i < AF_OP_COUNT; i++)
        if (!strcmp(af_ops[i].name, op_type)) return (af_op)i;
    return AF_OP_COUNT;
}
