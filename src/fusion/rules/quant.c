/* The int8 rule (docs/design.md, "Quantized models"):
 *  QuantConvMatMulFusionOp  fq(x) -> Conv | MatMul | Gemm whose weights are
 *                           DequantizeLinear(Wq, w_scale, w_zero_point) of a constant int8/uint8
 *                           Wq  ->  FusedConv / FusedMatMul with quant = 1:
 *      X       x (float32: the fake quantization fq = QuantizeDequantize(scale s_x, zero point
 *              z_x in the uint8 domain) is the op's, attributes x_scale and x_zero_point)
 *      W       a new constant INT8 tensor Wq - w_zero_point (refused when a value leaves
 *              [-128, 127]: it would not fit the int8 GEMM core)
 *      w_scale FLOATS, one value (per tensor) or one per output channel
 *      B       the float32 bias as it is (an int32 bias read through DequantizeLinear has been
 *              folded to float32 by then: only 8-bit weights stay unfolded, passes/fold.c)
 *  and Y = epilogue(op(fq(X), W * w_scale) + B) (fusion/fusion.h). The activation and the fake
 *  quantization after the product join its epilogue through ElementwiseFusionOp, as they do
 *  for any FusedConv / FusedMatMul.
 *
 * The weights' DequantizeLinear reaches this rule unfolded because the simplify before fusion
 * leaves DequantizeLinear of 8-bit constants read as Conv/MatMul/Gemm weights alone: folded to
 * float, the 8-bit values and their scale could only be guessed back. The simplify after fusion
 * folds those the rule did not take (so a refused conv runs on float weights as before).
 *
 * Invariant: check only reads the graph and verifies every constant, dtype, axis and value its
 * apply reads; apply allocates the shifted weights and rewires. */
#include "fusion/rule.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static af_value *input(const af_node *n, int i) {
    return i < n->nin ? n->in[i] : NULL;
}

static bool is8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

static int64_t elem8(const af_tensor *t, int64_t i) {
    return t->dtype == AF_DTYPE_UINT8 ? ((const uint8_t *)t->data)[i]
                                      : ((const int8_t *)t->data)[i];
}

/* The axis of W [.., ..] that runs over the output channels: Conv 0, MatMul 1 ([K, N]), Gemm 1
 * or 0 with transB. */
static int channel_axis(const af_node *n) {
    if (n->op == AF_OP_CONV) return 0;
    if (n->op == AF_OP_GEMM && af_attr_int(n, "transB", 0)) return 0;
    return 1;
}

/* The weight DequantizeLinear's parameters: constant float32 scale, one value or one per output
 * channel (its axis the output channels'), and a zero point with one value for all channels. */
static const char *weight_params(const af_node *n, const af_node *dq) {
    const af_value *wq = dq->in[0], *sc = input(dq, 1), *zp = input(dq, 2);
    const af_tensor *wt = &wq->type;
    if (!af_value_is_const(wq)) return "quantized weights are not constant";
    if (!is8(wt->dtype)) return "weights are not 8-bit";
    if (n->op == AF_OP_CONV ? wt->rank < 3 : wt->rank != 2)
        return n->op == AF_OP_CONV ? "weights rank below 3" : "weights are not 2-D";
    if (!af_dims_defined(wt)) return "shape is not known";
    if (!sc || !af_value_is_const(sc) || !af_value_is_f32(sc))
        return "weight scale is not a constant float32";
    int64_t ns = af_tensor_numel(&sc->type), oc = wt->dims[channel_axis(n)];
    if (ns != 1) {
        int axis;
        if (sc->type.rank != 1 || ns != oc ||
            !af_axis(af_attr_int(dq, "axis", 1), wt->rank, &axis) || axis != channel_axis(n))
            return "weight scale is not per tensor or per output channel";
    }
    const float *s = sc->type.data;
    for (int64_t i = 0; i < ns; i++)
        if (!(s[i] > 0.0f) || !isfinite(s[i])) return "weight scale is not positive and finite";
    if (zp) {
        int64_t nz = af_tensor_numel(&zp->type);
        if (!af_value_is_const(zp) || zp->type.dtype != wt->dtype || (nz != 1 && nz != ns))
            return "weight zero point is not a constant of the weights' type";
        for (int64_t i = 1; i < nz; i++)
            if (elem8(&zp->type, i) != elem8(&zp->type, 0)) return "weight zero point is per channel";
    }
    return NULL;
}

/* Wq - zero point in [-128, 127]? */
static bool shift_fits(const af_node *dq) {
    const af_tensor *wt = &dq->in[0]->type;
    const af_value *zp = input(dq, 2);
    int64_t z = zp ? elem8(&zp->type, 0) : 0, cnt = af_tensor_numel(wt);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t v = elem8(wt, i) - z;
        if (v < -128 || v > 127) return false;
    }
    return true;
}

const char *rule_quant_check(af_fusion_ctx *cx, af_node *n, af_match *m) {
    (void)cx;
    if (n->op != AF_OP_CONV && n->op != AF_OP_MATMUL && n->op != AF_OP_GEMM) return AF_NO_MATCH;
    af_value *x = input(n, 0), *w = input(n, 1), *b = input(n, 2);
    af_node *fq = x ? x->producer : NULL, *dq = w ? w->producer : NULL;
    /* a quantized conv whose input canonicalize could not make one fake quantization */
    if (fq && fq->op == AF_OP_DEQUANTIZE_LINEAR && dq && dq->op == AF_OP_DEQUANTIZE_LINEAR)
        return "input is not a QuantizeLinear -> DequantizeLinear pair with one set of constant "
               "per-tensor parameters";
    if (!fq || fq->op != AF_OP_QUANTIZE_DEQUANTIZE || fq->graph != n->graph || !w) return AF_NO_MATCH;
    if (!dq || dq->op != AF_OP_DEQUANTIZE_LINEAR || dq->graph != n->graph || !dq->in[0])
        return af_value_is_const(w) ? "weights are float, not a DequantizeLinear"
                                    : "weights are not constant";
    fuse_core core;
    const char *why = fuse_core_init(&core, n);
    if (why) return why;
    if (n->op == AF_OP_GEMM && af_attr_int(n, "transA", 0)) return "Gemm transposes A";
    if (n->op == AF_OP_GEMM && af_attr_float(n, "alpha", 1.0f) != 1.0f) return "Gemm alpha is not 1";
    if (n->op == AF_OP_CONV && b && !af_value_is_f32(b)) return "bias is not float32";
    if (!af_value_is_f32(fq->in[0])) return "dtype is not float32";
    if (af_ep_unary_check(AF_EP_FAKE_QUANT, af_attr_float(fq, "scale", 1.0f),
                          af_attr_float(fq, "zero_point", 0.0f)))
        return "input quantization parameters out of range";
    if ((why = weight_params(n, dq))) return why;
    if (!shift_fits(dq)) return "shifted weights leave [-128, 127]";
    fuse_match_add(m, n);
    fuse_match_add(m, fq);
    fuse_match_add(m, dq);
    if (fuse_edge(x)) fuse_match_keep(m, fq); /* others read fq(x) too (a residual) */
    if (fuse_edge(w)) fuse_match_keep(m, dq); /* weights shared */
    fuse_match_output(m, n->out[0]);
    return NULL;
}

/* The INT8 constant Wq - zero point (shift_fits checked the range). */
static af_value *shifted(af_node *n, const af_node *dq) {
    const af_value *wq = dq->in[0], *zp = input(dq, 2);
    char hint[256];
    snprintf(hint, sizeof hint, "%.200s/int8", wq->name);
    const char *name = af_graph_unique_name(n->graph, hint);
    af_value *v = name ? af_value_new_const(n->graph, name, AF_DTYPE_INT8, wq->type.rank,
                                            wq->type.dims)
                       : NULL;
    if (!v) return NULL;
    int64_t z = zp ? elem8(&zp->type, 0) : 0, cnt = af_tensor_numel(&wq->type);
    int8_t *d = v->type.data;
    for (int64_t i = 0; i < cnt; i++) d[i] = (int8_t)(elem8(&wq->type, i) - z);
    return v;
}

af_status rule_quant_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *n = m->node[0], *fq = m->node[1], *dq = m->node[2];
    fuse_core core;
    fuse_core_init(&core, n);
    core.in[0] = fq->in[0];
    core.in[1] = shifted(n, dq);
    const af_value *sc = dq->in[1];
    int ns = (int)af_tensor_numel(&sc->type);
    if (!core.in[1]) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    af_node *f = fuse_core_build(&core, n->name, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    if (!af_node_set_int(f, "quant", 1) ||
        !af_node_set_float(f, "x_scale", af_attr_float(fq, "scale", 1.0f)) ||
        !af_node_set_int(f, "x_zero_point", (int64_t)af_attr_float(fq, "zero_point", 0.0f)) ||
        !af_node_set_floats(f, "w_scale", sc->type.data, ns))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- FakeQuantShareFusionOp ----------------------------------------------------------------- */

/* A quantized core that reads x as X with scale s and zero point z (and nowhere else), with no
 * LayerNorm prologue (which would quantize LN(x), not x). */
static bool reads_quantized(const af_node *r, int slot, float s, float z) {
    return slot == 0 && (r->op == AF_OP_FUSED_CONV || r->op == AF_OP_FUSED_MATMUL) &&
           !(r->op == AF_OP_FUSED_MATMUL && r->nin > 3 && r->in[3]) &&
           af_attr_int(r, "quant", 0) == 1 && af_attr_float(r, "x_scale", 0.0f) == s &&
           (float)af_attr_int(r, "x_zero_point", -1) == z;
}

static bool same_fq(const af_node *r, int slot, float s, float z) {
    return slot == 0 && r->op == AF_OP_QUANTIZE_DEQUANTIZE && r->nout == 1 && r->out[0] &&
           af_attr_float(r, "scale", 0.0f) == s && af_attr_float(r, "zero_point", -1.0f) == z;
}

/* Can an epilogue take fq after x's producer p (now, or once ElementwiseFusionOp has made p's
 * chain a fused op)? */
static bool epilogue_producer(const af_node *p) {
    int64_t op;
    float p0, p1;
    return fuse_core_op(p->op) || fuse_act_op(p, &op, &p0, &p1) || p->op == AF_OP_ADD ||
           p->op == AF_OP_SUB || p->op == AF_OP_MUL || p->op == AF_OP_DIV;
}

/* fq = QuantizeDequantize(x) whose x is also read by quantized cores with fq's parameters (a
 * ResNet block's output: the next block's first conv quantizes it itself, its residual Add reads
 * fq(x)). fq is idempotent and such a core quantizes fq(x) to the same codes as x, so the cores
 * may read fq(x) instead: x is then fq's alone, and ElementwiseFusionOp appends fq to the
 * epilogue of x's producer (the residual Add + Relu then joins the next block's last conv as a
 * residual operand). Other fake quantizations of x with the same parameters merge into fq. */
const char *rule_fq_share_check(af_fusion_ctx *cx, af_node *q, af_match *m) {
    (void)cx;
    if (q->op != AF_OP_QUANTIZE_DEQUANTIZE || q->nin < 1 || !q->in[0] || q->nout != 1 || !q->out[0])
        return AF_NO_MATCH;
    af_value *x = q->in[0];
    af_node *p = x->producer;
    if (x->is_output || x->nuses < 2 || !p || p->graph != q->graph || p->nout < 1 ||
        p->out[0] != x || !epilogue_producer(p))
        return AF_NO_MATCH;
    float s = af_attr_float(q, "scale", 0.0f), z = af_attr_float(q, "zero_point", -1.0f);
    for (int u = 0; u < x->nuses; u++) {
        const af_node *r = x->uses[u].node;
        int slot = x->uses[u].slot;
        if (r == q) continue;
        if (!reads_quantized(r, slot, s, z) && !same_fq(r, slot, s, z))
            return "input also read unquantized or with other parameters";
        if (r->graph != q->graph) return "input also read inside a subgraph";
        if (r->id < q->id) return "a reader runs before the fake quantization";
        if (r->op == AF_OP_QUANTIZE_DEQUANTIZE) {
            const af_value *o = r->out[0];
            if (o->is_output) return "a merged fake quantization is a graph output";
            for (int k = 0; k < o->nuses; k++)
                if (o->uses[k].node->graph != q->graph || o->uses[k].node->id < q->id)
                    return "a reader runs before the fake quantization";
        }
    }
    fuse_match_add(m, q);
    fuse_match_output(m, q->out[0]);
    return NULL;
}

af_status rule_fq_share_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *q = m->node[0];
    af_value *x = q->in[0], *y = q->out[0];
    af_node *f = af_node_new_ours(q->graph, AF_OP_QUANTIZE_DEQUANTIZE, q->name, 1);
    if (!f || !fuse_copy_attrs(f, q)) return af_node_fail(err, q, AF_ERR_NOMEM, "out of memory");
    af_node_set_input(f, 0, x);
    af_status st = fuse_commit(cx, m, f, y, fuse_all(m), err);
    if (st != AF_OK || fuse_declined(cx)) return st;
    /* f now produces y; x's other readers move to y (uses shrink as they move: walk back) */
    for (int u = x->nuses - 1; u >= 0; u--) {
        af_node *r = x->uses[u].node;
        if (r == f) continue;
        if (r->op == AF_OP_QUANTIZE_DEQUANTIZE) {
            af_value_replace_uses(r->out[0], y);
            fuse_remove_if_dead(cx, r);
        } else {
            af_node_set_input(r, 0, y);
        }
    }
    return AF_OK;
}
