/* Fused cores: how a Conv, MatMul, Gemm or an existing fused node becomes the core of a
 * FusedConv / FusedMatMul / FusedElementwise that the rules then extend with epilogue steps and
 * a LayerNorm prologue. Gemm's C becomes the 1-D bias input when it is [N], else the first
 * epilogue step (an Add of C, which broadcasts to [M, N]); beta other than 1 is folded into a new
 * constant.
 *
 * Invariant: fuse_core_init only reads the graph; everything fuse_core_build will need to create
 * (a scaled C) was checked possible by fuse_core_init. */
#include "fusion/rule.h"

#include <string.h>

bool fuse_core_op(af_op op) {
    return op == AF_OP_CONV || op == AF_OP_MATMUL || op == AF_OP_GEMM ||
           op == AF_OP_FUSED_CONV || op == AF_OP_FUSED_MATMUL || op == AF_OP_FUSED_ELEMENTWISE;
}

static af_value *input(const af_node *n, int i) {
    return i < n->nin ? n->in[i] : NULL;
}

/* Gemm: where C goes and whether beta needs a new constant. */
static const char *gemm_c(fuse_core *c, af_node *gemm) {
    af_value *cv = input(gemm, 2), *y = gemm->out[0];
    float beta = af_attr_float(gemm, "beta", 1.0f);
    if (!cv || beta == 0.0f) return NULL;
    c->c_scale = beta;
    if (beta != 1.0f && !(af_value_is_const(cv) && af_value_is_f32(cv)))
        return "Gemm scales a C that is not constant";
    if (!af_value_is_f32(cv)) return "dtype is not float32";
    const af_tensor *t = &cv->type, *yt = &y->type;
    if (t->rank == 1 && yt->rank == 2 && t->dims[0] >= 0 && t->dims[0] == yt->dims[1]) {
        c->in[2] = cv;
        return NULL;
    }
    const char *why = fuse_fits(t, yt);
    if (why) return why;
    c->c_step = c->epi.n;
    c->epi.op[c->epi.n] = AF_EP_ADD;
    c->epi.operand[c->epi.n] = cv;
    c->epi.n++;
    return NULL;
}

const char *fuse_core_init(fuse_core *c, af_node *src) {
    memset(c, 0, sizeof *c);
    c->src = src;
    c->c_scale = 1.0f;
    c->c_step = -1;
    if (!fuse_core_op(src->op) || src->nout < 1 || !src->out[0]) return AF_NO_MATCH;
    switch (src->op) {
    case AF_OP_CONV:
        c->op = AF_OP_FUSED_CONV;
        c->nfixed = 3;
        for (int i = 0; i < 3; i++) c->in[i] = input(src, i);
        return c->in[0] && c->in[1] && src->nin <= 3 ? NULL : AF_NO_MATCH;
    case AF_OP_MATMUL:
        c->op = AF_OP_FUSED_MATMUL;
        c->nfixed = 5;
        c->in[0] = input(src, 0);
        c->in[1] = input(src, 1);
        return c->in[0] && c->in[1] && src->nin == 2 ? NULL : AF_NO_MATCH;
    case AF_OP_GEMM:
        c->op = AF_OP_FUSED_MATMUL;
        c->nfixed = 5;
        c->in[0] = input(src, 0);
        c->in[1] = input(src, 1);
        if (!c->in[0] || !c->in[1] || src->nin > 3) return AF_NO_MATCH;
        return gemm_c(c, src);
    case AF_OP_FUSED_CONV:
        c->op = AF_OP_FUSED_CONV;
        c->nfixed = 3;
        for (int i = 0; i < 3; i++) c->in[i] = input(src, i);
        return c->in[0] && c->in[1] ? fuse_epi_load(&c->epi, src, 3) : AF_NO_MATCH;
    case AF_OP_FUSED_MATMUL:
        c->op = AF_OP_FUSED_MATMUL;
        c->nfixed = 5;
        for (int i = 0; i < 5; i++) c->in[i] = input(src, i);
        c->ln = c->in[3] != NULL;
        c->ln_epsilon = af_attr_float(src, "ln_epsilon", 1e-5f);
        return c->in[0] && c->in[1] ? fuse_epi_load(&c->epi, src, 5) : AF_NO_MATCH;
    default: /* AF_OP_FUSED_ELEMENTWISE */
        c->op = AF_OP_FUSED_ELEMENTWISE;
        c->nfixed = 1;
        c->in[0] = input(src, 0);
        return c->in[0] ? fuse_epi_load(&c->epi, src, 1) : AF_NO_MATCH;
    }
}

/* beta * C as a new constant. */
static af_value *scaled_c(const fuse_core *c, af_error *err) {
    af_node *gemm = c->src;
    const af_value *cv = gemm->in[2];
    af_value *v = af_value_new_f32(gemm->graph, "gemm_c_scaled", cv->type.rank, cv->type.dims);
    if (!v) {
        af_node_fail(err, gemm, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    int64_t numel = af_tensor_numel(&cv->type);
    const float *s = cv->type.data;
    float *d = v->type.data;
    for (int64_t i = 0; i < numel; i++) d[i] = (float)((double)s[i] * c->c_scale);
    return v;
}

af_node *fuse_core_build(fuse_core *c, const char *name, af_error *err) {
    af_node *src = c->src;
    if (c->c_scale != 1.0f && src->op == AF_OP_GEMM) {
        af_value *v = scaled_c(c, err);
        if (!v) return NULL;
        if (c->c_step >= 0) c->epi.operand[c->c_step] = v;
        else c->in[2] = v;
        c->c_scale = 1.0f;
    }
    af_node *n = af_node_new_ours(src->graph, c->op, name, c->nfixed + fuse_epi_operands(&c->epi));
    if (!n) {
        af_node_fail(err, src, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < c->nfixed; i++)
        if (c->in[i]) af_node_set_input(n, i, c->in[i]);
    bool ok = true;
    if (src->op == AF_OP_GEMM) {
        int64_t ta = af_attr_int(src, "transA", 0), tb = af_attr_int(src, "transB", 0);
        float alpha = af_attr_float(src, "alpha", 1.0f);
        if (ta) ok = ok && af_node_set_int(n, "trans_a", 1);
        if (tb) ok = ok && af_node_set_int(n, "trans_b", 1);
        if (alpha != 1.0f) ok = ok && af_node_set_float(n, "alpha", alpha);
    } else if (src->op != AF_OP_MATMUL) {
        ok = fuse_copy_attrs(n, src);
    }
    if (ok && c->ln && !af_node_attr(n, "ln_epsilon"))
        ok = af_node_set_float(n, "ln_epsilon", c->ln_epsilon);
    if (!ok) {
        af_node_fail(err, src, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (fuse_epi_emit(n, &c->epi, c->nfixed, err) != AF_OK) return NULL;
    return n;
}
