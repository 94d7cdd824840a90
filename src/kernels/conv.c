/* Reference convolutions: Conv, ConvTranspose, ConvInteger and QLinearConv (ONNX opsets 7..17),
 * for 1-D, 2-D and 3-D inputs with any group count, dilation, stride and padding.
 *
 * Invariant: every output element is produced by one accumulator (a double) and written exactly
 * once through conv_emit, the per-element epilogue. A later fused kernel replaces conv_emit's
 * body (bias, scale, activation...) without touching the loop nest. Geometry is validated with
 * overflow-checked arithmetic before any loop runs, so the loops index only inside the tensors. */
#include "kernels/nn_common.h"

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

/* Group, channel and window checks shared by Conv, ConvInteger and QLinearConv.
 * W is [M, C/group, k...]. Sets g->w.nsp = -1 (nothing else) when the rank is unknown. */
static af_status conv_setup(const af_node *n, const af_tensor *x, const af_tensor *wt,
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
        af_tensor_set_type(y, dt, -1, dims);
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
    double *acc = malloc((size_t)(g->w.out[2] > 0 ? g->w.out[2] : 1) * sizeof(double));
    if (!acc)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    conv_core(g, x, w, e, acc);
    free(acc);
    return AF_OK;
}

/* Per-channel vector [count] from an optional 1-D or scalar tensor: values minus nothing, or
 * the broadcast scalar. Used for bias (length M) and for per-channel quantization parameters. */
static af_status conv_channel_vec(const af_node *n, const af_tensor *t, int64_t count,
                                  const char *what, double dflt, double **out, af_error *err) {
    *out = malloc((size_t)(count > 0 ? count : 1) * sizeof(double));
    if (!*out)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    int64_t tn = t ? nn_numel(t) : 0;
    if (t && tn != 1 && tn != count)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %lld elements, expected 1 or %lld",
                            what, (long long)tn, (long long)count);
    if (t && t->rank > 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be a scalar or 1-D", what);
    for (int64_t i = 0; i < count; i++)
        (*out)[i] = t ? nn_get(t, tn == 1 ? 0 : i) : dflt;
    return AF_OK;
}

