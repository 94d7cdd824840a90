/* The fusion engine: runs the rules of rules.def over a graph and its subgraphs, one rule at a
 * time over the whole graph in table order; offers each node whose op is the rule's anchor to the
 * rule's check, applies the standard guards to what it matched, records near misses, lets the
 * rule's apply build the fused node(s) and commits them (validation, rewiring, topological
 * position, provenance, cost accounting).
 *
 * Invariant: between two rewrites the graph is valid (af_graph_verify holds). fuse_commit checks a
 * fused node with its op's shape function and its place in the node order before it touches
 * the graph, then rewires completely; a rule's check never changes the graph. */
#include "fusion/rule.h"
#include "passes/passes.h"
#include "kernels/fast/dispatch.h"
#include "ir/plugin.h"

#include <stdlib.h>
#include <string.h>

typedef const char *(*fuse_check_fn)(af_fusion_ctx *, af_node *, af_match *);
typedef af_status (*fuse_apply_fn)(af_fusion_ctx *, af_match *, af_error *);

typedef struct fuse_rule {
    const char *name, *pattern, *conditions, *precision;
    af_op anchor; /* AF_OP_COUNT: every node */
    fuse_check_fn check;
    fuse_apply_fn apply;
} fuse_rule;

static const fuse_rule rules[AF_RULE_COUNT] = {
#define AF_RULE(id, name, pattern, anchor, check, apply, conditions, precision)                  \
    {name, pattern, conditions, precision, anchor, check, apply},
#include "fusion/rules.def"
#undef AF_RULE
};

const char af_no_match[] = "no match";

/* FLOPs of a fused node made during this run: the sum over the nodes it replaced, so that a
 * later rule absorbing it (ConvPoolFc over a FusedConv) costs it as what it computes. */
typedef struct fuse_flops {
    const af_node *node;
    double flops;
} fuse_flops;

struct af_fusion_ctx {
    af_fusion_report *rep; /* NULL: no report, no costing */
    const af_machine *mach;
    int rule;
    /* The match being applied. */
    const char *declined;
    double unfused, fused;
    int commits;
    fuse_flops *fl;
    int nfl, flcap;
    af_plugin_match pm; /* a plugin rule's match, from its check to plugin_apply */
};

/* Rules past the built-in ones are the plugins', in load order. */
static const af_custom_rule *plugin_rule(int r) {
    return r >= AF_RULE_COUNT ? af_plugin_rule(r - AF_RULE_COUNT) : NULL;
}

int af_fusion_rule_count(void) {
    return AF_RULE_COUNT + af_plugin_rule_count();
}

bool af_fusion_rule_is_plugin(int r) {
    return plugin_rule(r) != NULL;
}

const char *af_fusion_rule_name(int r) {
    const af_custom_rule *p = plugin_rule(r);
    return r >= 0 && r < AF_RULE_COUNT ? rules[r].name : p ? p->name : NULL;
}

const char *af_fusion_rule_pattern(int r) {
    const af_custom_rule *p = plugin_rule(r);
    if (r >= 0 && r < AF_RULE_COUNT) return rules[r].pattern;
    return p ? (p->pattern ? p->pattern : p->anchor_op) : NULL;
}

const char *af_fusion_rule_conditions(int r) {
    const af_custom_rule *p = plugin_rule(r);
    if (r >= 0 && r < AF_RULE_COUNT) return rules[r].conditions;
    return p ? (p->conditions ? p->conditions : "the plugin's check") : NULL;
}

const char *af_fusion_rule_precision(int r) {
    return r >= 0 && r < AF_RULE_COUNT ? rules[r].precision : NULL;
}

/* ---- matching and guards ------------------------------------------------------------------- */

bool fuse_match_add(af_match *m, af_node *n) {
    if (fuse_match_index(m, n) >= 0) return true;
    if (m->n >= AF_MATCH_MAX) return false;
    m->node[m->n++] = n;
    return true;
}

int fuse_match_index(const af_match *m, const af_node *n) {
    for (int i = 0; i < m->n; i++)
        if (m->node[i] == n) return i;
    return -1;
}

void fuse_match_keep(af_match *m, const af_node *n) {
    int i = fuse_match_index(m, n);
    if (i >= 0) m->keep |= (uint64_t)1 << i;
}

void fuse_match_output(af_match *m, af_value *v) {
    m->out[0] = v;
    m->nout = 1;
}

/* Static reasons, so that checks never format. */
static const char *consumers_reason(int n) {
    static const char *const r[] = {
        "output feeds 2 consumers", "output feeds 3 consumers", "output feeds 4 consumers",
        "output feeds 5 consumers", "output feeds 6 consumers", "output feeds 7 consumers",
        "output feeds 8 consumers"};
    if (n >= 2 && n <= 8) return r[n - 2];
    return n < 2 ? "output has no consumer" : "output feeds more than 8 consumers";
}

const char *fuse_edge(const af_value *v) {
    if (!v) return "intermediate is missing";
    if (v->is_output) return "intermediate is a graph output";
    if (v->nuses != 1) return consumers_reason(v->nuses);
    if (v->uses[0].node->graph != v->graph) return "intermediate is read by a subgraph";
    return NULL;
}

const char *fuse_fits(const af_tensor *t, const af_tensor *out) {
    if (!af_dims_defined(t) || !af_dims_defined(out)) return "shape is not known";
    if (t->rank > out->rank) return "broadcast does not fit the output";
    for (int i = 0; i < t->rank; i++) {
        int64_t td = t->dims[i], od = out->dims[out->rank - t->rank + i];
        if (td != 1 && td != od) return "broadcast does not fit the output";
    }
    return NULL;
}

static bool is_pattern_output(const af_match *m, const af_value *v) {
    for (int i = 0; i < m->nout; i++)
        if (m->out[i] == v) return true;
    return false;
}

/* The standard guards of rule.h over a match that check accepted; NULL or a reason. */
static const char *guard(const af_match *m, const af_graph *g) {
    if (m->n <= 0 || m->nout <= 0 || m->nout > AF_MATCH_OUT_MAX) return AF_NO_MATCH;
    for (int i = 0; i < m->n; i++)
        if (m->node[i]->graph != g) return "pattern crosses a subgraph boundary";
    for (int i = 0; i < m->n; i++) {
        if (m->keep >> i & 1) continue;
        const af_node *n = m->node[i];
        for (int o = 0; o < n->nout; o++) {
            const af_value *v = n->out[o];
            if (!v || is_pattern_output(m, v)) continue;
            if (v->is_output) return "intermediate is a graph output";
            for (int u = 0; u < v->nuses; u++)
                if (fuse_match_index(m, v->uses[u].node) < 0) return consumers_reason(v->nuses);
        }
    }
    for (int i = 0; i < m->nout; i++) {
        const af_value *v = m->out[i];
        if (!v || !v->producer || fuse_match_index(m, v->producer) < 0) return AF_NO_MATCH;
        if (!af_value_is_f32(v)) return "dtype is not float32";
    }
    const af_node *a = m->node[0];
    if ((a->nin > 0 && a->in[0] && !af_value_is_f32(a->in[0])) ||
        (a->nout > 0 && a->out[0] && !af_value_is_f32(a->out[0])))
        return "dtype is not float32";
    return NULL;
}

/* ---- building ------------------------------------------------------------------------------ */

static bool is_ours_attr(const char *name) {
    return !strcmp(name, "epilogue") || !strcmp(name, "epilogue_params") ||
           !strcmp(name, "custom_ops") ||
           !strcmp(name, "fusion_rule") || !strcmp(name, "fused_nodes");
}

bool fuse_copy_attrs(af_node *dst, const af_node *src) {
    for (int i = 0; i < src->nattrs; i++) {
        const af_attr *s = &src->attrs[i];
        if (is_ours_attr(s->name) || af_node_attr(dst, s->name)) continue;
        af_attr *d = af_node_add_attr(dst, s->name, s->type);
        if (!d) return false;
        *d = *s; /* same arena: the lists stay valid as long as the graph */
    }
    return true;
}

/* ---- committing ---------------------------------------------------------------------------- */

static double node_flops(const af_fusion_ctx *cx, const af_node *n) {
    for (int i = 0; i < cx->nfl; i++)
        if (cx->fl[i].node == n) return cx->fl[i].flops;
    return af_cost_flops(n);
}

static double node_time(const af_fusion_ctx *cx, const af_node *n) {
    return af_cost_node_time(cx->mach, n, node_flops(cx, n));
}

/* NULL when the fused op's shape function accepts the node's inputs and gives out's type. */
static const char *validate(const af_node *fused, const af_value *out, bool *oom) {
    const af_tensor **in = af_calloc((size_t)fused->nin + 1, sizeof(af_tensor *));
    *oom = !in;
    if (!in) return "out of memory";
    for (int i = 0; i < fused->nin; i++) in[i] = fused->in[i] ? &fused->in[i]->type : NULL;
    af_tensor y;
    memset(&y, 0, sizeof y);
    y.rank = -1;
    af_error e;
    af_status st = af_kernel_shape(fused, in, &y, &e);
    af_free(in);
    *oom = st == AF_ERR_NOMEM;
    if (st != AF_OK) return "the fused op rejects its inputs";
    const af_tensor *t = &out->type;
    if (y.dtype != AF_DTYPE_UNDEFINED && t->dtype != AF_DTYPE_UNDEFINED && y.dtype != t->dtype)
        return "the fused op gives another dtype";
    if (y.rank >= 0 && t->rank >= 0) {
        if (y.rank != t->rank) return "the fused op gives another shape";
        for (int i = 0; i < y.rank; i++)
            if (y.dims[i] != AF_DIM_UNKNOWN && t->dims[i] != AF_DIM_UNKNOWN && y.dims[i] != t->dims[i])
                return "the fused op gives another shape";
    }
    return NULL;
}

/* NULL when every input of fused exists before position `last` + 1 and none is produced by a
 * node the rewrite removes. */
static const char *check_inputs(const af_match *m, const af_node *fused, uint64_t removed,
                                int last) {
    const af_graph *g = fused->graph;
    for (int i = 0; i < fused->nin; i++) {
        const af_value *v = fused->in[i];
        const af_node *p = v ? v->producer : NULL;
        if (!p || p->graph != g || p == fused) continue;
        int k = fuse_match_index(m, p);
        if ((k >= 0 && (removed >> k & 1)) || p->id > last)
            return "fused op would read a value the pattern removes";
    }
    return NULL;
}

static bool append_str(af_arena *a, const char ***list, int *n, int *cap, const char *s) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*list)[i], s)) return true;
    if (!af_arena_grow(a, (void **)list, cap, *n + 1, sizeof(char *))) return false;
    (*list)[(*n)++] = s;
    return true;
}

/* "fused_nodes": the original nodes behind every covered node, in graph order; "fusion_rule":
 * the rules that built the covered fused nodes, then this one. */
static bool provenance(const af_match *m, af_node *fused, uint64_t covers, const char *rule) {
    af_arena *a = fused->graph->arena;
    const char **names = NULL, **rl = NULL;
    int nn = 0, ncap = 0, nr = 0, rcap = 0;
    int order[AF_MATCH_MAX], no = 0;
    for (int i = 0; i < m->n; i++) {
        if (!(covers >> i & 1)) continue;
        int k = no++;
        for (; k > 0 && m->node[order[k - 1]]->id > m->node[i]->id; k--) order[k] = order[k - 1];
        order[k] = i;
    }
    for (int j = 0; j < no; j++) {
        const af_node *c = m->node[order[j]];
        const af_attr *fn = af_node_attr(c, "fused_nodes");
        if (fn && fn->type == AF_ATTR_STRINGS && fn->n > 0) {
            for (int k = 0; k < fn->n; k++)
                if (fn->strings[k] && !append_str(a, &names, &nn, &ncap, fn->strings[k]))
                    return false;
        } else if (!append_str(a, &names, &nn, &ncap, c->name)) {
            return false;
        }
        const char *fr = af_attr_str(c, "fusion_rule", NULL);
        while (fr && *fr) {
            size_t len = strcspn(fr, ",");
            char *tok = af_arena_strndup(a, fr, len);
            if (!tok || (len && !append_str(a, &rl, &nr, &rcap, tok))) return false;
            fr += len + (fr[len] == ',');
        }
    }
    if (!append_str(a, &rl, &nr, &rcap, rule)) return false;
    size_t len = 1;
    for (int i = 0; i < nr; i++) len += strlen(rl[i]) + 1;
    char *joined = af_arena_alloc(a, len);
    if (!joined) return false;
    for (int i = 0; i < nr; i++) {
        if (i) strcat(joined, ",");
        strcat(joined, rl[i]);
    }
    af_attr *at = af_node_add_attr(fused, "fusion_rule", AF_ATTR_STRING);
    if (!at) return false;
    at->s = joined;
    at->slen = strlen(joined);
    at = af_node_add_attr(fused, "fused_nodes", AF_ATTR_STRINGS);
    if (!at) return false;
    at->strings = names;
    at->n = nn;
    return true;
}

af_status fuse_commit(af_fusion_ctx *cx, af_match *m, af_node *fused, af_value *out,
                    uint64_t covers, af_error *err) {
    af_graph *g = fused->graph;
    AF_ASSERT(g->nnodes > 0 && g->nodes[g->nnodes - 1] == fused && !fused->out[0]);
    covers &= fuse_all(m);
    uint64_t removed = covers & ~m->keep;
    int last = -1;
    for (int i = 0; i < m->n; i++)
        if ((covers >> i & 1) && m->node[i]->id > last) last = m->node[i]->id;
    const char *why = NULL;
    if (last < 0 || !out) why = "nothing to fuse";
    else if (!out->producer || out->producer->id != last)
        why = "pattern output is not produced last";
    bool oom = false;
    if (!why) why = validate(fused, out, &oom);
    if (!why) why = check_inputs(m, fused, removed, last);
    if (why) {
        af_node_remove(fused);
        /* Out of memory is an error, not a reason to leave the pattern unfused. */
        if (oom) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", g->file ? g->file : "<model>");
        cx->declined = why;
        return AF_OK;
    }
    const char *rule = m->report_as ? m->report_as : af_fusion_rule_name(cx->rule);
    if (!provenance(m, fused, covers, rule))
        return af_node_fail(err, fused, AF_ERR_NOMEM, "out of memory");
    double flops = 0.0;
    if (cx->mach) {
        for (int i = 0; i < m->n; i++) {
            if (!(covers >> i & 1)) continue;
            flops += node_flops(cx, m->node[i]);
            if (removed >> i & 1) cx->unfused += node_time(cx, m->node[i]);
        }
    }
    af_node_set_output(fused, 0, out);
    af_node_move_last_to(g, last + 1);
    for (int i = 0; i < m->n; i++)
        if (removed >> i & 1) af_node_remove(m->node[i]);
    cx->commits++;
    cx->declined = NULL;
    if (cx->mach) {
        if (!af_arena_grow(g->arena, (void **)&cx->fl, &cx->flcap, cx->nfl + 1, sizeof(fuse_flops)))
            return af_node_fail(err, fused, AF_ERR_NOMEM, "out of memory");
        cx->fl[cx->nfl++] = (fuse_flops){fused, flops};
        cx->fused += af_cost_node_time(cx->mach, fused, flops);
    }
    return AF_OK;
}

bool fuse_declined(const af_fusion_ctx *cx) {
    return cx->declined != NULL;
}

static bool alive(const af_node *n) {
    const af_graph *g = n->graph;
    return n->id >= 0 && n->id < g->nnodes && g->nodes[n->id] == n;
}

void fuse_remove_if_dead(af_fusion_ctx *cx, af_node *n) {
    if (!alive(n)) return;
    for (int o = 0; o < n->nout; o++)
        if (n->out[o] && (n->out[o]->nuses > 0 || n->out[o]->is_output)) return;
    if (cx->mach) cx->unfused += node_time(cx, n);
    af_node_remove(n);
}

/* ---- plugin rules ----------------------------------------------------------------------------- */

/* Is n a node of g? (A plugin hands back pointers: nothing is dereferenced before this.) */
static bool node_of(const af_graph *g, const af_pnode *n) {
    for (int i = 0; n && i < g->nnodes; i++)
        if ((const af_pnode *)g->nodes[i] == n) return true;
    return false;
}

/* The plugin rule's anchor: its op, and for a custom op its domain and name. */
static bool plugin_anchor(const af_custom_rule *p, const af_node *n) {
    if (strcmp(n->op_type, p->anchor_op)) return false;
    const char *d = p->anchor_domain && strcmp(p->anchor_domain, "ai.onnx") ? p->anchor_domain : "";
    const char *nd = n->domain && strcmp(n->domain, "ai.onnx") ? n->domain : "";
    return !strcmp(d, nd);
}

/* The check of a plugin rule: the plugin's check, then what it matched turned into an af_match
 * after every index and pointer in it is checked (a plugin's mistake is a near miss). */
static const char *plugin_check(af_fusion_ctx *cx, af_node *n, af_match *m) {
    const af_custom_rule *p = plugin_rule(cx->rule);
    if (!plugin_anchor(p, n)) return AF_NO_MATCH;
    af_plugin_match *pm = &cx->pm;
    memset(pm, 0, sizeof *pm);
    const char *why = p->check((const af_pnode *)n, &af_plugin_graph_api, pm);
    if (why) return why;
    const af_graph *g = n->graph;
    if (pm->nnodes < 1 || pm->nnodes > AF_PLUGIN_MATCH_MAX || pm->nodes[0] != (const af_pnode *)n ||
        pm->ninputs < 0 || pm->ninputs > AF_PLUGIN_MATCH_MAX || pm->nattrs < 0 ||
        pm->nattrs > (int)AF_COUNT(pm->attrs) || pm->out_node < 0 || pm->out_node >= pm->nnodes)
        return "the plugin's match is malformed";
    for (int i = 0; i < pm->nnodes; i++)
        if (!node_of(g, pm->nodes[i]) || !fuse_match_add(m, (af_node *)pm->nodes[i]))
            return "the plugin's match names a node outside the graph";
    for (int k = 0; k < pm->ninputs; k++) {
        int i = pm->inputs[k].node, in = pm->inputs[k].input;
        if (i < 0 || i >= pm->nnodes || in < 0 || in >= ((const af_node *)pm->nodes[i])->nin)
            return "the plugin's match names an input that does not exist";
    }
    for (int a = 0; a < pm->nattrs; a++)
        if (!pm->attrs[a].name || !*pm->attrs[a].name) return "the plugin's match is malformed";
    const af_node *o = (const af_node *)pm->nodes[pm->out_node];
    if (pm->out_output < 0 || pm->out_output >= o->nout || !o->out[pm->out_output])
        return "the plugin's match names an output that does not exist";
    fuse_match_output(m, o->out[pm->out_output]);
    return NULL;
}

/* One node of the rule's fused op over the matched inputs, with the match's attributes. */
static af_status plugin_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    const af_custom_rule *p = plugin_rule(cx->rule);
    const af_plugin_match *pm = &cx->pm;
    af_node *a = m->node[0];
    af_arena *ar = a->graph->arena;
    af_node *f = af_node_new_ours(a->graph, AF_OP_CUSTOM, a->name, pm->ninputs);
    if (!f) return af_node_fail(err, a, AF_ERR_NOMEM, "out of memory");
    f->domain = af_arena_strndup(ar, p->fused_domain, strlen(p->fused_domain));
    f->op_type = af_arena_strndup(ar, p->fused_op, strlen(p->fused_op));
    bool ok = f->domain && f->op_type;
    for (int k = 0; k < pm->ninputs; k++) {
        const af_node *src = (const af_node *)pm->nodes[pm->inputs[k].node];
        af_node_set_input(f, k, src->in[pm->inputs[k].input]);
    }
    for (int i = 0; ok && i < pm->nattrs; i++) {
        const char *name = af_arena_strndup(ar, pm->attrs[i].name, strlen(pm->attrs[i].name));
        ok = name && (pm->attrs[i].is_float ? af_node_set_float(f, name, pm->attrs[i].f)
                                            : af_node_set_int(f, name, pm->attrs[i].i));
    }
    if (!ok) return af_node_fail(err, a, AF_ERR_NOMEM, "out of memory");
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* The row of rule r: a built-in one, or the glue around a plugin's. */
static fuse_rule rule_row(int r) {
    const af_custom_rule *p = plugin_rule(r);
    if (!p) return rules[r];
    return (fuse_rule){p->name, af_fusion_rule_pattern(r), af_fusion_rule_conditions(r), NULL,
                     AF_OP_COUNT, plugin_check, plugin_apply};
}

/* ---- the walk ------------------------------------------------------------------------------ */

static af_fusion_stat *stat_for(af_fusion_report *r, int rule, const char *name) {
    for (int i = 0; i < r->nstats; i++)
        if (r->stats[i].rule == rule && !strcmp(r->stats[i].fused_into, name)) return &r->stats[i];
    if (r->nstats >= AF_FUSION_MAX_STATS) return NULL;
    af_fusion_stat *s = &r->stats[r->nstats++];
    memset(s, 0, sizeof *s);
    s->rule = rule;
    s->fused_into = name;
    return s;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s ? s : "");
    char *d = af_malloc(n + 1);
    if (d) memcpy(d, s ? s : "", n + 1);
    return d;
}

/* Note a near miss of the current rule at node `name` (op_type) in the report. */
static af_status record_miss(af_fusion_ctx *cx, const char *name, const char *op_type,
                             const char *reason, bool count, af_error *err) {
    af_fusion_report *r = cx->rep;
    if (!r) return AF_OK;
    if (count) {
        af_fusion_stat *s = stat_for(r, cx->rule, af_fusion_rule_name(cx->rule));
        if (s) s->matched++;
    }
    if (r->nmisses == r->misses_cap) {
        int cap = r->misses_cap ? r->misses_cap * 2 : 16;
        af_fusion_miss *nm = af_realloc(r->misses, (size_t)cap * sizeof *nm);
        if (!nm) return af_fail(err, AF_ERR_NOMEM, "out of memory recording a near miss");
        r->misses = nm;
        r->misses_cap = cap;
    }
    af_fusion_miss *mi = &r->misses[r->nmisses];
    mi->rule = cx->rule;
    mi->reason = reason;
    mi->node = dup_str(name);
    mi->op_type = dup_str(op_type);
    if (!mi->node || !mi->op_type) {
        af_free(mi->node);
        af_free(mi->op_type);
        return af_fail(err, AF_ERR_NOMEM, "out of memory recording a near miss");
    }
    r->nmisses++;
    return AF_OK;
}

static void record_applied(af_fusion_ctx *cx, const char *name) {
    if (!cx->rep) return;
    af_fusion_stat *s = stat_for(cx->rep, cx->rule, name);
    if (!s) return;
    s->matched++;
    s->applied++;
    s->t_unfused += cx->unfused;
    s->t_fused += cx->fused;
}

/* Offer every node of g that existed when the rule started to rule r. */
static af_status run_rule(af_fusion_ctx *cx, af_graph *g, int r, af_error *err) {
    const fuse_rule row = rule_row(r), *rule = &row;
    int count = g->nnodes;
    if (count == 0) return AF_OK;
    af_node **snap = af_malloc((size_t)count * sizeof *snap);
    if (!snap) return af_fail(err, AF_ERR_NOMEM, "out of memory in the fusion engine");
    memcpy(snap, g->nodes, (size_t)count * sizeof *snap);
    af_match *m = af_malloc(sizeof *m);
    af_status st = m ? AF_OK : af_fail(err, AF_ERR_NOMEM, "out of memory in the fusion engine");
    cx->rule = r;
    for (int i = 0; i < count && st == AF_OK; i++) {
        af_node *n = snap[i];
        if (!alive(n) || (rule->anchor != AF_OP_COUNT && n->op != rule->anchor)) continue;
        memset(m, 0, sizeof *m);
        const char *why = rule->check(cx, n, m);
        if (why == AF_NO_MATCH) continue;
        if (!why) why = guard(m, g);
        if (why == AF_NO_MATCH) continue;
        if (why) {
            st = record_miss(cx, n->name, n->op_type, why, true, err);
            continue;
        }
        /* The anchor may be gone after apply; keep what the report needs. */
        const char *name = n->name, *op_type = n->op_type;
        cx->declined = NULL;
        cx->unfused = cx->fused = 0.0;
        cx->commits = 0;
        st = rule->apply(cx, m, err);
        if (st != AF_OK) break;
        if (cx->commits > 0) {
            record_applied(cx, m->report_as ? m->report_as : rule->name);
            if (m->partial) st = record_miss(cx, name, op_type, m->partial, false, err);
        } else if (cx->declined) {
            st = record_miss(cx, name, op_type, cx->declined, true, err);
        }
    }
    af_free(m);
    af_free(snap);
    return st;
}

static af_status fuse_graph(af_fusion_ctx *cx, af_graph *g, const af_fusion_config *cfg,
                            af_error *err) {
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i];
        for (int a = 0; a < n->nattrs; a++) {
            af_attr *at = &n->attrs[a];
            af_status st = at->g ? fuse_graph(cx, at->g, cfg, err) : AF_OK;
            for (int k = 0; at->graphs && k < at->n && st == AF_OK; k++)
                st = fuse_graph(cx, at->graphs[k], cfg, err);
            if (st != AF_OK) return st;
        }
    }
    /* Plugin rules first: they name bigger, specific patterns the generic rules would split. */
    int nrules = af_fusion_rule_count();
    for (int i = 0; i < nrules; i++) {
        int r = (AF_RULE_COUNT + i) % nrules;
        if (cfg && cfg->disabled[r]) continue;
        af_status st = run_rule(cx, g, r, err);
        if (st != AF_OK) return st;
    }
    return AF_OK;
}

/* Node count and estimated time of g and its subgraphs. */
static void graph_totals(const af_fusion_ctx *cx, const af_graph *g, int *count, double *t) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        (*count)++;
        *t += node_time(cx, n);
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->g) graph_totals(cx, at->g, count, t);
            for (int k = 0; at->graphs && k < at->n; k++) graph_totals(cx, at->graphs[k], count, t);
        }
    }
}

af_status af_fuse(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                  af_error *err) {
    af_fusion_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.rep = rep;
    if (rep) {
        cx.mach = &rep->machine;
        if (cfg) rep->cfg = *cfg;
        else af_fusion_config_init(&rep->cfg);
        int count = 0;
        double t = 0.0;
        graph_totals(&cx, g, &count, &t);
        if (rep->ops_before == 0) rep->ops_before = count;
        rep->t_before = t;
    }
    af_status st = fuse_graph(&cx, g, cfg, err);
    if (st == AF_OK) st = af_graph_infer_shapes(g, err);
    if (st == AF_OK && rep) {
        int count = 0;
        double t = 0.0;
        graph_totals(&cx, g, &count, &t);
        rep->ops_after = count;
        rep->t_after = t;
    }
    return st;
}
