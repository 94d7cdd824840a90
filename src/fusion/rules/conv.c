/* The convolution rules:
 *  ConvBNReluFusionOp    Conv [+ BatchNormalization] [+ Add] [+ activation] -> FusedConv, the BN
 *                        folded into new weights and bias (inference semantics, any group and
 *                        dilation), the Add and the activation as epilogue steps;
 *  ConvTransposeBNReluFusionOp  the same for a ConvTranspose (same functions): a FusedConv with
 *                        transposed = 1, BN folded into W [C, M/group, k...] per output channel;
 *  ConvPoolFcFusionOp    Conv|FusedConv -> GlobalAveragePool -> Flatten|Reshape|Squeeze to
 *                        [N, C] -> Gemm|MatMul  ->  ConvPoolFc;
 *  SqueezeExciteFusionOp GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv -> Sigmoid|HardSigmoid
 *                        -> Mul with the pooled tensor's input  ->  SqueezeExcite;
 *  PadWindowFusionOp     Pad (constant, spatial dims only) -> Conv|AveragePool|MaxPool  ->  the
 *                        window op with the Pad's pads added to its own (exporters write
 *                        count_include_pad average pooling and "SAME" convs this way).
 *
 * Invariant: checks only read the graph; a check that accepts has verified every shape,
 * constant and attribute its apply reads, so apply only allocates and rewires. */
#include "fusion/rule.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static af_value *input(const af_node *n, int i) {
    return i < n->nin ? n->in[i] : NULL;
}

/* The first node reading v at input slot `slot` (-1: any slot) with op `op`; NULL if none. */
static af_node *reader(const af_value *v, af_op op, int slot) {
    for (int u = 0; v && u < v->nuses; u++) {
        af_node *r = v->uses[u].node;
        if (r->op == op && (slot < 0 || v->uses[u].slot == slot) && r->graph == v->graph) return r;
    }
    return NULL;
}

/* A float32 constant [n] (1-D). */
static bool const_vec(const af_value *v, int64_t n) {
    return af_value_is_const(v) && af_value_is_f32(v) && v->type.rank == 1 && v->type.dims[0] == n;
}

/* ---- ConvBNReluFusionOp -------------------------------------------------------------------- */

/* Scratch use: m->core = the BatchNormalization (or NULL). */

/* Output channels of a Conv (W [M, C/group, k...]) or ConvTranspose (W [C, M/group, k...]);
 * <= 0 when W's dims do not say. */
static int64_t out_channels(const af_node *conv) {
    const af_value *w = input(conv, 1);
    if (conv->op != AF_OP_CONV_TRANSPOSE) return w->type.dims[0];
    int64_t group = af_attr_int(conv, "group", 1), m;
    if (group < 1 || w->type.dims[1] <= 0 || !af_mul_i64(w->type.dims[1], group, &m) ||
        w->type.dims[0] % group)
        return -1;
    return m;
}

/* Can BN be folded into conv's weights? */
static const char *bn_foldable(const af_node *conv, const af_node *bn) {
    const af_value *w = input(conv, 1), *b = input(conv, 2);
    if (bn->nin < 5) return "BatchNormalization lacks parameters";
    if (af_attr_int(bn, "training_mode", 0) != 0) return "BatchNormalization is in training mode";
    if (af_attr_int(bn, "spatial", 1) != 1) return "BatchNormalization is not spatial";
    for (int o = 1; o < bn->nout; o++)
        if (bn->out[o] && (bn->out[o]->nuses > 0 || bn->out[o]->is_output))
            return "BatchNormalization statistics outputs are used";
    if (!af_value_is_const(w)) return "weights are not constant";
    if (!af_value_is_f32(w) || w->type.rank < 3 || w->type.dims[0] <= 0)
        return "weights are not constant float32";
    int64_t c = out_channels(conv);
    if (c <= 0) return "output channels unknown";
    if (b && !const_vec(b, c)) return "bias is not constant";
    for (int i = 1; i < 5; i++)
        if (!const_vec(input(bn, i), c)) return "BatchNormalization parameters are not constant";
    return NULL;
}

/* The activation after the conv: a unary one, or PRelu reading y as its x (its slope an
 * operand of the epilogue: face models put one after every conv). */
static bool is_act(const af_node *r, const af_value *y) {
    int64_t op;
    float p0, p1;
    return r->nin >= 1 && r->in[0] == y && (fuse_act_op(r, &op, &p0, &p1) || r->op == AF_OP_PRELU);
}

/* Does a reader of v start something this rule fuses? */
static bool fusable_follower(const af_value *v) {
    for (int u = 0; u < v->nuses; u++) {
        const af_node *r = v->uses[u].node;
        if ((r->op == AF_OP_BATCH_NORMALIZATION && v->uses[u].slot == 0) || r->op == AF_OP_ADD ||
            is_act(r, v))
            return true;
    }
    return false;
}

const char *rule_conv_bn_relu_check(af_fusion_ctx *cx, af_node *conv, af_match *m) {
    (void)cx;
    fuse_core core;
    af_value *y = conv->nout > 0 ? conv->out[0] : NULL;
    if (!y || fuse_core_init(&core, conv) || !fusable_follower(y)) return AF_NO_MATCH;
    const char *why = fuse_edge(y);
    if (why) return why;
    const af_tensor *out = &y->type;
    fuse_match_add(m, conv);
    af_node *next = af_value_sole_reader(y);
    if (next->op == AF_OP_BATCH_NORMALIZATION) {
        if (next->in[0] != y || !next->out[0]) return AF_NO_MATCH;
        why = bn_foldable(conv, next);
        if (why) return why;
        fuse_match_add(m, next);
        m->core = next;
        y = next->out[0];
        next = fuse_edge(y) ? NULL : af_value_sole_reader(y);
    }
    if (next && next->op == AF_OP_ADD) {
        why = fuse_epi_append(&m->epi, next, y, out);
        if (!why) {
            fuse_match_add(m, next);
            y = next->out[0];
            next = fuse_edge(y) ? NULL : af_value_sole_reader(y);
        } else if (why != AF_NO_MATCH) {
            if (m->n == 1) return why;
            m->partial = why;
            next = NULL;
        }
    }
    if (next && is_act(next, y) && !fuse_epi_append(&m->epi, next, y, out)) {
        fuse_match_add(m, next);
        y = next->out[0];
    }
    if (m->n == 1) return AF_NO_MATCH;
    fuse_match_output(m, y);
    return NULL;
}

/* W' = W * s and B' = (B - mean) * s + beta with s = gamma / sqrt(var + eps), per output
 * channel, in double. */
static af_status fold_bn(af_node *conv, const af_node *bn, af_value **w_out, af_value **b_out,
                         af_error *err) {
    const af_value *w = conv->in[1], *b = input(conv, 2);
    int64_t c = out_channels(conv), numel = af_tensor_numel(&w->type);
    /* Conv: output channel o owns W's rows [o * per, (o + 1) * per). ConvTranspose: W is
     * [C, Mg, k...]; element e belongs to output channel (c / Cg) * Mg + (e / taps) % Mg. */
    bool tr = conv->op == AF_OP_CONV_TRANSPOSE;
    int64_t per = numel / w->type.dims[0], taps = tr ? per / w->type.dims[1] : per;
    int64_t mg = tr ? w->type.dims[1] : 1, cg = tr ? w->type.dims[0] / (c / mg) : 1;
    char hint[200];
    snprintf(hint, sizeof hint, "%.180s_bnfold", w->name);
    af_value *nw = af_value_new_f32(conv->graph, hint, w->type.rank, w->type.dims);
    snprintf(hint, sizeof hint, "%.180s_bnfold_bias", conv->name);
    af_value *nb = af_value_new_f32(conv->graph, hint, 1, &c);
    if (!nw || !nb) return af_node_fail(err, conv, AF_ERR_NOMEM, "out of memory");
    const float *gamma = bn->in[1]->type.data, *beta = bn->in[2]->type.data;
    const float *mean = bn->in[3]->type.data, *var = bn->in[4]->type.data;
    const float *ws = w->type.data, *bs = b ? b->type.data : NULL;
    float *wd = nw->type.data, *bd = nb->type.data;
    double eps = af_attr_float(bn, "epsilon", 1e-5f);
    for (int64_t o = 0; o < c; o++) {
        double s = (double)gamma[o] / sqrt((double)var[o] + eps);
        if (!tr)
            for (int64_t k = 0; k < per; k++) wd[o * per + k] = (float)((double)ws[o * per + k] * s);
        bd[o] = (float)(((bs ? (double)bs[o] : 0.0) - mean[o]) * s + beta[o]);
    }
    for (int64_t e = 0; tr && e < numel; e++) {
        int64_t o = e / per / cg * mg + e / taps % mg;
        wd[e] = (float)((double)ws[e] * ((double)gamma[o] / sqrt((double)var[o] + eps)));
    }
    *w_out = nw;
    *b_out = nb;
    return AF_OK;
}

af_status rule_conv_bn_relu_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *conv = m->node[0];
    fuse_core core;
    fuse_core_init(&core, conv);
    if (m->core) {
        af_status st = fold_bn(conv, m->core, &core.in[1], &core.in[2], err);
        if (st != AF_OK) return st;
    }
    core.epi = m->epi;
    af_node *f = fuse_core_build(&core, conv->name, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- ConvPoolFcFusionOp -------------------------------------------------------------------- */

/* Scratch use: node[0] GAP, node[1] conv, node[2] flatten, node[3] FC. */

/* pooled [N, C, 1...] -> f's output [N, C]. */
static bool flattens(const af_node *f, const af_value *pooled) {
    if (f->op != AF_OP_FLATTEN && f->op != AF_OP_RESHAPE && f->op != AF_OP_SQUEEZE) return false;
    const af_tensor *p = &pooled->type, *o = f->nout > 0 && f->out[0] ? &f->out[0]->type : NULL;
    if (!o || !af_dims_defined(p) || p->rank < 3 || !af_dims_defined(o) || o->rank != 2) return false;
    for (int i = 2; i < p->rank; i++)
        if (p->dims[i] != 1) return false;
    return o->dims[0] == p->dims[0] && o->dims[1] == p->dims[1];
}

/* The flatten-like reader of pooled and the Gemm/MatMul reading its output as A. */
static bool head_shape(const af_value *pooled, af_node **flat, af_node **fc) {
    for (int u = 0; u < pooled->nuses; u++) {
        af_node *f = pooled->uses[u].node;
        if (f->graph != pooled->graph || pooled->uses[u].slot != 0 || !flattens(f, pooled))
            continue;
        af_node *g = reader(f->out[0], AF_OP_GEMM, 0);
        if (!g) g = reader(f->out[0], AF_OP_MATMUL, 0);
        if (g && g->nout > 0 && g->out[0]) {
            *flat = f;
            *fc = g;
            return true;
        }
    }
    return false;
}

/* The FC weights and bias: Gemm without transA; alpha and a scaled C need constants. */
static const char *fc_ok(const af_node *fc) {
    const af_value *w = input(fc, 1), *c = input(fc, 2);
    if (!w || !af_value_is_f32(w) || w->type.rank != 2) return "FC weights are not 2-D float32";
    if (fc->op == AF_OP_MATMUL) return fc->nin == 2 ? NULL : AF_NO_MATCH;
    if (af_attr_int(fc, "transA", 0) != 0) return "Gemm transposes A";
    if (fc->nin > 3) return AF_NO_MATCH;
    if (af_attr_float(fc, "alpha", 1.0f) != 1.0f && !af_value_is_const(w))
        return "Gemm scales weights that are not constant";
    float beta = af_attr_float(fc, "beta", 1.0f);
    if (c && beta != 0.0f) {
        if (!af_value_is_f32(c)) return "dtype is not float32";
        if (beta != 1.0f && !af_value_is_const(c)) return "Gemm scales a C that is not constant";
        if (c->type.rank > 2) return "broadcast does not fit the output";
        return fuse_fits(&c->type, &fc->out[0]->type);
    }
    return NULL;
}

const char *rule_conv_pool_fc_check(af_fusion_ctx *cx, af_node *gap, af_match *m) {
    (void)cx;
    af_value *x = input(gap, 0), *pooled = gap->nout > 0 ? gap->out[0] : NULL;
    af_node *conv = x ? x->producer : NULL, *flat = NULL, *fc = NULL;
    if (!conv || !pooled || conv->graph != gap->graph ||
        (conv->op != AF_OP_CONV && conv->op != AF_OP_FUSED_CONV) ||
        af_attr_int(conv, "transposed", 0) || conv->out[0] != x ||
        !head_shape(pooled, &flat, &fc))
        return AF_NO_MATCH;
    fuse_core core;
    const char *why = fuse_core_init(&core, conv);
    if (!why) why = fuse_edge(x);
    if (!why) why = fuse_edge(pooled);
    if (!why) why = fuse_edge(flat->out[0]);
    if (!why) why = fc_ok(fc);
    if (why) return why;
    fuse_match_add(m, gap);
    fuse_match_add(m, conv);
    fuse_match_add(m, flat);
    fuse_match_add(m, fc);
    fuse_match_output(m, fc->out[0]);
    return NULL;
}

/* Wfc scaled by alpha / C scaled by beta, as new constants when needed. */
static af_value *scaled(af_node *fc, af_value *v, float s, const char *hint, af_error *err) {
    if (s == 1.0f) return v;
    af_value *nv = af_value_new_f32(fc->graph, hint, v->type.rank, v->type.dims);
    if (!nv) {
        af_node_fail(err, fc, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    int64_t numel = af_tensor_numel(&v->type);
    const float *src = v->type.data;
    float *dst = nv->type.data;
    for (int64_t i = 0; i < numel; i++) dst[i] = (float)((double)src[i] * s);
    return nv;
}

af_status rule_conv_pool_fc_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *conv = m->node[1], *fc = m->node[3];
    fuse_core core;
    fuse_core_init(&core, conv);
    af_value *wfc = fc->in[1], *bfc = NULL;
    bool gemm = fc->op == AF_OP_GEMM;
    if (gemm) {
        wfc = scaled(fc, wfc, af_attr_float(fc, "alpha", 1.0f), "fc_w_scaled", err);
        float beta = af_attr_float(fc, "beta", 1.0f);
        if (input(fc, 2) && beta != 0.0f) bfc = scaled(fc, fc->in[2], beta, "fc_b_scaled", err);
        if (!wfc || (input(fc, 2) && beta != 0.0f && !bfc)) return err ? err->code : AF_ERR_NOMEM;
    }
    af_node *f = af_node_new_ours(conv->graph, AF_OP_CONV_POOL_FC, conv->name,
                             5 + fuse_epi_operands(&core.epi));
    if (!f || !fuse_copy_attrs(f, conv) ||
        (gemm && af_attr_int(fc, "transB", 0) && !af_node_set_int(f, "fc_trans_b", 1)))
        return af_node_fail(err, conv, AF_ERR_NOMEM, "out of memory");
    af_node_set_input(f, 0, core.in[0]);
    af_node_set_input(f, 1, core.in[1]);
    if (core.in[2]) af_node_set_input(f, 2, core.in[2]);
    af_node_set_input(f, 3, wfc);
    if (bfc) af_node_set_input(f, 4, bfc);
    af_status st = fuse_epi_emit(f, &core.epi, 5, err);
    if (st != AF_OK) return st;
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- SqueezeExciteFusionOp ----------------------------------------------------------------- */

/* Scratch use: node[] = GAP, conv1, act, conv2, gate, Mul. */

/* The first reader of v that is an epilogue activation (not a gate). */
static af_node *act_reader(const af_value *v) {
    for (int u = 0; v && u < v->nuses; u++) {
        af_node *r = v->uses[u].node;
        int64_t op;
        float p0, p1;
        if (r->graph == v->graph && fuse_act_op(r, &op, &p0, &p1) && r->in[0] == v) return r;
    }
    return NULL;
}

static af_node *gate_reader(const af_value *v) {
    af_node *g = reader(v, AF_OP_SIGMOID, 0);
    return g ? g : reader(v, AF_OP_HARD_SIGMOID, 0);
}

/* The Mul of v with x (either order). */
static af_node *mul_with(const af_value *v, const af_value *x) {
    for (int u = 0; v && u < v->nuses; u++) {
        af_node *r = v->uses[u].node;
        if (r->op == AF_OP_MUL && r->nin == 2 && r->graph == v->graph &&
            ((r->in[0] == v && r->in[1] == x) || (r->in[1] == v && r->in[0] == x)))
            return r;
    }
    return NULL;
}

/* A 1x1 conv from `cin` to `cout` channels on an [N, cin, 1...] input, group 1, giving
 * [N, cout, 1...]; cout < 0 takes W's. */
static const char *pointwise(const af_node *conv, int64_t cin, int64_t cout, int rank) {
    const af_value *w = input(conv, 1), *b = input(conv, 2), *y = conv->out[0];
    if (!w || !y || conv->nin > 3) return AF_NO_MATCH;
    if (af_attr_int(conv, "group", 1) != 1) return "excite conv has groups";
    const af_tensor *wt = &w->type, *yt = &y->type;
    if (!af_dims_defined(wt) || !af_dims_defined(yt) || wt->rank != rank || yt->rank != rank)
        return "shape is not known";
    if (wt->dims[1] != cin || (cout >= 0 && wt->dims[0] != cout))
        return "excite convs do not match the channels";
    for (int i = 2; i < rank; i++)
        if (wt->dims[i] != 1 || yt->dims[i] != 1) return "excite conv is not 1x1 on the pooled map";
    if (yt->dims[1] != wt->dims[0]) return "shape is not known";
    if (b && !(af_value_is_f32(b) && b->type.rank == 1 && b->type.dims[0] == wt->dims[0]))
        return "excite conv bias is not 1-D";
    return NULL;
}

const char *rule_squeeze_excite_check(af_fusion_ctx *cx, af_node *gap, af_match *m) {
    (void)cx;
    af_value *x = input(gap, 0), *pooled = gap->nout > 0 ? gap->out[0] : NULL;
    af_node *c1 = reader(pooled, AF_OP_CONV, 0);
    af_node *act = c1 ? act_reader(c1->out[0]) : NULL;
    af_node *c2 = act ? reader(act->out[0], AF_OP_CONV, 0) : NULL;
    af_node *gate = c2 ? gate_reader(c2->out[0]) : NULL;
    af_node *mul = gate ? mul_with(gate->out[0], x) : NULL;
    if (!x || !mul || !mul->out[0]) return AF_NO_MATCH;
    const af_tensor *xt = &x->type;
    if (!af_dims_defined(xt) || xt->rank < 3 || !af_same_shape(&mul->out[0]->type, xt))
        return "shape is not known";
    const char *why = fuse_edge(pooled);
    if (!why) why = fuse_edge(c1->out[0]);
    if (!why) why = fuse_edge(act->out[0]);
    if (!why) why = fuse_edge(c2->out[0]);
    if (!why) why = fuse_edge(gate->out[0]);
    if (!why) why = pointwise(c1, xt->dims[1], -1, xt->rank);
    if (!why) why = pointwise(c2, c1->in[1]->type.dims[0], xt->dims[1], xt->rank);
    if (why) return why;
    const af_node *nodes[6] = {gap, c1, act, c2, gate, mul};
    for (int i = 0; i < 6; i++) fuse_match_add(m, (af_node *)nodes[i]);
    fuse_match_output(m, mul->out[0]);
    return NULL;
}

af_status rule_squeeze_excite_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *gap = m->node[0], *c1 = m->node[1], *act = m->node[2], *c2 = m->node[3];
    af_node *gate = m->node[4];
    int64_t aop, gop;
    float ap[2], gp[2];
    fuse_act_op(act, &aop, &ap[0], &ap[1]);
    fuse_act_op(gate, &gop, &gp[0], &gp[1]);
    af_node *f = af_node_new_ours(gap->graph, AF_OP_SQUEEZE_EXCITE, gap->name, 5);
    if (!f || !af_node_set_ints(f, "act", &aop, 1) || !af_node_set_floats(f, "act_params", ap, 2) ||
        !af_node_set_ints(f, "gate", &gop, 1) || !af_node_set_floats(f, "gate_params", gp, 2))
        return af_node_fail(err, gap, AF_ERR_NOMEM, "out of memory");
    af_node_set_input(f, 0, gap->in[0]);
    af_node_set_input(f, 1, c1->in[1]);
    if (input(c1, 2)) af_node_set_input(f, 2, c1->in[2]);
    af_node_set_input(f, 3, c2->in[1]);
    if (input(c2, 2)) af_node_set_input(f, 4, c2->in[2]);
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- PadWindowFusionOp ---------------------------------------------------------------------- */

/* Scratch use: m->ival[0..2r) = the Pad's spatial pads (begin..., end...) of the window op's
 * rank r - 2 dims; m->ival[7] = r - 2. */

/* The Pad's pads (begin..., end... over its rank) and its fill value; a reason when they are not
 * constants this rule can read. */
static const char *pad_consts(const af_node *pad, int rank, int64_t *pads, float *fill) {
    if (strcmp(af_attr_str(pad, "mode", "constant"), "constant")) return "Pad is not constant-mode";
    const int64_t *a = NULL;
    int cnt;
    *fill = 0.0f;
    if (af_graph_opset(pad->graph) < 11) {
        cnt = af_attr_ints(pad, "pads", &a);
        *fill = af_attr_float(pad, "value", 0.0f);
    } else {
        const af_value *p = input(pad, 1), *v = input(pad, 2);
        if (input(pad, 3)) return "Pad has axes";
        if (!p || !af_value_is_const(p) || p->type.dtype != AF_DTYPE_INT64 || p->type.rank != 1)
            return "pads are not constant";
        a = p->type.data;
        cnt = (int)p->type.dims[0];
        if (v && (!af_value_is_const(v) || !af_value_is_f32(v) || af_tensor_numel(&v->type) != 1))
            return "fill value is not a constant float32";
        if (v) *fill = *(const float *)v->type.data;
    }
    if (cnt != 2 * rank) return "pads do not match the rank";
    for (int i = 0; i < cnt; i++) {
        if (a[i] < 0 || a[i] > (1 << 20)) return "pads are negative";
        if ((i % rank) < 2 && a[i] != 0) return "Pad pads the batch or channels";
        pads[i] = a[i];
    }
    return NULL;
}

const char *rule_pad_window_check(af_fusion_ctx *cx, af_node *pad, af_match *m) {
    (void)cx;
    af_value *y = pad->nout == 1 ? pad->out[0] : NULL;
    af_node *w = y && y->nuses == 1 ? y->uses[0].node : NULL;
    if (!w || y->uses[0].slot != 0 ||
        (w->op != AF_OP_CONV && w->op != AF_OP_AVERAGE_POOL && w->op != AF_OP_MAX_POOL))
        return AF_NO_MATCH;
    int rank = y->type.rank;
    if (rank < 3 || rank > 5) return "rank is not 3 to 5";
    const char *why = fuse_edge(y);
    if (why) return why;
    int64_t pads[10];
    float fill;
    if ((why = pad_consts(pad, rank, pads, &fill))) return why;
    if (strcmp(af_attr_str(w, "auto_pad", "NOTSET"), "NOTSET")) return "window op has auto_pad";
    if (w->op == AF_OP_MAX_POOL ? !(isinf(fill) && fill < 0) : fill != 0.0f)
        return w->op == AF_OP_MAX_POOL ? "MaxPool after a Pad that is not -inf"
                                       : "Pad fills with a value other than 0";
    if (w->op == AF_OP_MAX_POOL && w->nout > 1 && w->out[1]) return "MaxPool returns indices";
    const int64_t *wp = NULL;
    int nwp = af_attr_ints(w, "pads", &wp);
    bool padded = false;
    for (int i = 0; i < nwp; i++) padded = padded || wp[i] != 0;
    if (w->op == AF_OP_AVERAGE_POOL && padded && !af_attr_int(w, "count_include_pad", 0))
        return "AveragePool pads without counting the padding";
    int sp = rank - 2;
    for (int i = 0; i < sp; i++) {
        m->ival[i] = pads[2 + i];
        m->ival[sp + i] = pads[rank + 2 + i];
    }
    m->ival[7] = sp;
    fuse_match_add(m, pad);
    fuse_match_add(m, w);
    fuse_match_output(m, w->out[0]);
    return NULL;
}

af_status rule_pad_window_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *pad = m->node[0], *w = m->node[1];
    int sp = (int)m->ival[7];
    int64_t pads[6] = {0};
    const int64_t *wp = NULL;
    int nwp = af_attr_ints(w, "pads", &wp);
    for (int i = 0; i < 2 * sp; i++) pads[i] = m->ival[i] + (nwp == 2 * sp ? wp[i] : 0);
    /* The window op again (ONNX's domain), its pads grown by the Pad's. */
    af_node *f = af_node_new_ours(w->graph, w->op, w->name, w->nin);
    bool ok = f && fuse_copy_attrs(f, w);
    if (ok) {
        af_node_drop_attr(f, "pads");
        af_node_drop_attr(f, "count_include_pad");
        ok = af_node_set_ints(f, "pads", pads, 2 * sp) &&
             (w->op != AF_OP_AVERAGE_POOL || af_node_set_int(f, "count_include_pad", 1));
    }
    if (!ok) return af_node_fail(err, w, AF_ERR_NOMEM, "out of memory");
    f->domain = w->domain;
    af_node_set_input(f, 0, pad->in[0]);
    for (int i = 1; i < w->nin; i++)
        if (w->in[i]) af_node_set_input(f, i, w->in[i]);
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}
