/* The fast reduction kernels (src/kernels/fast/reduce.c) against the reference kernels: every
 * Reduce op over axes sets that give both of its forms (the last run reduced or kept), with
 * keepdims, noop_with_empty_axes, axes as attribute or input, dims of 1, odd sizes, NaN and
 * infinities; ArgMax / ArgMin with ties and select_last_index; InstanceNormalization of rank 3
 * to 5; LayerNormalization and RMSNormalization. Each case runs on the reference ISA (the oracle), then on every vector ISA the CPU has
 * (and the one AUTOFUSION_ISA allows) at 1 and 2 threads; floats must agree within float
 * rounding, indices exactly. The fast kernel is also called directly, so a case it was meant to
 * take cannot pass by being declined; bad inputs must give the reference's error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/kernel.h"
#include "test_util.h"

#include "ir/epilogue.h"
#include "kernels/fast/fast.h"
#include "kernels/ref/ref.h"
#include "kernels/simd/cpu.h"

/* ---- the cases ------------------------------------------------------------------------------- */

enum { FILL_RAND, FILL_TIES, FILL_NAN, FILL_POS, FILL_BIG };

typedef struct rcase {
    const char *op;
    const char *attrs; /* "name=value ..." (lists: 1,2,3) */
    int opset;
    int rank;
    int64_t dims[5];
    int naxes; /* >= 0: an int64 axes input of these values; -1: no second input */
    int64_t axes[5];
    int fill;
    bool fast; /* the fast kernel must take it (false: it must decline, e.g. a bad model) */
    int nout;  /* 0: 1 */
} rcase;

#define NOAX -1, {0}

static const rcase cases[] = {
    /* rows form: the last run reduced */
    {"ReduceMean", "axes=2,3", 13, 4, {1, 256, 56, 56}, NOAX, FILL_RAND, true},
    {"ReduceMean", "axes=-1 keepdims=0", 13, 3, {3, 7, 61}, NOAX, FILL_RAND, true},
    {"ReduceSum", "", 13, 3, {2, 5, 33}, 1, {2}, FILL_RAND, true},
    {"ReduceMax", "axes=1,3", 13, 4, {2, 3, 5, 17}, NOAX, FILL_RAND, true}, /* [k, r, k, r] */
    {"ReduceMin", "axes=0,2 keepdims=0", 13, 3, {4, 6, 9}, NOAX, FILL_RAND, true},
    {"ReduceProd", "axes=2", 13, 3, {3, 4, 21}, NOAX, FILL_POS, true},
    {"ReduceL1", "axes=1,2", 13, 3, {5, 7, 19}, NOAX, FILL_RAND, true},
    {"ReduceL2", "axes=2", 13, 3, {5, 7, 100}, NOAX, FILL_RAND, true},
    {"ReduceSumSquare", "axes=2", 13, 3, {5, 7, 3}, NOAX, FILL_RAND, true},
    {"ReduceLogSum", "axes=1,2", 13, 3, {4, 9, 13}, NOAX, FILL_POS, true},
    {"ReduceLogSumExp", "axes=2", 13, 3, {4, 9, 67}, NOAX, FILL_BIG, true},
    {"ReduceMax", "axes=2", 13, 3, {4, 3, 40}, NOAX, FILL_NAN, true},
    {"ReduceMin", "axes=2", 13, 3, {4, 3, 40}, NOAX, FILL_NAN, true},
    {"ReduceLogSumExp", "axes=2", 13, 3, {4, 3, 40}, NOAX, FILL_NAN, true},
    {"ReduceMean", "keepdims=0", 13, 3, {3, 50, 41}, NOAX, FILL_RAND, true}, /* every axis */
    /* few outputs of many elements: partial folds over fixed chunks, joined in order */
    {"ReduceMean", "keepdims=0", 13, 4, {1, 4, 200, 200}, NOAX, FILL_RAND, true},
    {"ReduceLogSumExp", "axes=1,2", 13, 3, {2, 400, 400}, NOAX, FILL_BIG, true},
    {"ReduceMax", "axes=0,2", 13, 3, {300, 3, 500}, NOAX, FILL_RAND, true},
    {"ReduceMax", "axes=1", 13, 2, {2, 140000}, NOAX, FILL_NAN, true},
    {"ReduceL2", "axes=1", 13, 2, {3, 140001}, NOAX, FILL_RAND, true},
    /* columns form: the last run kept */
    {"ReduceMean", "axes=1", 13, 4, {1, 256, 28, 28}, NOAX, FILL_RAND, true},
    {"ReduceSum", "", 13, 3, {6, 5, 300}, 1, {1}, FILL_RAND, true},
    {"ReduceSum", "keepdims=0", 13, 2, {70, 9}, 1, {0}, FILL_RAND, true},
    {"ReduceMax", "axes=0,2", 13, 4, {3, 4, 5, 37}, NOAX, FILL_RAND, true}, /* [r, k, r, k] */
    {"ReduceMin", "axes=1", 13, 3, {2, 9, 1000}, NOAX, FILL_RAND, true},
    {"ReduceProd", "axes=0", 13, 2, {5, 45}, NOAX, FILL_POS, true},
    {"ReduceL1", "axes=0", 13, 3, {7, 3, 5}, NOAX, FILL_RAND, true},
    {"ReduceL2", "axes=1", 13, 3, {2, 7, 19}, NOAX, FILL_RAND, true},
    {"ReduceSumSquare", "axes=0,1", 13, 3, {3, 7, 23}, NOAX, FILL_RAND, true},
    {"ReduceLogSum", "axes=0", 13, 2, {9, 33}, NOAX, FILL_POS, true},
    {"ReduceLogSumExp", "axes=1", 13, 3, {2, 11, 50}, NOAX, FILL_BIG, true},
    {"ReduceLogSumExp", "axes=1", 13, 3, {2, 11, 50}, NOAX, FILL_NAN, true},
    {"ReduceMax", "axes=0", 13, 2, {9, 50}, NOAX, FILL_NAN, true},
    {"ReduceMin", "axes=0", 13, 2, {9, 50}, NOAX, FILL_NAN, true},
    /* dims of 1, opset 18 axes inputs, noop */
    {"ReduceMean", "", 18, 5, {1, 3, 1, 5, 7}, 2, {1, 4}, FILL_RAND, true},
    {"ReduceL2", "", 18, 3, {4, 1, 6}, 1, {1}, FILL_RAND, true},  /* reduces only a 1: a map */
    {"ReduceLogSumExp", "keepdims=0", 18, 3, {1, 1, 1}, 0, {0}, FILL_RAND, true},
    {"ReduceMax", "", 18, 3, {2, 3, 4}, 0, {0}, FILL_RAND, true},  /* empty axes: all */
    {"ReduceSum", "noop_with_empty_axes=1", 13, 3, {2, 3, 4}, 0, {0}, FILL_RAND, false},
    {"ReduceMean", "axes=-3,-1", 18, 3, {5, 4, 3}, NOAX, FILL_RAND, true}, /* opset 18 attr: ignored */
    /* bad: an axis out of range, a repeated axis */
    {"ReduceSum", "", 13, 3, {2, 3, 4}, 1, {3}, FILL_RAND, false},
    {"ReduceMax", "axes=1,1", 13, 3, {2, 3, 4}, NOAX, FILL_RAND, false},
    /* ArgMax / ArgMin: inner 1 (the vector fold) and inner > 1 */
    {"ArgMax", "axis=-1", 13, 3, {3, 5, 77}, NOAX, FILL_RAND, true},
    {"ArgMin", "axis=2 keepdims=0", 13, 3, {3, 5, 77}, NOAX, FILL_TIES, true},
    {"ArgMax", "axis=2 select_last_index=1", 13, 3, {3, 5, 77}, NOAX, FILL_TIES, true},
    {"ArgMin", "axis=2 select_last_index=1", 13, 3, {3, 5, 77}, NOAX, FILL_TIES, true},
    {"ArgMax", "axis=1", 13, 3, {3, 40, 300}, NOAX, FILL_TIES, true},
    {"ArgMin", "axis=0 select_last_index=1", 13, 3, {7, 5, 9}, NOAX, FILL_TIES, true},
    {"ArgMax", "axis=1 keepdims=0", 13, 3, {2, 30, 9}, NOAX, FILL_NAN, true},
    {"ArgMin", "axis=1", 13, 3, {2, 30, 9}, NOAX, FILL_NAN, true},
    {"ArgMax", "axis=-1", 13, 2, {5, 30}, NOAX, FILL_NAN, true},
    {"ArgMin", "axis=-1 select_last_index=1", 13, 2, {5, 30}, NOAX, FILL_NAN, true},
    {"ArgMax", "axis=3", 13, 3, {2, 3, 4}, NOAX, FILL_RAND, false},
    /* InstanceNormalization: inputs 1 and 2 are [C] (added by the test) */
    {"InstanceNormalization", "", 6, 3, {1, 64, 3199}, NOAX, FILL_RAND, true},
    {"InstanceNormalization", "epsilon=0.01", 6, 4, {2, 3, 7, 9}, NOAX, FILL_BIG, true},
    {"InstanceNormalization", "", 6, 5, {1, 5, 3, 4, 5}, NOAX, FILL_RAND, true},
    {"InstanceNormalization", "", 6, 3, {3, 4, 1}, NOAX, FILL_RAND, true},
    /* NCHW pooling: one pass per spatial axis (rows of the inner axes, then lines) */
    {"MaxPool", "kernel_shape=3,3,3 strides=2,2,2 pads=1,1,1,1,1,1", 13, 5, {1, 4, 8, 20, 21}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=3,3 strides=2,2 pads=1,1,1,1", 13, 4, {2, 3, 45, 47}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=2,2 strides=2,2", 13, 4, {1, 3, 64, 66}, NOAX, FILL_TIES, true},
    {"MaxPool", "kernel_shape=3 strides=1 pads=1,1", 13, 3, {2, 5, 70}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=3,2 strides=3,1 dilations=2,3 pads=2,0,1,2", 13, 4, {1, 2, 19, 40}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=3,3 strides=2,2 ceil_mode=1", 13, 4, {1, 2, 10, 37}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=2 strides=2 pads=0,1 ceil_mode=1", 10, 3, {1, 3, 9}, NOAX, FILL_NAN, true},
    {"MaxPool", "kernel_shape=2,2 auto_pad=SAME_UPPER", 13, 4, {1, 2, 7, 9}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=1,1", 13, 4, {1, 2, 7, 9}, NOAX, FILL_RAND, true}, /* no pass: a copy */
    {"MaxPool", "kernel_shape=3,3 strides=2,2", 13, 4, {1, 2, 9, 9}, NOAX, FILL_RAND, false, 2}, /* Indices */
    {"AveragePool", "kernel_shape=3 strides=2 pads=1,1", 13, 3, {1, 8, 3199}, NOAX, FILL_RAND, true},
    {"AveragePool", "kernel_shape=3,3 strides=2,2 pads=1,1,1,1 count_include_pad=1", 13, 4, {1, 3, 33, 34}, NOAX, FILL_RAND, true},
    {"AveragePool", "kernel_shape=2,3,3 strides=1,2,2 pads=0,1,1,1,1,2", 13, 5, {1, 3, 5, 17, 18}, NOAX, FILL_RAND, true},
    {"AveragePool", "kernel_shape=2,3,3 strides=1,2,2 pads=0,1,1,1,1,2 count_include_pad=1", 13, 5, {1, 3, 5, 17, 18}, NOAX, FILL_RAND, true},
    {"AveragePool", "kernel_shape=3,3 strides=2,2 ceil_mode=1 count_include_pad=1 pads=1,1,1,1", 13, 4, {1, 2, 10, 11}, NOAX, FILL_RAND, true},
    {"AveragePool", "kernel_shape=5 strides=3 dilations=2 pads=2,2", 19, 3, {2, 3, 50}, NOAX, FILL_RAND, true},
    {"LpPool", "kernel_shape=3,3 strides=2,2 pads=1,1,1,1 p=2", 18, 4, {1, 3, 20, 21}, NOAX, FILL_RAND, true},
    {"LpPool", "kernel_shape=3 p=1", 18, 3, {2, 3, 30}, NOAX, FILL_RAND, true},
    /* planes enough for 2 threads: a plane at a time in the slot's buffers */
    {"AveragePool", "kernel_shape=3,2,3 strides=2,1,2 pads=1,0,1,1,1,1 count_include_pad=1", 13, 5, {2, 8, 5, 9, 10}, NOAX, FILL_RAND, true},
    {"LpPool", "kernel_shape=2,3 strides=2,2 p=2", 18, 4, {2, 8, 11, 12}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=3,3 strides=1,1 pads=1,1,1,1", 13, 4, {1, 16, 9, 40}, NOAX, FILL_TIES, true},
    {"LpPool", "kernel_shape=3 p=3", 18, 3, {2, 3, 30}, NOAX, FILL_RAND, false}, /* taken by the reference */
    {"GlobalAveragePool", "", 13, 5, {1, 16, 4, 7, 7}, NOAX, FILL_RAND, true},
    {"GlobalMaxPool", "", 13, 3, {2, 16, 101}, NOAX, FILL_RAND, true},
    {"GlobalLpPool", "p=2", 13, 4, {2, 5, 9, 11}, NOAX, FILL_RAND, true},
    {"GlobalLpPool", "p=1", 13, 4, {2, 5, 9, 11}, NOAX, FILL_RAND, true},
    {"MaxPool", "kernel_shape=3,3", 13, 4, {1, 2, 2, 9}, NOAX, FILL_RAND, false}, /* kernel past the input */
    /* TopK: the second input is K (int64 [1], from axes[0]) */
    {"TopK", "", 11, 2, {1, 20000}, 1, {100}, FILL_RAND, true, 2},
    {"TopK", "largest=0", 11, 2, {3, 500}, 1, {17}, FILL_TIES, true, 2},
    {"TopK", "axis=1", 11, 3, {2, 40, 7}, 1, {5}, FILL_TIES, true, 2},
    {"TopK", "axis=0 largest=0 sorted=0", 11, 3, {40, 2, 7}, 1, {40}, FILL_NAN, true, 2},
    {"TopK", "", 11, 2, {4, 60}, 1, {60}, FILL_NAN, true, 2},
    {"TopK", "", 11, 2, {3, 400}, 1, {10}, FILL_NAN, true, 2},       /* blocks skipped past NaN */
    {"TopK", "largest=0", 11, 2, {3, 400}, 1, {10}, FILL_NAN, true, 2},
    {"TopK", "largest=0", 11, 2, {2, 3000}, 1, {7}, FILL_TIES, true, 2},
    {"TopK", "", 11, 2, {4, 60}, 1, {1}, FILL_TIES, true, 2},
    {"TopK", "k=3 axis=0", 1, 2, {9, 4}, NOAX, FILL_TIES, true, 2},
    {"TopK", "", 11, 2, {4, 6}, 1, {7}, FILL_RAND, false, 2}, /* K above the axis */
    /* Softmax / LogSoftmax over a middle axis (columns), the last axis, opset 11's flattening */
    {"Softmax", "axis=1", 13, 4, {2, 19, 5, 9}, NOAX, FILL_BIG, true},
    {"Softmax", "axis=0", 13, 3, {7, 3, 300}, NOAX, FILL_RAND, true},
    {"Softmax", "axis=1", 13, 3, {2, 6, 17}, NOAX, FILL_NAN, true},
    {"Softmax", "axis=1", 11, 4, {2, 3, 5, 9}, NOAX, FILL_RAND, true},
    {"LogSoftmax", "axis=-1", 13, 3, {2, 6, 1000}, NOAX, FILL_BIG, true},
    {"LogSoftmax", "axis=1", 13, 4, {2, 19, 5, 9}, NOAX, FILL_RAND, true},
    {"LogSoftmax", "axis=-1", 13, 2, {5, 40}, NOAX, FILL_NAN, true},
    {"LogSoftmax", "axis=0", 13, 2, {5, 40}, NOAX, FILL_NAN, true},
    {"LogSoftmax", "axis=1", 11, 3, {2, 6, 7}, NOAX, FILL_RAND, true},
    {"Softmax", "axis=3", 13, 3, {2, 6, 7}, NOAX, FILL_RAND, false}, /* axis out of range */
    /* LayerNormalization over the last axes (torch's normalized_shape of 2 and 3 dims) */
    {"LayerNormalization", "axis=-2", 17, 4, {2, 5, 6, 7}, NOAX, FILL_BIG, true},
    {"LayerNormalization", "axis=1 epsilon=0.001", 17, 4, {3, 4, 5, 6}, NOAX, FILL_RAND, true},
    /* RMSNormalization: rows with a vector tail, several axes, a bad axis */
    {"RMSNormalization", "", 23, 3, {2, 5, 37}, NOAX, FILL_BIG, true},
    {"RMSNormalization", "epsilon=0.001", 23, 2, {7, 16}, NOAX, FILL_RAND, true},
    {"RMSNormalization", "axis=1", 23, 3, {3, 4, 5}, NOAX, FILL_RAND, true},
    {"RMSNormalization", "", 23, 2, {3, 1}, NOAX, FILL_RAND, true},
    {"RMSNormalization", "axis=3", 23, 3, {2, 4, 5}, NOAX, FILL_RAND, false}, /* axis out of range */
    /* CumSum: the second input is the axis (int64 [1]) */
    {"CumSum", "", 14, 2, {8, 4096}, 1, {1}, FILL_RAND, true},
    {"CumSum", "exclusive=1 reverse=1", 14, 2, {8, 333}, 1, {-1}, FILL_RAND, true},
    {"CumSum", "", 14, 3, {3, 50, 37}, 1, {1}, FILL_RAND, true},
    {"CumSum", "exclusive=1", 14, 3, {3, 50, 37}, 1, {1}, FILL_RAND, true},
    {"CumSum", "reverse=1", 14, 3, {60, 5, 3}, 1, {0}, FILL_RAND, true},
    {"CumSum", "exclusive=1 reverse=1", 14, 3, {6, 50, 3}, 1, {-2}, FILL_RAND, true},
    {"CumSum", "", 14, 2, {6, 5}, 1, {2}, FILL_RAND, false}, /* axis out of range */
};

/* ---- helpers ------------------------------------------------------------------------------- */

static void parse_attr(af_arena *a, af_attr *at, const char *val) {
    bool list = strchr(val, ',') != NULL;
    static const char *lists[] = {"axes", "kernel_shape", "strides", "pads", "dilations"};
    bool axes_like = false;
    for (size_t i = 0; i < AF_COUNT(lists); i++) axes_like |= !strcmp(at->name, lists[i]);
    if (list || axes_like) {
        at->type = AF_ATTR_INTS;
        at->ints = af_arena_calloc(a, 16, sizeof(int64_t));
        for (const char *p = val; *p && at->n < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
            at->ints[at->n++] = strtoll(p, NULL, 10);
        return;
    }
    tu_parse_scalar(a, at, val);
}

static void fill(af_tensor *t, int mode) {
    float *p = t->data;
    for (int64_t i = 0; i < af_tensor_numel(t); i++) {
        double r = tu_rnd();
        switch (mode) {
        case FILL_TIES: p[i] = (float)floor(r * 3.0); break; /* -3..2: many equal values */
        case FILL_POS: p[i] = (float)(1.0 + 0.3 * r); break;
        case FILL_BIG: p[i] = (float)(80.0 * r + 20.0); break;
        case FILL_NAN: {
            int64_t k = (int64_t)((r + 1.0) * 20.0);
            p[i] = k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY : (float)floor(r * 4.0);
            break;
        }
        default: p[i] = (float)r; break;
        }
    }
}

static af_kernel_fn fast_fn(af_op op) {
    switch (op) {
    case AF_OP_ARGMAX: case AF_OP_ARGMIN: return fast_arg;
    case AF_OP_INSTANCE_NORMALIZATION: return fast_instancenorm;
    case AF_OP_MAX_POOL: return fast_maxpool_any;
    case AF_OP_AVERAGE_POOL: return fast_avgpool_any;
    case AF_OP_LP_POOL: return fast_lppool;
    case AF_OP_GLOBAL_MAX_POOL: return fast_global_maxpool_any;
    case AF_OP_GLOBAL_AVERAGE_POOL: return fast_global_avgpool_any;
    case AF_OP_GLOBAL_LP_POOL: return fast_global_lppool;
    case AF_OP_TOPK: return fast_topk;
    case AF_OP_SOFTMAX: return fast_softmax;
    case AF_OP_LAYER_NORMALIZATION: return fast_layernorm;
    case AF_OP_RMS_NORMALIZATION: return fast_rmsnorm;
    case AF_OP_LOG_SOFTMAX: return fast_log_softmax;
    case AF_OP_GROUP_NORM: return fast_group_norm;
    case AF_OP_CUMSUM: return fast_cumsum;
    case AF_OP_ROI_ALIGN: return fast_roi_align;
    case AF_OP_RNN: case AF_OP_GRU: case AF_OP_LSTM: return fast_rnn;
    default: return fast_reduce;
    }
}

static bool same_value(double g, double w, bool exact) {
    if (w != w) return g != g;
    if (exact || isinf(w)) return g == w;
    return fabs(g - w) <= 1e-4 * fmax(1.0, fabs(w));
}

static void expect_same(const char *what, const af_tensor *got, const af_tensor *want) {
    if (got->dtype != want->dtype || got->rank != want->rank)
        fail_msg("%s: dtype/rank differ", what);
    for (int d = 0; d < want->rank; d++)
        if (got->dims[d] != want->dims[d]) fail_msg("%s: dim %d differs", what, d);
    bool exact = want->dtype != AF_DTYPE_FLOAT;
    for (int64_t i = 0; i < af_tensor_numel(want); i++) {
        double g = tens_get(got, i), w = tens_get(want, i);
        if (!same_value(g, w, exact))
            fail_msg("%s: element %lld is %.9g, the reference %.9g", what, (long long)i, g, w);
    }
}

static void expect_all(const char *what, const af_tensor *got, const af_tensor *want, int nout) {
    for (int o = 0; o < nout; o++) expect_same(what, &got[o], &want[o]);
}

/* Shape, allocation and kernel for out[0..nout): the dispatcher's choice (fast_direct false) or
 * the fast kernel itself. */
static af_status run(const af_node *n, const af_tensor *const *in, af_tensor *out, int nout,
                     af_runtime *rt, bool fast_direct, af_error *err) {
    for (int o = 0; o < nout; o++) {
        memset(&out[o], 0, sizeof out[o]);
        out[o].rank = -1;
    }
    af_status st = af_kernel_shape(n, in, out, err);
    for (int o = 0; o < nout && st == AF_OK; o++) st = af_tensor_alloc(&out[o], err);
    if (st != AF_OK) return st;
    if (!fast_direct) return af_runtime_kernel(rt, n, in, out, err);
    af_exec x;
    af_exec_init(&x, NULL, NULL);
    st = fast_fn(n->op)(n, in, out, &x, err);
    af_exec_release(&x);
    return st;
}

static void release(af_tensor *out, int nout) {
    for (int o = 0; o < nout; o++) af_tensor_release(&out[o]);
}

/* ---- the test ------------------------------------------------------------------------------- */

static void test_fast_vs_reference(void **state) {
    (void)state;
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_get();
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const rcase *rc = &cases[c];
        char what[160];
        snprintf(what, sizeof what, "case %zu: %s %s on %d-D", c, rc->op, rc->attrs, rc->rank);
        af_arena *a = af_arena_new();
        af_op op = af_op_lookup("", rc->op);
        bool inorm = op == AF_OP_INSTANCE_NORMALIZATION, rms = op == AF_OP_RMS_NORMALIZATION;
        bool lnorm = op == AF_OP_LAYER_NORMALIZATION || rms;
        int nin = inorm || (lnorm && !rms) ? 3 : lnorm || rc->naxes >= 0 ? 2 : 1;
        int nout = rc->nout ? rc->nout : 1;
        af_node *n = tu_node(a, op, rc->opset, nin, nout, 8);
        for (int o = 0; o < nout; o++) /* outputs present (MaxPool's Indices is read) */
            af_node_set_output(n, o, af_value_new(n->graph, o ? "y1" : "y0"));
        tu_attrs(a, n, rc->attrs, 8, parse_attr);
        af_tensor *owned[3] = {NULL};
        owned[0] = af_tensor_new(AF_DTYPE_FLOAT, rc->rank, rc->dims);
        assert_non_null(owned[0]);
        fill(owned[0], rc->fill);
        if (lnorm) { /* Scale and B (not RMSNorm's) of the normalised dims [axis, rank) */
            int64_t ax = af_attr_int(n, "axis", -1);
            ax = ax < 0 ? ax + rc->rank : ax;
            if (ax < 0 || ax >= rc->rank) ax = rc->rank - 1; /* a bad axis: any Scale */
            owned[1] = af_tensor_new(AF_DTYPE_FLOAT, rc->rank - (int)ax, rc->dims + ax);
            owned[2] = rms ? NULL : af_tensor_new(AF_DTYPE_FLOAT, rc->rank - (int)ax, rc->dims + ax);
            assert_true(owned[1] && (rms || owned[2]));
            fill(owned[1], FILL_POS);
            if (!rms) fill(owned[2], FILL_RAND);
        } else if (inorm) {
            int64_t cd[1] = {rc->dims[1]};
            owned[1] = af_tensor_new(AF_DTYPE_FLOAT, 1, cd);
            owned[2] = af_tensor_new(AF_DTYPE_FLOAT, 1, cd);
            assert_true(owned[1] && owned[2]);
            fill(owned[1], FILL_POS);
            fill(owned[2], FILL_RAND);
        } else if (rc->naxes >= 0) {
            int64_t ad[1] = {rc->naxes};
            owned[1] = af_tensor_new(AF_DTYPE_INT64, 1, ad);
            assert_non_null(owned[1]);
            if (rc->naxes) memcpy(owned[1]->data, rc->axes, sizeof(int64_t) * (size_t)rc->naxes);
        }
        const af_tensor *in[3] = {owned[0], owned[1], owned[2]};
        af_tensor want[2], got[2];
        af_isa_set(AF_ISA_REFERENCE);
        af_status ref = run(n, in, want, nout, NULL, false, &err);
        if (!rc->fast) {
            /* the fast kernel declines, the dispatcher's answer is the reference's */
            af_isa_set(best);
            af_status st = run(n, in, got, nout, NULL, true, &err);
            if (st == AF_OK || (st != AF_DECLINED && st != ref))
                fail_msg("%s: the fast kernel gave %d", what, st);
            release(got, nout);
            if (ref == AF_OK) { /* a valid case the fast kernel leaves (noop) */
                assert_int_equal(run(n, in, got, nout, NULL, false, &err), AF_OK);
                expect_all(what, got, want, nout);
                release(got, nout);
            } else {
                assert_int_equal(run(n, in, got, nout, rt, false, &err), ref);
                assert_non_null(strstr(err.message, "n0")); /* the error names the node */
                release(got, nout); /* the shape may have passed: outputs allocated */
            }
        } else {
            if (ref != AF_OK) fail_msg("%s: reference status %d (%s)", what, ref, err.message);
            for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
                af_isa_set((af_isa)isa);
                for (int threads = 1; threads <= 2; threads++) {
                    char w2[200];
                    snprintf(w2, sizeof w2, "%s, %s, %d thread(s)", what,
                             af_isa_name(af_isa_get()), threads);
                    af_status st = run(n, in, got, nout, threads == 2 ? rt : NULL, false, &err);
                    if (st != AF_OK) fail_msg("%s: status %d (%s)", w2, st, err.message);
                    expect_all(w2, got, want, nout);
                    release(got, nout);
                }
                af_status st = run(n, in, got, nout, NULL, true, &err);
                if (st != AF_OK) fail_msg("%s: the fast kernel declined (%d)", what, st);
                expect_all(what, got, want, nout);
                release(got, nout);
            }
        }
        af_isa_set(best);
        release(want, nout);
        for (int k = 0; k < 3; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

/* Buffers that do not hold their elements, or other dtypes, are declined before anything is
 * written (the reference kernel then reports or computes them). */
static void test_declines(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    af_node *n = tu_node(a, AF_OP_REDUCE_SUM, 13, 1, 1, 4);
    int64_t d[2] = {4, 8}, od[2] = {4, 1};
    af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 2, d);
    af_tensor *y = af_tensor_new(AF_DTYPE_FLOAT, 2, od);
    assert_true(x && y);
    fill(x, FILL_RAND);
    const af_tensor *in[1] = {x};
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    /* every axis reduced gives 1 element, the output holds 4 */
    assert_int_equal(fast_reduce(n, in, y, &ex, &err), AF_DECLINED);
    size_t keep = x->nbytes;
    x->nbytes = 4; /* the input's buffer is short */
    y->dims[0] = 1;
    y->rank = 2;
    assert_int_equal(fast_reduce(n, in, y, &ex, &err), AF_DECLINED);
    x->nbytes = keep;
    x->dtype = AF_DTYPE_INT32;
    assert_int_equal(fast_reduce(n, in, y, &ex, &err), AF_DECLINED);
    x->dtype = AF_DTYPE_FLOAT;
    af_node *g = tu_node(a, AF_OP_ARGMAX, 13, 1, 1, 4);
    assert_int_equal(fast_arg(g, in, y, &ex, &err), AF_DECLINED); /* a float output */
    af_node *in3 = tu_node(a, AF_OP_INSTANCE_NORMALIZATION, 6, 3, 1, 4);
    const af_tensor *iin[3] = {x, y, y}; /* C = 8, scale and B hold 1 element */
    af_tensor *z = af_tensor_new(AF_DTYPE_FLOAT, 2, d);
    assert_non_null(z);
    assert_int_equal(fast_instancenorm(in3, iin, z, &ex, &err), AF_DECLINED);
    af_exec_release(&ex);
    af_tensor_free(x);
    af_tensor_free(y);
    af_tensor_free(z);
    af_arena_free(a);
}

/* GroupNorm (the canonical form, with the epilogue the fuser gives it): every ISA, 1 and 2
 * threads, against the reference kernel; epilogues with a per-channel operand, a residual of
 * the output's shape, and an operand that only the generic (reference) path reads. */
static void test_group_norm(void **state) {
    (void)state;
    static const struct {
        int rank;
        int64_t dims[5], groups;
        int steps; /* 0: no epilogue; 1: Gelu, Mul per channel, Add residual; 2: Sigmoid, Add [1, 1, H, 1] */
    } cases[] = {
        {3, {1, 64, 3199}, 64, 1},
        {4, {2, 8, 5, 6}, 4, 0},
        {4, {2, 8, 5, 6}, 2, 1},
        {4, {2, 8, 5, 6}, 8, 2},
        {5, {1, 6, 3, 4, 5}, 3, 1},
        {4, {1, 32, 7, 7}, 1, 0},
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_get();
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_arena *a = af_arena_new();
        int nin = cases[c].steps ? 5 : 3;
        if (cases[c].steps == 2) nin = 4;
        af_node *n = tu_node(a, AF_OP_GROUP_NORM, 17, nin, 1, 8);
        af_node_add_attr(n, "num_groups", AF_ATTR_INT)->i = cases[c].groups;
        af_node_add_attr(n, "epsilon", AF_ATTR_FLOAT)->f = 1e-3f;
        int rank = cases[c].rank;
        int64_t ch = cases[c].dims[1], cd[5] = {ch, 1, 1, 1, 1}, hd[5] = {1, 1, 1, 1, 1};
        hd[2] = cases[c].dims[2];
        af_tensor *t[5] = {NULL};
        t[0] = af_tensor_new(AF_DTYPE_FLOAT, rank, cases[c].dims);
        t[1] = af_tensor_new(AF_DTYPE_FLOAT, 1, &ch);
        t[2] = af_tensor_new(AF_DTYPE_FLOAT, 1, &ch);
        if (cases[c].steps == 1) {
            t[3] = af_tensor_new(AF_DTYPE_FLOAT, rank - 1, cd);
            t[4] = af_tensor_new(AF_DTYPE_FLOAT, rank, cases[c].dims);
        } else if (cases[c].steps == 2) {
            t[3] = af_tensor_new(AF_DTYPE_FLOAT, rank, hd);
        }
        for (int i = 0; i < nin; i++) {
            assert_non_null(t[i]);
            fill(t[i], i == 1 ? FILL_POS : i == 0 ? FILL_BIG : FILL_RAND);
        }
        if (cases[c].steps) {
            /* fill each attribute before adding the next (adding may move them) */
            int64_t one[9] = {AF_EP_GELU, -1, 0, AF_EP_MUL, 3, 0, AF_EP_ADD, 4, 0};
            int64_t two[6] = {AF_EP_SIGMOID, -1, 0, AF_EP_ADD, 3, 0};
            int ni = cases[c].steps == 1 ? 9 : 6;
            af_attr *e = af_node_add_attr(n, "epilogue", AF_ATTR_INTS);
            e->ints = af_arena_calloc(a, 9, sizeof(int64_t));
            e->n = ni;
            memcpy(e->ints, cases[c].steps == 1 ? one : two, sizeof(int64_t) * (size_t)ni);
            af_attr *p = af_node_add_attr(n, "epilogue_params", AF_ATTR_FLOATS);
            p->floats = af_arena_calloc(a, 6, sizeof(float));
            p->n = ni / 3 * 2;
        }
        const af_tensor *in[5] = {t[0], t[1], t[2], t[3], t[4]};
        char what[96];
        snprintf(what, sizeof what, "GroupNorm case %zu", c);
        af_tensor want[1], got[1];
        af_isa_set(AF_ISA_REFERENCE);
        if (run(n, in, want, 1, NULL, false, &err)) fail_msg("%s: %s", what, err.message);
        for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
            af_isa_set((af_isa)isa);
            for (int threads = 1; threads <= 2; threads++) {
                if (run(n, in, got, 1, threads == 2 ? rt : NULL, false, &err))
                    fail_msg("%s: %s", what, err.message);
                expect_all(what, got, want, 1);
                release(got, 1);
            }
            assert_int_equal(run(n, in, got, 1, NULL, true, &err), AF_OK);
            expect_all(what, got, want, 1);
            release(got, 1);
        }
        af_isa_set(best);
        release(want, 1);
        /* bad: groups that do not divide the channels, refused by both with the node's name */
        n->attrs[0].i = ch + 1; /* num_groups */
        assert_int_equal(run(n, in, got, 1, NULL, false, &err), AF_ERR_INVALID_MODEL);
        assert_non_null(strstr(err.message, "n0"));
        release(got, 1);
        for (int i = 0; i < 5; i++) af_tensor_free(t[i]);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

/* RNN, GRU and LSTM (kernels/fast/rnn.c) against the reference kernel: odd sizes, both
 * directions and layouts, sequence_lens with entries of full, partial and zero length, initial
 * states, peepholes, clip, input_forget, linear_before_reset and activations with alpha / beta;
 * every ISA at 1 and 2 threads, and the fast kernel called directly so that a case cannot pass
 * by being declined. An activation without a vector form (softsign) is declined. */
static void test_rnn(void **state) {
    (void)state;
    static const struct {
        const char *op, *dir, *acts; /* acts: "" (defaults) or comma separated */
        int layout, lbr, input_forget, full; /* full: B, sequence_lens, initial states, P */
        float clip, alpha;                   /* clip 0: none; alpha: of every activation taking one */
        bool fast;
    } cases[] = {
        {"LSTM", "forward", "", 0, 0, 0, 1, 0.0f, 0.0f, true},
        {"LSTM", "bidirectional", "", 0, 0, 1, 1, 0.8f, 0.0f, true},
        {"LSTM", "reverse", "hardsigmoid,tanh,relu", 1, 0, 0, 1, 0.0f, 0.3f, true},
        {"LSTM", "forward", "sigmoid,elu,softplus", 0, 0, 0, 0, 0.0f, 0.7f, true},
        {"GRU", "forward", "", 0, 0, 0, 1, 0.0f, 0.0f, true},
        {"GRU", "bidirectional", "", 1, 1, 0, 1, 0.5f, 0.0f, true},
        {"GRU", "reverse", "sigmoid,leakyrelu", 0, 1, 0, 0, 0.0f, 0.1f, true},
        {"RNN", "forward", "relu", 0, 0, 0, 1, 0.0f, 0.0f, true},
        {"RNN", "bidirectional", "", 0, 0, 0, 1, 0.6f, 0.0f, true},
        {"LSTM", "forward", "sigmoid,softsign,tanh", 0, 0, 0, 1, 0.0f, 0.0f, false},
    };
    enum { SEQ = 5, BATCH = 3, INPUT = 7, HIDDEN = 9 };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_get();
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        char what[96];
        snprintf(what, sizeof what, "case %zu: %s %s", c, cases[c].op, cases[c].dir);
        af_arena *a = af_arena_new();
        af_op op = af_op_lookup("", cases[c].op);
        bool lstm = op == AF_OP_LSTM;
        int gates = lstm ? 4 : op == AF_OP_GRU ? 3 : 1, nout = lstm ? 3 : 2;
        int nin = cases[c].full ? (lstm ? 8 : 6) : 3;
        int64_t nd = strcmp(cases[c].dir, "bidirectional") ? 1 : 2, lay = cases[c].layout;
        af_node *n = tu_node(a, op, 14, nin, nout, 10);
        for (int o = 0; o < nout; o++) af_node_set_output(n, o, af_value_new(n->graph, o ? "y1" : "y0"));
        af_node_add_attr(n, "hidden_size", AF_ATTR_INT)->i = HIDDEN;
        af_attr *d = af_node_add_attr(n, "direction", AF_ATTR_STRING);
        d->s = cases[c].dir;
        d->slen = strlen(d->s);
        af_node_add_attr(n, "layout", AF_ATTR_INT)->i = lay;
        if (cases[c].lbr) af_node_add_attr(n, "linear_before_reset", AF_ATTR_INT)->i = 1;
        if (cases[c].input_forget) af_node_add_attr(n, "input_forget", AF_ATTR_INT)->i = 1;
        if (cases[c].clip > 0) af_node_add_attr(n, "clip", AF_ATTR_FLOAT)->f = cases[c].clip;
        if (cases[c].acts[0]) {
            /* the list once per direction */
            const char **names = af_arena_calloc(a, 8, sizeof(char *));
            int k = 0;
            for (int64_t r = 0; r < nd; r++) {
                char buf[64];
                snprintf(buf, sizeof buf, "%s", cases[c].acts);
                for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv))
                    names[k++] = af_arena_strdup(a, t);
            }
            af_attr *at = af_node_add_attr(n, "activations", AF_ATTR_STRINGS);
            at->strings = names;
            at->n = k;
            af_attr *al = af_node_add_attr(n, "activation_alpha", AF_ATTR_FLOATS);
            al->floats = af_arena_calloc(a, 8, sizeof(float));
            for (al->n = 0; al->n < k; al->n++) al->floats[al->n] = cases[c].alpha;
        }
        int64_t gh = gates * HIDDEN;
        int64_t xd[3] = {lay ? BATCH : SEQ, lay ? SEQ : BATCH, INPUT}, wd[3] = {nd, gh, INPUT};
        int64_t rd[3] = {nd, gh, HIDDEN}, bd[2] = {nd, 2 * gh}, sd[1] = {BATCH};
        int64_t hd[3] = {lay ? BATCH : nd, lay ? nd : BATCH, HIDDEN}, pd[2] = {nd, 3 * HIDDEN};
        af_tensor *t[8] = {af_tensor_new(AF_DTYPE_FLOAT, 3, xd), af_tensor_new(AF_DTYPE_FLOAT, 3, wd),
                           af_tensor_new(AF_DTYPE_FLOAT, 3, rd), NULL, NULL, NULL, NULL, NULL};
        if (cases[c].full) {
            t[3] = af_tensor_new(AF_DTYPE_FLOAT, 2, bd);
            t[4] = af_tensor_new(AF_DTYPE_INT32, 1, sd);
            t[5] = af_tensor_new(AF_DTYPE_FLOAT, 3, hd);
            if (lstm) t[6] = af_tensor_new(AF_DTYPE_FLOAT, 3, hd), t[7] = af_tensor_new(AF_DTYPE_FLOAT, 2, pd);
        }
        for (int i = 0; i < nin; i++) {
            assert_non_null(t[i]);
            if (i != 4) fill(t[i], FILL_RAND);
        }
        if (t[4]) {
            int32_t lens[BATCH] = {SEQ, 2, 0};
            memcpy(t[4]->data, lens, sizeof lens);
        }
        const af_tensor *in[8] = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]};
        af_tensor want[3], got[3];
        af_isa_set(AF_ISA_REFERENCE);
        if (run(n, in, want, nout, NULL, false, &err)) fail_msg("%s: %s", what, err.message);
        for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
            af_isa_set((af_isa)isa);
            for (int threads = 1; threads <= 2; threads++) {
                if (run(n, in, got, nout, threads == 2 ? rt : NULL, false, &err))
                    fail_msg("%s: %s", what, err.message);
                expect_all(what, got, want, nout);
                release(got, nout);
            }
            af_status st = run(n, in, got, nout, NULL, true, &err);
            if (st != (cases[c].fast ? AF_OK : AF_DECLINED)) fail_msg("%s: the fast kernel gave %d", what, st);
            if (cases[c].fast) expect_all(what, got, want, nout);
            release(got, nout);
        }
        af_isa_set(best);
        release(want, nout);
        for (int i = 0; i < 8; i++) af_tensor_free(t[i]);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

/* Box i of a batched NMS's layout (torchvision offsets each class's boxes by class x (max
 * coordinate + 1)): 13 groups along the diagonal, sizes from 3 to 6; every 37th box spans 3
 * groups (wider than the grid's span limit; the test gives them the top scores), every 23rd is a point and, in center form, every
 * 29th has negative sizes (a positive area, but no overlap). */
static void batched_box(float *b, int64_t i, bool center) {
    float off = (float)(i % 13) * 20.0f, y = off + (float)(tu_rnd() * 14.0), x = off + (float)(tu_rnd() * 14.0);
    float h = (float)(tu_rnd() * 3.0 + 3.0), w = (float)(tu_rnd() * 3.0 + 3.0);
    if (i % 37 == 0) y = off, x = off, h = 60, w = 60;
    if (i % 23 == 0) h = 0, w = 0;
    if (center && i % 29 == 0) h = -h, w = -w;
    if (center) {
        b[0] = x + w / 2, b[1] = y + h / 2, b[2] = w, b[3] = h;
    } else { /* corners in either order, as the op allows */
        b[0] = i % 2 ? y + h : y, b[1] = x, b[2] = i % 2 ? y : y + h, b[3] = x + w;
    }
}

/* NonMaxSuppression: the fast selection against the reference's, exactly, on overlapping
 * random boxes (corner and center forms, 2 images, 3 classes), with and without a score
 * threshold and output limit, and on a batched NMS's layout (groups of boxes far apart, a few
 * spanning all of them, points and inverted boxes); a negative IoU threshold and an infinite
 * coordinate are declined. */
static void test_nms(void **state) {
    (void)state;
    static const int64_t bd[3] = {2, 400, 4}, sd[3] = {2, 3, 400}, one[1] = {1};
    for (int v = 0; v < 8; v++) {
        af_arena *a = af_arena_new();
        af_node *n = tu_node(a, AF_OP_NON_MAX_SUPPRESSION, 11, 5, 1, 2);
        af_node_set_output(n, 0, af_value_new(n->graph, "sel"));
        if (v & 1) af_node_set_int(n, "center_point_box", 1);
        af_tensor *bx = af_tensor_new(AF_DTYPE_FLOAT, 3, bd), *sc = af_tensor_new(AF_DTYPE_FLOAT, 3, sd);
        af_tensor *mo = af_tensor_new(AF_DTYPE_INT64, 1, one), *io = af_tensor_new(AF_DTYPE_FLOAT, 1, one);
        af_tensor *st = af_tensor_new(AF_DTYPE_FLOAT, 1, one);
        assert_true(bx && sc && mo && io && st);
        float *b = bx->data, *s = sc->data;
        for (int64_t i = 0; i < af_tensor_numel(sc); i++) s[i] = (float)(tu_rnd() * 0.5 + 0.5);
        for (int64_t i = 0; i < af_tensor_numel(bx); i++) b[i] = (float)(tu_rnd() * 8.0 + (i % 4 >= 2) * 3.0);
        if (v >= 6)
            for (int64_t i = 0; i < af_tensor_numel(bx) / 4; i++) {
                batched_box(b + 4 * i, i % 400, v & 1);
                if (i % 400 % 37 == 0) /* the wide boxes first, so that they suppress */
                    for (int64_t k = 0; k < 3; k++) s[(i / 400 * 3 + k) * 400 + i % 400] = 2.0f;
            }
        *(int64_t *)mo->data = v < 2 ? 1000 : 40;
        /* batched: so low that the wide boxes suppress small ones too */
        *(float *)io->data = v == 4 ? -0.5f : v >= 6 ? 0.001f : 0.45f;
        *(float *)st->data = 0.3f;
        if (v == 5) b[17] = INFINITY;
        const af_tensor *in[5] = {bx, sc, mo, io, v == 2 ? NULL : st};
        af_tensor want, got;
        memset(&want, 0, sizeof want);
        memset(&got, 0, sizeof got);
        af_error err;
        assert_int_equal(af_ref_ops[AF_OP_NON_MAX_SUPPRESSION].kernel(n, in, &want, NULL, &err), AF_OK);
        af_exec x;
        af_exec_init(&x, NULL, NULL);
        af_status fs = fast_nms(n, in, &got, &x, &err);
        af_exec_release(&x);
        if (v == 4 || v == 5) {
            assert_int_equal(fs, AF_DECLINED);
        } else {
            assert_int_equal(fs, AF_OK);
            assert_true(want.dims[0] > 10);
            expect_same("NonMaxSuppression", &got, &want);
        }
        af_tensor_release(&want);
        af_tensor_release(&got);
        af_tensor *own[5] = {bx, sc, mo, io, st};
        for (int i = 0; i < 5; i++) af_tensor_free(own[i]);
        af_arena_free(a);
    }
}

/* ---- quantization ---------------------------------------------------------------------------- */

/* A tensor of type dt and dims whose elements are gen(i) (stored with the reference's rules). */
static af_tensor *q_tensor(af_dtype dt, int rank, const int64_t *dims, double (*gen)(int64_t)) {
    af_tensor *t = af_tensor_new(dt, rank, dims);
    assert_non_null(t);
    for (int64_t i = 0; i < af_tensor_numel(t); i++) {
        double v = gen(i);
        if (dt == AF_DTYPE_FLOAT) ((float *)t->data)[i] = (float)v;
        else if (dt == AF_DTYPE_UINT8) ((uint8_t *)t->data)[i] = (uint8_t)v;
        else ((int8_t *)t->data)[i] = (int8_t)v;
    }
    return t;
}

static double g_rand(int64_t i) { (void)i; return 4.0 * tu_rnd(); }
static double g_ties(int64_t i) { return 0.5 * (double)(i % 601) - 150.0; } /* x.5 halves */
static double g_odd(int64_t i) { /* NaN, infinities, huge, tiny */
    static const double v[] = {NAN, INFINITY, -INFINITY, 3e9, -3e9, 1e-30, -0.0, 254.5, -128.5};
    return i % 3 ? 3.0 * tu_rnd() : v[(i / 3) % 9];
}
static double g_u8(int64_t i) { return (double)((i * 37) % 256); }
static double g_i8(int64_t i) { return (double)((i * 37) % 256) - 128.0; }
static double g_scale(int64_t i) { return 0.01 + 0.007 * (double)i; }
static double g_zp_u8(int64_t i) { return (double)(100 + 40 * i); }
static double g_zp_i8(int64_t i) { return (double)(-20 + 15 * i); }
static double g_zero(int64_t i) { (void)i; return 0.0; }
static double g_pos(int64_t i) { return 1.0 + (double)(i % 13); }

/* QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: the fast kernels give the
 * reference's bits (ties to even, saturation, NaN, per-tensor and per-axis parameters, int8
 * and uint8, no zero point), called directly and through the dispatcher at 1 and 2 threads;
 * int32 dequantization is declined. */
static void test_quantize(void **state) {
    (void)state;
    typedef struct qcase {
        const char *op, *attrs;
        af_dtype xt;
        int rank;
        int64_t dims[4];
        double (*x)(int64_t);
        int nparams; /* 0: none (Dynamic); 1: scale; 2: scale and zero point */
        int64_t plen; /* parameter values: 0 scalar, else per axis */
        af_dtype zt;
        double (*zp)(int64_t);
        bool fast;
    } qcase;
    static const qcase cases[] = {
        {"QuantizeLinear", "", AF_DTYPE_FLOAT, 4, {2, 3, 5, 7}, g_rand, 2, 0, AF_DTYPE_UINT8, g_zp_u8, true},
        {"QuantizeLinear", "", AF_DTYPE_FLOAT, 2, {3, 40000}, g_ties, 1, 0, AF_DTYPE_UINT8, NULL, true},
        {"QuantizeLinear", "axis=1", AF_DTYPE_FLOAT, 4, {2, 3, 5, 7}, g_odd, 2, 3, AF_DTYPE_INT8, g_zp_i8, true},
        {"QuantizeLinear", "axis=-1", AF_DTYPE_FLOAT, 2, {9, 4}, g_ties, 2, 4, AF_DTYPE_INT8, g_zp_i8, true},
        {"QuantizeLinear", "", AF_DTYPE_FLOAT, 1, {999}, g_odd, 2, 0, AF_DTYPE_UINT8, g_zp_u8, true},
        {"DequantizeLinear", "", AF_DTYPE_UINT8, 3, {4, 5, 300}, g_u8, 2, 0, AF_DTYPE_UINT8, g_zp_u8, true},
        {"DequantizeLinear", "axis=0", AF_DTYPE_INT8, 3, {3, 5, 7}, g_i8, 2, 3, AF_DTYPE_INT8, g_zp_i8, true},
        {"DequantizeLinear", "", AF_DTYPE_INT8, 2, {7, 9}, g_i8, 1, 0, AF_DTYPE_INT8, NULL, true},
        {"DequantizeLinear", "", AF_DTYPE_INT32, 1, {10}, g_zero, 1, 0, AF_DTYPE_INT32, NULL, false},
        {"DynamicQuantizeLinear", "", AF_DTYPE_FLOAT, 2, {4, 50000}, g_rand, 0, 0, AF_DTYPE_UINT8, NULL, true},
        {"DynamicQuantizeLinear", "", AF_DTYPE_FLOAT, 2, {3, 7}, g_zero, 0, 0, AF_DTYPE_UINT8, NULL, true},
        {"DynamicQuantizeLinear", "", AF_DTYPE_FLOAT, 1, {77}, g_pos, 0, 0, AF_DTYPE_UINT8, NULL, true},
        {"DynamicQuantizeLinear", "", AF_DTYPE_FLOAT, 2, {5, 301}, g_odd, 0, 0, AF_DTYPE_UINT8, NULL, true},
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_get();
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const qcase *q = &cases[c];
        af_arena *a = af_arena_new();
        af_op op = af_op_lookup("", q->op);
        int nin = q->nparams ? 1 + q->nparams : 1, nout = q->nparams ? 1 : 3;
        af_node *n = tu_node(a, op, 13, nin, nout, 8);
        for (int o = 0; o < nout; o++) af_node_set_output(n, o, af_value_new(n->graph, "y"));
        tu_attrs(a, n, q->attrs, 8, parse_attr);
        af_tensor *owned[3] = {q_tensor(q->xt, q->rank, q->dims, q->x), NULL, NULL};
        int64_t pd[1] = {q->plen};
        if (q->nparams) owned[1] = q_tensor(AF_DTYPE_FLOAT, q->plen ? 1 : 0, pd, g_scale);
        if (q->nparams > 1) owned[2] = q_tensor(q->zt, q->plen ? 1 : 0, pd, q->zp);
        const af_tensor *in[3] = {owned[0], owned[1], owned[2]};
        char what[160];
        snprintf(what, sizeof what, "case %zu: %s %s", c, q->op, q->attrs);
        af_tensor want[3], got[3];
        af_isa_set(AF_ISA_REFERENCE);
        if (run(n, in, want, nout, NULL, false, &err)) fail_msg("%s: %s", what, err.message);
        af_isa_set(best);
        af_exec x;
        af_exec_init(&x, NULL, NULL);
        af_kernel_fn fast = op == AF_OP_QUANTIZE_LINEAR ? fast_quantize
                            : op == AF_OP_DEQUANTIZE_LINEAR ? fast_dequantize : fast_dyn_quantize;
        for (int o = 0; o < nout; o++) {
            memset(&got[o], 0, sizeof got[o]);
            af_tensor_type_copy(&got[o], &want[o]);
            assert_int_equal(af_tensor_alloc(&got[o], &err), AF_OK);
        }
        af_status st = fast(n, in, got, &x, &err);
        af_exec_release(&x);
        if (!q->fast) {
            assert_int_equal(st, AF_DECLINED);
        } else {
            if (st) fail_msg("%s: the fast kernel gave %d", what, st);
            for (int o = 0; o < nout; o++)
                if (memcmp(got[o].data, want[o].data, want[o].nbytes))
                    fail_msg("%s: output %d differs from the reference", what, o);
        }
        release(got, nout);
        for (int threads = 1; threads <= 2; threads++) {
            if (run(n, in, got, nout, threads == 2 ? rt : NULL, false, &err))
                fail_msg("%s: %s", what, err.message);
            for (int o = 0; o < nout; o++)
                if (memcmp(got[o].data, want[o].data, want[o].nbytes))
                    fail_msg("%s, %d thread(s): output %d differs", what, threads, o);
            release(got, nout);
        }
        release(want, nout);
        for (int k = 0; k < 3; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

/* RoiAlign: the fast kernel bit for bit against the reference (both compute in double, in one
 * order), directly and through the dispatcher at 1 and 2 threads on every ISA: avg and max,
 * both coordinate transformations, adaptive and fixed sampling, rois partly or wholly outside
 * the image, reversed and tiny ones, int32 and int64 batch indices. A non-finite roi and too
 * many samples per roi are declined (the reference computes them); a bad batch index is
 * declined and reported by the reference. */
static void test_roi_align(void **state) {
    (void)state;
    static const int64_t xd[4] = {2, 21, 11, 13}, rd[2] = {9, 4}, bd[1] = {9};
    static const float rois[9][4] = {
        {0, 0, 12, 10},   {2.5f, 1.25f, 7.75f, 9.5f}, {-4, -3, 5, 4},     {10, 8, 30, 25},
        {6, 6, 6.2f, 6.1f}, {9, 9, 3, 2},             {-30, -30, -20, -20}, {1, 2, 3, 11},
        {0.4f, 0.6f, 25.9f, 21.1f}};
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_isa best = af_isa_get();
    for (int v = 0; v < 8; v++) {
        af_arena *a = af_arena_new();
        af_node *n = tu_node(a, AF_OP_ROI_ALIGN, 16, 3, 1, 8);
        af_node_set_output(n, 0, af_value_new(n->graph, "y"));
        af_node_add_attr(n, "mode", AF_ATTR_STRING)->s = v & 1 ? "max" : "avg";
        af_node_add_attr(n, "coordinate_transformation_mode", AF_ATTR_STRING)->s =
            v & 2 ? "output_half_pixel" : "half_pixel";
        af_node_add_attr(n, "sampling_ratio", AF_ATTR_INT)->i = v & 4 ? 2 : 0;
        af_node_add_attr(n, "output_height", AF_ATTR_INT)->i = 3;
        af_node_add_attr(n, "output_width", AF_ATTR_INT)->i = 4;
        af_node_add_attr(n, "spatial_scale", AF_ATTR_FLOAT)->f = v < 4 ? 0.5f : 1.0f;
        for (int i = 0; i < n->nattrs; i++)
            if (n->attrs[i].type == AF_ATTR_STRING) n->attrs[i].slen = strlen(n->attrs[i].s);
        af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 4, xd), *r = af_tensor_new(AF_DTYPE_FLOAT, 2, rd);
        af_tensor *bi = af_tensor_new(v & 1 ? AF_DTYPE_INT32 : AF_DTYPE_INT64, 1, bd);
        assert_true(x && r && bi);
        fill(x, FILL_RAND);
        memcpy(r->data, rois, sizeof rois);
        for (int i = 0; i < 9; i++) {
            if (v & 1) ((int32_t *)bi->data)[i] = i % 2;
            else ((int64_t *)bi->data)[i] = i % 2;
        }
        const af_tensor *in[3] = {x, r, bi};
        af_tensor want[1], got[1];
        af_isa_set(AF_ISA_REFERENCE);
        if (run(n, in, want, 1, NULL, false, &err)) fail_msg("RoiAlign %d: %s", v, err.message);
        size_t bytes = (size_t)af_tensor_numel(&want[0]) * sizeof(float);
        for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
            af_isa_set((af_isa)isa);
            for (int way = 0; way < 3; way++) {
                af_status st = way == 0 ? run(n, in, got, 1, NULL, true, &err)
                                        : run(n, in, got, 1, way == 2 ? rt : NULL, false, &err);
                if (st != AF_OK) fail_msg("RoiAlign %d, way %d: status %d", v, way, st);
                if (memcmp(got[0].data, want[0].data, bytes))
                    fail_msg("RoiAlign %d on %s, way %d: differs from the reference", v,
                             af_isa_name(af_isa_get()), way);
                release(got, 1);
            }
        }
        af_isa_set(best);
        if (v == 0) {
            /* declined: a NaN coordinate; too many samples (the reference computes it) */
            ((float *)r->data)[6] = NAN;
            assert_int_equal(run(n, in, got, 1, NULL, true, &err), AF_DECLINED);
            release(got, 1);
            ((float *)r->data)[6] = rois[1][2];
            n->attrs[2].i = 200; /* sampling_ratio: 3 x 4 x 200 x 200 samples per roi */
            assert_int_equal(run(n, in, got, 1, NULL, true, &err), AF_DECLINED);
            release(got, 1);
            n->attrs[2].i = 0;
            /* a batch index out of range: declined, and the reference's error names the node */
            ((int64_t *)bi->data)[3] = 2;
            assert_int_equal(run(n, in, got, 1, NULL, true, &err), AF_DECLINED);
            release(got, 1);
            assert_int_equal(run(n, in, got, 1, rt, false, &err), AF_ERR_RUNTIME);
            assert_non_null(strstr(err.message, "n0"));
            release(got, 1);
        }
        release(want, 1);
        af_tensor_free(x);
        af_tensor_free(r);
        af_tensor_free(bi);
        af_arena_free(a);
    }
    af_runtime_free(rt);
}

int main(void) {
    tu_rng = 4242;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_vs_reference),
        cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_rnn),
        cmocka_unit_test(test_declines),
        cmocka_unit_test(test_nms),
        cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_roi_align),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
