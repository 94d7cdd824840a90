/* IR -> ONNX ModelProto (see export.h), with a small protobuf wire writer of our own.
 *
 * The writer appends to one growing buffer. A nested message reserves room for the longest
 * length varint when it opens and, once its length is known, writes the varint and slides its
 * bytes back over the unused room, so every message is written once, in field order, without
 * a sizing pass. Fields follow onnx.proto (proto2: repeated numbers are written unpacked).
 *
 * Invariant: every value a node reads is written under the same name as where it is defined
 * (graph input, initializer or node output), so the file resolves exactly as the IR does.
 */
#include "onnx/export.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Field numbers of onnx.proto. */
enum { MODEL_IR_VERSION = 1, MODEL_PRODUCER_NAME = 2, MODEL_PRODUCER_VERSION = 3, MODEL_GRAPH = 7,
       MODEL_OPSET_IMPORT = 8 };
enum { OPSET_DOMAIN = 1, OPSET_VERSION = 2 };
enum { GRAPH_NODE = 1, GRAPH_NAME = 2, GRAPH_INITIALIZER = 5, GRAPH_INPUT = 11, GRAPH_OUTPUT = 12,
       GRAPH_VALUE_INFO = 13 };
enum { NODE_INPUT = 1, NODE_OUTPUT = 2, NODE_NAME = 3, NODE_OP_TYPE = 4, NODE_ATTRIBUTE = 5,
       NODE_DOMAIN = 7 };
enum { ATTR_NAME = 1, ATTR_F = 2, ATTR_I = 3, ATTR_S = 4, ATTR_T = 5, ATTR_G = 6, ATTR_FLOATS = 7,
       ATTR_INTS = 8, ATTR_STRINGS = 9, ATTR_TENSORS = 10, ATTR_GRAPHS = 11, ATTR_TYPE = 20 };
enum { TENSOR_DIMS = 1, TENSOR_DATA_TYPE = 2, TENSOR_NAME = 8, TENSOR_RAW_DATA = 9 };
enum { VI_NAME = 1, VI_TYPE = 2 };
enum { TYPE_TENSOR = 1 };
enum { TT_ELEM_TYPE = 1, TT_SHAPE = 2 };
enum { SHAPE_DIM = 1 };
enum { DIM_VALUE = 1, DIM_PARAM = 2 };
enum { WIRE_VARINT = 0, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

#define IR_VERSION 8
#define MAX_PROTO ((size_t)INT32_MAX) /* protobuf messages stop at 2 GiB */
#define LEN_ROOM 10                   /* the longest varint */

/* ---- the wire writer ------------------------------------------------------------------------- */

typedef struct pbw {
    uint8_t *p;
    size_t n, cap;
    bool oom; /* sticky: checked once at the end */
} pbw;

static void pb_raw(pbw *b, const void *d, size_t n) {
    if (b->oom) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = af_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static size_t varint(uint8_t *out, uint64_t v) {
    size_t k = 0;
    do {
        out[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return k;
}

static void pb_varint(pbw *b, uint64_t v) {
    uint8_t tmp[LEN_ROOM];
    pb_raw(b, tmp, varint(tmp, v));
}

static void pb_tag(pbw *b, int num, int wire) { pb_varint(b, (uint64_t)num << 3 | (uint64_t)wire); }

/* int32/int64 fields: negative numbers take ten bytes, as protobuf encodes them. */
static void pb_int(pbw *b, int num, int64_t v) {
    pb_tag(b, num, WIRE_VARINT);
    pb_varint(b, (uint64_t)v);
}

static void pb_float(pbw *b, int num, float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    pb_tag(b, num, WIRE_FIXED32);
    pb_raw(b, &bits, 4); /* little-endian host (import.c asserts it) */
}

static void pb_bytes(pbw *b, int num, const void *d, size_t n) {
    pb_tag(b, num, WIRE_LEN);
    pb_varint(b, n);
    pb_raw(b, d, n);
}

static void pb_str(pbw *b, int num, const char *s) { pb_bytes(b, num, s, strlen(s)); }

/* Open a nested message in field num; returns the mark pb_end needs. */
static size_t pb_begin(pbw *b, int num) {
    static const uint8_t room[LEN_ROOM];
    pb_tag(b, num, WIRE_LEN);
    size_t mark = b->n;
    pb_raw(b, room, LEN_ROOM);
    return mark;
}

static void pb_end(pbw *b, size_t mark) {
    if (b->oom) return;
    size_t len = b->n - mark - LEN_ROOM;
    uint8_t tmp[LEN_ROOM];
    size_t k = varint(tmp, len);
    memmove(b->p + mark + k, b->p + mark + LEN_ROOM, len);
    memcpy(b->p + mark, tmp, k);
    b->n -= LEN_ROOM - k;
}

/* ---- model pieces ---------------------------------------------------------------------------- */

typedef struct exporter {
    const char *path;
    pbw b;
} exporter;

static af_status write_graph(exporter *x, int field, const af_graph *g, af_error *err);

/* The name a value is written under; generated (from its address, stable for this export) when
 * the IR gave it none. */
static const char *vname(const af_value *v, char *buf, size_t len) {
    if (v->name && *v->name) return v->name;
    snprintf(buf, len, "_unnamed_%p", (const void *)v);
    return buf;
}

static void write_tensor(exporter *x, int field, const af_tensor *t, const char *name) {
    size_t m = pb_begin(&x->b, field);
    for (int i = 0; i < t->rank; i++) pb_int(&x->b, TENSOR_DIMS, t->dims[i]);
    pb_int(&x->b, TENSOR_DATA_TYPE, t->dtype);
    if (name && *name) pb_str(&x->b, TENSOR_NAME, name);
    pb_bytes(&x->b, TENSOR_RAW_DATA, t->data, t->nbytes);
    pb_end(&x->b, m);
}

static af_status check_tensor(const exporter *x, const char *what, const af_tensor *t,
                              af_error *err) {
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), need;
    if (n < 0 || es == 0 || !af_mul_size((size_t)n, es, &need) || t->nbytes != need ||
        (need && !t->data))
        return af_fail(err, AF_ERR_INTERNAL, "%s: constant '%s' (%s) has no consistent data",
                       x->path, what, af_dtype_name(t->dtype));
    return AF_OK;
}

/* ValueInfoProto: name and, when the dtype is known, the tensor type (shape when the rank is). */
static void write_value_info(exporter *x, int field, const af_value *v) {
    char buf[64];
    const af_tensor *t = &v->type;
    size_t m = pb_begin(&x->b, field);
    pb_str(&x->b, VI_NAME, vname(v, buf, sizeof buf));
    if (t->dtype != AF_DTYPE_UNDEFINED) {
        size_t ty = pb_begin(&x->b, VI_TYPE), tt = pb_begin(&x->b, TYPE_TENSOR);
        pb_int(&x->b, TT_ELEM_TYPE, t->dtype);
        if (t->rank >= 0) {
            size_t sh = pb_begin(&x->b, TT_SHAPE);
            for (int i = 0; i < t->rank; i++) {
                size_t d = pb_begin(&x->b, SHAPE_DIM);
                char sym[128];
                if (t->dims[i] >= 0) pb_int(&x->b, DIM_VALUE, t->dims[i]);
                else if (af_dim_is_sym(t->dims[i])) /* "batch", "12*batch": Netron shows it */
                    pb_str(&x->b, DIM_PARAM, af_dim_str(v->graph, t->dims[i], sym, sizeof sym));
                else if (v->dim_param[i]) pb_str(&x->b, DIM_PARAM, v->dim_param[i]);
                pb_end(&x->b, d);
            }
            pb_end(&x->b, sh);
        }
        pb_end(&x->b, tt);
        pb_end(&x->b, ty);
    }
    pb_end(&x->b, m);
}

static af_status write_attr(exporter *x, const af_node *n, const af_attr *at, af_error *err) {
    size_t m = pb_begin(&x->b, NODE_ATTRIBUTE);
    af_status st = AF_OK;
    pb_str(&x->b, ATTR_NAME, at->name);
    pb_int(&x->b, ATTR_TYPE, at->type);
    switch (at->type) {
    case AF_ATTR_FLOAT:
        pb_float(&x->b, ATTR_F, at->f);
        break;
    case AF_ATTR_INT:
        pb_int(&x->b, ATTR_I, at->i);
        break;
    case AF_ATTR_STRING:
        pb_bytes(&x->b, ATTR_S, at->s ? at->s : "", at->s ? at->slen : 0);
        break;
    case AF_ATTR_TENSOR:
        st = check_tensor(x, at->name, at->t, err);
        if (!st) write_tensor(x, ATTR_T, at->t, NULL);
        break;
    case AF_ATTR_GRAPH:
        st = write_graph(x, ATTR_G, at->g, err);
        break;
    case AF_ATTR_FLOATS:
        for (int k = 0; k < at->n; k++) pb_float(&x->b, ATTR_FLOATS, at->floats[k]);
        break;
    case AF_ATTR_INTS:
        for (int k = 0; k < at->n; k++) pb_int(&x->b, ATTR_INTS, at->ints[k]);
        break;
    case AF_ATTR_STRINGS:
        for (int k = 0; k < at->n; k++)
            pb_str(&x->b, ATTR_STRINGS, at->strings[k] ? at->strings[k] : "");
        break;
    case AF_ATTR_TENSORS:
        for (int k = 0; k < at->n && !st; k++) {
            st = check_tensor(x, at->name, at->tensors[k], err);
            if (!st) write_tensor(x, ATTR_TENSORS, at->tensors[k], NULL);
        }
        break;
    case AF_ATTR_GRAPHS:
        for (int k = 0; k < at->n && !st; k++) st = write_graph(x, ATTR_GRAPHS, at->graphs[k], err);
        break;
    default:
        st = af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                          "attribute '%s' of type %d cannot be exported", at->name, (int)at->type);
    }
    pb_end(&x->b, m);
    return st;
}

/* Ops of our domain are written in it; training ops keep theirs; the rest are ai.onnx (""). */
static const char *node_domain(const af_node *n) {
    if (af_op_is_ours(n->op)) return AF_DOMAIN;
    if (!n->domain || !strcmp(n->domain, "ai.onnx")) return "";
    return n->domain;
}

static af_status write_node(exporter *x, const af_node *n, af_error *err) {
    char buf[64];
    size_t m = pb_begin(&x->b, GRAPH_NODE);
    af_status st = AF_OK;
    /* Trailing omitted inputs and outputs are dropped; inner ones are written as "". */
    int nin = n->nin, nout = n->nout;
    while (nin > 0 && !n->in[nin - 1]) nin--;
    while (nout > 0 && !n->out[nout - 1]) nout--;
    for (int k = 0; k < nin; k++)
        pb_str(&x->b, NODE_INPUT, n->in[k] ? vname(n->in[k], buf, sizeof buf) : "");
    for (int k = 0; k < nout; k++)
        pb_str(&x->b, NODE_OUTPUT, n->out[k] ? vname(n->out[k], buf, sizeof buf) : "");
    pb_str(&x->b, NODE_NAME, n->name);
    pb_str(&x->b, NODE_OP_TYPE, n->op == AF_OP_CUSTOM ? n->op_type : af_ops[n->op].name);
    for (int a = 0; a < n->nattrs && !st; a++) {
        /* Provenance on a standard op (a canonical LayerNormalization left in place) is not
         * part of its ONNX schema; only our own ops carry it in the file. */
        const char *name = n->attrs[a].name;
        if (!af_op_is_ours(n->op) && (!strcmp(name, "fused_nodes") || !strcmp(name, "fusion_rule")))
            continue;
        st = write_attr(x, n, &n->attrs[a], err);
    }
    const char *dom = node_domain(n);
    if (*dom) pb_str(&x->b, NODE_DOMAIN, dom);
    pb_end(&x->b, m);
    return st;
}

/* Does g or one of its subgraphs return v? */
static bool returned(const af_graph *g, const af_value *v) {
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == v) return true;
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i]->nattrs; a++) {
            const af_attr *at = &g->nodes[i]->attrs[a];
            if (at->type == AF_ATTR_GRAPH && returned(at->g, v)) return true;
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                if (returned(at->graphs[k], v)) return true;
        }
    return false;
}

/* A constant that nothing reads or returns (one a pass replaced, such as a conv's weights
 * once BatchNorm is folded into new ones) is not written. */
static bool live_const(const af_value *v) {
    return v->nuses > 0 || v->is_input || v->is_output || returned(v->graph, v);
}

static af_status write_graph(exporter *x, int field, const af_graph *g, af_error *err) {
    size_t m = pb_begin(&x->b, field);
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) st = write_node(x, g->nodes[i], err);
    /* onnx.checker wants every graph named. */
    pb_str(&x->b, GRAPH_NAME, g->name && *g->name ? g->name : g->parent ? "subgraph" : "main");
    for (int i = 0; i < g->nvalues && !st; i++) {
        const af_value *v = g->values[i];
        char buf[64];
        if (!v->is_const || !live_const(v)) continue;
        st = check_tensor(x, v->name, &v->type, err);
        if (!st) write_tensor(x, GRAPH_INITIALIZER, &v->type, vname(v, buf, sizeof buf));
    }
    for (int i = 0; i < g->ninputs; i++) write_value_info(x, GRAPH_INPUT, g->inputs[i]);
    for (int i = 0; i < g->noutputs; i++) write_value_info(x, GRAPH_OUTPUT, g->outputs[i]);
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        if (v->producer && !v->is_output && !v->is_input && !v->is_const &&
            v->type.dtype != AF_DTYPE_UNDEFINED && v->type.rank >= 0)
            write_value_info(x, GRAPH_VALUE_INFO, v);
    }
    pb_end(&x->b, m);
    return st;
}

static bool uses_our_ops(const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (af_op_is_ours(n->op)) return true;
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_GRAPH && uses_our_ops(at->g)) return true;
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                if (uses_our_ops(at->graphs[k])) return true;
        }
    }
    return false;
}

static void write_opset(exporter *x, const char *domain, int64_t version) {
    size_t m = pb_begin(&x->b, MODEL_OPSET_IMPORT);
    pb_str(&x->b, OPSET_DOMAIN, domain);
    pb_int(&x->b, OPSET_VERSION, version);
    pb_end(&x->b, m);
}

enum { MAX_DOMAINS = 64 };

/* Add d to the domains with an opset import (false when it was there or the list is full). */
static bool new_domain(const char **seen, int *n, const char *d) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(seen[i], d)) return false;
    if (*n == MAX_DOMAINS) return false;
    seen[(*n)++] = d;
    return true;
}

/* Version 1 of every custom op domain (a plugin's rule may make ops of a domain the model did
 * not import) that has no opset import yet. */
static void write_custom_opsets(exporter *x, const af_graph *g, const char **seen, int *n) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *c = g->nodes[i];
        if (c->op == AF_OP_CUSTOM && new_domain(seen, n, node_domain(c)))
            write_opset(x, node_domain(c), 1);
        for (int a = 0; a < c->nattrs; a++) {
            const af_attr *at = &c->attrs[a];
            if (at->type == AF_ATTR_GRAPH) write_custom_opsets(x, at->g, seen, n);
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                write_custom_opsets(x, at->graphs[k], seen, n);
        }
    }
}

static af_status write_model(exporter *x, const af_graph *g, af_error *err) {
    pb_int(&x->b, MODEL_IR_VERSION, IR_VERSION);
    pb_str(&x->b, MODEL_PRODUCER_NAME, "autofusion");
    pb_str(&x->b, MODEL_PRODUCER_VERSION, AF_VERSION);
    af_status st = write_graph(x, MODEL_GRAPH, g, err);
    const char *seen[MAX_DOMAINS] = {"", AF_DOMAIN};
    int nseen = 2;
    write_opset(x, "", af_graph_opset(g));
    for (int i = 0; i < g->nopsets; i++) {
        const char *d = g->opsets[i].domain ? g->opsets[i].domain : "";
        if (*d && strcmp(d, "ai.onnx") && new_domain(seen, &nseen, d))
            write_opset(x, d, g->opsets[i].version);
    }
    if (uses_our_ops(g)) write_opset(x, AF_DOMAIN, 1);
    write_custom_opsets(x, g, seen, &nseen);
    return st;
}

static bool fill_onnx(int fd, const void *x) {
    const exporter *e = x;
    return af_write_all(fd, e->b.p, e->b.n);
}

/* Write the bytes under a temporary name next to path, then rename into place. */
static af_status save(const exporter *x, af_error *err) {
    bool created;
    int e = af_write_atomic(x->path, fill_onnx, x, &created);
    if (!e) return AF_OK;
    if (e == ENOMEM && !created) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", x->path);
    return af_fail(err, AF_ERR_IO,
                   created ? "%s: cannot write: %s" : "%s: cannot create a file in its folder: %s",
                   x->path, strerror(e));
}

af_status af_onnx_export(const af_graph *g, const char *path, af_error *err) {
    exporter x = {.path = path};
    if (!g || g->parent)
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: only a main graph can be exported", path);
    af_status st = write_model(&x, g, err);
    if (!st && x.b.oom) st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    if (!st && x.b.n >= MAX_PROTO)
        st = af_fail(err, AF_ERR_UNSUPPORTED,
                     "%s: the model takes %zu bytes; ONNX files stop at 2 GiB (external data is "
                     "not written)", path, x.b.n);
    if (!st) st = save(&x, err);
    af_free(x.b.p);
    return st;
}
