/* Reference linear (de)quantization (ONNX opsets 10..23; not blocked, not int4 or int16):
 * QuantizeLinear and DequantizeLinear, per tensor or per axis, and DynamicQuantizeLinear.
 *
 * Invariant: scales and zero points are either one value or one per slice of `axis` (checked
 * before use); quantized stores round half to even and saturate (nn_put). Float32 inputs are
 * divided in float32, as ONNX's reference does, so that rounding ties land where it puts them. */
#include "kernels/ref/nn_common.h"

/* Per-axis parameter layout: value index of element i is (i / inner) % len, or 0 per tensor. */
typedef struct q_axis {
    int64_t len, inner;
} q_axis;

/* Check scale (and zero point) against x and `axis`: a scalar / 1-element tensor, or 1-D with
 * x.dims[axis] values. */
static af_status q_axis_setup(const af_node *n, const af_tensor *x, const af_tensor *scale,
                              const af_tensor *zp, q_axis *qa, af_error *err) {
    if (af_attr_int(n, "block_size", 0) != 0) /* opset 21: blocks along an axis, int4 weights */
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "blocked quantization (block_size, opset 21) is not supported");
    qa->len = 1;
    qa->inner = 1;
    if (scale->rank < 0 || x->rank < 0)
        return AF_OK;
    int64_t sn = af_tensor_numel(scale);
    if (scale->rank == 0 || (scale->rank == 1 && sn == 1)) {
        qa->len = 1;
    } else if (scale->rank == 1) {
        int axis;
        if (!af_axis(af_attr_int(n, "axis", 1), x->rank, &axis))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
        if (sn >= 0 && x->dims[axis] >= 0 && sn != x->dims[axis])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "scale has %lld values for an axis of %lld", (long long)sn,
                                (long long)x->dims[axis]);
        qa->len = sn;
        qa->inner = nn_prod(x, axis + 1, x->rank);
    } else {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scale must be a scalar or 1-D");
    }
    int64_t zn = zp ? af_tensor_numel(zp) : -1;
    if (zn >= 0 && qa->len >= 0 && zn != qa->len)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "zero point and scale sizes differ");
    return AF_OK;
}

static int64_t q_at(const q_axis *qa, int64_t i) {
    return qa->len == 1 ? 0 : (i / qa->inner) % qa->len;
}

static bool q_is8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

/* QuantizeLinear: y = saturate(round(x / y_scale) + y_zero_point); y's type is the zero
 * point's, else output_dtype's (opset 21), else uint8. */
static af_status quant_prepare(const af_node *n, const af_tensor *const *in, q_axis *qa,
                               af_dtype *yt, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *s = nn_in(n, in, 1), *zp = nn_in(n, in, 2);
    if (!x || !s)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing x or y_scale");
    if ((!nn_is_float(x->dtype) && x->dtype != AF_DTYPE_INT32) || !nn_is_float(s->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "QuantizeLinear of %s",
                            af_dtype_name(x->dtype));
    int64_t prec = af_attr_int(n, "precision", 0); /* opset 23: the division's type */
    if (prec && prec != AF_DTYPE_FLOAT && prec != AF_DTYPE_DOUBLE)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "precision %lld (a division below float32) is not supported",
                            (long long)prec);
    int64_t to = af_attr_int(n, "output_dtype", 0); /* af_dtype codes are ONNX's */
    *yt = zp ? zp->dtype : to > 0 && to <= AF_DTYPE_BFLOAT16 ? (af_dtype)to : AF_DTYPE_UINT8;
    if (to && (int64_t)*yt != to)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "output_dtype %lld is not the zero point's type", (long long)to);
    if (!q_is8(*yt))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "QuantizeLinear to %s", af_dtype_name(*yt));
    return q_axis_setup(n, x, s, zp, qa, err);
}

af_status shape_quantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    q_axis qa;
    af_dtype yt = AF_DTYPE_UINT8;
    af_status st = quant_prepare(n, in, &qa, &yt, err);
    if (st == AF_OK) {
        af_tensor_type_copy(&out[0], in[0]);
        out[0].dtype = yt;
    }
    return st;
}

/* x / s, in float32 when both are float32. */
static double q_div(const af_tensor *x, int64_t i, const af_tensor *s, int64_t si) {
    if (x->dtype == AF_DTYPE_FLOAT && s->dtype == AF_DTYPE_FLOAT)
        return ((const float *)x->data)[i] / ((const float *)s->data)[si];
    return af_tensor_get_double(x, i) / af_tensor_get_double(s, si);
}

/* Inputs hold data and have known shapes; output 0 is x-shaped. */
static af_status q_ready(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                         af_error *err) {
    for (int i = 0; i < n->nin; i++)
        if (in[i] && (!af_tensor_known(in[i]) || (af_tensor_numel(in[i]) > 0 && !in[i]->data)))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d unknown at run time", i);
    return nn_check_out(n, y, in[0]->rank, in[0]->dims, err);
}

af_status ref_quantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)ex;
    q_axis qa;
    af_dtype yt = AF_DTYPE_UINT8;
    af_status st = quant_prepare(n, in, &qa, &yt, err);
    if (st == AF_OK)
        st = q_ready(n, in, &out[0], err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *s = in[1], *zp = nn_in(n, in, 2);
    int64_t total = af_tensor_numel(x);
    for (int64_t i = 0; i < total; i++) {
        int64_t q = q_at(&qa, i);
        double v = nearbyint(q_div(x, i, s, q)) + (zp ? af_tensor_get_double(zp, q) : 0.0);
        nn_put(&out[0], i, v);
    }
    return AF_OK;
}

/* DequantizeLinear: y = (x - x_zero_point) * x_scale, as float32 (the scale's type). */
static af_status dequant_prepare(const af_node *n, const af_tensor *const *in, q_axis *qa,
                                 af_error *err) {
    const af_tensor *x = nn_in(n, in, 0), *s = nn_in(n, in, 1), *zp = nn_in(n, in, 2);
    if (!x || !s)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing x or x_scale");
    if ((!q_is8(x->dtype) && x->dtype != AF_DTYPE_INT32) || !nn_is_float(s->dtype) ||
        (zp && zp->dtype != x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "DequantizeLinear of %s",
                            af_dtype_name(x->dtype));
    int64_t to = af_attr_int(n, "output_dtype", 0); /* opset 23; the scale's type by default */
    if (to && to != (int64_t)s->dtype)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "output_dtype %lld other than the scale's type", (long long)to);
    return q_axis_setup(n, x, s, zp, qa, err);
}

af_status shape_dequantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_error *err) {
    q_axis qa;
    af_status st = dequant_prepare(n, in, &qa, err);
    if (st == AF_OK) {
        af_tensor_type_copy(&out[0], in[0]);
        out[0].dtype = in[1]->dtype;
    }
    return st;
}

af_status ref_dequantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *ex, af_error *err) {
    (void)ex;
    q_axis qa;
    af_status st = dequant_prepare(n, in, &qa, err);
    if (st == AF_OK)
        st = q_ready(n, in, &out[0], err);
    if (st != AF_OK)
        return st;
    const af_tensor *x = in[0], *s = in[1], *zp = nn_in(n, in, 2);
    int64_t total = af_tensor_numel(x);
    for (int64_t i = 0; i < total; i++) {
        int64_t q = q_at(&qa, i);
        nn_put(&out[0], i, (af_tensor_get_double(x, i) - (zp ? af_tensor_get_double(zp, q) : 0.0)) * af_tensor_get_double(s, q));
    }
    return AF_OK;
}

/* DynamicQuantizeLinear: uint8 with scale = (max(0, max x) - min(0, min x)) / 255 and
 * zero point round(-min / scale); all in float32 like the ONNX reference. */
af_status shape_dyn_quantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing x");
    if (x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "DynamicQuantizeLinear of %s",
                            af_dtype_name(x->dtype));
    af_tensor_type_copy(&out[0], x);
    out[0].dtype = AF_DTYPE_UINT8;
    if (n->nout > 1)
        af_tensor_set_type(&out[1], AF_DTYPE_FLOAT, 0, NULL);
    if (n->nout > 2)
        af_tensor_set_type(&out[2], AF_DTYPE_UINT8, 0, NULL);
    return AF_OK;
}

af_status ref_dyn_quantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = nn_in(n, in, 0);
    if (!x || x->dtype != AF_DTYPE_FLOAT)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "DynamicQuantizeLinear needs float x");
    af_status st = q_ready(n, in, &out[0], err);
    if (st != AF_OK)
        return st;
    af_tensor *ys = nn_out(n, out, 1), *yz = nn_out(n, out, 2);
    if ((ys && (st = nn_check_out(n, ys, 0, NULL, err)) != AF_OK) ||
        (yz && (st = nn_check_out(n, yz, 0, NULL, err)) != AF_OK))
        return st;
    const float *xv = x->data;
    int64_t total = af_tensor_numel(x);
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < total; i++) {
        lo = xv[i] < lo ? xv[i] : lo;
        hi = xv[i] > hi ? xv[i] : hi;
    }
    float scale = (hi - lo) / 255.0f;
    /* All zeros: any scale works; 1 keeps the divisions defined and y = 0. */
    if (scale == 0.0f)
        scale = 1.0f;
    float zpf = (float)nn_clamp(nearbyintf(-lo / scale), 0, 255);
    for (int64_t i = 0; i < total; i++)
        nn_put(&out[0], i, (double)nearbyintf(xv[i] / scale) + zpf);
    if (ys)
        ((float *)ys->data)[0] = scale;
    if (yz)
        ((uint8_t *)yz->data)[0] = (uint8_t)zpf;
    return AF_OK;
}
