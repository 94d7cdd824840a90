/* The compiled model file (.afm): writer, loader and the `inspect` printout. Layout in afm.h.
 *
 * Invariants. Writer: every reference in the file is an index into a section written by the same
 * call, and every constant starts on a 64-byte boundary of the weights section. Loader: no byte
 * of the file is used before the header and section checksums match, and no index, count,
 * offset or length is used before it is checked against the section it points into; the IR it
 * builds satisfies af_graph_verify (node order is re-checked with af_graph_toposort, use lists
 * are rebuilt by af_node_set_input, subgraph captures are recomputed from what nodes read).
 */
#include "format/afm.h"
#include "ir/plugin.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "constant bytes are stored as the host holds them: little-endian");

/* "AFM1", then CR LF, ^Z and LF: a file that went through a text-mode transfer or a line-ending
 * conversion no longer matches, and `type`/`cat` of the file stops at the ^Z. */
static const uint8_t MAGIC[8] = {'A', 'F', 'M', '1', '\r', '\n', 0x1a, '\n'};

#define NONE UINT32_MAX /* an absent string, value or parent */
#define WEIGHT_ALIGN 64
#define MAX_GRAPH_DEPTH 100 /* nesting of subgraphs, as the ONNX reader allows */
#define MAX_NODE_ATTRS 1024 /* far above any op's; bounds the duplicate-name check */

/* Sections, in file order. */
enum { SEC_STRINGS, SEC_META, SEC_MODEL, SEC_GRAPHS, SEC_VALUES, SEC_NODES, SEC_ATTRS, SEC_REFS,
       SEC_NUMS, SEC_TENSORS, SEC_PLAN, SEC_WEIGHTS, NSEC };
static const char *const SEC_NAME[NSEC] = {"strings", "meta",  "model",   "graphs",
                                            "values",  "nodes", "attributes", "refs",
                                            "nums",    "tensors", "plan",    "weights"};

/* Header: magic[8] u32 version, u32 header_size, u64 file_size, u32 nsections, u32 flags, then
 * per section {u32 kind, u32 reserved, u64 offset, u64 size, u64 xxh64}, then u64 xxh64 of all
 * header bytes before it. */
enum { HDR_FIXED = 32, HDR_ENTRY = 32, HDR_SIZE = HDR_FIXED + NSEC * HDR_ENTRY + 8 };

/* Record sizes and field offsets (bytes). */
enum { TENSOR_REC = 88 };  /* i32 dtype, i32 rank, i64 dims[8], u64 data_off, u64 nbytes */
enum { VALUE_REC = 128 };  /* u32 name, u32 flags, u32 dim_param[8], tensor record */
enum { V_NAME = 0, V_FLAGS = 4, V_DIMPARAM = 8, V_TENSOR = 40 };
enum { VF_INPUT = 1, VF_OUTPUT = 2, VF_CONST = 4 };
enum { GRAPH_REC = 48 };   /* u32 name, parent, value_first, nvalues, node_first, nnodes,
                              input_first, ninputs, output_first, noutputs, node_serial, 0 */
enum { NODE_REC = 40 };    /* u32 name, op_type, domain, nin, in_first, nout, out_first, nattrs,
                              attr_first, 0 */
enum { ATTR_REC = 32 };    /* u32 name, type, count, ref; i64 i; u32 f bits; u32 0 */
enum { OPSET_REC = 16 };   /* u32 domain, u32 0, i64 version */
enum { MODEL_FIXED = 16 }; /* i64 ir_version, u32 nopsets, u32 0 */
enum { META_FIXED = 16 };  /* u32 version, u32 command_line, u32 nkv, u32 0; then {key, value} */
enum { PLAN_FIXED = 16 };  /* u64 arena_size, u32 nentries, u32 0; then the entries */
enum { PLAN_REC = 24 };    /* u32 value, u32 in place over (value or NONE), u64 offset, u64 size */

/* ---- little-endian bytes --------------------------------------------------------------------- */

static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static void set32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void set64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ================================================================================================
 * Writer
 * ============================================================================================== */

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
        uint8_t *p = realloc(b->p, cap);
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

static uint64_t hash_bytes(const void *p, size_t n) { return XXH64(p, n, 0); }

static bool str_equal(const writer *w, uint32_t id, const char *s, size_t len) {
    uint32_t a = get32(w->str_offs.p + 4 * (size_t)id),
             b = get32(w->str_offs.p + 4 * (size_t)id + 4);
    return b - a == len + 1 && memcmp(w->str_blob.p + a, s, len) == 0;
}

static bool str_rehash(writer *w) {
    size_t cap = w->str_cap ? 2 * w->str_cap : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (uint32_t id = 0; id < w->nstr; id++) {
        uint32_t a = get32(w->str_offs.p + 4 * (size_t)id);
        uint32_t b = get32(w->str_offs.p + 4 * (size_t)id + 4);
        size_t i = hash_bytes(w->str_blob.p + a, b - a - 1) & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = id + 1;
    }
    free(w->str_slots);
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
    if (2 * ((size_t)w->nstr + 1) > w->str_cap && !str_rehash(w)) {
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
    w->str_slots[i] = ++w->nstr;
    return w->nstr - 1;
}

static uint32_t str_id(writer *w, const char *s) { return str_id_len(w, s, s ? strlen(s) : 0); }

/* Place a constant's bytes in the weights section; returns its offset. */
static uint64_t add_weight(writer *w, const void *data, size_t nbytes) {
    if (w->nw == w->wcap) {
        size_t cap = w->wcap ? 2 * w->wcap : 64;
        wpiece *p = realloc(w->w, cap * sizeof *p);
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
        const af_graph **gs = realloc(w->graphs, (size_t)cap * sizeof *gs);
        if (gs) w->graphs = gs;
        uint32_t *ps = realloc(w->graph_parent, (size_t)cap * sizeof *ps);
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
    w->orig_base = calloc(ng, sizeof *w->orig_base);
    w->value_base = calloc(ng, sizeof *w->value_base);
    w->nkept = calloc(ng, sizeof *w->nkept);
    if (!w->orig_base || !w->value_base || !w->nkept)
        return wfail(w, err, AF_ERR_NOMEM, "out of memory");
    for (size_t gi = 0; gi < ng; gi++) {
        w->orig_base[gi] = (uint32_t)total;
        total += (uint64_t)w->graphs[gi]->nvalues;
        if (total >= NONE) return wfail(w, err, AF_ERR_UNSUPPORTED, "too many values");
    }
    w->remap = calloc((size_t)total + 1, sizeof *w->remap);
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
        set64(r + 8 + 8 * i, (uint64_t)(i < t->rank ? t->dims[i] : 0));
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
        for (int d = 0; d < AF_MAX_RANK; d++)
            dp[d] = d < v->type.rank ? str_id(w, v->dim_param[d]) : NONE;
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
        uint32_t *ids = calloc((size_t)at->n + 1, sizeof *ids);
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
        free(ids);
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

/* Append key to the comma-separated list (once); false when it does not fit. */
static bool list_add(char *list, size_t cap, const char *key) {
    size_t n = strlen(list), k = strlen(key);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == k && !strncmp(p, key, k)) return true;
        p += l + (p[l] == ',');
    }
    if (n + (n > 0) + k + 1 > cap) return false;
    if (n) list[n++] = ',';
    memcpy(list + n, key, k + 1);
    return true;
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

/* Every op of meta's "plugin_ops" is registered; else an error naming those that are not. */
static af_status check_plugin_ops(const char *file, const af_afm_meta *meta, af_error *err) {
    const char *ops = NULL;
    for (int i = 0; i < meta->nkv; i++)
        if (!strcmp(meta->kv[i].key, "plugin_ops")) ops = meta->kv[i].value;
    char missing[1024] = "";
    for (const char *p = ops; p && *p;) {
        size_t l = strcspn(p, ",");
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)(l < sizeof key ? l : sizeof key - 1), p);
        if (!af_plugin_op_key(key)) list_add(missing, sizeof missing, key);
        p += l + (p[l] == ',');
    }
    if (!missing[0]) return AF_OK;
    char shown[2 * sizeof missing];
    size_t k = 0;
    for (const char *p = missing; *p; p++) { /* "a,b" as "a, b" */
        shown[k++] = *p;
        if (*p == ',') shown[k++] = ' ';
    }
    shown[k] = '\0';
    return af_fail(err, AF_ERR_UNSUPPORTED,
                   "%s: the model needs custom ops that no loaded plugin defines: %s (give their "
                   "plugin with --plugin or AUTOFUSION_PLUGINS)", file, shown);
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
    if (!p) return;
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

/* ---- section checksums ------------------------------------------------------------------------ */

static uint64_t chunks_of(uint64_t n) {
    return n ? (n + AF_AFM_HASH_CHUNK - 1) / AF_AFM_HASH_CHUNK : 0;
}

/* XXH3 of chunk c of the n bytes at p. */
static uint64_t chunk_hash(const uint8_t *p, uint64_t n, uint64_t c) {
    uint64_t lo = c * AF_AFM_HASH_CHUNK;
    return XXH3_64bits(p + lo, (size_t)(n - lo < AF_AFM_HASH_CHUNK ? n - lo : AF_AFM_HASH_CHUNK));
}

/* Append one chunk hash (little-endian) to the running checksum s. */
static void add_chunk(XXH3_state_t *s, uint64_t h) {
    uint8_t e[8];
    set64(e, h);
    XXH3_64bits_update(s, e, 8);
}

typedef struct hash_job {
    const uint8_t *p;
    uint64_t n, nchunks;
    uint8_t *list;
    int threads, id;
} hash_job;

static void *hash_chunks(void *arg) {
    const hash_job *j = arg;
    for (uint64_t c = (uint64_t)j->id; c < j->nchunks; c += (uint64_t)j->threads)
        set64(j->list + 8 * c, chunk_hash(j->p, j->n, c));
    return NULL;
}

uint64_t af_afm_section_hash(const void *p, uint64_t n) {
    uint64_t nchunks = chunks_of(n);
    /* Large sections on up to 4 threads (hashing runs at the memory bandwidth one core gets),
     * their chunk hashes into a list; otherwise, or without memory for the list, one thread
     * adding each chunk's hash to the checksum as it goes (the same value). */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = nchunks >= 8 ? (int)(cpus < 1 ? 1 : cpus > 4 ? 4 : cpus) : 1;
    uint8_t *list = threads > 1 ? malloc((size_t)(8 * nchunks)) : NULL;
    if (list) {
        hash_job jobs[4];
        pthread_t tid[4];
        int started = 1;
        for (int t = 0; t < threads; t++) jobs[t] = (hash_job){p, n, nchunks, list, threads, t};
        for (int t = 1; t < threads; t++, started++)
            if (pthread_create(&tid[t], NULL, hash_chunks, &jobs[t])) break;
        for (int t = started; t < threads; t++) hash_chunks(&jobs[t]); /* threads that did not start */
        hash_chunks(&jobs[0]);
        for (int t = 1; t < started; t++) pthread_join(tid[t], NULL);
        uint64_t h = XXH3_64bits(list, (size_t)(8 * nchunks));
        free(list);
        return h;
    }
    XXH3_state_t *s = XXH3_createState();
    if (!s) return 0; /* the load then reports a checksum mismatch */
    XXH3_64bits_reset(s);
    for (uint64_t c = 0; c < nchunks; c++) add_chunk(s, chunk_hash(p, n, c));
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
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
    for (uint64_t c = 0; ok && c < chunks_of(w->wsize); c++) {
        uint64_t lo = c * AF_AFM_HASH_CHUNK;
        uint64_t hi = w->wsize - lo < AF_AFM_HASH_CHUNK ? w->wsize : lo + AF_AFM_HASH_CHUNK;
        XXH3_64bits_reset(chunk);
        feed_weights(w, &piece, lo, hi, chunk);
        add_chunk(sum, XXH3_64bits_digest(chunk));
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
    for (int s = 0; s < NSEC; s++) free(w->sec[s].p);
    free(w->str_offs.p);
    free(w->str_blob.p);
    free(w->str_slots);
    free(w->graphs);
    free(w->graph_parent);
    free(w->value_base);
    free(w->orig_base);
    free(w->remap);
    free(w->nkept);
    free(w->w);
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

/* ================================================================================================
 * Loader
 * ============================================================================================== */

typedef struct section {
    const uint8_t *p;
    uint64_t size;
} section;

/* A mapped, checksum-verified file and what the loader has decoded so far. */
typedef struct loader {
    const char *file;
    const uint8_t *base;
    size_t len;
    uint32_t version;
    section sec[NSEC];
    uint64_t sec_off[NSEC];
    /* strings */
    uint32_t nstr;
    const uint8_t *str_offs, *str_blob;
    /* record counts */
    uint32_t ngraphs, nvalues, nnodes, nattrs, nrefs, nnums, ntensors;
    /* the IR being built */
    af_arena *a;
    af_graph **graphs;
    uint32_t *parent;  /* per graph: index of the enclosing graph, NONE for the main graph */
    bool *claimed;     /* per graph: an attribute holds it */
    af_value **values; /* by index in the values section */
    uint32_t *vgraph;  /* per value: index of its graph */
    uint32_t *last;    /* per value: the last graph that read it from inside a subgraph */
} loader;

static af_status lfail(const loader *L, af_error *err, af_status code, int sec, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));
static af_status lfail(const loader *L, af_error *err, af_status code, int sec, const char *fmt,
                       ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (sec < 0) return af_fail(err, code, "%s: %s", L->file, reason);
    return af_fail(err, code, "%s: %s: %s", L->file, SEC_NAME[sec], reason);
}

#define BAD(sec, ...) lfail(L, err, AF_ERR_INVALID_MODEL, sec, __VA_ARGS__)

/* Map the file and check the header and every section's checksum. */
static af_status map_file(loader *L, const char *path, af_error *err) {
    struct stat sb;
    L->file = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lfail(L, err, AF_ERR_IO, -1, "cannot open: %s", strerror(errno));
    af_status st = AF_OK;
    if (fstat(fd, &sb) != 0) st = lfail(L, err, AF_ERR_IO, -1, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = lfail(L, err, AF_ERR_IO, -1, "not a regular file");
    else if (sb.st_size < (off_t)HDR_SIZE)
        st = BAD(-1, "not a compiled model: %lld bytes is shorter than the header (%d bytes)",
                 (long long)sb.st_size, HDR_SIZE);
    if (!st) {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (map == MAP_FAILED) st = lfail(L, err, AF_ERR_IO, -1, "cannot map: %s", strerror(errno));
        else {
            L->base = map;
            L->len = (size_t)sb.st_size;
        }
    }
    close(fd);
    return st;
}

static af_status check_header(loader *L, af_error *err) {
    const uint8_t *h = L->base;
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return BAD(-1, "not a compiled model (bad magic; expected \"AFM1\" and a binary marker)");
    L->version = get32(h + 8);
    if (L->version != AF_AFM_FORMAT_VERSION)
        return lfail(L, err, AF_ERR_UNSUPPORTED, -1,
                     "format version %u is not supported (this build reads version %d)",
                     L->version, AF_AFM_FORMAT_VERSION);
    if (get32(h + 12) != HDR_SIZE || get32(h + 24) != NSEC)
        return BAD(-1, "header: size %u with %u sections, expected %d with %d", get32(h + 12),
                   get32(h + 24), HDR_SIZE, NSEC);
    uint64_t want = get64(h + 16);
    if (want != L->len)
        return BAD(-1, "%s: the header says %llu bytes, the file has %zu",
                   want > L->len ? "truncated" : "trailing bytes", (unsigned long long)want,
                   L->len);
    if (hash_bytes(h, HDR_SIZE - 8) != get64(h + HDR_SIZE - 8))
        return BAD(-1, "header: checksum mismatch (the file is damaged or was altered)");
    if (get32(h + 28) != 0) return BAD(-1, "header: unknown flags 0x%x", get32(h + 28));
    uint64_t end = HDR_SIZE;
    for (int s = 0; s < NSEC; s++) {
        const uint8_t *e = h + HDR_FIXED + HDR_ENTRY * s;
        uint64_t off = get64(e + 8), size = get64(e + 16);
        uint64_t align = s == SEC_WEIGHTS ? WEIGHT_ALIGN : 8;
        if (get32(e) != (uint32_t)s + 1)
            return BAD(-1, "header: section %d has kind %u, expected %d", s, get32(e), s + 1);
        if (off < end || off % align || off > L->len || size > L->len - off)
            return BAD(s, "offset %llu and size %llu do not fit the file (%zu bytes) in order",
                       (unsigned long long)off, (unsigned long long)size, L->len);
        for (uint64_t i = end; i < off; i++) /* padding is zero: no byte goes unchecked */
            if (L->base[i])
                return BAD(s, "nonzero padding byte at offset %llu", (unsigned long long)i);
        L->sec[s] = (section){L->base + off, size};
        L->sec_off[s] = off;
        end = off + size;
    }
    if (end != L->len) return BAD(-1, "%zu bytes follow the last section", L->len - (size_t)end);
    for (int s = 0; s < NSEC; s++)
        if (af_afm_section_hash(L->sec[s].p, L->sec[s].size) !=
            get64(h + HDR_FIXED + HDR_ENTRY * s + 24))
            return BAD(s, "checksum mismatch (the file is damaged or was altered)");
    return AF_OK;
}

/* Record count of a section of fixed-size records after a header of `fixed` bytes. */
static af_status count_records(const loader *L, int s, uint64_t fixed, uint64_t rec,
                               uint32_t *n, af_error *err) {
    uint64_t size = L->sec[s].size;
    if (size < fixed || (size - fixed) % rec)
        return BAD(s, "%llu bytes is not a whole number of %llu-byte records",
                   (unsigned long long)size, (unsigned long long)rec);
    if ((size - fixed) / rec >= INT32_MAX) return BAD(s, "too many records");
    *n = (uint32_t)((size - fixed) / rec);
    return AF_OK;
}

static af_status check_strings(loader *L, af_error *err) {
    const section *s = &L->sec[SEC_STRINGS];
    if (s->size < 8)
        return BAD(SEC_STRINGS, "%llu bytes is too short", (unsigned long long)s->size);
    L->nstr = get32(s->p);
    uint64_t table = 8 + 4 * ((uint64_t)L->nstr + 1);
    if (table > s->size)
        return BAD(SEC_STRINGS, "%u strings do not fit in %llu bytes", L->nstr,
                   (unsigned long long)s->size);
    L->str_offs = s->p + 8;
    L->str_blob = s->p + table;
    uint64_t blob = s->size - table;
    uint32_t prev = get32(L->str_offs);
    if (prev != 0) return BAD(SEC_STRINGS, "the first string starts at %u, not 0", prev);
    for (uint32_t i = 0; i < L->nstr; i++) {
        uint32_t next = get32(L->str_offs + 4 * ((size_t)i + 1));
        if (next <= prev || next > blob)
            return BAD(SEC_STRINGS, "string %u spans bytes %u..%u of %llu", i, prev, next,
                       (unsigned long long)blob);
        if (L->str_blob[next - 1] != 0)
            return BAD(SEC_STRINGS, "string %u is not NUL-terminated", i);
        prev = next;
    }
    if (prev != blob)
        return BAD(SEC_STRINGS, "%llu bytes follow the last string",
                   (unsigned long long)(blob - prev));
    return AF_OK;
}

/* String `id` (NULL for NONE when `nullable`) pointing into the mapping; *len excludes the NUL. */
static af_status get_str(const loader *L, int sec, uint32_t id, bool nullable, const char *what,
                         const char **out, size_t *len, af_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (id == NONE && nullable) return AF_OK;
    if (id >= L->nstr)
        return BAD(sec, "%s refers to string %u (the file has %u)", what, id, L->nstr);
    uint32_t a = get32(L->str_offs + 4 * (size_t)id), b = get32(L->str_offs + 4 * (size_t)id + 4);
    *out = (const char *)L->str_blob + a;
    if (len) *len = b - a - 1;
    return AF_OK;
}

/* A range [first, first + n) of a list of `total` items. */
static bool in_range(uint32_t first, uint32_t n, uint32_t total) {
    return first <= total && n <= total - first;
}

static af_status read_meta(loader *L, af_afm_meta *meta, af_error *err) {
    const section *s = &L->sec[SEC_META];
    uint32_t n = 0;
    af_status st = count_records(L, SEC_META, META_FIXED, 8, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n)
        return BAD(SEC_META, "%u key/value pairs announced, %u stored", get32(s->p + 8), n);
    memset(meta, 0, sizeof *meta);
    st = get_str(L, SEC_META, get32(s->p), false, "the version", &meta->version, NULL, err);
    if (!st)
        st = get_str(L, SEC_META, get32(s->p + 4), true, "the command line", &meta->command_line,
                     NULL, err);
    if (st) return st;
    if (!meta->command_line) meta->command_line = "";
    af_afm_kv *kv = af_arena_calloc(L->a, (size_t)n + 1, sizeof *kv);
    if (!kv) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", L->file);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + META_FIXED + 8 * (size_t)i;
        st = get_str(L, SEC_META, get32(r), false, "a key", &kv[i].key, NULL, err);
        if (!st) st = get_str(L, SEC_META, get32(r + 4), false, "a value", &kv[i].value, NULL, err);
    }
    meta->kv = kv;
    meta->nkv = (int)n;
    return st;
}

/* Structural checks and record counts of every section. */
static af_status open_sections(loader *L, af_error *err) {
    af_status st = check_strings(L, err);
    if (!st) st = count_records(L, SEC_GRAPHS, 0, GRAPH_REC, &L->ngraphs, err);
    if (!st) st = count_records(L, SEC_VALUES, 0, VALUE_REC, &L->nvalues, err);
    if (!st) st = count_records(L, SEC_NODES, 0, NODE_REC, &L->nnodes, err);
    if (!st) st = count_records(L, SEC_ATTRS, 0, ATTR_REC, &L->nattrs, err);
    if (!st) st = count_records(L, SEC_REFS, 0, 4, &L->nrefs, err);
    if (!st) st = count_records(L, SEC_NUMS, 0, 8, &L->nnums, err);
    if (!st) st = count_records(L, SEC_TENSORS, 0, TENSOR_REC, &L->ntensors, err);
    if (!st && L->ngraphs == 0) st = BAD(SEC_GRAPHS, "the file holds no graph");
    return st;
}

/* Decode a tensor record into t. With data, the type must be complete and its bytes must lie
 * (64-byte aligned) inside the weights section; t->data then points into the mapping. */
static af_status read_tensor(const loader *L, int sec, const uint8_t *r, bool with_data,
                             const char *what, af_tensor *t, af_error *err) {
    memset(t, 0, sizeof *t);
    uint32_t dtype = get32(r);
    int32_t rank = (int32_t)get32(r + 4);
    if (dtype > AF_DTYPE_BFLOAT16) return BAD(sec, "%s: data type %u is invalid", what, dtype);
    if (rank < -1 || rank > AF_MAX_RANK) return BAD(sec, "%s: rank %d is invalid", what, rank);
    t->dtype = (af_dtype)dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = (int64_t)get64(r + 8 + 8 * i);
        if (t->dims[i] < -1) return BAD(sec, "%s: dim %d is %lld", what, i, (long long)t->dims[i]);
    }
    if (!with_data) return AF_OK;
    uint64_t off = get64(r + 72), nbytes = get64(r + 80);
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), need;
    if (n < 0 || es == 0 || !af_mul_size((size_t)n, es, &need))
        return BAD(sec, "%s: a constant needs a known shape and a numeric type", what);
    if (nbytes != need)
        return BAD(sec, "%s: holds %llu bytes, its type needs %zu", what,
                   (unsigned long long)nbytes, need);
    const section *w = &L->sec[SEC_WEIGHTS];
    if (off % WEIGHT_ALIGN || off > w->size || nbytes > w->size - off)
        return BAD(
            sec, "%s: bytes %llu..+%llu are not 64-byte aligned inside the weights (%llu bytes)",
            what, (unsigned long long)off, (unsigned long long)nbytes, (unsigned long long)w->size);
    t->nbytes = (size_t)nbytes;
    /* Read-only mapping (see onnx.h). An empty constant still gets a valid pointer. */
    t->data = (void *)(w->p + off);
    return AF_OK;
}

static af_status nomem(const loader *L, af_error *err) {
    return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", L->file);
}

/* ir_version and the opset imports of the main graph. */
static af_status read_model(loader *L, af_model *m, af_opset **opsets, int *nopsets,
                            af_error *err) {
    const section *s = &L->sec[SEC_MODEL];
    uint32_t n = 0;
    af_status st = count_records(L, SEC_MODEL, MODEL_FIXED, OPSET_REC, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n)
        return BAD(SEC_MODEL, "%u opsets announced, %u stored", get32(s->p + 8), n);
    m->ir_version = (int64_t)get64(s->p);
    *opsets = af_arena_calloc(L->a, (size_t)n + 1, sizeof **opsets);
    if (!*opsets) return nomem(L, err);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + MODEL_FIXED + OPSET_REC * (size_t)i;
        st = get_str(L, SEC_MODEL, get32(r), false, "an opset domain", &(*opsets)[i].domain, NULL,
                     err);
        (*opsets)[i].version = (int64_t)get64(r + 8);
    }
    *nopsets = (int)n;
    return st;
}

/* Create every graph with its values. Graphs come in pre-order (each graph is followed by its
 * subgraphs, each of those by its own, before the graph's next sibling), which lets
 * build_nodes record captures in one pass. */
static af_status build_graphs(loader *L, af_model *m, af_opset *opsets, int nopsets,
                              af_error *err) {
    const section *gs = &L->sec[SEC_GRAPHS], *vs = &L->sec[SEC_VALUES];
    uint32_t next_value = 0, *chain, depth = 0;
    L->graphs = calloc(L->ngraphs, sizeof *L->graphs);
    L->parent = calloc(L->ngraphs, sizeof *L->parent);
    L->claimed = calloc(L->ngraphs, sizeof *L->claimed);
    L->values = calloc((size_t)L->nvalues + 1, sizeof *L->values);
    L->vgraph = calloc((size_t)L->nvalues + 1, sizeof *L->vgraph);
    L->last = malloc(((size_t)L->nvalues + 1) * sizeof *L->last);
    chain = calloc(MAX_GRAPH_DEPTH + 1, sizeof *chain); /* the current graph's ancestors */
    if (!L->graphs || !L->parent || !L->claimed || !L->values || !L->vgraph || !L->last || !chain) {
        free(chain);
        return nomem(L, err);
    }
    memset(L->last, 0xff, ((size_t)L->nvalues + 1) * sizeof *L->last);
    af_status st = AF_OK;
    for (uint32_t gi = 0; gi < L->ngraphs && !st; gi++) {
        const uint8_t *r = gs->p + GRAPH_REC * (size_t)gi;
        uint32_t parent = get32(r + 4), vfirst = get32(r + 8), nv = get32(r + 12);
        if ((gi == 0) != (parent == NONE)) {
            st = BAD(SEC_GRAPHS, "graph %u: parent %u is invalid", gi, parent);
            break;
        }
        while (gi && depth > 0 && chain[depth - 1] != parent) depth--;
        if (gi && depth == 0) {
            st = BAD(SEC_GRAPHS, "graph %u: parent %u is not an open graph (graphs are stored "
                     "parents first, in pre-order)", gi, parent);
            break;
        }
        if (depth > MAX_GRAPH_DEPTH) {
            st = BAD(SEC_GRAPHS, "graph %u: subgraphs nest deeper than %d", gi, MAX_GRAPH_DEPTH);
            break;
        }
        chain[depth++] = gi;
        L->parent[gi] = parent;
        if (vfirst != next_value || !in_range(vfirst, nv, L->nvalues)) {
            st = BAD(SEC_GRAPHS, "graph %u: values %u..+%u do not follow the previous graph's "
                     "(%u of %u)", gi, vfirst, nv, next_value, L->nvalues);
            break;
        }
        next_value += nv;
        af_graph *g = af_graph_new(L->a, L->file, gi ? L->graphs[parent] : NULL);
        if (!g) {
            st = nomem(L, err);
            break;
        }
        if (!gi) {
            g->opsets = opsets; /* subgraphs share them (af_graph_new) */
            g->nopsets = nopsets;
            m->graph = g;
        }
        L->graphs[gi] = g;
        st = get_str(L, SEC_GRAPHS, get32(r), true, "a graph name", &g->name, NULL, err);
        uint32_t serial = get32(r + 40);
        g->node_serial = serial > INT32_MAX / 2 ? INT32_MAX / 2 : (int)serial;
        for (uint32_t k = 0; k < nv && !st; k++) {
            uint32_t vi = vfirst + k;
            const uint8_t *vr = vs->p + VALUE_REC * (size_t)vi;
            char what[48];
            const char *name;
            snprintf(what, sizeof what, "value %u", vi);
            st = get_str(L, SEC_VALUES, get32(vr + V_NAME), false, what, &name, NULL, err);
            if (st) break;
            af_value *v = af_value_new(g, name);
            if (!v) {
                st = nomem(L, err);
                break;
            }
            uint32_t flags = get32(vr + V_FLAGS);
            if (flags & ~(uint32_t)(VF_INPUT | VF_OUTPUT | VF_CONST)) {
                st = BAD(SEC_VALUES, "%s ('%s'): unknown flags 0x%x", what, name, flags);
                break;
            }
            /* is_input and is_output follow the graph's lists (build_nodes). */
            v->is_const = flags & VF_CONST;
            st = read_tensor(L, SEC_VALUES, vr + V_TENSOR, v->is_const, what, &v->type, err);
            for (int d = 0; d < v->type.rank && !st; d++)
                st = get_str(L, SEC_VALUES, get32(vr + V_DIMPARAM + 4 * d), true, what,
                             &v->dim_param[d], NULL, err);
            L->values[vi] = v;
            L->vgraph[vi] = gi;
        }
    }
    free(chain);
    if (!st && next_value != L->nvalues)
        st = BAD(SEC_GRAPHS, "%u values belong to no graph", L->nvalues - next_value);
    return st;
}

/* Value `id` read or written in graph gi: NULL for NONE, else a value of gi or of a graph that
 * encloses it. */
static af_status ref_value(const loader *L, int sec, uint32_t id, uint32_t gi, const char *what,
                           af_value **out, af_error *err) {
    *out = NULL;
    if (id == NONE) return AF_OK;
    if (id >= L->nvalues)
        return BAD(sec, "%s refers to value %u (the file has %u)", what, id, L->nvalues);
    uint32_t up = gi;
    while (up != NONE && up != L->vgraph[id]) up = L->parent[up];
    if (up == NONE)
        return BAD(sec, "%s refers to value '%s' of a graph that does not enclose it", what,
                   L->values[id]->name);
    *out = L->values[id];
    return AF_OK;
}

/* Graph gi reads value id of an enclosing graph: every graph from gi up to (not including) the
 * value's own captures it, as af_graph_find would record. Graphs are built in pre-order, so a
 * graph `up` on that path already lists the value exactly when an earlier read came from a graph
 * numbered up or higher (its subtree): L->last makes each addition O(1). */
static af_status note_read(loader *L, uint32_t gi, uint32_t id, af_error *err) {
    if (id == NONE || L->vgraph[id] == gi) return AF_OK;
    for (uint32_t up = gi; up != L->vgraph[id]; up = L->parent[up]) {
        if (L->last[id] != NONE && L->last[id] >= up) break;
        af_graph *t = L->graphs[up];
        if (!af_arena_grow(L->a, (void **)&t->captures, &t->captures_cap, t->ncaptures + 1,
                           sizeof(af_value *)))
            return nomem(L, err);
        t->captures[t->ncaptures++] = L->values[id];
    }
    L->last[id] = gi;
    return AF_OK;
}

/* An attribute tensor record. */
static af_status attr_tensor(const loader *L, uint32_t id, const char *what, af_tensor **out,
                             af_error *err) {
    if (id >= L->ntensors)
        return BAD(SEC_ATTRS, "%s refers to tensor %u (the file has %u)", what, id, L->ntensors);
    if (!(*out = af_arena_alloc(L->a, sizeof **out))) return nomem(L, err);
    return read_tensor(L, SEC_TENSORS, L->sec[SEC_TENSORS].p + TENSOR_REC * (size_t)id, true, what,
                       *out, err);
}

/* Subgraph `id` for an attribute of a node of graph gi: it must be gi's child, held once. */
static af_status attr_graph(loader *L, uint32_t gi, uint32_t id, const char *what, af_graph **out,
                            af_error *err) {
    if (id == 0 || id >= L->ngraphs || L->parent[id] != gi || L->claimed[id])
        return BAD(SEC_ATTRS, "%s: graph %u is not a free subgraph of graph %u", what, id, gi);
    L->claimed[id] = true;
    *out = L->graphs[id];
    return AF_OK;
}

static af_status read_numbers(const loader *L, af_attr *at, uint32_t first, uint32_t count,
                              const char *what, af_error *err) {
    if (!in_range(first, count, L->nnums))
        return BAD(SEC_ATTRS, "%s: numbers %u..+%u outside the %u stored", what, first, count,
                   L->nnums);
    const uint8_t *p = L->sec[SEC_NUMS].p + 8 * (size_t)first;
    at->n = (int)count;
    if (at->type == AF_ATTR_INTS) {
        if (!(at->ints = af_arena_calloc(L->a, (size_t)count + 1, sizeof(int64_t))))
            return nomem(L, err);
        for (uint32_t k = 0; k < count; k++) at->ints[k] = (int64_t)get64(p + 8 * (size_t)k);
    } else {
        if (!(at->floats = af_arena_calloc(L->a, (size_t)count + 1, sizeof(float))))
            return nomem(L, err);
        for (uint32_t k = 0; k < count; k++) {
            uint32_t bits = get32(p + 8 * (size_t)k);
            memcpy(&at->floats[k], &bits, 4);
        }
    }
    return AF_OK;
}

/* STRINGS, TENSORS and GRAPHS: `count` ids in the refs section from `first`. */
static af_status read_list(loader *L, uint32_t gi, af_attr *at, uint32_t first, uint32_t count,
                           const char *what, af_error *err) {
    if (!in_range(first, count, L->nrefs))
        return BAD(SEC_ATTRS, "%s: list %u..+%u outside the %u refs", what, first, count, L->nrefs);
    const uint8_t *ids = L->sec[SEC_REFS].p + 4 * (size_t)first;
    void **items = af_arena_calloc(L->a, (size_t)count + 1, sizeof(void *));
    if (!items) return nomem(L, err);
    at->n = (int)count;
    af_status st = AF_OK;
    for (uint32_t k = 0; k < count && !st; k++) {
        uint32_t id = get32(ids + 4 * (size_t)k);
        if (at->type == AF_ATTR_STRINGS)
            st = get_str(L, SEC_ATTRS, id, false, what, (const char **)&items[k], NULL, err);
        else if (at->type == AF_ATTR_TENSORS)
            st = attr_tensor(L, id, what, (af_tensor **)&items[k], err);
        else
            st = attr_graph(L, gi, id, what, (af_graph **)&items[k], err);
    }
    if (at->type == AF_ATTR_STRINGS) at->strings = (const char **)items;
    else if (at->type == AF_ATTR_TENSORS) at->tensors = (af_tensor **)items;
    else at->graphs = (af_graph **)items;
    return st;
}

/* Attribute record ai of node n (in graph gi). */
static af_status read_attr(loader *L, uint32_t gi, const af_node *n, uint32_t ai, af_attr *at,
                           af_error *err) {
    const uint8_t *r = L->sec[SEC_ATTRS].p + ATTR_REC * (size_t)ai;
    char what[96];
    snprintf(what, sizeof what, "attribute %u of node '%.40s'", ai, n->name);
    af_status st = get_str(L, SEC_ATTRS, get32(r), false, what, &at->name, NULL, err);
    if (st) return st;
    uint32_t type = get32(r + 4), count = get32(r + 8), ref = get32(r + 12);
    at->type = (af_attr_type)type;
    switch (type) {
    case AF_ATTR_FLOAT: {
        uint32_t bits = get32(r + 24);
        memcpy(&at->f, &bits, 4);
        return AF_OK;
    }
    case AF_ATTR_INT:
        at->i = (int64_t)get64(r + 16);
        return AF_OK;
    case AF_ATTR_STRING:
        return get_str(L, SEC_ATTRS, ref, false, what, &at->s, &at->slen, err);
    case AF_ATTR_TENSOR:
        return attr_tensor(L, ref, what, &at->t, err);
    case AF_ATTR_GRAPH:
        return attr_graph(L, gi, ref, what, &at->g, err);
    case AF_ATTR_FLOATS:
    case AF_ATTR_INTS:
        return read_numbers(L, at, ref, count, what, err);
    case AF_ATTR_STRINGS:
    case AF_ATTR_TENSORS:
    case AF_ATTR_GRAPHS:
        return read_list(L, gi, at, ref, count, what, err);
    default:
        return BAD(SEC_ATTRS, "%s ('%s') has unknown type %u", what, at->name, type);
    }
}

/* A run of `n` refs starting at `first`, checked to lie inside the refs section. */
static af_status ref_list(const loader *L, int sec, uint32_t first, uint32_t n, const char *what,
                          const uint8_t **out, af_error *err) {
    if (!in_range(first, n, L->nrefs))
        return BAD(sec, "%s: refs %u..+%u outside the %u stored", what, first, n, L->nrefs);
    *out = L->sec[SEC_REFS].p + 4 * (size_t)first;
    return AF_OK;
}

static af_status build_node(loader *L, uint32_t gi, uint32_t ni, uint32_t *next_attr,
                            af_error *err) {
    af_graph *g = L->graphs[gi];
    const uint8_t *r = L->sec[SEC_NODES].p + NODE_REC * (size_t)ni, *ins = NULL, *outs = NULL;
    char what[64];
    snprintf(what, sizeof what, "node %u", ni);
    const char *name, *op_type, *domain;
    af_status st = get_str(L, SEC_NODES, get32(r), false, what, &name, NULL, err);
    if (!st) st = get_str(L, SEC_NODES, get32(r + 4), false, what, &op_type, NULL, err);
    if (!st) st = get_str(L, SEC_NODES, get32(r + 8), false, what, &domain, NULL, err);
    if (st) return st;
    uint32_t nin = get32(r + 12), nout = get32(r + 20), nattrs = get32(r + 28);
    uint32_t attr_first = get32(r + 32);
    snprintf(what, sizeof what, "node %u ('%.40s')", ni, name);
    st = ref_list(L, SEC_NODES, get32(r + 16), nin, what, &ins, err);
    if (!st) st = ref_list(L, SEC_NODES, get32(r + 24), nout, what, &outs, err);
    if (st) return st;
    if (attr_first != *next_attr || !in_range(attr_first, nattrs, L->nattrs))
        return BAD(SEC_NODES, "%s: attributes %u..+%u do not follow the previous node's (%u of %u)",
                   what, attr_first, nattrs, *next_attr, L->nattrs);
    *next_attr += nattrs;
    if (nattrs > MAX_NODE_ATTRS)
        return BAD(SEC_NODES, "%s has %u attributes (at most %d)", what, nattrs, MAX_NODE_ATTRS);
    af_op op = af_op_lookup(domain, op_type);
    if (op == AF_OP_COUNT)
        return lfail(L, err, AF_ERR_UNSUPPORTED, SEC_NODES,
                     "%s: op '%s' of domain '%s' is not supported by this build", what, op_type,
                     *domain ? domain : "ai.onnx");
    af_node *n = af_node_new(g, op, name, (int)nin, (int)nout);
    if (!n || !(n->attrs = af_arena_calloc(L->a, (size_t)nattrs + 1, sizeof(af_attr))))
        return nomem(L, err);
    n->op_type = op_type;
    n->domain = domain;
    for (uint32_t k = 0; k < nout; k++) {
        af_value *v;
        st = ref_value(L, SEC_NODES, get32(outs + 4 * (size_t)k), gi, what, &v, err);
        if (st) return st;
        if (!v) continue;
        if (v->graph != g || v->producer || v->is_const || v->is_input)
            return BAD(SEC_NODES, "%s: output '%s' is a graph input, a constant, another node's "
                       "output or a value of an enclosing graph", what, v->name);
        af_node_set_output(n, (int)k, v);
    }
    for (uint32_t k = 0; k < nin; k++) {
        af_value *v;
        uint32_t id = get32(ins + 4 * (size_t)k);
        st = ref_value(L, SEC_NODES, id, gi, what, &v, err);
        if (!st) st = note_read(L, gi, id, err);
        if (st) return st;
        if (v) af_node_set_input(n, (int)k, v);
    }
    for (uint32_t a = 0; a < nattrs; a++) {
        st = read_attr(L, gi, n, attr_first + a, &n->attrs[a], err);
        if (st) return st;
        n->nattrs = (int)a + 1;
        for (uint32_t b = 0; b < a; b++)
            if (!strcmp(n->attrs[a].name, n->attrs[b].name))
                return BAD(SEC_ATTRS, "%s: attribute '%s' given twice", what, n->attrs[a].name);
    }
    return AF_OK;
}

/* Graph gi's inputs and outputs. */
static af_status build_io(loader *L, uint32_t gi, af_error *err) {
    const uint8_t *r = L->sec[SEC_GRAPHS].p + GRAPH_REC * (size_t)gi, *ins = NULL, *outs = NULL;
    af_graph *g = L->graphs[gi];
    char what[32];
    snprintf(what, sizeof what, "graph %u", gi);
    uint32_t nin = get32(r + 28), nout = get32(r + 36);
    af_status st = ref_list(L, SEC_GRAPHS, get32(r + 24), nin, what, &ins, err);
    if (!st) st = ref_list(L, SEC_GRAPHS, get32(r + 32), nout, what, &outs, err);
    if (st) return st;
    g->inputs = af_arena_calloc(L->a, (size_t)nin + 1, sizeof(af_value *));
    g->outputs = af_arena_calloc(L->a, (size_t)nout + 1, sizeof(af_value *));
    if (!g->inputs || !g->outputs) return nomem(L, err);
    for (uint32_t k = 0; k < nin; k++) {
        af_value *v;
        st = ref_value(L, SEC_GRAPHS, get32(ins + 4 * (size_t)k), gi, what, &v, err);
        if (st) return st;
        if (!v || v->graph != g || v->is_input)
            return BAD(SEC_GRAPHS, "%s: input %u is missing, listed twice or another graph's",
                       what, k);
        v->is_input = true;
        g->inputs[g->ninputs++] = v;
    }
    for (uint32_t k = 0; k < nout; k++) {
        af_value *v;
        uint32_t id = get32(outs + 4 * (size_t)k);
        st = ref_value(L, SEC_GRAPHS, id, gi, what, &v, err);
        if (!st) st = note_read(L, gi, id, err);
        if (st) return st;
        if (!v) return BAD(SEC_GRAPHS, "%s: output %u is missing", what, k);
        if (v->graph == g) v->is_output = true;
        g->outputs[g->noutputs++] = v;
    }
    return AF_OK;
}

/* Every graph's inputs, outputs and nodes, in graph order (note_read relies on it). */
static af_status build_nodes(loader *L, af_error *err) {
    uint32_t next_node = 0, next_attr = 0;
    for (uint32_t gi = 0; gi < L->ngraphs; gi++) {
        const uint8_t *r = L->sec[SEC_GRAPHS].p + GRAPH_REC * (size_t)gi;
        uint32_t first = get32(r + 16), nn = get32(r + 20);
        af_status st = build_io(L, gi, err);
        if (st) return st;
        if (first != next_node || !in_range(first, nn, L->nnodes))
            return BAD(SEC_GRAPHS, "graph %u: nodes %u..+%u do not follow the previous graph's "
                       "(%u of %u)", gi, first, nn, next_node, L->nnodes);
        next_node += nn;
        for (uint32_t k = 0; k < nn; k++) {
            st = build_node(L, gi, first + k, &next_attr, err);
            if (st) return st;
        }
    }
    if (next_node != L->nnodes)
        return BAD(SEC_GRAPHS, "%u nodes belong to no graph", L->nnodes - next_node);
    if (next_attr != L->nattrs)
        return BAD(SEC_NODES, "%u attributes belong to no node", L->nattrs - next_attr);
    for (uint32_t gi = 1; gi < L->ngraphs; gi++)
        if (!L->claimed[gi]) return BAD(SEC_GRAPHS, "graph %u is not held by any node", gi);
    return AF_OK;
}

/* Every value a node reads or a graph returns exists when it is needed: a graph input, a
 * constant, or a node's output; af_graph_toposort then checks that producers run first. */
static af_status check_reads(const loader *L, af_error *err) {
    for (uint32_t gi = 0; gi < L->ngraphs; gi++) {
        af_graph *g = L->graphs[gi];
        for (int i = 0; i < g->nnodes; i++) {
            const af_node *n = g->nodes[i];
            for (int k = 0; k < n->nin; k++) {
                const af_value *v = n->in[k];
                if (v && !v->is_input && !v->is_const && !v->producer)
                    return BAD(SEC_NODES, "node '%s' reads '%s', which nothing produces", n->name,
                               v->name);
            }
        }
        for (int k = 0; k < g->noutputs; k++) {
            const af_value *v = g->outputs[k];
            if (!v->is_input && !v->is_const && !v->producer)
                return BAD(SEC_GRAPHS, "graph %u: output '%s' is produced by nothing", gi, v->name);
        }
        af_status st = af_graph_toposort(g, err);
        if (st) return st;
    }
    return AF_OK;
}

/* The plan section (empty: no plan) into *out, checked against the loaded main graph. */
static af_status read_plan(const loader *L, af_plan **out, af_error *err) {
    const section *s = &L->sec[SEC_PLAN];
    uint32_t n = 0;
    *out = NULL;
    if (s->size == 0) return AF_OK;
    af_status st = count_records(L, SEC_PLAN, PLAN_FIXED, PLAN_REC, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n || get32(s->p + 12) != 0)
        return BAD(SEC_PLAN, "%u entries announced (and word %u), %u stored", get32(s->p + 8),
                   get32(s->p + 12), n);
    const af_graph *g = L->graphs[0];
    af_plan *p = af_plan_new(g->nvalues);
    if (!p) return nomem(L, err);
    p->arena_size = get64(s->p);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + PLAN_FIXED + PLAN_REC * (size_t)i;
        uint32_t vi = get32(r), src = get32(r + 4), prev = i ? get32(r - PLAN_REC) : 0;
        uint64_t off = get64(r + 8), size = get64(r + 16);
        if (vi >= L->nvalues || L->vgraph[vi] != 0 || (i && vi <= prev))
            st = BAD(SEC_PLAN, "entry %u: value %u is not the next value of the main graph", i,
                     vi);
        else if (src != NONE && (src >= L->nvalues || L->vgraph[src] != 0))
            st = BAD(SEC_PLAN, "entry %u: in place over value %u, not one of the main graph", i,
                     src);
        else if (off > AF_PLAN_MAX_BYTES || size > AF_PLAN_MAX_BYTES)
            st = BAD(SEC_PLAN, "entry %u: bytes %llu..+%llu are beyond any arena", i,
                     (unsigned long long)off, (unsigned long long)size);
        else
            p->slots[L->values[vi]->id] =
                (af_plan_slot){(int64_t)off, size, src == NONE ? -1 : L->values[src]->id};
    }
    if (!st) {
        af_error e;
        st = af_plan_check(g, p, &e);
        if (st) st = lfail(L, err, st, -1, "%s", e.message);
    }
    if (st) af_plan_free(p);
    else *out = p;
    return st;
}

static void loader_free(loader *L) {
    free(L->graphs);
    free(L->parent);
    free(L->claimed);
    free(L->values);
    free(L->vgraph);
    free(L->last);
}

af_status af_afm_load_with_plan(const char *path, af_model **out, af_afm_meta *meta_out,
                                af_plan **plan_out, af_error *err) {
    loader L = {0};
    af_afm_meta meta;
    af_opset *opsets = NULL;
    af_plan *plan = NULL;
    int nopsets = 0;
    *out = NULL;
    if (plan_out) *plan_out = NULL;
    af_model *m = calloc(1, sizeof *m);
    if (m) m->arena = af_arena_new();
    if (!m || !m->arena || !(m->path = af_arena_strdup(m->arena, path))) {
        if (m) af_arena_free(m->arena);
        free(m);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    }
    L.a = m->arena;
    af_status st = map_file(&L, m->path, err);
    if (!st) {
        m->map = (void *)L.base; /* af_model_free unmaps it */
        m->map_len = L.len;
        m->map_is_mmap = true;
        st = check_header(&L, err);
    }
    if (!st) st = open_sections(&L, err);
    if (!st) st = read_meta(&L, &meta, err);
    if (!st) st = check_plugin_ops(L.file, &meta, err);
    if (!st) st = read_model(&L, m, &opsets, &nopsets, err);
    if (!st) st = build_graphs(&L, m, opsets, nopsets, err);
    if (!st) st = build_nodes(&L, err);
    if (!st) st = check_reads(&L, err);
#ifndef NDEBUG
    if (!st) st = af_graph_verify(m->graph, err);
#endif
    if (!st) st = read_plan(&L, &plan, err);
    loader_free(&L);
    if (st) {
        af_model_free(m);
        return st;
    }
    m->producer_name = "autofusion";
    m->producer_version = meta.version;
    if (meta_out) *meta_out = meta;
    if (plan_out) *plan_out = plan;
    else af_plan_free(plan);
    *out = m;
    return AF_OK;
}

af_status af_afm_load(const char *path, af_model **out, af_afm_meta *meta_out, af_error *err) {
    return af_afm_load_with_plan(path, out, meta_out, NULL, err);
}

/* ---- metadata and inspect -------------------------------------------------------------------- */

af_status af_afm_read_meta(const char *path, af_afm_info **out, af_error *err) {
    loader L = {0};
    *out = NULL;
    af_afm_info *info = calloc(1, sizeof *info);
    if (info) info->arena = af_arena_new();
    if (!info || !info->arena) {
        free(info);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    }
    L.a = info->arena;
    const char *file = af_arena_strdup(info->arena, path);
    af_status st =
        file ? map_file(&L, file, err) : af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    if (!st) st = check_header(&L, err);
    if (!st) st = check_strings(&L, err);
    if (!st) st = read_meta(&L, &info->meta, err);
    af_afm_section *secs = st ? NULL : af_arena_calloc(info->arena, NSEC, sizeof *secs);
    if (!st && !secs) st = nomem(&L, err);
    if (!st) {
        for (int s = 0; s < NSEC; s++)
            secs[s] = (af_afm_section){SEC_NAME[s], L.sec_off[s], L.sec[s].size};
        info->sections = secs;
        info->nsections = NSEC;
        info->format_version = L.version;
        info->file_size = L.len;
        /* The strings live in the mapping, which goes away: copy what the caller keeps. */
        af_afm_meta *mt = &info->meta;
        af_afm_kv *kv = (af_afm_kv *)mt->kv;
        mt->version = af_arena_strdup(info->arena, mt->version);
        mt->command_line = af_arena_strdup(info->arena, mt->command_line);
        bool ok = mt->version && mt->command_line;
        for (int i = 0; i < mt->nkv && ok; i++) {
            kv[i].key = af_arena_strdup(info->arena, kv[i].key);
            kv[i].value = af_arena_strdup(info->arena, kv[i].value);
            ok = kv[i].key && kv[i].value;
        }
        if (!ok) st = nomem(&L, err);
    }
    if (L.base) munmap((void *)L.base, L.len);
    if (st) {
        af_afm_info_free(info);
        return st;
    }
    *out = info;
    return AF_OK;
}

void af_afm_info_free(af_afm_info *info) {
    if (!info) return;
    af_arena_free(info->arena);
    free(info);
}

/* Totals over a graph and its subgraphs. */
typedef struct stats {
    int nodes, fused, nconst;
    uint64_t weight_bytes;
    const char **ops; /* distinct op names, with their counts */
    int *counts, nops, cap;
} stats;

static bool count_op(stats *s, const char *name) {
    for (int i = 0; i < s->nops; i++)
        if (!strcmp(s->ops[i], name)) {
            s->counts[i]++;
            return true;
        }
    if (s->nops == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        const char **ops = realloc(s->ops, (size_t)cap * sizeof *ops);
        if (ops) s->ops = ops;
        int *counts = realloc(s->counts, (size_t)cap * sizeof *counts);
        if (counts) s->counts = counts;
        if (!ops || !counts) return false;
        s->cap = cap;
    }
    s->ops[s->nops] = name;
    s->counts[s->nops++] = 1;
    return true;
}

static bool gather(stats *s, const af_graph *g) {
    for (int i = 0; i < g->nvalues; i++)
        if (g->values[i]->is_const) {
            s->nconst++;
            s->weight_bytes += g->values[i]->type.nbytes;
        }
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        s->nodes++;
        s->fused += af_node_attr(n, "fusion_rule") != NULL;
        if (!count_op(s, n->op_type)) return false;
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_TENSOR) s->weight_bytes += at->t->nbytes;
            for (int k = 0; at->type == AF_ATTR_TENSORS && k < at->n; k++)
                s->weight_bytes += at->tensors[k]->nbytes;
            if (at->type == AF_ATTR_GRAPH && !gather(s, at->g)) return false;
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                if (!gather(s, at->graphs[k])) return false;
        }
    }
    return true;
}

/* Text from the file, with control characters shown as '?': a hostile name must not drive the
 * terminal. */
static void put_text(FILE *out, const char *s) {
    for (; *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
}

static void print_fused(FILE *out, const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        const af_attr *rule = af_node_attr(n, "fusion_rule"),
                      *from = af_node_attr(n, "fused_nodes");
        if (rule && rule->type == AF_ATTR_STRING) {
            fputs("    ", out);
            put_text(out, n->name);
            fprintf(out, " (%s) by ", n->op_type);
            put_text(out, rule->s);
            const af_attr *prec = af_node_attr(n, "precision");
            if (prec && prec->type == AF_ATTR_STRING) {
                fputs(" in ", out);
                put_text(out, prec->s);
            }
            if (from && from->type == AF_ATTR_STRINGS) {
                fprintf(out, ", from %d node%s:", from->n, from->n == 1 ? "" : "s");
                for (int k = 0; k < from->n; k++) {
                    fputc(' ', out);
                    put_text(out, from->strings[k]);
                }
            }
            fputc('\n', out);
        }
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_GRAPH) print_fused(out, at->g);
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                print_fused(out, at->graphs[k]);
        }
    }
}

static void print_values(FILE *out, const char *title, af_value *const *vs, int n) {
    fprintf(out, "%s:\n", title);
    for (int i = 0; i < n; i++) {
        char dims[256];
        fputs("    ", out);
        put_text(out, vs[i]->name);
        fprintf(out, " %s%s\n", af_dtype_name(vs[i]->type.dtype),
                af_dims_str(&vs[i]->type, dims, sizeof dims));
    }
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* A short form of a metadata value (a report in JSON is long): at most 80 characters, each run
 * of white space shown as one space, other control characters as '?'. */
static void print_short(FILE *out, const char *s) {
    size_t full = strlen(s), shown = 0;
    const char *p = s;
    for (; *p && shown < 80; p++) {
        if (is_space(*p) && p > s && is_space(p[-1])) continue;
        unsigned char c = (unsigned char)*p;
        fputc(is_space(*p) ? ' ' : c < 0x20 || c == 0x7f ? '?' : c, out);
        shown++;
    }
    if (*p) fprintf(out, " ... (%zu bytes)", full);
}

af_status af_afm_inspect(const char *path, FILE *out, af_error *err) {
    af_afm_info *info = NULL;
    af_model *m = NULL;
    af_plan *plan = NULL;
    af_afm_meta meta;
    stats s = {0};
    af_status st = af_afm_read_meta(path, &info, err);
    if (!st) st = af_afm_load_with_plan(path, &m, &meta, &plan, err);
    if (!st && !gather(&s, m->graph)) st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    if (st) goto done;
    fprintf(out, "%s: autofusion compiled model, format version %u, %llu bytes, checksums OK\n",
            path, info->format_version, (unsigned long long)info->file_size);
    fputs("written by: autofusion ", out);
    put_text(out, meta.version);
    fputs("\ncommand line: ", out);
    put_text(out, *meta.command_line ? meta.command_line : "(none recorded)");
    fputc('\n', out);
    for (int i = 0; i < meta.nkv; i++) {
        fputs("meta ", out);
        put_text(out, meta.kv[i].key);
        fputs(": ", out);
        print_short(out, meta.kv[i].value);
        fputc('\n', out);
    }
    fprintf(out, "sections:\n");
    for (int i = 0; i < info->nsections; i++)
        fprintf(out, "    %-10s offset %12llu  size %12llu\n", info->sections[i].name,
                (unsigned long long)info->sections[i].offset,
                (unsigned long long)info->sections[i].size);
    const af_graph *g = m->graph;
    fprintf(out, "opsets:");
    for (int i = 0; i < g->nopsets; i++) {
        fputc(' ', out);
        put_text(out, *g->opsets[i].domain ? g->opsets[i].domain : "ai.onnx");
        fprintf(out, " %lld", (long long)g->opsets[i].version);
    }
    fputc('\n', out);
    print_values(out, "inputs", g->inputs, g->ninputs);
    print_values(out, "outputs", g->outputs, g->noutputs);
    fprintf(out, "ops: %d nodes (%d fused)\n", s.nodes, s.fused);
    for (int done = 0; done < s.nops; done++) { /* by count, largest first */
        int best = done;
        for (int i = done + 1; i < s.nops; i++)
            if (s.counts[i] > s.counts[best]) best = i;
        const char *name = s.ops[best];
        int count = s.counts[best];
        s.ops[best] = s.ops[done];
        s.counts[best] = s.counts[done];
        s.ops[done] = name;
        s.counts[done] = count;
        fprintf(out, "    %-24s %d\n", name, count);
    }
    fprintf(out, "fused ops with provenance:%s\n", s.fused ? "" : " none");
    print_fused(out, g);
    fprintf(out, "weights: %llu bytes (%.1f MiB) in %d constants\n",
            (unsigned long long)s.weight_bytes, (double)s.weight_bytes / (1024.0 * 1024.0),
            s.nconst);
    if (plan)
        fprintf(out, "arena: %llu bytes (lower bound %llu, ratio %.3f), %d intermediates "
                "planned, %d in place\n", (unsigned long long)plan->arena_size,
                (unsigned long long)plan->lower_bound, af_plan_ratio(plan), plan->nplanned,
                plan->ninplace);
    else
        fprintf(out, "arena: not planned (the file carries no memory plan; loading makes one)\n");
done:
    af_plan_free(plan);
    free(s.ops);
    free(s.counts);
    af_model_free(m);
    af_afm_info_free(info);
    return st;
}
