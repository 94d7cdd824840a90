/* Fast NonMaxSuppression: the reference's greedy selection (kernels/ref/detect.c) with the boxes
 * converted once per image into arrays of corners and areas, and each candidate tested against
 * the kept boxes in blocks without a branch or call per pair (a detector's batched NMS offsets
 * boxes per class and keeps most of them: SSDlite's is 27,000 candidates in one class).
 *
 * Invariant: the same selection as the reference, bit for bit: IoU is computed in double with
 * the reference's formula; boxes with a coordinate that is not finite (where min/max would
 * differ from fmin and fmax, and an IoU could be NaN) and a negative or NaN threshold (which
 * suppresses boxes that do not overlap) are left to the reference. */
#include "kernels/fast/fast.h"
#include "kernels/ref/nn_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NMS_BLOCK = 256 };

typedef struct nms_boxes {
    double *y0, *x0, *y1, *x1, *area; /* [count] each */
} nms_boxes;

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

/* Does box c overlap any of the kept boxes [0, taken) by more than th? */
static bool suppressed(const nms_boxes *all, int64_t c, const nms_boxes *kept, int64_t taken,
                       double th) {
    double a0 = all->y0[c], a1 = all->x0[c], a2 = all->y1[c], a3 = all->x1[c], aa = all->area[c];
    if (!(aa > 0)) return false; /* the reference's IoU is 0 against every box */
    for (int64_t t0 = 0; t0 < taken; t0 += NMS_BLOCK) {
        int64_t t1 = taken - t0 < NMS_BLOCK ? taken : t0 + NMS_BLOCK;
        int hit = 0;
        for (int64_t t = t0; t < t1; t++) {
            double ih = (a2 < kept->y1[t] ? a2 : kept->y1[t]) - (a0 > kept->y0[t] ? a0 : kept->y0[t]);
            double iw = (a3 < kept->x1[t] ? a3 : kept->x1[t]) - (a1 > kept->x0[t] ? a1 : kept->x0[t]);
            double ab = kept->area[t], inter = ih * iw, iou = inter / (aa + ab - inter);
            hit |= (ih > 0) & (iw > 0) & (ab > 0) & (iou > th);
        }
        if (hit) return true;
    }
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
    int64_t *sel = NULL, count = 0, cap = 0;
    if (!mem || !cand) {
        af_free(mem);
        af_free(cand);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    nms_boxes all = {mem, mem + m, mem + 2 * m, mem + 3 * m, mem + 4 * m};
    nms_boxes kept = {mem + 5 * m, mem + 6 * m, mem + 7 * m, mem + 8 * m, mem + 9 * m};
    af_status st = AF_OK;
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
            for (int64_t c = 0; c < nc && taken < maxo && st == AF_OK; c++) {
                if (suppressed(&all, cand[c].box, &kept, taken, iou_th)) continue;
                kept_set(&kept, taken++, &all, cand[c].box);
                if (count == cap) {
                    int64_t ncap = cap ? cap * 2 : 64;
                    int64_t *p = af_realloc(sel, (size_t)ncap * 3 * sizeof(int64_t));
                    if (!p) {
                        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
                        break;
                    }
                    sel = p, cap = ncap;
                }
                sel[3 * count] = b, sel[3 * count + 1] = k, sel[3 * count + 2] = cand[c].box;
                count++;
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
    af_free(sel);
    return st;
}
