/* Static shape and dtype inference: run each op's shape function over what is known at compile
 * time (declared types, constant values) and record the result on the output values. A dim the
 * model declares (value_info) is kept where inference cannot tell; a contradiction between the
 * two is an error, since the model would fail at run time anyway.
 *
 * Invariant: where inference cannot tell a dim, the one the model declares stays. */
#include "kernels/fast/dispatch.h"
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

static af_status merge(const af_node *n, af_value *v, const af_tensor *inferred, af_error *err) {
    af_tensor *t = &v->type;
    if (inferred->rank < 0) {
        if (t->dtype == AF_DTYPE_UNDEFINED) t->dtype = inferred->dtype;
        return AF_OK;
    }
    if (t->dtype != AF_DTYPE_UNDEFINED && inferred->dtype != AF_DTYPE_UNDEFINED &&
        t->dtype != inferred->dtype)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "output '%s' is declared %s but the op produces %s", v->name,
                            af_dtype_name(t->dtype), af_dtype_name(inferred->dtype));
    if (inferred->dtype != AF_DTYPE_UNDEFINED) t->dtype = inferred->dtype;
    if (t->rank >= 0 && t->rank != inferred->rank) {
        /* Declared ranks in value_info are advisory in practice (exporters get them wrong);
         * trust the op's semantics. */
        t->rank = inferred->rank;
        memcpy(t->dims, inferred->dims, sizeof t->dims);
        return AF_OK;
    }
    int declared_rank = t->rank;
    t->rank = inferred->rank;
    for (int i = 0; i < t->rank; i++)
        if (inferred->dims[i] != AF_DIM_UNKNOWN || declared_rank < 0) t->dims[i] = inferred->dims[i];
    return AF_OK;
}

af_status af_node_infer_shape(af_node *n, af_error *err) {
    af_status st = AF_OK;
    for (int a = 0; a < n->nattrs && !st; a++) {
        af_attr *at = &n->attrs[a];
        /* A branch of an If may not fit the shapes the model was compiled for and still never
         * run: Silero VAD's 8 kHz branch, given 16 kHz frames, feeds its LSTM a 5-D tensor.
         * Its inference stops at that node (the values after it stay unknown) and the compile
         * goes on; if the branch is taken, its kernels refuse the tensors at run time, naming
         * the node, as ONNX Runtime does. A branch that is certain to run (its If folded) is
         * inferred again in the enclosing graph, where the error stands. */
        af_error ignored;
        if (at->g && n->op == AF_OP_IF) af_graph_infer_shapes(at->g, &ignored);
        else if (at->g) st = af_graph_infer_shapes(at->g, err);
        for (int k = 0; at->graphs && k < at->n && !st; k++)
            st = af_graph_infer_shapes(at->graphs[k], err);
    }
    if (st) return st;
    /* On the heap: a node may have very many inputs or outputs. */
    const af_tensor **in = af_calloc((size_t)n->nin + 1, sizeof(af_tensor *));
    af_tensor *out = af_calloc((size_t)n->nout + 1, sizeof(af_tensor));
    if (!in || !out) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n->nin; i++) in[i] = n->in[i] ? &n->in[i]->type : NULL;
    for (int i = 0; i < n->nout; i++) out[i].rank = -1;
    st = af_kernel_shape(n, in, out, err);
    for (int o = 0; o < n->nout && !st; o++) {
        if (!n->out[o]) continue;
        if (out[o].rank > AF_MAX_RANK)
            st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output rank %d exceeds %d",
                              out[o].rank, AF_MAX_RANK);
        else
            st = merge(n, n->out[o], &out[o], err);
    }
done:
    af_free(in);
    af_free(out);
    return st;
}

af_status af_graph_infer_shapes(af_graph *g, af_error *err) {
    if (!g->parent) {
        af_status st = af_graph_name_input_dims(g, err);
        if (st) return st;
    }
    for (int i = 0; i < g->nnodes; i++) {
        af_status st = af_node_infer_shape(g->nodes[i], err);
        if (st) return st;
    }
    return AF_OK;
}
