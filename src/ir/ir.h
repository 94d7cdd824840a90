/* The intermediate representation: values, nodes, graphs, attributes and the op table.
 *
 * Invariants (checked by af_graph_verify):
 *  - every value has at most one producer; its `uses` list names every (node, input slot) that
 *    reads it, and nothing else;
 *  - graph->nodes is in topological order: a node only reads graph inputs, constants, values of
 *    an enclosing graph, or outputs of nodes before it;
 *  - a subgraph (If/Loop/Scan body) may read values of its enclosing graphs; those values belong
 *    to the enclosing graph (value->graph) and are listed in the subgraph's `captures`.
 * All IR memory comes from one arena per model (af_arena) and is released with it.
 */
#ifndef AF_IR_H
#define AF_IR_H

#include "autofusion.h"
#include "util/util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct af_graph af_graph;
typedef struct af_node af_node;
typedef struct af_value af_value;
typedef struct af_symtab af_symtab;

/* ---- op table ---------------------------------------------------------------------------- */

/* Op classes (TVM's lattice): how an op may join a fused group. */
typedef enum af_op_class {
    AF_CLASS_ELEMWISE,    /* out[i] = f(in[i]) */
    AF_CLASS_BROADCAST,   /* elementwise with numpy broadcasting */
    AF_CLASS_INJECTIVE,   /* each output element reads one input element (reshape, transpose..) */
    AF_CLASS_REDUCE,      /* reductions, softmax, normalisations */
    AF_CLASS_OUT_FUSABLE, /* conv, gemm, matmul, pooling: can absorb an elementwise epilogue */
    AF_CLASS_OPAQUE       /* everything else */
} af_op_class;

typedef enum af_op {
#define AF_OP(id, name, cls, shape, kernel, props) AF_OP_##id,
#include "ir/ops.def"
#undef AF_OP
    AF_OP_COUNT
} af_op;

/* How output 0 of an op may share memory with its input 0 (the memory planner, runtime/plan.c).
 * A promise about how the op's kernels walk memory, so the list is deliberately short. */
typedef enum af_inplace {
    AF_INPLACE_NONE = 0,
    AF_INPLACE_SAME_SHAPE, /* out[i] depends on in0[i] only (and on other inputs), and every
                              kernel reads in0[i] before it writes out[i] */
    AF_INPLACE_VIEW        /* the output's bytes are input 0's bytes (a reshape) */
} af_inplace;

/* How an op can join a channels-last region (the layout pass, passes/layout.c) without a
 * kernel of its own: computing the same whatever the layout of its inputs. */
typedef enum af_layout_kind {
    AF_LAYOUT_FIXED = 0, /* only what the layout pass knows op by op */
    AF_LAYOUT_UNARY,     /* elementwise on input 0; other inputs are parameters */
    AF_LAYOUT_BINARY     /* elementwise on two inputs that broadcast to each other */
} af_layout_kind;

/* Where an epilogue step's parameter comes from: an attribute, with its ONNX default. */
typedef struct af_op_param {
    const char *attr; /* NULL: no parameter */
    float dflt;
} af_op_param;

/* One row of the op table: the ONNX name and class, and the properties the passes, the fusion
 * engine, the planner and the fast kernels read instead of keeping op lists of their own. */
typedef struct af_op_info {
    const char *name; /* ONNX op_type */
    af_op_class cls;
    int ep;                /* the epilogue step (ir/epilogue.h: af_ep_op) this activation or
                              arithmetic op becomes in a fused op; 0: none */
    af_op_param ep_p[2];   /* its parameters p0, p1 */
    int vec_unary;         /* a unary op without an epilogue step that the vector kernels
                              compute (af_vec_unary); 0: none */
    af_inplace inplace;    /* output 0 over input 0 */
    bool writes_all;       /* every kernel of the op writes every output element, so the
                              planner need not zero its arena slot */
    af_layout_kind layout; /* channels-last without a kernel of its own */
    bool direct;           /* the reference kernel is all the op needs (a view, metadata,
                              control flow, a plugin's kernel): no fast kernel is missing when
                              it runs there (kernels/fast/dispatch.h: AF_KERNEL_DIRECT) */
} af_op_info;

extern const af_op_info af_ops[AF_OP_COUNT];
/* autofusion's own op domain: canonical forms and fused ops (the last group of ops.def). */
#define AF_DOMAIN "ai.autofusion"
/* Op for an ONNX (domain, op_type); AF_OP_COUNT when unknown. */
af_op af_op_lookup(const char *domain, const char *op_type);
/* True for ops of AF_DOMAIN. */
bool af_op_is_ours(af_op op);

/* ---- attributes -------------------------------------------------------------------------- */

typedef enum af_attr_type {
    AF_ATTR_UNDEFINED = 0,
    AF_ATTR_FLOAT = 1,
    AF_ATTR_INT = 2,
    AF_ATTR_STRING = 3,
    AF_ATTR_TENSOR = 4,
    AF_ATTR_GRAPH = 5,
    AF_ATTR_FLOATS = 6,
    AF_ATTR_INTS = 7,
    AF_ATTR_STRINGS = 8,
    AF_ATTR_TENSORS = 9,
    AF_ATTR_GRAPHS = 10,
    AF_ATTR_SPARSE_TENSOR = 11,
    AF_ATTR_SPARSE_TENSORS = 12,
    AF_ATTR_TYPE_PROTO = 13,
    AF_ATTR_TYPE_PROTOS = 14
} af_attr_type;

typedef struct af_attr {
    const char *name;
    af_attr_type type;
    float f;
    int64_t i;
    const char *s; /* NUL-terminated copy; slen excludes the NUL */
    size_t slen;
    af_tensor *t;
    af_graph *g;
    int n; /* element count of the list kinds below */
    float *floats;
    int64_t *ints;
    const char **strings;
    af_tensor **tensors;
    af_graph **graphs;
} af_attr;

/* ---- values, nodes, graphs ----------------------------------------------------------------- */

typedef struct af_use {
    af_node *node;
    int slot; /* input index in node->in */
} af_use;

struct af_value {
    const char *name;
    af_graph *graph; /* the graph whose scope declares it */
    int id;          /* index in graph->values */
    af_tensor type;  /* dtype and dims (-1 unknown); type.data != NULL for constants */
    const char *dim_param[AF_MAX_RANK]; /* symbolic dim names from ValueInfo, or NULL */
    af_node *producer;
    int producer_slot;
    af_use *uses;
    int nuses, uses_cap;
    bool is_input;  /* a graph input (maybe with an initializer default) */
    bool is_output; /* a graph output */
    bool is_const;  /* initializer or folded constant: type.data holds the value */
};

struct af_node {
    af_op op;
    const char *name;    /* never NULL: generated when the model gives none */
    const char *op_type; /* as written in the model */
    const char *domain;
    af_value **in; /* NULL entries for omitted optional inputs */
    int nin;
    af_value **out; /* NULL entries for omitted optional outputs */
    int nout;
    af_attr *attrs;
    int nattrs;
    af_graph *graph;
    int id; /* position in graph->nodes (refreshed by af_graph_renumber) */
};

typedef struct af_opset {
    const char *domain;
    int64_t version;
} af_opset;

struct af_graph {
    af_arena *arena;
    const char *name;
    const char *file; /* model path, for messages */
    af_graph *parent; /* enclosing graph of a subgraph, NULL at top level */
    af_value **values;
    int nvalues, values_cap;
    af_node **nodes; /* topological order */
    int nnodes, nodes_cap;
    af_value **inputs; /* graph inputs, in declaration order (no initializer-only values) */
    int ninputs;
    af_value **outputs;
    int noutputs;
    af_value **captures; /* values of enclosing graphs read inside this one */
    int ncaptures, captures_cap;
    af_opset *opsets; /* shared with the parent for subgraphs */
    int nopsets;
    int node_serial; /* for generated node names */
    af_symtab *syms; /* the symbolic dims (dims.c); top-level graph only, NULL until needed */
};

/* Opset version of the default ONNX domain (ai.onnx) in force for this graph. */
int64_t af_graph_opset(const af_graph *g);

/* Construction and mutation (all memory from g->arena). */
af_graph *af_graph_new(af_arena *a, const char *file, af_graph *parent);
af_value *af_value_new(af_graph *g, const char *name);
/* Find a value by name in g, then in its enclosing graphs (recording a capture); NULL if none. */
af_value *af_graph_find(af_graph *g, const char *name);
/* A node appended at the end of g->nodes; inputs may be NULL (omitted). */
af_node *af_node_new(af_graph *g, af_op op, const char *name, int nin, int nout);
void af_node_set_input(af_node *n, int slot, af_value *v);
void af_node_set_output(af_node *n, int slot, af_value *v);
/* Append an input slot reading v (an output slot producing v); its index, or -1 when out of
 * memory. */
int af_node_add_input(af_node *n, af_value *v);
int af_node_add_output(af_node *n, af_value *v);
/* A constant value owning zeroed data of the given type, from g's arena (fill type.data). */
af_value *af_value_new_const(af_graph *g, const char *name, af_dtype dtype, int rank,
                             const int64_t *dims);
/* A unique value name in g starting with `hint` (arena string). */
const char *af_graph_unique_name(af_graph *g, const char *hint);
/* Append an attribute to n (copying nothing: the caller fills the returned entry's fields with
 * arena memory). NULL when out of memory. */
af_attr *af_node_add_attr(af_node *n, const char *name, af_attr_type type);
/* Point every use of `from` at `to`. */
void af_value_replace_uses(af_value *from, af_value *to);
/* Detach n from its inputs and outputs and drop it from g->nodes. */
void af_node_remove(af_node *n);
/* Move the most recently appended node to position `pos` of g->nodes. */
void af_node_move_last_to(af_graph *g, int pos);
void af_graph_renumber(af_graph *g);
/* Check the invariants above; AF_ERR_INTERNAL or AF_ERR_INVALID_MODEL with a message. */
af_status af_graph_verify(const af_graph *g, af_error *err);
/* Sort nodes topologically; AF_ERR_INVALID_MODEL naming a node on a cycle or with a dangling input. */
af_status af_graph_toposort(af_graph *g, af_error *err);

/* ---- building (build.c): what the passes and fusion rules rewrite with -------------------- */

/* A constant whose value may be used at compile time: not an overridable graph input, data
 * present and covering its known dims. */
bool af_value_is_const(const af_value *v);
/* A float32 value (v may be NULL: false). */
bool af_value_is_f32(const af_value *v);
/* The only node reading v, in v's graph; NULL when v has no reader or several. */
af_node *af_value_sole_reader(const af_value *v);
/* A new float32 constant named after hint (data zeroed, to be filled); NULL when out of memory. */
af_value *af_value_new_f32(af_graph *g, const char *hint, int rank, const int64_t *dims);
/* A new 1-D int64 constant holding values[0..n) named after hint; NULL when out of memory. */
af_value *af_value_new_ints(af_graph *g, const char *hint, int n, const int64_t *values);
/* The constant shape input of a Reshape from `from` to `to` (allowzero 0): the known dims as
 * they are, 0 where `to` keeps `from`'s dim at the same position (a symbol, or 0), -1 for one
 * other symbolic dim. False when `to` has more than one such dim or an unknown one.
 * af_value_new_reshape_shape makes it a constant of g; NULL when it cannot (or out of memory). */
bool af_reshape_shape(const af_tensor *from, const af_tensor *to, int64_t *shape);
af_value *af_value_new_reshape_shape(af_graph *g, const af_tensor *from, const af_tensor *to);
/* A new node of our domain (AF_DOMAIN) with nin inputs (all NULL) and one output slot,
 * appended to g. */
af_node *af_node_new_ours(af_graph *g, af_op op, const char *name, int nin);
/* Add an attribute (a string, list or tensor is copied into g's arena); false when out of
 * memory. af_node_set_str replaces a STRING attribute of that name. */
bool af_node_set_int(af_node *n, const char *name, int64_t v);
bool af_node_set_float(af_node *n, const char *name, float v);
bool af_node_set_str(af_node *n, const char *name, const char *v);
bool af_node_set_ints(af_node *n, const char *name, const int64_t *v, int count);
bool af_node_set_floats(af_node *n, const char *name, const float *v, int count);
/* Remove n's attribute of that name, if any (attributes keep no order). */
void af_node_drop_attr(af_node *n, const char *name);

/* Attribute lookup; NULL when absent. */
const af_attr *af_node_attr(const af_node *n, const char *name);
int64_t af_attr_int(const af_node *n, const char *name, int64_t dflt);
float af_attr_float(const af_node *n, const char *name, float dflt);
const char *af_attr_str(const af_node *n, const char *name, const char *dflt);
/* Ints list: returns count and sets *v, or -1 when absent. */
int af_attr_ints(const af_node *n, const char *name, const int64_t **v);
int af_attr_floats(const af_node *n, const char *name, const float **v);

/* ---- tensors ----------------------------------------------------------------------------- */

/* Allocate zeroed data for t (dtype and dims set, all dims known); AF_ERR_NOMEM / INVALID_ARG. */
af_status af_tensor_alloc(af_tensor *t, af_error *err);
/* Release data owned by t (not t itself) and mark it as a type only. */
void af_tensor_release(af_tensor *t);
/* Deep copy of src into dst (which must hold no data). */
af_status af_tensor_copy(af_tensor *dst, const af_tensor *src, af_error *err);
/* Value of element i of an integer or float tensor as int64 / double. */
int64_t af_tensor_get_int(const af_tensor *t, int64_t i);
static inline double af_tensor_get_double(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: return ((const float *)p)[i];
    case AF_DTYPE_DOUBLE: return ((const double *)p)[i];
    case AF_DTYPE_FLOAT16: return af_half_to_float(((const uint16_t *)p)[i]);
    case AF_DTYPE_BFLOAT16: return af_bf16_to_float(((const uint16_t *)p)[i]);
    case AF_DTYPE_INT8: return ((const int8_t *)p)[i];
    case AF_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case AF_DTYPE_INT16: return ((const int16_t *)p)[i];
    case AF_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case AF_DTYPE_INT32: return ((const int32_t *)p)[i];
    case AF_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case AF_DTYPE_INT64: return (double)((const int64_t *)p)[i];
    case AF_DTYPE_UINT64: return (double)((const uint64_t *)p)[i];
    case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0.0;
    }
}
/* Every dim known (t may be NULL: false). */
bool af_tensor_known(const af_tensor *t);
/* Every dim known and t's data holds all its elements (t may be NULL: false). */
bool af_tensor_has_data(const af_tensor *t);
/* Normalise axis in [-rank, rank) to [0, rank); false when out of range. */
bool af_axis(int64_t axis, int rank, int *out);
/* Numpy broadcast of a and b dims into out (rank = max); false when incompatible.
 * Unknown dims (-1) broadcast to -1 unless the other side fixes them. */
bool af_broadcast_dims(const af_tensor *a, const af_tensor *b, af_tensor *out);
/* Row-major strides of t (in elements). Broadcast strides of t against shape `to`: stride 0
 * where t's (right-aligned) dim is 1 and to's is not. */
void af_strides(const af_tensor *t, int64_t *strides);
void af_broadcast_strides(const af_tensor *t, const af_tensor *to, int64_t *strides);
/* Copy type (dtype, rank, dims) without data. */
void af_tensor_type_copy(af_tensor *dst, const af_tensor *src);
/* Set dtype/rank/dims of a type-only tensor. */
void af_tensor_set_type(af_tensor *t, af_dtype dtype, int rank, const int64_t *dims);
/* Read an int64/int32 1-D tensor (e.g. a shape input) into v[0..n); false if too long/bad type. */
bool af_tensor_to_ints(const af_tensor *t, int64_t *v, int max, int *n);
/* Both types have the same rank and the same dims, none unknown (equal symbols are the same). */
bool af_same_shape(const af_tensor *a, const af_tensor *b);
/* "[1,3,224,224]" into buf. */
const char *af_dims_str(const af_tensor *t, char *buf, size_t len);

/* ---- symbolic dims (dims.c) ------------------------------------------------------------------
 * A dim is known (>= 0), unknown (AF_DIM_UNKNOWN) or symbolic (<= -2): a product of the model's
 * named dims and a constant, interned in the top-level graph, so equal products are equal
 * numbers. Arithmetic on dims goes through these; each returns a plain number when both sides
 * are known, and AF_DIM_UNKNOWN when the result is not an exact product (or out of memory). */
#define AF_DIM_UNKNOWN (-1)
static inline bool af_dim_is_sym(int64_t d) { return d <= -2; }
/* The dim called `name` in g's model (the same number for the same name); NULL: a fresh one. */
int64_t af_dim_named(af_graph *g, const char *name);
int64_t af_dim_mul(af_graph *g, int64_t a, int64_t b);
/* a / b when exact (b's factors among a's, coefficients divisible). */
int64_t af_dim_div(af_graph *g, int64_t a, int64_t b);
/* a + b: a number when both are; else the sum leaf "(a+b)" (dims.c). */
int64_t af_dim_add(af_graph *g, int64_t a, int64_t b);
/* a - b when exact: numbers with a >= b, a == b, or a sum leaf minus one of its terms. */
int64_t af_dim_sub(af_graph *g, int64_t a, int64_t b);
int64_t af_dims_product(af_graph *g, const int64_t *dims, int n);
/* Rank known and no dim unknown (symbolic dims allowed). */
bool af_dims_defined(const af_tensor *t);
/* Every unknown dim of g's inputs (constants aside) becomes a symbol: its dim_param, or a fresh
 * name. The shapes stage runs it on an imported model, the .afm loader on a loaded one. */
af_status af_graph_name_input_dims(af_graph *g, af_error *err);
/* "12", "batch", "12*batch*sequence", "?" into buf. */
const char *af_dim_str(const af_graph *g, int64_t d, char *buf, size_t len);

/* ---- errors ------------------------------------------------------------------------------- */

/* Fill err (if not NULL) and return code. */
af_status af_fail(af_error *err, af_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail with the node named: "<file>: node '<name>' (<op_type>): <reason>". */
af_status af_node_fail(af_error *err, const af_node *n, af_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
