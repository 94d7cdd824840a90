/* The int8 form of FusedConv and FusedMatMul (issue 18's design, docs/design.md §5): attributes
 * quant = 1, x_scale s (> 0, finite), x_zero_point z (uint8 domain, [0, 255]), w_scale (one value,
 * or one per output channel), and W a constant INT8 tensor (the file's Wq minus its zero point).
 * The semantics, for the reference and every fast kernel:
 *
 *     Y = epilogue(op(fq(X), W * w_scale[channel]) + B),
 *     fq(x) = (clamp(round_half_even(x / s) + z, 0, 255) - z) * s,
 *
 * with the division by s (ONNX QuantizeLinear's formula, not a multiplication by 1/s): the
 * epilogue's AF_EP_FAKE_QUANT (af_fake_quant), so the float form a lowering falls back to
 * computes the same. One exception in the int8 kernels: a NaN in X has no code and counts as
 * code 0 there (fused_quant_code), where fq keeps it NaN.
 *
 * Invariant: the reference builds the float operands fq(X) and W * w_scale in float32, then runs
 * the float kernel on them, so its output has the bits of the float op fed those operands (the
 * same double sums in the same order). */
#include "kernels/ref/fused.h"

#include <math.h>

bool fused_quant_on(const af_node *n) {
    return af_attr_int(n, "quant", 0) != 0;
}

af_status fused_quant_decode(const af_node *n, const af_tensor *w, int64_t channels,
                             fused_quant *q, af_error *err) {
    memset(q, 0, sizeof(*q));
    int64_t on = af_attr_int(n, "quant", 0);
    if (on != 0 && on != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "quant must be 0 or 1, not %lld",
                            (long long)on);
    if (!on) {
        if (w && w->dtype == AF_DTYPE_INT8)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "int8 W without quant = 1");
        return AF_OK;
    }
    q->on = true;
    const af_attr *xs = af_node_attr(n, "x_scale");
    if (!xs || xs->type != AF_ATTR_FLOAT)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "quant needs a FLOAT x_scale");
    q->x_scale = xs->f;
    if (!isfinite(q->x_scale) || !(q->x_scale > 0.0f))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "x_scale must be positive and finite, not %g", (double)q->x_scale);
    const af_attr *xz = af_node_attr(n, "x_zero_point");
    if (xz && xz->type != AF_ATTR_INT)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "x_zero_point must be an INT");
    int64_t z = xz ? xz->i : 0;
    if (z < 0 || z > 255)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "x_zero_point %lld outside [0, 255] (uint8 domain)", (long long)z);
    q->x_zero = (int)z;
    const float *ws = NULL;
    int nws = af_attr_floats(n, "w_scale", &ws);
    if (nws < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "quant needs FLOATS w_scale");
    if (nws != 1 && channels >= 0 && nws != channels)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "w_scale has %d values, not 1 or the %lld output channels", nws,
                            (long long)channels);
    for (int i = 0; i < nws; i++)
        if (!isfinite(ws[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "w_scale[%d] is not finite", i);
    q->w_scale = ws;
    q->nw_scale = nws;
    if (w && w->dtype != AF_DTYPE_INT8)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "quant = 1 needs an int8 W, not %s",
                            af_dtype_name(w->dtype));
    return AF_OK;
}

/* fq(X) into a new float32 tensor of X's shape. */
static af_status quant_x(const af_node *n, const fused_quant *q, const af_tensor *x,
                         af_tensor *xf, af_error *err) {
    if (x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "quantized %s on %s X (float32 only)",
                            n->op_type, af_dtype_name(x->dtype));
    af_tensor_set_type(xf, AF_DTYPE_FLOAT, x->rank, x->dims);
    af_status st = af_tensor_alloc(xf, err);
    if (st != AF_OK)
        return st;
    const float *src = x->data;
    float *dst = xf->data;
    int64_t total = af_tensor_numel(x);
    float s = q->x_scale, z = (float)q->x_zero;
    for (int64_t i = 0; i < total; i++)
        dst[i] = fused_quant_fq(src[i], s, z);
    return AF_OK;
}

af_status fused_quant_operands(const af_node *n, const fused_quant *q, const af_tensor *x,
                               const af_tensor *w, int64_t inner, int64_t channels,
                               af_tensor *xf, af_tensor *wf, af_error *err) {
    memset(xf, 0, sizeof(*xf));
    memset(wf, 0, sizeof(*wf));
    if (!af_tensor_has_data(x) || !af_tensor_has_data(w))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    if (inner < 1 || channels < 1 || (q->nw_scale != 1 && q->nw_scale != channels))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "w_scale does not match W at run time");
    af_status st = quant_x(n, q, x, xf, err);
    if (st != AF_OK)
        return st;
    af_tensor_set_type(wf, AF_DTYPE_FLOAT, w->rank, w->dims);
    st = af_tensor_alloc(wf, err);
    if (st != AF_OK) {
        af_tensor_release(xf);
        return st;
    }
    const int8_t *src = w->data;
    float *dst = wf->data;
    int64_t total = af_tensor_numel(w);
    for (int64_t i = 0; i < total; i++)
        dst[i] = (float)src[i] * q->w_scale[q->nw_scale == 1 ? 0 : i / inner % channels];
    return AF_OK;
}

const af_tensor **fused_quant_inputs(const af_node *n, const af_tensor *const *in,
                                     const af_tensor *xf, const af_tensor *wf, af_status *st,
                                     af_error *err) {
    const af_tensor **fin = af_malloc((size_t)n->nin * sizeof(*fin));
    if (!fin) {
        *st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n->nin; i++)
        fin[i] = in[i];
    fin[0] = xf;
    fin[1] = wf;
    return fin;
}
