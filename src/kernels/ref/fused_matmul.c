/* FusedMatMul: Y = epilogue(alpha * op(LN(A)) x op(B) + bias) with numpy MatMul semantics
 * (1-D operands promoted, batch dims broadcast), Gemm's trans_a / trans_b on the last two dims,
 * an optional LayerNorm prologue over A's last dim (inputs 3 and 4, attr ln_epsilon; ln_rms 1
 * makes it an RMSNorm: input 3 only, no mean) and a
 * 1-D bias [N] (input 2).
 *
 * Invariant: A is read one row at a time into a row buffer (normalised there when the prologue
 * is on: never a normalised copy of A); each output row is computed in i-k-j order (a double
 * accumulator per column, B walked along its rows; a trans_b B is transposed once per distinct
 * matrix into scratch), finished by the epilogue and stored once. Every index is derived from
 * shapes checked before the loops run. */
#include "kernels/ref/fused.h"

#include <stdlib.h>

static af_status mm_dim_mismatch(const af_node *n, const char *what, int64_t a, int64_t b,
                                 af_error *err) {
    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s: %lld vs %lld", what, (long long)a,
                        (long long)b);
}

/* Two dims that must agree (unknown -1 passes); *r gets the known one. */
static bool mm_same(int64_t a, int64_t b, int64_t *r) {
    *r = a >= 0 ? a : b;
    return a < 0 || b < 0 || a == b;
}

/* A vector input (bias, ln_scale, ln_bias) of length `len` (unknown -1 passes). */
static af_status mm_vec(const af_node *n, const af_tensor *t, const char *what, int64_t len,
                        af_error *err) {
    if (!t)
        return AF_OK;
    if (t->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is %s (float32 only)", what,
                            af_dtype_name(t->dtype));
    if (t->rank >= 0 && t->rank != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be 1-D", what);
    if (t->rank == 1 && t->dims[0] >= 0 && len >= 0 && t->dims[0] != len)
        return mm_dim_mismatch(n, what, t->dims[0], len, err);
    return AF_OK;
}

/* Shapes, attributes and output type; works with unknown dims (then g->rank may be -1). */
static af_status mm_setup_shapes(const af_node *n, const af_tensor *const *in,
                                 const af_tensor *b_view, fused_mm *g, af_error *err) {
    memset(g, 0, sizeof(*g));
    g->a = nn_in(n, in, 0);
    g->b = nn_in(n, in, 1);
    g->bias = nn_in(n, in, 2);
    g->lns = nn_in(n, in, 3);
    g->lnb = nn_in(n, in, 4);
    if (!g->a || !g->b)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input A or B");
    if (n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "FusedMatMul has one output");
    g->packed = af_attr_int(n, "b_packed", 0) != 0;
    g->bdtype = g->b->dtype;
    if (g->packed && !b_view)
        return af_ref_refuse_lowered(n, err);
    if (b_view)
        g->b = b_view;
    bool low_b = g->packed && (g->b->dtype == AF_DTYPE_BFLOAT16 || g->b->dtype == AF_DTYPE_FLOAT16);
    /* The int8 form's B (fused_quant.c): checked by fused_mm_setup. */
    bool q8_b = g->b->dtype == AF_DTYPE_INT8 && fused_quant_on(n);
    if (g->a->dtype != AF_DTYPE_FLOAT || (g->b->dtype != AF_DTYPE_FLOAT && !low_b && !q8_b))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FusedMatMul on %s (float32 only)",
                            af_dtype_name(g->a->dtype != AF_DTYPE_FLOAT ? g->a->dtype : g->b->dtype));
    if (g->lnb && !g->lns)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "ln_bias without ln_scale");
    g->rms = af_attr_int(n, "ln_rms", 0) != 0;
    if (g->rms && (!g->lns || g->lnb))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "ln_rms needs ln_scale and no ln_bias");
    g->ta = af_attr_int(n, "trans_a", 0) != 0;
    g->tb = af_attr_int(n, "trans_b", 0) != 0;
    g->rank = -1;
    const af_tensor *a = g->a, *b = g->b;
    if (a->rank == 0 || b->rank == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "MatMul of a scalar");
    if (g->lns && g->ta && a->rank > 1)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "LayerNorm prologue with trans_a");
    if (a->rank < 0 || b->rank < 0) {
        af_status st = mm_vec(n, g->lns, "ln_scale", -1, err);
        if (st == AF_OK)
            st = mm_vec(n, g->lnb, "ln_bias", -1, err);
        if (st == AF_OK)
            st = mm_vec(n, g->bias, "bias", -1, err);
        return st;
    }
    g->a1 = a->rank == 1;
    g->b1 = b->rank == 1;
    int ar = a->rank, br = b->rank;
    int64_t ak, am, bk, bn;
    if (g->a1) {
        am = 1;
        ak = a->dims[0];
    } else {
        am = a->dims[ar - (g->ta ? 1 : 2)];
        ak = a->dims[ar - (g->ta ? 2 : 1)];
    }
    if (g->b1) {
        bn = 1;
        bk = b->dims[0];
    } else {
        bk = b->dims[br - (g->tb ? 1 : 2)];
        bn = b->dims[br - (g->tb ? 2 : 1)];
    }
    if (!mm_same(ak, bk, &g->k))
        return mm_dim_mismatch(n, "inner dims of A and B", ak, bk, err);
    g->m = am;
    g->n = bn;
    /* Batch dims: numpy broadcast of A's and B's leading dims. */
    int nba = g->a1 ? 0 : ar - 2, nbb = g->b1 ? 0 : br - 2;
    g->nb = nba > nbb ? nba : nbb;
    for (int i = 0; i < g->nb; i++) {
        int ia = i - (g->nb - nba), ib = i - (g->nb - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        int64_t d;
        if (da == 1)
            d = db;
        else if (db == 1)
            d = da;
        else if (!mm_same(da, db, &d))
            return mm_dim_mismatch(n, "batch dims of A and B", da, db, err);
        g->bdims[i] = d;
    }
    g->rank = g->nb;
    for (int i = 0; i < g->nb; i++)
        g->dims[i] = g->bdims[i];
    if (!g->a1)
        g->dims[g->rank++] = g->m;
    if (!g->b1)
        g->dims[g->rank++] = g->n;
    af_status st = mm_vec(n, g->lns, "ln_scale", ak, err);
    if (st == AF_OK)
        st = mm_vec(n, g->lnb, "ln_bias", ak, err);
    if (st == AF_OK)
        st = mm_vec(n, g->bias, "bias", g->n, err);
    return st;
}

af_status fused_mm_setup(const af_node *n, const af_tensor *const *in, const af_tensor *b_view,
                         fused_mm *g, af_error *err) {
    af_status st = mm_setup_shapes(n, in, b_view, g, err);
    if (st != AF_OK)
        return st;
    /* quant = 1: its attributes against B's N output channels; a packed B (the fast kernels'
     * int8 panels) was checked by its view. */
    st = fused_quant_decode(n, g->packed ? NULL : g->b, g->rank >= 0 ? g->n : -1, &g->quant, err);
    if (st == AF_OK && g->quant.on && g->lns)
        st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "quant with a LayerNorm prologue");
    return st;
}

af_status shape_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    fused_mm g;
    af_status st = fused_mm_setup(n, in, NULL, &g, err);
    if (st != AF_OK)
        return st;
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, g.rank, g.rank >= 0 ? g.dims : NULL);
    return af_epilogue_validate(n, in, &out[0], err);
}

/* Batch strides (in elements) of an operand with `nbo` batch dims over the output batch dims;
 * 0 along broadcast dims. `mat` is the size of one matrix. */
static void mm_batch_strides(const fused_mm *g, const af_tensor *t, int nbo, int64_t mat,
                             int64_t *str) {
    int64_t s = mat;
    for (int i = g->nb - 1; i >= 0; i--) {
        int it = i - (g->nb - nbo);
        if (it < 0) {
            str[i] = 0;
            continue;
        }
        str[i] = t->dims[it] == 1 ? 0 : s;
        s *= t->dims[it];
    }
}

/* Row m of batch entry A (offset aoff) into row[0..K), LayerNorm (or RMSNorm: no mean)
 * applied when enabled. */
static void mm_load_row(const fused_mm *g, int64_t aoff, int64_t m, float eps, float *row) {
    const float *a = (const float *)g->a->data + aoff;
    for (int64_t kk = 0; kk < g->k; kk++)
        row[kk] = g->ta ? a[kk * g->m + m] : a[m * g->k + kk];
    if (!g->lns)
        return;
    double mean = 0.0, var = 0.0;
    if (!g->rms) { /* an RMSNorm keeps mean 0: var is then the mean square */
        for (int64_t kk = 0; kk < g->k; kk++)
            mean += row[kk];
        mean /= (double)g->k;
    }
    for (int64_t kk = 0; kk < g->k; kk++)
        var += (row[kk] - mean) * (row[kk] - mean);
    var /= (double)g->k;
    double inv = 1.0 / sqrt(var + (double)eps);
    const float *sc = g->lns->data, *bi = g->lnb ? g->lnb->data : NULL;
    for (int64_t kk = 0; kk < g->k; kk++)
        row[kk] = (float)((row[kk] - mean) * inv * sc[kk] + (bi ? bi[kk] : 0.0));
}

/* B's matrix at offset boff as row-major [K, N] floats: B itself, or (trans_b) its transpose
 * written into bt, so the core always walks B's rows contiguously. */
static const float *mm_b_rows(const fused_mm *g, int64_t boff, bool transpose, float *bt) {
    const float *b = (const float *)g->b->data + boff;
    if (!transpose)
        return b;
    for (int64_t j = 0; j < g->n; j++)
        for (int64_t kk = 0; kk < g->k; kk++)
            bt[kk * g->n + j] = b[j * g->k + kk];
    return bt;
}

/* One output row: y[j] = alpha * sum_k row[k] * B[k, j] + bias[j], in the i-k-j order of the
 * unfused MatMul (a double accumulator per column, B read along its rows, the products added in
 * k order, so both sums have the same bits). Four k steps share one pass over the accumulators:
 * each acc[j] is loaded and stored once per four products instead of once per product. */
static void mm_row(const fused_mm *g, const float *row, const float *b, const float *bias,
                   double alpha, double *acc, float *y) {
    int64_t nn = g->n, kk = 0;
    for (int64_t j = 0; j < nn; j++)
        acc[j] = 0.0;
    for (; kk + 4 <= g->k; kk += 4) {
        double a0 = row[kk], a1 = row[kk + 1], a2 = row[kk + 2], a3 = row[kk + 3];
        const float *b0 = b + kk * nn, *b1 = b0 + nn, *b2 = b1 + nn, *b3 = b2 + nn;
        for (int64_t j = 0; j < nn; j++) {
            double t = acc[j];
            t += a0 * b0[j];
            t += a1 * b1[j];
            t += a2 * b2[j];
            t += a3 * b3[j];
            acc[j] = t;
        }
    }
    for (; kk < g->k; kk++) {
        double av = row[kk];
        const float *brow = b + kk * nn;
        for (int64_t j = 0; j < nn; j++)
            acc[j] += av * brow[j];
    }
    if (bias)
        for (int64_t j = 0; j < nn; j++)
            y[j] = (float)(alpha * acc[j] + bias[j]);
    else
        for (int64_t j = 0; j < nn; j++)
            y[j] = (float)(alpha * acc[j]);
}

/* fused_mm_decode; float_operands: in[0] and in[1] are the float operands the reference made
 * for a quant = 1 node (its quant attributes were checked on the node's own inputs). */
static af_status mm_decode(const af_node *n, const af_tensor *const *in, const af_tensor *b_view,
                           bool float_operands, fused_mm *g, af_epilogue *ep, af_error *err) {
    af_status st = float_operands ? mm_setup_shapes(n, in, b_view, g, err)
                                  : fused_mm_setup(n, in, b_view, g, err);
    if (st != AF_OK)
        return st;
    if (g->rank < 0)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input shapes unknown at run time");
    if (g->lns && g->k == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "LayerNorm over an empty dim");
    af_tensor y = {AF_DTYPE_FLOAT, g->rank, {0}, NULL, 0, 0};
    memcpy(y.dims, g->dims, sizeof(int64_t) * (size_t)g->rank);
    st = af_epilogue_prepare_attr(n, in, &y, "epilogue", ep, err);
    if (st != AF_OK)
        return st;
    g->alpha = af_attr_float(n, "alpha", 1.0f);
    g->eps = af_attr_float(n, "ln_epsilon", 1e-5f);
    g->prologue_fp32 = af_attr_int(n, "prologue_fp32", 0) != 0;
    mm_batch_strides(g, g->a, g->a1 ? 0 : g->a->rank - 2, g->m * g->k, g->astr);
    mm_batch_strides(g, g->b, g->b1 ? 0 : g->b->rank - 2, g->k * g->n, g->bstr);
    return AF_OK;
}

af_status fused_mm_decode(const af_node *n, const af_tensor *const *in, const af_tensor *b_view,
                          fused_mm *g, af_epilogue *ep, af_error *err) {
    return mm_decode(n, in, b_view, false, g, ep, err);
}

af_status fused_mm_bind(const af_node *n, fused_mm *g, const af_tensor *const *in,
                        const af_tensor *b_view, af_tensor *out, af_epilogue *ep,
                        af_error *err) {
    g->a = nn_in(n, in, 0);
    g->b = b_view ? b_view : nn_in(n, in, 1);
    g->bias = nn_in(n, in, 2);
    g->lns = nn_in(n, in, 3);
    g->lnb = nn_in(n, in, 4);
    if (!af_tensor_has_data(g->a) || !af_tensor_has_data(g->b) ||
        (g->bias && !af_tensor_has_data(g->bias)) || (g->lns && !af_tensor_has_data(g->lns)) ||
        (g->lnb && !af_tensor_has_data(g->lnb)))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    af_status st = nn_check_out(n, &out[0], g->rank, g->dims, err);
    return st ? st : af_epilogue_bind(n, ep, in, err);
}

af_status fused_mm_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           const af_tensor *b_view, fused_mm *g, af_epilogue *ep,
                           af_error *err) {
    af_status st = fused_mm_decode(n, in, b_view, g, ep, err);
    return st ? st : fused_mm_bind(n, g, in, b_view, out, ep, err);
}

/* The float product with its epilogue (float_operands: as in mm_decode). */
static af_status ref_fused_matmul_float(const af_node *n, const af_tensor *const *in,
                                        af_tensor *out, bool float_operands, af_error *err) {
    fused_mm g;
    af_epilogue ep;
    af_status st = mm_decode(n, in, NULL, float_operands, &g, &ep, err);
    if (st == AF_OK)
        st = fused_mm_bind(n, &g, in, NULL, out, &ep, err);
    if (st != AF_OK)
        return st;
    float alpha = g.alpha, eps = g.eps;
    /* A transposed [N, K] B of one row or one column is already [K, N] in memory. */
    bool transpose = g.tb && g.n > 1 && g.k > 1;
    size_t kn = 0; /* B holds K*N elements per matrix, so this product fits */
    if (transpose && !af_mul_size((size_t)g.k, (size_t)g.n, &kn))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "B's size overflows");
    float *row = af_malloc((size_t)(g.k > 0 ? g.k : 1) * sizeof(float));
    double *acc = af_malloc((size_t)(g.n > 0 ? g.n : 1) * sizeof(double));
    float *bt = transpose ? af_malloc(kn * sizeof(float)) : NULL;
    if (!row || !acc || (transpose && !bt)) {
        af_free(row);
        af_free(acc);
        af_free(bt);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    int64_t nbatch = 1;
    for (int i = 0; i < g.nb; i++)
        nbatch *= g.bdims[i]; /* the output's element count is known not to overflow */
    const float *bias = g.bias ? g.bias->data : NULL, *bmat = NULL;
    float *y = out[0].data;
    int64_t idx[AF_MAX_RANK] = {0}, last_boff = -1;
    for (int64_t step = 0; step < nbatch; step++) {
        int64_t aoff = 0, boff = 0, rest = step;
        for (int i = g.nb - 1; i >= 0; i--) {
            idx[i] = rest % g.bdims[i];
            rest /= g.bdims[i];
            aoff += idx[i] * g.astr[i];
            boff += idx[i] * g.bstr[i];
        }
        /* A broadcast B (e.g. one weight for every batch entry) is transposed once. */
        if (boff != last_boff) {
            bmat = mm_b_rows(&g, boff, transpose, bt);
            last_boff = boff;
        }
        for (int64_t m = 0; m < g.m; m++) {
            int64_t yoff = (step * g.m + m) * g.n;
            mm_load_row(&g, aoff, m, eps, row);
            mm_row(&g, row, bmat, bias, alpha, acc, y + yoff);
            af_epilogue_apply_at(&ep, y, yoff, g.n);
        }
    }
    af_free(row);
    af_free(acc);
    af_free(bt);
    return AF_OK;
}

/* quant = 1: the float product of fq(A) and B * w_scale[n] (fused_quant.c), B's channel its
 * last dim ([.., K, N]) or, with trans_b, its second last ([.., N, K]). */
static af_status ref_fused_matmul_quant(const af_node *n, const af_tensor *const *in,
                                        af_tensor *out, af_error *err) {
    fused_mm g;
    af_status st = fused_mm_setup(n, in, NULL, &g, err);
    if (st != AF_OK)
        return st;
    if (g.rank < 0)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input shapes unknown at run time");
    bool tb = g.tb && !g.b1;
    af_tensor af, bf;
    st = fused_quant_operands(n, &g.quant, g.a, g.b, tb ? (g.k > 0 ? g.k : 1) : 1,
                              g.n > 0 ? g.n : 1, &af, &bf, err);
    const af_tensor **fin = st == AF_OK ? fused_quant_inputs(n, in, &af, &bf, &st, err) : NULL;
    if (fin)
        st = ref_fused_matmul_float(n, fin, out, true, err);
    af_free(fin);
    af_tensor_release(&af);
    af_tensor_release(&bf);
    return st;
}

af_status ref_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    return fused_quant_on(n) ? ref_fused_matmul_quant(n, in, out, err)
                             : ref_fused_matmul_float(n, in, out, false, err);
}
