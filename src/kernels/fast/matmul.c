/* FusedMatMul on the GEMM core (gemm.h); the op and its reference kernel are in
 * kernels/ref/fused_matmul.c. B is packed into panels once (at compile time by the pack pass,
 * b_packed, else per call into scratch); A is read in place, or normalised / transposed once
 * into scratch when the LayerNorm prologue or trans_a asks for it; the epilogue (with the bias
 * and alpha in front) runs on each tile in registers. Half and bfloat16 B (--precision_mode)
 * take A converted once per call.
 *
 * Invariant: the shapes are fused_mm_prepare's (the reference checks) and a packed B's size is
 * checked against b_shape before any panel is read. */
#include "kernels/fast/fast.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/fused.h"

#include <stddef.h>
#include <string.h>

/* The GEMM element type of a B stored as dtype t (packed panels; int8: the int8 form's). */
static af_gemm_type gemm_type(af_dtype t) {
    return t == AF_DTYPE_BFLOAT16 ? AF_GEMM_BF16
           : t == AF_DTYPE_FLOAT16 ? AF_GEMM_F16
           : t == AF_DTYPE_INT8    ? AF_GEMM_U8S8
                                   : AF_GEMM_F32;
}

/* B packed at compile time: a 1-D tensor of exactly the packed size of b_shape = [K, N]
 * (trans_b already applied): float32, or half / bfloat16 for a node the precision pass lowered.
 * *view becomes the logical [K, N] view of those elements (in their own type), which the
 * reference setup checks like any B. */
static af_status packed_view(const af_node *n, const af_tensor *const *in, af_tensor *view,
                             af_error *err) {
    const int64_t *shape = NULL;
    int64_t kn;
    if (af_attr_ints(n, "b_shape", &shape) != 2 || shape[0] < 0 || shape[1] < 0 ||
        !af_mul_i64(shape[0], shape[1], &kn) || kn > ((int64_t)1 << 40))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "b_packed needs b_shape = [K, N]");
    if (af_attr_int(n, "trans_b", 0))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "a packed B is never transposed");
    const af_tensor *b = n->nin > 1 ? in[1] : NULL;
    if (!b)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input A or B");
    af_gemm_type bt = gemm_type(b->dtype);
    if (bt == AF_GEMM_U8S8 && !fused_quant_on(n))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "int8 packed B without quant = 1");
    int64_t want = (int64_t)(af_gemm_packed_bytes(bt, shape[0], shape[1]) /
                             (bt == AF_GEMM_F32 ? 4 : bt == AF_GEMM_U8S8 ? 1 : 2));
    if (b->rank != 1 || (b->dims[0] >= 0 && b->dims[0] != want))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "packed B must be 1-D with %lld elements for [%lld, %lld]",
                            (long long)want, (long long)shape[0], (long long)shape[1]);
    *view = *b;
    view->rank = 2;
    view->dims[0] = shape[0];
    view->dims[1] = shape[1];
    return AF_OK;
}

/* The logical view of input 1 when it is packed (b_packed), else NULL. */
static af_status b_view(const af_node *n, const af_tensor *const *in, af_tensor *view,
                        const af_tensor **out, af_error *err) {
    *out = NULL;
    if (!af_attr_int(n, "b_packed", 0)) return AF_OK;
    af_status st = packed_view(n, in, view, err);
    if (!st) *out = view;
    return st;
}

/* What a FusedMatMul knows before its data (fused_mm_decode's), prepared once per node
 * (af_kernel_prepare) or derived on the spot; `view` is a packed B's logical view. */
typedef struct mm_prep {
    fused_mm g;
    af_epilogue ep;
    af_tensor view;
    bool packed;
} mm_prep;

static af_status mm_decode(const af_node *n, const af_tensor *const *in, mm_prep *p,
                           af_error *err) {
    const af_tensor *bv;
    af_status st = b_view(n, in, &p->view, &bv, err);
    p->packed = bv != NULL;
    if (!st) st = fused_mm_decode(n, in, bv, &p->g, &p->ep, err);
    /* The int8 form with its B not packed for the int8 core: the reference runs it. */
    if (!st && p->g.quant.on && !p->packed) st = AF_DECLINED;
    return st;
}

void *fast_prepare_fused_matmul(const af_node *n, const af_tensor *const *types) {
    mm_prep *p = af_malloc(sizeof *p);
    if (p && mm_decode(n, types, p, NULL) != AF_OK) {
        af_free(p);
        p = NULL;
    }
    return p;
}

af_status fast_shape_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    af_tensor view;
    const af_tensor *bv;
    fused_mm g;
    af_status st = b_view(n, in, &view, &bv, err);
    if (!st) st = fused_mm_setup(n, in, bv, &g, err);
    if (st) return st;
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, g.rank, g.rank >= 0 ? g.dims : NULL);
    return af_epilogue_validate(n, in, &out[0], err);
}

/* Where a fast FusedMatMul keeps its pieces while it runs. */
typedef struct mm_fast {
    const fused_mm *g;
    const af_vep *ep;
    const float *a;     /* A, or its normalised / transposed copy in scratch (same offsets) */
    float *bscratch;    /* per slot: one packed B, when B is not packed already */
    size_t bfloats;     /* floats of one packed B */
    float *y;
    int64_t nbatch;
} mm_fast;

/* Offsets of A and B for batch entry `step`. */
static void mm_offsets(const fused_mm *g, int64_t step, int64_t *aoff, int64_t *boff) {
    int64_t rest = step;
    *aoff = *boff = 0;
    for (int i = g->nb - 1; i >= 0; i--) {
        int64_t idx = rest % g->bdims[i];
        rest /= g->bdims[i];
        *aoff += idx * g->astr[i];
        *boff += idx * g->bstr[i];
    }
}

/* Row r of A over every batch entry (rows of the batches laid end to end), as float32. */
static const float *mm_a_row(const fused_mm *g, int64_t r) {
    int64_t aoff, boff;
    mm_offsets(g, r / g->m, &aoff, &boff);
    return (const float *)g->a->data + aoff + r % g->m * g->k;
}

/* B of batch entry at boff as packed panels: the compile-time ones, or packed into dst now. */
static const float *mm_packed(const fused_mm *g, int64_t boff, float *dst) {
    const float *b = (const float *)g->b->data + boff;
    if (g->packed) return b;
    af_gemm_pack(b, g->k, g->n, g->tb ? 1 : g->n, g->tb ? g->k : 1, dst);
    return dst;
}

/* Batch entries [begin, end), each one GEMM on this thread. */
static void mm_entries(void *ctx, int slot, int64_t begin, int64_t end) {
    const mm_fast *f = ctx;
    const fused_mm *g = f->g;
    static const int64_t tap0[1] = {0};
    for (int64_t step = begin; step < end; step++) {
        int64_t aoff, boff;
        mm_offsets(g, step, &aoff, &boff);
        af_gemm gm = {f->a + aoff, 1, g->m, 0, g->k, tap0, 1, g->k,
                      mm_packed(g, boff, f->bscratch + (size_t)slot * f->bfloats), g->n,
                      f->y + step * g->m * g->n, g->n, f->ep, step * g->m, 0, AF_GEMM_F32,
                      NULL, NULL, 0, 0, 0, NULL, 0, 0};
        af_gemm_run(NULL, &gm);
    }
}

/* One row of the prologue, LayerNorm or RMSNorm (ln_rms); y may be x. */
static void mm_norm_row(const fused_mm *g, float eps, const float *x, float *y) {
    const af_vec_ops *v = af_vec();
    if (g->rms)
        v->rmsnorm(x, y, g->k, eps, g->lns->data);
    else
        v->layernorm(x, y, g->k, eps, g->lns->data, g->lnb ? g->lnb->data : NULL);
}

typedef struct mm_norm_job {
    const fused_mm *g;
    float eps;
    const float *a;
    float *dst;
} mm_norm_job;

static void mm_norm_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const mm_norm_job *j = ctx;
    int64_t k = j->g->k;
    for (int64_t r = begin; r < end; r++) mm_norm_row(j->g, j->eps, j->a + r * k, j->dst + r * k);
}

/* LayerNorm or RMSNorm (or the transpose of trans_a) of every A matrix into dst, in A's own
 * layout. The rows are normalised in parallel (each on its own, so the bits do not depend on
 * the split): done on the caller alone, a ConvNeXt block's prologue over 3136 rows of 96 left
 * the second thread idle. */
static void mm_prepare_a(const fused_mm *g, float eps, float *dst, af_exec *ex) {
    int64_t rows = af_tensor_numel(g->a) / (g->k > 0 ? g->k : 1);
    const float *a = g->a->data;
    if (g->ta) { /* [.., K, M] -> [.., M, K] */
        for (int64_t r = 0; r < rows; r += g->m)
            for (int64_t i = 0; i < g->m; i++)
                for (int64_t kk = 0; kk < g->k; kk++)
                    dst[(r + i) * g->k + kk] = a[r * g->k + kk * g->m + i];
        if (!g->lns) return;
        a = dst; /* a 1-D A with trans_a (the only one setup lets through): normalise in place */
    }
    mm_norm_job j = {g, eps, a, dst};
    double work = (double)rows * (double)g->k;
    af_exec_parallel(ex, rows, af_exec_work_ns(ex, 8.0 * work, 8.0 * work), mm_norm_rows, &j);
}

/* ---- half and bfloat16 (--precision_mode) --------------------------------------------------- */

/* A converted for a low-precision GEMM: row r of every batch entry (nbatch * M rows), through
 * the LayerNorm prologue when there is one, rounded to the GEMM's type: bfloat16 rows of
 * af_gemm_bf16_k(K) (zero padded, and 32 zero rows after the last for the AMX tiles), or
 * float32 rows holding half-precision values. Without prologue_fp32 the input is rounded
 * first, as if it had been stored in that type. */
typedef struct mm_low {
    const fused_mm *g;
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
    const fused_mm *g = j->g;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        const float *a = mm_a_row(g, r);
        bool bf = gemm_type(g->bdtype) == AF_GEMM_BF16;
        float *row = bf ? j->a32 + (size_t)slot * (size_t)g->k : j->a32 + r * g->k;
        uint16_t *out = bf ? j->a16 + r * j->kp : NULL;
        af_copy(row, a, (size_t)g->k * sizeof(float));
        if (g->lns) {
            if (j->round_first) mm_round(gemm_type(g->bdtype), row, g->k, out);
            mm_norm_row(g, j->eps, row, row);
        }
        if (!bf) {
            v->round_f16(row, row, g->k);
            continue;
        }
        v->to_bf16(row, out, g->k);
        memset(out + g->k, 0, (size_t)(j->kp - g->k) * sizeof(uint16_t));
    }
}

static af_status mm_run_low(const af_node *n, const fused_mm *g, const af_vep *vep, float *y,
                            af_exec *ex, af_error *err) {
    int64_t nbatch = 1;
    for (int i = 0; i < g->nb; i++) nbatch *= g->bdims[i];
    int64_t rows = nbatch * g->m, slots = af_exec_threads(ex);
    bool bf = gemm_type(g->bdtype) == AF_GEMM_BF16;
    mm_low j = {g, g->eps, !g->prologue_fp32,
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
    af_exec_parallel(ex, rows, af_exec_work_ns(ex, 0.0, 8.0 * (double)(rows * g->k)), mm_low_rows, &j);
    static const int64_t tap0[1] = {0};
    af_gemm gm = {bf ? (const void *)j.a16 : (const void *)j.a32, 1, rows, 0, j.kp, tap0, 1, j.kp,
                  g->b->data, g->n, y, g->n, vep, 0, 0, gemm_type(g->bdtype), NULL, NULL, 0, 0, 0, NULL, 0, 0};
    af_gemm_run(ex, &gm);
    return AF_OK;
}

/* ---- int8 (the int8 form on U8S8 panels) ------------------------------------------------------- */

/* A's rows (nbatch * M of them) as uint8 codes in rows of kp bytes (K rounded up to 4; the
 * padding bytes meet zero rows of B). */
typedef struct mm_u8 {
    const fused_mm *g;
    int64_t kp;
    uint8_t *a8;
} mm_u8;

static void mm_u8_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const mm_u8 *j = ctx;
    const fused_mm *g = j->g;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        const float *a = mm_a_row(g, r);
        uint8_t *out = j->a8 + r * j->kp;
        v->to_u8(a, out, g->k, g->quant.x_scale, g->quant.x_zero);
        memset(out + g->k, g->quant.x_zero, (size_t)(j->kp - g->k));
    }
}

/* The int8 form: A converted once, then one U8S8 GEMM over every row, scales s_x * w_scale[j]. */
static af_status mm_run_u8s8(const af_node *n, const fused_mm *g, const af_vep *vep, float *y,
                             af_exec *ex, af_error *err) {
    if (g->ta || g->lns || !g->packed || g->quant.nw_scale < 1 ||
        (g->quant.nw_scale != 1 && g->quant.nw_scale != g->n))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "int8 B needs a plain A and w_scale of 1 or N");
    int64_t nbatch = 1;
    for (int i = 0; i < g->nb; i++) nbatch *= g->bdims[i];
    int64_t rows = nbatch * g->m;
    mm_u8 j = {g, af_gemm_u8s8_k(g->k), NULL};
    size_t a8 = ((size_t)(rows * j.kp) + 63) & ~(size_t)63;
    unsigned char *scratch = af_exec_scratch(ex, a8 + (size_t)g->n * sizeof(float) + 64);
    if (!scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch",
                            a8 + (size_t)g->n * sizeof(float));
    j.a8 = scratch;
    float *scale = (float *)(scratch + a8);
    for (int64_t c = 0; c < g->n; c++)
        scale[c] = g->quant.x_scale * g->quant.w_scale[g->quant.nw_scale == 1 ? 0 : c];
    af_exec_parallel(ex, rows, af_exec_work_ns(ex, 0.0, 5.0 * (double)(rows * g->k)), mm_u8_rows, &j);
    static const int64_t tap0[1] = {0};
    af_gemm gm = {j.a8, 1, rows, 0, j.kp, tap0, 1, j.kp, g->b->data, g->n, y, g->n, vep, 0, 0,
                  AF_GEMM_U8S8, NULL, NULL, 0, 0, 0, scale, g->quant.x_zero,
                  af_attr_int(n, "w_7bit", 0) != 0};
    af_gemm_run(ex, &gm);
    return AF_OK;
}

/* Y = epilogue(alpha * op(LN(A)) x B + bias) on the GEMM core. */
static af_status mm_run_fast(const af_node *n, const fused_mm *g, const af_epilogue *ep, float *y,
                             af_exec *ex, af_error *err) {
    float alpha = g->alpha, eps = g->eps; /* alpha's address goes into the vector epilogue */
    af_vep vep;
    af_vep_build(ep, y, g->n, &vep);
    if (g->bias) af_vep_prepend(&vep, AF_EP_ADD, AF_VEP_COL, g->bias->data);
    if (alpha != 1.0f) af_vep_prepend(&vep, AF_EP_MUL, AF_VEP_SCALAR, &alpha);
    if (gemm_type(g->bdtype) == AF_GEMM_U8S8) return mm_run_u8s8(n, g, &vep, y, ex, err);
    if (gemm_type(g->bdtype) != AF_GEMM_F32) return mm_run_low(n, g, &vep, y, ex, err);
    mm_fast f = {g, &vep, g->a->data, NULL, 0, y, 1};
    for (int i = 0; i < g->nb; i++) f.nbatch *= g->bdims[i];
    bool shared_b = true, dense_a = true;
    for (int i = 0; i < g->nb; i++) shared_b = shared_b && g->bstr[i] == 0;
    for (int64_t i = g->nb - 1, want = g->m * g->k; i >= 0; want *= g->bdims[i], i--)
        dense_a = dense_a && (g->bdims[i] == 1 || g->astr[i] == want);
    bool copy_a = g->ta || g->lns;
    size_t afloats = copy_a ? (size_t)af_tensor_numel(g->a) : 0;
    f.bfloats = g->packed ? 0 : af_gemm_packed_floats(g->k, g->n);
    int slots = shared_b ? 1 : af_exec_threads(ex);
    size_t bytes = (afloats + (size_t)slots * f.bfloats + 16) * sizeof(float);
    float *scratch = afloats || f.bfloats ? af_exec_scratch(ex, bytes) : NULL;
    if ((afloats || f.bfloats) && !scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    if (copy_a) {
        mm_prepare_a(g, eps, scratch, ex);
        f.a = scratch;
    }
    f.bscratch = scratch + afloats;
    static const int64_t tap0[1] = {0};
    if (shared_b && (dense_a || f.nbatch == 1)) {
        /* One GEMM over every row of every batch entry: B (shared) is packed once. */
        af_gemm gm = {f.a, 1, f.nbatch * g->m, 0, g->k, tap0, 1, g->k, mm_packed(g, 0, f.bscratch),
                      g->n, y, g->n, &vep, 0, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
        af_gemm_run(ex, &gm);
    } else if (shared_b) {
        const float *b = mm_packed(g, 0, f.bscratch);
        for (int64_t step = 0; step < f.nbatch; step++) {
            int64_t aoff, boff;
            mm_offsets(g, step, &aoff, &boff);
            af_gemm gm = {f.a + aoff, 1, g->m, 0, g->k, tap0, 1, g->k, b, g->n,
                          y + step * g->m * g->n, g->n, &vep, step * g->m, 0, AF_GEMM_F32,
                          NULL, NULL, 0, 0, 0, NULL, 0, 0};
            af_gemm_run(ex, &gm);
        }
    } else {
        double flops = 2.0 * (double)f.nbatch * (double)g->m * (double)g->n * (double)g->k;
        af_exec_parallel(ex, f.nbatch, af_exec_work_ns(ex, flops, 0.0), mm_entries, &f);
    }
    return AF_OK;
}

af_status fast_fused_matmul(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    mm_prep p;
    af_status st = AF_OK;
    if (ex && ex->prepared) {
        const mm_prep *q = ex->prepared;
        p.g = q->g;
        p.view = q->view;
        p.packed = q->packed;
        memcpy(&p.ep, &q->ep, offsetof(af_epilogue, steps) + (size_t)q->ep.nsteps * sizeof(af_ep_step));
    } else {
        st = mm_decode(n, in, &p, err);
    }
    if (st) return st;
    if (p.packed) { /* the view of this run's B */
        p.view.data = in[1]->data;
        p.view.nbytes = in[1]->nbytes;
    }
    st = fused_mm_bind(n, &p.g, in, p.packed ? &p.view : NULL, out, &p.ep, err);
    return st ? st : mm_run_fast(n, &p.g, &p.ep, out[0].data, ex, err);
}
