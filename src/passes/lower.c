/* Lowering: the graph as the fast kernels run it. It runs after fusion, and alone on the unfused
 * graph (--no_fusion), so both use the same kernels and differ only by what fusion did:
 *  - cores: every float32 Conv, MatMul and Gemm becomes the FusedConv / FusedMatMul that
 *    computes it with an empty epilogue (one GEMM and one convolution serve every graph);
 *  - BatchNormalization in inference mode with constant parameters becomes a FusedElementwise
 *    scale-and-shift: one pass over X, as a BatchNorm kernel makes (fusion folds it into the
 *    conv instead);
 *  - then the layout pass (layout.c) makes 2-D convolutions channels-last, and packing stores
 *    every constant GEMM weight in the panel order of kernels/gemm.h, once, at compile time.
 *
 * Invariant: a lowered node computes what the node it replaces computed (the same output value,
 * name and consumers); nodes the fast kernels cannot take (other dtypes, non-constant BatchNorm
 * statistics, training mode) are left as they are.
 */
#include "fusion/rule.h"
#include "kernels/gemm.h"
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
    fu_core core;
    if (fu_core_init(&core, n) != NULL) return AF_OK; /* nothing a fused core can express */
    af_node *f = fu_core_build(&core, n->name, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    take_place(g, f, n);
    return AF_OK;
}

/* BatchNormalization(X, scale, B, mean, var) -> FusedElementwise(X, s, t): y = x * s + t with
 * s = scale / sqrt(var + eps), t = B - mean * s, shaped [C, 1, ...] to broadcast over X. */
static af_status lower_batchnorm(af_graph *g, af_node *n, af_error *err) {
    if (n->nin != 5 || n->nout != 1 || !all_f32(n) || af_attr_int(n, "training_mode", 0)) return AF_OK;
    const af_value *x = n->in[0];
    if (x->type.rank < 2 || x->type.dims[1] < 1) return AF_OK;
    int64_t c = x->type.dims[1];
    for (int i = 1; i < 5; i++)
        if (!fu_is_const(n->in[i]) || n->in[i]->type.rank != 1 || n->in[i]->type.dims[0] != c)
            return AF_OK;
    int64_t dims[AF_MAX_RANK] = {c};
    int rank = x->type.rank - 1;
    for (int i = 1; i < rank; i++) dims[i] = 1;
    af_value *s = fu_const(g, "bn_scale", rank, dims), *t = fu_const(g, "bn_shift", rank, dims);
    af_node *f = s && t ? fu_node_new(g, AF_OP_FUSED_ELEMENTWISE, n->name, 3) : NULL;
    if (!f) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    const float *sc = n->in[1]->type.data, *bi = n->in[2]->type.data;
    const float *mean = n->in[3]->type.data, *var = n->in[4]->type.data;
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    float *sd = s->type.data, *td = t->type.data;
    for (int64_t i = 0; i < c; i++) {
        double k = sc[i] / sqrt((double)var[i] + eps);
        sd[i] = (float)k;
        td[i] = (float)(bi[i] - mean[i] * k);
    }
    af_node_set_input(f, 0, n->in[0]);
    af_node_set_input(f, 1, s);
    af_node_set_input(f, 2, t);
    fu_epi e;
    fu_epi_init(&e);
    e.op[0] = AF_EP_MUL;
    e.operand[0] = s;
    e.op[1] = AF_EP_ADD;
    e.operand[1] = t;
    e.n = 2;
    af_status st = fu_epi_emit(f, &e, 1, err);
    if (st) return st;
    take_place(g, f, n);
    return AF_OK;
}

af_status af_pass_lower(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        if ((n->op == AF_OP_CONV || n->op == AF_OP_MATMUL || n->op == AF_OP_GEMM) && all_f32(n))
            st = lower_core(g, n, err);
        else if (n->op == AF_OP_BATCH_NORMALIZATION)
            st = lower_batchnorm(g, n, err);
    }
    return st ? st : af_graph_infer_shapes(g, err);
}

/* ---- packing -------------------------------------------------------------------------------- */

/* A constant 2-D weight matrix read as a GEMM's B (input `slot`, [K, N], or [N, K] when the
 * node's `trans` attribute says so) replaced by its packed panels: `shape` = [K, N] and `flag`
 * = 1 say how, `trans` is folded in. FusedMatMul's B (b_shape, b_packed) and a channels-last
 * ConvPoolFc's FC weights (fc_shape, fc_packed). */
static af_status pack_b(af_graph *g, af_node *n, int slot, const char *trans, const char *shape,
                        const char *flag, af_error *err) {
    af_value *b = n->nin > slot ? n->in[slot] : NULL;
    if (!b || !fu_is_const(b) || !fu_is_f32(b) || b->type.rank != 2 || af_attr_int(n, flag, 0))
        return AF_OK;
    bool tb = af_attr_int(n, trans, 0) != 0;
    int64_t k = b->type.dims[tb ? 1 : 0], nn = b->type.dims[tb ? 0 : 1];
    int64_t len = (int64_t)af_gemm_packed_floats(k, nn), dims[2] = {k, nn};
    af_value *p = fu_const(g, "packed_b", 1, &len);
    if (!p || !fu_set_ints(n, shape, dims, 2) || !fu_set_int(n, flag, 1))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    af_gemm_pack(b->type.data, k, nn, tb ? 1 : nn, tb ? k : 1, p->type.data);
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, trans)) n->attrs[a].i = 0;
    af_node_set_input(n, slot, p);
    return AF_OK;
}

/* Is a channels-last conv with weights [M, Cg, KH, KW] depthwise (one input channel per
 * output channel)? Those run their own kernel on weights laid out [KH * KW][M]. */
static bool depthwise(const af_node *n, const af_value *w) {
    int64_t group = af_attr_int(n, "group", 1);
    return w->type.dims[1] == 1 && group > 1 && w->type.dims[0] == group;
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
static bool winograd(const af_node *n, const af_value *w) {
    const char *env = getenv("AUTOFUSION_WINOGRAD");
    const int64_t *d = w->type.dims, *y = n->out[0] ? n->out[0]->type.dims : NULL;
    if (!y || n->out[0]->type.rank != 4 || y[0] < 1 || y[1] < 1 || y[2] < 1) return false;
    int64_t tiles = y[0] * ((y[1] + 3) / 4) * ((y[2] + 3) / 4);
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

/* A channels-last FusedConv reads its constant weights packed:
 *   w_packed = 1: per group, the GEMM panels of B[k][m] with k = (kh * KW + kw) * Cg + c (the
 *                 order in which an NHWC input row holds a kernel window), groups one after
 *                 the other, each af_gemm_packed_floats(KH * KW * Cg, M / group) floats;
 *   w_packed = 2: depthwise, [KH * KW][M];
 *   w_packed = 3: Winograd, for each of the 36 transform positions the GEMM panels of
 *                 U[c][m] = (G g G^T)[position] of kernel (m, c), one after the other.
 * w_shape keeps the logical [M, Cg, KH, KW]. */
static af_status pack_conv(af_graph *g, af_node *n, af_error *err) {
    af_value *w = n->nin > 1 ? n->in[1] : NULL;
    if (!af_attr_int(n, "channels_last", 0) || af_attr_int(n, "w_packed", 0) || !w ||
        !fu_is_const(w) || !fu_is_f32(w) || w->type.rank != 4)
        return AF_OK;
    const int64_t *d = w->type.dims;
    int64_t m = d[0], cg = d[1], kh = d[2], kw = d[3], group = af_attr_int(n, "group", 1);
    if (group < 1 || m % group) return AF_OK; /* the kernel's shape checks will say why */
    int64_t mg = m / group, k = kh * kw * cg, taps = kh * kw;
    bool dw = depthwise(n, w), wg = !dw && winograd(n, w);
    int64_t len = dw ? taps * m : group * (int64_t)af_gemm_packed_floats(k, mg);
    if (wg) len = 36 * (int64_t)af_gemm_packed_floats(cg, m);
    af_value *p = fu_const(g, dw ? "packed_dw" : "packed_w", 1, &len);
    float *tmp = dw ? NULL : malloc(sizeof(float) * (size_t)((wg ? 36 : 1) * k * mg > 0 ? (wg ? 36 : 1) * k * mg : 1));
    if (!p || (!dw && !tmp) || !fu_set_ints(n, "w_shape", d, 4) ||
        !fu_set_int(n, "w_packed", dw ? 2 : wg ? 3 : 1)) {
        free(tmp);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory packing weights");
    }
    const float *src = w->type.data;
    float *dst = p->type.data;
    if (dw) {
        for (int64_t t = 0; t < taps; t++)
            for (int64_t o = 0; o < m; o++) dst[t * m + o] = src[o * taps + t];
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
    free(tmp);
    af_node_set_input(n, 1, p);
    return AF_OK;
}

/* ---- squeeze-excite into the next 1x1 conv ----------------------------------------------------- */

/* A channels-last SqueezeExcite whose only reader is a packed 1x1 conv (stride 1, no padding,
 * one group): the conv applies the gate to its weights instead (W'[c][m] = W[c][m] * gate[c],
 * per image), the SqueezeExcite only computes the gate (gate_only), and X * gate is never
 * written. Taken when the weights are smaller than X, which is when it saves memory traffic. */
static af_status fold_se(af_graph *g, af_node *se, af_error *err) {
    af_value *y = se->nout == 1 ? se->out[0] : NULL, *x = se->in[0];
    if (!y || y->is_output || y->nuses != 1 || !af_attr_int(se, "channels_last", 0) ||
        af_attr_int(se, "gate_only", 0) || x->type.rank != 4)
        return AF_OK;
    af_node *cv = y->uses[0].node;
    const int64_t *ws = NULL;
    if (cv->op != AF_OP_FUSED_CONV || y->uses[0].slot != 0 || !af_attr_int(cv, "channels_last", 0) ||
        af_attr_int(cv, "w_packed", 0) != 1 || af_attr_ints(cv, "w_shape", &ws) != 4 ||
        ws[2] != 1 || ws[3] != 1 || af_attr_int(cv, "group", 1) != 1 ||
        af_attr_int(cv, "in_scale", -1) >= 0 || !all_zero(cv, "pads") ||
        !all_one(cv, "strides") || strcmp(af_attr_str(cv, "auto_pad", "NOTSET"), "NOTSET"))
        return AF_OK;
    const int64_t *xd = x->type.dims;
    if (ws[0] >= xd[1] * xd[2]) return AF_OK; /* weights C x M vs X H x W x C, per image */
    af_value *gate = af_value_new(g, af_graph_unique_name(g, "se_gate"));
    if (!gate || !fu_set_int(se, "gate_only", 1))
        return af_node_fail(err, se, AF_ERR_NOMEM, "out of memory");
    gate->type = y->type;
    gate->type.dims[1] = gate->type.dims[2] = 1;
    af_node_set_output(se, 0, gate);
    af_node_set_input(cv, 0, x);
    int slot = af_node_add_input(cv, gate);
    if (slot < 0 || !fu_set_int(cv, "in_scale", slot))
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
        dw->op != AF_OP_FUSED_CONV || dw->nout != 1 || af_attr_int(dw, "w_packed", 0) != 2 ||
        af_attr_int(dw, "pool_out", 0) || x->type.rank != 4)
        return AF_OK;
    af_value *mean = af_value_new(g, af_graph_unique_name(g, "dw_mean"));
    if (!mean || af_node_add_output(dw, mean) < 0 || !fu_set_int(dw, "pool_out", 1) ||
        !fu_set_int(se, "pooled", 1))
        return af_node_fail(err, dw, AF_ERR_NOMEM, "out of memory");
    mean->type = x->type;
    mean->type.dims[1] = mean->type.dims[2] = 1;
    af_node_set_input(se, 0, mean);
    return AF_OK;
}

af_status af_pass_pack(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        if (n->op == AF_OP_FUSED_MATMUL) st = pack_b(g, n, 1, "trans_b", "b_shape", "b_packed", err);
        else if (n->op == AF_OP_FUSED_CONV) st = pack_conv(g, n, err);
        else if (n->op == AF_OP_CONV_POOL_FC && af_attr_int(n, "channels_last", 0) &&
                 !(st = pack_conv(g, n, err)))
            st = pack_b(g, n, 3, "fc_trans_b", "fc_shape", "fc_packed", err);
    }
    for (int i = 0; i < g->nnodes && !st; i++)
        if (g->nodes[i]->op == AF_OP_SQUEEZE_EXCITE && !(st = fold_se(g, g->nodes[i], err)))
            st = pool_in_conv(g, g->nodes[i], err);
    return st ? st : af_graph_infer_shapes(g, err);
}
