/* Fast detection kernels: NonMaxSuppression and RoiAlign.
 *
 * NonMaxSuppression: the reference's greedy selection (kernels/ref/detect.c) with the boxes
 * converted once per image into arrays of corners and areas, and each candidate tested only
 * against the kept boxes that a grid along the first coordinate says may overlap it. A
 * detector's batched NMS offsets boxes per class and keeps most of them (SSDlite's is 27,000
 * candidates in one class): testing every kept box made the selection quadratic, 1 s of
 * SSDlite's run, while each candidate overlaps only the few boxes of its own class.
 *
 * Invariant: the same selection as the reference, bit for bit: IoU is computed in double with
 * the reference's formula, and the grid only skips pairs that cannot overlap; boxes with a
 * coordinate that is not finite (where min/max would differ from fmin and fmax, and an IoU could
 * be NaN) and a negative or NaN threshold (which suppresses boxes that do not overlap) are left
 * to the reference. RoiAlign's invariant is with its kernel below. */
#include "kernels/fast/fast.h"
#include "kernels/ref/nn_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A kept box spanning more grid cells than this is tested against every candidate, and a
 * candidate spanning more tests every kept box, so that a few big boxes cost no more than the
 * plain loop. The cell width is the candidates' mean height, so most boxes span 1 to 3. */
enum { NMS_SPAN = 8 };

typedef struct nms_boxes {
    double *y0, *x0, *y1, *x1, *area; /* [count] each */
} nms_boxes;

/* The kept boxes of one class, listed in the cells of a uniform grid along y that their
 * [y0, y1] spans. Exact: when two boxes overlap (ih > 0) the point max(y0, a0) lies in both
 * spans, and cell() is monotone, so that point's cell is in both ranges of cells. */
typedef struct nms_grid {
    double lo, inv_w;
    int64_t ncell;
    int64_t *head;       /* [ncell]: the cell's first entry, -1 when empty */
    int64_t *next, *box; /* [cap] entries: the next entry of the cell, the kept box */
    int64_t used, cap;
    int64_t *wide, nwide; /* kept boxes spanning more than NMS_SPAN cells */
} nms_grid;

/* Image b's boxes as corners (ymin, xmin, ymax, xmax) and areas; false on a coordinate that is
 * not finite. */
static bool load_boxes(const float *bx, int64_t ns, bool center, nms_boxes *o) {
    for (int64_t i = 0; i < ns; i++) {
        double v[4] = {bx[4 * i], bx[4 * i + 1], bx[4 * i + 2], bx[4 * i + 3]};
        if (!isfinite(v[0]) || !isfinite(v[1]) || !isfinite(v[2]) || !isfinite(v[3])) return false;
        double b[4];
        if (center) {
            b[0] = v[1] - v[3] / 2, b[1] = v[0] - v[2] / 2;
            b[2] = v[1] + v[3] / 2, b[3] = v[0] + v[2] / 2;
        } else {
            b[0] = v[0] < v[2] ? v[0] : v[2], b[1] = v[1] < v[3] ? v[1] : v[3];
            b[2] = v[0] < v[2] ? v[2] : v[0], b[3] = v[1] < v[3] ? v[3] : v[1];
        }
        o->y0[i] = b[0], o->x0[i] = b[1], o->y1[i] = b[2], o->x1[i] = b[3];
        o->area[i] = (b[2] - b[0]) * (b[3] - b[1]);
    }
    return true;
}

/* Can box i overlap anything? Not when a side is empty or inverted (a center-form box with
 * negative sizes has a positive area): then ih or iw is at most that side, never > 0. */
static bool live(const nms_boxes *bs, int64_t i) {
    return bs->y1[i] > bs->y0[i] && bs->x1[i] > bs->x0[i] && bs->area[i] > 0;
}

static int64_t cell(const nms_grid *g, double v) {
    double f = (v - g->lo) * g->inv_w;
    if (!(f >= 0)) return 0;
    return f >= (double)g->ncell ? g->ncell - 1 : (int64_t)f;
}

/* Size the grid for one class's candidates: its span of y, cells as tall as the mean live box,
 * at most one cell per live candidate. */
static void grid_reset(nms_grid *g, const nms_boxes *all, const nms_cand *cand, int64_t nc) {
    double lo = INFINITY, hi = -INFINITY, sumh = 0;
    int64_t nlive = 0;
    for (int64_t c = 0; c < nc; c++) {
        int64_t i = cand[c].box;
        if (!live(all, i)) continue;
        lo = all->y0[i] < lo ? all->y0[i] : lo;
        hi = all->y1[i] > hi ? all->y1[i] : hi;
        sumh += all->y1[i] - all->y0[i];
        nlive++;
    }
    g->lo = nlive ? lo : 0, g->inv_w = 0, g->ncell = 1;
    if (nlive) {
        double w = sumh / (double)nlive, ext = hi - lo;
        if (ext / w > (double)nlive) w = ext / (double)nlive;
        double cells = ext / w + 1;
        g->ncell = cells < (double)(nlive + 1) ? (int64_t)cells : nlive + 1;
        g->inv_w = 1 / w;
    }
    for (int64_t i = 0; i < g->ncell; i++) g->head[i] = -1;
    g->used = 0, g->nwide = 0;
}

/* List kept box t (the candidate's box i) in the cells it spans; false when out of memory. */
static bool grid_add(nms_grid *g, const nms_boxes *all, int64_t i, int64_t t) {
    if (!live(all, i)) return true; /* it cannot suppress anything */
    int64_t c0 = cell(g, all->y0[i]), c1 = cell(g, all->y1[i]);
    if (c1 - c0 >= NMS_SPAN) {
        g->wide[g->nwide++] = t;
        return true;
    }
    if (g->used + (c1 - c0 + 1) > g->cap) {
        int64_t ncap = g->cap ? g->cap * 2 : 1024;
        int64_t *nx = af_realloc(g->next, (size_t)ncap * sizeof(int64_t));
        if (!nx) return false;
        g->next = nx;
        int64_t *bo = af_realloc(g->box, (size_t)ncap * sizeof(int64_t));
        if (!bo) return false;
        g->box = bo, g->cap = ncap;
    }
    for (int64_t c = c0; c <= c1; c++) {
        g->box[g->used] = t, g->next[g->used] = g->head[c];
        g->head[c] = g->used++;
    }
    return true;
}

/* Does candidate box i overlap kept box t by more than th? The reference's IoU test. */
static bool hits(const nms_boxes *all, int64_t i, const nms_boxes *kept, int64_t t, double th) {
    double a0 = all->y0[i], a1 = all->x0[i], a2 = all->y1[i], a3 = all->x1[i], aa = all->area[i];
    double ih = (a2 < kept->y1[t] ? a2 : kept->y1[t]) - (a0 > kept->y0[t] ? a0 : kept->y0[t]);
    double iw = (a3 < kept->x1[t] ? a3 : kept->x1[t]) - (a1 > kept->x0[t] ? a1 : kept->x0[t]);
    double ab = kept->area[t], inter = ih * iw, iou = inter / (aa + ab - inter);
    return (ih > 0) & (iw > 0) & (ab > 0) & (iou > th);
}

/* Does candidate box i overlap any kept box by more than th? */
static bool suppressed(const nms_boxes *all, int64_t i, const nms_boxes *kept, int64_t taken,
                       const nms_grid *g, double th) {
    if (!live(all, i)) return false; /* the reference's IoU is 0 against every box */
    int64_t c0 = cell(g, all->y0[i]), c1 = cell(g, all->y1[i]);
    if (c1 - c0 >= NMS_SPAN) {
        for (int64_t t = 0; t < taken; t++)
            if (hits(all, i, kept, t, th)) return true;
        return false;
    }
    for (int64_t c = c0; c <= c1; c++)
        for (int64_t e = g->head[c]; e >= 0; e = g->next[e])
            if (hits(all, i, kept, g->box[e], th)) return true;
    for (int64_t w = 0; w < g->nwide; w++)
        if (hits(all, i, kept, g->wide[w], th)) return true;
    return false;
}

static void kept_set(nms_boxes *kept, int64_t t, const nms_boxes *all, int64_t c) {
    kept->y0[t] = all->y0[c], kept->x0[t] = all->x0[c], kept->y1[t] = all->y1[c];
    kept->x1[t] = all->x1[c], kept->area[t] = all->area[c];
}

/* A scalar input's value (the reference reads them the same way), or dflt when absent. */
static double scalar(const af_tensor *t, double dflt) {
    return t && af_tensor_numel(t) > 0 ? af_tensor_get_double(t, 0) : dflt;
}

/* Append (b, k, box) to the selection; false when out of memory. */
static bool sel_push(int64_t **sel, int64_t *count, int64_t *cap, int64_t b, int64_t k, int64_t box) {
    if (*count == *cap) {
        int64_t ncap = *cap ? *cap * 2 : 64;
        int64_t *p = af_realloc(*sel, (size_t)ncap * 3 * sizeof(int64_t));
        if (!p) return false;
        *sel = p, *cap = ncap;
    }
    int64_t *r = *sel + 3 * (*count)++;
    r[0] = b, r[1] = k, r[2] = box;
    return true;
}

af_status fast_nms(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)x;
    const af_tensor *bx = nn_in(n, in, 0), *sc = nn_in(n, in, 1), *mo = nn_in(n, in, 2);
    const af_tensor *it = nn_in(n, in, 3), *stt = nn_in(n, in, 4);
    if (!bx || !sc || bx->dtype != AF_DTYPE_FLOAT || sc->dtype != AF_DTYPE_FLOAT ||
        bx->rank != 3 || sc->rank != 3 || !af_tensor_known(bx) || !af_tensor_known(sc) ||
        bx->dims[2] != 4 || bx->dims[0] != sc->dims[0] || bx->dims[1] != sc->dims[2] ||
        (mo && (mo->dtype != AF_DTYPE_INT64 || mo->rank > 1)) || (it && it->rank > 1) ||
        (stt && stt->rank > 1) || (it && !nn_is_float(it->dtype)) ||
        (stt && !nn_is_float(stt->dtype)))
        return AF_DECLINED;
    for (int i = 0; i < n->nin && i < 5; i++)
        if (in[i] && (!af_tensor_known(in[i]) || (af_tensor_numel(in[i]) > 0 && !in[i]->data)))
            return AF_DECLINED;
    int64_t maxo = mo && af_tensor_numel(mo) > 0 ? ((const int64_t *)mo->data)[0] : 0;
    double iou_th = scalar(it, 0.0), score_th = scalar(stt, 0.0);
    if (!(iou_th >= 0)) return AF_DECLINED;
    bool has_st = stt && af_tensor_numel(stt) > 0, center = af_attr_int(n, "center_point_box", 0) != 0;
    int64_t nb = bx->dims[0], ns = bx->dims[1], nk = sc->dims[1], m = ns > 0 ? ns : 1;
    double *mem = af_malloc((size_t)m * 10 * sizeof(double));
    nms_cand *cand = af_malloc((size_t)m * sizeof *cand);
    nms_grid g = {0};
    g.head = af_malloc((size_t)(m + 1) * sizeof(int64_t));
    g.wide = af_malloc((size_t)m * sizeof(int64_t));
    int64_t *sel = NULL, count = 0, cap = 0;
    af_status st = AF_OK;
    if (!mem || !cand || !g.head || !g.wide) st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    nms_boxes all = {0}, kept = {0};
    if (st == AF_OK) {
        all = (nms_boxes){mem, mem + m, mem + 2 * m, mem + 3 * m, mem + 4 * m};
        kept = (nms_boxes){mem + 5 * m, mem + 6 * m, mem + 7 * m, mem + 8 * m, mem + 9 * m};
    }
    for (int64_t b = 0; st == AF_OK && b < nb; b++) {
        if (!load_boxes((const float *)bx->data + b * ns * 4, ns, center, &all)) {
            st = AF_DECLINED;
            break;
        }
        for (int64_t k = 0; st == AF_OK && k < nk; k++) {
            const float *s = (const float *)sc->data + (b * nk + k) * ns;
            int64_t nc = 0, taken = 0;
            for (int64_t i = 0; i < ns; i++)
                if (!has_st || (double)s[i] > score_th) cand[nc++] = (nms_cand){s[i], i};
            qsort(cand, (size_t)nc, sizeof *cand, nms_cmp); /* the reference's order */
            grid_reset(&g, &all, cand, nc);
            for (int64_t c = 0; c < nc && taken < maxo && st == AF_OK; c++) {
                int64_t i = cand[c].box;
                if (suppressed(&all, i, &kept, taken, &g, iou_th)) continue;
                kept_set(&kept, taken, &all, i);
                if (!grid_add(&g, &all, i, taken++) || !sel_push(&sel, &count, &cap, b, k, i))
                    st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
            }
        }
    }
    if (st == AF_OK) {
        int64_t dims[2] = {count, 3};
        af_tensor_release(&out[0]);
        af_tensor_set_type(&out[0], AF_DTYPE_INT64, 2, dims);
        st = af_tensor_alloc(&out[0], err);
        if (st == AF_OK && count > 0) memcpy(out[0].data, sel, (size_t)count * 3 * sizeof(int64_t));
    }
    af_free(mem);
    af_free(cand);
    af_free(g.head);
    af_free(g.wide);
    af_free(g.next);
    af_free(g.box);
    af_free(sel);
    return st;
}

/* ---- RoiAlign -------------------------------------------------------------------------------- */

/* Fast RoiAlign: the reference's arithmetic in double, in its order (so the same bits), with
 * what depends only on the roi (each sample's four source offsets and bilinear weights) worked
 * out once per roi and block of channels instead of once per channel, and the rois and channel
 * blocks shared between threads. Rois, the scale and the sample counts are checked first: a
 * coordinate that is not finite (the reference's sample position would be NaN), a batch index out
 * of range, or more samples per roi than RA_MAX_SAMPLES is declined to the reference. */

enum { RA_CBLK = 16, RA_MAX_SAMPLES = 1 << 15 };

/* One sample: the offsets of its four source pixels in a plane and their weights, or outside
 * (the reference's sample is then 0). */
typedef struct ra_sample {
    int64_t o[4];
    double w[4];
    bool in;
} ra_sample;

/* One roi, as the reference derives it. */
typedef struct ra_roi {
    int64_t b, ny, nx;
    double x1, y1, bh, bw;
} ra_roi;

typedef struct ra_job {
    const float *x;
    float *y;
    const ra_roi *rois;
    ra_sample *tabs; /* maxs per slot */
    int64_t c, h, w, oh, ow, nblk, maxs;
    bool max_mode;
} ra_job;

/* The reference's sample at (yy, xx) of an h x w plane: its source offsets and weights. */
static ra_sample ra_at(double yy, double xx, int64_t h, int64_t w) {
    ra_sample s = {{0, 0, 0, 0}, {0, 0, 0, 0}, false};
    if (yy < -1.0 || yy > (double)h || xx < -1.0 || xx > (double)w) return s;
    yy = yy < 0 ? 0 : yy;
    xx = xx < 0 ? 0 : xx;
    int64_t y0 = (int64_t)yy, x0 = (int64_t)xx, y1, x1;
    if (y0 >= h - 1) {
        y0 = y1 = h - 1;
        yy = (double)y0;
    } else {
        y1 = y0 + 1;
    }
    if (x0 >= w - 1) {
        x0 = x1 = w - 1;
        xx = (double)x0;
    } else {
        x1 = x0 + 1;
    }
    double ly = yy - (double)y0, lx = xx - (double)x0, hy = 1 - ly, hx = 1 - lx;
    s.o[0] = y0 * w + x0, s.o[1] = y0 * w + x1, s.o[2] = y1 * w + x0, s.o[3] = y1 * w + x1;
    s.w[0] = hy * hx, s.w[1] = hy * lx, s.w[2] = ly * hx, s.w[3] = ly * lx;
    s.in = true;
    return s;
}

/* The samples of every bin of roi r, bin by bin, in the reference's order. */
static void ra_table(const ra_job *j, const ra_roi *r, ra_sample *t) {
    for (int64_t py = 0; py < j->oh; py++)
        for (int64_t px = 0; px < j->ow; px++)
            for (int64_t iy = 0; iy < r->ny; iy++) {
                double yy = r->y1 + (double)py * r->bh + ((double)iy + 0.5) * r->bh / (double)r->ny;
                for (int64_t ix = 0; ix < r->nx; ix++) {
                    double xx = r->x1 + (double)px * r->bw + ((double)ix + 0.5) * r->bw / (double)r->nx;
                    *t++ = ra_at(yy, xx, j->h, j->w);
                }
            }
}

/* Items are (roi, block of RA_CBLK channels). */
static void ra_range(void *ctx, int slot, int64_t begin, int64_t end) {
    const ra_job *j = ctx;
    ra_sample *tab = j->tabs + (size_t)slot * (size_t)j->maxs;
    int64_t last = -1, plane = j->h * j->w, bins = j->oh * j->ow;
    for (int64_t it = begin; it < end; it++) {
        int64_t ri = it / j->nblk, c0 = it % j->nblk * RA_CBLK;
        int64_t c1 = c0 + RA_CBLK < j->c ? c0 + RA_CBLK : j->c;
        const ra_roi *r = &j->rois[ri];
        if (ri != last) ra_table(j, r, tab);
        last = ri;
        int64_t per = r->ny * r->nx;
        double count = (double)per;
        for (int64_t ch = c0; ch < c1; ch++) {
            const float *p = j->x + (r->b * j->c + ch) * plane;
            float *y = j->y + (ri * j->c + ch) * bins;
            const ra_sample *s = tab;
            for (int64_t bin = 0; bin < bins; bin++) {
                double acc = j->max_mode ? -INFINITY : 0.0;
                for (int64_t k = 0; k < per; k++, s++) {
                    double v = 0.0;
                    if (s->in) {
                        double v0 = s->w[0] * p[s->o[0]], v1 = s->w[1] * p[s->o[1]];
                        double v2 = s->w[2] * p[s->o[2]], v3 = s->w[3] * p[s->o[3]];
                        v = j->max_mode ? nn_fmax(nn_fmax(v0, v1), nn_fmax(v2, v3)) : v0 + v1 + v2 + v3;
                    }
                    acc = j->max_mode ? nn_fmax(acc, v) : acc + v;
                }
                y[bin] = (float)(j->max_mode ? acc : acc / count);
            }
        }
    }
}

static bool ra_ready(const af_tensor *t, af_dtype dt, int rank) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && t->dtype == dt && t->rank == rank &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / af_dtype_size(dt)));
}

af_status fast_roi_align(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    (void)err;
    const af_tensor *t = nn_in(n, in, 0), *rs = nn_in(n, in, 1), *bi = nn_in(n, in, 2);
    if (!ra_ready(t, AF_DTYPE_FLOAT, 4) || !ra_ready(rs, AF_DTYPE_FLOAT, 2) || !bi ||
        !ra_ready(bi, bi->dtype, 1) || (bi->dtype != AF_DTYPE_INT64 && bi->dtype != AF_DTYPE_INT32) ||
        !ra_ready(&out[0], AF_DTYPE_FLOAT, 4) || af_tensor_numel(t) == 0)
        return AF_DECLINED;
    const char *mode = af_attr_str(n, "mode", "avg");
    const char *ct = roi_align_mode(n);
    bool half = strcmp(ct, "half_pixel") == 0, max_mode = strcmp(mode, "max") == 0;
    int64_t oh = af_attr_int(n, "output_height", 1), ow = af_attr_int(n, "output_width", 1);
    int64_t ratio = af_attr_int(n, "sampling_ratio", 0), nr = rs->dims[0];
    double scale = af_attr_float(n, "spatial_scale", 1.0f), off = half ? 0.5 : 0.0;
    if ((!half && strcmp(ct, "output_half_pixel") != 0) || (!max_mode && strcmp(mode, "avg") != 0) ||
        oh < 1 || ow < 1 || ratio < 0 || !isfinite(scale) || rs->dims[1] != 4 ||
        bi->dims[0] != nr || out[0].dims[0] != nr || out[0].dims[1] != t->dims[1] ||
        out[0].dims[2] != oh || out[0].dims[3] != ow)
        return AF_DECLINED;
    if (nr == 0 || t->dims[1] == 0) return AF_OK;
    ra_roi *rois = af_malloc((size_t)nr * sizeof *rois);
    if (!rois) return AF_DECLINED;
    const float *rv = rs->data;
    double samples = 0;
    int64_t maxs = 1;
    for (int64_t i = 0; i < nr; i++) {
        ra_roi *r = &rois[i];
        r->b = bi->dtype == AF_DTYPE_INT64 ? ((const int64_t *)bi->data)[i] : ((const int32_t *)bi->data)[i];
        const float *q = rv + 4 * i;
        if (r->b < 0 || r->b >= t->dims[0] || !isfinite(q[0]) || !isfinite(q[1]) ||
            !isfinite(q[2]) || !isfinite(q[3])) {
            af_free(rois);
            return AF_DECLINED;
        }
        r->x1 = (double)q[0] * scale - off, r->y1 = (double)q[1] * scale - off;
        double rw = (double)q[2] * scale - off - r->x1, rh = (double)q[3] * scale - off - r->y1;
        if (!half) {
            rw = fmax(rw, 1.0);
            rh = fmax(rh, 1.0);
        }
        r->bh = rh / (double)oh, r->bw = rw / (double)ow;
        double gh = ratio > 0 ? (double)ratio : ceil(rh / (double)oh);
        double gw = ratio > 0 ? (double)ratio : ceil(rw / (double)ow);
        r->ny = (int64_t)nn_clamp(gh, 1, 1 << 16), r->nx = (int64_t)nn_clamp(gw, 1, 1 << 16);
        if ((double)oh * (double)ow * (double)r->ny * (double)r->nx > RA_MAX_SAMPLES) {
            af_free(rois);
            return AF_DECLINED;
        }
        int64_t per = oh * ow * r->ny * r->nx;
        samples += (double)per;
        maxs = per > maxs ? per : maxs;
    }
    int slots = af_exec_threads(x) < AF_EXEC_MAX_SLOTS ? af_exec_threads(x) : AF_EXEC_MAX_SLOTS;
    ra_sample *tabs = af_exec_scratch(x, (size_t)(slots > 0 ? slots : 1) * (size_t)maxs * sizeof(ra_sample));
    if (!tabs) {
        af_free(rois);
        return AF_DECLINED;
    }
    ra_job j = {t->data, out[0].data, rois, tabs, t->dims[1], t->dims[2], t->dims[3], oh, ow,
                (t->dims[1] + RA_CBLK - 1) / RA_CBLK, maxs, max_mode};
    double work = samples * (double)j.c;
    af_exec_parallel(x, nr * j.nblk, af_exec_work_ns(x, 12.0 * work, 16.0 * work), ra_range, &j);
    af_free(rois);
    return AF_OK;
}
