/* The fast float32 index ops: TopK by partial selection and CumSum along any axis.
 *
 * TopK ranks elements by value (NaN above every number, as the reference's comparison puts
 * it), then by index, lower first: a strict total order, so the k first of it are exactly the
 * reference's stable sort's k first, whatever the algorithm. Each line along the axis streams
 * through a heap of its k best so far (the worst on top: most elements are turned away by one
 * comparison with it, whole blocks of a contiguous line by a vectorisable test), which is then
 * sorted; an element's rank is one 64-bit key (rank_key). The output is in that order whether
 * or not `sorted` is set (the reference's too).
 *
 * CumSum along the last axis keeps a double running sum per line, as the reference does;
 * along another axis it adds whole rows of the inner axes (vec reduce_acc, float lanes: within
 * float rounding of the reference).
 *
 * Invariant: tensors are checked to hold their elements, K and the axis to be in range;
 * anything else is AF_DECLINED before anything is written and the reference kernel runs (and
 * reports) it. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"
#include "kernels/simd/vec.h"

#include <string.h>

static bool ready(const af_tensor *t, af_dtype dt) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count > 0 && t->dtype == dt && t->data &&
           (uint64_t)count <= (uint64_t)t->nbytes / af_dtype_size(dt);
}

/* ---- TopK ---------------------------------------------------------------------------------- */

enum { TOPK_BLOCK = 32 }; /* a power of 2 */

typedef struct topk_job {
    const float *x;
    float *vals;
    int64_t *idx;
    int64_t dim, inner, k;
    bool largest;
    uint64_t *heaps; /* k keys per slot */
} topk_job;

/* The rank of (v, i) as one integer, higher ranking first: the value's bits made monotone
 * (-0 as +0, every NaN one value above +inf) in the high word, flipped for the smallest, and
 * the index flipped in the low word (the lower index wins a tie). One integer comparison
 * instead of the branches of NaN and ties. */
static inline uint64_t rank_key(float v, int64_t i, bool largest) {
    uint32_t u;
    if (v == 0.0f) v = 0.0f;
    memcpy(&u, &v, sizeof u);
    if (v != v) u = 0xFFFFFFFFu;
    else u = u & 0x80000000u ? ~u : u | 0x80000000u;
    if (!largest) u = ~u;
    return (uint64_t)u << 32 | (uint32_t)~(uint32_t)i;
}

/* Restore the min-heap (the worst kept on top) below position p of h[0..n). */
static void sift_down(uint64_t *h, int64_t n, int64_t p) {
    uint64_t top = h[p];
    for (;;) {
        int64_t c = 2 * p + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (top <= h[c]) break;
        h[p] = h[c];
        p = c;
    }
    h[p] = top;
}

static void topk_line(const topk_job *j, uint64_t *h, const float *x, float *vals, int64_t *idx) {
    const int64_t k = j->k, st = j->inner;
    const bool lg = j->largest;
    for (int64_t i = 0; i < k; i++) h[i] = rank_key(x[i * st], i, lg);
    for (int64_t p = k / 2 - 1; p >= 0; p--) sift_down(h, k, p);
    /* The worst kept value t turns away, while it is a number, every v not above (below) it:
     * ties lose to it, their index being higher, and a NaN fails the comparison and is ranked.
     * Contiguous lines test whole blocks first (a loop the compiler vectorises). */
    float t = x[(int64_t)(uint32_t)~(uint32_t)h[0] * st];
    for (int64_t i = k; i < j->dim; i++) {
        if (st == 1 && t == t && (i & (TOPK_BLOCK - 1)) == 0 && i + TOPK_BLOCK <= j->dim) {
            int beaten = 0;
            if (lg)
                for (int b = 0; b < TOPK_BLOCK; b++) beaten |= !(x[i + b] <= t);
            else
                for (int b = 0; b < TOPK_BLOCK; b++) beaten |= !(x[i + b] >= t);
            if (!beaten) {
                i += TOPK_BLOCK - 1;
                continue;
            }
        }
        float v = x[i * st];
        if (t == t && (lg ? v <= t : v >= t)) continue;
        uint64_t key = rank_key(v, i, lg);
        if (key <= h[0]) continue;
        h[0] = key;
        sift_down(h, k, 0);
        t = x[(int64_t)(uint32_t)~(uint32_t)h[0] * st];
    }
    /* heap sort: the worst goes last */
    for (int64_t n = k; n > 1; n--) {
        uint64_t t = h[0];
        h[0] = h[n - 1];
        h[n - 1] = t;
        sift_down(h, n - 1, 0);
    }
    for (int64_t r = 0; r < k; r++) {
        int64_t i = (uint32_t)~(uint32_t)h[r];
        vals[r * st] = x[i * st];
        idx[r * st] = i;
    }
}

static void topk_range(void *ctx, int slot, int64_t begin, int64_t end) {
    const topk_job *j = ctx;
    uint64_t *h = j->heaps + (int64_t)slot * j->k;
    for (int64_t it = begin; it < end; it++) {
        int64_t a = it / j->inner, i = it % j->inner;
        topk_line(j, h, j->x + a * j->dim * j->inner + i, j->vals + a * j->k * j->inner + i,
                  j->idx + a * j->k * j->inner + i);
    }
}

af_status fast_topk(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                    af_error *err) {
    (void)err;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    int axis;
    if (!t || n->nout != 2 || !ready(t, AF_DTYPE_FLOAT) || !ready(&out[0], AF_DTYPE_FLOAT) ||
        !ready(&out[1], AF_DTYPE_INT64) || t->rank < 1 ||
        !af_axis(af_attr_int(n, "axis", -1), t->rank, &axis))
        return AF_DECLINED;
    int64_t k = -1;
    if (af_graph_opset(n->graph) < 10) {
        k = af_attr_int(n, "k", -1);
    } else {
        int cnt;
        if (n->nin < 2 || !in[1] || in[1]->dtype != AF_DTYPE_INT64 || !tn_ints(in[1], &k, 1, &cnt) ||
            cnt != 1)
            return AF_DECLINED;
    }
    topk_job j = {t->data, out[0].data, out[1].data, t->dims[axis],
                  tn_prod(t->dims, axis + 1, t->rank), k, af_attr_int(n, "largest", 1) != 0, NULL};
    int64_t outer = tn_prod(t->dims, 0, axis);
    if (k < 1 || k > j.dim || j.dim > (int64_t)UINT32_MAX || af_tensor_numel(&out[0]) != outer * k * j.inner ||
        af_tensor_numel(&out[1]) != outer * k * j.inner)
        return AF_DECLINED;
    int slots = af_exec_threads(x) < AF_EXEC_MAX_SLOTS ? af_exec_threads(x) : AF_EXEC_MAX_SLOTS;
    j.heaps = af_exec_scratch(x, (size_t)slots * (size_t)k * sizeof(uint64_t));
    if (!j.heaps) return AF_DECLINED;
    int64_t total = af_tensor_numel(t);
    af_exec_parallel(x, outer * j.inner, af_exec_work_ns(x, 2.0 * (double)total, 4.0 * (double)total),
                     topk_range, &j);
    return AF_OK;
}

/* ---- CumSum -------------------------------------------------------------------------------- */

typedef struct cs_job {
    const float *x;
    float *y;
    int64_t dim, inner;
    bool excl, rev;
} cs_job;

/* Items are lines (inner == 1) or (outer) blocks of rows. */
static void cs_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const cs_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t a = begin; a < end; a++) {
        const float *x = j->x + a * j->dim * j->inner;
        float *y = j->y + a * j->dim * j->inner;
        if (j->inner == 1) {
            double acc = 0.0;
            for (int64_t s = 0; s < j->dim; s++) {
                int64_t e = j->rev ? j->dim - 1 - s : s;
                if (j->excl) y[e] = (float)acc;
                acc += x[e];
                if (!j->excl) y[e] = (float)acc;
            }
            continue;
        }
        const size_t row = (size_t)j->inner * sizeof(float);
        for (int64_t s = 0; s < j->dim; s++) {
            int64_t e = j->rev ? j->dim - 1 - s : s, p = j->rev ? e + 1 : e - 1;
            float *yr = y + e * j->inner;
            if (s == 0) {
                if (j->excl) memset(yr, 0, row);
                else af_copy(yr, x + e * j->inner, row);
                continue;
            }
            /* y[e] = y[p] + (exclusive ? x[p] : x[e]) */
            af_copy(yr, y + p * j->inner, row);
            v->reduce_acc(AF_VRED_SUM, x + (j->excl ? p : e) * j->inner, j->inner, yr, NULL);
        }
    }
}

af_status fast_cumsum(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    const af_tensor *t = n->nin == 2 ? in[0] : NULL;
    int64_t av;
    int cnt, axis;
    if (!t || n->nout != 1 || !ready(t, AF_DTYPE_FLOAT) || !ready(&out[0], AF_DTYPE_FLOAT) ||
        !in[1] || !tn_ints(in[1], &av, 1, &cnt) || cnt != 1 || !af_axis(av, t->rank, &axis) ||
        af_tensor_numel(&out[0]) != af_tensor_numel(t))
        return AF_DECLINED;
    cs_job j = {t->data, out[0].data, t->dims[axis], tn_prod(t->dims, axis + 1, t->rank),
                af_attr_int(n, "exclusive", 0) != 0, af_attr_int(n, "reverse", 0) != 0};
    int64_t outer = tn_prod(t->dims, 0, axis), total = af_tensor_numel(t);
    af_exec_parallel(x, outer, af_exec_work_ns(x, (double)total, 8.0 * (double)total), cs_range, &j);
    return AF_OK;
}
