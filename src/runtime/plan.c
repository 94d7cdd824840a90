/* The memory planner (see plan.h): liveness over the node order, in-place reuse for the ops
 * whose row of the op table allows it (ir/ops.def: .inplace), and a greedy placement of the resulting buffers in one arena; plus the checker
 * that holds any plan (ours or one read from a file) to the invariant of plan.h.
 *
 * Buffers: a value planned in place over its producer's input 0 joins that input's buffer, so a
 * buffer is a chain of values handed from one op to the next; it lives from its first value's
 * producer to its last value's last reader, and has one offset. Placement takes buffers largest
 * first and puts each at the lowest offset where it overlaps no buffer live at the same time
 * (first fit): large buffers fix the arena's shape, small ones fill the gaps they leave.
 */
#include "ir/epilogue.h"
#include "kernels/fast/dispatch.h"
#include "runtime/plan.h"

#include <stdarg.h>
#include <string.h>

/* Bytes of a fully known numeric type; false when unknown, empty, or beyond AF_PLAN_MAX_BYTES. */
static bool type_bytes(const af_tensor *t, uint64_t *bytes) {
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), b;
    if (t->rank < 0 || t->rank > AF_MAX_RANK || n <= 0 || es == 0 || t->dtype == AF_DTYPE_STRING ||
        !af_mul_size((size_t)n, es, &b) || b > AF_PLAN_MAX_BYTES)
        return false;
    *bytes = b;
    return true;
}

bool af_plan_inplace_ok(const af_node *n, const af_tensor *in0, const af_tensor *out) {
    af_inplace k = af_ops[n->op].inplace;
    int ep = af_ops[n->op].ep;
    uint64_t a, b;
    /* An activation in place reads one input, arithmetic two: a node with others is not what
     * the row promises about. */
    if ((af_ep_is_unary(ep) && n->nin != 1) || (af_ep_is_binary(ep) && n->nin != 2)) return false;
    if (k == AF_INPLACE_NONE || in0->dtype != out->dtype || !type_bytes(in0, &a) ||
        !type_bytes(out, &b) || a != b)
        return false;
    if (k == AF_INPLACE_VIEW) return true;
    if (in0->rank != out->rank) return false;
    for (int d = 0; d < out->rank; d++)
        if (in0->dims[d] != out->dims[d]) return false;
    return true;
}

/* ---- liveness ---------------------------------------------------------------------------------- */

/* Per value id of the main graph: producer position (-1 if none), last reader position, and
 * the bytes of the value when it can be planned (0 otherwise). */
typedef struct live {
    const af_graph *g;
    const af_tensor *types; /* by value id, this plan's types (NULL: the graph's own) */
    int *def, *last;
    uint64_t *bytes;
} live;

static bool has_subgraph(const af_node *n) {
    for (int a = 0; a < n->nattrs; a++)
        if ((n->attrs[a].type == AF_ATTR_GRAPH && n->attrs[a].g) ||
            (n->attrs[a].type == AF_ATTR_GRAPHS && n->attrs[a].n > 0))
            return true;
    return false;
}

static void read_at(live *L, const af_value *v, int pos) {
    if (v && v->graph == L->g && v->id >= 0 && v->id < L->g->nvalues && L->last[v->id] < pos)
        L->last[v->id] = pos;
}

/* Everything subgraph sg (and the subgraphs inside it) reads of the main graph is read at pos:
 * the listed captures, and, should a list be stale, every node input directly. */
static void read_sub(live *L, const af_graph *sg, int pos, int depth) {
    if (!sg || depth > 256) return;
    for (int c = 0; c < sg->ncaptures; c++) read_at(L, sg->captures[c], pos);
    for (int i = 0; i < sg->nnodes; i++) {
        const af_node *n = sg->nodes[i];
        for (int k = 0; k < n->nin; k++) read_at(L, n->in[k], pos);
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_GRAPH) read_sub(L, at->g, pos, depth + 1);
            for (int s = 0; at->type == AF_ATTR_GRAPHS && s < at->n; s++)
                read_sub(L, at->graphs[s], pos, depth + 1);
        }
    }
    for (int k = 0; k < sg->noutputs; k++) read_at(L, sg->outputs[k], pos);
}

static void live_free(live *L) {
    af_free(L->def);
    af_free(L->last);
    af_free(L->bytes);
}

/* types: by value id, what each value's type is for this plan (NULL: the graph's own). */
static af_status live_compute(live *L, const af_graph *g, const af_tensor *types,
                              af_error *err) {
    size_t n = (size_t)g->nvalues + 1;
    L->g = g;
    L->types = types;
    L->def = af_malloc(n * sizeof(int));
    L->last = af_malloc(n * sizeof(int));
    L->bytes = af_calloc(n, sizeof(uint64_t));
    if (!L->def || !L->last || !L->bytes) {
        live_free(L);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory planning memory",
                       g->file ? g->file : "<model>");
    }
    for (int i = 0; i < g->nvalues; i++) L->def[i] = L->last[i] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *nd = g->nodes[i];
        for (int k = 0; k < nd->nin; k++) read_at(L, nd->in[k], i);
        for (int a = 0; a < nd->nattrs; a++) {
            const af_attr *at = &nd->attrs[a];
            if (at->type == AF_ATTR_GRAPH) read_sub(L, at->g, i, 0);
            for (int s = 0; at->type == AF_ATTR_GRAPHS && s < at->n; s++)
                read_sub(L, at->graphs[s], i, 0);
        }
        for (int o = 0; o < nd->nout; o++) {
            const af_value *v = nd->out[o];
            if (!v || v->graph != g || v->id < 0 || v->id >= g->nvalues || L->def[v->id] >= 0)
                continue;
            L->def[v->id] = i;
            if (v->producer == nd && !v->is_input && !v->is_const && !v->is_output &&
                !has_subgraph(nd) &&
                type_bytes(types ? &types[v->id] : &v->type, &L->bytes[v->id]))
                continue;
            L->bytes[v->id] = 0;
        }
    }
    /* A value read before it is produced (a graph the verifier would refuse) is not planned;
     * an output nobody reads lives during its producer only. */
    for (int i = 0; i < g->nvalues; i++) {
        if (L->def[i] < 0) continue;
        if (L->last[i] >= 0 && L->last[i] < L->def[i]) L->bytes[i] = 0;
        if (L->last[i] < L->def[i]) L->last[i] = L->def[i];
    }
    for (int k = 0; k < g->noutputs; k++) /* outputs listed without the flag */
        if (g->outputs[k] && g->outputs[k]->graph == g && g->outputs[k]->id >= 0 &&
            g->outputs[k]->id < g->nvalues)
            L->bytes[g->outputs[k]->id] = 0;
    return AF_OK;
}

static uint64_t align_up(uint64_t v) {
    return (v + AF_PLAN_ALIGN - 1) / AF_PLAN_ALIGN * AF_PLAN_ALIGN;
}

/* The value that output v of node nd may overwrite, or NULL: v is output 0 of an op of the
 * table, input 0 is a planned value (slots[id].offset >= 0) that dies at this node, is read
 * through no other slot and has v's size (and shape, for SAME_SHAPE ops), in this plan's types:
 * a dynamic model's plan per shape signature once judged by the compiled types, whose symbolic
 * sizes never match, and put no value in place (Swin-T with a dynamic batch copied its 69
 * Reshapes, 1.7 ms a run). */
static const af_value *inplace_source(const live *L, const af_node *nd, const af_value *v,
                                      const af_plan_slot *slots) {
    if (nd->nout < 1 || nd->out[0] != v || nd->nin < 1 || has_subgraph(nd)) return NULL;
    const af_value *in0 = nd->in[0];
    if (!in0 || in0->graph != L->g || in0->id < 0 || in0->id >= L->g->nvalues) return NULL;
    if (!L->bytes[in0->id] || slots[in0->id].offset < 0 || L->last[in0->id] != L->def[v->id])
        return NULL;
    for (int k = 1; k < nd->nin; k++)
        if (nd->in[k] == in0) return NULL;
    return af_plan_inplace_ok(nd, L->types ? &L->types[in0->id] : &in0->type,
                              L->types ? &L->types[v->id] : &v->type)
               ? in0
               : NULL;
}

/* ---- buffers ------------------------------------------------------------------------------------ */

typedef struct buffer {
    int root;          /* the chain's first value */
    uint64_t size;     /* aligned bytes */
    int start, end;    /* live range in node positions */
    int64_t offset;
} buffer;

/* Buffers of the values planned (slots[i].offset >= 0 marks them, inplace_of links chains);
 * bufof[value id] receives each value's buffer index. */
static af_status make_buffers(const live *L, const af_plan_slot *slots, int *bufof,
                              buffer **out, int *nout, af_error *err) {
    const af_graph *g = L->g;
    buffer *b = af_calloc((size_t)g->nvalues + 1, sizeof *b);
    int nb = 0;
    if (!b) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory planning memory", g->file);
    /* In producer order, so a chain's earlier value has its buffer before the next joins. */
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *nd = g->nodes[i];
        for (int o = 0; o < nd->nout; o++) {
            const af_value *v = nd->out[o];
            if (!v || v->graph != g || v->id < 0 || v->id >= g->nvalues || L->def[v->id] != i ||
                slots[v->id].offset < 0)
                continue;
            int src = slots[v->id].inplace_of;
            int k = src >= 0 ? bufof[src] : -1;
            if (k < 0) {
                k = nb++;
                b[k] = (buffer){v->id, slots[v->id].size, i, i, slots[v->id].offset};
            }
            bufof[v->id] = k;
            if (b[k].end < L->last[v->id]) b[k].end = L->last[v->id];
        }
    }
    *out = b;
    *nout = nb;
    return AF_OK;
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Max over node positions of the bytes of buffers live there. */
static af_status lower_bound(const af_graph *g, const buffer *b, int nb, uint64_t *out,
                             af_error *err) {
    uint64_t *add = af_calloc((size_t)g->nnodes + 2, sizeof *add),
             *sub = af_calloc((size_t)g->nnodes + 2, sizeof *sub);
    if (!add || !sub) {
        af_free(add);
        af_free(sub);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory planning memory", g->file);
    }
    for (int k = 0; k < nb; k++) {
        add[b[k].start] = sat_add(add[b[k].start], b[k].size);
        sub[b[k].end + 1] = sat_add(sub[b[k].end + 1], b[k].size);
    }
    uint64_t cur = 0, best = 0;
    for (int t = 0; t <= g->nnodes; t++) {
        cur = sat_add(cur, add[t]);
        cur = cur == UINT64_MAX ? cur : cur - sub[t]; /* a saturated sum stays saturated */
        if (cur > best) best = cur;
    }
    af_free(add);
    af_free(sub);
    *out = best;
    return AF_OK;
}

/* ---- placement ---------------------------------------------------------------------------------- */

static int by_size_desc(const void *pa, const void *pb) {
    const buffer *a = pa, *b = pb;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    if (a->start != b->start) return a->start < b->start ? -1 : 1;
    return (a->root > b->root) - (a->root < b->root);
}

typedef struct span {
    uint64_t off, end;
} span;

static int by_off(const void *pa, const void *pb) {
    const span *a = pa, *b = pb;
    return (a->off > b->off) - (a->off < b->off);
}

/* Offsets for b[0..nb), sorted largest first; a buffer that would end beyond
 * AF_PLAN_MAX_BYTES stays unplanned (offset -1). */
static af_status place(buffer *b, int nb, uint64_t *arena, af_error *err) {
    span *busy = af_malloc(((size_t)nb + 1) * sizeof *busy);
    if (!busy) return af_fail(err, AF_ERR_NOMEM, "out of memory planning memory");
    qsort(b, (size_t)nb, sizeof *b, by_size_desc);
    *arena = 0;
    for (int k = 0; k < nb; k++) {
        int nbusy = 0;
        for (int j = 0; j < k; j++)
            if (b[j].offset >= 0 && b[j].start <= b[k].end && b[k].start <= b[j].end)
                busy[nbusy++] = (span){(uint64_t)b[j].offset, (uint64_t)b[j].offset + b[j].size};
        qsort(busy, (size_t)nbusy, sizeof *busy, by_off);
        uint64_t at = 0;
        for (int j = 0; j < nbusy && busy[j].off < at + b[k].size; j++)
            if (busy[j].end > at) at = busy[j].end;
        if (at + b[k].size > AF_PLAN_MAX_BYTES) {
            b[k].offset = -1;
            continue;
        }
        b[k].offset = (int64_t)at;
        if (at + b[k].size > *arena) *arena = at + b[k].size;
    }
    af_free(busy);
    return AF_OK;
}

/* ---- building --------------------------------------------------------------------------------- */

af_plan *af_plan_new(int nvalues) {
    if (nvalues < 0) return NULL;
    af_plan *p = af_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->slots = af_malloc(((size_t)nvalues + 1) * sizeof *p->slots);
    if (!p->slots) {
        af_free(p);
        return NULL;
    }
    p->nvalues = nvalues;
    for (int i = 0; i < nvalues; i++) p->slots[i] = (af_plan_slot){-1, 0, -1};
    return p;
}

void af_plan_free(af_plan *p) {
    if (!p) return;
    af_free(p->slots);
    af_free(p);
}

double af_plan_ratio(const af_plan *p) {
    return p->lower_bound ? (double)p->arena_size / (double)p->lower_bound : 1.0;
}

static af_status build(const af_graph *g, const af_tensor *types, af_plan **out, af_error *err) {
    *out = NULL;
    if (!g || g->parent)
        return af_fail(err, AF_ERR_INVALID_ARG, "only a main graph has a memory plan");
    live L = {0};
    af_status st = live_compute(&L, g, types, err);
    if (st) return st;
    af_plan *p = af_plan_new(g->nvalues);
    int *bufof = af_malloc(((size_t)g->nvalues + 1) * sizeof *bufof);
    buffer *b = NULL;
    int nb = 0;
    if (!p || !bufof) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory planning memory", g->file);
        goto done;
    }
    /* Mark what is planned (offset 0 for now) and link in-place chains, in node order. */
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *nd = g->nodes[i];
        for (int o = 0; o < nd->nout; o++) {
            const af_value *v = nd->out[o];
            if (!v || v->graph != g || v->id < 0 || v->id >= g->nvalues || L.def[v->id] != i ||
                !L.bytes[v->id])
                continue;
            af_plan_slot *s = &p->slots[v->id];
            const af_value *src = inplace_source(&L, nd, v, p->slots);
            *s = (af_plan_slot){0, align_up(L.bytes[v->id]), src ? src->id : -1};
        }
    }
    for (int i = 0; i < g->nvalues; i++) bufof[i] = -1;
    st = make_buffers(&L, p->slots, bufof, &b, &nb, err);
    if (!st) st = lower_bound(g, b, nb, &p->lower_bound, err);
    if (!st) st = place(b, nb, &p->arena_size, err);
    if (st) goto done;
    /* Each value takes its buffer's offset (bufof indexes the unsorted order: map by root). */
    int *at = af_malloc(((size_t)g->nvalues + 1) * sizeof *at);
    if (!at) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory planning memory", g->file);
        goto done;
    }
    for (int k = 0; k < nb; k++) at[b[k].root] = k;
    for (int i = 0; i < g->nvalues; i++) {
        af_plan_slot *s = &p->slots[i];
        if (s->offset < 0) continue;
        int root = i;
        while (p->slots[root].inplace_of >= 0) root = p->slots[root].inplace_of;
        s->offset = b[at[root]].offset;
    }
    af_free(at);
    /* Chains whose buffer found no room are unplanned as a whole. */
    for (int i = 0; i < g->nvalues; i++) {
        af_plan_slot *s = &p->slots[i];
        if (s->offset < 0) *s = (af_plan_slot){-1, 0, -1};
        else {
            p->nplanned++;
            p->ninplace += s->inplace_of >= 0;
        }
    }
done:
    af_free(b);
    af_free(bufof);
    live_free(&L);
    if (st) af_plan_free(p);
    else *out = p;
    return st;
}

af_status af_plan_build(const af_graph *g, af_plan **out, af_error *err) {
    return build(g, NULL, out, err);
}

/* The types of g's values for these inputs: each node's shape function over its inputs' types,
 * in order. Dims inference cannot tell stay as compiled (numbers) or unknown (symbols), and a
 * node whose shape function fails keeps its compiled types: such values are left unplanned, and
 * the run reports the error. */
static void infer_types(const af_graph *g, const af_tensor *const *inputs, af_tensor *types) {
    for (int i = 0; i < g->nvalues; i++) {
        types[i] = g->values[i]->type;
        if (!g->values[i]->is_const) types[i].data = NULL, types[i].nbytes = 0;
        types[i].owns_data = 0;
    }
    for (int k = 0; k < g->ninputs; k++) {
        const af_value *v = g->inputs[k];
        if (inputs[k] && !v->is_const && v->id < g->nvalues)
            af_tensor_set_type(&types[v->id], inputs[k]->dtype, inputs[k]->rank, inputs[k]->dims);
    }
    const af_tensor *in[64];
    af_tensor out[8];
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->nin > 64 || n->nout > 8 || has_subgraph(n)) continue;
        bool ok = true;
        for (int k = 0; k < n->nin; k++) {
            const af_value *v = n->in[k];
            ok = ok && (!v || (v->graph == g && v->id < g->nvalues));
            in[k] = v && ok ? &types[v->id] : NULL;
        }
        for (int o = 0; o < n->nout; o++) memset(&out[o], 0, sizeof out[o]), out[o].rank = -1;
        af_error e;
        if (!ok || af_kernel_shape(n, in, out, &e) != AF_OK) continue;
        for (int o = 0; o < n->nout; o++) {
            const af_value *v = n->out[o];
            af_tensor *t = v && v->graph == g && v->id < g->nvalues ? &types[v->id] : NULL;
            if (!t || v->is_const || out[o].rank < 0 || out[o].rank != t->rank) continue;
            for (int d = 0; d < t->rank; d++)
                t->dims[d] = out[o].dims[d] >= 0 ? out[o].dims[d]
                             : t->dims[d] >= 0   ? t->dims[d]
                                                 : AF_DIM_UNKNOWN;
        }
    }
}

af_status af_plan_build_for(const af_graph *g, const af_tensor *const *inputs, af_plan **out,
                            af_error *err) {
    *out = NULL;
    af_tensor *types = g ? af_calloc((size_t)g->nvalues + 1, sizeof *types) : NULL;
    if (!types) return af_fail(err, AF_ERR_NOMEM, "out of memory planning memory");
    infer_types(g, inputs, types);
    af_status st = build(g, types, out, err);
    af_free(types);
    return st;
}

/* ---- checking ----------------------------------------------------------------------------------- */

/* Messages start with "memory plan: "; the caller adds the file (the .afm loader names it). */
static af_status bad(af_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static af_status bad(af_error *err, const char *fmt, ...) {
    char reason[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return af_fail(err, AF_ERR_INVALID_MODEL, "memory plan: %s", reason);
}

/* One planned value: plannable, its exact size, inside the arena, in place only as allowed. */
static af_status check_slot(const live *L, const af_plan *p, const af_value *v, af_error *err) {
    const af_plan_slot *s = &p->slots[v->id];
    uint64_t want = L->bytes[v->id];
    if (!want)
        return bad(err, "value '%s' cannot be planned (not an intermediate of fully known "
                   "type produced by a node of the main graph)", v->name);
    if (s->size != align_up(want))
        return bad(err, "value '%s' is given %llu bytes, its type needs %llu", v->name,
                   (unsigned long long)s->size, (unsigned long long)align_up(want));
    if (s->offset % AF_PLAN_ALIGN || (uint64_t)s->offset > p->arena_size ||
        s->size > p->arena_size - (uint64_t)s->offset)
        return bad(err, "value '%s' at bytes %lld..+%llu is not %d-byte aligned inside the "
                   "arena (%llu bytes)", v->name, (long long)s->offset,
                   (unsigned long long)s->size, AF_PLAN_ALIGN,
                   (unsigned long long)p->arena_size);
    if (s->inplace_of < 0) return AF_OK;
    const af_node *nd = v->producer;
    const af_value *src = nd ? inplace_source(L, nd, v, p->slots) : NULL;
    if (!src || src->id != s->inplace_of)
        return bad(err, "value '%s' is placed over value %d, which its producer may not "
                   "overwrite", v->name, s->inplace_of);
    if (p->slots[src->id].offset != s->offset || p->slots[src->id].size != s->size)
        return bad(err, "value '%s' is in place over '%s' but not at its offset", v->name,
                   src->name);
    return AF_OK;
}

static int by_start(const void *pa, const void *pb) {
    const buffer *a = pa, *b = pb;
    if (a->start != b->start) return a->start < b->start ? -1 : 1;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

/* No two buffers live at once share a byte. A sweep over time keeps the live buffers sorted
 * by offset; they are disjoint, so a new one only needs checking against its two neighbours. */
static af_status check_disjoint(const af_graph *g, buffer *b, int nb, af_error *err) {
    buffer **act = af_malloc(((size_t)nb + 1) * sizeof *act);
    int nact = 0;
    if (!act) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory checking a memory plan", g->file);
    qsort(b, (size_t)nb, sizeof *b, by_start);
    af_status st = AF_OK;
    for (int k = 0; k < nb && !st; k++) {
        int keep = 0;
        for (int j = 0; j < nact; j++)
            if (act[j]->end >= b[k].start) act[keep++] = act[j];
        nact = keep;
        int pos = 0;
        while (pos < nact && act[pos]->offset < b[k].offset) pos++;
        const buffer *lo = pos > 0 ? act[pos - 1] : NULL, *hi = pos < nact ? act[pos] : NULL;
        const buffer *hit = NULL;
        if (lo && (uint64_t)lo->offset + lo->size > (uint64_t)b[k].offset) hit = lo;
        else if (hi && (uint64_t)b[k].offset + b[k].size > (uint64_t)hi->offset) hit = hi;
        if (hit) {
            st = bad(err, "values '%s' (bytes %lld..+%llu, nodes %d..%d) and '%s' (bytes "
                     "%lld..+%llu, nodes %d..%d) are live at once and overlap",
                     g->values[hit->root]->name, (long long)hit->offset,
                     (unsigned long long)hit->size, hit->start, hit->end,
                     g->values[b[k].root]->name, (long long)b[k].offset,
                     (unsigned long long)b[k].size, b[k].start, b[k].end);
            break;
        }
        memmove(act + pos + 1, act + pos, (size_t)(nact - pos) * sizeof *act);
        act[pos] = &b[k];
        nact++;
    }
    af_free(act);
    return st;
}

af_status af_plan_check(const af_graph *g, af_plan *p, af_error *err) {
    if (!g || g->parent) return bad(err, "only a main graph has a memory plan");
    if (!p->slots || p->nvalues != g->nvalues)
        return bad(err, "made for %d values, the graph has %d", p->nvalues, g->nvalues);
    if (p->arena_size > AF_PLAN_MAX_BYTES || p->arena_size % AF_PLAN_ALIGN)
        return bad(err, "an arena of %llu bytes is not a multiple of %d up to %llu",
                   (unsigned long long)p->arena_size, AF_PLAN_ALIGN,
                   (unsigned long long)AF_PLAN_MAX_BYTES);
    live L = {0};
    af_status st = live_compute(&L, g, NULL, err);
    if (st) return st;
    int *bufof = af_malloc(((size_t)g->nvalues + 1) * sizeof *bufof);
    buffer *b = NULL;
    int nb = 0, nplanned = 0, ninplace = 0;
    if (!bufof) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory checking a memory plan", g->file);
        goto done;
    }
    for (int i = 0; i < g->nvalues && !st; i++) {
        const af_plan_slot *s = &p->slots[i];
        bufof[i] = -1;
        if (s->offset < 0) {
            if (s->offset != -1 || s->size || s->inplace_of != -1)
                st = bad(err, "value '%s' is unplanned but has a place", g->values[i]->name);
            continue;
        }
        if (s->inplace_of < -1 || s->inplace_of >= g->nvalues)
            st = bad(err, "value '%s' is in place over value %d of %d", g->values[i]->name,
                     s->inplace_of, g->nvalues);
        if (!st) st = check_slot(&L, p, g->values[i], err);
        nplanned++;
        ninplace += s->inplace_of >= 0;
    }
    if (!st) st = make_buffers(&L, p->slots, bufof, &b, &nb, err);
    if (!st) st = lower_bound(g, b, nb, &p->lower_bound, err);
    if (!st) st = check_disjoint(g, b, nb, err);
    if (!st) {
        p->nplanned = nplanned;
        p->ninplace = ninplace;
    }
done:
    af_free(b);
    af_free(bufof);
    live_free(&L);
    return st;
}
