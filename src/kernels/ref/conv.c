/* Reference convolutions: Conv, ConvTranspose, ConvInteger and QLinearConv (ONNX opsets 7..17),
 * for 1-D, 2-D and 3-D inputs with any group count, dilation, stride and padding.
 *
 * Invariant: every output element is produced by one accumulator (a double) and written exactly
 * once through conv_emit, the per-element epilogue. A later fused kernel replaces conv_emit's
 * body (bias, scale, activation...) without touching the loop nest. Geometry is validated with
 * overflow-checked arithmetic before any loop runs, so the loops index only inside the tensors. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

/* The geometry of one convolution: the sliding window plus channels and groups. */
typedef struct conv_geom {
    nn_window w;
    int64_t batch;  /* N */
    int64_t cin;    /* C: input channels */
    int64_t cout;   /* M: output channels */
    int64_t group;
    int64_t cg, mg; /* input and output channels per group */
} conv_geom;

/* How a finished accumulator becomes an output element: (acc + bias[m]) * scale[m] + zero. */
typedef struct conv_epilogue {
    af_tensor *y;
    const double *bias;  /* [M] or NULL */
    const double *scale; /* [M] requantization multiplier, or NULL */
    double zero_point;   /* added after scaling (quantized outputs) */
} conv_epilogue;

static inline void conv_emit(const conv_epilogue *e, int64_t i, int64_t m, double acc) {
    if (e->bias)
        acc += e->bias[m];
    if (e->scale)
        acc = acc * e->scale[m] + e->zero_point;
    nn_put(e->y, i, acc);
}

/* Kernel sizes from the kernel_shape attribute or, when absent, from W's dims 2..; -1 unknown. */
static af_status conv_kernel_shape(const af_node *n, const af_tensor *wt, int nsp, int64_t *k,
                                   af_error *err) {
    const int64_t *ks = NULL;
    int nks = af_attr_ints(n, "kernel_shape", &ks);
    if (nks >= 0 && nks != nsp)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "kernel_shape has %d values for %d spatial dims", nks, nsp);
    for (int i = 0; i < nsp; i++) {
        int64_t wd = wt->rank == nsp + 2 ? wt->dims[2 + i] : -1;
        if (nks >= 0) {
            if (ks[i] < 1)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "kernel_shape[%d] = %lld", i,
                                    (long long)ks[i]);
            if (wd >= 0 && wd != ks[i])
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "kernel_shape[%d] = %lld but W has %lld", i,
                                    (long long)ks[i], (long long)wd);
            k[i] = ks[i];
        } else {
            k[i] = wd;
        }
    }
    return AF_OK;
}

/* Spatial rank of x (rank 3..5); -1 when x's rank is unknown. */
static af_status conv_nsp(const af_node *n, const af_tensor *x, const af_tensor *wt, int *nsp,
                          af_error *err) {
    int rank = x->rank >= 0 ? x->rank : wt->rank;
    *nsp = -1;
    if (rank < 0)
        return AF_OK;
    if (rank < 3 || rank > NN_MAXSP + 2)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "input rank %d (1 to %d spatial dims supported)", rank, NN_MAXSP);
    if (wt->rank >= 0 && wt->rank != rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X has rank %d but W has rank %d", rank,
                            wt->rank);
    *nsp = rank - 2;
    return AF_OK;
}

/* The start both geometries share: zeroes g, then sets the spatial rank and, when it is known,
 * the group count, batch and input channels from X. g->w.nsp = -1 (nothing else) when the rank
 * is unknown. */
static af_status geom_begin(const af_node *n, const af_tensor *x, const af_tensor *wt,
                            conv_geom *g, af_error *err) {
    memset(g, 0, sizeof(*g));
    int nsp;
    af_status st = conv_nsp(n, x, wt, &nsp, err);
    if (st != AF_OK)
        return st;
    g->w.nsp = nsp;
    if (nsp < 0)
        return AF_OK;
    g->group = af_attr_int(n, "group", 1);
    if (g->group < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "group = %lld", (long long)g->group);
    g->batch = x->rank >= 0 ? x->dims[0] : -1;
    g->cin = x->rank >= 0 ? x->dims[1] : -1;
    return AF_OK;
}

/* Group, channel and window checks shared by Conv, ConvInteger and QLinearConv.
 * W is [M, C/group, k...]. Sets g->w.nsp = -1 (nothing else) when the rank is unknown. */
static af_status conv_setup(const af_node *n, const af_tensor *x, const af_tensor *wt,
                            conv_geom *g, af_error *err) {
    af_status st = geom_begin(n, x, wt, g, err);
    if (st != AF_OK || g->w.nsp < 0)
        return st;
    int nsp = g->w.nsp;
    g->cout = wt->rank >= 0 ? wt->dims[0] : -1;
    g->cg = wt->rank >= 0 ? wt->dims[1] : -1;
    if (g->cin >= 0 && g->cg >= 0 && (g->cin % g->group != 0 || g->cin / g->group != g->cg))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "X has %lld channels but W expects %lld per group x %lld groups",
                            (long long)g->cin, (long long)g->cg, (long long)g->group);
    if (g->cout >= 0) {
        if (g->cout % g->group != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "%lld output channels not divisible by group %lld",
                                (long long)g->cout, (long long)g->group);
        g->mg = g->cout / g->group;
    }
    int64_t k[NN_MAXSP];
    st = conv_kernel_shape(n, wt, nsp, k, err);
    if (st != AF_OK)
        return st;
    /* The window needs a real x; with x's rank unknown, describe one with unknown dims. */
    af_tensor xs = *x;
    if (xs.rank < 0) {
        xs.rank = nsp + 2;
        for (int i = 0; i < xs.rank; i++)
            xs.dims[i] = -1;
    }
    return nn_window_init(n, &xs, k, nsp, false, &g->w, err);
}

/* Output type [N, M, out...] of a convolution, or rank -1 when unknown. */
static void conv_out_type(const conv_geom *g, af_dtype dt, af_tensor *y) {
    int64_t dims[AF_MAX_RANK];
    if (g->w.nsp < 0) {
        af_tensor_set_type(y, dt, -1, NULL);
        return;
    }
    dims[0] = g->batch;
    dims[1] = g->cout;
    for (int i = 0; i < g->w.nsp; i++)
        dims[2 + i] = g->w.out[NN_MAXSP - g->w.nsp + i];
    af_tensor_set_type(y, dt, g->w.nsp + 2, dims);
}

static af_status conv_out_check(const af_node *n, const conv_geom *g, const af_tensor *y,
                                af_error *err) {
    af_tensor t;
    conv_out_type(g, y->dtype, &t);
    return nn_check_out(n, y, t.rank, t.dims, err);
}

/* The direct convolution loop nest over double copies of X [N, C, D, H, W] and
 * W [M, C/group, kD, kH, kW] (padded to 3 spatial dims). `acc` has room for one output row. */
static void conv_core(const conv_geom *g, const double *x, const double *w,
                      const conv_epilogue *e, double *acc) {
    const nn_window *win = &g->w;
    const int64_t *in = win->in, *out = win->out, *k = win->k;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t m = 0; m < g->cout; m++) {
            int64_t grp = m / g->mg;
            for (int64_t od = 0; od < out[0]; od++)
                for (int64_t oh = 0; oh < out[1]; oh++) {
                    for (int64_t ow = 0; ow < out[2]; ow++)
                        acc[ow] = 0.0;
                    for (int64_t cc = 0; cc < g->cg; cc++) {
                        int64_t c = grp * g->cg + cc;
                        for (int64_t kd = 0; kd < k[0]; kd++) {
                            int64_t id = od * win->s[0] - win->pb[0] + kd * win->d[0];
                            if (id < 0 || id >= in[0])
                                continue;
                            for (int64_t kh = 0; kh < k[1]; kh++) {
                                int64_t ih = oh * win->s[1] - win->pb[1] + kh * win->d[1];
                                if (ih < 0 || ih >= in[1])
                                    continue;
                                const double *xrow = x + (((b * g->cin + c) * in[0] + id) * in[1] + ih) * in[2];
                                const double *wrow = w + (((m * g->cg + cc) * k[0] + kd) * k[1] + kh) * k[2];
                                for (int64_t kw = 0; kw < k[2]; kw++) {
                                    int64_t lo, hi;
                                    nn_window_range(win, 2, kw, &lo, &hi);
                                    double wv = wrow[kw];
                                    int64_t base = kw * win->d[2] - win->pb[2];
                                    for (int64_t ow = lo; ow < hi; ow++)
                                        acc[ow] += wv * xrow[ow * win->s[2] + base];
                                }
                            }
                        }
                    }
                    int64_t yrow = (((b * g->cout + m) * out[0] + od) * out[1] + oh) * out[2];
                    for (int64_t ow = 0; ow < out[2]; ow++)
                        conv_emit(e, yrow + ow, m, acc[ow]);
                }
        }
}

/* Run conv_core on loaded operands; x and w are subtracted their zero points already. */
static af_status conv_run(const af_node *n, const conv_geom *g, const double *x, const double *w,
                          const conv_epilogue *e, af_error *err) {
    double *acc = af_malloc((size_t)(g->w.out[2] > 0 ? g->w.out[2] : 1) * sizeof(double));
    if (!acc)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    conv_core(g, x, w, e, acc);
    af_free(acc);
    return AF_OK;
}

/* A malloc'ed vector of `count` doubles from an optional tensor of `count` values or one value
 * (broadcast); `dflt` when the tensor is omitted. Used for bias (length M) and for per-tensor or
 * per-channel quantization parameters. The caller frees *out, also on failure. */
static af_status conv_channel_vec(const af_node *n, const af_tensor *t, int64_t count,
                                  const char *what, double dflt, double **out, af_error *err) {
    *out = af_malloc((size_t)(count > 0 ? count : 1) * sizeof(double));
    if (!*out)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    int64_t tn = t ? af_tensor_numel(t) : 0;
    if (t && tn != 1 && tn != count)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %lld elements, expected 1 or %lld",
                            what, (long long)tn, (long long)count);
    if (t && t->rank > 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be a scalar or 1-D", what);
    for (int64_t i = 0; i < count; i++)
        (*out)[i] = t ? af_tensor_get_double(t, tn == 1 ? 0 : i) : dflt;
    return AF_OK;
}


/* Load t as doubles minus a zero point: zp[0] for the whole tensor (nzp == 1) or zp[i] for
 * block i of `nzp` equal blocks along the first axis (per-output-channel weights). */
static af_status conv_load_shifted(const af_node *n, const af_tensor *t, const double *zp,
                                   int64_t nzp, double **out, af_error *err) {
    af_status st = nn_load(n, t, out, err);
    if (st != AF_OK || !zp)
        return st;
    int64_t total = af_tensor_numel(t);
    int64_t block = nzp > 0 ? total / nzp : 0;
    for (int64_t i = 0; i < total; i++)
        (*out)[i] -= zp[nzp == 1 || block == 0 ? 0 : i / block];
    return AF_OK;
}

/* ---- sliding windows ------------------------------------------------------------------------- */

af_status nn_autopad_parse(const af_node *n, nn_autopad *pad, af_error *err) {
    const char *s = af_attr_str(n, "auto_pad", "NOTSET");
    if (strcmp(s, "NOTSET") == 0 || s[0] == '\0')
        *pad = NN_PAD_NOTSET;
    else if (strcmp(s, "SAME_UPPER") == 0)
        *pad = NN_PAD_SAME_UPPER;
    else if (strcmp(s, "SAME_LOWER") == 0)
        *pad = NN_PAD_SAME_LOWER;
    else if (strcmp(s, "VALID") == 0)
        *pad = NN_PAD_VALID;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "unknown auto_pad '%s'", s);
    return AF_OK;
}

/* An ints attribute with `count` values, each >= min; absent means all `dflt`. */
static af_status win_ints(const af_node *n, const char *name, int count, int64_t dflt,
                          int64_t min, int64_t *v, af_error *err) {
    const int64_t *a = NULL;
    int na = af_attr_ints(n, name, &a);
    if (na >= 0 && na != count)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %d values, expected %d", name,
                            na, count);
    for (int i = 0; i < count; i++) {
        v[i] = na >= 0 ? a[i] : dflt;
        if (v[i] < min)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s[%d] = %lld", name, i,
                                (long long)v[i]);
    }
    return AF_OK;
}

/* Reset w to the identity window over nsp spatial dims. */
static void win_reset(nn_window *w, int nsp) {
    w->nsp = nsp;
    for (int j = 0; j < NN_MAXSP; j++) {
        w->in[j] = w->out[j] = w->k[j] = w->s[j] = w->d[j] = 1;
        w->pb[j] = w->pe[j] = 0;
    }
}

/* Strides, dilations and pads (NOTSET form) into the padded slots of w. */
static af_status win_attrs(const af_node *n, int nsp, nn_window *w, af_error *err) {
    int64_t s[NN_MAXSP], d[NN_MAXSP], p[2 * NN_MAXSP];
    af_status st = win_ints(n, "strides", nsp, 1, 1, s, err);
    if (st == AF_OK)
        st = win_ints(n, "dilations", nsp, 1, 1, d, err);
    if (st == AF_OK)
        st = win_ints(n, "pads", 2 * nsp, 0, 0, p, err);
    if (st != AF_OK)
        return st;
    for (int i = 0; i < nsp; i++) {
        int j = NN_MAXSP - nsp + i;
        w->s[j] = s[i];
        w->d[j] = d[i];
        w->pb[j] = p[i];
        w->pe[j] = p[nsp + i];
    }
    return AF_OK;
}

/* Dilated kernel extent (k - 1) * d + 1; false on overflow. */
static bool win_extent(int64_t k, int64_t d, int64_t *dk) {
    return af_mul_i64(k - 1, d, dk) && af_add_i64(*dk, 1, dk);
}

af_status nn_window_init(const af_node *n, const af_tensor *x, const int64_t *k, int nsp,
                         bool ceil_mode, nn_window *w, af_error *err) {
    AF_ASSERT(nsp >= 1 && nsp <= NN_MAXSP && x->rank == nsp + 2);
    win_reset(w, nsp);
    nn_autopad pad;
    af_status st = nn_autopad_parse(n, &pad, err);
    if (st == AF_OK)
        st = win_attrs(n, nsp, w, err);
    if (st != AF_OK)
        return st;
    for (int i = 0; i < nsp; i++) {
        int j = NN_MAXSP - nsp + i;
        int64_t in = x->dims[2 + i], s = w->s[j], dk, span, out;
        w->in[j] = in;
        w->k[j] = k[i];
        if (in < 0 || k[i] < 0) {
            w->out[j] = -1;
            continue;
        }
        if (!win_extent(k[i], w->d[j], &dk))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "kernel extent overflows");
        switch (pad) {
        case NN_PAD_NOTSET:
            if (!af_add_i64(in, w->pb[j], &span) || !af_add_i64(span, w->pe[j], &span))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "padding overflows");
            span -= dk;
            if (span < 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "kernel extent %lld exceeds padded input %lld in dim %d",
                                    (long long)dk, (long long)(span + dk), i);
            out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
            /* A last window starting inside the end padding would see only padding. */
            if (ceil_mode && (out - 1) * s >= in + w->pb[j])
                out--;
            break;
        case NN_PAD_VALID:
            w->pb[j] = w->pe[j] = 0;
            if (in < dk)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "kernel extent %lld exceeds input %lld in dim %d",
                                    (long long)dk, (long long)in, i);
            out = (in - dk) / s + 1;
            break;
        default: {
            out = in / s + (in % s != 0);
            int64_t total = (out - 1) * s + dk - in; /* <= dk: no overflow */
            if (total < 0)
                total = 0;
            if (pad == NN_PAD_SAME_UPPER) {
                w->pb[j] = total / 2;
                w->pe[j] = total - total / 2;
            } else {
                w->pe[j] = total / 2;
                w->pb[j] = total - total / 2;
            }
            break;
        }
        }
        if (out < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "empty output in spatial dim %d", i);
        w->out[j] = out;
    }
    return AF_OK;
}

/* floor(a / b) and ceil(a / b) for b > 0 and any sign of a. */
static int64_t floordiv(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}
static int64_t ceildiv(int64_t a, int64_t b) {
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

void nn_window_range(const nn_window *w, int i, int64_t kk, int64_t *lo, int64_t *hi) {
    /* Input index o*s + base must lie in [0, in). */
    int64_t base = kk * w->d[i] - w->pb[i];
    int64_t l = ceildiv(-base, w->s[i]);
    int64_t h = floordiv(w->in[i] - 1 - base, w->s[i]) + 1;
    *lo = l < 0 ? 0 : l;
    *hi = h > w->out[i] ? w->out[i] : h;
    if (*hi < *lo)
        *hi = *lo;
}

/* ---- Conv ------------------------------------------------------------------------------------ */

/* Fetch X, W and bias of a Conv and derive the geometry; shared by the shape function and the
 * kernel so that both see the same checks. */
static af_status convt_setup(const af_node *n, const af_tensor *x, const af_tensor *wt,
                             conv_geom *g, af_error *err);

/* Inputs and geometry of a float Conv (transpose false) or ConvTranspose (transpose true). */
static af_status conv_prepare(const af_node *n, const af_tensor *const *in, bool transpose,
                              const af_tensor **x, const af_tensor **wt, const af_tensor **b,
                              conv_geom *g, af_error *err) {
    *x = nn_in(n, in, 0);
    *wt = nn_in(n, in, 1);
    *b = nn_in(n, in, 2);
    if (!*x || !*wt)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or W");
    if (!nn_is_float((*x)->dtype) || (*wt)->dtype != (*x)->dtype ||
        (*b && (*b)->dtype != (*x)->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                            af_dtype_name((*x)->dtype));
    af_status st = transpose ? convt_setup(n, *x, *wt, g, err) : conv_setup(n, *x, *wt, g, err);
    if (st != AF_OK)
        return st;
    const af_tensor *bt = *b;
    if (bt && bt->rank >= 0 &&
        (bt->rank != 1 || (bt->dims[0] >= 0 && g->cout >= 0 && bt->dims[0] != g->cout)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bias must be 1-D with %lld elements",
                            (long long)g->cout);
    return AF_OK;
}

af_status shape_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    const af_tensor *x, *wt, *b;
    conv_geom g;
    af_status st = conv_prepare(n, in, false, &x, &wt, &b, &g, err);
    if (st != AF_OK)
        return st;
    conv_out_type(&g, x->dtype, &out[0]);
    return AF_OK;
}

/* Kernel-time checks: everything known and the output as the shape function made it. */
static af_status conv_ready(const af_node *n, const conv_geom *g, const af_tensor *x,
                            const af_tensor *wt, const af_tensor *y, af_error *err) {
    if (g->w.nsp < 0 || !af_tensor_known(x) || !af_tensor_known(wt))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input shapes unknown at run time");
    return conv_out_check(n, g, y, err);
}

/* Run-time start of a float Conv or ConvTranspose: checks the inputs against the output y and
 * loads X, W and B (*bd stays NULL without B) as doubles. The caller frees the three buffers,
 * also on failure. */
static af_status conv_load(const af_node *n, const af_tensor *const *in, bool transpose,
                           const af_tensor *y, conv_geom *g, double **xd, double **wd,
                           double **bd, af_error *err) {
    const af_tensor *x, *wt, *b;
    af_status st = conv_prepare(n, in, transpose, &x, &wt, &b, g, err);
    if (st == AF_OK)
        st = conv_ready(n, g, x, wt, y, err);
    if (st == AF_OK)
        st = nn_load(n, x, xd, err);
    if (st == AF_OK)
        st = nn_load(n, wt, wd, err);
    if (st == AF_OK && b)
        st = conv_channel_vec(n, b, g->cout, "B", 0.0, bd, err);
    return st;
}

af_status ref_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    (void)ex;
    conv_geom g;
    double *xd = NULL, *wd = NULL, *bd = NULL;
    af_status st = conv_load(n, in, false, &out[0], &g, &xd, &wd, &bd, err);
    if (st == AF_OK) {
        conv_epilogue e = {&out[0], bd, NULL, 0.0};
        st = conv_run(n, &g, xd, wd, &e, err);
    }
    af_free(xd);
    af_free(wd);
    af_free(bd);
    return st;
}

/* ---- ConvInteger and QLinearConv --------------------------------------------------------------- */

/* Quantized convolutions share Conv's geometry; their X and W slots differ. */
static af_status qconv_prepare(const af_node *n, const af_tensor *const *in, int xi, int wi,
                               const af_tensor **x, const af_tensor **wt, conv_geom *g,
                               af_error *err) {
    *x = nn_in(n, in, xi);
    *wt = nn_in(n, in, wi);
    if (!*x || !*wt)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input x or w");
    af_dtype xt = (*x)->dtype, wtt = (*wt)->dtype;
    if ((xt != AF_DTYPE_UINT8 && xt != AF_DTYPE_INT8) ||
        (wtt != AF_DTYPE_UINT8 && wtt != AF_DTYPE_INT8))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s/%s", n->op_type,
                            af_dtype_name(xt), af_dtype_name(wtt));
    return conv_setup(n, *x, *wt, g, err);
}

af_status shape_conv_integer(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    const af_tensor *x, *wt;
    conv_geom g;
    af_status st = qconv_prepare(n, in, 0, 1, &x, &wt, &g, err);
    if (st != AF_OK)
        return st;
    conv_out_type(&g, AF_DTYPE_INT32, &out[0]);
    return AF_OK;
}

/* The accumulations are exact in double: 8-bit products are below 2^17 and a kernel volume
 * would need 2^36 taps to reach 2^53. */
af_status ref_conv_integer(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x, *wt;
    conv_geom g;
    double *xzp = NULL, *wzp = NULL, *xd = NULL, *wd = NULL;
    af_status st = qconv_prepare(n, in, 0, 1, &x, &wt, &g, err);
    if (st == AF_OK)
        st = conv_ready(n, &g, x, wt, &out[0], err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 2), 1, "x_zero_point", 0.0, &xzp, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 3), g.cout, "w_zero_point", 0.0, &wzp, err);
    if (st == AF_OK)
        st = conv_load_shifted(n, x, xzp, 1, &xd, err);
    if (st == AF_OK)
        st = conv_load_shifted(n, wt, wzp, g.cout, &wd, err);
    if (st == AF_OK) {
        conv_epilogue e = {&out[0], NULL, NULL, 0.0};
        st = conv_run(n, &g, xd, wd, &e, err);
    }
    af_free(xzp);
    af_free(wzp);
    af_free(xd);
    af_free(wd);
    return st;
}

/* QLinearConv inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
 * y_zero_point, B. The output type is y_zero_point's (x's when it is omitted). */
af_status shape_qlinear_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    const af_tensor *x, *wt, *yzp = nn_in(n, in, 7);
    conv_geom g;
    af_status st = qconv_prepare(n, in, 0, 3, &x, &wt, &g, err);
    if (st != AF_OK)
        return st;
    if (!nn_in(n, in, 1) || !nn_in(n, in, 4) || !nn_in(n, in, 6))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing a scale input");
    af_dtype yt = yzp ? yzp->dtype : x->dtype;
    if (yt != AF_DTYPE_UINT8 && yt != AF_DTYPE_INT8)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "QLinearConv output %s", af_dtype_name(yt));
    conv_out_type(&g, yt, &out[0]);
    return AF_OK;
}

af_status ref_qlinear_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x, *wt;
    conv_geom g;
    double *xs = NULL, *xzp = NULL, *ws = NULL, *wzp = NULL, *ys = NULL, *yzp = NULL;
    double *bias = NULL, *xd = NULL, *wd = NULL;
    af_status st = qconv_prepare(n, in, 0, 3, &x, &wt, &g, err);
    if (st == AF_OK)
        st = conv_ready(n, &g, x, wt, &out[0], err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 1), 1, "x_scale", 1.0, &xs, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 2), 1, "x_zero_point", 0.0, &xzp, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 4), g.cout, "w_scale", 1.0, &ws, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 5), g.cout, "w_zero_point", 0.0, &wzp, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 6), 1, "y_scale", 1.0, &ys, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 7), 1, "y_zero_point", 0.0, &yzp, err);
    if (st == AF_OK)
        st = conv_channel_vec(n, nn_in(n, in, 8), g.cout, "B", 0.0, &bias, err);
    if (st == AF_OK && (ys[0] == 0.0 || !isfinite(ys[0])))
        st = af_node_fail(err, n, AF_ERR_RUNTIME, "y_scale must be finite and non-zero");
    if (st == AF_OK)
        st = conv_load_shifted(n, x, xzp, 1, &xd, err);
    if (st == AF_OK)
        st = conv_load_shifted(n, wt, wzp, g.cout, &wd, err);
    if (st == AF_OK) {
        /* ws becomes the per-channel requantization multiplier x_scale * w_scale / y_scale. */
        for (int64_t m = 0; m < g.cout; m++)
            ws[m] = xs[0] * ws[m] / ys[0];
        conv_epilogue e = {&out[0], bias, ws, yzp[0]};
        st = conv_run(n, &g, xd, wd, &e, err);
    }
    af_free(xs);
    af_free(xzp);
    af_free(ws);
    af_free(wzp);
    af_free(ys);
    af_free(yzp);
    af_free(bias);
    af_free(xd);
    af_free(wd);
    return st;
}

/* ---- ConvTranspose --------------------------------------------------------------------------- */

/* ConvTranspose geometry: W is [C, M/group, k...]; w.in is X's spatial size and w.out Y's.
 * Padding comes from pads, or from output_shape / auto_pad as the ONNX spec derives it. */
static af_status convt_setup(const af_node *n, const af_tensor *x, const af_tensor *wt,
                             conv_geom *g, af_error *err) {
    af_status st = geom_begin(n, x, wt, g, err);
    if (st != AF_OK || g->w.nsp < 0)
        return st;
    int nsp = g->w.nsp;
    win_reset(&g->w, nsp);
    int64_t wc = wt->rank >= 0 ? wt->dims[0] : -1;
    g->mg = wt->rank >= 0 ? wt->dims[1] : -1;
    if (g->cin >= 0 && wc >= 0 && g->cin != wc)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X has %lld channels but W has %lld",
                            (long long)g->cin, (long long)wc);
    if (g->cin < 0)
        g->cin = wc;
    if (g->cin >= 0) {
        if (g->cin % g->group != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "%lld input channels not divisible by group %lld",
                                (long long)g->cin, (long long)g->group);
        g->cg = g->cin / g->group;
    }
    g->cout = -1;
    if (g->mg >= 0 && !af_mul_i64(g->mg, g->group, &g->cout))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output channels overflow");

    int64_t k[NN_MAXSP], op[NN_MAXSP], oshape[NN_MAXSP + 2];
    nn_autopad pad;
    if ((st = conv_kernel_shape(n, wt, nsp, k, err)) != AF_OK ||
        (st = nn_autopad_parse(n, &pad, err)) != AF_OK ||
        (st = win_attrs(n, nsp, &g->w, err)) != AF_OK ||
        (st = win_ints(n, "output_padding", nsp, 0, 0, op, err)) != AF_OK)
        return st;
    const int64_t *os = NULL;
    int nos = af_attr_ints(n, "output_shape", &os);
    if (nos >= 0 && nos != nsp && nos != nsp + 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output_shape has %d values", nos);
    for (int i = 0; i < nsp; i++)
        oshape[i] = nos >= 0 ? os[nos - nsp + i] : -1;

    for (int i = 0; i < nsp; i++) {
        int j = NN_MAXSP - nsp + i;
        int64_t in = x->rank >= 0 ? x->dims[2 + i] : -1, s = g->w.s[j], dk, full, out;
        g->w.in[j] = in;
        g->w.k[j] = k[i];
        g->w.out[j] = -1;
        if (in < 0 || k[i] < 0)
            continue;
        if (in < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "empty spatial input dim %d", i);
        /* The unpadded ("full") output extent: s * (in - 1) + output_padding + dk. */
        if (!win_extent(k[i], g->w.d[j], &dk) || !af_mul_i64(s, in - 1, &full) ||
            !af_add_i64(full, op[i], &full) || !af_add_i64(full, dk, &full))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output size overflows");
        if (oshape[i] >= 0 || pad == NN_PAD_SAME_UPPER || pad == NN_PAD_SAME_LOWER) {
            if (oshape[i] >= 0)
                out = oshape[i];
            else if (!af_mul_i64(in, s, &out))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output size overflows");
            /* An output larger than the full extent is zero-extended at the end. */
            int64_t total = full - out > 0 ? full - out : 0;
            if (pad == NN_PAD_SAME_UPPER) {
                g->w.pb[j] = total / 2;
                g->w.pe[j] = total - total / 2;
            } else {
                g->w.pb[j] = total - total / 2;
                g->w.pe[j] = total / 2;
            }
        } else {
            if (pad == NN_PAD_VALID)
                g->w.pb[j] = g->w.pe[j] = 0;
            out = full - g->w.pb[j] - g->w.pe[j]; /* pads are >= 0: no overflow */
        }
        if (out < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "empty output in spatial dim %d", i);
        g->w.out[j] = out;
    }
    return AF_OK;
}

/* ConvTranspose's window for X and W (types) as the fast kernels read it: X's spatial size in
 * w->in, Y's in w->out, pads derived from pads, output_shape or auto_pad; the same checks as the
 * shape function. */
af_status nn_conv_transpose_window(const af_node *n, const af_tensor *x, const af_tensor *wt,
                                   nn_window *w, af_error *err) {
    conv_geom g;
    af_status st = convt_setup(n, x, wt, &g, err);
    if (st == AF_OK && g.w.nsp < 0)
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "ConvTranspose rank unknown");
    if (st == AF_OK)
        *w = g.w;
    return st;
}

af_status shape_conv_transpose(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    const af_tensor *x, *wt, *b;
    conv_geom g;
    af_status st = conv_prepare(n, in, true, &x, &wt, &b, &g, err);
    if (st != AF_OK)
        return st;
    conv_out_type(&g, x->dtype, &out[0]);
    return AF_OK;
}

/* Scatter form: each input element adds x * w into the outputs its kernel covers. Outputs are
 * finished only after the whole scatter, so the epilogue runs over the accumulator at the end. */
static void convt_core(const conv_geom *g, const double *x, const double *w, double *y) {
    const nn_window *win = &g->w;
    const int64_t *in = win->in, *out = win->out, *k = win->k;
    int64_t ksize = k[0] * k[1] * k[2];
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t c = 0; c < g->cin; c++) {
            int64_t grp = c / g->cg;
            for (int64_t id = 0; id < in[0]; id++)
                for (int64_t ih = 0; ih < in[1]; ih++)
                    for (int64_t iw = 0; iw < in[2]; iw++) {
                        double xv = x[(((b * g->cin + c) * in[0] + id) * in[1] + ih) * in[2] + iw];
                        for (int64_t mm = 0; mm < g->mg; mm++) {
                            int64_t m = grp * g->mg + mm;
                            const double *wk = w + (c * g->mg + mm) * ksize;
                            double *yp = y + (b * g->cout + m) * out[0] * out[1] * out[2];
                            for (int64_t kd = 0; kd < k[0]; kd++) {
                                int64_t od = id * win->s[0] - win->pb[0] + kd * win->d[0];
                                if (od < 0 || od >= out[0])
                                    continue;
                                for (int64_t kh = 0; kh < k[1]; kh++) {
                                    int64_t oh = ih * win->s[1] - win->pb[1] + kh * win->d[1];
                                    if (oh < 0 || oh >= out[1])
                                        continue;
                                    for (int64_t kw = 0; kw < k[2]; kw++) {
                                        int64_t ow = iw * win->s[2] - win->pb[2] + kw * win->d[2];
                                        if (ow < 0 || ow >= out[2])
                                            continue;
                                        yp[(od * out[1] + oh) * out[2] + ow] +=
                                            xv * wk[(kd * k[1] + kh) * k[2] + kw];
                                    }
                                }
                            }
                        }
                    }
        }
}

af_status ref_conv_transpose(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    conv_geom g;
    double *xd = NULL, *wd = NULL, *bd = NULL, *acc = NULL;
    af_status st = conv_load(n, in, true, &out[0], &g, &xd, &wd, &bd, err);
    int64_t total = af_tensor_numel(&out[0]);
    if (st == AF_OK) {
        acc = af_calloc((size_t)(total > 0 ? total : 1), sizeof(double));
        if (!acc)
            st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    if (st == AF_OK) {
        convt_core(&g, xd, wd, acc);
        conv_epilogue e = {&out[0], bd, NULL, 0.0};
        int64_t plane = g.w.out[0] * g.w.out[1] * g.w.out[2];
        for (int64_t i = 0; i < total; i++)
            conv_emit(&e, i, (i / plane) % g.cout, acc[i]);
    }
    af_free(xd);
    af_free(wd);
    af_free(bd);
    af_free(acc);
    return st;
}
