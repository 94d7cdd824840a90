/* Helpers shared by the table-driven kernel tests (test_elementwise.c, test_misc.c,
 * test_tensor.c): small tensor literals, element access by dtype, one-node graphs with
 * attributes parsed from "name=value ..." strings, and running a node's shape function and
 * kernel the way the executor does.
 *
 * Invariant: the helpers only build inputs and report; every expectation stays in the test
 * files. Include after cmocka.h and kernels/kernel.h; define TENS_MAXV first to size a literal's
 * values (default 64). */
#ifndef AF_TEST_UTIL_H
#define AF_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fast/dispatch.h"
#include "onnx/onnx.h"
#include "passes/passes.h"
#include "runtime/exec.h"

#ifndef TENS_MAXV
#define TENS_MAXV 64
#endif

/* A small tensor literal: dtype, rank, dims, values in row-major order (as doubles). */
typedef struct tens {
    af_dtype t; /* AF_DTYPE_UNDEFINED: an omitted input (or an absent output) */
    int rank;
    int64_t dims[4];
    double v[TENS_MAXV];
} tens;

/* One row of a table-driven kernel test: an op (ONNX op_type) with its attributes ("name=value
 * ...", read by tu_attrs) and opset, its inputs, and the status and outputs it must give. */
typedef struct tcase {
    const char *name;
    const char *op;
    const char *attrs;
    int opset;
    int nin;
    tens in[5];
    af_status expect;
    tens out, out2; /* out2: a second output, for ops that have one */
} tcase;

#define F32 AF_DTYPE_FLOAT
#define F64 AF_DTYPE_DOUBLE
#define I32 AF_DTYPE_INT32
#define I64 AF_DTYPE_INT64
#define BOOL AF_DTYPE_BOOL
#define T0(t, x) {t, 0, {0}, {x}}
#define T1(t, a, ...) {t, 1, {a}, {__VA_ARGS__}}
#define T2(t, a, b, ...) {t, 2, {a, b}, {__VA_ARGS__}}
#define T3(t, a, b, c, ...) {t, 3, {a, b, c}, {__VA_ARGS__}}
#define T4(t, a, b, c, d, ...) {t, 4, {a, b, c, d}, {__VA_ARGS__}}
#define NONE {AF_DTYPE_UNDEFINED, 0, {0}, {0}}
#define I64MIN (-9223372036854775807.0 - 1.0)

static inline int64_t tens_numel(const tens *s) {
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++) n *= s->dims[d];
    return n;
}

/* Store v at element i of t, converted to t's dtype. */
static inline void tens_set(af_tensor *t, int64_t i, double v) {
    void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)p)[i] = v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)p)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = af_float_to_bf16((float)v); break;
    case AF_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case AF_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case AF_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    case AF_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case AF_DTYPE_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case AF_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case AF_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case AF_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case AF_DTYPE_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    default: fail_msg("dtype %d not handled by the test", t->dtype);
    }
}

/* Element i of t as a double. */
static inline double tens_get(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: return ((const float *)p)[i];
    case AF_DTYPE_DOUBLE: return ((const double *)p)[i];
    case AF_DTYPE_FLOAT16: return af_half_to_float(((const uint16_t *)p)[i]);
    case AF_DTYPE_BFLOAT16: return af_bf16_to_float(((const uint16_t *)p)[i]);
    case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    case AF_DTYPE_INT8: return ((const int8_t *)p)[i];
    case AF_DTYPE_INT16: return ((const int16_t *)p)[i];
    case AF_DTYPE_INT32: return ((const int32_t *)p)[i];
    case AF_DTYPE_INT64: return (double)((const int64_t *)p)[i];
    case AF_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case AF_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case AF_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case AF_DTYPE_UINT64: return (double)((const uint64_t *)p)[i];
    default: fail_msg("dtype %d not handled by the test", t->dtype);
    }
    return 0;
}

/* A new tensor holding the literal s (the caller frees it). */
static inline af_tensor *tens_make(const tens *s) {
    af_tensor *t = af_tensor_new(s->t, s->rank, s->dims);
    assert_non_null(t);
    for (int64_t i = 0; i < tens_numel(s); i++) tens_set(t, i, s->v[i]);
    return t;
}

/* Node "n0" running op `id` in a new graph "test.onnx" that imports the default domain at
 * `opset`, with room for max_attrs attributes. */
static inline af_node *tu_node(af_arena *a, af_op id, int opset, int nin, int nout,
                               int max_attrs) {
    af_graph *g = af_graph_new(a, "test.onnx", NULL);
    assert_non_null(g);
    g->opsets = af_arena_calloc(a, 1, sizeof(af_opset));
    g->opsets[0].domain = "";
    g->opsets[0].version = opset;
    g->nopsets = 1;
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, "n0", nin, nout);
    assert_non_null(n);
    n->attrs = af_arena_calloc(a, (size_t)max_attrs, sizeof(af_attr));
    return n;
}

/* Sets at from the text of one attribute value; each test file says how it writes lists. */
typedef void (*tu_value_parser)(af_arena *a, af_attr *at, const char *val);

/* A scalar value: with a '.' a float, all digits (and '-') an int, otherwise a string. */
static inline void tu_parse_scalar(af_arena *a, af_attr *at, const char *val) {
    if (strchr(val, '.')) {
        at->type = AF_ATTR_FLOAT;
        at->f = strtof(val, NULL);
    } else if (strspn(val, "-0123456789") == strlen(val)) {
        at->type = AF_ATTR_INT;
        at->i = strtoll(val, NULL, 10);
    } else {
        at->type = AF_ATTR_STRING;
        at->s = af_arena_strdup(a, val);
        at->slen = strlen(val);
    }
}

/* Adds the attributes of "name=value ..." to n (which has room for max_attrs), each value
 * read by parse. */
static inline void tu_attrs(af_arena *a, af_node *n, const char *attrs, int max_attrs,
                            tu_value_parser parse) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", attrs);
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok;
         tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        assert_non_null(eq);
        assert_true(n->nattrs < max_attrs);
        *eq = '\0';
        af_attr *at = &n->attrs[n->nattrs++];
        at->name = af_arena_strdup(a, tok);
        parse(a, at, eq + 1);
    }
}

/* Shape function, allocation of out[0..nout) and kernel, as the executor runs a node; stops
 * at the first failure. */
static inline af_status tu_run(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               int nout, af_error *err) {
    af_status st = af_kernel_shape(n, in, out, err);
    for (int o = 0; o < nout && st == AF_OK; o++) st = af_tensor_alloc(&out[o], err);
    if (st == AF_OK) st = af_runtime_kernel(NULL, n, in, out, err);
    return st;
}

/* Fails unless got has want's dtype and dims and its values lie within a relative 1e-5. */
static inline void tens_expect_close(const char *name, const af_tensor *got, const tens *want) {
    if (got->dtype != want->t) fail_msg("%s: dtype %d, expected %d", name, got->dtype, want->t);
    if (got->rank != want->rank) fail_msg("%s: rank %d, expected %d", name, got->rank, want->rank);
    for (int d = 0; d < want->rank; d++)
        if (got->dims[d] != want->dims[d])
            fail_msg("%s: dim %d is %lld, expected %lld", name, d, (long long)got->dims[d],
                     (long long)want->dims[d]);
    for (int64_t i = 0; i < tens_numel(want); i++) {
        double g = tens_get(got, i), w = want->v[i];
        if (fabs(g - w) > 1e-5 * fmax(1.0, fabs(w)))
            fail_msg("%s: element %lld is %.17g, expected %.17g", name, (long long)i, g, w);
    }
}

/* ---- random numbers, graphs, constants ----------------------------------------------------------
 * One 64-bit LCG for every test, the same sequence on every machine; a test file seeds tu_rng
 * (in main, or before a case that must not depend on the others) where its expectations were
 * made with a given seed. */
static uint64_t tu_rng = 1;

/* Uniform in [-1, 1). */
static inline double tu_rnd(void) {
    tu_rng = tu_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(tu_rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* A main graph to build node by node: opset 17 of ai.onnx and 1 of ai.autofusion, room for
 * max_io inputs and as many outputs. */
static inline af_graph *tu_graph(af_arena *a, const char *file, int max_io) {
    af_graph *g = af_graph_new(a, file, NULL);
    assert_non_null(g);
    g->name = file;
    g->opsets = af_arena_calloc(a, 2, sizeof(af_opset));
    assert_non_null(g->opsets);
    g->opsets[0] = (af_opset){"", 17};
    g->opsets[1] = (af_opset){AF_DOMAIN, 1};
    g->nopsets = 2;
    g->inputs = af_arena_calloc(a, (size_t)max_io, sizeof(af_value *));
    g->outputs = af_arena_calloc(a, (size_t)max_io, sizeof(af_value *));
    assert_true(g->inputs && g->outputs);
    return g;
}

/* A float32 constant of g with values uniform in [lo, hi). */
static inline af_value *tu_const(af_graph *g, int rank, const int64_t *dims, double lo,
                                 double hi) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "c"), AF_DTYPE_FLOAT, rank, dims);
    assert_non_null(v);
    float *p = v->type.data;
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++)
        p[i] = (float)(lo + (tu_rnd() + 1.0) * 0.5 * (hi - lo));
    return v;
}

/* A model as the compile driver sees it before optimising: imported, then its shapes inferred
 * (the first stage). On error *m is NULL. */
static inline af_status tu_load(const char *path, af_model **m, af_error *err) {
    af_status st = af_model_load(path, m, err);
    if (st == AF_OK && (st = af_graph_infer_shapes((*m)->graph, err)) != AF_OK) {
        af_model_free(*m);
        *m = NULL;
    }
    return st;
}

static inline af_status tu_load_bytes(const void *bytes, size_t len, const char *name,
                                      af_model **m, af_error *err) {
    af_status st = af_model_load_bytes(bytes, len, name, m, err);
    if (st == AF_OK && (st = af_graph_infer_shapes((*m)->graph, err)) != AF_OK) {
        af_model_free(*m);
        *m = NULL;
    }
    return st;
}

#endif
