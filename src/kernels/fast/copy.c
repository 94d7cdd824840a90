/* The fast data-movement kernels, for every dtype by element size: Pad (constant, reflect,
 * edge, wrap; negative pads crop; any rank). The output is walked as rows along its last dim
 * (the outer dims counted once per row, never per element), in parallel: a row is a memcpy of
 * the contiguous run of its source row, plus the few padded elements on either side from a
 * table of their sources computed once per call.
 *
 * Invariant: each output element gets exactly the bytes the reference kernel gives it (the
 * same plan and source-coordinate function, tn_pad_plan and tn_pad_src), so results are
 * bit-identical. Tensors are checked to hold their elements; what the plan refuses is
 * AF_DECLINED and the reference kernel reports it. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"

#include <string.h>

/* A tensor whose data holds its elements (of size es). */
static bool cp_ready(const af_tensor *t, size_t es) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && es > 0 && t->rank <= AF_MAX_RANK &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / es));
}

/* n copies of the element at v into y. */
static void cp_fill(char *y, const unsigned char *v, size_t es, int64_t n) {
    if (n <= 0) return;
    bool zero = true;
    for (size_t b = 0; b < es; b++) zero = zero && v[b] == 0;
    if (zero) {
        memset(y, 0, (size_t)n * es);
        return;
    }
    memcpy(y, v, es);
    int64_t done = 1; /* doubling copies */
    while (done < n) {
        int64_t k = done < n - done ? done : n - done;
        memcpy(y + (size_t)done * es, y, (size_t)k * es);
        done += k;
    }
}

/* ---- Pad --------------------------------------------------------------------------------------- */

typedef struct pad_job {
    const tn_pad_plan_t *p;
    const char *x;
    char *y;
    int rank;
    const int64_t *xd, *yd;
    int64_t xs[AF_MAX_RANK];
    int64_t w, xw;            /* last dim of y and x */
    int64_t lo, hi;           /* y's last-dim run [lo, hi) reads x[lo - pad .. hi - pad) */
    const int64_t *tab;       /* source (or -1: fill) of each last-dim coordinate of y */
} pad_job;

static void pad_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pad_job *j = ctx;
    const tn_pad_plan_t *p = j->p;
    size_t es = p->es;
    int outer = j->rank - 1;
    int64_t idx[AF_MAX_RANK];
    for (int64_t r = begin, d = outer - 1; d >= 0; d--) {
        idx[d] = r % j->yd[d];
        r /= j->yd[d];
    }
    for (int64_t r = begin; r < end; r++) {
        char *y = j->y + (size_t)(r * j->w) * es;
        int64_t off = 0;
        bool fill = false;
        for (int d = 0; d < outer && !fill; d++) {
            int64_t c = tn_pad_src(idx[d] - p->pads[d], j->xd[d], p->mode);
            fill = c < 0;
            off += c * j->xs[d];
        }
        if (fill) {
            cp_fill(y, p->fill, es, j->w);
        } else {
            const char *x = j->x + (size_t)off * es;
            int64_t pb = p->pads[outer];
            for (int64_t c = 0; c < j->lo; c++)
                memcpy(y + (size_t)c * es, j->tab[c] < 0 ? (const void *)p->fill : x + (size_t)j->tab[c] * es, es);
            if (j->hi > j->lo)
                memcpy(y + (size_t)j->lo * es, x + (size_t)(j->lo - pb) * es, (size_t)(j->hi - j->lo) * es);
            for (int64_t c = j->hi > j->lo ? j->hi : j->lo; c < j->w; c++)
                memcpy(y + (size_t)c * es, j->tab[c] < 0 ? (const void *)p->fill : x + (size_t)j->tab[c] * es, es);
        }
        for (int d = outer - 1; d >= 0; d--) {
            if (++idx[d] < j->yd[d]) break;
            idx[d] = 0;
        }
    }
}

af_status fast_pad(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)err;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || t->rank < 1 || t->rank > AF_MAX_RANK || out[0].rank != t->rank ||
        out[0].dtype != t->dtype || t->dtype == AF_DTYPE_STRING)
        return AF_DECLINED;
    size_t es = af_dtype_size(t->dtype);
    if (!cp_ready(t, es) || !cp_ready(&out[0], es)) return AF_DECLINED;
    af_error quiet = {0};
    tn_pad_plan_t p;
    if (tn_pad_plan(n, in, &out[0], &p, &quiet) != AF_OK || p.es != es) return AF_DECLINED;
    int r = t->rank;
    /* The output's dims must be the plan's (the shape function's). */
    for (int a = 0; a < r; a++)
        if (out[0].dims[a] != t->dims[a] + p.pads[a] + p.pads[a + r]) return AF_DECLINED;
    int64_t total = af_tensor_numel(&out[0]);
    if (total == 0) return AF_OK;
    pad_job j = {.p = &p, .x = t->data, .y = out[0].data, .rank = r, .xd = t->dims,
                 .yd = out[0].dims, .w = out[0].dims[r - 1], .xw = t->dims[r - 1]};
    if (j.w == 0) return AF_OK;
    af_strides(t, j.xs);
    int64_t pb = p.pads[r - 1];
    j.lo = pb < 0 ? 0 : pb;
    j.hi = pb + j.xw < j.w ? pb + j.xw : j.w;
    if (j.hi < j.lo) j.hi = j.lo;
    int64_t *tab = af_malloc((size_t)j.w * sizeof *tab);
    if (!tab) return AF_DECLINED;
    for (int64_t c = 0; c < j.w; c++) tab[c] = tn_pad_src(c - pb, j.xw, p.mode);
    j.tab = tab;
    af_exec_parallel(x, total / j.w, af_exec_work_ns(x, 0.0, 2.0 * (double)total * (double)es),
                     pad_rows, &j);
    af_free(tab);
    return AF_OK;
}
