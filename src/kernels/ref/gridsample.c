/* Reference GridSample (ONNX opsets 16 and 20): sampling of X [N, C, D1..Dr] (r = 1, 2 or 3
 * spatial axes) at the normalised positions of grid [N, D1_out..Dr_out, r], with linear,
 * nearest or cubic interpolation (opset 16 names them bilinear, nearest, bicubic), zeros,
 * border or reflection padding and align_corners, matching PyTorch's grid_sample (which ONNX
 * specifies it after) and ONNX Runtime. N-linear and N-cubic are separable (gridsample.h), so
 * 3-D cubic, which ONNX defines and ONNX Runtime refuses, is the same code as 2-D.
 *
 * Invariant: every pixel read goes through gs_taps, which leaves out positions outside the
 * volume, so no coordinate computed from grid data (NaN, huge) can index outside X. */
#include "kernels/ref/gridsample.h"
#include "kernels/ref/nn_common.h"

/* The mode names of opset 20 (linear, cubic) and of opsets 16 to 19 (bilinear, bicubic): ONNX
 * Runtime takes each opset's names only, and so do we. */
static af_status gs_parse(const af_node *n, gs_opts *o, af_error *err) {
    bool v20 = af_graph_opset(n->graph) >= 20;
    const char *lin = v20 ? "linear" : "bilinear", *cub = v20 ? "cubic" : "bicubic";
    const char *m = af_attr_str(n, "mode", lin), *p = af_attr_str(n, "padding_mode", "zeros");
    if (!strcmp(m, lin))
        o->mode = GS_LINEAR;
    else if (!strcmp(m, "nearest"))
        o->mode = GS_NEAREST;
    else if (!strcmp(m, cub))
        o->mode = GS_CUBIC;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "mode '%s' (opset %lld: %s, nearest or %s)",
                            m, (long long)af_graph_opset(n->graph), lin, cub);
    if (!strcmp(p, "zeros"))
        o->pad = GS_ZEROS;
    else if (!strcmp(p, "border"))
        o->pad = GS_BORDER;
    else if (!strcmp(p, "reflection"))
        o->pad = GS_REFLECTION;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "padding_mode '%s'", p);
    o->align = af_attr_int(n, "align_corners", 0) != 0;
    return AF_OK;
}

af_status gs_prepare(const af_node *n, const af_tensor *const *in, gs_opts *o, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *g = nn_in(n, in, 1);
    if (!x || !g)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing X or grid");
    if (!nn_is_float(x->dtype) || !nn_is_float(g->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "GridSample on %s", af_dtype_name(x->dtype));
    af_status st = gs_parse(n, o, err);
    if (st != AF_OK)
        return st;
    int rank = x->rank >= 0 ? x->rank : g->rank;
    if (rank >= 0 && (rank < 3 || rank > 2 + GS_MAX_DIMS))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "X of rank %d: 1 to %d spatial axes are supported", rank, GS_MAX_DIMS);
    o->r = rank >= 0 ? rank - 2 : 0;
    if ((x->rank >= 0 && g->rank >= 0 && x->rank != g->rank) ||
        (g->rank >= 0 && o->r > 0 && g->dims[g->rank - 1] >= 0 && g->dims[g->rank - 1] != o->r) ||
        (x->rank >= 0 && g->rank >= 0 && x->dims[0] >= 0 && g->dims[0] >= 0 &&
         x->dims[0] != g->dims[0]))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "X must be [N, C, D1..Dr] and grid [N, D1_out..Dr_out, r]");
    return AF_OK;
}

static void gs_out_type(const af_tensor *const *in, af_tensor *y) {
    const af_tensor *x = in[0], *g = in[1];
    if (x->rank < 0 && g->rank < 0) {
        af_tensor_set_type(y, x->dtype, -1, NULL);
        return;
    }
    int rank = x->rank >= 0 ? x->rank : g->rank;
    int64_t dims[2 + GS_MAX_DIMS];
    dims[0] = x->rank >= 0 ? x->dims[0] : g->dims[0];
    dims[1] = x->rank >= 0 ? x->dims[1] : -1;
    for (int d = 2; d < rank; d++) dims[d] = g->rank >= 0 ? g->dims[d - 1] : -1;
    af_tensor_set_type(y, x->dtype, rank, dims);
}

af_status shape_grid_sample(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    gs_opts o;
    af_status st = gs_prepare(n, in, &o, err);
    if (st == AF_OK)
        gs_out_type(in, &out[0]);
    return st;
}

/* Normalised [-1, 1] to pixel coordinates. */
static double gs_unnormalize(double c, int64_t size, bool align) {
    return align ? (c + 1) / 2 * (double)(size - 1) : ((c + 1) * (double)size - 1) / 2;
}

/* Reflect c into [lo2/2, hi2/2] (bounds given doubled so that half pixels stay exact). */
static double gs_reflect(double c, double lo2, double hi2) {
    if (lo2 == hi2)
        return 0;
    double lo = lo2 / 2, span = (hi2 - lo2) / 2;
    c = fabs(c - lo);
    double extra = fmod(c, span), flips = floor(c / span);
    return fmod(flips, 2) == 0 ? extra + lo : span - extra + lo;
}

/* Apply border or reflection padding to a pixel coordinate. */
static double gs_pad_coord(double c, int64_t size, const gs_opts *o) {
    if (o->pad == GS_BORDER)
        return nn_clamp(c, 0, (double)(size - 1));
    if (o->pad == GS_REFLECTION) {
        c = o->align ? gs_reflect(c, 0, 2.0 * (double)(size - 1))
                     : gs_reflect(c, -1, 2.0 * (double)size - 1);
        return nn_clamp(c, 0, (double)(size - 1));
    }
    return c;
}

static double gs_cubic(double t, int k) {
    const double a = -0.75;
    double d = k == 0 ? t + 1 : k == 1 ? t : k == 2 ? 1 - t : 2 - t;
    if (k == 1 || k == 2)
        return ((a + 2) * d - (a + 3)) * d * d + 1;
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
}

/* The taps of one axis: up to 4 (index, weight). */
typedef struct gs_axis {
    int n;
    int64_t idx[4];
    double w[4];
} gs_axis;

/* Adds pixel coordinate c (an integer after padding) with weight w when it is inside the axis
 * (NaN is not). */
static void gs_add(gs_axis *a, double c, int64_t size, double w) {
    if (!(c >= 0 && c < (double)size))
        return;
    a->idx[a->n] = (int64_t)c;
    a->w[a->n++] = w;
}

/* The taps along one axis of length size at normalised coordinate g. Cubic pads each of its 4
 * taps (PyTorch's order); linear and nearest pad the coordinate first. */
static void gs_axis_taps(const gs_opts *o, double g, int64_t size, gs_axis *a) {
    double c = gs_unnormalize(g, size, o->align);
    a->n = 0;
    if (o->mode == GS_CUBIC) {
        double c0 = floor(c), t = c - c0;
        for (int k = 0; k < 4; k++)
            gs_add(a, gs_pad_coord(c0 - 1 + k, size, o), size, gs_cubic(t, k));
        return;
    }
    c = gs_pad_coord(c, size, o);
    if (o->mode == GS_NEAREST) {
        gs_add(a, nearbyint(c), size, 1.0);
        return;
    }
    double c0 = floor(c), l = c - c0;
    gs_add(a, c0, size, 1 - l);
    gs_add(a, c0 + 1, size, l);
}

int gs_taps(const gs_opts *o, const int64_t *size, const double *g, int64_t *off, double *w) {
    gs_axis ax[GS_MAX_DIMS];
    for (int d = 0; d < o->r; d++) gs_axis_taps(o, g[o->r - 1 - d], size[d], &ax[d]);
    /* The product of the axes' taps, outermost axis slowest, built in place: tap p of the axes
     * so far becomes taps p * n .. p * n + n - 1, written from the last p down so that no tap is
     * overwritten before it is read. */
    int count = 1;
    off[0] = 0;
    w[0] = 1.0;
    for (int d = 0; d < o->r; d++) {
        const gs_axis *a = &ax[d];
        for (int p = count - 1; p >= 0; p--) {
            int64_t base = off[p] * size[d];
            double wp = w[p];
            for (int k = a->n - 1; k >= 0; k--) {
                off[p * a->n + k] = base + a->idx[k];
                w[p * a->n + k] = wp * a->w[k];
            }
        }
        count *= a->n;
    }
    return count;
}

af_status ref_grid_sample(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    (void)ex;
    gs_opts o;
    af_status st = gs_prepare(n, in, &o, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *g = in[1];
    if (!af_tensor_known(x) || !af_tensor_known(g))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    gs_out_type(in, &t);
    if ((st = nn_check_out(n, &out[0], t.rank, t.dims, err)) != AF_OK)
        return st;
    int64_t nb = x->dims[0], c = x->dims[1], vol = 1, outs = 1;
    for (int d = 0; d < o.r; d++) {
        vol *= x->dims[2 + d];
        outs *= t.dims[2 + d];
    }
    int64_t off[GS_MAX_TAPS];
    double w[GS_MAX_TAPS], gp[GS_MAX_DIMS];
    /* The taps depend on the point only: found once, read for every channel. */
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < outs; s++) {
            for (int d = 0; d < o.r; d++) gp[d] = af_tensor_get_double(g, (b * outs + s) * o.r + d);
            int taps = gs_taps(&o, x->dims + 2, gp, off, w);
            for (int64_t ch = 0; ch < c; ch++) {
                int64_t base = (b * c + ch) * vol;
                double v = 0.0;
                for (int k = 0; k < taps; k++) v += w[k] * af_tensor_get_double(x, base + off[k]);
                nn_put(&out[0], (b * c + ch) * outs + s, v);
            }
        }
    return AF_OK;
}
