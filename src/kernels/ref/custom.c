/* The op-table row of custom ops (AF_OP_CUSTOM): shape inference and kernel of a plugin's op,
 * found in the plugin registry (ir/plugin.h) by the node's domain and op_type.
 *
 * Invariant: what a plugin's shape function returns is checked (rank, dtype) before anything
 * uses it. */
#include "ir/plugin.h"
#include "kernels/ref/ref.h"

static const af_custom_op *node_op(const af_node *n, af_error *err) {
    const af_custom_op *op = af_plugin_op(n->domain, n->op_type);
    if (!op)
        af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                     "custom op '%s:%s' is not loaded (give its plugin with --plugin or "
                     "AUTOFUSION_PLUGINS)", n->domain && strcmp(n->domain, "ai.onnx") ? n->domain : "", n->op_type);
    return op;
}

af_status shape_custom(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_custom_op *op = node_op(n, err);
    if (!op) return err ? err->code : AF_ERR_UNSUPPORTED;
    char msg[512] = "";
    for (int o = 0; o < n->nout; o++) af_tensor_set_type(&out[o], AF_DTYPE_UNDEFINED, -1, NULL);
    if (op->infer((const af_pnode *)n, &af_plugin_graph_api, n->nin, in, n->nout, out, msg,
                  sizeof msg)) {
        msg[sizeof msg - 1] = '\0';
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s", *msg ? msg : "shape inference failed");
    }
    for (int o = 0; o < n->nout; o++)
        if (out[o].rank > AF_MAX_RANK || af_dtype_size(out[o].dtype) == 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "the plugin's shape inference gave output %d rank %d, type %d", o,
                                out[o].rank, (int)out[o].dtype);
    return AF_OK;
}

af_status ref_custom(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *x, af_error *err) {
    (void)x;
    const af_custom_op *op = node_op(n, err);
    if (!op) return err ? err->code : AF_ERR_UNSUPPORTED;
    char msg[512] = "";
    if (op->compute((const af_pnode *)n, &af_plugin_graph_api, n->nin, in, n->nout, out, msg,
                    sizeof msg)) {
        msg[sizeof msg - 1] = '\0';
        return af_node_fail(err, n, AF_ERR_RUNTIME, "%s", *msg ? msg : "the plugin's kernel failed");
    }
    return AF_OK;
}
