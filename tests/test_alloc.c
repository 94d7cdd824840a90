/* Out of memory, everywhere: every heap allocation of a compile and of a run of small models
 * is made to fail in turn (util.h: af_alloc_fault, SQLite's fault injection), and each failure
 * must come back as a clean error: AF_ERR_NOMEM with a message, or success where the code has
 * a way around it (then the outputs are the same as without the failure). A trial compiles the
 * model, writes it as an .afm file, loads that and runs it. Run under ASan and
 * LeakSanitizer (asan_test_alloc), a failure path that leaks, double-frees or reads freed
 * memory fails the test.
 *
 * Models: from the fusion and attention fixtures (a conv with BatchNorm, pooling and a
 * classifier; squeeze-excite; a BERT block with attention; an If subgraph), so that the
 * importer, every stage of the driver, the planner and the fused and fast kernels are on the
 * path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"
#include "driver/session.h"
#include "runtime/machine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_IO 8

typedef struct outputs {
    af_tensor *t[MAX_IO];
    int n;
} outputs;

static void outputs_free(outputs *o) {
    for (int i = 0; i < o->n; i++) af_tensor_free(o->t[i]);
    o->n = 0;
}

/* Inputs of the model's declared types (symbolic dims 1), filled with a fixed pattern. */
static int make_inputs(const af_session *s, af_tensor **in, const char **names) {
    int n = af_session_input_count(s);
    assert_true(n <= MAX_IO);
    for (int i = 0; i < n; i++) {
        af_tensor t;
        assert_int_equal(af_session_input_type(s, i, &t), AF_OK);
        for (int d = 0; d < t.rank; d++)
            if (t.dims[d] < 0) t.dims[d] = 1;
        in[i] = af_tensor_new(t.dtype, t.rank, t.dims);
        assert_non_null(in[i]);
        int64_t count = af_tensor_numel(in[i]);
        for (int64_t k = 0; k < count; k++) {
            double v = sin(0.37 * (double)k + i);
            if (t.dtype == AF_DTYPE_FLOAT) ((float *)in[i]->data)[k] = (float)v;
            else if (t.dtype == AF_DTYPE_INT64) ((int64_t *)in[i]->data)[k] = k % 7;
            else if (t.dtype == AF_DTYPE_INT32) ((int32_t *)in[i]->data)[k] = (int32_t)(k % 7);
            else if (t.dtype == AF_DTYPE_BOOL) ((uint8_t *)in[i]->data)[k] = v > 0;
        }
        names[i] = af_session_input_name(s, i);
    }
    return n;
}

/* Compile path, save it as an .afm file, load that, and run it on inputs made for it: AF_OK
 * with the outputs in *o, or the first error (sessions and inputs freed either way). */
static af_status compile_and_run(const char *path, outputs *o, af_error *err) {
    af_session *s = NULL;
    af_options opt;
    af_options_init(&opt);
    opt.threads = 2;
    char afm[4200];
    snprintf(afm, sizeof afm, "%s.alloc.afm", path);
    af_status st = af_session_new(path, &opt, &s, err);
    if (!st) st = af_session_save(s, afm, "test_alloc", err);
    af_session_free(s);
    s = NULL;
    if (!st) st = af_session_new(afm, &opt, &s, err);
    remove(afm);
    if (st) return st;
    af_tensor *in[MAX_IO] = {NULL};
    const char *names[MAX_IO];
    /* The inputs are the test's, made with the injection paused: only the library's
     * allocations are counted and failed. */
    af_alloc_pause(true);
    int nin = make_inputs(s, in, names);
    o->n = af_session_output_count(s);
    assert_true(o->n <= MAX_IO);
    af_alloc_pause(false);
    st = af_session_run(s, names, (const af_tensor *const *)in, (size_t)nin, o->t, err);
    if (st) o->n = 0;
    for (int i = 0; i < nin; i++) af_tensor_free(in[i]);
    af_session_free(s);
    return st;
}

static void expect_same(const char *model, int64_t k, const outputs *want, const outputs *got) {
    assert_int_equal(want->n, got->n);
    for (int i = 0; i < want->n; i++) {
        const af_tensor *a = want->t[i], *b = got->t[i];
        if (a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes ||
            memcmp(a->data, b->data, a->nbytes))
            fail_msg("%s: allocation %lld failed, the run went on, and output %d differs", model,
                     (long long)k, i);
    }
}

static void fail_each(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    af_error err;
    outputs want = {{NULL}, 0}, got = {{NULL}, 0};
    af_alloc_fault(0, false);
    if (compile_and_run(path, &want, &err)) fail_msg("%s: %s", name, err.message);
    int64_t total = af_alloc_count();
    assert_true(total > 10);
    int ok = 0;
    for (int64_t k = 1; k <= total; k++) {
        af_alloc_fault(k, false);
        memset(&err, 0, sizeof err);
        af_status st = compile_and_run(path, &got, &err);
        af_alloc_fault(0, false);
        if (st == AF_OK) {
            expect_same(name, k, &want, &got);
            outputs_free(&got);
            ok++;
        } else if (st != AF_ERR_NOMEM || !err.message[0]) {
            fail_msg("%s: allocation %lld of %lld failed, and the error is %d: %s", name,
                     (long long)k, (long long)total, (int)st, err.message);
        }
    }
    print_message("%s: %lld allocations failed in turn, %d of them worked around\n", name,
                  (long long)total, ok);
    outputs_free(&want);
}

static const char *fixture(const char *var) {
    const char *d = getenv(var);
    if (!d) fail_msg("%s is not set (run through ctest)", var);
    return d;
}

static void test_conv_pool_fc(void **state) {
    (void)state;
    fail_each(fixture("AF_FUSION_MODELS_DIR"), "conv_pool_fc.onnx");
}

static void test_squeeze_excite(void **state) {
    (void)state;
    fail_each(fixture("AF_FUSION_MODELS_DIR"), "squeeze_excite.onnx");
}

static void test_if_subgraph(void **state) {
    (void)state;
    fail_each(fixture("AF_FUSION_MODELS_DIR"), "if_subgraph.onnx");
}

/* QDQ: the fake quantizations of canonicalize, their propagation, the int8 rule. */
static void test_quantized(void **state) {
    (void)state;
    fail_each(fixture("AF_FUSION_MODELS_DIR"), "q_pool_concat.onnx");
    fail_each(fixture("AF_FUSION_MODELS_DIR"), "q_conv_relu.onnx");
}

static void test_bert_block(void **state) {
    (void)state;
    fail_each(fixture("AF_ATTN_MODELS"), "bert_block.onnx");
}

int main(void) {
    /* The machine's rates are measured once per process: before the counting starts. */
    af_machine_get();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_pool_fc),
        cmocka_unit_test(test_squeeze_excite),
        cmocka_unit_test(test_if_subgraph),
        cmocka_unit_test(test_quantized),
        cmocka_unit_test(test_bert_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
