/* FusedElementwise and SqueezeExcite on the vector kernels (the ops and their reference
 * kernels are in kernels/ref/fused_misc.c). FusedElementwise runs its program through the vector
 * epilogue in cache-sized pieces; SqueezeExcite's two small FCs are vector products with the
 * activation vectorised, and channels-last X is pooled and scaled a row of channels at a time.
 *
 * Invariant: both kernels check their node with the reference side's prepare step before reading
 * anything. */
#include "kernels/fast/elementwise.h"
#include "kernels/fast/fast.h"
#include "kernels/ref/fused.h"

#include <string.h>

af_status fast_fused_elementwise(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    af_epilogue ep;
    af_status st = fused_elementwise_prepare(n, in, out, &ep, err);
    if (st != AF_OK) return st;
    const af_tensor *x = in[0];
    af_vep v;
    af_vep_build(&ep, out[0].data, x->rank > 0 ? x->dims[x->rank - 1] : 1, &v);
    fast_ep_run(ex, &v, x->data, out[0].data, af_tensor_numel(x));
    return AF_OK;
}

typedef struct se_fc_job {
    const float *w, *b, *s_in;
    int64_t nin;
    const se_act *a;
    float *s_out;
} se_fc_job;

/* Outputs [begin, end): the vector product, then bias and activation. */
static void se_fc_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const se_fc_job *j = ctx;
    const af_vec_ops *v = af_vec();
    float *y = j->s_out + begin;
    v->gemv(j->w + begin * j->nin, j->nin, j->s_in, end - begin, j->nin, y);
    if (j->b)
        for (int64_t o = begin; o < end; o++) j->s_out[o] += j->b[o];
    /* The activation vectorised (a scalar libm sigmoid per output was a fifth of EfficientNet's
     * squeeze-excite time): every non-custom epilogue activation has a vector form. */
    v->unary(j->a->op, j->a->p0, j->a->p1, y, y, end - begin);
}

/* s_out[o] = act(b[o] + sum_i w[o, i] * s_in[i]) for a 1x1 conv on a [1, nin, 1...] input.
 * The weights (up to megabytes in EfficientNet's last stages) are read once per image, so the
 * threads share the rows of large ones (af_exec_parallel keeps small ones on the caller). */
static void se_fc(const float *w, const float *b, const float *s_in, int64_t nin, int64_t nout,
                  const se_act *a, float *s_out, af_exec *ex) {
    se_fc_job j = {w, b, s_in, nin, a, s_out};
    af_exec_parallel(ex, nout, af_exec_work_ns(ex, 2.0 * (double)(nin * nout), 4.0 * (double)(nin * nout)),
                     se_fc_rows, &j);
}

typedef struct se_job {
    const float *x;
    float *y;
    const af_vep *v;
    int64_t c;
} se_job;

/* Rows [begin, end) of positions: y = x * scale (per channel). */
static void se_scale_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const se_job *j = ctx;
    if (j->y != j->x)
        af_copy(j->y + begin * j->c, j->x + begin * j->c, (size_t)((end - begin) * j->c) * sizeof(float));
    af_vec()->ep_tile(j->v, j->y + begin * j->c, j->c, begin, 0, end - begin, j->c);
}

/* Channels-last: X [N, positions, C]; the mean over positions is a sum of rows of C. With
 * gate_only, y receives the N x C gates instead of the scaled X. */
static void se_run_cl(const af_tensor *x, const af_tensor *w1, const af_tensor *b1,
                      const af_tensor *w2, const af_tensor *b2, const se_act *act,
                      const se_act *gate, int64_t c, int64_t cr, float *gap, float *mid,
                      float *scale, float *y, bool gate_only, bool pooled, af_exec *ex) {
    int64_t batch = x->dims[0], hw = c > 0 && batch > 0 ? af_tensor_numel(x) / (batch * c) : 0;
    const af_vec_ops *v = af_vec();
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = (const float *)x->data + b * hw * c;
        if (pooled) { /* X already holds the means (computed by the conv that made them) */
            af_copy(gap, xb, (size_t)c * sizeof(float));
        } else {
            if (hw > 0) v->reduce_rows(xb, hw, c, 0, gap);
            for (int64_t ch = 0; ch < c; ch++) gap[ch] = hw > 0 ? gap[ch] / (float)hw : 0.0f;
        }
        se_fc(w1->data, b1 ? b1->data : NULL, gap, c, cr, act, mid, ex);
        se_fc(w2->data, b2 ? b2->data : NULL, mid, cr, c, gate, gate_only ? y + b * c : scale, ex);
        if (gate_only) continue;
        af_vep vp;
        af_vep_build(NULL, y + b * hw * c, c, &vp);
        af_vep_prepend(&vp, AF_EP_MUL, AF_VEP_COL, scale);
        se_job j = {xb, y + b * hw * c, &vp, c};
        af_exec_parallel(ex, hw, af_exec_work_ns(ex, (double)(hw * c), 8.0 * (double)(hw * c)),
                         se_scale_rows, &j);
    }
}

af_status fast_squeeze_excite(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    fused_se s;
    af_status st = fused_se_prepare(n, in, out, &s, err);
    if (st != AF_OK)
        return st;
    if (!s.channels_last) return fused_se_run_nchw(n, &s, out[0].data, se_fc, ex, err);
    /* Three small vectors, from the run's scratch (nothing allocated per run). */
    size_t nc = (size_t)(s.c > 0 ? s.c : 1), nr = (size_t)(s.cr > 0 ? s.cr : 1);
    float *gap = af_exec_scratch(ex, (2 * nc + nr) * sizeof(float));
    if (!gap) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    se_run_cl(s.x, s.w1, s.b1, s.w2, s.b2, &s.act, &s.gate, s.c, s.cr, gap, gap + nc,
              gap + nc + nr, out[0].data, s.gate_only, s.pooled, ex);
    return AF_OK;
}
