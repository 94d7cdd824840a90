/* Reference pooling (ONNX opsets 7..17): MaxPool (with the optional Indices output),
 * AveragePool, LpPool, their Global forms, MaxRoiPool and MaxUnpool, over 1 to 3 spatial dims.
 *
 * Invariant: the window geometry (nn_window, shared with conv.c) is derived and checked once;
 * every input position a window visits is tested against [0, in) before it is read, so
 * padding is never read, only counted (AveragePool's count_include_pad). Each output element
 * is one accumulator written once. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

typedef enum pool_kind { POOL_MAX, POOL_AVG, POOL_LP } pool_kind;

/* Window geometry of MaxPool / AveragePool / LpPool from kernel_shape and x. */
static af_status pool_setup(const af_node *n, const af_tensor *x, nn_window *w, af_error *err) {
    const int64_t *ks = NULL;
    int nsp = af_attr_ints(n, "kernel_shape", &ks);
    if (nsp < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing kernel_shape");
    if (nsp > NN_MAXSP)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%d spatial dims (1 to %d supported)",
                            nsp, NN_MAXSP);
    for (int i = 0; i < nsp; i++)
        if (ks[i] < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "kernel_shape[%d] = %lld", i,
                                (long long)ks[i]);
    if (x->rank >= 0 && x->rank != nsp + 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "input rank %d does not match %d-D kernel_shape", x->rank, nsp);
    af_tensor xs = *x;
    if (xs.rank < 0) {
        xs.rank = nsp + 2;
        for (int i = 0; i < xs.rank; i++)
            xs.dims[i] = -1;
    }
    bool ceil_mode = af_attr_int(n, "ceil_mode", 0) != 0;
    return nn_window_init(n, &xs, ks, nsp, ceil_mode, w, err);
}

static void pool_out_type(const nn_window *w, const af_tensor *x, af_dtype dt, af_tensor *y) {
    int64_t dims[AF_MAX_RANK];
    dims[0] = x->rank >= 0 ? x->dims[0] : -1;
    dims[1] = x->rank >= 0 ? x->dims[1] : -1;
    for (int i = 0; i < w->nsp; i++)
        dims[2 + i] = w->out[NN_MAXSP - w->nsp + i];
    af_tensor_set_type(y, dt, w->nsp + 2, dims);
}

static bool pool_type_ok(pool_kind kind, af_dtype t) {
    return nn_is_float(t) ||
           (kind == POOL_MAX && (t == AF_DTYPE_INT8 || t == AF_DTYPE_UINT8));
}

static af_status pool_prepare(const af_node *n, const af_tensor *const *in, pool_kind kind,
                              nn_window *w, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X");
    if (!pool_type_ok(kind, x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                            af_dtype_name(x->dtype));
    if (kind == POOL_LP) {
        const af_attr *p = af_node_attr(n, "p");
        double pv = !p ? 2.0 : p->type == AF_ATTR_FLOAT ? p->f : (double)p->i;
        if (!(pv > 0.0) || !isfinite(pv))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "p must be positive");
    }
    return pool_setup(n, x, w, err);
}

/* LpPool's p: an int since opset 2, a float in opset 1. */
static double pool_p(const af_node *n) {
    const af_attr *p = af_node_attr(n, "p");
    return !p ? 2.0 : p->type == AF_ATTR_FLOAT ? p->f : (double)p->i;
}

static af_status pool_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            pool_kind kind, af_error *err) {
    if (af_attr_int(n, "channels_last", 0) && kind != POOL_LP)
        return af_ref_refuse_lowered(n, err);
    nn_window w;
    af_status st = pool_prepare(n, in, kind, &w, err);
    if (st != AF_OK)
        return st;
    pool_out_type(&w, in[0], in[0]->dtype, &out[0]);
    if (kind == POOL_MAX && n->nout > 1)
        pool_out_type(&w, in[0], AF_DTYPE_INT64, &out[1]);
    return AF_OK;
}

af_status shape_maxpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    return pool_shape(n, in, out, POOL_MAX, err);
}
af_status shape_avgpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    return pool_shape(n, in, out, POOL_AVG, err);
}
af_status shape_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    return pool_shape(n, in, out, POOL_LP, err);
}

/* Positions kk in [0, k) of padded dim i whose input index o*s - pb + kk*d lies in
 * [-pb, in + pe): the divisor of AveragePool with count_include_pad. */
static int64_t pool_padded_count(const nn_window *w, int i, int64_t o) {
    int64_t c = 0;
    for (int64_t kk = 0; kk < w->k[i]; kk++) {
        int64_t p = o * w->s[i] - w->pb[i] + kk * w->d[i];
        c += p >= -w->pb[i] && p < w->in[i] + w->pe[i];
    }
    return c;
}

/* The flat input index of MaxPool's Indices output: row-major over the whole tensor, or with
 * the spatial dims in column-major order when storage_order = 1. */
static int64_t pool_index(const nn_window *w, int64_t plane, int64_t id, int64_t ih, int64_t iw,
                          bool col_major) {
    int64_t size = w->in[0] * w->in[1] * w->in[2];
    int64_t sp = col_major ? id + ih * w->in[0] + iw * w->in[0] * w->in[1]
                           : (id * w->in[1] + ih) * w->in[2] + iw;
    return plane * size + sp;
}

static af_status pool_kernel(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             pool_kind kind, af_error *err) {
    nn_window w;
    af_status st = pool_prepare(n, in, kind, &w, err);
    const af_tensor *x = in[0];
    af_tensor *idx = kind == POOL_MAX ? nn_out(n, out, 1) : NULL;
    if (st != AF_OK)
        return st;
    if (!af_tensor_known(x) || x->data == NULL)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    pool_out_type(&w, x, x->dtype, &t);
    if ((st = nn_check_out(n, &out[0], t.rank, t.dims, err)) != AF_OK)
        return st;
    if (idx && (st = nn_check_out(n, idx, t.rank, t.dims, err)) != AF_OK)
        return st;
    bool include_pad = af_attr_int(n, "count_include_pad", 0) != 0;
    bool col_major = af_attr_int(n, "storage_order", 0) != 0;
    double p = pool_p(n);
    int64_t planes = x->dims[0] * x->dims[1], insize = w.in[0] * w.in[1] * w.in[2], yi = 0;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t od = 0; od < w.out[0]; od++)
            for (int64_t oh = 0; oh < w.out[1]; oh++)
                for (int64_t ow = 0; ow < w.out[2]; ow++, yi++) {
                    double acc = kind == POOL_MAX ? -INFINITY : 0.0;
                    int64_t count = 0, best = -1;
                    for (int64_t kd = 0; kd < w.k[0]; kd++) {
                        int64_t id = od * w.s[0] - w.pb[0] + kd * w.d[0];
                        if (id < 0 || id >= w.in[0])
                            continue;
                        for (int64_t kh = 0; kh < w.k[1]; kh++) {
                            int64_t ih = oh * w.s[1] - w.pb[1] + kh * w.d[1];
                            if (ih < 0 || ih >= w.in[1])
                                continue;
                            for (int64_t kw = 0; kw < w.k[2]; kw++) {
                                int64_t iw = ow * w.s[2] - w.pb[2] + kw * w.d[2];
                                if (iw < 0 || iw >= w.in[2])
                                    continue;
                                double v = af_tensor_get_double(x, pl * insize + (id * w.in[1] + ih) * w.in[2] + iw);
                                count++;
                                if (kind == POOL_AVG)
                                    acc += v;
                                else if (kind == POOL_LP)
                                    acc += pow(fabs(v), p);
                                else if (v > acc || best < 0) {
                                    acc = v;
                                    best = pool_index(&w, pl, id, ih, iw, col_major);
                                }
                            }
                        }
                    }
                    if (kind == POOL_AVG) {
                        if (include_pad)
                            count = pool_padded_count(&w, 0, od) * pool_padded_count(&w, 1, oh) *
                                    pool_padded_count(&w, 2, ow);
                        acc = count > 0 ? acc / (double)count : 0.0;
                    } else if (kind == POOL_LP) {
                        acc = pow(acc, 1.0 / p);
                    }
                    nn_put(&out[0], yi, acc);
                    if (idx)
                        ((int64_t *)idx->data)[yi] = best < 0 ? 0 : best;
                }
    return AF_OK;
}

af_status ref_maxpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    (void)ex;
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    return pool_kernel(n, in, out, POOL_MAX, err);
}
af_status ref_avgpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    (void)ex;
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    return pool_kernel(n, in, out, POOL_AVG, err);
}
af_status ref_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    return pool_kernel(n, in, out, POOL_LP, err);
}

/* ---- Global pooling ------------------------------------------------------------------------------ */

/* Y is [N, C, 1, ...]: X reduced over every dim after the second. */
static af_status gpool_prepare(const af_node *n, const af_tensor *const *in, pool_kind kind,
                               af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X");
    if (!nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                            af_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < 2", x->rank);
    if (kind == POOL_LP && !(pool_p(n) > 0.0 && isfinite(pool_p(n))))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "p must be positive");
    return AF_OK;
}

static void gpool_out_type(const af_tensor *x, af_tensor *y) {
    af_tensor_type_copy(y, x);
    for (int i = 2; i < y->rank; i++)
        y->dims[i] = 1;
}

static af_status gpool_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             pool_kind kind, af_error *err) {
    if (af_attr_int(n, "channels_last", 0) && kind != POOL_LP)
        return af_ref_refuse_lowered(n, err);
    af_status st = gpool_prepare(n, in, kind, err);
    if (st == AF_OK)
        gpool_out_type(in[0], &out[0]);
    return st;
}

static af_status gpool_kernel(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              pool_kind kind, af_error *err) {
    af_status st = gpool_prepare(n, in, kind, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    if (!af_tensor_known(x) || x->data == NULL)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    gpool_out_type(x, &t);
    if ((st = nn_check_out(n, &out[0], t.rank, t.dims, err)) != AF_OK)
        return st;
    int64_t planes = x->dims[0] * x->dims[1], inner = nn_prod(x, 2, x->rank);
    double p = pool_p(n);
    for (int64_t pl = 0; pl < planes; pl++) {
        double acc = kind == POOL_MAX ? -INFINITY : 0.0;
        for (int64_t i = 0; i < inner; i++) {
            double v = af_tensor_get_double(x, pl * inner + i);
            if (kind == POOL_MAX)
                acc = (v > acc || i == 0) ? v : acc;
            else if (kind == POOL_LP)
                acc += pow(fabs(v), p);
            else
                acc += v;
        }
        if (kind == POOL_AVG)
            acc = inner > 0 ? acc / (double)inner : 0.0;
        else if (kind == POOL_LP)
            acc = pow(acc, 1.0 / p);
        nn_put(&out[0], pl, acc);
    }
    return AF_OK;
}

af_status shape_global_maxpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    return gpool_shape(n, in, out, POOL_MAX, err);
}
af_status shape_global_avgpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    return gpool_shape(n, in, out, POOL_AVG, err);
}
af_status shape_global_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_error *err) {
    return gpool_shape(n, in, out, POOL_LP, err);
}
af_status ref_global_maxpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    return gpool_kernel(n, in, out, POOL_MAX, err);
}
af_status ref_global_avgpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    return gpool_kernel(n, in, out, POOL_AVG, err);
}
af_status ref_global_lppool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_exec *ex, af_error *err) {
    (void)ex;
    return gpool_kernel(n, in, out, POOL_LP, err);
}

/* ---- MaxRoiPool ---------------------------------------------------------------------------------- */

/* X [N, C, H, W], rois [R, 5] of (batch, x1, y1, x2, y2); Y [R, C, ph, pw]: each roi, scaled
 * and rounded to whole pixels, is cut into ph x pw bins, each the max of its pixels (0 if
 * empty), as in Fast R-CNN. */
static af_status roi_prepare(const af_node *n, const af_tensor *const *in, int64_t *ph,
                             int64_t *pw, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *r = nn_in(n, in, 1);
    if (!x || !r)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or rois");
    if (!nn_is_float(x->dtype) || r->dtype != x->dtype)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "MaxRoiPool on %s",
                            af_dtype_name(x->dtype));
    if ((x->rank >= 0 && x->rank != 4) || (r->rank >= 0 && r->rank != 2) ||
        (r->rank == 2 && r->dims[1] >= 0 && r->dims[1] != 5))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X must be 4-D and rois [R, 5]");
    const int64_t *ps = NULL;
    if (af_attr_ints(n, "pooled_shape", &ps) != 2 || ps[0] < 1 || ps[1] < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pooled_shape must be 2 positive ints");
    *ph = ps[0];
    *pw = ps[1];
    return AF_OK;
}

static void roi_out_type(const af_tensor *const *in, int64_t ph, int64_t pw, af_tensor *y) {
    int64_t dims[4] = {in[1]->rank == 2 ? in[1]->dims[0] : -1, in[0]->rank == 4 ? in[0]->dims[1] : -1,
                       ph, pw};
    af_tensor_set_type(y, in[0]->dtype, 4, dims);
}

af_status shape_max_roi_pool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    int64_t ph = 0, pw = 0;
    af_status st = roi_prepare(n, in, &ph, &pw, err);
    if (st == AF_OK)
        roi_out_type(in, ph, pw, &out[0]);
    return st;
}

/* Round a roi coordinate to a pixel, clamped so the conversion is defined. */
static int64_t roi_coord(double v, double scale) {
    return (int64_t)nn_clamp(round(v * scale), -1e15, 1e15);
}

/* The pixel range [lo, hi) of bin b of `bins` over a roi of `size` pixels from `start`,
 * clipped to [0, limit). */
static void roi_bin(int64_t b, int64_t bins, int64_t start, int64_t size, int64_t limit,
                    int64_t *lo, int64_t *hi) {
    double bin = (double)size / (double)bins;
    int64_t l = (int64_t)floor((double)b * bin) + start, h = (int64_t)ceil((double)(b + 1) * bin) + start;
    *lo = l < 0 ? 0 : l > limit ? limit : l;
    *hi = h < 0 ? 0 : h > limit ? limit : h;
}

af_status ref_max_roi_pool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    int64_t ph = 0, pw = 0;
    af_status st = roi_prepare(n, in, &ph, &pw, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *r = in[1];
    if (!af_tensor_known(x) || !af_tensor_known(r))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    roi_out_type(in, ph, pw, &t);
    if ((st = nn_check_out(n, &out[0], 4, t.dims, err)) != AF_OK)
        return st;
    double scale = af_attr_float(n, "spatial_scale", 1.0f);
    int64_t nb = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3], yi = 0;
    for (int64_t ri = 0; ri < r->dims[0]; ri++) {
        double bv = af_tensor_get_double(r, ri * 5);
        if (!(bv >= 0.0 && bv < (double)nb))
            return af_node_fail(err, n, AF_ERR_RUNTIME, "roi %lld has batch index %g",
                                (long long)ri, bv);
        int64_t b = (int64_t)bv;
        int64_t x1 = roi_coord(af_tensor_get_double(r, ri * 5 + 1), scale), y1 = roi_coord(af_tensor_get_double(r, ri * 5 + 2), scale);
        int64_t x2 = roi_coord(af_tensor_get_double(r, ri * 5 + 3), scale), y2 = roi_coord(af_tensor_get_double(r, ri * 5 + 4), scale);
        int64_t rh = y2 - y1 + 1 > 1 ? y2 - y1 + 1 : 1, rw = x2 - x1 + 1 > 1 ? x2 - x1 + 1 : 1;
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < ph; i++)
                for (int64_t j = 0; j < pw; j++, yi++) {
                    int64_t h0, h1, w0, w1;
                    roi_bin(i, ph, y1, rh, h, &h0, &h1);
                    roi_bin(j, pw, x1, rw, w, &w0, &w1);
                    double m = 0.0;
                    for (int64_t yy = h0; yy < h1; yy++)
                        for (int64_t xx = w0; xx < w1; xx++) {
                            double v = af_tensor_get_double(x, ((b * c + ch) * h + yy) * w + xx);
                            if ((yy == h0 && xx == w0) || v > m)
                                m = v;
                        }
                    nn_put(&out[0], yi, m);
                }
    }
    return AF_OK;
}

/* ---- MaxUnpool ----------------------------------------------------------------------------------- */

/* MaxUnpool: Y is zero except at the positions of MaxPool's flat Indices, which count in the
 * default unpooled shape D = [N, C, (in - 1) * stride + kernel - pads...]. Y has shape D, or the
 * output_shape input when given; then each index's coordinates in D are placed at the same
 * coordinates of Y (as the ONNX reference does). */
static af_status unpool_default(const af_node *n, const af_tensor *x, int *rank, int64_t *dims,
                                af_error *err) {
    const int64_t *ks = NULL, *st = NULL, *pads = NULL;
    int nsp = af_attr_ints(n, "kernel_shape", &ks);
    if (nsp < 1 || nsp > AF_MAX_RANK - 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad kernel_shape");
    if (x->rank >= 0 && x->rank != nsp + 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank does not match kernel_shape");
    int nst = af_attr_ints(n, "strides", &st), npads = af_attr_ints(n, "pads", &pads);
    if ((nst >= 0 && nst != nsp) || (npads >= 0 && npads != 2 * nsp))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "strides/pads length");
    *rank = nsp + 2;
    dims[0] = x->rank >= 0 ? x->dims[0] : -1;
    dims[1] = x->rank >= 0 ? x->dims[1] : -1;
    for (int i = 0; i < nsp; i++) {
        int64_t in = x->rank >= 0 ? x->dims[2 + i] : -1, s = nst >= 0 ? st[i] : 1;
        int64_t pb = npads >= 0 ? pads[i] : 0, pe = npads >= 0 ? pads[nsp + i] : 0, d, pad;
        if (s < 1 || ks[i] < 1 || pb < 0 || pe < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad strides, pads or kernel");
        dims[2 + i] = -1;
        if (in < 0)
            continue;
        if (in < 1 || !af_mul_i64(in - 1, s, &d) || !af_add_i64(d, ks[i], &d) ||
            !af_add_i64(pb, pe, &pad) || (d -= pad) < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad output size");
        dims[2 + i] = d;
    }
    return AF_OK;
}

static af_status unpool_out_type(const af_node *n, const af_tensor *const *in, af_tensor *y,
                                 af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *ind = nn_in(n, in, 1), *os = nn_in(n, in, 2);
    if (!x || !ind)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or I");
    if (!nn_is_float(x->dtype) || ind->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "MaxUnpool on %s", af_dtype_name(x->dtype));
    int64_t dims[AF_MAX_RANK];
    int rank;
    af_status st = unpool_default(n, x, &rank, dims, err);
    if (st != AF_OK || !os) {
        if (st == AF_OK)
            af_tensor_set_type(y, x->dtype, rank, dims);
        return st;
    }
    int got = 0;
    if (!os->data) {
        af_tensor_set_type(y, x->dtype, rank, NULL);
        return AF_OK;
    }
    if (!af_tensor_to_ints(os, dims, AF_MAX_RANK, &got) || got != rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output_shape must have %d values", rank);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0 || (i < 2 && x->rank >= 0 && dims[i] != x->dims[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad output_shape[%d]", i);
    af_tensor_set_type(y, x->dtype, rank, dims);
    return AF_OK;
}

af_status shape_max_unpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_error *err) {
    return unpool_out_type(n, in, &out[0], err);
}

af_status ref_max_unpool(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *ex, af_error *err) {
    (void)ex;
    af_tensor t, def;
    int rank;
    af_status st = unpool_out_type(n, in, &t, err);
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], t.rank, t.dims, err);
    if (st == AF_OK)
        st = unpool_default(n, in[0], &rank, def.dims, err);
    if (st != AF_OK)
        return st;
    def.rank = rank;
    const af_tensor *x = in[0], *ind = in[1];
    int64_t nx = af_tensor_numel(x), nd = af_tensor_numel(&def);
    if (af_tensor_numel(ind) != nx || !af_tensor_known(x) || nd < 0 || ind->data == NULL)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "I must have X's shape");
    for (int64_t i = 0; i < nx; i++) {
        int64_t at = ((const int64_t *)ind->data)[i], yi = 0, stride = 1;
        if (at < 0 || at >= nd)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "index %lld outside the unpooled shape",
                                (long long)at);
        for (int d = rank - 1; d >= 0; d--) {
            int64_t c = at % def.dims[d];
            at /= def.dims[d];
            if (c >= out[0].dims[d])
                return af_node_fail(err, n, AF_ERR_RUNTIME, "index outside output_shape");
            yi += c * stride;
            stride *= out[0].dims[d];
        }
        nn_put(&out[0], yi, af_tensor_get_double(x, i));
    }
    return AF_OK;
}
