/* Tensor-manipulation kernel tests, table-driven: each row builds one node (op, attributes,
 * opset), runs its shape function and reference kernel on small tensors and checks the status
 * and, on success, the output dtype, dims and values. Rows cover Reshape (0, -1, allowzero),
 * Slice (negative steps, clamping, INT64 bounds), Resize (modes, coordinate transforms,
 * nearest modes, exclude_outside, tf_crop_and_resize) and Pad (modes, cropping, opset 2 form).
 * A second group checks shape inference with values unknown, as at compile time; a third runs
 * float32 Transposes (the fast paths where they apply: NCHW <-> NHWC, [R, C] -> [C, R],
 * dims of 1 anywhere, odd sizes, few rows, rows moved whole up to rank 6) with 1 and 2 threads
 * against the reference's strided copy; a fourth the fast Resize, Pad, Slice, Expand, Tile, Concat, Split and Gather against their
 * reference kernels on every ISA, called directly and through the dispatcher at 1 and 2
 * threads (fast_vs_ref), and what they decline reported by the reference; likewise the
 * selection kernels and Trilu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/simd/cpu.h"
#include "kernels/fast/dispatch.h"
#include "kernels/fast/fast.h"
#include "kernels/ref/ref.h"
#include "runtime/exec.h"

#define TENS_MAXV 64
#include "test_util.h"

#define EMPTY(t) {t, 1, {0}, {0}}
#define U8 AF_DTYPE_UINT8
#define BIG 1e18 /* "to the end" without INT64_MAX, which a double cannot hold */

/* x = 0..11 as [2, 3, 2] and [3, 4]; a 2x2 image; a 1x4 row. */
#define X12 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
#define IMG T4(F32, 1, 1, 2, 2, 1, 2, 3, 4)
#define ROW T4(F32, 1, 1, 1, 4, 1, 2, 3, 4)
#define M23 T2(F32, 2, 3, 1, 2, 3, 4, 5, 6)

static const tcase cases[] = {
    /* Reshape */
    {"reshape 0 copies, -1 infers", "Reshape", "", 14, 2,
     {{F32, 3, {2, 3, 2}, {X12}}, T1(I64, 2, 0, -1)}, AF_OK, {F32, 2, {2, 6}, {X12}}},
    {"reshape -1 first", "Reshape", "", 13, 2, {{F32, 3, {2, 3, 2}, {X12}}, T1(I64, 3, -1, 2, 2)},
     AF_OK, {F32, 3, {3, 2, 2}, {X12}}},
    {"reshape 0 past input rank", "Reshape", "", 13, 2, {T2(F32, 2, 2, 1, 2, 3, 4),
     T1(I64, 3, 2, 2, 0)}, AF_ERR_INVALID_MODEL, NONE},
    {"reshape allowzero keeps 0", "Reshape", "allowzero=1", 14, 2, {EMPTY(F32), T1(I64, 2, 3, 0)},
     AF_OK, {F32, 2, {3, 0}, {0}}},
    {"reshape allowzero=0 copies 0", "Reshape", "allowzero=0", 14, 2, {M23, T1(I64, 2, 0, 3)},
     AF_OK, {F32, 2, {2, 3}, {1, 2, 3, 4, 5, 6}}},
    {"reshape allowzero with 0 and -1", "Reshape", "allowzero=1", 14, 2, {M23, T1(I64, 2, 0, -1)},
     AF_ERR_INVALID_MODEL, NONE},
    {"reshape two -1", "Reshape", "", 13, 2, {M23, T1(I64, 2, -1, -1)}, AF_ERR_INVALID_MODEL, NONE},
    {"reshape wrong count", "Reshape", "", 13, 2, {M23, T1(I64, 2, 4, 2)}, AF_ERR_INVALID_MODEL,
     NONE},
    {"reshape -1 not divisible", "Reshape", "", 13, 2, {M23, T1(I64, 2, 4, -1)},
     AF_ERR_INVALID_MODEL, NONE},

    /* Slice */
    {"slice negative step", "Slice", "", 13, 5, {T1(F32, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
     T1(I64, 1, 8), T1(I64, 1, 1), T1(I64, 1, 0), T1(I64, 1, -3)}, AF_OK, T1(F32, 3, 8, 5, 2)},
    {"slice reverse all with INT64_MIN end", "Slice", "", 13, 5, {T1(F32, 4, 0, 1, 2, 3),
     T1(I64, 1, -1), T1(I64, 1, I64MIN), NONE, T1(I64, 1, -1)}, AF_OK, T1(F32, 4, 3, 2, 1, 0)},
    {"slice clamps both ends", "Slice", "", 13, 3, {T1(F32, 4, 0, 1, 2, 3), T1(I64, 1, -100),
     T1(I64, 1, 100)}, AF_OK, T1(F32, 4, 0, 1, 2, 3)},
    {"slice start past end is empty", "Slice", "", 13, 3, {T1(F32, 4, 0, 1, 2, 3),
     T1(I64, 1, 20), T1(I64, 1, 30)}, AF_OK, EMPTY(F32)},
    {"slice negative step clamps start", "Slice", "", 13, 5, {T1(F32, 4, 0, 1, 2, 3),
     T1(I64, 1, 100), T1(I64, 1, -100), T1(I64, 1, 0), T1(I64, 1, -2)}, AF_OK,
     T1(F32, 2, 3, 1)},
    {"slice 2-D axes and steps", "Slice", "", 13, 5, {{F32, 2, {3, 4}, {X12}}, T1(I64, 2, 0, 3),
     T1(I64, 2, BIG, 0), T1(I64, 2, 0, -1), T1(I64, 2, 2, -1)}, AF_OK,
     T2(F32, 2, 3, 3, 2, 1, 11, 10, 9)},
    {"slice empty axis with negative step", "Slice", "", 13, 5, {EMPTY(F32), T1(I64, 1, I64MIN),
     T1(I64, 1, 1), T1(I64, 1, 0), T1(I64, 1, -1)}, AF_OK, EMPTY(F32)},
    {"slice step 0", "Slice", "", 13, 5, {T1(F32, 2, 0, 1), T1(I64, 1, 0), T1(I64, 1, 2),
     T1(I64, 1, 0), T1(I64, 1, 0)}, AF_ERR_INVALID_MODEL, NONE},
    {"slice repeated axis", "Slice", "", 13, 4, {M23, T1(I64, 2, 0, 0), T1(I64, 2, 1, 1),
     T1(I64, 2, 1, -1)}, AF_ERR_INVALID_MODEL, NONE},
    {"slice opset 1 attributes", "Slice", "starts=1 ends=1000 axes=1", 9, 1, {M23}, AF_OK,
     T2(F32, 2, 2, 2, 3, 5, 6)},

    /* Resize and Upsample */
    {"resize nearest half_pixel", "Resize", "mode=nearest", 13, 3,
     {IMG, EMPTY(F32), T1(F32, 4, 1, 1, 2, 2)}, AF_OK,
     T4(F32, 1, 1, 4, 4, 1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4)},
    {"resize linear half_pixel", "Resize", "mode=linear", 13, 3,
     {IMG, EMPTY(F32), T1(F32, 4, 1, 1, 2, 2)}, AF_OK,
     T4(F32, 1, 1, 4, 4, 1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25,
        3.75, 4)},
    {"resize linear align_corners sizes", "Resize",
     "mode=linear coordinate_transformation_mode=align_corners", 13, 4,
     {IMG, EMPTY(F32), EMPTY(F32), T1(I64, 4, 1, 1, 3, 3)}, AF_OK,
     T4(F32, 1, 1, 3, 3, 1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4)},
    {"resize cubic downsample", "Resize", "mode=cubic", 13, 3,
     {ROW, EMPTY(F32), T1(F32, 4, 1, 1, 1, 0.5)}, AF_OK, T4(F32, 1, 1, 1, 2, 1.40625, 3.59375)},
    {"resize cubic exclude_outside", "Resize", "mode=cubic exclude_outside=1", 13, 3,
     {ROW, EMPTY(F32), T1(F32, 4, 1, 1, 1, 0.5)}, AF_OK,
     T4(F32, 1, 1, 1, 2, 1.3714285714285714, 3.6285714285714286)},
    {"resize nearest floor asymmetric", "Resize",
     "nearest_mode=floor coordinate_transformation_mode=asymmetric", 13, 4,
     {ROW, EMPTY(F32), EMPTY(F32), T1(I64, 4, 1, 1, 1, 8)}, AF_OK,
     T4(F32, 1, 1, 1, 8, 1, 1, 2, 2, 3, 3, 4, 4)},
    {"resize nearest round_prefer_ceil clamps", "Resize",
     "nearest_mode=round_prefer_ceil coordinate_transformation_mode=asymmetric", 13, 4,
     {ROW, EMPTY(F32), EMPTY(F32), T1(I64, 4, 1, 1, 1, 8)}, AF_OK,
     T4(F32, 1, 1, 1, 8, 1, 2, 2, 3, 3, 4, 4, 4)},
    {"resize tf_crop_and_resize extrapolates", "Resize",
     "mode=linear coordinate_transformation_mode=tf_crop_and_resize extrapolation_value=10.0", 13,
     4, {ROW, T1(F32, 8, 0, 0, 0, 0, 1, 1, 1, 1.5), EMPTY(F32), T1(I64, 4, 1, 1, 1, 3)}, AF_OK,
     T4(F32, 1, 1, 1, 3, 1, 3.25, 10)},
    {"resize bad mode", "Resize", "mode=area", 13, 3, {IMG, EMPTY(F32), T1(F32, 4, 1, 1, 2, 2)},
     AF_ERR_UNSUPPORTED, NONE},
    {"resize scales of wrong length", "Resize", "", 13, 3, {IMG, EMPTY(F32), T1(F32, 2, 2, 2)},
     AF_ERR_INVALID_MODEL, NONE},
    {"upsample opset 9 nearest", "Upsample", "mode=nearest", 9, 2,
     {IMG, T1(F32, 4, 1, 1, 2, 2)}, AF_OK,
     T4(F32, 1, 1, 4, 4, 1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4)},

    /* Pad */
    {"pad constant value", "Pad", "mode=constant", 13, 3, {M23, T1(I64, 4, 0, 1, 0, 1),
     {F32, 0, {0}, {9}}}, AF_OK, T2(F32, 2, 5, 9, 1, 2, 3, 9, 9, 4, 5, 6, 9)},
    {"pad reflect", "Pad", "mode=reflect", 13, 2, {M23, T1(I64, 4, 0, 2, 0, 2)}, AF_OK,
     T2(F32, 2, 7, 3, 2, 1, 2, 3, 2, 1, 6, 5, 4, 5, 6, 5, 4)},
    {"pad reflect wider than the axis", "Pad", "mode=reflect", 13, 2,
     {M23, T1(I64, 4, 0, 4, 0, 0)}, AF_OK,
     T2(F32, 2, 7, 1, 2, 3, 2, 1, 2, 3, 4, 5, 6, 5, 4, 5, 6)},
    {"pad edge", "Pad", "mode=edge", 13, 2, {M23, T1(I64, 4, 1, 0, 0, 1)}, AF_OK,
     T2(F32, 3, 4, 1, 2, 3, 3, 1, 2, 3, 3, 4, 5, 6, 6)},
    {"pad negative crops", "Pad", "", 13, 2, {M23, T1(I64, 4, 0, -1, 0, 0)}, AF_OK,
     T2(F32, 2, 2, 2, 3, 5, 6)},
    {"pad opset 2 attributes", "Pad", "pads=0,1,0,1 value=9.0", 10, 1, {M23}, AF_OK,
     T2(F32, 2, 5, 9, 1, 2, 3, 9, 9, 4, 5, 6, 9)},
    {"pad crop below zero", "Pad", "", 13, 2, {M23, T1(I64, 4, 0, -2, 0, -2)},
     AF_ERR_INVALID_MODEL, NONE},
    {"pad wrong pads length", "Pad", "", 13, 2, {M23, T1(I64, 2, 1, 1)}, AF_ERR_INVALID_MODEL,
     NONE},
    {"pad unknown mode", "Pad", "mode=mirror", 13, 2, {M23, T1(I64, 4, 0, 1, 0, 1)},
     AF_ERR_UNSUPPORTED, NONE},
};

/* ---- helpers ------------------------------------------------------------------------------ */

static void parse_attr(af_arena *a, af_attr *at, const char *val) {
    if (strchr(val, ',')) {
        at->type = AF_ATTR_INTS;
        at->ints = af_arena_calloc(a, 16, sizeof(int64_t));
        for (const char *p = val; *p && at->n < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
            at->ints[at->n++] = strtoll(p, NULL, 10);
    } else if (strchr(val, '.')) {
        at->type = AF_ATTR_FLOAT;
        at->f = strtof(val, NULL);
    } else if (strspn(val, "-0123456789") == strlen(val)) {
        /* A lone int is both an INT and a one-element INTS (e.g. Slice's axes=1). */
        at->type = AF_ATTR_INT;
        at->i = strtoll(val, NULL, 10);
        at->ints = af_arena_calloc(a, 1, sizeof(int64_t));
        at->ints[0] = at->i;
        at->n = 1;
    } else {
        at->type = AF_ATTR_STRING;
        at->s = af_arena_strdup(a, val);
        at->slen = strlen(val);
    }
}

/* A one-node graph for `op` at `opset` with attributes parsed from `attrs`. */
static af_node *make_node(af_arena *a, const char *op, const char *attrs, int opset, int nin,
                          int nout) {
    af_node *n = tu_node(a, af_op_lookup("", op), opset, nin, nout, 8);
    tu_attrs(a, n, attrs, 8, parse_attr);
    return n;
}

/* The INT-typed lone ints above must also read as lists: af_attr_ints checks the type, so give
 * list-valued attribute names the INTS type. */
static void fix_list_attrs(af_node *n) {
    static const char *lists[] = {"starts", "ends", "axes", "pads", "perm", "split"};
    for (int i = 0; i < n->nattrs; i++)
        for (size_t k = 0; k < AF_COUNT(lists); k++)
            if (!strcmp(n->attrs[i].name, lists[k]) && n->attrs[i].type == AF_ATTR_INT)
                n->attrs[i].type = AF_ATTR_INTS;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_cases(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const tcase *tc = &cases[c];
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, tc->op, tc->attrs, tc->opset, tc->nin, 1);
        fix_list_attrs(n);
        af_tensor *owned[5] = {NULL};
        const af_tensor *in[5] = {NULL};
        for (int k = 0; k < tc->nin; k++)
            if (tc->in[k].t != AF_DTYPE_UNDEFINED) in[k] = owned[k] = tens_make(&tc->in[k]);
        af_tensor out;
        memset(&out, 0, sizeof out);
        out.rank = -1;
        af_error err = {0};
        af_status st = tu_run(n, in, &out, 1, &err);
        if (st != tc->expect)
            fail_msg("%s: status %d, expected %d (%s)", tc->name, st, tc->expect, err.message);
        if (st == AF_OK) tens_expect_close(tc->name, &out, &tc->out);
        af_tensor_release(&out);
        for (int k = 0; k < 5; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
}

/* At compile time an input's value may be unknown: dims that depend on it become -1. */
static void test_unknown_values(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err = {0};
    af_tensor x = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {2, 3, 4}};
    af_tensor shape = {.dtype = AF_DTYPE_INT64, .rank = 1, .dims = {2}};
    const af_tensor *in[5] = {&x, &shape, NULL, NULL, NULL};
    af_tensor out;

    /* Reshape: rank from the shape input's length, dims unknown. */
    af_node *n = make_node(a, "Reshape", "", 13, 2, 1);
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(n, in, &out, &err), AF_OK);
    assert_int_equal(out.rank, 2);
    assert_true(out.dims[0] == -1 && out.dims[1] == -1);

    /* Slice with unknown starts: rank kept, dims unknown. */
    af_tensor s1 = {.dtype = AF_DTYPE_INT64, .rank = 1, .dims = {1}};
    const af_tensor *sin[5] = {&x, &s1, &s1, NULL, NULL};
    n = make_node(a, "Slice", "", 13, 3, 1);
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(n, sin, &out, &err), AF_OK);
    assert_int_equal(out.rank, 3);
    assert_int_equal(out.dims[0], -1);

    /* Transpose of partly unknown dims keeps what is known. */
    x.dims[1] = -1;
    n = make_node(a, "Transpose", "perm=2,0,1", 13, 1, 1);
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(n, in, &out, &err), AF_OK);
    assert_int_equal(out.rank, 3);
    assert_true(out.dims[0] == 4 && out.dims[1] == 2 && out.dims[2] == -1);

    /* Resize with unknown scales: rank kept, dims unknown. */
    af_tensor roi = {.dtype = AF_DTYPE_FLOAT, .rank = 1, .dims = {0}};
    af_tensor sc = {.dtype = AF_DTYPE_FLOAT, .rank = 1, .dims = {3}};
    const af_tensor *rin[5] = {&x, &roi, &sc, NULL, NULL};
    n = make_node(a, "Resize", "", 13, 3, 1);
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(n, rin, &out, &err), AF_OK);
    assert_int_equal(out.rank, 3);
    assert_int_equal(out.dims[0], -1);

    /* Unknown rank propagates. */
    x.rank = -1;
    n = make_node(a, "Squeeze", "", 13, 1, 1);
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(n, in, &out, &err), AF_OK);
    assert_int_equal(out.rank, -1);
    af_arena_free(a);
}


/* Transpose on every ISA and 1 and 2 threads must equal the reference copy bit for bit. */
static void test_transpose_fast(void **state) {
    (void)state;
    static const struct {
        const char *perm;
        int rank;
        int64_t dims[6];
        bool fast; /* fast_transpose takes it (else it declines, the reference runs) */
    } cases[] = {
        {"perm=0,2,3,1", 4, {1, 3, 150, 161}, true}, /* NCHW -> NHWC, a CNN input reorder (threaded) */
        {"perm=0,2,3,1", 4, {2, 3, 5, 7}, true},
        {"perm=0,2,3,1", 4, {2, 4, 9, 130}, true},  /* 4 planes, more columns than an item */
        {"perm=1,0", 2, {2, 1500}, true},           /* 2 rows */     /* batch 2, fewer columns than a block */
        {"perm=0,3,1,2", 4, {2, 9, 11, 35}, true},  /* NHWC -> NCHW, batch 2 */
        {"perm=1,0", 2, {33, 70}, true},            /* [R, C] -> [C, R] */
        {"perm=0,3,1,2", 4, {1, 40, 41, 64}, true}, /* 8 x 8 tiles over several 64 x 64 items */
        {"perm=0,2,1", 3, {3, 72, 136}, true},       /* batch 3, whole tiles only */
        {"perm=0,2,1", 3, {1, 1, 300}, true},       /* only dims of 1 move: a copy */
        {"perm=2,0,1,3", 4, {5, 1, 17, 1}, true},   /* merges to [5, 17] -> [17, 5] */
        {"perm=0,2,1,3", 4, {2, 19, 3, 8}, false},   /* moves rows of 8: the reference's case */
        {"perm=0,2,1,3", 4, {2, 19, 3, 20}, true},  /* moves rows of 20 */
        {"perm=0,1,3,2,4,5", 6, {2, 3, 7, 2, 7, 24}, true}, /* Swin's window partition */
        {"perm=2,0,3,1,4", 5, {3, 5, 2, 1, 17}, true},      /* three outer runs out of order, a dim of 1 */
        {"perm=3,2,1,0", 4, {3, 4, 5, 6}, false},    /* full reversal: the reference's case */
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_best();
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, "Transpose", cases[c].perm, 13, 1, 1);
        af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, cases[c].rank, cases[c].dims);
        assert_non_null(x);
        for (int64_t i = 0; i < af_tensor_numel(x); i++) ((float *)x->data)[i] = (float)i;
        const af_tensor *in[1] = {x};
        af_tensor want, got;
        memset(&want, 0, sizeof want);
        af_isa_set(AF_ISA_REFERENCE);
        assert_int_equal(tu_run(n, in, &want, 1, &err), AF_OK);
        for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++)
            for (int threads = 1; threads <= 2; threads++) {
                af_isa_set((af_isa)isa);
                memset(&got, 0, sizeof got);
                af_status st = af_kernel_shape(n, in, &got, &err);
                if (st == AF_OK) st = af_tensor_alloc(&got, &err);
                if (st == AF_OK) st = af_runtime_kernel(threads == 2 ? rt : NULL, n, in, &got, &err);
                assert_int_equal(st, AF_OK);
                assert_int_equal(got.rank, want.rank);
                if (cases[c].fast != (fast_transpose(n, in, &got, NULL, &err) == AF_OK))
                    fail_msg("%s: fast_transpose %s it", cases[c].perm, cases[c].fast ? "declined" : "took");
                if (memcmp(got.data, want.data, (size_t)af_tensor_numel(&want) * sizeof(float)))
                    fail_msg("%s on %s, %d thread(s): differs from the reference", cases[c].perm,
                             af_isa_name(af_isa_get()), threads);
                af_tensor_release(&got);
            }
        af_isa_set(best);
        af_tensor_release(&want);
        af_tensor_free(x);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

/* ---- fast kernels against the reference ---------------------------------------------------- */

/* A tensor of dtype t and dims with values from tu_rnd (integers: small ones, some negative). */
static af_tensor *rnd_tensor(af_dtype t, int rank, const int64_t *dims) {
    af_tensor *x = af_tensor_new(t, rank, dims);
    assert_non_null(x);
    for (int64_t i = 0; i < af_tensor_numel(x); i++) {
        double v = tu_rnd() * 8.0;
        tens_set(x, i, t == AF_DTYPE_FLOAT ? v : (double)(int64_t)v);
    }
    return x;
}

/* Run n on the fast kernel fast directly (one thread: it must take the case) and through the
 * dispatcher on 1 and 2 threads, on every ISA; compare its nout outputs with the reference
 * kernel's: bit for bit when exact, else within 1e-5 of the reference's largest magnitude. */
static void fast_vs_ref_n(const char *name, const af_node *n, const af_tensor *const *in,
                          int nout, af_kernel_fn fast, bool exact, af_runtime *rt) {
    af_error err = {0};
    af_tensor want[4], got[4];
    assert_true(nout >= 1 && nout <= 4);
    memset(want, 0, sizeof want);
    af_isa best = af_isa_best();
    af_isa_set(AF_ISA_REFERENCE);
    if (tu_run(n, in, want, nout, &err) != AF_OK) fail_msg("%s: reference: %s", name, err.message);
    for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++)
        for (int way = 0; way < 3; way++) {
            af_isa_set((af_isa)isa);
            memset(got, 0, sizeof got);
            af_status st = af_kernel_shape(n, in, got, &err);
            for (int o = 0; st == AF_OK && o < nout; o++) st = af_tensor_alloc(&got[o], &err);
            if (st == AF_OK && way == 0) {
                af_exec ex;
                af_exec_init(&ex, NULL, NULL);
                st = fast(n, in, got, &ex, &err);
                af_exec_release(&ex);
            } else if (st == AF_OK) {
                st = af_runtime_kernel(way == 2 ? rt : NULL, n, in, got, &err);
            }
            const char *how = way == 0 ? "fast kernel" : way == 1 ? "1 thread" : "2 threads";
            if (st != AF_OK)
                fail_msg("%s on %s, %s: status %d", name, af_isa_name(af_isa_get()), how, st);
            for (int o = 0; o < nout; o++) {
                af_tensor *g = &got[o], *w = &want[o];
                assert_int_equal(g->dtype, w->dtype);
                assert_int_equal(g->rank, w->rank);
                for (int d = 0; d < w->rank; d++) assert_int_equal(g->dims[d], w->dims[d]);
                int64_t count = af_tensor_numel(w);
                double range = 1.0;
                for (int64_t i = 0; !exact && i < count; i++) range = fmax(range, fabs(tens_get(w, i)));
                for (int64_t i = 0; i < count; i++) {
                    size_t es = af_dtype_size(w->dtype);
                    bool ok = exact ? !memcmp((char *)g->data + i * es, (char *)w->data + i * es, es)
                                    : fabs(tens_get(g, i) - tens_get(w, i)) <= 1e-5 * range;
                    if (!ok)
                        fail_msg("%s on %s, %s: output %d element %lld is %.9g, expected %.9g",
                                 name, af_isa_name(af_isa_get()), how, o, (long long)i,
                                 tens_get(g, i), tens_get(w, i));
                }
            }
            for (int o = 0; o < nout; o++) af_tensor_release(&got[o]);
        }
    af_isa_set(best);
    for (int o = 0; o < nout; o++) af_tensor_release(&want[o]);
}

static void fast_vs_ref(const char *name, const af_node *n, const af_tensor *const *in,
                        af_kernel_fn fast, bool exact, af_runtime *rt) {
    fast_vs_ref_n(name, n, in, 1, fast, exact, rt);
}

/* Resize: every mode, coordinate transformation and nearest_mode, scales and sizes, resized
 * axes anywhere (first, middle, all, none), ranks 1 to 5, several dtypes for nearest. */
static void test_resize_fast(void **state) {
    (void)state;
    static const struct {
        const char *attrs;
        int opset;
        af_dtype t;
        int rank;
        int64_t dims[5];
        double scales[5]; /* all 0: sizes */
        int64_t sizes[5];
        double roi[10]; /* tf_crop_and_resize */
    } cases[] = {
        {"mode=linear", 13, F32, 4, {1, 8, 30, 40}, {1, 1, 2, 2}}, /* threaded */
        {"mode=linear", 13, F32, 4, {2, 3, 7, 9}, {1, 1, 0.5, 0.7}},
        {"mode=linear coordinate_transformation_mode=align_corners", 13, F32, 4, {2, 3, 5, 6},
         {0}, {2, 3, 9, 4}},
        {"mode=linear coordinate_transformation_mode=pytorch_half_pixel", 13, F32, 4,
         {1, 2, 3, 7}, {0}, {1, 2, 1, 13}},
        {"mode=linear coordinate_transformation_mode=asymmetric", 13, F32, 3, {2, 5, 7},
         {1, 1.5, 0.6}},
        {"mode=linear coordinate_transformation_mode=half_pixel", 11, F32, 5, {1, 2, 3, 4, 5},
         {1, 1, 2, 2, 2}},
        {"mode=linear", 13, F32, 3, {3, 2, 4}, {2, 1, 1}},   /* the first axis resized */
        {"mode=linear", 13, F32, 4, {2, 5, 3, 4}, {1, 2, 1, 1}}, /* a middle axis alone */
        {"mode=linear", 13, F32, 1, {11}, {1.9}},
        {"mode=linear", 13, F32, 3, {2, 3, 4}, {1, 1, 1}},   /* nothing resized: a copy */
        {"mode=cubic", 13, F32, 4, {1, 2, 6, 8}, {1, 1, 1.7, 2.3}},
        {"mode=cubic cubic_coeff_a=-0.5 exclude_outside=1", 13, F32, 4, {1, 1, 9, 5}, {0},
         {1, 1, 4, 11}},
        {"mode=cubic coordinate_transformation_mode=align_corners", 13, F32, 4, {1, 3, 4, 4},
         {1, 1, 2, 2}},
        {"mode=nearest", 13, F32, 4, {1, 3, 5, 7}, {1, 1, 2, 3}},
        {"mode=nearest nearest_mode=ceil coordinate_transformation_mode=asymmetric", 13, F32, 4,
         {2, 2, 5, 7}, {1, 1, 1.5, 0.5}},
        {"mode=nearest nearest_mode=floor coordinate_transformation_mode=align_corners", 13, I64,
         3, {3, 5, 7}, {0}, {3, 9, 4}},
        {"mode=nearest nearest_mode=round_prefer_ceil "
         "coordinate_transformation_mode=tf_half_pixel_for_nn", 13, U8, 5, {1, 2, 3, 4, 5},
         {1, 1, 2, 1.5, 0.8}},
        {"mode=nearest coordinate_transformation_mode=pytorch_half_pixel", 13, I32, 4,
         {2, 3, 4, 5}, {1, 3, 2, 2}},
        {"mode=linear coordinate_transformation_mode=tf_crop_and_resize extrapolation_value=-7.5",
         13, F32, 4, {1, 2, 5, 6}, {0}, {1, 2, 7, 9}, {0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3}},
        {"mode=nearest coordinate_transformation_mode=tf_crop_and_resize", 13, F32, 4,
         {1, 2, 5, 6}, {0}, {1, 2, 4, 8}, {0, 0, -0.3, 0.1, 1, 1, 0.8, 1.2}},
        {"mode=linear", 10, F32, 4, {1, 2, 3, 5}, {1, 1, 2, 2}}, /* opset 10: X, scales */
        {"mode=nearest", 9, F32, 4, {1, 2, 3, 5}, {1, 1, 2, 3}}, /* Upsample */
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_arena *a = af_arena_new();
        int r = cases[c].rank, opset = cases[c].opset;
        bool sizes = cases[c].scales[0] == 0, upsample = opset < 10;
        int nin = opset < 11 ? 2 : sizes ? 4 : 3;
        af_node *n = make_node(a, upsample ? "Upsample" : "Resize", cases[c].attrs, opset, nin, 1);
        af_tensor *x = rnd_tensor(cases[c].t, r, cases[c].dims);
        int64_t r1 = r, r2 = 2 * r, r0 = 0;
        bool crop = strstr(cases[c].attrs, "tf_crop_and_resize") != NULL;
        af_tensor *roi = af_tensor_new(F32, 1, crop ? &r2 : &r0);
        af_tensor *sc = af_tensor_new(F32, 1, sizes ? &r0 : &r1);
        af_tensor *sz = af_tensor_new(I64, 1, &r1);
        for (int i = 0; crop && i < 2 * r; i++) ((float *)roi->data)[i] = (float)cases[c].roi[i];
        for (int i = 0; !sizes && i < r; i++) ((float *)sc->data)[i] = (float)cases[c].scales[i];
        for (int i = 0; i < r; i++) ((int64_t *)sz->data)[i] = cases[c].sizes[i];
        const af_tensor *in4[4] = {x, roi, sc, sz}, *in2[2] = {x, sc};
        char name[200];
        snprintf(name, sizeof name, "resize %s (case %zu)", cases[c].attrs, c);
        fast_vs_ref(name, n, opset < 11 ? in2 : in4, fast_resize,
                    strstr(cases[c].attrs, "nearest") != NULL || cases[c].t != F32, rt);
        af_tensor_free(x);
        af_tensor_free(roi);
        af_tensor_free(sc);
        af_tensor_free(sz);
        af_arena_free(a);
    }
    /* What the fast kernel does not take, the reference refuses with a message. */
    af_arena *a = af_arena_new();
    int64_t d4[4] = {1, 1, 2, 2}, four = 4;
    af_tensor *x = rnd_tensor(F32, 4, d4), *sc = af_tensor_new(F32, 1, &four);
    for (int i = 0; i < 4; i++) ((float *)sc->data)[i] = 2.0f;
    af_node *n = make_node(a, "Resize", "mode=linear antialias=1", 18, 3, 1);
    const af_tensor *in[3] = {x, NULL, sc};
    af_tensor out;
    memset(&out, 0, sizeof out);
    int64_t d44[4] = {1, 1, 4, 4};
    af_tensor_set_type(&out, F32, 4, d44); /* the shape function refuses antialias too */
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_resize(n, in, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in, &out, &err), AF_ERR_UNSUPPORTED);
    out.nbytes = 8; /* an output buffer shorter than its dims */
    n = make_node(a, "Resize", "mode=linear", 13, 3, 1);
    assert_int_equal(fast_resize(n, in, &out, &ex, &err), AF_DECLINED);
    out.nbytes = 16 * sizeof(float);
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(sc);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* GridSample: every mode x padding_mode x align_corners on 1-D, 2-D and 3-D inputs (opset 16's
 * mode names for 2-D, opset 20's for the others), odd sizes, N > 1, C = 1 and C > 8, grid values
 * inside and outside [-1, 1], a NaN and a huge one; nearest bit for bit. */
static void test_grid_sample_fast(void **state) {
    (void)state;
    static const struct {
        int rank;
        int64_t x[5], g[5];
    } geo[] = {
        {4, {2, 3, 5, 7}, {2, 4, 6, 2}},
        {4, {1, 1, 4, 3}, {1, 9, 5, 2}},     /* C = 1 */
        {4, {1, 11, 6, 9}, {1, 3, 7, 2}},    /* C > 8 */
        {5, {2, 3, 3, 4, 5}, {2, 2, 3, 4, 3}},
        {3, {2, 3, 7}, {2, 5, 1}},
        {4, {1, 1, 1, 1}, {1, 2, 3, 2}},     /* a single pixel (reflection's empty span) */
    };
    static const char *modes16[] = {"bilinear", "nearest", "bicubic"};
    static const char *modes20[] = {"linear", "nearest", "cubic"};
    static const char *pads[] = {"zeros", "border", "reflection"};
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    for (size_t c = 0; c < AF_COUNT(geo); c++)
        for (int m = 0; m < 3; m++)
            for (int p = 0; p < 3; p++)
                for (int al = 0; al < 2; al++) {
                    af_arena *a = af_arena_new();
                    int opset = geo[c].rank == 4 ? 16 : 20;
                    char attrs[96], name[160];
                    snprintf(attrs, sizeof attrs, "mode=%s padding_mode=%s align_corners=%d",
                             opset == 16 ? modes16[m] : modes20[m], pads[p], al);
                    af_node *n = make_node(a, "GridSample", attrs, opset, 2, 1);
                    af_tensor *x = rnd_tensor(F32, geo[c].rank, geo[c].x);
                    af_tensor *g = af_tensor_new(F32, geo[c].rank, geo[c].g);
                    float *gv = g->data;
                    for (int64_t i = 0; i < af_tensor_numel(g); i++) gv[i] = (float)(tu_rnd() * 1.6);
                    gv[0] = 1e30f;
                    if (m != 2) gv[1] = NAN; /* cubic's weights of a NaN are NaN in both */
                    const af_tensor *in[2] = {x, g};
                    snprintf(name, sizeof name, "GridSample %s, geometry %zu", attrs, c);
                    fast_vs_ref(name, n, in, fast_grid_sample, m == 1, rt);
                    af_tensor_free(x);
                    af_tensor_free(g);
                    af_arena_free(a);
                }
    /* Large enough for two threads to share it. */
    af_arena *a = af_arena_new();
    int64_t xd[4] = {2, 16, 40, 40}, gd[4] = {2, 40, 40, 2};
    af_node *n = make_node(a, "GridSample", "", 16, 2, 1);
    af_tensor *x = rnd_tensor(F32, 4, xd), *g = af_tensor_new(F32, 4, gd);
    for (int64_t i = 0; i < af_tensor_numel(g); i++) ((float *)g->data)[i] = (float)(tu_rnd() * 1.1);
    const af_tensor *in[2] = {x, g};
    fast_vs_ref("GridSample threaded", n, in, fast_grid_sample, false, rt);
    /* Each opset's mode names only, as ONNX Runtime; more than 3 spatial axes refused by name. */
    af_tensor out;
    memset(&out, 0, sizeof out);
    n = make_node(a, "GridSample", "mode=linear", 16, 2, 1);
    assert_int_equal(af_kernel_shape(n, in, &out, &err), AF_ERR_INVALID_MODEL);
    assert_non_null(strstr(err.message, "bilinear, nearest or bicubic"));
    n = make_node(a, "GridSample", "mode=bicubic", 20, 2, 1);
    assert_int_equal(af_kernel_shape(n, in, &out, &err), AF_ERR_INVALID_MODEL);
    assert_non_null(strstr(err.message, "linear, nearest or cubic"));
    int64_t d6[6] = {1, 1, 2, 2, 2, 2}, g6[6] = {1, 2, 2, 2, 2, 4};
    af_tensor *x6 = af_tensor_new(F32, 6, d6), *gg6 = af_tensor_new(F32, 6, g6);
    const af_tensor *in6[2] = {x6, gg6};
    n = make_node(a, "GridSample", "", 20, 2, 1);
    assert_int_equal(af_kernel_shape(n, in6, &out, &err), AF_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "1 to 3 spatial axes"));
    af_tensor_free(x6);
    af_tensor_free(gg6);
    af_tensor_free(x);
    af_tensor_free(g);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* Pad: every mode, negative pads, ranks 1 to 5, dtypes of 1 to 8 bytes, constant values. */
static void test_pad_fast(void **state) {
    (void)state;
    static const struct {
        const char *attrs;
        int opset;
        af_dtype t;
        int rank;
        int64_t dims[5];
        int64_t pads[10];
        double value; /* constant_value input (opset 11 on); NAN: none */
    } cases[] = {
        {"mode=reflect", 13, F32, 4, {1, 16, 60, 80}, {0, 0, 1, 1, 0, 0, 1, 1}, NAN}, /* threaded */
        {"mode=constant", 13, F32, 4, {2, 3, 5, 7}, {0, 1, 2, 3, 1, 0, 3, 2}, 2.5},
        {"mode=constant", 13, F32, 4, {2, 3, 5, 7}, {0, -1, 2, -3, 1, 0, -2, 2}, NAN},
        {"mode=edge", 13, I64, 3, {3, 4, 5}, {1, 2, 3, 2, 1, 4}, NAN},
        {"mode=reflect", 13, F32, 3, {2, 4, 5}, {0, 3, 4, 1, 3, 4}, NAN},
        {"mode=reflect", 13, U8, 2, {1, 6}, {2, 9, 1, 7}, NAN},       /* pads beyond the axis */
        {"mode=wrap", 19, F32, 4, {1, 2, 3, 4}, {0, 1, 2, 5, 0, 2, 4, 3}, NAN},
        {"mode=wrap", 19, I32, 2, {3, 5}, {-1, -2, 1, 2}, NAN},
        {"mode=edge", 13, F32, 5, {1, 2, 3, 4, 1}, {0, 0, 1, 2, 3, 1, 0, 0, 1, 2}, NAN},
        {"mode=constant", 13, F32, 1, {9}, {4, -3}, -1.0},
        {"mode=constant value=1.5", 2, F32, 2, {3, 4}, {1, 2, 0, 1}, NAN}, /* opset 2: attributes */
        {"mode=constant", 13, F32, 3, {2, 0, 3}, {0, 1, 1, 0, 1, 1}, 3.0}, /* an empty input */
        {"mode=constant", 13, F32, 2, {3, 4}, {0, 0, 0, -4}, NAN},         /* an empty output */
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_arena *a = af_arena_new();
        int r = cases[c].rank, opset = cases[c].opset;
        bool cv = opset >= 11 && !isnan(cases[c].value);
        char attrs[128];
        if (opset < 11) {
            snprintf(attrs, sizeof attrs, "%s pads=", cases[c].attrs);
            for (int i = 0; i < 2 * r; i++)
                snprintf(attrs + strlen(attrs), sizeof attrs - strlen(attrs), "%s%lld", i ? "," : "",
                         (long long)cases[c].pads[i]);
        } else {
            snprintf(attrs, sizeof attrs, "%s", cases[c].attrs);
        }
        af_node *n = make_node(a, "Pad", attrs, opset, opset < 11 ? 1 : cv ? 3 : 2, 1);
        fix_list_attrs(n);
        af_tensor *x = rnd_tensor(cases[c].t, r, cases[c].dims);
        int64_t np = 2 * r;
        af_tensor *pads = af_tensor_new(I64, 1, &np), *val = af_tensor_new(cases[c].t, 0, NULL);
        for (int i = 0; i < 2 * r; i++) ((int64_t *)pads->data)[i] = cases[c].pads[i];
        if (cv) tens_set(val, 0, cases[c].value);
        const af_tensor *in[3] = {x, pads, val};
        char name[200];
        snprintf(name, sizeof name, "pad %s (case %zu)", attrs, c);
        fast_vs_ref(name, n, in, fast_pad, true, rt);
        af_tensor_free(x);
        af_tensor_free(pads);
        af_tensor_free(val);
        af_arena_free(a);
    }
    /* Refused by the fast kernel, reported by the reference: an edge pad of an empty tensor,
     * a short input buffer. */
    af_arena *a = af_arena_new();
    int64_t d2[2] = {0, 3}, four = 4, d3[2] = {2, 5};
    af_tensor *x = af_tensor_new(F32, 2, d2), *pads = af_tensor_new(I64, 1, &four);
    for (int i = 0; i < 4; i++) ((int64_t *)pads->data)[i] = 1;
    af_node *n = make_node(a, "Pad", "mode=edge", 13, 2, 1);
    const af_tensor *in[2] = {x, pads};
    af_tensor out;
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 2, d3);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_pad(n, in, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in, &out, &err), AF_ERR_RUNTIME);
    af_tensor_free(x);
    int64_t d1[2] = {1, 3};
    x = af_tensor_new(F32, 2, d1);
    x->nbytes = 4; /* claims 3 floats, holds 1 */
    in[0] = x;
    assert_int_equal(fast_pad(n, in, &out, &ex, &err), AF_DECLINED);
    x->nbytes = 12;
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(pads);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* An int64 tensor of rank 1 (rank 0 when len < 0) holding v. */
static af_tensor *i64s(int len, const int64_t *v) {
    int64_t d = len < 0 ? 1 : len;
    af_tensor *t = af_tensor_new(I64, len < 0 ? 0 : 1, &d);
    assert_non_null(t);
    memcpy(t->data, v, (size_t)d * sizeof(int64_t));
    return t;
}

/* Slice, Expand, Tile, Concat, Split, Gather and Transposes that are copies: copies of any
 * element size, bit-identical. */
static void test_copy_fast(void **state) {
    (void)state;
    static const struct {
        const char *op, *attrs;
        int opset, nin, nout;
        af_dtype t;
        int rank;
        int64_t dims[4];
        int ilen[4];       /* lengths of the int64 inputs 1..4 (-1: a scalar) */
        int64_t iv[4][6];  /* their values */
        af_kernel_fn fast;
    } cases[] = {
        {"Slice", "", 13, 5, 1, F32, 4, {1, 128, 30, 40}, {1, 1, 1, 1}, {{64}, {128}, {1}, {1}},
         fast_slice}, /* channels 64..127: one block per batch */
        {"Slice", "", 13, 5, 1, F32, 3, {5, 6, 7}, {2, 2, 2, 2}, {{4, -1}, {0, -8}, {0, 2}, {-1, -2}},
         fast_slice}, /* negative steps */
        {"Slice", "", 13, 5, 1, I64, 3, {5, 6, 7}, {1, 1, 1, 1}, {{1}, {7}, {2}, {3}}, fast_slice},
        {"Slice", "", 13, 4, 1, U8, 2, {4, 9}, {2, 2, 2, 0}, {{1, 3}, {3, 100}, {0, 1}}, fast_slice},
        {"Slice", "", 13, 4, 1, F32, 2, {4, 9}, {1, 1, 1, 0}, {{5}, {5}, {1}}, fast_slice}, /* empty */
        {"Expand", "", 13, 2, 1, F32, 3, {3, 1, 5}, {4}, {{2, 3, 4, 5}}, fast_expand},
        {"Expand", "", 13, 2, 1, F32, 4, {1, 8, 1, 1}, {4}, {{2, 8, 30, 40}}, fast_expand},
        {"Expand", "", 13, 2, 1, I32, 2, {1, 7}, {3}, {{3, 1, 7}}, fast_expand},
        {"Expand", "", 13, 2, 1, F32, 2, {5, 1}, {2}, {{1, 70000}}, fast_expand}, /* row pieces */
        {"Tile", "", 13, 2, 1, F32, 3, {2, 3, 4}, {3}, {{2, 1, 3}}, fast_tile},
        {"Tile", "", 13, 2, 1, U8, 2, {3, 1}, {2}, {{1, 9}}, fast_tile},
        {"Tile", "", 13, 2, 1, F32, 2, {3, 4}, {2}, {{0, 2}}, fast_tile},
        {"Split", "axis=1", 13, 2, 3, F32, 4, {2, 9, 5, 7}, {3}, {{2, 3, 4}}, fast_split},
        {"Split", "axis=-1", 13, 1, 2, I64, 2, {3, 8}, {0}, {{0}}, fast_split}, /* equal halves */
        {"Split", "axis=0 split=1,4", 11, 1, 2, F32, 2, {5, 3}, {0}, {{0}}, fast_split},
        {"Gather", "axis=0", 13, 2, 1, F32, 2, {30, 16}, {6}, {{0, 29, -1, -30, 7, 7}}, fast_gather},
        {"Gather", "axis=1", 13, 2, 1, F32, 3, {2, 5, 3}, {-1}, {{-2}}, fast_gather}, /* scalar */
        {"Gather", "axis=-1", 13, 2, 1, I64, 3, {2, 3, 9}, {4}, {{8, 0, -9, 4}}, fast_gather},
        {"Gather", "axis=2", 13, 2, 1, U8, 3, {2, 3, 9}, {3}, {{1, 1, -1}}, fast_gather},
        /* transposes that move only dims of 1 are copies, of any dtype */
        {"Transpose", "perm=1,0", 13, 1, 1, I64, 2, {1, 37}, {0}, {{0}}, fast_transpose},
        {"Transpose", "perm=1,0,2", 13, 1, 1, U8, 3, {4, 1, 9}, {0}, {{0}}, fast_transpose},
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, cases[c].op, cases[c].attrs, cases[c].opset, cases[c].nin,
                               cases[c].nout);
        fix_list_attrs(n);
        af_tensor *x = rnd_tensor(cases[c].t, cases[c].rank, cases[c].dims), *owned[5] = {x};
        const af_tensor *in[5] = {x};
        for (int k = 1; k < cases[c].nin; k++) in[k] = owned[k] = i64s(cases[c].ilen[k - 1], cases[c].iv[k - 1]);
        if (!strcmp(cases[c].op, "Gather") && c % 2) { /* int32 indices */
            af_tensor *i32 = af_tensor_new(I32, owned[1]->rank, owned[1]->dims);
            for (int64_t i = 0; i < af_tensor_numel(i32); i++)
                ((int32_t *)i32->data)[i] = (int32_t)((int64_t *)owned[1]->data)[i];
            af_tensor_free(owned[1]);
            in[1] = owned[1] = i32;
        }
        char name[200];
        snprintf(name, sizeof name, "%s %s (case %zu)", cases[c].op, cases[c].attrs, c);
        fast_vs_ref_n(name, n, in, cases[c].nout, cases[c].fast, true, rt);
        for (int k = 0; k < cases[c].nin; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
    /* Channel shuffles (ShuffleNet's Gather of channels, channels-last: the last axis) with 2,
     * 3 and 4 groups, 4-byte and 8-byte elements, int32 and int64 indices; one index off (not
     * a shuffle: the per-element path); the shuffle of the NCHW form (rows of H * W). */
    static const struct {
        int64_t c, g;
        af_dtype t;
        const char *attrs;
        bool i32, broken;
    } shuffles[] = {{12, 2, F32, "axis=-1", false, false}, {116, 2, F32, "axis=3", true, false},
                    {12, 3, F32, "axis=-1", false, false}, {24, 4, I32, "axis=-1", true, false},
                    {12, 2, I64, "axis=-1", false, false}, {12, 2, F32, "axis=-1", false, true},
                    {12, 2, F32, "axis=1", false, false}};
    for (size_t c = 0; c < AF_COUNT(shuffles); c++) {
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, "Gather", shuffles[c].attrs, 13, 2, 1);
        int64_t ch = shuffles[c].c, g = shuffles[c].g, q = ch / g;
        bool nchw = !strcmp(shuffles[c].attrs, "axis=1");
        int64_t d[4] = {2, nchw ? ch : 5, 7, nchw ? 3 : ch};
        af_tensor *x = rnd_tensor(shuffles[c].t, 4, d);
        af_tensor *ix = af_tensor_new(shuffles[c].i32 ? I32 : I64, 1, &ch);
        for (int64_t t = 0; t < ch; t++) {
            int64_t v = t % g * q + t / g;
            if (shuffles[c].broken && t == 5) v = 0;
            if (shuffles[c].i32) ((int32_t *)ix->data)[t] = (int32_t)v;
            else ((int64_t *)ix->data)[t] = v;
        }
        const af_tensor *in[2] = {x, ix};
        char name[80];
        snprintf(name, sizeof name, "channel shuffle C %lld g %lld (case %zu)", (long long)ch,
                 (long long)g, c);
        fast_vs_ref_n(name, n, in, 1, fast_gather, true, rt);
        af_tensor_free(x);
        af_tensor_free(ix);
        af_arena_free(a);
    }
    /* Concat along each axis of 3 inputs of different lengths, several dtypes. */
    for (int axis = -1; axis < 3; axis++) {
        af_arena *a = af_arena_new();
        char attrs[32];
        snprintf(attrs, sizeof attrs, "axis=%d", axis);
        af_node *n = make_node(a, "Concat", attrs, 13, 3, 1);
        af_dtype t = axis == 1 ? I64 : axis == 2 ? U8 : F32;
        af_tensor *x[3];
        for (int k = 0; k < 3; k++) {
            int64_t d[3] = {3, 4, 5};
            d[axis < 0 ? 2 : axis] = k + 1;
            x[k] = rnd_tensor(t, 3, d);
        }
        const af_tensor *in[3] = {x[0], x[1], x[2]};
        fast_vs_ref_n(attrs, n, in, 1, fast_concat, true, rt);
        for (int k = 0; k < 3; k++) af_tensor_free(x[k]);
        af_arena_free(a);
    }
    /* A big Concat (threaded): two [1, 64, 60, 80] halves. */
    {
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, "Concat", "axis=1", 13, 2, 1);
        int64_t d[4] = {1, 64, 60, 80};
        af_tensor *x0 = rnd_tensor(F32, 4, d), *x1 = rnd_tensor(F32, 4, d);
        const af_tensor *in[2] = {x0, x1};
        fast_vs_ref_n("concat big", n, in, 1, fast_concat, true, rt);
        af_tensor_free(x0);
        af_tensor_free(x1);
        af_arena_free(a);
    }
    /* Refused by the fast kernels, reported by the reference: an index out of range, inputs
     * that disagree with the output. */
    af_arena *a = af_arena_new();
    int64_t d2[2] = {4, 3}, bad[2] = {1, 4}, d22[2] = {2, 3};
    af_tensor *x = rnd_tensor(F32, 2, d2), *ix = i64s(2, bad), out;
    af_node *n = make_node(a, "Gather", "axis=0", 13, 2, 1);
    const af_tensor *in[2] = {x, ix};
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 2, d22);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_gather(n, in, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in, &out, &err), AF_ERR_RUNTIME);
    n = make_node(a, "Concat", "axis=0", 13, 1, 1);
    assert_int_equal(fast_concat(n, in, &out, &ex, &err), AF_DECLINED); /* 4 rows into 2 */
    n = make_node(a, "Expand", "", 13, 2, 1);
    assert_int_equal(fast_expand(n, in, &out, &ex, &err), AF_DECLINED); /* [4,3] into [2,3] */
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(ix);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* An index tensor (int64, or int32 when i32) of dims with values in [-lim, lim): negative ones
 * count from the end, repeats are likely. */
static af_tensor *rnd_index(bool i32, int rank, const int64_t *dims, int64_t lim) {
    af_tensor *t = af_tensor_new(i32 ? I32 : I64, rank, dims);
    assert_non_null(t);
    for (int64_t i = 0; i < af_tensor_numel(t); i++) {
        int64_t v = (int64_t)floor((tu_rnd() + 1.0) * (double)lim) - lim;
        v = v < -lim ? -lim : v >= lim ? lim - 1 : v;
        if (i32) ((int32_t *)t->data)[i] = (int32_t)v;
        else ((int64_t *)t->data)[i] = v;
    }
    return t;
}

/* ScatterElements, GatherElements, GatherND, NonZero and ConstantOfShape: the detectors'
 * post-processing kernels (any element size) bit for bit against the reference, with repeated and negative
 * indices, int32 and int64 indices, indices smaller than the data, every axis, batch_dims; a bad
 * index declined by the fast kernel and reported by the reference. */
static void test_select_fast(void **state) {
    (void)state;
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    /* ScatterElements: data dims, indices dims, axis, dtype of the data, int32 indices */
    static const struct {
        int64_t dd[4], id[4];
        int rank, axis;
        af_dtype t;
        bool i32;
    } sc[] = {
        {{7, 5, 3}, {4, 5, 3}, 3, 0, F32, false},
        {{7, 5, 3}, {3, 2, 2}, 3, 0, F32, true},   /* indices smaller than the data */
        {{4, 9, 5}, {4, 11, 5}, 3, 1, I64, false}, /* more indices than the axis: repeats */
        {{4, 9, 5}, {2, 3, 7}, 3, -1, F32, false},
        {{6, 4, 3, 3}, {2, 4, 3, 3}, 4, 0, F32, false}, /* Faster R-CNN's rows, below */
        {{13}, {13}, 1, 0, U8, true},
    };
    for (size_t c = 0; c < AF_COUNT(sc); c++) {
        af_arena *a = af_arena_new();
        char attrs[32], name[64];
        snprintf(attrs, sizeof attrs, "axis=%d", sc[c].axis);
        af_node *n = make_node(a, c % 2 ? "ScatterElements" : "Scatter", attrs, c % 2 ? 16 : 10, 3, 1);
        int ax = sc[c].axis < 0 ? sc[c].axis + sc[c].rank : sc[c].axis;
        af_tensor *d = rnd_tensor(sc[c].t, sc[c].rank, sc[c].dd);
        af_tensor *ix = rnd_index(sc[c].i32, sc[c].rank, sc[c].id, sc[c].dd[ax]);
        af_tensor *up = rnd_tensor(sc[c].t, sc[c].rank, sc[c].id);
        if (c == 4) /* the row index of each update, the same along the other axes (an Expand) */
            for (int64_t i = 0; i < af_tensor_numel(ix); i++)
                ((int64_t *)ix->data)[i] = i / 36 == 0 ? 4 : 1;
        const af_tensor *in[3] = {d, ix, up};
        snprintf(name, sizeof name, "ScatterElements case %zu", c);
        fast_vs_ref(name, n, in, fast_scatter_elements, true, rt);
        af_tensor_free(d);
        af_tensor_free(ix);
        af_tensor_free(up);
        af_arena_free(a);
    }
    /* ScatterElements' reductions on the same geometries (repeated indices combine in index
     * order), float32, int64 and int32 data (uint8 with a reduction stays on the reference) */
    static const char *reds[] = {"add", "mul", "max", "min"};
    for (size_t c = 0; c < AF_COUNT(sc); c++)
        for (int r = 0; r < 4; r++)
            for (int i32data = 0; i32data < 2; i32data++) {
                if ((i32data && sc[c].t != I64) || sc[c].t == U8) continue;
                af_arena *a = af_arena_new();
                char attrs[48], name[80];
                snprintf(attrs, sizeof attrs, "axis=%d reduction=%s", sc[c].axis, reds[r]);
                af_node *n = make_node(a, "ScatterElements", attrs, 18, 3, 1);
                int ax = sc[c].axis < 0 ? sc[c].axis + sc[c].rank : sc[c].axis;
                af_dtype t = i32data ? I32 : sc[c].t;
                af_tensor *d = rnd_tensor(t, sc[c].rank, sc[c].dd);
                af_tensor *ix = rnd_index(sc[c].i32, sc[c].rank, sc[c].id, sc[c].dd[ax]);
                af_tensor *up = rnd_tensor(t, sc[c].rank, sc[c].id);
                const af_tensor *in[3] = {d, ix, up};
                snprintf(name, sizeof name, "ScatterElements %s, case %zu%s", reds[r], c,
                         i32data ? ", int32" : "");
                fast_vs_ref(name, n, in, fast_scatter_elements, true, rt);
                af_tensor_free(d);
                af_tensor_free(ix);
                af_tensor_free(up);
                af_arena_free(a);
            }
    /* GatherElements: the same geometries (indices of any size along the axis, repeats,
     * negative indices, int32) */
    for (size_t c = 0; c < AF_COUNT(sc); c++) {
        af_arena *a = af_arena_new();
        char attrs[32], name[64];
        snprintf(attrs, sizeof attrs, "axis=%d", sc[c].axis);
        af_node *n = make_node(a, "GatherElements", attrs, 13, 2, 1);
        int ax = sc[c].axis < 0 ? sc[c].axis + sc[c].rank : sc[c].axis;
        af_tensor *d = rnd_tensor(sc[c].t, sc[c].rank, sc[c].dd);
        af_tensor *ix = rnd_index(sc[c].i32, sc[c].rank, sc[c].id, sc[c].dd[ax]);
        const af_tensor *in[2] = {d, ix};
        snprintf(name, sizeof name, "GatherElements case %zu", c);
        fast_vs_ref(name, n, in, fast_gather_elements, true, rt);
        af_tensor_free(d);
        af_tensor_free(ix);
        af_arena_free(a);
    }
    /* GatherND: data dims, indices dims (the last is the tuple length), batch_dims */
    static const struct {
        int64_t dd[4], id[4];
        int rank, irank, b;
        af_dtype t;
        bool i32;
    } gn[] = {
        {{5, 4, 3}, {6, 2}, 3, 2, 0, F32, false},
        {{5, 4, 3}, {2, 3, 1}, 3, 3, 0, I64, true},
        {{5, 4, 3}, {7, 3}, 3, 2, 0, F32, false}, /* single elements */
        {{2, 5, 3}, {2, 4, 1}, 3, 3, 1, F32, true},
        {{3234, 4}, {3000, 1}, 2, 2, 0, F32, false}, /* SSDlite's boxes of one class */
        {{9, 2}, {0, 1}, 2, 2, 0, F32, false},       /* no tuple */
    };
    for (size_t c = 0; c < AF_COUNT(gn); c++) {
        af_arena *a = af_arena_new();
        char attrs[32], name[64];
        snprintf(attrs, sizeof attrs, "batch_dims=%d", gn[c].b);
        af_node *n = make_node(a, "GatherND", attrs, 13, 2, 1);
        af_tensor *d = rnd_tensor(gn[c].t, gn[c].rank, gn[c].dd);
        af_tensor *ix = rnd_index(gn[c].i32, gn[c].irank, gn[c].id, 1);
        int64_t m = gn[c].id[gn[c].irank - 1];
        for (int64_t i = 0; i < af_tensor_numel(ix); i++) { /* each in its own dim's range */
            int64_t dim = gn[c].dd[gn[c].b + i % m];
            int64_t v = (int64_t)floor((tu_rnd() + 1.0) * (double)dim) - dim;
            v = v < -dim ? -dim : v >= dim ? dim - 1 : v;
            if (gn[c].i32) ((int32_t *)ix->data)[i] = (int32_t)v;
            else ((int64_t *)ix->data)[i] = v;
        }
        const af_tensor *in[2] = {d, ix};
        snprintf(name, sizeof name, "GatherND case %zu", c);
        fast_vs_ref(name, n, in, fast_gather_nd, true, rt);
        af_tensor_free(d);
        af_tensor_free(ix);
        af_arena_free(a);
    }
    /* NonZero of bool, float32 (with -0 and NaN), int64 and uint8, ranks 1 to 3 */
    static const struct {
        int64_t dd[3];
        int rank;
        af_dtype t;
    } nz[] = {{{3, 7}, 2, AF_DTYPE_BOOL}, {{50}, 1, F32}, {{2, 3, 4}, 3, I64}, {{5, 1, 9}, 3, U8}, {{0, 4}, 2, F32}};
    for (size_t c = 0; c < AF_COUNT(nz); c++) {
        af_arena *a = af_arena_new();
        char name[64];
        af_node *n = make_node(a, "NonZero", "", 13, 1, 1);
        af_tensor *x = af_tensor_new(nz[c].t, nz[c].rank, nz[c].dd);
        assert_non_null(x);
        for (int64_t i = 0; i < af_tensor_numel(x); i++) {
            double r = tu_rnd();
            if (nz[c].t == AF_DTYPE_BOOL) ((uint8_t *)x->data)[i] = r > 0;
            else if (nz[c].t == F32) ((float *)x->data)[i] = i % 7 == 1 ? -0.0f : i % 11 == 2 ? NAN : r > 0 ? (float)r : 0.0f;
            else tens_set(x, i, r > 0 ? floor(r * 3.0) : 0);
        }
        const af_tensor *in[1] = {x};
        snprintf(name, sizeof name, "NonZero case %zu", c);
        fast_vs_ref(name, n, in, fast_non_zero, true, rt);
        af_tensor_free(x);
        af_arena_free(a);
    }
    /* ConstantOfShape: no value (float 0), a float, an int64; a big one (threaded), a scalar */
    static const struct {
        int len;
        int64_t dims[4];
        af_dtype t; /* UNDEFINED: no value attribute */
    } cs[] = {{3, {3, 4, 5}, AF_DTYPE_UNDEFINED}, {2, {7, 9}, F32}, {1, {11}, I64},
              {4, {2, 64, 60, 80}, F32}, {0, {0}, I64}, {2, {3, 0}, F32}};
    for (size_t c = 0; c < AF_COUNT(cs); c++) {
        af_arena *a = af_arena_new();
        char name[64];
        af_node *n = make_node(a, "ConstantOfShape", "", 13, 1, 1);
        af_tensor *v = NULL;
        if (cs[c].t != AF_DTYPE_UNDEFINED) {
            int64_t one = 1;
            v = af_tensor_new(cs[c].t, 1, &one);
            assert_non_null(v);
            tens_set(v, 0, cs[c].t == F32 ? 1.25 : -7);
            af_attr *at = &n->attrs[n->nattrs++];
            at->name = "value";
            at->type = AF_ATTR_TENSOR;
            at->t = v;
        }
        af_tensor *shape = i64s(cs[c].len, cs[c].dims);
        if (cs[c].len == 0) shape->dims[0] = 0; /* [] : a scalar */
        const af_tensor *in[1] = {shape};
        snprintf(name, sizeof name, "ConstantOfShape case %zu", c);
        fast_vs_ref(name, n, in, fast_constant_of_shape, true, rt);
        af_tensor_free(shape);
        af_tensor_free(v);
        af_arena_free(a);
    }
    /* Bad indices: declined by the fast kernels, reported by the reference. */
    af_arena *a = af_arena_new();
    int64_t d2[2] = {4, 3};
    af_tensor *x = rnd_tensor(F32, 2, d2), *ix = rnd_index(false, 2, d2, 4), out;
    ((int64_t *)ix->data)[5] = 4;
    const af_tensor *in3[3] = {x, ix, x};
    af_node *n = make_node(a, "ScatterElements", "axis=0", 16, 3, 1);
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 2, d2);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_scatter_elements(n, in3, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in3, &out, &err), AF_ERR_RUNTIME);
    assert_non_null(strstr(err.message, "n0"));
    n = make_node(a, "ScatterElements", "axis=0 reduction=add", 16, 3, 1);
    assert_int_equal(fast_scatter_elements(n, in3, &out, &ex, &err), AF_DECLINED); /* a bad index */
    int64_t tdims[2] = {4, 1}, od[2] = {4, 3};
    af_tensor *tup = af_tensor_new(I64, 2, tdims);
    int64_t tv[4] = {0, 3, -4, 4};
    memcpy(tup->data, tv, sizeof tv);
    const af_tensor *in2[2] = {x, tup};
    n = make_node(a, "GatherND", "", 13, 2, 1);
    af_tensor_release(&out);
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 2, od);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    assert_int_equal(fast_gather_nd(n, in2, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in2, &out, &err), AF_ERR_RUNTIME);
    assert_non_null(strstr(err.message, "n0"));
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(ix);
    af_tensor_free(tup);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* Trilu: upper and lower, k absent, zero, positive, negative, past either edge of the matrix and
 * at INT64's limits (int64 and int32 k), wide, tall, batched and empty matrices, element sizes
 * 1 to 8; bit for bit. */
static void test_trilu_fast(void **state) {
    (void)state;
    static const struct {
        af_dtype t;
        int rank;
        int64_t dims[4];
    } geo[] = {
        {F32, 2, {5, 7}},    {F32, 2, {7, 5}},         {I64, 3, {3, 4, 4}}, {U8, 4, {2, 3, 6, 2}},
        {AF_DTYPE_FLOAT16, 2, {1, 9}}, {BOOL, 2, {6, 1}}, {F32, 3, {2, 0, 3}}, {F32, 2, {3, 0}},
        {F32, 3, {4, 90, 130}}, /* threaded */
    };
    static const int64_t ks[] = {0, 1, -1, 3, -4, 6, -7, 100, -100, INT64_MAX, INT64_MIN};
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    for (size_t c = 0; c < AF_COUNT(geo); c++)
        for (int upper = 0; upper < 2; upper++)
            for (int kc = -1; kc < (int)AF_COUNT(ks); kc++) { /* -1: no k */
                af_arena *a = af_arena_new();
                char attrs[16], name[96];
                snprintf(attrs, sizeof attrs, "upper=%d", upper);
                af_node *n = make_node(a, "Trilu", attrs, 14, kc < 0 ? 1 : 2, 1);
                af_tensor *x = rnd_tensor(geo[c].t, geo[c].rank, geo[c].dims);
                bool i32 = kc >= 0 && kc % 2 && ks[kc] > INT32_MIN && ks[kc] < INT32_MAX;
                af_tensor *k = af_tensor_new(i32 ? I32 : I64, 0, NULL);
                if (kc >= 0 && i32) *(int32_t *)k->data = (int32_t)ks[kc];
                else if (kc >= 0) *(int64_t *)k->data = ks[kc];
                const af_tensor *in[2] = {x, k};
                snprintf(name, sizeof name, "Trilu %s k %lld, geometry %zu", attrs,
                         kc < 0 ? 0LL : (long long)ks[kc], c);
                fast_vs_ref(name, n, in, fast_trilu, true, rt);
                af_tensor_free(x);
                af_tensor_free(k);
                af_arena_free(a);
            }
    /* A k of two elements: declined by the fast kernel, reported by the reference. */
    af_arena *a = af_arena_new();
    int64_t d[2] = {3, 3}, two = 2;
    af_tensor *x = rnd_tensor(F32, 2, d), *k = af_tensor_new(I64, 1, &two), out;
    af_node *n = make_node(a, "Trilu", "", 14, 2, 1);
    const af_tensor *in[2] = {x, k};
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 2, d);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_trilu(n, in, &out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, n, in, &out, &err), AF_ERR_RUNTIME);
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(k);
    af_arena_free(a);
    af_runtime_free(rt);
}

/* DepthToSpace (DCR, CRD) and SpaceToDepth on their fast kernel against the reference: block
 * sizes 1 to 3, element sizes 1 to 8, one and several images, 2 threads; an output of other
 * dims is declined. */
static void test_depth_space_fast(void **state) {
    (void)state;
    static const struct {
        af_dtype t;
        int64_t dims[4];
    } geo[] = {
        {F32, {1, 8, 3, 5}}, {F32, {2, 36, 6, 4}}, {U8, {1, 4, 2, 2}}, {I64, {2, 18, 3, 6}},
        {AF_DTYPE_FLOAT16, {1, 9, 6, 3}}, {F32, {1, 64, 40, 36}}, /* threaded */
    };
    static const char *ops[][2] = {{"DepthToSpace", "mode=DCR"}, {"DepthToSpace", "mode=CRD"},
                                   {"SpaceToDepth", ""}};
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    int ran = 0;
    for (size_t c = 0; c < AF_COUNT(geo); c++)
        for (int o = 0; o < 3; o++)
            for (int64_t b = 1; b <= 3; b++) {
                const int64_t *d = geo[c].dims;
                if (o < 2 ? d[1] % (b * b) : d[2] % b || d[3] % b) continue;
                af_arena *a = af_arena_new();
                char attrs[48], name[96];
                snprintf(attrs, sizeof attrs, "blocksize=%lld %s", (long long)b, ops[o][1]);
                af_node *n = make_node(a, ops[o][0], attrs, 13, 1, 1);
                af_tensor *x = rnd_tensor(geo[c].t, 4, d);
                const af_tensor *in[1] = {x};
                snprintf(name, sizeof name, "%s %s, geometry %zu", ops[o][0], attrs, c);
                fast_vs_ref(name, n, in, fast_depth_space, true, rt);
                af_tensor_free(x);
                af_arena_free(a);
                ran++;
            }
    assert_true(ran >= 30);
    /* an output of other dims: declined */
    af_arena *a = af_arena_new();
    int64_t d[4] = {1, 8, 2, 2}, bad[4] = {1, 2, 4, 5};
    af_tensor *x = rnd_tensor(F32, 4, d), out;
    af_node *n = make_node(a, "DepthToSpace", "blocksize=2", 13, 1, 1);
    const af_tensor *in[1] = {x};
    memset(&out, 0, sizeof out);
    af_tensor_set_type(&out, F32, 4, bad);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    assert_int_equal(fast_depth_space(n, in, &out, &ex, &err), AF_DECLINED);
    af_exec_release(&ex);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_arena_free(a);
    af_runtime_free(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_unknown_values),
        cmocka_unit_test(test_transpose_fast),
        cmocka_unit_test(test_resize_fast),
        cmocka_unit_test(test_grid_sample_fast),
        cmocka_unit_test(test_pad_fast),
        cmocka_unit_test(test_copy_fast),
        cmocka_unit_test(test_select_fast),
        cmocka_unit_test(test_trilu_fast),
        cmocka_unit_test(test_depth_space_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
