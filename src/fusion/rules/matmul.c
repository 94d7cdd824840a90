/* The matrix-product rules:
 *  MatMulBiasActFusionOp   MatMul|Gemm [+ Add] [+ activation] -> FusedMatMul: a 1-D [N] addend
 *                          becomes the bias input, any other addend that broadcasts to the output
 *                          an epilogue Add; reported as MatMulBiasReluFusionOp when the activation
 *                          is Relu;
 *  LayerNormMatMulFusionOp LayerNormalization over the last axis read as A by MatMul/Gemm/
 *                          FusedMatMul nodes -> each becomes a FusedMatMul normalising A's rows as
 *                          it reads them; the LayerNorm stays only for its other readers;
 *  RMSNormMatMulFusionOp   the same for RMSNormalization (FusedMatMul with ln_rms 1).
 *
 * Invariant: checks only read the graph and leave in the match everything apply needs; apply
 * re-derives the core with fuse_core_init (deterministic) and only allocates and rewires. */
#include "fusion/rule.h"

#include <string.h>

static af_value *input(const af_node *n, int i) {
    return i < n->nin ? n->in[i] : NULL;
}

/* ---- MatMulBiasActFusionOp ----------------------------------------------------------------- */

/* Scratch use: m->epi = the steps after the core's own; m->val[0] = the bias input or NULL. */

/* Does a reader of y start something this rule fuses (an Add; for a Gemm also an activation)? */
static bool follower(const af_value *y, bool gemm) {
    for (int u = 0; u < y->nuses; u++) {
        const af_node *r = y->uses[u].node;
        int64_t op;
        float p0, p1;
        if (r->op == AF_OP_ADD || (gemm && fuse_act_op(r, &op, &p0, &p1) && y->uses[u].slot == 0))
            return true;
    }
    return false;
}

/* The Add's other operand when it is a float32 [N] vector for the bias input. */
static af_value *bias_vector(const af_node *add, const af_value *y) {
    if (add->nin != 2 || !add->in[0] || !add->in[1] || add->in[0] == add->in[1]) return NULL;
    af_value *t = add->in[0] == y ? add->in[1] : add->in[0];
    const af_tensor *yt = &y->type;
    if (!af_value_is_f32(t) || t->type.rank != 1 || yt->rank < 1 || t->type.dims[0] < 0 ||
        t->type.dims[0] != yt->dims[yt->rank - 1] || !add->out[0] ||
        add->out[0]->type.rank != yt->rank)
        return NULL;
    return t;
}

const char *rule_matmul_bias_act_check(af_fusion_ctx *cx, af_node *mm, af_match *m) {
    (void)cx;
    bool gemm = mm->op == AF_OP_GEMM;
    if (mm->op != AF_OP_MATMUL && !gemm) return AF_NO_MATCH;
    af_value *y = mm->nout > 0 ? mm->out[0] : NULL;
    if (!y || !follower(y, gemm)) return AF_NO_MATCH;
    if (!gemm) {
        const af_value *a = input(mm, 0), *b = input(mm, 1);
        if (!a || !b || a->type.rank < 2 || b->type.rank != 2) return AF_NO_MATCH;
    }
    fuse_core core;
    const char *why = fuse_core_init(&core, mm);
    if (!why) why = fuse_edge(y);
    if (why) return why;
    fuse_match_add(m, mm);
    const af_tensor *out = &y->type;
    af_node *next = af_value_sole_reader(y);
    int first = core.epi.n;
    if (next->op == AF_OP_ADD) {
        af_value *bias = core.in[2] ? NULL : bias_vector(next, y);
        why = bias ? NULL : fuse_epi_append(&core.epi, next, y, out);
        if (why == AF_NO_MATCH) return AF_NO_MATCH;
        if (why) return why;
        m->val[0] = bias;
        fuse_match_add(m, next);
        y = next->out[0];
        next = fuse_edge(y) ? NULL : af_value_sole_reader(y);
    } else if (!gemm) {
        return AF_NO_MATCH;
    }
    int64_t op;
    float p0, p1;
    if (next && fuse_act_op(next, &op, &p0, &p1) && !fuse_epi_append(&core.epi, next, y, out)) {
        fuse_match_add(m, next);
        y = next->out[0];
        if (op == AF_EP_RELU) m->report_as = "MatMulBiasReluFusionOp";
    }
    if (m->n == 1) return AF_NO_MATCH;
    fuse_epi_init(&m->epi);
    for (int s = first; s < core.epi.n; s++) {
        int k = m->epi.n++;
        m->epi.op[k] = core.epi.op[s];
        m->epi.flags[k] = core.epi.flags[s];
        m->epi.p0[k] = core.epi.p0[s];
        m->epi.p1[k] = core.epi.p1[s];
        m->epi.operand[k] = core.epi.operand[s];
    }
    fuse_match_output(m, y);
    return NULL;
}

/* Append the steps of `more` to e (checked to fit by the check). */
static void epi_concat(fuse_epi *e, const fuse_epi *more) {
    for (int s = 0; s < more->n && e->n < AF_EP_MAX_STEPS; s++) {
        int k = e->n++;
        e->op[k] = more->op[s];
        e->flags[k] = more->flags[s];
        e->p0[k] = more->p0[s];
        e->p1[k] = more->p1[s];
        e->operand[k] = more->operand[s];
    }
}

af_status rule_matmul_bias_act_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *mm = m->node[0];
    fuse_core core;
    fuse_core_init(&core, mm);
    if (m->val[0]) core.in[2] = m->val[0];
    epi_concat(&core.epi, &m->epi);
    af_node *f = fuse_core_build(&core, mm->name, err);
    if (!f) return err ? err->code : AF_ERR_NOMEM;
    return fuse_commit(cx, m, f, m->out[0], fuse_all(m), err);
}

/* ---- LayerNormMatMulFusionOp and RMSNormMatMulFusionOp --------------------------------------- */

/* Both rules are one: the RMSNorm is a LayerNorm without mean and bias (the FusedMatMul's ln_rms
 * attribute), so the products, the row ops and the refusals are the same. */

/* Scratch use: node[0] the LayerNorm (kept; removed at the end when nothing reads it any more);
 * m->core a row op between the LayerNorm and some products, or NULL; then the products that take
 * the prologue, bit i of m->ival[0] set for those reading through the row op.
 * A row op moves whole rows of the last axis without changing them (a Transpose that keeps the
 * last axis last, a Gather on another axis, a Reshape that keeps the last dim), so it commutes
 * with a LayerNorm over that axis: torchvision's MultiheadAttention transposes [B, S, E] to
 * [S, B, E] right after ln_1, ViT's head gathers the class token after the last LayerNorm. The
 * products then read a copy of the row op applied to the LayerNorm's input. */

/* Can product p (reading the LayerNorm output at A) take the prologue? */
static const char *prologue_ok(af_node *p) {
    fuse_core core;
    const char *why = fuse_core_init(&core, p);
    if (why) return why;
    if (core.op != AF_OP_FUSED_MATMUL) return AF_NO_MATCH;
    if (p->op == AF_OP_GEMM && af_attr_int(p, "transA", 0)) return "Gemm reads A transposed";
    if (p->op == AF_OP_FUSED_MATMUL && af_attr_int(p, "trans_a", 0))
        return "FusedMatMul reads A transposed";
    if (core.ln) return AF_NO_MATCH;
    if (p->in[1] == p->in[0]) return AF_NO_MATCH;
    return NULL;
}

static bool is_product(af_op op) {
    return op == AF_OP_MATMUL || op == AF_OP_GEMM || op == AF_OP_FUSED_MATMUL;
}

static bool read_by_product(const af_value *v) {
    for (int u = 0; v && u < v->nuses; u++)
        if (is_product(v->uses[u].node->op) && v->uses[u].slot == 0) return true;
    return false;
}

/* Does t (reading y at input 0) move whole rows of y's last axis? */
static bool row_op(const af_node *t, const af_value *y) {
    const af_tensor *yt = &y->type;
    int rank = yt->rank;
    if (t->nin < 1 || t->in[0] != y || t->nout != 1 || !t->out[0] || rank < 1) return false;
    const af_tensor *ot = &t->out[0]->type;
    if (t->op == AF_OP_TRANSPOSE) {
        const int64_t *perm;
        if (af_attr_ints(t, "perm", &perm) != rank || perm[rank - 1] != rank - 1) return false;
        for (int i = 0; i < rank; i++) {
            if (perm[i] < 0 || perm[i] >= rank) return false;
            for (int k = 0; k < i; k++)
                if (perm[k] == perm[i]) return false;
        }
        return true;
    }
    if (t->op == AF_OP_GATHER) {
        int64_t axis = af_attr_int(t, "axis", 0);
        if (axis < 0) axis += rank;
        return axis >= 0 && axis < rank - 1;
    }
    if (t->op == AF_OP_RESHAPE)
        return ot->rank >= 1 && yt->dims[rank - 1] > 0 &&
               ot->dims[ot->rank - 1] == yt->dims[rank - 1];
    return false;
}

/* The first reader of y that is a row op feeding a product; NULL if none. */
static af_node *row_reader(const af_value *y) {
    for (int u = 0; u < y->nuses; u++) {
        af_node *t = y->uses[u].node;
        if (t->graph == y->graph && y->uses[u].slot == 0 && row_op(t, y) &&
            read_by_product(t->out[0]))
            return t;
    }
    return NULL;
}

/* Add the products reading a at A that can take the prologue; the last refusal in *refused. */
static void collect(af_match *m, const af_node *ln, const af_value *a, bool via,
                    const char **refused) {
    for (int u = 0; u < a->nuses && m->nout < AF_MATCH_OUT_MAX; u++) {
        af_node *p = a->uses[u].node;
        if (!is_product(p->op) || a->uses[u].slot != 0 || p->graph != ln->graph ||
            fuse_match_index(m, p) >= 0 || !p->out[0])
            continue;
        const char *why = prologue_ok(p);
        if (why) {
            if (why != AF_NO_MATCH) *refused = why;
            continue;
        }
        if (m->n >= 63 || !fuse_match_add(m, p)) return;
        if (via) m->ival[0] |= (int64_t)1 << (m->n - 1);
        m->out[m->nout++] = p->out[0];
    }
}

static const char *norm_matmul_check(af_node *ln, af_match *m) {
    af_value *x = input(ln, 0), *scale = input(ln, 1), *bias = input(ln, 2);
    af_value *y = ln->nout > 0 ? ln->out[0] : NULL;
    if (!x || !y) return AF_NO_MATCH;
    af_node *t = row_reader(y);
    if (!t && !read_by_product(y)) return AF_NO_MATCH;
    int rank = x->type.rank;
    int64_t axis = af_attr_int(ln, "axis", -1);
    if (rank < 1) return "shape is not known";
    if (axis != -1 && axis != rank - 1) return "normalisation axis is not the last";
    int64_t k = x->type.dims[rank - 1];
    if (k < 0) return "shape is not known";
    if (!af_value_is_f32(scale) || scale->type.rank != 1 || scale->type.dims[0] != k)
        return "norm scale is not 1-D";
    if (ln->op == AF_OP_RMS_NORMALIZATION && (ln->nin != 2 || ln->nout != 1))
        return "RMSNormalization is not X, Scale -> Y";
    if (bias && (!af_value_is_f32(bias) || bias->type.rank != 1 || bias->type.dims[0] != k))
        return "LayerNorm bias is not 1-D";
    for (int o = 1; o < ln->nout; o++)
        if (ln->out[o] && (ln->out[o]->nuses > 0 || ln->out[o]->is_output))
            return "LayerNorm statistics outputs are used";
    fuse_match_add(m, ln);
    fuse_match_keep(m, ln);
    const char *refused = AF_NO_MATCH;
    collect(m, ln, y, false, &refused);
    if (t) {
        fuse_match_add(m, t);
        fuse_match_keep(m, t);
        m->core = t;
        collect(m, ln, t->out[0], true, &refused);
    }
    return m->nout > 0 ? NULL : refused;
}

const char *rule_layernorm_matmul_check(af_fusion_ctx *cx, af_node *ln, af_match *m) {
    (void)cx;
    return norm_matmul_check(ln, m);
}

const char *rule_rmsnorm_matmul_check(af_fusion_ctx *cx, af_node *rms, af_match *m) {
    (void)cx;
    return norm_matmul_check(rms, m);
}

/* A copy of row op t reading x instead of the LayerNorm output, placed right after t; NULL when
 * out of memory. */
static af_value *row_copy(af_node *t, af_value *x, af_error *err) {
    af_graph *g = t->graph;
    const char *vname = af_graph_unique_name(g, t->out[0]->name);
    af_value *v = vname ? af_value_new(g, vname) : NULL;
    af_node *n = v ? af_node_new(g, t->op, vname, t->nin, 1) : NULL;
    if (!n || !fuse_copy_attrs(n, t)) {
        af_node_fail(err, t, AF_ERR_NOMEM, "out of memory");
        return NULL;
    }
    v->type = t->out[0]->type;
    v->type.data = NULL;
    v->type.nbytes = 0;
    v->type.owns_data = 0;
    n->domain = t->domain;
    n->op_type = t->op_type;
    af_node_set_input(n, 0, x);
    for (int i = 1; i < t->nin; i++)
        if (t->in[i]) af_node_set_input(n, i, t->in[i]);
    af_node_set_output(n, 0, v);
    af_node_move_last_to(g, t->id + 1);
    return v;
}

static af_status norm_matmul_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    af_node *ln = m->node[0], *t = m->core;
    af_value *moved = NULL;
    if (t && m->ival[0]) {
        moved = row_copy(t, ln->in[0], err);
        if (!moved) return err ? err->code : AF_ERR_NOMEM;
    }
    for (int i = 1; i < m->n; i++) {
        af_node *p = m->node[i];
        if (p == t) continue;
        bool via = (m->ival[0] >> i) & 1;
        fuse_core core;
        fuse_core_init(&core, p);
        core.in[0] = via ? moved : ln->in[0];
        core.in[3] = ln->in[1];
        core.in[4] = input(ln, 2);
        core.ln = true;
        core.ln_rms = ln->op == AF_OP_RMS_NORMALIZATION;
        core.ln_epsilon = af_attr_float(ln, "epsilon", 1e-5f);
        af_node *f = fuse_core_build(&core, p->name, err);
        if (!f) return err ? err->code : AF_ERR_NOMEM;
        uint64_t covers = (uint64_t)1 | (uint64_t)1 << i;
        af_status st = fuse_commit(cx, m, f, p->out[0], covers, err);
        if (st != AF_OK) return st;
    }
    if (t) fuse_remove_if_dead(cx, t);
    if (moved) fuse_remove_if_dead(cx, moved->producer);
    fuse_remove_if_dead(cx, ln);
    return AF_OK;
}

af_status rule_layernorm_matmul_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    return norm_matmul_apply(cx, m, err);
}

af_status rule_rmsnorm_matmul_apply(af_fusion_ctx *cx, af_match *m, af_error *err) {
    return norm_matmul_apply(cx, m, err);
}
