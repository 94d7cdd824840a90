/* The roofline cost model behind the report's estimated speedups: an op takes
 * max(FLOPs / peak FMA rate, bytes moved / memory bandwidth), where bytes moved are its inputs
 * (weights included) and outputs; a fused op moves only its own inputs and outputs, which is
 * where fusion saves. The rates are the machine's, measured once (runtime/machine.c) and given
 * to the fusion stage with the report (af_fusion_report_init).
 *
 * Invariant: every estimate comes from those measured rates and the graph's types; there is no
 * constant speedup anywhere. Unknown dims count as 1 so that estimates stay finite. */
#include "fusion/fusion.h"

#include <math.h>

/* ---- per-node estimates -------------------------------------------------------------------- */

/* Element count with unknown dims as 1 (double: no overflow). */
static double count(const af_tensor *t) {
    double n = 1.0;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i] > 0 ? (double)t->dims[i] : 1.0;
    return n;
}

static double value_bytes(const af_value *v) {
    size_t es = af_dtype_size(v->type.dtype);
    return count(&v->type) * (double)(es ? es : 4);
}

double af_cost_bytes(const af_node *n) {
    double b = 0.0;
    for (int i = 0; i < n->nin; i++) {
        const af_value *v = n->in[i];
        bool seen = false;
        for (int k = 0; k < i && v && !seen; k++) seen = n->in[k] == v;
        if (v && !seen) b += value_bytes(v);
    }
    for (int i = 0; i < n->nout; i++)
        if (n->out[i]) b += value_bytes(n->out[i]);
    return b;
}

static const af_tensor *in_type(const af_node *n, int i) {
    return i < n->nin && n->in[i] ? &n->in[i]->type : NULL;
}

/* Product of dims [from, rank) of t. */
static double tail(const af_tensor *t, int from) {
    double p = 1.0;
    for (int i = from; t && i < t->rank; i++) p *= t->dims[i] > 0 ? (double)t->dims[i] : 1.0;
    return p;
}

/* Epilogue steps of a fused node. */
static double steps(const af_node *n) {
    const int64_t *v;
    int c = af_attr_ints(n, "epilogue", &v);
    return c > 0 ? c / 3 : 0;
}

double af_cost_flops(const af_node *n) {
    const af_tensor *y = n->nout > 0 && n->out[0] ? &n->out[0]->type : NULL;
    const af_tensor *a = in_type(n, 0), *b = in_type(n, 1);
    double out = y ? count(y) : 1.0;
    switch (n->op) {
    case AF_OP_CONV:
    case AF_OP_FUSED_CONV:
        if (af_attr_int(n, "transposed", 0)) /* W [C, M/group, k...]: each input times it */
            return 2.0 * (a ? count(a) : 1.0) * tail(b, 1) + out * steps(n);
        return 2.0 * out * tail(b, 1) + out * steps(n);
    case AF_OP_CONV_TRANSPOSE:
        return 2.0 * (a ? count(a) : 1.0) * tail(b, 1);
    case AF_OP_MATMUL:
    case AF_OP_GEMM:
    case AF_OP_FUSED_MATMUL: {
        bool ta = af_attr_int(n, "transA", 0) || af_attr_int(n, "trans_a", 0);
        double k = 1.0;
        if (a && a->rank >= 1) {
            int64_t d = a->dims[ta && a->rank >= 2 ? a->rank - 2 : a->rank - 1];
            k = d > 0 ? (double)d : 1.0;
        }
        return 2.0 * out * k + out * steps(n);
    }
    case AF_OP_BATCH_NORMALIZATION: return 2.0 * out;
    case AF_OP_LAYER_NORMALIZATION:
    case AF_OP_GROUP_NORM: return 8.0 * out;
    case AF_OP_RMS_NORMALIZATION: return 4.0 * out;
    case AF_OP_SOFTMAX:
    case AF_OP_LOG_SOFTMAX: return 5.0 * out;
    case AF_OP_MAX_POOL:
    case AF_OP_AVERAGE_POOL:
    case AF_OP_LP_POOL: {
        const int64_t *k;
        int nk = af_attr_ints(n, "kernel_shape", &k);
        double kk = 1.0;
        for (int i = 0; i < nk; i++) kk *= k[i] > 0 ? (double)k[i] : 1.0;
        return out * kk;
    }
    case AF_OP_GLOBAL_AVERAGE_POOL:
    case AF_OP_GLOBAL_MAX_POOL:
    case AF_OP_GLOBAL_LP_POOL:
    case AF_OP_REDUCE_SUM:
    case AF_OP_REDUCE_MEAN:
    case AF_OP_REDUCE_MAX:
    case AF_OP_REDUCE_MIN:
    case AF_OP_REDUCE_PROD:
    case AF_OP_REDUCE_SUM_SQUARE:
    case AF_OP_REDUCE_LOG_SUM:
    case AF_OP_REDUCE_LOG_SUM_EXP: return a ? count(a) : out;
    case AF_OP_FUSED_ELEMENTWISE: return out * (steps(n) > 0 ? steps(n) : 1.0);
    case AF_OP_FUSED_ATTENTION: {
        /* Per output element: Sk products for the scores' share (out * Sk / D scores of D
         * products each) and Sk for P x V, 2 FLOPs each; per score row (out / D of them): about
         * 5 FLOPs per key for scale, mask, max, exp and sum. Sk is k's sequence dim, per the
         * "layout" attribute's k entry (0: [B, S, ..], 1: [S, B, ..], 2: [B, H, S, D]). */
        const int64_t *lay = NULL;
        int kl = af_attr_ints(n, "layout", &lay) == 4 ? (int)lay[1] : 0;
        int sdim = kl == 1 ? 0 : kl == 2 ? 2 : 1;
        double sk = 1.0, d = (double)af_attr_int(n, "head_dim", 1);
        if (b && b->rank == (kl == 2 ? 4 : 3) && b->dims[sdim] > 0) sk = (double)b->dims[sdim];
        if (!(d >= 1.0)) d = 1.0;
        return out * sk * 4.0 + out / d * sk * 5.0;
    }
    default: return out;
    }
}

static bool gemm_like(af_op op) {
    return op == AF_OP_CONV || op == AF_OP_FUSED_CONV || op == AF_OP_MATMUL || op == AF_OP_GEMM ||
           op == AF_OP_FUSED_MATMUL || op == AF_OP_CONV_POOL_FC || op == AF_OP_FUSED_ATTENTION ||
           op == AF_OP_CONV_TRANSPOSE;
}

/* Seconds to move value v once. */
static double move_time(const af_machine *m, const af_value *v) {
    double b = value_bytes(v);
    if (v->is_const && b > 65536.0) return b / m->bandwidth;
    if (b <= m->l2_bytes) return b / m->l2_bandwidth;
    if (b <= 8.0 * m->l2_bytes) return b / m->l3_bandwidth;
    return b / m->bandwidth;
}

double af_cost_node_time(const af_machine *m, const af_node *n, double flops) {
    if (!m) return 0.0;
    double rate = gemm_like(n->op) ? m->gemm_flops : m->flops, tm = 0.0;
    for (int i = 0; i < n->nin; i++) {
        const af_value *v = n->in[i];
        bool seen = false;
        for (int k = 0; k < i && v && !seen; k++) seen = n->in[k] == v;
        if (v && !seen) tm += move_time(m, v);
    }
    for (int i = 0; i < n->nout; i++)
        if (n->out[i]) tm += move_time(m, n->out[i]);
    double tc = rate > 0.0 ? flops / rate : 0.0;
    return tc > tm ? tc : tm;
}

double af_cost_time(const af_machine *m, double flops, double bytes) {
    double tc = m && m->flops > 0.0 ? flops / m->flops : 0.0;
    double tm = m && m->bandwidth > 0.0 ? bytes / m->bandwidth : 0.0;
    return tc > tm ? tc : tm;
}
