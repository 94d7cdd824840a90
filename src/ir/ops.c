/* The op table built from ops.def (names, classes, properties), and lookup by ONNX name.
 *
 * Invariant: af_ops[op] describes op for every op of the enum, and af_op_lookup never returns an
 * op of another domain than the one asked for. */
#include "ir/epilogue.h"
#include "ir/plugin.h"

#include <string.h>

#define AF_UNPAREN(...) __VA_ARGS__
const af_op_info af_ops[AF_OP_COUNT] = {
#define AF_OP(id, onnx_name, op_class, shape, kernel, props)                                  \
    [AF_OP_##id] = {.name = onnx_name, .cls = op_class, AF_UNPAREN props},
#include "ir/ops.def"
#undef AF_OP
};

/* The rows of the ai.onnx.preview.training domain (ops_misc.def). */
static bool op_is_training(int op) {
    return op == AF_OP_ADAGRAD || op == AF_OP_ADAM || op == AF_OP_MOMENTUM;
}

/* The rows of the com.microsoft domain (ops_ms.def). */
static bool op_is_ms(int op) {
    return op >= AF_OP_QLINEAR_ADD && op <= AF_OP_QLINEAR_CONCAT;
}

af_op af_op_lookup(const char *domain, const char *op_type) {
    bool ours = domain && !strcmp(domain, AF_DOMAIN);
    bool training = domain && !strcmp(domain, "ai.onnx.preview.training");
    bool ms = domain && !strcmp(domain, "com.microsoft");
    bool onnx = !domain || !*domain || !strcmp(domain, "ai.onnx");
    for (int i = ours ? AF_OP_GELU : 0;
         (ours || onnx || training || ms) && i < (ours ? AF_OP_CUSTOM : AF_OP_GELU); i++)
        if (!strcmp(af_ops[i].name, op_type) && op_is_training(i) == training && op_is_ms(i) == ms)
            return (af_op)i;
    return !ours && af_plugin_op(domain, op_type) ? AF_OP_CUSTOM : AF_OP_COUNT;
}

bool af_op_is_ours(af_op op) { return op >= AF_OP_GELU && op < AF_OP_CUSTOM; }
