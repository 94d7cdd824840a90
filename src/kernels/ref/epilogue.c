/* The epilogue program of fused ops (see epilogue.h): parsing and validation of the "epilogue" /
 * "epilogue_params" attributes, and the reference (scalar) application to a run of outputs.
 *
 * Invariant: a parsed af_epilogue only holds steps that af_epilogue_apply can run, with operand
 * strides that keep every read inside the operand (validated once per kernel call). */
#include "kernels/ref/epilogue.h"
#include "ir/plugin.h"
#include "kernels/ref/nn_common.h"

#include <stdio.h>

bool af_ep_is_binary(int64_t op) {
    return (op >= AF_EP_ADD && op <= AF_EP_DIV) || op == AF_EP_CUSTOM_BINARY;
}

bool af_ep_is_unary(int64_t op) {
    return (op >= AF_EP_RELU && op <= AF_EP_ELU) || op == AF_EP_CUSTOM_UNARY;
}

const char *af_ep_unary_check(int64_t op, float p0, float p1) {
    (void)p1;
    if (!af_ep_is_unary(op))
        return "unknown activation";
    if (op == AF_EP_GELU && p0 != 0.0f && p0 != 1.0f)
        return "GELU form must be 0 (erf) or 1 (tanh)";
    return NULL;
}

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
    default: return x; /* binary ops never reach here (af_epilogue_parse keeps them apart) */
    }
}

/* Ops whose parameters must be given (no neutral default exists). */
static bool ep_needs_params(int64_t op) {
    return op == AF_EP_CLIP || op == AF_EP_LEAKY_RELU || op == AF_EP_HARD_SIGMOID ||
           op == AF_EP_ELU;
}

/* Whether operand type t broadcasts unidirectionally to y; unknown dims pass. */
static bool ep_broadcastable(const af_tensor *t, const af_tensor *y) {
    if (t->rank < 0 || y->rank < 0)
        return true;
    if (t->rank > y->rank)
        return false;
    for (int i = 0; i < t->rank; i++) {
        int64_t td = t->dims[i], yd = y->dims[y->rank - t->rank + i];
        if (td < 0 || yd < 0 || td == 1 || td == yd)
            continue;
        return false;
    }
    return true;
}

/* The plugin op of custom step s (flags >> AF_EP_CUSTOM_SHIFT indexes "custom_ops"), which
 * must be loaded and give the function the step calls. */
static af_status ep_custom(const af_node *n, int s, int64_t op, int64_t flags,
                           const af_custom_op **out, af_error *err) {
    const af_attr *names = af_node_attr(n, "custom_ops");
    int64_t k = flags >> AF_EP_CUSTOM_SHIFT;
    if (flags < 0 || !names || names->type != AF_ATTR_STRINGS || k >= names->n || !names->strings[k])
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "epilogue step %d: custom op %lld is not in custom_ops", s, (long long)k);
    const af_custom_op *c = af_plugin_op_key(names->strings[k]);
    if (!c)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "epilogue step %d: custom op '%s' is not loaded (give its plugin with "
                            "--plugin or AUTOFUSION_PLUGINS)", s, names->strings[k]);
    if (op == AF_EP_CUSTOM_UNARY ? !c->map : !c->map2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "epilogue step %d: custom op '%s' has no %s function", s,
                            names->strings[k], op == AF_EP_CUSTOM_UNARY ? "map" : "map2");
    *out = c;
    return AF_OK;
}

/* Shared walk over the program: validates every step; fills ep when it is not NULL (then dims
 * must be known and operand data present). */
static af_status ep_check(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                          const char *attr, af_epilogue *ep, af_error *err) {
    const int64_t *prog = NULL;
    const float *params = NULL;
    char pname[64];
    snprintf(pname, sizeof pname, "%s_params", attr);
    int nprog = af_attr_ints(n, attr, &prog);
    int nparams = af_attr_floats(n, pname, &params);
    if (ep) {
        memset(ep, 0, sizeof(*ep));
        ep->rank = y->rank;
        for (int i = 0; i < y->rank; i++)
            ep->dims[i] = y->dims[i];
    }
    if (nprog < 0) {
        if (nparams > 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "epilogue_params without epilogue");
        return AF_OK;
    }
    if (nprog % 3 != 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "epilogue has %d ints, not 3 per step", nprog);
    int nsteps = nprog / 3;
    if (nsteps > AF_EP_MAX_STEPS)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "epilogue has %d steps (at most %d)",
                            nsteps, AF_EP_MAX_STEPS);
    if (nparams >= 0 && nparams != 2 * nsteps)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "epilogue_params has %d floats for %d steps (2 per step)", nparams,
                            nsteps);
    for (int s = 0; s < nsteps; s++) {
        int64_t op = prog[3 * s], opnd = prog[3 * s + 1], flags = prog[3 * s + 2];
        float p0 = nparams > 0 ? params[2 * s] : 0.0f, p1 = nparams > 0 ? params[2 * s + 1] : 0.0f;
        bool custom = op == AF_EP_CUSTOM_UNARY || op == AF_EP_CUSTOM_BINARY;
        if (!custom && (flags & ~(int64_t)AF_EP_REVERSED))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "epilogue step %d: flags %lld", s,
                                (long long)flags);
        const af_custom_op *cop = NULL;
        if (custom) {
            af_status st = ep_custom(n, s, op, flags, &cop, err);
            if (st) return st;
        }
        const af_tensor *t = NULL;
        if (af_ep_is_binary(op)) {
            if (opnd < 0 || opnd >= n->nin || !in[opnd])
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "epilogue step %d: operand input %lld is missing", s,
                                    (long long)opnd);
            t = in[opnd];
            if (t->dtype != AF_DTYPE_FLOAT)
                return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                                    "epilogue step %d: operand is %s, not float", s,
                                    af_dtype_name(t->dtype));
            if (!ep_broadcastable(t, y)) {
                char a[128], b[128];
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "epilogue step %d: operand %s does not broadcast to %s", s,
                                    af_dims_str(t, a, sizeof a), af_dims_str(y, b, sizeof b));
            }
        } else {
            const char *why = af_ep_unary_check(op, p0, p1);
            if (why)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "epilogue step %d (op %lld): %s",
                                    s, (long long)op, why);
            if (opnd != -1)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "epilogue step %d: unary op with operand %lld", s,
                                    (long long)opnd);
            if (nparams < 0 && ep_needs_params(op))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "epilogue step %d needs epilogue_params", s);
        }
        if (!ep)
            continue;
        af_ep_step *st = &ep->steps[s];
        st->op = (af_ep_op)op;
        st->reversed = (flags & AF_EP_REVERSED) != 0;
        st->p0 = p0;
        st->p1 = p1;
        st->custom = cop;
        if (t) {
            int64_t cnt = nn_numel(t);
            if (!t->data || cnt < 0 || (size_t)cnt > t->nbytes / sizeof(float))
                return af_node_fail(err, n, AF_ERR_INTERNAL,
                                    "epilogue step %d: operand data missing", s);
            st->operand = t->data;
            af_broadcast_strides(t, y, st->strides);
        }
        ep->nsteps = s + 1;
    }
    return AF_OK;
}

af_status af_epilogue_validate(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                               af_error *err) {
    return ep_check(n, in, y, "epilogue", NULL, err);
}

af_status af_epilogue_parse_attr(const af_node *n, const af_tensor *const *in,
                                 const af_tensor *y, const char *attr, af_epilogue *ep,
                                 af_error *err) {
    for (int i = 0; i < y->rank; i++)
        if (y->dims[i] < 0)
            return af_node_fail(err, n, AF_ERR_INTERNAL, "output shape unknown at run time");
    return ep_check(n, in, y, attr, ep, err);
}

af_status af_epilogue_parse(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                            af_epilogue *ep, af_error *err) {
    return af_epilogue_parse_attr(n, in, y, "epilogue", ep, err);
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
