/* FusedMatMul: Y = epilogue(alpha * op(LN(A)) x op(B) + bias) with numpy MatMul semantics
 * (1-D operands promoted, batch dims broadcast), Gemm's trans_a / trans_b on the last two dims,
 * an optional LayerNorm prologue over A's last dim (inputs 3 and 4, attr ln_epsilon) and a
 * 1-D bias [N] (input 2).
 *
 * Invariant: A is read one row at a time into a row buffer (normalised there when the prologue
 * is on: never a normalised copy of A); each output row is computed in i-k-j order (a double
 * accumulator per column, B walked along its rows; a trans_b B is transposed once per distinct
 * matrix into scratch), finished by the epilogue and stored once. Every index is derived from
 * shapes checked before the loops run. */
#include "kernels/simd/cpu.h"
#include "kernels/ref/fused.h"
#include "kernels/fast/gemm.h"

#include <stdlib.h>

/* Inputs and geometry of one FusedMatMul. Batch dims are the output's leading `nb` dims; A and
 * B batch strides are 0 along broadcast dims. A is [.., M, K] (or [.., K, M] with trans_a),
 * B [.., K, N] (or [.., N, K] with trans_b); 1-D operands have no M or N dim. */
typedef struct fk_mm {
    const af_tensor *a, *b, *bias, *lns, *lnb;
    bool ta, tb, a1, b1; /* trans flags; A or B 1-D */
    int64_t m, k, n;
    int nb;
    int64_t bdims[AF_MAX_RANK], astr[AF_MAX_RANK], bstr[AF_MAX_RANK];
    int rank; /* output rank */
    int64_t dims[AF_MAX_RANK];
    bool packed;  /* B was packed by the lower pass (gemm.h): `b` then points at bpk */
    af_gemm_type bt; /* the packed B's type: float32, half, bfloat16 (--precision_mode) */
    af_tensor bpk; /* the packed B seen as its logical [K, N] */
} fk_mm;

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

/* B packed at compile time: a 1-D tensor of exactly the packed size of b_shape = [K, N]
 * (trans_b already applied): float32, or half / bfloat16 for a node the precision pass lowered.
 * Afterwards g->b is the logical [K, N] view of those elements. */
static af_status mm_packed_b(const af_node *n, fk_mm *g, af_error *err) {
    const int64_t *shape = NULL;
    int64_t kn;
    if (af_attr_ints(n, "b_shape", &shape) != 2 || shape[0] < 0 || shape[1] < 0 ||
        !af_mul_i64(shape[0], shape[1], &kn) || kn > ((int64_t)1 << 40))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "b_packed needs b_shape = [K, N]");
    if (g->tb)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "a packed B is never transposed");
    const af_tensor *b = g->b;
    g->bt = b->dtype == AF_DTYPE_BFLOAT16 ? AF_GEMM_BF16
            : b->dtype == AF_DTYPE_FLOAT16 ? AF_GEMM_F16 : AF_GEMM_F32;
    int64_t want = (int64_t)(af_gemm_packed_bytes(g->bt, shape[0], shape[1]) /
                             (g->bt == AF_GEMM_F32 ? 4 : 2));
    if (b->rank != 1 || (b->dims[0] >= 0 && b->dims[0] != want))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "packed B must be 1-D with %lld elements for [%lld, %lld]",
                            (long long)want, (long long)shape[0], (long long)shape[1]);
    g->packed = true;
    g->bpk = *b;
    g->bpk.rank = 2;
    g->bpk.dims[0] = shape[0];
    g->bpk.dims[1] = shape[1];
    g->b = &g->bpk;
    return AF_OK;
}

/* Shapes, attributes and output type; works with unknown dims (then g->rank may be -1). */
static af_status mm_setup(const af_node *n, const af_tensor *const *in, fk_mm *g, af_error *err) {
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
    bool low_b = af_attr_int(n, "b_packed", 0) &&
                 (g->b->dtype == AF_DTYPE_BFLOAT16 || g->b->dtype == AF_DTYPE_FLOAT16);
    if (g->a->dtype != AF_DTYPE_FLOAT || (g->b->dtype != AF_DTYPE_FLOAT && !low_b))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FusedMatMul on %s (float32 only)",
                            af_dtype_name(g->a->dtype != AF_DTYPE_FLOAT ? g->a->dtype : g->b->dtype));
    if (g->lnb && !g->lns)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "ln_bias without ln_scale");
    g->ta = af_attr_int(n, "trans_a", 0) != 0;
    g->tb = af_attr_int(n, "trans_b", 0) != 0;
    if (af_attr_int(n, "b_packed", 0)) {
        af_status st = mm_packed_b(n, g, err);
        if (st != AF_OK)
            return st;
    }
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

af_status fk_shape_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    fk_mm g;
    af_status st = mm_setup(n, in, &g, err);
    if (st != AF_OK)
        return st;
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, g.rank, g.rank >= 0 ? g.dims : NULL);
    return af_epilogue_validate(n, in, &out[0], err);
}

/* Batch strides (in elements) of an operand with `nbo` batch dims over the output batch dims;
 * 0 along broadcast dims. `mat` is the size of one matrix. */
static void mm_batch_strides(const fk_mm *g, const af_tensor *t, int nbo, int64_t mat,
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

/* Row m of batch entry A (offset aoff) into row[0..K), LayerNorm applied when enabled. */
static void mm_load_row(const fk_mm *g, int64_t aoff, int64_t m, float eps, float *row) {
    const float *a = (const float *)g->a->data + aoff;
    for (int64_t kk = 0; kk < g->k; kk++)
        row[kk] = g->ta ? a[kk * g->m + m] : a[m * g->k + kk];
    if (!g->lns)
        return;
    double mean = 0.0, var = 0.0;
    for (int64_t kk = 0; kk < g->k; kk++)
        mean += row[kk];
    mean /= (double)g->k;
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
static const float *mm_b_rows(const fk_mm *g, int64_t boff, bool transpose, float *bt) {
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
static void mm_row(const fk_mm *g, const float *row, const float *b, const float *bias,
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


/* ---- the fast path: the GEMM core (gemm.h) ------------------------------------------------------ */

/* Where a fast FusedMatMul keeps its pieces while it runs. */
typedef struct mm_fast {
    const fk_mm *g;
    const af_vep *ep;
    const float *a;     /* A, or its normalised / transposed copy in scratch (same offsets) */
    float *bscratch;    /* per slot: one packed B, when B is not packed already */
    size_t bfloats;     /* floats of one packed B */
    float *y;
    int64_t nbatch;
} mm_fast;

/* Offsets of A and B for batch entry `step`. */
static void mm_offsets(const fk_mm *g, int64_t step, int64_t *aoff, int64_t *boff) {
    int64_t rest = step;
    *aoff = *boff = 0;
    for (int i = g->nb - 1; i >= 0; i--) {
        int64_t idx = rest % g->bdims[i];
        rest /= g->bdims[i];
        *aoff += idx * g->astr[i];
        *boff += idx * g->bstr[i];
    }
}

/* B of batch entry at boff as packed panels: the compile-time ones, or packed into dst now. */
static const float *mm_packed(const fk_mm *g, int64_t boff, float *dst) {
    const float *b = (const float *)g->b->data + boff;
    if (g->packed) return b;
    af_gemm_pack(b, g->k, g->n, g->tb ? 1 : g->n, g->tb ? g->k : 1, dst);
    return dst;
}

/* Batch entries [begin, end), each one GEMM on this thread. */
static void mm_entries(void *ctx, int slot, int64_t begin, int64_t end) {
    const mm_fast *f = ctx;
    const fk_mm *g = f->g;
    static const int64_t tap0[1] = {0};
    for (int64_t step = begin; step < end; step++) {
        int64_t aoff, boff;
        mm_offsets(g, step, &aoff, &boff);
        af_gemm gm = {f->a + aoff, 1, g->m, 0, g->k, tap0, 1, g->k,
                      mm_packed(g, boff, f->bscratch + (size_t)slot * f->bfloats), g->n,
                      f->y + step * g->m * g->n, g->n, f->ep, step * g->m, 0, AF_GEMM_F32,
                      NULL, NULL};
        af_gemm_run(NULL, &gm);
    }
}

/* LayerNorm (or the transpose of trans_a) of every A matrix into dst, in A's own layout. */
static void mm_prepare_a(const fk_mm *g, float eps, float *dst) {
    int64_t rows = nn_numel(g->a) / (g->k > 0 ? g->k : 1);
    const float *a = g->a->data;
    if (g->ta) { /* [.., K, M] -> [.., M, K] */
        for (int64_t r = 0; r < rows; r += g->m)
            for (int64_t i = 0; i < g->m; i++)
                for (int64_t kk = 0; kk < g->k; kk++)
                    dst[(r + i) * g->k + kk] = a[r * g->k + kk * g->m + i];
        return;
    }
    const af_vec_ops *v = af_vec();
    const float *bi = g->lnb ? g->lnb->data : NULL;
    for (int64_t r = 0; r < rows; r++)
        v->layernorm(a + r * g->k, dst + r * g->k, g->k, eps, g->lns->data, bi);
}

/* ---- half and bfloat16 (--precision_mode) --------------------------------------------------- */

/* A converted for a low-precision GEMM: row r of every batch entry (nbatch * M rows), through
 * the LayerNorm prologue when there is one, rounded to the GEMM's type: bfloat16 rows of
 * af_gemm_bf16_k(K) (zero padded, and 32 zero rows after the last for the AMX tiles), or
 * float32 rows holding half-precision values. Without prologue_fp32 the input is rounded
 * first, as if it had been stored in that type. */
typedef struct mm_low {
    const fk_mm *g;
    float eps;
    bool round_first;
    int64_t kp;
    uint16_t *a16;
    float *a32;  /* F16: the converted rows; BF16: per slot, one row of LayerNorm output */
} mm_low;

static void mm_round(af_gemm_type t, float *x, int64_t n, uint16_t *tmp16) {
    const af_vec_ops *v = af_vec();
    if (t == AF_GEMM_F16) {
        v->round_f16(x, x, n);
        return;
    }
    v->to_bf16(x, tmp16, n);
    for (int64_t i = 0; i < n; i++) x[i] = af_bf16_to_float(tmp16[i]);
}

static void mm_low_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    const mm_low *j = ctx;
    const fk_mm *g = j->g;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        int64_t aoff, boff;
        mm_offsets(g, r / g->m, &aoff, &boff);
        const float *a = (const float *)g->a->data + aoff + r % g->m * g->k;
        bool bf = g->bt == AF_GEMM_BF16;
        float *row = bf ? j->a32 + (size_t)slot * (size_t)g->k : j->a32 + r * g->k;
        uint16_t *out = bf ? j->a16 + r * j->kp : NULL;
        memcpy(row, a, (size_t)g->k * sizeof(float));
        if (g->lns) {
            if (j->round_first) mm_round(g->bt, row, g->k, out);
            v->layernorm(row, row, g->k, j->eps, g->lns->data, g->lnb ? g->lnb->data : NULL);
        }
        if (!bf) {
            v->round_f16(row, row, g->k);
            continue;
        }
        v->to_bf16(row, out, g->k);
        memset(out + g->k, 0, (size_t)(j->kp - g->k) * sizeof(uint16_t));
    }
}

static af_status mm_run_low(const af_node *n, const fk_mm *g, const af_vep *vep, float *y,
                            af_exec *ex, af_error *err) {
    int64_t nbatch = 1;
    for (int i = 0; i < g->nb; i++) nbatch *= g->bdims[i];
    int64_t rows = nbatch * g->m, slots = af_exec_threads(ex);
    bool bf = g->bt == AF_GEMM_BF16;
    mm_low j = {g, af_attr_float(n, "ln_epsilon", 1e-5f), !af_attr_int(n, "prologue_fp32", 0),
                bf ? af_gemm_bf16_k(g->k) : g->k, NULL, NULL};
    size_t a16 = bf ? (size_t)((rows + 32) * j.kp) * sizeof(uint16_t) : 0;
    size_t a32 = (size_t)((bf ? slots : rows) * g->k) * sizeof(float);
    size_t off = (a16 + 63) & ~(size_t)63;
    unsigned char *scratch = af_exec_scratch(ex, off + a32 + 64);
    if (!scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch",
                            off + a32 + 64);
    j.a16 = bf ? (uint16_t *)scratch : NULL;
    j.a32 = (float *)(scratch + off);
    if (bf) memset(j.a16 + rows * j.kp, 0, (size_t)(32 * j.kp) * sizeof(uint16_t));
    af_exec_parallel(rows * g->k < 16384 ? NULL : ex, rows, mm_low_rows, &j);
    static const int64_t tap0[1] = {0};
    af_gemm gm = {bf ? (const void *)j.a16 : (const void *)j.a32, 1, rows, 0, j.kp, tap0, 1, j.kp,
                  g->b->data, g->n, y, g->n, vep, 0, 0, g->bt, NULL, NULL};
    af_gemm_run(ex, &gm);
    return AF_OK;
}

/* Y = epilogue(alpha * op(LN(A)) x B + bias) on the GEMM core. */
static af_status mm_run_fast(const af_node *n, const fk_mm *g, const af_epilogue *ep, float *y,
                             af_exec *ex, af_error *err) {
    float alpha = af_attr_float(n, "alpha", 1.0f), eps = af_attr_float(n, "ln_epsilon", 1e-5f);
    af_vep vep;
    af_vep_build(ep, y, g->n, &vep);
    if (g->bias) af_vep_prepend(&vep, AF_EP_ADD, AF_VEP_COL, g->bias->data);
    if (alpha != 1.0f) af_vep_prepend(&vep, AF_EP_MUL, AF_VEP_SCALAR, &alpha);
    if (g->bt != AF_GEMM_F32) return mm_run_low(n, g, &vep, y, ex, err);
    mm_fast f = {g, &vep, g->a->data, NULL, 0, y, 1};
    for (int i = 0; i < g->nb; i++) f.nbatch *= g->bdims[i];
    bool shared_b = true, dense_a = true;
    for (int i = 0; i < g->nb; i++) shared_b = shared_b && g->bstr[i] == 0;
    for (int64_t i = g->nb - 1, want = g->m * g->k; i >= 0; want *= g->bdims[i], i--)
        dense_a = dense_a && (g->bdims[i] == 1 || g->astr[i] == want);
    bool copy_a = g->ta || g->lns;
    size_t afloats = copy_a ? (size_t)nn_numel(g->a) : 0;
    f.bfloats = g->packed ? 0 : af_gemm_packed_floats(g->k, g->n);
    int slots = shared_b ? 1 : af_exec_threads(ex);
    size_t bytes = (afloats + (size_t)slots * f.bfloats + 16) * sizeof(float);
    float *scratch = afloats || f.bfloats ? af_exec_scratch(ex, bytes) : NULL;
    if ((afloats || f.bfloats) && !scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    if (copy_a) {
        mm_prepare_a(g, eps, scratch);
        f.a = scratch;
    }
    f.bscratch = scratch + afloats;
    static const int64_t tap0[1] = {0};
    if (shared_b && (dense_a || f.nbatch == 1)) {
        /* One GEMM over every row of every batch entry: B (shared) is packed once. */
        af_gemm gm = {f.a, 1, f.nbatch * g->m, 0, g->k, tap0, 1, g->k, mm_packed(g, 0, f.bscratch),
                      g->n, y, g->n, &vep, 0, 0, AF_GEMM_F32, NULL, NULL};
        af_gemm_run(ex, &gm);
    } else if (shared_b) {
        const float *b = mm_packed(g, 0, f.bscratch);
        for (int64_t step = 0; step < f.nbatch; step++) {
            int64_t aoff, boff;
            mm_offsets(g, step, &aoff, &boff);
            af_gemm gm = {f.a + aoff, 1, g->m, 0, g->k, tap0, 1, g->k, b, g->n,
                          y + step * g->m * g->n, g->n, &vep, step * g->m, 0, AF_GEMM_F32,
                          NULL, NULL};
            af_gemm_run(ex, &gm);
        }
    } else {
        af_exec_parallel(ex, f.nbatch, mm_entries, &f);
    }
    return AF_OK;
}

af_status fk_kernel_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    fk_mm g;
    af_epilogue ep;
    af_status st = mm_setup(n, in, &g, err);
    if (st != AF_OK)
        return st;
    if (g.rank < 0 || !fk_has_data(g.a) || !fk_has_data(g.b) ||
        (g.bias && !fk_has_data(g.bias)) || (g.lns && !fk_has_data(g.lns)) ||
        (g.lnb && !fk_has_data(g.lnb)))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    st = nn_check_out(n, &out[0], g.rank, g.dims, err);
    if (st == AF_OK)
        st = af_epilogue_parse(n, in, &out[0], &ep, err);
    if (st != AF_OK)
        return st;
    if (g.lns && g.k == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "LayerNorm over an empty dim");
    float alpha = af_attr_float(n, "alpha", 1.0f), eps = af_attr_float(n, "ln_epsilon", 1e-5f);
    mm_batch_strides(&g, g.a, g.a1 ? 0 : g.a->rank - 2, g.m * g.k, g.astr);
    mm_batch_strides(&g, g.b, g.b1 ? 0 : g.b->rank - 2, g.k * g.n, g.bstr);
    /* Packed weights exist only for the fast path; otherwise it is the ISA's choice. */
    if (g.packed || af_isa_get() != AF_ISA_REFERENCE)
        return mm_run_fast(n, &g, &ep, out[0].data, ex, err);
    /* A transposed [N, K] B of one row or one column is already [K, N] in memory. */
    bool transpose = g.tb && g.n > 1 && g.k > 1;
    size_t kn = 0; /* B holds K*N elements per matrix, so this product fits */
    if (transpose && !af_mul_size((size_t)g.k, (size_t)g.n, &kn))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "B's size overflows");
    float *row = malloc((size_t)(g.k > 0 ? g.k : 1) * sizeof(float));
    double *acc = malloc((size_t)(g.n > 0 ? g.n : 1) * sizeof(double));
    float *bt = transpose ? malloc(kn * sizeof(float)) : NULL;
    if (!row || !acc || (transpose && !bt)) {
        free(row);
        free(acc);
        free(bt);
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
    free(row);
    free(acc);
    free(bt);
    return AF_OK;
}
