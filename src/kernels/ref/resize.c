/* Reference kernels for Resize (opsets 10 to 19) and the deprecated Upsample (opsets 7-9):
 * nearest, N-D (multi)linear and cubic sampling with every coordinate_transformation_mode,
 * nearest_mode, cubic_coeff_a, exclude_outside, tf_crop_and_resize's extrapolation_value, and
 * opset 18's axes and keep_aspect_ratio_policy (not antialias).
 *
 * Invariant: each output coordinate on each axis maps to at most 4 taps (input index, weight)
 * computed once per axis; taps are clamped to the input (edge padding, as ONNX's reference does)
 * so no sample reads outside it. An output element is the sum over the product of its axes' taps,
 * or the extrapolation value when tf_crop_and_resize puts a coordinate outside the input. */
#include "kernels/ref/tensor_util.h"

#include <stdlib.h>

typedef enum rz_mode { RZ_NEAREST, RZ_LINEAR, RZ_CUBIC } rz_mode;
typedef enum rz_coord {
    RZ_HALF_PIXEL, RZ_PYTORCH_HALF_PIXEL, RZ_ALIGN_CORNERS, RZ_ASYMMETRIC,
    RZ_TF_HALF_PIXEL_FOR_NN, RZ_TF_CROP_AND_RESIZE, RZ_HALF_PIXEL_SYMMETRIC
} rz_coord;
/* RZ_SIMPLE: Upsample and Resize-10 (floor when enlarging, ceil when shrinking, as ORT does). */
typedef enum rz_round { RZ_PREFER_FLOOR, RZ_PREFER_CEIL, RZ_FLOOR, RZ_CEIL, RZ_SIMPLE } rz_round;

typedef struct rz_params {
    rz_mode mode;
    rz_coord coord;
    rz_round round;
    double cubic_a, extrapolation;
    bool exclude_outside;
    int keep; /* keep_aspect_ratio_policy: 0 stretch, -1 not_larger, 1 not_smaller */
    bool known;     /* output dims and scales known */
    bool roi_known; /* tf_crop_and_resize's roi known (always true for other modes) */
    int rank, naxes, axes[AF_MAX_RANK]; /* the axes scales, sizes and roi name */
    double scale[AF_MAX_RANK];
    double len[AF_MAX_RANK]; /* in * scale: the (fractional) resized length ONNX's reference
                                uses in align_corners and the length-1 special cases */
    int64_t out[AF_MAX_RANK];
    double roi[2 * AF_MAX_RANK];
} rz_params;

/* One output coordinate on one axis. */
typedef tn_rz_taps rz_taps;

static af_status parse_mode(const af_node *n, rz_params *p, af_error *err) {
    const char *m = af_attr_str(n, "mode", "nearest");
    if (!strcmp(m, "nearest"))
        p->mode = RZ_NEAREST;
    else if (!strcmp(m, "linear") || !strcmp(m, "bilinear"))
        p->mode = RZ_LINEAR;
    else if (!strcmp(m, "cubic") && n->op == AF_OP_RESIZE)
        p->mode = RZ_CUBIC;
    else
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unknown mode '%s'", m);
    bool legacy = n->op == AF_OP_UPSAMPLE || af_graph_opset(n->graph) < 11;
    p->coord = RZ_ASYMMETRIC;
    p->round = RZ_SIMPLE;
    p->cubic_a = af_attr_float(n, "cubic_coeff_a", -0.75f);
    p->exclude_outside = af_attr_int(n, "exclude_outside", 0) != 0;
    p->extrapolation = af_attr_float(n, "extrapolation_value", 0.0f);
    if (legacy)
        return AF_OK;
    static const char *const coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                         "asymmetric", "tf_half_pixel_for_nn",
                                         "tf_crop_and_resize", "half_pixel_symmetric"};
    static const char *const rounds[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                         "ceil"};
    const char *c = af_attr_str(n, "coordinate_transformation_mode", "half_pixel");
    const char *r = af_attr_str(n, "nearest_mode", "round_prefer_floor");
    int ci = -1, ri = -1;
    for (int i = 0; i < (int)AF_COUNT(coords); i++)
        if (!strcmp(c, coords[i]))
            ci = i;
    for (int i = 0; i < (int)AF_COUNT(rounds); i++)
        if (!strcmp(r, rounds[i]))
            ri = i;
    if (ci < 0)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "unknown coordinate_transformation_mode '%s'", c);
    if (ri < 0)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unknown nearest_mode '%s'", r);
    p->coord = (rz_coord)ci;
    p->round = (rz_round)ri;
    if (af_node_attr(n, "antialias") && af_attr_int(n, "antialias", 0))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "antialias (opset 18) is not supported");
    const char *keep = af_attr_str(n, "keep_aspect_ratio_policy", "stretch");
    p->keep = !strcmp(keep, "not_larger") ? -1 : !strcmp(keep, "not_smaller") ? 1 : 0;
    if (!p->keep && strcmp(keep, "stretch"))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "unknown keep_aspect_ratio_policy '%s'", keep);
    return AF_OK;
}

/* The axes that scales, sizes and roi name: opset 18's axes attribute, else all in order. */
static af_status rz_axes(const af_node *n, rz_params *p, af_error *err) {
    const int64_t *a = NULL;
    int cnt = af_attr_ints(n, "axes", &a);
    bool seen[AF_MAX_RANK] = {false};
    p->naxes = cnt < 0 ? p->rank : cnt;
    if (p->naxes > p->rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%d axes for rank %d", cnt, p->rank);
    for (int i = 0; i < p->naxes; i++) {
        if (cnt < 0)
            p->axes[i] = i;
        else if (!af_axis(a[i], p->rank, &p->axes[i]) || seen[p->axes[i]])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axes[%d] = %lld is out of range or repeated",
                                i, (long long)a[i]);
        seen[p->axes[i]] = true;
    }
    return AF_OK;
}

/* keep_aspect_ratio_policy (opset 18, with sizes): one scale for the named axes, the smallest
 * (not_larger) or largest (not_smaller) of sizes / input, and the sizes rounded from it. */
static void keep_aspect(const af_tensor *x, rz_params *p) {
    double s = 0;
    for (int j = 0; j < p->naxes; j++) {
        int a = p->axes[j];
        double r = x->dims[a] > 0 ? (double)p->out[a] / (double)x->dims[a] : 1.0; /* dims known */
        s = j == 0 ? r : p->keep < 0 ? fmin(s, r) : fmax(s, r);
    }
    for (int j = 0; j < p->naxes; j++) {
        int a = p->axes[j];
        p->scale[a] = s;
        p->len[a] = s * (double)x->dims[a];
        p->out[a] = (int64_t)round(p->len[a]);
    }
}

/* Output dims from scales: floor(in * scale), as the ONNX reference computes it. */
static af_status dims_from_scales(const af_node *n, const af_tensor *x, rz_params *p,
                                  af_error *err) {
    for (int i = 0; i < p->rank; i++) {
        double s = p->scale[i];
        if (!(s > 0) || s > 1e9)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad scale %g", s);
        if (x->dims[i] < 0) {
            p->out[i] = -1;
            continue;
        }
        double d = floor((double)x->dims[i] * s);
        if (d > 4e18)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output dim overflows");
        p->out[i] = (int64_t)d;
        p->len[i] = (double)x->dims[i] * s;
    }
    return AF_OK;
}

/* Scales or sizes per the op and opset; p->known false while they are not known. */
static af_status parse_sizes(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                             rz_params *p, af_error *err) {
    int64_t opset = af_graph_opset(n->graph);
    p->rank = x->rank;
    p->known = false;
    for (int i = 0; i < 2 * AF_MAX_RANK; i++)
        p->roi[i] = i < AF_MAX_RANK ? 0.0 : 1.0;
    if (n->op == AF_OP_UPSAMPLE && opset < 9) {
        const float *f = NULL;
        int cnt = af_attr_floats(n, "scales", &f);
        if (cnt != x->rank)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scales must hold %d values",
                                x->rank);
        for (int i = 0; i < cnt; i++)
            p->scale[i] = f[i];
        p->known = true;
        return dims_from_scales(n, x, p, err);
    }
    bool legacy = n->op == AF_OP_UPSAMPLE || opset < 11;
    const af_tensor *roi = legacy ? NULL : tn_in(n, in, 1);
    const af_tensor *sc = tn_in(n, in, legacy ? 1 : 2), *sz = legacy ? NULL : tn_in(n, in, 3);
    if (sc && !sc->data && !(sc->rank == 1 && sc->dims[0] == 0))
        return AF_OK; /* scales not known yet */
    af_status st = rz_axes(n, p, err);
    if (st)
        return st;
    int na = p->naxes;
    for (int i = 0; i < x->rank; i++) { /* axes not named keep their length */
        p->scale[i] = 1.0;
        p->out[i] = x->dims[i];
        p->len[i] = (double)x->dims[i];
    }
    if (sc && af_tensor_numel(sc) > 0) {
        if (!tn_is_float(sc->dtype) || af_tensor_numel(sc) != na)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scales must hold %d floats", na);
        for (int j = 0; j < na; j++)
            p->scale[p->axes[j]] = af_tensor_get_double(sc, j);
        if ((st = dims_from_scales(n, x, p, err)))
            return st;
    } else if (sz) {
        if (!sz->data)
            return AF_OK;
        int64_t v[AF_MAX_RANK];
        int cnt;
        if (!tn_ints(sz, v, AF_MAX_RANK, &cnt) || cnt != na)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "sizes must hold %d int64 values", na);
        for (int j = 0; j < na; j++) {
            int a = p->axes[j];
            if (v[j] < 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "negative size");
            p->out[a] = v[j];
            p->scale[a] = x->dims[a] > 0 ? (double)v[j] / (double)x->dims[a] : 1.0;
            p->len[a] = (double)v[j];
        }
        for (int j = 0; p->keep && j < na; j++)
            if (x->dims[p->axes[j]] < 0)
                return AF_OK; /* the common scale needs every named input length */
        if (p->keep)
            keep_aspect(x, p);
    } else {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "one of scales and sizes is needed");
    }
    p->known = true;
    /* The roi moves samples, not the output shape: it may stay unknown until run time. */
    p->roi_known = p->coord != RZ_TF_CROP_AND_RESIZE;
    if (!p->roi_known && roi && roi->data) {
        if (af_tensor_numel(roi) != 2 * na || !tn_is_float(roi->dtype))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "roi must hold %d floats", 2 * na);
        for (int j = 0; j < na; j++) {
            p->roi[p->axes[j]] = af_tensor_get_double(roi, j);
            p->roi[AF_MAX_RANK + p->axes[j]] = af_tensor_get_double(roi, na + j);
        }
        p->roi_known = true;
    }
    return AF_OK;
}

static af_status rz_parse(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                          rz_params *p, af_error *err) {
    af_status st = parse_mode(n, p, err);
    if (st)
        return st;
    return parse_sizes(n, in, x, p, err);
}

af_status shape_resize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input 'X'");
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    rz_params p;
    af_status st = rz_parse(n, in, x, &p, err);
    if (st)
        return st;
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        dims[i] = p.known ? p.out[i] : -1;
    af_tensor_set_type(out, x->dtype, x->rank, dims);
    return AF_OK;
}

/* Input coordinate of output coordinate o on axis a. */
static double source_coord(const rz_params *p, int a, int64_t o, int64_t in_len) {
    double x = (double)o, s = p->scale[a], out_len = p->len[a];
    switch (p->coord) {
    case RZ_HALF_PIXEL: return (x + 0.5) / s - 0.5;
    case RZ_PYTORCH_HALF_PIXEL: return out_len > 1 ? (x + 0.5) / s - 0.5 : 0.0;
    case RZ_ALIGN_CORNERS: return out_len == 1 ? 0.0 : x * (double)(in_len - 1) / (out_len - 1);
    case RZ_TF_HALF_PIXEL_FOR_NN: return (x + 0.5) / s;
    case RZ_HALF_PIXEL_SYMMETRIC: {
        /* opset 19: half_pixel shifted so that the floor of in * scale loses as much at each
         * end: by (in / 2) * (1 - out / (in * scale)) */
        double adjust = out_len > 0 ? (double)p->out[a] / out_len : 1.0;
        return 0.5 * (double)in_len * (1.0 - adjust) + (x + 0.5) / s - 0.5;
    }
    case RZ_TF_CROP_AND_RESIZE: {
        double lo = p->roi[a], hi = p->roi[AF_MAX_RANK + a], span = (double)(in_len - 1);
        if (out_len > 1)
            return lo * span + x * (hi - lo) * span / (out_len - 1);
        return 0.5 * (lo + hi) * span;
    }
    default: return x / s;
    }
}

static int64_t nearest_index(const rz_params *p, int a, double x) {
    double r;
    switch (p->round) {
    case RZ_PREFER_FLOOR: r = ceil(x - 0.5); break;
    case RZ_PREFER_CEIL: r = floor(x + 0.5); break;
    case RZ_FLOOR: r = floor(x); break;
    case RZ_CEIL: r = ceil(x); break;
    default: r = p->scale[a] < 1 ? ceil(x) : floor(x); break;
    }
    return r < -1e18 ? INT64_MIN / 2 : r > 1e18 ? INT64_MAX / 2 : (int64_t)r;
}

static void cubic_coeffs(double t, double A, double *c) {
    double u = 1 - t;
    c[0] = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
    c[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    c[2] = ((A + 2) * u - (A + 3)) * u * u + 1;
    c[3] = ((A * (u + 1) - 5 * A) * (u + 1) + 8 * A) * (u + 1) - 4 * A;
}

static int64_t clamp_index(int64_t i, int64_t len) {
    return i < 0 ? 0 : i >= len ? len - 1 : i;
}

static void make_taps(const rz_params *p, int a, int64_t o, int64_t in_len, rz_taps *t) {
    double x = source_coord(p, a, o, in_len);
    t->n = 0;
    t->outside = p->coord == RZ_TF_CROP_AND_RESIZE && (x < 0 || x > (double)(in_len - 1));
    if (x != x || t->outside) {
        t->outside = true;
        return;
    }
    if (p->mode == RZ_NEAREST) {
        t->n = 1;
        t->idx[0] = clamp_index(nearest_index(p, a, x), in_len);
        t->w[0] = 1;
        return;
    }
    double fl = floor(x);
    if (fl < -1e15 || fl > 1e15)
        fl = fl < 0 ? -1e15 : 1e15;
    int64_t x0 = (int64_t)fl;
    double r = x - fl, w[4];
    int64_t idx[4];
    int cnt;
    if (p->mode == RZ_LINEAR) {
        cnt = 2;
        idx[0] = x0, idx[1] = x0 + 1;
        w[0] = 1 - r, w[1] = r;
    } else {
        cnt = 4;
        cubic_coeffs(r, p->cubic_a, w);
        for (int k = 0; k < 4; k++)
            idx[k] = x0 - 1 + k;
        if (p->exclude_outside) {
            double sum = 0;
            for (int k = 0; k < 4; k++) {
                if (idx[k] < 0 || idx[k] >= in_len)
                    w[k] = 0;
                sum += w[k];
            }
            for (int k = 0; k < 4 && sum != 0; k++)
                w[k] /= sum;
        }
    }
    for (int k = 0; k < cnt; k++) {
        if (w[k] == 0)
            continue;
        t->idx[t->n] = clamp_index(idx[k], in_len);
        t->w[t->n++] = w[k];
    }
    if (t->n == 0) { /* all weights cancelled: fall back to the nearest input */
        t->n = 1;
        t->idx[0] = clamp_index(x0, in_len);
        t->w[0] = 1;
    }
}

/* Value of one output element whose per-axis taps are tp[a]. */
static double sample(const af_tensor *x, const int64_t *xs, rz_taps *const *tp) {
    int r = x->rank, k[AF_MAX_RANK] = {0};
    double sum = 0;
    for (;;) {
        double w = 1;
        int64_t off = 0;
        for (int a = 0; a < r; a++) {
            w *= tp[a]->w[k[a]];
            off += tp[a]->idx[k[a]] * xs[a];
        }
        sum += w * af_tensor_get_double(x, off);
        int a = r - 1;
        for (; a >= 0; a--) {
            if (++k[a] < tp[a]->n)
                break;
            k[a] = 0;
        }
        if (a < 0)
            return sum;
    }
}

af_status tn_resize_plan(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                         tn_rz_plan *plan, af_error *err) {
    const af_tensor *x = in[0];
    rz_params p;
    size_t es;
    af_status st = rz_parse(n, in, x, &p, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    if (!p.known || !p.roi_known)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scales, sizes or roi missing");
    int r = x->rank;
    int64_t ntaps = 0;
    plan->taps = NULL;
    if (af_tensor_numel(out) == 0)
        return AF_OK;
    if (out->rank != r)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "resize shape mismatch");
    for (int a = 0; a < r; a++) {
        if (out->dims[a] != p.out[a])
            return af_node_fail(err, n, AF_ERR_INTERNAL, "resize shape mismatch");
        if (x->dims[a] == 0)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "cannot resize an empty axis");
        ntaps += out->dims[a];
    }
    if (p.mode != RZ_NEAREST && !tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    rz_taps *taps = af_calloc((size_t)ntaps + 1, sizeof *taps);
    if (!taps)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    rz_taps *t = taps;
    for (int a = 0; a < r; a++) {
        plan->axis[a] = t;
        for (int64_t o = 0; o < out->dims[a]; o++)
            make_taps(&p, a, o, x->dims[a], t++);
    }
    plan->taps = taps;
    plan->nearest = p.mode == RZ_NEAREST;
    plan->extrapolation = p.extrapolation;
    return AF_OK;
}

af_status ref_resize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input 'X'");
    int64_t total = af_tensor_numel(out);
    tn_rz_plan plan;
    af_status st = tn_resize_plan(n, in, out, &plan, err);
    if (st || total == 0)
        return st;
    int r = x->rank;
    size_t es = af_dtype_size(x->dtype);
    int64_t xs[AF_MAX_RANK], idx[AF_MAX_RANK] = {0};
    af_strides(x, xs);
    rz_taps *tp[AF_MAX_RANK];
    for (int64_t i = 0; i < total; i++) {
        bool outside = false;
        for (int a = 0; a < r; a++) {
            tp[a] = plan.axis[a] + idx[a];
            outside |= tp[a]->outside;
        }
        if (outside) {
            tn_setd(out, i, plan.extrapolation);
        } else if (plan.nearest) {
            int64_t off = 0;
            for (int a = 0; a < r; a++)
                off += tp[a]->idx[0] * xs[a];
            memcpy((char *)out->data + (size_t)i * es, (const char *)x->data + (size_t)off * es,
                   es);
        } else {
            tn_setd(out, i, sample(x, xs, tp));
        }
        tn_next(idx, out->dims, r);
    }
    af_free(plan.taps);
    return AF_OK;
}
