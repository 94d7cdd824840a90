/* Einsum of two operands as one batched MatMul (a step of canonicalize): every letter of the
 * equation is a batch letter (in both operands and the output), a contracted one (in both, not
 * in the output) or a kept one of one operand (in it and the output). A is transposed to
 * [batch, kept of A, contracted] and reshaped to [B, M, K], B to [batch, contracted, kept of
 * B] as [B, K, N]; the MatMul's [B, M, N] is reshaped to the letters' dims and transposed into
 * the output's order (identity transposes and reshapes are not made). The MatMul then runs on
 * the GEMM core, and a constant operand's transpose folds into packed weights; the reference
 * Einsum summed element by element in double: 'bchw,cd->bdhw' over 64 x 64 x 64 took 323 ms,
 * ONNX Runtime 3.6.
 *
 * Left to the Einsum kernel: other operand counts, "...", implicit outputs, a letter twice in
 * one term (diagonals), a letter summed in one operand only, dims that differ between the
 * operands (broadcast 1s), dims unknown at compile time, non-float32 operands.
 *
 * Invariant: the rewrite computes the Einsum's sums in the GEMM's order, every product once. */
#include "passes/rewrite.h"

#include <ctype.h>
#include <string.h>

enum { ES_BATCH, ES_KEPT_A, ES_KEPT_B, ES_SUM };

typedef struct es_eq {
    char term[3][AF_MAX_RANK + 1]; /* A, B, output */
    int len[3];
} es_eq;

/* "ab,bc->ac" with spaces dropped; false for anything this rewrite leaves alone. */
static bool es_parse(const char *eq, es_eq *e) {
    int t = 0, k = 0;
    memset(e, 0, sizeof *e);
    for (const char *p = eq; *p; p++) {
        if (*p == ' ') continue;
        if (*p == ',' && t == 0) {
            e->len[t++] = k, k = 0;
        } else if (*p == '-' && p[1] == '>' && t == 1) {
            e->len[t++] = k, k = 0, p++;
        } else if (isalpha((unsigned char)*p) && k < AF_MAX_RANK) {
            for (int i = 0; i < k; i++)
                if (e->term[t][i] == *p) return false; /* a diagonal */
            e->term[t][k++] = *p;
        } else {
            return false;
        }
    }
    e->len[t] = k;
    return t == 2;
}

static int es_find(const es_eq *e, int t, char c) {
    for (int i = 0; i < e->len[t]; i++)
        if (e->term[t][i] == c) return i;
    return -1;
}

static bool dims_known(const af_tensor *t, int rank) {
    if (t->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (t->dims[i] < 1) return false;
    return true;
}

/* A new float32 value of the given dims. */
static af_value *es_value(pass_scope *s, int rank, const int64_t *dims) {
    const char *name = af_graph_unique_name(s->g, "einsum");
    af_value *v = name ? af_value_new(s->g, name) : NULL;
    if (!v) return NULL;
    v->type.dtype = AF_DTYPE_FLOAT;
    v->type.rank = rank;
    memcpy(v->type.dims, dims, sizeof(int64_t) * (size_t)rank);
    return v;
}

/* x transposed by perm (no node for the identity), then reshaped to dims (no node when they
 * are x's already); the last node made writes `out` when given. Returns the result, or NULL
 * when out of memory. */
static af_value *es_move(pass_scope *s, const af_node *anchor, af_value *x, const int64_t *perm,
                         const int64_t *dims, int drank, af_value *out) {
    int rank = x->type.rank;
    bool ident = true;
    int64_t td[AF_MAX_RANK] = {0};
    for (int i = 0; i < rank; i++) {
        ident = ident && perm[i] == i;
        td[i] = x->type.dims[perm[i]];
    }
    bool reshape = drank != rank || memcmp(td, dims, sizeof(int64_t) * (size_t)rank);
    if (!ident) {
        af_value *t = !reshape && out ? out : es_value(s, rank, td);
        af_node *tr = t ? pass_node_new(s, AF_OP_TRANSPOSE, anchor, 1, 1) : NULL;
        if (!tr || !af_node_set_ints(tr, "perm", perm, rank)) return NULL;
        af_node_set_input(tr, 0, x);
        af_node_set_output(tr, 0, t);
        x = t;
    }
    if (!reshape) return x;
    int64_t r = drank;
    const char *name = af_graph_unique_name(s->g, "shape");
    af_value *c = name ? af_value_new_const(s->g, name, AF_DTYPE_INT64, 1, &r) : NULL;
    af_value *y = c ? (out ? out : es_value(s, drank, dims)) : NULL;
    af_node *rs = y ? pass_node_new(s, AF_OP_RESHAPE, anchor, 2, 1) : NULL;
    if (!rs) return NULL;
    memcpy(c->type.data, dims, sizeof(int64_t) * (size_t)drank);
    af_node_set_input(rs, 0, x);
    af_node_set_input(rs, 1, c);
    af_node_set_output(rs, 0, y);
    return y;
}

typedef struct es_groups {
    char c[4][AF_MAX_RANK]; /* the letters of each role */
    int n[4];
    int64_t size[4];        /* the product of their dims */
} es_groups;

/* Letter c into role g, its dim the same in every term that has it; false when they differ. */
static bool es_add(es_groups *gr, int g, char c, const es_eq *e, const af_value *const *v) {
    int64_t d = -1;
    for (int t = 0; t < 3; t++) {
        int i = es_find(e, t, c);
        if (i < 0) continue;
        if (d >= 0 && v[t]->type.dims[i] != d) return false;
        d = v[t]->type.dims[i];
    }
    gr->c[g][gr->n[g]++] = c;
    gr->size[g] *= d;
    return true;
}

af_status pass_einsum_matmul(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    es_eq e;
    af_value *a = n->nin == 2 ? n->in[0] : NULL, *b = n->nin == 2 ? n->in[1] : NULL;
    af_value *y = n->nout == 1 ? n->out[0] : NULL;
    if (!a || !b || !y || !es_parse(af_attr_str(n, "equation", ""), &e) ||
        a->type.dtype != AF_DTYPE_FLOAT || b->type.dtype != AF_DTYPE_FLOAT ||
        !dims_known(&a->type, e.len[0]) || !dims_known(&b->type, e.len[1]) ||
        !dims_known(&y->type, e.len[2]))
        return AF_OK;
    const af_value *v[3] = {a, b, y};
    es_groups gr = {.size = {1, 1, 1, 1}};
    for (int i = 0; i < e.len[2]; i++) { /* output letters, in its order */
        char c = e.term[2][i];
        int ia = es_find(&e, 0, c), ib = es_find(&e, 1, c);
        int g = ia >= 0 && ib >= 0 ? ES_BATCH : ia >= 0 ? ES_KEPT_A : ES_KEPT_B;
        if ((ia < 0 && ib < 0) || !es_add(&gr, g, c, &e, v)) return AF_OK;
    }
    for (int i = 0; i < e.len[0]; i++) { /* contracted letters, in A's order */
        char c = e.term[0][i];
        if (es_find(&e, 2, c) >= 0) continue;
        if (es_find(&e, 1, c) < 0 || !es_add(&gr, ES_SUM, c, &e, v)) return AF_OK;
    }
    for (int i = 0; i < e.len[1]; i++) /* a letter summed in B alone */
        if (es_find(&e, 0, e.term[1][i]) < 0 && es_find(&e, 2, e.term[1][i]) < 0) return AF_OK;
    /* A as [batch, kept A, sum], B as [batch, sum, kept B]; the MatMul's letters as [batch,
     * kept A, kept B], which po takes to the output's order */
    static const int oa[3] = {ES_BATCH, ES_KEPT_A, ES_SUM}, ob[3] = {ES_BATCH, ES_SUM, ES_KEPT_B};
    static const int om[3] = {ES_BATCH, ES_KEPT_A, ES_KEPT_B};
    int64_t pa[AF_MAX_RANK], pb[AF_MAX_RANK], po[AF_MAX_RANK], mid[AF_MAX_RANK], ident[AF_MAX_RANK];
    int ka = 0, kb = 0, km = 0;
    for (int q = 0; q < 3; q++) {
        for (int i = 0; i < gr.n[oa[q]]; i++) pa[ka++] = es_find(&e, 0, gr.c[oa[q]][i]);
        for (int i = 0; i < gr.n[ob[q]]; i++) pb[kb++] = es_find(&e, 1, gr.c[ob[q]][i]);
        for (int i = 0; i < gr.n[om[q]]; i++, km++) {
            int io = es_find(&e, 2, gr.c[om[q]][i]);
            mid[km] = y->type.dims[io];
            po[io] = km;
        }
    }
    for (int i = 0; i < AF_MAX_RANK; i++) ident[i] = i;
    bool batched = gr.size[ES_BATCH] > 1, moved = false;
    for (int i = 0; i < km; i++) moved = moved || po[i] != i;
    int64_t da[3] = {gr.size[ES_BATCH], gr.size[ES_KEPT_A], gr.size[ES_SUM]};
    int64_t db[3] = {gr.size[ES_BATCH], gr.size[ES_SUM], gr.size[ES_KEPT_B]};
    int64_t dm[3] = {gr.size[ES_BATCH], gr.size[ES_KEPT_A], gr.size[ES_KEPT_B]};
    int r = batched ? 3 : 2, off = batched ? 0 : 1;
    bool direct = !moved && km == r && !memcmp(mid, dm + off, sizeof(int64_t) * (size_t)r);
    af_status st = pass_kill(s, n, err);
    if (st) return st;
    af_value *ma = es_move(s, n, a, pa, da + off, r, NULL);
    af_value *mb = ma ? es_move(s, n, b, pb, db + off, r, NULL) : NULL;
    af_value *mm = !mb ? NULL : direct ? y : es_value(s, r, dm + off);
    af_node *mat = mm ? pass_node_new(s, AF_OP_MATMUL, n, 2, 1) : NULL;
    if (!mat) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_node_set_input(mat, 0, ma);
    af_node_set_input(mat, 1, mb);
    af_node_set_output(mat, 0, mm);
    if (!direct) { /* to the letters' dims, then into the output's order */
        af_value *l = es_move(s, n, mm, ident, mid, km, moved ? NULL : y);
        if (!l || (moved && !es_move(s, n, l, po, y->type.dims, km, y)))
            return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    }
    *hit = true;
    return AF_OK;
}
