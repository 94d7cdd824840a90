/* Reference kernels of the com.microsoft QOperator ops (ir/ops_ms.def): QLinearAdd, QLinearMul
 * (numpy broadcasting), QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool (NCHW, or
 * NHWC with channels_last) and QLinearConcat. Each dequantizes its operands, computes the float
 * op in double and quantizes the result (round half to even, saturating: nn_put) with the
 * output's scale and zero point, which is what the DequantizeLinear -> op -> QuantizeLinear form
 * of passes/qdq.c computes (up to where float32 rounds).
 *
 * Invariant: scales and zero points are one value each (checked by the shape functions and again
 * before use); an operand's zero point has its type; every index stays inside its tensor. */
#include "kernels/ref/nn_common.h"

/* The inputs of one quantized operand: value, scale, zero point (may be absent). */
typedef struct qin {
    const af_tensor *x, *s, *z;
} qin;

static bool is8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

/* Operand slots: Add/Mul 0 and 3 with the output's at 6; the unary ones 0, output 3; Concat
 * (X, Xs, Xz) triples from 2, output 0. */
static int q_out_slot(const af_node *n) {
    switch (n->op) {
    case AF_OP_QLINEAR_ADD: case AF_OP_QLINEAR_MUL: return 6;
    case AF_OP_QLINEAR_CONCAT: return 0;
    default: return 3;
    }
}

static af_status q_check(const af_node *n, const af_tensor *const *in, int slot, bool operand,
                         qin *q, af_error *err) {
    q->x = operand ? nn_in(n, in, slot) : NULL;
    q->s = nn_in(n, in, slot + (operand ? 1 : 0));
    q->z = nn_in(n, in, slot + (operand ? 2 : 1));
    if ((operand && !q->x) || !q->s)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d or its scale is missing", slot);
    if (operand && !is8(q->x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "input %d is %s, not 8-bit", slot,
                            af_dtype_name(q->x->dtype));
    if (!nn_is_float(q->s->dtype) || (q->s->rank >= 0 && af_tensor_numel(q->s) != 1))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "scale of input %d is not one float", slot);
    if (q->z && (!is8(q->z->dtype) || (operand && q->z->dtype != q->x->dtype) ||
                 (q->z->rank >= 0 && af_tensor_numel(q->z) != 1)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "zero point of input %d is not one value of its type", slot);
    return AF_OK;
}

/* The output's type: its zero point's, else the first operand's. */
static af_dtype q_out_type(const af_node *n, const af_tensor *const *in, const qin *first) {
    const af_tensor *z = nn_in(n, in, q_out_slot(n) + 1);
    return z ? z->dtype : first->x->dtype;
}

static af_status q_output(const af_node *n, const af_tensor *const *in, qin *y, af_error *err) {
    return q_check(n, in, q_out_slot(n), false, y, err);
}

af_status shape_qlinear_binary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_error *err) {
    qin a, b, y;
    af_status st = q_check(n, in, 0, true, &a, err);
    if (!st) st = q_check(n, in, 3, true, &b, err);
    if (!st) st = q_output(n, in, &y, err);
    if (st) return st;
    if (a.x->dtype != b.x->dtype)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "A and B differ in type");
    if (!af_broadcast_dims(a.x, b.x, &out[0]))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "A and B do not broadcast");
    out[0].dtype = q_out_type(n, in, &a);
    return AF_OK;
}

af_status shape_qlinear_unary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_error *err) {
    qin x, y;
    af_status st = q_check(n, in, 0, true, &x, err);
    if (!st) st = q_output(n, in, &y, err);
    if (st) return st;
    af_tensor_type_copy(&out[0], x.x);
    out[0].dtype = q_out_type(n, in, &x);
    return AF_OK;
}

af_status shape_qlinear_gap(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    qin x, y;
    af_status st = q_check(n, in, 0, true, &x, err);
    if (!st) st = q_output(n, in, &y, err);
    if (st) return st;
    if (x.x->rank >= 0 && x.x->rank < 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X has rank %d, not 3 or more",
                            x.x->rank);
    af_tensor_type_copy(&out[0], x.x);
    out[0].dtype = q_out_type(n, in, &x);
    bool last = af_attr_int(n, "channels_last", 0) != 0;
    for (int d = 1; d < x.x->rank; d++)
        if (last ? d < x.x->rank - 1 : d > 1) out[0].dims[d] = 1;
    return AF_OK;
}

af_status shape_qlinear_concat(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_error *err) {
    qin y, x0;
    if (n->nin < 5 || (n->nin - 2) % 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "takes Y_scale, Y_zero_point and (X, scale, zero point) triples");
    af_status st = q_output(n, in, &y, err);
    if (!st) st = q_check(n, in, 2, true, &x0, err);
    if (st) return st;
    int rank = x0.x->rank, axis = 0;
    if (rank >= 0 && !af_axis(af_attr_int(n, "axis", 0), rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    af_tensor_type_copy(&out[0], x0.x);
    out[0].dtype = q_out_type(n, in, &x0);
    for (int k = 5; k < n->nin; k += 3) {
        qin x;
        if ((st = q_check(n, in, k, true, &x, err))) return st;
        if (x.x->rank != rank || x.x->dtype != x0.x->dtype)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d differs in rank or type", k);
        for (int d = 0; rank >= 0 && d < rank; d++) {
            int64_t a = out[0].dims[d], b = x.x->dims[d];
            if (d == axis) out[0].dims[d] = a < 0 || b < 0 ? -1 : a + b;
            else if (a >= 0 && b >= 0 && a != b)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d differs in dim %d", k, d);
            else if (a < 0) out[0].dims[d] = b;
        }
    }
    return AF_OK;
}

/* Element i of operand q, dequantized. */
static double deq(const qin *q, int64_t i) {
    return (af_tensor_get_double(q->x, i) - (q->z ? af_tensor_get_double(q->z, 0) : 0.0)) *
           af_tensor_get_double(q->s, 0);
}

/* Store v quantized with the output's parameters. */
static void quant_put(af_tensor *y, int64_t i, const qin *yq, double v) {
    nn_put(y, i, nearbyint(v / af_tensor_get_double(yq->s, 0)) +
                     (yq->z ? af_tensor_get_double(yq->z, 0) : 0.0));
}

/* A (op) B with numpy broadcasting over y's multi-index. */
static void run_binary(const af_node *n, const qin *a, const qin *b, const qin *yq, af_tensor *y) {
    int64_t sa[AF_MAX_RANK] = {0}, sb[AF_MAX_RANK] = {0}, idx[AF_MAX_RANK] = {0};
    af_broadcast_strides(a->x, y, sa);
    af_broadcast_strides(b->x, y, sb);
    int64_t total = af_tensor_numel(y), ia = 0, ib = 0;
    for (int64_t i = 0; i < total; i++) {
        double u = deq(a, ia), v = deq(b, ib);
        quant_put(y, i, yq, n->op == AF_OP_QLINEAR_ADD ? u + v : u * v);
        for (int d = y->rank - 1; d >= 0; d--) { /* next multi-index, offsets along */
            ia += sa[d], ib += sb[d];
            if (++idx[d] < y->dims[d]) break;
            ia -= sa[d] * y->dims[d], ib -= sb[d] * y->dims[d];
            idx[d] = 0;
        }
    }
}

static void run_unary(const af_node *n, const qin *x, const qin *yq, af_tensor *y) {
    double alpha = af_attr_float(n, "alpha", 0.01f);
    int64_t total = af_tensor_numel(y);
    for (int64_t i = 0; i < total; i++) {
        double v = deq(x, i);
        v = n->op == AF_OP_QLINEAR_SIGMOID ? 1.0 / (1.0 + exp(-v)) : (v < 0 ? alpha * v : v);
        quant_put(y, i, yq, v);
    }
}

/* Mean over the spatial dims: [N, C, S] (or [N, S, C] with channels_last) to [N, C]. */
static void run_gap(const af_node *n, const qin *x, const qin *yq, af_tensor *y) {
    bool last = af_attr_int(n, "channels_last", 0) != 0;
    const af_tensor *t = x->x;
    int64_t nb = t->dims[0], c = last ? t->dims[t->rank - 1] : t->dims[1];
    int64_t sp = nn_prod(t, last ? 1 : 2, last ? t->rank - 1 : t->rank);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t k = 0; k < c; k++) {
            double sum = 0.0;
            for (int64_t p = 0; p < sp; p++)
                sum += deq(x, last ? (b * sp + p) * c + k : (b * c + k) * sp + p);
            quant_put(y, b * c + k, yq, sp ? sum / (double)sp : 0.0);
        }
}

/* Each input's block of dims[axis:] per outer index, requantized, one after the other. */
static void run_concat(const af_node *n, const af_tensor *const *in, const qin *yq, af_tensor *y) {
    int axis = 0;
    af_axis(af_attr_int(n, "axis", 0), y->rank, &axis);
    int64_t outer = nn_prod(y, 0, axis), row = nn_prod(y, axis, y->rank), at = 0;
    for (int k = 2; k < n->nin; k += 3) {
        qin x = {in[k], in[k + 1], nn_in(n, in, k + 2)};
        int64_t len = nn_prod(x.x, axis, x.x->rank);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < len; j++) quant_put(y, o * row + at + j, yq, deq(&x, o * len + j));
        at += len;
    }
}

af_status ref_qlinear_ms(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    (void)ex;
    for (int i = 0; i < n->nin; i++)
        if (in[i] && (!af_tensor_known(in[i]) || (af_tensor_numel(in[i]) > 0 && !in[i]->data)))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d unknown at run time", i);
    qin a, b, yq;
    af_status st = q_output(n, in, &yq, err);
    if (!st && n->op != AF_OP_QLINEAR_CONCAT) st = q_check(n, in, 0, true, &a, err);
    if (!st && (n->op == AF_OP_QLINEAR_ADD || n->op == AF_OP_QLINEAR_MUL))
        st = q_check(n, in, 3, true, &b, err);
    if (st) return st;
    switch (n->op) {
    case AF_OP_QLINEAR_ADD: case AF_OP_QLINEAR_MUL: run_binary(n, &a, &b, &yq, &out[0]); break;
    case AF_OP_QLINEAR_GLOBAL_AVERAGE_POOL: run_gap(n, &a, &yq, &out[0]); break;
    case AF_OP_QLINEAR_CONCAT: run_concat(n, in, &yq, &out[0]); break;
    default: run_unary(n, &a, &yq, &out[0]); break;
    }
    return AF_OK;
}
