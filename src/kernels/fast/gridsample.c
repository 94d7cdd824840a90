/* The fast GridSample (float32): for a group of output points the reference's taps
 * (ref/gridsample.h gs_taps: every mode, padding and align_corners, 1-D to 3-D) are found once
 * and kept as float weights and int32 offsets, then read for every channel, so the coordinate
 * arithmetic (in double, as the reference does it, so nearest picks the same pixel) is paid once
 * per point instead of once per point and channel. Both steps are shared between threads.
 *
 * Results agree with the reference's double sums within float rounding; nearest copies the pixel
 * (bit-identical). A point with fewer taps than its mode's full count (zeros padding at the
 * border) sums only the taps it has, so a NaN or infinity elsewhere in the plane never leaks into
 * it. Volumes of more than INT32_MAX elements and other dtypes are AF_DECLINED.
 *
 * Invariant: every offset in a table comes from gs_taps, so it lies inside the volume. */
#include "kernels/fast/fast.h"
#include "kernels/ref/gridsample.h"

/* Points are taken in groups whose table (offsets and weights) holds at most GSF_GROUP taps
 * (256 KB: it and a plane of a few hundred KB stay in L2), first the group's table, in parallel
 * over runs of points, then each channel's plane through it, in parallel over (channel, run of
 * GSF_RUN points). Channels outermost keep one plane in cache while the group reads it: a grid
 * that jumps about the image (a random flow) would otherwise touch every plane per point. */
enum { GSF_GROUP = 1 << 15, GSF_RUN = 512 };

typedef struct gsf_table {
    int32_t *off; /* [points][k] */
    float *w;     /* [points][k] */
    uint8_t *nt;  /* [points]: taps of each point (<= k) */
} gsf_table;

typedef struct gsf_job {
    const float *x, *g;
    float *y;
    gs_opts o;
    int64_t size[GS_MAX_DIMS]; /* spatial dims of X */
    int64_t n, c, vol, outs;   /* batch, channels, points per plane in and out */
    int k;                     /* taps of a point that has all of them */
    int64_t group;             /* points per group */
    /* the group in progress: batch item b, points [s0, s0 + cnt), runs of GSF_RUN points */
    int64_t b, s0, cnt, runs;
    gsf_table t;
} gsf_job;

/* Fills the table for points [begin, end) of the group (in runs). */
static void gsf_fill(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gsf_job *j = ctx;
    int r = j->o.r;
    int64_t off[GS_MAX_TAPS];
    double w[GS_MAX_TAPS], gp[GS_MAX_DIMS];
    int64_t i1 = end * GSF_RUN < j->cnt ? end * GSF_RUN : j->cnt;
    for (int64_t i = begin * GSF_RUN; i < i1; i++) {
        const float *g = j->g + (j->b * j->outs + j->s0 + i) * r;
        for (int d = 0; d < r; d++) gp[d] = g[d];
        int n = gs_taps(&j->o, j->size, gp, off, w);
        j->t.nt[i] = (uint8_t)n;
        for (int q = 0; q < n; q++) {
            j->t.off[i * j->k + q] = (int32_t)off[q];
            j->t.w[i * j->k + q] = (float)w[q];
        }
    }
}

/* One plane's cnt points through the table; k is a constant in each instance (gsf_points), so
 * the full points' sum is unrolled. */
static inline __attribute__((always_inline)) void gsf_plane(const float *restrict p, const gsf_table *t,
                                                            int64_t cnt, const int k, float *restrict y) {
    for (int64_t i = 0; i < cnt; i++) {
        const int32_t *o = t->off + i * k;
        const float *w = t->w + i * k;
        int n = t->nt[i];
        float acc = 0.0f;
        if (n == k) {
            acc = w[0] * p[o[0]];
            for (int q = 1; q < k; q++) acc += w[q] * p[o[q]];
        } else {
            for (int q = 0; q < n; q++) acc += w[q] * p[o[q]];
        }
        y[i] = acc;
    }
}

static void gsf_points(const float *p, const gsf_table *t, int64_t cnt, int k, float *y) {
    switch (k) {
    case 1: gsf_plane(p, t, cnt, 1, y); break;
    case 2: gsf_plane(p, t, cnt, 2, y); break;
    case 4: gsf_plane(p, t, cnt, 4, y); break;
    case 8: gsf_plane(p, t, cnt, 8, y); break;
    case 16: gsf_plane(p, t, cnt, 16, y); break;
    default: gsf_plane(p, t, cnt, k, y); break;
    }
}

/* Items are (channel, run of points) of the group, channel-major. */
static void gsf_planes(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gsf_job *j = ctx;
    for (int64_t it = begin; it < end; it++) {
        int64_t ch = it / j->runs, i0 = it % j->runs * GSF_RUN;
        int64_t cnt = j->cnt - i0 < GSF_RUN ? j->cnt - i0 : GSF_RUN;
        gsf_table t = {j->t.off + i0 * j->k, j->t.w + i0 * j->k, j->t.nt + i0};
        int64_t plane = j->b * j->c + ch;
        gsf_points(j->x + plane * j->vol, &t, cnt, j->k, j->y + plane * j->outs + j->s0 + i0);
    }
}

static bool gsf_ready(const af_tensor *t, int rank) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && t->dtype == AF_DTYPE_FLOAT && t->rank == rank &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / sizeof(float)));
}

/* The job of a float32 node whose shapes agree, or false. */
static bool gsf_setup(const af_node *n, const af_tensor *const *in, af_tensor *out, gsf_job *j) {
    af_error quiet = {0};
    if (n->nin < 2 || !in[0] || !in[1] || gs_prepare(n, in, &j->o, &quiet) != AF_OK || j->o.r < 1)
        return false;
    const af_tensor *x = in[0], *g = in[1];
    int rank = j->o.r + 2;
    if (!gsf_ready(x, rank) || !gsf_ready(g, rank) || !gsf_ready(&out[0], rank) ||
        g->dims[0] != x->dims[0] || g->dims[rank - 1] != j->o.r || out[0].dims[0] != x->dims[0] ||
        out[0].dims[1] != x->dims[1])
        return false;
    j->vol = j->outs = 1;
    for (int d = 0; d < j->o.r; d++) {
        if (out[0].dims[2 + d] != g->dims[1 + d]) return false;
        j->size[d] = x->dims[2 + d];
        j->vol *= x->dims[2 + d];
        j->outs *= g->dims[1 + d];
    }
    j->x = x->data, j->g = g->data, j->y = out[0].data;
    j->n = x->dims[0], j->c = x->dims[1];
    j->k = j->o.mode == GS_NEAREST ? 1 : j->o.mode == GS_LINEAR ? 1 << j->o.r : 1 << 2 * j->o.r;
    j->group = GSF_GROUP / j->k;
    return j->vol <= INT32_MAX;
}

af_status fast_grid_sample(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                           af_error *err) {
    (void)err;
    gsf_job j;
    if (!gsf_setup(n, in, out, &j)) return AF_DECLINED;
    if (j.n == 0 || j.c == 0 || j.outs == 0) return AF_OK;
    int64_t most = j.outs < j.group ? j.outs : j.group;
    char *buf = af_exec_scratch(x, (size_t)most * ((size_t)j.k * (sizeof(int32_t) + sizeof(float)) + 1));
    if (!buf) return AF_DECLINED;
    j.t.off = (int32_t *)buf;
    j.t.w = (float *)(buf + (size_t)(most * j.k) * sizeof(int32_t));
    j.t.nt = (uint8_t *)(buf + (size_t)(most * j.k) * (sizeof(int32_t) + sizeof(float)));
    for (j.b = 0; j.b < j.n; j.b++)
        for (j.s0 = 0; j.s0 < j.outs; j.s0 += j.cnt) {
            j.cnt = j.outs - j.s0 < j.group ? j.outs - j.s0 : j.group;
            j.runs = (j.cnt + GSF_RUN - 1) / GSF_RUN;
            double pts = (double)j.cnt, taps = pts * (double)j.k * (double)j.c;
            af_exec_parallel(x, j.runs, af_exec_work_ns(x, 60.0 * pts * j.o.r, 8.0 * pts * j.k), gsf_fill, &j);
            af_exec_parallel(x, j.c * j.runs, af_exec_work_ns(x, 2.0 * taps, 4.0 * taps), gsf_planes, &j);
        }
    return AF_OK;
}
