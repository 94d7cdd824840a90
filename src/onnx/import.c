/* ONNX -> IR: ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto and ValueInfoProto
 * read with the wire reader (reader.h) into the model's arena.
 *
 * Invariants: nothing read from the file is trusted (every count, dim, length and name is
 * checked before use); the IR lives in the model's arena, so an error anywhere only has to
 * release the few malloc'd scratch buffers of the function that fails, and af_model_free
 * releases the rest; constants reference the mapped file (zero copy) when their bytes are
 * aligned for their element type, and are copied into the arena otherwise.
 *
 * A graph is imported in passes over its GraphProto: inputs, initializers, node outputs, then
 * node attributes (subgraphs) and node inputs, then outputs and value_info. Declaring every
 * node's outputs before resolving any input lets nodes come in any order (af_graph_toposort
 * orders them) and lets a subgraph see every value of its enclosing graphs.
 */
#include "onnx/onnx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tensor bytes are used as stored: ONNX raw_data is little-endian");

/* Field numbers of onnx.proto, one enum per message. */
enum { /* ModelProto */
    MODEL_IR_VERSION = 1, MODEL_PRODUCER_NAME = 2, MODEL_PRODUCER_VERSION = 3, MODEL_DOMAIN = 4,
    MODEL_MODEL_VERSION = 5, MODEL_DOC_STRING = 6, MODEL_GRAPH = 7, MODEL_OPSET_IMPORT = 8,
    MODEL_METADATA_PROPS = 14, MODEL_FUNCTIONS = 25
};
enum { /* FunctionProto */
    FN_NAME = 1, FN_INPUT = 4, FN_OUTPUT = 5, FN_NODE = 7, FN_OPSET_IMPORT = 9, FN_DOMAIN = 10,
    FN_ATTRIBUTE_PROTO = 11, FN_OVERLOAD = 13
};
enum { /* StringStringEntryProto */
    ENTRY_KEY = 1, ENTRY_VALUE = 2
};
enum { /* OperatorSetIdProto */
    OPSET_DOMAIN = 1, OPSET_VERSION = 2
};
enum { /* GraphProto */
    GRAPH_NODE = 1, GRAPH_NAME = 2, GRAPH_INITIALIZER = 5, GRAPH_INPUT = 11, GRAPH_OUTPUT = 12,
    GRAPH_VALUE_INFO = 13, GRAPH_SPARSE_INITIALIZER = 15
};
enum { /* NodeProto */
    NODE_INPUT = 1, NODE_OUTPUT = 2, NODE_NAME = 3, NODE_OP_TYPE = 4, NODE_ATTRIBUTE = 5,
    NODE_DOMAIN = 7, NODE_OVERLOAD = 8
};
enum { /* AttributeProto */
    ATTR_NAME = 1, ATTR_F = 2, ATTR_I = 3, ATTR_S = 4, ATTR_T = 5, ATTR_G = 6, ATTR_FLOATS = 7,
    ATTR_INTS = 8, ATTR_STRINGS = 9, ATTR_TENSORS = 10, ATTR_GRAPHS = 11, ATTR_TP = 14,
    ATTR_TYPE_PROTOS = 15, ATTR_TYPE = 20, ATTR_REF_ATTR_NAME = 21, ATTR_SPARSE_TENSOR = 22,
    ATTR_SPARSE_TENSORS = 23
};
enum { /* TensorProto */
    TENSOR_DIMS = 1, TENSOR_DATA_TYPE = 2, TENSOR_SEGMENT = 3, TENSOR_FLOAT_DATA = 4,
    TENSOR_INT32_DATA = 5, TENSOR_STRING_DATA = 6, TENSOR_INT64_DATA = 7, TENSOR_NAME = 8,
    TENSOR_RAW_DATA = 9, TENSOR_DOUBLE_DATA = 10, TENSOR_UINT64_DATA = 11,
    TENSOR_EXTERNAL_DATA = 13, TENSOR_DATA_LOCATION = 14
};
enum { /* ValueInfoProto */
    VI_NAME = 1, VI_TYPE = 2
};
enum { /* TypeProto */
    TYPE_TENSOR = 1, TYPE_SEQUENCE = 4, TYPE_MAP = 5, TYPE_OPAQUE = 7, TYPE_SPARSE_TENSOR = 8,
    TYPE_OPTIONAL = 9
};
enum { /* TypeProto.Tensor */
    TT_ELEM_TYPE = 1, TT_SHAPE = 2
};
enum { /* TensorShapeProto */
    SHAPE_DIM = 1
};
enum { /* TensorShapeProto.Dimension */
    DIM_VALUE = 1, DIM_PARAM = 2
};

#define OPSET_MIN 1
#define OPSET_MAX 23

typedef struct imp {
    af_model *m; /* NULL when decoding a lone TensorProto */
    af_arena *a;
    const char *file;
    bool owning; /* tensors get data they own (af_tensor_alloc) instead of arena memory */
    /* The float16 rule: float16/bfloat16 tensors keep their type everywhere, except that
     * initializers and Constant values become float32 when the main graph has no float16 or
     * bfloat16 input or output: that is a float32 model storing its weights in half precision,
     * and the kernels (which only handle float16 in Cast) then see float32 weights. A model that
     * really computes in float16 keeps its types as declared. */
    bool halves_to_float;
    af_opset *opsets;
    int nopsets;
    bool has_onnx_opset; /* ai.onnx is imported (models of other domains only may omit it) */
    struct fn_def *fns; /* the model's local functions */
    int nfns;
} imp;

/* A model-local function (ModelProto.functions, as torch's dynamo exporter and onnxscript write
 * them): a node of its domain, name and overload is replaced by the function's body at import,
 * its values renamed under the calling node's name. */
typedef struct fn_def {
    const char *domain, *name, *overload;
    af_pb msg;
    const char **in, **out;
    int nin, nout;
    int64_t onnx_version; /* its ai.onnx import, -1 when it has none */
} fn_def;

/* One call being inlined: the actual names of the formal inputs and outputs ("" when the caller
 * omits one), the prefix of the body's own values, and the caller's attributes (values already,
 * its own references resolved), which the body's ref_attr_name attributes take. */
typedef struct fn_frame {
    const fn_def *fn;
    const char *prefix;
    const char **in, **out;
    const af_attr *attrs;
    int nattrs, depth;
} fn_frame;

/* Calls nest at most this deep (a function may not call itself), and inlining gives a graph at
 * most this many nodes (a function calling another twice, 32 deep, would give 2^32). */
#define FN_MAX_DEPTH 32
#define FN_MAX_NODES (1 << 18)

/* A NodeProto being imported: what phase 1 declared, for phase 2. */
typedef struct node_rec {
    af_pb msg;
    const char *name;  /* as written; may be "" */
    const char *label; /* for messages: the name, the generated name, or "#<index>" */
    const char *op_type;
    const char *domain;
    af_node *node; /* NULL for a Constant, which becomes `konst` instead */
    af_value *konst;
    const fn_frame *frame; /* the call whose body holds this node; NULL in a graph */
    const fn_def *call;    /* the function this node calls (inlined: no node of its own) */
} node_rec;

/* Names declared in one graph: open addressing, capacity a power of two, at most half full. */
typedef struct scope {
    af_value **slots;
    size_t cap, n;
} scope;

static af_status import_graph(const imp *c, const af_pb *msg, af_graph *parent, af_graph **out,
                              af_error *err);

/* ---- errors -------------------------------------------------------------------------------- */

static af_status nomem(const imp *c, af_error *err) {
    return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", c->file);
}

/* "<file>: <reason>", where the reason starts with what is wrong ("tensor 'w': ..."). */
static af_status __attribute__((format(printf, 4, 5)))
file_fail(const imp *c, af_error *err, af_status code, const char *fmt, ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return af_fail(err, code, "%s: %s", c->file, reason);
}

/* "<file>: node '<name>' (<op>): <reason>", also before the af_node exists. */
static af_status __attribute__((format(printf, 5, 6)))
node_fail(const imp *c, const node_rec *r, af_error *err, af_status code, const char *fmt, ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return af_fail(err, code, "%s: node '%s' (%s): %s", c->file, r->label,
                   *r->op_type ? r->op_type : "?", reason);
}

/* ---- the name scope of one graph ------------------------------------------------------------ */

static size_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211u;
    return (size_t)h;
}

static af_value *scope_get(const scope *s, const char *name) {
    if (!s->cap) return NULL;
    for (size_t i = hash_name(name) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (!s->slots[i]) return NULL;
        if (!strcmp(s->slots[i]->name, name)) return s->slots[i];
    }
}

static bool scope_put(scope *s, af_value *v) {
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        af_value **slots = af_calloc(cap, sizeof *slots);
        if (!slots) return false;
        for (size_t k = 0; k < s->cap; k++) {
            if (!s->slots[k]) continue;
            size_t i = hash_name(s->slots[k]->name) & (cap - 1);
            while (slots[i]) i = (i + 1) & (cap - 1);
            slots[i] = s->slots[k];
        }
        af_free(s->slots);
        s->slots = slots;
        s->cap = cap;
    }
    size_t i = hash_name(v->name) & (s->cap - 1);
    while (s->slots[i]) i = (i + 1) & (s->cap - 1);
    s->slots[i] = v;
    s->n++;
    return true;
}

/* A value of this graph, or of an enclosing one (recorded as a capture by af_graph_find). */
static af_value *resolve(af_graph *g, const scope *s, const char *name) {
    af_value *v = scope_get(s, name);
    if (!v && g->parent) v = af_graph_find(g, name);
    return v;
}

/* A new value of g named `name`; callers have checked that g does not declare it yet, to say
 * what is declared twice. */
static af_status declare(const imp *c, af_graph *g, scope *s, const char *name, af_value **out,
                         af_error *err) {
    *out = NULL;
    af_value *v = af_value_new(g, name);
    if (!v || !scope_put(s, v)) return nomem(c, err);
    *out = v;
    return AF_OK;
}

/* ---- tensors ------------------------------------------------------------------------------- */

/* Where af_pb_repeated stores elements: `size` bytes each (the low bytes, little-endian). */
typedef struct sink {
    unsigned char *dst;
    size_t size;
    bool is_bool;
} sink;

static void put_elem(void *ctx, size_t i, uint64_t v) {
    sink *s = ctx;
    if (s->is_bool) v = v != 0;
    memcpy(s->dst + i * s->size, &v, s->size);
}

/* The typed field that holds data of type t, and its element wire type. */
static int typed_field(af_dtype t, int *wire) {
    switch (t) {
    case AF_DTYPE_FLOAT:
    case AF_DTYPE_COMPLEX64:
        *wire = AF_PB_FIXED32;
        return TENSOR_FLOAT_DATA;
    case AF_DTYPE_DOUBLE:
    case AF_DTYPE_COMPLEX128:
        *wire = AF_PB_FIXED64;
        return TENSOR_DOUBLE_DATA;
    case AF_DTYPE_INT64:
        *wire = AF_PB_VARINT;
        return TENSOR_INT64_DATA;
    case AF_DTYPE_UINT32:
    case AF_DTYPE_UINT64:
        *wire = AF_PB_VARINT;
        return TENSOR_UINT64_DATA;
    default: /* int32 and narrower integers, bool, and float16/bfloat16 as their bits */
        *wire = AF_PB_VARINT;
        return TENSOR_INT32_DATA;
    }
}

static const char *typed_field_name(int num) {
    switch (num) {
    case TENSOR_FLOAT_DATA:
        return "float_data";
    case TENSOR_INT32_DATA:
        return "int32_data";
    case TENSOR_STRING_DATA:
        return "string_data";
    case TENSOR_INT64_DATA:
        return "int64_data";
    case TENSOR_DOUBLE_DATA:
        return "double_data";
    default:
        return "uint64_data";
    }
}

static const char *type_str(const af_tensor *t, char *buf, size_t len) {
    char dims[160];
    snprintf(buf, len, "%s%s", af_dtype_name(t->dtype), af_dims_str(t, dims, sizeof dims));
    return buf;
}

/* Memory for t->nbytes bytes: the tensor's own, or the arena's. */
static af_status tensor_mem(const imp *c, af_tensor *t, af_error *err) {
    if (c->owning) return af_tensor_alloc(t, err);
    t->data = af_arena_alloc(c->a, t->nbytes);
    return t->data ? AF_OK : nomem(c, err);
}

/* Raw little-endian bytes (raw_data or external data) of exactly t->nbytes. The model's buffer
 * outlives its IR, so aligned bytes are used in place. */
static af_status place_bytes(const imp *c, af_tensor *t, const uint8_t *bytes, af_error *err) {
    size_t align = af_dtype_size(t->dtype);
    if (!c->owning && (uintptr_t)bytes % align == 0) {
        t->data = (void *)bytes; /* read-only mapping: see onnx.h */
        return AF_OK;
    }
    af_status st = tensor_mem(c, t, err);
    if (st == AF_OK && t->nbytes) memcpy(t->data, bytes, t->nbytes);
    return st;
}

/* Decode the typed field `num` (already checked to be the one for t->dtype). */
static af_status decode_typed(const imp *c, const af_pb *msg, const char *name, af_tensor *t,
                              int num, int wire, af_error *err) {
    size_t count, want = (size_t)af_tensor_numel(t), got;
    bool complex = t->dtype == AF_DTYPE_COMPLEX64 || t->dtype == AF_DTYPE_COMPLEX128;
    af_status st =
        af_pb_repeated(msg, (uint32_t)num, wire, typed_field_name(num), NULL, NULL, 0, &count, err);
    if (st) return st;
    if (complex) want *= 2; /* real and imaginary parts; numel * 16 bytes fit, so this does too */
    if (count != want) {
        char ty[200];
        return file_fail(c, err, AF_ERR_INVALID_MODEL,
                         "tensor '%s': %s has %zu values, %s needs %zu", name,
                         typed_field_name(num), count, type_str(t, ty, sizeof ty), want);
    }
    st = tensor_mem(c, t, err);
    if (st) return st;
    sink s = {t->data, af_dtype_size(t->dtype) / (complex ? 2 : 1), t->dtype == AF_DTYPE_BOOL};
    st = af_pb_repeated(msg, (uint32_t)num, wire, typed_field_name(num), put_elem, &s, count, &got,
                        err);
    if (st && c->owning) af_tensor_release(t);
    return st;
}

/* Decode a TensorProto into t (type and data). *name gets its name ("" when absent). */
static af_status read_tensor(const imp *c, const af_pb *msg, af_tensor *t, const char **name,
                             af_error *err) {
    af_pb r = *msg;
    af_pb_field f, raw = {0};
    af_status st = AF_OK;
    int64_t dtype = 0, location = 0;
    bool has_raw = false;
    unsigned typed = 0; /* bit per typed data field present */
    memset(t, 0, sizeof *t);
    *name = "";
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        switch (f.num) {
        case TENSOR_DATA_TYPE:
            st = af_pb_int64(&r, &f, "data_type", &dtype, err);
            break;
        case TENSOR_NAME:
            st = af_pb_str(&r, &f, "name", c->a, name, err);
            break;
        case TENSOR_RAW_DATA:
            st = af_pb_want(&r, &f, AF_PB_LEN, "raw_data", err);
            raw = f;
            has_raw = true;
            break;
        case TENSOR_DATA_LOCATION:
            st = af_pb_int64(&r, &f, "data_location", &location, err);
            break;
        case TENSOR_SEGMENT:
            st = af_pb_fail(&r, err, f.off, AF_ERR_UNSUPPORTED,
                            "segmented tensors are not supported");
            break;
        case TENSOR_FLOAT_DATA:
        case TENSOR_INT32_DATA:
        case TENSOR_STRING_DATA:
        case TENSOR_INT64_DATA:
        case TENSOR_DOUBLE_DATA:
        case TENSOR_UINT64_DATA:
            typed |= 1u << f.num;
            break;
        default:
            break;
        }
    }
    if (st) return st;

    size_t rank;
    st = af_pb_repeated(msg, TENSOR_DIMS, AF_PB_VARINT, "dims", NULL, NULL, 0, &rank, err);
    if (st) return st;
    if (rank > AF_MAX_RANK)
        return file_fail(c, err, AF_ERR_UNSUPPORTED, "tensor '%s': rank %zu (at most %d supported)",
                         *name, rank, AF_MAX_RANK);
    sink dims = {(unsigned char *)t->dims, sizeof t->dims[0], false};
    st = af_pb_repeated(msg, TENSOR_DIMS, AF_PB_VARINT, "dims", put_elem, &dims, rank, &rank, err);
    if (st) return st;
    t->rank = (int)rank;

    if (dtype == AF_DTYPE_STRING || (typed & 1u << TENSOR_STRING_DATA))
        return file_fail(c, err, AF_ERR_UNSUPPORTED,
                         "tensor '%s': string tensors are not supported", *name);
    if (dtype <= 0 || dtype > AF_DTYPE_BFLOAT16 || af_dtype_size((af_dtype)dtype) == 0)
        return file_fail(c, err, dtype == 0 ? AF_ERR_INVALID_MODEL : AF_ERR_UNSUPPORTED,
                         "tensor '%s': data type %lld is not supported", *name, (long long)dtype);
    t->dtype = (af_dtype)dtype;

    int64_t numel = 1, nbytes;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] < 0)
            return file_fail(c, err, AF_ERR_INVALID_MODEL, "tensor '%s': dim %d is negative (%lld)",
                             *name, i, (long long)t->dims[i]);
        if (!af_mul_i64(numel, t->dims[i], &numel))
            return file_fail(c, err, AF_ERR_INVALID_MODEL,
                             "tensor '%s': the product of its dims overflows", *name);
    }
    if (!af_mul_i64(numel, (int64_t)af_dtype_size(t->dtype), &nbytes))
        return file_fail(c, err, AF_ERR_INVALID_MODEL, "tensor '%s': its size in bytes overflows",
                         *name);
    t->nbytes = (size_t)nbytes;

    if (location != 0 && location != 1)
        return file_fail(c, err, AF_ERR_INVALID_MODEL, "tensor '%s': data_location %lld is invalid",
                         *name, (long long)location);
    int sources = has_raw + (location == 1) + __builtin_popcount(typed);
    if (sources > 1)
        return file_fail(c, err, AF_ERR_INVALID_MODEL,
                         "tensor '%s': data given in more than one place (raw_data, typed fields, "
                         "external data)",
                         *name);
    char ty[200];
    if (location == 1) {
        if (!c->m || !c->m->dir)
            return file_fail(c, err, AF_ERR_UNSUPPORTED,
                             "tensor '%s': external data needs a model loaded from a file", *name);
        const uint8_t *bytes;
        st = af_onnx_extdata(c->m, msg, *name, t->nbytes, &bytes, err);
        return st ? st : place_bytes(c, t, bytes, err);
    }
    if (has_raw) {
        if (raw.len != t->nbytes)
            return file_fail(c, err, AF_ERR_INVALID_MODEL,
                             "tensor '%s': raw_data has %zu bytes, %s needs %zu", *name, raw.len,
                             type_str(t, ty, sizeof ty), t->nbytes);
        return place_bytes(c, t, raw.data, err);
    }
    if (typed) {
        int wire, num = typed_field(t->dtype, &wire);
        if (typed != 1u << num)
            return file_fail(c, err, AF_ERR_INVALID_MODEL, "tensor '%s': %s data for a %s tensor",
                             *name, typed_field_name(__builtin_ctz(typed)),
                             af_dtype_name(t->dtype));
        return decode_typed(c, msg, *name, t, num, wire, err);
    }
    if (numel != 0)
        return file_fail(c, err, AF_ERR_INVALID_MODEL, "tensor '%s': %s has no data", *name,
                         type_str(t, ty, sizeof ty));
    return tensor_mem(c, t, err);
}

/* The float16 rule (see imp): half-precision constants of a float32 model become float32. */
static af_status widen_halves(const imp *c, af_tensor *t, af_error *err) {
    if (!c->halves_to_float || (t->dtype != AF_DTYPE_FLOAT16 && t->dtype != AF_DTYPE_BFLOAT16))
        return AF_OK;
    size_t n = t->nbytes / 2;
    float *dst = af_arena_calloc(c->a, n, sizeof(float));
    if (!dst) return nomem(c, err);
    const unsigned char *src = t->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = t->dtype == AF_DTYPE_FLOAT16 ? af_half_to_float(h) : af_bf16_to_float(h);
    }
    t->dtype = AF_DTYPE_FLOAT;
    t->data = dst;
    t->nbytes = n * sizeof(float);
    return AF_OK;
}

/* ---- value types --------------------------------------------------------------------------- */

typedef struct decl {
    af_tensor type;
    const char *dim_param[AF_MAX_RANK];
} decl;

static af_status read_dim(const imp *c, const af_pb *msg, const char *vname, decl *d, int i,
                          af_error *err) {
    af_pb r = *msg;
    af_pb_field f;
    af_status st;
    d->type.dims[i] = -1;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == DIM_VALUE) {
            st = af_pb_int64(&r, &f, "dim_value", &d->type.dims[i], err);
            if (st == AF_OK && d->type.dims[i] < 0)
                return file_fail(c, err, AF_ERR_INVALID_MODEL,
                                 "value '%s': dim %d is negative (%lld)", vname, i,
                                 (long long)d->type.dims[i]);
        } else if (f.num == DIM_PARAM) {
            st = af_pb_str(&r, &f, "dim_param", c->a, &d->dim_param[i], err);
        }
        if (st) return st;
    }
    return st;
}

static af_status read_tensor_type(const imp *c, const af_pb *msg, const char *vname, decl *d,
                                  af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f;
    af_status st = AF_OK;
    int64_t elem = 0;
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == TT_ELEM_TYPE) {
            st = af_pb_int64(&r, &f, "elem_type", &elem, err);
            continue;
        }
        if (f.num != TT_SHAPE) continue;
        int ndims, i = 0;
        af_pb dims;
        st = af_pb_sub(&r, &f, "TensorShapeProto", &dims, err);
        if (st == AF_OK) st = af_pb_count(&dims, SHAPE_DIM, &ndims, err);
        if (st) return st;
        if (ndims > AF_MAX_RANK)
            return file_fail(c, err, AF_ERR_UNSUPPORTED,
                             "value '%s': rank %d (at most %d supported)", vname, ndims,
                             AF_MAX_RANK);
        d->type.rank = ndims;
        memset(d->dim_param, 0, sizeof d->dim_param);
        while ((st = af_pb_next(&dims, &f, err)) == AF_OK && f.num) {
            if (f.num != SHAPE_DIM) continue;
            st = af_pb_sub(&dims, &f, "TensorShapeProto.Dimension", &sub, err);
            if (st == AF_OK) st = read_dim(c, &sub, vname, d, i++, err);
            if (st) return st;
        }
    }
    if (st) return st;
    if (elem == AF_DTYPE_STRING)
        return file_fail(c, err, AF_ERR_UNSUPPORTED, "value '%s': string tensors are not supported",
                         vname);
    if (elem < 0 || elem > AF_DTYPE_BFLOAT16)
        return file_fail(c, err, AF_ERR_UNSUPPORTED,
                         "value '%s': element type %lld is not supported", vname, (long long)elem);
    d->type.dtype = (af_dtype)elem;
    return AF_OK;
}

static af_status read_type(const imp *c, const af_pb *msg, const char *vname, decl *d,
                           af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f;
    af_status st;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        const char *kind = NULL;
        switch (f.num) {
        case TYPE_TENSOR:
            st = af_pb_sub(&r, &f, "TypeProto.Tensor", &sub, err);
            if (st == AF_OK) st = read_tensor_type(c, &sub, vname, d, err);
            break;
        case TYPE_SEQUENCE:
            kind = "sequence";
            break;
        case TYPE_MAP:
            kind = "map";
            break;
        case TYPE_OPAQUE:
            kind = "opaque";
            break;
        case TYPE_SPARSE_TENSOR:
            kind = "sparse tensor";
            break;
        case TYPE_OPTIONAL:
            kind = "optional";
            break;
        default:
            break;
        }
        if (kind)
            return file_fail(c, err, AF_ERR_UNSUPPORTED, "value '%s': %s types are not supported",
                             vname, kind);
        if (st) return st;
    }
    return st;
}

/* A ValueInfoProto: name and declared type (rank -1 when it gives no shape). */
static af_status read_value_info(const imp *c, const af_pb *msg, const char **name, decl *d,
                                 af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f, type = {0};
    af_status st = AF_OK;
    memset(d, 0, sizeof *d);
    d->type.rank = -1;
    *name = "";
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == VI_NAME)
            st = af_pb_str(&r, &f, "name", c->a, name, err);
        else if (f.num == VI_TYPE)
            type = f;
    }
    if (st || !type.num) return st;
    st = af_pb_sub(msg, &type, "TypeProto", &sub, err);
    return st ? st : read_type(c, &sub, *name, d, err);
}

/* Give v the declared type where it knows nothing yet (constants keep their data's type). */
static void apply_decl(af_value *v, const decl *d) {
    if (v->is_const) return;
    if (v->type.dtype == AF_DTYPE_UNDEFINED) v->type.dtype = d->type.dtype;
    if (v->type.rank < 0 && d->type.rank >= 0) {
        v->type.rank = d->type.rank;
        memcpy(v->type.dims, d->type.dims, sizeof v->type.dims);
        memcpy(v->dim_param, d->dim_param, sizeof v->dim_param);
    }
}

/* ---- attributes ---------------------------------------------------------------------------- */

static af_attr_type infer_attr_type(unsigned present) {
    static const struct {
        int field;
        af_attr_type type;
    } order[] = {{ATTR_F, AF_ATTR_FLOAT},         {ATTR_I, AF_ATTR_INT},
                 {ATTR_S, AF_ATTR_STRING},        {ATTR_T, AF_ATTR_TENSOR},
                 {ATTR_G, AF_ATTR_GRAPH},         {ATTR_FLOATS, AF_ATTR_FLOATS},
                 {ATTR_INTS, AF_ATTR_INTS},       {ATTR_STRINGS, AF_ATTR_STRINGS},
                 {ATTR_TENSORS, AF_ATTR_TENSORS}, {ATTR_GRAPHS, AF_ATTR_GRAPHS}};
    for (size_t i = 0; i < AF_COUNT(order); i++)
        if (present & 1u << order[i].field) return order[i].type;
    return AF_ATTR_UNDEFINED;
}

/* A repeated float or int attribute into arena memory of `size` bytes per element. */
static af_status read_numbers(const imp *c, const node_rec *nr, const af_pb *msg, af_attr *at,
                              int num, int wire, size_t size, void **out, af_error *err) {
    size_t n;
    af_status st = af_pb_repeated(msg, (uint32_t)num, wire, at->name, NULL, NULL, 0, &n, err);
    if (st) return st;
    if (n > INT32_MAX)
        return node_fail(c, nr, err, AF_ERR_UNSUPPORTED, "attribute '%s' has too many values",
                         at->name);
    sink s = {af_arena_calloc(c->a, n ? n : 1, size), size, false};
    if (!s.dst) return nomem(c, err);
    st = af_pb_repeated(msg, (uint32_t)num, wire, at->name, put_elem, &s, n, &n, err);
    at->n = (int)n;
    *out = s.dst;
    return st;
}

/* The occurrences of a repeated message/bytes field `num` of the attribute, in order: strings
 * (kind 0), tensors (1) or graphs (2). */
static af_status read_list(const imp *c, af_graph *g, const af_pb *msg, af_attr *at, int num,
                           int kind, af_error *err) {
    int n, k = 0;
    af_status st = af_pb_count(msg, (uint32_t)num, &n, err);
    if (st) return st;
    void **items = af_arena_calloc(c->a, (size_t)n + 1, sizeof(void *));
    if (!items) return nomem(c, err);
    af_pb r = *msg, sub;
    af_pb_field f;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != (uint32_t)num) continue;
        const char *tname;
        if (kind == 0) {
            st = af_pb_want(&r, &f, AF_PB_LEN, at->name, err);
            if (st == AF_OK && !(items[k] = af_arena_strndup(c->a, (const char *)f.data, f.len)))
                st = nomem(c, err);
        } else if (kind == 1) {
            st = af_pb_sub(&r, &f, "TensorProto", &sub, err);
            if (st == AF_OK && !(items[k] = af_arena_alloc(c->a, sizeof(af_tensor))))
                st = nomem(c, err);
            if (st == AF_OK) st = read_tensor(c, &sub, items[k], &tname, err);
        } else {
            st = af_pb_sub(&r, &f, "GraphProto", &sub, err);
            if (st == AF_OK) st = import_graph(c, &sub, g, (af_graph **)&items[k], err);
        }
        if (st) return st;
        k++;
    }
    at->n = k;
    if (kind == 0)
        at->strings = (const char **)items;
    else if (kind == 1)
        at->tensors = (af_tensor **)items;
    else
        at->graphs = (af_graph **)items;
    return st;
}

static af_status fn_attr(const imp *c, const node_rec *nr, af_graph *g, const char *ref,
                         af_attr *at, bool *omit, af_error *err);

/* One AttributeProto of node nr into at; *omit when it refers to an attribute of the calling
 * function's that the call does not give and that has no default (the body's op then sees it
 * absent, as ONNX defines). */
static af_status read_attr(const imp *c, const node_rec *nr, af_graph *g, const af_pb *msg,
                           af_attr *at, bool *omit, af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f, tf = {0}, gf = {0};
    af_status st = AF_OK;
    int64_t type = 0;
    unsigned present = 0;
    const char *ref = NULL, *tname;
    at->name = "";
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num < 32) present |= 1u << f.num;
        switch (f.num) {
        case ATTR_NAME:
            st = af_pb_str(&r, &f, "name", c->a, &at->name, err);
            break;
        case ATTR_TYPE:
            st = af_pb_int64(&r, &f, "type", &type, err);
            break;
        case ATTR_REF_ATTR_NAME:
            st = af_pb_str(&r, &f, "ref_attr_name", c->a, &ref, err);
            break;
        case ATTR_F:
            st = af_pb_float(&r, &f, "f", &at->f, err);
            break;
        case ATTR_I:
            st = af_pb_int64(&r, &f, "i", &at->i, err);
            break;
        case ATTR_S:
            st = af_pb_want(&r, &f, AF_PB_LEN, "s", err);
            at->slen = f.len;
            if (st == AF_OK && !(at->s = af_arena_strndup(c->a, (const char *)f.data, f.len)))
                st = nomem(c, err);
            break;
        case ATTR_T:
            tf = f;
            break;
        case ATTR_G:
            gf = f;
            break;
        default:
            break;
        }
    }
    if (st) return st;
    if (!*at->name) return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "an attribute has no name");
    if (ref) return fn_attr(c, nr, g, ref, at, omit, err);
    if (type < 0 || type > AF_ATTR_TYPE_PROTOS)
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "attribute '%s' has invalid type %lld",
                         at->name, (long long)type);
    at->type = type ? (af_attr_type)type : infer_attr_type(present);
    switch (at->type) {
    case AF_ATTR_FLOAT:
    case AF_ATTR_INT:
        return AF_OK;
    case AF_ATTR_STRING:
        if (!at->s && !(at->s = af_arena_strdup(c->a, ""))) return nomem(c, err);
        return AF_OK;
    case AF_ATTR_TENSOR:
        if (!tf.num)
            return node_fail(c, nr, err, AF_ERR_INVALID_MODEL,
                             "tensor attribute '%s' has no tensor", at->name);
        st = af_pb_sub(msg, &tf, "TensorProto", &sub, err);
        if (st == AF_OK && !(at->t = af_arena_alloc(c->a, sizeof *at->t))) st = nomem(c, err);
        return st ? st : read_tensor(c, &sub, at->t, &tname, err);
    case AF_ATTR_GRAPH:
    case AF_ATTR_GRAPHS:
        if (nr->frame) /* its names would need the call's renaming too */
            return node_fail(c, nr, err, AF_ERR_UNSUPPORTED,
                             "a subgraph (attribute '%s') inside function '%s' is not supported",
                             at->name, nr->frame->fn->name);
        if (at->type == AF_ATTR_GRAPHS)
            return read_list(c, g, msg, at, ATTR_GRAPHS, 2, err);
        if (!gf.num)
            return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "graph attribute '%s' has no graph",
                             at->name);
        st = af_pb_sub(msg, &gf, "GraphProto", &sub, err);
        return st ? st : import_graph(c, &sub, g, &at->g, err);
    case AF_ATTR_FLOATS:
        return read_numbers(c, nr, msg, at, ATTR_FLOATS, AF_PB_FIXED32, sizeof(float),
                            (void **)&at->floats, err);
    case AF_ATTR_INTS:
        return read_numbers(c, nr, msg, at, ATTR_INTS, AF_PB_VARINT, sizeof(int64_t),
                            (void **)&at->ints, err);
    case AF_ATTR_STRINGS:
        return read_list(c, g, msg, at, ATTR_STRINGS, 0, err);
    case AF_ATTR_TENSORS:
        return read_list(c, g, msg, at, ATTR_TENSORS, 1, err);
    case AF_ATTR_SPARSE_TENSOR:
    case AF_ATTR_SPARSE_TENSORS:
    case AF_ATTR_TYPE_PROTO:
    case AF_ATTR_TYPE_PROTOS:
        return node_fail(c, nr, err, AF_ERR_UNSUPPORTED,
                         "attribute '%s' has type %lld (sparse tensor or type proto), which is "
                         "not supported",
                         at->name, (long long)type);
    default: /* AF_ATTR_UNDEFINED: neither a type nor a value */
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "attribute '%s' has no type",
                         at->name);
    }
}

static af_status read_attrs(const imp *c, const node_rec *nr, af_graph *g, af_attr **out, int *nout,
                            af_error *err) {
    int n, k = 0;
    af_status st = af_pb_count(&nr->msg, NODE_ATTRIBUTE, &n, err);
    if (st) return st;
    af_attr *attrs = af_arena_calloc(c->a, (size_t)n + 1, sizeof *attrs);
    if (!attrs) return nomem(c, err);
    af_pb r = nr->msg, sub;
    af_pb_field f;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != NODE_ATTRIBUTE) continue;
        bool omit = false;
        memset(&attrs[k], 0, sizeof attrs[k]);
        st = af_pb_sub(&r, &f, "AttributeProto", &sub, err);
        if (st == AF_OK) st = read_attr(c, nr, g, &sub, &attrs[k], &omit, err);
        if (st) return st;
        if (omit) continue;
        for (int j = 0; j < k; j++)
            if (!strcmp(attrs[j].name, attrs[k].name))
                return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "attribute '%s' given twice",
                                 attrs[k].name);
        k++;
    }
    *out = attrs;
    *nout = k;
    return st;
}

/* ---- model-local functions ------------------------------------------------------------------ */

static bool is_default_domain(const char *d) {
    return !*d || !strcmp(d, "ai.onnx");
}

static af_status read_opset(const imp *c, const af_pb *msg, af_opset *op, af_error *err);

static af_status read_function(const imp *c, const af_pb *msg, fn_def *fn, af_error *err) {
    int nin, nout;
    af_status st = af_pb_count(msg, FN_INPUT, &nin, err);
    if (!st) st = af_pb_count(msg, FN_OUTPUT, &nout, err);
    if (st) return st;
    *fn = (fn_def){.domain = "", .name = "", .overload = "", .msg = *msg, .onnx_version = -1};
    fn->in = af_arena_calloc(c->a, (size_t)nin + 1, sizeof *fn->in);
    fn->out = af_arena_calloc(c->a, (size_t)nout + 1, sizeof *fn->out);
    if (!fn->in || !fn->out) return nomem(c, err);
    af_pb r = *msg, sub;
    af_pb_field f;
    af_opset op;
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        switch (f.num) {
        case FN_NAME: st = af_pb_str(&r, &f, "name", c->a, &fn->name, err); break;
        case FN_DOMAIN: st = af_pb_str(&r, &f, "domain", c->a, &fn->domain, err); break;
        case FN_OVERLOAD: st = af_pb_str(&r, &f, "overload", c->a, &fn->overload, err); break;
        case FN_INPUT: st = af_pb_str(&r, &f, "input", c->a, &fn->in[fn->nin++], err); break;
        case FN_OUTPUT: st = af_pb_str(&r, &f, "output", c->a, &fn->out[fn->nout++], err); break;
        case FN_OPSET_IMPORT:
            st = af_pb_sub(&r, &f, "OperatorSetIdProto", &sub, err);
            if (!st) st = read_opset(c, &sub, &op, err);
            if (!st && is_default_domain(op.domain)) fn->onnx_version = op.version;
            break;
        default: break;
        }
    }
    if (!st && !*fn->name) return file_fail(c, err, AF_ERR_INVALID_MODEL, "a function has no name");
    return st;
}

static const fn_def *find_fn(const imp *c, const char *domain, const char *name,
                             const char *overload) {
    for (int i = 0; i < c->nfns; i++)
        if (!strcmp(c->fns[i].domain, domain) && !strcmp(c->fns[i].name, name) &&
            !strcmp(c->fns[i].overload, overload))
            return &c->fns[i];
    return NULL;
}

static const char *joined(const imp *c, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = af_arena_alloc(c->a, la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

/* A value name as node nr writes it: in a function body, a formal input or output is the
 * caller's name for it, and any other name gets the call's prefix (NULL: out of memory). */
static const char *map_name(const imp *c, const node_rec *nr, const char *name) {
    const fn_frame *fr = nr->frame;
    if (!fr || !*name) return name;
    for (int i = 0; i < fr->fn->nin; i++)
        if (!strcmp(fr->fn->in[i], name)) return fr->in[i];
    for (int i = 0; i < fr->fn->nout; i++)
        if (!strcmp(fr->fn->out[i], name) && *fr->out[i]) return fr->out[i];
    return joined(c, fr->prefix, name);
}

/* A body attribute that refers to the function's attribute `ref`: the caller's value, else the
 * function's default (attribute_proto), else absent. */
static af_status fn_attr(const imp *c, const node_rec *nr, af_graph *g, const char *ref,
                         af_attr *at, bool *omit, af_error *err) {
    const fn_frame *fr = nr->frame;
    const char *name = at->name;
    if (!fr)
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL,
                         "attribute '%s' refers to '%s' outside a function", name, ref);
    for (int i = 0; i < fr->nattrs; i++)
        if (!strcmp(fr->attrs[i].name, ref)) {
            *at = fr->attrs[i];
            at->name = name;
            return AF_OK;
        }
    node_rec plain = *nr; /* a default is a value, never a reference */
    plain.frame = NULL;
    af_pb r = fr->fn->msg, sub;
    af_pb_field f;
    af_status st;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != FN_ATTRIBUTE_PROTO) continue;
        af_attr d = {0};
        bool o = false;
        st = af_pb_sub(&r, &f, "AttributeProto", &sub, err);
        if (!st) st = read_attr(c, &plain, g, &sub, &d, &o, err);
        if (st) return st;
        if (!strcmp(d.name, ref)) {
            *at = d;
            at->name = name;
            return AF_OK;
        }
    }
    *omit = !st;
    return st;
}

/* ---- nodes --------------------------------------------------------------------------------- */

/* Phase 1: read the node's header, create its af_node (or its constant value) and declare its
 * outputs. */
static af_status declare_node(const imp *c, af_graph *g, scope *s, node_rec *nr, int index,
                              af_error *err) {
    af_pb r = nr->msg;
    af_pb_field f;
    af_status st = AF_OK;
    int nin = 0, nout = 0;
    char label[32];
    const char *overload = "";
    nr->name = nr->op_type = nr->domain = "";
    snprintf(label, sizeof label, "#%d", index);
    nr->label = af_arena_strdup(c->a, label);
    if (!nr->label) return nomem(c, err);
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        switch (f.num) {
        case NODE_NAME:
            st = af_pb_str(&r, &f, "name", c->a, &nr->name, err);
            break;
        case NODE_OP_TYPE:
            st = af_pb_str(&r, &f, "op_type", c->a, &nr->op_type, err);
            break;
        case NODE_DOMAIN:
            st = af_pb_str(&r, &f, "domain", c->a, &nr->domain, err);
            break;
        case NODE_OVERLOAD:
            st = af_pb_str(&r, &f, "overload", c->a, &overload, err);
            break;
        case NODE_INPUT:
            st = af_pb_want(&r, &f, AF_PB_LEN, "input", err);
            nin++;
            break;
        case NODE_OUTPUT:
            st = af_pb_want(&r, &f, AF_PB_LEN, "output", err);
            nout++;
            break;
        default:
            break;
        }
    }
    if (st) return st;
    if (nr->frame && !(nr->name = joined(c, nr->frame->prefix, *nr->name ? nr->name : nr->label)))
        return nomem(c, err);
    if (*nr->name) nr->label = nr->name;
    if (!*nr->op_type) return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "no op_type");
    if ((nr->call = find_fn(c, nr->domain, nr->op_type, overload)))
        return AF_OK; /* its body's nodes declare the outputs */

    if (is_default_domain(nr->domain) && !c->has_onnx_opset)
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "the model imports no ai.onnx opset");
    if (is_default_domain(nr->domain) && !strcmp(nr->op_type, "Constant")) {
        if (nin != 0 || nout != 1)
            return node_fail(c, nr, err, AF_ERR_INVALID_MODEL,
                             "a Constant has no inputs and one output, not %d and %d", nin, nout);
    } else {
        af_op op = af_op_lookup(nr->domain, nr->op_type);
        bool onnx = !*nr->domain || !strcmp(nr->domain, "ai.onnx");
        if (op == AF_OP_COUNT)
            return node_fail(c, nr, err, AF_ERR_UNSUPPORTED,
                             "op '%s' of domain '%s' is not supported%s", nr->op_type,
                             onnx ? "ai.onnx" : nr->domain,
                             onnx ? "" : " (a custom op: give its plugin with --plugin or "
                                         "AUTOFUSION_PLUGINS)");
        nr->node = af_node_new(g, op, nr->name, nin, nout);
        if (!nr->node) return nomem(c, err);
        nr->node->op_type = nr->op_type;
        nr->node->domain = nr->domain;
        nr->label = nr->node->name;
    }

    int k = 0;
    r = nr->msg;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != NODE_OUTPUT) continue;
        const char *name;
        af_value *v;
        st = af_pb_str(&r, &f, "output", c->a, &name, err);
        if (st) return st;
        if (!(name = map_name(c, nr, name))) return nomem(c, err);
        if (!*name) { /* an omitted optional output */
            if (!nr->node) return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "output has no name");
            k++;
            continue;
        }
        if (scope_get(s, name))
            return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "value '%s' produced twice", name);
        st = declare(c, g, s, name, &v, err);
        if (st) return st;
        if (nr->node)
            af_node_set_output(nr->node, k, v);
        else
            nr->konst = v;
        k++;
    }
    return st;
}

/* Phase 2 of a Constant: its one attribute becomes the value's data. */
static af_status define_constant(const imp *c, af_graph *g, node_rec *nr, af_error *err) {
    af_attr *attrs;
    int n;
    af_status st = read_attrs(c, nr, g, &attrs, &n, err);
    if (st) return st;
    if (n != 1)
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "needs exactly one attribute, has %d",
                         n);
    const af_attr *at = &attrs[0];
    af_tensor *t = &nr->konst->type;
    const char *a = at->name;
    memset(t, 0, sizeof *t);
    nr->konst->is_const = true;
    if (!strcmp(a, "value") && at->type == AF_ATTR_TENSOR) {
        *t = *at->t;
        return widen_halves(c, t, err);
    }
    bool scalar = !strcmp(a, "value_float") || !strcmp(a, "value_int");
    if ((!strcmp(a, "value_float") && at->type == AF_ATTR_FLOAT) ||
        (!strcmp(a, "value_floats") && at->type == AF_ATTR_FLOATS)) {
        t->dtype = AF_DTYPE_FLOAT;
    } else if ((!strcmp(a, "value_int") && at->type == AF_ATTR_INT) ||
               (!strcmp(a, "value_ints") && at->type == AF_ATTR_INTS)) {
        t->dtype = AF_DTYPE_INT64;
    } else if (!strcmp(a, "value_string") || !strcmp(a, "value_strings") ||
               !strcmp(a, "sparse_value")) {
        return node_fail(c, nr, err, AF_ERR_UNSUPPORTED, "attribute '%s' is not supported", a);
    } else {
        return node_fail(c, nr, err, AF_ERR_INVALID_MODEL, "invalid attribute '%s' (type %d)", a,
                         (int)at->type);
    }
    size_t count = scalar ? 1 : (size_t)at->n, size = af_dtype_size(t->dtype);
    t->rank = scalar ? 0 : 1;
    t->dims[0] = scalar ? 0 : at->n;
    t->nbytes = count * size;
    t->data = af_arena_alloc(c->a, t->nbytes);
    if (!t->data) return nomem(c, err);
    if (t->dtype == AF_DTYPE_FLOAT)
        memcpy(t->data, scalar ? &at->f : at->floats, t->nbytes);
    else
        memcpy(t->data, scalar ? &at->i : at->ints, t->nbytes);
    return AF_OK;
}

/* Phase 2 of an op node: attributes (subgraphs see every value declared so far) and inputs. */
static af_status define_node(const imp *c, af_graph *g, const scope *s, node_rec *nr,
                             af_error *err) {
    af_node *n = nr->node;
    af_status st = read_attrs(c, nr, g, &n->attrs, &n->nattrs, err);
    if (st) return st;
    af_pb r = nr->msg;
    af_pb_field f;
    int k = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != NODE_INPUT) continue;
        const char *name;
        st = af_pb_str(&r, &f, "input", c->a, &name, err);
        if (st) return st;
        if (!(name = map_name(c, nr, name))) return nomem(c, err);
        if (*name) { /* "" is an omitted optional input */
            af_value *v = resolve(g, s, name);
            if (!v)
                return node_fail(c, nr, err, AF_ERR_INVALID_MODEL,
                                 "reads '%s', which nothing produces", name);
            af_node_set_input(n, k, v);
        }
        k++;
    }
    return st;
}

/* The node records of one graph: its nodes, and the bodies of the functions they call, inlined
 * where the call stands. */
typedef struct rec_list {
    node_rec *v;
    int n, cap;
} rec_list;

static af_status add_node(const imp *c, af_graph *g, scope *s, rec_list *l, const af_pb *msg,
                          const fn_frame *frame, int index, af_error *err);

/* The actual names of a call's inputs or outputs (field num) for the function's nformal ones. */
static af_status call_names(const imp *c, const node_rec *call, uint32_t num, int nformal,
                            const char ***out, af_error *err) {
    const char **names = af_arena_calloc(c->a, (size_t)nformal + 1, sizeof *names);
    if (!names) return nomem(c, err);
    for (int i = 0; i < nformal; i++) names[i] = "";
    af_pb r = call->msg;
    af_pb_field f;
    af_status st;
    int k = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != num) continue;
        if (k >= nformal)
            return node_fail(c, call, err, AF_ERR_INVALID_MODEL, "more %s than function '%s' has",
                             num == NODE_INPUT ? "inputs" : "outputs", call->call->name);
        const char *name;
        if ((st = af_pb_str(&r, &f, "name", c->a, &name, err))) return st;
        if (!(names[k++] = map_name(c, call, name))) return nomem(c, err);
    }
    *out = names;
    return st;
}

/* Inline the call l->v[at]: its frame, then each body node as a node of g. */
static af_status expand_call(const imp *c, af_graph *g, scope *s, rec_list *l, int at,
                             af_error *err) {
    node_rec call = l->v[at]; /* a copy: adding nodes moves the list */
    const fn_def *fn = call.call;
    int depth = call.frame ? call.frame->depth + 1 : 1;
    int64_t onnx = af_graph_opset(g);
    if (depth > FN_MAX_DEPTH)
        return node_fail(c, &call, err, AF_ERR_UNSUPPORTED,
                         "calls to function '%s' nest deeper than %d", fn->name, FN_MAX_DEPTH);
    if (fn->onnx_version >= 0 && fn->onnx_version != onnx)
        return node_fail(c, &call, err, AF_ERR_UNSUPPORTED,
                         "function '%s' imports ai.onnx %lld, the model %lld", fn->name,
                         (long long)fn->onnx_version, (long long)onnx);
    fn_frame *fr = af_arena_calloc(c->a, 1, sizeof *fr);
    if (!fr || !(fr->prefix = joined(c, call.label, "/"))) return nomem(c, err);
    fr->fn = fn;
    fr->depth = depth;
    af_attr *attrs;
    af_status st = call_names(c, &call, NODE_INPUT, fn->nin, &fr->in, err);
    if (!st) st = call_names(c, &call, NODE_OUTPUT, fn->nout, &fr->out, err);
    if (!st) st = read_attrs(c, &call, g, &attrs, &fr->nattrs, err);
    if (st) return st;
    fr->attrs = attrs;
    af_pb r = fn->msg, sub;
    af_pb_field f;
    int k = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != FN_NODE) continue;
        st = af_pb_sub(&r, &f, "NodeProto", &sub, err);
        if (!st) st = add_node(c, g, s, l, &sub, fr, k++, err);
        if (st) return st;
    }
    return st;
}

/* Phase 1 of one NodeProto (and of the body it calls). */
static af_status add_node(const imp *c, af_graph *g, scope *s, rec_list *l, const af_pb *msg,
                          const fn_frame *frame, int index, af_error *err) {
    if (frame && l->n >= FN_MAX_NODES)
        return node_fail(c, &(node_rec){.label = frame->prefix, .op_type = frame->fn->name}, err,
                         AF_ERR_UNSUPPORTED, "inlined functions give more than %d nodes",
                         FN_MAX_NODES);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        node_rec *v = af_realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return nomem(c, err);
        l->v = v;
        l->cap = cap;
    }
    int at = l->n++;
    l->v[at] = (node_rec){.msg = *msg, .frame = frame};
    af_status st = declare_node(c, g, s, &l->v[at], index, err);
    return !st && l->v[at].call ? expand_call(c, g, s, l, at, err) : st;
}

static af_status import_nodes(const imp *c, const af_pb *msg, af_graph *g, scope *s,
                              af_error *err) {
    rec_list l = {0};
    af_pb r = *msg, sub;
    af_pb_field f;
    af_status st;
    int k = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != GRAPH_NODE) continue;
        st = af_pb_sub(&r, &f, "NodeProto", &sub, err);
        if (st == AF_OK) st = add_node(c, g, s, &l, &sub, NULL, k++, err);
        if (st) goto fail;
    }
    for (int i = 0; i < l.n && st == AF_OK; i++)
        if (!l.v[i].call)
            st = l.v[i].node ? define_node(c, g, s, &l.v[i], err)
                             : define_constant(c, g, &l.v[i], err);
fail:
    af_free(l.v);
    return st;
}

/* ---- graphs -------------------------------------------------------------------------------- */

static af_status import_inputs(const imp *c, const af_pb *msg, af_graph *g, scope *s,
                               af_error *err) {
    int n;
    af_status st = af_pb_count(msg, GRAPH_INPUT, &n, err);
    if (st) return st;
    g->inputs = af_arena_calloc(c->a, (size_t)n + 1, sizeof(af_value *));
    if (!g->inputs) return nomem(c, err);
    af_pb r = *msg, sub;
    af_pb_field f;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == GRAPH_SPARSE_INITIALIZER)
            return af_pb_fail(&r, err, f.off, AF_ERR_UNSUPPORTED,
                              "sparse initializers are not supported");
        if (f.num == GRAPH_NAME && (st = af_pb_str(&r, &f, "name", c->a, &g->name, err))) return st;
        if (f.num != GRAPH_INPUT) continue;
        const char *name;
        decl d;
        af_value *v;
        st = af_pb_sub(&r, &f, "ValueInfoProto", &sub, err);
        if (st == AF_OK) st = read_value_info(c, &sub, &name, &d, err);
        if (st) return st;
        if (!*name)
            return file_fail(c, err, AF_ERR_INVALID_MODEL, "graph '%s': an input has no name",
                             g->name ? g->name : "");
        if (scope_get(s, name))
            return file_fail(c, err, AF_ERR_INVALID_MODEL, "graph input '%s' declared twice", name);
        st = declare(c, g, s, name, &v, err);
        if (st) return st;
        apply_decl(v, &d);
        v->is_input = true;
        g->inputs[g->ninputs++] = v;
    }
    return st;
}

static bool same_type(const af_tensor *declared, const af_tensor *t) {
    if (declared->dtype != AF_DTYPE_UNDEFINED && declared->dtype != t->dtype) return false;
    if (declared->rank < 0) return true;
    if (declared->rank != t->rank) return false;
    for (int i = 0; i < t->rank; i++)
        if (declared->dims[i] >= 0 && declared->dims[i] != t->dims[i]) return false;
    return true;
}

static af_status import_initializers(const imp *c, const af_pb *msg, af_graph *g, scope *s,
                                     af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f;
    af_status st;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != GRAPH_INITIALIZER) continue;
        const char *name;
        af_tensor t;
        st = af_pb_sub(&r, &f, "TensorProto", &sub, err);
        if (st == AF_OK) st = read_tensor(c, &sub, &t, &name, err);
        if (st == AF_OK) st = widen_halves(c, &t, err);
        if (st) return st;
        if (!*name) return file_fail(c, err, AF_ERR_INVALID_MODEL, "an initializer has no name");
        af_value *v = scope_get(s, name);
        if (v && (!v->is_input || v->is_const))
            return file_fail(c, err, AF_ERR_INVALID_MODEL, "initializer '%s' defined twice", name);
        if (v && !same_type(&v->type, &t)) {
            char a[200], b[200];
            return file_fail(c, err, AF_ERR_INVALID_MODEL,
                             "initializer '%s' is %s but the graph input declares %s", name,
                             type_str(&t, a, sizeof a), type_str(&v->type, b, sizeof b));
        }
        /* An initializer named like a graph input is that input's default value. */
        if (!v && (st = declare(c, g, s, name, &v, err))) return st;
        v->type = t;
        memset(v->dim_param, 0, sizeof v->dim_param);
        v->is_const = true;
    }
    return st;
}

static af_status import_outputs(const imp *c, const af_pb *msg, af_graph *g, const scope *s,
                                af_error *err) {
    int n;
    af_status st = af_pb_count(msg, GRAPH_OUTPUT, &n, err);
    if (st) return st;
    g->outputs = af_arena_calloc(c->a, (size_t)n + 1, sizeof(af_value *));
    if (!g->outputs) return nomem(c, err);
    af_pb r = *msg, sub;
    af_pb_field f;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != GRAPH_OUTPUT && f.num != GRAPH_VALUE_INFO) continue;
        const char *name;
        decl d;
        st = af_pb_sub(&r, &f, "ValueInfoProto", &sub, err);
        if (st == AF_OK) st = read_value_info(c, &sub, &name, &d, err);
        if (st) return st;
        if (f.num == GRAPH_VALUE_INFO) { /* types of intermediate values, when known */
            af_value *v = scope_get(s, name);
            if (v) apply_decl(v, &d);
            continue;
        }
        af_value *v = *name ? resolve(g, s, name) : NULL;
        if (!v)
            return file_fail(c, err, AF_ERR_INVALID_MODEL,
                             "graph output '%s' is not produced by any node, input or initializer",
                             name);
        if (v->graph == g) { /* a subgraph may pass an outer value through unchanged */
            v->is_output = true;
            apply_decl(v, &d);
        }
        g->outputs[g->noutputs++] = v;
    }
    return st;
}

static af_status import_graph(const imp *c, const af_pb *msg, af_graph *parent, af_graph **out,
                              af_error *err) {
    scope s = {0};
    af_status st;
    af_graph *g = af_graph_new(c->a, c->file, parent);
    if (!g) return nomem(c, err);
    if (!parent) {
        g->opsets = c->opsets;
        g->nopsets = c->nopsets;
    }
    g->name = "";
    st = import_inputs(c, msg, g, &s, err);
    if (st == AF_OK) st = import_initializers(c, msg, g, &s, err);
    if (st == AF_OK) st = import_nodes(c, msg, g, &s, err);
    if (st == AF_OK) st = import_outputs(c, msg, g, &s, err);
    if (st == AF_OK) st = af_graph_toposort(g, err);
    af_free(s.slots);
    *out = g;
    return st;
}

/* ---- models -------------------------------------------------------------------------------- */

/* Does the main graph declare a float16/bfloat16 input or output? (the float16 rule, see imp) */
static af_status has_half_io(const imp *c, const af_pb *graph, bool *half, af_error *err) {
    af_pb r = *graph, sub;
    af_pb_field f;
    af_status st;
    *half = false;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != GRAPH_INPUT && f.num != GRAPH_OUTPUT) continue;
        const char *name;
        decl d;
        st = af_pb_sub(&r, &f, "ValueInfoProto", &sub, err);
        if (st == AF_OK) st = read_value_info(c, &sub, &name, &d, err);
        if (st) return st;
        *half |= d.type.dtype == AF_DTYPE_FLOAT16 || d.type.dtype == AF_DTYPE_BFLOAT16;
    }
    return st;
}

static af_status read_opset(const imp *c, const af_pb *msg, af_opset *op, af_error *err) {
    af_pb r = *msg;
    af_pb_field f;
    af_status st = AF_OK;
    op->domain = "";
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == OPSET_DOMAIN)
            st = af_pb_str(&r, &f, "domain", c->a, &op->domain, err);
        else if (f.num == OPSET_VERSION)
            st = af_pb_int64(&r, &f, "version", &op->version, err);
    }
    return st;
}

/* The ai.onnx opset may be imported once, within the versions our kernels implement (a model
 * without it may not use its ops). Other domains are fine as long as no node uses them
 * (declare_node rejects such nodes). */
static af_status check_opsets(imp *c, af_error *err) {
    const af_opset *ai = NULL;
    for (int i = 0; i < c->nopsets; i++) {
        if (!is_default_domain(c->opsets[i].domain)) continue;
        if (ai) return file_fail(c, err, AF_ERR_INVALID_MODEL, "opset_import lists ai.onnx twice");
        ai = &c->opsets[i];
    }
    c->has_onnx_opset = ai != NULL;
    if (ai && (ai->version < OPSET_MIN || ai->version > OPSET_MAX))
        return file_fail(c, err, AF_ERR_UNSUPPORTED,
                         "ai.onnx opset %lld is not supported (supported: %d to %d)",
                         (long long)ai->version, OPSET_MIN, OPSET_MAX);
    return AF_OK;
}

/* One metadata_props entry, appended to m->meta (key, value pairs; "" for a missing half). */
static af_status read_metadata(af_model *m, af_pb *r, af_error *err) {
    const char *key = "", *value = "";
    af_pb_field f;
    af_status st;
    while ((st = af_pb_next(r, &f, err)) == AF_OK && f.num) {
        if (f.num == ENTRY_KEY) st = af_pb_str(r, &f, "key", m->arena, &key, err);
        else if (f.num == ENTRY_VALUE) st = af_pb_str(r, &f, "value", m->arena, &value, err);
        if (st) return st;
    }
    if (st) return st;
    const char **grown = af_arena_alloc(m->arena, (size_t)(m->nmeta + 1) * 2 * sizeof *grown);
    if (!grown) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", m->path);
    if (m->nmeta) memcpy(grown, m->meta, (size_t)m->nmeta * 2 * sizeof *grown);
    grown[2 * m->nmeta] = key;
    grown[2 * m->nmeta + 1] = value;
    m->meta = grown;
    m->nmeta++;
    return AF_OK;
}

static af_status import_model(af_model *m, af_error *err) {
    imp c = {.m = m, .a = m->arena, .file = m->path};
    af_pb r, sub;
    af_pb_field f, graph = {0};
    af_status st;
    bool half;
    af_pb_init(&r, m->map, m->map_len, m->path, "ModelProto");
    st = af_pb_count(&r, MODEL_OPSET_IMPORT, &c.nopsets, err);
    if (st) return st;
    c.opsets = af_arena_calloc(m->arena, (size_t)c.nopsets + 1, sizeof(af_opset));
    if (!c.opsets) return nomem(&c, err);
    int nfns;
    st = af_pb_count(&r, MODEL_FUNCTIONS, &nfns, err);
    if (st) return st;
    c.fns = af_arena_calloc(m->arena, (size_t)nfns + 1, sizeof *c.fns);
    if (!c.fns) return nomem(&c, err);
    int k = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        switch (f.num) {
        case MODEL_IR_VERSION:
            st = af_pb_int64(&r, &f, "ir_version", &m->ir_version, err);
            break;
        case MODEL_PRODUCER_NAME:
            st = af_pb_str(&r, &f, "producer_name", m->arena, &m->producer_name, err);
            break;
        case MODEL_PRODUCER_VERSION:
            st = af_pb_str(&r, &f, "producer_version", m->arena, &m->producer_version, err);
            break;
        case MODEL_DOMAIN:
            st = af_pb_str(&r, &f, "domain", m->arena, &m->domain, err);
            break;
        case MODEL_MODEL_VERSION:
            st = af_pb_int64(&r, &f, "model_version", &m->model_version, err);
            break;
        case MODEL_DOC_STRING:
            st = af_pb_str(&r, &f, "doc_string", m->arena, &m->doc_string, err);
            break;
        case MODEL_METADATA_PROPS:
            st = af_pb_sub(&r, &f, "StringStringEntryProto", &sub, err);
            if (st == AF_OK) st = read_metadata(m, &sub, err);
            break;
        case MODEL_GRAPH:
            st = af_pb_want(&r, &f, AF_PB_LEN, "graph", err);
            graph = f;
            break;
        case MODEL_OPSET_IMPORT:
            st = af_pb_sub(&r, &f, "OperatorSetIdProto", &sub, err);
            if (st == AF_OK) st = read_opset(&c, &sub, &c.opsets[k++], err);
            break;
        case MODEL_FUNCTIONS: {
            fn_def *fn = &c.fns[c.nfns];
            st = af_pb_sub(&r, &f, "FunctionProto", &sub, err);
            if (st == AF_OK) st = read_function(&c, &sub, fn, err);
            if (st == AF_OK && find_fn(&c, fn->domain, fn->name, fn->overload))
                st = file_fail(&c, err, AF_ERR_INVALID_MODEL, "function '%s' defined twice",
                               fn->name);
            c.nfns++;
            break;
        }
        default:
            break;
        }
        if (st) return st;
    }
    if (st) return st;
    if (!graph.num) return file_fail(&c, err, AF_ERR_INVALID_MODEL, "the model has no graph");
    st = check_opsets(&c, err);
    if (st == AF_OK) st = af_pb_sub(&r, &graph, "GraphProto", &sub, err);
    if (st == AF_OK) st = has_half_io(&c, &sub, &half, err);
    if (st) return st;
    c.halves_to_float = !half;
    st = import_graph(&c, &sub, NULL, &m->graph, err);
    return st;
}

/* A model with its arena and names, no bytes yet. */
static af_model *model_new(const char *path) {
    af_model *m = af_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->arena = af_arena_new();
    if (!m->arena || !(m->path = af_arena_strdup(m->arena, path))) {
        af_arena_free(m->arena);
        af_free(m);
        return NULL;
    }
    m->producer_name = m->producer_version = m->domain = m->doc_string = "";
    return m;
}

/* The model's folder, resolved, for external data. */
static af_status model_dir(af_model *m, const char *path, af_error *err) {
    const char *slash = strrchr(path, '/');
    char *dir = NULL, *real = NULL;
    if (!slash)
        dir = af_arena_strdup(m->arena, ".");
    else
        dir = af_arena_strndup(m->arena, path, slash == path ? 1 : (size_t)(slash - path));
    if (!dir) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    real = realpath(dir, NULL);
    if (!real)
        return af_fail(err, AF_ERR_IO, "%s: cannot resolve the model's folder: %s", path,
                       strerror(errno));
    m->dir = af_arena_strdup(m->arena, real);
    af_free(real);
    return m->dir ? AF_OK : af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
}

af_status af_model_load(const char *path, af_model **out, af_error *err) {
    af_status st = AF_OK;
    struct stat sb;
    int fd = -1;
    af_model *m = model_new(path);
    *out = NULL;
    if (!m) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0) {
        st = af_fail(err, AF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = af_fail(err, AF_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    if (sb.st_size > 0) {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            st = af_fail(err, AF_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
            goto fail;
        }
        m->map = map;
        m->map_len = (size_t)sb.st_size;
        m->map_is_mmap = true;
    }
    st = model_dir(m, path, err);
    if (st == AF_OK) st = import_model(m, err);
fail:
    if (fd >= 0) close(fd);
    if (st) {
        af_model_free(m);
        return st;
    }
    *out = m;
    return AF_OK;
}

af_status af_model_load_bytes(const void *bytes, size_t len, const char *name, af_model **out,
                              af_error *err) {
    af_status st;
    af_model *m = model_new(name ? name : "<bytes>");
    *out = NULL;
    if (!m) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", name ? name : "<bytes>");
    m->map = af_malloc(len ? len : 1);
    if (!m->map) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory copying %zu bytes", m->path, len);
        goto fail;
    }
    if (len) memcpy(m->map, bytes, len);
    m->map_len = len;
    st = import_model(m, err);
fail:
    if (st) {
        af_model_free(m);
        return st;
    }
    *out = m;
    return AF_OK;
}

void af_model_free(af_model *m) {
    if (!m) return;
    af_onnx_extdata_close(m);
    if (m->map_is_mmap)
        munmap(m->map, m->map_len);
    else
        af_free(m->map);
    af_arena_free(m->arena);
    af_free(m);
}

af_status af_tensor_load_pb(const char *path, af_tensor *out, char **name_out, af_error *err) {
    unsigned char *buf;
    size_t len;
    const char *name;
    memset(out, 0, sizeof *out);
    if (name_out) *name_out = NULL;
    if (af_read_file(path, &buf, &len) != 0)
        return af_fail(err, AF_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    imp c = {.a = af_arena_new(), .file = path, .owning = true};
    af_status st = c.a ? AF_OK : af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    af_pb r;
    af_pb_init(&r, buf, len, path, "TensorProto");
    if (st == AF_OK) st = read_tensor(&c, &r, out, &name, err);
    if (st == AF_OK && name_out && *name && !(*name_out = af_strdup(name))) {
        af_tensor_release(out);
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    }
    af_arena_free(c.a);
    af_free(buf);
    return st;
}
