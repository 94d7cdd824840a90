/* Integer products as float32 ones (pass_integer_as_float, a step of simplify): the ConvInteger
 * and MatMulInteger of dynamically quantized models (DynamicQuantizeLinear -> ConvInteger ->
 * Cast to float -> Mul by the scales, as onnxruntime.quantization.quantize_dynamic writes them)
 * become float32 Conv and MatMul nodes that the fusion rules and the GEMM core take:
 *
 *   y = Cast<float>(ConvInteger(x, w, x_zp, w_zp))
 *     -> y = Conv(DequantizeLinear(x, 1, x_zp), float(w - w_zp))
 *
 * with the same attributes (MatMulInteger likewise, into MatMul). The weights are constant, so
 * their shifted float copy is made here once. Every product and every partial sum is an integer;
 * float32 holds them exactly up to 2^24 and rounds beyond, where the Cast of the int32 result to
 * float rounds too: the result is within a few float32 ulps of the integer path's. Until the
 * int8 GEMM kernels exist, this runs these models at float32 speed instead of the reference's.
 *
 * Taken when: the weights and their zero point are constant 8-bit tensors, x's zero point is a
 * scalar (or absent), and every reader of the int32 result is a Cast to float. Otherwise the
 * node stays as it is (on its reference kernel, which inspect and bench name). */
#include "passes/rewrite.h"

#include <stdio.h>
#include <string.h>

static bool is8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

static double elem8(const af_tensor *t, int64_t i) {
    return t->dtype == AF_DTYPE_UINT8 ? (double)((const uint8_t *)t->data)[i]
                                      : (double)((const int8_t *)t->data)[i];
}

/* Is every reader of v a Cast to float32 (and v read at all, and not a graph output)? */
static bool read_as_float(const pass_scope *s, const af_value *v) {
    if (!v || pass_pinned(s, v) || v->nuses == 0) return false;
    for (int i = 0; i < v->nuses; i++) {
        const af_node *r = v->uses[i].node;
        if (r->graph != s->g || r->op != AF_OP_CAST || pass_dead(s, r) ||
            af_attr_int(r, "to", 0) != AF_DTYPE_FLOAT)
            return false;
    }
    return true;
}

/* float(w - w_zp): w_zp a scalar, or one value per slice of `axis` of w. NULL when w_zp is
 * neither. */
static af_value *shifted_weights(af_graph *g, const af_value *w, const af_value *zp, int axis) {
    const af_tensor *wt = &w->type, *zt = zp ? &zp->type : NULL;
    int64_t zn = zt ? af_tensor_numel(zt) : 1, total = af_tensor_numel(wt);
    if (zt && (zt->dtype != wt->dtype || zt->rank > 1 || (zn != 1 && zn != wt->dims[axis])))
        return NULL;
    int64_t inner = 1;
    for (int d = axis + 1; d < wt->rank; d++) inner *= wt->dims[d];
    char hint[256];
    snprintf(hint, sizeof hint, "%s/float", w->name);
    const char *name = af_graph_unique_name(g, hint);
    af_value *f = name ? af_value_new_const(g, name, AF_DTYPE_FLOAT, wt->rank, wt->dims) : NULL;
    if (!f) return NULL;
    float *dst = f->type.data;
    for (int64_t i = 0; i < total; i++) {
        int64_t k = zn == 1 ? 0 : (i / inner) % zn;
        dst[i] = (float)(elem8(wt, i) - (zt ? elem8(zt, k) : 0.0));
    }
    return f;
}

/* x - x_zp in float32, exactly: a DequantizeLinear with scale 1 (one fast node). */
static af_value *shifted_input(pass_scope *s, const af_node *n, af_value *x, af_value *zp) {
    char hint[256];
    snprintf(hint, sizeof hint, "%s/shifted", x->name);
    const char *name = af_graph_unique_name(s->g, hint);
    af_value *one = af_value_new_f32(s->g, "one", 0, NULL);
    af_node *dq = name && one ? pass_node_new(s, AF_OP_DEQUANTIZE_LINEAR, n, zp ? 3 : 2, 1) : NULL;
    af_value *v = dq ? af_value_new(s->g, name) : NULL;
    if (!v) return NULL;
    *(float *)one->type.data = 1.0f;
    af_node_set_input(dq, 0, x);
    af_node_set_input(dq, 1, one);
    if (zp) af_node_set_input(dq, 2, zp);
    af_node_set_output(dq, 0, v);
    return v;
}

static af_status rewrite(pass_scope *s, af_node *n, bool *changed, af_error *err) {
    bool conv = n->op == AF_OP_CONV_INTEGER;
    af_value *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL;
    af_value *xzp = n->nin > 2 ? n->in[2] : NULL, *wzp = n->nin > 3 ? n->in[3] : NULL;
    if (!x || !w || !af_value_is_const(w) || !is8(w->type.dtype) || !is8(x->type.dtype) ||
        w->type.rank < 2 || (wzp && !af_value_is_const(wzp)) ||
        (xzp && (af_tensor_numel(&xzp->type) != 1 || xzp->type.dtype != x->type.dtype)) ||
        !read_as_float(s, n->out[0]))
        return AF_OK;
    /* the weights' zero point: per output channel (conv: axis 0 of [M, C, k...]; matmul: per
     * column, the last axis of [K, N]) */
    af_value *wf = shifted_weights(s->g, w, wzp, conv ? 0 : w->type.rank - 1);
    if (!wf) return AF_OK; /* a zero point of another shape: left to the reference */
    af_value *xs = shifted_input(s, n, x, xzp);
    af_node *r = xs ? pass_node_new(s, conv ? AF_OP_CONV : AF_OP_MATMUL, n, 2, 1) : NULL;
    const char *name = r ? af_graph_unique_name(s->g, n->out[0]->name) : NULL;
    af_value *y = name ? af_value_new(s->g, name) : NULL;
    if (!y) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    af_node_set_input(r, 0, xs);
    af_node_set_input(r, 1, wf);
    af_node_set_output(r, 0, y);
    for (int i = 0; conv && i < n->nattrs; i++) { /* auto_pad, dilations, group, kernel_shape... */
        af_attr *a = af_node_add_attr(r, n->attrs[i].name, n->attrs[i].type);
        if (!a) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        *a = n->attrs[i];
    }
    /* the Casts to float read y now: each becomes a copy that simplify drops */
    af_value_replace_uses(n->out[0], y);
    af_status st = pass_kill(s, n, err);
    if (!st) *changed = true;
    return st;
}

af_status pass_integer_as_float(af_graph *g, bool *changed, af_error *err) {
    pass_scope s;
    af_status st = pass_scope_open(&s, g, err);
    bool mine = false;
    int before = g->nnodes;
    for (int i = 0; !st && i < before; i++) {
        af_node *n = g->nodes[i];
        if (pass_dead(&s, n) || (n->op != AF_OP_CONV_INTEGER && n->op != AF_OP_MATMUL_INTEGER))
            continue;
        st = rewrite(&s, n, &mine, err);
    }
    if (!st) pass_scope_sweep(&s);
    pass_scope_close(&s);
    if (!st && mine) {
        *changed = true;
        st = af_graph_toposort(g, err);
    }
    return st;
}
