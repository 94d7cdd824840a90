/* ElementwiseFusionOp, the generic fuser that runs last: a chain of ops an epilogue can express
 * (Add, Sub, Mul, Div with an operand that broadcasts to the output; the activations of
 * fuse_act_op; a plugin's ELEMWISE and BROADCAST ops that give their per-element function) joins the epilogue of the Conv, MatMul, Gemm or fused op that produces its first
 * input; a chain of two or more such ops with no such producer becomes one FusedElementwise.
 * BatchNormActFusionOp (here too, for the chain it shares): a BatchNormalization no conv took,
 * with the activation chain after it, becomes one FusedElementwise that scales and shifts first.
 *
 * Invariant: the anchor is the first op of the chain; the chain grows only through values with a
 * single reader that are not graph outputs, so nothing outside reads what disappears. */
#include "fusion/rule.h"
#include "ir/plugin.h"

#include <string.h>

/* Scratch use: m->core = the producer whose core takes the chain (NULL: FusedElementwise);
 * m->epi = the whole program; m->val[0] = FusedElementwise's X. */

/* Grow the chain after value y (the output of the last op taken) while the next op fits. */
static af_value *extend(af_match *m, af_value *y, const af_tensor *out) {
    while (!fuse_edge(y)) {
        af_node *next = af_value_sole_reader(y);
        if (!next || fuse_epi_append(&m->epi, next, y, out) || !fuse_match_add(m, next)) break;
        y = next->out[0];
    }
    return y;
}

/* Attach to the producer of input slot `slot` of e: NULL, AF_NO_MATCH or a reason. A shared
 * producer output is a near miss only when `report_edge` (the slot is e's main data path, not
 * an operand such as a residual that other nodes also read). */
static const char *attach(af_node *e, int slot, bool report_edge, af_match *m) {
    af_value *y = slot < e->nin ? e->in[slot] : NULL;
    af_node *p = y ? y->producer : NULL;
    if (!p || p->graph != e->graph || !fuse_core_op(p->op) || p->out[0] != y) return AF_NO_MATCH;
    fuse_core core;
    const char *why = fuse_core_init(&core, p);
    if (!why && fuse_edge(y)) why = report_edge ? fuse_edge(y) : AF_NO_MATCH;
    if (!why) why = fuse_epi_append(&core.epi, e, y, &y->type);
    if (why) return why;
    m->epi = core.epi;
    m->core = p;
    fuse_match_add(m, e);
    fuse_match_add(m, p);
    fuse_match_output(m, extend(m, e->out[0], &y->type));
    return NULL;
}

const char *rule_elementwise_check(af_fusion_ctx *cx, af_node *e, af_match *m) {
    (void)cx;
    int64_t op;
    float p0, p1;
    bool act = fuse_act_op(e, &op, &p0, &p1);
    bool bin = (e->op == AF_OP_ADD || e->op == AF_OP_SUB || e->op == AF_OP_MUL ||
                e->op == AF_OP_DIV) && e->nin == 2 && e->in[0] && e->in[1];
    /* A plugin's ELEMWISE / BROADCAST op joins like an activation / a binary op. */
    const af_custom_op *c = e->op == AF_OP_CUSTOM ? af_plugin_op(e->domain, e->op_type) : NULL;
    act |= c && c->op_class == AF_CUSTOM_ELEMWISE;
    bin |= c && c->op_class == AF_CUSTOM_BROADCAST && e->nin == 2 && e->in[0] && e->in[1];
    if ((!act && !bin) || e->nout < 1 || !e->out[0]) return AF_NO_MATCH;
    /* The main data path of a binary op: the input shaped like the output when the other is
     * not (a bias, a scale); none when both are (a residual Add). */
    int main_slot = 0;
    if (bin) {
        bool s0 = af_same_shape(&e->in[0]->type, &e->out[0]->type);
        bool s1 = af_same_shape(&e->in[1]->type, &e->out[0]->type);
        main_slot = s0 && !s1 ? 0 : s1 && !s0 ? 1 : -1;
    }
    const char *refused = attach(e, 0, main_slot == 0, m);
    if (!refused) return NULL;
    if (bin) {
        const char *why = attach(e, 1, main_slot == 1, m);
        if (!why) return NULL;
        if (refused == AF_NO_MATCH) refused = why;
    }
    /* No producer takes the chain: a FusedElementwise over X, the input shaped like the output. */
    memset(m, 0, sizeof *m);
    af_value *x = e->in[0];
    if (bin && !af_same_shape(&x->type, &e->out[0]->type)) x = e->in[1];
    if (!af_same_shape(&x->type, &e->out[0]->type) || fuse_epi_append(&m->epi, e, x, &x->type))
        return refused;
    fuse_match_add(m, e);
    af_value *y = extend(m, e->out[0], &x->type);
    if (m->n < 2) return refused;
    m->val[0] = x;
    if (refused != AF_NO_MATCH) m->partial = refused;
    fuse_match_output(m, y);
    return NULL;
}

af_status rule_elementwise_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *e = m->node[0], *f;
    if (m->core) {
        fuse_core core;
        fuse_core_init(&core, m->core);
        core.epi = m->epi;
        f = fuse_core_build(&core, m->core->name, err);
        if (!f) return err ? err->code : AF_ERR_NOMEM;
    } else {
        f = af_node_new_ours(e->graph, AF_OP_FUSED_ELEMENTWISE, e->name, 1 + fuse_epi_operands(&m->epi));
        if (!f) return af_node_fail(err, e, AF_ERR_NOMEM, "out of memory");
        af_node_set_input(f, 0, m->val[0]);
        af_status st = fuse_epi_emit(f, &m->epi, 1, err);
        if (st != AF_OK) return st;
    }
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- BatchNormActFusionOp ---------------------------------------------------------------- */

/* A BatchNormalization that no conv took (ConvBNRelu runs first), and the chain of epilogue ops
 * after it (an activation at least; DenseNet's pre-activation BN + Relu before each conv):
 * one FusedElementwise computing act(x * s + t). */
const char *rule_bn_act_check(af_fusion_ctx *cx, af_node *bn, af_match *m) {
    (void)cx;
    if (!fuse_bn_inference(bn)) return AF_NO_MATCH;
    af_value *y = bn->out[0];
    af_node *act = af_value_sole_reader(y);
    int64_t op;
    float p0, p1;
    if (!act || !fuse_act_op(act, &op, &p0, &p1)) return AF_NO_MATCH;
    const char *why = fuse_edge(y);
    if (why) return why;
    fuse_epi_init(&m->epi);
    fuse_match_add(m, bn);
    af_value *last = extend(m, y, &y->type);
    if (m->n < 2) return AF_NO_MATCH;
    fuse_match_output(m, last);
    return NULL;
}

af_status rule_bn_act_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *f = fuse_bn_node(m->node[0], &m->epi, err);
    return f ? fuse_commit(cx, m, f, m->out[0], fuse_all(m), err) : (err ? err->code : AF_ERR_NOMEM);
}
