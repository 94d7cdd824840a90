/* Channels-last FusedConv (channels_last = 1, made by the layout pass): X [N, H, W, C] (or
 * [N, W, C], [N, D, H, W, C] for 1-D and 3-D convolutions), weights packed by the pack pass
 * (w_packed 1: GEMM panels per group; 2: depthwise [KH * KW][M]; 3: Winograd; 4: groups of as
 * many output as input channels, blocks of [taps][G][16 channels] (lower.c); the logical
 * [M, Cg, KH, KW] (or [M, Cg, KW], [M, Cg, KD, KH, KW]) in w_shape), bias [M], epilogue
 * operands broadcasting to the output [N, OH, OW, M] (of X's rank).
 *
 * Every rank is read as three spatial dims (D, H, W), the missing leading ones 1: a 1-D conv is
 * a 2-D conv of height 1 and takes every path below; a 3-D conv is a stack of 2-D implicit GEMMs
 * (one per output depth, the taps walking depth too) and takes the dense float32 path only.
 *
 * Dense convolutions are implicit GEMMs on the GEMM core (gemm.h): output positions are rows,
 * output channels columns, and the K loop walks the kernel window straight through the NHWC
 * input (one tap per kernel row when the KW * C floats of a window row are contiguous). Padding
 * is handled by copying the input once into a zero-bordered scratch image when the windows
 * reach outside X, so the micro-kernels never test bounds. Depthwise convolutions run their own
 * row kernel (vec.h), vectorised along the channels, with the bounds folded into loop limits;
 * grouped ones with small groups of G in and G out channels another (vec.h af_grp_row) over the
 * same zero-bordered image.
 *
 * A transposed FusedConv (transposed = 1, a ConvTranspose of any rank) is one GEMM per band of
 * input positions into columns (every kernel position's contribution) and a gather of those
 * columns per output row, with the epilogue; a depthwise one gathers x * W directly (below).
 *
 * Codes between int8 convs (lower/codes.c): an int8 conv (w_packed 1 on U8S8) reads X as the
 * uint8 codes of its x_scale and x_zero_point when X is UINT8 (the producer wrote them); a conv
 * with y_scale and y_zero_point (an int8 one, or a float32 depthwise one without a merged expand
 * or means) writes its output as the uint8 codes of that quantization (an int8 one through
 * af_vep.codes, the GEMM driver's; a depthwise one row by row, dw_rows).
 *
 * Invariant: cl_setup checks every dim, attribute and byte count against each other (through
 * Conv's own shape function on the NCHW view), so the loops below only form in-range
 * addresses. */
#include "kernels/fast/fast.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/epilogue.h"
#include "kernels/ref/fused.h"
#include "kernels/simd/cpu.h"

typedef struct conv_cl {
    af_tensor y; /* output type [N, OH, OW, M] (rank -1 while X's rank is unknown) */
    int64_t n, h, w, c, m, cg, mg, group;
    int64_t oh, ow, kh, kw, sh, sw, dh, dw, ph, pw; /* pads at the beginning */
    int64_t d, od, kd, sd, dd, pd; /* depth: 1 (pads 0) but for a 3-D conv */
    int packed; /* w_packed: 0 not yet, 1 GEMM panels, 2 depthwise */
    af_gemm_type wt_type; /* packed GEMM panels in half or bfloat16 (--precision_mode) */
    const float *x, *wt, *b;
    /* in_scale: X's channels are multiplied by gate[n][c] (input in_scale, [N, 1, 1, C]; a
     * squeeze-excite gate folded into this 1x1 conv), applied to the weights per image */
    const float *gate;
    /* pro_w >= 0: a depthwise conv whose 1x1 expand conv was merged in (passes/lower.c). X
     * (input 0) is the expand's input [N, H, W, pro_c]; the C = E channels the depthwise conv
     * reads are computed from it row by row (pro_wt packed pro_c x C, bias pro_b or NULL, then
     * the program in pro_epilogue) and never stored whole. x is NULL then. */
    const float *pro_x, *pro_wt, *pro_b;
    int64_t pro_c;
    bool pro;                 /* a merged expand conv (pro_w >= 0) */
    /* transposed = 1: a ConvTranspose (W [C, Mg, k...], kernels below); c, h, w... are then X's
     * and oh, ow... Y's, pd, ph, pw its begin pads as ONNX derives them */
    bool transposed;
    int pro_wi, pro_bi, gi;   /* inputs of pro_w, pro_b, in_scale (-1: none) */
    /* the int8 form (quant = 1, kernels/ref/fused_quant.c): wt_type U8S8, one group; w7: its
     * weights within [-64, 64] (lower.c "w_7bit") */
    fused_quant q;
    int32_t w7;
    const uint8_t *x8; /* X as codes (then x is NULL) */
    bool codes;        /* the output is codes of y_scale, y_zero_point */
    float ys;
    int yz;
} conv_cl;

#include <math.h>
#include <stddef.h>
#include <string.h>

/* NCHW view (type only) of an NHWC type, of any rank from 3 to 5. */
static af_tensor nchw_view(const af_tensor *t) {
    af_tensor v = {t->dtype, t->rank, {t->dims[0], t->dims[t->rank - 1]}, NULL, 0, 0};
    for (int i = 2; i < t->rank; i++) v.dims[i] = t->dims[i - 1];
    return v;
}

/* A merged expand conv (pro_w >= 0): its weights and bias checked against X [N, H, W, pro_c]
 * and E = pro_m channels; *xd becomes the type the depthwise conv reads, [N, H, W, E]. */
static af_status pro_setup(const af_node *n, const af_tensor *const *in, conv_cl *g,
                           af_tensor *xd, af_error *err) {
    int64_t wi = af_attr_int(n, "pro_w", -1), bi = af_attr_int(n, "pro_b", -1);
    int64_t e = af_attr_int(n, "pro_m", 0);
    const af_tensor *x = in[0], *w = wi < n->nin ? nn_in(n, in, (int)wi) : NULL;
    const af_tensor *b = bi >= 0 && bi < n->nin ? nn_in(n, in, (int)bi) : NULL;
    if (!w || (bi >= 0 && !b) || e < 1 || e > (1 << 24) || af_attr_int(n, "w_packed", 0) != 2 ||
        w->dtype != AF_DTYPE_FLOAT || w->rank != 1 || (b && (b->dtype != AF_DTYPE_FLOAT ||
                                                              b->rank != 1 || b->dims[0] != e)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "a merged expand conv needs pro_m >= 1, packed float32 weights "
                            "(pro_w) and a bias of pro_m (pro_b) on a depthwise conv");
    *xd = *x;
    xd->data = NULL;
    if (x->rank != 4) return AF_OK;
    int64_t c0 = x->dims[3];
    if (c0 >= 0 && w->dims[0] >= 0 && w->dims[0] != (int64_t)af_gemm_packed_floats(c0, e))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "merged expand weights must be %lld x %lld packed",
                            (long long)c0, (long long)e);
    xd->dims[3] = e;
    g->pro_c = c0;
    g->pro_wi = (int)wi;
    g->pro_bi = (int)bi;
    return AF_OK;
}

/* Point g at the data of a run's inputs (of the types g was set up for). */
static void conv_cl_bind(conv_cl *g, const af_node *n, const af_tensor *const *in) {
    const af_tensor *b = nn_in(n, in, 2);
    bool x8 = in[0]->dtype == AF_DTYPE_UINT8;
    g->x = g->pro || x8 ? NULL : in[0]->data;
    g->x8 = x8 ? in[0]->data : NULL;
    g->wt = in[1]->data;
    g->b = b ? b->data : NULL;
    g->gate = g->gi >= 0 ? in[g->gi]->data : NULL;
    g->pro_x = g->pro ? in[0]->data : NULL;
    g->pro_wt = g->pro ? in[g->pro_wi]->data : NULL;
    g->pro_b = g->pro && g->pro_bi >= 0 ? in[g->pro_bi]->data : NULL;
}

/* Check the node and its inputs (types only when data is absent) and fill g. */
static af_status conv_cl_setup(const af_node *n, const af_tensor *const *in, conv_cl *g,
                                  af_error *err) {
    memset(g, 0, sizeof *g);
    g->pro_wi = g->pro_bi = g->gi = -1;
    const af_tensor *x = nn_in(n, in, 0), *w = nn_in(n, in, 1), *b = nn_in(n, in, 2);
    if (!x || !w) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or W");
    af_tensor xd;
    if (af_attr_int(n, "pro_w", -1) >= 0) {
        af_status st = pro_setup(n, in, g, &xd, err);
        if (st != AF_OK) return st;
        x = &xd;
        g->pro = true;
    }
    g->packed = (int)af_attr_int(n, "w_packed", 0);
    bool q8 = w->dtype == AF_DTYPE_INT8 && fused_quant_on(n);
    g->wt_type = w->dtype == AF_DTYPE_BFLOAT16 ? AF_GEMM_BF16
                 : w->dtype == AF_DTYPE_FLOAT16 ? AF_GEMM_F16
                 : q8                           ? AF_GEMM_U8S8
                                                : AF_GEMM_F32;
    bool low_w = (g->packed == 1 && g->wt_type != AF_GEMM_F32) || (q8 && !g->packed);
    if (fused_quant_on(n) && (!q8 || g->pro || af_attr_int(n, "in_scale", -1) >= 0 || g->packed > 1))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "a channels-last int8 FusedConv takes int8 weights (w_packed 1), "
                            "no pro_w, no in_scale");
    g->ys = af_attr_float(n, "y_scale", 0.0f);
    g->yz = (int)af_attr_int(n, "y_zero_point", 0);
    g->codes = g->ys != 0.0f;
    if (g->codes && (!(g->ys > 0.0f && isfinite(g->ys)) || g->yz < 0 || g->yz > 255 ||
                     (!(g->packed == 1 && q8) && !(g->packed == 2 && w->dtype == AF_DTYPE_FLOAT &&
                                                   !g->pro && !af_attr_int(n, "transposed", 0)))))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "y_scale (> 0) and y_zero_point (0 to 255) need an int8 conv (w_packed 1) "
                            "or a float32 depthwise one (w_packed 2) without pro_w, not transposed");
    bool x_codes = x->dtype == AF_DTYPE_UINT8 && q8 && g->packed == 1;
    if ((x->dtype != AF_DTYPE_FLOAT && !x_codes) || (w->dtype != AF_DTYPE_FLOAT && !low_w) ||
        (b && b->dtype != AF_DTYPE_FLOAT))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FusedConv on %s (float32 only)",
                            af_dtype_name(x->dtype != AF_DTYPE_FLOAT ? x->dtype : w->dtype));
    if (x->rank >= 0 && (x->rank < 3 || x->rank > 5 || (g->pro && x->rank != 4)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "channels-last FusedConv needs X of rank 3 to 5 (4 with pro_w)");
    af_tensor wv = *w;
    wv.data = NULL;
    wv.dtype = AF_DTYPE_FLOAT; /* the logical weights, whatever type the packed ones are in */
    if (g->packed) {
        const int64_t *ws = NULL;
        int nw = af_attr_ints(n, "w_shape", &ws);
        if (g->packed < 1 || g->packed > 4 || nw < 3 || nw > 5 || (x->rank >= 0 && nw != x->rank))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "w_packed needs w_shape [M, Cg, KH, KW] of X's rank");
        wv.rank = nw;
        for (int i = 0; i < nw; i++) {
            if (ws[i] < 1 || ws[i] > (1 << 24))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad w_shape");
            wv.dims[i] = ws[i];
        }
    }
    g->transposed = af_attr_int(n, "transposed", 0) != 0;
    if (g->transposed && (g->pro || af_attr_int(n, "in_scale", -1) >= 0 || af_attr_int(n, "pool_out", 0) ||
                          g->packed >= 3 || g->wt_type != AF_GEMM_F32))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "a transposed FusedConv takes float32 weights (w_packed 1 or 2) only");
    if (x->rank < 0) {
        g->y.rank = -1;
        return AF_OK;
    }
    af_tensor xv = nchw_view(x), yv;
    xv.dtype = AF_DTYPE_FLOAT; /* codes stand for floats */
    const af_tensor *cin[3] = {&xv, &wv, b};
    af_status st = g->transposed ? shape_conv_transpose(n, cin, &yv, err) : shape_conv(n, cin, &yv, err);
    if (st != AF_OK) return st;
    int r = x->rank, nsp = r - 2;
    g->y = yv;
    g->y.dims[0] = yv.dims[0];
    g->y.dims[r - 1] = yv.dims[1];
    for (int i = 1; i < r - 1; i++) g->y.dims[i] = yv.dims[i + 1];
    if (!af_tensor_known(x) || !af_tensor_known(&wv)) return AF_OK; /* shape inference with unknown dims */
    int64_t k[3];
    for (int i = 0; i < nsp; i++) k[i] = wv.dims[2 + i];
    nn_window win; /* spatial dims padded to three, (D, H, W): the leading missing ones are 1 */
    st = g->transposed ? nn_conv_transpose_window(n, &xv, &wv, &win, err)
                       : nn_window_init(n, &xv, k, nsp, false, &win, err);
    if (st != AF_OK) return st;
    g->n = x->dims[0];
    g->c = x->dims[r - 1];
    g->m = g->transposed ? yv.dims[1] : wv.dims[0];
    g->cg = g->transposed ? g->c / af_attr_int(n, "group", 1) : wv.dims[1];
    g->d = win.in[0], g->h = win.in[1], g->w = win.in[2];
    g->kd = win.k[0], g->kh = win.k[1], g->kw = win.k[2];
    g->od = win.out[0], g->oh = win.out[1], g->ow = win.out[2];
    g->sd = win.s[0], g->sh = win.s[1], g->sw = win.s[2];
    g->dd = win.d[0], g->dh = win.d[1], g->dw = win.d[2];
    g->pd = win.pb[0], g->ph = win.pb[1], g->pw = win.pb[2];
    g->group = af_attr_int(n, "group", 1);
    g->mg = g->m / g->group;
    if (r == 5 && g->packed && !g->transposed &&
        (g->packed == 3 || (g->packed == 1 && g->wt_type != AF_GEMM_F32 && g->wt_type != AF_GEMM_U8S8) ||
         (g->packed == 2 && g->kd * g->kh > AF_DW_MAX_ROWS)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "a 3-D channels-last conv needs float32 or int8 GEMM panels (w_packed 1), or "
                            "depthwise weights (w_packed 2) of at most %d KD x KH rows", AF_DW_MAX_ROWS);
    if (g->wt_type == AF_GEMM_U8S8) {
        g->w7 = af_attr_int(n, "w_7bit", 0) != 0;
        st = fused_quant_decode(n, g->packed ? NULL : w, g->m, &g->q, err);
        if (st != AF_OK) return st;
    }
    if (g->packed == 3 && (g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->dh != 1 ||
                           g->dw != 1 || g->group != 1))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "Winograd weights need a 3x3 stride-1 undilated conv with one group");
    if (g->packed == 4 &&
        (g->group < 2 || g->cg != g->mg || g->c != g->m || g->wt_type != AF_GEMM_F32))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "grouped weights (w_packed 4) need float32 groups of as many output "
                            "as input channels");
    if (g->wt_type != AF_GEMM_F32 && g->group != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "half or bfloat16 weights need one group");
    if (g->packed && g->transposed) {
        int64_t taps = g->kd * g->kh * g->kw;
        int64_t want = g->packed == 2 ? taps * g->c
                                      : g->group * (int64_t)af_gemm_packed_floats(g->cg, taps * g->mg);
        if (g->packed == 2 && (g->cg != 1 || g->mg != 1))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "depthwise weights need Cg = Mg = 1");
        if (w->rank != 1 || (w->dims[0] >= 0 && w->dims[0] != want))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "packed W must be 1-D with %lld elements", (long long)want);
    } else if (g->packed) {
        int64_t cp = g->wt_type == AF_GEMM_BF16 ? af_gemm_bf16_k(g->cg) : g->cg;
        int64_t want = g->packed == 2   ? g->kd * g->kh * g->kw * g->m
                       : g->packed == 3 ? 36 * (int64_t)af_gemm_packed_floats(g->c, g->m)
                       : g->packed == 4 ? g->kd * g->kh * g->kw * g->cg *
                                              ((g->m + AF_GRP_LANES - 1) / AF_GRP_LANES * AF_GRP_LANES)
                       : g->wt_type == AF_GEMM_U8S8
                           ? (int64_t)af_gemm_packed_bytes(AF_GEMM_U8S8, g->kd * g->kh * g->kw * af_gemm_u8s8_k(g->cg), g->m)
                       : g->wt_type != AF_GEMM_F32
                           ? (int64_t)(af_gemm_packed_bytes(g->wt_type, g->kh * g->kw * cp, g->m) / 2)
                           : g->group * (int64_t)af_gemm_packed_floats(g->kd * g->kh * g->kw * g->cg, g->mg);
        if (g->packed == 2 && (g->cg != 1 || g->m != g->group))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "depthwise weights need Cg = 1, M = group");
        if (w->rank != 1 || (w->dims[0] >= 0 && w->dims[0] != want))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "packed W must be 1-D with %lld elements", (long long)want);
    }
    int64_t gi = af_attr_int(n, "in_scale", -1);
    if (gi >= 0) {
        const af_tensor *gt = gi < n->nin ? in[gi] : NULL;
        if (!gt || gt->dtype != AF_DTYPE_FLOAT || g->packed != 1 || r != 4 || g->kh != 1 || g->kw != 1 ||
            g->group != 1 || af_tensor_numel(gt) != g->n * g->c)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "in_scale needs an [N, 1, 1, C] gate on a packed 1x1 conv");
        g->gi = (int)gi;
    }
    conv_cl_bind(g, n, in);
    return AF_OK;
}

/* pool_out = 1: output 1 is the mean over positions of output 0, [N, 1, 1, M] (for a
 * squeeze-excite that reads it instead of pooling the output again). Depthwise only. */
static bool pool_out(const af_node *n) {
    return af_attr_int(n, "pool_out", 0) != 0 && n->nout == 2;
}

af_status fast_shape_fused_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    conv_cl g;
    af_status st = conv_cl_setup(n, in, &g, err);
    if (st != AF_OK) return st;
    if ((n->nout != 1 && !pool_out(n)) ||
        (af_attr_int(n, "pool_out", 0) && (!pool_out(n) || g.packed == 1 || (g.y.rank >= 0 && g.y.rank != 4))))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "FusedConv has one output (two with pool_out on a 2-D depthwise conv)");
    if (g.codes && pool_out(n))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "y_scale without pool_out");
    af_tensor_set_type(&out[0], g.codes ? AF_DTYPE_UINT8 : AF_DTYPE_FLOAT, g.y.rank,
                       g.y.rank >= 0 ? g.y.dims : NULL);
    if (pool_out(n)) {
        int64_t d[4] = {g.y.rank >= 0 ? g.y.dims[0] : -1, 1, 1, g.y.rank >= 0 ? g.y.dims[3] : -1};
        af_tensor_set_type(&out[1], AF_DTYPE_FLOAT, 4, d);
    }
    return af_epilogue_validate(n, in, &out[0], err);
}

/* ---- dense: implicit GEMM ------------------------------------------------------------------------- */

/* The extent of input the windows read: rows [0, hp) and columns [0, wp) of the padded image. */
static void padded_extent(const conv_cl *g, int64_t *hp, int64_t *wp) {
    *hp = (g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    *wp = (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
}

/* The same along depth: planes [0, dp) of the padded volume. */
static int64_t padded_depth(const conv_cl *g) {
    return (g->od - 1) * g->sd + (g->kd - 1) * g->dd + 1;
}

static bool needs_padding(const conv_cl *g) {
    int64_t hp, wp;
    padded_extent(g, &hp, &wp);
    return g->pd > 0 || g->ph > 0 || g->pw > 0 || padded_depth(g) > g->d || hp > g->h || wp > g->w;
}

/* A 1x1(x1) stride-1 conv without padding: its output positions are X's, one flat row range. */
static bool conv_flat(const conv_cl *g) {
    return g->kd == 1 && g->kh == 1 && g->kw == 1 && g->sd == 1 && g->sh == 1 && g->sw == 1 &&
           !needs_padding(g);
}

typedef struct pad_job {
    const conv_cl *g;
    float *dst;
    int64_t dp, hp, wp; /* the padded volume's extent (dp = 1 for 1-D and 2-D convs) */
} pad_job;

/* Rows [begin, end) (over batch x padded planes x padded rows) of the zero-bordered copy of X. */
static void pad_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pad_job *p = ctx;
    const conv_cl *g = p->g;
    int64_t c = g->c, rowf = p->wp * c;
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / (p->dp * p->hp), id = r / p->hp % p->dp - g->pd, ih = r % p->hp - g->ph;
        float *d = p->dst + r * rowf;
        if (id < 0 || id >= g->d || ih < 0 || ih >= g->h) {
            memset(d, 0, (size_t)rowf * sizeof(float));
            continue;
        }
        int64_t lo = g->pw, n = g->w < p->wp - lo ? g->w : p->wp - lo;
        memset(d, 0, (size_t)(lo * c) * sizeof(float));
        af_copy(d + lo * c, g->x + (((b * g->d + id) * g->h + ih) * g->w) * c,
               (size_t)(n * c) * sizeof(float));
        memset(d + (lo + n) * c, 0, (size_t)((p->wp - lo - n) * c) * sizeof(float));
    }
}

/* The work of writing the padded copy of X (dp x hp x wp rows per image): bytes read and written. */
static double pad_ns(const conv_cl *g, int64_t dp, int64_t hp, int64_t wp, af_exec *ex) {
    return af_exec_work_ns(ex, 0.0, 4.0 * (double)(g->n * (dp * hp * wp + g->d * g->h * g->w) * g->c));
}

/* ---- valid taps only: one GEMM per kernel position over the outputs whose input it reaches ----
 * Along each axis, the outputs o whose input o * s - p + t * dil lies inside X for kernel
 * position t form one range, so for each kernel position the outputs it reaches are a box.
 * When the windows reach far outside X (a dilated conv on a small image: DeepLabV3's ASPP, 3x3
 * with dilation 12 on 14x14, where 18% of window positions are inside X), the padded path
 * spends most of its products on zeros. This path fills Y with zeros, then runs one GEMM per
 * kernel position over its box (K = Cg, reading X in place: no zero-bordered copy), adding into
 * Y in registers (the residual of the micro-kernels, Y itself), then the epilogue over Y. Each
 * kernel position's rows of B are read once, as the padded path reads all of B once: B is the
 * large operand of such layers (8.8 MB for the ASPP conv). Taken when its work, counted in
 * micro-kernel tiles, is under the padded path's: a 3x3 conv with padding 1 keeps the copy. */
enum { VT_MAX_TAPS = 1024 };

/* The outputs [*o0, *o1) of one axis that kernel position t reaches. */
static void vt_range(int64_t out, int64_t in, int64_t t, int64_t s, int64_t dil, int64_t p, int64_t *o0,
                     int64_t *o1) {
    int64_t off = t * dil - p; /* input = o * s + off, inside [0, in) */
    int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s, hi = in - 1 - off < 0 ? 0 : (in - 1 - off) / s + 1;
    if (hi > out) hi = out;
    *o0 = lo < hi ? lo : hi;
    *o1 = hi;
}

/* Micro-kernel work of one GEMM row of `mi` outputs: its rows plus a fixed cost per tile (the
 * B loads a tile shares among its rows, the C stores), in rows. */
static double vt_row_cost(int64_t mi) {
    int64_t mr = af_vec()->mr, tiles = (mi + mr - 1) / mr;
    return (double)mi + 4.0 * (double)tiles;
}

/* Whether conv_dense runs g one kernel position at a time: float32 panels, no gate, windows
 * reaching outside X, and less work by vt_row_cost than the padded path. */
static bool vt_choose(const conv_cl *g) {
    int64_t taps = g->kd * g->kh * g->kw;
    if (g->gate || !needs_padding(g) || taps > VT_MAX_TAPS) return false;
    double valid = 0.0;
    for (int64_t t = 0; t < taps; t++) {
        int64_t d0, d1, h0, h1, w0, w1;
        vt_range(g->od, g->d, t / (g->kh * g->kw), g->sd, g->dd, g->pd, &d0, &d1);
        vt_range(g->oh, g->h, t / g->kw % g->kh, g->sh, g->dh, g->ph, &h0, &h1);
        vt_range(g->ow, g->w, t % g->kw, g->sw, g->dw, g->pw, &w0, &w1);
        /* K = Cg, and the load and store of Y's row (about 4 elements' worth of products) */
        if (w1 > w0) valid += (double)((d1 - d0) * (h1 - h0)) * vt_row_cost(w1 - w0) * (double)(g->cg + 4);
    }
    valid = valid * (double)g->group + 4.0 * (double)(g->od * g->oh * g->ow); /* + zeroing Y, the epilogue pass */
    /* padded: every output, every tap, and the copy (a float copied costs about 2 / Mg of a
     * row-element's Mg multiply-adds) */
    int64_t hp, wp;
    padded_extent(g, &hp, &wp);
    double padded = (double)(g->od * g->oh) * vt_row_cost(g->ow) * (double)(taps * g->cg * g->group) +
                    2.0 * (double)(padded_depth(g) * hp * wp * g->c) / (double)g->mg;
    /* a margin for what the count leaves out (a parallel loop per kernel position, Y's two extra
     * passes): ResNet-50's 3x3 convs at 7x7, which it counts 15% cheaper, keep the padded path */
    return valid < 0.7 * padded;
}

typedef struct vt_job {
    const af_vep *ep;
    float *y;
    int64_t m; /* columns */
    bool zero; /* zero rows, else run the epilogue on them */
} vt_job;

static void vt_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const vt_job *j = ctx;
    float *y = j->y + begin * j->m;
    if (j->zero) memset(y, 0, (size_t)((end - begin) * j->m) * sizeof(float));
    else af_vec()->ep_tile(j->ep, y, j->m, begin, 0, end - begin, j->m);
}

static void conv_valid_taps(const conv_cl *g, const af_vep *ep, float *y, af_exec *ex) {
    int64_t taps = g->kd * g->kh * g->kw, kp = taps * g->cg, rows = g->n * g->od * g->oh * g->ow;
    size_t per = af_gemm_packed_floats(kp, g->mg);
    double fill_ns = af_exec_work_ns(ex, 0.0, 4.0 * (double)(rows * g->m));
    vt_job zj = {ep, y, g->m, true};
    af_exec_parallel(ex, rows, fill_ns, vt_rows, &zj);
    /* the products add into Y in registers: Y is each GEMM's residual (read before written) */
    af_vep acc;
    memset(&acc, 0, sizeof acc);
    acc.nsteps = 1;
    acc.cols = g->m;
    acc.y = y;
    acc.steps[0] = (af_vep_step){AF_EP_ADD, AF_VEP_FULL, 0, 0.0f, 0.0f, y};
    static const int64_t tap0[1] = {0};
    for (int64_t t = 0; t < taps; t++) {
        int64_t kd = t / (g->kh * g->kw), kh = t / g->kw % g->kh, kw = t % g->kw;
        int64_t d0, d1, h0, h1, w0, w1;
        vt_range(g->od, g->d, kd, g->sd, g->dd, g->pd, &d0, &d1);
        vt_range(g->oh, g->h, kh, g->sh, g->dh, g->ph, &h0, &h1);
        vt_range(g->ow, g->w, kw, g->sw, g->dw, g->pw, &w0, &w1);
        if (d0 == d1 || h0 == h1 || w0 == w1) continue;
        for (int64_t b = 0; b < g->n; b++)
            for (int64_t z = d0; z < d1; z++)
                for (int64_t gi = 0; gi < g->group; gi++) {
                    /* the box's first output, and the input this kernel position reads for it */
                    int64_t row0 = ((b * g->od + z) * g->oh + h0) * g->ow + w0;
                    int64_t xd = z * g->sd - g->pd + kd * g->dd, xh = h0 * g->sh - g->ph + kh * g->dh;
                    int64_t xw = w0 * g->sw - g->pw + kw * g->dw;
                    af_gemm gm = {g->x + (((b * g->d + xd) * g->h + xh) * g->w + xw) * g->c + gi * g->cg,
                                  h1 - h0, w1 - w0, g->sh * g->w * g->c, g->sw * g->c, tap0, 1, g->cg,
                                  g->wt + (size_t)gi * per, g->mg, y + row0 * g->m + gi * g->mg, g->m,
                                  &acc, row0, gi * g->mg, AF_GEMM_F32, NULL, NULL, t * g->cg, kp, g->ow, NULL, 0, 0};
                    af_gemm_run(ex, &gm);
                }
    }
    if (ep->nsteps || ep->generic) {
        vt_job ej = {ep, y, g->m, false};
        af_exec_parallel(ex, rows, fill_ns, vt_rows, &ej);
    }
}

/* Scratch conv_dense needs on `threads` threads: the zero-bordered image when the windows
 * reach outside X, the blocks of gated weights (one per thread) and the tap offsets. */
static size_t dense_scratch_bytes(const conv_cl *g, int threads) {
    int64_t hp = g->h, wp = g->w, dp = padded_depth(g);
    if (needs_padding(g)) padded_extent(g, &hp, &wp);
    size_t img = needs_padding(g) ? (size_t)(g->n * dp * hp * wp * g->c) * sizeof(float) : 0;
    size_t gated =
        g->gate ? (size_t)threads * af_gemm_rowscale_floats(g->c, g->m) * sizeof(float) : 0;
    return ((img + 63) & ~(size_t)63) + ((gated + 63) & ~(size_t)63) +
           (size_t)(g->kd * g->kh * g->kw) * sizeof(int64_t);
}

/* What the windows of conv_dense and conv_grouped read: X, or its zero-bordered copy, of
 * extent dp x hp x wp per image, and each kernel position's offset from a window's origin (one
 * per kernel row when `merged`); wg is the room for gated weights. */
typedef struct dense_in {
    const float *x;
    int64_t dp, hp, wp;
    int64_t *taps;
    float *wg;
} dense_in;

/* Lay out `scratch` (dense_scratch_bytes) and fill it: the padded copy when the windows reach
 * outside X, the tap offsets. */
static dense_in dense_input(const conv_cl *g, bool merged, unsigned char *scratch, af_exec *ex) {
    bool pad = needs_padding(g);
    dense_in in = {g->x, pad ? padded_depth(g) : g->d, g->h, g->w, NULL, NULL};
    if (pad) padded_extent(g, &in.hp, &in.wp);
    size_t img = pad ? (size_t)(g->n * in.dp * in.hp * in.wp * g->c) * sizeof(float) : 0;
    size_t gated = g->gate ? (size_t)af_exec_threads(ex) * af_gemm_rowscale_floats(g->c, g->m) *
                                 sizeof(float)
                           : 0;
    in.wg = (float *)(scratch + ((img + 63) & ~(size_t)63));
    in.taps = (int64_t *)((unsigned char *)in.wg + ((gated + 63) & ~(size_t)63));
    if (pad) {
        pad_job pj = {g, (float *)scratch, in.dp, in.hp, in.wp};
        af_exec_parallel(ex, g->n * in.dp * in.hp, pad_ns(g, in.dp, in.hp, in.wp, ex), pad_rows, &pj);
        in.x = (const float *)scratch;
    }
    for (int64_t a = 0, t = 0; a < g->kd; a++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < (merged ? 1 : g->kw); j++)
                in.taps[t++] = ((a * g->dd * in.hp + i * g->dh) * in.wp + j * g->dw) * g->c;
    return in;
}

/* The convolution into y (rows of M channels) through ep, using `scratch` (64-byte aligned,
 * dense_scratch_bytes of it). */
static void conv_dense(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                       af_exec *ex) {
    if (vt_choose(g)) {
        conv_valid_taps(g, ep, y, ex);
        return;
    }
    bool merged = g->group == 1 && g->dw == 1; /* a window row is KW * C contiguous floats */
    dense_in in = dense_input(g, merged, scratch, ex);
    const float *xp = in.x;
    const int64_t *taps = in.taps;
    int64_t dp = in.dp, hp = in.hp, wp = in.wp;
    int64_t ntaps = merged ? g->kd * g->kh : g->kd * g->kh * g->kw;
    float *wg = in.wg;
    /* One flat row range per image when output positions are evenly spaced in X (1x1x1, stride
     * 1, no pad); else one GEMM per output plane (depth), its rows OH x OW. */
    bool flat = conv_flat(g);
    int64_t planes = flat ? 1 : g->od, plane = g->oh * g->ow;
    size_t per = af_gemm_packed_floats(g->kd * g->kh * g->kw * g->cg, g->mg);
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t z = 0; z < planes; z++)
            for (int64_t gi = 0; gi < g->group; gi++) {
                const float *w = g->wt + (size_t)gi * per;
                int64_t row0 = (b * g->od + z) * plane; /* the plane's first output position */
                af_gemm gm = {xp + ((b * dp + z * g->sd) * hp) * wp * g->c + gi * g->cg,
                              flat ? 1 : g->oh, flat ? g->od * plane : g->ow,
                              g->sh * wp * g->c, g->sw * g->c,
                              taps, ntaps, merged ? g->kw * g->c : g->cg,
                              w, g->mg,
                              y + row0 * g->m + gi * g->mg, g->m,
                              ep, row0, gi * g->mg, AF_GEMM_F32,
                              /* the squeeze-excite gate scales W's rows, a block at a time */
                              g->gate ? g->gate + b * g->c : NULL, wg, 0, 0, 0, NULL, 0, 0};
                af_gemm_run(ex, &gm);
            }
}

/* ---- grouped, G = Cg = Mg input and output channels per group (w_packed 4) ------------------ */

typedef struct grp_job {
    const conv_cl *g;
    const af_vep *ep;
    float *y;
    dense_in in;
} grp_job;

/* Output rows [begin, end) over batch x OD x OH, each through the vector table's grp_row. */
static void grp_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const grp_job *j = ctx;
    const conv_cl *g = j->g;
    const dense_in *in = &j->in;
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / (g->od * g->oh), z = r / g->oh % g->od, oh = r % g->oh;
        af_grp_row p = {in->x + ((b * in->dp + z * g->sd) * in->hp + oh * g->sh) * in->wp * g->c,
                        in->taps, g->kd * g->kh * g->kw, g->sw * g->c, g->c, g->cg, g->wt, g->ow,
                        j->y + r * g->ow * g->c, j->ep, r * g->ow};
        af_vec()->grp_row(&p);
    }
}

/* ResNeXt's first 3x3 convs (32 groups of 4 channels) ran as one GEMM per group on the panels
 * of w_packed 1: four useful columns of a vector of 8 or 16, and each group's GEMM read every
 * cache line of X again for its 16 bytes (4.5 GFLOP/s, half ONNX Runtime's rate). Here each
 * output row takes all the groups at once, every product on whole vectors of X's channels. */
static void conv_grouped(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                         af_exec *ex) {
    grp_job j = {g, ep, y, dense_input(g, false, scratch, ex)};
    int64_t rows = g->n * g->od * g->oh, out = rows * g->ow * g->c;
    double ns = af_exec_work_ns(ex, 2.0 * (double)(out * g->kd * g->kh * g->kw * g->cg),
                                4.0 * (double)(g->n * g->d * g->h * g->w * g->c + out));
    af_exec_parallel(ex, rows, ns, grp_rows, &j);
}

/* ---- half and bfloat16 (--precision_mode) ------------------------------------------------------- */

/* X converted once per run for a half or bfloat16 conv: zero-bordered like pad_rows, each
 * position's channels multiplied by the squeeze-excite gate when there is one (in_scale: here
 * rather than on the weights, which are not float32), rounded to the type; bfloat16 positions
 * hold cp channels (a multiple of AF_GEMM_BF16_KB, zero padded) so every kernel position is a tap
 * of whole K blocks. */
typedef struct low_job {
    const conv_cl *g;
    int64_t hp, wp, cp;
    uint16_t *d16; /* BF16 */
    float *d32;    /* F16: float32 holding half values */
} low_job;

enum { LOW_CHUNK = 256 }; /* channels converted at a time through a stack buffer */

static void low_position(const low_job *p, const float *src, const float *gate, int64_t pos) {
    const conv_cl *g = p->g;
    const af_vec_ops *v = af_vec();
    float tmp[LOW_CHUNK];
    for (int64_t c0 = 0; c0 < g->c; c0 += LOW_CHUNK) {
        int64_t nc = g->c - c0 < LOW_CHUNK ? g->c - c0 : LOW_CHUNK;
        const float *s = src + c0;
        if (gate) {
            for (int64_t k = 0; k < nc; k++) tmp[k] = s[k] * gate[c0 + k];
            s = tmp;
        }
        if (p->d16) v->to_bf16(s, p->d16 + pos * p->cp + c0, nc);
        else v->round_f16(s, p->d32 + pos * p->cp + c0, nc);
    }
    if (p->d16) memset(p->d16 + pos * p->cp + g->c, 0, (size_t)(p->cp - g->c) * sizeof(uint16_t));
}

static void low_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const low_job *p = ctx;
    const conv_cl *g = p->g;
    size_t es = p->d16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / p->hp, ih = r % p->hp - g->ph;
        const float *gate = g->gate ? g->gate + b * g->c : NULL;
        for (int64_t iwp = 0; iwp < p->wp; iwp++) {
            int64_t iw = iwp - g->pw, pos = r * p->wp + iwp;
            if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) {
                char *d = p->d16 ? (char *)(p->d16 + pos * p->cp) : (char *)(p->d32 + pos * p->cp);
                memset(d, 0, (size_t)p->cp * es);
                continue;
            }
            low_position(p, g->x + ((b * g->h + ih) * g->w + iw) * g->c, gate, pos);
        }
    }
}

/* Elements of the converted image and the slack after it (bfloat16: AMX reads up to 32 rows of
 * A past a tile's first row). */
static void low_sizes(const conv_cl *g, int64_t *hp, int64_t *wp, int64_t *cp, size_t *img,
                      size_t *slack) {
    *hp = g->h;
    *wp = g->w;
    if (needs_padding(g)) padded_extent(g, hp, wp);
    *cp = g->wt_type == AF_GEMM_BF16 ? af_gemm_bf16_k(g->c) : g->c;
    *img = (size_t)(g->n * *hp * *wp * *cp);
    *slack = g->wt_type == AF_GEMM_BF16 ? (size_t)(32 * g->sw * *cp) : 0;
}

static size_t low_scratch_bytes(const conv_cl *g) {
    int64_t hp, wp, cp;
    size_t img, slack, es = g->wt_type == AF_GEMM_BF16 ? 2 : 4;
    low_sizes(g, &hp, &wp, &cp, &img, &slack);
    return (((img + slack) * es + 63) & ~(size_t)63) + (size_t)(g->kh * g->kw) * sizeof(int64_t);
}

static void conv_low(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                     af_exec *ex) {
    int64_t hp, wp, cp;
    size_t img, slack;
    low_sizes(g, &hp, &wp, &cp, &img, &slack);
    bool bf = g->wt_type == AF_GEMM_BF16;
    size_t es = bf ? 2 : 4;
    low_job j = {g, hp, wp, cp, bf ? (uint16_t *)scratch : NULL, bf ? NULL : (float *)scratch};
    int64_t *taps = (int64_t *)(scratch + (((img + slack) * es + 63) & ~(size_t)63));
    if (slack) memset(scratch + img * es, 0, slack * es);
    af_exec_parallel(ex, g->n * hp, pad_ns(g, 1, hp, wp, ex), low_rows, &j);
    /* bfloat16: one tap per kernel position (channels padded); half: per kernel row, as float32 */
    bool merged = !bf && g->dw == 1;
    int64_t ntaps = 0;
    for (int64_t i = 0; i < g->kh; i++)
        for (int64_t k = 0; k < (merged ? 1 : g->kw); k++) taps[ntaps++] = (i * g->dh * wp + k * g->dw) * cp;
    bool flat = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && !needs_padding(g);
    for (int64_t b = 0; b < g->n; b++) {
        size_t off = (size_t)(b * hp * wp * cp);
        af_gemm gm = {bf ? (const void *)(j.d16 + off) : (const void *)(j.d32 + off),
                      flat ? 1 : g->oh, flat ? g->oh * g->ow : g->ow, g->sh * wp * cp, g->sw * cp,
                      taps, ntaps, merged ? g->kw * cp : cp, g->wt, g->m,
                      y + b * g->oh * g->ow * g->m, g->m, ep, b * g->oh * g->ow, 0, g->wt_type,
                      NULL, NULL, 0, 0, 0, NULL, 0, 0};
        af_gemm_run(ex, &gm);
    }
}

/* ---- int8 (the int8 form on U8S8 panels) ---------------------------------------------------------
 * X converted once per run to uint8 codes (kernels/ref/fused_quant.c), or copied when it is
 * codes already, in a bordered image of cp = C rounded up to 4 channels a position: borders and
 * padding channels hold the zero point (code z is float 0; the padding channels also meet zero
 * rows of B); codes that need no border nor padding channels (a 1x1 conv, C a multiple of 4)
 * are read where they are. Then, as conv_dense, one
 * implicit GEMM per image and output plane (depth), one tap per kernel row (KW positions of cp
 * bytes, contiguous) or per kernel position when dilated along W, on the U8S8 core with
 * scale[m] = s_x * w_scale[m]. 1-D, 2-D and 3-D, one group. */
typedef struct u8_job {
    const conv_cl *g;
    int64_t dp, hp, wp, cp;
    uint8_t *img;
} u8_job;

/* Bytes of codes a row of the image converts at a time when C is not a multiple of 4. */
enum { U8_RUN = 2048 };

/* Rows [begin, end) (over batch x padded planes x padded rows) of the code image. */
static void u8_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const u8_job *p = ctx;
    const conv_cl *g = p->g;
    const af_vec_ops *v = af_vec();
    const int z = g->q.x_zero;
    const float s = g->q.x_scale;
    int64_t c = g->c, cp = p->cp;
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / (p->dp * p->hp), id = r / p->hp % p->dp - g->pd, ih = r % p->hp - g->ph;
        uint8_t *d = p->img + r * p->wp * cp;
        if (id < 0 || id >= g->d || ih < 0 || ih >= g->h) {
            memset(d, z, (size_t)(p->wp * cp));
            continue;
        }
        int64_t at = (((b * g->d + id) * g->h + ih) * g->w) * c;
        int64_t lo = g->pw, nw = g->w < p->wp - lo ? g->w : p->wp - lo;
        memset(d, z, (size_t)(lo * cp));
        if (cp == c && g->x8) {
            memcpy(d + lo * cp, g->x8 + at, (size_t)(nw * c));
        } else if (cp == c) {
            v->to_u8(g->x + at, d + lo * cp, nw * c, s, z); /* the row's positions in one call */
        } else { /* C not a multiple of 4 (an image's 3 channels): runs of positions converted
                  * in one call, then spread cp bytes apart (a call per position of 3 channels
                  * cost more than the stem's whole conversion should) */
            uint8_t run[U8_RUN];
            int64_t per = c < U8_RUN ? U8_RUN / c : 1;
            for (int64_t i0 = 0; i0 < nw; i0 += per) {
                int64_t k = nw - i0 < per ? nw - i0 : per;
                const uint8_t *src = g->x8 ? g->x8 + at + i0 * c : run;
                if (!g->x8 && per > 1) v->to_u8(g->x + at + i0 * c, run, k * c, s, z);
                for (int64_t iw = i0; iw < i0 + k; iw++) {
                    uint8_t *o = d + (lo + iw) * cp;
                    if (!g->x8 && per == 1) v->to_u8(g->x + at + iw * c, o, c, s, z);
                    else memcpy(o, src + (iw - i0) * c, (size_t)c);
                    memset(o + c, z, (size_t)(cp - c));
                }
            }
        }
        memset(d + (lo + nw) * cp, z, (size_t)((p->wp - lo - nw) * cp));
    }
}

/* X's codes as they are serve as the image. */
static bool u8_in_place(const conv_cl *g) {
    return g->x8 && conv_flat(g) && af_gemm_u8s8_k(g->c) == g->c;
}

/* The image's extent, and the bytes of the image (none in place), the taps and the scales. */
static size_t u8_sizes(const conv_cl *g, int64_t *dp, int64_t *hp, int64_t *wp, int64_t *cp,
                       size_t *img) {
    *hp = g->h, *wp = g->w, *dp = g->d;
    if (needs_padding(g)) {
        padded_extent(g, hp, wp);
        *dp = padded_depth(g);
    }
    *cp = af_gemm_u8s8_k(g->c);
    *img = u8_in_place(g) ? 0 : ((size_t)(g->n * *dp * *hp * *wp * *cp) + 63) & ~(size_t)63;
    return *img + (size_t)(g->kd * g->kh * g->kw) * sizeof(int64_t) + (size_t)g->m * sizeof(float);
}

static size_t u8_scratch_bytes(const conv_cl *g) {
    int64_t dp, hp, wp, cp;
    size_t img;
    return u8_sizes(g, &dp, &hp, &wp, &cp, &img);
}

static void conv_u8s8(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                      af_exec *ex) {
    int64_t dp, hp, wp, cp;
    size_t img;
    u8_sizes(g, &dp, &hp, &wp, &cp, &img);
    int64_t *taps = (int64_t *)(scratch + img);
    float *scale = (float *)(taps + g->kd * g->kh * g->kw);
    for (int64_t m = 0; m < g->m; m++)
        scale[m] = g->q.x_scale * g->q.w_scale[g->q.nw_scale == 1 ? 0 : m];
    u8_job j = {g, dp, hp, wp, cp, scratch};
    const uint8_t *image = u8_in_place(g) ? g->x8 : scratch;
    if (!u8_in_place(g))
        af_exec_parallel(ex, g->n * dp * hp,
                         af_exec_work_ns(ex, 0.0, (g->x8 ? 2.0 : 5.0) * (double)(g->n * dp * hp * wp * cp)),
                         u8_rows, &j);
    bool merged = g->dw == 1; /* a window row is KW * cp contiguous bytes */
    int64_t ntaps = 0;
    for (int64_t a = 0; a < g->kd; a++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t k = 0; k < (merged ? 1 : g->kw); k++)
                taps[ntaps++] = ((a * g->dd * hp + i * g->dh) * wp + k * g->dw) * cp;
    bool flat = conv_flat(g);
    int64_t planes = flat ? 1 : g->od, plane = g->oh * g->ow;
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t zp = 0; zp < planes; zp++) {
            int64_t row0 = (b * g->od + zp) * plane;
            af_gemm gm = {image + ((b * dp + zp * g->sd) * hp) * wp * cp, flat ? 1 : g->oh,
                          flat ? g->od * plane : g->ow, g->sh * wp * cp, g->sw * cp, taps, ntaps,
                          merged ? g->kw * cp : cp, g->wt, g->m, y ? y + row0 * g->m : NULL, g->m, ep, row0,
                          0, AF_GEMM_U8S8, NULL, NULL, 0, 0, 0, scale, g->q.x_zero, g->w7};
            af_gemm_run(ex, &gm);
        }
}

/* ---- Winograd F(4x4, 3x3) --------------------------------------------------------------------------
 * For a 3x3 stride-1 conv (w_packed = 3): the output in 4x4 tiles, each read from a 6x6 patch
 * of the zero-bordered input. Three phases, each in parallel: every tile's patch transformed
 * (V = B^T d B per channel, V[e][tile][c] for the 36 positions e), then for each position one
 * GEMM of all tiles by the packed transformed weights U[e] (Cin x Cout, made by the pack pass:
 * each U[e] is read once, while V and M stay in cache), then every tile transformed back
 * (Y = A^T M A) and finished by the epilogue: 36 products of Cin x Cout per 16 outputs instead
 * of 144. */

typedef struct wino_job {
    const conv_cl *g;
    const af_vep *ep;
    const float *xp; /* the zero-bordered input, hp x wp */
    int64_t hp, wp, th, tw, ntiles;
    float *v, *mt, *y; /* V [36][ntiles][c], M [36][ntiles][m], output */
    float *tile;       /* per slot: 16 x m */
} wino_job;

static void wino_in_tiles(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const wino_job *j = ctx;
    const conv_cl *g = j->g;
    const af_vec_ops *v = af_vec();
    for (int64_t tile = begin; tile < end; tile++) {
        int64_t b = tile / (j->th * j->tw), r = tile % (j->th * j->tw);
        const float *x = j->xp + ((b * j->hp + r / j->tw * 4) * j->wp + r % j->tw * 4) * g->c;
        v->wino_in(x, j->wp * g->c, g->c, j->v + tile * g->c, j->ntiles * g->c);
    }
}

static void wino_products(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const wino_job *j = ctx;
    const conv_cl *g = j->g;
    size_t per = af_gemm_packed_floats(g->c, g->m);
    static const int64_t tap0[1] = {0};
    for (int64_t e = begin; e < end; e++) {
        af_gemm gm = {j->v + e * j->ntiles * g->c, 1, j->ntiles, 0, g->c, tap0, 1, g->c,
                      g->wt + (size_t)e * per, g->m, j->mt + e * j->ntiles * g->m, g->m, NULL, 0, 0,
                      AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
        af_gemm_run(NULL, &gm);
    }
}

static void wino_out_tiles(void *ctx, int slot, int64_t begin, int64_t end) {
    const wino_job *j = ctx;
    const conv_cl *g = j->g;
    const af_vec_ops *v = af_vec();
    int64_t m = g->m;
    float *yt = j->tile + (size_t)slot * 16 * m;
    for (int64_t tile = begin; tile < end; tile++) {
        int64_t b = tile / (j->th * j->tw), r = tile % (j->th * j->tw);
        int64_t oh0 = r / j->tw * 4, ow0 = r % j->tw * 4;
        v->wino_out(j->mt + tile * m, j->ntiles * m, m, yt);
        int64_t rows = g->oh - oh0 < 4 ? g->oh - oh0 : 4, cols = g->ow - ow0 < 4 ? g->ow - ow0 : 4;
        for (int64_t i = 0; i < rows; i++) {
            int64_t pos = (b * g->oh + oh0 + i) * g->ow + ow0;
            float *dst = j->y + pos * m;
            af_copy(dst, yt + i * 4 * m, (size_t)(cols * m) * sizeof(float));
            if (j->ep->nsteps || j->ep->generic) v->ep_tile(j->ep, dst, m, pos, 0, cols, m);
        }
    }
}

/* Scratch of the Winograd path: the zero-bordered input covering whole tiles, V, M, and one
 * output tile per thread. */
static size_t wino_sizes(const conv_cl *g, int threads, int64_t *hp, int64_t *wp, size_t *img,
                         size_t *vm) {
    int64_t ntiles = g->n * ((g->oh + 3) / 4) * ((g->ow + 3) / 4);
    *hp = (g->oh + 3) / 4 * 4 + 2;
    *wp = (g->ow + 3) / 4 * 4 + 2;
    *img = ((size_t)(g->n * *hp * *wp * g->c) * sizeof(float) + 63) & ~(size_t)63;
    *vm = ((size_t)(36 * ntiles * (g->c + g->m)) * sizeof(float) + 63) & ~(size_t)63;
    return *img + *vm + (size_t)threads * 16 * (size_t)g->m * sizeof(float);
}

static void conv_winograd(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                          af_exec *ex) {
    int64_t hp, wp;
    size_t img, vm;
    wino_sizes(g, af_exec_threads(ex), &hp, &wp, &img, &vm);
    pad_job pj = {g, (float *)scratch, 1, hp, wp};
    af_exec_parallel(ex, g->n * hp, pad_ns(g, 1, hp, wp, ex), pad_rows, &pj);
    int64_t th = (g->oh + 3) / 4, tw = (g->ow + 3) / 4, ntiles = g->n * th * tw;
    float *v = (float *)(scratch + img);
    wino_job j = {g, ep, (float *)scratch, hp, wp, th, tw, ntiles, v, v + 36 * ntiles * g->c, y,
                  (float *)(scratch + img + vm)};
    /* the transforms: about 10 additions per element of 36-element tiles, in and out */
    double in_ns = af_exec_work_ns(ex, 360.0 * (double)(ntiles * g->c), 288.0 * (double)(ntiles * g->c));
    double out_ns = af_exec_work_ns(ex, 360.0 * (double)(ntiles * g->m), 288.0 * (double)(ntiles * g->m));
    af_exec_parallel(ex, ntiles, in_ns, wino_in_tiles, &j);
    af_exec_parallel(ex, 36, af_exec_work_ns(ex, 72.0 * (double)(ntiles * g->c * g->m), 0.0),
                     wino_products, &j);
    af_exec_parallel(ex, ntiles, out_ns, wino_out_tiles, &j);
}

/* ---- depthwise ----------------------------------------------------------------------------------- */

typedef struct dw_job {
    const conv_cl *g;
    const af_vep *ep;
    float *y;
    float *sums; /* NULL, or per output row the [M] sums of its outputs (pool_out) */
    /* codes out (y_scale): each row made in its slot's row of floats (OW x C) and written as
     * codes */
    uint8_t *codes;
    float *rowbuf;
} dw_job;

/* Floats of a depthwise conv's row, whole cache lines. */
static size_t dw_row_floats(const conv_cl *g) {
    return ((size_t)(g->ow * g->c) + 15) & ~(size_t)15;
}

/* Floats between two output rows' sums: whole cache lines, so that two threads, which add
 * into a row's sums at every output position, never write the same line. Sums per row rather
 * than per thread make the means independent of which thread ran which rows. */
static size_t dw_sums_stride(const conv_cl *g) {
    return ((size_t)g->m + 15) & ~(size_t)15;
}

/* Bytes of every output row's sums: a multiple of 64, so what follows them stays aligned. */
static size_t conv_sums_bytes(const conv_cl *g) {
    return (size_t)(g->n * g->oh) * dw_sums_stride(g) * sizeof(float);
}

/* Output rows [begin, end) over batch x OD x OH. A 3-D conv's row is a 2-D kernel's of KD * KH
 * rows (the packed weights' [KD][KH][KW] order) reading its input rows through pointers, NULL
 * for those outside the input (the depth's padding as well as the height's). Before, 3-D
 * depthwise convs ran as C one-column GEMMs: 1.8x ONNX Runtime's time on a 32-channel 3x3x3. */
static void dw_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    const dw_job *j = ctx;
    const conv_cl *g = j->g;
    const af_vec_ops *v = af_vec();
    const float *rows[AF_DW_MAX_ROWS];
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / (g->od * g->oh), z = r / g->oh % g->od, oh = r % g->oh;
        float *yr = j->codes ? j->rowbuf + (size_t)slot * dw_row_floats(g) : j->y + r * g->ow * g->c;
        af_dw_row p = {g->x + b * g->d * g->h * g->w * g->c, g->h, g->w, g->c, g->wt, g->b,
                       g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->ph, g->pw, oh, g->ow, yr,
                       j->ep, r * g->ow,
                       j->sums ? j->sums + (size_t)r * dw_sums_stride(g) : NULL, NULL};
        if (g->y.rank == 5) {
            for (int64_t kd = 0; kd < g->kd; kd++)
                for (int64_t kh = 0; kh < g->kh; kh++) {
                    int64_t xd = z * g->sd - g->pd + kd * g->dd, ih = oh * g->sh - g->ph + kh * g->dh;
                    bool in = xd >= 0 && xd < g->d && ih >= 0 && ih < g->h;
                    rows[kd * g->kh + kh] = in ? p.x + (xd * g->h + ih) * g->w * g->c : NULL;
                }
            p.xrows = rows; /* every row "inside": kernel row k reads rows[k] */
            p.x = NULL;
            p.h = p.kh = g->kd * g->kh;
            p.oh = p.ph = 0;
            p.sh = p.dh = 1;
        }
        v->dw_row(&p);
        if (j->codes) v->to_u8(yr, j->codes + r * g->ow * g->c, g->ow * g->c, g->ys, g->yz);
    }
}

/* ---- a depthwise conv with its 1x1 expand conv merged in ---------------------------------------- */

/* Each thread walks its output rows in order, keeping the expanded input rows the kernel window
 * covers in a ring of `span` rows (input row ih in slot ih % span): each expanded row is
 * computed once per thread (by the GEMM core, one output row of the expand at a time, with its
 * epilogue) and read from cache by the depthwise kernel; the [N, H, W, E] tensor between the two
 * convs is never written. A slot's ring, and which rows it holds, last from one of its pieces
 * to the next (af_exec_parallel), so a piece that starts where the slot's last one ended
 * recomputes no row. */
enum { PRO_MAX_SPAN = 64 };

static int64_t pro_span(const conv_cl *g) {
    return (g->kh - 1) * g->dh + 1;
}

/* A slot's part of the ring scratch: which row each ring slot holds (image * H + ih, or -1),
 * then the rows. */
typedef struct pro_ring {
    int64_t have[PRO_MAX_SPAN];
    float rows[];
} pro_ring;

static size_t pro_ring_bytes(const conv_cl *g) {
    return (sizeof(pro_ring) + (size_t)(pro_span(g) * g->w * g->c) * sizeof(float) + 63) &
           ~(size_t)63;
}

typedef struct pro_job {
    const conv_cl *g;
    const af_vep *ep, *pro;
    float *y, *sums;
    unsigned char *rings; /* pro_ring_bytes(g) per slot */
} pro_job;

/* Expanded input row ih of image b into dst ([W][E]). */
static void pro_expand_row(const pro_job *j, int64_t b, int64_t ih, float *dst) {
    const conv_cl *g = j->g;
    static const int64_t tap0[1] = {0};
    int64_t row = b * g->h + ih;
    af_gemm gm = {g->pro_x + row * g->w * g->pro_c, 1, g->w, 0, g->pro_c, tap0, 1, g->pro_c,
                  g->pro_wt, g->c, dst, g->c, j->pro, row * g->w, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
    af_gemm_run(NULL, &gm);
}

static void pro_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    const pro_job *j = ctx;
    const conv_cl *g = j->g;
    const af_vec_ops *v = af_vec();
    int64_t span = pro_span(g);
    pro_ring *ring = (pro_ring *)(j->rings + (size_t)slot * pro_ring_bytes(g));
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / g->oh, oh = r % g->oh, ih0 = oh * g->sh - g->ph;
        const float *rows[PRO_MAX_SPAN];
        for (int64_t k = 0; k < g->kh; k++) {
            int64_t ih = ih0 + k * g->dh, s = ih % span;
            rows[k] = NULL;
            if (ih < 0 || ih >= g->h) continue;
            float *dst = ring->rows + s * g->w * g->c;
            if (ring->have[s] != b * g->h + ih) pro_expand_row(j, b, ih, dst);
            ring->have[s] = b * g->h + ih;
            rows[k] = dst;
        }
        af_dw_row p = {NULL, g->h, g->w, g->c, g->wt, g->b, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw,
                       g->ph, g->pw, oh, g->ow, j->y + r * g->ow * g->c, j->ep, r * g->ow,
                       j->sums ? j->sums + (size_t)r * dw_sums_stride(g) : NULL, rows};
        v->dw_row(&p);
    }
}

/* ---- transposed: a GEMM into columns, then col2im as a gather ------------------------------------
 * y[o] = sum over kernel positions t and inputs i with i * s - p + t * dil = o (per dim) of
 * x[i] W[t]. The input positions times the packed [Cg][taps * Mg] weights (one GEMM per group)
 * give every kernel position's contribution of each input ("columns"); each output position then
 * sums the contributions that land on it (a gather: no two threads write one output) and its
 * row goes through the epilogue while in cache. A depthwise ConvTranspose (Cg = Mg = 1) gathers
 * x * W directly. The work is cut in bands along the outermost spatial axis with more than one
 * position: a band of outputs reads a slab of inputs that is contiguous in channels-last memory
 * (the axes before it have one position), and a thread runs a whole band (its GEMM on the
 * columns of that slab, in its own scratch, then the gather), so the columns never leave the
 * cache and no loop waits for another. Inputs near a band's edge that reach into the next band
 * are multiplied again there: (K - 1) * dil / s rows per band. */

/* Begin and end of the input range along axis a that outputs [o0, o1) read. */
static void convt_in_range(const conv_cl *g, int a, int64_t o0, int64_t o1, int64_t *i0, int64_t *i1) {
    const int64_t in[3] = {g->d, g->h, g->w}, k[3] = {g->kd, g->kh, g->kw};
    const int64_t s[3] = {g->sd, g->sh, g->sw}, dl[3] = {g->dd, g->dh, g->dw}, p[3] = {g->pd, g->ph, g->pw};
    int64_t lo = o0 + p[a] - (k[a] - 1) * dl[a], hi = o1 - 1 + p[a];
    lo = lo >= 0 ? (lo + s[a] - 1) / s[a] : -((-lo) / s[a]);
    hi = hi >= 0 ? hi / s[a] + 1 : -((-hi + s[a] - 1) / s[a]) + 1;
    *i0 = lo < 0 ? 0 : lo;
    *i1 = hi > in[a] ? in[a] : hi;
    if (*i1 < *i0) *i1 = *i0;
}

/* The kernel positions t (and their inputs i) that reach output o along one dim: the count. */
static int convt_taps(int64_t o, int64_t in, int64_t k, int64_t s, int64_t dl, int64_t p, int64_t *kk,
                      int64_t *ii) {
    int n = 0;
    if ((s & (s - 1)) == 0) { /* strides are mostly powers of two: no division per tap */
        int sh = __builtin_ctzll((unsigned long long)s);
        for (int64_t t = 0; t < k; t++) {
            int64_t v = o + p - t * dl;
            if (v < 0) break;
            if ((v & (s - 1)) || (v >> sh) >= in) continue;
            kk[n] = t;
            ii[n++] = v >> sh;
        }
        return n;
    }
    for (int64_t t = 0; t < k; t++) {
        int64_t v = o + p - t * dl;
        if (v < 0) break; /* smaller still for every later t */
        if (v % s || v / s >= in) continue;
        kk[n] = t;
        ii[n++] = v / s;
    }
    return n;
}

typedef struct convt_job {
    const conv_cl *g;
    const af_vep *ep;
    float *y;
    unsigned char *cols; /* slot_bytes per slot */
    size_t slot_bytes;
    int axis;              /* the banded axis: 0 D, 1 H, 2 W */
    int64_t band, nbands;  /* outputs per band along it, bands per image */
} convt_job;

/* Scratch of one slot: the columns of a band's input slab, then the tap lists of the three dims
 * (kernel position and input index each). */
static size_t convt_slot_bytes(const conv_cl *g, int axis, int64_t band) {
    const int64_t in[3] = {g->d, g->h, g->w}, k[3] = {g->kd, g->kh, g->kw};
    const int64_t s[3] = {g->sd, g->sh, g->sw}, dl[3] = {g->dd, g->dh, g->dw};
    int64_t slab = (band - 1 + (k[axis] - 1) * dl[axis]) / s[axis] + 1, inner = 1;
    if (slab > in[axis]) slab = in[axis];
    for (int a = axis + 1; a < 3; a++) inner *= in[a];
    size_t cols = g->packed == 2 ? 0 : (size_t)(slab * inner * g->kd * g->kh * g->kw * g->m) * sizeof(float);
    size_t lists = (size_t)(2 * (g->kd + g->kh + g->kw)) * sizeof(int64_t);
    return ((cols + 63) & ~(size_t)63) + ((lists + 63) & ~(size_t)63); /* slots stay 64-byte aligned */
}

/* Output row (b, od, oh) of the band: every position's gathered sum, then the epilogue. src is
 * the columns (dense; position stride T * M, group gi's tap t at gi * T * Mg + t * Mg) or X
 * (depthwise), local positions counted from the slab's first, `first`. */
static void convt_row(const convt_job *j, int64_t b, int64_t od, int64_t oh, int64_t ow0, int64_t ow1,
                      const float *src, int64_t first, int64_t *lists) {
    const conv_cl *g = j->g;
    int64_t *kd = lists, *id = kd + g->kd, *kh = id + g->kd, *ih = kh + g->kh, *kw = ih + g->kh,
            *iw = kw + g->kw;
    int nd = convt_taps(od, g->d, g->kd, g->sd, g->dd, g->pd, kd, id);
    int nh = convt_taps(oh, g->h, g->kh, g->sh, g->dh, g->ph, kh, ih);
    int64_t taps = g->kd * g->kh * g->kw, m = g->m, mg = g->mg, stride = g->packed == 2 ? g->c : taps * m;
    int64_t pos0 = ((b * g->od + od) * g->oh + oh) * g->ow;
    for (int64_t ow = ow0; ow < ow1; ow++) {
        float *yp = j->y + (pos0 + ow) * m;
        int nw = convt_taps(ow, g->w, g->kw, g->sw, g->dw, g->pw, kw, iw);
        bool any = false;
        for (int a = 0; a < nd; a++)
            for (int c = 0; c < nh; c++)
                for (int e = 0; e < nw; e++) {
                    int64_t t = (kd[a] * g->kh + kh[c]) * g->kw + kw[e];
                    int64_t ip = (id[a] * g->h + ih[c]) * g->w + iw[e] - first;
                    const float *sp = src + ip * stride;
                    if (g->packed == 2) { /* depthwise: x * W[t] */
                        const float *wt = g->wt + t * m;
                        if (!any)
                            for (int64_t q = 0; q < m; q++) yp[q] = sp[q] * wt[q];
                        else
                            for (int64_t q = 0; q < m; q++) yp[q] += sp[q] * wt[q];
                    } else {
                        for (int64_t gi = 0; gi < g->group; gi++) {
                            const float *cp = sp + (gi * taps + t) * mg;
                            float *yg = yp + gi * mg;
                            if (!any) af_copy(yg, cp, (size_t)mg * sizeof(float));
                            else
                                for (int64_t q = 0; q < mg; q++) yg[q] += cp[q];
                        }
                    }
                    any = true;
                }
        if (!any) memset(yp, 0, (size_t)m * sizeof(float));
    }
    if (j->ep->nsteps || j->ep->generic)
        af_vec()->ep_tile(j->ep, j->y + (pos0 + ow0) * m, m, pos0 + ow0, 0, ow1 - ow0, m);
}

static void convt_bands(void *ctx, int slot, int64_t begin, int64_t end) {
    const convt_job *j = ctx;
    const conv_cl *g = j->g;
    const int64_t in[3] = {g->d, g->h, g->w}, out[3] = {g->od, g->oh, g->ow};
    unsigned char *mine = j->cols + (size_t)slot * j->slot_bytes;
    size_t lists_bytes = (size_t)(2 * (g->kd + g->kh + g->kw)) * sizeof(int64_t);
    size_t cols_bytes = j->slot_bytes - ((lists_bytes + 63) & ~(size_t)63);
    float *cols = (float *)mine;
    int64_t *lists = (int64_t *)(mine + cols_bytes);
    int64_t inner = 1, taps = g->kd * g->kh * g->kw, in_pos = g->d * g->h * g->w;
    for (int a = j->axis + 1; a < 3; a++) inner *= in[a];
    size_t per = af_gemm_packed_floats(g->cg, taps * g->mg);
    static const int64_t tap0[1] = {0};
    for (int64_t item = begin; item < end; item++) {
        int64_t b = item / j->nbands, o0 = item % j->nbands * j->band;
        int64_t o1 = o0 + j->band < out[j->axis] ? o0 + j->band : out[j->axis], i0, i1;
        convt_in_range(g, j->axis, o0, o1, &i0, &i1);
        const float *xb = g->x + b * in_pos * g->c;
        const float *src = xb;
        if (g->packed != 2 && i1 > i0) {
            for (int64_t gi = 0; gi < g->group; gi++) {
                af_gemm gm = {xb + i0 * inner * g->c + gi * g->cg, 1, (i1 - i0) * inner, 0, g->c,
                              tap0, 1, g->cg, g->wt + (size_t)gi * per, taps * g->mg,
                              cols + gi * taps * g->mg, taps * g->m, NULL, 0, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
                af_gemm_run(NULL, &gm);
            }
            src = cols;
        }
        int64_t first = g->packed == 2 ? 0 : i0 * inner;
        /* the band's output rows: [o0, o1) along the axis, every position along the others */
        int64_t d0 = j->axis == 0 ? o0 : 0, d1 = j->axis == 0 ? o1 : g->od;
        int64_t h0 = j->axis == 1 ? o0 : 0, h1 = j->axis == 1 ? o1 : g->oh;
        int64_t w0 = j->axis == 2 ? o0 : 0, w1 = j->axis == 2 ? o1 : g->ow;
        for (int64_t od = d0; od < d1; od++)
            for (int64_t oh = h0; oh < h1; oh++) convt_row(j, b, od, oh, w0, w1, src, first, lists);
    }
}

/* Band length along the axis: a slab's columns about half the L2 (at least one output), and with
 * several threads enough bands for each to take several. */
static int64_t convt_band(const conv_cl *g, int axis, int threads) {
    const int64_t in[3] = {g->d, g->h, g->w}, out[3] = {g->od, g->oh, g->ow};
    const int64_t s[3] = {g->sd, g->sh, g->sw};
    int64_t inner = 1;
    for (int a = axis + 1; a < 3; a++) inner *= in[a];
    double row_bytes = 4.0 * (double)(inner * g->kd * g->kh * g->kw * g->m); /* one input row's columns */
    double l2 = (double)af_cpu_l2();
    int64_t band = g->packed == 2 ? out[axis] : (int64_t)(l2 / 2 / row_bytes) * s[axis];
    int64_t par = threads > 1 ? (out[axis] * g->n + 4 * threads - 1) / (4 * threads) : out[axis];
    if (par < 1) par = 1;
    if (band > par) band = par;
    if (band < s[axis]) band = s[axis];
    return band < out[axis] ? band : out[axis];
}

static int convt_axis(const conv_cl *g) {
    if (g->d > 1 || g->od > 1) return 0;
    return g->h > 1 || g->oh > 1 ? 1 : 2;
}

static size_t convt_scratch_bytes(const conv_cl *g, int threads) {
    int axis = convt_axis(g);
    int slots = threads < AF_EXEC_MAX_SLOTS ? threads : AF_EXEC_MAX_SLOTS;
    return (size_t)slots * convt_slot_bytes(g, axis, convt_band(g, axis, threads));
}

static void conv_transposed(const conv_cl *g, const af_vep *ep, float *y, unsigned char *scratch,
                            af_exec *ex) {
    int axis = convt_axis(g);
    const int64_t out[3] = {g->od, g->oh, g->ow};
    int64_t band = convt_band(g, axis, af_exec_threads(ex));
    convt_job j = {g, ep, y, scratch, convt_slot_bytes(g, axis, band), axis, band,
                   (out[axis] + band - 1) / band};
    int64_t taps = g->kd * g->kh * g->kw, in_pos = g->d * g->h * g->w, out_pos = g->od * g->oh * g->ow;
    double flops = 2.0 * (double)(g->n * in_pos * g->cg * taps * g->m);
    double bytes = 4.0 * (double)(g->n * (in_pos * (g->c + taps * g->m) + 2 * out_pos * g->m));
    af_exec_parallel(ex, g->n * j.nbands, af_exec_work_ns(ex, flops, bytes), convt_bands, &j);
}

/* The convolution of g into y through the epilogue program ep (bias added here), and with
 * `mean` (depthwise only, may be NULL) the [N][M] means of y over positions; scratch is
 * conv_scratch_bytes(g, mean != NULL, ex) at 64-byte alignment. */
static void conv_run(const conv_cl *g, const af_epilogue *ep, const af_epilogue *pro,
                     void *out, float *mean, unsigned char *scratch, af_exec *ex) {
    af_vep vep;
    float *y = g->codes ? NULL : out;
    af_vep_build(ep, y, g->m, &vep);
    if (g->transposed) {
        if (g->b) af_vep_prepend(&vep, AF_EP_ADD, AF_VEP_COL, g->b);
        conv_transposed(g, &vep, y, scratch, ex);
        return;
    }
    if (g->packed != 2) {
        if (g->b) af_vep_prepend(&vep, AF_EP_ADD, AF_VEP_COL, g->b);
        if (g->packed == 3) conv_winograd(g, &vep, y, scratch, ex);
        else if (g->packed == 4) conv_grouped(g, &vep, y, scratch, ex);
        else if (g->wt_type == AF_GEMM_U8S8) {
            if (g->codes) { /* written by the GEMM driver */
                vep.codes = out;
                vep.codes_scale = g->ys;
                vep.codes_zero = g->yz;
            }
            conv_u8s8(g, &vep, y, scratch, ex);
        }
        else if (g->wt_type != AF_GEMM_F32) conv_low(g, &vep, y, scratch, ex);
        else conv_dense(g, &vep, y, scratch, ex);
        return;
    }
    /* The depthwise row kernel starts from the bias itself. */
    double dw_ns = af_exec_work_ns(ex, 2.0 * (double)(g->n * g->od * g->oh * g->ow * g->c * g->kd * g->kh * g->kw),
                                   4.0 * (double)(g->n * (g->d * g->h * g->w + g->od * g->oh * g->ow) * g->c));
    size_t stride = dw_sums_stride(g), sums_bytes = mean ? conv_sums_bytes(g) : 0;
    float *sums = mean ? (float *)scratch : NULL;
    if (mean) memset(scratch, 0, sums_bytes);
    if (g->pro) {
        af_vep pv;
        af_vep_build(pro, NULL, g->c, &pv);
        if (g->pro_b) af_vep_prepend(&pv, AF_EP_ADD, AF_VEP_COL, g->pro_b);
        pro_job pj = {g, &vep, &pv, y, sums, scratch + sums_bytes};
        for (int s = 0; s < af_exec_threads(ex) && s < AF_EXEC_MAX_SLOTS; s++)
            for (int k = 0; k < PRO_MAX_SPAN; k++)
                ((pro_ring *)(pj.rings + (size_t)s * pro_ring_bytes(g)))->have[k] = -1;
        af_exec_parallel(ex, g->n * g->oh, dw_ns + af_exec_work_ns(ex, 2.0 * (double)(g->n * g->h * g->w * g->c * g->pro_c), 0.0), pro_rows, &pj);
    } else {
        dw_job j = {g, &vep, y, sums, g->codes ? out : NULL, (float *)scratch};
        af_exec_parallel(ex, g->n * g->od * g->oh, dw_ns, dw_rows, &j);
    }
    if (!mean) return;
    float inv = 1.0f / (float)(g->oh * g->ow);
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t c = 0; c < g->m; c++) {
            float sum = 0.0f;
            for (int64_t oh = 0; oh < g->oh; oh++) sum += sums[(size_t)(b * g->oh + oh) * stride + (size_t)c];
            mean[b * g->m + c] = sum * inv;
        }
}

static size_t conv_scratch_bytes(const conv_cl *g, bool mean, af_exec *ex) {
    if (g->transposed) return convt_scratch_bytes(g, af_exec_threads(ex));
    if (g->packed == 1 && g->wt_type == AF_GEMM_U8S8) return u8_scratch_bytes(g);
    if (g->packed == 1 || g->packed == 4)
        return g->wt_type != AF_GEMM_F32 ? low_scratch_bytes(g)
                                         : dense_scratch_bytes(g, af_exec_threads(ex));
    if (g->packed == 3) {
        int64_t hp, wp;
        size_t img, vm;
        return wino_sizes(g, af_exec_threads(ex), &hp, &wp, &img, &vm);
    }
    int slots = af_exec_threads(ex) < AF_EXEC_MAX_SLOTS ? af_exec_threads(ex) : AF_EXEC_MAX_SLOTS;
    if (g->codes) return (size_t)slots * dw_row_floats(g) * sizeof(float); /* no pro, no mean */
    size_t sums = mean ? conv_sums_bytes(g) : 0;
    return g->pro ? sums + (size_t)slots * pro_ring_bytes(g) : sums;
}

/* What a channels-last FusedConv knows before its data: geometry and weights (conv_cl), its
 * epilogue and a merged expand conv's program, and whether it writes the means too. Prepared
 * once per node (af_kernel_prepare) or derived on the spot. */
typedef struct conv_prep {
    conv_cl g;
    af_epilogue ep, pro;
    bool mean;
} conv_prep;

static af_status conv_decode(const af_node *n, const af_tensor *const *in, conv_prep *p,
                             af_error *err) {
    conv_cl *g = &p->g;
    af_status st = conv_cl_setup(n, in, g, err);
    if (st != AF_OK) return st;
    if (!g->packed || g->y.rank < 3)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "channels-last weights not packed, or X unknown");
    p->mean = pool_out(n);
    st = af_epilogue_prepare_attr(n, in, &g->y, "epilogue", &p->ep, err);
    p->pro.nsteps = 0;
    if (st == AF_OK && g->codes) {
        af_vep v;
        af_vep_build(&p->ep, NULL, g->m, &v);
        if (v.generic || p->mean)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "y_scale needs an epilogue of vector steps, and no means");
    }
    if (st != AF_OK || !g->pro) return st;
    /* A merged expand conv's program, over its [N, H, W, E] output; only kinds the vector
     * epilogue runs per tile (the ring rows are not that tensor's memory). */
    af_tensor pt = {AF_DTYPE_FLOAT, 4, {g->n, g->h, g->w, g->c}, NULL, 0, 0};
    st = af_epilogue_prepare_attr(n, in, &pt, "pro_epilogue", &p->pro, err);
    af_vep pv;
    af_vep_build(&p->pro, NULL, g->c, &pv);
    if (st == AF_OK && (pv.generic || pro_span(g) > PRO_MAX_SPAN))
        st = af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                          "merged expand conv: epilogue operands or kernel height not supported");
    return st;
}

void *fast_prepare_fused_conv(const af_node *n, const af_tensor *const *types) {
    conv_prep *p = af_malloc(sizeof *p);
    if (p && conv_decode(n, types, p, NULL) != AF_OK) {
        af_free(p);
        p = NULL;
    }
    return p;
}

/* The run-time checks of a conv set up for its run's inputs: packed weights, data present. */
static af_status conv_ready(const af_node *n, const af_tensor *const *in, const conv_cl *g,
                            af_error *err) {
    if (!g->packed) return af_node_fail(err, n, AF_ERR_INTERNAL, "channels-last weights are not packed");
    if (g->y.rank < 3 || !af_tensor_has_data(in[0]) || !g->wt ||
        (nn_in(n, in, 2) && !af_tensor_has_data(in[2])))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    return AF_OK;
}

/* An epilogue's header and its nsteps steps (the rest is never read). */
static void ep_copy(af_epilogue *dst, const af_epilogue *src) {
    memcpy(dst, src, offsetof(af_epilogue, steps) + (size_t)src->nsteps * sizeof(af_ep_step));
}

af_status fast_fused_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    conv_prep p;
    af_status st = AF_OK;
    if (ex && ex->prepared) {
        const conv_prep *q = ex->prepared;
        p.g = q->g;
        p.mean = q->mean;
        ep_copy(&p.ep, &q->ep);
        ep_copy(&p.pro, &q->pro);
        conv_cl_bind(&p.g, n, in);
    } else {
        st = conv_decode(n, in, &p, err);
    }
    const conv_cl *g = &p.g;
    if (st == AF_OK) st = conv_ready(n, in, g, err);
    if (st == AF_OK) st = nn_check_out(n, &out[0], g->y.rank, g->y.dims, err);
    if (st == AF_OK && out[0].dtype != (g->codes ? AF_DTYPE_UINT8 : AF_DTYPE_FLOAT))
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "output not allocated in its type");
    int64_t md[4] = {g->n, 1, 1, g->m};
    if (st == AF_OK && p.mean) st = nn_check_out(n, &out[1], 4, md, err);
    if (st == AF_OK) st = af_epilogue_bind(n, &p.ep, in, err);
    if (st == AF_OK && g->pro) st = af_epilogue_bind(n, &p.pro, in, err);
    if (st != AF_OK) return st;
    size_t bytes = conv_scratch_bytes(g, p.mean, ex);
    unsigned char *scratch = bytes ? af_exec_scratch(ex, bytes) : NULL;
    if (bytes && !scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    conv_run(g, &p.ep, g->pro ? &p.pro : NULL, out[0].data, p.mean ? out[1].data : NULL, scratch,
             ex);
    return AF_OK;
}

/* ---- ConvPoolFc -------------------------------------------------------------------------------- */

/* The FC part of a channels-last ConvPoolFc: Wfc (input 3) packed with fc_shape = [M, classes]
 * (fc_packed = 1, made by the pack pass) or plain [M, classes] / [classes, M] (fc_trans_b),
 * Bfc (input 4) broadcasting to [N, classes]. */
typedef struct cpf_cl {
    conv_cl conv;
    const af_tensor *w, *b;
    int64_t classes;
    bool packed, tb;
} cpf_cl;

static af_status cpf_setup(const af_node *n, const af_tensor *const *in, cpf_cl *c, af_tensor *y,
                           af_error *err) {
    af_status st = conv_cl_setup(n, in, &c->conv, err);
    if (st != AF_OK) return st;
    c->w = nn_in(n, in, 3);
    c->b = nn_in(n, in, 4);
    c->packed = af_attr_int(n, "fc_packed", 0) != 0;
    c->tb = af_attr_int(n, "fc_trans_b", 0) != 0;
    if (!c->w || c->w->dtype != AF_DTYPE_FLOAT || (c->b && c->b->dtype != AF_DTYPE_FLOAT))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "Wfc (and Bfc) must be float32");
    int64_t k = -1;
    if (c->packed) {
        const int64_t *fs = NULL;
        if (af_attr_ints(n, "fc_shape", &fs) != 2 || fs[0] < 1 || fs[1] < 1 || c->tb ||
            c->w->rank != 1 || (c->w->dims[0] >= 0 &&
                                c->w->dims[0] != (int64_t)af_gemm_packed_floats(fs[0], fs[1])))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "fc_packed needs fc_shape and its packed Wfc");
        k = fs[0];
        c->classes = fs[1];
    } else {
        if (c->w->rank != 2) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "Wfc must be 2-D");
        k = c->w->dims[c->tb ? 1 : 0];
        c->classes = c->w->dims[c->tb ? 0 : 1];
    }
    int64_t m = c->conv.y.rank >= 3 ? c->conv.y.dims[c->conv.y.rank - 1] : -1;
    if (k >= 0 && m >= 0 && k != m)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "Wfc expects %lld features but the conv has %lld channels",
                            (long long)k, (long long)m);
    int64_t dims[2] = {c->conv.y.rank >= 3 ? c->conv.y.dims[0] : -1, c->classes};
    af_tensor_set_type(y, AF_DTYPE_FLOAT, 2, dims);
    if (c->b && (c->b->rank > 2 || (c->b->rank >= 1 && c->b->dims[c->b->rank - 1] != 1 &&
                                     c->b->dims[c->b->rank - 1] != c->classes)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "Bfc does not broadcast to [N, classes]");
    return AF_OK;
}

af_status fast_shape_conv_pool_fc(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    cpf_cl c;
    af_status st = cpf_setup(n, in, &c, &out[0], err);
    if (st == AF_OK && c.conv.y.rank >= 3) st = af_epilogue_validate(n, in, &c.conv.y, err);
    return st;
}

af_status fast_conv_pool_fc(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    cpf_cl c;
    af_tensor yt;
    af_epilogue ep, fc_ep;
    af_status st = cpf_setup(n, in, &c, &yt, err);
    if (st == AF_OK) st = conv_ready(n, in, &c.conv, err);
    if (st == AF_OK && (!af_tensor_has_data(c.w) || (c.b && !af_tensor_has_data(c.b))))
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    if (st == AF_OK) st = nn_check_out(n, &out[0], 2, yt.dims, err);
    if (st == AF_OK) st = af_epilogue_parse(n, in, &c.conv.y, &ep, err);
    if (st != AF_OK) return st;
    const conv_cl *g = &c.conv;
    int64_t rows = g->od * g->oh * g->ow;
    size_t conv_floats = (size_t)(g->n * rows * g->m), wfloats = c.packed ? 0 : af_gemm_packed_floats(g->m, c.classes);
    size_t cb = (conv_floats * sizeof(float) + 63) & ~(size_t)63, csb = conv_scratch_bytes(g, false, ex);
    size_t pb = ((size_t)(g->n * g->m) * sizeof(float) + 63) & ~(size_t)63;
    size_t bytes = cb + ((csb + 63) & ~(size_t)63) + pb + wfloats * sizeof(float);
    unsigned char *s = af_exec_scratch(ex, bytes);
    if (!s) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    float *conv = (float *)s, *pooled = (float *)(s + cb + ((csb + 63) & ~(size_t)63));
    float *wp = (float *)((unsigned char *)pooled + pb);
    /* The conv output lives only in scratch (cache-sized for a classification head). */
    conv_run(g, &ep, NULL, conv, NULL, s + cb, ex);
    const af_vec_ops *v = af_vec();
    for (int64_t b = 0; b < g->n; b++) {
        float *pr = pooled + b * g->m;
        v->reduce_rows(conv + b * rows * g->m, rows, g->m, 0, pr);
        for (int64_t j = 0; j < g->m; j++) pr[j] /= (float)rows;
    }
    const float *w = c.w->data;
    if (!c.packed) {
        af_gemm_pack(w, g->m, c.classes, c.tb ? 1 : c.classes, c.tb ? g->m : 1, wp);
        w = wp;
    }
    /* Bfc as an epilogue over [N, classes]: COL for [classes], generic otherwise. */
    memset(&fc_ep, 0, sizeof fc_ep);
    fc_ep.rank = 2;
    fc_ep.dims[0] = g->n;
    fc_ep.dims[1] = c.classes;
    if (c.b) {
        fc_ep.nsteps = 1;
        fc_ep.steps[0].op = AF_EP_ADD;
        fc_ep.steps[0].operand = c.b->data;
        af_broadcast_strides(c.b, &yt, fc_ep.steps[0].strides);
    }
    af_vep fv;
    af_vep_build(&fc_ep, out[0].data, c.classes, &fv);
    static const int64_t tap0[1] = {0};
    af_gemm gm = {pooled, 1, g->n, 0, g->m, tap0, 1, g->m, w, c.classes, out[0].data, c.classes,
                  &fv, 0, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
    af_gemm_run(ex, &gm);
    return AF_OK;
}
