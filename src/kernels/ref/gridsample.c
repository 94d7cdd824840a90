/* Reference GridSample (ONNX opset 16): 2-D sampling of X [N, C, H, W] at the normalised
 * positions of grid [N, Ho, Wo, 2], with bilinear, nearest or bicubic interpolation, zeros,
 * border or reflection padding and align_corners, matching PyTorch's grid_sample (which ONNX
 * specifies it after).
 *
 * Invariant: every pixel read goes through gs_pixel, which returns 0 for positions outside the
 * image, so no coordinate computed from grid data (NaN, huge) can index outside X. */
#include "kernels/ref/nn_common.h"

typedef enum gs_mode { GS_BILINEAR, GS_NEAREST, GS_BICUBIC } gs_mode;
typedef enum gs_pad { GS_ZEROS, GS_BORDER, GS_REFLECTION } gs_pad;

typedef struct gs_opts {
    gs_mode mode;
    gs_pad pad;
    bool align;
} gs_opts;

static af_status gs_prepare(const af_node *n, const af_tensor *const *in, gs_opts *o,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *g = nn_in(n, in, 1);
    if (!x || !g)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing X or grid");
    if (!nn_is_float(x->dtype) || !nn_is_float(g->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "GridSample on %s", af_dtype_name(x->dtype));
    const char *m = af_attr_str(n, "mode", "bilinear"), *p = af_attr_str(n, "padding_mode", "zeros");
    if (!strcmp(m, "bilinear"))
        o->mode = GS_BILINEAR;
    else if (!strcmp(m, "nearest"))
        o->mode = GS_NEAREST;
    else if (!strcmp(m, "bicubic"))
        o->mode = GS_BICUBIC;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "mode '%s'", m);
    if (!strcmp(p, "zeros"))
        o->pad = GS_ZEROS;
    else if (!strcmp(p, "border"))
        o->pad = GS_BORDER;
    else if (!strcmp(p, "reflection"))
        o->pad = GS_REFLECTION;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "padding_mode '%s'", p);
    o->align = af_attr_int(n, "align_corners", 0) != 0;
    if ((x->rank >= 0 && x->rank != 4) || (g->rank >= 0 && g->rank != 4) ||
        (g->rank == 4 && g->dims[3] >= 0 && g->dims[3] != 2) ||
        (x->rank == 4 && g->rank == 4 && x->dims[0] >= 0 && g->dims[0] >= 0 &&
         x->dims[0] != g->dims[0]))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "X must be [N, C, H, W] and grid [N, Ho, Wo, 2] (2-D only)");
    return AF_OK;
}

static void gs_out_type(const af_tensor *const *in, af_tensor *y) {
    const af_tensor *x = in[0], *g = in[1];
    int64_t dims[4] = {x->rank == 4 ? x->dims[0] : -1, x->rank == 4 ? x->dims[1] : -1,
                       g->rank == 4 ? g->dims[1] : -1, g->rank == 4 ? g->dims[2] : -1};
    af_tensor_set_type(y, x->dtype, 4, dims);
}

af_status shape_grid_sample(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_error *err) {
    gs_opts o = {GS_BILINEAR, GS_ZEROS, false};
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

/* Pixel (y, x) of the plane at base, 0 outside the image (and for NaN coordinates). */
static double gs_pixel(const af_tensor *x, int64_t base, int64_t h, int64_t w, double yy,
                       double xx) {
    if (!(yy >= 0 && yy < (double)h && xx >= 0 && xx < (double)w))
        return 0.0;
    return af_tensor_get_double(x, base + (int64_t)yy * w + (int64_t)xx);
}

static double gs_cubic(double t, int k) {
    const double a = -0.75;
    double d = k == 0 ? t + 1 : k == 1 ? t : k == 2 ? 1 - t : 2 - t;
    if (k == 1 || k == 2)
        return ((a + 2) * d - (a + 3)) * d * d + 1;
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
}

static double gs_sample(const af_tensor *x, int64_t base, int64_t h, int64_t w, double gx,
                        double gy, const gs_opts *o) {
    double ix = gs_unnormalize(gx, w, o->align), iy = gs_unnormalize(gy, h, o->align);
    if (o->mode == GS_BICUBIC) {
        /* Padding applies to each of the 4 x 4 taps. */
        double x0 = floor(ix), y0 = floor(iy), tx = ix - x0, ty = iy - y0, acc = 0.0;
        for (int i = 0; i < 4; i++) {
            double row = 0.0;
            double yy = gs_pad_coord(y0 - 1 + i, h, o);
            for (int j = 0; j < 4; j++) {
                double xx = gs_pad_coord(x0 - 1 + j, w, o);
                row += gs_cubic(tx, j) * gs_pixel(x, base, h, w, yy, xx);
            }
            acc += gs_cubic(ty, i) * row;
        }
        return acc;
    }
    ix = gs_pad_coord(ix, w, o);
    iy = gs_pad_coord(iy, h, o);
    if (o->mode == GS_NEAREST)
        return gs_pixel(x, base, h, w, nearbyint(iy), nearbyint(ix));
    double x0 = floor(ix), y0 = floor(iy), lx = ix - x0, ly = iy - y0;
    return (1 - ly) * ((1 - lx) * gs_pixel(x, base, h, w, y0, x0) + lx * gs_pixel(x, base, h, w, y0, x0 + 1)) +
           ly * ((1 - lx) * gs_pixel(x, base, h, w, y0 + 1, x0) + lx * gs_pixel(x, base, h, w, y0 + 1, x0 + 1));
}

af_status ref_grid_sample(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_exec *ex, af_error *err) {
    (void)ex;
    gs_opts o = {GS_BILINEAR, GS_ZEROS, false};
    af_status st = gs_prepare(n, in, &o, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *g = in[1];
    if (!af_tensor_known(x) || !af_tensor_known(g))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    af_tensor t;
    gs_out_type(in, &t);
    if ((st = nn_check_out(n, &out[0], 4, t.dims, err)) != AF_OK)
        return st;
    int64_t nb = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3];
    int64_t oh = g->dims[1], ow = g->dims[2], yi = 0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++, yi++) {
                    int64_t gi = ((b * oh + i) * ow + j) * 2;
                    double v = gs_sample(x, (b * c + ch) * h * w, h, w, af_tensor_get_double(g, gi),
                                         af_tensor_get_double(g, gi + 1), &o);
                    nn_put(&out[0], yi, v);
                }
    return AF_OK;
}
