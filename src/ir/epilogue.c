/* The epilogue program of fused ops (see epilogue.h): its step codes, and the checking and
 * decoding of a node's "epilogue" / "epilogue_params" attributes.
 *
 * Invariant: a decoded af_epilogue only holds steps the kernels can run, with operand strides
 * that keep every read inside the operand (checked once per kernel call). */
#include "ir/epilogue.h"
#include "ir/plugin.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int af_epilogue_steps(const af_node *n, int64_t e[3 * AF_EP_MAX_STEPS], float q[2 * AF_EP_MAX_STEPS]) {
    const int64_t *ep = NULL;
    const float *pr = NULL;
    int ne = af_attr_ints(n, "epilogue", &ep), np = af_attr_floats(n, "epilogue_params", &pr);
    memset(q, 0, 2 * AF_EP_MAX_STEPS * sizeof *q);
    if (ne < 0) return 0;
    if (ne % 3 || ne > 3 * AF_EP_MAX_STEPS || (np > 0 && np != ne / 3 * 2)) return -1;
    memcpy(e, ep, (size_t)ne * sizeof *e);
    if (np > 0) memcpy(q, pr, (size_t)np * sizeof *q);
    return ne / 3;
}

bool af_epilogue_set_steps(af_node *n, const int64_t *e, const float *q, int nsteps) {
    af_node_drop_attr(n, "epilogue"); /* set_* adds an attribute: the first one would win */
    af_node_drop_attr(n, "epilogue_params");
    return nsteps == 0 || (af_node_set_ints(n, "epilogue", e, 3 * nsteps) &&
                           af_node_set_floats(n, "epilogue_params", q, 2 * nsteps));
}

bool af_ep_is_binary(int64_t op) {
    return (op >= AF_EP_ADD && op <= AF_EP_DIV) || op == AF_EP_PRELU || op == AF_EP_CUSTOM_BINARY;
}

bool af_ep_is_unary(int64_t op) {
    return (op >= AF_EP_RELU && op <= AF_EP_ELU) || op == AF_EP_CUSTOM_UNARY ||
           op == AF_EP_FAKE_QUANT;
}

const char *af_ep_unary_check(int64_t op, float p0, float p1) {
    (void)p1;
    if (!af_ep_is_unary(op))
        return "unknown activation";
    if (op == AF_EP_GELU && p0 != 0.0f && p0 != 1.0f)
        return "GELU form must be 0 (erf) or 1 (tanh)";
    /* the kernels' clamp bounds -z and 255 - z must be integers, and y / s finite for finite y
     * except where it saturates */
    if (op == AF_EP_FAKE_QUANT && !(p0 > 0.0f && isfinite(p0)))
        return "fake quantization scale must be positive and finite";
    if (op == AF_EP_FAKE_QUANT && !(p1 >= 0.0f && p1 <= 255.0f && p1 == floorf(p1)))
        return "fake quantization zero point must be an integer in [0, 255]";
    return NULL;
}

/* Ops whose parameters must be given (no neutral default exists). */
static bool ep_needs_params(int64_t op) {
    return op == AF_EP_CLIP || op == AF_EP_LEAKY_RELU || op == AF_EP_HARD_SIGMOID ||
           op == AF_EP_ELU || op == AF_EP_FAKE_QUANT;
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

/* The data of a float32 operand that holds all its elements, or NULL. */
static const float *operand_data(const af_tensor *t) {
    int64_t cnt = af_tensor_numel(t);
    return t->data && cnt >= 0 && (size_t)cnt <= t->nbytes / sizeof(float) ? t->data : NULL;
}

/* Shared walk over the program: validates every step; fills ep when it is not NULL (then dims
 * must be known, and with `bind` the operands' data present). */
static af_status ep_check(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                          const char *attr, af_epilogue *ep, bool bind, af_error *err) {
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
            if (!af_tensor_known(t))
                return af_node_fail(err, n, AF_ERR_INTERNAL,
                                    "epilogue step %d: operand shape unknown", s);
            st->input = (int)opnd;
            af_broadcast_strides(t, y, st->strides);
            if (bind && !(st->operand = operand_data(t)))
                return af_node_fail(err, n, AF_ERR_INTERNAL,
                                    "epilogue step %d: operand data missing", s);
        }
        ep->nsteps = s + 1;
    }
    return AF_OK;
}

af_status af_epilogue_validate(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                               af_error *err) {
    return ep_check(n, in, y, "epilogue", NULL, false, err);
}

/* The program for output type y, bound to the operands' data or not. */
static af_status ep_decode(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                           const char *attr, af_epilogue *ep, bool bind, af_error *err) {
    if (!af_tensor_known(y))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output shape unknown at run time");
    return ep_check(n, in, y, attr, ep, bind, err);
}

af_status af_epilogue_parse_attr(const af_node *n, const af_tensor *const *in,
                                 const af_tensor *y, const char *attr, af_epilogue *ep,
                                 af_error *err) {
    return ep_decode(n, in, y, attr, ep, true, err);
}

af_status af_epilogue_prepare_attr(const af_node *n, const af_tensor *const *in,
                                   const af_tensor *y, const char *attr, af_epilogue *ep,
                                   af_error *err) {
    return ep_decode(n, in, y, attr, ep, false, err);
}

af_status af_epilogue_bind(const af_node *n, af_epilogue *ep, const af_tensor *const *in,
                           af_error *err) {
    for (int s = 0; s < ep->nsteps; s++) {
        af_ep_step *st = &ep->steps[s];
        if (!af_ep_is_binary(st->op)) continue;
        if (!(st->operand = operand_data(in[st->input])))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "epilogue step %d: operand data missing",
                                s);
    }
    return AF_OK;
}

af_status af_epilogue_parse(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                            af_epilogue *ep, af_error *err) {
    return af_epilogue_parse_attr(n, in, y, "epilogue", ep, err);
}

bool af_op_ep_step(const af_node *n, int *op, float *p0, float *p1) {
    const af_op_info *row = &af_ops[n->op];
    float p[2] = {0.0f, 0.0f};
    if (!af_ep_is_unary(row->ep) || n->op == AF_OP_CLIP) return false;
    for (int i = 0; i < 2; i++)
        if (row->ep_p[i].attr) p[i] = af_attr_float(n, row->ep_p[i].attr, row->ep_p[i].dflt);
    /* Gelu's form is a string: "none" (erf) is p0 0, "tanh" p0 1. */
    if (n->op == AF_OP_GELU) {
        const char *form = af_attr_str(n, "approximate", "none");
        if (strcmp(form, "none") && strcmp(form, "tanh")) return false;
        p[0] = strcmp(form, "tanh") ? 0.0f : 1.0f;
    }
    *op = row->ep;
    *p0 = p[0];
    *p1 = p[1];
    return true;
}
