/* Kernels of the canonical activation forms the canonicalize pass creates (Gelu, Silu,
 * QuantizeDequantize): float32 and float64, elementwise, output shaped like the input.
 *
 * Invariant: each output element is computed from its input element alone, in double. */
#include "kernels/ref/epilogue.h"
#include "kernels/ref/ref.h"

af_status shape_same(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    if (n->nin < 1 || !in[0] || n->nout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "takes one input and one output");
    if (in[0]->dtype != AF_DTYPE_FLOAT && in[0]->dtype != AF_DTYPE_DOUBLE)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s input is not supported",
                            af_dtype_name(in[0]->dtype));
    af_tensor_type_copy(&out[0], in[0]);
    return AF_OK;
}

static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }

static double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

static af_status map(const af_tensor *x, af_tensor *y, double (*f)(double)) {
    int64_t n = af_tensor_numel(x);
    if (x->dtype == AF_DTYPE_FLOAT) {
        const float *a = x->data;
        float *b = y->data;
        for (int64_t i = 0; i < n; i++) b[i] = (float)f(a[i]);
    } else {
        const double *a = x->data;
        double *b = y->data;
        for (int64_t i = 0; i < n; i++) b[i] = f(a[i]);
    }
    return AF_OK;
}

af_status ref_gelu(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    (void)x;
    const char *approx = af_attr_str(n, "approximate", "none");
    if (strcmp(approx, "none") && strcmp(approx, "tanh"))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "approximate must be none or tanh, not '%s'", approx);
    return map(in[0], &out[0], strcmp(approx, "tanh") ? gelu_erf : gelu_tanh);
}

af_status ref_silu(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    (void)n;
    (void)x;
    (void)err;
    return map(in[0], &out[0], silu);
}

/* QuantizeDequantize (fake quantization, af_fake_quant): float32 as the QuantizeLinear ->
 * DequantizeLinear pair it replaces computes it; float64 the same formula in double. */
af_status ref_quantize_dequantize(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_exec *x, af_error *err) {
    (void)x;
    float s = af_attr_float(n, "scale", 1.0f), z = af_attr_float(n, "zero_point", 0.0f);
    const char *why = af_ep_unary_check(AF_EP_FAKE_QUANT, s, z);
    if (why) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s", why);
    int64_t cnt = af_tensor_numel(in[0]);
    if (in[0]->dtype == AF_DTYPE_FLOAT) {
        const float *a = in[0]->data;
        float *b = out[0].data;
        for (int64_t i = 0; i < cnt; i++) b[i] = af_fake_quant(a[i], s, z);
    } else {
        const double *a = in[0]->data;
        double *b = out[0].data;
        for (int64_t i = 0; i < cnt; i++) {
            double q = nearbyint(a[i] / s) + z;
            q = q < 0.0 ? 0.0 : (q > 255.0 ? 255.0 : q);
            b[i] = (q - z) * s;
        }
    }
    return AF_OK;
}
