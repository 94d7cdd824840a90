/* The reference application of an epilogue program (see epilogue.h) to a run of outputs.
 *
 * Invariant: a step reads its operand only at the broadcast strides af_epilogue_parse checked. */
#include "kernels/ref/epilogue.h"
#include "ir/plugin.h"

static float ep_sigmoid(float x) {
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

float af_ep_unary(af_ep_op op, float x, float p0, float p1) {
    double d = x;
    switch (op) {
    case AF_EP_RELU: return x < 0.0f ? 0.0f : x; /* NaN stays NaN, as in Relu */
    case AF_EP_CLIP: x = x < p0 ? p0 : x; return x > p1 ? p1 : x; /* as Clip: max wins */
    case AF_EP_LEAKY_RELU: return x < 0.0f ? p0 * x : x;
    case AF_EP_SIGMOID: return ep_sigmoid(x);
    case AF_EP_HARD_SIGMOID: {
        double v = (double)p0 * d + (double)p1;
        return (float)(v < 0.0 ? 0.0 : (v > 1.0 ? 1.0 : v));
    }
    case AF_EP_HARD_SWISH: {
        double v = d / 6.0 + 0.5;
        return (float)(d * (v < 0.0 ? 0.0 : (v > 1.0 ? 1.0 : v)));
    }
    case AF_EP_SILU: return (float)(d / (1.0 + exp(-d)));
    case AF_EP_GELU:
        if (p0 == 0.0f)
            return (float)(0.5 * d * (1.0 + erf(d * 0.70710678118654752440)));
        return (float)(0.5 * d * (1.0 + tanh(0.79788456080286535588 * (d + 0.044715 * d * d * d))));
    case AF_EP_TANH: return (float)tanh(d);
    case AF_EP_ELU: return x < 0.0f ? (float)((double)p0 * expm1(d)) : x;
    case AF_EP_FAKE_QUANT: return af_fake_quant(x, p0, p1);
    default: return x; /* binary ops never reach here (af_epilogue_parse keeps them apart) */
    }
}

/* y[j] = y[j] (op) b[j * bs] (or b (op) y with `rev`) for j < len. One loop per op and per
 * kind of stride (0: one operand value for the run, 1: contiguous, else strided) so that the
 * common cases compile to straight, vectorisable loops. */
#define EP_RUN(expr)                                                                              \
    do {                                                                                          \
        if (bs == 0) {                                                                            \
            float bv = b[0];                                                                      \
            for (int64_t j = 0; j < len; j++) {                                                   \
                float yv = y[j];                                                                  \
                y[j] = (expr);                                                                    \
            }                                                                                     \
        } else if (bs == 1) {                                                                     \
            for (int64_t j = 0; j < len; j++) {                                                   \
                float yv = y[j], bv = b[j];                                                       \
                y[j] = (expr);                                                                    \
            }                                                                                     \
        } else {                                                                                  \
            for (int64_t j = 0; j < len; j++) {                                                   \
                float yv = y[j], bv = b[j * bs];                                                  \
                y[j] = (expr);                                                                    \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* A plugin's map2 over a run whose operand advances by bs (0: one value): contiguous operands
 * go straight in, the others through a local buffer. */
static void ep_custom_run(const af_ep_step *st, float *y, int64_t len, const float *b, int64_t bs) {
    const float p[2] = {st->p0, st->p1};
    float tmp[256];
    for (int64_t j = 0; j < len;) {
        int64_t m = bs == 1 ? len - j : (len - j < 256 ? len - j : 256);
        const float *bb = b + j * bs;
        if (bs != 1) {
            for (int64_t i = 0; i < m; i++) tmp[i] = b[(j + i) * bs];
            bb = tmp;
        }
        if (st->reversed) st->custom->map2(p, bb, y + j, y + j, m);
        else st->custom->map2(p, y + j, bb, y + j, m);
        j += m;
    }
}

static void ep_binary_run(const af_ep_step *st, float *y, int64_t len, const float *b,
                          int64_t bs) {
    af_ep_op op = st->op;
    bool rev = st->reversed;
    if (op == AF_EP_CUSTOM_BINARY) {
        ep_custom_run(st, y, len, b, bs);
        return;
    }
    switch (op) {
    case AF_EP_ADD: EP_RUN(rev ? bv + yv : yv + bv); break;
    case AF_EP_SUB: EP_RUN(rev ? bv - yv : yv - bv); break;
    case AF_EP_MUL: EP_RUN(rev ? bv * yv : yv * bv); break;
    case AF_EP_PRELU: EP_RUN(rev ? (bv < 0 ? bv * yv : bv) : (yv < 0 ? yv * bv : yv)); break;
    default: EP_RUN(rev ? bv / yv : yv / bv); break;
    }
}

#undef EP_RUN

/* One binary step over the run, split into segments along the output's last dim: inside a
 * segment the operand advances by one fixed stride; between segments the multi-index carries
 * into the outer dims and the operand offset follows the broadcast strides. */
static void ep_apply_binary(const af_epilogue *ep, const af_ep_step *st, float *y, int64_t len,
                            const int64_t *idx) {
    int r = ep->rank;
    if (r == 0) { /* scalar output: the run is at most one element, the operand a scalar */
        ep_binary_run(st, y, len, st->operand, 0);
        return;
    }
    int64_t cur[AF_MAX_RANK], off = 0;
    for (int i = 0; i < r; i++) {
        cur[i] = idx[i];
        off += idx[i] * st->strides[i];
    }
    int64_t last = ep->dims[r - 1], ls = st->strides[r - 1];
    for (int64_t j = 0; j < len;) {
        int64_t seg = last - cur[r - 1];
        if (seg > len - j)
            seg = len - j;
        if (seg <= 0)
            break; /* the run went past the output's end: callers never ask for that */
        ep_binary_run(st, y + j, seg, st->operand + off, ls);
        j += seg;
        cur[r - 1] += seg;
        off += seg * ls;
        /* Carry into the outer dims when the segment ended its row. */
        for (int i = r - 1; i > 0 && cur[i] >= ep->dims[i]; i--) {
            off -= cur[i] * st->strides[i];
            cur[i] = 0;
            cur[i - 1]++;
            off += st->strides[i - 1];
        }
    }
}

/* One unary step over the run: the cheap piecewise ops inline, the rest through af_ep_unary. */
static void ep_apply_unary(const af_ep_step *st, float *y, int64_t len) {
    float p0 = st->p0, p1 = st->p1;
    const float p[2] = {p0, p1};
    switch (st->op) {
    case AF_EP_CUSTOM_UNARY:
        st->custom->map(p, y, y, len);
        break;
    case AF_EP_RELU:
        for (int64_t j = 0; j < len; j++)
            y[j] = y[j] < 0.0f ? 0.0f : y[j];
        break;
    case AF_EP_CLIP:
        for (int64_t j = 0; j < len; j++) {
            float t = y[j] < p0 ? p0 : y[j];
            y[j] = t > p1 ? p1 : t;
        }
        break;
    case AF_EP_LEAKY_RELU:
        for (int64_t j = 0; j < len; j++)
            y[j] = y[j] < 0.0f ? p0 * y[j] : y[j];
        break;
    case AF_EP_FAKE_QUANT:
        for (int64_t j = 0; j < len; j++) y[j] = af_fake_quant(y[j], p0, p1);
        break;
    default:
        for (int64_t j = 0; j < len; j++)
            y[j] = af_ep_unary(st->op, y[j], p0, p1);
        break;
    }
}

void af_epilogue_apply(const af_epilogue *ep, float *y, int64_t len, const int64_t *idx) {
    for (int s = 0; s < ep->nsteps; s++) {
        const af_ep_step *st = &ep->steps[s];
        if (st->operand)
            ep_apply_binary(ep, st, y, len, idx);
        else
            ep_apply_unary(st, y, len);
    }
}

void af_epilogue_apply_at(const af_epilogue *ep, float *y, int64_t offset, int64_t len) {
    int64_t idx[AF_MAX_RANK], rest = offset;
    for (int i = ep->rank - 1; i >= 0; i--) {
        int64_t d = ep->dims[i] > 0 ? ep->dims[i] : 1;
        idx[i] = rest % d;
        rest /= d;
    }
    af_epilogue_apply(ep, y + offset, len, idx);
}
