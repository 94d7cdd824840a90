/* Pass unit tests (simplify, canonicalize): small graphs built with the IR API, each checked for
 * the exact op counts after the pass and for the same outputs before and after it (both runs
 * through the reference executor on the same random inputs, rtol 1e-5). Near-miss graphs must
 * come out untouched.
 *
 * Also a driver for real models and the conformance data (not run by ctest):
 *   test_passes --model=M.onnx [--count]                      op histograms before/after, and
 *                                                            (without --count) optimized vs
 *                                                            unoptimized outputs on random inputs
 * Exit status of the drivers: 0 same, 1 the passes broke something, 2 the unoptimized graph
 * fails already, 3 the model does not load.
 *   test_passes --suite=DIR [--filter=S] [-v]                 every DIR/<case>/model.onnx with
 *                                                            its test_data_set_0, per case in a
 *                                                            child process
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "onnx/onnx.h"
#include "passes/passes.h"
#include "runtime/exec.h"

/* ---- graph building ------------------------------------------------------------------------ */

typedef struct tg {
    af_arena *a;
    af_graph *g;
} tg;

static tg tg_new(int64_t opset) {
    tg t = {af_arena_new(), NULL};
    t.g = af_graph_new(t.a, "test.onnx", NULL);
    t.g->opsets = af_arena_calloc(t.a, 1, sizeof(af_opset));
    t.g->opsets[0] = (af_opset){"", opset};
    t.g->nopsets = 1;
    t.g->inputs = af_arena_calloc(t.a, 8, sizeof(af_value *));
    t.g->outputs = af_arena_calloc(t.a, 8, sizeof(af_value *));
    return t;
}

static af_value *input_in(af_graph *g, const char *name, af_dtype dt, int rank,
                          const int64_t *dims) {
    af_value *v = af_value_new(g, name);
    v->type.dtype = dt;
    v->type.rank = rank;
    for (int i = 0; i < rank; i++) v->type.dims[i] = dims[i];
    v->is_input = true;
    g->inputs[g->ninputs++] = v;
    return v;
}

static af_value *input(tg *t, const char *name, int rank, const int64_t *dims) {
    return input_in(t->g, name, AF_DTYPE_FLOAT, rank, dims);
}

static void output_in(af_graph *g, af_value *v) {
    if (v->graph == g) v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

static af_value *cst_in(af_graph *g, af_dtype dt, int rank, const int64_t *dims,
                        const double *vals) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "c"), dt, rank, dims);
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++) {
        if (dt == AF_DTYPE_FLOAT) ((float *)v->type.data)[i] = (float)vals[i];
        else if (dt == AF_DTYPE_INT64) ((int64_t *)v->type.data)[i] = (int64_t)vals[i];
        else if (dt == AF_DTYPE_BOOL) ((uint8_t *)v->type.data)[i] = vals[i] != 0;
    }
    return v;
}

/* A float scalar constant (rank 0). */
static af_value *sc(tg *t, double v) { return cst_in(t->g, AF_DTYPE_FLOAT, 0, NULL, &v); }

static af_value *ints(tg *t, int n, const double *v) {
    int64_t d = n;
    return cst_in(t->g, AF_DTYPE_INT64, 1, &d, v);
}

/* A node `op` of g reading in[0..nin), with nout fresh outputs; returns the node. */
static af_node *mk_in(af_graph *g, const char *op, int nin, af_value *const *in, int nout) {
    af_op id = af_op_lookup("", op);
    if (id == AF_OP_COUNT) id = af_op_lookup(AF_DOMAIN, op);
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, NULL, nin, nout);
    for (int i = 0; i < nin; i++) af_node_set_input(n, i, in[i]);
    for (int o = 0; o < nout; o++)
        af_node_set_output(n, o, af_value_new(g, af_graph_unique_name(g, "v")));
    return n;
}

static af_value *op1(tg *t, const char *op, af_value *a) {
    return mk_in(t->g, op, 1, (af_value *[]){a}, 1)->out[0];
}

static af_value *op2(tg *t, const char *op, af_value *a, af_value *b) {
    return mk_in(t->g, op, 2, (af_value *[]){a, b}, 1)->out[0];
}

static void attr_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INTS);
    a->n = count;
    a->ints = af_arena_calloc(n->graph->arena, (size_t)count, sizeof(int64_t));
    memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
}

static void attr_int(af_node *n, const char *name, int64_t v) {
    af_node_add_attr(n, name, AF_ATTR_INT)->i = v;
}

static void attr_float(af_node *n, const char *name, float v) {
    af_node_add_attr(n, name, AF_ATTR_FLOAT)->f = v;
}

static void finish_graph(af_graph *g) {
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    if (af_graph_infer_shapes(g, &err)) fail_msg("%s", err.message);
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
}

/* ---- running and comparing ----------------------------------------------------------------- */


/* Inputs for g: floats in [-3, 3), integers 0/1, bools. Caller releases. */
static af_tensor *make_inputs(const af_graph *g) {
    af_tensor *in = calloc((size_t)g->ninputs + 1, sizeof(af_tensor));
    for (int i = 0; i < g->ninputs; i++) {
        const af_tensor *ty = &g->inputs[i]->type;
        in[i].dtype = ty->dtype;
        in[i].rank = ty->rank;
        for (int k = 0; k < ty->rank; k++) in[i].dims[k] = ty->dims[k] < 0 ? 1 : ty->dims[k];
        if (g->inputs[i]->is_const || af_tensor_alloc(&in[i], NULL)) continue;
        for (int64_t k = 0; k < af_tensor_numel(&in[i]); k++) {
            double v = (tu_rnd() + 1.0) * 0.5;
            switch (ty->dtype) {
            case AF_DTYPE_FLOAT: ((float *)in[i].data)[k] = (float)(6 * v - 3); break;
            case AF_DTYPE_DOUBLE: ((double *)in[i].data)[k] = 6 * v - 3; break;
            case AF_DTYPE_INT64: ((int64_t *)in[i].data)[k] = v < 0.5 ? 0 : 1; break;
            case AF_DTYPE_INT32: ((int32_t *)in[i].data)[k] = v < 0.5 ? 0 : 1; break;
            case AF_DTYPE_BOOL: ((uint8_t *)in[i].data)[k] = v < 0.5; break;
            default: break;
            }
        }
    }
    return in;
}

static af_status run(const af_graph *g, const af_tensor *in, af_tensor *out, af_error *err) {
    const af_tensor **bound = calloc((size_t)g->ninputs + 1, sizeof(af_tensor *));
    for (int i = 0; i < g->ninputs; i++) bound[i] = in[i].data ? &in[i] : NULL;
    af_status st = af_exec_graph(g, bound, out, err);
    free(bound);
    return st;
}

/* Worst |a-b| / (atol/rtol + |b|) over all elements, in units of rtol (<= 1 passes). */
static double mismatch(const af_tensor *a, const af_tensor *b, double rtol, double atol) {
    if (a->dtype != b->dtype || a->rank != b->rank) return INFINITY;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return INFINITY;
    double worst = 0;
    int64_t n = af_tensor_numel(a);
    bool fl = a->dtype == AF_DTYPE_FLOAT || a->dtype == AF_DTYPE_DOUBLE ||
              a->dtype == AF_DTYPE_FLOAT16 || a->dtype == AF_DTYPE_BFLOAT16;
    for (int64_t i = 0; i < n; i++) {
        double x = af_tensor_get_double(a, i), y = af_tensor_get_double(b, i);
        if (isnan(x) && isnan(y)) continue;
        if (!fl) {
            if (af_tensor_get_int(a, i) != af_tensor_get_int(b, i)) return INFINITY;
            continue;
        }
        if (x == y) continue;
        double e = fabs(x - y) / (atol + rtol * fabs(y));
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static void release_all(af_tensor *t, int n) {
    for (int i = 0; i < n; i++) af_tensor_release(&t[i]);
    free(t);
}

typedef af_status (*pass_fn)(af_graph *, af_error *);

/* Run g, apply the pass, verify, run again on the same inputs: outputs must agree. */
static void check_pass(af_graph *g, pass_fn pass) {
    af_error err;
    af_tensor *in = make_inputs(g);
    af_tensor *before = calloc((size_t)g->noutputs + 1, sizeof(af_tensor));
    af_tensor *after = calloc((size_t)g->noutputs + 1, sizeof(af_tensor));
    const char *names[8];
    for (int i = 0; i < g->noutputs && i < 8; i++) names[i] = g->outputs[i]->name;
    if (run(g, in, before, &err)) fail_msg("before: %s", err.message);
    if (pass(g, &err)) fail_msg("pass: %s", err.message);
    if (af_graph_verify(g, &err)) fail_msg("verify: %s", err.message);
    for (int i = 0; i < g->noutputs && i < 8; i++)
        assert_string_equal(g->outputs[i]->name, names[i]);
    if (run(g, in, after, &err)) fail_msg("after: %s", err.message);
    for (int i = 0; i < g->noutputs; i++) {
        double e = mismatch(&after[i], &before[i], 1e-5, 1e-6);
        if (e > 1) fail_msg("output %d differs (%.3g x tolerance)", i, e);
    }
    release_all(in, g->ninputs);
    release_all(before, g->noutputs);
    release_all(after, g->noutputs);
}

/* Ours first: our Gelu shares its name with ONNX's (opset 20), which canonicalize replaces. */
static int count(const af_graph *g, const char *op) {
    af_op id = af_op_lookup(AF_DOMAIN, op);
    if (id == AF_OP_COUNT) id = af_op_lookup("", op);
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) c += g->nodes[i]->op == id;
    return c;
}

/* ---- simplify ------------------------------------------------------------------------------ */

static const int64_t D23[] = {2, 3}, D234[] = {2, 3, 4};

static void test_fold_arithmetic(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_value *k = op2(&t, "Mul", sc(&t, 2), op1(&t, "Exp", sc(&t, 1)));
    output_in(t.g, op2(&t, "Add", x, k));
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(t.g->nnodes, 1);
    assert_int_equal(count(t.g, "Add"), 1);
    assert_true(t.g->nodes[0]->in[1]->is_const);
    af_arena_free(t.a);
}

/* x -> Shape -> Gather(2) -> Unsqueeze -> Concat([-1], .) -> Reshape(x, .): all but the
 * Reshape fold once x's dims are known (the exported ViT's Slice arithmetic has this shape). */
/* Reshape(x, Concat([-1], Unsqueeze(Shape(x)[axis] + 0))) */
static af_graph *shape_chain(tg *t, const int64_t *dims, int axis) {
    af_value *x = input(t, "x", 3, dims);
    af_value *s = op1(t, "Shape", x);
    af_value *idx = cst_in(t->g, AF_DTYPE_INT64, 0, NULL, (double[]){axis});
    af_value *g = mk_in(t->g, "Gather", 2, (af_value *[]){s, idx}, 1)->out[0];
    af_value *zero = cst_in(t->g, AF_DTYPE_INT64, 0, NULL, (double[]){0});
    af_value *u = op2(t, "Unsqueeze", op2(t, "Add", g, zero), ints(t, 1, (double[]){0}));
    af_node *cat = mk_in(t->g, "Concat", 2, (af_value *[]){ints(t, 1, (double[]){-1}), u}, 1);
    attr_int(cat, "axis", 0);
    output_in(t->g, op2(t, "Reshape", x, cat->out[0]));
    finish_graph(t->g);
    return t->g;
}

static void test_fold_shape_chain(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_graph *g = shape_chain(&t, D234, 2);
    assert_int_equal(g->nnodes, 6);
    check_pass(g, af_pass_simplify);
    assert_int_equal(g->nnodes, 1);
    assert_int_equal(count(g, "Reshape"), 1);
    const af_value *shape = g->nodes[0]->in[1];
    assert_true(shape->is_const);
    assert_int_equal(((int64_t *)shape->type.data)[0], -1);
    assert_int_equal(((int64_t *)shape->type.data)[1], 4);
    assert_int_equal(g->outputs[0]->type.dims[0], 6); /* shapes inferred again */
    af_arena_free(t.a);
}

/* A dynamic dim is a symbol: Shape(x)[2] of x [N, 3, 4] is still 4, so the chain folds and the
 * Reshape's -1 is 3*N. */
static void test_shape_symbolic_dims_fold(void **state) {
    (void)state;
    tg t = tg_new(17);
    const int64_t dims[] = {-1, 3, 4};
    af_graph *g = shape_chain(&t, dims, 2);
    af_error err;
    assert_int_equal(af_graph_infer_shapes(g, &err), AF_OK);
    assert_int_equal(af_pass_simplify(g, &err), AF_OK);
    assert_int_equal(g->nnodes, 1);
    int64_t n = g->inputs[0]->type.dims[0], y0 = g->outputs[0]->type.dims[0];
    char buf[32];
    assert_true(af_dim_is_sym(n));
    assert_int_equal(y0, af_dim_mul(g, 3, n));
    assert_string_equal(af_dim_str(g, y0, buf, sizeof buf), "3*unk__0");
    assert_int_equal(g->outputs[0]->type.dims[1], 4);
    af_arena_free(t.a);
}

/* Reshape(x, [-1, N]) of x [N, 3, 4] (Shape(x)[0] + 0 is N): no constant shape says that (N
 * is not x's dim 1), so the chain stays; the output still gets its dims [12, N] from it. */
static void test_shape_symbolic_sum_stays(void **state) {
    (void)state;
    tg t = tg_new(17);
    const int64_t dims[] = {-1, 3, 4};
    af_graph *g = shape_chain(&t, dims, 0);
    af_error err;
    assert_int_equal(af_graph_infer_shapes(g, &err), AF_OK);
    assert_int_equal(af_pass_simplify(g, &err), AF_OK);
    assert_int_equal(g->nnodes, 6);
    assert_int_equal(count(g, "Shape"), 1);
    assert_int_equal(g->outputs[0]->type.dims[0], 12);
    assert_int_equal(g->outputs[0]->type.dims[1], g->inputs[0]->type.dims[0]);
    af_arena_free(t.a);
}

/* Scalar dim `axis` of x: Gather(Shape(x), axis). */
static af_value *dim_of(tg *t, af_value *x, int axis) {
    af_value *idx = cst_in(t->g, AF_DTYPE_INT64, 0, NULL, (double[]){axis});
    return mk_in(t->g, "Gather", 2, (af_value *[]){op1(t, "Shape", x), idx}, 1)->out[0];
}

/* 100 Pads in a row, each padding x [N, 4, 3] by Shape(x)[1] % 2 (0) at the end of axis 1, as
 * Swin's window partitions do: each Pad's dims are known only once the rounds before it folded
 * its pads, so this takes more than the 16 rounds simplify once stopped at (Swin-T's last stage
 * kept unknown dims and lost its fusions). */
static void test_fold_many_rounds(void **state) {
    (void)state;
    tg t = tg_new(17);
    const int64_t d[] = {-1, 4, 3};
    af_value *x = input(&t, "x", 3, d);
    for (int k = 0; k < 100; k++) {
        af_value *two = cst_in(t.g, AF_DTYPE_INT64, 0, NULL, (double[]){2});
        af_value *u = op2(&t, "Unsqueeze", op2(&t, "Mod", dim_of(&t, x, 1), two), ints(&t, 1, (double[]){0}));
        af_node *cat = mk_in(t.g, "Concat", 3,
                             (af_value *[]){ints(&t, 4, (double[]){0, 0, 0, 0}), u, ints(&t, 1, (double[]){0})}, 1);
        attr_int(cat, "axis", 0);
        x = op2(&t, "Pad", x, cat->out[0]);
    }
    output_in(t.g, x);
    finish_graph(t.g);
    af_error err;
    assert_int_equal(af_graph_infer_shapes(t.g, &err), AF_OK);
    assert_int_equal(af_pass_simplify(t.g, &err), AF_OK);
    assert_int_equal(count(t.g, "Shape"), 0);
    assert_int_equal(x->type.dims[1], 4);
    assert_int_equal(x->type.dims[2], 3);
    af_arena_free(t.a);
}

/* GPT-2 with past keys, dynamic: Concat(past [N, 2, P, 3], new [N, 2, S, 3]) on axis 2 is
 * (P+S) long, a sum leaf; Range(P, P + S, 1) is S long; table[:, :, K - S : K] with K the
 * Concat's dim 2 is S long, and table[:, :, :, :K] is K long. Nothing else is known. */
static void test_shape_symbolic_sums(void **state) {
    (void)state;
    tg t = tg_new(17);
    const int64_t dp[] = {-1, 2, -1, 3}, dt[] = {1, 1, 16, 16};
    af_value *past = input(&t, "past", 4, dp), *cur = input(&t, "cur", 4, dp);
    af_node *cat = mk_in(t.g, "Concat", 2, (af_value *[]){past, cur}, 1);
    attr_int(cat, "axis", 2);
    output_in(t.g, cat->out[0]);
    af_value *P = dim_of(&t, past, 2), *S = dim_of(&t, cur, 2), *K = dim_of(&t, cat->out[0], 2);
    af_value *one = cst_in(t.g, AF_DTYPE_INT64, 0, NULL, (double[]){1});
    af_value *range = mk_in(t.g, "Range", 3, (af_value *[]){P, op2(&t, "Add", P, S), one}, 1)->out[0];
    output_in(t.g, range);
    double zeros[256] = {0};
    af_value *table = cst_in(t.g, AF_DTYPE_FLOAT, 4, dt, zeros);
    af_value *axes0 = ints(&t, 1, (double[]){0});
    af_value *st = op2(&t, "Unsqueeze", op2(&t, "Sub", K, S), axes0);
    af_value *en = op2(&t, "Unsqueeze", K, ints(&t, 1, (double[]){0}));
    af_value *rows = mk_in(t.g, "Slice", 4, (af_value *[]){table, st, en, ints(&t, 1, (double[]){2})}, 1)->out[0];
    af_value *cols = mk_in(t.g, "Slice", 4, (af_value *[]){rows, ints(&t, 1, (double[]){0}), en,
                                                            ints(&t, 1, (double[]){3})}, 1)->out[0];
    output_in(t.g, cols);
    finish_graph(t.g);
    af_graph *g = t.g;
    af_error err;
    assert_int_equal(af_graph_infer_shapes(g, &err), AF_OK);
    assert_int_equal(af_pass_simplify(g, &err), AF_OK);
    int64_t p = g->inputs[0]->type.dims[2], s = g->inputs[1]->type.dims[2];
    int64_t k = g->outputs[0]->type.dims[2];
    assert_true(af_dim_is_sym(p) && af_dim_is_sym(s) && af_dim_is_sym(k));
    assert_int_equal(k, af_dim_add(g, s, p)); /* one leaf, either order */
    assert_int_equal(af_dim_sub(g, k, p), s);
    assert_int_equal(af_dim_sub(g, k, s), p);
    assert_int_equal(af_dim_sub(g, k, af_dim_mul(g, 2, s)), AF_DIM_UNKNOWN);
    assert_int_equal(af_dim_add(g, 3, 4), 7);
    assert_int_equal(af_dim_sub(g, 3, 4), AF_DIM_UNKNOWN); /* a dim is never negative */
    assert_int_equal(g->outputs[1]->type.rank, 1);
    assert_int_equal(g->outputs[1]->type.dims[0], s);
    const int64_t want[4] = {1, 1, s, k};
    assert_int_equal(g->outputs[2]->type.rank, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(g->outputs[2]->type.dims[i], want[i]);
    af_arena_free(t.a);
}

/* An initializer that is also a graph input can be overridden: never folded. */
static void test_overridable_default_not_folded(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_value *w = cst_in(t.g, AF_DTYPE_FLOAT, 2, D23, (double[]){1, 2, 3, 4, 5, 6});
    w->is_input = true;
    t.g->inputs[t.g->ninputs++] = w;
    output_in(t.g, op2(&t, "Add", x, op1(&t, "Neg", w)));
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(count(t.g, "Neg"), 1);
    af_arena_free(t.a);
}

/* Identity, inference-mode Dropout and a Dropout that trains with ratio 0 (torchvision's Swin
 * exports these) are copies. */
static void test_identity_and_dropout_removed(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_value *a = op1(&t, "Identity", op1(&t, "Relu", x));
    af_node *drop = mk_in(t.g, "Dropout", 1, (af_value *[]){a}, 2); /* mask unused */
    double on = 1;
    af_value *training = cst_in(t.g, AF_DTYPE_BOOL, 0, NULL, &on);
    af_node *d0 = mk_in(t.g, "Dropout", 3, (af_value *[]){drop->out[0], sc(&t, 0.0), training}, 1);
    output_in(t.g, op1(&t, "Neg", d0->out[0]));
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(t.g->nnodes, 2);
    assert_int_equal(count(t.g, "Identity") + count(t.g, "Dropout"), 0);
    af_arena_free(t.a);
}

/* A Reshape to the shape it reads is a copy; one that changes the shape is not. */
static void test_same_shape_reshape_removed(void **state) {
    (void)state;
    static const double same[] = {0, -1}, other[] = {3, 2};
    tg t = tg_new(17);
    af_value *x = op1(&t, "Relu", input(&t, "x", 2, D23));
    af_value *r = op2(&t, "Reshape", op2(&t, "Reshape", x, ints(&t, 2, same)), ints(&t, 2, other));
    output_in(t.g, op1(&t, "Neg", r));
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(count(t.g, "Reshape"), 1);
    af_arena_free(t.a);
}

/* Cast float->float is a copy; Cast float->int64 is not. */
static void test_same_type_cast_removed(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_node *same = mk_in(t.g, "Cast", 1, (af_value *[]){op1(&t, "Neg", x)}, 1);
    attr_int(same, "to", AF_DTYPE_FLOAT);
    af_node *other = mk_in(t.g, "Cast", 1, (af_value *[]){same->out[0]}, 1);
    attr_int(other, "to", AF_DTYPE_INT64);
    output_in(t.g, other->out[0]);
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(t.g->nnodes, 2);
    assert_int_equal(count(t.g, "Cast"), 1);
    af_arena_free(t.a);
}

/* A float16 graph widened (passes/widen.c): a float32 input cast to half, a half constant, a
 * half input and a half output. Afterwards every value but the half interface is float32, the
 * interface gets one Cast each way, the model's own Casts copy (simplify drops them), and the
 * graph computes what the half graph means to float32 precision. */
static void test_widen_halves(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_value *z = input_in(t.g, "z", AF_DTYPE_FLOAT16, 2, D23);
    af_node *to_half = mk_in(t.g, "Cast", 1, (af_value *[]){x}, 1);
    attr_int(to_half, "to", AF_DTYPE_FLOAT16);
    int64_t three = 3;
    af_value *c = af_value_new_const(t.g, "c", AF_DTYPE_FLOAT16, 1, &three);
    for (int i = 0; i < 3; i++) ((uint16_t *)c->type.data)[i] = af_float_to_half(0.5f * (float)i - 0.5f);
    af_value *r = op1(&t, "Relu", op2(&t, "Add", to_half->out[0], c));
    af_node *to_float = mk_in(t.g, "Cast", 1, (af_value *[]){r}, 1);
    attr_int(to_float, "to", AF_DTYPE_FLOAT);
    output_in(t.g, to_float->out[0]);
    af_value *w = op2(&t, "Mul", z, to_half->out[0]);
    af_tensor_set_type(&w->type, AF_DTYPE_FLOAT16, 2, D23); /* declared, as a file does */
    output_in(t.g, w);
    af_graph *g = t.g;
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    if (af_pass_widen_halves(g, &err) || af_graph_infer_shapes(g, &err) || af_graph_verify(g, &err))
        fail_msg("%s", err.message);
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        bool half = v->type.dtype == AF_DTYPE_FLOAT16;
        if (half != (v == z || v == w)) fail_msg("value %s is %s", v->name, af_dtype_name(v->type.dtype));
    }
    assert_int_equal(count(g, "Cast"), 4); /* the model's two, now copies, and the interface's */
    af_tensor in[2] = {{.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {2, 3}},
                       {.dtype = AF_DTYPE_FLOAT16, .rank = 2, .dims = {2, 3}}};
    assert_int_equal(af_tensor_alloc(&in[0], NULL), AF_OK);
    assert_int_equal(af_tensor_alloc(&in[1], NULL), AF_OK);
    for (int i = 0; i < 6; i++) {
        ((float *)in[0].data)[i] = 0.3f * (float)i - 0.9f;
        ((uint16_t *)in[1].data)[i] = af_float_to_half(1.5f - 0.25f * (float)i);
    }
    af_tensor out[2];
    memset(out, 0, sizeof out);
    if (run(g, in, out, &err)) fail_msg("%s", err.message);
    assert_int_equal(out[0].dtype, AF_DTYPE_FLOAT);
    assert_int_equal(out[1].dtype, AF_DTYPE_FLOAT16);
    for (int i = 0; i < 6; i++) {
        float xv = ((float *)in[0].data)[i], zv = af_half_to_float(((uint16_t *)in[1].data)[i]);
        float want_y = fmaxf(xv + 0.5f * (float)(i % 3) - 0.5f, 0.0f);
        assert_float_equal(((float *)out[0].data)[i], want_y, 1e-6);
        assert_float_equal(af_half_to_float(((uint16_t *)out[1].data)[i]), zv * xv, 2e-3);
    }
    af_pass_simplify(g, &err);
    assert_int_equal(count(g, "Cast"), 2); /* the copies went */
    for (int i = 0; i < 2; i++) af_tensor_release(&in[i]), af_tensor_release(&out[i]);
    af_arena_free(t.a);
}

/* Identity writing a graph output: its producer takes over the output's name. */
static void test_identity_output_renamed(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    af_value *r = op1(&t, "Relu", x);
    af_value *y = op1(&t, "Identity", r);
    af_value *z = op1(&t, "Neg", r);
    output_in(t.g, y);
    output_in(t.g, z);
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(t.g->nnodes, 2);
    assert_int_equal(count(t.g, "Identity"), 0);
    assert_ptr_equal(t.g->outputs[0], y);
    assert_int_equal(y->producer->op, AF_OP_RELU);
    assert_ptr_equal(z->producer->in[0], y);
    af_arena_free(t.a);
}

/* Identity of a graph input into a graph output, and a Dropout whose mask is used or whose
 * training mode is not known: all stay. */
static void test_copies_that_stay(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    output_in(t.g, op1(&t, "Identity", x));
    af_node *d1 = mk_in(t.g, "Dropout", 1, (af_value *[]){op1(&t, "Relu", x)}, 2);
    output_in(t.g, d1->out[0]);
    output_in(t.g, d1->out[1]);
    af_value *nx = op1(&t, "Neg", x), *training = op1(&t, "IsNaN", op1(&t, "ReduceSum", nx));
    af_node *d2 = mk_in(t.g, "Dropout", 3, (af_value *[]){nx, sc(&t, 0.5), training}, 1);
    output_in(t.g, d2->out[0]);
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(count(t.g, "Identity"), 1);
    assert_int_equal(count(t.g, "Dropout"), 2);
    af_arena_free(t.a);
}

static void test_dead_nodes_removed(void **state) {
    (void)state;
    tg t = tg_new(17);
    af_value *x = input(&t, "x", 2, D23);
    op1(&t, "Sqrt", op1(&t, "Exp", x)); /* read by nobody */
    output_in(t.g, op1(&t, "Neg", x));
    finish_graph(t.g);
    check_pass(t.g, af_pass_simplify);
    assert_int_equal(t.g->nnodes, 1);
    assert_int_equal(count(t.g, "Neg"), 1);
    af_arena_free(t.a);
}

/* If whose then-branch computes outer constants (folds inside the body) and whose else-branch
 * copies an outer value through an Identity (an output: stays). Runs both ways. */
static void test_subgraph_folded(void **state) {
    (void)state;
    for (int branch = 0; branch < 2; branch++) {
        tg t = tg_new(17);
        af_value *x = input(&t, "x", 2, D23);
        af_value *cond = input_in(t.g, "cond", AF_DTYPE_BOOL, 0, NULL);
        af_value *c1 = cst_in(t.g, AF_DTYPE_FLOAT, 2, D23, (double[]){1, 2, 3, 4, 5, 6});
        af_value *nx = op1(&t, "Neg", x);
        af_graph *then_g = af_graph_new(t.a, "test.onnx", t.g);
        af_graph *else_g = af_graph_new(t.a, "test.onnx", t.g);
        then_g->outputs = af_arena_calloc(t.a, 1, sizeof(af_value *));
        else_g->outputs = af_arena_calloc(t.a, 1, sizeof(af_value *));
        af_value *c1in = af_graph_find(then_g, c1->name);
        af_value *sum = mk_in(then_g, "Add", 2, (af_value *[]){c1in, c1in}, 1)->out[0];
        output_in(then_g, mk_in(then_g, "Exp", 1, (af_value *[]){sum}, 1)->out[0]);
        af_value *nxin = af_graph_find(else_g, nx->name);
        output_in(else_g, mk_in(else_g, "Identity", 1, (af_value *[]){nxin}, 1)->out[0]);
        af_node *n = mk_in(t.g, "If", 1, (af_value *[]){cond}, 1);
        af_node_add_attr(n, "then_branch", AF_ATTR_GRAPH)->g = then_g;
        af_node_add_attr(n, "else_branch", AF_ATTR_GRAPH)->g = else_g;
        output_in(t.g, n->out[0]);
        finish_graph(t.g);
        tu_rng = 7 + (uint64_t)branch;
        check_pass(t.g, af_pass_simplify);
        assert_int_equal(then_g->nnodes, 0);
        assert_int_equal(then_g->ncaptures, 0); /* c1 is no longer read */
        assert_int_equal(else_g->nnodes, 1);
        assert_int_equal(t.g->nnodes, 2);
        af_arena_free(t.a);
    }
}

/* ---- canonicalize: LayerNorm --------------------------------------------------------------- */

typedef struct ln_opts {
    bool gamma, beta;
    bool mul_square;     /* d*d instead of Pow(d, 2) */
    bool reciprocal;     /* d * Reciprocal(Sqrt(.)) instead of Div */
    int64_t mean_axis;   /* axis of the first ReduceMean */
    bool mean_escapes;   /* the mean is also a graph output */
    bool eps_input;      /* eps is a graph input */
    double exponent;
    bool gamma_2d;       /* gamma of shape [1, C] */
} ln_opts;

static const ln_opts LN_PLAIN = {true, true, false, false, -1, false, false, 2.0, false};

/* The decomposed LayerNorm torch exports at opset 13, x [2,3,8]. */
static af_graph *build_ln(tg *t, ln_opts o) {
    const int64_t xd[] = {2, 3, 8}, c = 8, c2[] = {1, 8};
    af_value *x = input(t, "x", 3, xd);
    af_node *m1 = mk_in(t->g, "ReduceMean", 1, (af_value *[]){x}, 1);
    attr_ints(m1, "axes", 1, &o.mean_axis);
    af_value *d = op2(t, "Sub", x, m1->out[0]);
    af_value *sq = o.mul_square ? op2(t, "Mul", d, d) : op2(t, "Pow", d, sc(t, o.exponent));
    af_node *m2 = mk_in(t->g, "ReduceMean", 1, (af_value *[]){sq}, 1);
    attr_ints(m2, "axes", 1, (int64_t[]){-1});
    af_value *eps = o.eps_input ? input(t, "eps", 0, NULL) : sc(t, 1e-5);
    af_value *sd = op1(t, "Sqrt", op2(t, "Add", m2->out[0], eps));
    af_value *y = o.reciprocal ? op2(t, "Mul", d, op1(t, "Reciprocal", sd)) : op2(t, "Div", d, sd);
    double gv[8], bv[8];
    for (int i = 0; i < 8; i++) gv[i] = 0.5 + 0.1 * i, bv[i] = 0.05 * i - 0.2;
    if (o.gamma)
        y = op2(t, "Mul", y,
                cst_in(t->g, AF_DTYPE_FLOAT, o.gamma_2d ? 2 : 1, o.gamma_2d ? c2 : &c, gv));
    if (o.beta) y = op2(t, "Add", cst_in(t->g, AF_DTYPE_FLOAT, 1, &c, bv), y);
    output_in(t->g, y);
    if (o.mean_escapes) output_in(t->g, m1->out[0]);
    finish_graph(t->g);
    return t->g;
}

/* want_rms: RMSNormalization nodes expected (a LayerNorm refused for its mean is still the RMSNorm
 * of x - mean, with gamma, the beta Add after it). */
static void ln_case_rms(ln_opts o, int want_ln, int want_rms, int want_nodes) {
    tg t = tg_new(13);
    af_graph *g = build_ln(&t, o);
    check_pass(g, af_pass_canonicalize);
    assert_int_equal(count(g, "LayerNormalization"), want_ln);
    assert_int_equal(count(g, "RMSNormalization"), want_rms);
    assert_int_equal(g->nnodes, want_nodes);
    if (want_ln == 1 && want_nodes == 1) {
        const af_node *n = g->nodes[0];
        assert_int_equal(af_attr_int(n, "axis", 0), -1);
        assert_float_equal(af_attr_float(n, "epsilon", 0), 1e-5f, 1e-12);
        assert_int_equal(n->nin, 3);
        assert_non_null(strstr(n->name, "LayerNormalization"));
    }
    af_arena_free(t.a);
}

static void ln_case(ln_opts o, int want_ln, int want_nodes) { ln_case_rms(o, want_ln, 0, want_nodes); }

static void test_layernorm(void **state) {
    (void)state;
    ln_case(LN_PLAIN, 1, 1);
    ln_opts o = LN_PLAIN;
    o.gamma = o.beta = false;
    ln_case(o, 1, 1);
    o = LN_PLAIN;
    o.mul_square = o.reciprocal = true;
    ln_case(o, 1, 1);
    o = LN_PLAIN;
    o.mean_axis = 2; /* rank 3: the last axis written positively */
    ln_case(o, 1, 1);
    o = LN_PLAIN;
    o.gamma_2d = true; /* does not fit Scale: LN with ones, then the Mul and Add stay */
    ln_case(o, 1, 3);
}

static void test_layernorm_near_misses(void **state) {
    (void)state;
    ln_opts o = LN_PLAIN;
    o.mean_escapes = true;
    ln_case_rms(o, 0, 1, 4); /* ReduceMean, Sub, RMSNormalization, Add */
    o = LN_PLAIN;
    o.eps_input = true;
    ln_case(o, 0, 9);
    o = LN_PLAIN;
    o.mean_axis = 1;
    ln_case_rms(o, 0, 1, 4);
    o = LN_PLAIN;
    o.exponent = 3.0;
    ln_case(o, 0, 9);
}

/* keepdims=0 on the variance's mean, and the centered value read a third time. */
static void test_layernorm_more_near_misses(void **state) {
    (void)state;
    for (int which = 0; which < 2; which++) {
        tg t = tg_new(13);
        af_graph *g = build_ln(&t, LN_PLAIN);
        af_node *sub = NULL, *m2 = NULL;
        for (int i = 0; i < g->nnodes; i++) {
            if (g->nodes[i]->op == AF_OP_SUB) sub = g->nodes[i];
            if (g->nodes[i]->op == AF_OP_REDUCE_MEAN) m2 = g->nodes[i];
        }
        if (which == 0) {
            /* The graph no longer type-checks (Div of [2,3,8] by [2,3]), so it is not run:
             * only the refusal is checked. */
            attr_int(m2, "keepdims", 0);
            af_error err;
            assert_int_equal(af_pass_canonicalize(g, &err), AF_OK);
            assert_int_equal(count(g, "LayerNormalization"), 0);
        } else {
            output_in(g, op1(&t, "Neg", sub->out[0]));
            finish_graph(g);
            check_pass(g, af_pass_canonicalize);
            assert_int_equal(count(g, "LayerNormalization"), 0);
        }
        af_arena_free(t.a);
    }
}

/* ---- canonicalize: RMSNorm ----------------------------------------------------------------- */

enum { RMS_DIV, RMS_ONE_OVER, RMS_RECIPROCAL, RMS_POW_HALF };

typedef struct rms_opts {
    bool mul_square;   /* x*x instead of Pow(x, 2) */
    int norm;          /* x / Sqrt, x * (1 / Sqrt) (T5), x * Reciprocal(Sqrt), x * Pow(., -0.5) */
    int gamma;         /* 0 none, 1 Mul(y, gamma), 2 Mul(gamma, y) (T5) */
    bool residual;     /* x is also read by an Add (the residual): still an RMSNorm */
    double exponent;   /* of the square */
    double one;        /* numerator of 1 / Sqrt */
    int64_t axis;      /* of the ReduceMean */
    bool ms_escapes;   /* the mean square is also a graph output */
    bool eps_input;    /* eps is a graph input */
    bool other_x;      /* the normalisation multiplies another tensor than the squared one */
    double times;      /* 0, or a constant scalar Mul after gamma (T5's d_model^-0.5) */
    bool gamma_input;  /* gamma is a graph input (not a constant) */
} rms_opts;

static const rms_opts RMS_PLAIN = {false, RMS_ONE_OVER, 2, false, 2.0, 1.0, -1, false, false, false, 0, false};

/* x [2,3,8] as T5's and LLaMA's RMSNorm exports. Nodes: 7 with gamma. */
static af_graph *build_rms(tg *t, rms_opts o) {
    const int64_t xd[] = {2, 3, 8}, c = 8;
    af_value *x = input(t, "x", 3, xd), *x2 = o.other_x ? input(t, "x2", 3, xd) : x;
    af_value *sq = o.mul_square ? op2(t, "Mul", x, x) : op2(t, "Pow", x, sc(t, o.exponent));
    af_node *ms = mk_in(t->g, "ReduceMean", 1, (af_value *[]){sq}, 1);
    attr_ints(ms, "axes", 1, &o.axis);
    af_value *eps = o.eps_input ? input(t, "eps", 0, NULL) : sc(t, 1e-6);
    af_value *v = op2(t, "Add", ms->out[0], eps), *y;
    if (o.norm == RMS_POW_HALF) {
        y = op2(t, "Mul", x2, op2(t, "Pow", v, sc(t, -0.5)));
    } else {
        af_value *sd = op1(t, "Sqrt", v);
        if (o.norm == RMS_DIV) y = op2(t, "Div", x2, sd);
        else if (o.norm == RMS_RECIPROCAL) y = op2(t, "Mul", op1(t, "Reciprocal", sd), x2);
        else y = op2(t, "Mul", x2, op2(t, "Div", sc(t, o.one), sd));
    }
    double gv[8];
    for (int i = 0; i < 8; i++) gv[i] = 0.5 + 0.1 * i;
    af_value *gamma = o.gamma_input ? input(t, "gamma", 1, &c) : cst_in(t->g, AF_DTYPE_FLOAT, 1, &c, gv);
    if (o.gamma) y = o.gamma == 1 ? op2(t, "Mul", y, gamma) : op2(t, "Mul", gamma, y);
    if (o.times != 0) y = op2(t, "Mul", y, sc(t, o.times));
    if (o.residual) y = op2(t, "Add", y, x);
    output_in(t->g, y);
    if (o.ms_escapes) output_in(t->g, ms->out[0]);
    finish_graph(t->g);
    return t->g;
}

static void rms_case(rms_opts o, int want_rms, int want_nodes) {
    tg t = tg_new(13);
    af_graph *g = build_rms(&t, o);
    check_pass(g, af_pass_canonicalize);
    assert_int_equal(count(g, "RMSNormalization"), want_rms);
    assert_int_equal(g->nnodes, want_nodes);
    assert_int_equal(count(g, "LayerNormalization"), 0);
    if (want_rms == 1) {
        const af_node *n = g->nodes[0];
        assert_int_equal(n->op, AF_OP_RMS_NORMALIZATION);
        assert_int_equal(af_attr_int(n, "axis", 0), -1);
        assert_float_equal(af_attr_float(n, "epsilon", 0), 1e-6f, 1e-12);
        assert_int_equal(n->nin, 2);
    }
    af_arena_free(t.a);
}

static void test_rmsnorm(void **state) {
    (void)state;
    rms_case(RMS_PLAIN, 1, 1);
    rms_opts o = RMS_PLAIN;
    o.mul_square = true;
    o.norm = RMS_RECIPROCAL;
    o.gamma = 1;
    rms_case(o, 1, 1);
    o = RMS_PLAIN;
    o.norm = RMS_DIV;
    o.gamma = 0; /* Scale of ones */
    rms_case(o, 1, 1);
    o = RMS_PLAIN;
    o.norm = RMS_POW_HALF;
    o.residual = true;
    rms_case(o, 1, 2);
    o = RMS_PLAIN;
    o.axis = 2; /* the last axis written positively */
    rms_case(o, 1, 1);
    o = RMS_PLAIN;
    o.times = 0.125; /* folded into gamma */
    rms_case(o, 1, 1);
    o.gamma = 0;
    rms_case(o, 1, 1);
    o = RMS_PLAIN;
    o.times = 0.125;
    o.gamma_input = true; /* gamma not constant: the scalar Mul stays after the norm */
    rms_case(o, 1, 2);
}

/* Each leaves the graph as it was: 7 nodes. */
static void test_rmsnorm_near_misses(void **state) {
    (void)state;
    rms_opts o = RMS_PLAIN;
    o.exponent = 3.0;
    rms_case(o, 0, 7);
    o = RMS_PLAIN;
    o.one = 2.0;
    rms_case(o, 0, 7);
    o = RMS_PLAIN;
    o.axis = 1;
    rms_case(o, 0, 7);
    o = RMS_PLAIN;
    o.ms_escapes = true;
    rms_case(o, 0, 7);
    o = RMS_PLAIN;
    o.eps_input = true;
    rms_case(o, 0, 7);
    o = RMS_PLAIN;
    o.other_x = true;
    o.norm = RMS_RECIPROCAL;
    rms_case(o, 0, 7);
}

/* ---- canonicalize: GroupNorm --------------------------------------------------------------- */

typedef struct gn_opts {
    bool gamma, beta;
    bool gamma_4d;      /* gamma [1, C, 1, 1] instead of [C, 1, 1] */
    bool gamma_flat;    /* gamma [6]: broadcasts along the last axis, not the channels */
    bool scale_not_one; /* the InstanceNormalization's scale is 2 */
    bool escapes;       /* the first Reshape's output is also a graph output */
} gn_opts;

static const gn_opts GN_PLAIN = {true, true, false, false, false, false};

/* torch.nn.GroupNorm(4, 8) as torch 1.13 exports it, x [2, 8, 5, 6]. */
static af_graph *build_gn(tg *t, gn_opts o) {
    const int64_t xd[] = {2, 8, 5, 6}, g4 = 4, c3[] = {8, 1, 1}, c4[] = {1, 8, 1, 1}, c1 = 6;
    af_value *x = input(t, "x", 4, xd);
    af_value *r = op2(t, "Reshape", x, ints(t, 3, (double[]){2, 4, -1}));
    double ones[4] = {o.scale_not_one ? 2 : 1, 1, 1, 1}, zeros[4] = {0};
    af_node *in = mk_in(t->g, "InstanceNormalization", 3,
                        (af_value *[]){r, cst_in(t->g, AF_DTYPE_FLOAT, 1, &g4, ones),
                                       cst_in(t->g, AF_DTYPE_FLOAT, 1, &g4, zeros)}, 1);
    attr_float(in, "epsilon", 1e-5f);
    af_value *y = op2(t, "Reshape", in->out[0], ints(t, 4, (double[]){2, 8, 5, 6}));
    double gv[8], bv[8];
    for (int i = 0; i < 8; i++) gv[i] = 0.5 + 0.1 * i, bv[i] = 0.05 * i - 0.2;
    int grank = o.gamma_4d ? 4 : o.gamma_flat ? 1 : 3;
    const int64_t *gd = o.gamma_4d ? c4 : o.gamma_flat ? &c1 : c3;
    if (o.gamma) y = op2(t, "Mul", y, cst_in(t->g, AF_DTYPE_FLOAT, grank, gd, gv));
    if (o.beta) y = op2(t, "Add", cst_in(t->g, AF_DTYPE_FLOAT, 3, c3, bv), y);
    output_in(t->g, y);
    if (o.escapes) output_in(t->g, r);
    finish_graph(t->g);
    return t->g;
}

static void gn_case(gn_opts o, int want_gn, int want_nodes) {
    tg t = tg_new(13);
    af_graph *g = build_gn(&t, o);
    check_pass(g, af_pass_canonicalize);
    assert_int_equal(count(g, "GroupNorm"), want_gn);
    assert_int_equal(g->nnodes, want_nodes);
    if (want_gn == 1 && want_nodes == 1) {
        const af_node *n = g->nodes[0];
        assert_int_equal(af_attr_int(n, "num_groups", 0), 4);
        assert_float_equal(af_attr_float(n, "epsilon", 0), 1e-5f, 1e-12);
        assert_int_equal(n->nin, 3);
        assert_int_equal(n->in[1]->type.rank, 1);
        assert_int_equal(n->in[1]->type.dims[0], 8);
    }
    af_arena_free(t.a);
}

static void test_groupnorm(void **state) {
    (void)state;
    gn_case(GN_PLAIN, 1, 1);
    gn_opts o = GN_PLAIN;
    o.gamma = o.beta = false; /* affine=False: unit scale, zero bias */
    gn_case(o, 1, 1);
    o = GN_PLAIN;
    o.gamma_4d = true;
    gn_case(o, 1, 1);
    o = GN_PLAIN;
    o.gamma_flat = true; /* not per channel: GN without it, then the Mul and the Add stay */
    gn_case(o, 1, 3);
}

/* The torch pattern broken: its InstanceNormalization alone becomes a GroupNorm of the
 * reshaped [N, G, K] (G groups of one channel), the rest stays. */
static void test_groupnorm_near_misses(void **state) {
    (void)state;
    gn_opts o = GN_PLAIN;
    o.scale_not_one = true;
    gn_case(o, 1, 5);
    o = GN_PLAIN;
    o.escapes = true;
    gn_case(o, 1, 5);
}

/* A plain InstanceNormalization with [C] scale and B (graph inputs: not constants) is a
 * GroupNorm of C groups; with a [1] scale it is left alone. */
static void test_instancenorm_as_groupnorm(void **state) {
    (void)state;
    for (int bad = 0; bad < 2; bad++) {
        tg t = tg_new(13);
        const int64_t xd[] = {2, 5, 7}, c = bad ? 1 : 5;
        af_value *x = input(&t, "x", 3, xd), *sc = input(&t, "s", 1, &c), *b = input(&t, "b", 1, &c);
        af_node *in = mk_in(t.g, "InstanceNormalization", 3, (af_value *[]){x, sc, b}, 1);
        attr_float(in, "epsilon", 1e-3f);
        output_in(t.g, op1(&t, "Relu", in->out[0]));
        if (bad) { /* the shape function refuses a [1] scale for 5 channels: not run */
            af_error err;
            assert_int_equal(af_pass_canonicalize(t.g, &err), AF_OK);
        } else {
            finish_graph(t.g);
            check_pass(t.g, af_pass_canonicalize);
        }
        assert_int_equal(count(t.g, "GroupNorm"), bad ? 0 : 1);
        assert_int_equal(count(t.g, "InstanceNormalization"), bad ? 1 : 0);
        for (int i = 0; i < t.g->nnodes && !bad; i++)
            if (t.g->nodes[i]->op == AF_OP_GROUP_NORM) {
                assert_int_equal(af_attr_int(t.g->nodes[i], "num_groups", 0), 5);
                assert_float_equal(af_attr_float(t.g->nodes[i], "epsilon", 0), 1e-3f, 1e-12);
            }
        af_arena_free(t.a);
    }
}

/* ---- canonicalize: GELU, SiLU, HardSwish ---------------------------------------------------- */

typedef enum { GELU_TORCH, GELU_HF, GELU_HALF_FIRST } gelu_order;

/* 0.5*x*a for a = 1 + f(x) in the given association order. */
static af_value *half_x(tg *t, af_value *x, af_value *a, gelu_order order) {
    switch (order) {
    case GELU_TORCH: return op2(t, "Mul", op2(t, "Mul", x, a), sc(t, 0.5));
    case GELU_HF: return op2(t, "Mul", op2(t, "Mul", x, sc(t, 0.5)), a);
    default: return op2(t, "Mul", op2(t, "Mul", a, sc(t, 0.5)), x);
    }
}

static af_value *gelu_erf_form(tg *t, af_value *x, gelu_order order, double root) {
    af_value *e = op1(t, "Erf", op2(t, "Div", x, sc(t, root)));
    return half_x(t, x, op2(t, "Add", e, sc(t, 1.0)), order);
}

static af_value *gelu_tanh_form(tg *t, af_value *x, bool pow) {
    af_value *cube = pow ? op2(t, "Pow", x, sc(t, 3.0)) : op2(t, "Mul", x, op2(t, "Mul", x, x));
    af_value *inner = op2(t, "Add", x, op2(t, "Mul", sc(t, 0.044715), cube));
    af_value *th = op1(t, "Tanh", op2(t, "Mul", sc(t, 0.7978845608), inner));
    return half_x(t, x, op2(t, "Add", sc(t, 1.0), th), GELU_TORCH);
}

static void act_case(af_graph *g, const char *op, int want_op, int want_nodes) {
    check_pass(g, af_pass_canonicalize);
    assert_int_equal(count(g, op), want_op);
    assert_int_equal(g->nnodes, want_nodes);
}

static void test_gelu(void **state) {
    (void)state;
    for (int order = GELU_TORCH; order <= GELU_HALF_FIRST; order++) {
        tg t = tg_new(13);
        af_value *x = input(&t, "x", 2, D23);
        output_in(t.g, gelu_erf_form(&t, x, (gelu_order)order, 1.4142135));
        finish_graph(t.g);
        act_case(t.g, "Gelu", 1, 1);
        assert_string_equal(af_attr_str(t.g->nodes[0], "approximate", ""), "none");
        assert_string_equal(t.g->nodes[0]->domain, AF_DOMAIN);
        af_arena_free(t.a);
    }
    for (int pow = 0; pow < 2; pow++) {
        tg t = tg_new(13);
        af_value *x = input(&t, "x", 2, D23);
        output_in(t.g, gelu_tanh_form(&t, x, pow));
        finish_graph(t.g);
        act_case(t.g, "Gelu", 1, 1);
        assert_string_equal(af_attr_str(t.g->nodes[0], "approximate", ""), "tanh");
        af_arena_free(t.a);
    }
}

static void test_gelu_near_misses(void **state) {
    (void)state;
    /* Wrong constant: x / sqrt(3). */
    tg t = tg_new(13);
    af_value *x = input(&t, "x", 2, D23);
    output_in(t.g, gelu_erf_form(&t, x, GELU_TORCH, 1.7320508));
    finish_graph(t.g);
    act_case(t.g, "Gelu", 0, 5);
    af_arena_free(t.a);
    /* The Erf's output is also a graph output. */
    t = tg_new(13);
    x = input(&t, "x", 2, D23);
    af_value *e = op1(&t, "Erf", op2(&t, "Div", x, sc(&t, M_SQRT2)));
    output_in(t.g, half_x(&t, x, op2(&t, "Add", e, sc(&t, 1.0)), GELU_TORCH));
    output_in(t.g, e);
    finish_graph(t.g);
    act_case(t.g, "Gelu", 0, 5);
    af_arena_free(t.a);
    /* A [1,1,1] constant 0.5 would broadcast the 2-D x to 3-D. */
    t = tg_new(13);
    x = input(&t, "x", 2, D23);
    e = op1(&t, "Erf", op2(&t, "Div", x, sc(&t, M_SQRT2)));
    af_value *half = cst_in(t.g, AF_DTYPE_FLOAT, 3, (int64_t[]){1, 1, 1}, (double[]){0.5});
    output_in(t.g, op2(&t, "Mul", op2(&t, "Mul", x, op2(&t, "Add", e, sc(&t, 1.0))), half));
    finish_graph(t.g);
    act_case(t.g, "Gelu", 0, 5);
    af_arena_free(t.a);
    /* The cube's x is another value. */
    t = tg_new(13);
    x = input(&t, "x", 2, D23);
    af_value *z = input(&t, "z", 2, D23);
    af_value *cube = op2(&t, "Pow", z, sc(&t, 3));
    af_value *inner = op2(&t, "Add", x, op2(&t, "Mul", sc(&t, 0.044715), cube));
    af_value *th = op1(&t, "Tanh", op2(&t, "Mul", sc(&t, 0.7978845608), inner));
    output_in(t.g, half_x(&t, x, op2(&t, "Add", sc(&t, 1.0), th), GELU_TORCH));
    finish_graph(t.g);
    act_case(t.g, "Gelu", 0, 8);
    af_arena_free(t.a);
}

static void test_silu(void **state) {
    (void)state;
    tg t = tg_new(13);
    af_value *x = input(&t, "x", 2, D23);
    output_in(t.g, op2(&t, "Mul", op1(&t, "Sigmoid", x), x));
    af_value *z = input(&t, "z", 2, D23); /* near miss: sigmoid(x) * z */
    output_in(t.g, op2(&t, "Mul", z, op1(&t, "Sigmoid", x)));
    finish_graph(t.g);
    act_case(t.g, "Silu", 1, 3);
    assert_int_equal(count(t.g, "Sigmoid"), 1);
    af_arena_free(t.a);
}

static void test_hardswish_hardsigmoid(void **state) {
    (void)state;
    tg t = tg_new(13);
    af_value *x = input(&t, "x", 2, D23);
    af_node *hs = mk_in(t.g, "HardSigmoid", 1, (af_value *[]){x}, 1);
    attr_float(hs, "alpha", 1.0f / 6.0f);
    output_in(t.g, op2(&t, "Mul", x, hs->out[0]));
    af_node *hs2 = mk_in(t.g, "HardSigmoid", 1, (af_value *[]){x}, 1); /* alpha 0.2: no */
    output_in(t.g, op2(&t, "Mul", x, hs2->out[0]));
    finish_graph(t.g);
    act_case(t.g, "HardSwish", 1, 3);
    assert_int_equal(count(t.g, "HardSigmoid"), 1);
    af_arena_free(t.a);
}

/* x * Clip(x+3, 0, 6) / 6, dividing after or before the product, Clip bounds as inputs
 * (opset 13) or attributes (opset 10). */
static void test_hardswish_clip(void **state) {
    (void)state;
    for (int form = 0; form < 4; form++) {
        bool attrs = form >= 2, div_first = form & 1;
        tg t = tg_new(attrs ? 10 : 13);
        af_value *x = input(&t, "x", 2, D23);
        af_value *a = op2(&t, "Add", x, sc(&t, 3));
        af_node *clip = attrs ? mk_in(t.g, "Clip", 1, (af_value *[]){a}, 1)
                              : mk_in(t.g, "Clip", 3, (af_value *[]){a, sc(&t, 0), sc(&t, 6)}, 1);
        if (attrs) {
            attr_float(clip, "min", 0);
            attr_float(clip, "max", 6);
        }
        af_value *c = clip->out[0];
        af_value *y = div_first ? op2(&t, "Mul", x, op2(&t, "Div", c, sc(&t, 6)))
                                : op2(&t, "Mul", op2(&t, "Mul", c, x), sc(&t, 1.0 / 6.0));
        output_in(t.g, y);
        finish_graph(t.g);
        act_case(t.g, "HardSwish", 1, 1);
        af_arena_free(t.a);
    }
    /* Near miss: Clip(x+3, 0, 5). */
    tg t = tg_new(13);
    af_value *x = input(&t, "x", 2, D23);
    af_value *a = op2(&t, "Add", x, sc(&t, 3));
    af_value *c = mk_in(t.g, "Clip", 3, (af_value *[]){a, sc(&t, 0), sc(&t, 5)}, 1)->out[0];
    output_in(t.g, op2(&t, "Div", op2(&t, "Mul", x, c), sc(&t, 6)));
    finish_graph(t.g);
    act_case(t.g, "HardSwish", 0, 4);
    af_arena_free(t.a);
}

/* ---- canonicalize: reshapes ------------------------------------------------------------------ */

static af_value *transpose(tg *t, af_value *x, int rank, const int64_t *perm) {
    af_node *n = mk_in(t->g, "Transpose", 1, (af_value *[]){x}, 1);
    attr_ints(n, "perm", rank, perm);
    return n->out[0];
}

static void test_transpose_of_unit_axes(void **state) {
    (void)state;
    static const int64_t d[] = {5, 1, 6}, swap[] = {1, 0, 2}, move[] = {2, 1, 0};
    /* [5, 1, 6] -> [1, 5, 6]: the bytes keep their order, a Reshape */
    tg t = tg_new(13);
    output_in(t.g, op1(&t, "Relu", transpose(&t, input(&t, "x", 3, d), 3, swap)));
    finish_graph(t.g);
    act_case(t.g, "Reshape", 1, 2);
    assert_int_equal(count(t.g, "Transpose"), 0);
    af_arena_free(t.a);
    /* Near misses: 5 and 6 swap places; the default perm; a dim unknown */
    for (int k = 0; k < 3; k++) {
        tg u = tg_new(13);
        af_value *x = input(&u, "x", 3, d);
        if (k == 2) x->type.dims[0] = -1;
        af_value *y = k == 1 ? op1(&u, "Transpose", x) : transpose(&u, x, 3, k ? swap : move);
        output_in(u.g, op1(&u, "Relu", y));
        finish_graph(u.g);
        if (k == 2) { /* the runner needs whole dims: only the pass, no runs */
            af_error err;
            assert_int_equal(af_pass_canonicalize(u.g, &err), AF_OK);
        } else {
            check_pass(u.g, af_pass_canonicalize);
        }
        assert_int_equal(count(u.g, "Transpose"), 1);
        assert_int_equal(count(u.g, "Reshape"), 0);
        af_arena_free(u.a);
    }
}

/* ShuffleNet's channel shuffle [1, 6, 4, 5] -> [1, 2, 3, 4, 5] -> swap axes 1, 2 -> [1, 6, 4, 5]
 * becomes one Gather of the channels; a transpose of other axes stays. */
static void test_channel_shuffle(void **state) {
    (void)state;
    static const int64_t d[] = {1, 6, 4, 5}, perm[] = {0, 2, 1, 3, 4}, other[] = {0, 1, 2, 4, 3};
    static const double split[] = {1, 2, 3, 4, 5}, back[] = {1, 6, 4, 5};
    for (int k = 0; k < 2; k++) {
        tg t = tg_new(13);
        af_value *x = op1(&t, "Relu", input(&t, "x", 4, d));
        af_value *y = transpose(&t, op2(&t, "Reshape", x, ints(&t, 5, split)), 5, k ? other : perm);
        output_in(t.g, op1(&t, "Neg", op2(&t, "Reshape", y, ints(&t, 4, back))));
        finish_graph(t.g);
        check_pass(t.g, af_pass_canonicalize);
        assert_int_equal(count(t.g, "Gather"), k ? 0 : 1);
        assert_int_equal(count(t.g, "Transpose"), k ? 1 : 0);
        af_arena_free(t.a);
    }
}

/* Gemm [5, 6] -> Reshape [5, 1, 6] -> Transpose [1, 5, 6] -> Add r [1, 5, 6] (the attention
 * output projection of torch's multi-head attention and its residual). */
static af_value *projection_residual(tg *t, const int64_t *rdims, af_value **gemm_out) {
    static const int64_t d56[] = {5, 6}, d66[] = {6, 6}, swap[] = {1, 0, 2};
    double w[36];
    for (int i = 0; i < 36; i++) w[i] = (i % 7) * 0.25 - 0.7;
    af_value *a = input(t, "a", 2, d56), *r = input(t, "r", 3, rdims);
    af_value *y = op2(t, "Gemm", a, cst_in(t->g, AF_DTYPE_FLOAT, 2, d66, w));
    *gemm_out = y;
    double shape[] = {5, 1, 6};
    af_value *v = transpose(t, op2(t, "Reshape", y, ints(t, 3, shape)), 3, swap);
    return op2(t, "Add", v, r);
}

static void test_add_before_reshape(void **state) {
    (void)state;
    static const int64_t d156[] = {1, 5, 6}, d116[] = {1, 1, 6};
    tg t = tg_new(13);
    af_value *g;
    output_in(t.g, projection_residual(&t, d156, &g));
    finish_graph(t.g);
    check_pass(t.g, af_pass_canonicalize);
    /* Gemm, Add(Gemm, Reshape(r)), Reshape back: the Add reads the Gemm's output directly */
    assert_int_equal(count(t.g, "Transpose"), 0);
    assert_int_equal(count(t.g, "Add"), 1);
    assert_int_equal(count(t.g, "Reshape"), 2);
    assert_int_equal(g->nuses, 1);
    assert_int_equal(g->uses[0].node->op, af_op_lookup("", "Add"));
    af_arena_free(t.a);
    /* Near misses: r broadcasts; the Gemm's output has a second reader */
    for (int k = 0; k < 2; k++) {
        tg u = tg_new(13);
        af_value *y = projection_residual(&u, k ? d156 : d116, &g);
        output_in(u.g, y);
        if (k) output_in(u.g, op1(&u, "Relu", g));
        finish_graph(u.g);
        check_pass(u.g, af_pass_canonicalize);
        af_node *add = y->producer;
        assert_int_equal(add->op, af_op_lookup("", "Add"));
        assert_true(add->in[0]->producer->op == af_op_lookup("", "Reshape"));
        af_arena_free(u.a);
    }
}

/* Gemm [5, 6] -> Reshape [5, 1, 6] -> Reshape [1, 5, 6] -> activation (GPT-2's Conv1D and its
 * MLP's Gelu): the activation moves before the Reshapes, next to the Gemm; also a Gelu that
 * canonicalize itself makes of the tanh form (a node of the walk's own). */
static void test_act_before_reshape(void **state) {
    (void)state;
    static const int64_t d56[] = {5, 6}, d66[] = {6, 6};
    static const double s516[] = {5, 1, 6}, s156[] = {1, 5, 6};
    double w[36];
    for (int i = 0; i < 36; i++) w[i] = (i % 5) * 0.3 - 0.6;
    for (int k = 0; k < 4; k++) { /* Relu; Gelu's tanh form; near misses: Gemm read twice, Neg */
        tg t = tg_new(13);
        af_value *y = op2(&t, "Gemm", input(&t, "a", 2, d56), cst_in(t.g, AF_DTYPE_FLOAT, 2, d66, w));
        af_value *v = op2(&t, "Reshape", op2(&t, "Reshape", y, ints(&t, 3, s516)), ints(&t, 3, s156));
        output_in(t.g, k == 1 ? gelu_tanh_form(&t, v, false) : op1(&t, k == 3 ? "Neg" : "Relu", v));
        if (k == 2) output_in(t.g, y);
        finish_graph(t.g);
        check_pass(t.g, af_pass_canonicalize);
        const char *act = k == 1 ? "Gelu" : k == 3 ? "Neg" : "Relu";
        assert_int_equal(count(t.g, act), 1);
        assert_int_equal(count(t.g, "Reshape"), 2);
        const char *want = k < 2 ? act : "Reshape"; /* what reads the Gemm's output now */
        af_op id = af_op_lookup(AF_DOMAIN, want);
        assert_int_equal(y->nuses, 1);
        assert_int_equal(y->uses[0].node->op, id == AF_OP_COUNT ? af_op_lookup("", want) : id);
        af_arena_free(t.a);
    }
}

/* ---- driver: real models and the conformance data -------------------------------------------- */

static void histogram(const char *title, const af_graph *g) {
    int counts[AF_OP_COUNT] = {0};
    for (int i = 0; i < g->nnodes; i++) counts[g->nodes[i]->op]++;
    printf("%s: %d nodes:", title, g->nnodes);
    for (int op = 0; op < AF_OP_COUNT; op++)
        if (counts[op]) printf(" %s=%d", af_ops[op].name, counts[op]);
    printf("\n");
}

static bool verbose; /* -v: node counts of every case */

static af_status optimize(af_graph *g, af_error *err) {
    af_status st = af_pass_simplify(g, err);
    if (!st) st = af_pass_canonicalize(g, err);
    if (!st) st = af_graph_verify(g, err);
    return st;
}

/* Run g on `in`, optimize, run again. 0: the runs agree (rtol 1e-4) and match `want` when
 * given (rtol 1e-3, atol 1e-5, the conformance runner's); 1: the passes broke something;
 * 2: the unoptimized graph already fails or misses `want`, and the passes changed nothing. */
static int compare_runs(af_graph *g, af_tensor *in, const af_tensor *want, bool show) {
    af_error err;
    int n = g->noutputs, bad = 0, nodes_before = g->nnodes;
    af_tensor *base = calloc((size_t)n + 1, sizeof(af_tensor));
    af_tensor *opt = calloc((size_t)n + 1, sizeof(af_tensor));
    if (show) histogram("before", g);
    if (run(g, in, base, &err)) {
        printf("unoptimized run fails: %s\n", err.message);
        bad = 2;
    } else if (optimize(g, &err)) {
        printf("passes fail: %s\n", err.message);
        bad = 1;
    } else if (run(g, in, opt, &err)) {
        printf("optimized run fails: %s\n", err.message);
        bad = 1;
    }
    if (show && !bad) histogram("after", g);
    if (verbose && !bad) printf("%d -> %d nodes\n", nodes_before, g->nnodes);
    for (int i = 0; i < n && bad != 1 && !(bad == 2 && !opt[i].data); i++) {
        double e = mismatch(&opt[i], &base[i], 1e-4, 1e-6);
        double wb = want ? mismatch(&base[i], &want[i], 1e-3, 1e-5) : 0;
        double wo = want ? mismatch(&opt[i], &want[i], 1e-3, 1e-5) : 0;
        if (show || e > 1 || wo > 1)
            printf("output %s: optimized vs unoptimized %.3g x tol", g->outputs[i]->name, e);
        if (want && (show || e > 1 || wo > 1)) printf(", vs expected %.3g x tol", wo);
        if (show || e > 1 || wo > 1) printf("\n");
        if (e > 1 || (wo > 1 && wb <= 1)) bad = 1;
        else if (wb > 1) bad = 2;
    }
    release_all(base, n);
    release_all(opt, n);
    return bad;
}

/* --model: histograms and (unless count_only) optimized vs unoptimized outputs. */
static int drive_model(const char *path, bool count_only) {
    af_model *m;
    af_error err;
    if (tu_load(path, &m, &err)) {
        printf("%s\n", err.message);
        return 3;
    }
    int bad = 0;
    if (count_only) {
        histogram("before", m->graph);
        bad = optimize(m->graph, &err) != AF_OK;
        if (bad) printf("passes fail: %s\n", err.message);
        else histogram("after", m->graph);
    } else {
        af_tensor *in = make_inputs(m->graph);
        bad = compare_runs(m->graph, in, NULL, true);
        release_all(in, m->graph->ninputs);
    }
    af_model_free(m);
    return bad;
}

/* One conformance case: its model and test_data_set_0 (inputs bound by name, else in order). */
static int drive_case(const char *dir) {
    char path[4096];
    af_model *m;
    af_error err;
    if (snprintf(path, sizeof path, "%s/model.onnx", dir) >= (int)sizeof path) return 3;
    if (tu_load(path, &m, &err)) return 3; /* not importable: not ours to judge */
    af_graph *g = m->graph;
    af_tensor *in = calloc((size_t)g->ninputs + 1, sizeof(af_tensor));
    af_tensor *want = calloc((size_t)g->noutputs + 1, sizeof(af_tensor));
    int bad = 0;
    for (int i = 0; i < 64 && !bad; i++) {
        af_tensor t;
        char *name = NULL;
        if (snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, i) >=
                (int)sizeof path ||
            access(path, R_OK))
            break;
        if (af_tensor_load_pb(path, &t, &name, &err)) bad = 3;
        int k = i;
        for (int j = 0; name && j < g->ninputs; j++)
            if (!strcmp(g->inputs[j]->name, name)) k = j;
        if (!bad && k < g->ninputs) in[k] = t;
        else af_tensor_release(&t);
        free(name);
    }
    for (int i = 0; i < g->noutputs && !bad; i++) {
        if (snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, i) >=
                (int)sizeof path ||
            af_tensor_load_pb(path, &want[i], NULL, &err))
            bad = 3;
    }
    if (!bad) bad = compare_runs(g, in, want, false);
    release_all(in, g->ninputs);
    release_all(want, g->noutputs);
    af_model_free(m);
    return bad;
}

static int drive_suite(const char *root, const char *filter) {
    DIR *d = opendir(root);
    if (!d) {
        printf("cannot open %s\n", root);
        return 1;
    }
    int tally[5] = {0};
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || (filter && !strstr(e->d_name, filter))) continue;
        char dir[2048];
        if (snprintf(dir, sizeof dir, "%s/%s", root, e->d_name) >= (int)sizeof dir) continue;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(120);
            int r = drive_case(dir);
            fflush(stdout);
            _exit(r);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int r = WIFEXITED(status) ? WEXITSTATUS(status) : 4;
        if (r > 4) r = 4;
        tally[r]++;
        if (r == 1 || r == 4 || verbose)
            printf("%s %s%s\n", r == 1 || r == 4 ? "FAIL" : "case", e->d_name,
                   r == 4 ? " (crash/timeout)" : "");
    }
    closedir(d);
    printf("%s: %d same, %d differ or fail after the passes, %d fail unoptimized too, "
           "%d not loadable, %d crashed\n",
           root, tally[0], tally[1], tally[2], tally[3], tally[4]);
    return tally[1] + tally[4] > 0;
}

int main(int argc, char **argv) {
    tu_rng = 42;
    const char *filter = NULL;
    bool count_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--filter=", 9)) filter = argv[i] + 9;
        verbose |= !strcmp(argv[i], "-v");
        count_only |= !strcmp(argv[i], "--count");
    }
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--model=", 8)) return drive_model(argv[i] + 8, count_only);
        if (!strncmp(argv[i], "--suite=", 8)) return drive_suite(argv[i] + 8, filter);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fold_arithmetic),
        cmocka_unit_test(test_fold_shape_chain),
        cmocka_unit_test(test_shape_symbolic_dims_fold),
        cmocka_unit_test(test_shape_symbolic_sum_stays),
        cmocka_unit_test(test_shape_symbolic_sums),
        cmocka_unit_test(test_fold_many_rounds),
        cmocka_unit_test(test_overridable_default_not_folded),
        cmocka_unit_test(test_identity_and_dropout_removed),
        cmocka_unit_test(test_same_shape_reshape_removed),
        cmocka_unit_test(test_same_type_cast_removed),
        cmocka_unit_test(test_widen_halves),
        cmocka_unit_test(test_identity_output_renamed),
        cmocka_unit_test(test_copies_that_stay),
        cmocka_unit_test(test_dead_nodes_removed),
        cmocka_unit_test(test_subgraph_folded),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_near_misses),
        cmocka_unit_test(test_layernorm_more_near_misses),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rmsnorm_near_misses),
        cmocka_unit_test(test_groupnorm),
        cmocka_unit_test(test_groupnorm_near_misses),
        cmocka_unit_test(test_instancenorm_as_groupnorm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_gelu_near_misses),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_hardswish_hardsigmoid),
        cmocka_unit_test(test_hardswish_clip),
        cmocka_unit_test(test_transpose_of_unit_axes),
        cmocka_unit_test(test_channel_shuffle),
        cmocka_unit_test(test_add_before_reshape),
        cmocka_unit_test(test_act_before_reshape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
