/* Reference kernels for matrix products and normalisations (ONNX opsets 7..17): Gemm, MatMul,
 * MatMulInteger, QLinearMatMul, BatchNormalization (inference), InstanceNormalization,
 * LayerNormalization, LpNormalization, LRN, MeanVarianceNormalization, Softmax, LogSoftmax,
 * Hardmax and Det; plus the helpers of nn_common.h.
 *
 * Invariant: floating-point work is done in double and rounded once on store, so results do not
 * depend on summation order to float precision; integer products accumulate in 64-bit
 * wrap-around arithmetic. Each matrix-product output element is written once, through mm_emit
 * (the per-element epilogue a fused kernel will replace). Shape functions and kernels share one
 * "setup" per op, so the kernel indexes only within what the checks allowed. */
#include "kernels/ref/epilogue.h"
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

/* ---- shared helpers -------------------------------------------------------------------------- */

bool nn_is_float(af_dtype t) {
    return t == AF_DTYPE_FLOAT || t == AF_DTYPE_DOUBLE || t == AF_DTYPE_FLOAT16 ||
           t == AF_DTYPE_BFLOAT16;
}

bool nn_is_int(af_dtype t) {
    switch (t) {
    case AF_DTYPE_INT8: case AF_DTYPE_UINT8: case AF_DTYPE_INT16: case AF_DTYPE_UINT16:
    case AF_DTYPE_INT32: case AF_DTYPE_UINT32: case AF_DTYPE_INT64: case AF_DTYPE_UINT64:
        return true;
    default:
        return false;
    }
}

int64_t nn_prod(const af_tensor *t, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++)
        if (t->dims[i] < 0 || !af_mul_i64(p, t->dims[i], &p))
            return -1;
    return p;
}

af_status nn_load(const af_node *n, const af_tensor *t, double **out, af_error *err) {
    *out = NULL;
    int64_t numel = af_tensor_numel(t);
    if (!af_tensor_has_data(t))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing or shorter than its shape");
    size_t bytes;
    if (!af_mul_size((size_t)(numel > 0 ? numel : 1), sizeof(double), &bytes) ||
        !(*out = af_malloc(bytes)))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < numel; i++)
        (*out)[i] = af_tensor_get_double(t, i);
    return AF_OK;
}

af_status nn_check_out(const af_node *n, const af_tensor *y, int rank, const int64_t *dims,
                       af_error *err) {
    bool same = y->rank == rank;
    for (int i = 0; same && i < rank; i++)
        same = y->dims[i] == dims[i] && dims[i] >= 0;
    if (!same || !af_tensor_has_data(y))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output not allocated as its shape says");
    return AF_OK;
}

/* Check that every given input holds data for its shape (inputs may be shorter in a bad model
 * only through an executor bug; kernels read them by index, so check anyway). */
static af_status nn_inputs_ready(const af_node *n, const af_tensor *const *in, af_error *err) {
    for (int i = 0; i < n->nin; i++) {
        const af_tensor *t = in[i];
        if (t && (!af_tensor_known(t) || !af_tensor_has_data(t)))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d has no data for its shape", i);
    }
    return AF_OK;
}

/* An output with the type of x (the common case of elementwise-shaped normalisations). */
static af_status nn_check_like(const af_node *n, const af_tensor *y, const af_tensor *x,
                               af_error *err) {
    return nn_check_out(n, y, x->rank, x->dims, err);
}

static af_status nn_missing(const af_node *n, const char *what, af_error *err) {
    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input %s", what);
}

/* ---- matrix products --------------------------------------------------------------------------- */

/* The geometry of a (batched, broadcast) matrix product Y[b] = A[b] x B[b] with A[b] [M, K] and
 * B[b] [K, N] stored contiguously; batch strides are 0 along broadcast dims. */
typedef struct mm_geom {
    int64_t m, k, n;
    int brank;
    int64_t bdims[AF_MAX_RANK];
    int64_t astride[AF_MAX_RANK], bstride[AF_MAX_RANK]; /* in matrices, not elements */
    bool a_vec, b_vec;                                   /* 1-D operands (numpy promotion) */
} mm_geom;

/* How a finished accumulator becomes Y[yi]: alpha * acc (+ beta * C[i, j]), then optionally
 * requantized as v * col_scale[j] + zero_point. */
typedef struct mm_epilogue {
    af_tensor *y;
    double alpha;
    const af_tensor *c; /* Gemm's C, read at i * c_rs + j * c_cs (0 strides broadcast) */
    int64_t c_rs, c_cs;
    double beta;
    const double *col_scale; /* [N] or NULL */
    double zero_point;
} mm_epilogue;

static inline void mm_emit(const mm_epilogue *e, int64_t yi, int64_t i, int64_t j, double acc) {
    double v = e->alpha * acc;
    if (e->c)
        v += e->beta * af_tensor_get_double(e->c, i * e->c_rs + j * e->c_cs);
    if (e->col_scale)
        v = v * e->col_scale[j] + e->zero_point;
    nn_put(e->y, yi, v);
}

/* Integer twin of mm_emit: exact wrap-around arithmetic unless alpha/beta scale the result. */
static inline void mm_emit_int(const mm_epilogue *e, int64_t yi, int64_t i, int64_t j,
                               uint64_t acc) {
    const af_tensor *c = e->c;
    int64_t ci = i * e->c_rs + j * e->c_cs;
    if (e->alpha == 1.0 && (!c || e->beta == 1.0))
        nn_puti(e->y, yi, acc + (c ? (uint64_t)nn_geti(c, ci) : 0));
    else
        nn_put(e->y, yi, e->alpha * (double)(int64_t)acc + (c ? e->beta * af_tensor_get_double(c, ci) : 0.0));
}

/* Merge one batch dim of A and B (either may be absent: 0 means "no dim here"). */
static bool mm_bcast(int64_t a, int64_t b, int64_t *out) {
    if (a == b || b == 1 || a == 1) { /* equal (symbols too), or one side broadcasts */
        *out = a == 1 ? b : a;
        return true;
    }
    if (a < 0 || b < 0) {
        int64_t known = a < 0 ? b : a;
        *out = (known > 1) ? known : -1;
        return true;
    }
    return false;
}

/* MatMul geometry with numpy semantics: 1-D A is [1, K] and 1-D B is [K, 1] (the added dim is
 * dropped from Y), batch dims broadcast. Unknown dims stay -1 (rank must be known). */
static af_status mm_setup(const af_node *n, const af_tensor *a, const af_tensor *b, mm_geom *g,
                          af_error *err) {
    memset(g, 0, sizeof(*g));
    if (a->rank < 1 || b->rank < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "MatMul operands must have rank >= 1");
    g->a_vec = a->rank == 1;
    g->b_vec = b->rank == 1;
    g->m = g->a_vec ? 1 : a->dims[a->rank - 2];
    int64_t ka = a->dims[a->rank - 1];
    int64_t kb = g->b_vec ? b->dims[0] : b->dims[b->rank - 2];
    g->n = g->b_vec ? 1 : b->dims[b->rank - 1];
    if (ka >= 0 && kb >= 0 && ka != kb)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "inner dims differ: %lld vs %lld",
                            (long long)ka, (long long)kb);
    g->k = ka >= 0 ? ka : kb;
    int abr = g->a_vec ? 0 : a->rank - 2, bbr = g->b_vec ? 0 : b->rank - 2;
    g->brank = abr > bbr ? abr : bbr;
    /* Batch strides: matrices per step of each batch dim, right-aligned. */
    int64_t as = 1, bs = 1;
    for (int i = g->brank - 1; i >= 0; i--) {
        int ai = i - (g->brank - abr), bi = i - (g->brank - bbr);
        int64_t ad = ai >= 0 ? a->dims[ai] : 1, bd = bi >= 0 ? b->dims[bi] : 1;
        if (!mm_bcast(ad, bd, &g->bdims[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "batch dims %lld and %lld do not broadcast", (long long)ad,
                                (long long)bd);
        g->astride[i] = ad == 1 ? 0 : as;
        g->bstride[i] = bd == 1 ? 0 : bs;
        if (ad > 0 && !af_mul_i64(as, ad, &as))
            as = 0;
        if (bd > 0 && !af_mul_i64(bs, bd, &bs))
            bs = 0;
    }
    return AF_OK;
}

static void mm_out_type(const mm_geom *g, af_dtype dt, af_tensor *y) {
    int64_t dims[AF_MAX_RANK];
    int r = 0;
    for (int i = 0; i < g->brank; i++)
        dims[r++] = g->bdims[i];
    if (!g->a_vec)
        dims[r++] = g->m;
    if (!g->b_vec)
        dims[r++] = g->n;
    af_tensor_set_type(y, dt, r, dims);
}

static af_status mm_out_check(const af_node *n, const mm_geom *g, const af_tensor *y,
                              af_error *err) {
    af_tensor t;
    mm_out_type(g, y->dtype, &t);
    return nn_check_out(n, y, t.rank, t.dims, err);
}

/* Number of batch steps and, for step s, the matrix offsets into A and B. */
static int64_t mm_batches(const mm_geom *g) {
    int64_t nb = 1;
    for (int i = 0; i < g->brank; i++)
        nb *= g->bdims[i]; /* Y exists, so the product fits */
    return nb;
}

static void mm_batch_offsets(const mm_geom *g, int64_t s, int64_t *ao, int64_t *bo) {
    *ao = *bo = 0;
    for (int i = g->brank - 1; i >= 0; i--) {
        int64_t idx = s % g->bdims[i];
        s /= g->bdims[i];
        *ao += idx * g->astride[i];
        *bo += idx * g->bstride[i];
    }
}

/* Y = A x B over doubles, row by row: the row accumulator keeps the inner loop contiguous. */
static void mm_core(const mm_geom *g, const double *a, const double *b, const mm_epilogue *e,
                    double *acc) {
    int64_t nb = mm_batches(g), mk = g->m * g->k, kn = g->k * g->n;
    for (int64_t s = 0; s < nb; s++) {
        int64_t ao, bo;
        mm_batch_offsets(g, s, &ao, &bo);
        const double *ap = a + ao * mk, *bp = b + bo * kn;
        for (int64_t i = 0; i < g->m; i++) {
            for (int64_t j = 0; j < g->n; j++)
                acc[j] = 0.0;
            for (int64_t kk = 0; kk < g->k; kk++) {
                double av = ap[i * g->k + kk];
                const double *brow = bp + kk * g->n;
                for (int64_t j = 0; j < g->n; j++)
                    acc[j] += av * brow[j];
            }
            for (int64_t j = 0; j < g->n; j++)
                mm_emit(e, (s * g->m + i) * g->n + j, i, j, acc[j]);
        }
    }
}

/* Integer twin of mm_core on int64 copies, in wrap-around unsigned arithmetic. */
static void mm_core_int(const mm_geom *g, const int64_t *a, const int64_t *b,
                        const mm_epilogue *e, uint64_t *acc) {
    int64_t nb = mm_batches(g), mk = g->m * g->k, kn = g->k * g->n;
    for (int64_t s = 0; s < nb; s++) {
        int64_t ao, bo;
        mm_batch_offsets(g, s, &ao, &bo);
        const int64_t *ap = a + ao * mk, *bp = b + bo * kn;
        for (int64_t i = 0; i < g->m; i++) {
            for (int64_t j = 0; j < g->n; j++)
                acc[j] = 0;
            for (int64_t kk = 0; kk < g->k; kk++) {
                uint64_t av = (uint64_t)ap[i * g->k + kk];
                const int64_t *brow = bp + kk * g->n;
                for (int64_t j = 0; j < g->n; j++)
                    acc[j] += av * (uint64_t)brow[j];
            }
            for (int64_t j = 0; j < g->n; j++)
                mm_emit_int(e, (s * g->m + i) * g->n + j, i, j, acc[j]);
        }
    }
}

/* A malloc'ed int64 copy of an integer tensor. */
static af_status nn_load_int(const af_node *n, const af_tensor *t, int64_t **out, af_error *err) {
    int64_t numel = af_tensor_numel(t);
    *out = NULL;
    if (!af_tensor_has_data(t))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing or shorter than its shape");
    *out = af_malloc((size_t)(numel > 0 ? numel : 1) * sizeof(int64_t));
    if (!*out)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < numel; i++)
        (*out)[i] = nn_geti(t, i);
    return AF_OK;
}

/* Run the double or the integer core (by A's dtype) on loaded A and B. */
static af_status mm_run(const af_node *n, const mm_geom *g, const af_tensor *a,
                        const af_tensor *b, const mm_epilogue *e, af_error *err) {
    af_status st;
    void *ad = NULL, *bd = NULL, *acc = NULL;
    if (nn_is_int(a->dtype)) {
        st = nn_load_int(n, a, (int64_t **)&ad, err);
        if (st == AF_OK)
            st = nn_load_int(n, b, (int64_t **)&bd, err);
    } else {
        st = nn_load(n, a, (double **)&ad, err);
        if (st == AF_OK)
            st = nn_load(n, b, (double **)&bd, err);
    }
    if (st == AF_OK && !(acc = af_malloc((size_t)(g->n > 0 ? g->n : 1) * sizeof(uint64_t))))
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    if (st == AF_OK) {
        if (nn_is_int(a->dtype))
            mm_core_int(g, ad, bd, e, acc);
        else
            mm_core(g, ad, bd, e, acc);
    }
    af_free(ad);
    af_free(bd);
    af_free(acc);
    return st;
}

/* Types of MatMul and Gemm: floats and the 32/64-bit integers. */
static bool mm_type_ok(af_dtype t) {
    return nn_is_float(t) || t == AF_DTYPE_INT32 || t == AF_DTYPE_INT64 ||
           t == AF_DTYPE_UINT32 || t == AF_DTYPE_UINT64;
}

static af_status matmul_prepare(const af_node *n, const af_tensor *const *in,
                                const af_tensor **a, const af_tensor **b, mm_geom *g,
                                af_error *err) {
    *a = nn_in(n, in, 0);
    *b = nn_in(n, in, 1);
    if (!*a || !*b)
        return nn_missing(n, "A or B", err);
    if (!mm_type_ok((*a)->dtype) || (*b)->dtype != (*a)->dtype)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "MatMul on %s x %s",
                            af_dtype_name((*a)->dtype), af_dtype_name((*b)->dtype));
    if ((*a)->rank < 0 || (*b)->rank < 0) {
        g->brank = -1;
        return AF_OK;
    }
    return mm_setup(n, *a, *b, g, err);
}

af_status shape_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *a, *b;
    mm_geom g;
    af_status st = matmul_prepare(n, in, &a, &b, &g, err);
    if (st != AF_OK)
        return st;
    if (g.brank < 0)
        af_tensor_set_type(&out[0], a->dtype, -1, NULL);
    else
        mm_out_type(&g, a->dtype, &out[0]);
    return AF_OK;
}

af_status ref_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *a, *b;
    mm_geom g;
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK)
        st = matmul_prepare(n, in, &a, &b, &g, err);
    if (st == AF_OK)
        st = mm_out_check(n, &g, &out[0], err);
    if (st != AF_OK)
        return st;
    mm_epilogue e = {.y = &out[0], .alpha = 1.0};
    return mm_run(n, &g, a, b, &e, err);
}

/* ---- Gemm -------------------------------------------------------------------------------------- */

/* Gemm: Y = alpha * A' x B' + beta * C, A' = transA ? A^T : A, C broadcast to [M, N]. */
static af_status gemm_prepare(const af_node *n, const af_tensor *const *in, const af_tensor **a,
                              const af_tensor **b, const af_tensor **c, mm_geom *g,
                              af_error *err) {
    memset(g, 0, sizeof(*g));
    *a = nn_in(n, in, 0);
    *b = nn_in(n, in, 1);
    *c = nn_in(n, in, 2);
    if (!*a || !*b)
        return nn_missing(n, "A or B", err);
    af_dtype dt = (*a)->dtype;
    if (!mm_type_ok(dt) || (*b)->dtype != dt || (*c && (*c)->dtype != dt))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "Gemm on %s", af_dtype_name(dt));
    if ((*a)->rank >= 0 && (*a)->rank != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "A must be 2-D");
    if ((*b)->rank >= 0 && (*b)->rank != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "B must be 2-D");
    bool ta = af_attr_int(n, "transA", 0) != 0, tb = af_attr_int(n, "transB", 0) != 0;
    int64_t ka = -1, kb = -1;
    g->m = g->n = -1;
    if ((*a)->rank == 2) {
        g->m = (*a)->dims[ta ? 1 : 0];
        ka = (*a)->dims[ta ? 0 : 1];
    }
    if ((*b)->rank == 2) {
        kb = (*b)->dims[tb ? 1 : 0];
        g->n = (*b)->dims[tb ? 0 : 1];
    }
    if (ka >= 0 && kb >= 0 && ka != kb)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "inner dims differ: %lld vs %lld",
                            (long long)ka, (long long)kb);
    g->k = ka >= 0 ? ka : kb;
    const af_tensor *ct = *c;
    if (ct && ct->rank >= 0) {
        if (ct->rank > 2)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "C has rank %d", ct->rank);
        int64_t want[2] = {g->m, g->n};
        for (int i = 0; i < ct->rank; i++) {
            int64_t d = ct->dims[i], w = want[2 - ct->rank + i];
            if (d >= 0 && w >= 0 && d != 1 && d != w)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "C dim %lld does not broadcast to %lld", (long long)d,
                                    (long long)w);
        }
    }
    return AF_OK;
}

af_status shape_gemm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    const af_tensor *a, *b, *c;
    mm_geom g;
    af_status st = gemm_prepare(n, in, &a, &b, &c, &g, err);
    if (st != AF_OK)
        return st;
    int64_t dims[2] = {g.m, g.n};
    af_tensor_set_type(&out[0], a->dtype, 2, dims);
    return AF_OK;
}

/* A copy of the 2-D tensor t, transposed when `trans`, so the core always sees row-major
 * [rows, cols]. Same dtype as t (so the core's dtype dispatch still applies). */
static af_status gemm_operand(const af_tensor *t, bool trans, af_tensor *dst, af_error *err) {
    memset(dst, 0, sizeof(*dst));
    int64_t r = t->dims[0], c = t->dims[1];
    int64_t dims[2] = {trans ? c : r, trans ? r : c};
    af_tensor_set_type(dst, t->dtype, 2, dims);
    af_status st = af_tensor_alloc(dst, err);
    if (st != AF_OK)
        return st;
    size_t es = af_dtype_size(t->dtype);
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) {
            int64_t to = trans ? j * r + i : i * c + j;
            memcpy((char *)dst->data + to * es, (const char *)t->data + (i * c + j) * es, es);
        }
    return AF_OK;
}

af_status ref_gemm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *a, *b, *c;
    mm_geom g;
    af_tensor at, bt;
    memset(&at, 0, sizeof(at));
    memset(&bt, 0, sizeof(bt));
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK)
        st = gemm_prepare(n, in, &a, &b, &c, &g, err);
    if (st != AF_OK)
        return st;
    int64_t dims[2] = {g.m, g.n};
    if ((st = nn_check_out(n, &out[0], 2, dims, err)) != AF_OK)
        return st;
    bool ta = af_attr_int(n, "transA", 0) != 0, tb = af_attr_int(n, "transB", 0) != 0;
    mm_epilogue e = {.y = &out[0], .alpha = af_attr_float(n, "alpha", 1.0f)};
    if (c) {
        /* Unidirectional broadcast of C (rank 0..2) onto [M, N] through zero strides. */
        int64_t cr = c->rank == 2 ? c->dims[0] : 1, cc = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        e.c = c;
        e.beta = af_attr_float(n, "beta", 1.0f);
        e.c_rs = cr == 1 ? 0 : cc;
        e.c_cs = cc == 1 ? 0 : 1;
    }
    st = gemm_operand(a, ta, &at, err);
    if (st == AF_OK)
        st = gemm_operand(b, tb, &bt, err);
    if (st == AF_OK)
        st = mm_run(n, &g, &at, &bt, &e, err);
    af_tensor_release(&at);
    af_tensor_release(&bt);
    return st;
}

/* ---- MatMulInteger and QLinearMatMul ------------------------------------------------------------ */

static bool is_q8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

/* A per-row (A) or per-column (B) zero point or scale as a vector of `count`, from an optional
 * scalar or 1-D tensor. */
static af_status q_vec(const af_node *n, const af_tensor *t, int64_t count, double dflt,
                       const char *what, double **out, af_error *err) {
    *out = af_malloc((size_t)(count > 0 ? count : 1) * sizeof(double));
    if (!*out)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    int64_t tn = t ? af_tensor_numel(t) : 1;
    if (t && ((tn != 1 && tn != count) || t->rank > 1))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "%s must be a scalar or have %lld elements", what, (long long)count);
    for (int64_t i = 0; i < count; i++)
        (*out)[i] = t ? af_tensor_get_double(t, tn == 1 ? 0 : i) : dflt;
    return AF_OK;
}

/* A float copy of A minus its zero point per row (zp has `rows` values, rows of `inner`
 * elements, repeating over batches), or B minus its zero point per column (zp has `inner`
 * values); stored as a DOUBLE tensor so mm_run takes the double core. */
static af_status q_shifted(const af_tensor *t, const double *zp, bool per_row, int64_t rows,
                           int64_t inner, af_tensor *dst, af_error *err) {
    memset(dst, 0, sizeof(*dst));
    af_tensor_set_type(dst, AF_DTYPE_DOUBLE, t->rank, t->dims);
    af_status st = af_tensor_alloc(dst, err);
    if (st != AF_OK)
        return st;
    int64_t total = af_tensor_numel(t);
    double *d = dst->data;
    for (int64_t i = 0; i < total; i++) {
        int64_t z = inner <= 0 || rows <= 0 ? 0 : per_row ? (i / inner) % rows : (i % inner);
        d[i] = af_tensor_get_double(t, i) - zp[z];
    }
    return AF_OK;
}

/* Shared by MatMulInteger (ai = 0, bi = 1) and QLinearMatMul (ai = 0, bi = 3). */
static af_status qmm_prepare(const af_node *n, const af_tensor *const *in, int bi,
                             const af_tensor **a, const af_tensor **b, mm_geom *g,
                             af_error *err) {
    *a = nn_in(n, in, 0);
    *b = nn_in(n, in, bi);
    if (!*a || !*b)
        return nn_missing(n, "A or B", err);
    if (!is_q8((*a)->dtype) || !is_q8((*b)->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s x %s", n->op_type,
                            af_dtype_name((*a)->dtype), af_dtype_name((*b)->dtype));
    if ((*a)->rank < 0 || (*b)->rank < 0) {
        memset(g, 0, sizeof(*g));
        g->brank = -1;
        return AF_OK;
    }
    return mm_setup(n, *a, *b, g, err);
}

static void qmm_out_type(const mm_geom *g, af_dtype dt, af_tensor *y) {
    if (g->brank < 0)
        af_tensor_set_type(y, dt, -1, NULL);
    else
        mm_out_type(g, dt, y);
}

af_status shape_matmul_integer(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    const af_tensor *a, *b;
    mm_geom g;
    af_status st = qmm_prepare(n, in, 1, &a, &b, &g, err);
    if (st == AF_OK)
        qmm_out_type(&g, AF_DTYPE_INT32, &out[0]);
    return st;
}

/* Run A' x B' where A' and B' are A and B minus zero points (per row of A, per column of B).
 * Exact in double: 8-bit products summed over K < 2^36 stay below 2^53. */
static af_status qmm_run(const af_node *n, const af_tensor *const *in, const mm_geom *g,
                         const af_tensor *a, const af_tensor *b, int azi, int bzi,
                         const mm_epilogue *e, af_error *err) {
    double *azp = NULL, *bzp = NULL;
    af_tensor as, bs;
    memset(&as, 0, sizeof(as));
    memset(&bs, 0, sizeof(bs));
    af_status st = q_vec(n, nn_in(n, in, azi), g->m, 0.0, "a_zero_point", &azp, err);
    if (st == AF_OK)
        st = q_vec(n, nn_in(n, in, bzi), g->n, 0.0, "b_zero_point", &bzp, err);
    if (st == AF_OK)
        st = q_shifted(a, azp, true, g->m, g->k, &as, err);
    if (st == AF_OK)
        st = q_shifted(b, bzp, false, 1, g->n, &bs, err);
    if (st == AF_OK)
        st = mm_run(n, g, &as, &bs, e, err);
    af_free(azp);
    af_free(bzp);
    af_tensor_release(&as);
    af_tensor_release(&bs);
    return st;
}

af_status ref_matmul_integer(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *a, *b;
    mm_geom g;
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK)
        st = qmm_prepare(n, in, 1, &a, &b, &g, err);
    if (st == AF_OK)
        st = mm_out_check(n, &g, &out[0], err);
    if (st != AF_OK)
        return st;
    mm_epilogue e = {.y = &out[0], .alpha = 1.0};
    return qmm_run(n, in, &g, a, b, 2, 3, &e, err);
}

/* QLinearMatMul inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
 * y_zero_point; the output type is y_zero_point's. */
af_status shape_qlinear_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    const af_tensor *a, *b, *yzp = nn_in(n, in, 7);
    mm_geom g;
    af_status st = qmm_prepare(n, in, 3, &a, &b, &g, err);
    if (st != AF_OK)
        return st;
    if (!nn_in(n, in, 1) || !nn_in(n, in, 4) || !nn_in(n, in, 6))
        return nn_missing(n, "scale", err);
    af_dtype yt = yzp ? yzp->dtype : a->dtype;
    if (!is_q8(yt))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output %s", af_dtype_name(yt));
    qmm_out_type(&g, yt, &out[0]);
    return AF_OK;
}

af_status ref_qlinear_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *a, *b;
    mm_geom g;
    double *as = NULL, *bs = NULL, *ys = NULL, *yzp = NULL;
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK)
        st = qmm_prepare(n, in, 3, &a, &b, &g, err);
    if (st == AF_OK)
        st = mm_out_check(n, &g, &out[0], err);
    if (st == AF_OK)
        st = q_vec(n, nn_in(n, in, 1), 1, 1.0, "a_scale", &as, err);
    if (st == AF_OK)
        st = q_vec(n, nn_in(n, in, 4), g.n, 1.0, "b_scale", &bs, err);
    if (st == AF_OK)
        st = q_vec(n, nn_in(n, in, 6), 1, 1.0, "y_scale", &ys, err);
    if (st == AF_OK)
        st = q_vec(n, nn_in(n, in, 7), 1, 0.0, "y_zero_point", &yzp, err);
    if (st == AF_OK && (ys[0] == 0.0 || !isfinite(ys[0])))
        st = af_node_fail(err, n, AF_ERR_RUNTIME, "y_scale must be finite and non-zero");
    if (st == AF_OK) {
        /* bs becomes the per-column requantization multiplier a_scale * b_scale / y_scale. */
        for (int64_t j = 0; j < g.n; j++)
            bs[j] = as[0] * bs[j] / ys[0];
        mm_epilogue e = {.y = &out[0], .alpha = 1.0, .col_scale = bs, .zero_point = yzp[0]};
        st = qmm_run(n, in, &g, a, b, 2, 5, &e, err);
    }
    af_free(as);
    af_free(bs);
    af_free(ys);
    af_free(yzp);
    return st;
}

/* ---- normalisations ---------------------------------------------------------------------------- */

/* Shape function of the ops whose output 0 has X's type (X = input 0, a float tensor). */
static af_status norm_shape_like_x(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   int min_rank, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return nn_missing(n, "X", err);
    if (!nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                            af_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank < min_rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < %d", x->rank, min_rank);
    af_tensor_type_copy(&out[0], x);
    return AF_OK;
}

/* Kernel entry common to those ops: inputs hold data and Y is X-shaped. */
static af_status norm_ready(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK && !nn_in(n, in, 0))
        st = nn_missing(n, "X", err);
    if (st == AF_OK)
        st = nn_check_like(n, &out[0], in[0], err);
    return st;
}

/* A per-channel parameter (scale, bias, mean, var): float, with `count` elements when known. */
static af_status norm_param(const af_node *n, const af_tensor *t, const char *what, int64_t count,
                            int64_t alt_count, af_error *err) {
    if (!t)
        return nn_missing(n, what, err);
    if (!nn_is_float(t->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is %s", what, af_dtype_name(t->dtype));
    int64_t tn = af_tensor_numel(t);
    if (tn >= 0 && count >= 0 && tn != count && tn != alt_count)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %lld elements, expected %lld",
                            what, (long long)tn, (long long)count);
    return AF_OK;
}

/* BatchNormalization in inference mode: Y = (X - mean) / sqrt(var + epsilon) * scale + B with
 * parameters per channel (dim 1), or per element of X's dims 1.. under opset < 9's spatial = 0. */
static af_status bn_prepare(const af_node *n, const af_tensor *const *in, af_error *err) {
    int64_t opset = af_graph_opset(n->graph);
    if (af_attr_int(n, "training_mode", 0) != 0 || (opset <= 6 && af_attr_int(n, "is_test", 0) == 0))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "training mode is not supported");
    for (int i = 1; i < n->nout; i++)
        if (n->out[i])
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                                "training outputs (running or saved statistics) are not supported");
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return nn_missing(n, "X", err);
    int64_t c = x->rank >= 2 ? x->dims[1] : -1, alt = x->rank >= 2 ? nn_prod(x, 1, x->rank) : -1;
    if (opset >= 9 || af_attr_int(n, "spatial", 1) != 0)
        alt = c;
    static const char *names[4] = {"scale", "B", "input_mean", "input_var"};
    for (int i = 0; i < 4; i++) {
        af_status st = norm_param(n, nn_in(n, in, 1 + i), names[i], c, alt, err);
        if (st != AF_OK)
            return st;
    }
    return AF_OK;
}

af_status shape_batchnorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    af_status st = bn_prepare(n, in, err);
    if (st == AF_OK)
        st = norm_shape_like_x(n, in, out, 2, err);
    /* Omitted training outputs get a [C] type: the executor allocates every slot. */
    int64_t c = st == AF_OK && in[0]->rank >= 2 ? in[0]->dims[1] : -1;
    for (int i = 1; st == AF_OK && i < n->nout; i++)
        af_tensor_set_type(&out[i], in[3]->dtype, 1, &c);
    return st;
}

af_status ref_batchnorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    (void)ex;
    af_status st = bn_prepare(n, in, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *scale = in[1], *bias = in[2], *mean = in[3], *var = in[4];
    if (x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < 2", x->rank);
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    int64_t c = x->dims[1], inner = nn_prod(x, 2, x->rank), total = af_tensor_numel(x);
    bool per_channel = af_tensor_numel(scale) == c;
    for (int64_t i = 0; i < total; i++) {
        int64_t p = per_channel ? (i / inner) % c : i % (c * inner);
        double v = (af_tensor_get_double(x, i) - af_tensor_get_double(mean, p)) / sqrt(af_tensor_get_double(var, p) + eps);
        nn_put(&out[0], i, v * af_tensor_get_double(scale, p) + af_tensor_get_double(bias, p));
    }
    return AF_OK;
}

/* Mean and variance (population) of `count` elements of x starting at `base`, `step` apart. */
static void norm_moments(const af_tensor *x, int64_t base, int64_t count, int64_t step,
                         double *mean, double *var) {
    double s = 0.0, q = 0.0;
    for (int64_t i = 0; i < count; i++)
        s += af_tensor_get_double(x, base + i * step);
    *mean = count > 0 ? s / (double)count : 0.0;
    for (int64_t i = 0; i < count; i++) {
        double d = af_tensor_get_double(x, base + i * step) - *mean;
        q += d * d;
    }
    *var = count > 0 ? q / (double)count : 0.0;
}

/* InstanceNormalization: each (n, c) plane normalised by its own mean and variance. */
static af_status in_prepare(const af_node *n, const af_tensor *const *in, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return nn_missing(n, "input", err);
    int64_t c = x->rank >= 2 ? x->dims[1] : -1;
    af_status st = norm_param(n, nn_in(n, in, 1), "scale", c, c, err);
    if (st == AF_OK)
        st = norm_param(n, nn_in(n, in, 2), "B", c, c, err);
    return st;
}

af_status shape_instancenorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    af_status st = in_prepare(n, in, err);
    if (st == AF_OK)
        st = norm_shape_like_x(n, in, out, 2, err);
    return st;
}

af_status ref_instancenorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    af_status st = in_prepare(n, in, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    if (x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < 2", x->rank);
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    int64_t c = x->dims[1], inner = nn_prod(x, 2, x->rank), planes = x->dims[0] * c;
    for (int64_t p = 0; p < planes; p++) {
        double mean, var;
        norm_moments(x, p * inner, inner, 1, &mean, &var);
        double k = af_tensor_get_double(in[1], p % c) / sqrt(var + eps), b = af_tensor_get_double(in[2], p % c);
        for (int64_t i = 0; i < inner; i++)
            nn_put(&out[0], p * inner + i, (af_tensor_get_double(x, p * inner + i) - mean) * k + b);
    }
    return AF_OK;
}

/* GroupNorm (ours, the canonical form of torch's GroupNorm export: Reshape to [N, G, -1],
 * InstanceNormalization with unit scale and zero bias, Reshape back, Mul gamma, Add beta):
 * X [N, C, ...] in num_groups groups of C / G channels, each normalised by its own mean and
 * variance, then scale[c] and B[c] per channel, then the epilogue program (activations the
 * fuser joined). ONNX's GroupNormalization is the same (canonicalize makes it a GroupNorm when
 * its scale and bias are constants), except that in opset 18 they hold one value per group:
 * opset 21 made them per channel, as torch's GroupNorm and ours have them. */
static bool gn_per_group(const af_node *n) {
    return n->op == AF_OP_GROUP_NORMALIZATION && af_graph_opset(n->graph) < 21;
}

static af_status gn_prepare(const af_node *n, const af_tensor *const *in, int64_t *groups,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    *groups = af_attr_int(n, "num_groups", 0);
    if (!x)
        return nn_missing(n, "input", err);
    if (x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s (float32 only)", n->op_type,
                            af_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank < 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < 3", x->rank);
    int64_t c = x->rank >= 2 ? x->dims[1] : -1;
    if (*groups < 1 || (c >= 0 && c % *groups != 0))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "num_groups %lld does not divide %lld channels",
                            (long long)*groups, (long long)c);
    int64_t per = gn_per_group(n) ? *groups : c;
    af_status st = norm_param(n, nn_in(n, in, 1), "scale", per, per, err);
    if (st == AF_OK)
        st = norm_param(n, nn_in(n, in, 2), "B", per, per, err);
    return st;
}

af_status shape_group_norm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    int64_t groups;
    af_status st = gn_prepare(n, in, &groups, err);
    if (st == AF_OK)
        st = norm_shape_like_x(n, in, out, 3, err);
    return st == AF_OK ? af_epilogue_validate(n, in, &out[0], err) : st;
}

af_status ref_group_norm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    (void)ex;
    int64_t groups = 1;
    af_epilogue ep;
    af_status st = gn_prepare(n, in, &groups, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st == AF_OK)
        st = af_epilogue_parse(n, in, &out[0], &ep, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    int64_t c = x->dims[1], cpg = c / groups, inner = nn_prod(x, 2, x->rank);
    int64_t count = cpg * inner, total = x->dims[0] * groups;
    float *y = out[0].data;
    for (int64_t g = 0; g < total; g++) {
        double mean, var;
        norm_moments(x, g * count, count, 1, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t i = 0; i < count; i++) {
            int64_t ch = gn_per_group(n) ? g % groups : g % groups * cpg + i / inner;
            double v = (af_tensor_get_double(x, g * count + i) - mean) * inv;
            y[g * count + i] = (float)(v * af_tensor_get_double(in[1], ch) + af_tensor_get_double(in[2], ch));
        }
        af_epilogue_apply_at(&ep, y, g * count, count);
    }
    return AF_OK;
}

/* LayerNormalization (opset 17): normalise over dims [axis, rank); Scale and B broadcast onto
 * those dims; optional outputs Mean and InvStdDev have shape dims[:axis] + 1s, of stash_type. */
typedef struct ln_geom {
    int axis;
    af_dtype stash;
} ln_geom;

/* Check that t broadcasts (right-aligned) onto dims [axis, rank) of x. */
static af_status ln_param(const af_node *n, const af_tensor *t, const char *what,
                          const af_tensor *x, int axis, af_error *err) {
    if (!nn_is_float(t->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is %s", what, af_dtype_name(t->dtype));
    if (t->rank < 0 || x->rank < 0)
        return AF_OK;
    if (t->rank > x->rank - axis)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has rank %d > %d", what, t->rank,
                            x->rank - axis);
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i], w = x->dims[x->rank - t->rank + i];
        if (d >= 0 && w >= 0 && d != 1 && d != w)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s dim %lld does not match %lld",
                                what, (long long)d, (long long)w);
    }
    return AF_OK;
}

static af_status ln_prepare(const af_node *n, const af_tensor *const *in, ln_geom *g,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *scale = nn_in(n, in, 1), *b = nn_in(n, in, 2);
    if (!x || !scale)
        return nn_missing(n, "X or Scale", err);
    switch (af_attr_int(n, "stash_type", 1)) {
    case AF_DTYPE_FLOAT: g->stash = AF_DTYPE_FLOAT; break;
    case AF_DTYPE_DOUBLE: g->stash = AF_DTYPE_DOUBLE; break;
    case AF_DTYPE_FLOAT16: g->stash = AF_DTYPE_FLOAT16; break;
    case AF_DTYPE_BFLOAT16: g->stash = AF_DTYPE_BFLOAT16; break;
    default: return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "stash_type not a float type");
    }
    g->axis = 0;
    if (x->rank < 0)
        return AF_OK;
    if (!af_axis(af_attr_int(n, "axis", -1), x->rank, &g->axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    af_status st = ln_param(n, scale, "Scale", x, g->axis, err);
    if (st == AF_OK && b)
        st = ln_param(n, b, "B", x, g->axis, err);
    return st;
}

af_status nn_layernorm_axis(const af_node *n, const af_tensor *const *in, int *axis,
                            af_error *err) {
    ln_geom g;
    af_status st = ln_prepare(n, in, &g, err);
    *axis = g.axis;
    return st;
}

static void ln_stat_type(const af_tensor *x, const ln_geom *g, af_tensor *t) {
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        dims[i] = i < g->axis ? x->dims[i] : 1;
    af_tensor_set_type(t, g->stash, x->rank, dims);
}

af_status shape_layernorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    ln_geom g;
    af_status st = ln_prepare(n, in, &g, err);
    if (st == AF_OK)
        st = norm_shape_like_x(n, in, out, 1, err);
    if (st != AF_OK)
        return st;
    /* Omitted outputs get their type too: the executor allocates every slot. */
    for (int i = 1; i < 3 && i < n->nout; i++) {
        if (in[0]->rank < 0)
            af_tensor_set_type(&out[i], g.stash, -1, NULL);
        else
            ln_stat_type(in[0], &g, &out[i]);
    }
    return AF_OK;
}

/* Offsets of a broadcast parameter for each of the `inner` normalised positions. */
static int64_t *ln_index(const af_tensor *t, const af_tensor *x, int axis, int64_t inner) {
    int64_t *idx = af_malloc((size_t)(inner > 0 ? inner : 1) * sizeof(int64_t));
    if (!idx)
        return NULL;
    int nd = x->rank - axis, off = nd - t->rank;
    for (int64_t p = 0; p < inner; p++) {
        int64_t rem = p, o = 0, stride = 1;
        for (int i = nd - 1; i >= 0; i--) {
            int64_t d = x->dims[axis + i], k = rem % d;
            rem /= d;
            if (i >= off) {
                int64_t td = t->dims[i - off];
                if (td != 1)
                    o += k * stride;
                stride *= td;
            }
        }
        idx[p] = o;
    }
    return idx;
}

af_status ref_layernorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    (void)ex;
    ln_geom g;
    af_status st = ln_prepare(n, in, &g, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *scale = in[1], *b = nn_in(n, in, 2);
    af_tensor *stat[2] = {nn_out(n, out, 1), nn_out(n, out, 2)};
    for (int i = 0; i < 2 && st == AF_OK; i++)
        if (stat[i]) {
            af_tensor t;
            ln_stat_type(x, &g, &t);
            st = nn_check_out(n, stat[i], t.rank, t.dims, err);
        }
    if (st != AF_OK)
        return st;
    int64_t outer = nn_prod(x, 0, g.axis), inner = nn_prod(x, g.axis, x->rank);
    int64_t *si = ln_index(scale, x, g.axis, inner), *bi = b ? ln_index(b, x, g.axis, inner) : NULL;
    if (!si || (b && !bi)) {
        af_free(si);
        af_free(bi);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    for (int64_t o = 0; o < outer; o++) {
        double mean, var;
        norm_moments(x, o * inner, inner, 1, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t p = 0; p < inner; p++) {
            double v = (af_tensor_get_double(x, o * inner + p) - mean) * inv * af_tensor_get_double(scale, si[p]);
            nn_put(&out[0], o * inner + p, b ? v + af_tensor_get_double(b, bi[p]) : v);
        }
        if (stat[0])
            nn_put(stat[0], o, mean);
        if (stat[1])
            nn_put(stat[1], o, inv);
    }
    af_free(si);
    af_free(bi);
    return AF_OK;
}

/* RMSNormalization (opset 23): y = x / sqrt(mean(x^2) + eps) * Scale over dims [axis, rank),
 * Scale broadcast onto those dims as LayerNormalization's is; no bias, one output. The
 * canonical form of T5's and LLaMA's RMSNorm (passes/canonicalize.c). */
static af_status rms_prepare(const af_node *n, const af_tensor *const *in, ln_geom *g,
                             af_error *err) {
    if (n->nin != 2 || n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "RMSNormalization takes X and Scale and has one output");
    return ln_prepare(n, in, g, err);
}

af_status shape_rmsnorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    ln_geom g;
    af_status st = rms_prepare(n, in, &g, err);
    return st == AF_OK ? norm_shape_like_x(n, in, out, 1, err) : st;
}

af_status ref_rmsnorm(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *ex,
                      af_error *err) {
    (void)ex;
    ln_geom g;
    af_status st = rms_prepare(n, in, &g, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *scale = in[1];
    int64_t outer = nn_prod(x, 0, g.axis), inner = nn_prod(x, g.axis, x->rank);
    int64_t *si = ln_index(scale, x, g.axis, inner);
    if (!si)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    double eps = af_attr_float(n, "epsilon", 1e-5f);
    for (int64_t o = 0; o < outer; o++) {
        double q = 0.0;
        for (int64_t p = 0; p < inner; p++) {
            double v = af_tensor_get_double(x, o * inner + p);
            q += v * v;
        }
        double inv = 1.0 / sqrt((inner > 0 ? q / (double)inner : 0.0) + eps);
        for (int64_t p = 0; p < inner; p++)
            nn_put(&out[0], o * inner + p,
                   af_tensor_get_double(x, o * inner + p) * inv * af_tensor_get_double(scale, si[p]));
    }
    af_free(si);
    return AF_OK;
}

/* Split x around one axis: outer x len x inner, the layout of every "along an axis" op. */
static void nn_split_axis(const af_tensor *x, int axis, int64_t *outer, int64_t *len,
                          int64_t *inner) {
    *outer = nn_prod(x, 0, axis);
    *len = x->dims[axis];
    *inner = nn_prod(x, axis + 1, x->rank);
}

/* LpNormalization: x / ||x||_p along axis (p = 1 or 2); a zero norm gives zeros. */
static af_status lpn_prepare(const af_node *n, const af_tensor *x, int *axis, af_error *err) {
    int64_t p = af_attr_int(n, "p", 2);
    if (p != 1 && p != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "p = %lld (1 or 2)", (long long)p);
    if (x->rank >= 0 && !af_axis(af_attr_int(n, "axis", -1), x->rank, axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    return AF_OK;
}

af_status shape_lpnorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    int axis;
    af_status st = norm_shape_like_x(n, in, out, 1, err);
    if (st == AF_OK)
        st = lpn_prepare(n, in[0], &axis, err);
    return st;
}

af_status ref_lpnorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    int axis;
    af_status st = norm_ready(n, in, out, err);
    if (st == AF_OK)
        st = lpn_prepare(n, in[0], &axis, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    int64_t outer, len, inner, p = af_attr_int(n, "p", 2);
    nn_split_axis(x, axis, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double norm = 0.0;
            for (int64_t l = 0; l < len; l++) {
                double v = af_tensor_get_double(x, base + l * inner);
                norm += p == 1 ? fabs(v) : v * v;
            }
            if (p == 2)
                norm = sqrt(norm);
            for (int64_t l = 0; l < len; l++)
                nn_put(&out[0], base + l * inner, norm == 0.0 ? 0.0 : af_tensor_get_double(x, base + l * inner) / norm);
        }
    return AF_OK;
}

/* LRN across channels: y = x / (bias + alpha / size * sum of x^2 over nearby channels)^beta. */
static af_status lrn_prepare(const af_node *n, af_error *err) {
    if (af_attr_int(n, "size", 0) < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "size must be >= 1");
    return AF_OK;
}

af_status shape_lrn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    af_status st = lrn_prepare(n, err);
    if (st == AF_OK)
        st = norm_shape_like_x(n, in, out, 2, err);
    return st;
}

af_status ref_lrn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    af_status st = lrn_prepare(n, err);
    if (st == AF_OK)
        st = norm_ready(n, in, out, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    if (x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input rank %d < 2", x->rank);
    int64_t size = af_attr_int(n, "size", 1);
    double alpha = af_attr_float(n, "alpha", 1e-4f), beta = af_attr_float(n, "beta", 0.75f);
    double bias = af_attr_float(n, "bias", 1.0f);
    int64_t outer, c, inner;
    nn_split_axis(x, 1, &outer, &c, &inner);
    /* The window [ch - floor((size-1)/2), ch + ceil((size-1)/2)], clipped to the channels. */
    int64_t before = (size - 1) / 2, after = size - 1 - before;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t lo = ch - before < 0 ? 0 : ch - before;
                int64_t hi = ch > c - 1 - after ? c - 1 : ch + after;
                double sq = 0.0;
                for (int64_t k = lo; k <= hi; k++) {
                    double v = af_tensor_get_double(x, (o * c + k) * inner + i);
                    sq += v * v;
                }
                int64_t at = (o * c + ch) * inner + i;
                nn_put(&out[0], at, af_tensor_get_double(x, at) / pow(bias + alpha / (double)size * sq, beta));
            }
    return AF_OK;
}

/* MeanVarianceNormalization: (x - mean) / (std + 1e-9) over `axes` (default 0, 2, 3), the
 * epsilon ONNX's function body adds. */
static af_status mvn_axes(const af_node *n, const af_tensor *x, bool *reduced, af_error *err) {
    static const int64_t dflt[3] = {0, 2, 3};
    const int64_t *axes = dflt;
    int na = af_attr_ints(n, "axes", &axes);
    if (na < 0) {
        axes = dflt;
        na = 3;
    }
    for (int i = 0; i < AF_MAX_RANK; i++)
        reduced[i] = false;
    for (int i = 0; i < na; i++) {
        int a;
        if (!af_axis(axes[i], x->rank, &a) || reduced[a])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad or repeated axis %lld",
                                (long long)axes[i]);
        reduced[a] = true;
    }
    return AF_OK;
}

af_status shape_mvn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    bool reduced[AF_MAX_RANK];
    af_status st = norm_shape_like_x(n, in, out, 0, err);
    if (st == AF_OK && in[0]->rank >= 0)
        st = mvn_axes(n, in[0], reduced, err);
    return st;
}

/* Group (index over the kept axes) of flat element i. */
static int64_t mvn_group(const af_tensor *x, const bool *reduced, int64_t i) {
    int64_t g = 0, stride = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        int64_t k = i % x->dims[d];
        i /= x->dims[d];
        if (!reduced[d]) {
            g += k * stride;
            stride *= x->dims[d];
        }
    }
    return g;
}

af_status ref_mvn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    bool reduced[AF_MAX_RANK];
    af_status st = norm_ready(n, in, out, err);
    if (st == AF_OK)
        st = mvn_axes(n, in[0], reduced, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    int64_t total = af_tensor_numel(x), groups = 1, count = 1;
    for (int d = 0; d < x->rank; d++) {
        if (reduced[d])
            count *= x->dims[d];
        else
            groups *= x->dims[d];
    }
    double *sum = af_calloc((size_t)(groups > 0 ? groups : 1), 2 * sizeof(double));
    if (!sum)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    double *sq = sum + (groups > 0 ? groups : 1);
    for (int64_t i = 0; i < total; i++)
        sum[mvn_group(x, reduced, i)] += af_tensor_get_double(x, i);
    for (int64_t g = 0; g < groups; g++)
        sum[g] /= (double)count;
    for (int64_t i = 0; i < total; i++) {
        int64_t g = mvn_group(x, reduced, i);
        double d = af_tensor_get_double(x, i) - sum[g];
        sq[g] += d * d;
    }
    for (int64_t i = 0; i < total; i++) {
        int64_t g = mvn_group(x, reduced, i);
        double sd = sqrt(sq[g] / (double)count);
        nn_put(&out[0], i, (af_tensor_get_double(x, i) - sum[g]) / (sd + 1e-9));
    }
    af_free(sum);
    return AF_OK;
}

/* ---- Softmax, LogSoftmax, Hardmax -------------------------------------------------------------- */

/* Before opset 13 these ops flatten X to 2-D at `axis` (default 1) and work on whole rows;
 * from 13 on they work along the one axis (default -1). Both are outer x len x inner. */
af_status nn_softmax_geom(const af_node *n, const af_tensor *x, int64_t *outer, int64_t *len,
                          int64_t *inner, af_error *err) {
    bool coerce = af_graph_opset(n->graph) < 13;
    int axis;
    if (!af_axis(af_attr_int(n, "axis", coerce ? 1 : -1), x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    if (coerce) {
        *outer = nn_prod(x, 0, axis);
        *len = nn_prod(x, axis, x->rank);
        *inner = 1;
    } else {
        nn_split_axis(x, axis, outer, len, inner);
    }
    return AF_OK;
}

af_status shape_softmax(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    af_status st = norm_shape_like_x(n, in, out, 0, err);
    if (st == AF_OK && in[0]->rank >= 0) {
        int64_t o, l, i;
        st = nn_softmax_geom(n, in[0], &o, &l, &i, err);
    }
    return st;
}

typedef enum smax_kind { SMAX_SOFT, SMAX_LOG, SMAX_HARD } smax_kind;

static af_status smax_run(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          smax_kind kind, af_exec *ex, af_error *err) {
    (void)ex;
    af_status st = norm_ready(n, in, out, err);
    int64_t outer, len, inner;
    if (st == AF_OK)
        st = nn_softmax_geom(n, in[0], &outer, &len, &inner, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i, arg = 0;
            double mx = -INFINITY, sum = 0.0;
            for (int64_t l = 0; l < len; l++) {
                double v = af_tensor_get_double(x, base + l * inner);
                if (v > mx || l == 0) {
                    mx = v;
                    arg = l;
                }
            }
            for (int64_t l = 0; kind != SMAX_HARD && l < len; l++)
                sum += exp(af_tensor_get_double(x, base + l * inner) - mx);
            for (int64_t l = 0; l < len; l++) {
                double v = af_tensor_get_double(x, base + l * inner) - mx, y;
                if (kind == SMAX_SOFT)
                    y = exp(v) / sum;
                else if (kind == SMAX_LOG)
                    y = v - log(sum);
                else
                    y = l == arg ? 1.0 : 0.0;
                nn_put(&out[0], base + l * inner, y);
            }
        }
    return AF_OK;
}

af_status ref_softmax(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    return smax_run(n, in, out, SMAX_SOFT, ex, err);
}

af_status ref_logsoftmax(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *ex, af_error *err) {
    return smax_run(n, in, out, SMAX_LOG, ex, err);
}

af_status ref_hardmax(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    return smax_run(n, in, out, SMAX_HARD, ex, err);
}

/* ---- Det --------------------------------------------------------------------------------------- */

/* Determinant of each [M, M] matrix of X [..., M, M] by Gaussian elimination with partial
 * pivoting, in double. */
static af_status det_prepare(const af_node *n, const af_tensor *x, af_error *err) {
    if (!x)
        return nn_missing(n, "X", err);
    if (!nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "Det on %s", af_dtype_name(x->dtype));
    if (x->rank >= 0 && (x->rank < 2 || (x->dims[x->rank - 1] >= 0 && x->dims[x->rank - 2] >= 0 &&
                                         x->dims[x->rank - 1] != x->dims[x->rank - 2])))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X must be [..., M, M]");
    return AF_OK;
}

af_status shape_det(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    af_status st = det_prepare(n, x, err);
    if (st == AF_OK)
        af_tensor_set_type(&out[0], x->dtype, x->rank < 0 ? -1 : x->rank - 2, x->dims);
    return st;
}

af_status ref_det(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = nn_in(n, in, 0);
    double *a = NULL;
    af_status st = nn_inputs_ready(n, in, err);
    if (st == AF_OK)
        st = det_prepare(n, x, err);
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], x->rank - 2, x->dims, err);
    if (st == AF_OK)
        st = nn_load(n, x, &a, err);
    if (st != AF_OK)
        return st;
    int64_t m = x->dims[x->rank - 1], count = af_tensor_numel(&out[0]);
    for (int64_t b = 0; b < count; b++) {
        double *mat = a + b * m * m, det = 1.0;
        for (int64_t col = 0; col < m && det != 0.0; col++) {
            int64_t piv = col;
            for (int64_t r = col + 1; r < m; r++)
                if (fabs(mat[r * m + col]) > fabs(mat[piv * m + col]))
                    piv = r;
            if (mat[piv * m + col] == 0.0) {
                det = 0.0;
                break;
            }
            if (piv != col) {
                for (int64_t k = 0; k < m; k++) {
                    double t = mat[col * m + k];
                    mat[col * m + k] = mat[piv * m + k];
                    mat[piv * m + k] = t;
                }
                det = -det;
            }
            det *= mat[col * m + col];
            for (int64_t r = col + 1; r < m; r++) {
                double f = mat[r * m + col] / mat[col * m + col];
                for (int64_t k = col; k < m; k++)
                    mat[r * m + k] -= f * mat[col * m + k];
            }
        }
        nn_put(&out[0], b, det);
    }
    af_free(a);
    return AF_OK;
}
