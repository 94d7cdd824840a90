/* Fused cores: how a Conv, MatMul, Gemm or an existing fused node becomes the core of a
 * FusedConv / FusedMatMul / FusedElementwise that the rules then extend with epilogue steps and
 * a LayerNorm prologue; a GroupNorm (canonical form) takes epilogue steps itself. Gemm's C becomes the 1-D bias input when it is [N], else the first
 * epilogue step (an Add of C, which broadcasts to [M, N]); beta other than 1 is folded into a new
 * constant.
 *
 * Invariant: fuse_core_init only reads the graph; everything fuse_core_build will need to create
 * (a scaled C) was checked possible by fuse_core_init. */
#include "fusion/rule.h"

#include <math.h>

#include <string.h>

bool fuse_core_op(af_op op) {
    return op == AF_OP_CONV || op == AF_OP_CONV_TRANSPOSE || op == AF_OP_MATMUL || op == AF_OP_GEMM ||
           op == AF_OP_FUSED_CONV || op == AF_OP_FUSED_MATMUL || op == AF_OP_FUSED_ELEMENTWISE ||
           op == AF_OP_GROUP_NORM;
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
    case AF_OP_CONV_TRANSPOSE: /* a FusedConv with transposed = 1 */
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
        c->ln_rms = c->ln && af_attr_int(src, "ln_rms", 0) != 0;
        c->ln_epsilon = af_attr_float(src, "ln_epsilon", 1e-5f);
        return c->in[0] && c->in[1] ? fuse_epi_load(&c->epi, src, 5) : AF_NO_MATCH;
    case AF_OP_GROUP_NORM: /* the canonical form; its kernels run the epilogue per group */
        c->op = AF_OP_GROUP_NORM;
        c->nfixed = 3;
        for (int i = 0; i < 3; i++) c->in[i] = input(src, i);
        return c->in[0] && c->in[1] && c->in[2] ? fuse_epi_load(&c->epi, src, 3) : AF_NO_MATCH;
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
        if (ok && src->op == AF_OP_CONV_TRANSPOSE) ok = af_node_set_int(n, "transposed", 1);
    }
    if (ok && c->ln && !af_node_attr(n, "ln_epsilon"))
        ok = af_node_set_float(n, "ln_epsilon", c->ln_epsilon);
    if (ok && c->ln_rms && !af_node_attr(n, "ln_rms")) ok = af_node_set_int(n, "ln_rms", 1);
    if (!ok) {
        af_node_fail(err, src, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (fuse_epi_emit(n, &c->epi, c->nfixed, err) != AF_OK) return NULL;
    return n;
}

/* ---- BatchNormalization as a scale and shift ------------------------------------------------- */

bool fuse_bn_inference(const af_node *bn) {
    if (bn->op != AF_OP_BATCH_NORMALIZATION || bn->nin != 5 || bn->nout < 1 || !bn->out[0] ||
        af_attr_int(bn, "training_mode", 0) || af_attr_int(bn, "spatial", 1) != 1)
        return false;
    for (int o = 1; o < bn->nout; o++)
        if (bn->out[o] && (bn->out[o]->nuses > 0 || bn->out[o]->is_output)) return false;
    const af_value *x = bn->in[0];
    if (!x || x->type.dtype != AF_DTYPE_FLOAT || bn->out[0]->type.dtype != AF_DTYPE_FLOAT ||
        x->type.rank < 2 || x->type.dims[1] < 1)
        return false;
    int64_t c = x->type.dims[1];
    for (int i = 1; i < 5; i++)
        if (!bn->in[i] || !af_value_is_const(bn->in[i]) || !af_value_is_f32(bn->in[i]) ||
            bn->in[i]->type.rank != 1 || bn->in[i]->type.dims[0] != c)
            return false;
    return true;
}

af_node *fuse_bn_node(af_node *bn, fuse_epi *e, af_error *err) {
    af_graph *g = bn->graph;
    const af_value *x = bn->in[0];
    int64_t c = x->type.dims[1], dims[AF_MAX_RANK] = {c};
    int rank = x->type.rank - 1;
    for (int i = 1; i < rank; i++) dims[i] = 1;
    af_value *s = af_value_new_f32(g, "bn_scale", rank, dims), *t = af_value_new_f32(g, "bn_shift", rank, dims);
    if (!s || !t || e->n + 2 > AF_EP_MAX_STEPS) {
        af_node_fail(err, bn, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    const float *sc = bn->in[1]->type.data, *bi = bn->in[2]->type.data;
    const float *mean = bn->in[3]->type.data, *var = bn->in[4]->type.data;
    double eps = af_attr_float(bn, "epsilon", 1e-5f);
    float *sd = s->type.data, *td = t->type.data;
    for (int64_t i = 0; i < c; i++) {
        double k = sc[i] / sqrt((double)var[i] + eps);
        sd[i] = (float)k;
        td[i] = (float)(bi[i] - mean[i] * k);
    }
    /* the scale and shift go first, before the steps e already holds */
    memmove(&e->op[2], &e->op[0], sizeof e->op[0] * (size_t)e->n);
    memmove(&e->flags[2], &e->flags[0], sizeof e->flags[0] * (size_t)e->n);
    memmove(&e->p0[2], &e->p0[0], sizeof e->p0[0] * (size_t)e->n);
    memmove(&e->p1[2], &e->p1[0], sizeof e->p1[0] * (size_t)e->n);
    memmove(&e->operand[2], &e->operand[0], sizeof e->operand[0] * (size_t)e->n);
    memmove(&e->custom[2], &e->custom[0], sizeof e->custom[0] * (size_t)e->n);
    for (int k = 0; k < 2; k++) {
        e->op[k] = k ? AF_EP_ADD : AF_EP_MUL;
        e->flags[k] = 0;
        e->p0[k] = e->p1[k] = 0.0f;
        e->operand[k] = k ? t : s;
        e->custom[k] = NULL;
    }
    e->n += 2;
    af_node *f = af_node_new_ours(g, AF_OP_FUSED_ELEMENTWISE, bn->name, 1 + fuse_epi_operands(e));
    if (!f) {
        af_node_fail(err, bn, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    af_node_set_input(f, 0, bn->in[0]);
    return fuse_epi_emit(f, e, 1, err) == AF_OK ? f : NULL;
}
