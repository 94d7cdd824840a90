/* The compiled model file (.afm): the writer (afm.h has the layout).
 *
 * Invariant: every reference in the file is an index into a section written by the same call,
 * and every constant starts on a 64-byte boundary of the weights section. */
#include "format/afm_layout.h"
#include "ir/plugin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A growable byte buffer; running out of memory is sticky and checked once at the end. */
typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

/* n zeroed bytes at the end of b; NULL (and b->oom) when out of memory. */
static uint8_t *wb_grow(wbuf *b, size_t n) {
    if (b->oom) return NULL;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return NULL;
            }
            cap *= 2;
        }
        uint8_t *p = af_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->n;
    memset(at, 0, n);
    b->n += n;
    return at;
}

static void wb_u32(wbuf *b, uint32_t v) {
    uint8_t *p = wb_grow(b, 4);
    if (p) set32(p, v);
}

static void wb_u64(wbuf *b, uint64_t v) {
    uint8_t *p = wb_grow(b, 8);
    if (p) set64(p, v);
}

/* A constant's bytes and where they go in the weights section. */
typedef struct wpiece {
    const void *data;
    uint64_t off, nbytes;
} wpiece;

typedef struct writer {
    const char *path;
    wbuf sec[NSEC];             /* every section but the weights */
    wbuf str_offs, str_blob;    /* the strings section is assembled from these at the end */
    uint32_t nstr;
    uint32_t *str_slots;        /* hash of string contents -> id + 1 */
    size_t str_cap;
    const af_graph **graphs;    /* pre-order: parents before children */
    uint32_t *graph_parent;
    uint32_t *orig_base;        /* per graph: where its values start in `remap` */
    uint32_t *remap;            /* value (orig_base + id) -> index in the values section, NONE
                                   for a value that is not written */
    uint32_t *value_base;       /* per graph: index of its first value in the values section */
    uint32_t *nkept;            /* per graph: values written */
    int ngraphs, graphs_cap;
    int cur;                    /* the graph being written */
    wpiece *w;
    size_t nw, wcap;
    uint64_t wsize;
    bool oom;
} writer;

static af_status wfail(const writer *w, af_error *err, af_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static af_status wfail(const writer *w, af_error *err, af_status code, const char *fmt, ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return af_fail(err, code, "%s: %s", w->path, reason);
}

static bool str_equal(const writer *w, uint32_t id, const char *s, size_t len) {
    uint32_t a = get32(w->str_offs.p + 4 * (size_t)id),
             b = get32(w->str_offs.p + 4 * (size_t)id + 4);
    return b - a == len + 1 && memcmp(w->str_blob.p + a, s, len) == 0;
}

static bool str_rehash(writer *w) {
    size_t cap = w->str_cap ? 2 * w->str_cap : 1024;
    uint32_t *slots = af_calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (uint32_t id = 0; id < w->nstr; id++) {
        uint32_t a = get32(w->str_offs.p + 4 * (size_t)id);
        uint32_t b = get32(w->str_offs.p + 4 * (size_t)id + 4);
        size_t i = hash_bytes(w->str_blob.p + a, b - a - 1) & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = id + 1;
    }
    af_free(w->str_slots);
    w->str_slots = slots;
    w->str_cap = cap;
    return true;
}

/* The id of a string of len bytes (NUL-terminated in the file), adding it once. NONE for NULL. */
static uint32_t str_id_len(writer *w, const char *s, size_t len) {
    if (!s) return NONE;
    if (w->oom) return 0;
    if (w->str_blob.n + len + 1 > UINT32_MAX || w->nstr >= UINT32_MAX - 2) {
        w->oom = true; /* reported as "too large" below */
        return 0;
    }
    if (!w->nstr) wb_u32(&w->str_offs, 0);
    if (w->str_offs.oom || (2 * ((size_t)w->nstr + 1) > w->str_cap && !str_rehash(w))) {
        w->oom = true;
        return 0;
    }
    size_t i = hash_bytes(s, len) & (w->str_cap - 1);
    for (; w->str_slots[i]; i = (i + 1) & (w->str_cap - 1))
        if (str_equal(w, w->str_slots[i] - 1, s, len)) return w->str_slots[i] - 1;
    uint8_t *dst = wb_grow(&w->str_blob, len + 1);
    if (!dst) {
        w->oom = true;
        return 0;
    }
    if (len) memcpy(dst, s, len);
    wb_u32(&w->str_offs, (uint32_t)w->str_blob.n);
    if (w->str_offs.oom) { /* the string's end offset is not recorded: it must not be found */
        w->oom = true;
        return 0;
    }
    w->str_slots[i] = ++w->nstr;
    return w->nstr - 1;
}

static uint32_t str_id(writer *w, const char *s) { return str_id_len(w, s, s ? strlen(s) : 0); }

/* Place a constant's bytes in the weights section; returns its offset. */
static uint64_t add_weight(writer *w, const void *data, size_t nbytes) {
    if (w->nw == w->wcap) {
        size_t cap = w->wcap ? 2 * w->wcap : 64;
        wpiece *p = af_realloc(w->w, cap * sizeof *p);
        if (!p) {
            w->oom = true;
            return 0;
        }
        w->w = p;
        w->wcap = cap;
    }
    uint64_t off = align_up(w->wsize, WEIGHT_ALIGN);
    w->w[w->nw++] = (wpiece){data, off, nbytes};
    w->wsize = off + nbytes;
    return off;
}

/* Collect g and its subgraphs in pre-order. */
static af_status collect_graphs(writer *w, const af_graph *g, uint32_t parent, int depth,
                                af_error *err) {
    if (depth > MAX_GRAPH_DEPTH)
        return wfail(w, err, AF_ERR_UNSUPPORTED, "subgraphs nest deeper than %d", MAX_GRAPH_DEPTH);
    if (w->ngraphs == w->graphs_cap) {
        int cap = w->graphs_cap ? 2 * w->graphs_cap : 8;
        const af_graph **gs = af_realloc(w->graphs, (size_t)cap * sizeof *gs);
        if (gs) w->graphs = gs;
        uint32_t *ps = af_realloc(w->graph_parent, (size_t)cap * sizeof *ps);
        if (ps) w->graph_parent = ps;
        if (!gs || !ps) return wfail(w, err, AF_ERR_NOMEM, "out of memory");
        w->graphs_cap = cap;
    }
    uint32_t me = (uint32_t)w->ngraphs++;
    w->graphs[me] = g;
    w->graph_parent[me] = parent;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            af_status st = AF_OK;
            if (at->type == AF_ATTR_GRAPH && at->g)
                st = collect_graphs(w, at->g, me, depth + 1, err);
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n && !st; k++)
                st = collect_graphs(w, at->graphs[k], me, depth + 1, err);
            if (st) return st;
        }
    }
    return AF_OK;
}

/* Index of g among the graphs being written, -1 if it is not one of them. Values are looked up
 * from the graph being written and its ancestors first: that is where every value a node reads
 * lives. */
static int graph_index(const writer *w, const af_graph *g) {
    for (uint32_t i = (uint32_t)w->cur; i != NONE; i = w->graph_parent[i])
        if (w->graphs[i] == g) return (int)i;
    for (int i = 0; i < w->ngraphs; i++)
        if (w->graphs[i] == g) return i;
    return -1;
}

/* Index of v in the values section, or NONE for NULL; the IR's bug when v is not in a graph
 * being written. */
static af_status value_ref(const writer *w, const af_value *v, uint32_t *out, af_error *err) {
    *out = NONE;
    if (!v) return AF_OK;
    int gi = v->graph ? graph_index(w, v->graph) : -1;
    if (gi < 0 || v->id < 0 || v->id >= v->graph->nvalues || v->graph->values[v->id] != v)
        return wfail(w, err, AF_ERR_INTERNAL, "value '%s' is not listed in its graph", v->name);
    *out = w->remap[w->orig_base[gi] + (uint32_t)v->id];
    if (*out == NONE)
        return wfail(w, err, AF_ERR_INTERNAL, "value '%s' is read but its use list is empty",
                     v->name);
    return AF_OK;
}

/* Which values are written, and their indices. A value that nothing produces, reads or returns
 * is left out: a constant that a pass replaced (a conv's weights once BatchNorm is folded into
 * new ones) stays in graph->values, and would otherwise double the weights. */
static af_status number_values(writer *w, af_error *err) {
    size_t ng = (size_t)w->ngraphs;
    uint64_t total = 0;
    w->orig_base = af_calloc(ng, sizeof *w->orig_base);
    w->value_base = af_calloc(ng, sizeof *w->value_base);
    w->nkept = af_calloc(ng, sizeof *w->nkept);
    if (!w->orig_base || !w->value_base || !w->nkept)
        return wfail(w, err, AF_ERR_NOMEM, "out of memory");
    for (size_t gi = 0; gi < ng; gi++) {
        w->orig_base[gi] = (uint32_t)total;
        total += (uint64_t)w->graphs[gi]->nvalues;
        if (total >= NONE) return wfail(w, err, AF_ERR_UNSUPPORTED, "too many values");
    }
    w->remap = af_calloc((size_t)total + 1, sizeof *w->remap);
    if (!w->remap) return wfail(w, err, AF_ERR_NOMEM, "out of memory");
    for (size_t gi = 0; gi < ng; gi++) {
        const af_graph *g = w->graphs[gi];
        for (int i = 0; i < g->nvalues; i++) {
            const af_value *v = g->values[i];
            if (v->id != i || v->graph != g)
                return wfail(w, err, AF_ERR_INTERNAL, "value '%s' is misnumbered", v->name);
            w->remap[w->orig_base[gi] + (uint32_t)i] =
                v->producer || v->is_input || v->is_output || v->nuses > 0;
        }
    }
    /* A subgraph may return a value of an enclosing graph that nothing else reads. */
    for (size_t gi = 0; gi < ng; gi++) {
        const af_graph *g = w->graphs[gi];
        w->cur = (int)gi;
        for (int k = 0; k < g->noutputs; k++) {
            const af_value *v = g->outputs[k];
            int vg = v ? graph_index(w, v->graph) : -1;
            if (vg < 0 || v->id < 0 || v->id >= v->graph->nvalues)
                return wfail(w, err, AF_ERR_INTERNAL, "graph output %d is not a value of the graph",
                             k);
            w->remap[w->orig_base[vg] + (uint32_t)v->id] = 1;
        }
    }
    uint32_t next = 0;
    for (size_t gi = 0; gi < ng; gi++) {
        w->value_base[gi] = next;
        for (int i = 0; i < w->graphs[gi]->nvalues; i++) {
            uint32_t *r = &w->remap[w->orig_base[gi] + (uint32_t)i];
            *r = *r ? next++ : NONE;
        }
        w->nkept[gi] = next - w->value_base[gi];
    }
    return AF_OK;
}

static void put_tensor(writer *w, wbuf *b, const af_tensor *t, bool with_data) {
    uint8_t *r = wb_grow(b, TENSOR_REC);
    uint64_t off = 0, nbytes = 0;
    if (with_data) {
        nbytes = t->nbytes;
        off = add_weight(w, t->data, t->nbytes);
    }
    if (!r) return;
    set32(r, (uint32_t)t->dtype);
    set32(r + 4, (uint32_t)t->rank);
    for (int i = 0; i < AF_MAX_RANK; i++)
        /* A symbolic dim is stored unknown; its name goes with the value's dim_param. */
        set64(r + 8 + 8 * i, (uint64_t)(i >= t->rank ? 0 : t->dims[i] < 0 ? -1 : t->dims[i]));
    set64(r + 72, off);
    set64(r + 80, nbytes);
}

/* A tensor with data must hold exactly its type's bytes: the loader checks the same. */
static af_status check_data(const writer *w, const char *what, const af_tensor *t, af_error *err) {
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), need;
    if (n < 0 || es == 0 || !af_mul_size((size_t)n, es, &need))
        return wfail(w, err, AF_ERR_UNSUPPORTED, "%s: a constant of type %s cannot be stored",
                     what, af_dtype_name(t->dtype));
    if (!t->data && need)
        return wfail(w, err, AF_ERR_INTERNAL, "%s: constant without data", what);
    if (t->nbytes != need)
        return wfail(w, err, AF_ERR_INTERNAL, "%s: constant holds %zu bytes, its type needs %zu",
                     what, t->nbytes, need);
    return AF_OK;
}

static af_status write_values(writer *w, const af_graph *g, af_error *err) {
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        if (w->remap[w->orig_base[w->cur] + (uint32_t)i] == NONE) continue;
        if (v->is_const) {
            af_status st = check_data(w, v->name, &v->type, err);
            if (st) return st;
        }
        uint8_t *r = wb_grow(&w->sec[SEC_VALUES], V_TENSOR);
        uint32_t name = str_id(w, v->name), dp[AF_MAX_RANK];
        for (int d = 0; d < AF_MAX_RANK; d++) {
            char sym[128];
            const char *param = d < v->type.rank ? v->dim_param[d] : NULL;
            if (!param && d < v->type.rank && af_dim_is_sym(v->type.dims[d]))
                param = af_dim_str(g, v->type.dims[d], sym, sizeof sym);
            dp[d] = d < v->type.rank ? str_id(w, param) : NONE;
        }
        put_tensor(w, &w->sec[SEC_VALUES], &v->type, v->is_const);
        if (!r) continue;
        r = w->sec[SEC_VALUES].p + w->sec[SEC_VALUES].n - VALUE_REC; /* the buffer may have moved */
        set32(r + V_NAME, name);
        set32(r + V_FLAGS, (v->is_input ? VF_INPUT : 0) | (v->is_output ? VF_OUTPUT : 0) |
                               (v->is_const ? VF_CONST : 0));
        for (int d = 0; d < AF_MAX_RANK; d++) set32(r + V_DIMPARAM + 4 * d, dp[d]);
    }
    return AF_OK;
}

/* The domain a node is written with: ours for our ops, the node's own otherwise ("" is ai.onnx). */
static const char *node_domain(const af_node *n) {
    if (af_op_is_ours(n->op)) return AF_DOMAIN;
    if (!n->domain || !strcmp(n->domain, "ai.onnx")) return "";
    return n->domain;
}

static af_status write_attr(writer *w, const af_node *n, const af_attr *at, af_error *err) {
    wbuf *refs = &w->sec[SEC_REFS], *nums = &w->sec[SEC_NUMS];
    uint32_t count = 0, ref = 0, fbits = 0;
    int64_t i = 0;
    if (at->n < 0)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "attribute '%s' has a negative count",
                            at->name);
    switch (at->type) {
    case AF_ATTR_FLOAT:
        memcpy(&fbits, &at->f, 4);
        break;
    case AF_ATTR_INT:
        i = at->i;
        break;
    case AF_ATTR_STRING:
        ref = str_id_len(w, at->s ? at->s : "", at->s ? at->slen : 0);
        break;
    case AF_ATTR_TENSOR: {
        if (!at->t)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "attribute '%s' has no tensor", at->name);
        af_status st = check_data(w, at->name, at->t, err);
        if (st) return st;
        ref = (uint32_t)(w->sec[SEC_TENSORS].n / TENSOR_REC);
        put_tensor(w, &w->sec[SEC_TENSORS], at->t, true);
        break;
    }
    case AF_ATTR_GRAPH: {
        int gi = at->g ? graph_index(w, at->g) : -1;
        if (gi < 0)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "attribute '%s' has no graph", at->name);
        ref = (uint32_t)gi;
        break;
    }
    case AF_ATTR_FLOATS:
    case AF_ATTR_INTS:
        count = (uint32_t)at->n;
        ref = (uint32_t)(nums->n / 8);
        for (int k = 0; k < at->n; k++) {
            uint64_t slot = 0;
            if (at->type == AF_ATTR_FLOATS) memcpy(&slot, &at->floats[k], 4);
            else slot = (uint64_t)at->ints[k];
            wb_u64(nums, slot);
        }
        break;
    case AF_ATTR_STRINGS:
    case AF_ATTR_TENSORS:
    case AF_ATTR_GRAPHS: {
        count = (uint32_t)at->n;
        uint32_t *ids = af_calloc((size_t)at->n + 1, sizeof *ids);
        if (!ids) return wfail(w, err, AF_ERR_NOMEM, "out of memory");
        af_status st = AF_OK;
        for (int k = 0; k < at->n && !st; k++) {
            if (at->type == AF_ATTR_STRINGS) {
                ids[k] = str_id(w, at->strings[k] ? at->strings[k] : "");
            } else if (at->type == AF_ATTR_TENSORS) {
                st = check_data(w, at->name, at->tensors[k], err);
                ids[k] = (uint32_t)(w->sec[SEC_TENSORS].n / TENSOR_REC);
                if (!st) put_tensor(w, &w->sec[SEC_TENSORS], at->tensors[k], true);
            } else {
                int gi = graph_index(w, at->graphs[k]);
                if (gi < 0)
                    st = af_node_fail(err, n, AF_ERR_INTERNAL, "attribute '%s': graph %d unknown",
                                      at->name, k);
                ids[k] = (uint32_t)gi;
            }
        }
        ref = (uint32_t)(refs->n / 4);
        for (int k = 0; k < at->n && !st; k++) wb_u32(refs, ids[k]);
        af_free(ids);
        if (st) return st;
        break;
    }
    default:
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "attribute '%s' has type %d, which a compiled model cannot store",
                            at->name, (int)at->type);
    }
    uint32_t name = str_id(w, at->name);
    uint8_t *r = wb_grow(&w->sec[SEC_ATTRS], ATTR_REC);
    if (!r) return AF_OK;
    set32(r, name);
    set32(r + 4, (uint32_t)at->type);
    set32(r + 8, count);
    set32(r + 12, ref);
    set64(r + 16, (uint64_t)i);
    set32(r + 24, fbits);
    return AF_OK;
}

/* A run of value indices in the refs section; *first gets where it starts. */
static af_status write_value_list(writer *w, af_value *const *vs, int n, uint32_t *first,
                                  af_error *err) {
    *first = (uint32_t)(w->sec[SEC_REFS].n / 4);
    for (int k = 0; k < n; k++) {
        uint32_t id;
        af_status st = value_ref(w, vs[k], &id, err);
        if (st) return st;
        wb_u32(&w->sec[SEC_REFS], id);
    }
    return AF_OK;
}

static af_status write_nodes(writer *w, const af_graph *g, af_error *err) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->op >= AF_OP_COUNT) return af_node_fail(err, n, AF_ERR_INTERNAL, "unknown op");
        uint32_t in_first, out_first;
        uint32_t attr_first = (uint32_t)(w->sec[SEC_ATTRS].n / ATTR_REC);
        af_status st = write_value_list(w, n->in, n->nin, &in_first, err);
        if (!st) st = write_value_list(w, n->out, n->nout, &out_first, err);
        if (!st && n->nattrs > MAX_NODE_ATTRS)
            st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%d attributes (at most %d)", n->nattrs,
                              MAX_NODE_ATTRS);
        for (int a = 0; a < n->nattrs && !st; a++) st = write_attr(w, n, &n->attrs[a], err);
        if (st) return st;
        uint32_t name = str_id(w, n->name), op = str_id(w, af_ops[n->op].name),
                 dom = str_id(w, node_domain(n));
        uint8_t *r = wb_grow(&w->sec[SEC_NODES], NODE_REC);
        if (!r) continue;
        uint32_t f[] = {name, op, dom, (uint32_t)n->nin, in_first, (uint32_t)n->nout, out_first,
                        (uint32_t)n->nattrs, attr_first, 0};
        for (size_t k = 0; k < AF_COUNT(f); k++) set32(r + 4 * k, f[k]);
    }
    return AF_OK;
}

static af_status write_graphs(writer *w, af_error *err) {
    uint32_t nnodes = 0;
    af_status st = number_values(w, err);
    for (int gi = 0; gi < w->ngraphs && !st; gi++) {
        const af_graph *g = w->graphs[gi];
        uint32_t in_first, out_first;
        w->cur = gi;
        st = write_values(w, g, err);
        if (!st) st = write_value_list(w, g->inputs, g->ninputs, &in_first, err);
        if (!st) st = write_value_list(w, g->outputs, g->noutputs, &out_first, err);
        if (!st) st = write_nodes(w, g, err);
        if (st) return st;
        uint32_t name = str_id(w, g->name);
        uint8_t *r = wb_grow(&w->sec[SEC_GRAPHS], GRAPH_REC);
        if (!r) continue;
        uint32_t f[] = {name,
                        w->graph_parent[gi],
                        w->value_base[gi],
                        w->nkept[gi],
                        nnodes,
                        (uint32_t)g->nnodes,
                        in_first,
                        (uint32_t)g->ninputs,
                        out_first,
                        (uint32_t)g->noutputs,
                        (uint32_t)(g->node_serial > 0 ? g->node_serial : 0),
                        0};
        for (size_t k = 0; k < AF_COUNT(f); k++) set32(r + 4 * k, f[k]);
        nnodes += (uint32_t)g->nnodes;
    }
    return st;
}

/* "domain:name,..." of the plugins' ops the graphs use, as nodes or as epilogue steps, into list
 * (cap bytes): what loading the file needs registered. */
static void plugin_ops(const writer *w, char *list, size_t cap) {
    list[0] = '\0';
    for (int i = 0; i < w->ngraphs; i++)
        for (int k = 0; k < w->graphs[i]->nnodes; k++) {
            const af_node *n = w->graphs[i]->nodes[k];
            char key[512];
            if (n->op == AF_OP_CUSTOM) {
                snprintf(key, sizeof key, "%s:%s", n->domain, n->op_type);
                if (!list_add(list, cap, key)) return;
            }
            const af_attr *c = af_node_attr(n, "custom_ops");
            for (int j = 0; c && c->type == AF_ATTR_STRINGS && j < c->n; j++)
                if (c->strings[j] && !list_add(list, cap, c->strings[j])) return;
        }
}

static void write_model_meta(writer *w, const af_graph *g, const af_afm_meta *meta) {
    wbuf *m = &w->sec[SEC_MODEL], *mt = &w->sec[SEC_META];
    wb_u64(m, 8); /* the ONNX IR version the graph follows */
    wb_u32(m, (uint32_t)(g->nopsets > 0 ? g->nopsets : 0));
    wb_u32(m, 0);
    for (int i = 0; i < g->nopsets; i++) {
        wb_u32(m, str_id(w, g->opsets[i].domain ? g->opsets[i].domain : ""));
        wb_u32(m, 0);
        wb_u64(m, (uint64_t)g->opsets[i].version);
    }
    const char *version = meta && meta->version ? meta->version : AF_VERSION;
    int nkv = meta && meta->kv && meta->nkv > 0 ? meta->nkv : 0;
    char ops[4096];
    plugin_ops(w, ops, sizeof ops);
    wb_u32(mt, str_id(w, version));
    wb_u32(mt, str_id(w, meta ? meta->command_line : NULL));
    wb_u32(mt, (uint32_t)(nkv + (ops[0] != '\0')));
    wb_u32(mt, 0);
    for (int i = 0; i < nkv; i++) {
        wb_u32(mt, str_id(w, meta->kv[i].key ? meta->kv[i].key : ""));
        wb_u32(mt, str_id(w, meta->kv[i].value ? meta->kv[i].value : ""));
    }
    if (ops[0]) {
        wb_u32(mt, str_id(w, "plugin_ops"));
        wb_u32(mt, str_id(w, ops));
    }
}

/* The plan section: empty without a plan; else the arena size and one entry per planned value
 * of the main graph, in increasing value index. */
static af_status write_plan(writer *w, const af_graph *g, const af_plan *plan, af_error *err) {
    wbuf *b = &w->sec[SEC_PLAN];
    if (!plan) return AF_OK;
    uint32_t count = 0;
    for (int i = 0; i < g->nvalues; i++) count += plan->slots[i].offset >= 0;
    wb_u64(b, plan->arena_size);
    wb_u32(b, count);
    wb_u32(b, 0);
    for (int i = 0; i < g->nvalues; i++) {
        const af_plan_slot *s = &plan->slots[i];
        if (s->offset < 0) continue;
        uint32_t id = w->remap[w->orig_base[0] + (uint32_t)i], src = NONE;
        if (s->inplace_of >= 0) src = w->remap[w->orig_base[0] + (uint32_t)s->inplace_of];
        if (id == NONE || (s->inplace_of >= 0 && src == NONE))
            return wfail(w, err, AF_ERR_INTERNAL, "planned value '%s' is not written",
                         g->values[i]->name);
        wb_u32(b, id);
        wb_u32(b, src);
        wb_u64(b, (uint64_t)s->offset);
        wb_u64(b, s->size);
    }
    return AF_OK;
}

/* The strings section: count, offsets[count + 1], then the bytes. */
static void finish_strings(writer *w) {
    wbuf *s = &w->sec[SEC_STRINGS];
    if (!w->nstr) wb_u32(&w->str_offs, 0);
    wb_u32(s, w->nstr);
    wb_u32(s, 0);
    uint8_t *p = wb_grow(s, w->str_offs.n + w->str_blob.n);
    if (!p || w->str_offs.oom || w->str_blob.oom) return; /* reported by the caller */
    memcpy(p, w->str_offs.p, w->str_offs.n);
    if (w->str_blob.n) memcpy(p + w->str_offs.n, w->str_blob.p, w->str_blob.n);
}

static bool write_zeros(int fd, uint64_t n) {
    static const uint8_t zeros[WEIGHT_ALIGN];
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        if (!af_write_all(fd, zeros, k)) return false;
        n -= k;
    }
    return true;
}

/* Feed bytes [lo, hi) of the weights section as it will be in the file (pieces and the zero
 * padding between them) to s; *piece is the first piece that may reach past lo. */
static void feed_weights(const writer *w, size_t *piece, uint64_t lo, uint64_t hi, XXH3_state_t *s) {
    static const uint8_t zeros[WEIGHT_ALIGN];
    for (uint64_t at = lo; at < hi;) {
        while (*piece < w->nw && w->w[*piece].off + w->w[*piece].nbytes <= at) (*piece)++;
        const wpiece *p = *piece < w->nw ? &w->w[*piece] : NULL;
        uint64_t next = p && p->off < hi ? (p->off > at ? p->off : at) : hi;
        if (next > at) { /* padding */
            uint64_t k = next - at < sizeof zeros ? next - at : sizeof zeros;
            XXH3_64bits_update(s, zeros, (size_t)k);
            at += k;
            continue;
        }
        uint64_t end = p->off + p->nbytes < hi ? p->off + p->nbytes : hi;
        XXH3_64bits_update(s, (const uint8_t *)p->data + (at - p->off), (size_t)(end - at));
        at = end;
    }
}

/* The weights section's checksum (af_afm_section_hash of the bytes it will have in the file). */
static bool weights_hash(const writer *w, uint64_t *h) {
    XXH3_state_t *chunk = XXH3_createState(), *sum = XXH3_createState();
    bool ok = chunk && sum;
    size_t piece = 0;
    if (ok) XXH3_64bits_reset(sum);
    for (uint64_t c = 0; ok && c < af_afm_chunks(w->wsize); c++) {
        uint64_t lo = c * AF_AFM_HASH_CHUNK;
        uint64_t hi = w->wsize - lo < AF_AFM_HASH_CHUNK ? w->wsize : lo + AF_AFM_HASH_CHUNK;
        XXH3_64bits_reset(chunk);
        feed_weights(w, &piece, lo, hi, chunk);
        af_afm_add_chunk(sum, XXH3_64bits_digest(chunk));
    }
    if (ok) *h = XXH3_64bits_digest(sum);
    XXH3_freeState(chunk);
    XXH3_freeState(sum);
    return ok;
}

/* Lay the sections out after the header, build the header and write everything to fd. */
static bool write_file(const writer *w, int fd) {
    uint64_t off[NSEC], size[NSEC], at = HDR_SIZE, wh;
    uint8_t hdr[HDR_SIZE] = {0};
    if (!weights_hash(w, &wh)) {
        errno = ENOMEM;
        return false;
    }
    for (int s = 0; s < NSEC; s++) {
        at = align_up(at, s == SEC_WEIGHTS ? WEIGHT_ALIGN : 8);
        off[s] = at;
        size[s] = s == SEC_WEIGHTS ? w->wsize : w->sec[s].n;
        at += size[s];
    }
    memcpy(hdr, MAGIC, sizeof MAGIC);
    set32(hdr + 8, AF_AFM_FORMAT_VERSION);
    set32(hdr + 12, HDR_SIZE);
    set64(hdr + 16, at);
    set32(hdr + 24, NSEC);
    for (int s = 0; s < NSEC; s++) {
        uint8_t *e = hdr + HDR_FIXED + HDR_ENTRY * s;
        set32(e, (uint32_t)s + 1);
        set64(e + 8, off[s]);
        set64(e + 16, size[s]);
        set64(e + 24, s == SEC_WEIGHTS ? wh : af_afm_section_hash(w->sec[s].p, w->sec[s].n));
    }
    set64(hdr + HDR_SIZE - 8, hash_bytes(hdr, HDR_SIZE - 8));
    if (!af_write_all(fd, hdr, sizeof hdr)) return false;
    at = HDR_SIZE;
    for (int s = 0; s < SEC_WEIGHTS; s++) {
        if (!write_zeros(fd, off[s] - at) || !af_write_all(fd, w->sec[s].p, w->sec[s].n)) return false;
        at = off[s] + size[s];
    }
    if (!write_zeros(fd, off[SEC_WEIGHTS] - at)) return false;
    at = 0;
    for (size_t i = 0; i < w->nw; i++) {
        if (!write_zeros(fd, w->w[i].off - at) ||
            !af_write_all(fd, w->w[i].data, (size_t)w->w[i].nbytes))
            return false;
        at = w->w[i].off + w->w[i].nbytes;
    }
    return true;
}

static bool fill_afm(int fd, const void *w) { return write_file(w, fd); }

/* Write to a temporary file next to path, then rename it into place. */
static af_status write_out(const writer *w, af_error *err) {
    bool created;
    int e = af_write_atomic(w->path, fill_afm, w, &created);
    if (!e) return AF_OK;
    if (e == ENOMEM && !created) return wfail(w, err, AF_ERR_NOMEM, "out of memory");
    return wfail(w, err, AF_ERR_IO, created ? "cannot write: %s" : "cannot create a file in its folder: %s",
                 strerror(e));
}

static void writer_free(writer *w) {
    for (int s = 0; s < NSEC; s++) af_free(w->sec[s].p);
    af_free(w->str_offs.p);
    af_free(w->str_blob.p);
    af_free(w->str_slots);
    af_free(w->graphs);
    af_free(w->graph_parent);
    af_free(w->value_base);
    af_free(w->orig_base);
    af_free(w->remap);
    af_free(w->nkept);
    af_free(w->w);
}

af_status af_afm_save_with_plan(const char *path, const af_graph *g, const af_afm_meta *meta,
                                const af_plan *plan, af_error *err) {
    writer w = {.path = path};
    af_status st;
    if (!g || g->parent)
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: only a main graph can be saved", path);
    if (plan) {
        af_plan copy = *plan; /* the check fills statistics; the caller's plan stays as it is */
        af_error e;
        st = af_plan_check(g, &copy, &e);
        if (st)
            return af_fail(err, st == AF_ERR_NOMEM ? st : AF_ERR_INVALID_ARG, "%s: %s", path,
                           e.message);
    }
    st = collect_graphs(&w, g, NONE, 0, err);
    if (!st) st = write_graphs(&w, err);
    if (!st) st = write_plan(&w, g, plan, err);
    if (!st) {
        write_model_meta(&w, g, meta);
        finish_strings(&w);
        bool oom = w.oom || w.str_offs.oom || w.str_blob.oom;
        for (int s = 0; s < NSEC; s++) {
            oom |= w.sec[s].oom;
            if (w.sec[s].n / 4 >= NONE) oom = true; /* indices are u32 */
        }
        if (oom)
            st = wfail(&w, err, AF_ERR_NOMEM,
                       "out of memory, or the graph is too large for the format");
    }
    if (!st) st = write_out(&w, err);
    writer_free(&w);
    return st;
}

af_status af_afm_save(const char *path, const af_graph *g, const af_afm_meta *meta,
                      af_error *err) {
    af_plan *plan = NULL;
    if (!g || g->parent)
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: only a main graph can be saved", path);
    af_error e;
    af_status st = af_plan_build(g, &plan, &e);
    if (st) return af_fail(err, st, "%s: %s", path, e.message);
    st = af_afm_save_with_plan(path, g, meta, plan, err);
    af_plan_free(plan);
    return st;
}

