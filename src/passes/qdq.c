/* Quantized models in one form (docs/design.md, "Quantized models"): float activations between
 * ops, quantization written as QuantizeLinear / DequantizeLinear (QDQ), so that the fusion rules
 * see one pattern whatever the exporter wrote.
 *
 * 1. QOperator ops become DequantizeLinear -> float op -> QuantizeLinear (pass_qoperator_as_qdq,
 *    a step of simplify, so the unfused baseline runs the same form):
 *      QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)
 *          -> Q(Conv(DQ(x, xs, xz), DQ(w, ws, wz; axis 0), B * xs * ws), ys, yz)
 *      QLinearMatMul(a, as, az, b, bs, bz, ys, yz)
 *          -> Q(MatMul(DQ(a, as, az), DQ(b, bs, bz)), ys, yz)
 *    and the com.microsoft ops onnxruntime.quantization writes (ir/ops_ms.def): QLinearAdd,
 *    QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool (NCHW),
 *    QLinearConcat, likewise around Add, Mul, Sigmoid, LeakyRelu, GlobalAveragePool, Concat.
 *    One row per op in the table below says where the float op's operands and the output's
 *    parameters sit among the node's inputs. A per-row / per-column scale becomes the
 *    DequantizeLinear's axis. An int32 bias becomes float32 B * xs * ws (a constant), so these
 *    need constant scales when a bias is given.
 * 2. A QuantizeLinear whose 8-bit output only DequantizeLinear nodes read, with the same constant
 *    per-tensor scale and zero point, is one QuantizeDequantize node (fake quantization, the
 *    epilogue step AF_EP_FAKE_QUANT; pass_fake_quant, a step of canonicalize): the pair computes
 *    (clamp(round(x / s) + z, lo, hi) - z) * s, which for int8 (z8, [-128, 127]) is the uint8
 *    formula with z = z8 + 128. As one elementwise op it joins conv/matmul epilogues and
 *    elementwise chains like an activation, and the int8 rule (fusion/rules/quant.c) finds
 *    the quantized input of a Conv/MatMul/Gemm as fq(x).
 *    A DequantizeLinear after data movement on 8-bit values (QOperator models reshape uint8
 *    tensors between their ops) moves before it first, so that it meets its QuantizeLinear.
 * 3. Fake quantization commutes with data movement for per-tensor parameters: fq -> M -> fq'
 *    with M a Reshape, Flatten, Squeeze, Unsqueeze, Transpose, MaxPool, Concat or nearest Resize
 *    and fq' with fq's parameters is M -> fq' (M moves or selects values, or takes a maximum of
 *    them, and fq is non-decreasing and idempotent: fq'(M(fq(x))) = fq(M(x))). So the fq before
 *    a MaxPool goes and the conv after it still reads fq(maxpool(...)) (pass_fake_quant too).
 *    An fq that data movement alone separates from a Conv/MatMul/Gemm moves after it.
 *
 * Invariant: every rewrite computes what the nodes it replaces computed (the fake quantization
 * bit for bit; the QOperator forms within float rounding of the integer products), keeps the
 * names of the values it writes, and fires only when every constant, dtype and reader it relies
 * on checks out; otherwise the nodes stay as they are (and run on their reference kernels). */
#include "passes/rewrite.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool is8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

static af_value *in_at(const af_node *n, int i) {
    return i >= 0 && i < n->nin ? n->in[i] : NULL;
}

/* ---- 1. QOperator -> QDQ ------------------------------------------------------------------- */

/* One row per QOperator op: the float op it stands for and where its inputs sit: the
 * quantized operands as (value, scale, zero point) triples from input `first` (nops of them; -1:
 * triples up to the last input), the output's scale and zero point, an int32 bias (-1: none),
 * and whether the node's attributes are the float op's (Conv's pads, LeakyRelu's alpha,
 * Concat's axis). */
typedef struct qop_row {
    af_op qop, op;
    int first, nops, ys, yz, bias;
    bool attrs;
} qop_row;

static const qop_row qop_rows[] = {
    {AF_OP_QLINEAR_CONV, AF_OP_CONV, 0, 2, 6, 7, 8, true},
    {AF_OP_QLINEAR_MATMUL, AF_OP_MATMUL, 0, 2, 6, 7, -1, false},
    /* com.microsoft (ir/ops_ms.def) */
    {AF_OP_QLINEAR_ADD, AF_OP_ADD, 0, 2, 6, 7, -1, false},
    {AF_OP_QLINEAR_MUL, AF_OP_MUL, 0, 2, 6, 7, -1, false},
    {AF_OP_QLINEAR_SIGMOID, AF_OP_SIGMOID, 0, 1, 3, 4, -1, false},
    {AF_OP_QLINEAR_LEAKY_RELU, AF_OP_LEAKY_RELU, 0, 1, 3, 4, -1, true},
    {AF_OP_QLINEAR_GLOBAL_AVERAGE_POOL, AF_OP_GLOBAL_AVERAGE_POOL, 0, 1, 3, 4, -1, false},
    {AF_OP_QLINEAR_CONCAT, AF_OP_CONCAT, 2, -1, 0, 1, -1, true},
};

/* The DequantizeLinear axis of operand k of a QOperator node: Conv's weights per output
 * channel (axis 0); MatMul's A per row (rank - 2) and B per column (rank - 1). -2: scale is a
 * scalar (no axis); -1: a scale this form cannot say. */
static int qop_axis(const qop_row *r, int k, const af_value *x, const af_value *scale) {
    const af_tensor *t = &scale->type;
    if (t->rank < 0 || x->type.rank < 0) return -1;
    int64_t cnt = af_tensor_numel(t);
    if (cnt == 1 && t->rank <= 1) return -2;
    if (t->rank != 1 || (r->op != AF_OP_CONV && r->op != AF_OP_MATMUL)) return -1;
    int axis = r->op == AF_OP_CONV ? (k == 1 ? 0 : -1)
                                    : (k == 0 ? x->type.rank - 2 : x->type.rank - 1);
    if (axis < 0 || x->type.rank < 2 || x->type.dims[axis] != cnt) return -1;
    return axis;
}

static af_value *new_value(pass_scope *s, const char *base, const char *suffix) {
    char hint[256];
    snprintf(hint, sizeof hint, "%.200s/%s", base, suffix);
    const char *name = af_graph_unique_name(s->g, hint);
    return name ? af_value_new(s->g, name) : NULL;
}

/* DequantizeLinear(x, scale, zp; axis) as a new node; NULL when out of memory. */
static af_value *dequantize(pass_scope *s, const af_node *anchor, af_value *x, af_value *scale,
                            af_value *zp, int axis) {
    af_node *dq = pass_node_new(s, AF_OP_DEQUANTIZE_LINEAR, anchor, zp ? 3 : 2, 1);
    af_value *y = dq ? new_value(s, x->name, "dequantized") : NULL;
    if (!y || (axis >= 0 && !af_node_set_int(dq, "axis", axis))) return NULL;
    af_node_set_input(dq, 0, x);
    af_node_set_input(dq, 1, scale);
    if (zp) af_node_set_input(dq, 2, zp);
    af_node_set_output(dq, 0, y);
    return y;
}

/* The float32 bias B * xs * ws[m] of QLinearConv (B int32 [M], scales constant). NULL when the
 * inputs are not such constants (*bad set) or out of memory (*bad clear). */
static af_value *conv_bias(pass_scope *s, const af_value *b, const af_value *xs,
                           const af_value *ws, bool *bad) {
    *bad = true;
    double sx;
    int64_t m = b->type.rank == 1 ? b->type.dims[0] : -1, nws = af_tensor_numel(&ws->type);
    if (!af_value_is_const(b) || b->type.dtype != AF_DTYPE_INT32 || m < 0 ||
        !pass_scalar(xs, &sx) || !af_value_is_const(ws) || !af_value_is_f32(ws) ||
        (nws != 1 && nws != m))
        return NULL;
    *bad = false;
    char hint[256];
    snprintf(hint, sizeof hint, "%.200s/float", b->name);
    const char *name = af_graph_unique_name(s->g, hint);
    af_value *f = name ? af_value_new_const(s->g, name, AF_DTYPE_FLOAT, 1, &m) : NULL;
    if (!f) return NULL;
    const int32_t *src = b->type.data;
    const float *w = ws->type.data;
    float *dst = f->type.data;
    for (int64_t i = 0; i < m; i++) dst[i] = (float)((double)src[i] * sx * w[nws == 1 ? 0 : i]);
    return f;
}

#define QOP_MAX 64 /* operands of a QLinearConcat rewritten */

static af_status qop_rewrite(pass_scope *s, af_node *n, const qop_row *r, bool *changed,
                             af_error *err) {
    af_value *y = n->nout == 1 ? n->out[0] : NULL, *ys = in_at(n, r->ys), *yz = in_at(n, r->yz);
    int nops = r->nops >= 0 ? r->nops : (n->nin - r->first) / 3;
    if (!y || !ys || !af_value_is_f32(ys) || (yz && !is8(yz->type.dtype)) || nops < 1 ||
        nops > QOP_MAX || (r->nops < 0 && (n->nin - r->first) % 3) ||
        (r->op == AF_OP_GLOBAL_AVERAGE_POOL && af_attr_int(n, "channels_last", 0)))
        return AF_OK; /* a form the reference kernel runs as it is */
    int axes[QOP_MAX];
    for (int k = 0; k < nops; k++) {
        int at = r->first + 3 * k;
        af_value *x = in_at(n, at), *sc = in_at(n, at + 1), *zp = in_at(n, at + 2);
        if (!x || !sc || !is8(x->type.dtype) || !af_value_is_f32(sc) ||
            (zp && zp->type.dtype != x->type.dtype) || (axes[k] = qop_axis(r, k, x, sc)) == -1 ||
            (axes[k] == -2 && zp && af_tensor_numel(&zp->type) != 1))
            return AF_OK;
    }
    if (af_tensor_numel(&ys->type) != 1 || (yz && af_tensor_numel(&yz->type) != 1)) return AF_OK;
    af_value *bias = NULL, *b = in_at(n, r->bias);
    if (b) {
        bool bad;
        bias = conv_bias(s, b, in_at(n, r->first + 1), in_at(n, r->first + 4), &bad);
        if (!bias) return bad ? AF_OK : af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    af_node *f = pass_node_new(s, r->op, n, bias ? 3 : nops, 1);
    af_node *q = f ? pass_node_new(s, AF_OP_QUANTIZE_LINEAR, n, yz ? 3 : 2, 1) : NULL;
    af_value *fy = q ? new_value(s, y->name, "float") : NULL;
    if (!fy) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    for (int k = 0; k < nops; k++) {
        int at = r->first + 3 * k;
        af_value *d = dequantize(s, n, n->in[at], n->in[at + 1], in_at(n, at + 2), axes[k]);
        if (!d) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        af_node_set_input(f, k, d);
    }
    if (bias) af_node_set_input(f, 2, bias);
    for (int i = 0; r->attrs && i < n->nattrs; i++) { /* pads, strides, group; alpha; axis */
        af_attr *a = af_node_add_attr(f, n->attrs[i].name, n->attrs[i].type);
        if (!a) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        *a = n->attrs[i];
    }
    af_node_set_output(f, 0, fy);
    af_node_set_input(q, 0, fy);
    af_node_set_input(q, 1, ys);
    if (yz) af_node_set_input(q, 2, yz);
    af_status st = pass_kill(s, n, err);
    if (st) return st;
    af_node_set_output(q, 0, y); /* the name stays */
    *changed = true;
    return AF_OK;
}

af_status pass_qoperator_as_qdq(af_graph *g, bool *changed, af_error *err) {
    pass_scope s;
    af_status st = pass_scope_open(&s, g, err);
    bool mine = false;
    int before = g->nnodes;
    for (int i = 0; !st && i < before; i++) {
        af_node *n = g->nodes[i];
        for (size_t r = 0; !pass_dead(&s, n) && r < AF_COUNT(qop_rows); r++)
            if (n->op == qop_rows[r].qop) st = qop_rewrite(&s, n, &qop_rows[r], &mine, err);
    }
    if (!st) pass_scope_sweep(&s);
    pass_scope_close(&s);
    if (!st && mine) {
        *changed = true;
        st = af_graph_toposort(g, err);
    }
    return st;
}

/* ---- 2. QuantizeLinear -> DequantizeLinear as one fake quantization ------------------------ */

/* The constant per-tensor parameters of a QuantizeLinear / DequantizeLinear: scale (float32,
 * positive, finite) and the zero point in the uint8 domain, with the quantized type. */
typedef struct qparams {
    float scale;
    float zero; /* uint8 domain: int8's z8 + 128 */
    af_dtype type;
} qparams;

static bool qparams_of(const af_node *n, qparams *p) {
    const af_value *sc = in_at(n, 1), *zp = in_at(n, 2);
    double z = 0.0;
    if (!sc || !af_value_is_f32(sc) || !af_value_is_const(sc) || af_tensor_numel(&sc->type) != 1)
        return false;
    p->scale = *(const float *)sc->type.data;
    p->type = AF_DTYPE_UINT8;
    if (n->op == AF_OP_QUANTIZE_LINEAR && !zp) { /* opset 21: the type may be an attribute */
        int64_t t = af_attr_int(n, "output_dtype", 0);
        if (t) p->type = (af_dtype)t;
    }
    if (zp) {
        if (!af_value_is_const(zp) || af_tensor_numel(&zp->type) != 1 || !pass_scalar(zp, &z))
            return false;
        p->type = zp->type.dtype;
    }
    if (!is8(p->type) || !(p->scale > 0.0f) || !isfinite(p->scale)) return false;
    p->zero = (float)(z + (p->type == AF_DTYPE_INT8 ? 128.0 : 0.0));
    return true;
}

static bool qparams_same(const qparams *a, const qparams *b) {
    return a->scale == b->scale && a->zero == b->zero && a->type == b->type;
}

/* q's readers, all DequantizeLinear with q's parameters writing float32: their number, and the
 * one whose output is pinned (at most one may be; *keep) */
static int pair_readers(const pass_scope *s, const af_node *q, const qparams *p, af_node **keep) {
    const af_value *v = q->out[0];
    *keep = NULL;
    if (v->nuses == 0 || pass_pinned(s, v)) return 0;
    for (int u = 0; u < v->nuses; u++) {
        const af_node *d = v->uses[u].node;
        qparams dp;
        if (d->graph != s->g || d->op != AF_OP_DEQUANTIZE_LINEAR || v->uses[u].slot != 0 ||
            pass_dead(s, d) || d->nout != 1 || !d->out[0] || !qparams_of(d, &dp) ||
            !qparams_same(p, &dp) || !af_value_is_f32(d->out[0]))
            return 0;
        if (pass_pinned(s, d->out[0])) {
            if (*keep) return 0;
            *keep = (af_node *)d;
        }
    }
    return v->nuses;
}

static af_node *fq_node(pass_scope *s, const af_node *anchor, const qparams *p) {
    af_node *f = pass_node_new(s, AF_OP_QUANTIZE_DEQUANTIZE, anchor, 1, 1);
    if (!f || !af_node_set_float(f, "scale", p->scale) ||
        !af_node_set_float(f, "zero_point", p->zero))
        return NULL;
    return f;
}

static af_status pair_at(pass_scope *s, af_node *q, bool *hit, af_error *err) {
    qparams p;
    af_node *keep;
    af_value *x = in_at(q, 0);
    if (!x || !af_value_is_f32(x) || q->nout != 1 || !q->out[0] || !qparams_of(q, &p) ||
        !pair_readers(s, q, &p, &keep))
        return AF_OK;
    af_node *f = fq_node(s, q, &p);
    af_value *y = f && !keep ? new_value(s, x->name, "fake_quantized") : NULL;
    if (!f || (!keep && !y)) return af_node_fail(err, q, AF_ERR_NOMEM, "out of memory");
    if (keep) {
        y = keep->out[0];
    } else { /* x's type: the fusion rules that follow read it */
        af_tensor_type_copy(&y->type, &x->type);
        memcpy(y->dim_param, x->dim_param, sizeof y->dim_param);
    }
    af_value *qv = q->out[0];
    while (qv->nuses > 0) { /* each DequantizeLinear: its readers read y */
        af_node *d = qv->uses[0].node;
        af_value *dy = d->out[0];
        af_status st = pass_kill(s, d, err);
        if (st) return st;
        if (dy != y) af_value_replace_uses(dy, y);
    }
    af_status st = pass_kill(s, q, err);
    if (st) return st;
    af_node_set_input(f, 0, x);
    af_node_set_output(f, 0, y);
    *hit = true;
    return AF_OK;
}

/* ---- 3. fake quantization through data movement -------------------------------------------- */

/* Does op M commute with a per-tensor fake quantization (its output is each value of one input
 * moved, or a maximum of them)? Which inputs carry data: all for Concat, else the first. */
static bool fq_commutes(const af_node *m) {
    switch (m->op) {
    case AF_OP_RESHAPE: case AF_OP_FLATTEN: case AF_OP_SQUEEZE: case AF_OP_UNSQUEEZE:
    case AF_OP_TRANSPOSE: case AF_OP_CONCAT:
        return m->nout == 1;
    case AF_OP_MAX_POOL: /* its Indices output unused */
        return m->nout == 1 || (m->nout == 2 && (!m->out[1] || m->out[1]->nuses == 0));
    case AF_OP_RESIZE: case AF_OP_UPSAMPLE:
        return m->nout == 1 && !strcmp(af_attr_str(m, "mode", "nearest"), "nearest");
    default:
        return false;
    }
}

/* The fake quantization producing v with parameters p, read only by `user`; else NULL. */
static af_node *fq_feeding(const pass_scope *s, const af_value *v, const qparams *p,
                           const af_node *user) {
    af_node *a = pass_producer(s, v, AF_OP_QUANTIZE_DEQUANTIZE);
    if (!a || pass_sole_user(s, v) != user) return NULL;
    qparams ap = {af_attr_float(a, "scale", 1.0f), af_attr_float(a, "zero_point", 0.0f), p->type};
    return qparams_same(&ap, p) ? a : NULL;
}

/* b = fq(M1(...Mk(...)))): walk back through the data movement read only along the chain and
 * drop the fake quantizations with b's parameters that feed it. */
static af_status propagate_at(pass_scope *s, af_node *b, bool *hit, af_error *err) {
    qparams p = {af_attr_float(b, "scale", 1.0f), af_attr_float(b, "zero_point", 0.0f),
                 AF_DTYPE_UINT8};
    af_value *v = b->in[0];
    af_node *m = v ? v->producer : NULL;
    const af_node *reader = b;
    for (int depth = 0; m && depth < 16; depth++) {
        if (m->graph != s->g || pass_dead(s, m) || !fq_commutes(m) || m->out[0] != v ||
            pass_sole_user(s, v) != reader)
            return AF_OK;
        int nin = m->op == AF_OP_CONCAT ? m->nin : 1;
        for (int i = 0; i < nin; i++) {
            af_node *a = m->in[i] ? fq_feeding(s, m->in[i], &p, m) : NULL;
            if (!a) continue;
            af_value *x = a->in[0];
            af_status st = pass_kill(s, a, err);
            if (st) return st;
            af_node_set_input(m, i, x);
            *hit = true;
        }
        if (m->op == AF_OP_CONCAT) return AF_OK;
        reader = m;
        v = m->in[0];
        m = v ? v->producer : NULL;
    }
    return AF_OK;
}

/* d = DequantizeLinear(M(q)) with M a data movement op on the 8-bit values read only by d, and
 * d's parameters per tensor: M(DequantizeLinear(q)) instead (dequantization is elementwise and
 * increasing, so it commutes with M as fq does), which lets q's QuantizeLinear meet its
 * DequantizeLinear. QOperator models move uint8 tensors between their QLinear ops this way. */
static af_status sink_at(pass_scope *s, af_node *d, bool *hit, af_error *err) {
    qparams p;
    af_value *v1 = in_at(d, 0), *v2 = d->nout == 1 ? d->out[0] : NULL;
    af_node *m = v1 ? v1->producer : NULL;
    if (!v2 || !m || m->graph != s->g || pass_dead(s, m) || m->op == AF_OP_CONCAT ||
        !fq_commutes(m) || m->out[0] != v1 || pass_sole_user(s, v1) != d || !m->in[0] ||
        !is8(m->in[0]->type.dtype) || !qparams_of(d, &p))
        return AF_OK;
    af_value *v0 = m->in[0];
    af_node *nd = pass_node_new(s, AF_OP_DEQUANTIZE_LINEAR, d, d->nin, 1);
    af_value *u = nd ? new_value(s, v0->name, "dequantized") : NULL;
    if (!u) return af_node_fail(err, d, AF_ERR_NOMEM, "out of memory");
    af_tensor_type_copy(&u->type, &v0->type);
    memcpy(u->dim_param, v0->dim_param, sizeof u->dim_param);
    u->type.dtype = AF_DTYPE_FLOAT;
    af_node_set_input(nd, 0, v0);
    for (int i = 1; i < d->nin; i++)
        if (d->in[i]) af_node_set_input(nd, i, d->in[i]);
    af_node_set_output(nd, 0, u);
    af_status st = pass_kill(s, d, err);
    if (st) return st;
    af_node_set_input(m, 0, u);
    af_node_set_output(m, 0, v2); /* v2 keeps its name; v1 goes unread */
    *hit = true;
    return AF_OK;
}

/* fq -> M1 -> ... -> Mk -> Conv|MatMul|Gemm (input 0), each M a data movement op with one data
 * input read only along the chain: M1 -> ... -> Mk -> fq instead, so that the product reads
 * fq(x) and the int8 rule takes it (a QOperator model reshapes between QLinearConv and
 * QLinearMatMul). */
static af_status hoist_at(pass_scope *s, af_node *fq, bool *hit, af_error *err) {
    af_value *y = fq->out[0], *v = y;
    af_node *m = pass_sole_user(s, y), *last = NULL;
    for (int depth = 0; m && depth < 16; depth++) {
        if (m->op == AF_OP_CONV || m->op == AF_OP_MATMUL || m->op == AF_OP_GEMM) break;
        if (m->op == AF_OP_CONCAT || !fq_commutes(m) || m->in[0] != v || !af_value_is_f32(m->out[0]))
            return AF_OK;
        last = m;
        v = m->out[0];
        m = pass_sole_user(s, v);
    }
    if (!last || !m || (m->op != AF_OP_CONV && m->op != AF_OP_MATMUL && m->op != AF_OP_GEMM) ||
        m->in[0] != v)
        return AF_OK;
    af_value *t = new_value(s, v->name, "moved");
    if (!t) return af_node_fail(err, fq, AF_ERR_NOMEM, "out of memory");
    af_tensor_type_copy(&t->type, &v->type);
    memcpy(t->dim_param, v->dim_param, sizeof t->dim_param);
    af_node *first = pass_sole_user(s, y);
    af_node_set_input(first, 0, fq->in[0]);
    af_node_set_output(last, 0, t);
    af_node_set_input(fq, 0, t);
    af_node_set_output(fq, 0, v); /* v keeps its name; y goes unread */
    *hit = true;
    return AF_OK;
}

af_status pass_fake_quant(pass_scope *s, bool *hit, af_error *err) {
    af_status st = AF_OK;
    /* DequantizeLinear moved before data movement, repeatedly along a chain (new ones are
     * appended, so the walk reaches them) */
    for (int i = 0; i < s->g->nnodes && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (!pass_dead(s, n) && n->op == AF_OP_DEQUANTIZE_LINEAR) st = sink_at(s, n, hit, err);
    }
    for (int i = 0, n0 = s->g->nnodes; i < n0 && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (!pass_dead(s, n) && n->op == AF_OP_QUANTIZE_LINEAR) st = pair_at(s, n, hit, err);
    }
    /* the new nodes too: they were appended */
    for (int i = 0; i < s->g->nnodes && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (!pass_dead(s, n) && n->op == AF_OP_QUANTIZE_DEQUANTIZE && n->nin == 1 && n->in[0])
            st = propagate_at(s, n, hit, err);
    }
    for (int i = 0; i < s->g->nnodes && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (!pass_dead(s, n) && n->op == AF_OP_QUANTIZE_DEQUANTIZE && n->nin == 1 && n->in[0] &&
            n->nout == 1 && n->out[0])
            st = hoist_at(s, n, hit, err);
    }
    return st;
}
