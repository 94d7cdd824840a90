/* Importer tests: the wire reader on hand-made bytes, a small valid model built in memory (and
 * every truncation and single-bit flip of it), the importer's rules (constants, initializer
 * defaults, the float16 rule, subgraph captures, external data), hostile models built in memory,
 * the hostile files of tests/gen_bad_models.py (folder from argv[1] or AF_BAD_MODELS_DIR, with
 * expected.tsv), TensorProto .pb files and .npy files.
 *
 * Models are written with the small protobuf encoder below, so each test states its bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "onnx/onnx.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *bad_models_dir;
static char tmp_dir[] = "/tmp/af_test_import_XXXXXX";

/* ---- a minimal protobuf encoder ------------------------------------------------------------- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put_raw(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_varint(buf *b, uint64_t v) {
    do {
        unsigned char c = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put_raw(b, &c, 1);
    } while (v);
}

static void put_tag(buf *b, int num, int wire) {
    put_varint(b, (uint64_t)num << 3 | (uint64_t)wire);
}

static void put_int(buf *b, int num, int64_t v) {
    put_tag(b, num, 0);
    put_varint(b, (uint64_t)v);
}

static void put_float(buf *b, int num, float f) {
    put_tag(b, num, 5);
    put_raw(b, &f, 4);
}

static void put_bytes(buf *b, int num, const void *d, size_t n) {
    put_tag(b, num, 2);
    put_varint(b, n);
    put_raw(b, d, n);
}

static void put_str(buf *b, int num, const char *s) {
    put_bytes(b, num, s, strlen(s));
}

/* Append sub-message m as field num, and free m. */
static void put_msg(buf *b, int num, buf *m) {
    put_bytes(b, num, m->p, m->n);
    free(m->p);
    *m = (buf){0};
}

/* ---- ONNX messages ----------------------------------------------------------------------------
 */

static buf tensor_msg(const char *name, int dtype, int rank, const int64_t *dims, const void *raw,
                      size_t nraw) {
    buf t = {0};
    for (int i = 0; i < rank; i++) put_int(&t, 1, dims[i]);
    put_int(&t, 2, dtype);
    put_str(&t, 8, name);
    if (raw) put_bytes(&t, 9, raw, nraw);
    return t;
}

/* A tensor type with `rank` dims (rank -1: no shape); dim_value -1 is written as dim_param "N". */
static buf value_info(const char *name, int elem, int rank, const int64_t *dims) {
    buf tt = {0}, shape = {0}, type = {0}, vi = {0};
    put_int(&tt, 1, elem);
    if (rank >= 0) {
        for (int i = 0; i < rank; i++) {
            buf dim = {0};
            if (dims[i] >= 0)
                put_int(&dim, 1, dims[i]);
            else
                put_str(&dim, 2, "N");
            put_msg(&shape, 1, &dim);
        }
        put_msg(&tt, 2, &shape);
    }
    put_msg(&type, 1, &tt);
    put_str(&vi, 1, name);
    put_msg(&vi, 2, &type);
    return vi;
}

/* Appends a value_info for `name` to message g as field `num` (11 input, 12 output). */
static void put_value_info(buf *g, int num, const char *name, int elem, int rank,
                           const int64_t *dims) {
    buf vi = value_info(name, elem, rank, dims);
    put_msg(g, num, &vi);
}

/* A node; `ins` and `outs` are NULL-terminated; attrs (may be NULL) are appended and freed. */
static buf node_msg(const char *op, const char *name, const char *const *ins,
                    const char *const *outs, buf *attrs, int nattrs) {
    buf n = {0};
    for (; *ins; ins++) put_str(&n, 1, *ins);
    for (; *outs; outs++) put_str(&n, 2, *outs);
    put_str(&n, 3, name);
    put_str(&n, 4, op);
    for (int i = 0; i < nattrs; i++) put_msg(&n, 5, &attrs[i]);
    return n;
}

static buf attr_float(const char *name, float f) {
    buf a = {0};
    put_str(&a, 1, name);
    put_int(&a, 20, AF_ATTR_FLOAT);
    put_float(&a, 2, f);
    return a;
}

static buf attr_graph(const char *name, buf *g) {
    buf a = {0};
    put_str(&a, 1, name);
    put_int(&a, 20, AF_ATTR_GRAPH);
    put_msg(&a, 6, g);
    return a;
}

static buf model_msg(buf *graph, int64_t opset) {
    buf m = {0}, op = {0};
    put_int(&m, 1, 8);
    put_str(&op, 1, "");
    put_int(&op, 2, opset);
    put_msg(&m, 8, &op);
    put_str(&m, 2, "test_import");
    put_msg(&m, 7, graph);
    return m;
}

/* Which part of the small model a test replaces. */
typedef struct variant {
    int64_t opset;
    const char *op2;  /* op of the second node (default Mul) */
    const char *in2;  /* its second input (default "two") */
    int w_dtype;      /* initializer's dtype (default float) */
    int64_t w_dims0;  /* its first dim (default 2) */
    size_t w_bytes;   /* its raw_data length (default: exact) */
    int x_elem;       /* graph input's elem type (default float) */
    bool w_is_input;  /* also declare w as a graph input */
    bool extra_bytes; /* append an unknown field of every wire type to the model */
} variant;

/* The small model: y = Relu((x + w) * two), x float[2,3] (dim 0 symbolic), w an initializer
 * float[2,3] = 1..6, two a Constant 2.0. */
static buf small_model(variant v) {
    static const uint16_t halves[6] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    const float wf[12] = {1, 2, 3, 4, 5, 6}; /* room for the oversized raw_data cases */
    int64_t wd[2] = {v.w_dims0 ? v.w_dims0 : 2, 3}, xd[2] = {-1, 3}, yd[2] = {2, 3};
    int wt = v.w_dtype ? v.w_dtype : AF_DTYPE_FLOAT;
    const void *wraw = wt == AF_DTYPE_FLOAT16 ? (const void *)halves : (const void *)wf;
    size_t wbytes = v.w_bytes ? v.w_bytes : (wt == AF_DTYPE_FLOAT16 ? 12 : 24);
    buf g = {0}, n, t, attr = attr_float("value_float", 2.0f);
    n = node_msg("Constant", "const_two", (const char *[]){NULL}, (const char *[]){"two", NULL},
                 &attr, 1);
    put_msg(&g, 1, &n);
    n = node_msg("Add", "add", (const char *[]){"x", "w", NULL}, (const char *[]){"s", NULL}, NULL,
                 0);
    put_msg(&g, 1, &n);
    n = node_msg(v.op2 ? v.op2 : "Mul", "", (const char *[]){"s", v.in2 ? v.in2 : "two", NULL},
                 (const char *[]){"m", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    n = node_msg("Relu", "relu", (const char *[]){"m", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    put_str(&g, 2, "small");
    t = tensor_msg("w", wt, 2, wd, wraw, wbytes);
    put_msg(&g, 5, &t);
    put_value_info(&g, 11, "x", v.x_elem ? v.x_elem : AF_DTYPE_FLOAT, 2, xd);
    if (v.w_is_input) {
        put_value_info(&g, 11, "w", AF_DTYPE_FLOAT, 2, wd);
    }
    put_value_info(&g, 12, "y", v.x_elem ? v.x_elem : AF_DTYPE_FLOAT, 2, yd);
    buf m = model_msg(&g, v.opset ? v.opset : 13);
    if (v.extra_bytes) {
        put_int(&m, 1000, 7);
        put_tag(&m, 1001, 1);
        put_raw(&m, "12345678", 8);
        put_str(&m, 1002, "skipped");
        put_tag(&m, 1003, 5);
        put_raw(&m, "1234", 4);
    }
    return m;
}

static af_status load(const buf *b, af_model **m, af_error *err) {
    memset(err, 0, sizeof *err);
    af_status st = tu_load_bytes(b->p, b->n, "mem.onnx", m, err);
    if (st == AF_OK)
        assert_non_null(*m);
    else
        assert_null(*m);
    return st;
}

/* Load b, expect `code` and a message containing `word`. */
static void expect_fail(const buf *b, af_status code, const char *word) {
    af_model *m;
    af_error err;
    af_status st = load(b, &m, &err);
    if (st != code || !strstr(err.message, word))
        fail_msg("expected status %d with '%s', got %d: %s", code, word, st, err.message);
    assert_non_null(strstr(err.message, "mem.onnx"));
    assert_null(strchr(err.message, '\n'));
}

static af_value *find(af_graph *g, const char *name) {
    for (int i = 0; i < g->nvalues; i++)
        if (!strcmp(g->values[i]->name, name)) return g->values[i];
    return NULL;
}

/* ---- the wire reader ------------------------------------------------------------------------ */

static af_status next_of(const void *bytes, size_t n, af_pb_field *f, af_error *err) {
    af_pb r;
    af_pb_init(&r, bytes, n, "t.pb", "Test");
    return af_pb_next(&r, f, err);
}

static void test_reader_fields(void **state) {
    (void)state;
    af_pb_field f;
    af_error err;
    /* field 1 varint 300; field 2 fixed64; field 3 "abc"; field 4 fixed32; then the end */
    const unsigned char ok[] = {0x08, 0xac, 0x02, 0x11, 1,   0,   0,    0, 0, 0, 0,
                                0x80, 0x1a, 3,    'a',  'b', 'c', 0x25, 1, 2, 3, 4};
    af_pb r;
    af_pb_init(&r, ok, sizeof ok, "t.pb", "Test");
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    assert_int_equal(f.num, 1);
    assert_int_equal(f.v, 300);
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    assert_int_equal(f.wire, AF_PB_FIXED64);
    assert_true(f.v == 0x8000000000000001ull);
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    assert_int_equal(f.len, 3);
    assert_memory_equal(f.data, "abc", 3);
    assert_int_equal(f.off, 12);
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    assert_int_equal(f.v, 0x04030201);
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    assert_int_equal(f.num, 0);
    /* the largest varint: ten bytes */
    const unsigned char max[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_int_equal(next_of(max, sizeof max, &f, &err), AF_OK);
    assert_true(f.v == UINT64_MAX);
}

static void test_reader_errors(void **state) {
    (void)state;
    static const struct {
        unsigned char bytes[16];
        size_t n;
        const char *word;
    } bad[] = {
        {{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, 11, "64 bits"},
        {{0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 12, "64 bits"},
        {{0x08, 0x80}, 2, "past the end"},
        {{0x00, 0x01}, 2, "field number 0"},
        {{0x0b}, 1, "group"},
        {{0x0c}, 1, "group"},
        {{0x0e, 0x00}, 2, "invalid wire type"},
        {{0x0f, 0x00}, 2, "invalid wire type"},
        {{0x12, 0x05, 'a', 'b'}, 4, "only 2 bytes remain"},
        {{0x11, 1, 2, 3}, 4, "past the end"},
        {{0x15, 1, 2}, 3, "past the end"},
        {{0xf8, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00}, 7, "too large"},
    };
    for (size_t i = 0; i < AF_COUNT(bad); i++) {
        af_pb_field f;
        af_error err = {0};
        af_status st = next_of(bad[i].bytes, bad[i].n, &f, &err);
        if (st != AF_ERR_PARSE || !strstr(err.message, bad[i].word) || !strstr(err.message, "t.pb"))
            fail_msg("case %zu: %d %s", i, st, err.message);
    }
}

static void test_reader_repeated_and_depth(void **state) {
    (void)state;
    af_error err;
    /* field 1 = 5 unpacked, then packed {7, 300}, then field 2 (skipped), then unpacked 9 */
    const unsigned char msg[] = {0x08, 5, 0x0a, 3, 7, 0xac, 0x02, 0x10, 1, 0x08, 9};
    af_pb r;
    size_t n;
    af_pb_init(&r, msg, sizeof msg, "t.pb", "Test");
    assert_int_equal(af_pb_repeated(&r, 1, AF_PB_VARINT, "x", NULL, NULL, 0, &n, &err), AF_OK);
    assert_int_equal(n, 4);
    int count;
    assert_int_equal(af_pb_count(&r, 1, &count, &err), AF_OK);
    assert_int_equal(count, 3);
    /* A packed run cut in the middle of a varint. */
    const unsigned char cut[] = {0x0a, 2, 7, 0x80};
    af_pb_init(&r, cut, sizeof cut, "t.pb", "Test");
    assert_int_equal(af_pb_repeated(&r, 1, AF_PB_VARINT, "x", NULL, NULL, 0, &n, &err),
                     AF_ERR_PARSE);
    /* Wrong wire type for a repeated float. */
    af_pb_init(&r, msg, sizeof msg, "t.pb", "Test");
    assert_int_equal(af_pb_repeated(&r, 1, AF_PB_FIXED32, "floats", NULL, NULL, 0, &n, &err),
                     AF_ERR_PARSE);
    assert_non_null(strstr(err.message, "floats"));
    /* Depth: a sub-reader at the limit refuses to go deeper. */
    const unsigned char sub[] = {0x0a, 0};
    af_pb_field f;
    af_pb_init(&r, sub, sizeof sub, "t.pb", "Test");
    r.depth = AF_PB_MAX_DEPTH - 1;
    assert_int_equal(af_pb_next(&r, &f, &err), AF_OK);
    af_pb inner;
    assert_int_equal(af_pb_sub(&r, &f, "Inner", &inner, &err), AF_OK);
    inner.depth = AF_PB_MAX_DEPTH;
    assert_int_equal(af_pb_sub(&inner, &f, "Inner", &r, &err), AF_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "nested deeper"));
}

/* ---- the small model --------------------------------------------------------------------------
 */

static void test_small_model(void **state) {
    (void)state;
    buf b = small_model((variant){.extra_bytes = true});
    af_model *m;
    af_error err;
    assert_int_equal(load(&b, &m, &err), AF_OK);
    af_graph *g = m->graph;
    assert_string_equal(m->producer_name, "test_import");
    assert_int_equal(m->ir_version, 8);
    assert_int_equal(af_graph_opset(g), 13);
    assert_int_equal(g->ninputs, 1);
    assert_int_equal(g->noutputs, 1);
    assert_int_equal(g->nnodes, 3); /* the Constant became a value */
    assert_string_equal(g->nodes[0]->name, "add");
    assert_string_equal(g->nodes[1]->op_type, "Mul");
    assert_true(strlen(g->nodes[1]->name) > 0); /* generated */
    af_value *x = g->inputs[0], *w = find(g, "w"), *two = find(g, "two"), *y = g->outputs[0];
    assert_string_equal(x->name, "x");
    assert_true(x->is_input && !x->is_const);
    assert_int_equal(x->type.rank, 2);
    char sym[16];
    assert_true(af_dim_is_sym(x->type.dims[0])); /* a symbol named after the dim_param */
    assert_string_equal(af_dim_str(g, x->type.dims[0], sym, sizeof sym), "N");
    assert_string_equal(x->dim_param[0], "N");
    assert_int_equal(x->type.dims[1], 3);
    assert_true(w->is_const && !w->is_input);
    assert_int_equal(w->type.dtype, AF_DTYPE_FLOAT);
    assert_int_equal(((const float *)w->type.data)[5], 6.0f);
    assert_true(two->is_const);
    assert_int_equal(two->type.rank, 0);
    assert_int_equal(*(const float *)two->type.data, 2.0f);
    assert_string_equal(y->name, "y");
    assert_true(y->is_output);
    assert_int_equal(y->type.dtype, AF_DTYPE_FLOAT);
    assert_int_equal(y->type.rank, 2);
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
    af_model_free(m);
    free(b.p);
}

/* Every prefix of the model is loaded: each one either loads or fails with a message. */
static void test_truncations(void **state) {
    (void)state;
    buf b = small_model((variant){0});
    int loaded = 0;
    for (size_t n = 0; n < b.n; n++) {
        unsigned char *copy = malloc(n ? n : 1); /* exact size, so ASan sees overreads */
        memcpy(copy, b.p, n);
        af_model *m;
        af_error err = {0};
        af_status st = tu_load_bytes(copy, n, "cut.onnx", &m, &err);
        if (st == AF_OK) {
            loaded++;
            af_model_free(m);
        } else {
            assert_true(strlen(err.message) > 0);
        }
        free(copy);
    }
    assert_true(loaded < 3); /* the graph is the last field: cutting it breaks the model */
    free(b.p);
}

static void test_bit_flips(void **state) {
    (void)state;
    buf b = small_model((variant){0});
    for (size_t i = 0; i < b.n; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b.p[i] ^= (unsigned char)(1u << bit);
            af_model *m;
            af_error err = {0};
            af_status st = tu_load_bytes(b.p, b.n, "flip.onnx", &m, &err);
            if (st == AF_OK)
                af_model_free(m);
            else
                assert_true(strlen(err.message) > 0);
            b.p[i] ^= (unsigned char)(1u << bit);
        }
    }
    free(b.p);
}

/* ---- importer rules -----------------------------------------------------------------------------
 */

static void test_initializer_as_input_default(void **state) {
    (void)state;
    buf b = small_model((variant){.w_is_input = true});
    af_model *m;
    af_error err;
    assert_int_equal(load(&b, &m, &err), AF_OK);
    af_value *w = find(m->graph, "w");
    assert_true(w->is_input && w->is_const);
    assert_int_equal(m->graph->ninputs, 2);
    af_model_free(m);
    free(b.p);
}

/* float16 weights of a float32 model become float32; a float16 model keeps float16. */
static void test_float16_rule(void **state) {
    (void)state;
    buf b = small_model((variant){.w_dtype = AF_DTYPE_FLOAT16});
    af_model *m;
    af_error err;
    assert_int_equal(load(&b, &m, &err), AF_OK);
    af_value *w = find(m->graph, "w");
    assert_int_equal(w->type.dtype, AF_DTYPE_FLOAT);
    assert_int_equal(w->type.nbytes, 24);
    assert_int_equal(((const float *)w->type.data)[0], 1.0f);
    assert_int_equal(((const float *)w->type.data)[5], 6.0f);
    af_model_free(m);
    free(b.p);

    /* With a float16 graph input the weights stay float16 (shape inference may then reject the
     * float Constant mixed in: only the initializer's type matters here). */
    b = small_model((variant){
        .w_dtype = AF_DTYPE_FLOAT16, .x_elem = AF_DTYPE_FLOAT16, .op2 = "Relu", .in2 = ""});
    af_status st = load(&b, &m, &err);
    if (st == AF_OK) {
        w = find(m->graph, "w");
        assert_int_equal(w->type.dtype, AF_DTYPE_FLOAT16);
        af_model_free(m);
    } else {
        assert_int_not_equal(st, AF_ERR_PARSE);
    }
    free(b.p);
}

static void test_model_errors(void **state) {
    (void)state;
    static const struct {
        variant v;
        af_status code;
        const char *word;
    } cases[] = {
        {{.opset = -1}, AF_ERR_UNSUPPORTED, "opset -1"},
        {{.opset = 24}, AF_ERR_UNSUPPORTED, "1 to 23"},
        {{.op2 = "FancyOp"}, AF_ERR_UNSUPPORTED, "FancyOp"},
        {{.in2 = "ghost"}, AF_ERR_INVALID_MODEL, "'ghost', which nothing produces"},
        {{.in2 = "m"}, AF_ERR_INVALID_MODEL, "cycle"},
        {{.w_dims0 = -2}, AF_ERR_INVALID_MODEL, "negative"},
        {{.w_dims0 = (int64_t)1 << 62}, AF_ERR_INVALID_MODEL, "overflow"},
        {{.w_bytes = 48}, AF_ERR_INVALID_MODEL, "raw_data has 48 bytes"},
        {{.w_dtype = AF_DTYPE_STRING}, AF_ERR_UNSUPPORTED, "string"},
        {{.w_dtype = 99}, AF_ERR_UNSUPPORTED, "data type 99"},
        {{.w_dtype = AF_DTYPE_INT64, .w_is_input = true, .w_bytes = 48},
         AF_ERR_INVALID_MODEL,
         "declares"},
        {{.x_elem = AF_DTYPE_STRING}, AF_ERR_UNSUPPORTED, "value 'x'"},
    };
    for (size_t i = 0; i < AF_COUNT(cases); i++) {
        buf b = small_model(cases[i].v);
        expect_fail(&b, cases[i].code, cases[i].word);
        free(b.p);
    }
}

/* A graph `g` (freed) wrapped in a model. */
static void expect_graph_fail(buf *g, af_status code, const char *word) {
    buf m = model_msg(g, 13);
    expect_fail(&m, code, word);
    free(m.p);
}

static void test_graph_errors(void **state) {
    (void)state;
    int64_t d1[1] = {1};
    buf g, n, a, t;

    /* the same output from two nodes */
    g = (buf){0};
    n = node_msg("Relu", "a", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    n = node_msg("Neg", "b", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 11, "x", 1, 1, d1);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_INVALID_MODEL, "node 'b' (Neg): value 'y' produced twice");

    /* a graph output nothing produces */
    g = (buf){0};
    put_value_info(&g, 11, "x", 1, 1, d1);
    put_value_info(&g, 12, "nope", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_INVALID_MODEL, "'nope' is not produced");

    /* Constant with a string value */
    g = (buf){0};
    a = (buf){0};
    put_str(&a, 1, "value_string");
    put_int(&a, 20, AF_ATTR_STRING);
    put_str(&a, 4, "hello");
    n = node_msg("Constant", "k", (const char *[]){NULL}, (const char *[]){"y", NULL}, &a, 1);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_UNSUPPORTED, "node 'k' (Constant): attribute 'value_string'");

    /* an attribute referring to a function's attribute, in a graph (not a function body) */
    g = (buf){0};
    a = (buf){0};
    put_str(&a, 1, "alpha");
    put_int(&a, 20, AF_ATTR_FLOAT);
    put_str(&a, 21, "outer_alpha");
    n = node_msg("LeakyRelu", "lr", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, &a,
                 1);
    put_msg(&g, 1, &n);
    put_value_info(&g, 11, "x", 1, 1, d1);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_INVALID_MODEL, "refers to 'outer_alpha' outside a function");

    /* an attribute given twice */
    g = (buf){0};
    buf two[2] = {attr_float("alpha", 1), attr_float("alpha", 2)};
    n = node_msg("LeakyRelu", "lr", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, two,
                 2);
    put_msg(&g, 1, &n);
    put_value_info(&g, 11, "x", 1, 1, d1);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_INVALID_MODEL, "'alpha' given twice");

    /* external data without a model folder */
    g = (buf){0};
    t = tensor_msg("w", 1, 1, d1, NULL, 0);
    buf e = {0};
    put_str(&e, 1, "location");
    put_str(&e, 2, "w.bin");
    put_msg(&t, 13, &e);
    put_int(&t, 14, 1);
    put_msg(&g, 5, &t);
    n = node_msg("Relu", "a", (const char *[]){"w", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_UNSUPPORTED, "external data");

    /* typed data that does not fit the dtype */
    g = (buf){0};
    t = tensor_msg("w", AF_DTYPE_FLOAT, 1, d1, NULL, 0);
    put_int(&t, 7, 5); /* int64_data */
    put_msg(&g, 5, &t);
    n = node_msg("Relu", "a", (const char *[]){"w", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_INVALID_MODEL, "int64_data data for a float tensor");

    /* a sparse initializer */
    g = (buf){0};
    put_str(&g, 15, "");
    expect_graph_fail(&g, AF_ERR_UNSUPPORTED, "sparse");

    /* a node in another domain */
    g = (buf){0};
    n = node_msg("Gelu", "gelu", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, NULL, 0);
    put_str(&n, 7, "com.microsoft");
    put_msg(&g, 1, &n);
    put_value_info(&g, 11, "x", 1, 1, d1);
    put_value_info(&g, 12, "y", 1, 1, d1);
    expect_graph_fail(&g, AF_ERR_UNSUPPORTED, "com.microsoft");

    /* no graph at all */
    buf m = {0};
    put_int(&m, 1, 8);
    expect_fail(&m, AF_ERR_INVALID_MODEL, "no graph");
    free(m.p);
}

/* Typed data fields, packed and not, for several dtypes. */
static void test_typed_tensors(void **state) {
    (void)state;
    int64_t d3[1] = {3};
    buf g = {0}, t, n;
    /* int32 [-1, 2, 300] as int32_data, packed */
    t = tensor_msg("a", AF_DTYPE_INT32, 1, d3, NULL, 0);
    buf packed = {0};
    put_varint(&packed, (uint64_t)(int64_t)-1);
    put_varint(&packed, 2);
    put_varint(&packed, 300);
    put_msg(&t, 5, &packed);
    put_msg(&g, 5, &t);
    /* float as float_data, unpacked */
    t = tensor_msg("b", AF_DTYPE_FLOAT, 1, d3, NULL, 0);
    put_float(&t, 4, 0.5f);
    put_float(&t, 4, -1.5f);
    put_float(&t, 4, 3.0f);
    put_msg(&g, 5, &t);
    /* bool from int32_data: nonzero is true */
    t = tensor_msg("c", AF_DTYPE_BOOL, 1, d3, NULL, 0);
    put_int(&t, 5, 0);
    put_int(&t, 5, 7);
    put_int(&t, 5, 1);
    put_msg(&g, 5, &t);
    /* uint64 from uint64_data, int8 from int32_data */
    t = tensor_msg("d", AF_DTYPE_UINT64, 1, d3, NULL, 0);
    put_int(&t, 11, -1);
    put_int(&t, 11, 0);
    put_int(&t, 11, 42);
    put_msg(&g, 5, &t);
    t = tensor_msg("e", AF_DTYPE_INT8, 1, d3, NULL, 0);
    put_int(&t, 5, -128);
    put_int(&t, 5, 127);
    put_int(&t, 5, -1);
    put_msg(&g, 5, &t);
    n = node_msg("Identity", "id", (const char *[]){"a", NULL}, (const char *[]){"y", NULL}, NULL,
                 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "y", AF_DTYPE_INT32, 1, d3);
    buf mb = model_msg(&g, 13);
    af_model *m;
    af_error err;
    assert_int_equal(load(&mb, &m, &err), AF_OK);
    const int32_t *a = find(m->graph, "a")->type.data;
    assert_int_equal(a[0], -1);
    assert_int_equal(a[2], 300);
    const float *b = find(m->graph, "b")->type.data;
    assert_true(b[0] == 0.5f && b[1] == -1.5f && b[2] == 3.0f);
    const uint8_t *c = find(m->graph, "c")->type.data;
    assert_true(c[0] == 0 && c[1] == 1 && c[2] == 1);
    const uint64_t *d = find(m->graph, "d")->type.data;
    assert_true(d[0] == UINT64_MAX && d[2] == 42);
    const int8_t *e = find(m->graph, "e")->type.data;
    assert_true(e[0] == -128 && e[1] == 127 && e[2] == -1);
    af_model_free(m);
    free(mb.p);
}

/* `levels` If nodes, each inside the then_branch of the previous; the innermost reads the top
 * graph's input "x" (a capture through every level). */
static buf nested_if(int levels) {
    int64_t d1[1] = {1};
    buf g = {0}, n, a[2];
    n = node_msg("Identity", "leaf", (const char *[]){"x", NULL}, (const char *[]){"o_leaf", NULL},
                 NULL, 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "o_leaf", 1, 1, d1);
    for (int k = levels - 1; k >= 0; k--) {
        char out[32], name[32];
        snprintf(out, sizeof out, "o%d", k);
        snprintf(name, sizeof name, "if%d", k);
        buf other = {0};
        n = node_msg("Identity", "e", (const char *[]){"x", NULL}, (const char *[]){"o_else", NULL},
                     NULL, 0);
        put_msg(&other, 1, &n);
        put_value_info(&other, 12, "o_else", 1, 1, d1);
        a[0] = attr_graph("then_branch", &g);
        a[1] = attr_graph("else_branch", &other);
        g = (buf){0};
        n = node_msg("If", name, (const char *[]){"cond", NULL}, (const char *[]){out, NULL}, a, 2);
        put_msg(&g, 1, &n);
        if (k == 0) {
            put_value_info(&g, 11, "cond", AF_DTYPE_BOOL, 0, NULL);
            put_value_info(&g, 11, "x", 1, 1, d1);
        }
        put_value_info(&g, 12, out, 1, 1, d1);
    }
    return model_msg(&g, 13);
}

static void test_subgraphs(void **state) {
    (void)state;
    buf b = nested_if(3);
    af_model *m;
    af_error err;
    assert_int_equal(load(&b, &m, &err), AF_OK);
    af_graph *g = m->graph;
    const af_attr *then = af_node_attr(g->nodes[0], "then_branch");
    assert_non_null(then);
    af_graph *s1 = then->g;
    assert_ptr_equal(s1->parent, g);
    af_graph *s3 =
        af_node_attr(af_node_attr(s1->nodes[0], "then_branch")->g->nodes[0], "then_branch")->g;
    /* the leaf reads x of the top graph: captured at every level */
    assert_ptr_equal(s3->nodes[0]->in[0], g->inputs[1]);
    assert_int_equal(s3->ncaptures, 1);
    assert_int_equal(s1->ncaptures, 2); /* x, and cond read by its own If */
    af_model_free(m);
    free(b.p);

    /* 31 levels fit the nesting limit of 100 messages; 32 do not. */
    b = nested_if(31);
    assert_int_equal(load(&b, &m, &err), AF_OK);
    af_model_free(m);
    free(b.p);
    b = nested_if(32);
    expect_fail(&b, AF_ERR_UNSUPPORTED, "nested deeper than 100");
    free(b.p);
}

/* A node whose subgraph reads an outer value runs after that value's producer, even when the
 * only path to it is the capture: relu(x) -> a, neg(a) -> t, If(cond) { then: Identity(t) }. */
static void test_capture_order(void **state) {
    (void)state;
    int64_t d2[1] = {2};
    buf then = {0}, other = {0}, g = {0}, n, a[2];
    n = node_msg("Identity", "", (const char *[]){"t", NULL}, (const char *[]){"o1", NULL}, NULL,
                 0);
    put_msg(&then, 1, &n);
    put_value_info(&then, 12, "o1", 1, 1, d2);
    n = node_msg("Identity", "", (const char *[]){"x", NULL}, (const char *[]){"o2", NULL}, NULL,
                 0);
    put_msg(&other, 1, &n);
    put_value_info(&other, 12, "o2", 1, 1, d2);
    n = node_msg("Relu", "relu", (const char *[]){"x", NULL}, (const char *[]){"a", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    n = node_msg("Neg", "neg", (const char *[]){"a", NULL}, (const char *[]){"t", NULL}, NULL, 0);
    put_msg(&g, 1, &n);
    a[0] = attr_graph("then_branch", &then);
    a[1] = attr_graph("else_branch", &other);
    n = node_msg("If", "if", (const char *[]){"cond", NULL}, (const char *[]){"y", NULL}, a, 2);
    put_msg(&g, 1, &n);
    put_value_info(&g, 11, "x", 1, 1, d2);
    put_value_info(&g, 11, "cond", AF_DTYPE_BOOL, 0, NULL);
    put_value_info(&g, 12, "y", 1, 1, d2);
    buf mb = model_msg(&g, 13);
    af_model *m;
    af_error err;
    assert_int_equal(load(&mb, &m, &err), AF_OK);
    int neg = -1, iff = -1;
    for (int i = 0; i < m->graph->nnodes; i++) {
        if (!strcmp(m->graph->nodes[i]->name, "neg")) neg = i;
        if (!strcmp(m->graph->nodes[i]->name, "if")) iff = i;
    }
    assert_true(neg >= 0 && iff > neg);
    af_model_free(m);
    free(mb.p);
}

/* ---- files: mmap, external data, .pb tensors, .npy --------------------------------------------
 */

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_load_file_and_external_data(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/ext", tmp_dir);
    mkdir(dir, 0755);
    /* two tensors in one external file: opened once */
    const float data[4] = {1, 2, 3, 4};
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    write_file(path, data, sizeof data);
    int64_t d2[1] = {2};
    buf g = {0}, n;
    for (int k = 0; k < 2; k++) {
        buf t = tensor_msg(k ? "w1" : "w0", AF_DTYPE_FLOAT, 1, d2, NULL, 0), e = {0};
        put_str(&e, 1, "location");
        put_str(&e, 2, "weights.bin");
        put_msg(&t, 13, &e);
        put_str(&e, 1, "offset");
        put_str(&e, 2, k ? "8" : "0");
        put_msg(&t, 13, &e);
        put_int(&t, 14, 1);
        put_msg(&g, 5, &t);
    }
    n = node_msg("Add", "add", (const char *[]){"w0", "w1", NULL}, (const char *[]){"y", NULL},
                 NULL, 0);
    put_msg(&g, 1, &n);
    put_value_info(&g, 12, "y", 1, 1, d2);
    buf mb = model_msg(&g, 13);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    write_file(path, mb.p, mb.n);
    af_model *m;
    af_error err;
    assert_int_equal(tu_load(path, &m, &err), AF_OK);
    const float *w0 = find(m->graph, "w0")->type.data, *w1 = find(m->graph, "w1")->type.data;
    assert_true(w0[0] == 1 && w0[1] == 2 && w1[0] == 3 && w1[1] == 4);
    assert_ptr_equal((const char *)w1, (const char *)w0 + 8); /* one mapping of the file */
    af_model_free(m);
    free(mb.p);

    /* A file that does not exist, and a directory. */
    snprintf(path, sizeof path, "%s/absent.onnx", dir);
    assert_int_equal(tu_load(path, &m, &err), AF_ERR_IO);
    assert_null(m);
    assert_int_equal(tu_load(dir, &m, &err), AF_ERR_IO);
}

/* A TensorProto file keeps float16 as float16. */
static void test_tensor_pb(void **state) {
    (void)state;
    char path[600];
    int64_t d2[2] = {1, 2};
    uint16_t h[2] = {0x3c00, 0xc000};
    buf t = tensor_msg("input_0", AF_DTYPE_FLOAT16, 2, d2, h, sizeof h);
    snprintf(path, sizeof path, "%s/t.pb", tmp_dir);
    write_file(path, t.p, t.n);
    af_tensor x;
    char *name;
    af_error err;
    assert_int_equal(af_tensor_load_pb(path, &x, &name, &err), AF_OK);
    assert_int_equal(x.dtype, AF_DTYPE_FLOAT16);
    assert_int_equal(x.rank, 2);
    assert_int_equal(x.dims[1], 2);
    assert_true(x.owns_data);
    assert_memory_equal(x.data, h, sizeof h);
    assert_string_equal(name, "input_0");
    free(name);
    af_tensor_release(&x);
    /* every truncation fails cleanly or loads */
    for (size_t n = 0; n < t.n; n++) {
        write_file(path, t.p, n);
        if (af_tensor_load_pb(path, &x, NULL, &err) == AF_OK) af_tensor_release(&x);
    }
    free(t.p);
    /* one file of the conformance suite, when installed */
    const char *conf = "/usr/share/libonnx-testdata/data/node/test_abs/test_data_set_0/input_0.pb";
    if (access(conf, R_OK) == 0) {
        assert_int_equal(af_tensor_load_pb(conf, &x, NULL, &err), AF_OK);
        assert_int_equal(x.dtype, AF_DTYPE_FLOAT);
        assert_int_equal(af_tensor_numel(&x), 60);
        af_tensor_release(&x);
    }
}

static void test_npy_roundtrip(void **state) {
    (void)state;
    static const af_dtype types[] = {AF_DTYPE_FLOAT,  AF_DTYPE_DOUBLE, AF_DTYPE_FLOAT16,
                                     AF_DTYPE_INT8,   AF_DTYPE_INT16,  AF_DTYPE_INT32,
                                     AF_DTYPE_INT64,  AF_DTYPE_UINT8,  AF_DTYPE_UINT16,
                                     AF_DTYPE_UINT32, AF_DTYPE_UINT64, AF_DTYPE_BOOL};
    static const int64_t shapes[3][3] = {{0}, {5}, {2, 3, 4}};
    static const int ranks[3] = {0, 1, 3};
    char path[600];
    af_error err;
    snprintf(path, sizeof path, "%s/t.npy", tmp_dir);
    for (size_t i = 0; i < AF_COUNT(types); i++) {
        for (int s = 0; s < 3; s++) {
            af_tensor *t = af_tensor_new(types[i], ranks[s], shapes[s]);
            assert_non_null(t);
            for (size_t k = 0; k < t->nbytes; k++)
                ((unsigned char *)t->data)[k] =
                    types[i] == AF_DTYPE_BOOL ? (unsigned char)(k & 1) : (unsigned char)(k * 7);
            assert_int_equal(af_tensor_save_npy(path, t, &err), AF_OK);
            struct stat sb;
            assert_int_equal(stat(path, &sb), 0);
            assert_int_equal(((size_t)sb.st_size - t->nbytes) % 64, 0);
            af_tensor u;
            assert_int_equal(af_tensor_load_npy(path, &u, &err), AF_OK);
            assert_int_equal(u.dtype, t->dtype);
            assert_int_equal(u.rank, t->rank);
            assert_int_equal(u.nbytes, t->nbytes);
            assert_memory_equal(u.data, t->data, t->nbytes);
            af_tensor_release(&u);
            af_tensor_free(t);
        }
    }
    af_tensor *bf = af_tensor_new(AF_DTYPE_BFLOAT16, 0, NULL);
    assert_int_equal(af_tensor_save_npy(path, bf, &err), AF_ERR_UNSUPPORTED);
    af_tensor_free(bf);
}

/* A .npy file with header `h` (padded as numpy does unless raw) and `data` bytes. */
static void write_npy(const char *path, int version, const char *h, size_t ndata) {
    buf b = {0};
    put_raw(&b, "\x93NUMPY", 6);
    unsigned char v[2] = {(unsigned char)version, 0};
    put_raw(&b, v, 2);
    size_t hl = strlen(h);
    unsigned char len[4] = {(unsigned char)hl, (unsigned char)(hl >> 8), 0, 0};
    put_raw(&b, len, version == 1 ? 2 : 4);
    put_raw(&b, h, hl);
    for (size_t i = 0; i < ndata; i++) put_raw(&b, "\x01", 1);
    write_file(path, b.p, b.n);
    free(b.p);
}

static void test_npy_hostile(void **state) {
    (void)state;
    static const struct {
        int version;
        const char *header;
        size_t ndata;
        const char *word;
    } cases[] = {
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8, NULL},
        {3, "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (1, 2L)}", 16, NULL},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 7, "needs 8"},
        {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 8, "Fortran"},
        {1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8, "descr"},
        {1, "{'descr': '<U8', 'fortran_order': False, 'shape': (2,), }\n", 8, "descr"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", 8, "shape"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 8,
         "overflow"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8,
         "shape"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "shape"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", 8, "key"},
        {1, "{'descr': '<f4', 'fortran_order': False}", 4, "lacks"},
        {1, "{'descr': '<f4", 8, "malformed"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", 8, "trailing"},
        {1, "[1, 2]", 8, "dict"},
        {4, "{}", 0, "version"},
    };
    char path[600];
    snprintf(path, sizeof path, "%s/h.npy", tmp_dir);
    for (size_t i = 0; i < AF_COUNT(cases); i++) {
        write_npy(path, cases[i].version, cases[i].header, cases[i].ndata);
        af_tensor t;
        af_error err = {0};
        af_status st = af_tensor_load_npy(path, &t, &err);
        if (!cases[i].word) {
            if (st != AF_OK) fail_msg("case %zu: %s", i, err.message);
            af_tensor_release(&t);
        } else if (st == AF_OK || !strstr(err.message, cases[i].word)) {
            fail_msg("case %zu: status %d, message '%s', expected '%s'", i, st, err.message,
                     cases[i].word);
        }
    }
    /* a header length past the end, and a file shorter than the magic */
    write_file(path, "\x93NUMPY\x01\x00\xff\x7f{}", 12);
    af_tensor t;
    af_error err;
    assert_int_equal(af_tensor_load_npy(path, &t, &err), AF_ERR_PARSE);
    write_file(path, "\x93NUM", 4);
    assert_int_equal(af_tensor_load_npy(path, &t, &err), AF_ERR_PARSE);
}

/* ---- the generated hostile files ----------------------------------------------------------------
 */

static const char *status_name(af_status s) {
    static const char *names[] = {"AF_OK",
                                  "AF_ERR_IO",
                                  "AF_ERR_PARSE",
                                  "AF_ERR_INVALID_MODEL",
                                  "AF_ERR_UNSUPPORTED",
                                  "AF_ERR_INVALID_ARG",
                                  "AF_ERR_NOMEM",
                                  "AF_ERR_RUNTIME",
                                  "AF_ERR_INTERNAL"};
    return (unsigned)s < AF_COUNT(names) ? names[s] : "?";
}

static void test_generated_models(void **state) {
    (void)state;
    if (!bad_models_dir) {
        print_message("no folder of generated models (argv[1] or AF_BAD_MODELS_DIR): skipped\n");
        skip();
    }
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/expected.tsv", bad_models_dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    int cases = 0, failures = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *name = strtok(line, "\t"), *status = strtok(NULL, "\t"), *word = strtok(NULL, "\t");
        if (!name || !status) continue;
        snprintf(path, sizeof path, "%s/%s/model.onnx", bad_models_dir, name);
        af_model *m;
        af_error err = {0};
        af_status st = tu_load(path, &m, &err);
        if (st == AF_OK) af_model_free(m);
        if (strcmp(status_name(st), status) || (word && !strstr(err.message, word))) {
            print_error("%s: expected %s '%s', got %s: %s\n", name, status, word ? word : "",
                        status_name(st), err.message);
            failures++;
        }
        cases++;
    }
    fclose(f);
    assert_true(cases >= 20);
    assert_int_equal(failures, 0);
}

static int rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

int main(int argc, char **argv) {
    bad_models_dir = argc > 1 ? argv[1] : getenv("AF_BAD_MODELS_DIR");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_fields),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_reader_repeated_and_depth),
        cmocka_unit_test(test_small_model),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_initializer_as_input_default),
        cmocka_unit_test(test_float16_rule),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_graph_errors),
        cmocka_unit_test(test_typed_tensors),
        cmocka_unit_test(test_subgraphs),
        cmocka_unit_test(test_capture_order),
        cmocka_unit_test(test_load_file_and_external_data),
        cmocka_unit_test(test_tensor_pb),
        cmocka_unit_test(test_npy_roundtrip),
        cmocka_unit_test(test_npy_hostile),
        cmocka_unit_test(test_generated_models),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rm_tree(tmp_dir);
    return failed;
}
