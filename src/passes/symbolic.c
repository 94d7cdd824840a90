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
 *  - Equal and Where evaluate on vectors too (torch's expand(n, -1, -1) writes
 *    Where(Equal(shape, -1), 1, shape)), and an Expand that cannot get a constant shape gets
 *    its output dims from the vector;
 *  - ConstantOfShape's output gets the vector as its dims, and a Slice whose end on one axis is
 *    a symbol E (start 0 or a dim S, step 1) gets E (E - S) on that axis. That takes E to be
 *    within the sliced dim, as in x[:, :seq] of a position table or GPT-2's causal buffer
 *    bias[:, :, k - q : k, :k]; a run where it is not still computes the true shape (the
 *    executor infers shapes from the data), and a fused op's shape function refuses it;
 *  - a Reshape whose vector has no constant equivalent ([B*S, E] into [B, S, -1]) gets its
 *    output dims from the vector;
 *  - a Range(start, limit, 1) of dims is limit - start long when that is exact (a sum leaf
 *    minus one of its terms: GPT-2's arange(past, past + seq)).
 * The shape nodes left without readers die in simplify's dead-code sweep.
 *
 * Invariant: a vector is exact. An element is known only when every path of the computation is
 * a rule below (a product is a product, a division is exact); anything else gives the value no
 * vector, and the graph keeps computing it at run time. An element is a number (negative ones,
 * the -1 of "infer", are flagged as such, since a symbol is a negative number too) or a symbol;
 * arithmetic with a negative number is done only between numbers. */
#include "passes/rewrite.h"

#include <string.h>

typedef struct vec {
    bool ok;
    int n;                   /* elements */
    int rank;                /* 0 (a scalar) or 1 */
    int64_t d[AF_MAX_RANK];  /* dims: >= 0 or symbolic; or negative numbers (neg) */
    unsigned neg;            /* bit i: d[i] is a negative number, not a symbol */
} vec;

/* One element: a number, or (num false) a symbolic dim. */
typedef struct elt {
    int64_t v;
    bool num;
} elt;

static elt at(const vec *x, int i) {
    return (elt){x->d[i], x->d[i] >= 0 || ((x->neg >> i) & 1u)};
}

static void put(vec *x, int i, elt e) {
    x->d[i] = e.v;
    if (e.num && e.v < 0) x->neg |= 1u << i;
    else x->neg &= ~(1u << i);
}

/* Element i of x broadcast to n elements (x has n or 1). */
static elt bat(const vec *x, int i) { return at(x, x->n == 1 ? 0 : i); }

/* Do a and b (and c) broadcast to n elements? */
static int bcast_n(const vec *a, const vec *b, const vec *c) {
    int n = a->n > b->n ? a->n : b->n;
    if (c && c->n > n) n = c->n;
    if ((a->n != n && a->n != 1) || (b->n != n && b->n != 1) || (c && c->n != n && c->n != 1))
        return -1;
    return n;
}

/* A constant integer tensor of rank <= 1 with AF_MAX_RANK elements at most. */
static bool from_const(const af_value *v, vec *out) {
    const af_tensor *t = &v->type;
    if (!af_value_is_const(v) || (t->dtype != AF_DTYPE_INT64 && t->dtype != AF_DTYPE_INT32) ||
        t->rank > 1)
        return false;
    int64_t n = af_tensor_numel(t);
    if (n < 0 || n > AF_MAX_RANK) return false;
    for (int64_t i = 0; i < n; i++) put(out, (int)i, (elt){af_tensor_get_int(t, i), true});
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

/* Elementwise Mul/Div/Add/Sub of two vectors, numpy-broadcast (a scalar or a [1] side). Numbers
 * compute as numbers (Div of non-negative ones only: truncation and floor agree there); a
 * symbol multiplies and divides exactly; a sum with it is a sum leaf, and a difference is
 * known only when exact (a sum leaf minus one of its terms: ir.h). */
static bool arith(af_graph *g, af_op op, const vec *a, const vec *b, vec *out) {
    int n = bcast_n(a, b, NULL);
    if (n < 0) return false;
    for (int i = 0; i < n; i++) {
        elt x = bat(a, i), y = bat(b, i);
        int64_t r = 0;
        bool ok;
        if (x.num && y.num) {
            if (op == AF_OP_MUL) ok = af_mul_i64(x.v, y.v, &r);
            else if (op == AF_OP_ADD) ok = af_add_i64(x.v, y.v, &r);
            else if (op == AF_OP_SUB) ok = !__builtin_sub_overflow(x.v, y.v, &r);
            else ok = x.v >= 0 && y.v > 0 && ((r = x.v / y.v), true);
        } else {
            ok = (x.num ? x.v >= 0 : true) && (y.num ? y.v >= 0 : true);
            r = !ok ? AF_DIM_UNKNOWN
                : op == AF_OP_MUL ? af_dim_mul(g, x.v, y.v)
                : op == AF_OP_DIV ? af_dim_div(g, x.v, y.v)
                : op == AF_OP_ADD ? af_dim_add(g, x.v, y.v) : af_dim_sub(g, x.v, y.v);
            ok = r != AF_DIM_UNKNOWN;
        }
        if (!ok) return false;
        put(out, i, (elt){r, x.num && y.num});
    }
    out->n = n;
    out->rank = a->rank > b->rank ? a->rank : b->rank;
    return out->ok = true;
}

/* Equal: numbers compare; a dim equals itself and never a negative number; else not known. */
static bool equal(const vec *a, const vec *b, vec *out) {
    int n = bcast_n(a, b, NULL);
    if (n < 0) return false;
    for (int i = 0; i < n; i++) {
        elt x = bat(a, i), y = bat(b, i);
        if (x.num == y.num && x.v == y.v) put(out, i, (elt){1, true});
        else if (x.num && y.num) put(out, i, (elt){0, true});
        else if ((x.num && x.v < 0) || (y.num && y.v < 0)) put(out, i, (elt){0, true});
        else return false;
    }
    out->n = n;
    out->rank = a->rank > b->rank ? a->rank : b->rank;
    return out->ok = true;
}

/* Where(c, x, y) with every condition element a number. */
static bool where(const vec *c, const vec *x, const vec *y, vec *out) {
    int n = bcast_n(c, x, y);
    if (n < 0) return false;
    for (int i = 0; i < n; i++) {
        elt k = bat(c, i);
        if (!k.num) return false;
        put(out, i, k.v ? bat(x, i) : bat(y, i));
    }
    out->n = n;
    out->rank = c->rank > x->rank ? c->rank : x->rank;
    if (y->rank > out->rank) out->rank = y->rank;
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
    for (int i = 0; i < out->n; i++) put(out, i, at(x, (int)st + i));
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
        put(out, 0, at(a, (int)(k < 0 ? k + a->n : k)));
        out->n = 1;
        out->rank = nd->in[1]->type.rank;
        return out->ok = true;
    }
    case AF_OP_UNSQUEEZE:
    case AF_OP_SQUEEZE:
    case AF_OP_RESHAPE: /* of a vector into a vector or a scalar */
        if (!a || !nd->out[0] || nd->out[0]->type.rank < 0 || nd->out[0]->type.rank > 1 ||
            (nd->out[0]->type.rank == 1 && nd->out[0]->type.dims[0] != a->n) ||
            (nd->out[0]->type.rank == 0 && a->n != 1))
            return false;
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
            for (int k = 0; k < x->n; k++) put(out, out->n + k, at(x, k));
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
    case AF_OP_EQUAL:
        b = arg(V, nd, 1, &s1);
        return a && b && equal(a, b, out);
    case AF_OP_WHERE: {
        vec s2;
        const vec *c = arg(V, nd, 2, &s2);
        b = arg(V, nd, 1, &s1);
        return a && b && c && where(a, b, c, out);
    }
    default:
        return false;
    }
}

/* Every element a number. */
static bool all_numbers(const vec *x) {
    for (int k = 0; k < x->n; k++)
        if (!at(x, k).num) return false;
    return true;
}

/* Replace v by a constant holding its vector of numbers. */
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

/* Reshape's shape as a constant: numbers as they are (0 copies unless allowzero, -1 infers), a
 * symbol 0 where it is the input's dim at the same position, else the one -1. */
static bool reshape_shape(const af_node *nd, const vec *x, int64_t *shape) {
    const af_tensor *in = &nd->in[0]->type;
    bool allowzero = af_attr_int(nd, "allowzero", 0) != 0;
    int infer = 0;
    for (int i = 0; i < x->n; i++) {
        elt e = at(x, i);
        if (e.num) shape[i] = e.v;
        else if (!allowzero && i < in->rank && in->dims[i] == e.v) shape[i] = 0;
        else shape[i] = -1;
        if (shape[i] < -1 || (shape[i] == -1 && ++infer > 1)) return false;
    }
    return true;
}

/* Expand's shape as a constant: numbers, and 1 where a symbol is the input's (right-aligned)
 * dim. */
static bool expand_shape(const af_node *nd, const vec *x, int64_t *shape) {
    const af_tensor *in = &nd->in[0]->type;
    for (int i = 0; i < x->n; i++) {
        elt e = at(x, i);
        int k = i - (x->n - in->rank);
        if (e.num && e.v >= 0) shape[i] = e.v;
        else if (!e.num && k >= 0 && in->dims[k] == e.v) shape[i] = 1;
        else return false;
    }
    return true;
}

/* Point input 1 of a Reshape or Expand at a constant equivalent to the vector x, when there is
 * one. */
static af_status to_const_shape(pass_scope *s, af_node *nd, const vec *x, bool *changed,
                                af_error *err) {
    int64_t shape[AF_MAX_RANK];
    if (x->rank != 1 || nd->in[0]->type.rank < 0) return AF_OK;
    if (!(nd->op == AF_OP_RESHAPE ? reshape_shape(nd, x, shape) : expand_shape(nd, x, shape)))
        return AF_OK;
    af_value *c = af_value_new_ints(s->g, "shape", x->n, shape);
    if (!c) return af_fail(err, AF_ERR_NOMEM, "out of memory folding shapes");
    af_node_set_input(nd, 1, c);
    *changed = true;
    return AF_OK;
}

/* Expand's output dims from its input's and the vector: the broadcast of the two, where an
 * element 1 keeps the input's dim. */
static bool refine_expand(const af_tensor *in, const vec *x, af_tensor *y) {
    bool changed = false;
    if (in->rank < 0 || y->rank != (in->rank > x->n ? in->rank : x->n)) return false;
    for (int i = 0; i < y->rank; i++) {
        int k = i - (y->rank - in->rank), j = i - (y->rank - x->n);
        int64_t a = k >= 0 ? in->dims[k] : 1, d = AF_DIM_UNKNOWN;
        elt e = j >= 0 ? at(x, j) : (elt){1, true};
        if (e.num && e.v == 1) d = a;
        else if (a == 1 || a == e.v) d = e.num && e.v < 0 ? AF_DIM_UNKNOWN : e.v;
        if (y->dims[i] == AF_DIM_UNKNOWN && d != AF_DIM_UNKNOWN) y->dims[i] = d, changed = true;
    }
    return changed;
}

/* Dims the shape functions cannot see, from vectors: ConstantOfShape's, Expand's, and a Slice's
 * with a symbolic end (see the file's comment). Only dims still unknown change. */
static bool refine(const vecs *V, af_node *nd) {
    af_tensor *y = &nd->out[0]->type;
    int from = nd->op == AF_OP_CONSTANT_OF_SHAPE ? 0 : nd->op == AF_OP_EXPAND ? 1 : 2;
    const vec *x = from < nd->nin ? vec_of(V, nd->in[from], nd->graph) : NULL;
    bool changed = false;
    if (!x || y->rank < 0) return false;
    if (nd->op == AF_OP_EXPAND) return nd->in[0] && refine_expand(&nd->in[0]->type, x, y);
    if (nd->op == AF_OP_CONSTANT_OF_SHAPE && x->rank == 1 && y->rank == x->n) {
        for (int i = 0; i < x->n; i++)
            if (y->dims[i] == AF_DIM_UNKNOWN && !(at(x, i).num && x->d[i] < 0))
                y->dims[i] = x->d[i], changed = true;
    } else if (nd->op == AF_OP_SLICE && x->n == 1 && nd->nin >= 4) {
        int64_t st, ax, step = 1, len;
        int a;
        const vec *sv = vec_of(V, nd->in[1], nd->graph);
        if (const_index(nd->in[1], &st)) {
            if (st != 0) return false;
        } else if (sv && sv->n == 1 && !(at(sv, 0).num && sv->d[0] < 0)) {
            st = sv->d[0]; /* a symbolic start: x[..., E - n : E] is n long */
        } else {
            return false;
        }
        if (!const_index(nd->in[3], &ax) ||
            (nd->nin > 4 && nd->in[4] && (!const_index(nd->in[4], &step) || step != 1)) ||
            !af_axis(ax, y->rank, &a) || at(x, 0).num || y->dims[a] != AF_DIM_UNKNOWN ||
            (len = af_dim_sub(nd->graph, x->d[0], st)) == AF_DIM_UNKNOWN)
            return false;
        y->dims[a] = len;
        changed = true;
    }
    return changed;
}

/* A Reshape whose shape has a vector but no constant equivalent ([B*S, E] into [B, S, -1]:
 * two symbols where the input has neither) gets its output dims from the vector: numbers, 0
 * as the input's dim (without allowzero), symbols, and the one -1 as what is left of the input's
 * element count. Only dims still unknown change. */
static bool refine_reshape(const vec *x, af_node *nd) {
    af_tensor *y = &nd->out[0]->type;
    const af_tensor *in = &nd->in[0]->type;
    bool allowzero = af_attr_int(nd, "allowzero", 0) != 0, changed = false;
    int64_t dims[AF_MAX_RANK], known = 1;
    int infer = -1;
    if (x->rank != 1 || y->rank != x->n || !af_dims_defined(in)) return false;
    for (int i = 0; i < x->n; i++) {
        elt e = at(x, i);
        if (e.num && e.v == -1 && infer < 0) infer = i, dims[i] = 1;
        else if (e.num && e.v == 0 && !allowzero && i < in->rank) dims[i] = in->dims[i];
        else if (!e.num || e.v >= 0) dims[i] = e.v;
        else return false;
        if (i != infer && (known = af_dim_mul(nd->graph, known, dims[i])) == AF_DIM_UNKNOWN)
            return false;
    }
    if (infer >= 0 &&
        (dims[infer] = af_dim_div(nd->graph, af_dims_product(nd->graph, in->dims, in->rank),
                                  known)) == AF_DIM_UNKNOWN)
        return false;
    for (int i = 0; i < y->rank; i++)
        if (y->dims[i] == AF_DIM_UNKNOWN) y->dims[i] = dims[i], changed = true;
    return changed;
}

/* Range(start, limit, 1) over dims is limit - start long when that difference is exact
 * (arange(past, past + seq) of GPT-2's positions is seq long). */
static bool refine_range(const vecs *V, af_node *nd) {
    af_tensor *y = &nd->out[0]->type;
    int64_t step, len;
    if (nd->nin != 3 || y->rank != 1 || y->dims[0] != AF_DIM_UNKNOWN ||
        !const_index(nd->in[2], &step) || step != 1)
        return false;
    const vec *a = vec_of(V, nd->in[0], nd->graph), *b = vec_of(V, nd->in[1], nd->graph);
    if (!a || !b || a->n != 1 || b->n != 1 || (at(a, 0).num && a->d[0] < 0) ||
        (at(b, 0).num && b->d[0] < 0) ||
        (len = af_dim_sub(nd->graph, b->d[0], a->d[0])) == AF_DIM_UNKNOWN)
        return false;
    y->dims[0] = len;
    return true;
}

af_status pass_fold_symbolic(pass_scope *s, bool *changed, af_error *err) {
    af_graph *g = s->g;
    vecs V = {af_calloc((size_t)g->nvalues + 1, sizeof(vec)), g->nvalues};
    if (!V.v) return af_fail(err, AF_ERR_NOMEM, "out of memory folding shapes");
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *nd = g->nodes[i];
        if (pass_dead(s, nd) || nd->nout < 1 || !nd->out[0]) continue;
        /* Types as of this sweep, so that a symbol found upstream reaches the next Shape now,
         * not one simplify round per layer later. An error is left to the run (simplify's
         * rule). */
        af_error scratch;
        af_tensor before = {.rank = -1};
        af_tensor_type_copy(&before, &nd->out[0]->type);
        (void)af_node_infer_shape(nd, &scratch);
        const vec *shape = nd->nin == 2 && nd->in[0] ? vec_of(&V, nd->in[1], g) : NULL;
        if ((nd->op == AF_OP_RESHAPE || nd->op == AF_OP_EXPAND) && shape)
            st = to_const_shape(s, nd, shape, changed, err);
        /* The shape function forgets a refined dim every sweep; refining it again is a change
         * only when the dims differ from the last sweep's (else simplify never settles). */
        bool refined = false;
        if (!st && nd->op == AF_OP_RESHAPE && shape && !af_value_is_const(nd->in[1]))
            refined = refine_reshape(shape, nd);
        if (nd->op == AF_OP_CONSTANT_OF_SHAPE || nd->op == AF_OP_SLICE || nd->op == AF_OP_EXPAND)
            refined = refine(&V, nd);
        if (nd->op == AF_OP_RANGE) refined = refine_range(&V, nd);
        const af_tensor *now = &nd->out[0]->type;
        if (refined && (now->rank != before.rank ||
                        memcmp(now->dims, before.dims, sizeof(int64_t) * (size_t)(now->rank > 0 ? now->rank : 0))))
            *changed = true;
        af_value *y = nd->out[0];
        vec *x = y->id < V.n ? &V.v[y->id] : NULL;
        if (st || !x || y->is_const || !eval(&V, nd, x)) continue;
        if (all_numbers(x) && !pass_pinned(s, y) &&
            (y->type.dtype == AF_DTYPE_INT64 || y->type.dtype == AF_DTYPE_INT32))
            st = to_const(s, y, x, changed, err);
    }
    af_free(V.v);
    return st;
}
