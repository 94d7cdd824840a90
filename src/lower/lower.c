/* Lowering: the graph as the fast kernels run it. It runs after fusion, and alone on the unfused
 * graph (--no_fusion), so both use the same kernels and differ only by what fusion did:
 *  - cores: every float32 Conv, ConvTranspose (a FusedConv with transposed = 1), MatMul and
 *    Gemm becomes the FusedConv / FusedMatMul that computes it with an empty epilogue (one GEMM and one convolution serve every graph);
 *  - BatchNormalization in inference mode with constant parameters becomes a FusedElementwise
 *    scale-and-shift: one pass over X, as a BatchNorm kernel makes (fusion folds it into the
 *    conv instead);
 *  - then the layout pass (layout.c) makes 2-D convolutions channels-last, and packing stores
 *    every constant GEMM weight in the panel order of kernels/fast/gemm.h, once, at compile time.
 *
 * Bodies of If, Loop and Scan are lowered and packed as graphs of their own: a weight a body
 * captures from the main graph is packed into a constant of the body, and the rewrites that
 * follow a producer (an expand conv, a squeeze-excite's conv, Q/K/V projections) stop where it
 * is another graph's.
 *
 * Invariant: a lowered node computes what the node it replaces computed (the same output value,
 * name and consumers); nodes the fast kernels cannot take (other dtypes, non-constant BatchNorm
 * statistics, training mode) are left as they are.
 */
#include "fusion/rule.h"
#include "kernels/simd/cpu.h"
#include "kernels/fast/gemm.h"
#include "kernels/simd/vec.h"
#include "kernels/ref/nn_common.h"
#include "lower/lower.h"
#include "passes/rewrite.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Put `n` (appended last) in the place of `old`, producing old's output values. */
static void take_place(af_graph *g, af_node *n, af_node *old) {
    int pos = old->id;
    af_value *outs[8];
    int nout = old->nout < 8 ? old->nout : 8;
    for (int o = 0; o < nout; o++) outs[o] = old->out[o];
    af_node_remove(old);
    for (int o = 0; o < nout && o < n->nout; o++)
        if (outs[o]) af_node_set_output(n, o, outs[o]);
    af_node_move_last_to(g, pos);
    af_graph_renumber(g);
}

static bool all_f32(const af_node *n) {
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && n->in[i]->type.dtype != AF_DTYPE_FLOAT) return false;
    return n->nout >= 1 && n->out[0] && n->out[0]->type.dtype == AF_DTYPE_FLOAT;
}

/* Conv, MatMul, Gemm -> FusedConv / FusedMatMul with no epilogue steps. */
static af_status lower_core(af_graph *g, af_node *n, af_error *err) {
    fuse_core core;
    if (fuse_core_init(&core, n) != NULL) return AF_OK; /* nothing a fused core can express */
    af_node *f = fuse_core_build(&core, n->name, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    take_place(g, f, n);
    return AF_OK;
}

/* BatchNormalization(X, scale, B, mean, var) -> FusedElementwise(X, s, t): y = x * s + t
 * (fuse_bn_node). A BN that follows a conv was folded into it by the fuser, one followed by an
 * activation was fused with it (BatchNormActFusionOp); the ones left read something else. */
static af_status lower_batchnorm(af_graph *g, af_node *n, af_error *err) {
    if (!fuse_bn_inference(n)) return AF_OK;
    fuse_epi e;
    fuse_epi_init(&e);
    af_node *f = fuse_bn_node(n, &e, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    take_place(g, f, n);
    return AF_OK;
}

/* ---- dead taps ----------------------------------------------------------------------------- */

/* Kernel positions whose window never touches X, for any output position, only multiply
 * padding: a conv dilated past its feature map (DeepLabV3's ASPP at rates 24 and 36 on a 14x14
 * map is a 3x3 conv of which only the centre tap reads data). In each spatial dim the dead taps
 * at the kernel's two ends are cut off and the pads shrunk so that every output stays where it
 * was; a dim whose pads would go negative keeps its kernel. */
static af_status trim_dead_taps(af_graph *g, af_node *n, af_error *err) {
    af_value *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL;
    int r = w ? w->type.rank : 0, nsp = r - 2;
    if (!x || !w || !af_value_is_const(w) || !af_value_is_f32(w) || r < 3 || r > 5 ||
        af_attr_int(n, "transposed", 0) ||
        x->type.rank != r || strcmp(af_attr_str(n, "auto_pad", "NOTSET"), "NOTSET"))
        return AF_OK;
    int64_t k[3], first[3], nk[3], pads[6];
    for (int i = 0; i < nsp; i++) {
        k[i] = w->type.dims[2 + i];
        if (x->type.dims[2 + i] < 1 || k[i] < 1) return AF_OK;
    }
    af_tensor xt = x->type;
    xt.data = NULL;
    nn_window win;
    if (nn_window_init(n, &xt, k, nsp, false, &win, NULL) != AF_OK) return AF_OK;
    bool any = false;
    for (int i = 0; i < nsp; i++) {
        int j = NN_MAXSP - nsp + i;
        int64_t lo = -1, hi = -1;
        for (int64_t t = 0; t < k[i]; t++) {
            int64_t a, b;
            nn_window_range(&win, j, t, &a, &b);
            if (a < b) hi = t, lo = lo < 0 ? t : lo;
        }
        if (lo < 0) return AF_OK; /* every tap dead: the output is the bias, leave it */
        int64_t kk = hi - lo + 1, pb = win.pb[j] - lo * win.d[j];
        int64_t pe = (win.out[j] - 1) * win.s[j] + (kk - 1) * win.d[j] + 1 - win.in[j] - pb;
        if (pb < 0 || pe < 0) lo = 0, kk = k[i], pb = win.pb[j], pe = win.pe[j];
        first[i] = lo;
        nk[i] = kk;
        pads[i] = pb;
        pads[nsp + i] = pe;
        any = any || kk != k[i];
    }
    if (!any) return AF_OK;
    int64_t nd[5] = {w->type.dims[0], w->type.dims[1]}, outer = nd[0] * nd[1];
    for (int i = 0; i < nsp; i++) nd[2 + i] = nk[i];
    af_value *nw = af_value_new_f32(g, "trimmed_w", r, nd);
    if (!nw) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    const float *src = w->type.data;
    float *dst = nw->type.data;
    int64_t k3[3] = {1, 1, 1}, f3[3] = {0, 0, 0}, n3[3] = {1, 1, 1}; /* as (D, H, W) */
    for (int i = 0; i < nsp; i++) k3[3 - nsp + i] = k[i], f3[3 - nsp + i] = first[i], n3[3 - nsp + i] = nk[i];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t a = 0; a < n3[0]; a++)
            for (int64_t b = 0; b < n3[1]; b++)
                for (int64_t c = 0; c < n3[2]; c++)
                    *dst++ = src[((o * k3[0] + a + f3[0]) * k3[1] + b + f3[1]) * k3[2] + c + f3[2]];
    af_node_set_input(n, 1, nw);
    af_node_drop_attr(n, "kernel_shape");
    af_node_drop_attr(n, "pads");
    if (!af_node_set_ints(n, "kernel_shape", nk, nsp) || !af_node_set_ints(n, "pads", pads, 2 * nsp))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    return AF_OK;
}

/* Lower the bodies of g's control-flow nodes first: each is a graph of its own, whose nodes
 * may read g's values (captures), which lowering reads like inputs and never rewrites. */
static af_status lower_bodies(af_graph *g, af_status (*pass)(af_graph *, af_error *),
                              af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(g->nodes[i], k)); k++) st = pass(sub, err);
    }
    return st;
}

af_status af_pass_lower(af_graph *g, af_error *err) {
    af_status st = lower_bodies(g, af_pass_lower, err);
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        if ((n->op == AF_OP_CONV || n->op == AF_OP_CONV_TRANSPOSE || n->op == AF_OP_MATMUL ||
             n->op == AF_OP_GEMM) && all_f32(n))
            st = lower_core(g, n, err);
        else if (n->op == AF_OP_BATCH_NORMALIZATION)
            st = lower_batchnorm(g, n, err);
        if (!st && g->nodes[i]->op == AF_OP_FUSED_CONV) st = trim_dead_taps(g, g->nodes[i], err);
    }
    /* Bodies are inferred from their enclosing graph's types: once, from the top. */
    return st || g->parent ? st : af_graph_infer_shapes(g, err);
}

/* ---- packing -------------------------------------------------------------------------------- */

/* A constant 2-D weight matrix read as a GEMM's B (input `slot`, [K, N], or [N, K] when the
 * node's `trans` attribute says so) replaced by its packed panels: `shape` = [K, N] and `flag`
 * = 1 say how, `trans` is folded in. FusedMatMul's B (b_shape, b_packed) and a channels-last
 * ConvPoolFc's FC weights (fc_shape, fc_packed). */
/* The GEMM type node n's precision attribute asks for (precision.c). */
static af_gemm_type gemm_type(const af_node *n) {
    const char *p = af_attr_str(n, "precision", "fp32");
    return !strcmp(p, "bf16") ? AF_GEMM_BF16 : !strcmp(p, "fp16") ? AF_GEMM_F16 : AF_GEMM_F32;
}

/* n cannot run its precision after all: fp32, and why. */
static af_status keep_fp32(af_node *n, const char *why, af_error *err) {
    if (!af_node_set_str(n, "precision", "fp32") || !af_node_set_str(n, "precision_why", why))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    return AF_OK;
}

/* A constant for `bytes` of packed weights of type t: float32, or half / bfloat16 elements. */
static af_value *packed_const(af_graph *g, af_gemm_type t, size_t bytes) {
    int64_t len = (int64_t)(t == AF_GEMM_F32 ? bytes / 4 : bytes / 2);
    if (t == AF_GEMM_F32) return af_value_new_f32(g, "packed_b", 1, &len);
    return af_value_new_const(g, af_graph_unique_name(g, "packed_b"),
                              t == AF_GEMM_F16 ? AF_DTYPE_FLOAT16 : AF_DTYPE_BFLOAT16, 1, &len);
}

/* A constant 2-D weight matrix read as a GEMM's B (input `slot`, [K, N], or [N, K] when the
 * node's `trans` attribute says so) replaced by its packed panels, in the node's precision:
 * `shape` = [K, N] and `flag` = 1 say how, `trans` is folded in. FusedMatMul's B (b_shape,
 * b_packed) and a channels-last ConvPoolFc's FC weights (fc_shape, fc_packed). */
static af_status pack_b(af_graph *g, af_node *n, int slot, const char *trans, const char *shape,
                        const char *flag, af_error *err) {
    af_value *b = n->nin > slot ? n->in[slot] : NULL;
    if (!b || !af_value_is_const(b) || !af_value_is_f32(b) || b->type.rank != 2 || af_attr_int(n, flag, 0))
        return AF_OK;
    bool tb = af_attr_int(n, trans, 0) != 0;
    af_gemm_type t = n->op == AF_OP_FUSED_MATMUL ? gemm_type(n) : AF_GEMM_F32;
    int64_t k = b->type.dims[tb ? 1 : 0], nn = b->type.dims[tb ? 0 : 1], dims[2] = {k, nn};
    af_value *p = packed_const(g, t, af_gemm_packed_bytes(t, k, nn));
    if (!p || !af_node_set_ints(n, shape, dims, 2) || !af_node_set_int(n, flag, 1))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    af_gemm_pack_type(t, b->type.data, k, nn, tb ? 1 : nn, tb ? k : 1, p->type.data);
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, trans)) n->attrs[a].i = 0;
    af_node_set_input(n, slot, p);
    return AF_OK;
}

/* Is a channels-last conv with weights [M, Cg, KH, KW] depthwise (one input channel per
 * output channel)? Those run their own kernel on weights laid out [KH * KW][M]. */
static bool depthwise(const af_node *n, const af_value *w) {
    int64_t group = af_attr_int(n, "group", 1);
    const int64_t *d = w->type.dims;
    return (w->type.rank <= 4 || (w->type.rank == 5 && d[2] * d[3] <= AF_DW_MAX_ROWS)) && d[1] == 1 &&
           group > 1 && d[0] == group;
}

/* Does a channels-last conv with weights [M, Cg, K...] take the grouped row kernel (vec.h
 * af_grp_row): groups of G = Cg = Mg channels with G 2, 4 or 8 (G dividing every vector width
 * the kernel is compiled for: wider groups fill the GEMM's columns well enough)? */
static bool grouped_small(const af_node *n, const af_value *w) {
    int64_t group = af_attr_int(n, "group", 1), cg = w->type.dims[1];
    return group > 1 && w->type.dims[0] == group * cg && (cg == 2 || cg == 4 || cg == 8);
}

/* Kernel positions of conv weights [M, Cg, K...]. */
static int64_t kernel_taps(const af_value *w) {
    int64_t taps = 1;
    for (int i = 2; i < w->type.rank; i++) taps *= w->type.dims[i];
    return taps;
}

static bool all_zero(const af_node *n, const char *name) {
    const int64_t *v = NULL;
    int c = af_attr_ints(n, name, &v);
    for (int i = 0; i < c; i++)
        if (v[i] != 0) return false;
    return true;
}

static bool all_one(const af_node *n, const char *name) {
    const int64_t *v = NULL;
    int c = af_attr_ints(n, name, &v);
    for (int i = 0; i < c; i++)
        if (v[i] != 1) return false;
    return true;
}

/* Winograd F(4x4, 3x3) for a 3x3 stride-1 undilated one-group conv with enough channels for
 * the GEMMs to outweigh the transforms and enough 4x4 output tiles (at least 16) to outweigh
 * reading weights four times the size of the direct ones (measured: 2x faster at 56x56 and
 * 28x28 on ResNet-50, slower at 7x7). AUTOFUSION_WINOGRAD=0 turns it off (direct convolution
 * everywhere, a little closer to the reference). Accuracy: tests/test_lower.c holds it to the
 * same tolerance as direct convolution. */
/* Output rows and columns of a 3x3 stride-1 conv over the channels-last X [N, H, W, C], from
 * X and the padding (the node's output is not the conv's for ConvPoolFc); false when unknown. */
static bool out_hw_3x3(const af_node *n, int64_t *oh, int64_t *ow) {
    const af_tensor *x = n->nin > 0 && n->in[0] ? &n->in[0]->type : NULL;
    if (!x || x->rank != 4 || (x->dims[0] < 1 && !af_dim_is_sym(x->dims[0])) || x->dims[1] < 1 ||
        x->dims[2] < 1)
        return false;
    const char *ap = af_attr_str(n, "auto_pad", "NOTSET");
    const int64_t *p = NULL;
    int np = af_attr_ints(n, "pads", &p);
    int64_t ph = 0, pw = 0; /* total padding of each spatial dim */
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) ph = pw = 2;
    else if (!strcmp(ap, "NOTSET") && np == 4) ph = p[0] + p[2], pw = p[1] + p[3];
    *oh = x->dims[1] + ph - 2;
    *ow = x->dims[2] + pw - 2;
    return *oh >= 1 && *ow >= 1;
}

static bool winograd(const af_node *n, const af_value *w) {
    const char *env = getenv("AUTOFUSION_WINOGRAD");
    const int64_t *d = w->type.dims;
    int64_t oh, ow;
    if (!out_hw_3x3(n, &oh, &ow)) return false;
    /* A symbolic batch counts as 1: the fewest tiles it can have. */
    int64_t batch = n->in[0]->type.dims[0] < 1 ? 1 : n->in[0]->type.dims[0];
    int64_t tiles = batch * ((oh + 3) / 4) * ((ow + 3) / 4);
    return !(env && !strcmp(env, "0")) && d[2] == 3 && d[3] == 3 && d[0] >= 32 && d[1] >= 32 &&
           tiles >= 16 && af_attr_int(n, "group", 1) == 1 && all_one(n, "strides") &&
           all_one(n, "dilations");
}

/* G g G^T of one 3x3 kernel g into u[36] (the weight side of Winograd F(4x4, 3x3)). */
static void wino_weight(const float *k, double *u) {
    static const double G[6][3] = {{0.25, 0, 0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
    double t[6][3];
    for (int i = 0; i < 6; i++)
        for (int b = 0; b < 3; b++) t[i][b] = G[i][0] * k[b] + G[i][1] * k[3 + b] + G[i][2] * k[6 + b];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) u[i * 6 + j] = t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2];
}

/* The dense weights of a one-group conv in half precision (the float32 layout below) or in
 * bfloat16 pairs over k = (kh * KW + kw) * Cp + c, the channels padded to Cp, a multiple of
 * AF_GEMM_BF16_KB, with zero rows: each kernel position is then a tap of whole K blocks (the
 * kernel converts X to bfloat16 with the same padding). */
static af_status pack_conv_low(af_graph *g, af_node *n, af_gemm_type t, af_error *err) {
    const af_value *w = n->in[1];
    const int64_t *d = w->type.dims;
    int64_t m = d[0], c = d[1], taps = kernel_taps(w);
    int64_t cp = t == AF_GEMM_BF16 ? af_gemm_bf16_k(c) : c, k = taps * cp;
    af_value *p = packed_const(g, t, af_gemm_packed_bytes(t, k, m));
    float *tmp = af_calloc((size_t)(k * m > 0 ? k * m : 1), sizeof(float));
    if (!p || !tmp || !af_node_set_ints(n, "w_shape", d, w->type.rank) ||
        !af_node_set_int(n, "w_packed", 1)) {
        af_free(tmp);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    }
    const float *src = w->type.data;
    for (int64_t o = 0; o < m; o++)
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t tp = 0; tp < taps; tp++) tmp[(tp * cp + ci) * m + o] = src[(o * c + ci) * taps + tp];
    af_gemm_pack_type(t, tmp, k, m, m, 1, p->type.data);
    af_free(tmp);
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* A channels-last transposed FusedConv (a ConvTranspose, W [C, Mg, k...]) reads its weights
 *   w_packed = 1: per group, the GEMM panels of B[c][t * Mg + mm] = W[gi * Cg + c][mm][t] (Cg
 *                 rows, taps * Mg columns: one GEMM of the input positions by B gives every
 *                 kernel position's contribution, kernels/fast/conv.c), groups one after the other;
 *   w_packed = 2: depthwise (Cg = Mg = 1, group = C), [taps][C].
 * Always float32 (the precision pass keeps it so). */
static af_status pack_conv_transposed(af_graph *g, af_node *n, af_error *err) {
    af_value *w = n->in[1];
    const int64_t *d = w->type.dims;
    int64_t c = d[0], mg = d[1], group = af_attr_int(n, "group", 1), taps = kernel_taps(w);
    if (group < 1 || c % group || c < 1 || mg < 1) return AF_OK; /* the shape checks say why */
    int64_t cg = c / group, cols = taps * mg;
    bool dw = cg == 1 && mg == 1;
    af_status st = gemm_type(n) != AF_GEMM_F32 ? keep_fp32(n, "transposed convolution runs fp32", err) : AF_OK;
    if (st) return st;
    int64_t len = dw ? taps * c : group * (int64_t)af_gemm_packed_floats(cg, cols);
    af_value *p = af_value_new_f32(g, dw ? "packed_dw" : "packed_w", 1, &len);
    float *tmp = dw ? NULL : af_malloc(sizeof(float) * (size_t)(cg * cols));
    if (!p || (!dw && !tmp) || !af_node_set_ints(n, "w_shape", d, w->type.rank) ||
        !af_node_set_int(n, "w_packed", dw ? 2 : 1)) {
        af_free(tmp);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    }
    const float *src = w->type.data;
    float *dst = p->type.data;
    if (dw) {
        for (int64_t t = 0; t < taps; t++)
            for (int64_t ci = 0; ci < c; ci++) dst[t * c + ci] = src[ci * taps + t];
    } else {
        size_t per = af_gemm_packed_floats(cg, cols);
        for (int64_t gi = 0; gi < group; gi++) {
            for (int64_t ci = 0; ci < cg; ci++)
                for (int64_t o = 0; o < mg; o++)
                    for (int64_t t = 0; t < taps; t++)
                        tmp[ci * cols + t * mg + o] = src[((gi * cg + ci) * mg + o) * taps + t];
            af_gemm_pack(tmp, cg, cols, cols, 1, dst + (size_t)gi * per);
        }
    }
    af_free(tmp);
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* An int8-form node int8.c put on the U8S8 core. */
static bool runs_int8(const af_node *n) {
    return af_attr_int(n, "quant", 0) && !strcmp(af_attr_str(n, "precision", ""), "int8");
}

/* A constant for `bytes` of U8S8 panels (int8 quads and the column sums after them). */
static af_value *packed_i8(af_graph *g, const char *hint, size_t bytes) {
    int64_t len = (int64_t)bytes;
    return af_value_new_const(g, af_graph_unique_name(g, hint), AF_DTYPE_INT8, 1, &len);
}

/* The int8 B of an int8 FusedMatMul ([K, N], or [N, K] with trans_b) as U8S8 panels, like
 * pack_b: b_shape = [K, N], b_packed = 1, trans_b folded in. */
static af_status pack_b_u8s8(af_graph *g, af_node *n, af_error *err) {
    af_value *b = n->nin > 1 ? n->in[1] : NULL;
    if (!b || !af_value_is_const(b) || b->type.dtype != AF_DTYPE_INT8 || b->type.rank != 2 ||
        af_attr_int(n, "b_packed", 0))
        return AF_OK;
    bool tb = af_attr_int(n, "trans_b", 0) != 0;
    int64_t k = b->type.dims[tb ? 1 : 0], nn = b->type.dims[tb ? 0 : 1], dims[2] = {k, nn};
    af_value *p = packed_i8(g, "packed_b", af_gemm_packed_bytes(AF_GEMM_U8S8, k, nn));
    if (!p || !af_node_set_ints(n, "b_shape", dims, 2) || !af_node_set_int(n, "b_packed", 1))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    af_gemm_pack_u8s8(b->type.data, k, nn, tb ? 1 : nn, tb ? k : 1, p->type.data);
    if (af_gemm_int8_7bit(b->type.data, k * nn) && !af_node_set_int(n, "w_7bit", 1))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, "trans_b")) n->attrs[a].i = 0;
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* The int8 weights [M, C, k...] of an int8 channels-last FusedConv (one group) as U8S8 panels
 * of B[t * cp + c][m] = W[m][c][t], t the kernel position, cp = C rounded up to a multiple of 4
 * (rows of the padding channels zero): one tap of cp channels per kernel position, as the
 * kernel converts X (kernels/fast/conv.c). w_shape, w_packed = 1. */
static af_status pack_conv_u8s8(af_graph *g, af_node *n, af_error *err) {
    const af_value *w = n->in[1];
    const int64_t *d = w->type.dims;
    int64_t m = d[0], c = d[1], taps = kernel_taps(w), cp = af_gemm_u8s8_k(c), k = taps * cp;
    af_value *p = packed_i8(g, "packed_w", af_gemm_packed_bytes(AF_GEMM_U8S8, k, m));
    int8_t *tmp = af_calloc((size_t)(k * m > 0 ? k * m : 1), 1);
    if (!p || !tmp || !af_node_set_ints(n, "w_shape", d, w->type.rank) ||
        !af_node_set_int(n, "w_packed", 1)) {
        af_free(tmp);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    }
    const int8_t *src = w->type.data;
    for (int64_t o = 0; o < m; o++)
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t tp = 0; tp < taps; tp++) tmp[(tp * cp + ci) * m + o] = src[(o * c + ci) * taps + tp];
    af_gemm_pack_u8s8(tmp, k, m, m, 1, p->type.data);
    af_free(tmp);
    if (af_gemm_int8_7bit(src, m * c * taps) && !af_node_set_int(n, "w_7bit", 1))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* A channels-last FusedConv reads its constant weights packed:
 *   w_packed = 1: per group, the GEMM panels of B[k][m] with k = (kh * KW + kw) * Cg + c (the
 *                 order in which an NHWC input row holds a kernel window; for a 3-D kernel
 *                 ((kd * KH + kh) * KW + kw) * Cg + c, for a 1-D one kw * Cg + c), groups one
 *                 after the other, each af_gemm_packed_floats(taps * Cg, M / group) floats; in
 *                 half or bfloat16 when the weights have that dtype (pack_conv_low);
 *   w_packed = 2: depthwise, [KH * KW][M] ([KD * KH * KW][M] for 3-D, KD * KH at most
 *                 AF_DW_MAX_ROWS);
 *   w_packed = 3: Winograd, for each of the 36 transform positions the GEMM panels of
 *                 U[c][m] = (G g G^T)[position] of kernel (m, c), one after the other.
 *   w_packed = 4: groups of G = Cg = Mg channels (grouped_small), in blocks of AF_GRP_LANES
 *                 channels [M / AF_GRP_LANES][taps][G][AF_GRP_LANES] (M rounded up, zeros):
 *                 channel i = gi * G + c at [t][d] holds W[gi * G + (c + d) % G][c][t]
 *                 (vec.h af_grp_row).
 * w_shape keeps the logical [M, Cg, KH, KW] (of the weights' rank). */
static af_status pack_conv(af_graph *g, af_node *n, af_error *err) {
    af_value *w = n->nin > 1 ? n->in[1] : NULL;
    if (runs_int8(n) && af_attr_int(n, "channels_last", 0) && !af_attr_int(n, "w_packed", 0) && w &&
        af_value_is_const(w) && w->type.dtype == AF_DTYPE_INT8 && w->type.rank >= 3 &&
        w->type.rank <= 5 && af_attr_int(n, "group", 1) == 1)
        return pack_conv_u8s8(g, n, err);
    if (!af_attr_int(n, "channels_last", 0) || af_attr_int(n, "w_packed", 0) || !w ||
        !af_value_is_const(w) || !af_value_is_f32(w) || w->type.rank < 3 || w->type.rank > 5)
        return AF_OK;
    if (af_attr_int(n, "transposed", 0)) return pack_conv_transposed(g, n, err);
    const int64_t *d = w->type.dims;
    int64_t m = d[0], cg = d[1], group = af_attr_int(n, "group", 1), taps = kernel_taps(w);
    if (group < 1 || m % group) return AF_OK; /* the kernel's shape checks will say why */
    int64_t mg = m / group, k = taps * cg;
    bool dw = depthwise(n, w), wg = !dw && w->type.rank == 4 && winograd(n, w);
    bool gs = !dw && grouped_small(n, w);
    af_gemm_type t = gemm_type(n);
    if (t != AF_GEMM_F32) {
        /* Winograd's fewer products win over bfloat16 without AMX, and over half storage. */
        const char *why = dw ? "depthwise: bound by memory traffic, runs fp32"
                          : group > 1 ? "grouped convolution runs fp32"
                          : w->type.rank == 5 ? "3-D convolution runs fp32"
                          : wg && (t == AF_GEMM_F16 || !af_cpu_amx())
                              ? "Winograd F(4x4, 3x3) in fp32 is faster here"
                              : NULL;
        if (!why) return pack_conv_low(g, n, t, err);
        af_status st = keep_fp32(n, why, err);
        if (st) return st;
    }
    int64_t mb = (m + AF_GRP_LANES - 1) / AF_GRP_LANES * AF_GRP_LANES;
    int64_t len = dw ? taps * m : gs ? taps * cg * mb : group * (int64_t)af_gemm_packed_floats(k, mg);
    if (wg) len = 36 * (int64_t)af_gemm_packed_floats(cg, m);
    af_value *p = af_value_new_f32(g, dw ? "packed_dw" : "packed_w", 1, &len);
    float *tmp = dw || gs ? NULL : af_malloc(sizeof(float) * (size_t)((wg ? 36 : 1) * k * mg > 0 ? (wg ? 36 : 1) * k * mg : 1));
    if (!p || (!dw && !gs && !tmp) || !af_node_set_ints(n, "w_shape", d, w->type.rank) ||
        !af_node_set_int(n, "w_packed", dw ? 2 : wg ? 3 : gs ? 4 : 1)) {
        af_free(tmp);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    }
    const float *src = w->type.data;
    float *dst = p->type.data;
    if (dw) {
        for (int64_t t = 0; t < taps; t++)
            for (int64_t o = 0; o < m; o++) dst[t * m + o] = src[o * taps + t];
    } else if (gs) {
        memset(dst, 0, (size_t)len * sizeof(float));
        for (int64_t i = 0; i < m; i++)
            for (int64_t t = 0; t < taps; t++)
                for (int64_t dd = 0; dd < cg; dd++) {
                    int64_t base = i - i % cg, c = i % cg, l = i % AF_GRP_LANES;
                    dst[((i / AF_GRP_LANES * taps + t) * cg + dd) * AF_GRP_LANES + l] =
                        src[((base + (c + dd) % cg) * cg + c) * taps + t];
                }
    } else if (wg) { /* tmp: [36][c][m], then each position packed on its own */
        double u[36];
        for (int64_t o = 0; o < m; o++)
            for (int64_t c = 0; c < cg; c++) {
                wino_weight(src + (o * cg + c) * 9, u);
                for (int e = 0; e < 36; e++) tmp[(e * cg + c) * m + o] = (float)u[e];
            }
        size_t per = af_gemm_packed_floats(cg, m);
        for (int e = 0; e < 36; e++) af_gemm_pack(tmp + (size_t)e * cg * m, cg, m, m, 1, dst + e * per);
    } else {
        size_t per = af_gemm_packed_floats(k, mg);
        for (int64_t gi = 0; gi < group; gi++) {
            for (int64_t o = 0; o < mg; o++)
                for (int64_t c = 0; c < cg; c++)
                    for (int64_t t = 0; t < taps; t++)
                        tmp[(t * cg + c) * mg + o] = src[((gi * mg + o) * cg + c) * taps + t];
            af_gemm_pack(tmp, k, mg, mg, 1, dst + (size_t)gi * per);
        }
    }
    af_free(tmp);
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* ---- squeeze-excite into the next 1x1 conv ----------------------------------------------------- */

/* A channels-last SqueezeExcite whose only reader is a packed 1x1 conv (stride 1, no padding,
 * one group): the conv applies the gate to its weights instead (W'[c][m] = W[c][m] * gate[c],
 * per image), the SqueezeExcite only computes the gate (gate_only), and X * gate is never
 * written. Taken when the weights are at most about twice X (see below). */
static af_status fold_se(af_graph *g, af_node *se, af_error *err) {
    af_value *y = se->nout == 1 ? se->out[0] : NULL, *x = se->in[0];
    if (!y || y->is_output || y->nuses != 1 || !af_attr_int(se, "channels_last", 0) ||
        af_attr_int(se, "gate_only", 0) || x->type.rank != 4)
        return AF_OK;
    af_node *cv = y->uses[0].node;
    const int64_t *ws = NULL;
    if (cv->graph != g || cv->op != AF_OP_FUSED_CONV || y->uses[0].slot != 0 || !af_attr_int(cv, "channels_last", 0) ||
        af_attr_int(cv, "transposed", 0) || af_attr_int(cv, "quant", 0) || /* int8: no gate */
        af_attr_int(cv, "w_packed", 0) != 1 || af_attr_ints(cv, "w_shape", &ws) != 4 ||
        ws[2] != 1 || ws[3] != 1 || af_attr_int(cv, "group", 1) != 1 ||
        af_attr_int(cv, "in_scale", -1) >= 0 || !all_zero(cv, "pads") ||
        !all_one(cv, "strides") || strcmp(af_attr_str(cv, "auto_pad", "NOTSET"), "NOTSET"))
        return AF_OK;
    const int64_t *xd = x->type.dims;
    /* Gating the weights scales C x M floats per image (inside the GEMM, a block at a time);
     * X * gate reads X for the mean (on one thread) and again for the product, which it
     * writes: 3 x H x W x C. Measured on EfficientNet-B4 at 2 threads: folding its 8 blocks
     * with M = 1.9 x HW (12x12x1632) saved 0.4 ms in all, its 2 blocks with M = 3.1 x HW lost
     * 0.2 ms (with the gate a separate pass; with it in the GEMM, folding those 2 too measured
     * the same as not). */
    if (ws[0] > 2 * xd[1] * xd[2]) return AF_OK;
    af_value *gate = af_value_new(g, af_graph_unique_name(g, "se_gate"));
    if (!gate || !af_node_set_int(se, "gate_only", 1))
        return af_node_fail(err, se, AF_ERR_NOMEM, "out of memory");
    gate->type = y->type;
    gate->type.dims[1] = gate->type.dims[2] = 1;
    af_node_set_output(se, 0, gate);
    af_node_set_input(cv, 0, x);
    int slot = af_node_add_input(cv, gate);
    if (slot < 0 || !af_node_set_int(cv, "in_scale", slot))
        return af_node_fail(err, cv, AF_ERR_NOMEM, "out of memory");
    y->producer = NULL;
    return AF_OK;
}

/* A gate-only SqueezeExcite over the output of a channels-last depthwise conv: the conv also
 * writes the means over positions of what it computes (pool_out, while each row is in cache)
 * and the SqueezeExcite reads those (pooled) instead of reading X again. */
static af_status pool_in_conv(af_graph *g, af_node *se, af_error *err) {
    af_value *x = se->in[0];
    af_node *dw = x->producer;
    if (!af_attr_int(se, "gate_only", 0) || af_attr_int(se, "pooled", 0) || !dw ||
        dw->graph != g || dw->op != AF_OP_FUSED_CONV || dw->nout != 1 || af_attr_int(dw, "w_packed", 0) != 2 ||
        af_attr_int(dw, "transposed", 0) ||
        af_attr_int(dw, "pool_out", 0) || x->type.rank != 4)
        return AF_OK;
    af_value *mean = af_value_new(g, af_graph_unique_name(g, "dw_mean"));
    if (!mean || af_node_add_output(dw, mean) < 0 || !af_node_set_int(dw, "pool_out", 1) ||
        !af_node_set_int(se, "pooled", 1))
        return af_node_fail(err, dw, AF_ERR_NOMEM, "out of memory");
    mean->type = x->type;
    mean->type.dims[1] = mean->type.dims[2] = 1;
    af_node_set_input(se, 0, mean);
    return AF_OK;
}

/* ---- a 1x1 expand conv into the depthwise conv that reads it ----------------------------------- */

/* An inverted-residual block's expand (a packed float32 1x1 conv, stride 1, no padding, one
 * group, no gate) read only by a channels-last depthwise conv, both made by fusion (an unfused
 * graph has its BatchNorm and activation between them): the depthwise conv computes the
 * expanded rows itself, a few at a time (kernels/fast/conv.c), so the expanded tensor, the
 * largest of the block, never goes to memory. Taken when that tensor is over half the L2
 * (measured: every merged EfficientNet-B4 block got faster at that threshold) and the expand
 * weights fit a quarter of it beside the rows (each expanded row reads all of them). Every
 * operand of the expand's epilogue must broadcast per channel, per element or as a scalar (the
 * forms its vector epilogue runs on rows of the ring). */
static bool pro_operand_ok(const af_value *v, const af_value *y) {
    const af_tensor *t = &v->type;
    int64_t n = af_tensor_numel(t), e = y->type.dims[3];
    if (n == 1 || af_same_shape(t, &y->type)) return true;
    return t->rank >= 1 && t->dims[t->rank - 1] == e && n == e;
}

/* AUTOFUSION_MERGE_EXPAND=0 keeps the two convs apart (A/B measurements); =1 merges whatever
 * the sizes (tests); unset: by size. */
static int merge_expand_mode(void) {
    const char *env = getenv("AUTOFUSION_MERGE_EXPAND");
    return !env ? 1 : !strcmp(env, "0") ? 0 : 2;
}

static bool expand_into_dw(const af_node *d, const af_node *e) {
    const int64_t *ws = NULL, *prog = NULL;
    const af_value *y = e ? e->out[0] : NULL;
    if (!e || e->graph != d->graph || e->op != AF_OP_FUSED_CONV || e->nout != 1 || !y || y->is_output || y->nuses != 1 ||
        af_attr_int(e, "transposed", 0) || af_attr_int(d, "transposed", 0) ||
        d->in[0] != y || !af_node_attr(e, "fusion_rule") || !af_node_attr(d, "fusion_rule") ||
        !af_attr_int(e, "channels_last", 0) || af_attr_int(e, "w_packed", 0) != 1 ||
        af_attr_ints(e, "w_shape", &ws) != 4 || ws[2] != 1 || ws[3] != 1 ||
        af_attr_int(e, "group", 1) != 1 || af_attr_int(e, "in_scale", -1) >= 0 ||
        af_node_attr(e, "custom_ops") || !all_zero(e, "pads") || !all_one(e, "strides") ||
        strcmp(af_attr_str(e, "auto_pad", "NOTSET"), "NOTSET") || !e->in[1] ||
        e->in[1]->type.dtype != AF_DTYPE_FLOAT || y->type.rank != 4 ||
        af_attr_int(d, "w_packed", 0) != 2 || af_attr_int(d, "pro_w", -1) >= 0)
        return false;
    /* The size of one image's expanded tensor: a dynamic batch (dims[0] unknown) counts as 1,
     * as the batch the zoo's exports run at (before, a dynamic batch made the size negative,
     * so no block of a dynamically exported MobileNet or MNASNet merged); an unknown spatial or
     * channel dim keeps the two convs apart. */
    const int64_t *yd = y->type.dims;
    size_t l2 = af_cpu_l2();
    int64_t batch = yd[0] > 0 ? yd[0] : 1;
    bool known = yd[1] > 0 && yd[2] > 0 && yd[3] > 0;
    double tensor = 4.0 * (double)(batch * yd[1] * yd[2] * yd[3]), weights = 4.0 * (double)(ws[0] * ws[1]);
    if (merge_expand_mode() == 1 && (!known || tensor < 0.5 * (double)l2 || weights > (double)l2 / 4))
        return false;
    int np = af_attr_ints(e, "epilogue", &prog);
    for (int s = 0; s + 2 < np; s += 3)
        if (prog[s + 1] >= 0 && (prog[s + 1] >= e->nin || !e->in[prog[s + 1]] ||
                                 !pro_operand_ok(e->in[prog[s + 1]], y)))
            return false;
    return true;
}

/* "fused_nodes" of a's then b's, and b's "fusion_rule" with a's rules it lacks, onto b. */
static bool merge_provenance(const af_node *a, af_node *b) {
    const af_attr *fa = af_node_attr(a, "fused_nodes"), *fb = af_node_attr(b, "fused_nodes");
    const char *ra = af_attr_str(a, "fusion_rule", ""), *rb = af_attr_str(b, "fusion_rule", "");
    if (!fa || !fb || fa->type != AF_ATTR_STRINGS || fb->type != AF_ATTR_STRINGS) return true;
    const char **names = af_arena_calloc(b->graph->arena, (size_t)(fa->n + fb->n) + 1, sizeof(char *));
    char *rules = af_arena_alloc(b->graph->arena, strlen(ra) + strlen(rb) + 2);
    if (!names || !rules) return false;
    memcpy(names, fa->strings, sizeof(char *) * (size_t)fa->n);
    memcpy(names + fa->n, fb->strings, sizeof(char *) * (size_t)fb->n);
    strcpy(rules, rb);
    for (const char *p = ra; *p;) {
        size_t l = strcspn(p, ",");
        bool have = false;
        for (const char *q = rb; *q && !have;) {
            size_t m = strcspn(q, ",");
            have = m == l && !strncmp(p, q, l);
            q += m + (q[m] == ',');
        }
        if (!have && l) {
            strcat(rules, ",");
            strncat(rules, p, l);
        }
        p += l + (p[l] == ',');
    }
    for (int i = 0; i < b->nattrs; i++) {
        if (!strcmp(b->attrs[i].name, "fused_nodes")) {
            b->attrs[i].strings = names;
            b->attrs[i].n = fa->n + fb->n;
        }
    }
    return af_node_set_str(b, "fusion_rule", rules);
}

static af_status merge_expand(af_graph *g, af_node *d, af_error *err) {
    af_node *e = d->in[0] ? d->in[0]->producer : NULL;
    if (!expand_into_dw(d, e)) return AF_OK;
    const int64_t *prog = NULL, *ws = NULL;
    const float *params = NULL;
    int np = af_attr_ints(e, "epilogue", &prog), npar = af_attr_floats(e, "epilogue_params", &params);
    af_attr_ints(e, "w_shape", &ws);
    int64_t *nprog = np > 0 ? af_arena_calloc(g->arena, (size_t)np, sizeof(int64_t)) : NULL;
    int wi = af_node_add_input(d, e->in[1]), bi = e->nin > 2 && e->in[2] ? af_node_add_input(d, e->in[2]) : -1;
    bool ok = wi >= 0 && (np <= 0 || nprog) && (bi >= 0 || e->nin <= 2 || !e->in[2]);
    for (int s = 0; ok && s + 2 < np; s += 3) {
        nprog[s] = prog[s];
        nprog[s + 2] = prog[s + 2];
        nprog[s + 1] = prog[s + 1] < 0 ? -1 : af_node_add_input(d, e->in[prog[s + 1]]);
        ok = prog[s + 1] < 0 || nprog[s + 1] >= 0;
    }
    ok = ok && af_node_set_int(d, "pro_w", wi) && af_node_set_int(d, "pro_b", bi) &&
         af_node_set_int(d, "pro_m", ws[0]) && (np <= 0 || af_node_set_ints(d, "pro_epilogue", nprog, np)) &&
         (npar <= 0 || af_node_set_floats(d, "pro_epilogue_params", params, npar)) &&
         merge_provenance(e, d);
    if (!ok) return af_node_fail(err, d, AF_ERR_NOMEM, "out of memory merging the expand conv");
    af_value *y = e->out[0];
    af_node_set_input(d, 0, e->in[0]);
    af_node_remove(e);
    y->producer = NULL;
    af_graph_renumber(g);
    return AF_OK;
}

/* ---- one GEMM for an attention's Q, K and V ---------------------------------------------------- */

/* Q, K and V of a FusedAttention projected from the same input by three FusedMatMuls (same A,
 * LayerNorm prologue, trans_a and alpha; constant 2-D B; constant or no bias; no epilogue), each
 * read only by the attention, become one FusedMatMul writing [.., Nq + Nk + Nv]: A is read and
 * normalised once instead of three times, and one GEMM three times as wide splits better across
 * threads. The attention reads its heads in place at column offsets of that output, as it does
 * for a model's own packed QKV projection. */
typedef struct qkv {
    af_node *p[3];
    int64_t k, n[3];
} qkv;

static bool same_value_attr(const af_node *a, const af_node *b, const char *name, float dflt) {
    return af_attr_float(a, name, dflt) == af_attr_float(b, name, dflt);
}

static bool qkv_match(const af_node *att, qkv *q) {
    const int64_t *lay = NULL;
    memset(q, 0, sizeof *q);
    /* Rows of a projection only: a head-major input (layout 2) is not one. */
    if (af_attr_ints(att, "layout", &lay) != 4 || lay[0] > 1 || lay[1] > 1 || lay[2] > 1)
        return false;
    for (int i = 0; i < 3; i++) {
        af_value *v = att->nin > i ? att->in[i] : NULL;
        af_node *p = v ? v->producer : NULL;
        if (!p || p->graph != att->graph || p->op != AF_OP_FUSED_MATMUL || p->nout != 1 ||
            v->nuses != 1 || v->is_output ||
            p->nin > 5 || af_node_attr(p, "epilogue") || af_attr_int(p, "b_packed", 0))
            return false;
        const af_value *b = p->in[1], *bias = p->nin > 2 ? p->in[2] : NULL;
        if (!af_value_is_const(b) || !af_value_is_f32(b) || b->type.rank != 2 || v->type.rank < 2) return false;
        bool tb = af_attr_int(p, "trans_b", 0) != 0;
        q->p[i] = p;
        q->n[i] = b->type.dims[tb ? 0 : 1];
        int64_t k = b->type.dims[tb ? 1 : 0];
        if (bias && (!af_value_is_const(bias) || !af_value_is_f32(bias) || bias->type.rank != 1 ||
                     bias->type.dims[0] != q->n[i]))
            return false;
        if (i == 0) {
            q->k = k;
            continue;
        }
        const af_node *p0 = q->p[0];
        if (p == p0 || (i == 2 && p == q->p[1]) || k != q->k || p->in[0] != p0->in[0] ||
            p->nin != p0->nin || (p->nin > 3 && p->in[3] != p0->in[3]) || (p->nin > 4 && p->in[4] != p0->in[4]) ||
            af_attr_int(p, "trans_a", 0) != af_attr_int(p0, "trans_a", 0) ||
            !same_value_attr(p, p0, "alpha", 1.0f) || !same_value_attr(p, p0, "ln_epsilon", 1e-5f) ||
            af_attr_int(p, "ln_rms", 0) != af_attr_int(p0, "ln_rms", 0) ||
            v->type.rank != att->in[0]->type.rank)
            return false;
    }
    return true;
}

/* Provenance of the merged node: p0's "fusion_rule", and as "fused_nodes" the original nodes
 * behind the three, each once. */
static bool qkv_provenance(af_node *f, const qkv *q) {
    const af_attr *fn[3], *rule = af_node_attr(q->p[0], "fusion_rule");
    int total = 0;
    for (int i = 0; i < 3; i++) {
        fn[i] = af_node_attr(q->p[i], "fused_nodes");
        if (!fn[i] || fn[i]->type != AF_ATTR_STRINGS || !rule) return true; /* not from fusion */
        total += fn[i]->n;
    }
    const char **names = af_arena_calloc(f->graph->arena, (size_t)total + 1, sizeof(char *));
    if (!names) return false;
    int n = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < fn[i]->n; k++) {
            int j = 0;
            while (j < n && strcmp(names[j], fn[i]->strings[k])) j++;
            if (j == n && fn[i]->strings[k]) names[n++] = fn[i]->strings[k];
        }
    if (!af_node_add_attr(f, "fused_nodes", AF_ATTR_STRINGS) ||
        !af_node_add_attr(f, "fusion_rule", rule->type))
        return false;
    f->attrs[f->nattrs - 1] = *rule; /* both looked up after the last add moved the array */
    f->attrs[f->nattrs - 2].strings = names;
    f->attrs[f->nattrs - 2].n = n;
    return true;
}

static af_status merge_qkv(af_graph *g, af_node *att, af_error *err) {
    qkv q;
    const int64_t *off = NULL;
    if (!qkv_match(att, &q) || af_attr_ints(att, "offsets", &off) != 3) return AF_OK;
    af_node *p0 = q.p[0];
    int64_t ntot = q.n[0] + q.n[1] + q.n[2], kn[2] = {q.k, ntot};
    bool has_bias = false;
    for (int i = 0; i < 3; i++) has_bias |= q.p[i]->nin > 2 && q.p[i]->in[2];
    af_value *b = af_value_new_f32(g, "qkv_weight", 2, kn);
    af_value *bias = has_bias ? af_value_new_f32(g, "qkv_bias", 1, &ntot) : NULL;
    af_value *y = af_value_new(g, af_graph_unique_name(g, "qkv"));
    af_node *f = b && y && (bias || !has_bias)
                     ? af_node_new_ours(g, AF_OP_FUSED_MATMUL, p0->name, p0->nin)
                     : NULL;
    int64_t *noff = af_arena_calloc(g->arena, 3, sizeof(int64_t));
    if (!f || !noff || !af_node_set_int(f, "trans_b", 0) || !fuse_copy_attrs(f, p0) ||
        !qkv_provenance(f, &q))
        return af_node_fail(err, att, AF_ERR_NOMEM, "out of memory merging Q, K and V");
    float *bd = b->type.data, *cd = bias ? bias->type.data : NULL;
    for (int64_t i = 0, col = 0; i < 3; col += q.n[i], i++) {
        const af_node *p = q.p[i];
        const float *src = p->in[1]->type.data;
        bool tb = af_attr_int(p, "trans_b", 0) != 0;
        for (int64_t k = 0; k < q.k; k++)
            for (int64_t j = 0; j < q.n[i]; j++)
                bd[k * ntot + col + j] = src[tb ? j * q.k + k : k * q.n[i] + j];
        if (cd && p->nin > 2 && p->in[2])
            memcpy(cd + col, p->in[2]->type.data, (size_t)q.n[i] * sizeof(float));
        noff[i] = off[i] + col;
    }
    af_node_set_input(f, 0, p0->in[0]);
    af_node_set_input(f, 1, b);
    if (p0->nin > 2) af_node_set_input(f, 2, bias);
    for (int s = 3; s < p0->nin; s++) af_node_set_input(f, s, p0->in[s]);
    y->type = att->in[0]->type;
    y->type.dims[y->type.rank - 1] = ntot;
    af_node_set_output(f, 0, y);
    for (int a = 0; a < att->nattrs; a++)
        if (!strcmp(att->attrs[a].name, "offsets")) att->attrs[a].ints = noff;
    for (int i = 0; i < 3; i++) {
        af_node_set_input(att, i, y);
        af_node_remove(q.p[i]);
    }
    af_graph_renumber(g);
    af_node_move_last_to(g, att->id);
    af_graph_renumber(g);
    return AF_OK;
}

af_status af_pass_pack(af_graph *g, af_error *err) {
    af_status st = lower_bodies(g, af_pass_pack, err);
    for (int i = 0; i < g->nnodes && !st; i++)
        if (g->nodes[i]->op == AF_OP_FUSED_ATTENTION) {
            af_node *att = g->nodes[i];
            st = merge_qkv(g, att, err);
            i = att->id; /* three nodes before it became one */
        }
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        if (n->op == AF_OP_FUSED_MATMUL && runs_int8(n)) st = pack_b_u8s8(g, n, err);
        else if (n->op == AF_OP_FUSED_MATMUL) st = pack_b(g, n, 1, "trans_b", "b_shape", "b_packed", err);
        else if (n->op == AF_OP_FUSED_CONV) st = pack_conv(g, n, err);
        else if (n->op == AF_OP_CONV_POOL_FC && af_attr_int(n, "channels_last", 0) &&
                 !(st = pack_conv(g, n, err)))
            st = pack_b(g, n, 3, "fc_trans_b", "fc_shape", "fc_packed", err);
    }
    for (int i = 0; i < g->nnodes && !st; i++)
        if (g->nodes[i]->op == AF_OP_SQUEEZE_EXCITE && !(st = fold_se(g, g->nodes[i], err)))
            st = pool_in_conv(g, g->nodes[i], err);
    for (int i = 0; i < g->nnodes && !st; i++)
        if (g->nodes[i]->op == AF_OP_FUSED_CONV && merge_expand_mode()) {
            af_node *d = g->nodes[i];
            st = merge_expand(g, d, err);
            i = d->id;
        }
    /* A body whose nodes now read packed constants of its own no longer reads the weights it
     * captured. */
    if (!st && !g->parent) st = pass_fix_captures(g, err);
    return st || g->parent ? st : af_graph_infer_shapes(g, err);
}
