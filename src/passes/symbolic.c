/* Symbolic shape folding: the shape arithmetic of a dynamic export (Shape -> Gather ->
 * Unsqueeze -> Concat -> Reshape, with Mul/Div/Slice/Cast on the way) evaluated over symbolic
 * dims (ir.h), so that it folds away as it does when every dim is known.
 *
 * Each small integer tensor the graph computes from shapes gets a "shape vector": its elements
 * as dims (numbers >= 0 or symbols). Then:
 *  - a vector whose elements are all numbers becomes a constant (Shape(x)[2] of [batch, seq,
 *    768] is 768);
 *  - a Reshape whose shape input has a vector gets a constant shape instead (af_reshape_shape:
 *    0 keeps the input's dim, one -1 for a symbol), and shape inference gives its output the
 *    symbolic dims;
 *  - an Expand likewise, with 1 where the target keeps the input's dim;
 *  - ConstantOfShape's output gets the vector as its dims, and a Slice whose end on one axis is
 *    a symbol E (start 0, step 1) gets E on that axis. That takes E to be within the sliced dim,
 *    as in x[:, :seq] of a position table; a run where it is not still computes the true shape
 *    (the executor infers shapes from the data), and a fused op's shape function refuses it.
 * The shape nodes left without readers die in simplify's dead-code sweep.
 *
 * Invariant: a vector is exact. An element is known only when every path of the computation is
 * a rule below (a product is a product, a division is exact); anything else gives the value no
 * vector, and the graph keeps computing it at run time. Negative literals (-1 "infer") are not
 * vectors either, so an element never needs a sign to be read. */
#include "passes/rewrite.h"

#include <string.h>

typedef struct vec {
    bool ok;
    int n;                   /* elements */
    int rank;                /* 0 (a scalar) or 1 */
    int64_t d[AF_MAX_RANK];  /* dims: >= 0 or symbolic */
} vec;

/* A constant integer tensor of rank <= 1 with AF_MAX_RANK non-negative elements at most. */
static bool from_const(const af_value *v, vec *out) {
    const af_tensor *t = &v->type;
    if (!af_value_is_const(v) || (t->dtype != AF_DTYPE_INT64 && t->dtype != AF_DTYPE_INT32) ||
        t->rank > 1)
        return false;
    int64_t n = af_tensor_numel(t);
    if (n < 0 || n > AF_MAX_RANK) return false;
    for (int64_t i = 0; i < n; i++)
        if ((out->d[i] = af_tensor_get_int(t, i)) < 0) return false;
    out->n = (int)n;
    out->rank = t->rank;
    return out->ok = true;
}

/* The vectors of one graph's values, by value id (values made during the pass have none). */
typedef struct vecs {
    vec *v;
    int n;
} vecs;

static const vec *vec_of(const vecs *V, const af_value *v, const af_graph *g) {
    return v && v->graph == g && v->id < V->n && V->v[v->id].ok ? &V->v[v->id] : NULL;
}

/* Input i of n as a vector: computed before, or a constant. */
static const vec *arg(const vecs *V, const af_node *n, int i, vec *scratch) {
    const af_value *v = i < n->nin ? n->in[i] : NULL;
    const vec *x = vec_of(V, v, n->graph);
    if (x || !v) return x;
    memset(scratch, 0, sizeof *scratch);
    return from_const(v, scratch) ? scratch : NULL;
}

/* One constant index (scalar or [1]) of an int tensor. */
static bool const_index(const af_value *v, int64_t *k) {
    if (!v || !af_value_is_const(v) || v->type.rank > 1 || af_tensor_numel(&v->type) != 1 ||
        (v->type.dtype != AF_DTYPE_INT64 && v->type.dtype != AF_DTYPE_INT32))
        return false;
    *k = af_tensor_get_int(&v->type, 0);
    return true;
}

/* Elementwise Mul/Div/Add/Sub of two vectors, numpy-broadcast (a scalar or a [1] side). */
static bool arith(af_graph *g, af_op op, const vec *a, const vec *b, vec *out) {
    int n = a->n > b->n ? a->n : b->n;
    if ((a->n != n && a->n != 1) || (b->n != n && b->n != 1)) return false;
    for (int i = 0; i < n; i++) {
        int64_t x = a->d[a->n == 1 ? 0 : i], y = b->d[b->n == 1 ? 0 : i], r = AF_DIM_UNKNOWN;
        bool known = x >= 0 && y >= 0;
        if (op == AF_OP_MUL) r = af_dim_mul(g, x, y);
        else if (op == AF_OP_DIV) r = known ? (y ? x / y : AF_DIM_UNKNOWN) : af_dim_div(g, x, y);
        else if (op == AF_OP_ADD && known && !af_add_i64(x, y, &r)) r = AF_DIM_UNKNOWN;
        else if (op == AF_OP_SUB && known && x >= y) r = x - y;
        if (r == AF_DIM_UNKNOWN) return false;
        out->d[i] = r;
    }
    out->n = n;
    out->rank = a->rank > b->rank ? a->rank : b->rank;
    return out->ok = true;
}

/* Slice of a 1-D vector: constant starts/ends (one axis, 0), step 1. */
static bool slice(const af_node *nd, const vec *x, vec *out) {
    int64_t st, en, step = 1, ax = 0;
    if (nd->nin < 3 || !const_index(nd->in[1], &st) || !const_index(nd->in[2], &en) ||
        (nd->nin > 3 && nd->in[3] && !const_index(nd->in[3], &ax)) ||
        (nd->nin > 4 && nd->in[4] && !const_index(nd->in[4], &step)) || step != 1 ||
        (ax != 0 && ax != -1) || x->rank != 1)
        return false;
    int64_t w = x->n;
    if (st < 0) st = st < -w ? 0 : st + w;
    if (en < 0) en = en < -w ? 0 : en + w;
    st = st > w ? w : st;
    en = en > w ? w : en < st ? st : en;
    out->n = (int)(en - st);
    memcpy(out->d, x->d + st, sizeof(int64_t) * (size_t)out->n);
    out->rank = 1;
    return out->ok = true;
}

/* The vector of n's output 0 from its inputs' vectors (V by value id). */
static bool eval(const vecs *V, const af_node *nd, vec *out) {
    vec s0, s1;
    const vec *a = arg(V, nd, 0, &s0), *b;
    memset(out, 0, sizeof *out);
    switch (nd->op) {
    case AF_OP_SHAPE: {
        const af_tensor *x = nd->nin ? &nd->in[0]->type : NULL;
        if (!x || !af_dims_defined(x)) return false;
        int64_t lo = af_attr_int(nd, "start", 0), hi = af_attr_int(nd, "end", x->rank);
        if (lo < 0) lo += x->rank;
        if (hi < 0) hi += x->rank;
        lo = lo < 0 ? 0 : lo > x->rank ? x->rank : lo;
        hi = hi < lo ? lo : hi > x->rank ? x->rank : hi;
        out->n = (int)(hi - lo);
        memcpy(out->d, x->dims + lo, sizeof(int64_t) * (size_t)out->n);
        out->rank = 1;
        return out->ok = true;
    }
    case AF_OP_GATHER: {
        int64_t k;
        if (!a || a->rank != 1 || af_attr_int(nd, "axis", 0) != 0 || nd->nin < 2 ||
            !const_index(nd->in[1], &k) || k < -a->n || k >= a->n)
            return false;
        out->d[0] = a->d[k < 0 ? k + a->n : k];
        out->n = 1;
        out->rank = nd->in[1]->type.rank;
        return out->ok = true;
    }
    case AF_OP_UNSQUEEZE:
    case AF_OP_SQUEEZE:
        if (!a || !nd->out[0] || nd->out[0]->type.rank < 0 || nd->out[0]->type.rank > 1) return false;
        *out = *a;
        out->rank = nd->out[0]->type.rank;
        return true;
    case AF_OP_CAST:
    case AF_OP_IDENTITY:
        if (!a || !nd->out[0] ||
            (nd->out[0]->type.dtype != AF_DTYPE_INT64 && nd->out[0]->type.dtype != AF_DTYPE_INT32))
            return false;
        *out = *a;
        return true;
    case AF_OP_CONCAT:
        if (af_attr_int(nd, "axis", 0) != 0 && af_attr_int(nd, "axis", 0) != -1) return false;
        for (int i = 0; i < nd->nin; i++) {
            vec si;
            const vec *x = arg(V, nd, i, &si);
            if (!x || x->rank != 1 || out->n + x->n > AF_MAX_RANK) return false;
            memcpy(out->d + out->n, x->d, sizeof(int64_t) * (size_t)x->n);
            out->n += x->n;
        }
        out->rank = 1;
        return out->ok = true;
    case AF_OP_MUL:
    case AF_OP_DIV:
    case AF_OP_ADD:
    case AF_OP_SUB:
        b = arg(V, nd, 1, &s1);
        return a && b && arith(nd->graph, nd->op, a, b, out);
    case AF_OP_SLICE:
        return a && slice(nd, a, out);
    default:
        return false;
    }
}

/* Replace v by a constant holding its (all known) vector. */
static af_status to_const(pass_scope *s, af_value *v, const vec *x, bool *changed, af_error *err) {
    int64_t n = x->n;
    const char *name = af_graph_unique_name(s->g, v->name ? v->name : "shape");
    af_value *c = name ? af_value_new_const(s->g, name, v->type.dtype, x->rank, &n) : NULL;
    if (!c) return af_fail(err, AF_ERR_NOMEM, "out of memory folding shapes");
    for (int i = 0; i < x->n; i++) {
        if (v->type.dtype == AF_DTYPE_INT64) ((int64_t *)c->type.data)[i] = x->d[i];
        else ((int32_t *)c->type.data)[i] = (int32_t)x->d[i];
    }
    af_value_replace_uses(v, c);
    *changed = true;
    return AF_OK;
}

/* Point input 1 of a Reshape or Expand at a constant equivalent to the vector x. */
static af_status to_const_shape(pass_scope *s, af_node *nd, const vec *x, bool *changed,
                                af_error *err) {
    const af_tensor *in = &nd->in[0]->type;
    af_tensor to = {.dtype = in->dtype, .rank = x->n};
    int64_t shape[AF_MAX_RANK], rank = x->n;
    if (nd->op == AF_OP_RESHAPE) {
        bool allowzero = af_attr_int(nd, "allowzero", 0) != 0;
        for (int i = 0; i < x->n; i++)
            to.dims[i] = x->d[i] == 0 && !allowzero ? (i < in->rank ? in->dims[i] : -1) : x->d[i];
        if (!af_reshape_shape(in, &to, shape)) return AF_OK;
    } else { /* Expand: 1 keeps the input's (right-aligned) dim */
        for (int i = 0; i < x->n; i++) {
            int k = i - (x->n - in->rank);
            bool keep = k >= 0 && in->dims[k] == x->d[i];
            if (x->d[i] >= 0) shape[i] = x->d[i];
            else if (keep) shape[i] = 1;
            else return AF_OK;
        }
    }
    const char *name = af_graph_unique_name(s->g, "shape");
    af_value *c = name ? af_value_new_const(s->g, name, AF_DTYPE_INT64, 1, &rank) : NULL;
    if (!c) return af_fail(err, AF_ERR_NOMEM, "out of memory folding shapes");
    memcpy(c->type.data, shape, sizeof(int64_t) * (size_t)rank);
    af_node_set_input(nd, 1, c);
    *changed = true;
    return AF_OK;
}

/* Dims the shape functions cannot see, from vectors: ConstantOfShape's, and a Slice's with a
 * symbolic end (see the file's comment). Only dims still unknown change. */
static bool refine(const vecs *V, af_node *nd) {
    af_tensor *y = &nd->out[0]->type;
    const vec *x = nd->nin > 1 || nd->op == AF_OP_CONSTANT_OF_SHAPE
                       ? vec_of(V, nd->in[nd->op == AF_OP_CONSTANT_OF_SHAPE ? 0 : 2], nd->graph)
                       : NULL;
    bool changed = false;
    if (!x || y->rank < 0) return false;
    if (nd->op == AF_OP_CONSTANT_OF_SHAPE && x->rank == 1 && y->rank == x->n) {
        for (int i = 0; i < x->n; i++)
            if (y->dims[i] == AF_DIM_UNKNOWN) y->dims[i] = x->d[i], changed = true;
    } else if (nd->op == AF_OP_SLICE && x->n == 1 && nd->nin >= 4) {
        int64_t st, ax, step = 1;
        int a;
        if (!const_index(nd->in[1], &st) || st != 0 || !const_index(nd->in[3], &ax) ||
            (nd->nin > 4 && nd->in[4] && (!const_index(nd->in[4], &step) || step != 1)) ||
            !af_axis(ax, y->rank, &a) || !af_dim_is_sym(x->d[0]) || y->dims[a] != AF_DIM_UNKNOWN)
            return false;
        y->dims[a] = x->d[0];
        changed = true;
    }
    return changed;
}

af_status pass_fold_symbolic(pass_scope *s, bool *changed, af_error *err) {
    af_graph *g = s->g;
    vecs V = {af_calloc((size_t)g->nvalues + 1, sizeof(vec)), g->nvalues};
    if (!V.v) return af_fail(err, AF_ERR_NOMEM, "out of memory folding shapes");
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *nd = g->nodes[i];
        if (pass_dead(s, nd) || nd->nout < 1 || !nd->out[0]) continue;
        const vec *shape = nd->nin == 2 && nd->in[0] ? vec_of(&V, nd->in[1], g) : NULL;
        if ((nd->op == AF_OP_RESHAPE || nd->op == AF_OP_EXPAND) && shape)
            st = to_const_shape(s, nd, shape, changed, err);
        if ((nd->op == AF_OP_CONSTANT_OF_SHAPE || nd->op == AF_OP_SLICE) && refine(&V, nd))
            *changed = true;
        af_value *y = nd->out[0];
        vec *x = y->id < V.n ? &V.v[y->id] : NULL;
        if (st || !x || y->is_const || !eval(&V, nd, x)) continue;
        bool known = true;
        for (int k = 0; k < x->n; k++) known = known && x->d[k] >= 0;
        if (known && !pass_pinned(s, y) &&
            (y->type.dtype == AF_DTYPE_INT64 || y->type.dtype == AF_DTYPE_INT32))
            st = to_const(s, y, x, changed, err);
    }
    af_free(V.v);
    return st;
}
