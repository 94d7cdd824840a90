/* The IR's construction and mutation API, attribute lookup and error formatting.
 * Mutations keep the use lists exact: af_node_set_input is the only way a node starts reading a
 * value, and af_node_remove / af_value_replace_uses are the only ways it stops.
 *
 * Invariant: every value's use list names exactly the (node, slot) pairs that read it. */
#include "ir/ir.h"

#include <stdarg.h>
#include <string.h>

af_status af_fail(af_error *err, af_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

af_status af_node_fail(af_error *err, const af_node *n, af_status code, const char *fmt, ...) {
    if (err) {
        char reason[768];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, sizeof reason, fmt, ap);
        va_end(ap);
        const char *file = n->graph && n->graph->file ? n->graph->file : "<model>";
        snprintf(err->message, sizeof err->message, "%s: node '%s' (%s): %s", file, n->name,
                 n->op_type ? n->op_type : "?", reason);
        err->code = code;
    }
    return code;
}

int64_t af_graph_opset(const af_graph *g) {
    for (int i = 0; i < g->nopsets; i++) {
        const char *d = g->opsets[i].domain;
        if (!d || !*d || !strcmp(d, "ai.onnx")) return g->opsets[i].version;
    }
    return 17;
}

af_graph *af_graph_new(af_arena *a, const char *file, af_graph *parent) {
    af_graph *g = af_arena_alloc(a, sizeof *g);
    if (!g) return NULL;
    g->arena = a;
    g->file = file;
    g->parent = parent;
    if (parent) {
        g->opsets = parent->opsets;
        g->nopsets = parent->nopsets;
    }
    return g;
}

af_value *af_value_new(af_graph *g, const char *name) {
    if (!af_arena_grow(g->arena, (void **)&g->values, &g->values_cap, g->nvalues + 1,
                       sizeof(af_value *)))
        return NULL;
    af_value *v = af_arena_alloc(g->arena, sizeof *v);
    if (!v) return NULL;
    v->name = name ? name : "";
    v->graph = g;
    v->id = g->nvalues;
    v->type.rank = -1;
    g->values[g->nvalues++] = v;
    return v;
}

static af_value *find_local(const af_graph *g, const char *name) {
    /* Newest first: later definitions are the ones in scope while importing. */
    for (int i = g->nvalues - 1; i >= 0; i--)
        if (!strcmp(g->values[i]->name, name)) return g->values[i];
    return NULL;
}

af_value *af_graph_find(af_graph *g, const char *name) {
    af_value *v = find_local(g, name);
    if (v) return v;
    for (af_graph *p = g->parent; p; p = p->parent) {
        v = find_local(p, name);
        if (!v) continue;
        /* Record the capture in g and every graph between g and p. */
        for (af_graph *s = g; s != p; s = s->parent) {
            bool seen = false;
            for (int i = 0; i < s->ncaptures; i++) seen |= s->captures[i] == v;
            if (seen) continue;
            if (!af_arena_grow(s->arena, (void **)&s->captures, &s->captures_cap,
                               s->ncaptures + 1, sizeof(af_value *)))
                return NULL;
            s->captures[s->ncaptures++] = v;
        }
        return v;
    }
    return NULL;
}

af_node *af_node_new(af_graph *g, af_op op, const char *name, int nin, int nout) {
    if (nin < 0 || nout < 0) return NULL;
    if (!af_arena_grow(g->arena, (void **)&g->nodes, &g->nodes_cap, g->nnodes + 1,
                       sizeof(af_node *)))
        return NULL;
    af_node *n = af_arena_alloc(g->arena, sizeof *n);
    if (!n) return NULL;
    n->op = op;
    n->graph = g;
    n->op_type = op < AF_OP_COUNT ? af_ops[op].name : "?";
    n->domain = "";
    n->in = af_arena_calloc(g->arena, (size_t)nin + 1, sizeof(af_value *));
    n->out = af_arena_calloc(g->arena, (size_t)nout + 1, sizeof(af_value *));
    if (!n->in || !n->out) return NULL;
    n->nin = nin;
    n->nout = nout;
    if (name && *name) {
        n->name = name;
    } else {
        char buf[96];
        snprintf(buf, sizeof buf, "%s_%d", n->op_type, g->node_serial++);
        n->name = af_arena_strdup(g->arena, buf);
        if (!n->name) return NULL;
    }
    n->id = g->nnodes;
    g->nodes[g->nnodes++] = n;
    return n;
}

static bool add_use(af_value *v, af_node *n, int slot) {
    af_arena *a = n->graph->arena;
    if (!af_arena_grow(a, (void **)&v->uses, &v->uses_cap, v->nuses + 1, sizeof(af_use)))
        return false;
    v->uses[v->nuses++] = (af_use){n, slot};
    return true;
}

static void drop_use(af_value *v, const af_node *n, int slot) {
    for (int i = 0; i < v->nuses; i++) {
        if (v->uses[i].node == n && v->uses[i].slot == slot) {
            v->uses[i] = v->uses[--v->nuses];
            return;
        }
    }
}

void af_node_set_input(af_node *n, int slot, af_value *v) {
    AF_ASSERT(slot >= 0 && slot < n->nin);
    if (n->in[slot]) drop_use(n->in[slot], n, slot);
    n->in[slot] = v;
    /* Out of memory here leaves the use list short; the verifier would catch it. The arena
     * grows in 64 KiB blocks, so this only fails when the process is out of memory. */
    if (v && !add_use(v, n, slot)) {
        fprintf(stderr, "autofusion: out of memory\n");
        abort();
    }
}

int af_node_add_input(af_node *n, af_value *v) {
    af_value **in = af_arena_calloc(n->graph->arena, (size_t)n->nin + 1, sizeof(af_value *));
    if (!in) return -1;
    if (n->nin) memcpy(in, n->in, (size_t)n->nin * sizeof(af_value *));
    n->in = in; /* the use lists name slots, not the array: they stay right */
    n->nin++;
    af_node_set_input(n, n->nin - 1, v);
    return n->nin - 1;
}

void af_node_set_output(af_node *n, int slot, af_value *v) {
    AF_ASSERT(slot >= 0 && slot < n->nout);
    if (n->out[slot] && n->out[slot]->producer == n) n->out[slot]->producer = NULL;
    n->out[slot] = v;
    if (v) {
        v->producer = n;
        v->producer_slot = slot;
    }
}

int af_node_add_output(af_node *n, af_value *v) {
    af_value **out = af_arena_calloc(n->graph->arena, (size_t)n->nout + 1, sizeof(af_value *));
    if (!out) return -1;
    if (n->nout) memcpy(out, n->out, (size_t)n->nout * sizeof(af_value *));
    n->out = out;
    n->nout++;
    af_node_set_output(n, n->nout - 1, v);
    return n->nout - 1;
}

void af_value_replace_uses(af_value *from, af_value *to) {
    while (from->nuses > 0) {
        af_use u = from->uses[from->nuses - 1];
        af_node_set_input(u.node, u.slot, to);
    }
}

void af_node_remove(af_node *n) {
    af_graph *g = n->graph;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i]) drop_use(n->in[i], n, i);
    for (int i = 0; i < n->nout; i++)
        if (n->out[i] && n->out[i]->producer == n) n->out[i]->producer = NULL;
    int j = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i] != n) g->nodes[j++] = g->nodes[i];
    g->nnodes = j;
    af_graph_renumber(g);
}

void af_node_move_last_to(af_graph *g, int pos) {
    AF_ASSERT(g->nnodes > 0 && pos >= 0 && pos < g->nnodes);
    af_node *last = g->nodes[g->nnodes - 1];
    memmove(g->nodes + pos + 1, g->nodes + pos, (size_t)(g->nnodes - 1 - pos) * sizeof(af_node *));
    g->nodes[pos] = last;
    af_graph_renumber(g);
}

void af_graph_renumber(af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) g->nodes[i]->id = i;
}

/* A value is available before any node of g runs when it is a graph input, a constant, or
 * belongs to an enclosing graph. */
static bool available_at_start(const af_graph *g, const af_value *v) {
    return v->graph != g || v->is_input || v->is_const || !v->producer;
}

/* The k-th thing node n waits for in g: the producer of an input, then the producers of values
 * its subgraphs capture (a body reading an outer value depends on it like an input). NULL when
 * that slot needs nothing from g. */
static const af_node *dep_at(const af_graph *g, const af_node *n, int k) {
    const af_value *v = NULL;
    if (k < n->nin) {
        v = n->in[k];
    } else {
        k -= n->nin;
        for (int a = 0; a < n->nattrs && !v; a++) {
            const af_attr *at = &n->attrs[a];
            int ng = at->g ? 1 : (at->graphs ? at->n : 0);
            for (int s = 0; s < ng && !v; s++) {
                const af_graph *sub = at->g ? at->g : at->graphs[s];
                if (k < sub->ncaptures) v = sub->captures[k];
                else k -= sub->ncaptures;
            }
        }
    }
    if (!v || available_at_start(g, v) || v->producer->graph != g) return NULL;
    return v->producer;
}

static int dep_count(const af_node *n) {
    int c = n->nin;
    for (int a = 0; a < n->nattrs; a++) {
        const af_attr *at = &n->attrs[a];
        int ng = at->g ? 1 : (at->graphs ? at->n : 0);
        for (int s = 0; s < ng; s++) c += (at->g ? at->g : at->graphs[s])->ncaptures;
    }
    return c;
}

/* Depth-first, visiting nodes in their current order, so a graph that is already sorted keeps
 * its order. Iterative: a deep chain must not exhaust the C stack. */
af_status af_graph_toposort(af_graph *g, af_error *err) {
    int n = g->nnodes;
    if (n == 0) return AF_OK;
    enum { NEW, OPEN, DONE };
    unsigned char *state = af_calloc((size_t)n, 1);
    int *stack = af_calloc((size_t)n, sizeof(int)), *next = af_calloc((size_t)n, sizeof(int));
    af_node **order = af_calloc((size_t)n, sizeof(af_node *));
    af_status st = AF_OK;
    if (!state || !stack || !next || !order) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory sorting the graph", g->file);
        goto done;
    }
    af_graph_renumber(g);
    int out = 0;
    for (int root = 0; root < n && !st; root++) {
        if (state[root] != NEW) continue;
        int top = 0;
        stack[top++] = root;
        state[root] = OPEN;
        while (top > 0) {
            int cur = stack[top - 1];
            const af_node *nd = g->nodes[cur];
            if (next[cur] < dep_count(nd)) {
                const af_node *d = dep_at(g, nd, next[cur]++);
                if (!d) continue;
                if (state[d->id] == OPEN) {
                    st = af_node_fail(err, nd, AF_ERR_INVALID_MODEL,
                                      "graph has a cycle through this node");
                    break;
                }
                if (state[d->id] == NEW) {
                    state[d->id] = OPEN;
                    stack[top++] = d->id;
                }
                continue;
            }
            state[cur] = DONE;
            order[out++] = g->nodes[cur];
            top--;
        }
    }
    if (!st) {
        memcpy(g->nodes, order, (size_t)n * sizeof(af_node *));
        af_graph_renumber(g);
    }
done:
    af_free(state);
    af_free(stack);
    af_free(next);
    af_free(order);
    return st;
}

af_status af_graph_verify(const af_graph *g, af_error *err) {
    const char *file = g->file ? g->file : "<model>";
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->id != i || n->graph != g)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "node numbering is stale");
        for (int k = 0; k < n->nin; k++) {
            const af_value *v = n->in[k];
            if (!v) continue;
            bool listed = false;
            for (int u = 0; u < v->nuses; u++)
                listed |= v->uses[u].node == n && v->uses[u].slot == k;
            if (!listed)
                return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d ('%s') misses its use", k,
                                    v->name);
        }
        for (int k = 0, nd = dep_count(n); k < nd; k++) {
            const af_node *d = dep_at(g, n, k);
            if (d && d->id >= i)
                return af_node_fail(err, n, AF_ERR_INTERNAL,
                                    "reads a value of node '%s', which runs later", d->name);
        }
        for (int o = 0; o < n->nout; o++)
            if (n->out[o] && n->out[o]->producer != n)
                return af_node_fail(err, n, AF_ERR_INTERNAL, "output '%s' names another producer",
                                    n->out[o]->name);
    }
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        for (int u = 0; u < v->nuses; u++) {
            const af_use *use = &v->uses[u];
            if (use->slot >= use->node->nin || use->node->in[use->slot] != v)
                return af_fail(err, AF_ERR_INTERNAL, "%s: value '%s' lists a stale use", file,
                               v->name);
        }
    }
    for (int i = 0; i < g->noutputs; i++)
        if (!g->outputs[i])
            return af_fail(err, AF_ERR_INTERNAL, "%s: graph output %d is missing", file, i);
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i]->nattrs; a++) {
            const af_attr *at = &g->nodes[i]->attrs[a];
            if (at->g) {
                af_status st = af_graph_verify(at->g, err);
                if (st) return st;
            }
            for (int k = 0; k < at->n && at->graphs; k++) {
                af_status st = af_graph_verify(at->graphs[k], err);
                if (st) return st;
            }
        }
    return AF_OK;
}

const af_attr *af_node_attr(const af_node *n, const char *name) {
    for (int i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}

int64_t af_attr_int(const af_node *n, const char *name, int64_t dflt) {
    const af_attr *a = af_node_attr(n, name);
    return a && a->type == AF_ATTR_INT ? a->i : dflt;
}

float af_attr_float(const af_node *n, const char *name, float dflt) {
    const af_attr *a = af_node_attr(n, name);
    if (a && a->type == AF_ATTR_FLOAT) return a->f;
    if (a && a->type == AF_ATTR_INT) return (float)a->i;
    return dflt;
}

const char *af_attr_str(const af_node *n, const char *name, const char *dflt) {
    const af_attr *a = af_node_attr(n, name);
    return a && a->type == AF_ATTR_STRING ? a->s : dflt;
}

int af_attr_ints(const af_node *n, const char *name, const int64_t **v) {
    const af_attr *a = af_node_attr(n, name);
    if (!a || a->type != AF_ATTR_INTS) return -1;
    *v = a->ints;
    return a->n;
}

int af_attr_floats(const af_node *n, const char *name, const float **v) {
    const af_attr *a = af_node_attr(n, name);
    if (!a || a->type != AF_ATTR_FLOATS) return -1;
    *v = a->floats;
    return a->n;
}

const char *af_graph_unique_name(af_graph *g, const char *hint) {
    char buf[256];
    for (;;) {
        snprintf(buf, sizeof buf, "%s_%d", hint, g->node_serial++);
        bool taken = false;
        for (const af_graph *s = g; s && !taken; s = s->parent)
            for (int i = 0; i < s->nvalues && !taken; i++) taken = !strcmp(s->values[i]->name, buf);
        if (!taken) return af_arena_strdup(g->arena, buf);
    }
}

af_value *af_value_new_const(af_graph *g, const char *name, af_dtype dtype, int rank,
                             const int64_t *dims) {
    if (rank < 0 || rank > AF_MAX_RANK) return NULL;
    af_value *v = af_value_new(g, name);
    if (!v) return NULL;
    v->type.dtype = dtype;
    v->type.rank = rank;
    for (int i = 0; i < rank; i++) v->type.dims[i] = dims[i];
    int64_t n = af_tensor_numel(&v->type);
    size_t bytes;
    if (n < 0 || !af_mul_size((size_t)n, af_dtype_size(dtype), &bytes)) return NULL;
    v->type.data = af_arena_alloc_data(g->arena, bytes);
    if (!v->type.data) return NULL;
    v->type.nbytes = bytes;
    v->type.owns_data = 0; /* the arena owns it */
    v->is_const = true;
    return v;
}

af_attr *af_node_add_attr(af_node *n, const char *name, af_attr_type type) {
    af_attr *a = af_arena_calloc(n->graph->arena, (size_t)n->nattrs + 1, sizeof(af_attr));
    if (!a) return NULL;
    if (n->nattrs) memcpy(a, n->attrs, (size_t)n->nattrs * sizeof(af_attr));
    n->attrs = a;
    af_attr *at = &a[n->nattrs++];
    at->name = name;
    at->type = type;
    return at;
}
