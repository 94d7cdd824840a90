/* The fast Resize / Upsample: separable passes over the reference kernel's own per-axis taps
 * (tn_resize_plan: every mode, coordinate transformation, nearest_mode, cubic_coeff_a,
 * exclude_outside, scales or sizes, opsets 7-19).
 *
 * The tensor is cut at its first resized axis f: the dims before f are not resized, so each of
 * their index combinations is an independent slice (an N x C plane for an NCHW image), run in
 * parallel (with fewer slices than threads, as for a channels-last image, each pass runs over
 * all slices at once, in parallel over its output rows). Inside a slice the resized axes are done one at a time, innermost first, through
 * two per-thread buffers (a plane fits in L2): along the last axis an output element gathers its
 * taps; along any other axis an output row is a weighted sum of whole input rows (vec.h
 * blend_row), or a copy of one for nearest. Axes whose taps are the identity (scale 1) are
 * skipped. Linear and cubic are float32 (weights rounded to float, so results agree with the
 * reference's double sums within float rounding); nearest moves whole elements of any size
 * (bit-identical). tf_crop_and_resize's outside coordinates are written last, as the
 * extrapolation value.
 *
 * Invariant: every index in the tables is clamped into its axis by tn_resize_plan; a pass reads
 * only its source slice and writes only its destination slice. Anything tn_resize_plan refuses
 * (antialias, a bad shape) is AF_DECLINED: the reference kernel reports it. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"
#include "kernels/simd/vec.h"

#include <string.h>

/* One resized axis, as the passes read it: taps per output coordinate in float. */
typedef struct rs_axis {
    int a;              /* the axis */
    int64_t lin, lout;  /* input and output length */
    int64_t pre, post;  /* the pass's view: [pre, lin, post] -> [pre, lout, post] */
    const tn_rz_taps *t; /* lout taps (plan) */
    float *w;            /* [lout][4] */
} rs_axis;

typedef struct rs_job {
    const char *x;
    char *y;
    size_t es;
    bool nearest;
    int naxes;
    rs_axis ax[AF_MAX_RANK]; /* innermost first */
    int64_t slice_in, slice_out, mid; /* elements of a slice in, out, and a buffer */
    char *scratch;                    /* 2 buffers of mid elements per slot */
    /* tf_crop_and_resize: output dims of the slice and their taps, for the last step */
    bool outside;
    int srank;
    int64_t sdims[AF_MAX_RANK];
    const tn_rz_taps *st[AF_MAX_RANK];
    float extrapolation;
} rs_job;

/* Output rows [begin, end) of the pass of axis ax from src to dst; a row is one (p, o) of the
 * view [pre, lout, post], p counted over `pre` (several slices may be one view). */
static void rs_pass_rows(const rs_job *j, const rs_axis *ax, const char *src, char *dst,
                         int64_t begin, int64_t end) {
    const af_vec_ops *v = af_vec();
    size_t es = j->es;
    if (ax->post == 1 && !j->nearest) { /* along the last axis, linear or cubic: gather floats */
        for (int64_t r = begin; r < end;) {
            int64_t p = r / ax->lout, o = r % ax->lout, stop = end - r < ax->lout - o ? o + end - r : ax->lout;
            const float *sf = (const float *)src + p * ax->lin;
            float *d = (float *)dst + p * ax->lout;
            for (; o < stop; o++, r++) {
                const tn_rz_taps *t = &ax->t[o];
                const float *w = ax->w + 4 * o;
                float acc = 0.0f;
                if (t->n > 0) acc = w[0] * sf[t->idx[0]];
                for (int k = 1; k < t->n; k++) acc += w[k] * sf[t->idx[k]];
                d[o] = acc;
            }
        }
        return;
    }
    if (ax->post == 1 && es == 4) { /* along the last axis, nearest: gather 4-byte elements */
        for (int64_t r = begin; r < end;) {
            int64_t p = r / ax->lout, o = r % ax->lout, stop = end - r < ax->lout - o ? o + end - r : ax->lout;
            const uint32_t *sx = (const uint32_t *)src + p * ax->lin;
            uint32_t *d = (uint32_t *)dst + p * ax->lout;
            for (; o < stop; o++, r++) d[o] = ax->t[o].n ? sx[ax->t[o].idx[0]] : 0;
        }
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        int64_t p = r / ax->lout, o = r % ax->lout;
        const char *s = src + (size_t)(p * ax->lin * ax->post) * es;
        char *d = dst + (size_t)(p * ax->lout * ax->post) * es;
        const tn_rz_taps *t = &ax->t[o];
        if (ax->post == 1) { /* along the last axis: gather */
            if (t->n == 0) {
                memset(d + (size_t)o * es, 0, es);
            } else if (j->nearest) {
                switch (es) { /* constant sizes: a move, not a call */
                case 4: ((uint32_t *)d)[o] = ((const uint32_t *)s)[t->idx[0]]; break;
                case 8: ((uint64_t *)d)[o] = ((const uint64_t *)s)[t->idx[0]]; break;
                case 2: ((uint16_t *)d)[o] = ((const uint16_t *)s)[t->idx[0]]; break;
                default: memcpy(d + (size_t)o * es, s + (size_t)t->idx[0] * es, es);
                }
            } else {
                const float *sf = (const float *)s, *w = ax->w + 4 * o;
                float acc = w[0] * sf[t->idx[0]];
                for (int k = 1; k < t->n; k++) acc += w[k] * sf[t->idx[k]];
                ((float *)d)[o] = acc;
            }
            continue;
        }
        char *row = d + (size_t)(o * ax->post) * es;
        if (t->n == 0) {
            memset(row, 0, (size_t)ax->post * es);
        } else if (j->nearest || (t->n == 1 && ax->w[4 * o] == 1.0f)) {
            af_copy(row, s + (size_t)(t->idx[0] * ax->post) * es, (size_t)ax->post * es);
        } else {
            const float *rows[4];
            for (int k = 0; k < t->n; k++) rows[k] = (const float *)s + t->idx[k] * ax->post;
            v->blend_row(rows, ax->w + 4 * o, t->n, (float *)row, ax->post);
        }
    }
}

static void rs_pass(const rs_job *j, const rs_axis *ax, const char *src, char *dst) {
    rs_pass_rows(j, ax, src, dst, 0, ax->pre * ax->lout);
}

/* The extrapolation value into every element of the output slice y with an outside coordinate. */
static void rs_outside(const rs_job *j, float *y) {
    int64_t idx[AF_MAX_RANK] = {0};
    for (int64_t i = 0; i < j->slice_out; i++) {
        bool out = false;
        for (int d = 0; d < j->srank && !out; d++) out = j->st[d][idx[d]].outside;
        if (out) y[i] = j->extrapolation;
        for (int d = j->srank - 1; d >= 0; d--) {
            if (++idx[d] < j->sdims[d]) break;
            idx[d] = 0;
        }
    }
}

static void rs_slices(void *ctx, int slot, int64_t begin, int64_t end) {
    const rs_job *j = ctx;
    char *buf[2] = {j->scratch + (size_t)(2 * slot) * (size_t)j->mid * j->es,
                    j->scratch + (size_t)(2 * slot + 1) * (size_t)j->mid * j->es};
    for (int64_t s = begin; s < end; s++) {
        const char *src = j->x + (size_t)(s * j->slice_in) * j->es;
        char *dst = j->y + (size_t)(s * j->slice_out) * j->es;
        for (int k = 0; k < j->naxes; k++) {
            char *to = k == j->naxes - 1 ? dst : buf[k & 1];
            rs_pass(j, &j->ax[k], src, to);
            src = to;
        }
        if (j->outside) rs_outside(j, (float *)dst);
    }
}

/* The pass-wise form, for few slices (a channels-last image, a single plane): each pass over
 * every slice at once, in parallel over its output rows, through two whole-tensor buffers. */
typedef struct rs_whole {
    const rs_job *j;
    const rs_axis *ax;
    int64_t slices;
    const char *src;
    char *dst;
} rs_whole;

static void rs_whole_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const rs_whole *w = ctx;
    rs_axis ax = *w->ax;
    ax.pre *= w->slices; /* the slices are the outermost dims: one view */
    rs_pass_rows(w->j, &ax, w->src, w->dst, begin, end);
}

static void rs_outside_all(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const rs_job *j = ctx;
    for (int64_t s = begin; s < end; s++) rs_outside(j, (float *)(j->y + (size_t)(s * j->slice_out) * j->es));
}

static void rs_passwise(rs_job *j, int64_t slices, af_exec *ex) {
    char *buf[2] = {j->scratch, j->scratch + (size_t)(slices * j->mid) * j->es};
    const char *src = j->x;
    for (int k = 0; k < j->naxes; k++) {
        const rs_axis *ax = &j->ax[k];
        char *to = k == j->naxes - 1 ? j->y : buf[k & 1];
        rs_whole w = {j, ax, slices, src, to};
        int64_t rows = slices * ax->pre * ax->lout;
        double outs = (double)rows * (double)ax->post;
        af_exec_parallel(ex, rows, af_exec_work_ns(ex, 8.0 * outs, (double)j->es * 3.0 * outs),
                         rs_whole_rows, &w);
        src = to;
    }
    if (j->outside) af_exec_parallel(ex, slices, af_exec_work_ns(ex, 0.0, (double)(slices * j->slice_out)),
                                     rs_outside_all, j);
}

/* Whether an axis's taps are the identity (each output reads its own index, weight 1). */
static bool rs_identity(const tn_rz_taps *t, int64_t lin, int64_t lout) {
    if (lin != lout) return false;
    for (int64_t o = 0; o < lout; o++)
        if (t[o].outside || t[o].n != 1 || t[o].idx[0] != o || t[o].w[0] != 1.0) return false;
    return true;
}

static af_status rs_run(const tn_rz_plan *plan, const af_tensor *x, af_tensor *y, af_exec *ex,
                        float *wbuf) {
    rs_job j = {.x = x->data, .y = y->data, .es = af_dtype_size(x->dtype),
                .nearest = plan->nearest, .extrapolation = (float)plan->extrapolation};
    int r = x->rank, f = r;
    bool resized[AF_MAX_RANK];
    for (int a = 0; a < r; a++) {
        const tn_rz_taps *t = plan->axis[a];
        resized[a] = !rs_identity(t, x->dims[a], y->dims[a]);
        if (resized[a] && f == r) f = a;
        for (int64_t o = 0; o < y->dims[a]; o++) j.outside = j.outside || t[o].outside;
    }
    int64_t slices = 1;
    for (int a = 0; a < f; a++) slices *= x->dims[a];
    if (f == r) { /* nothing resized: a copy */
        af_copy(y->data, x->data, (size_t)af_tensor_numel(x) * j.es);
        return AF_OK;
    }
    /* Passes innermost first; the view of axis a: axes before it still at input size, after it
     * already at output size. */
    j.slice_in = j.slice_out = 1;
    for (int a = f; a < r; a++) {
        j.slice_in *= x->dims[a];
        j.slice_out *= y->dims[a];
    }
    float *w = wbuf;
    for (int a = r - 1; a >= f; a--) {
        if (!resized[a]) continue;
        rs_axis *ax = &j.ax[j.naxes++];
        ax->a = a;
        ax->lin = x->dims[a];
        ax->lout = y->dims[a];
        ax->pre = ax->post = 1;
        for (int b = f; b < a; b++) ax->pre *= x->dims[b];
        for (int b = a + 1; b < r; b++) ax->post *= y->dims[b];
        ax->t = plan->axis[a];
        ax->w = w;
        for (int64_t o = 0; o < ax->lout; o++)
            for (int k = 0; k < 4; k++) w[4 * o + k] = k < ax->t[o].n ? (float)ax->t[o].w[k] : 0.0f;
        w += 4 * ax->lout;
    }
    /* Buffers hold every pass's output but the last. */
    j.mid = 1;
    for (int k = 0; k + 1 < j.naxes; k++) {
        int64_t m = j.ax[k].pre * j.ax[k].lout * j.ax[k].post;
        if (m > j.mid) j.mid = m;
    }
    j.srank = r - f;
    for (int a = f; a < r; a++) {
        j.sdims[a - f] = y->dims[a];
        j.st[a - f] = plan->axis[a];
    }
    int slots = af_exec_threads(ex);
    if (slots > AF_EXEC_MAX_SLOTS) slots = AF_EXEC_MAX_SLOTS;
    if (slots < 1) slots = 1;
    if (slots > 1 && slices < 4 * slots) { /* too few slices to share: pass by pass */
        j.scratch = j.naxes > 1 ? af_exec_scratch(ex, (size_t)(2 * slices * j.mid) * j.es) : NULL;
        if (j.naxes > 1 && !j.scratch) return AF_DECLINED;
        rs_passwise(&j, slices, ex);
        return AF_OK;
    }
    size_t need = (size_t)(2 * slots) * (size_t)j.mid * j.es;
    j.scratch = j.naxes > 1 ? af_exec_scratch(ex, need) : NULL;
    if (j.naxes > 1 && !j.scratch) return AF_DECLINED;
    double outs = (double)af_tensor_numel(y);
    af_exec_parallel(ex, slices, af_exec_work_ns(ex, 8.0 * outs * j.naxes, (double)j.es * 3.0 * outs),
                     rs_slices, &j);
    return AF_OK;
}

/* Tensors of up to this many elements in every pass (a bound that keeps sizes far from
 * overflow). */
enum { RS_MAX_MID = 1 << 30 };

af_status fast_resize(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || !out[0].data || t->rank < 1 || t->rank > AF_MAX_RANK || out[0].rank != t->rank ||
        out[0].dtype != t->dtype)
        return AF_DECLINED;
    size_t es = af_dtype_size(t->dtype);
    int64_t cin = af_tensor_numel(t), cout = af_tensor_numel(&out[0]);
    if (es == 0 || t->dtype == AF_DTYPE_STRING || cin < 0 || cout <= 0 || (cin > 0 && !t->data) ||
        (uint64_t)cin > (uint64_t)t->nbytes / es || (uint64_t)cout > (uint64_t)out[0].nbytes / es)
        return AF_DECLINED;
    af_error quiet = {0};
    tn_rz_plan plan;
    if (tn_resize_plan(n, in, &out[0], &plan, &quiet) != AF_OK) return AF_DECLINED;
    if (!plan.taps) return AF_DECLINED;
    /* Linear and cubic sum floats; nearest copies any element. Every buffer holds at most the
     * product of the larger of each axis's lengths. */
    bool ok = plan.nearest || t->dtype == AF_DTYPE_FLOAT;
    int64_t taps = 0, bound = 1;
    for (int a = 0; ok && a < t->rank; a++) {
        int64_t m = out[0].dims[a] > t->dims[a] ? out[0].dims[a] : t->dims[a];
        taps += out[0].dims[a];
        ok = af_mul_i64(bound, m, &bound) && bound <= RS_MAX_MID;
    }
    float *w = ok ? af_malloc((size_t)(4 * taps + 1) * sizeof(float)) : NULL;
    af_status st = w ? rs_run(&plan, t, &out[0], x, w) : AF_DECLINED;
    af_free(w);
    af_free(plan.taps);
    return st;
}
