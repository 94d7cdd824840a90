/* An example autofusion plugin (include/autofusion_plugin.h): three custom ops of the domain
 * "ai.example" and one fusion rule.
 *
 *   ScaledTanh  ELEMWISE   y = alpha * tanh(beta * x)   (attributes alpha, beta; default 1)
 *   SquaredDiff BROADCAST  y = (x - b)^2, b broadcasting to x (numpy, unidirectional)
 *   Mish        ELEMWISE   y = x * tanh(softplus(x))
 *
 *   MishFusionOp  Softplus -> Tanh -> Mul(x, .)  becomes one Mish node: the subgraph exporters
 *                 write for torch.nn.Mish at opsets before 18.
 *
 * All three ops give their per-element function (map / map2), so the generic fuser places them
 * in the epilogue of the convolution or matrix product before them: a Conv followed by
 * Softplus, Tanh and Mul ends as one FusedConv whose epilogue calls Mish on each output tile.
 *
 * Build: cc -shared -fPIC -O3 -fno-trapping-math -I<autofusion>/include example_plugin.c \
 *            -o libaf_example_plugin.so -lm
 * Use:   autofusion run model.onnx --plugin=./libaf_example_plugin.so
 */
#include "autofusion_plugin.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define DOMAIN "ai.example"

/* e^x for x in [-87, 20] without libm, so that the loops below vectorise (a libm call per
 * element cannot): e^x = 2^n e^r, n = round(x / ln2), |r| <= ln2 / 2, e^r by a degree-6 Taylor
 * polynomial (relative error below 2e-7), 2^n put into the exponent bits. */
static inline float exp_approx(float x) {
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693145752f - n * 1.42860677e-06f;
    float p = 1.0f / 720, q;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    memcpy(&q, &bits, sizeof q);
    return p * q;
}

/* mish(x) = x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2): one exp, no log.
 * x is clamped to [-87, 20] for the exp: past 20 the ratio is 1 to float precision, below -87
 * the product is 0 to float precision. */
static float mish(float x) {
    float c = x < -87.0f ? -87.0f : x > 20.0f ? 20.0f : x;
    float e = exp_approx(c), n = e * (e + 2.0f);
    return x * n / (n + 2.0f);
}

/* ---- shape inference ---------------------------------------------------------------------- */

static int fail(char *msg, size_t len, const char *why) {
    snprintf(msg, len, "%s", why);
    return 1;
}

static int is_float(const af_tensor *t) {
    return t && t->dtype == AF_DTYPE_FLOAT;
}

/* Output 0 is shaped like input 0 (ELEMWISE ops). */
static int infer_like_x(const af_pnode *node, const af_plugin_graph *g, int nin,
                        const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                        size_t len) {
    (void)node, (void)g;
    if (nin != 1 || nout != 1) return fail(msg, len, "wants one input and one output");
    if (!is_float(in[0])) return fail(msg, len, "input must be float32");
    out[0] = *in[0];
    out[0].data = NULL;
    out[0].nbytes = 0;
    out[0].owns_data = 0;
    return 0;
}

/* b broadcasts to x: its dims, aligned right, are 1 or x's. */
static int fits(const af_tensor *b, const af_tensor *x) {
    if (b->rank > x->rank) return 0;
    for (int i = 0; i < b->rank; i++) {
        int64_t bd = b->dims[i], xd = x->dims[x->rank - b->rank + i];
        if (bd != 1 && bd != xd) return 0;
    }
    return 1;
}

static int infer_broadcast(const af_pnode *node, const af_plugin_graph *g, int nin,
                           const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                           size_t len) {
    (void)node, (void)g;
    if (nin != 2 || nout != 1) return fail(msg, len, "wants two inputs and one output");
    if (!is_float(in[0]) || !is_float(in[1])) return fail(msg, len, "inputs must be float32");
    if (in[0]->rank >= 0 && in[1]->rank >= 0 && !fits(in[1], in[0]))
        return fail(msg, len, "b does not broadcast to x");
    out[0] = *in[0];
    out[0].data = NULL;
    out[0].nbytes = 0;
    out[0].owns_data = 0;
    return 0;
}

static long long numel(const af_tensor *t) {
    long long n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

/* ---- per-element functions (also what the fused epilogues call) --------------------------- */

static void scaled_tanh_params(const af_pnode *n, const af_plugin_graph *g, float p[2]) {
    p[0] = g->attr_float(n, "alpha", 1.0f);
    p[1] = g->attr_float(n, "beta", 1.0f);
}

static void scaled_tanh_map(const float p[2], const float *x, float *y, long long n) {
    for (long long i = 0; i < n; i++) y[i] = p[0] * tanhf(p[1] * x[i]);
}

/* Compiled for AVX-512, AVX2 and baseline x86-64, the best picked when the plugin loads (GCC's
 * target_clones); with -fno-trapping-math (CMakeLists.txt) the loop vectorises: 16 Mish values
 * per iteration on AVX-512. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void mish_map(const float p[2], const float *x, float *y, long long n) {
    (void)p;
    for (long long i = 0; i < n; i++) y[i] = mish(x[i]);
}

static void squared_diff_map2(const float p[2], const float *x, const float *b, float *y,
                              long long n) {
    (void)p;
    for (long long i = 0; i < n; i++) {
        float d = x[i] - b[i];
        y[i] = d * d;
    }
}

/* ---- kernels ------------------------------------------------------------------------------ */

static int compute_scaled_tanh(const af_pnode *node, const af_plugin_graph *g, int nin,
                               const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                               size_t len) {
    (void)nin, (void)nout, (void)msg, (void)len;
    float p[2];
    scaled_tanh_params(node, g, p);
    scaled_tanh_map(p, in[0]->data, out[0].data, numel(in[0]));
    return 0;
}

static int compute_mish(const af_pnode *node, const af_plugin_graph *g, int nin,
                        const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                        size_t len) {
    (void)node, (void)g, (void)nin, (void)nout, (void)msg, (void)len;
    mish_map(NULL, in[0]->data, out[0].data, numel(in[0]));
    return 0;
}

/* y = (x - b)^2 with b broadcast: b's index of each element of x through b's strides (0 on a
 * broadcast dim). */
static int compute_squared_diff(const af_pnode *node, const af_plugin_graph *g, int nin,
                                const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                                size_t len) {
    (void)node, (void)g, (void)nin, (void)nout;
    const af_tensor *x = in[0], *b = in[1];
    if (!fits(b, x)) return fail(msg, len, "b does not broadcast to x");
    long long stride[AF_MAX_RANK] = {0}, s = 1;
    for (int i = b->rank - 1; i >= 0; i--) {
        int d = x->rank - b->rank + i;
        stride[d] = b->dims[i] == 1 ? 0 : s;
        s *= b->dims[i];
    }
    const float *xd = x->data, *bd = b->data;
    float *y = out[0].data;
    long long n = numel(x);
    for (long long e = 0; e < n; e++) {
        long long rem = e, k = 0;
        for (int d = x->rank - 1; d >= 0; d--) {
            k += rem % x->dims[d] * stride[d];
            rem /= x->dims[d];
        }
        float diff = xd[e] - bd[k];
        y[e] = diff * diff;
    }
    return 0;
}

/* ---- the rule: Softplus -> Tanh -> Mul(x, .) ------------------------------------------------ */

/* The only reader of output 0 of n, if it is an ai.onnx op_type; else NULL. */
static const af_pnode *sole_reader(const af_pnode *n, const af_plugin_graph *g,
                                   const char *op_type) {
    if (g->num_readers(n, 0) != 1) return NULL;
    const af_pnode *r = g->reader(n, 0, 0);
    return r && !strcmp(g->op_type(r), op_type) && !*g->domain(r) ? r : NULL;
}

static const char *mish_check(const af_pnode *softplus_node, const af_plugin_graph *g,
                              af_plugin_match *m) {
    if (g->num_inputs(softplus_node) != 1) return "Softplus has no single input";
    const af_pnode *tanh_node = sole_reader(softplus_node, g, "Tanh");
    if (!tanh_node) return "Softplus is not read by one Tanh only";
    const af_pnode *mul = sole_reader(tanh_node, g, "Mul");
    if (!mul || g->num_inputs(mul) != 2) return "Tanh is not read by one Mul only";
    /* The Mul's other input is the Softplus's input x (not a broadcast of something else). */
    int other = g->producer(mul, 0) == tanh_node ? 1 : 0;
    const void *x = g->input_id(softplus_node, 0);
    if (!x || g->input_id(mul, other) != x) return "Mul does not multiply the Softplus input";
    m->nodes[0] = softplus_node;
    m->nodes[1] = tanh_node;
    m->nodes[2] = mul;
    m->nnodes = 3;
    m->inputs[0].node = 0;
    m->inputs[0].input = 0;
    m->ninputs = 1;
    m->out_node = 2;
    m->out_output = 0;
    return NULL;
}

/* ---- the description ---------------------------------------------------------------------- */

static const af_custom_op ops[] = {
    {DOMAIN, "ScaledTanh", AF_CUSTOM_ELEMWISE, infer_like_x, compute_scaled_tanh,
     scaled_tanh_params, scaled_tanh_map, NULL},
    {DOMAIN, "SquaredDiff", AF_CUSTOM_BROADCAST, infer_broadcast, compute_squared_diff, NULL,
     NULL, squared_diff_map2},
    {DOMAIN, "Mish", AF_CUSTOM_ELEMWISE, infer_like_x, compute_mish, NULL, mish_map, NULL},
};

static const af_custom_rule rules[] = {
    {"MishFusionOp", "Softplus+Tanh+Mul",
     "Mul multiplies the Softplus input by Tanh(Softplus(x)); each intermediate read once",
     "", "Softplus", mish_check, DOMAIN, "Mish"},
};

static const af_plugin_desc desc = {
    AF_PLUGIN_ABI_VERSION, "autofusion example plugin", ops, (int)(sizeof ops / sizeof ops[0]),
    rules, (int)(sizeof rules / sizeof rules[0]),
};

const af_plugin_desc *af_plugin_describe(void) {
    return &desc;
}
