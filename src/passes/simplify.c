/* Simplify: constant folding (fold.c); an If with a known condition replaced by its branch
 * (fold_if.c); removal of copies (Identity, a Reshape to its input's shape, inference-mode
 * Dropout, Cast to the type its input already has); dead-node removal; QOperator ops in their
 * QDQ form (qdq.c) and integer products as float ones (integer.c); repeated until nothing
 * changes, in every graph and subgraph.
 *
 * Invariant: graph outputs keep their names and order. A removed Identity whose output is a
 * graph output hands that name to the value it copied (its producer writes the output value
 * directly); when that is impossible (it copies a graph input, a constant or another output)
 * the Identity stays.
 */
#include "passes/rewrite.h"

/* Folding a node can make its consumers' dims known, which lets a Shape further down fold in
 * the next round; a bound keeps a pathological graph from looping long. Each stage of a Swin
 * exported with a symbolic batch takes about 7 rounds (its window pads are computed from the
 * dims the stage before leaves): Swin-T needed 40, and at 16 its last stage kept unknown dims
 * and lost its fusions. */
#define MAX_ROUNDS 256

/* Dropout copies its input unless training_mode is set with a ratio above 0 (exporters write
 * training_mode true with ratio 0: torchvision's Swin); its mask must be unused. */
static bool dropout_is_copy(const pass_scope *s, const af_node *n) {
    double training, ratio;
    bool no_drop = n->nin > 1 && n->in[1] && pass_scalar(n->in[1], &ratio) && ratio == 0;
    if (n->nin > 2 && n->in[2] && (!pass_scalar(n->in[2], &training) || training != 0) && !no_drop)
        return false;
    const af_value *mask = n->nout > 1 ? n->out[1] : NULL;
    return !mask || (mask->nuses == 0 && !pass_pinned(s, mask));
}

/* Cast to the type the input already has (Cast "to", CastLike its second input's type). */
static bool cast_is_copy(const af_node *n) {
    af_dtype from = n->in[0]->type.dtype;
    if (from == AF_DTYPE_UNDEFINED) return false;
    if (n->op == AF_OP_CAST) return af_attr_int(n, "to", AF_DTYPE_UNDEFINED) == (int64_t)from;
    return n->nin > 1 && n->in[1] && n->in[1]->type.dtype == from;
}

/* Can x's producer write y instead of x (so that y keeps its name)? */
static bool renamable(const pass_scope *s, const af_value *x) {
    return x->graph == s->g && x->producer && !pass_dead(s, x->producer) &&
           !pass_pinned(s, x) && !x->is_input && !x->is_const;
}

/* Remove n (y = copy of x): consumers of y read x; or, when y is pinned, x becomes y. */
static af_status bypass(pass_scope *s, af_node *n, bool *changed, af_error *err) {
    af_value *x = n->in[0], *y = n->out[0];
    if (!pass_pinned(s, y)) {
        af_value_replace_uses(y, x);
        *changed = true;
        return pass_kill(s, n, err);
    }
    if (!renamable(s, x)) return AF_OK;
    af_node *p = x->producer;
    int slot = x->producer_slot;
    af_status st = pass_kill(s, n, err);
    if (st) return st;
    af_value_replace_uses(x, y);
    af_node_set_output(p, slot, y);
    *changed = true;
    return AF_OK;
}

static af_status remove_copies(pass_scope *s, bool *changed, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < s->g->nnodes && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (pass_dead(s, n) || n->nin < 1 || !n->in[0] || n->nout < 1 || !n->out[0]) continue;
        /* a Reshape to the shape it reads (symbols equal: torch's GroupNorm export reshapes
         * [N, C, L] to [N, C, -1] when the groups are the channels) */
        bool copy = n->op == AF_OP_IDENTITY ||
                    (n->op == AF_OP_RESHAPE && n->nout == 1 &&
                     af_same_shape(&n->in[0]->type, &n->out[0]->type)) ||
                    (n->op == AF_OP_DROPOUT && dropout_is_copy(s, n)) ||
                    ((n->op == AF_OP_CAST || n->op == AF_OP_CAST_LIKE) && cast_is_copy(n));
        if (copy) st = bypass(s, n, changed, err);
    }
    return st;
}

static bool node_live(const pass_scope *s, const af_node *n) {
    for (int o = 0; o < n->nout; o++) {
        const af_value *v = n->out[o];
        if (v && (v->nuses > 0 || pass_pinned(s, v))) return true;
    }
    return false;
}

/* Backwards, so that a chain feeding only dead nodes dies in one sweep. */
static af_status remove_dead(pass_scope *s, bool *changed, af_error *err) {
    af_status st = AF_OK;
    for (int i = s->g->nnodes - 1; i >= 0 && !st; i--) {
        af_node *n = s->g->nodes[i];
        if (pass_dead(s, n) || node_live(s, n)) continue;
        *changed = true;
        st = pass_kill(s, n, err);
    }
    return st;
}

static af_status simplify_round(af_graph *g, bool keep_qweights, bool *changed, af_error *err) {
    pass_scope s;
    af_status st = pass_scope_open(&s, g, err);
    if (st) return st;
    s.keep_qweights = keep_qweights;
    st = pass_fold_constants(&s, changed, err);
    if (!st) st = pass_fold_symbolic(&s, changed, err);
    if (!st) st = remove_copies(&s, changed, err);
    if (!st) st = remove_dead(&s, changed, err);
    pass_scope_sweep(&s);
    pass_scope_close(&s);
    /* After the scope: inlining and the integer rewrite add values and nodes the scope's
     * arrays do not cover. */
    if (!st) st = pass_fold_if(g, changed, err);
    if (!st) st = pass_qoperator_as_qdq(g, changed, err);
    return st ? st : pass_integer_as_float(g, changed, err);
}

/* Rounds until nothing changes. After a change, shapes are inferred again with the new
 * constants; an error there is left to the run (the import already checked the graph, and a
 * node that fails on its now-known inputs fails the same way when it runs). */
static af_status simplify_rounds(af_graph *g, bool keep_qweights, af_error *err) {
    bool changed = true;
    for (int round = 0; changed && round < MAX_ROUNDS; round++) {
        changed = false;
        af_status st = simplify_round(g, keep_qweights, &changed, err);
        if (st) return st;
        if (changed) {
            af_error scratch;
            (void)af_graph_infer_shapes(g, &scratch);
        }
    }
    return AF_OK;
}

/* g first (constants it folds may let a body fold), then each body, then g again: values only
 * a body read may have died with it. */
static af_status simplify_graph(af_graph *g, bool keep_qweights, af_error *err) {
    af_status st = simplify_rounds(g, keep_qweights, err);
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(g->nodes[i], k)); k++)
            st = simplify_graph(sub, keep_qweights, err);
    }
    return st ? st : simplify_rounds(g, keep_qweights, err);
}

af_status af_pass_simplify_ex(af_graph *g, bool keep_qweights, af_error *err) {
    af_status st = simplify_graph(g, keep_qweights, err);
    return st ? st : pass_fix_captures(g, err);
}

af_status af_pass_simplify(af_graph *g, af_error *err) {
    return af_pass_simplify_ex(g, false, err);
}
