/* MultiHeadAttentionFusionOp: per-head reshapes/transposes of q, k and v, QK^T, scale (Div or Mul
 * by a constant, on the scores or on q/k), optional additive mask (T5's and Swin's relative
 * position bias is one), optional Where(keep, scores, fill) (GPT-2's causal mask: the keep mask
 * becomes an operand), Softmax over the keys, times V, transposes/reshape back to rows of H*D
 * ->  one FusedAttention node (kernels/ref/attention.c).
 *
 * The match starts at the Softmax and walks outward: back through the scores to the QK MatMul,
 * back through each operand's transposes to the Reshape that splits the hidden dim into heads
 * (and a constant Slice of a packed QKV projection, when there is one), forward from the PV
 * MatMul through transposes to the Reshape that merges the heads again. The projections feeding
 * q, k, v are left alone: the fused node reads their outputs in place. A 4-D q, k or v already in
 * [B, H, S, D] order that is not private to the pattern (GPT-2's past keys concatenated with the
 * new ones: a graph output, "present") or not made by a reshape/transpose is read as it is, head-major
 * (layout 2); the Concat stays, and the fused node reads its output, so Sk = past + new.
 *
 * Axis bookkeeping: every tensor on the way is described by labels, one per axis, each a short
 * product of symbols B (batch), H (heads), S (sequence), D (head dim), outer to inner. The
 * MatMuls fix the labels ([B][H][S][D] for 4-D operands, [B*H][S][D] for 3-D ones); transposes
 * permute them; at a Reshape the labels read outer to inner give the memory order, which must
 * be B,S,H,D or S,B,H,D (heads are an inner split of the hidden dim): that is what lets the
 * kernel address heads in place. Symbols of size 1 carry no memory order and are ignored there.
 *
 * The rule runs before MatMulBiasAct/Elementwise (rules.def), which would otherwise take the
 * score scale and mask Add into a FusedMatMul epilogue.
 *
 * Invariant: rule_attention_check accepts only what it fully checked: every value float32 with known
 * dims, every perm a permutation, every reshape shape and scale a constant, every intermediate
 * read exactly once (by the next node of the pattern) and not a graph output, shapes consistent
 * with hidden = H*D, and the fused node's inputs produced outside the pattern; it changes
 * nothing. rule_attention_apply builds the node from what check left in the match. Each refusal is a
 * short static reason for the report's near misses; AF_NO_MATCH only when there is no
 * MatMul -> [scale/mask] -> Softmax -> MatMul structure at all. */
#include "fusion/rule.h"

#include <float.h>
#include <math.h>
#include <string.h>

enum { SYM_B, SYM_H, SYM_S, SYM_D, SYM_W, NSYM }; /* W: which of a packed q, k, v */
enum { FA_MAX_CHAIN = 8 };

typedef struct fa_label {
    int n;      /* symbols in this axis: 1 or 2 */
    int sym[2]; /* outer to inner */
} fa_label;

/* One of q, k, v: where the fused node reads it. */
typedef struct fa_input {
    af_value *src;   /* rank-3 projection output (maybe packed), or the head-major tensor */
    int64_t col;     /* first column of head 0 in src's last dim */
    int order;       /* 0: rows b*S+s; 1: rows s*B+b; 2: head-major [B, H, S, D] */
    bool head_major; /* src is read as [B, H, S, D]: no reshape, no split */
    int64_t nw, which; /* packed by a Gather: W axis of size nw, this input's index; nw 0: not */
    af_value *shared; /* the Gather's input, also read by the other inputs' Gathers */
    af_node *reshape;
    af_value *split; /* the reshape's input: src itself, or a Slice of it */
    fa_label labels[AF_MAX_RANK]; /* of the reshape's output */
    int rank;
} fa_input;

typedef struct fa_match {
    af_match *am; /* the engine's match: covered nodes, anchor (the Softmax) first */
    af_node *softmax, *qk, *pv, *add, *where, *out_reshape;
    af_value *mask, *keep, *out;
    double fill; /* Where's value for dropped scores */
    fa_input in[3]; /* q, k, v */
    int64_t B, H, D, E, Sq, Sk;
    double scale;
    int rank; /* of the scores: 3 (heads merged into the batch) or 4 */
    int out_order, out_rank;
} fa_match;

/* ---- small checks ----------------------------------------------------------------------------- */

static const char *cover(fa_match *m, af_node *n) {
    return fuse_match_add(m->am, n) ? NULL : "pattern too long";
}

/* v is an intermediate of the pattern read by `reader`: NULL, or the engine's standard reason. */
static const char *edge(const af_value *v, const af_node *reader) {
    const char *why = fuse_edge(v);
    if (why) return why;
    return v->uses[0].node == reader ? NULL : "intermediate is read by another node";
}

/* The producer of v in g with one output, or NULL. */
static af_node *producer(const af_value *v, const af_graph *g) {
    af_node *p = v ? v->producer : NULL;
    return p && p->graph == g && p->nout == 1 && p->out[0] == v ? p : NULL;
}

/* Float32 of this rank with no unknown dim (symbolic ones, a batch or a sequence, are fine). */
static bool known_f32(const af_value *v, int rank) {
    return af_value_is_f32(v) && v->type.rank == rank && af_dims_defined(&v->type);
}

/* A float32 constant holding one finite number whose rank does not exceed `rank` (so it
 * cannot grow the other operand's shape when broadcast). */
static bool const_scalar(const af_value *v, int rank, double *out) {
    if (!af_value_is_const(v) || v->type.dtype != AF_DTYPE_FLOAT || v->type.rank > rank ||
        af_tensor_numel(&v->type) != 1)
        return false;
    *out = ((const float *)v->type.data)[0];
    return isfinite(*out);
}

/* Transpose's perm (default: reversed axes), checked to be a permutation of rank axes. */
static bool get_perm(const af_node *t, int rank, int *perm) {
    const int64_t *p = NULL;
    int np = af_attr_ints(t, "perm", &p);
    bool seen[AF_MAX_RANK] = {false};
    if (rank < 1 || rank > AF_MAX_RANK) return false;
    if (np < 0) {
        for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
        return true;
    }
    if (np != rank) return false;
    for (int i = 0; i < rank; i++) {
        if (p[i] < 0 || p[i] >= rank || seen[p[i]]) return false;
        seen[p[i]] = true;
        perm[i] = (int)p[i];
    }
    return true;
}

/* A Mul or Div of the chain value by a constant scalar: the chain side in *x, the factor it
 * contributes in *f. */
static bool scale_node(const af_node *n, af_value **x, double *f) {
    double c;
    if ((n->op != AF_OP_MUL && n->op != AF_OP_DIV) || n->nin != 2 || !n->in[0] || !n->in[1] ||
        n->nout != 1 || !n->out[0])
        return false;
    int rank = n->out[0]->type.rank;
    if (n->op == AF_OP_MUL) {
        for (int i = 0; i < 2; i++)
            if (const_scalar(n->in[1 - i], rank, &c) && !af_value_is_const(n->in[i])) {
                *x = n->in[i];
                *f = c;
                return true;
            }
        return false;
    }
    if (const_scalar(n->in[1], rank, &c) && c != 0.0 && !af_value_is_const(n->in[0])) {
        *x = n->in[0];
        *f = 1.0 / c;
        return true;
    }
    return false;
}

/* ---- labels ----------------------------------------------------------------------------------- */

static fa_label lab1(int s) { return (fa_label){1, {s, 0}}; }

/* The labels of a rank-`rank` MatMul operand whose last two axes are (a, b). */
static void operand_labels(fa_label *l, int rank, int a, int b) {
    if (rank == 4) {
        l[0] = lab1(SYM_B);
        l[1] = lab1(SYM_H);
    } else {
        l[0] = (fa_label){2, {SYM_B, SYM_H}};
    }
    l[rank - 2] = lab1(a);
    l[rank - 1] = lab1(b);
}

/* Element count of one axis (a symbolic product where B or S is); AF_DIM_UNKNOWN on overflow,
 * which known_f32 has ruled out as a dim. */
static int64_t label_size(af_graph *g, const fa_label *l, const int64_t *size) {
    int64_t p = 1;
    for (int i = 0; i < l->n; i++) p = af_dim_mul(g, p, size[l->sym[i]]);
    return p;
}

/* The symbols of size > 1 in memory order (labels read outer to inner); their count. */
static int memory_seq(const fa_label *l, int rank, const int64_t *size, int *seq) {
    int n = 0;
    for (int i = 0; i < rank; i++)
        for (int j = 0; j < l[i].n; j++)
            if (size[l[i].sym[j]] != 1) seq[n++] = l[i].sym[j];
    return n;
}

/* Memory order of a tensor with these labels: 0 for B,S,H,D, 1 for S,B,H,D, 2 when both fit
 * (B or S has size 1), -1 when neither does. */
static int memory_order(const fa_label *l, int rank, const int64_t *size) {
    static const fa_label want[2][4] = {
        {{1, {SYM_B, 0}}, {1, {SYM_S, 0}}, {1, {SYM_H, 0}}, {1, {SYM_D, 0}}},
        {{1, {SYM_S, 0}}, {1, {SYM_B, 0}}, {1, {SYM_H, 0}}, {1, {SYM_D, 0}}}};
    int have[2 * AF_MAX_RANK], ref[4], ok = 0;
    int n = memory_seq(l, rank, size, have);
    for (int o = 0; o < 2; o++) {
        int k = memory_seq(want[o], 4, size, ref);
        if (k == n && !memcmp(have, ref, sizeof(int) * (size_t)n)) ok |= 1 << o;
    }
    return ok == 3 ? 2 : ok == 1 ? 0 : ok == 2 ? 1 : -1;
}

/* Do a tensor's dims agree with its labels? */
static bool dims_fit(const af_value *v, const fa_label *l, int rank, const int64_t *size) {
    for (int i = 0; i < rank; i++)
        if (v->type.dims[i] != label_size(v->graph, &l[i], size)) return false;
    return true;
}

/* ---- the three input chains -------------------------------------------------------------------- */

/* Is x (labels l) to be read as it is, head-major? Its axes are exactly B, H, S, D (rank 4),
 * float32 with known dims, and the walk cannot go on: x is not private to the pattern (a graph
 * output, other readers) or no reshape/transpose (scale, for q and k) made it. */
static bool head_major(const af_value *x, const af_node *reader, const fa_label *l, int r,
                       bool may_scale) {
    static const int want[4] = {SYM_B, SYM_H, SYM_S, SYM_D};
    if (r != 4 || !known_f32(x, 4)) return false;
    for (int i = 0; i < 4; i++)
        if (l[i].n != 1 || l[i].sym[0] != want[i]) return false;
    if (edge(x, reader)) return true;
    const af_node *p = producer(x, reader->graph);
    af_value *next;
    double f;
    return !p || !(p->op == AF_OP_RESHAPE || (p->op == AF_OP_TRANSPOSE && p->nin == 1) ||
                   p->op == AF_OP_GATHER || (may_scale && scale_node(p, &next, &f)));
}

/* A Gather of one of q, k, v from a packed [W, ...] tensor (Swin's qkv.reshape(B, N, 3, H,
 * D).permute(2, 0, 3, 1, 4) then qkv[0], qkv[1], qkv[2]): axis 0, a constant scalar index. */
static const char *gather_which(fa_input *in, const af_node *p, int r) {
    int64_t k;
    const af_value *d = p->nin == 2 ? p->in[0] : NULL, *i = p->nin == 2 ? p->in[1] : NULL;
    if (!d || !i || af_attr_int(p, "axis", 0) != 0 || !af_value_is_const(i) || i->type.rank != 0 ||
        (i->type.dtype != AF_DTYPE_INT64 && i->type.dtype != AF_DTYPE_INT32) ||
        !known_f32(d, r + 1) || r + 1 > AF_MAX_RANK)
        return "q/k/v gather is not a constant index of a packed axis 0";
    in->nw = d->type.dims[0];
    k = af_tensor_get_int(&i->type, 0);
    if (in->nw < 1 || k < -in->nw || k >= in->nw) return "q/k/v gather index out of range";
    in->which = k < 0 ? k + in->nw : k;
    return NULL;
}

/* From the packed tensor x (labels l, rank r, read by the Gathers) back through transposes to
 * the Reshape that splits [W, H, D] out of the projection's last dim; nodes already covered by
 * another input's walk are not covered again. */
static const char *walk_shared(fa_match *m, fa_input *in, af_value *x, fa_label *l, int r) {
    const af_graph *g = m->softmax->graph;
    for (int step = 0;; step++) {
        const char *why;
        if (step == FA_MAX_CHAIN) return "q/k/v chain too long";
        if (x->is_output) return "packed q/k/v is a graph output";
        if (!known_f32(x, r)) return "q/k/v head tensor not float32 with known dims";
        af_node *p = producer(x, g);
        if (!p) return "q/k/v is not reshaped/transposed into heads";
        if (fuse_match_index(m->am, p) < 0 && (why = cover(m, p))) return why;
        if (p->op == AF_OP_RESHAPE) {
            in->reshape = p;
            memcpy(in->labels, l, sizeof(fa_label) * (size_t)r);
            in->rank = r;
            if (p->nin < 2 || !af_value_is_const(p->in[1])) return "head reshape shape is not constant";
            in->split = p->in[0];
            return NULL;
        }
        int perm[AF_MAX_RANK];
        fa_label lin[AF_MAX_RANK];
        if (p->op != AF_OP_TRANSPOSE || p->nin != 1) return "q/k/v is not reshaped/transposed into heads";
        if (!get_perm(p, r, perm)) return "transpose perm is not a permutation";
        for (int i = 0; i < r; i++) lin[perm[i]] = l[i];
        memcpy(l, lin, sizeof(fa_label) * (size_t)r);
        x = p->in[0];
    }
}

/* The input of a chain of Reshapes ending at `last` (each intermediate read only by the next),
 * back to the first of rank 3 ([rows, rows, H*D], what place_input reads): they are one
 * Reshape. GPT-2 at one token: the head Transpose of [B, 1, H, D] moves only a dim of 1,
 * canonicalize made it a Reshape, and the split became Reshape -> Reshape (the merge of the
 * heads after PV too: walk_output). */
static const char *reshapes_back(fa_match *m, af_node *last, af_value **src) {
    af_value *x = last->in[0];
    af_node *q;
    while (x->type.rank != 3 && (q = producer(x, m->softmax->graph)) && q->op == AF_OP_RESHAPE &&
           q->nin >= 1 && q->in[0] && !edge(x, last)) {
        const char *why = cover(m, q);
        if (why) return why;
        last = q;
        x = q->in[0];
    }
    *src = x;
    return NULL;
}

/* Walk back from a MatMul operand x (labels l, rank r) through transposes (and, for q and k,
 * scalar scales) to the Reshape that splits heads. `reader` is the node that reads x. */
static const char *walk_input(fa_match *m, fa_input *in, af_value *x, af_node *reader,
                              fa_label *l, int r, bool may_scale) {
    const af_graph *g = m->softmax->graph;
    for (int step = 0;; step++) {
        const char *why;
        if (step == FA_MAX_CHAIN) return "q/k/v chain too long";
        if (head_major(x, reader, l, r, may_scale)) {
            in->src = x;
            in->head_major = true;
            in->rank = r;
            memcpy(in->labels, l, sizeof(fa_label) * (size_t)r);
            return NULL;
        }
        if ((why = edge(x, reader))) return why;
        if (!known_f32(x, r)) return "q/k/v head tensor not float32 with known dims";
        af_node *p = producer(x, g);
        if (!p) return "q/k/v is not reshaped/transposed into heads";
        if ((why = cover(m, p))) return why;
        if (p->op == AF_OP_RESHAPE) {
            in->reshape = p;
            memcpy(in->labels, l, sizeof(fa_label) * (size_t)r);
            in->rank = r;
            if (p->nin < 2 || !af_value_is_const(p->in[1])) return "head reshape shape is not constant";
            return reshapes_back(m, p, &in->split);
        }
        double f;
        af_value *next = NULL;
        if (p->op == AF_OP_TRANSPOSE && p->nin == 1) {
            int perm[AF_MAX_RANK];
            fa_label lin[AF_MAX_RANK];
            if (!get_perm(p, r, perm)) return "transpose perm is not a permutation";
            for (int i = 0; i < r; i++) lin[perm[i]] = l[i];
            memcpy(l, lin, sizeof(fa_label) * (size_t)r);
            next = p->in[0];
        } else if (may_scale && scale_node(p, &next, &f)) {
            m->scale *= f;
        } else if (p->op == AF_OP_GATHER && !in->nw) {
            if ((why = gather_which(in, p, r))) return why;
            memmove(l + 1, l, sizeof(fa_label) * (size_t)r);
            l[0] = lab1(SYM_W);
            r++;
            next = p->in[0];
            in->shared = next;
            /* The packed tensor and the nodes that made it are read by the other inputs'
             * Gathers too: walk them without the single-reader guard (match_at checks that
             * every reader is in the pattern) and cover them once. */
            if ((why = walk_shared(m, in, next, l, r))) return why;
            return NULL;
        } else {
            return "q/k/v is not reshaped/transposed into heads";
        }
        reader = p;
        x = next;
    }
}

/* One constant int64/int32 element of Slice input i, if present. */
static bool slice_arg(const af_node *s, int i, bool *present, int64_t *v) {
    const af_value *a = i < s->nin ? s->in[i] : NULL;
    *present = a != NULL;
    if (!a) return true;
    if (!af_value_is_const(a) || (a->type.dtype != AF_DTYPE_INT64 && a->type.dtype != AF_DTYPE_INT32) ||
        af_tensor_numel(&a->type) != 1)
        return false;
    *v = af_tensor_get_int(&a->type, 0);
    return true;
}

/* The Slice absorbed into a packed-QKV read: one constant window [start, end) on the last axis
 * of `data` (rank 3), step 1. */
static bool slice_window(const af_node *s, const af_value *data, int64_t *start, int64_t *end) {
    int64_t st = 0, en = 0, ax = -1, step = 1, w = data->type.dims[2];
    if (s->nin == 1) { /* opset < 10: attributes */
        const int64_t *a = NULL, *b = NULL, *c = NULL;
        if (af_graph_opset(s->graph) >= 10 || af_attr_ints(s, "starts", &a) != 1 ||
            af_attr_ints(s, "ends", &b) != 1 || af_attr_ints(s, "axes", &c) != 1)
            return false;
        st = a[0];
        en = b[0];
        ax = c[0];
    } else {
        bool has_st, has_en, has_ax, has_step;
        if (!slice_arg(s, 1, &has_st, &st) || !slice_arg(s, 2, &has_en, &en) ||
            !slice_arg(s, 3, &has_ax, &ax) || !slice_arg(s, 4, &has_step, &step) || !has_st ||
            !has_en || !has_ax)
            return false;
    }
    if (ax != 2 && ax != -1) return false;
    if (step != 1) return false;
    /* Clamp as Slice does for a positive step. */
    if (st < 0) st = st < -w ? 0 : st + w;
    if (en < 0) en = en < -w ? 0 : en + w;
    *start = st > w ? w : st;
    *end = en > w ? w : en;
    return true;
}

/* The W axis (which of a packed q, k, v) must sit right outside the heads in memory, so that
 * the projection's hidden dim is [W, H, D] and input `which` is columns [which*E, +E). Then
 * drop it from the labels (rank one less). */
static bool drop_which(fa_label *l, int *rank, const int64_t *size) {
    int seq[2 * AF_MAX_RANK], n = memory_seq(l, *rank, size, seq), w = -1, k = 0;
    for (int i = 0; i < n; i++)
        if (seq[i] == SYM_W) w = i;
    if (w >= 0 && (w + 1 >= n || seq[w + 1] != (size[SYM_H] != 1 ? SYM_H : SYM_D))) return false;
    for (int i = 0; i < *rank; i++) {
        if (l[i].n == 1 && l[i].sym[0] == SYM_W) continue;
        for (int j = 0; j < l[i].n; j++)
            if (l[i].sym[j] == SYM_W) return false; /* W merged with another axis */
        l[k++] = l[i];
    }
    if (k != *rank - 1) return false;
    *rank = k;
    return true;
}

/* Where the fused node reads one input: the reshape's input, or the packed tensor under a
 * constant Slice of it; then check the memory order of the head split and the rows. */
static const char *place_input(fa_match *m, fa_input *in, int64_t S) {
    const af_graph *g = m->softmax->graph;
    int64_t size[NSYM] = {m->B, m->H, S, m->D};
    if (in->head_major) {
        if (!dims_fit(in->src, in->labels, 4, size)) return "head-major q/k/v dims do not match the heads";
        in->order = 2;
        in->col = 0;
        return NULL;
    }
    af_value *x = in->split;
    int64_t width = m->E, col = 0;
    if (in->nw) { /* packed by a Gather: the hidden dim is [W, H, D] */
        size[SYM_W] = in->nw;
        if (!af_mul_i64(m->E, in->nw, &width) || !af_mul_i64(m->E, in->which, &col))
            return "packed q/k/v too wide";
    }
    if (!known_f32(x, 3) || x->type.dims[2] != width)
        return "head reshape input is not [rows, rows, H*D] float32";
    if (!dims_fit(in->reshape->out[0], in->labels, in->rank, size))
        return "head reshape shape does not match the heads";
    if (in->nw && !drop_which(in->labels, &in->rank, size))
        return "packed q/k/v axis is not right outside the heads";
    in->src = x;
    in->col = col;
    af_node *s = producer(x, g);
    int64_t st, en;
    if (s && s->op == AF_OP_SLICE && s->nin >= 1 && !fuse_edge(x) && known_f32(s->in[0], 3) &&
        slice_window(s, s->in[0], &st, &en) && en - st == width && !in->nw &&
        s->in[0]->type.dims[0] == x->type.dims[0] && s->in[0]->type.dims[1] == x->type.dims[1]) {
        const char *why = cover(m, s);
        if (why) return why;
        in->src = s->in[0];
        in->col = st;
    }
    if (in->col > INT32_MAX - m->E) return "packed q/k/v too wide";
    int o = memory_order(in->labels, in->rank, size);
    if (o < 0) return "heads are not an inner split of the hidden dim";
    const int64_t *d = in->src->type.dims;
    bool fit0 = d[0] == m->B && d[1] == S, fit1 = d[0] == S && d[1] == m->B;
    if (o == 2) o = fit0 ? 0 : 1;
    if (!(o == 0 ? fit0 : fit1)) return "q/k/v rows are not [B, S] or [S, B]";
    in->order = o;
    return NULL;
}

/* ---- scores, output ---------------------------------------------------------------------------- */

/* A Mul or Div by a one-element constant of any dtype: the shape of a scale, before its
 * conditions are checked (so that a float64 block is a near miss, not a non-match). */
static bool scale_like(const af_node *n, const af_value **x) {
    if ((n->op != AF_OP_MUL && n->op != AF_OP_DIV) || n->nin != 2 || !n->in[0] || !n->in[1])
        return false;
    for (int i = 0; i < 2; i++) {
        const af_value *c = n->in[1 - i];
        if ((i == 0 || n->op == AF_OP_MUL) && af_value_is_const(c) && af_tensor_numel(&c->type) == 1 &&
            !af_value_is_const(n->in[i])) {
            *x = n->in[i];
            return true;
        }
    }
    return false;
}

/* Does v come from a MatMul through scalar scales only? (Which side of the mask Add holds the
 * scores: the mask itself is often a scaled value too, e.g. (1 - m) * -10000.) */
static bool reaches_matmul(const af_value *v, const af_graph *g) {
    for (int step = 0; step < FA_MAX_CHAIN; step++) {
        af_node *p = producer(v, g);
        if (!p) return false;
        if (p->op == AF_OP_MATMUL) return true;
        if (!scale_like(p, &v)) return false;
    }
    return false;
}

/* The score side (0 or 1) of a mask Add, or -1. */
static int score_side(const af_node *add, const af_graph *g) {
    if (add->op != AF_OP_ADD || add->nin != 2 || !add->in[0] || !add->in[1]) return -1;
    return reaches_matmul(add->in[0], g) ? 0 : reaches_matmul(add->in[1], g) ? 1 : -1;
}

/* Is the attention pattern here at all (before any condition)? The Softmax input comes from a
 * MatMul through scalar scales and at most one Add, and a MatMul reads its output as A. */
static bool present(const af_node *s) {
    const af_graph *g = s->graph;
    if (s->op != AF_OP_SOFTMAX || s->nin != 1 || s->nout != 1 || !s->in[0] || !s->out[0])
        return false;
    bool pv = false;
    for (int i = 0; i < s->out[0]->nuses; i++)
        pv |= s->out[0]->uses[i].node->op == AF_OP_MATMUL && s->out[0]->uses[i].slot == 0;
    if (!pv) return false;
    const af_value *v = s->in[0];
    bool added = false, kept = false;
    for (int step = 0; step < FA_MAX_CHAIN; step++) {
        af_node *p = producer(v, g);
        int side;
        if (!p) return false;
        if (p->op == AF_OP_MATMUL) return true;
        if (scale_like(p, &v)) continue;
        if (p->op == AF_OP_WHERE && p->nin == 3 && p->in[1] && !kept) {
            kept = true;
            v = p->in[1];
            continue;
        }
        if (added || (side = score_side(p, g)) < 0) return false;
        added = true;
        v = p->in[side];
    }
    return false;
}

/* A Where's fill: a one-element float32 constant, a number or -inf. */
static bool fill_scalar(const af_value *v, int rank, double *out) {
    if (!af_value_is_const(v) || v->type.dtype != AF_DTYPE_FLOAT || v->type.rank > rank ||
        af_tensor_numel(&v->type) != 1)
        return false;
    *out = ((const float *)v->type.data)[0];
    return !isnan(*out) && *out != INFINITY;
}

/* Back from the Softmax input to the QK MatMul: [Where keep] after [Add mask] after any scalar
 * scales. */
static const char *walk_scores(fa_match *m) {
    const af_graph *g = m->softmax->graph;
    af_value *x = m->softmax->in[0];
    af_node *reader = m->softmax;
    int rank = x->type.rank;
    bool scaled = false;
    for (int step = 0;; step++) {
        const char *why;
        if (step == FA_MAX_CHAIN) return "score chain too long";
        if ((why = edge(x, reader))) return why;
        if (!known_f32(x, rank)) return "scores not float32 with known dims";
        af_node *p = producer(x, g);
        if (!p) return "softmax input is not scaled/masked QK^T";
        if ((why = cover(m, p))) return why;
        if (p->op == AF_OP_MATMUL) {
            m->qk = p;
            return NULL;
        }
        double f;
        af_value *next = NULL;
        int side;
        if (p->op == AF_OP_WHERE) {
            /* Where(keep, scores, fill) right before the softmax: a scale or mask after it
             * would change the fill, which the fused op keeps as it is. */
            if (step != 0) return "where is not the last step before the softmax";
            if (p->nin != 3 || !p->in[0] || !p->in[1] || !p->in[2])
                return "softmax input is not scaled/masked QK^T";
            if (!fill_scalar(p->in[2], rank, &m->fill))
                return "where's other value is not a constant scalar";
            m->where = p;
            m->keep = p->in[0];
            next = p->in[1];
        } else if (scale_node(p, &next, &f)) {
            m->scale *= f;
            scaled = true;
        } else if (!m->add && (side = score_side(p, g)) >= 0) {
            /* Walking backward: a scale seen already comes after the Add, so it scales the
             * mask too, which the fused op does not. */
            if (scaled) return "mask is added before the scale";
            m->add = p;
            m->mask = p->in[1 - side];
            next = p->in[side];
        } else {
            return "softmax input is not scaled/masked QK^T";
        }
        reader = p;
        x = next;
    }
}

/* The mask broadcasts (unidirectionally) to the scores. */
static const char *check_mask(const fa_match *m) {
    if (!af_value_is_f32(m->mask)) return "mask is not float32";
    if (m->mask->type.rank > m->rank) return "mask rank exceeds the scores'";
    return fuse_fits(&m->mask->type, &m->qk->out[0]->type);
}

/* So does the Where's condition, a bool. */
static const char *check_keep(const fa_match *m) {
    if (m->keep->type.dtype != AF_DTYPE_BOOL) return "where condition is not bool";
    if (m->keep->type.rank > m->rank) return "where condition rank exceeds the scores'";
    return fuse_fits(&m->keep->type, &m->qk->out[0]->type);
}

/* Forward from the PV MatMul through transposes to the Reshape that merges heads. */
static const char *walk_output(fa_match *m) {
    int r = m->rank;
    fa_label l[AF_MAX_RANK];
    int64_t size[NSYM] = {m->B, m->H, m->Sq, m->D};
    operand_labels(l, r, SYM_S, SYM_D);
    af_value *y = m->pv->out[0];
    for (int step = 0;; step++) {
        const char *why;
        if (step == FA_MAX_CHAIN) return "output chain too long";
        if (!known_f32(y, r)) return "attention output not float32 with known dims";
        if ((why = fuse_edge(y))) return why;
        af_node *c = y->uses[0].node;
        if (c->graph != m->softmax->graph || c->nout != 1 || y->uses[0].slot != 0 || !c->out[0])
            return "attention output is not merged back into rows";
        if ((why = cover(m, c))) return why;
        if (c->op == AF_OP_RESHAPE) {
            if (c->nin < 2 || !af_value_is_const(c->in[1])) return "output reshape shape is not constant";
            /* and the Reshapes after it while they are of the heads' rank (see reshapes_back) */
            af_value *z;
            while ((z = c->out[0])->type.rank > 3 && !fuse_edge(z) && z->uses[0].node->op == AF_OP_RESHAPE &&
                   z->uses[0].slot == 0 && z->uses[0].node->graph == c->graph &&
                   z->uses[0].node->nout == 1 && z->uses[0].node->out[0]) {
                c = z->uses[0].node;
                if ((why = cover(m, c))) return why;
            }
            m->out_reshape = c;
            break;
        }
        if (c->op != AF_OP_TRANSPOSE || c->nin != 1)
            return "attention output is not merged back into rows";
        int perm[AF_MAX_RANK];
        fa_label lout[AF_MAX_RANK];
        if (!get_perm(c, r, perm)) return "transpose perm is not a permutation";
        for (int i = 0; i < r; i++) lout[i] = l[perm[i]];
        memcpy(l, lout, sizeof(fa_label) * (size_t)r);
        y = c->out[0];
    }
    if (!dims_fit(y, l, r, size)) return "output transpose dims do not match the heads";
    int o = memory_order(l, r, size);
    if (o < 0) return "output heads are not merged into the hidden dim";
    af_value *out = m->out_reshape->out[0];
    if (!af_value_is_f32(out)) return "output reshape is not float32";
    const af_tensor *t = &out->type;
    int64_t rows = af_dim_mul(m->softmax->graph, m->B, m->Sq);
    if (rows == AF_DIM_UNKNOWN) return "output rows overflow";
    if (t->rank == 3 && t->dims[2] == m->E) {
        bool fit0 = t->dims[0] == m->B && t->dims[1] == m->Sq;
        bool fit1 = t->dims[0] == m->Sq && t->dims[1] == m->B;
        if (o == 2) o = fit0 ? 0 : 1;
        if (!(o == 0 ? fit0 : fit1)) return "output reshape is not [B, S, H*D] or [S, B, H*D]";
    } else if (t->rank == 2 && t->dims[1] == m->E && t->dims[0] == rows) {
        if (o == 2) o = 0;
    } else {
        return "output reshape is not rows of H*D";
    }
    m->out = out;
    m->out_order = o;
    m->out_rank = t->rank;
    return NULL;
}

/* ---- the whole match --------------------------------------------------------------------------- */

/* Sizes from the MatMuls and the q source: B, H, Sq, Sk, D, E with E = H*D. */
static const char *sizes(fa_match *m) {
    const af_tensor *sc = &m->qk->out[0]->type, *q = &m->qk->in[0]->type;
    const af_tensor *k = &m->qk->in[1]->type, *v = &m->pv->in[1]->type, *o = &m->pv->out[0]->type;
    int r = m->rank;
    m->Sq = sc->dims[r - 2];
    m->Sk = sc->dims[r - 1];
    m->D = q->dims[r - 1];
    for (int i = 0; i < r - 2; i++)
        if (q->dims[i] != sc->dims[i] || k->dims[i] != sc->dims[i] || v->dims[i] != sc->dims[i] ||
            o->dims[i] != sc->dims[i])
            return "q/k/v batch dims differ (broadcast MatMul)";
    if (q->dims[r - 2] != m->Sq || k->dims[r - 2] != m->D || k->dims[r - 1] != m->Sk ||
        v->dims[r - 2] != m->Sk || v->dims[r - 1] != m->D || o->dims[r - 2] != m->Sq ||
        o->dims[r - 1] != m->D)
        return "QK^T and PV MatMul shapes disagree";
    /* E from a head split (the first input that has one); head-major inputs have none. */
    /* (A Gather-packed split holds nw of them side by side.) */
    const af_value *src = NULL;
    int64_t nw = 1, w = 0;
    for (int i = 0; i < 3 && !src; i++)
        if ((src = m->in[i].split) && m->in[i].nw) nw = m->in[i].nw;
    if (src && !known_f32(src, 3)) return "head reshape input is not [rows, rows, H*D] float32";
    if (!src && r != 4) return "q/k/v is not reshaped/transposed into heads";
    if (src) {
        w = src->type.dims[2];
        if (w % nw) return "hidden size is not a multiple of the packed count";
        w /= nw;
    }
    if (r == 4) {
        int64_t hd;
        m->B = sc->dims[0];
        m->H = sc->dims[1];
        if (m->D < 1 || m->H < 1 || !af_mul_i64(m->H, m->D, &hd))
            return "hidden != num_heads * head_dim";
        if (src && hd != w) return "hidden != num_heads * head_dim";
        m->E = hd;
        if (m->E > INT32_MAX) return "hidden size too large";
    } else {
        m->E = w;
        if (m->D < 1 || m->E < 1 || m->E % m->D) return "hidden size is not a multiple of head dim";
        if (m->E > INT32_MAX) return "hidden size too large";
        m->H = m->E / m->D;
        m->B = af_dim_div(m->softmax->graph, sc->dims[0], m->H);
        if (m->B == AF_DIM_UNKNOWN) return "batch*heads is not a multiple of num_heads";
    }
    /* B and the sequences may be symbols; heads, head dim and hidden are numbers. */
    if (m->H < 1 || m->B == 0 || m->Sq == 0 || m->Sk == 0) return "empty attention";
    return NULL;
}

static const char *match_at(af_node *s, fa_match *m) {
    const char *why;
    m->softmax = s;
    m->scale = 1.0;
    if (!present(s)) return AF_NO_MATCH;
    if ((why = cover(m, s))) return why;
    int rank = s->in[0]->type.rank;
    if (rank != 3 && rank != 4) return "scores are not 3-D or 4-D";
    m->rank = rank;
    int64_t a = af_attr_int(s, "axis", af_graph_opset(s->graph) < 13 ? 1 : -1);
    if (a != -1 && a != rank - 1) return "softmax is not over the last axis";
    if (!known_f32(s->out[0], rank)) return "softmax output not float32 with known dims";
    if ((why = fuse_edge(s->out[0]))) return why;
    af_node *pv = s->out[0]->uses[0].node;
    if (pv->op != AF_OP_MATMUL || pv->nin != 2 || s->out[0]->uses[0].slot != 0 ||
        pv->nout != 1 || !pv->out[0] || pv->graph != s->graph)
        return "softmax output does not feed a MatMul with V";
    m->pv = pv;
    if ((why = cover(m, pv)) || (why = walk_scores(m))) return why;
    if (m->mask && (why = check_mask(m))) return why;
    if (m->keep && (why = check_keep(m))) return why;
    if (!known_f32(m->qk->in[0], rank) || !known_f32(m->qk->in[1], rank) ||
        !known_f32(m->pv->in[1], rank) || !known_f32(m->pv->out[0], rank) ||
        !known_f32(m->qk->out[0], rank))
        return "q/k/v not float32 with known dims";
    fa_label lq[AF_MAX_RANK], lk[AF_MAX_RANK], lv[AF_MAX_RANK];
    operand_labels(lq, rank, SYM_S, SYM_D);
    operand_labels(lk, rank, SYM_D, SYM_S);
    operand_labels(lv, rank, SYM_S, SYM_D);
    if ((why = walk_input(m, &m->in[0], m->qk->in[0], m->qk, lq, rank, true)) ||
        (why = walk_input(m, &m->in[1], m->qk->in[1], m->qk, lk, rank, true)) ||
        (why = walk_input(m, &m->in[2], m->pv->in[1], m->pv, lv, rank, false)) ||
        (why = sizes(m)))
        return why;
    if ((why = place_input(m, &m->in[0], m->Sq)) || (why = place_input(m, &m->in[1], m->Sk)) ||
        (why = place_input(m, &m->in[2], m->Sk)))
        return why;
    if (!(fabs(m->scale) <= FLT_MAX) || (float)m->scale == 0.0f)
        return "scale is not a finite nonzero float";
    if ((why = walk_output(m))) return why;
    /* Each covered node once, and every input of the fused node made outside the pattern. The
     * edge guards already imply both; checking is cheap and keeps apply safe. */
    for (int i = 0; i < m->am->n; i++)
        for (int j = i + 1; j < m->am->n; j++)
            if (m->am->node[i] == m->am->node[j]) return "a node is matched twice";
    /* A packed tensor the Gathers read, and what made it, is read inside the pattern only. */
    for (int i = 0; i < 3; i++)
        for (af_value *x = m->in[i].shared; x && x != m->in[i].split; x = x->producer->in[0]) {
            if (x->is_output) return "packed q/k/v is a graph output";
            for (int u = 0; u < x->nuses; u++)
                if (fuse_match_index(m->am, x->uses[u].node) < 0)
                    return "packed q/k/v is read outside the attention";
        }
    const af_value *ins[5] = {m->in[0].src, m->in[1].src, m->in[2].src, m->mask, m->keep};
    for (int i = 0; i < 5; i++)
        if (ins[i] && ins[i]->producer && fuse_match_index(m->am, ins[i]->producer) >= 0)
            return "q/k/v or mask is computed inside the pattern";
    return NULL;
}

/* ---- the rule ---------------------------------------------------------------------------------- */

/* Scratch passed from check to apply in the engine's af_match. */
enum { V_Q, V_K, V_V, V_MASK, V_KEEP };
enum { I_HEADS, I_HEAD_DIM, I_LAYOUT, I_COL_Q, I_COL_K, I_COL_V, I_OUT_RANK, I_MERGED };

const char *rule_attention_check(af_fusion_ctx *cx, af_node *anchor, af_match *am) {
    (void)cx;
    fa_match m;
    memset(&m, 0, sizeof m);
    m.am = am;
    const char *why = match_at(anchor, &m);
    if (why) return why;
    fuse_match_output(am, m.out);
    for (int i = 0; i < 3; i++) am->val[V_Q + i] = m.in[i].src;
    am->val[V_MASK] = m.mask;
    am->val[V_KEEP] = m.keep;
    am->fval[1] = (float)m.fill;
    am->ival[I_HEADS] = m.H;
    am->ival[I_HEAD_DIM] = m.D;
    am->ival[I_LAYOUT] = m.in[0].order | m.in[1].order << 2 | m.in[2].order << 4 |
                         m.out_order << 6;
    for (int i = 0; i < 3; i++) am->ival[I_COL_Q + i] = m.in[i].col;
    am->ival[I_OUT_RANK] = m.out_rank;
    am->ival[I_MERGED] = m.rank == 3;
    am->fval[0] = (float)m.scale;
    return NULL;
}

/* "<scope>/FusedAttention" for a Softmax named "<scope>/Softmax": the report and Netron then
 * show the fused node where the attention block was. */
static const char *fused_name(af_graph *g, const af_node *softmax) {
    const char *slash = strrchr(softmax->name, '/');
    size_t keep = slash ? (size_t)(slash - softmax->name) + 1 : 0;
    char *s = af_arena_alloc(g->arena, keep + sizeof "FusedAttention");
    if (!s) return NULL;
    memcpy(s, softmax->name, keep);
    memcpy(s + keep, "FusedAttention", sizeof "FusedAttention");
    return s;
}

af_status rule_attention_apply(af_fusion_ctx *cx, af_match *am, af_error *err) {
    af_graph *g = am->node[0]->graph;
    af_value *mask = am->val[V_MASK], *keep = am->val[V_KEEP];
    const char *name = fused_name(g, am->node[0]);
    af_node *f = name ? af_node_new_ours(g, AF_OP_FUSED_ATTENTION, name, keep ? 5 : mask ? 4 : 3)
                      : NULL;
    int64_t lay = am->ival[I_LAYOUT];
    int64_t layout[4] = {lay & 3, lay >> 2 & 3, lay >> 4 & 3, lay >> 6 & 3};
    int64_t offsets[3] = {am->ival[I_COL_Q], am->ival[I_COL_K], am->ival[I_COL_V]};
    if (!f || !af_node_set_int(f, "num_heads", am->ival[I_HEADS]) ||
        !af_node_set_int(f, "head_dim", am->ival[I_HEAD_DIM]) ||
        !af_node_set_float(f, "scale", am->fval[0]) || !af_node_set_ints(f, "layout", layout, 4) ||
        !af_node_set_ints(f, "offsets", offsets, 3) ||
        !af_node_set_int(f, "out_rank", am->ival[I_OUT_RANK]) ||
        !af_node_set_int(f, "heads_merged", am->ival[I_MERGED]) ||
        (keep && !af_node_set_float(f, "fill", am->fval[1])))
        return af_fail(err, AF_ERR_NOMEM, "out of memory fusing attention");
    for (int i = 0; i < 3; i++) af_node_set_input(f, i, am->val[V_Q + i]);
    if (mask) af_node_set_input(f, 3, mask);
    if (keep) af_node_set_input(f, 4, keep);
    return fuse_commit(cx, am, f, am->out[0], fuse_all(am), err);
}
