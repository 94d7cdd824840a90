/* NCHW pooling of every rank (1-D to 3-D windows, float32): MaxPool (dilations, pads,
 * ceil_mode; not its Indices output), AveragePool (count_include_pad), LpPool, and the Global
 * forms; plus the entries of dispatch.c's pooling rows, which send the channels-last form
 * (channels_last = 1, the layout pass's) to pool.c and the plain form here.
 *
 * A window's max or sum is separable: the pool over (d, h, w) is the pool over d, then over h,
 * then over w, and so is AveragePool's divisor, the product of the taps counted on each axis
 * (inside X, or inside the padded X with count_include_pad; an axis with none gives 0, as the
 * reference's empty window does). So the kernel runs one 1-D pass per spatial axis, outer
 * axes first (each shrinks what the next reads), a plane (n, c) at a time with its
 * intermediates in cache when there are planes enough for the threads, else each pass over the
 * whole tensor in parallel: along an outer axis a pass folds whole
 * contiguous rows of the inner axes (vec reduce_acc), along the last axis it pools each line
 * (vec pool_line: vectors of outputs at strides 1 and 2). LpPool raises |x| to p before the
 * passes and takes the p-th root after them. Sums add in another order than the reference's
 * window walk (float rounding); maxima are exact (a NaN may land elsewhere).
 *
 * Invariant: the geometry is the reference's (nn_window_init through the reference shape
 * function's checks), every tensor is checked to hold its elements, and whatever the kernel
 * does not take (other dtypes, MaxPool's Indices, p other than 1 or 2 for the Global form) is
 * AF_DECLINED before anything is written. */
#include "kernels/fast/fast.h"
#include "kernels/ref/nn_common.h"
#include "kernels/ref/ref.h"
#include "kernels/simd/vec.h"

#include <math.h>
#include <string.h>

typedef enum pkind { PK_MAX, PK_AVG, PK_LP } pkind;

static bool ready(const af_tensor *t) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count > 0 && t->dtype == AF_DTYPE_FLOAT && t->data &&
           (uint64_t)count <= (uint64_t)t->nbytes / sizeof(float);
}

/* LpPool's p when it is 1 or 2 (an int since opset 2, a float in opset 1); 0 otherwise. */
static int lp_p(const af_node *n) {
    const af_attr *p = af_node_attr(n, "p");
    double v = !p ? 2.0 : p->type == AF_ATTR_FLOAT ? p->f : (double)p->i;
    return v == 1.0 ? 1 : v == 2.0 ? 2 : 0;
}

/* ---- one pass: pool axis `len_in` -> `len_out` of X viewed as [outer, len, inner] ---------- */

typedef struct pass_job {
    const float *x;
    float *y;
    int64_t outer, len_in, len_out, inner;
    int64_t k, s, d, pb;
    int max;
    const float *scale; /* [len_out] or NULL */
} pass_job;

/* Outer-axis pass: items are (outer, o); each folds the rows of the taps inside. */
static void rows_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pass_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / j->len_out, o = it % j->len_out;
        const float *x = j->x + b * j->len_in * j->inner;
        float *y = j->y + it * j->inner;
        bool first = true;
        for (int64_t t = 0; t < j->k; t++) {
            int64_t i = o * j->s - j->pb + t * j->d;
            if (i < 0 || i >= j->len_in) continue;
            if (first) af_copy(y, x + i * j->inner, (size_t)j->inner * sizeof(float));
            else v->reduce_acc(j->max ? AF_VRED_MAX : AF_VRED_SUM, x + i * j->inner, j->inner, y, NULL);
            first = false;
        }
        if (first) {
            for (int64_t i = 0; i < j->inner; i++) y[i] = j->max ? -INFINITY : 0.0f;
        } else if (j->scale) {
            v->scale_rows(y, &j->scale[o], 1, j->inner, y);
        }
    }
}

/* Last-axis pass: items are lines. */
static void lines_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pass_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t b = begin; b < end; b++)
        v->pool_line(j->x + b * j->len_in, j->len_in, j->y + b * j->len_out, j->len_out, j->k, j->s,
                     j->d, j->pb, j->max, j->scale);
}

/* Taps of output o of padded axis i inside [lo, hi) (of input indices). */
static int64_t taps_in(const nn_window *w, int i, int64_t o, int64_t lo, int64_t hi) {
    int64_t c = 0;
    for (int64_t t = 0; t < w->k[i]; t++) {
        int64_t p = o * w->s[i] - w->pb[i] + t * w->d[i];
        c += p >= lo && p < hi;
    }
    return c;
}

/* ---- the kernel ------------------------------------------------------------------------------ */

typedef struct pool_plan {
    nn_window w;
    int nsp, first; /* spatial axes; first padded index of a real one */
    int64_t planes; /* N * C */
    pkind kind;
    int max, include_pad, p;
} pool_plan;

/* An axis whose pass would copy its input (one tap, stride 1, no padding). */
static bool identity_axis(const nn_window *w, int i) {
    return w->k[i] == 1 && w->s[i] == 1 && w->pb[i] == 0 && w->out[i] == w->in[i];
}

static void elementwise_p(const float *x, float *y, int64_t count, int p) {
    af_vec()->unary(p == 1 ? AF_VUN_ABS : AF_VUN_SQUARE, 0.0f, 0.0f, x, y, count);
}

/* Elements of X after the passes over the first `done` real axes. */
static int64_t size_after(const pool_plan *pp, int done) {
    int64_t s = pp->planes;
    for (int a = 0; a < pp->nsp; a++) {
        int i = pp->first + a;
        s *= a < done ? pp->w.out[i] : pp->w.in[i];
    }
    return s;
}

/* The passes over `planes` planes from x to y through buf[0], buf[1] (and lp, LpPool's |x|^p
 * of the planes): each pass parallel on ex, or, with ex NULL, all on the caller. scales[q]:
 * pass q's AveragePool divisors. */
typedef struct passes {
    const pool_plan *pp;
    int todo[NN_MAXSP], npass;
    const float *scales[NN_MAXSP];
} passes;

static void run_planes(const passes *ps, const float *x, float *y, int64_t planes, float *buf0,
                       float *buf1, float *lp, af_exec *ex) {
    const pool_plan *pp = ps->pp;
    const nn_window *w = &pp->w;
    int64_t in_count = planes * (size_after(pp, 0) / pp->planes);
    int64_t out_count = planes * (size_after(pp, pp->nsp) / pp->planes);
    float *buf[2] = {buf0, buf1};
    const float *src = x;
    if (pp->kind == PK_LP) {
        elementwise_p(x, ps->npass ? lp : y, in_count, pp->p);
        src = lp;
    } else if (!ps->npass) {
        af_copy(y, x, (size_t)in_count * sizeof(float));
    }
    for (int q = 0; q < ps->npass; q++) {
        int a = ps->todo[q], i = pp->first + a;
        pass_job j = {src, q == ps->npass - 1 ? y : buf[q & 1], planes, w->in[i], w->out[i], 1,
                      w->k[i], w->s[i], w->d[i], w->pb[i], pp->max, ps->scales[q]};
        for (int b = 0; b < a; b++) j.outer *= w->out[pp->first + b];
        for (int b = a + 1; b < pp->nsp; b++) j.inner *= w->in[pp->first + b];
        int64_t items = j.inner == 1 ? j.outer : j.outer * j.len_out;
        af_range_fn fn = j.inner == 1 ? lines_range : rows_range;
        if (ex) {
            int64_t moved = j.outer * (j.len_in + j.len_out) * j.inner;
            double ns = af_exec_work_ns(ex, (double)(j.outer * j.len_out * j.inner * j.k), 4.0 * (double)moved);
            af_exec_parallel(ex, items, ns, fn, &j);
        } else {
            fn(&j, 0, 0, items);
        }
        src = j.y;
    }
    if (pp->kind == PK_LP && pp->p == 2) af_vec()->unary(AF_VUN_SQRT, 0.0f, 0.0f, y, y, out_count);
}

typedef struct plane_job {
    const passes *ps;
    const float *x;
    float *y, *scratch;
    int64_t in_plane, out_plane, per_slot, big;
} plane_job;

/* Items are planes: every pass of a plane while it is in cache, in the slot's buffers. */
static void planes_range(void *ctx, int slot, int64_t begin, int64_t end) {
    const plane_job *j = ctx;
    float *mine = j->scratch + (int64_t)slot * j->per_slot;
    for (int64_t p = begin; p < end; p++)
        run_planes(j->ps, j->x + p * j->in_plane, j->y + p * j->out_plane, 1, mine, mine + j->big,
                   mine + 2 * j->big, NULL);
}

static af_status run_passes(const pool_plan *pp, const float *x, float *y, af_exec *ex) {
    const nn_window *w = &pp->w;
    passes ps = {pp, {0}, 0, {NULL}};
    for (int a = 0; a < pp->nsp; a++)
        if (!identity_axis(w, pp->first + a)) ps.todo[ps.npass++] = a;
    int64_t in_count = size_after(pp, 0), out_count = size_after(pp, pp->nsp), big = 0;
    for (int a = 0; a <= pp->nsp; a++) big = size_after(pp, a) > big ? size_after(pp, a) : big;
    /* An intermediate far above X and Y (one axis padded much wider while another shrinks):
     * the separable form does not pay, the reference's window walk runs it. */
    if (big > 4 * (in_count + out_count)) return AF_DECLINED;
    /* Enough planes for every thread: a plane at a time, its intermediates in the slot's
     * buffers (in cache); else each pass over the whole tensor, in parallel. */
    int64_t slots = af_exec_threads(ex) < AF_EXEC_MAX_SLOTS ? af_exec_threads(ex) : AF_EXEC_MAX_SLOTS;
    bool by_plane = pp->planes >= 4 * slots;
    int64_t bigp = big / pp->planes, inp = in_count / pp->planes;
    int64_t per_slot = 2 * bigp + (pp->kind == PK_LP ? inp : 0);
    int64_t whole = 2 * big + (pp->kind == PK_LP ? in_count : 0), divisors = 0;
    for (int q = 0; q < ps.npass; q++) divisors += w->out[pp->first + ps.todo[q]];
    size_t floats = (size_t)((by_plane ? slots * per_slot : whole) + divisors);
    float *scratch = af_exec_scratch(ex, floats * sizeof(float));
    if (!scratch) return AF_DECLINED; /* nothing written: the reference needs no scratch */
    float *scale = scratch + (by_plane ? slots * per_slot : whole);
    for (int q = 0; q < ps.npass && pp->kind == PK_AVG; q++) {
        int i = pp->first + ps.todo[q];
        int64_t lo = pp->include_pad ? -w->pb[i] : 0, hi = w->in[i] + (pp->include_pad ? w->pe[i] : 0);
        for (int64_t o = 0; o < w->out[i]; o++) {
            int64_t c = taps_in(w, i, o, lo, hi);
            scale[o] = c > 0 ? 1.0f / (float)c : 0.0f;
        }
        ps.scales[q] = scale;
        scale += w->out[i];
    }
    if (!by_plane) {
        run_planes(&ps, x, y, pp->planes, scratch, scratch + big, scratch + 2 * big, ex);
        return AF_OK;
    }
    plane_job j = {&ps, x, y, scratch, inp, out_count / pp->planes, per_slot, bigp};
    int64_t taps = 1;
    for (int a = 0; a < pp->nsp; a++) taps += w->k[pp->first + a];
    af_exec_parallel(ex, pp->planes,
                     af_exec_work_ns(ex, (double)(out_count * taps), 8.0 * (double)(in_count + out_count)),
                     planes_range, &j);
    return AF_OK;
}

static af_status pool_nchw(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err, pkind kind) {
    (void)err; /* whatever is wrong with the node, the reference kernel reports */
    const af_tensor *x = n->nin == 1 ? in[0] : NULL;
    if (!x || !ready(x) || !ready(&out[0]) || x->rank < 3 || x->rank > 2 + NN_MAXSP ||
        (n->nout > 1 && n->out[1]) || (kind == PK_LP && !lp_p(n)))
        return AF_DECLINED;
    /* the reference's shape function checks the attributes and gives the output's dims */
    af_tensor t[2]; /* MaxPool's shape function types an Indices slot too */
    memset(t, 0, sizeof t);
    af_error scratch_err;
    if (af_ref_ops[n->op].shape(n, in, t, &scratch_err) != AF_OK || t[0].rank != out[0].rank)
        return AF_DECLINED;
    for (int i = 0; i < t[0].rank; i++)
        if (t[0].dims[i] != out[0].dims[i]) return AF_DECLINED;
    pool_plan pp;
    memset(&pp, 0, sizeof pp);
    const int64_t *ks = NULL;
    pp.nsp = af_attr_ints(n, "kernel_shape", &ks);
    if (pp.nsp != x->rank - 2 ||
        nn_window_init(n, x, ks, pp.nsp, af_attr_int(n, "ceil_mode", 0) != 0, &pp.w, &scratch_err))
        return AF_DECLINED;
    pp.first = NN_MAXSP - pp.nsp;
    pp.planes = x->dims[0] * x->dims[1];
    pp.kind = kind;
    pp.max = kind == PK_MAX;
    pp.include_pad = af_attr_int(n, "count_include_pad", 0) != 0;
    pp.p = kind == PK_LP ? lp_p(n) : 0;
    return run_passes(&pp, x->data, out[0].data, ex);
}

/* ---- global pooling: a fold per (n, c) plane ---------------------------------------------- */

typedef struct gp_job {
    const float *x;
    float *y;
    int64_t inner;
    int fold;
    bool mean, root;
} gp_job;

static void gp_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gp_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t p = begin; p < end; p++) {
        float s = v->reduce_run(j->fold, j->x + p * j->inner, j->inner, 0.0f);
        j->y[p] = j->mean ? s / (float)j->inner : j->root ? sqrtf(s) : s;
    }
}

static af_status gpool_nchw(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, pkind kind) {
    const af_tensor *x = n->nin == 1 ? in[0] : NULL;
    if (!x || !ready(x) || !ready(&out[0]) || x->rank < 2 || (kind == PK_LP && !lp_p(n)))
        return AF_DECLINED;
    int64_t planes = x->dims[0] * x->dims[1], total = af_tensor_numel(x);
    if (planes < 1 || af_tensor_numel(&out[0]) != planes || out[0].rank != x->rank) return AF_DECLINED;
    int p = kind == PK_LP ? lp_p(n) : 0;
    gp_job j = {x->data, out[0].data, total / planes,
                kind == PK_MAX ? AF_VRED_MAX : p == 1 ? AF_VRED_ABS : p == 2 ? AF_VRED_SQ : AF_VRED_SUM,
                kind == PK_AVG, p == 2};
    af_exec_parallel(ex, planes, af_exec_work_ns(ex, (double)total, 4.0 * (double)total), gp_range, &j);
    return AF_OK;
}

/* ---- dispatch entries: the channels-last form to pool.c, the plain one here ----------------- */

static bool channels_last(const af_node *n) { return af_attr_int(n, "channels_last", 0) != 0; }

af_status fast_maxpool_any(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *x, af_error *err) {
    return channels_last(n) ? fast_maxpool(n, in, out, x, err) : pool_nchw(n, in, out, x, err, PK_MAX);
}

af_status fast_avgpool_any(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *x, af_error *err) {
    return channels_last(n) ? fast_avgpool(n, in, out, x, err) : pool_nchw(n, in, out, x, err, PK_AVG);
}

af_status fast_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    return pool_nchw(n, in, out, x, err, PK_LP);
}

af_status fast_global_maxpool_any(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_exec *x, af_error *err) {
    return channels_last(n) ? fast_global_maxpool(n, in, out, x, err) : gpool_nchw(n, in, out, x, PK_MAX);
}

af_status fast_global_avgpool_any(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_exec *x, af_error *err) {
    return channels_last(n) ? fast_global_avgpool(n, in, out, x, err) : gpool_nchw(n, in, out, x, PK_AVG);
}

af_status fast_global_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *x, af_error *err) {
    (void)err;
    return gpool_nchw(n, in, out, x, PK_LP);
}
