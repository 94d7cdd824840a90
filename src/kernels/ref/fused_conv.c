/* FusedConv: a Conv (1-D to 3-D, groups, dilations, strides, pads, auto_pad) whose every output
 * row goes through the node's epilogue program before it is stored. Also the row convolution
 * that ConvPoolFc shares (fused.h).
 *
 * With transposed = 1 it is a ConvTranspose instead (its attributes, W [C, M/group, k...]), run
 * by the reference ConvTranspose with the epilogue over its output.
 *
 * Invariant: the output is written one row (n, m, od, oh, all ow) at a time, each row computed
 * in a scratch buffer, finished by the epilogue, then stored once; no full-size temporary. Each
 * output sums its products in double in the unfused Conv's order (channel, then kernel d, h, w),
 * so the core gives the unfused Conv's bits; the loops only share passes over the row between
 * consecutive products where that order allows it. */
#include "kernels/ref/epilogue.h"
#include "kernels/ref/fused.h"

#include <stdlib.h>

af_status fused_conv_setup(const af_node *n, const af_tensor *const *in, fused_conv *c, af_error *err) {
    memset(c, 0, sizeof(*c));
    const af_tensor *x = nn_in(n, in, 0), *wt = nn_in(n, in, 1), *b = nn_in(n, in, 2);
    if (!x || !wt)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or W");
    if (x->dtype != AF_DTYPE_FLOAT || wt->dtype != AF_DTYPE_FLOAT ||
        (b && b->dtype != AF_DTYPE_FLOAT))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s (float32 only)", n->op_type,
                            af_dtype_name(x->dtype));
    if (!af_tensor_has_data(x) || !af_tensor_has_data(wt) || (b && !af_tensor_has_data(b)))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    /* Conv's own shape function checks ranks, groups, channels, kernel_shape and bias. */
    const af_tensor *cin[3] = {x, wt, b};
    af_status st = shape_conv(n, cin, &c->y, err);
    if (st != AF_OK)
        return st;
    if (c->y.rank < 3)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "conv output rank unknown at run time");
    int nsp = x->rank - 2;
    int64_t k[NN_MAXSP];
    for (int i = 0; i < nsp; i++)
        k[i] = wt->dims[2 + i];
    st = nn_window_init(n, x, k, nsp, false, &c->w, err);
    if (st != AF_OK)
        return st;
    c->group = af_attr_int(n, "group", 1);
    c->batch = x->dims[0];
    c->cin = x->dims[1];
    c->cout = wt->dims[0];
    c->cg = wt->dims[1];
    c->mg = c->cout / c->group;
    c->row = c->w.out[NN_MAXSP - 1];
    c->x = x->data;
    c->wt = wt->data;
    c->b = b ? b->data : NULL;
    /* The valid output columns of each kernel column depend on nothing else: computed once
     * here rather than in the innermost loops. */
    int64_t kw = c->w.k[NN_MAXSP - 1];
    size_t rb, kb;
    if (!af_mul_size((size_t)(c->row > 0 ? c->row : 1), sizeof(double), &rb) ||
        !af_mul_size((size_t)(kw > 0 ? kw : 1), sizeof(int64_t), &kb))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "convolution too large");
    c->acc = af_malloc(rb);
    c->kw_lo = af_malloc(kb);
    c->kw_hi = af_malloc(kb);
    if (!c->acc || !c->kw_lo || !c->kw_hi)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    c->in_lo = 0;
    c->in_hi = c->row;
    for (int64_t i = 0; i < kw; i++) {
        nn_window_range(&c->w, NN_MAXSP - 1, i, &c->kw_lo[i], &c->kw_hi[i]);
        c->in_lo = c->kw_lo[i] > c->in_lo ? c->kw_lo[i] : c->in_lo;
        c->in_hi = c->kw_hi[i] < c->in_hi ? c->kw_hi[i] : c->in_hi;
    }
    if (c->in_hi < c->in_lo)
        c->in_hi = c->in_lo;
    /* Sharing a pass between three kernel columns pays off on long rows only: on short ones
     * the extra edge loops cost more than the saved accumulator traffic. */
    c->grouped_taps = kw >= 3 && c->in_hi - c->in_lo >= 16;
    return AF_OK;
}

void fused_conv_release(fused_conv *c) {
    af_free(c->acc);
    af_free(c->kw_lo);
    af_free(c->kw_hi);
    c->acc = NULL;
    c->kw_lo = c->kw_hi = NULL;
}

/* acc[ow] += sum over channels cc < cg of w[cc] * x[cc * plane + ow * sw + base] for ow in
 * [lo, hi): four channels share one pass over the row, each output still adding its products in
 * channel order. Inlined twice, with sw == 1 a constant in one copy, so that copy vectorises. */
static inline void pw_accumulate(const float *x, int64_t plane, const float *w, int64_t cg,
                                 int64_t lo, int64_t hi, int64_t sw, int64_t base, double *acc) {
    int64_t cc = 0;
    for (; cc + 4 <= cg; cc += 4) {
        const float *x0 = x + cc * plane, *x1 = x0 + plane, *x2 = x1 + plane, *x3 = x2 + plane;
        double w0 = w[cc], w1 = w[cc + 1], w2 = w[cc + 2], w3 = w[cc + 3];
        for (int64_t ow = lo; ow < hi; ow++) {
            int64_t i = ow * sw + base;
            double t = acc[ow];
            t += w0 * x0[i];
            t += w1 * x1[i];
            t += w2 * x2[i];
            t += w3 * x3[i];
            acc[ow] = t;
        }
    }
    for (; cc < cg; cc++) {
        const float *xc = x + cc * plane;
        double wv = w[cc];
        for (int64_t ow = lo; ow < hi; ow++)
            acc[ow] += wv * xc[ow * sw + base];
    }
}

/* A 1x1x1 kernel (pointwise conv) for output row (b, m, od, oh) into acc: only a channel sum,
 * over one input row per channel. A row outside X (padding) contributes nothing. */
static void conv_row_pointwise(const fused_conv *c, int64_t b, int64_t m, int64_t od, int64_t oh,
                               double *acc) {
    const nn_window *w = &c->w;
    const int64_t *in = w->in;
    int64_t id = od * w->s[0] - w->pb[0], ih = oh * w->s[1] - w->pb[1];
    if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1])
        return;
    const int64_t sw = w->s[2], base = -w->pb[2], lo = c->kw_lo[0], hi = c->kw_hi[0];
    const int64_t plane = in[0] * in[1] * in[2];
    const float *x =
        c->x + (((b * c->cin + (m / c->mg) * c->cg) * in[0] + id) * in[1] + ih) * in[2];
    const float *wm = c->wt + m * c->cg;
    if (sw == 1)
        pw_accumulate(x, plane, wm, c->cg, lo, hi, 1, base, acc);
    else
        pw_accumulate(x, plane, wm, c->cg, lo, hi, sw, base, acc);
}

/* acc[ow] += sum over kernel columns kw of w[kw] * x[ow * sw + kw * dw - pw] for every output
 * column ow the kernel column reaches, one kernel column per pass over the row; each output
 * adds its products in kw order (the unfused Conv's order). Stride 1 reads X contiguously: its
 * own loop vectorises. */
static void taps_each(const fused_conv *c, const float *x, const float *w, double *acc) {
    const int64_t nk = c->w.k[2], sw = c->w.s[2], dw = c->w.d[2], pw = c->w.pb[2];
    for (int64_t kw = 0; kw < nk; kw++) {
        int64_t lo = c->kw_lo[kw], hi = c->kw_hi[kw], base = kw * dw - pw;
        double wv = w[kw];
        if (sw == 1)
            for (int64_t ow = lo; ow < hi; ow++)
                acc[ow] += wv * x[ow + base];
        else
            for (int64_t ow = lo; ow < hi; ow++)
                acc[ow] += wv * x[ow * sw + base];
    }
}

/* The same sums, same order per output, for long rows: the edge columns, where only some
 * kernel columns reach, go one kernel column at a time over its valid range; the interior
 * [in_lo, in_hi), where all reach, takes three kernel columns per pass, loading and storing
 * each accumulator once per three products. Inlined twice, with sw == 1 a constant in one
 * copy, so that copy vectorises. */
static inline void taps_grouped(const fused_conv *c, const float *x, const float *w, int64_t sw,
                                double *acc) {
    const int64_t nk = c->w.k[2], dw = c->w.d[2], pw = c->w.pb[2];
    const int64_t ilo = c->in_lo, ihi = c->in_hi;
    for (int64_t kw = 0; kw < nk; kw++) {
        int64_t lo = c->kw_lo[kw], hi = c->kw_hi[kw], base = kw * dw - pw;
        int64_t e1 = hi < ilo ? hi : ilo, e2 = lo > ihi ? lo : ihi;
        double wv = w[kw];
        for (int64_t ow = lo; ow < e1; ow++)
            acc[ow] += wv * x[ow * sw + base];
        for (int64_t ow = e2; ow < hi; ow++)
            acc[ow] += wv * x[ow * sw + base];
    }
    int64_t kw = 0;
    for (; kw + 3 <= nk; kw += 3) {
        int64_t b0 = kw * dw - pw, b1 = b0 + dw, b2 = b1 + dw;
        double w0 = w[kw], w1 = w[kw + 1], w2 = w[kw + 2];
        for (int64_t ow = ilo; ow < ihi; ow++) {
            double t = acc[ow];
            t += w0 * x[ow * sw + b0];
            t += w1 * x[ow * sw + b1];
            t += w2 * x[ow * sw + b2];
            acc[ow] = t;
        }
    }
    for (; kw < nk; kw++) {
        int64_t base = kw * dw - pw;
        double wv = w[kw];
        for (int64_t ow = ilo; ow < ihi; ow++)
            acc[ow] += wv * x[ow * sw + base];
    }
}

/* Any kernel: the loop nest of the unfused Conv (conv.c) for output row (b, m, od, oh) into
 * acc, with each kernel column's valid output range looked up instead of recomputed. */
static void conv_row_general(const fused_conv *c, int64_t b, int64_t m, int64_t od, int64_t oh,
                             double *acc) {
    const nn_window *w = &c->w;
    const int64_t *in = w->in, *k = w->k;
    const int64_t sw = w->s[2];
    int64_t grp = m / c->mg;
    for (int64_t cc = 0; cc < c->cg; cc++) {
        int64_t ch = grp * c->cg + cc;
        for (int64_t kd = 0; kd < k[0]; kd++) {
            int64_t id = od * w->s[0] - w->pb[0] + kd * w->d[0];
            if (id < 0 || id >= in[0])
                continue;
            for (int64_t kh = 0; kh < k[1]; kh++) {
                int64_t ih = oh * w->s[1] - w->pb[1] + kh * w->d[1];
                if (ih < 0 || ih >= in[1])
                    continue;
                const float *xrow = c->x + (((b * c->cin + ch) * in[0] + id) * in[1] + ih) * in[2];
                const float *wrow = c->wt + (((m * c->cg + cc) * k[0] + kd) * k[1] + kh) * k[2];
                if (c->grouped_taps && sw == 1)
                    taps_grouped(c, xrow, wrow, 1, acc);
                else if (c->grouped_taps)
                    taps_grouped(c, xrow, wrow, sw, acc);
                else
                    taps_each(c, xrow, wrow, acc);
            }
        }
    }
}

void fused_conv_row(const fused_conv *c, int64_t b, int64_t m, int64_t od, int64_t oh, float *row) {
    const int64_t *k = c->w.k;
    double *acc = c->acc;
    for (int64_t ow = 0; ow < c->row; ow++)
        acc[ow] = 0.0;
    if (k[0] == 1 && k[1] == 1 && k[2] == 1)
        conv_row_pointwise(c, b, m, od, oh, acc);
    else
        conv_row_general(c, b, m, od, oh, acc);
    double bias = c->b ? c->b[m] : 0.0;
    for (int64_t ow = 0; ow < c->row; ow++)
        row[ow] = (float)(acc[ow] + bias);
}

af_status shape_fused_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_error *err) {
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    if (n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "FusedConv has one output");
    const af_tensor *x = nn_in(n, in, 0);
    if (x && x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "FusedConv on %s (float32 only)",
                            af_dtype_name(x->dtype));
    const af_tensor *wt = nn_in(n, in, 1);
    fused_quant q;
    af_status st = fused_quant_decode(n, wt, wt && wt->rank >= 1 ? wt->dims[0] : -1, &q, err);
    if (st != AF_OK)
        return st;
    /* The int8 form: Conv's shape rules with W seen as the float it stands for. */
    af_tensor wf;
    const af_tensor *cin[3] = {x, wt, nn_in(n, in, 2)}, *const *core = in;
    if (q.on) {
        if (af_attr_int(n, "transposed", 0))
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "quant on a transposed FusedConv");
        if (wt) {
            af_tensor_set_type(&wf, AF_DTYPE_FLOAT, wt->rank, wt->rank >= 0 ? wt->dims : NULL);
            cin[1] = &wf;
        }
        core = cin;
    }
    st = af_attr_int(n, "transposed", 0) ? shape_conv_transpose(n, core, &out[0], err)
                                         : shape_conv(n, core, &out[0], err);
    if (st != AF_OK)
        return st;
    return af_epilogue_validate(n, in, &out[0], err);
}

/* transposed = 1: a ConvTranspose (every attribute of it) whose output then goes through the
 * epilogue: the reference ConvTranspose, then the program over the whole output. */
static af_status ref_fused_conv_transpose(const af_node *n, const af_tensor *const *in,
                                          af_tensor *out, af_exec *ex, af_error *err) {
    af_epilogue ep;
    af_status st = af_epilogue_parse(n, in, &out[0], &ep, err);
    if (st == AF_OK)
        st = ref_conv_transpose(n, in, out, ex, err);
    if (st == AF_OK)
        af_epilogue_apply_at(&ep, out[0].data, 0, af_tensor_numel(&out[0]));
    return st;
}

/* The float convolution with its epilogue. */
static af_status ref_fused_conv_float(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                      af_error *err) {
    fused_conv c;
    af_epilogue ep;
    af_status st = fused_conv_setup(n, in, &c, err);
    if (st == AF_OK)
        st = nn_check_out(n, &out[0], c.y.rank, c.y.dims, err);
    if (st == AF_OK)
        st = af_epilogue_parse(n, in, &out[0], &ep, err);
    if (st != AF_OK) {
        fused_conv_release(&c);
        return st;
    }
    float *y = out[0].data;
    const int64_t *o = c.w.out;
    int64_t off = 0;
    for (int64_t b = 0; b < c.batch; b++)
        for (int64_t m = 0; m < c.cout; m++)
            for (int64_t od = 0; od < o[0]; od++)
                for (int64_t oh = 0; oh < o[1]; oh++) {
                    fused_conv_row(&c, b, m, od, oh, y + off);
                    af_epilogue_apply_at(&ep, y, off, c.row);
                    off += c.row;
                }
    fused_conv_release(&c);
    return AF_OK;
}

/* quant = 1: the float convolution of fq(X) and W * w_scale[m] (fused_quant.c). */
static af_status ref_fused_conv_quant(const af_node *n, const af_tensor *const *in,
                                      af_tensor *out, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *wt = nn_in(n, in, 1);
    if (!x || !wt)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X or W");
    if (af_attr_int(n, "transposed", 0))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "quant on a transposed FusedConv");
    if (wt->rank < 1 || wt->dims[0] < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "W has no output channels");
    fused_quant q;
    af_status st = fused_quant_decode(n, wt, wt->dims[0], &q, err);
    if (st != AF_OK)
        return st;
    int64_t per = af_tensor_numel(wt) / wt->dims[0];
    af_tensor xf, wf;
    st = fused_quant_operands(n, &q, x, wt, per > 0 ? per : 1, wt->dims[0], &xf, &wf, err);
    const af_tensor **fin = st == AF_OK ? fused_quant_inputs(n, in, &xf, &wf, &st, err) : NULL;
    if (fin)
        st = ref_fused_conv_float(n, fin, out, err);
    af_free(fin);
    af_tensor_release(&xf);
    af_tensor_release(&wf);
    return st;
}

af_status ref_fused_conv(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *ex, af_error *err) {
    if (af_attr_int(n, "channels_last", 0)) return af_ref_refuse_lowered(n, err);
    if (fused_quant_on(n)) return ref_fused_conv_quant(n, in, out, err);
    if (af_attr_int(n, "transposed", 0)) return ref_fused_conv_transpose(n, in, out, ex, err);
    fused_quant q; /* an int8 W without quant = 1 */
    af_status st = fused_quant_decode(n, nn_in(n, in, 1), -1, &q, err);
    return st ? st : ref_fused_conv_float(n, in, out, err);
}
