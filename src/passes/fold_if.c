/* An If whose condition is known at compile time becomes the branch it takes, inlined into the
 * enclosing graph. The condition is known when it is a constant, which constant folding makes it
 * also when it is computed from known shapes (Shape -> Gather -> Equal, Size -> Greater).
 *
 * The IR of a model lives in one arena, so inlining moves rather than copies: the branch's nodes
 * and values are re-parented to the enclosing graph at the If's position. Node names get the
 * If's name as a prefix ("If_3/Gemm_0"), so the report and profile still say where they came
 * from; a value whose name the graph (or a graph enclosing it) already uses is renamed; bodies
 * nested in the branch get the graph as their parent. Each of the If's outputs is then produced
 * by an Identity of the branch's output, which simplify's copy removal takes away in the next
 * round (handing the If output's name to the branch's producer when the name is pinned).
 *
 * Invariant: the graph computes what the If computed; the If's output values keep their names
 * and readers. An If the kernel would refuse (a condition of more than one element) or a branch
 * that does not match the node is left alone, to fail at run time as before. Capture lists are
 * stale after a fold until pass_fix_captures (af_pass_simplify ends with it).
 */
#include "passes/rewrite.h"

#include <string.h>

/* The branch n takes for certain, or NULL. The test is the kernel's (ref_if): the condition's
 * only element, read as an integer, non-zero. */
static af_graph *taken_branch(const af_node *n) {
    const af_value *c = n->nin >= 1 ? n->in[0] : NULL;
    if (n->op != AF_OP_IF || !c || !af_value_is_const(c) || af_tensor_numel(&c->type) != 1 ||
        !af_dtype_size(c->type.dtype))
        return NULL;
    bool cond = af_tensor_get_int(&c->type, 0) != 0;
    const af_attr *a = af_node_attr(n, cond ? "then_branch" : "else_branch");
    af_graph *b = a && a->type == AF_ATTR_GRAPH ? a->g : NULL;
    return b && b->ninputs == 0 && b->noutputs == n->nout ? b : NULL;
}

static bool name_taken(const af_graph *g, const char *name) {
    for (const af_graph *s = g; s; s = s->parent)
        for (int i = 0; i < s->nvalues; i++)
            if (!strcmp(s->values[i]->name, name)) return true;
    return false;
}

/* Value v of a branch becomes a value of g (renamed when g's scope has its name). */
static bool adopt_value(af_graph *g, af_value *v) {
    if (name_taken(g, v->name)) {
        const char *name = af_graph_unique_name(g, v->name);
        if (!name) return false;
        v->name = name;
    }
    if (!af_arena_grow(g->arena, (void **)&g->values, &g->values_cap, g->nvalues + 1,
                       sizeof(af_value *)))
        return false;
    v->graph = g;
    v->id = g->nvalues;
    v->is_output = false; /* it was the branch's output; the If's output is g's */
    g->values[g->nvalues++] = v;
    return true;
}

/* Node m of a branch becomes node `pos` of g, named "<prefix>/<its name>". */
static bool adopt_node(af_graph *g, af_node *m, const char *prefix, int pos) {
    size_t len = strlen(prefix) + strlen(m->name) + 2;
    char *name = af_arena_alloc(g->arena, len);
    if (!name || !af_arena_grow(g->arena, (void **)&g->nodes, &g->nodes_cap, g->nnodes + 1,
                                sizeof(af_node *)))
        return false;
    snprintf(name, len, "%s/%s", prefix, m->name);
    m->name = name;
    m->graph = g;
    m->id = g->nnodes;
    g->nodes[g->nnodes++] = m;
    af_node_move_last_to(g, pos);
    af_graph *sub;
    for (int k = 0; (sub = pass_subgraph(m, k)); k++) sub->parent = g;
    return true;
}

/* Replace If node n of g by branch b. */
static af_status inline_branch(af_graph *g, af_node *n, af_graph *b, af_error *err) {
    int pos = n->id, count = b->nnodes;
    for (int i = 0; i < b->nvalues; i++)
        if (!adopt_value(g, b->values[i])) goto oom;
    for (int i = 0; i < count; i++)
        if (!adopt_node(g, b->nodes[i], n->name, pos + i)) goto oom;
    b->nnodes = b->nvalues = 0; /* b is no one's now: its node goes below */
    af_node_remove(n);
    for (int o = 0, at = pos + count; o < n->nout; o++) {
        if (!n->out[o]) continue;
        af_node *copy = af_node_new(g, AF_OP_IDENTITY, af_graph_unique_name(g, n->name), 1, 1);
        if (!copy) goto oom;
        af_node_set_input(copy, 0, b->outputs[o]);
        af_node_set_output(copy, 0, n->out[o]);
        af_node_move_last_to(g, at++);
    }
    return AF_OK;
oom:
    return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory inlining the branch");
}

af_status pass_fold_if(af_graph *g, bool *changed, af_error *err) {
    /* By index, re-reading position i after a fold: the inlined branch may hold an If whose
     * condition is known too. */
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i];
        af_graph *b = taken_branch(n);
        if (!b) continue;
        af_status st = inline_branch(g, n, b, err);
        if (st) return st;
        *changed = true;
        i--;
    }
    return AF_OK;
}
