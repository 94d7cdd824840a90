/* IR unit tests: construction, use lists under mutation, topological sort, cycle rejection and
 * the verifier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "ir/ir.h"
#include "util/util.h"

/* x -> Relu(a) -> Neg(b) -> y, built out of order to exercise the sort. */
static af_graph *chain(af_arena *a, af_node **relu, af_node **neg) {
    af_graph *g = af_graph_new(a, "chain.onnx", NULL);
    af_value *x = af_value_new(g, "x"), *t = af_value_new(g, "t"), *y = af_value_new(g, "y");
    x->is_input = true;
    y->is_output = true;
    g->inputs = af_arena_calloc(a, 1, sizeof(af_value *));
    g->inputs[0] = x;
    g->ninputs = 1;
    g->outputs = af_arena_calloc(a, 1, sizeof(af_value *));
    g->outputs[0] = y;
    g->noutputs = 1;
    af_op r = af_op_lookup("", "Relu"), n = af_op_lookup("", "Neg");
    *neg = af_node_new(g, n, "neg", 1, 1);
    af_node_set_input(*neg, 0, t);
    af_node_set_output(*neg, 0, y);
    *relu = af_node_new(g, r, "relu", 1, 1);
    af_node_set_input(*relu, 0, x);
    af_node_set_output(*relu, 0, t);
    return g;
}

static void test_sort_and_verify(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *relu, *neg;
    af_graph *g = chain(a, &relu, &neg);
    af_error err;
    assert_int_equal(af_graph_verify(g, &err), AF_ERR_INTERNAL); /* neg before relu */
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    assert_ptr_equal(g->nodes[0], relu);
    assert_ptr_equal(g->nodes[1], neg);
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
    af_arena_free(a);
}

static void test_replace_and_remove(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *relu, *neg;
    af_graph *g = chain(a, &relu, &neg);
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    af_value *x = g->inputs[0], *t = relu->out[0];
    /* Bypass the Relu: Neg reads x directly, then the Relu goes. */
    af_value_replace_uses(t, x);
    assert_int_equal(t->nuses, 0);
    assert_int_equal(x->nuses, 2);
    af_node_remove(relu);
    assert_int_equal(x->nuses, 1);
    assert_ptr_equal(x->uses[0].node, neg);
    assert_int_equal(g->nnodes, 1);
    assert_null(t->producer);
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
    af_arena_free(a);
}

static void test_cycle_rejected(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *relu, *neg;
    af_graph *g = chain(a, &relu, &neg);
    af_node_set_input(relu, 0, neg->out[0]); /* relu reads y, neg reads relu's output */
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_ERR_INVALID_MODEL);
    assert_non_null(strstr(err.message, "chain.onnx"));
    assert_non_null(strstr(err.message, "cycle"));
    af_arena_free(a);
}

static void test_insert_position(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *relu, *neg;
    af_graph *g = chain(a, &relu, &neg);
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    /* Insert Abs between relu and neg. */
    af_value *t = relu->out[0], *u = af_value_new(g, "u");
    af_node *abs = af_node_new(g, af_op_lookup("", "Abs"), NULL, 1, 1);
    af_node_set_output(abs, 0, u);
    af_value_replace_uses(t, u);
    af_node_set_input(abs, 0, t);
    af_node_move_last_to(g, 1);
    assert_ptr_equal(g->nodes[1], abs);
    assert_string_equal(abs->name, "Abs_0");
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
    af_arena_free(a);
}

static void test_capture_lookup(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *outer = af_graph_new(a, "f.onnx", NULL);
    af_value *v = af_value_new(outer, "w");
    af_graph *mid = af_graph_new(a, "f.onnx", outer), *inner = af_graph_new(a, "f.onnx", mid);
    assert_ptr_equal(af_graph_find(inner, "w"), v);
    assert_int_equal(inner->ncaptures, 1);
    assert_int_equal(mid->ncaptures, 1);
    assert_null(af_graph_find(inner, "nope"));
    af_arena_free(a);
}

static void test_half_conversions(void **state) {
    (void)state;
    float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1e-9f, 1e6f};
    uint16_t halves[] = {0x0000, 0x3c00, 0xc100, 0x7bff, 0x0400, 0x0001, 0x0000, 0x7c00};
    for (size_t i = 0; i < AF_COUNT(vals); i++) {
        assert_int_equal(af_float_to_half(vals[i]), halves[i]);
        if (i < 6) assert_true(af_half_to_float(halves[i]) == vals[i]);
    }
    assert_true(af_bf16_to_float(af_float_to_bf16(1.5f)) == 1.5f);
}

/* af_copy against memcpy: every distance modulo 4 KiB class (the backward path at 1-31 bytes
 * ahead, memcpy elsewhere), sizes around its bounds and odd tails, and no byte outside [dst,
 * dst + n) written. */
/* Tensor buffers freed are kept for the next run's outputs (alloc.c af_buffer_free): a buffer
 * of 128 KiB or more comes back for a request it fits, zeroed; smaller ones and sizes it would
 * waste a quarter of are not taken; the cache keeps at most AF_BUFFER_SLOTS (the oldest go
 * first) and af_heap_trim empties it; an injected failure still fails. */
static void test_buffer_cache(void **state) {
    (void)state;
    af_heap_trim();
    int64_t dims[1] = {64 << 10}; /* 256 KiB of floats */
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, 1, dims);
    assert_non_null(t);
    void *kept = t->data;
    memset(t->data, 0x5A, t->nbytes);
    af_tensor_free(t);
    dims[0] = 40 << 10; /* 160 KiB: the 256 KiB buffer would waste more than a quarter */
    af_tensor *small = af_tensor_new(AF_DTYPE_FLOAT, 1, dims);
    assert_non_null(small);
    assert_ptr_not_equal(small->data, kept);
    dims[0] = (64 << 10) - 100; /* fits: the same buffer, zeroed */
    t = af_tensor_new(AF_DTYPE_FLOAT, 1, dims);
    assert_non_null(t);
    assert_ptr_equal(t->data, kept);
    for (size_t i = 0; i < t->nbytes; i++) assert_int_equal(((unsigned char *)t->data)[i], 0);
    af_tensor_free(t);
    af_tensor_free(small);
    /* more buffers than slots: the first ones freed are gone, the last ones kept */
    enum { N = AF_BUFFER_SLOTS + 4 };
    af_tensor *many[N];
    void *where[N];
    dims[0] = 33 << 10;
    for (int i = 0; i < N; i++) {
        assert_non_null(many[i] = af_tensor_new(AF_DTYPE_FLOAT, 1, dims));
        where[i] = many[i]->data;
    }
    for (int i = 0; i < N; i++) af_tensor_free(many[i]);
    af_tensor *last = af_tensor_new(AF_DTYPE_FLOAT, 1, dims);
    assert_non_null(last);
    bool recent = false;
    for (int i = N - AF_BUFFER_SLOTS; i < N; i++) recent |= last->data == where[i];
    assert_true(recent);
    af_tensor_free(last);
    af_heap_trim(); /* emptied: nothing is taken from it any more */
    af_alloc_fault(2, false); /* the tensor's struct, then its buffer */
    assert_null(af_tensor_new(AF_DTYPE_FLOAT, 1, dims));
    af_alloc_fault(0, false);
}

static void test_copy(void **state) {
    (void)state;
    enum { CAP = (1 << 20) + 8192 };
    unsigned char *src = malloc(CAP), *dst = malloc(CAP + 64), *want = malloc(CAP + 64);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(want);
    for (size_t i = 0; i < CAP; i++) src[i] = (unsigned char)(i * 131 + i / 251);
    const size_t sizes[] = {0, 1, 63, 4095, 4096, 4097, 5000, 65536 + 7, (1 << 20) - 1, 1 << 20};
    const size_t shifts[] = {0, 1, 4, 16, 31, 32, 33, 4096 + 4, 2048};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof shifts / sizeof *shifts; b++) {
            size_t n = sizes[a], at = (a * 7 + b) % 64; /* dst's own alignment varies too */
            unsigned char *d = dst + at;
            /* src placed so that d starts shifts[b] bytes after it modulo 4 KiB */
            size_t so = ((uintptr_t)d - (uintptr_t)src - shifts[b]) & 4095;
            unsigned char *s = src + so;
            assert_true((((uintptr_t)d - (uintptr_t)s) & 4095) == shifts[b] % 4096);
            assert_true(so + n <= CAP);
            memset(dst, 0xA5, CAP + 64);
            memcpy(want, dst, CAP + 64);
            memcpy(want + at, s, n);
            af_copy(d, s, n);
            assert_memory_equal(dst, want, CAP + 64);
        }
    free(src);
    free(dst);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sort_and_verify),   cmocka_unit_test(test_replace_and_remove),
        cmocka_unit_test(test_cycle_rejected),    cmocka_unit_test(test_insert_position),
        cmocka_unit_test(test_capture_lookup),    cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_copy),          cmocka_unit_test(test_buffer_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
