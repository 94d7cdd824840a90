/* int8: where each FusedConv / FusedMatMul in the int8 form (quant = 1, kernels/ref/fused_quant.c)
 * runs (issue 18's design, points 4 and 5). It runs after the cores are lowered and before the
 * layout pass:
 *  - on the U8S8 GEMM core ("precision" = "int8") when this CPU has AVX512_VNNI or the node's
 *    weights are all within [-64, 64] (7 bits: without VNNI the kernels sum byte pairs in int16
 *    with VPMADDUBSW, exact only then; our calibration writes such weights there, as ONNX
 *    Runtime's reduce_range does), the calibrated int8 GEMM rate (machine file: VPDPBUSD, or
 *    VPMADDUBSW on 7-bit weights) is at least INT8_MIN_GAIN times the fp32 rate, and the
 *    kernels take the node: a FusedMatMul with a constant 2-D int8 B, no trans_a and no
 *    LayerNorm prologue; a dense (one group) FusedConv of rank 3 to 5 with constant int8
 *    weights, which the layout pass then makes channels-last and the pack pass packs
 *    (lower.c); K at most INT8_MAX_K;
 *  - else in float32: W dequantized at compile time (W * w_scale[channel]), X through a
 *    QuantizeDequantize node (the epilogue's AF_EP_FAKE_QUANT), the quant attributes dropped
 *    and "precision" = "fp32" with "precision_why" saying why, as bf16 does. Same numbers within
 *    float rounding: the reference of the int8 form computes exactly that. When X's producer is
 *    a fused op with an epilogue program and X's other readers are quantized cores with the same
 *    x_scale and x_zero_point, fq is appended to the producer's epilogue instead of a node
 *    (MobileNet-v2's depthwise convs: their expand conv's epilogue quantizes).
 *
 * Invariant: a node leaves this pass either marked int8 with its int8 form intact, or as a plain
 * float32 FusedConv / FusedMatMul reading fq(X); nothing else in the graph changes but the
 * epilogue of X's producer, which may gain that fq step when every reader of X agrees to it. */
#include "ir/epilogue.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/fused.h"
#include "kernels/simd/cpu.h"
#include "lower/lower.h"
#include "passes/rewrite.h"

#include <stdio.h>
#include <string.h>

/* int8 pays only well above the fp32 rate: each int8 op also converts its activation input
 * once per run (on the generic ISA its kernels widen bytes and are slower than fp32). */
#define INT8_MIN_GAIN 1.2
/* Most K (in quads' rows, padded) whose int32 sums cannot overflow: 65536 * 255 * 128 < 2^31. */
#define INT8_MAX_K 65536

static bool quantized(const af_node *n) {
    return (n->op == AF_OP_FUSED_CONV || n->op == AF_OP_FUSED_MATMUL) && fused_quant_on(n);
}

bool af_graph_has_quant(const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_graph *sub;
        if (quantized(g->nodes[i])) return true;
        for (int k = 0; (sub = pass_subgraph(g->nodes[i], k)); k++)
            if (af_graph_has_quant(sub)) return true;
    }
    return false;
}

/* NULL when the U8S8 kernels take node n, else why not. */
static const char *node_blocker(const af_node *n) {
    const af_value *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL;
    if (!w || !af_value_is_const(w) || w->type.dtype != AF_DTYPE_INT8 || !af_tensor_has_data(&w->type))
        return "int8: W is not a constant int8 tensor, runs fp32";
    if (!af_cpu_vnni() && !af_gemm_int8_7bit(w->type.data, af_tensor_numel(&w->type)))
        return "int8: weights beyond 7 bits on a CPU without AVX512_VNNI (VPMADDUBSW's pair sums "
               "would saturate), runs fp32";
    if (!x || x->type.dtype != AF_DTYPE_FLOAT || x->type.rank < 1)
        return "int8: X's type is unknown, runs fp32";
    const int64_t *d = w->type.dims;
    if (n->op == AF_OP_FUSED_MATMUL) {
        if (w->type.rank != 2) return "int8: B is not a matrix (batched weights run fp32)";
        if (af_attr_int(n, "trans_a", 0)) return "int8: A is transposed, runs fp32";
        if (n->nin > 3 && n->in[3]) return "int8: LayerNorm prologue, runs fp32";
        int64_t k = d[af_attr_int(n, "trans_b", 0) ? 1 : 0];
        return af_gemm_u8s8_k(k) > INT8_MAX_K ? "int8: K above 65536, runs fp32" : NULL;
    }
    if (af_attr_int(n, "transposed", 0)) return "int8: transposed convolution runs fp32";
    if (af_attr_int(n, "group", 1) != 1)
        return "int8: grouped or depthwise convolution runs fp32 (the int8 kernels are dense)";
    if (w->type.rank < 3 || w->type.rank > 5 || x->type.rank != w->type.rank)
        return "int8: convolution rank not 1-D to 3-D, runs fp32";
    int64_t taps = 1;
    for (int i = 2; i < w->type.rank; i++) taps *= d[i];
    if (d[1] < 1 || taps < 1 || taps * af_gemm_u8s8_k(d[1]) > INT8_MAX_K)
        return "int8: K above 65536, runs fp32";
    return NULL;
}

/* An existing QuantizeDequantize of x with scale s and zero point z (several cores reading one
 * activation, as BERT's Q, K and V projections do, share one), or NULL. */
static af_value *shared_fq(const af_value *x, float s, int z) {
    for (int u = 0; u < x->nuses; u++) {
        const af_node *f = x->uses[u].node;
        if (f->op == AF_OP_QUANTIZE_DEQUANTIZE && f->nout == 1 && f->out[0] &&
            af_attr_float(f, "scale", 0.0f) == s && af_attr_float(f, "zero_point", -1.0f) == (float)z)
            return f->out[0];
    }
    return NULL;
}

bool af_last_fq(const af_node *p, float *s, int *z) {
    int64_t e[3 * AF_EP_MAX_STEPS];
    float q[2 * AF_EP_MAX_STEPS];
    int n = af_epilogue_steps(p, e, q);
    if (n < 1 || e[3 * (n - 1)] != AF_EP_FAKE_QUANT || !(q[2 * (n - 1)] > 0.0f)) return false;
    *s = q[2 * (n - 1)];
    *z = (int)q[2 * (n - 1) + 1];
    return true;
}

/* Does node p's epilogue program end with fq(s, z), or is p that fq (fq is idempotent)? */
static bool ends_with_fq(const af_node *p, float s, int z) {
    if (p->op == AF_OP_QUANTIZE_DEQUANTIZE)
        return af_attr_float(p, "scale", 0.0f) == s && af_attr_float(p, "zero_point", -1.0f) == (float)z;
    float ps;
    int pz;
    return af_last_fq(p, &ps, &pz) && ps == s && pz == z;
}

/* x = p's output may become fq(x) in place when p is a fused op with an epilogue program with
 * room for a step and every other reader of x is a quantized core with the same s and z
 * reading it as X (fq is idempotent, and such a core quantizes fq(x) to x's codes): then no
 * QuantizeDequantize node runs, the producer's epilogue does it on the tile it just computed. */
static bool fq_fits_producer(const af_value *x, const af_node *n, float s, int z) {
    const af_node *p = x->producer;
    if (!p || p->graph != n->graph || x->is_output || p->nout < 1 || p->out[0] != x ||
        (p->op != AF_OP_FUSED_CONV && p->op != AF_OP_FUSED_MATMUL &&
         p->op != AF_OP_FUSED_ELEMENTWISE))
        return false;
    int64_t e[3 * AF_EP_MAX_STEPS];
    float q[2 * AF_EP_MAX_STEPS];
    int ns = af_epilogue_steps(p, e, q);
    if (ns < 0 || ns >= AF_EP_MAX_STEPS) return false;
    for (int u = 0; u < x->nuses; u++) {
        const af_node *r = x->uses[u].node;
        if (r == n) continue;
        /* (a LayerNorm prologue would quantize LN(x), not x) */
        if (x->uses[u].slot != 0 || !quantized(r) || af_attr_float(r, "x_scale", 0.0f) != s ||
            (r->op == AF_OP_FUSED_MATMUL && r->nin > 3 && r->in[3]) ||
            af_attr_int(r, "x_zero_point", -1) != z)
            return false;
    }
    return true;
}

/* Append the step fq(s, z) to p's epilogue program (fq_fits_producer checked its form). */
static bool append_fq(af_node *p, float s, int z) {
    int64_t e[3 * AF_EP_MAX_STEPS];
    float q[2 * AF_EP_MAX_STEPS];
    int n = af_epilogue_steps(p, e, q);
    e[3 * n] = AF_EP_FAKE_QUANT;
    e[3 * n + 1] = -1;
    e[3 * n + 2] = 0;
    q[2 * n] = s;
    q[2 * n + 1] = (float)z;
    return af_epilogue_set_steps(p, e, q, n + 1);
}

/* The float32 form of n (see the top): W * w_scale, X through a QuantizeDequantize. */
static af_status to_float(af_graph *g, af_node *n, const char *why, af_error *err) {
    af_value *x = n->in[0], *w = n->in[1];
    const af_tensor *wt = &w->type;
    int r = wt->rank;
    int64_t ch = 1, inner = 1;
    if (n->op == AF_OP_FUSED_CONV && r >= 1) {
        ch = wt->dims[0];
        inner = ch > 0 ? af_tensor_numel(wt) / ch : 1;
    } else if (r >= 2 && af_attr_int(n, "trans_b", 0)) {
        ch = wt->dims[r - 2];
        inner = wt->dims[r - 1];
    } else if (r >= 2) {
        ch = wt->dims[r - 1];
    }
    fused_quant q;
    af_status st = fused_quant_decode(n, wt, ch, &q, err);
    if (st) return st;
    if (!af_value_is_const(w) || !af_tensor_has_data(wt) || ch < 1 || inner < 1)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "int8 form with a W that is not constant");
    af_value *wf = af_value_new_f32(g, "dequant_w", r, wt->dims);
    af_value *y = shared_fq(x, q.x_scale, q.x_zero);
    if (!wf || !af_node_set_str(n, "precision", "fp32") || !af_node_set_str(n, "precision_why", why))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    /* x already fq(x) (another reader put fq in the producer's epilogue, or x is an fq's
     * output), or it can be */
    if (!y && x->producer && ends_with_fq(x->producer, q.x_scale, q.x_zero)) y = x;
    if (!y && fq_fits_producer(x, n, q.x_scale, q.x_zero)) {
        if (!append_fq(x->producer, q.x_scale, q.x_zero))
            return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        y = x;
    }
    if (!y) {
        af_node *f = af_node_new_ours(g, AF_OP_QUANTIZE_DEQUANTIZE, af_graph_unique_name(g, "fq"), 1);
        y = f ? af_value_new(g, af_graph_unique_name(g, "fq_x")) : NULL;
        if (!y || !af_node_set_float(f, "scale", q.x_scale) ||
            !af_node_set_float(f, "zero_point", (float)q.x_zero))
            return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        af_node_set_input(f, 0, x);
        af_node_set_output(f, 0, y);
        af_tensor_type_copy(&y->type, &x->type);
        af_node_move_last_to(g, n->id);
        af_graph_renumber(g);
    }
    const int8_t *src = wt->data;
    float *dst = wf->type.data;
    for (int64_t i = 0; i < af_tensor_numel(wt); i++)
        dst[i] = (float)src[i] * q.w_scale[q.nw_scale == 1 ? 0 : i / inner % ch];
    af_node_set_input(n, 0, y);
    af_node_set_input(n, 1, wf);
    af_node_drop_attr(n, "quant");
    af_node_drop_attr(n, "x_scale");
    af_node_drop_attr(n, "x_zero_point");
    af_node_drop_attr(n, "w_scale");
    return AF_OK;
}

static af_status int8_graph(af_graph *g, const af_precision_cfg *cfg, af_error *err) {
    char buf[200];
    const char *machine = NULL;
    if (!af_cpu_vnni() && !(cfg && cfg->gemm_flops > 0)) {
        machine = "int8: no AVX512_VNNI on this CPU (or AUTOFUSION_VNNI=0) and no measured int8 "
                  "rate, runs fp32";
    } else if (cfg && cfg->gemm_flops > 0 && !(cfg->gemm_int8_ops >= INT8_MIN_GAIN * cfg->gemm_flops)) {
        snprintf(buf, sizeof buf, "int8: int8 GEMMs run at %.0f GOP/s on this CPU, fp32 at %.0f "
                 "GFLOP/s (under %.1fx), runs fp32", cfg->gemm_int8_ops / 1e9,
                 cfg->gemm_flops / 1e9, INT8_MIN_GAIN);
        machine = buf;
    }
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i];
        af_graph *sub;
        for (int k = 0; (sub = pass_subgraph(n, k)); k++) {
            af_status st = int8_graph(sub, cfg, err);
            if (st) return st;
        }
        if (!quantized(n)) continue;
        const char *why = machine ? machine : node_blocker(n);
        if (!why) {
            if (!af_node_set_str(n, "precision", "int8"))
                return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
            continue;
        }
        af_status st = to_float(g, n, why, err);
        if (st) return st;
        i = n->id; /* a node was put before it */
    }
    return AF_OK;
}

af_status af_pass_int8(af_graph *g, const af_precision_cfg *cfg, af_error *err) {
    if (!af_graph_has_quant(g)) return AF_OK;
    af_status st = int8_graph(g, cfg, err);
    return st || g->parent ? st : af_graph_infer_shapes(g, err);
}
