/* Reference sampling ops (ONNX opsets 1 to 22): RandomUniform, RandomNormal and their *Like
 * forms, Bernoulli and Multinomial. VITS-style TTS models (Piper voices) draw their noise with
 * RandomNormalLike.
 *
 * Element i of a node's output is a function of (key, i) alone: a counter-based generator
 * (splitmix64's finalizer over key + i * golden ratio), so the values do not depend on the
 * thread count or on which run asks, and the fused and unfused graphs of `verify` draw the same
 * numbers. The key is the node's seed attribute when it has one, else a hash of the node's
 * name: a run is reproducible, where ONNX Runtime draws a new seed per session without one.
 * Normal values come in pairs from two uniforms by Box-Muller.
 *
 * Invariant: output dtypes are checked by the shape functions (floating point for the
 * distributions, any numeric or bool for Bernoulli, int32 / int64 for Multinomial's indices);
 * Multinomial's input is 2-D with at least one class and its draws index inside it. Constant
 * folding never runs these ops (passes/fold.c). */
#include "kernels/ref/nn_common.h"

/* ---- the generator --------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The stream of node n: its seed's bits, or its name's FNV-1a hash. */
static uint64_t rnd_key(const af_node *n) {
    const af_attr *s = af_node_attr(n, "seed");
    if (s) {
        double v = s->type == AF_ATTR_FLOAT ? s->f : (double)s->i;
        uint64_t bits;
        memcpy(&bits, &v, sizeof bits);
        return mix64(bits ^ 0x5eedULL);
    }
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = n->name ? n->name : ""; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    return mix64(h ^ (uint64_t)n->op);
}

/* Uniform in [0, 1) with 53 random bits: draw i of the stream. */
static double rnd_uniform(uint64_t key, uint64_t i) {
    return (double)(mix64(key + i * 0x9e3779b97f4a7c15ULL) >> 11) * 0x1.0p-53;
}

/* Normal draws 2k and 2k + 1, from uniform draws 2k and 2k + 1 (Box-Muller's pair); in float
 * arithmetic (3x faster) unless the output is double. */
static void rnd_normal2(uint64_t key, uint64_t k, bool dbl, double *z) {
    double u1 = rnd_uniform(key, 2 * k), u2 = rnd_uniform(key, 2 * k + 1);
    if (dbl) {
        double r = sqrt(-2.0 * log1p(-u1)), t = 6.283185307179586 * u2; /* 1 - u1 in (0, 1] */
        z[0] = r * cos(t);
        z[1] = r * sin(t);
        return;
    }
    float r = sqrtf(-2.0f * log1pf(-(float)u1)), t = 6.2831853f * (float)u2;
    if (!(r < INFINITY)) /* u1 rounded to 1 in float: the largest value double would give */
        r = 8.5f;
    z[0] = (double)(r * cosf(t));
    z[1] = (double)(r * sinf(t));
}

/* ---- shapes ---------------------------------------------------------------------------------- */

/* dtype attribute (an ONNX type code, which af_dtype's are), else dflt. */
static af_status rnd_dtype(const af_node *n, af_dtype dflt, bool any_numeric, af_dtype *dt,
                           af_error *err) {
    int64_t v = af_attr_int(n, "dtype", (int64_t)dflt);
    *dt = v > AF_DTYPE_UNDEFINED && v <= AF_DTYPE_BFLOAT16 ? (af_dtype)v : AF_DTYPE_UNDEFINED;
    bool ok = nn_is_float(*dt) || (any_numeric && (nn_is_int(*dt) || *dt == AF_DTYPE_BOOL));
    if (!ok)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "dtype %lld is not supported",
                            (long long)v);
    return AF_OK;
}

/* RandomUniform / RandomNormal: the shape attribute. */
af_status shape_random(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    (void)in;
    const int64_t *dims = NULL;
    int rank = af_attr_ints(n, "shape", &dims);
    if (rank < 0 || rank > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing or too long attribute 'shape'");
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "shape[%d] = %lld", i,
                                (long long)dims[i]);
    af_dtype dt;
    af_status st = rnd_dtype(n, AF_DTYPE_FLOAT, false, &dt, err);
    if (!st)
        af_tensor_set_type(out, dt, rank, dims);
    return st;
}

/* RandomUniformLike / RandomNormalLike / Bernoulli: the input's shape; Bernoulli's input holds
 * the probabilities, so it must be floating point. */
af_status shape_random_like(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input");
    bool bernoulli = n->op == AF_OP_BERNOULLI;
    if (bernoulli && !nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "probabilities of %s",
                            af_dtype_name(x->dtype));
    af_dtype dt;
    af_status st = rnd_dtype(n, x->dtype, bernoulli, &dt, err);
    if (!st) {
        af_tensor_type_copy(out, x);
        out->dtype = dt;
    }
    return st;
}

af_status shape_multinomial(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    int64_t samples = af_attr_int(n, "sample_size", 1);
    if (!x || !nn_is_float(x->dtype) || (x->rank >= 0 && x->rank != 2))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "input must be 2-D floating point [batch, classes]");
    if (x->rank == 2 && x->dims[1] == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "no classes to draw from");
    if (samples < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "sample_size %lld", (long long)samples);
    int64_t dt = af_attr_int(n, "dtype", AF_DTYPE_INT32);
    if (dt != AF_DTYPE_INT32 && dt != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "dtype must be int32 or int64");
    int64_t dims[2] = {x->rank == 2 ? x->dims[0] : -1, samples};
    af_tensor_set_type(out, (af_dtype)dt, 2, dims);
    return AF_OK;
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* Uniform in [low, high) or normal(mean, scale), by op. */
static af_status fill(const af_node *n, af_tensor *y, bool normal, af_error *err) {
    af_status st = nn_check_out(n, y, y->rank, y->dims, err);
    if (st)
        return st;
    uint64_t key = rnd_key(n);
    int64_t count = af_tensor_numel(y);
    if (normal) {
        double mean = af_attr_float(n, "mean", 0.0f), scale = af_attr_float(n, "scale", 1.0f);
        for (int64_t i = 0; i < count; i += 2) {
            double z[2];
            rnd_normal2(key, (uint64_t)i / 2, y->dtype == AF_DTYPE_DOUBLE, z);
            nn_put(y, i, mean + scale * z[0]);
            if (i + 1 < count)
                nn_put(y, i + 1, mean + scale * z[1]);
        }
    } else {
        double lo = af_attr_float(n, "low", 0.0f), hi = af_attr_float(n, "high", 1.0f);
        for (int64_t i = 0; i < count; i++)
            nn_put(y, i, lo + (hi - lo) * rnd_uniform(key, (uint64_t)i));
    }
    return AF_OK;
}

af_status ref_random_uniform(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)in, (void)ex;
    return fill(n, &out[0], false, err);
}

af_status ref_random_normal(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    (void)in, (void)ex;
    return fill(n, &out[0], true, err);
}

af_status ref_bernoulli(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *ex,
                        af_error *err) {
    (void)ex;
    const af_tensor *p = in[0];
    af_status st = nn_check_out(n, &out[0], p->rank, p->dims, err);
    if (st)
        return st;
    uint64_t key = rnd_key(n);
    int64_t count = af_tensor_numel(p);
    for (int64_t i = 0; i < count; i++)
        nn_put(&out[0], i, rnd_uniform(key, (uint64_t)i) < af_tensor_get_double(p, i) ? 1.0 : 0.0);
    return AF_OK;
}

/* Each row's draws: classes by their unnormalised log-probabilities (softmax, in double). */
af_status ref_multinomial(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *ex,
                          af_error *err) {
    (void)ex;
    const af_tensor *x = in[0];
    af_tensor *y = &out[0];
    int64_t rows = x->dims[0], classes = x->dims[1], samples = af_attr_int(n, "sample_size", 1);
    af_status st = nn_check_out(n, y, 2, (int64_t[2]){rows, samples}, err);
    if (st)
        return st;
    uint64_t key = rnd_key(n);
    for (int64_t r = 0; r < rows; r++) {
        double top = -INFINITY, sum = 0;
        for (int64_t c = 0; c < classes; c++)
            top = fmax(top, af_tensor_get_double(x, r * classes + c));
        for (int64_t c = 0; c < classes; c++)
            sum += exp(af_tensor_get_double(x, r * classes + c) - top);
        for (int64_t s = 0; s < samples; s++) {
            double u = rnd_uniform(key, (uint64_t)(r * samples + s)) * sum, acc = 0;
            int64_t c = 0;
            for (; c < classes - 1; c++) {
                acc += exp(af_tensor_get_double(x, r * classes + c) - top);
                if (u < acc)
                    break;
            }
            nn_put(y, r * samples + s, (double)c);
        }
    }
    return AF_OK;
}
