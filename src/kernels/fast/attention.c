/* FusedAttention on the GEMM core (the op is described in kernels/ref/attention.c, the
 * reference kernel). Per (batch, head) task, K^T and V are packed once into GEMM panels
 * (scratch of the task's thread); each query tile of up to HEAD_TQ rows then takes its scores
 * S = scale * Q K^T + mask (the scale and mask as epilogue steps) for every key, a softmax per
 * row, and O = P V written straight into the head's columns of the output. Key blocks of HEAD_TK
 * bound the score tile; with more keys than one block, the rows carry a running max and sum
 * (online softmax) and O is rescaled.
 *
 * Invariant: the geometry is attn_prepare's (the reference kernel's checks), so every head row
 * read or written is inside q, k, v and the output. */
#include "kernels/fast/fast.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/attention.h"

enum { HEAD_TQ = 56, HEAD_TK = 1024 };

typedef struct attn_job {
    const attn_geom *g;
    const attn_view *q, *k, *v;
    const attn_run *r; /* the masks */
    float *out;
    unsigned char *scratch;
    size_t per_slot; /* bytes of scratch per thread */
} attn_job;

/* n floats rounded up to whole cache lines. */
static int64_t pad_floats(int64_t n) {
    return (n + 15) / 16 * 16;
}

/* Scores a Where dropped take the fill value: rows [s0, s0 + tq) x keys [j0, j0 + tk) of sc. */
static void apply_keep(const attn_job *j, int64_t b, int64_t h, int64_t s0, int64_t tq,
                       int64_t j0, int64_t tk, float *sc, int64_t ld) {
    const int64_t *ks = j->r->kst;
    float fill = j->g->fill;
    for (int64_t i = 0; i < tq; i++) {
        const unsigned char *k = j->r->keep + b * ks[0] + h * ks[1] + (s0 + i) * ks[2] + j0 * ks[3];
        float *row = sc + i * ld;
        for (int64_t c = 0; c < tk; c++)
            if (!k[c * ks[3]]) row[c] = fill;
    }
}

/* Scores of query rows [s0, s0 + tq) against keys [j0, j0 + tk) into sc (tq rows of tk, ld
 * floats apart), with the scale and the mask applied; without the scale when `unscaled` (the
 * softmax applies it). */
static void scores(const attn_job *j, int64_t b, int64_t h, int64_t s0, int64_t tq,
                      int64_t j0, int64_t tk, const float *kt, float *sc, int64_t ld, bool unscaled) {
    const attn_geom *g = j->g;
    static const int64_t tap0[1] = {0};
    af_epilogue ep;
    memset(&ep, 0, sizeof ep);
    ep.rank = 2;
    ep.dims[0] = g->Sq;
    ep.dims[1] = tk;
    const int64_t *mst = j->r->mst;
    if (j->r->mask) {
        ep.nsteps = 1;
        ep.steps[0].op = AF_EP_ADD;
        ep.steps[0].operand = j->r->mask + b * mst[0] + h * mst[1] + j0 * mst[3];
        ep.steps[0].strides[0] = mst[2];
        ep.steps[0].strides[1] = mst[3];
    }
    af_vep v;
    af_vep_build(&ep, sc - s0 * tk, tk, &v); /* rows of the epilogue are query positions */
    float scale = g->scale;
    if (!unscaled) af_vep_prepend(&v, AF_EP_MUL, AF_VEP_SCALAR, &scale);
    af_gemm gm = {attn_row(j->q, b, s0, h), 1, tq, 0, j->q->ss,
                  tap0, 1, g->D, kt, tk, sc, ld, &v, s0, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
    af_gemm_run(NULL, &gm);
    if (j->r->keep) apply_keep(j, b, h, s0, tq, j0, tk, sc, ld);
}

static void run_head(const attn_job *j, int slot, int64_t b, int64_t h) {
    const attn_geom *g = j->g;
    const af_vec_ops *vo = af_vec();
    static const int64_t tap0[1] = {0};
    int64_t D = g->D, Sk = g->Sk, nblk = (Sk + HEAD_TK - 1) / HEAD_TK, tkmax = Sk < HEAD_TK ? Sk : HEAD_TK;
    unsigned char *s = j->scratch + (size_t)slot * j->per_slot;
    float *kt = (float *)s;                                /* every key block, packed */
    float *vp = kt + af_gemm_packed_floats(D, tkmax) * (size_t)nblk;
    float *sc = vp + af_gemm_packed_floats(tkmax, D) * (size_t)nblk; /* HEAD_TQ x pad_floats(tkmax) */
    float *o = sc + (size_t)HEAD_TQ * (size_t)pad_floats(tkmax); /* HEAD_TQ x D, online blocks */
    float *mx = o + (size_t)HEAD_TQ * (size_t)D, *sum = mx + HEAD_TQ;
    /* One key block and no mask: the softmax takes the scale (saving the scores a pass) and
     * leaves the rows unnormalised; P V multiplies each output row by 1 / its sum. */
    bool direct = nblk == 1 && !j->r->mask && !j->r->keep && g->scale > 0.0f;
    /* Score rows a whole number of cache lines apart when direct (the epilogue program, which
     * would index by the row length, is empty then): a row's masked last store spans into the
     * next row otherwise, and the next row's first load waits for it (softmax of 197 keys 19
     * -> 13.x TSC cycles per 16 floats). */
    int64_t ld = direct ? pad_floats(Sk) : Sk;
    af_vep inv;
    memset(&inv, 0, offsetof(af_vep, steps));
    inv.nsteps = 1;
    inv.cols = D;
    inv.steps[0] = (af_vep_step){AF_EP_MUL, AF_VEP_ROW, 0, 0.0f, 0.0f, sum};
    size_t ktb = af_gemm_packed_floats(D, tkmax), vpb = af_gemm_packed_floats(tkmax, D);
    for (int64_t kb = 0; kb < nblk; kb++) {
        int64_t j0 = kb * HEAD_TK, tk = Sk - j0 < HEAD_TK ? Sk - j0 : HEAD_TK;
        const float *k0 = attn_row(j->k, b, j0, h), *v0 = attn_row(j->v, b, j0, h);
        af_gemm_pack(k0, D, tk, 1, j->k->ss, kt + kb * ktb);
        af_gemm_pack(v0, tk, D, j->v->ss, 1, vp + kb * vpb);
    }
    int64_t ystep = g->layout[3] ? g->B * g->E : g->E;
    for (int64_t s0 = 0; s0 < g->Sq; s0 += HEAD_TQ) {
        int64_t tq = g->Sq - s0 < HEAD_TQ ? g->Sq - s0 : HEAD_TQ;
        int64_t r0 = g->layout[3] ? s0 * g->B + b : b * g->Sq + s0;
        float *y = j->out + r0 * g->E + h * D;
        if (nblk == 1) { /* all keys in one block: a plain softmax per row */
            scores(j, b, h, s0, tq, 0, Sk, kt, sc, ld, direct);
            for (int64_t i = 0; i < tq; i++) {
                if (direct) sum[i] = 1.0f / vo->softmax_exp(sc + i * ld, Sk, g->scale);
                else vo->softmax_row(sc + i * ld, Sk);
            }
            af_gemm gm = {sc, 1, tq, 0, ld, tap0, 1, Sk, vp, D, y, ystep, direct ? &inv : NULL, 0,
                          0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
            af_gemm_run(NULL, &gm);
            continue;
        }
        for (int64_t i = 0; i < tq; i++) {
            mx[i] = -INFINITY;
            sum[i] = 0.0f;
            memset(y + i * ystep, 0, sizeof(float) * (size_t)D);
        }
        for (int64_t kb = 0; kb < nblk; kb++) {
            int64_t j0 = kb * HEAD_TK, tk = Sk - j0 < HEAD_TK ? Sk - j0 : HEAD_TK;
            scores(j, b, h, s0, tq, j0, tk, kt + kb * ktb, sc, tk, false);
            for (int64_t i = 0; i < tq; i++) { /* running max and sum, block by block */
                float *row = sc + i * tk, bmax = -INFINITY;
                for (int64_t c = 0; c < tk; c++) bmax = row[c] > bmax ? row[c] : bmax;
                float nmax = bmax > mx[i] ? bmax : mx[i];
                float corr = nmax == -INFINITY ? 1.0f : expf(mx[i] - nmax);
                float bsum = 0.0f;
                for (int64_t c = 0; c < tk; c++) {
                    row[c] = nmax == -INFINITY ? 0.0f : expf(row[c] - nmax);
                    bsum += row[c];
                }
                sum[i] = sum[i] * corr + bsum;
                mx[i] = nmax;
                float *yi = y + i * ystep;
                for (int64_t d = 0; d < D; d++) yi[d] *= corr;
            }
            af_gemm gm = {sc, 1, tq, 0, tk, tap0, 1, tk, vp + kb * vpb, D, o, D, NULL, 0, 0,
                          AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
            af_gemm_run(NULL, &gm);
            for (int64_t i = 0; i < tq; i++)
                for (int64_t d = 0; d < D; d++) y[i * ystep + d] += o[i * D + d];
        }
        for (int64_t i = 0; i < tq; i++) {
            float inv = 1.0f / sum[i];
            for (int64_t d = 0; d < D; d++) y[i * ystep + d] *= inv;
        }
    }
}

static void run_heads(void *ctx, int slot, int64_t begin, int64_t end) {
    const attn_job *j = ctx;
    for (int64_t t = begin; t < end; t++) run_head(j, slot, t / j->g->H, t % j->g->H);
}

static af_status run_attention(const af_node *n, const attn_run *r, af_exec *x, af_error *err) {
    const attn_geom *g = &r->g;
    const attn_view *views = r->views;
    int64_t nblk = (g->Sk + HEAD_TK - 1) / HEAD_TK, tk = g->Sk < HEAD_TK ? g->Sk : HEAD_TK;
    size_t floats = (af_gemm_packed_floats(g->D, tk) + af_gemm_packed_floats(tk, g->D)) * (size_t)nblk +
                    (size_t)HEAD_TQ * (size_t)(pad_floats(tk) + g->D + 2) + 64;
    attn_job j = {g, &views[0], &views[1], &views[2], r, r->y, NULL,
                (floats * sizeof(float) + 63) & ~(size_t)63};
    int threads = af_exec_threads(x);
    j.scratch = af_exec_scratch(x, j.per_slot * (size_t)threads);
    if (!j.scratch)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for attention scratch");
    double ns = af_exec_work_ns(x, 4.0 * (double)(g->B * g->H * g->Sq * g->Sk * g->D), 0.0);
    af_exec_parallel(x, g->B * g->H, ns, run_heads, &j);
    return AF_OK;
}


af_status fast_attention(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x, af_error *err) {
    attn_run r;
    bool done;
    af_status st = attn_prepare(n, in, out, &r, &done, err);
    if (st || done) return st;
    return run_attention(n, &r, x, err);
}
