/* Reference detection ops (ONNX opsets 10..17): NonMaxSuppression and RoiAlign.
 *
 * Invariant: boxes, scores, rois and batch indices are checked against each other's shapes
 * before any is indexed, and every batch index read from data is range-checked. NMS output has
 * a data-dependent length, so its kernel allocates [selected, 3] itself. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

/* ---- NonMaxSuppression ------------------------------------------------------------------------ */

/* boxes [B, S, 4], scores [B, K, S]; optional scalar inputs max_output_boxes_per_class,
 * iou_threshold, score_threshold. */
static af_status nms_prepare(const af_node *n, const af_tensor *const *in, af_error *err) {
    const af_tensor *bx = nn_in(n, in, 0), *sc = nn_in(n, in, 1);
    if (!bx || !sc)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing boxes or scores");
    if (!nn_is_float(bx->dtype) || !nn_is_float(sc->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "NonMaxSuppression on %s",
                            af_dtype_name(bx->dtype));
    const af_tensor *mo = nn_in(n, in, 2);
    if (mo && mo->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "max_output_boxes_per_class must be int64");
    for (int i = 2; i < 5; i++) {
        const af_tensor *t = nn_in(n, in, i);
        if (t && (t->rank > 1 || (i > 2 && !nn_is_float(t->dtype))))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d must be a scalar", i);
    }
    if ((bx->rank >= 0 && bx->rank != 3) || (sc->rank >= 0 && sc->rank != 3))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "boxes and scores must be 3-D");
    if (bx->rank == 3 && sc->rank == 3) {
        if ((bx->dims[2] >= 0 && bx->dims[2] != 4) ||
            (bx->dims[0] >= 0 && sc->dims[0] >= 0 && bx->dims[0] != sc->dims[0]) ||
            (bx->dims[1] >= 0 && sc->dims[2] >= 0 && bx->dims[1] != sc->dims[2]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "boxes must be [B, S, 4] and scores [B, classes, S]");
    }
    return AF_OK;
}

af_status shape_nms(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    af_status st = nms_prepare(n, in, err);
    int64_t dims[2] = {-1, 3}; /* the selection count is known only by running */
    if (st == AF_OK)
        af_tensor_set_type(&out[0], AF_DTYPE_INT64, 2, dims);
    return st;
}

/* Box i as (ymin, xmin, ymax, xmax), from corners in either order or from center form. */
static void nms_box(const af_tensor *bx, int64_t i, bool center, double *b) {
    double v[4];
    for (int k = 0; k < 4; k++)
        v[k] = af_tensor_get_double(bx, i * 4 + k);
    if (center) { /* [x_center, y_center, width, height] */
        b[0] = v[1] - v[3] / 2;
        b[1] = v[0] - v[2] / 2;
        b[2] = v[1] + v[3] / 2;
        b[3] = v[0] + v[2] / 2;
    } else {
        b[0] = fmin(v[0], v[2]);
        b[1] = fmin(v[1], v[3]);
        b[2] = fmax(v[0], v[2]);
        b[3] = fmax(v[1], v[3]);
    }
}

static double nms_iou(const double *a, const double *b) {
    double ih = fmin(a[2], b[2]) - fmax(a[0], b[0]), iw = fmin(a[3], b[3]) - fmax(a[1], b[1]);
    double aa = (a[2] - a[0]) * (a[3] - a[1]), ab = (b[2] - b[0]) * (b[3] - b[1]);
    if (ih <= 0 || iw <= 0 || aa <= 0 || ab <= 0)
        return 0.0;
    double inter = ih * iw;
    return inter / (aa + ab - inter);
}

int nms_cmp(const void *pa, const void *pb) {
    const nms_cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->box > b->box) - (a->box < b->box);
}

/* Append (b, k, box) to the growing selection; false when out of memory. */
static bool nms_push(int64_t **sel, int64_t *count, int64_t *cap, int64_t b, int64_t k,
                     int64_t box) {
    if (*count == *cap) {
        int64_t nc = *cap ? *cap * 2 : 64;
        int64_t *p = af_realloc(*sel, (size_t)nc * 3 * sizeof(int64_t));
        if (!p)
            return false;
        *sel = p;
        *cap = nc;
    }
    int64_t *r = *sel + *count * 3;
    r[0] = b;
    r[1] = k;
    r[2] = box;
    (*count)++;
    return true;
}

af_status ref_nms(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    af_status st = nms_prepare(n, in, err);
    if (st != AF_OK)
        return st;
    for (int i = 0; i < n->nin; i++)
        if (in[i] && (!af_tensor_known(in[i]) || (af_tensor_numel(in[i]) > 0 && !in[i]->data)))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d unknown at run time", i);
    const af_tensor *bx = in[0], *sc = in[1], *mo = nn_in(n, in, 2);
    const af_tensor *it = nn_in(n, in, 3), *stt = nn_in(n, in, 4);
    int64_t maxo = mo && af_tensor_numel(mo) > 0 ? nn_geti(mo, 0) : 0;
    double iou_th = it && af_tensor_numel(it) > 0 ? af_tensor_get_double(it, 0) : 0.0;
    bool has_st = stt && af_tensor_numel(stt) > 0;
    double score_th = has_st ? af_tensor_get_double(stt, 0) : 0.0;
    bool center = af_attr_int(n, "center_point_box", 0) != 0;
    int64_t nb = bx->dims[0], ns = bx->dims[1], nk = sc->dims[1];
    nms_cand *cand = af_malloc((size_t)(ns > 0 ? ns : 1) * sizeof(nms_cand));
    double *sel_boxes = af_malloc((size_t)(ns > 0 ? ns : 1) * 4 * sizeof(double));
    int64_t *sel = NULL, count = 0, cap = 0;
    if (!cand || !sel_boxes)
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; st == AF_OK && b < nb; b++)
        for (int64_t k = 0; st == AF_OK && k < nk; k++) {
            int64_t nc = 0, taken = 0;
            for (int64_t s = 0; s < ns; s++) {
                double v = af_tensor_get_double(sc, (b * nk + k) * ns + s);
                if (!has_st || v > score_th)
                    cand[nc++] = (nms_cand){v, s};
            }
            qsort(cand, (size_t)nc, sizeof(nms_cand), nms_cmp);
            for (int64_t c = 0; c < nc && taken < maxo; c++) {
                double box[4];
                nms_box(bx, b * ns + cand[c].box, center, box);
                bool keep = true;
                for (int64_t t = 0; keep && t < taken; t++)
                    keep = nms_iou(box, sel_boxes + t * 4) <= iou_th;
                if (!keep)
                    continue;
                memcpy(sel_boxes + taken * 4, box, sizeof(box));
                taken++;
                if (!nms_push(&sel, &count, &cap, b, k, cand[c].box))
                    st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
            }
        }
    if (st == AF_OK) {
        int64_t dims[2] = {count, 3};
        af_tensor_release(&out[0]);
        af_tensor_set_type(&out[0], AF_DTYPE_INT64, 2, dims);
        st = af_tensor_alloc(&out[0], err);
        if (st == AF_OK && count > 0)
            memcpy(out[0].data, sel, (size_t)count * 3 * sizeof(int64_t));
    }
    af_free(cand);
    af_free(sel_boxes);
    af_free(sel);
    return st;
}

/* ---- RoiAlign ------------------------------------------------------------------------------------ */

const char *roi_align_mode(const af_node *n) {
    int64_t opset = n->graph ? af_graph_opset(n->graph) : 16;
    return af_attr_str(n, "coordinate_transformation_mode",
                       opset >= 16 ? "half_pixel" : "output_half_pixel");
}

/* X [N, C, H, W], rois [R, 4] as (x1, y1, x2, y2), batch_indices [R]; Y [R, C, oh, ow]. */
static af_status roialign_prepare(const af_node *n, const af_tensor *const *in, int64_t *oh,
                                  int64_t *ow, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *r = nn_in(n, in, 1), *bi = nn_in(n, in, 2);
    if (!x || !r || !bi)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing X, rois or batch_indices");
    if (!nn_is_float(x->dtype) || r->dtype != x->dtype ||
        (bi->dtype != AF_DTYPE_INT64 && bi->dtype != AF_DTYPE_INT32))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "RoiAlign on %s", af_dtype_name(x->dtype));
    if ((x->rank >= 0 && x->rank != 4) || (r->rank >= 0 && r->rank != 2) ||
        (r->rank == 2 && r->dims[1] >= 0 && r->dims[1] != 4) || (bi->rank >= 0 && bi->rank != 1) ||
        (r->rank == 2 && bi->rank == 1 && r->dims[0] >= 0 && bi->dims[0] >= 0 &&
         r->dims[0] != bi->dims[0]))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "X must be 4-D, rois [R, 4] and batch_indices [R]");
    const char *mode = af_attr_str(n, "mode", "avg");
    if (strcmp(mode, "avg") != 0 && strcmp(mode, "max") != 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "mode '%s'", mode);
    const char *ct = roi_align_mode(n);
    if (strcmp(ct, "half_pixel") != 0 && strcmp(ct, "output_half_pixel") != 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "coordinate_transformation_mode '%s'", ct);
    *oh = af_attr_int(n, "output_height", 1);
    *ow = af_attr_int(n, "output_width", 1);
    if (*oh < 1 || *ow < 1 || af_attr_int(n, "sampling_ratio", 0) < 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad output size or sampling_ratio");
    return AF_OK;
}

static void roialign_out_type(const af_tensor *const *in, int64_t oh, int64_t ow, af_tensor *y) {
    int64_t dims[4] = {in[1]->rank == 2 ? in[1]->dims[0] : -1,
                       in[0]->rank == 4 ? in[0]->dims[1] : -1, oh, ow};
    af_tensor_set_type(y, in[0]->dtype, 4, dims);
}

af_status shape_roi_align(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    int64_t oh = 1, ow = 1;
    af_status st = roialign_prepare(n, in, &oh, &ow, err);
    if (st == AF_OK)
        roialign_out_type(in, oh, ow, &out[0]);
    return st;
}

/* Bilinear sample of plane p (H x W) at (y, x); 0 outside [-1, H] x [-1, W]. In max mode the
 * largest of the four weighted corners is the sample (the behaviour ONNX Runtime defines). */
static double roialign_sample(const af_tensor *x, int64_t base, int64_t h, int64_t w, double y,
                              double xx, bool max_mode) {
    if (y < -1.0 || y > (double)h || xx < -1.0 || xx > (double)w)
        return 0.0;
    y = y < 0 ? 0 : y;
    xx = xx < 0 ? 0 : xx;
    int64_t y0 = (int64_t)y, x0 = (int64_t)xx, y1, x1;
    if (y0 >= h - 1) {
        y0 = y1 = h - 1;
        y = (double)y0;
    } else {
        y1 = y0 + 1;
    }
    if (x0 >= w - 1) {
        x0 = x1 = w - 1;
        xx = (double)x0;
    } else {
        x1 = x0 + 1;
    }
    double ly = y - (double)y0, lx = xx - (double)x0, hy = 1 - ly, hx = 1 - lx;
    double v[4] = {hy * hx * af_tensor_get_double(x, base + y0 * w + x0), hy * lx * af_tensor_get_double(x, base + y0 * w + x1),
                   ly * hx * af_tensor_get_double(x, base + y1 * w + x0), ly * lx * af_tensor_get_double(x, base + y1 * w + x1)};
    if (max_mode)
        return nn_fmax(nn_fmax(v[0], v[1]), nn_fmax(v[2], v[3]));
    return v[0] + v[1] + v[2] + v[3];
}

af_status ref_roi_align(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    (void)ex;
    int64_t oh = 1, ow = 1;
    af_status st = roialign_prepare(n, in, &oh, &ow, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *r = in[1], *bi = in[2];
    if (!af_tensor_known(x) || !af_tensor_known(r) || !af_tensor_known(bi))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    roialign_out_type(in, oh, ow, &t);
    if ((st = nn_check_out(n, &out[0], 4, t.dims, err)) != AF_OK)
        return st;
    if (af_tensor_numel(x) == 0)
        return AF_OK; /* an empty image: every sample is outside, Y stays zero */
    bool max_mode = strcmp(af_attr_str(n, "mode", "avg"), "max") == 0;
    bool half = strcmp(roi_align_mode(n), "half_pixel") == 0;
    double scale = af_attr_float(n, "spatial_scale", 1.0f), off = half ? 0.5 : 0.0;
    int64_t ratio = af_attr_int(n, "sampling_ratio", 0);
    int64_t nb = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3], yi = 0;
    for (int64_t ri = 0; ri < r->dims[0]; ri++) {
        int64_t b = nn_geti(bi, ri);
        if (b < 0 || b >= nb)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "batch index %lld out of range",
                                (long long)b);
        double x1 = af_tensor_get_double(r, ri * 4) * scale - off, y1 = af_tensor_get_double(r, ri * 4 + 1) * scale - off;
        double rw = af_tensor_get_double(r, ri * 4 + 2) * scale - off - x1;
        double rh = af_tensor_get_double(r, ri * 4 + 3) * scale - off - y1;
        if (!half) { /* the legacy mode forces at least one pixel */
            rw = fmax(rw, 1.0);
            rh = fmax(rh, 1.0);
        }
        double bh = rh / (double)oh, bw = rw / (double)ow;
        /* Samples per bin; clamped so a hostile roi cannot ask for an unbounded loop. */
        double gh = ratio > 0 ? (double)ratio : ceil(rh / (double)oh);
        double gw = ratio > 0 ? (double)ratio : ceil(rw / (double)ow);
        int64_t ny = (int64_t)nn_clamp(gh, 1, 1 << 16), nx = (int64_t)nn_clamp(gw, 1, 1 << 16);
        for (int64_t ch = 0; ch < c; ch++) {
            int64_t base = (b * c + ch) * h * w;
            for (int64_t py = 0; py < oh; py++)
                for (int64_t px = 0; px < ow; px++, yi++) {
                    double acc = max_mode ? -INFINITY : 0.0;
                    for (int64_t iy = 0; iy < ny; iy++) {
                        double yy = y1 + (double)py * bh + ((double)iy + 0.5) * bh / (double)ny;
                        for (int64_t ix = 0; ix < nx; ix++) {
                            double xx = x1 + (double)px * bw + ((double)ix + 0.5) * bw / (double)nx;
                            double v = roialign_sample(x, base, h, w, yy, xx, max_mode);
                            acc = max_mode ? nn_fmax(acc, v) : acc + v;
                        }
                    }
                    nn_put(&out[0], yi, max_mode ? acc : acc / (double)(ny * nx));
                }
        }
    }
    return AF_OK;
}
