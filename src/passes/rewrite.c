/* Shared machinery of the passes (see rewrite.h) and the opset-independent readers of
 * passes.h. Removal is batched: a pass flags nodes dead while it walks and compacts g->nodes
 * once at the end, so removing k nodes costs O(n), not O(k*n).
 *
 * Invariant: a pass's removed nodes stay detached in g->nodes until pass_scope_sweep, so walks
 * by index stay valid. */
#include "passes/rewrite.h"

#include <math.h>
#include <string.h>

/* ---- scope --------------------------------------------------------------------------------- */

static void pin_sub_outputs(pass_scope *s, const af_graph *sub) {
    for (int i = 0; i < sub->noutputs; i++) {
        const af_value *v = sub->outputs[i];
        if (v && v->graph == s->g && v->id < s->npinned) s->pinned[v->id] = true;
    }
    for (int i = 0; i < sub->nnodes; i++) {
        af_graph *inner;
        for (int k = 0; (inner = pass_subgraph(sub->nodes[i], k)); k++) pin_sub_outputs(s, inner);
    }
}

af_status pass_scope_open(pass_scope *s, af_graph *g, af_error *err) {
    memset(s, 0, sizeof *s);
    s->g = g;
    s->npinned = g->nvalues;
    s->ndead = g->nnodes;
    s->pinned = af_calloc((size_t)s->npinned + 1, sizeof(bool));
    s->dead = af_calloc((size_t)s->ndead + 1, sizeof(bool));
    if (!s->pinned || !s->dead) {
        pass_scope_close(s);
        return af_fail(err, AF_ERR_NOMEM, "out of memory optimizing the graph");
    }
    /* The graph's own outputs, and values of g that a nested body returns unchanged (an If
     * branch may output an outer value): both are read by name or position from outside. */
    pin_sub_outputs(s, g);
    for (int i = 0; i < g->nvalues; i++) s->pinned[i] |= g->values[i]->is_output;
    return AF_OK;
}

void pass_scope_close(pass_scope *s) {
    af_free(s->pinned);
    af_free(s->dead);
    s->pinned = NULL;
    s->dead = NULL;
}

bool pass_pinned(const pass_scope *s, const af_value *v) {
    if (v->graph != s->g || v->is_output) return true;
    return v->id < s->npinned && s->pinned[v->id];
}

bool pass_dead(const pass_scope *s, const af_node *n) {
    return n->id >= 0 && n->id < s->ndead && s->dead[n->id];
}

af_status pass_kill(pass_scope *s, af_node *n, af_error *err) {
    if (n->id >= s->ndead) {
        /* Nodes made during this pass sit past the size the scope opened with. */
        int cap = s->g->nnodes;
        bool *d = af_realloc(s->dead, (size_t)cap * sizeof(bool));
        if (!d) return af_fail(err, AF_ERR_NOMEM, "out of memory optimizing the graph");
        memset(d + s->ndead, 0, (size_t)(cap - s->ndead) * sizeof(bool));
        s->dead = d;
        s->ndead = cap;
    }
    AF_ASSERT(n->id >= 0 && n->id < s->ndead && s->g->nodes[n->id] == n);
    for (int k = 0; k < n->nin; k++)
        if (n->in[k]) af_node_set_input(n, k, NULL);
    for (int o = 0; o < n->nout; o++)
        if (n->out[o] && n->out[o]->producer == n) n->out[o]->producer = NULL;
    s->dead[n->id] = true;
    s->removed++;
    return AF_OK;
}

void pass_scope_sweep(pass_scope *s) {
    af_graph *g = s->g;
    int j = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (!pass_dead(s, g->nodes[i])) g->nodes[j++] = g->nodes[i];
    g->nnodes = j;
    af_graph_renumber(g);
    memset(s->dead, 0, (size_t)s->ndead * sizeof(bool));
}

/* ---- matching helpers ---------------------------------------------------------------------- */

af_node *pass_sole_user(const pass_scope *s, const af_value *v) {
    if (!v || pass_pinned(s, v) || v->nuses != 1) return NULL;
    af_node *n = v->uses[0].node;
    return n->graph == s->g && !pass_dead(s, n) ? n : NULL;
}

af_node *pass_producer(const pass_scope *s, const af_value *v, af_op op) {
    if (!v || v->graph != s->g || !v->producer) return NULL;
    af_node *p = v->producer;
    return p->op == op && p->graph == s->g && !pass_dead(s, p) ? p : NULL;
}

static bool is_real_number_type(af_dtype t) {
    return af_dtype_size(t) > 0 && t != AF_DTYPE_COMPLEX64 && t != AF_DTYPE_COMPLEX128;
}

bool pass_scalar(const af_value *v, double *out) {
    if (!af_value_is_const(v) || af_tensor_numel(&v->type) != 1 || !is_real_number_type(v->type.dtype))
        return false;
    *out = af_tensor_get_double(&v->type, 0);
    return true;
}

af_graph *pass_subgraph(const af_node *n, int k) {
    for (int a = 0; a < n->nattrs; a++) {
        const af_attr *at = &n->attrs[a];
        int ng = at->g ? 1 : (at->graphs ? at->n : 0);
        if (k < ng) return at->g ? at->g : at->graphs[k];
        k -= ng;
    }
    return NULL;
}

/* ---- new nodes ----------------------------------------------------------------------------- */

/* "/scope/Erf_1" replaced by a Gelu becomes "/scope/Gelu_1"; other names get "/Gelu" added. */
static const char *derived_name(af_arena *a, const af_node *anchor, const char *op_name) {
    const char *full = anchor->name, *slash = strrchr(full, '/');
    const char *base = slash ? slash + 1 : full, *type = anchor->op_type ? anchor->op_type : "";
    size_t tl = strlen(type), len = strlen(full) + strlen(op_name) + 2;
    char *buf = af_arena_alloc(a, len);
    if (!buf) return NULL;
    if (tl && !strncmp(base, type, tl))
        snprintf(buf, len, "%.*s%s%s", (int)(base - full), full, op_name, base + tl);
    else
        snprintf(buf, len, "%s/%s", full, op_name);
    return buf;
}

af_node *pass_node_new(pass_scope *s, af_op op, const af_node *anchor, int nin, int nout) {
    const char *name = derived_name(s->g->arena, anchor, af_ops[op].name);
    af_node *n = name ? af_node_new(s->g, op, name, nin, nout) : NULL;
    if (n && af_op_is_ours(op)) n->domain = AF_DOMAIN;
    return n;
}

/* ---- captures ------------------------------------------------------------------------------ */

static af_status capture(af_graph *sub, af_value *v, af_error *err) {
    if (!v || v->graph == sub) return AF_OK;
    for (int i = 0; i < sub->ncaptures; i++)
        if (sub->captures[i] == v) return AF_OK;
    if (!af_arena_grow(sub->arena, (void **)&sub->captures, &sub->captures_cap,
                       sub->ncaptures + 1, sizeof(af_value *)))
        return af_fail(err, AF_ERR_NOMEM, "out of memory optimizing the graph");
    sub->captures[sub->ncaptures++] = v;
    return AF_OK;
}

/* sub reads an outer value through a node input, a graph output, or a nested body. */
static af_status rebuild_captures(af_graph *sub, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < sub->nnodes && !st; i++) {
        af_graph *inner;
        for (int k = 0; !st && (inner = pass_subgraph(sub->nodes[i], k)); k++)
            st = rebuild_captures(inner, err);
    }
    sub->ncaptures = 0;
    for (int i = 0; i < sub->nnodes && !st; i++) {
        const af_node *n = sub->nodes[i];
        af_graph *inner;
        for (int k = 0; k < n->nin && !st; k++) st = capture(sub, n->in[k], err);
        for (int k = 0; !st && (inner = pass_subgraph(n, k)); k++)
            for (int c = 0; c < inner->ncaptures && !st; c++)
                st = capture(sub, inner->captures[c], err);
    }
    for (int i = 0; i < sub->noutputs && !st; i++) st = capture(sub, sub->outputs[i], err);
    return st;
}

af_status pass_fix_captures(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(g->nodes[i], k)); k++)
            st = rebuild_captures(sub, err);
    }
    return st;
}

/* ---- opset-independent readers ------------------------------------------------------------- */

bool af_node_clip_bounds(const af_node *n, double *lo, double *hi) {
    if (n->op != AF_OP_CLIP) return false;
    *lo = -INFINITY;
    *hi = INFINITY;
    if (af_graph_opset(n->graph) < 11) {
        *lo = af_attr_float(n, "min", -INFINITY);
        *hi = af_attr_float(n, "max", INFINITY);
        return true;
    }
    const af_value *l = n->nin > 1 ? n->in[1] : NULL, *h = n->nin > 2 ? n->in[2] : NULL;
    return (!l || pass_scalar(l, lo)) && (!h || pass_scalar(h, hi));
}

/* The opset from which the op takes axes as input 1; 0 for ops without axes. */
static int axes_input_since(af_op op) {
    switch (op) {
    case AF_OP_REDUCE_SUM: case AF_OP_SQUEEZE: case AF_OP_UNSQUEEZE: return 13;
    case AF_OP_REDUCE_MEAN: case AF_OP_REDUCE_MAX: case AF_OP_REDUCE_MIN: case AF_OP_REDUCE_PROD:
    case AF_OP_REDUCE_L1: case AF_OP_REDUCE_L2: case AF_OP_REDUCE_LOG_SUM:
    case AF_OP_REDUCE_LOG_SUM_EXP: case AF_OP_REDUCE_SUM_SQUARE: return 18;
    default: return 0;
    }
}

bool af_node_axes(const af_node *n, int64_t *axes, int max, int *count) {
    int since = axes_input_since(n->op);
    if (!since) return false;
    *count = -1;
    if (af_graph_opset(n->graph) < since) {
        const int64_t *v;
        int c = af_attr_ints(n, "axes", &v);
        if (c > max) return false;
        for (int i = 0; i < c; i++) axes[i] = v[i];
        *count = c;
        return true;
    }
    const af_value *a = n->nin > 1 ? n->in[1] : NULL;
    if (!a) return true;
    if (!af_value_is_const(a) || a->type.rank > 1) return false;
    if (a->type.dtype != AF_DTYPE_INT64 && a->type.dtype != AF_DTYPE_INT32) return false;
    int64_t c = af_tensor_numel(&a->type);
    if (c < 0 || c > max) return false;
    for (int64_t i = 0; i < c; i++) axes[i] = af_tensor_get_int(&a->type, i);
    *count = (int)c;
    return true;
}
