/* The bodies of If, Loop and Scan through the compile pipeline (driver/compile.c), and the If
 * whose condition is known at compile time folded into its branch (passes/fold_if.c).
 *
 * The models of gen_body_models.py (in $AF_BODY_MODELS), whose bodies read main-graph weights,
 * are compiled as a session would (af_compile: shapes, optimisation, lowering, plan) and their
 * outputs compared with the imported graph run on the reference executor (shapes inferred,
 * nothing else), within rtol 1e-4 (the fast GEMM sums in another order than the reference's
 * double accumulation). Each test also checks what the pipeline did inside the bodies: Gemm and
 * MatMul lowered to FusedMatMul with packed weights and the activation in its epilogue; no If
 * left where the condition was known. The same models also run through a session, saved as an
 * .afm and loaded again (the planned executor, prepared kernels, the file format). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "driver/compile.h"
#include "driver/session.h"
#include "kernels/simd/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static void model_path(const char *name, char *path, size_t len) {
    const char *dir = getenv("AF_BODY_MODELS");
    if (!dir) fail_msg("AF_BODY_MODELS is not set (run through ctest)");
    snprintf(path, len, "%s/%s.onnx", dir, name);
}

/* The model as imported, its shapes inferred: the reference. */
static af_model *load(const char *name) {
    char path[1024];
    model_path(name, path, sizeof path);
    af_model *m = NULL;
    af_error err;
    if (tu_load(path, &m, &err) != AF_OK) fail_msg("%s: %s", name, err.message);
    return m;
}

/* The model compiled with the session's defaults (fusion on, lowered, planned). */
static af_model *compile(const char *name, af_compiled *c) {
    char path[1024];
    model_path(name, path, sizeof path);
    af_model *m = NULL;
    af_error err;
    af_options opt;
    af_options_init(&opt);
    if (af_model_load(path, &m, &err) != AF_OK) fail_msg("%s: %s", name, err.message);
    if (af_compile(m->graph, path, &opt, c, &err) != AF_OK) fail_msg("%s: %s", name, err.message);
    if (af_graph_verify(m->graph, &err) != AF_OK) fail_msg("%s: verify: %s", name, err.message);
    return m;
}

/* Nodes of op in g (depth 0) or only in the bodies nested in it (depth > 0 counts nodes at
 * that nesting depth or deeper). */
static int count_op(const af_graph *g, af_op op, int depth) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        c += depth <= 0 && n->op == op;
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->g) c += count_op(at->g, op, depth - 1);
            for (int k = 0; at->graphs && k < at->n; k++) c += count_op(at->graphs[k], op, depth - 1);
        }
    }
    return c;
}

/* Every FusedMatMul of g and its bodies has packed weights; returns how many have an epilogue. */
static int check_packed(const af_graph *g) {
    int with_epilogue = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->op == AF_OP_FUSED_MATMUL) {
            if (!af_attr_int(n, "b_packed", 0)) fail_msg("'%s' is not packed", n->name);
            with_epilogue += af_node_attr(n, "epilogue") != NULL;
        }
        for (int a = 0; a < n->nattrs; a++)
            if (n->attrs[a].g) with_epilogue += check_packed(n->attrs[a].g);
    }
    return with_epilogue;
}

/* Inputs: floats from tu_rnd, bools `flag`, int64 `count`. */
static af_tensor **make_inputs(const af_graph *g, bool flag, int64_t count) {
    af_tensor **in = calloc((size_t)g->ninputs + 1, sizeof *in);
    assert_non_null(in);
    for (int i = 0; i < g->ninputs; i++) {
        const af_tensor *t = &g->inputs[i]->type;
        in[i] = af_tensor_new(t->dtype, t->rank, t->dims);
        assert_non_null(in[i]);
        for (int64_t k = 0; k < af_tensor_numel(in[i]); k++)
            tens_set(in[i], k, t->dtype == AF_DTYPE_FLOAT ? tu_rnd()
                               : t->dtype == AF_DTYPE_BOOL ? flag : (double)count);
    }
    return in;
}

static void free_inputs(af_tensor **in, int n) {
    for (int i = 0; i < n; i++) af_tensor_free(in[i]);
    free(in);
}

static af_tensor *run(const af_graph *g, af_tensor **in) {
    af_tensor *out = calloc((size_t)g->noutputs + 1, sizeof *out);
    assert_non_null(out);
    af_error err;
    if (af_exec_graph(g, (const af_tensor *const *)in, out, &err) != AF_OK)
        fail_msg("run: %s", err.message);
    return out;
}

static void same(const char *what, int o, const af_tensor *want, const af_tensor *got) {
    assert_int_equal(want->dtype, AF_DTYPE_FLOAT);
    assert_int_equal(got->dtype, AF_DTYPE_FLOAT);
    assert_int_equal(want->rank, got->rank);
    for (int d = 0; d < want->rank; d++) assert_int_equal(want->dims[d], got->dims[d]);
    const float *w = want->data, *f = got->data;
    for (int64_t i = 0; i < af_tensor_numel(want); i++)
        if (!(fabs((double)w[i] - f[i]) <= 1e-4 * fabs((double)w[i]) + 1e-5))
            fail_msg("%s: output %d [%lld]: reference %.8g, compiled %.8g", what, o, (long long)i,
                     (double)w[i], (double)f[i]);
}

/* The session's outputs (path: .onnx or .afm) for the given inputs, against want. */
static void session_same(const char *path, const af_graph *ref, af_tensor **in,
                         const af_tensor *want) {
    af_session *s = NULL;
    af_error err;
    af_options opt;
    af_options_init(&opt);
    opt.threads = 2;
    if (af_session_new(path, &opt, &s, &err) != AF_OK) fail_msg("%s: %s", path, err.message);
    const char **names = calloc((size_t)ref->ninputs + 1, sizeof *names);
    af_tensor **out = calloc((size_t)ref->noutputs + 1, sizeof *out);
    assert_true(names && out);
    for (int i = 0; i < ref->ninputs; i++) names[i] = ref->inputs[i]->name;
    /* Twice: the second run is the steady state (arena, prepared kernels). */
    for (int rep = 0; rep < 2; rep++) {
        if (af_session_run(s, names, (const af_tensor *const *)in, (size_t)ref->ninputs, out,
                           &err) != AF_OK)
            fail_msg("%s: %s", path, err.message);
        for (int o = 0; o < ref->noutputs; o++) {
            same(path, o, &want[o], out[o]);
            af_tensor_free(out[o]);
        }
    }
    free(names);
    free(out);
    af_session_free(s);
}

/* Compiled vs reference on one set of inputs: the graph itself, a session, and the session's
 * .afm loaded again. */
static void check_outputs(const char *name, const af_graph *ref, const af_graph *opt, bool flag,
                          int64_t count) {
    af_tensor **in = make_inputs(ref, flag, count);
    af_tensor *want = run(ref, in), *got = run(opt, in);
    for (int o = 0; o < ref->noutputs; o++) same(name, o, &want[o], &got[o]);
    char path[1024], afm[1024];
    model_path(name, path, sizeof path);
    session_same(path, ref, in, want);
    snprintf(afm, sizeof afm, "/tmp/af_test_bodies_%d_%s.afm", (int)getpid(), name);
    af_session *s = NULL;
    af_error err;
    if (af_session_new(path, NULL, &s, &err) != AF_OK ||
        af_session_save(s, afm, "test_bodies", &err) != AF_OK)
        fail_msg("%s: save: %s", name, err.message);
    af_session_free(s);
    session_same(afm, ref, in, want);
    unlink(afm);
    for (int o = 0; o < ref->noutputs; o++) {
        af_tensor_release(&want[o]);
        af_tensor_release(&got[o]);
    }
    free(want);
    free(got);
    free_inputs(in, ref->ninputs);
}

/* Lowering runs only above the reference ISA. */
static bool lowering(void) { return af_isa_get() != AF_ISA_REFERENCE; }

/* ---- bodies lowered and fused ---------------------------------------------------------------- */

/* Both branches: Gemm + Relu and Gemm(transB) + Sigmoid, each one packed FusedMatMul with the
 * activation in its epilogue, reading the main graph's weights. */
static void test_if_branches(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("if_gemm"), *m = compile("if_gemm", &c);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 1), 2);
        assert_int_equal(count_op(m->graph, AF_OP_GEMM, 0), 0);
        assert_int_equal(count_op(m->graph, AF_OP_RELU, 0), 0);
        assert_int_equal(count_op(m->graph, AF_OP_SIGMOID, 0), 0);
        assert_int_equal(check_packed(m->graph), 2);
    }
    assert_int_equal(count_op(m->graph, AF_OP_IF, 0), 1); /* the condition is an input */
    check_outputs("if_gemm", ref->graph, m->graph, true, 0);
    check_outputs("if_gemm", ref->graph, m->graph, false, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* An If whose else branch cannot run with x's shape (an LSTM given a 2-D X): the model loads
 * and compiles, the then branch runs, and taking the else branch fails naming the LSTM. */
static void test_dead_branch_compiles(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("if_dead_branch"), *m = compile("if_dead_branch", &c);
    check_outputs("if_dead_branch", ref->graph, m->graph, true, 0);
    char path[1024];
    model_path("if_dead_branch", path, sizeof path);
    af_session *s = NULL;
    af_error err;
    assert_int_equal(af_session_new(path, NULL, &s, &err), AF_OK);
    af_tensor **in = make_inputs(ref->graph, false, 0), *out[2] = {NULL};
    const char *names[2] = {ref->graph->inputs[0]->name, ref->graph->inputs[1]->name};
    assert_int_not_equal(af_session_run(s, names, (const af_tensor *const *)in, 2, out, &err), AF_OK);
    if (!strstr(err.message, "LSTM")) fail_msg("the error does not name the LSTM: %s", err.message);
    af_session_free(s);
    free_inputs(in, ref->graph->ninputs);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* A Loop body: MatMul + Add + Tanh becomes one packed FusedMatMul; 0, 1 and 5 iterations. */
static void test_loop_body(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("loop_matmul"), *m = compile("loop_matmul", &c);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 1), 1);
        assert_int_equal(count_op(m->graph, AF_OP_MATMUL, 0), 0);
        assert_int_equal(check_packed(m->graph), 1);
    }
    for (int64_t trips = 0; trips <= 5; trips += trips ? 4 : 1)
        check_outputs("loop_matmul", ref->graph, m->graph, true, trips);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* The body's carried input has no shape: the lowering takes what it can from what is known,
 * and the outputs are the reference's. */
static void test_loop_unknown_shapes(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("loop_unknown"), *m = compile("loop_unknown", &c);
    check_packed(m->graph);
    check_outputs("loop_unknown", ref->graph, m->graph, true, 3);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* A Scan body (an RNN cell): both MatMuls lowered, bias and Tanh in epilogues. */
static void test_scan_body(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("scan_rnn"), *m = compile("scan_rnn", &c);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 1), 2);
        assert_int_equal(count_op(m->graph, AF_OP_MATMUL, 0), 0);
        assert_int_equal(count_op(m->graph, AF_OP_TANH, 0), 0);
        assert_true(check_packed(m->graph) >= 1);
    }
    check_outputs("scan_rnn", ref->graph, m->graph, true, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* An If inside a Loop body: its branches, two graphs below the weights they read, lowered. */
static void test_nested_if_in_loop(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("loop_if"), *m = compile("loop_if", &c);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 2), 2);
        assert_int_equal(count_op(m->graph, AF_OP_GEMM, 0), 0);
        assert_int_equal(check_packed(m->graph), 2);
    }
    assert_int_equal(count_op(m->graph, AF_OP_IF, 1), 1);
    check_outputs("loop_if", ref->graph, m->graph, true, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* ---- If with a known condition --------------------------------------------------------------- */

/* cond = Constant(true): the then-branch's nodes in the main graph, no If left. */
static void test_const_if_folds(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("const_if"), *m = compile("const_if", &c);
    assert_int_equal(count_op(m->graph, AF_OP_IF, 0), 0);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 0), 1);
        assert_int_equal(count_op(m->graph, AF_OP_RELU, 0), 0);
    }
    /* The output keeps its name; the inlined node says where it came from. */
    assert_string_equal(m->graph->outputs[0]->name, "y");
    assert_non_null(m->graph->outputs[0]->producer);
    assert_non_null(strstr(m->graph->outputs[0]->producer->name, "/"));
    check_outputs("const_if", ref->graph, m->graph, false, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* cond = Equal(Shape(x)[0], 4) with x [4, 16]: decided by the known shape. */
static void test_shape_if_folds(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("shape_if"), *m = compile("shape_if", &c);
    assert_int_equal(count_op(m->graph, AF_OP_IF, 0), 0);
    assert_int_equal(count_op(m->graph, AF_OP_SHAPE, 0), 0);
    check_outputs("shape_if", ref->graph, m->graph, false, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* An If inside a Loop body over a main-graph constant (a capture): folded inside the body. */
static void test_const_if_in_body_folds(void **state) {
    (void)state;
    af_compiled c;
    af_model *ref = load("loop_const_if"), *m = compile("loop_const_if", &c);
    assert_int_equal(count_op(m->graph, AF_OP_IF, 0), 0);
    assert_int_equal(count_op(m->graph, AF_OP_LOOP, 0), 1);
    if (lowering()) assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 1), 1);
    check_outputs("loop_const_if", ref->graph, m->graph, false, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* Without the fusion (no_fusion) the simplification still folds the If (so that `bench
 * --compare` compares fusion and nothing else), also under the reference ISA, where nothing
 * is lowered; nothing is fused: the Relu stays. */
static void test_no_fusion_folds_too(void **state) {
    (void)state;
    char path[1024];
    model_path("const_if", path, sizeof path);
    af_model *m = NULL;
    af_error err;
    af_options opt;
    af_options_init(&opt);
    opt.no_fusion = 1;
    af_compiled c;
    if (af_model_load(path, &m, &err) != AF_OK || af_compile(m->graph, path, &opt, &c, &err))
        fail_msg("%s", err.message);
    assert_int_equal(count_op(m->graph, AF_OP_IF, 0), 0);
    if (lowering()) {
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_MATMUL, 0), 1);
        assert_int_equal(count_op(m->graph, AF_OP_RELU, 0), 1);
    }
    af_model *ref = load("const_if");
    check_outputs("const_if", ref->graph, m->graph, false, 0);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_if_branches),
        cmocka_unit_test(test_dead_branch_compiles),
        cmocka_unit_test(test_loop_body),
        cmocka_unit_test(test_loop_unknown_shapes),
        cmocka_unit_test(test_scan_body),
        cmocka_unit_test(test_nested_if_in_loop),
        cmocka_unit_test(test_const_if_folds),
        cmocka_unit_test(test_shape_if_folds),
        cmocka_unit_test(test_const_if_in_body_folds),
        cmocka_unit_test(test_no_fusion_folds_too),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
