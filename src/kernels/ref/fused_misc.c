/* The other fused ops: FusedElementwise (the epilogue program over X), ConvPoolFc (conv +
 * epilogue -> global average pool -> Gemm) and SqueezeExcite
 * (Y = X * gate(conv1x1_2(act(conv1x1_1(GAP(X)))))).
 *
 * Invariant: none of them materialises an intermediate of the output's size: FusedElementwise
 * works in place on Y one cache-sized run at a time, ConvPoolFc reduces each conv output row as
 * soon as it is computed, SqueezeExcite keeps only per-channel vectors. Values are rounded to
 * float where the unfused chain would store a float tensor, so both agree closely. */
#include "kernels/ref/epilogue.h"
#include "kernels/ref/fused.h"

#include <stdlib.h>

/* ---- FusedElementwise ------------------------------------------------------------------------ */

af_status shape_fused_elementwise(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                     af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x || n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "takes input X and one output");
    if (x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FusedElementwise on %s (float32 only)",
                            af_dtype_name(x->dtype));
    af_tensor_type_copy(&out[0], x);
    return af_epilogue_validate(n, in, &out[0], err);
}

af_status fused_elementwise_prepare(const af_node *n, const af_tensor *const *in,
                                       af_tensor *out, af_epilogue *ep, af_error *err) {
    af_tensor yt;
    af_status st = shape_fused_elementwise(n, in, &yt, err);
    const af_tensor *x = in[0];
    if (st == AF_OK && !af_tensor_has_data(x))
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], x->rank, x->dims, err);
    if (st == AF_OK)
        st = af_epilogue_parse(n, in, &out[0], ep, err);
    return st;
}

af_status ref_fused_elementwise(const af_node *n, const af_tensor *const *in,
                                      af_tensor *out, af_exec *ex, af_error *err) {
    (void)ex;
    af_epilogue ep;
    af_status st = fused_elementwise_prepare(n, in, out, &ep, err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0];
    /* Fixed-size runs (they may wrap across rows) stay in cache between the copy and the
     * epilogue, whatever the shape: short rows cost no per-row overhead. */
    enum { RUN = 4096 };
    int64_t total = af_tensor_numel(x);
    float *y = out[0].data;
    const float *xd = x->data;
    for (int64_t off = 0; off < total; off += RUN) {
        int64_t len = total - off < RUN ? total - off : RUN;
        /* The planner may run this in place (y == x): then the bytes are already there. */
        if (y != xd) memcpy(y + off, xd + off, (size_t)len * sizeof(float));
        af_epilogue_apply_at(&ep, y, off, len);
    }
    return AF_OK;
}

/* ---- ConvPoolFc ------------------------------------------------------------------------------ */

/* Inputs 3 (Wfc) and 4 (Bfc) and the FC geometry: pooled [N, M] x Wfc -> [N, classes]. */
typedef struct cpf_fc {
    const af_tensor *w, *b;
    bool tb;
    int64_t classes;
} cpf_fc;

/* Check the FC weights against M conv channels (unknown -1 passes); set the output type. */
static af_status cpf_fc_setup(const af_node *n, const af_tensor *const *in, const af_tensor *conv,
                              cpf_fc *fc, af_tensor *y, af_error *err) {
    fc->w = nn_in(n, in, 3);
    fc->b = nn_in(n, in, 4);
    fc->tb = af_attr_int(n, "fc_trans_b", 0) != 0;
    fc->classes = -1;
    if (!fc->w)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input Wfc");
    if (fc->w->dtype != AF_DTYPE_FLOAT || (fc->b && fc->b->dtype != AF_DTYPE_FLOAT))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FC weights are not float32");
    int64_t m = conv->rank >= 2 ? conv->dims[1] : -1;
    int64_t batch = conv->rank >= 1 ? conv->dims[0] : -1;
    if (fc->w->rank >= 0) {
        if (fc->w->rank != 2)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "Wfc must be 2-D");
        int64_t wk = fc->w->dims[fc->tb ? 1 : 0];
        fc->classes = fc->w->dims[fc->tb ? 0 : 1];
        if (wk >= 0 && m >= 0 && wk != m)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "Wfc expects %lld features but the conv has %lld channels",
                                (long long)wk, (long long)m);
    }
    int64_t dims[2] = {batch, fc->classes};
    af_tensor_set_type(y, AF_DTYPE_FLOAT, 2, dims);
    if (fc->b) {
        bool ok = fc->b->rank <= 2;
        for (int i = 0; ok && fc->b->rank > 0 && i < fc->b->rank; i++) {
            int64_t bd = fc->b->dims[i], yd = dims[2 - fc->b->rank + i];
            ok = bd < 0 || yd < 0 || bd == 1 || bd == yd;
        }
        if (!ok)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "Bfc does not broadcast to [N, classes]");
    }
    return AF_OK;
}

af_status shape_conv_pool_fc(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    af_tensor conv;
    cpf_fc fc;
    if (n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "ConvPoolFc has one output");
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    const af_tensor *x = nn_in(n, in, 0);
    if (x && x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "ConvPoolFc on %s (float32 only)",
                            af_dtype_name(x->dtype));
    af_status st = shape_conv(n, in, &conv, err);
    if (st == AF_OK)
        st = af_epilogue_validate(n, in, &conv, err);
    if (st == AF_OK)
        st = cpf_fc_setup(n, in, &conv, &fc, &out[0], err);
    return st;
}

/* Mean of every conv output channel (after the epilogue) for batch entry b into pooled[M]. */
static void cpf_pool(const fused_conv *c, const af_epilogue *ep, int64_t b, float *row,
                     float *pooled) {
    const int64_t *o = c->w.out;
    int64_t per_channel = o[0] * o[1] * c->row;
    for (int64_t m = 0; m < c->cout; m++) {
        double sum = 0.0;
        int64_t off = (b * c->cout + m) * per_channel;
        for (int64_t od = 0; od < o[0]; od++)
            for (int64_t oh = 0; oh < o[1]; oh++) {
                int64_t idx[AF_MAX_RANK], rest = off;
                for (int i = ep->rank - 1; i >= 0; i--) {
                    idx[i] = rest % ep->dims[i];
                    rest /= ep->dims[i];
                }
                fused_conv_row(c, b, m, od, oh, row);
                af_epilogue_apply(ep, row, c->row, idx);
                for (int64_t ow = 0; ow < c->row; ow++)
                    sum += row[ow];
                off += c->row;
            }
        pooled[m] = (float)(sum / (double)per_channel);
    }
}

/* acc[j] = sum_m pooled[m] * Wfc(m, j) for every class j: a dot product along Wfc's rows when
 * it is [classes, M] (fc_trans_b), else i-k-j over its [M, classes] rows; both read Wfc
 * contiguously. */
static void cpf_fc_row(const cpf_fc *fc, int64_t mch, const float *pooled, double *acc) {
    const float *w = fc->w->data;
    int64_t cls = fc->classes;
    if (fc->tb) {
        for (int64_t j = 0; j < cls; j++) {
            double sum = 0.0;
            for (int64_t m = 0; m < mch; m++)
                sum += (double)pooled[m] * w[j * mch + m];
            acc[j] = sum;
        }
        return;
    }
    for (int64_t j = 0; j < cls; j++)
        acc[j] = 0.0;
    for (int64_t m = 0; m < mch; m++) {
        double pv = pooled[m];
        for (int64_t j = 0; j < cls; j++)
            acc[j] += pv * w[m * cls + j];
    }
}

af_status ref_conv_pool_fc(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    fused_conv c;
    cpf_fc fc;
    af_epilogue ep;
    af_tensor yt;
    af_status st = fused_conv_setup(n, in, &c, err);
    if (st == AF_OK)
        st = af_epilogue_parse(n, in, &c.y, &ep, err);
    if (st == AF_OK)
        st = cpf_fc_setup(n, in, &c.y, &fc, &yt, err);
    if (st == AF_OK && (!af_tensor_has_data(fc.w) || (fc.b && !af_tensor_has_data(fc.b))))
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], yt.rank, yt.dims, err);
    if (st != AF_OK) {
        fused_conv_release(&c);
        return st;
    }
    float *row = af_malloc((size_t)(c.row > 0 ? c.row : 1) * sizeof(float));
    float *pooled = af_malloc((size_t)(c.cout > 0 ? c.cout : 1) * sizeof(float));
    double *acc = af_malloc((size_t)(fc.classes > 0 ? fc.classes : 1) * sizeof(double));
    if (!row || !pooled || !acc) {
        fused_conv_release(&c);
        af_free(row);
        af_free(pooled);
        af_free(acc);
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    int64_t bstr[2] = {0, 0};
    if (fc.b)
        af_broadcast_strides(fc.b, &yt, bstr);
    const float *bias = fc.b ? fc.b->data : NULL;
    float *y = out[0].data;
    for (int64_t b = 0; b < c.batch; b++) {
        cpf_pool(&c, &ep, b, row, pooled);
        cpf_fc_row(&fc, c.cout, pooled, acc);
        for (int64_t j = 0; j < fc.classes; j++)
            y[b * fc.classes + j] =
                (float)(acc[j] + (bias ? bias[b * bstr[0] + j * bstr[1]] : 0.0));
    }
    fused_conv_release(&c);
    af_free(row);
    af_free(pooled);
    af_free(acc);
    return AF_OK;
}

/* ---- SqueezeExcite --------------------------------------------------------------------------- */

static af_status se_act_parse(const af_node *n, const char *name, const char *pname, bool gate,
                              se_act *a, af_error *err) {
    const int64_t *ops = NULL;
    const float *ps = NULL;
    int nops = af_attr_ints(n, name, &ops), nps = af_attr_floats(n, pname, &ps);
    if (nops != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must hold one op", name);
    if (nps >= 0 && nps != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must hold 2 floats", pname);
    a->p0 = nps == 2 ? ps[0] : 0.0f;
    a->p1 = nps == 2 ? ps[1] : 0.0f;
    const char *why = af_ep_unary_check(ops[0], a->p0, a->p1);
    if (!why && gate && ops[0] != AF_EP_SIGMOID && ops[0] != AF_EP_HARD_SIGMOID)
        why = "the gate must be SIGMOID or HARD_SIGMOID";
    if (!why && nps < 0 && (ops[0] == AF_EP_CLIP || ops[0] == AF_EP_LEAKY_RELU ||
                            ops[0] == AF_EP_HARD_SIGMOID || ops[0] == AF_EP_ELU))
        why = "parameters missing";
    if (why)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s (op %lld): %s", name,
                            (long long)ops[0], why);
    a->op = (af_ep_op)ops[0];
    return AF_OK;
}

/* A 1x1 conv weight [out, in, 1...] of X's rank (or 2-D [out, in]); unknown dims pass. */
static af_status se_weight(const af_node *n, const af_tensor *w, const af_tensor *b, int xrank,
                           int64_t want_in, int64_t *out_ch, const char *what, af_error *err) {
    *out_ch = -1;
    if (!w)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input %s", what);
    if (w->dtype != AF_DTYPE_FLOAT || (b && b->dtype != AF_DTYPE_FLOAT))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s is not float32", what);
    if (w->rank < 0)
        return AF_OK;
    if (w->rank < 2 || (w->rank != 2 && xrank >= 0 && w->rank != xrank))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has rank %d", what, w->rank);
    for (int i = 2; i < w->rank; i++)
        if (w->dims[i] >= 0 && w->dims[i] != 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s is not a 1x1 kernel", what);
    if (w->dims[1] >= 0 && want_in >= 0 && w->dims[1] != want_in)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has %lld input channels, not %lld",
                            what, (long long)w->dims[1], (long long)want_in);
    *out_ch = w->dims[0];
    if (b && b->rank >= 0 &&
        (b->rank != 1 || (b->dims[0] >= 0 && *out_ch >= 0 && b->dims[0] != *out_ch)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bias of %s must be 1-D [%lld]", what,
                            (long long)*out_ch);
    return AF_OK;
}

/* Shapes and attributes of a SqueezeExcite; *c and *cr get the channel counts (-1 unknown). */
static af_status se_setup(const af_node *n, const af_tensor *const *in, se_act *act,
                          se_act *gate, int64_t *c, int64_t *cr, af_error *err) {
    *c = *cr = 0; /* set before any error return, so no caller reads them unset */
    const af_tensor *x = nn_in(n, in, 0);
    if (!x || n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "takes input X and one output");
    if (x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "SqueezeExcite on %s (float32 only)",
                            af_dtype_name(x->dtype));
    if (x->rank >= 0 && x->rank < 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X must be [N, C, spatial...]");
    af_status st = se_act_parse(n, "act", "act_params", false, act, err);
    if (st == AF_OK)
        st = se_act_parse(n, "gate", "gate_params", true, gate, err);
    bool cl = af_attr_int(n, "channels_last", 0) != 0; /* X is [N, spatial..., C] */
    *c = x->rank >= 0 ? x->dims[cl ? x->rank - 1 : 1] : -1;
    int64_t c2;
    if (st == AF_OK)
        st = se_weight(n, nn_in(n, in, 1), nn_in(n, in, 2), x->rank, *c, cr, "W1", err);
    if (st == AF_OK)
        st = se_weight(n, nn_in(n, in, 3), nn_in(n, in, 4), x->rank, *cr, &c2, "W2", err);
    if (st == AF_OK && c2 >= 0 && *c >= 0 && c2 != *c)
        st = af_node_fail(err, n, AF_ERR_INVALID_MODEL, "W2 has %lld output channels, X has %lld",
                          (long long)c2, (long long)*c);
    return st;
}

af_status shape_squeeze_excite(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    se_act act, gate;
    int64_t c, cr;
    af_status st = se_setup(n, in, &act, &gate, &c, &cr, err);
    if (st != AF_OK) return st;
    af_tensor_type_copy(&out[0], in[0]);
    /* gate_only (made by the lowering when the next 1x1 conv applies the gate to its weights):
     * the output is the gate itself, [N, 1, ..., 1, C] channels-last. */
    if (af_attr_int(n, "gate_only", 0)) {
        if (!af_attr_int(n, "channels_last", 0))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "gate_only needs channels_last");
        for (int i = 1; i + 1 < out[0].rank; i++) out[0].dims[i] = 1;
    }
    /* pooled (with gate_only): X is already the [N, 1, 1, C] means of the image. */
    if (af_attr_int(n, "pooled", 0) && (!af_attr_int(n, "gate_only", 0) || in[0]->rank != 4 ||
                                        in[0]->dims[1] != 1 || in[0]->dims[2] != 1))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pooled needs gate_only and [N, 1, 1, C] means");
    return AF_OK;
}

af_status fused_se_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out, fused_se *s,
                        af_error *err) {
    af_status st = se_setup(n, in, &s->act, &s->gate, &s->c, &s->cr, err);
    if (st != AF_OK)
        return st;
    s->x = in[0];
    s->w1 = in[1];
    s->w2 = in[3];
    s->b1 = nn_in(n, in, 2);
    s->b2 = nn_in(n, in, 4);
    if (!af_tensor_has_data(s->x) || !af_tensor_has_data(s->w1) || !af_tensor_has_data(s->w2) ||
        (s->b1 && !af_tensor_has_data(s->b1)) || (s->b2 && !af_tensor_has_data(s->b2)) || s->cr < 0)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    s->gate_only = af_attr_int(n, "gate_only", 0) != 0;
    s->pooled = af_attr_int(n, "pooled", 0) != 0;
    s->channels_last = af_attr_int(n, "channels_last", 0) != 0;
    af_tensor yt;
    st = shape_squeeze_excite(n, in, &yt, err);
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], yt.rank, yt.dims, err);
    s->batch = s->x->dims[0];
    s->hw = nn_prod(s->x, 2, s->x->rank);
    return st;
}

/* s_out[o] = act(b[o] + sum_i w[o, i] * s_in[i]) for a 1x1 conv on a [1, nin, 1...] input. */
static void se_fc(const float *w, const float *b, const float *s_in, int64_t nin, int64_t nout,
                  const se_act *a, float *s_out, af_exec *ex) {
    (void)ex;
    for (int64_t o = 0; o < nout; o++) {
        double sum = b ? b[o] : 0.0;
        for (int64_t i = 0; i < nin; i++)
            sum += (double)w[o * nin + i] * s_in[i];
        s_out[o] = af_ep_unary(a->op, (float)sum, a->p0, a->p1);
    }
}

af_status fused_se_run_nchw(const af_node *n, const fused_se *s, float *y, fused_se_fc fc, af_exec *ex,
                         af_error *err) {
    int64_t c = s->c, cr = s->cr, hw = s->hw;
    /* Three small vectors, from the run's scratch, or allocated here without one. */
    size_t nc = (size_t)(c > 0 ? c : 1), nr = (size_t)(cr > 0 ? cr : 1);
    size_t bytes = (2 * nc + nr) * sizeof(float);
    float *own = ex ? NULL : af_malloc(bytes), *gap = ex ? af_exec_scratch(ex, bytes) : own;
    if (!gap) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    float *mid = gap + nc, *scale = mid + nr;
    const float *xd = s->x->data, *b1 = s->b1 ? s->b1->data : NULL, *b2 = s->b2 ? s->b2->data : NULL;
    for (int64_t b = 0; b < s->batch; b++) {
        const float *xb = xd + b * c * hw;
        for (int64_t ch = 0; ch < c; ch++) {
            double sum = 0.0;
            for (int64_t p = 0; p < hw; p++)
                sum += xb[ch * hw + p];
            gap[ch] = (float)(hw > 0 ? sum / (double)hw : 0.0);
        }
        fc(s->w1->data, b1, gap, c, cr, &s->act, mid, ex);
        fc(s->w2->data, b2, mid, cr, c, &s->gate, scale, ex);
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++)
                y[(b * c + ch) * hw + p] = xb[ch * hw + p] * scale[ch];
    }
    af_free(own);
    return AF_OK;
}

af_status ref_squeeze_excite(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    (void)ex;
    fused_se s;
    af_status st = fused_se_prepare(n, in, out, &s, err);
    if (st != AF_OK)
        return st;
    if (s.channels_last)
        return af_ref_refuse_lowered(n, err);
    return fused_se_run_nchw(n, &s, out[0].data, se_fc, NULL, err);
}
