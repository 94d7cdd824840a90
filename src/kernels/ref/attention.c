/* FusedAttention (domain ai.autofusion): multi-head scaled dot-product attention in one op, made
 * by MultiHeadAttentionFusionOp (src/fusion/rules/attention.c).
 *
 *   inputs  q, k, v (float32, rank 3; rank 4 when head-major), mask (optional, float32),
 *           keep (optional, bool: a Where's condition, GPT-2's causal mask)
 *   attrs   num_heads H, head_dim D, scale (float), fill (float: the score where keep is false),
 *           layout  INTS {q, k, v, out}: row order of each tensor, 0 = [B, S, ...] (batch-major),
 *                   1 = [S, B, ...] (sequence-major), 2 = [B, H, S, D] (head-major, q/k/v
 *                   only: past keys/values concatenated with the new ones, offset 0),
 *           offsets INTS {q, k, v}: column of the first head in the tensor's last dim (a packed
 *                   [.., 3*H*D] projection is read in place by all three),
 *           out_rank INT: 3 gives [B, Sq, H*D] or [Sq, B, H*D] (per layout), 2 gives [rows, H*D],
 *           heads_merged INT: the masks broadcast against [B*H, Sq, Sk] (scores of a 3-D
 *                   batched MatMul) instead of [B, H, Sq, Sk].
 *   x[b,h,s,j] = scale * q[b,s,h,:].k[b,j,h,:] + mask[b,h,s,j], then fill where !keep[b,h,s,j]
 *   out[b, s, h*D + d] = sum_j softmax_j(x[b,h,s,:]) v[b,j,h,d]
 *
 * Heads are read and written in place through (row, column) addressing: no transposes, no copies.
 * Invariant: the kernel never holds more than one TQ x TK block of scores; each query tile keeps a
 * running max and sum per row (online softmax) and rescales its TQ x D accumulator when the max
 * grows, so the [Sq, Sk] score matrix is never written anywhere. Every index the kernel forms is
 * checked against the tensors' dims first (attn_geom), so hostile attributes cannot read outside. */
#include "kernels/ref/attention.h"

enum { FA_TQ = 16, FA_TK = 64 }; /* query rows per tile, keys per score block */

/* Attributes, checked on their own (no input needed). */
static af_status attn_attrs(const af_node *n, attn_geom *g, af_error *err) {
    const int64_t *lay = NULL, *off = NULL;
    g->H = af_attr_int(n, "num_heads", 0);
    g->D = af_attr_int(n, "head_dim", 0);
    g->scale = af_attr_float(n, "scale", 1.0f);
    g->fill = af_attr_float(n, "fill", -INFINITY);
    g->out_rank = (int)af_attr_int(n, "out_rank", 3);
    int64_t merged = af_attr_int(n, "heads_merged", 0);
    if (g->H < 1 || g->D < 1 || !af_mul_i64(g->H, g->D, &g->E) || g->E > INT32_MAX)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "num_heads and head_dim must be >= 1");
    if (!isfinite(g->scale))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scale is not finite");
    if (isnan(g->fill) || g->fill == INFINITY)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "fill must be a number or -inf");
    if (g->out_rank != 2 && g->out_rank != 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "out_rank must be 2 or 3");
    if (merged != 0 && merged != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "heads_merged must be 0 or 1");
    g->heads_merged = merged == 1;
    if (af_attr_ints(n, "layout", &lay) != 4)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "layout needs 4 ints (q, k, v, out)");
    if (af_attr_ints(n, "offsets", &off) != 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "offsets needs 3 ints (q, k, v)");
    for (int i = 0; i < 4; i++) {
        if (lay[i] < 0 || lay[i] > (i < 3 ? 2 : 1))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "layout entries must be 0, 1 or (q, k, v) 2");
        g->layout[i] = (int)lay[i];
    }
    for (int i = 0; i < 3; i++) {
        if (off[i] < 0 || off[i] > INT32_MAX)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "offsets must be in [0, 2^31)");
        g->offsets[i] = off[i];
    }
    return AF_OK;
}

/* (batch, seq) of a q/k/v tensor with row order `order`; -1 where unknown. */
static void attn_rows(const af_tensor *t, int order, int64_t *b, int64_t *s) {
    *b = t->dims[order == 1 ? 1 : 0];
    *s = t->dims[order == 1 ? 0 : order == 2 ? 2 : 1];
}

/* Optional input i, or NULL. */
static const af_tensor *attn_opt(const af_node *n, const af_tensor *const *in, int i) {
    return n->nin > i ? in[i] : NULL;
}

/* Two dims that must agree: unknown (-1) agrees with anything; the known one wins. */
static bool attn_join(int64_t *have, int64_t d) {
    if (d < 0) return true;
    if (*have < 0) *have = d;
    return *have == d;
}

/* Attributes and input types: B, Sq, Sk (-1 when unknown at compile time). */
static af_status attn_geom_of(const af_node *n, const af_tensor *const *in, attn_geom *g,
                            af_error *err) {
    static const char *const names[3] = {"q", "k", "v"};
    af_status st = attn_attrs(n, g, err);
    if (st) return st;
    if (n->nin < 3 || n->nin > 5 || n->nout != 1 || !in[0] || !in[1] || !in[2])
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "takes q, k, v, [mask], [keep] and one output");
    g->B = g->Sq = g->Sk = -1;
    for (int i = 0; i < 3; i++) {
        const af_tensor *t = in[i];
        if (t->dtype != AF_DTYPE_FLOAT)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is %s, not float", names[i],
                                af_dtype_name(t->dtype));
        if (g->layout[i] == 2) { /* [B, H, S, D] */
            if (t->rank != 4 || g->offsets[i] != 0 || (t->dims[1] >= 0 && t->dims[1] != g->H) ||
                (t->dims[3] >= 0 && t->dims[3] != g->D))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "%s: head-major input must be [B, %lld, S, %lld], offset 0",
                                    names[i], (long long)g->H, (long long)g->D);
        } else if (t->rank != 3) {
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must have rank 3", names[i]);
        }
        int64_t b, s, w = t->dims[t->rank - 1], end;
        attn_rows(t, g->layout[i], &b, &s);
        if (g->layout[i] != 2 && w >= 0 && (!af_add_i64(g->offsets[i], g->E, &end) || end > w))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "%s: columns [%lld, +%lld) exceed its last dim %lld", names[i],
                                (long long)g->offsets[i], (long long)g->E, (long long)w);
        if (!attn_join(&g->B, b) || !attn_join(i == 0 ? &g->Sq : &g->Sk, s))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "%s: batch or sequence length disagrees with the other inputs",
                                names[i]);
    }
    return AF_OK;
}

/* Does a mask broadcast (unidirectionally, right-aligned) to the scores [B, H, Sq, Sk], or to
 * [B*H, Sq, Sk] with heads_merged? Dims only: also safe on compile-time types. */
static bool attn_mask_fits(const af_tensor *m, const attn_geom *g) {
    int64_t BH;
    if (!af_mul_i64(g->B, g->H, &BH)) return false;
    int64_t full[4] = {g->B, g->H, g->Sq, g->Sk}, merged[3] = {BH, g->Sq, g->Sk};
    const int64_t *target = g->heads_merged ? merged : full;
    int trank = g->heads_merged ? 3 : 4;
    if (m->rank > trank) return false;
    for (int i = 0; i < m->rank; i++) {
        int64_t d = m->dims[i], t = target[trank - m->rank + i];
        if (d != 1 && d != t) return false;
    }
    return true;
}

/* Element strides of the mask over (b, h, i, j), 0 along broadcast axes; the mask fits and
 * holds data (so its strides and b*H + h index stay within its element count). With
 * heads_merged its first axis indexes b*H + h. */
static void attn_mask_strides(const af_tensor *m, const attn_geom *g, int64_t st[4]) {
    int trank = g->heads_merged ? 3 : 4;
    int64_t ms[AF_MAX_RANK], ts[4] = {0, 0, 0, 0};
    af_strides(m, ms);
    for (int i = 0; i < m->rank; i++)
        if (m->dims[i] != 1) ts[trank - m->rank + i] = ms[i];
    if (g->heads_merged) {
        st[0] = ts[0] * g->H;
        st[1] = ts[0];
        st[2] = ts[1];
        st[3] = ts[2];
    } else {
        memcpy(st, ts, sizeof ts);
    }
}

/* Compile-time checks of mask (slot 3, float) or keep (slot 4, bool). */
static af_status attn_check_mask(const af_node *n, const af_tensor *m, const attn_geom *g,
                                 int slot, af_error *err) {
    const char *what = slot == 3 ? "mask" : "keep";
    af_dtype want = slot == 3 ? AF_DTYPE_FLOAT : AF_DTYPE_BOOL;
    if (!m) return AF_OK;
    if (m->dtype != want)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is %s, not %s", what,
                            af_dtype_name(m->dtype), af_dtype_name(want));
    if (m->rank < 0 || m->rank > (g->heads_merged ? 3 : 4))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s rank %d exceeds the scores'", what,
                            m->rank);
    bool known = g->B >= 0 && g->Sq >= 0 && g->Sk >= 0;
    for (int i = 0; known && i < m->rank; i++) known = m->dims[i] >= 0;
    if (known && !attn_mask_fits(m, g))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s does not broadcast to the scores",
                            what);
    return AF_OK;
}

af_status shape_attention(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    attn_geom g;
    af_status st = attn_geom_of(n, in, &g, err);
    if (st || (st = attn_check_mask(n, attn_opt(n, in, 3), &g, 3, err)) ||
        (st = attn_check_mask(n, attn_opt(n, in, 4), &g, 4, err)))
        return st;
    int64_t dims[3];
    if (g.out_rank == 3) {
        dims[g.layout[3] ? 1 : 0] = g.B;
        dims[g.layout[3] ? 0 : 1] = g.Sq;
        dims[2] = g.E;
    } else {
        dims[0] = -1;
        if (g.B >= 0 && g.Sq >= 0 && !af_mul_i64(g.B, g.Sq, &dims[0]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output rows overflow");
        dims[1] = g.E;
    }
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, g.out_rank, dims);
    return AF_OK;
}

/* One (batch, head, query tile of rows [s0, s0+tq)): online softmax over key blocks.
 * acc holds tq x D running (unnormalised) outputs; mx/sum the running row max and exp sum;
 * kt is D x FA_TK scratch for the key block, transposed so that the score loop runs along the
 * keys (contiguous, vectorisable) while each score still sums its D products in order. */
static void attn_tile(const attn_geom *g, const attn_view *q, const attn_view *k, const attn_view *v,
                    const attn_run *r, float *out, int64_t b, int64_t h,
                    int64_t s0, int64_t tq, float *acc, float *kt) {
    const float *mask = r->mask;
    const int64_t *mst = r->mst, *kst = r->kst;
    const int64_t D = g->D;
    float scores[FA_TQ][FA_TK], mx[FA_TQ], sum[FA_TQ];
    const float *qrow[FA_TQ];
    for (int64_t i = 0; i < tq; i++) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
        qrow[i] = attn_row(q, b, s0 + i, h);
        memset(acc + i * D, 0, sizeof(float) * (size_t)D);
    }
    for (int64_t j0 = 0; j0 < g->Sk; j0 += FA_TK) {
        int64_t tk = g->Sk - j0 < FA_TK ? g->Sk - j0 : FA_TK;
        for (int64_t j = 0; j < tk; j++) {
            const float *krow = attn_row(k, b, j0 + j, h);
            for (int64_t d = 0; d < D; d++) kt[d * FA_TK + j] = krow[d];
        }
        for (int64_t i = 0; i < tq; i++) {
            float *sc = scores[i];
            for (int64_t j = 0; j < tk; j++) sc[j] = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                float qd = qrow[i][d];
                const float *kd = kt + d * FA_TK;
                for (int64_t j = 0; j < tk; j++) sc[j] += qd * kd[j];
            }
            float bmax = -INFINITY;
            for (int64_t j = 0; j < tk; j++) {
                float x = sc[j] * g->scale;
                if (mask)
                    x += mask[b * mst[0] + h * mst[1] + (s0 + i) * mst[2] + (j0 + j) * mst[3]];
                if (r->keep &&
                    !r->keep[b * kst[0] + h * kst[1] + (s0 + i) * kst[2] + (j0 + j) * kst[3]])
                    x = g->fill;
                sc[j] = x;
                if (x > bmax) bmax = x;
            }
            /* A block of -inf (masked) scores adds nothing; skipping it keeps exp(-inf - -inf)
             * from turning the row into NaN before a later block brings a finite max. */
            float nmax = bmax > mx[i] ? bmax : mx[i];
            if (nmax == -INFINITY) continue;
            float corr = expf(mx[i] - nmax);
            float *a = acc + i * D;
            if (corr != 1.0f) {
                for (int64_t d = 0; d < D; d++) a[d] *= corr;
                sum[i] *= corr;
            }
            mx[i] = nmax;
            for (int64_t j = 0; j < tk; j++) {
                float p = expf(sc[j] - nmax);
                const float *vrow = attn_row(v, b, j0 + j, h);
                sum[i] += p;
                for (int64_t d = 0; d < D; d++) a[d] += p * vrow[d];
            }
        }
    }
    for (int64_t i = 0; i < tq; i++) {
        int64_t s = s0 + i, r = g->layout[3] ? s * g->B + b : b * g->Sq + s;
        float *y = out + r * g->E + h * D;
        /* A row whose scores are all -inf has sum 0: NaN, as the unfused Softmax gives. */
        float inv = 1.0f / sum[i];
        for (int64_t d = 0; d < D; d++) y[d] = acc[i * D + d] * inv;
    }
}



af_status attn_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out, attn_run *r,
                     bool *done, af_error *err) {
    attn_geom g;
    *done = false;
    af_status st = attn_geom_of(n, in, &g, err);
    if (st) return st;
    if (g.B < 0 || g.Sq < 0 || g.Sk < 0)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input dims unknown at run time");
    for (int i = 0; i < 3; i++)
        if (!in[i]->data && af_tensor_numel(in[i]) != 0)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d has no data", i);
    const af_tensor *ms[2] = {attn_opt(n, in, 3), attn_opt(n, in, 4)};
    int64_t st4[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    for (int i = 0; i < 2; i++) {
        const af_tensor *m = ms[i];
        if (!m) continue;
        if (m->dtype != (i ? AF_DTYPE_BOOL : AF_DTYPE_FLOAT) || !attn_mask_fits(m, &g))
            return af_node_fail(err, n, AF_ERR_RUNTIME,
                                "%s does not broadcast to the scores [%lld, %lld, %lld, %lld]",
                                i ? "keep" : "mask", (long long)g.B, (long long)g.H,
                                (long long)g.Sq, (long long)g.Sk);
        if (!m->data && af_tensor_numel(m) != 0)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "%s has no data", i ? "keep" : "mask");
        attn_mask_strides(m, &g, st4[i]);
    }
    af_tensor *y = &out[0];
    int64_t rows, total;
    if (!af_mul_i64(g.B, g.Sq, &rows) || !af_mul_i64(rows, g.E, &total) ||
        y->dtype != AF_DTYPE_FLOAT || af_tensor_numel(y) != total || (total > 0 && !y->data))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output not allocated as [%lld, %lld]",
                            (long long)rows, (long long)g.E);
    if (rows == 0 || g.Sk == 0) {
        /* No keys: softmax over an empty axis leaves nothing to average; the unfused graph's
         * MatMul over an empty inner dim gives zeros. */
        if (total > 0) memset(y->data, 0, (size_t)total * sizeof(float));
        *done = true;
        return AF_OK;
    }
    r->g = g;
    for (int i = 0; i < 3; i++) {
        attn_view *v = &r->views[i];
        int64_t S = i == 0 ? g.Sq : g.Sk;
        v->data = in[i]->data;
        v->width = in[i]->dims[in[i]->rank - 1];
        v->col = g.offsets[i];
        v->order = g.layout[i];
        /* Products of dims of tensors that hold data: no overflow. */
        v->sb = v->order == 0 ? S * v->width : v->order == 1 ? v->width : g.H * S * g.D;
        v->ss = v->order == 0 ? v->width : v->order == 1 ? g.B * v->width : g.D;
        v->sh = v->order == 2 ? S * g.D : g.D;
    }
    r->mask = ms[0] ? ms[0]->data : NULL;
    memcpy(r->mst, st4[0], sizeof r->mst);
    r->keep = ms[1] ? ms[1]->data : NULL;
    memcpy(r->kst, st4[1], sizeof r->kst);
    r->y = y->data;
    return AF_OK;
}

af_status ref_attention(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *x, af_error *err) {
    (void)x;
    attn_run r;
    bool done;
    af_status st = attn_prepare(n, in, out, &r, &done, err);
    if (st || done) return st;
    const attn_geom *g = &r.g;
    size_t accn, ktn;
    float *acc = NULL, *kt = NULL;
    if (!af_mul_size((size_t)FA_TQ, (size_t)g->D, &accn) ||
        !af_mul_size((size_t)FA_TK, (size_t)g->D, &ktn) ||
        !(acc = af_malloc(accn * sizeof(float))) || !(kt = af_malloc(ktn * sizeof(float)))) {
        af_free(acc);
        return af_node_fail(err, n, AF_ERR_NOMEM, "no memory for a %d x %lld tile", FA_TQ,
                            (long long)g->D);
    }
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t s0 = 0; s0 < g->Sq; s0 += FA_TQ) {
                int64_t tq = g->Sq - s0 < FA_TQ ? g->Sq - s0 : FA_TQ;
                attn_tile(g, &r.views[0], &r.views[1], &r.views[2], &r, r.y, b, h, s0, tq, acc,
                          kt);
            }
    af_free(kt);
    af_free(acc);
    return AF_OK;
}
