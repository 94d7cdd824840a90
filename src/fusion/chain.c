/* Epilogue programs for the rules: which nodes an epilogue can express (activations and the four
 * broadcast arithmetic ops), appending them to a program, reading the program of an existing
 * fused node and writing a program into a new node's inputs and attributes.
 *
 * Invariant: a step is appended only when the fused kernel computes exactly what the node did:
 * its operand is a float32 value other than the chain value that broadcasts unidirectionally to
 * the program's output, and every parameter is a compile-time constant. */
#include "fusion/rule.h"
#include "ir/plugin.h"

#include <math.h>
#include <string.h>

void fuse_epi_init(fuse_epi *e) {
    memset(e, 0, sizeof *e);
}

/* A float32 constant holding one element (any rank): its value. */
static bool const_scalar(const af_value *v, float *out) {
    if (!af_value_is_const(v) || v->type.dtype != AF_DTYPE_FLOAT || af_tensor_numel(&v->type) != 1)
        return false;
    *out = ((const float *)v->type.data)[0];
    return true;
}

/* Clip's bounds: attributes before opset 11, optional constant inputs from then on. */
static bool clip_bounds(const af_node *n, float *lo, float *hi) {
    *lo = -INFINITY;
    *hi = INFINITY;
    if (af_graph_opset(n->graph) < 11) {
        *lo = af_attr_float(n, "min", -INFINITY);
        *hi = af_attr_float(n, "max", INFINITY);
        return true;
    }
    if (n->nin > 1 && n->in[1] && !const_scalar(n->in[1], lo)) return false;
    if (n->nin > 2 && n->in[2] && !const_scalar(n->in[2], hi)) return false;
    return n->nin <= 3;
}

bool fuse_act_op(const af_node *n, int64_t *op, float *p0, float *p1) {
    *p0 = *p1 = 0.0f;
    if (n->nin < 1 || !n->in[0] || n->nout < 1 || !n->out[0]) return false;
    if (n->op == AF_OP_CLIP) {
        *op = AF_EP_CLIP;
        return clip_bounds(n, p0, p1);
    }
    /* Max / Min of the chain value (first) and a constant scalar: a Clip with one bound. The
     * value stays as the node computed it but for the sign of a zero result (Max(-0, 0) is +0,
     * the clamp keeps -0); a NaN bound, which Max would return, is refused. */
    if ((n->op == AF_OP_MAX || n->op == AF_OP_MIN) && n->nin == 2) {
        float c;
        if (!n->in[1] || !const_scalar(n->in[1], &c) || isnan(c) || !af_value_is_f32(n->in[0]) ||
            !af_same_shape(&n->out[0]->type, &n->in[0]->type))
            return false;
        *op = AF_EP_CLIP;
        *p0 = n->op == AF_OP_MAX ? c : -INFINITY;
        *p1 = n->op == AF_OP_MAX ? INFINITY : c;
        return true;
    }
    int step;
    if (!af_op_ep_step(n, &step, p0, p1)) return false;
    *op = step;
    return n->nin == 1;
}

/* The epilogue step of an arithmetic op (its row's .ep); 0 for anything else. */
static int64_t binary_op(af_op op) {
    return af_ep_is_binary(af_ops[op].ep) ? af_ops[op].ep : 0;
}

/* A plugin's op as a custom step: ELEMWISE with map reading y, or BROADCAST with map2 reading y
 * and an operand that broadcasts to the output. */
static const char *custom_step(fuse_epi *e, const af_node *n, const af_value *y, const af_tensor *out) {
    const af_custom_op *c = af_plugin_op(n->domain, n->op_type);
    if (!c || c->op_class == AF_CUSTOM_OPAQUE || n->nout != 1 || !n->out[0]) return AF_NO_MATCH;
    int k = e->n;
    bool unary = c->op_class == AF_CUSTOM_ELEMWISE;
    if (unary ? n->nin != 1 || n->in[0] != y : n->nin != 2 || !n->in[0] || !n->in[1])
        return AF_NO_MATCH;
    if (unary ? !c->map : !c->map2) return "the custom op gives no per-element function";
    int slot = unary || n->in[0] == y ? 0 : 1;
    af_value *t = unary ? NULL : n->in[1 - slot];
    if (!unary && (n->in[slot] != y || t == y)) return AF_NO_MATCH;
    if (!af_value_is_f32(n->out[0]) || (t && !af_value_is_f32(t))) return "dtype is not float32";
    if (t) {
        const char *why = fuse_fits(&t->type, out);
        if (why) return why;
    }
    if (!af_same_shape(&n->out[0]->type, out)) return "broadcast does not fit the output";
    float p[2] = {0.0f, 0.0f};
    if (c->params) c->params((const af_pnode *)n, &af_plugin_graph_api, p);
    e->op[k] = unary ? AF_EP_CUSTOM_UNARY : AF_EP_CUSTOM_BINARY;
    e->flags[k] = slot == 1 ? AF_EP_REVERSED : 0;
    e->p0[k] = p[0];
    e->p1[k] = p[1];
    e->operand[k] = t;
    e->custom[k] = c;
    e->n++;
    return NULL;
}

const char *fuse_epi_append(fuse_epi *e, const af_node *n, const af_value *y, const af_tensor *out) {
    if (e->n >= AF_EP_MAX_STEPS) return AF_NO_MATCH;
    if (n->op == AF_OP_CUSTOM) return custom_step(e, n, y, out);
    int k = e->n;
    int64_t op;
    float p0, p1;
    if (fuse_act_op(n, &op, &p0, &p1)) {
        if (n->in[0] != y) return AF_NO_MATCH;
        e->op[k] = op;
        e->flags[k] = 0;
        e->p0[k] = p0;
        e->p1[k] = p1;
        e->operand[k] = NULL;
        e->n++;
        return NULL;
    }
    op = binary_op(n->op);
    if (!op || n->nin != 2 || !n->in[0] || !n->in[1] || n->nout < 1 || !n->out[0])
        return AF_NO_MATCH;
    int slot = n->in[0] == y ? 0 : 1;
    af_value *t = n->in[1 - slot];
    if (n->in[slot] != y || t == y) return AF_NO_MATCH;
    if (!af_value_is_f32(t) || !af_value_is_f32(n->out[0])) return "dtype is not float32";
    const char *why = fuse_fits(&t->type, out);
    if (why) return why;
    if (!af_same_shape(&n->out[0]->type, out)) return "broadcast does not fit the output";
    e->op[k] = op;
    e->flags[k] = slot == 1 && (op == AF_EP_SUB || op == AF_EP_DIV || op == AF_EP_PRELU) ? AF_EP_REVERSED : 0;
    e->p0[k] = e->p1[k] = 0.0f;
    e->operand[k] = t;
    e->n++;
    return NULL;
}

const char *fuse_epi_load(fuse_epi *e, const af_node *fused, int first) {
    fuse_epi_init(e);
    const int64_t *ops = NULL;
    const float *ps = NULL;
    int nops = af_attr_ints(fused, "epilogue", &ops);
    int nps = af_attr_floats(fused, "epilogue_params", &ps);
    const af_attr *names = af_node_attr(fused, "custom_ops");
    if (nops < 0) return NULL;
    if (nops % 3 || nops / 3 > AF_EP_MAX_STEPS || (nps >= 0 && nps != nops / 3 * 2))
        return "fused op has a malformed epilogue";
    for (int s = 0; s < nops / 3; s++) {
        int64_t op = ops[3 * s], idx = ops[3 * s + 1], flags = ops[3 * s + 2];
        e->op[s] = op;
        e->flags[s] = flags;
        e->p0[s] = nps > 0 ? ps[2 * s] : 0.0f;
        e->p1[s] = nps > 0 ? ps[2 * s + 1] : 0.0f;
        if (op == AF_EP_CUSTOM_UNARY || op == AF_EP_CUSTOM_BINARY) {
            int64_t c = flags >> AF_EP_CUSTOM_SHIFT;
            if (flags < 0 || !names || names->type != AF_ATTR_STRINGS || c >= names->n ||
                !(e->custom[s] = af_plugin_op_key(names->strings[c])))
                return "fused op has a custom step whose op is not loaded";
            e->flags[s] = flags & AF_EP_REVERSED;
        }
        if (af_ep_is_binary(op)) {
            if (idx < first || idx >= fused->nin || !fused->in[idx])
                return "fused op has a malformed epilogue";
            e->operand[s] = fused->in[idx];
        } else if (!af_ep_is_unary(op) || af_ep_unary_check(op, e->p0[s], e->p1[s])) {
            return "fused op has a malformed epilogue";
        }
    }
    e->n = nops / 3;
    return NULL;
}

int fuse_epi_operands(const fuse_epi *e) {
    int c = 0;
    for (int s = 0; s < e->n; s++) c += e->operand[s] != NULL;
    return c;
}

af_status fuse_epi_emit(af_node *dst, const fuse_epi *e, int first, af_error *err) {
    if (e->n == 0) return AF_OK;
    int64_t ops[3 * AF_EP_MAX_STEPS];
    float ps[2 * AF_EP_MAX_STEPS];
    const char *names[AF_EP_MAX_STEPS];
    int ncustom = 0, slot = first;
    for (int s = 0; s < e->n; s++) {
        int64_t idx = -1;
        if (e->operand[s]) {
            AF_ASSERT(slot < dst->nin);
            af_node_set_input(dst, slot, e->operand[s]);
            idx = slot++;
        }
        ops[3 * s] = e->op[s];
        ops[3 * s + 1] = idx;
        ops[3 * s + 2] = e->flags[s];
        if (e->custom[s]) { /* the op by name: the .afm must not depend on load order */
            char key[512];
            af_plugin_op_key_of(e->custom[s], key, sizeof key);
            names[ncustom] = af_arena_strdup(dst->graph->arena, key);
            if (!names[ncustom]) return af_node_fail(err, dst, AF_ERR_NOMEM, "out of memory");
            ops[3 * s + 2] |= (int64_t)ncustom++ << AF_EP_CUSTOM_SHIFT;
        }
        ps[2 * s] = e->p0[s];
        ps[2 * s + 1] = e->p1[s];
    }
    if (!af_node_set_ints(dst, "epilogue", ops, 3 * e->n) ||
        !af_node_set_floats(dst, "epilogue_params", ps, 2 * e->n))
        return af_node_fail(err, dst, AF_ERR_NOMEM, "out of memory");
    if (ncustom) {
        const char **list = af_arena_calloc(dst->graph->arena, (size_t)ncustom, sizeof *list);
        af_attr *at = list ? af_node_add_attr(dst, "custom_ops", AF_ATTR_STRINGS) : NULL;
        if (!at) return af_node_fail(err, dst, AF_ERR_NOMEM, "out of memory");
        memcpy(list, names, sizeof *list * (size_t)ncustom);
        at->strings = list;
        at->n = ncustom;
    }
    return AF_OK;
}
