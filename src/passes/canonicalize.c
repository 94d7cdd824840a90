/* Canonicalize: decomposed forms that exporters emit become one op each, so that the fuser and
 * the kernels see a single form:
 *   LayerNormalization(x, gamma, beta; axis=-1, epsilon)  from  ReduceMean, Sub, Pow 2 (or
 *       Mul d*d), ReduceMean, Add eps, Sqrt, Div (or Mul by Reciprocal / Pow -0.5), [Mul gamma],
 *       [Add beta]; absent gamma/beta become constants 1/0;
 *   RMSNormalization(x, gamma; axis=-1, epsilon)  from  Pow 2 (or Mul x*x), ReduceMean, Add eps,
 *       then LayerNorm's normalisations with x for x - mean (also x * (1 / Sqrt), torch's
 *       rsqrt), [Mul gamma], [Mul by a constant scalar k, folded: gamma * k]; an absent gamma
 *       becomes constant 1 (or k);
 *   Gelu(x; approximate="none")   from  0.5*x*(1+Erf(x/sqrt2)), in the association orders
 *       torch and Hugging Face emit;
 *   Gelu(x; approximate="tanh")   from  0.5*x*(1+Tanh(sqrt(2/pi)*(x+0.044715*x^3)));
 *   Gelu(x; approximate)  from  ONNX's own Gelu (opset 20), the same op in the default domain;
 *   Silu(x)  from  x*Sigmoid(x);
 *   HardSwish(x)  from  x*HardSigmoid(x; 1/6, 0.5)  and  x*Clip(x+3, 0, 6)/6;
 *   Reshape(x)  from  a Transpose that moves only axes of size 1 (the bytes keep their order:
 *       torch's multi-head attention swaps batch 1 and the sequence axis this way);
 *   Gather(x, idx; axis=1)  from  the channel shuffle Reshape [N, g, C/g, ...] -> Transpose
 *       swapping axes 1 and 2 -> Reshape [N, C, ...] (ShuffleNet): a permutation of the
 *       channels, which the layout pass keeps channels-last;
 *   Reshape(Add(y, Reshape(r)))  from  Add(Reshape(...Reshape(y)), r) where y is a MatMul's or
 *       Gemm's output and r has the Add's shape: the Add moves next to the product, where the
 *       fuser takes it as the residual (ViT's attention output projection and its residual).
 *   Reshape(...Reshape(Act(y)))  from  Act(Reshape(...Reshape(y))), y a MatMul's or Gemm's
 *       output, Act a unary activation: the same nodes rewired (GPT-2's Gemm -> Reshape -> Gelu);
 *   GroupNorm(x, gamma, beta; num_groups, epsilon)  from  torch's GroupNorm export: Reshape to
 *       [N, G, K], InstanceNormalization with constant scale 1 and bias 0, Reshape back to x's
 *       shape, [Mul gamma], [Add beta] with gamma/beta constants per channel ([C, 1, ...]);
 *       and from any other float32 InstanceNormalization with [C] scale and B (C groups),
 *       and from ONNX's GroupNormalization with constant scale and B;
 *   ReduceMean, Sub, Mul, ReduceMean, Sqrt, Add, Div  from  MeanVarianceNormalization (float32,
 *       known dims): its definition in ops that have fast kernels;
 *   QuantizeDequantize(x; scale, zero_point)  from  QuantizeLinear -> DequantizeLinear with the
 *       same constant per-tensor parameters, and through data movement (qdq.c);
 * Existing LayerNormalization nodes get axis -1 when they normalise the last axis.
 *
 * Invariant: a rewrite fires only when every shape, constant, attribute and consumer it relies
 * on checks out: each intermediate value has exactly the consumers the pattern expects (one,
 * except LayerNorm's x - mean, read by the square and the division) and is no graph output;
 * constants are true constants (never overridable inputs) of one element that cannot broaden
 * the result's shape; reductions are over the last axis with keepdims. Otherwise the graph is
 * left exactly as it was. The replacement writes the pattern's last value, so names of graph
 * outputs survive.
 */
#include "ir/epilogue.h"
#include "passes/rewrite.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Constants as exporters write them (float32 roundings of the exact values) match within this
 * relative tolerance; a genuinely different constant does not. */
#define CONST_RTOL 1e-5

/* The nodes a pattern matched, all replaced together. */
#define MATCH_MAX 16
typedef struct match {
    af_node *nodes[MATCH_MAX];
    int n;
} match;

static void take(match *m, af_node *n) {
    AF_ASSERT(m->n < MATCH_MAX);
    m->nodes[m->n++] = n;
}

/* ---- small matchers ------------------------------------------------------------------------ */

static bool near(double v, double want) { return fabs(v - want) <= CONST_RTOL * fabs(want); }

/* The canonical ops compute float32 and float64. */
static bool float_value(const af_value *x) {
    return x && (x->type.dtype == AF_DTYPE_FLOAT || x->type.dtype == AF_DTYPE_DOUBLE);
}

/* c is a one-element constant that, combined elementwise with x, leaves x's shape: its rank is
 * not above x's (a [1,1,1] constant would turn a 2-D x into 3-D). Its value in *v. */
static bool shape_safe_scalar(const af_value *c, const af_value *x, double *v) {
    if (!pass_scalar(c, v)) return false;
    return c->type.rank == 0 || (x->type.rank >= 0 && c->type.rank <= x->type.rank);
}

static bool scalar_is(const af_value *c, const af_value *x, double want) {
    double v;
    return c && shape_safe_scalar(c, x, &v) && near(v, want);
}

/* The other input of binary node b, one of whose inputs is v; NULL when neither is v. */
static af_value *other_input(const af_node *b, const af_value *v) {
    if (b->nin != 2 || !b->in[0] || !b->in[1]) return NULL;
    if (b->in[0] == v) return b->in[1];
    return b->in[1] == v ? b->in[0] : NULL;
}

/* The sole consumer of v when it is a one-output `op` node. */
static af_node *next(const pass_scope *s, const af_value *v, af_op op) {
    af_node *n = pass_sole_user(s, v);
    return n && n->op == op && n->nout == 1 && n->out[0] ? n : NULL;
}

/* The producer of v when it is an `op` node whose only consumer is `user`. */
static af_node *feeding(const pass_scope *s, const af_value *v, af_op op, const af_node *user) {
    af_node *p = pass_producer(s, v, op);
    return p && p->nout == 1 && pass_sole_user(s, v) == user ? p : NULL;
}

/* For a commutative node b = op(x, c) with constant c == want: x (else NULL). */
static af_value *scaled_input(const af_node *b, double want) {
    if (b->nin != 2 || !b->in[0] || !b->in[1]) return NULL;
    if (scalar_is(b->in[1], b->in[0], want)) return b->in[0];
    return scalar_is(b->in[0], b->in[1], want) ? b->in[1] : NULL;
}

/* ---- rewriting ----------------------------------------------------------------------------- */

/* Provenance: the canonical node keeps the names of the nodes it stands for, so that a fused op
 * built from it later names the model's original nodes ("fused_nodes", as fused ops do). */
static bool provenance(af_node *r, const match *m) {
    af_attr *a = af_node_add_attr(r, "fused_nodes", AF_ATTR_STRINGS);
    if (!a || !(a->strings = af_arena_calloc(r->graph->arena, (size_t)m->n + 1, sizeof(char *))))
        return false;
    for (int i = 0; i < m->n; i++) a->strings[i] = m->nodes[i]->name;
    a->n = m->n;
    return true;
}

/* Replace the matched nodes by a new one-output node `op` reading x and writing y. */
static af_status replace(pass_scope *s, const match *m, const af_node *anchor, af_op op,
                         af_value *x, af_value *y, af_node **made, af_error *err) {
    af_node *r = pass_node_new(s, op, anchor, 1, 1);
    if (!r || !provenance(r, m))
        return af_node_fail(err, anchor, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_status st = AF_OK;
    for (int i = 0; i < m->n && !st; i++) st = pass_kill(s, m->nodes[i], err);
    if (st) return st;
    af_node_set_input(r, 0, x);
    af_node_set_output(r, 0, y);
    *made = r;
    return AF_OK;
}

static af_status make_gelu(pass_scope *s, const match *m, const af_node *anchor, af_value *x,
                           af_value *y, const char *approximate, bool *hit, af_error *err) {
    af_node *r = NULL;
    af_status st = replace(s, m, anchor, AF_OP_GELU, x, y, &r, err);
    if (!st && !af_node_set_str(r, "approximate", approximate))
        st = af_node_fail(err, anchor, AF_ERR_NOMEM, "out of memory canonicalizing");
    *hit = !st;
    return st;
}

/* ---- GELU ---------------------------------------------------------------------------------- */

/* a = 1 + v (either order); v's only consumer is that Add. */
static af_value *one_plus(const pass_scope *s, const af_value *v, const af_value *x, match *m) {
    af_node *add = next(s, v, AF_OP_ADD);
    if (!add || !scalar_is(other_input(add, v), x, 1.0)) return NULL;
    take(m, add);
    return add->out[0];
}

/* 0.5 * x * a, a = 1 + f(x), in the three association orders: (x*a)*0.5 (torch),
 * (x*0.5)*a (Hugging Face), (a*0.5)*x. Returns the last node, or NULL. */
static af_node *half_x_times(const pass_scope *s, const af_value *a, const af_value *x,
                             match *m) {
    af_node *m1 = a ? next(s, a, AF_OP_MUL) : NULL;
    af_value *o = m1 ? other_input(m1, a) : NULL;
    if (!o) return NULL;
    take(m, m1);
    if (o == x) {
        af_node *m2 = next(s, m1->out[0], AF_OP_MUL);
        if (!m2 || !scalar_is(other_input(m2, m1->out[0]), x, 0.5)) return NULL;
        take(m, m2);
        return m2;
    }
    af_node *h = feeding(s, o, AF_OP_MUL, m1);
    if (h && scaled_input(h, 0.5) == x) {
        take(m, h);
        return m1;
    }
    if (!scalar_is(o, x, 0.5)) return NULL;
    af_node *m2 = next(s, m1->out[0], AF_OP_MUL);
    if (!m2 || other_input(m2, m1->out[0]) != x) return NULL;
    take(m, m2);
    return m2;
}

/* u = x / sqrt(2) or x * (1/sqrt(2)): x, else NULL. */
static af_value *over_sqrt2(const pass_scope *s, const af_value *u, const af_node *erf,
                            match *m) {
    af_node *p = feeding(s, u, AF_OP_DIV, erf);
    af_value *x = NULL;
    if (p && p->nin == 2 && p->in[0] && scalar_is(p->in[1], p->in[0], M_SQRT2)) x = p->in[0];
    if (!p && (p = feeding(s, u, AF_OP_MUL, erf))) x = scaled_input(p, M_SQRT1_2);
    if (x) take(m, p);
    return x;
}

static af_status gelu_erf(pass_scope *s, af_node *erf, bool *hit, af_error *err) {
    match m = {0};
    af_value *x = erf->nin == 1 && erf->nout == 1 ? over_sqrt2(s, erf->in[0], erf, &m) : NULL;
    if (!float_value(x)) return AF_OK;
    take(&m, erf);
    af_node *last = half_x_times(s, one_plus(s, erf->out[0], x, &m), x, &m);
    return last ? make_gelu(s, &m, erf, x, last->out[0], "none", hit, err) : AF_OK;
}

/* cube = x^3 as Pow(x, 3), x*(x*x) or (x*x)*x; its only consumer is `user`. */
static bool is_cube(const pass_scope *s, const af_value *cube, const af_value *x,
                    const af_node *user, match *m) {
    af_node *p = feeding(s, cube, AF_OP_POW, user);
    if (p) {
        if (p->nin != 2 || p->in[0] != x || !scalar_is(p->in[1], x, 3.0)) return false;
        take(m, p);
        return true;
    }
    if (!(p = feeding(s, cube, AF_OP_MUL, user))) return false;
    af_value *sq = other_input(p, x);
    af_node *q = sq ? feeding(s, sq, AF_OP_MUL, p) : NULL;
    if (!q || q->nin != 2 || q->in[0] != x || q->in[1] != x) return false;
    take(m, p);
    take(m, q);
    return true;
}

/* w = x + 0.044715 * x^3 (either order in both): x, else NULL. */
static af_value *cubic_inner(const pass_scope *s, const af_value *w, const af_node *user,
                             match *m) {
    af_node *add = feeding(s, w, AF_OP_ADD, user);
    if (!add || add->nin != 2 || !add->in[0] || !add->in[1]) return NULL;
    for (int side = 0; side < 2; side++) {
        af_value *x = add->in[side], *k = add->in[1 - side];
        af_node *mk = feeding(s, k, AF_OP_MUL, add);
        match trial = *m;
        if (!mk || x == k) continue;
        af_value *cube = NULL;
        for (int c = 0; c < 2 && !cube; c++)
            if (mk->in[c] && scalar_is(mk->in[1 - c], x, 0.044715)) cube = mk->in[c];
        if (!cube || !is_cube(s, cube, x, mk, &trial)) continue;
        take(&trial, mk);
        take(&trial, add);
        *m = trial;
        return x;
    }
    return NULL;
}

static af_status gelu_tanh(pass_scope *s, af_node *tanh_node, bool *hit, af_error *err) {
    match m = {0};
    if (tanh_node->nin != 1 || tanh_node->nout != 1 || !tanh_node->in[0]) return AF_OK;
    af_node *scale = feeding(s, tanh_node->in[0], AF_OP_MUL, tanh_node);
    if (!scale || scale->nin != 2) return AF_OK;
    af_value *x = NULL;
    for (int c = 0; c < 2 && !x; c++) {
        const af_value *w = scale->in[1 - c];
        double v;
        if (w && scale->in[c] && pass_scalar(scale->in[c], &v) && near(v, sqrt(2.0 / M_PI)))
            x = cubic_inner(s, w, scale, &m);
    }
    /* The scale constant is checked against x's rank only once x is known. */
    if (!float_value(x) || !scaled_input(scale, sqrt(2.0 / M_PI))) return AF_OK;
    take(&m, scale);
    take(&m, tanh_node);
    af_node *last = half_x_times(s, one_plus(s, tanh_node->out[0], x, &m), x, &m);
    return last ? make_gelu(s, &m, tanh_node, x, last->out[0], "tanh", hit, err) : AF_OK;
}

/* ---- SiLU and HardSwish -------------------------------------------------------------------- */

/* gate(x) * x: the Mul that multiplies the gate's output by x, else NULL. */
static af_node *times_x(const pass_scope *s, const af_node *gate, const af_value *x) {
    af_node *mul = next(s, gate->out[0], AF_OP_MUL);
    return mul && other_input(mul, gate->out[0]) == x ? mul : NULL;
}

static af_status unary_rewrite(pass_scope *s, match *m, const af_node *anchor, af_op op,
                               af_value *x, af_value *y, bool *hit, af_error *err) {
    af_node *r;
    af_status st = replace(s, m, anchor, op, x, y, &r, err);
    *hit = !st;
    return st;
}

static af_status silu(pass_scope *s, af_node *sig, bool *hit, af_error *err) {
    match m = {0};
    if (sig->nin != 1 || sig->nout != 1 || !float_value(sig->in[0])) return AF_OK;
    af_node *mul = times_x(s, sig, sig->in[0]);
    if (!mul) return AF_OK;
    take(&m, sig);
    take(&m, mul);
    return unary_rewrite(s, &m, sig, AF_OP_SILU, sig->in[0], mul->out[0], hit, err);
}

static af_status hardswish_hs(pass_scope *s, af_node *hs, bool *hit, af_error *err) {
    match m = {0};
    if (hs->nin != 1 || hs->nout != 1 || !float_value(hs->in[0])) return AF_OK;
    if (!near(af_attr_float(hs, "alpha", 0.2f), 1.0 / 6.0) ||
        !near(af_attr_float(hs, "beta", 0.5f), 0.5))
        return AF_OK;
    af_node *mul = times_x(s, hs, hs->in[0]);
    if (!mul) return AF_OK;
    take(&m, hs);
    take(&m, mul);
    return unary_rewrite(s, &m, hs, AF_OP_HARD_SWISH, hs->in[0], mul->out[0], hit, err);
}

/* v / 6 or v * (1/6), v's only consumer: that node, else NULL. */
static af_node *over_six(const pass_scope *s, const af_value *v, const af_value *x) {
    af_node *d = next(s, v, AF_OP_DIV);
    if (d) return d->nin == 2 && d->in[0] == v && scalar_is(d->in[1], x, 6.0) ? d : NULL;
    d = next(s, v, AF_OP_MUL);
    return d && scalar_is(other_input(d, v), x, 1.0 / 6.0) ? d : NULL;
}

/* x * Clip(x + 3, 0, 6) / 6, dividing before or after the multiplication by x. */
static af_status hardswish_clip(pass_scope *s, af_node *clip, bool *hit, af_error *err) {
    match m = {0};
    double lo, hi;
    if (clip->nin < 1 || !clip->in[0] || clip->nout != 1 || !af_node_clip_bounds(clip, &lo, &hi))
        return AF_OK;
    af_node *add = feeding(s, clip->in[0], AF_OP_ADD, clip);
    af_value *x = add ? scaled_input(add, 3.0) : NULL;
    if (!float_value(x) || lo != 0.0 || !near(hi, 6.0)) return AF_OK;
    take(&m, add);
    take(&m, clip);
    af_node *last = NULL, *mid = times_x(s, clip, x);
    if (mid) {
        last = over_six(s, mid->out[0], x);
    } else if ((mid = over_six(s, clip->out[0], x))) {
        last = times_x(s, mid, x);
    }
    if (!last) return AF_OK;
    take(&m, mid);
    take(&m, last);
    return unary_rewrite(s, &m, clip, AF_OP_HARD_SWISH, x, last->out[0], hit, err);
}

/* ---- LayerNorm ----------------------------------------------------------------------------- */

/* Rows wider than this are left alone: the default scale and bias constants would be huge, and
 * no real model normalises such rows. */
#define LN_MAX_WIDTH ((int64_t)1 << 24)

typedef struct ln_match {
    match m;
    af_value *x, *d, *gamma, *beta, *y;
    af_node *square, *norm;
    int rank;
    int64_t width; /* x's last dim */
    double eps;
    double times; /* RMSNorm: a constant scalar factor after it, folded into gamma (else 1) */
} ln_match;

/* r reduces x's last axis only, keeping it as 1. */
static bool reduces_last(const af_node *r, int rank) {
    int64_t axis;
    int count;
    if (r->nin < 1 || !r->in[0] || r->nout != 1 || af_attr_int(r, "keepdims", 1) != 1)
        return false;
    return af_node_axes(r, &axis, 1, &count) && count == 1 &&
           (axis == -1 || axis == (int64_t)rank - 1);
}

/* d = x - mean, mean = ReduceMean(x) over the last axis; d is read by the square and by the
 * normalisation only (checked once both are found). */
static bool ln_center(const pass_scope *s, af_node *mean, ln_match *l) {
    af_value *x = mean->in[0];
    if (!x || x->type.dtype != AF_DTYPE_FLOAT || x->type.rank < 1 || x->type.rank > AF_MAX_RANK)
        return false;
    l->x = x;
    l->rank = x->type.rank;
    l->width = x->type.dims[l->rank - 1];
    if (l->width < 1 || l->width > LN_MAX_WIDTH || !reduces_last(mean, l->rank)) return false;
    af_node *sub = next(s, mean->out[0], AF_OP_SUB);
    if (!sub || sub->nin != 2 || sub->in[0] != x || sub->in[1] != mean->out[0]) return false;
    l->d = sub->out[0];
    take(&l->m, mean);
    take(&l->m, sub);
    return !pass_pinned(s, l->d);
}

/* The node squaring d: Pow(d, 2) or Mul(d, d). */
static af_node *ln_square(const pass_scope *s, const ln_match *l) {
    for (int u = 0; u < l->d->nuses; u++) {
        af_node *n = l->d->uses[u].node;
        if (n->graph != s->g || pass_dead(s, n) || n->nin != 2 || n->nout != 1) continue;
        if (n->op == AF_OP_POW && n->in[0] == l->d && scalar_is(n->in[1], l->x, 2.0)) return n;
        if (n->op == AF_OP_MUL && n->in[0] == l->d && n->in[1] == l->d) return n;
    }
    return NULL;
}

/* var = ReduceMean(d^2) over the last axis, then var + eps: returns that sum. */
static af_value *ln_variance(const pass_scope *s, ln_match *l) {
    af_node *sq = l->square = ln_square(s, l);
    af_node *var = sq ? next(s, sq->out[0], AF_OP_REDUCE_MEAN) : NULL;
    if (!var || var->in[0] != sq->out[0] || !reduces_last(var, l->rank)) return NULL;
    af_node *add = next(s, var->out[0], AF_OP_ADD);
    af_value *eps = add ? other_input(add, var->out[0]) : NULL;
    if (!eps || !shape_safe_scalar(eps, l->x, &l->eps) || !isfinite(l->eps)) return NULL;
    take(&l->m, sq);
    take(&l->m, var);
    take(&l->m, add);
    return add->out[0];
}

/* d / sqrt(ve), d * reciprocal(sqrt(ve)), d * (1 / sqrt(ve)) (torch's rsqrt), d * ve^-0.5 or
 * d / ve^0.5: the last node. */
static af_node *ln_normalise(const pass_scope *s, const af_value *ve, ln_match *l) {
    af_node *u = pass_sole_user(s, ve), *r, *recip = NULL, *out = NULL;
    if (!u || u->nin < 1 || u->in[0] != ve || u->nout != 1) return NULL;
    bool root = u->op == AF_OP_SQRT ||
                (u->op == AF_OP_POW && u->nin == 2 && scalar_is(u->in[1], l->x, 0.5));
    bool inv_root = u->op == AF_OP_POW && u->nin == 2 && scalar_is(u->in[1], l->x, -0.5);
    if (root && (r = next(s, u->out[0], AF_OP_DIV)) && r->nin == 2 && r->in[1] == u->out[0]) {
        if (r->in[0] == l->d) out = r;
        else if (scalar_is(r->in[0], l->x, 1.0)) recip = r;
    }
    if (root && !out && !recip) recip = next(s, u->out[0], AF_OP_RECIPROCAL);
    if (recip) {
        af_node *mul = next(s, recip->out[0], AF_OP_MUL);
        if (mul && other_input(mul, recip->out[0]) == l->d) {
            take(&l->m, recip);
            out = mul;
        }
    }
    if (inv_root && (r = next(s, u->out[0], AF_OP_MUL)) && other_input(r, u->out[0]) == l->d)
        out = r;
    if (out) take(&l->m, u);
    return out;
}

/* d feeds exactly the square (once, or twice for d*d) and the normalisation. */
static bool ln_d_uses_ok(const ln_match *l) {
    int want = l->square->op == AF_OP_MUL ? 3 : 2;
    if (l->d->nuses != want) return false;
    for (int u = 0; u < l->d->nuses; u++)
        if (l->d->uses[u].node != l->square && l->d->uses[u].node != l->norm) return false;
    return true;
}

/* gamma/beta: float32 [width], what LayerNormalization's Scale and B hold. */
static bool ln_param_ok(const af_value *p, const ln_match *l) {
    return p && p->type.dtype == AF_DTYPE_FLOAT && p->type.rank == 1 &&
           p->type.dims[0] == l->width;
}

/* y = norm [* gamma] [+ beta]: the affine tail, each step taken only when it fits. */
static void ln_affine(const pass_scope *s, ln_match *l) {
    l->y = l->norm->out[0];
    af_node *mul = next(s, l->y, AF_OP_MUL);
    af_value *p = mul ? other_input(mul, l->y) : NULL;
    if (ln_param_ok(p, l)) {
        l->gamma = p;
        take(&l->m, mul);
        l->y = mul->out[0];
    }
    af_node *add = next(s, l->y, AF_OP_ADD);
    p = add ? other_input(add, l->y) : NULL;
    if (ln_param_ok(p, l)) {
        l->beta = p;
        take(&l->m, add);
        l->y = add->out[0];
    }
}

static bool ln_match_at(const pass_scope *s, af_node *mean, ln_match *l) {
    if (!ln_center(s, mean, l)) return false;
    af_value *ve = ln_variance(s, l);
    l->norm = ve ? ln_normalise(s, ve, l) : NULL;
    if (!l->norm || !ln_d_uses_ok(l)) return false;
    take(&l->m, l->norm);
    ln_affine(s, l);
    return true;
}

/* A float32 [width] constant filled with v (LayerNormalization's default scale and bias). */
static af_value *ln_fill(pass_scope *s, const ln_match *l, const char *hint, float v) {
    const char *name = af_graph_unique_name(s->g, hint);
    af_value *c = name ? af_value_new_const(s->g, name, AF_DTYPE_FLOAT, 1, &l->width) : NULL;
    if (c)
        for (int64_t i = 0; i < l->width; i++) ((float *)c->type.data)[i] = v;
    return c;
}

static af_status layernorm(pass_scope *s, af_node *mean, bool *hit, af_error *err) {
    ln_match l = {0};
    if (!ln_match_at(s, mean, &l)) return AF_OK;
    if (!l.gamma) l.gamma = ln_fill(s, &l, "layernorm_scale", 1.0f);
    if (!l.beta) l.beta = ln_fill(s, &l, "layernorm_bias", 0.0f);
    af_node *r = pass_node_new(s, AF_OP_LAYER_NORMALIZATION, mean, 3, 1);
    if (!l.gamma || !l.beta || !r || !af_node_set_int(r, "axis", -1) ||
        !af_node_set_float(r, "epsilon", (float)l.eps) || !provenance(r, &l.m))
        return af_node_fail(err, mean, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_status st = AF_OK;
    for (int i = 0; i < l.m.n && !st; i++) st = pass_kill(s, l.m.nodes[i], err);
    if (st) return st;
    af_node_set_input(r, 0, l.x);
    af_node_set_input(r, 1, l.gamma);
    af_node_set_input(r, 2, l.beta);
    af_node_set_output(r, 0, l.y);
    *hit = true;
    return AF_OK;
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

/* x / sqrt(ReduceMean(x^2) + eps) [* gamma] over the last axis, anchored at the ReduceMean: the
 * square is Pow(x, 2) or Mul(x, x), the normalisation any of LayerNorm's (ln_normalise with
 * d = x: T5's x * (1 / Sqrt), LLaMA's x * Reciprocal(Sqrt), x * Pow -0.5, x / Sqrt), gamma a
 * float32 [width] on either side. x itself may have any other readers (the residual). */
static bool rms_match_at(const pass_scope *s, af_node *var, ln_match *l) {
    af_value *sqv = var->nin >= 1 ? var->in[0] : NULL;
    af_node *sq = feeding(s, sqv, AF_OP_POW, var);
    if (!sq) sq = feeding(s, sqv, AF_OP_MUL, var);
    af_value *x = sq && sq->nin == 2 ? sq->in[0] : NULL;
    if (!x || x->type.dtype != AF_DTYPE_FLOAT || x->type.rank < 1 || x->type.rank > AF_MAX_RANK)
        return false;
    if (sq->op == AF_OP_POW ? !scalar_is(sq->in[1], x, 2.0) : sq->in[1] != x) return false;
    l->x = l->d = x;
    l->rank = x->type.rank;
    l->width = x->type.dims[l->rank - 1];
    if (l->width < 1 || l->width > LN_MAX_WIDTH || !reduces_last(var, l->rank)) return false;
    af_node *add = next(s, var->out[0], AF_OP_ADD);
    af_value *eps = add ? other_input(add, var->out[0]) : NULL;
    if (!eps || !shape_safe_scalar(eps, x, &l->eps) || !isfinite(l->eps) || l->eps < 0.0)
        return false;
    take(&l->m, sq);
    take(&l->m, var);
    take(&l->m, add);
    if (!(l->norm = ln_normalise(s, add->out[0], l))) return false;
    take(&l->m, l->norm);
    l->y = l->norm->out[0];
    af_node *mul = next(s, l->y, AF_OP_MUL);
    af_value *p = mul ? other_input(mul, l->y) : NULL;
    if (ln_param_ok(p, l)) {
        l->gamma = p;
        take(&l->m, mul);
        l->y = mul->out[0];
    }
    /* A constant scalar factor after it (T5 scales by d_model^-0.5 before its LM head) folds
     * into a constant gamma, so that the product after it can take the norm as a prologue. */
    l->times = 1.0;
    double k;
    mul = next(s, l->y, AF_OP_MUL);
    p = mul ? other_input(mul, l->y) : NULL;
    if (p && p != l->y && shape_safe_scalar(p, x, &k) && isfinite(k) &&
        (!l->gamma || af_value_is_const(l->gamma))) {
        l->times = k;
        take(&l->m, mul);
        l->y = mul->out[0];
    }
    return true;
}

/* gamma * times as a new constant (the old one may have other readers); absent gamma: times. */
static af_value *rms_scale(pass_scope *s, const ln_match *l) {
    if (!l->gamma) return ln_fill(s, l, "rmsnorm_scale", (float)l->times);
    if (l->times == 1.0) return l->gamma;
    af_value *c = ln_fill(s, l, "rmsnorm_scale", 0.0f);
    for (int64_t i = 0; c && i < l->width; i++)
        ((float *)c->type.data)[i] = (float)(((const float *)l->gamma->type.data)[i] * l->times);
    return c;
}

static af_status rmsnorm(pass_scope *s, af_node *var, bool *hit, af_error *err) {
    ln_match l = {0};
    if (!rms_match_at(s, var, &l)) return AF_OK;
    l.gamma = rms_scale(s, &l);
    af_node *r = pass_node_new(s, AF_OP_RMS_NORMALIZATION, var, 2, 1);
    if (!l.gamma || !r || !af_node_set_int(r, "axis", -1) ||
        !af_node_set_float(r, "epsilon", (float)l.eps) || !provenance(r, &l.m))
        return af_node_fail(err, var, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_status st = AF_OK;
    for (int i = 0; i < l.m.n && !st; i++) st = pass_kill(s, l.m.nodes[i], err);
    if (st) return st;
    af_node_set_input(r, 0, l.x);
    af_node_set_input(r, 1, l.gamma);
    af_node_set_output(r, 0, l.y);
    *hit = true;
    return AF_OK;
}

/* ReduceMean anchors both norms: LayerNorm's mean first, else RMSNorm's mean square. */
static af_status norm_at(pass_scope *s, af_node *mean, bool *hit, af_error *err) {
    bool ln = false;
    af_status st = layernorm(s, mean, &ln, err);
    *hit = *hit || ln;
    return st || ln ? st : rmsnorm(s, mean, hit, err);
}

/* LayerNormalization over the last axis written as a positive axis: make it -1. */
static void layernorm_axis(af_node *n) {
    const af_value *x = n->nin > 0 ? n->in[0] : NULL;
    if (!x || x->type.rank < 1) return;
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, "axis") && n->attrs[a].type == AF_ATTR_INT &&
            n->attrs[a].i == x->type.rank - 1)
            n->attrs[a].i = -1;
}

/* ---- reshapes ------------------------------------------------------------------------------ */

/* Every dim known and at least 1: a shape a Reshape can be given as it is (a 0 there would
 * mean "keep the input's dim"). */
static bool dims_whole(const af_tensor *t) {
    if (t->rank < 0 || t->rank > AF_MAX_RANK) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 1) return false;
    return true;
}

/* A new Reshape of x to the dims of t, writing y; NULL when out of memory. */
static af_node *reshape_to(pass_scope *s, const af_node *anchor, af_value *x, const af_tensor *t,
                           af_value *y) {
    int64_t rank = t->rank;
    const char *name = af_graph_unique_name(s->g, "shape");
    af_value *c = name ? af_value_new_const(s->g, name, AF_DTYPE_INT64, 1, &rank) : NULL;
    af_node *r = c ? pass_node_new(s, AF_OP_RESHAPE, anchor, 2, 1) : NULL;
    if (!r) return NULL;
    memcpy(c->type.data, t->dims, (size_t)rank * sizeof(int64_t));
    af_node_set_input(r, 0, x);
    af_node_set_input(r, 1, c);
    af_node_set_output(r, 0, y);
    return r;
}

/* A value like t (float32 dims), for a rewrite's intermediate; NULL when out of memory. */
static af_value *value_like(pass_scope *s, const char *hint, const af_tensor *t) {
    const char *name = af_graph_unique_name(s->g, hint);
    af_value *v = name ? af_value_new(s->g, name) : NULL;
    if (!v) return NULL;
    v->type.dtype = t->dtype;
    v->type.rank = t->rank;
    memcpy(v->type.dims, t->dims, sizeof(int64_t) * (size_t)t->rank);
    return v;
}

/* Transpose -> Reshape when the axes longer than 1 keep their order. */
static af_status transpose_reshape(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    af_value *x = n->nin > 0 ? n->in[0] : NULL, *y = n->nout > 0 ? n->out[0] : NULL;
    if (!x || !y || !dims_whole(&x->type) || !dims_whole(&y->type)) return AF_OK;
    const int64_t *perm;
    int np = af_attr_ints(n, "perm", &perm), rank = x->type.rank;
    if (np != rank) return AF_OK; /* the default (reversed) perm is left alone */
    int64_t last = -1;
    for (int i = 0; i < rank; i++) {
        if (perm[i] < 0 || perm[i] >= rank) return AF_OK;
        if (x->type.dims[perm[i]] == 1) continue;
        if (perm[i] < last) return AF_OK;
        last = perm[i];
    }
    af_status st = pass_kill(s, n, err);
    if (st) return st;
    if (!reshape_to(s, n, x, &y->type, y))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    *hit = true;
    return AF_OK;
}

/* Reshape x [N, C, S...] to [N, g, C/g, S...], swap axes 1 and 2, Reshape back to [N, C, S...]:
 * output channel a * g + b is input channel b * (C/g) + a, a Gather along axis 1. */
static af_status channel_shuffle(pass_scope *s, af_node *tr, bool *hit, af_error *err) {
    af_value *x5 = tr->in[0], *y5 = tr->out[0];
    af_node *r1 = x5 ? feeding(s, x5, AF_OP_RESHAPE, tr) : NULL, *r2 = y5 ? next(s, y5, AF_OP_RESHAPE) : NULL;
    if (!r1 || !r2 || tr->nout != 1 || !r1->in[0]) return AF_OK;
    af_value *x = r1->in[0], *y = r2->out[0];
    const af_tensor *xt = &x->type, *t5 = &x5->type;
    int r = xt->rank;
    const int64_t *perm;
    if (r < 3 || r > AF_MAX_RANK - 1 || t5->rank != r + 1 || !af_same_shape(xt, &y->type) ||
        af_attr_ints(tr, "perm", &perm) != r + 1)
        return AF_OK;
    for (int i = 1; i <= r; i++) /* the batch may be symbolic, the rest is known */
        if (t5->dims[i] < 1 || (i < r && xt->dims[i] < 1)) return AF_OK;
    int64_t c = xt->dims[1], g = t5->dims[1];
    bool ok = t5->dims[0] == xt->dims[0] && g * t5->dims[2] == c && perm[0] == 0 && perm[1] == 2 &&
              perm[2] == 1;
    for (int i = 2; ok && i < r; i++) ok = t5->dims[i + 1] == xt->dims[i] && perm[i + 1] == i + 1;
    if (!ok) return AF_OK;
    const char *name = af_graph_unique_name(s->g, "shuffle");
    af_value *idx = name ? af_value_new_const(s->g, name, AF_DTYPE_INT64, 1, &c) : NULL;
    af_node *gn = idx ? pass_node_new(s, AF_OP_GATHER, tr, 2, 1) : NULL;
    match m = {{r1, tr, r2}, 3};
    if (!gn || !provenance(gn, &m) || !af_node_set_int(gn, "axis", 1))
        return af_node_fail(err, tr, AF_ERR_NOMEM, "out of memory canonicalizing");
    int64_t *d = idx->type.data, per = c / g;
    for (int64_t a = 0; a < per; a++)
        for (int64_t b = 0; b < g; b++) d[a * g + b] = b * per + a;
    af_status st = AF_OK;
    for (int i = 0; i < m.n && !st; i++) st = pass_kill(s, m.nodes[i], err);
    if (st) return st;
    af_node_set_input(gn, 0, x);
    af_node_set_input(gn, 1, idx);
    af_node_set_output(gn, 0, y);
    *hit = true;
    return AF_OK;
}

/* Add(Reshape(...Reshape(y)), r), y a MatMul's or Gemm's output read only by the chain, r of
 * the Add's dims: Reshape(Add(y, Reshape(r))). */
static af_status add_before_reshape(pass_scope *s, af_node *add, bool *hit, af_error *err) {
    af_value *out = add->nout > 0 ? add->out[0] : NULL;
    if (add->nin != 2 || !out || out->type.dtype != AF_DTYPE_FLOAT || !dims_whole(&out->type))
        return AF_OK;
    for (int side = 0; side < 2; side++) {
        af_value *v = add->in[side], *r = add->in[1 - side];
        if (!v || !r || v == r || r->type.dtype != AF_DTYPE_FLOAT || !af_same_shape(&r->type, &out->type))
            continue;
        match m = {{NULL}, 0};
        af_node *rs;
        while (m.n < MATCH_MAX && (rs = pass_producer(s, v, AF_OP_RESHAPE)) && pass_sole_user(s, v)) {
            take(&m, rs);
            v = rs->in[0];
        }
        bool product = pass_producer(s, v, AF_OP_MATMUL) || pass_producer(s, v, AF_OP_GEMM);
        if (!m.n || !product || !pass_sole_user(s, v) || v->type.dtype != AF_DTYPE_FLOAT ||
            !dims_whole(&v->type) || af_tensor_numel(&v->type) != af_tensor_numel(&out->type))
            continue;
        af_status st = pass_kill(s, add, err);
        for (int i = 0; i < m.n && !st; i++) st = pass_kill(s, m.nodes[i], err);
        if (st) return st;
        af_value *r2 = value_like(s, "residual", &v->type), *t = value_like(s, "sum", &v->type);
        af_node *a2 = r2 && t ? pass_node_new(s, AF_OP_ADD, add, 2, 1) : NULL;
        if (!a2 || !reshape_to(s, add, r, &v->type, r2) || !reshape_to(s, add, t, &out->type, out))
            return af_node_fail(err, add, AF_ERR_NOMEM, "out of memory canonicalizing");
        af_node_set_input(a2, 0, v);
        af_node_set_input(a2, 1, r2);
        af_node_set_output(a2, 0, t);
        *hit = true;
        return AF_OK;
    }
    return AF_OK;
}

/* Act(Reshape(...Reshape(y))), y a MatMul's or Gemm's output read only by the chain, Act a
 * unary epilogue op: Reshape(...Reshape(Act(y))), the same nodes rewired, so that the fuser
 * takes the activation into the product's epilogue (GPT-2's Conv1D is Gemm -> Reshape, and its
 * MLP's Gelu read the Reshape: 3% of the decoder's time as a pass of its own). */
static af_status act_before_reshape(pass_scope *s, af_node *act, bool *hit) {
    int step;
    float p0, p1;
    af_value *v = act->nin == 1 ? act->in[0] : NULL, *out = act->nout == 1 ? act->out[0] : NULL;
    if (!v || !out || !af_op_ep_step(act, &step, &p0, &p1)) return AF_OK;
    af_node *last = pass_producer(s, v, AF_OP_RESHAPE), *first = NULL, *rs;
    if (!last || !pass_sole_user(s, v) || last->nout != 1) return AF_OK;
    af_value *y = v;
    while ((rs = pass_producer(s, y, AF_OP_RESHAPE)) && pass_sole_user(s, y) && rs->nout == 1 &&
           rs->nin >= 1 && rs->in[0]) {
        first = rs;
        y = rs->in[0];
    }
    bool product = pass_producer(s, y, AF_OP_MATMUL) || pass_producer(s, y, AF_OP_GEMM);
    if (!first || !product || !pass_sole_user(s, y) || y->type.dtype != out->type.dtype) return AF_OK;
    /* y -> act -> v (now of y's type) -> first ... last -> out */
    af_node_set_input(act, 0, y);
    af_node_set_input(first, 0, v);
    af_node_set_output(last, 0, out);
    af_node_set_output(act, 0, v);
    v->type.rank = y->type.rank;
    memcpy(v->type.dims, y->type.dims, sizeof v->type.dims);
    memcpy(v->dim_param, y->dim_param, sizeof v->dim_param);
    *hit = true;
    return AF_OK;
}

/* ---- GroupNorm ----------------------------------------------------------------------------- */

typedef struct gn_match {
    match m;
    af_value *x, *gamma, *beta, *y;
    int64_t groups, c;
} gn_match;

/* v is a float32 constant of `count` elements, each equal to want. */
static bool const_fill(const af_value *v, int64_t count, float want) {
    if (!v || !af_value_is_const(v) || !af_value_is_f32(v) || af_tensor_numel(&v->type) != count)
        return false;
    for (int64_t i = 0; i < count; i++)
        if (((const float *)v->type.data)[i] != want) return false;
    return true;
}

/* p is a float32 constant of C elements laid along x's channel axis (dim 1) when broadcast
 * onto x: [C, 1, ...] of rank x - 1, or [1, C, 1, ...] of rank x (torch's weight[:, None, ...]). */
static bool per_channel(const af_value *p, const gn_match *g, int rank) {
    if (!p || !af_value_is_const(p) || !af_value_is_f32(p) || p->type.rank > rank ||
        p->type.rank < rank - 1)
        return false;
    int off = rank - p->type.rank; /* x axis of p's axis 0 */
    for (int i = 0; i < p->type.rank; i++)
        if (p->type.dims[i] != (i + off == 1 ? g->c : 1)) return false;
    return true;
}

/* The sole consumer of v when it is a binary `op` with a per-channel constant: the constant. */
static af_value *channel_step(const pass_scope *s, const af_value *v, af_op op, const gn_match *g,
                              af_node **node) {
    af_node *b = next(s, v, op);
    af_value *p = b ? other_input(b, v) : NULL;
    if (!per_channel(p, g, g->x->type.rank)) return NULL;
    *node = b;
    return p;
}

/* Reshape(x, [N, G, -1]) -> InstanceNormalization(1, 0) -> Reshape(x's shape), anchored at the
 * InstanceNormalization; then [Mul gamma] [Add beta] per channel. */
static bool gn_match_at(const pass_scope *s, af_node *in, gn_match *g) {
    if (in->nin != 3 || in->nout != 1 || !in->in[0] || !in->out[0]) return false;
    af_node *r1 = feeding(s, in->in[0], AF_OP_RESHAPE, in);
    af_value *x = r1 ? r1->in[0] : NULL;
    if (!x || x->type.dtype != AF_DTYPE_FLOAT || !dims_whole(&x->type) || x->type.rank < 3 ||
        pass_pinned(s, in->in[0]))
        return false;
    const af_tensor *v = &in->in[0]->type;
    if (!dims_whole(v) || v->rank != 3 || v->dims[0] != x->type.dims[0]) return false;
    g->x = x;
    g->c = x->type.dims[1];
    g->groups = v->dims[1];
    if (g->c > LN_MAX_WIDTH || g->c % g->groups || af_tensor_numel(v) != af_tensor_numel(&x->type) ||
        !const_fill(in->in[1], g->groups, 1.0f) || !const_fill(in->in[2], g->groups, 0.0f))
        return false;
    af_node *r2 = next(s, in->out[0], AF_OP_RESHAPE);
    if (!r2 || r2->in[0] != in->out[0] || !af_same_shape(&r2->out[0]->type, &x->type)) return false;
    take(&g->m, r1);
    take(&g->m, in);
    take(&g->m, r2);
    g->y = r2->out[0];
    af_node *b;
    if ((g->gamma = channel_step(s, g->y, AF_OP_MUL, g, &b))) {
        take(&g->m, b);
        g->y = b->out[0];
    }
    if ((g->beta = channel_step(s, g->y, AF_OP_ADD, g, &b))) {
        take(&g->m, b);
        g->y = b->out[0];
    }
    return true;
}

/* A float32 [C] constant: p's values, or v everywhere when p is NULL. */
static af_value *gn_param(pass_scope *s, const gn_match *g, const af_value *p, const char *hint,
                          float v) {
    af_value *c = af_value_new_f32(s->g, hint, 1, &g->c);
    if (!c) return NULL;
    for (int64_t i = 0; i < g->c; i++)
        ((float *)c->type.data)[i] = p ? ((const float *)p->type.data)[i] : v;
    return c;
}

/* A plain InstanceNormalization of float32 x [N, C, ...] with float32 [C] scale and B is a
 * GroupNorm of C groups: one form for the fuser (activations after it join its epilogue). */
static bool in_as_groupnorm(const af_node *in, gn_match *g) {
    af_value *x = in->nin == 3 ? in->in[0] : NULL, *sc = x ? in->in[1] : NULL, *b = x ? in->in[2] : NULL;
    if (!x || !sc || !b || in->nout != 1 || !in->out[0] || x->type.dtype != AF_DTYPE_FLOAT ||
        x->type.rank < 3 || x->type.rank > AF_MAX_RANK || x->type.dims[1] < 1)
        return false;
    int64_t c = x->type.dims[1];
    for (int i = 1; i < 3; i++) {
        const af_tensor *t = &in->in[i]->type;
        if (t->dtype != AF_DTYPE_FLOAT || t->rank != 1 || t->dims[0] != c) return false;
    }
    g->x = x;
    g->c = g->groups = c;
    g->y = in->out[0];
    take(&g->m, (af_node *)in);
    return true;
}

static af_status groupnorm(pass_scope *s, af_node *in, bool *hit, af_error *err) {
    gn_match g = {0};
    af_value *gamma, *beta;
    if (gn_match_at(s, in, &g)) {
        gamma = gn_param(s, &g, g.gamma, "groupnorm_scale", 1.0f);
        beta = gn_param(s, &g, g.beta, "groupnorm_bias", 0.0f);
    } else {
        memset(&g, 0, sizeof g);
        if (!in_as_groupnorm(in, &g)) return AF_OK;
        gamma = in->in[1]; /* scale and B as they are (they need not be constants) */
        beta = in->in[2];
    }
    af_node *r = pass_node_new(s, AF_OP_GROUP_NORM, in, 3, 1);
    if (!gamma || !beta || !r || !af_node_set_int(r, "num_groups", g.groups) ||
        !af_node_set_float(r, "epsilon", af_attr_float(in, "epsilon", 1e-5f)) ||
        !provenance(r, &g.m))
        return af_node_fail(err, in, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_status st = AF_OK;
    for (int i = 0; i < g.m.n && !st; i++) st = pass_kill(s, g.m.nodes[i], err);
    if (st) return st;
    af_node_set_input(r, 0, g.x);
    af_node_set_input(r, 1, gamma);
    af_node_set_input(r, 2, beta);
    af_node_set_output(r, 0, g.y);
    *hit = true;
    return AF_OK;
}

/* ONNX's GroupNormalization with constant float32 parameters as our GroupNorm, each group's
 * value repeated over its channels (opset 18: per group; opset 21: per channel, copied); its
 * fusion and fast kernels then take it. */
static af_value *per_channel_of(pass_scope *s, const af_value *p, int64_t groups, int64_t c) {
    if (!p || !af_value_is_const(p) || !af_value_is_f32(p) || af_tensor_numel(&p->type) != groups)
        return NULL;
    const char *name = af_graph_unique_name(s->g, "groupnorm_param");
    af_value *v = name ? af_value_new_const(s->g, name, AF_DTYPE_FLOAT, 1, &c) : NULL;
    if (!v) return NULL;
    const float *src = p->type.data;
    float *dst = v->type.data;
    for (int64_t i = 0; i < c; i++) dst[i] = src[i / (c / groups)];
    return v;
}

static af_status group_normalization(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    af_value *x = n->nin == 3 ? n->in[0] : NULL, *y = n->nout == 1 ? n->out[0] : NULL;
    int64_t groups = af_attr_int(n, "num_groups", 0);
    if (!x || !y || x->type.rank < 3 || x->type.dtype != AF_DTYPE_FLOAT || groups < 1) return AF_OK;
    int64_t c = x->type.dims[1];
    if (c < 1 || c % groups) return AF_OK;
    int64_t per = af_graph_opset(n->graph) < 21 ? groups : c; /* opset 21: per channel already */
    af_value *gamma = per_channel_of(s, n->in[1], per, c), *beta = gamma ? per_channel_of(s, n->in[2], per, c) : NULL;
    if (!gamma || !beta) return AF_OK; /* not constants (or out of memory): the reference runs it */
    af_node *r = pass_node_new(s, AF_OP_GROUP_NORM, n, 3, 1);
    match m = {{n}, 1};
    if (!r || !af_node_set_int(r, "num_groups", groups) ||
        !af_node_set_float(r, "epsilon", af_attr_float(n, "epsilon", 1e-5f)) || !provenance(r, &m))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    af_status st = pass_kill(s, n, err);
    if (st) return st;
    af_node_set_input(r, 0, x);
    af_node_set_input(r, 1, gamma);
    af_node_set_input(r, 2, beta);
    af_node_set_output(r, 0, y);
    *hit = true;
    return AF_OK;
}

/* ONNX's Gelu (opset 20) as ours; an unknown approximate stays for the reference to refuse. */
static af_status onnx_gelu(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    const char *approx = af_attr_str(n, "approximate", "none");
    bool tanh_form = !strcmp(approx, "tanh");
    if (n->nin != 1 || n->nout != 1 || !n->in[0] || !n->out[0] || (!tanh_form && strcmp(approx, "none")))
        return AF_OK;
    match m = {{n}, 1};
    return make_gelu(s, &m, n, n->in[0], n->out[0], tanh_form ? "tanh" : "none", hit, err);
}

/* ---- MeanVarianceNormalization ------------------------------------------------------------- */

/* The standard deviation's epsilon of ONNX's function body (and of the reference kernel). */
#define MVN_EPS 1e-9f

/* MVN's axes (default 0, 2, 3) normalised into axes, their count; 0 when one is out of range or
 * repeated, or there are none (ReduceMean would read no axes as all of them): the reference
 * runs those. */
static int mvn_axes(const af_node *n, int rank, int64_t *axes, bool *reduced) {
    static const int64_t dflt[3] = {0, 2, 3};
    const int64_t *a = dflt;
    int na = af_attr_ints(n, "axes", &a);
    if (na < 0) {
        a = dflt;
        na = 3;
    }
    if (na > rank) return 0;
    for (int i = 0; i < na; i++) {
        int ax;
        if (!af_axis(a[i], rank, &ax) || reduced[ax]) return 0;
        reduced[ax] = true;
        axes[i] = ax;
    }
    return na;
}

/* A new node op(a, b) (b may be NULL) in place of MVN node n, writing y, or a new value of
 * type t when y is NULL; its output, NULL when out of memory. */
static af_value *mvn_step(pass_scope *s, const match *m, af_op op, af_value *a, af_value *b,
                          const af_tensor *t, af_value *y) {
    af_node *r = pass_node_new(s, op, m->nodes[0], b ? 2 : 1, 1);
    af_value *out = y ? y : value_like(s, "mvn", t);
    if (!r || !out || !provenance(r, m)) return NULL;
    af_node_set_input(r, 0, a);
    if (b) af_node_set_input(r, 1, b);
    af_node_set_output(r, 0, out);
    return out;
}

/* ReduceMean(v; axes, keepdims 1), its axes an attribute before opset 18 and an input from it;
 * its name the MVN node's with `suffix` (the two means' names differ). */
static af_value *mvn_mean(pass_scope *s, const match *m, af_value *v, const int64_t *axes, int na,
                          const af_tensor *t, const char *suffix) {
    bool input = af_graph_opset(s->g) >= 18;
    af_value *ax = input ? af_value_new_ints(s->g, "mvn_axes", na, axes) : NULL;
    if (input && !ax) return NULL;
    af_value *mean = mvn_step(s, m, AF_OP_REDUCE_MEAN, v, ax, t, NULL);
    af_node *r = mean ? mean->producer : NULL;
    size_t len = r ? strlen(r->name) + strlen(suffix) + 1 : 0;
    char *name = r ? af_arena_alloc(s->g->arena, len) : NULL;
    if (!name || !af_node_set_int(r, "keepdims", 1) || (!input && !af_node_set_ints(r, "axes", axes, na)))
        return NULL;
    snprintf(name, len, "%s%s", r->name, suffix);
    r->name = name;
    return mean;
}

/* MeanVarianceNormalization(x; axes) as the ops of its definition, each with a fast kernel:
 * d = x - ReduceMean(x), y = d / (Sqrt(ReduceMean(d * d)) + 1e-9). The variance is the
 * reference's, from the deviations: ONNX's function body takes E[x^2] - E[x]^2, which cancels
 * in float32 where the mean is large against the spread. */
static af_status mean_variance_normalization(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    af_value *x = n->nin == 1 ? n->in[0] : NULL, *y = n->nout == 1 ? n->out[0] : NULL;
    if (!x || !y || x->type.dtype != AF_DTYPE_FLOAT || !dims_whole(&x->type)) return AF_OK;
    int64_t axes[AF_MAX_RANK];
    bool reduced[AF_MAX_RANK] = {false};
    int na = mvn_axes(n, x->type.rank, axes, reduced);
    if (na == 0) return AF_OK;
    af_tensor rt = x->type; /* the statistics' type: reduced axes kept as 1 */
    for (int i = 0; i < rt.rank; i++)
        if (reduced[i]) rt.dims[i] = 1;
    match m = {{n}, 1};
    af_value *eps = af_value_new_f32(s->g, "mvn_epsilon", 0, NULL);
    af_value *mean = eps ? mvn_mean(s, &m, x, axes, na, &rt, "") : NULL;
    af_value *d = mean ? mvn_step(s, &m, AF_OP_SUB, x, mean, &x->type, NULL) : NULL;
    af_value *sq = d ? mvn_step(s, &m, AF_OP_MUL, d, d, &x->type, NULL) : NULL;
    af_value *var = sq ? mvn_mean(s, &m, sq, axes, na, &rt, "_variance") : NULL;
    af_value *sd = var ? mvn_step(s, &m, AF_OP_SQRT, var, NULL, &rt, NULL) : NULL;
    af_value *den = sd ? mvn_step(s, &m, AF_OP_ADD, sd, eps, &rt, NULL) : NULL;
    if (!den) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    *(float *)eps->type.data = MVN_EPS;
    af_status st = pass_kill(s, n, err); /* frees y for the Div */
    if (st) return st;
    if (!mvn_step(s, &m, AF_OP_DIV, d, den, &x->type, y))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory canonicalizing");
    *hit = true;
    return AF_OK;
}

/* ---- the walk ------------------------------------------------------------------------------ */

static af_status rewrite_at(pass_scope *s, af_node *n, bool *hit, af_error *err) {
    switch (n->op) {
    case AF_OP_REDUCE_MEAN: return norm_at(s, n, hit, err);
    case AF_OP_ERF: return gelu_erf(s, n, hit, err);
    case AF_OP_TANH: return gelu_tanh(s, n, hit, err);
    case AF_OP_SIGMOID: return silu(s, n, hit, err);
    case AF_OP_HARD_SIGMOID: return hardswish_hs(s, n, hit, err);
    case AF_OP_CLIP: return hardswish_clip(s, n, hit, err);
    case AF_OP_LAYER_NORMALIZATION: layernorm_axis(n); return AF_OK;
    case AF_OP_INSTANCE_NORMALIZATION: return groupnorm(s, n, hit, err);
    case AF_OP_GROUP_NORMALIZATION: return group_normalization(s, n, hit, err);
    case AF_OP_MEAN_VARIANCE_NORMALIZATION: return mean_variance_normalization(s, n, hit, err);
    case AF_OP_ONNX_GELU: return onnx_gelu(s, n, hit, err);
    case AF_OP_TRANSPOSE: {
        bool shuffled = false;
        af_status st = channel_shuffle(s, n, &shuffled, err);
        *hit = *hit || shuffled;
        return st || shuffled ? st : transpose_reshape(s, n, hit, err);
    }
    case AF_OP_ADD: return add_before_reshape(s, n, hit, err);
    case AF_OP_EINSUM: return pass_einsum_matmul(s, n, hit, err);
    default: return act_before_reshape(s, n, hit);
    }
}

/* Anchors are the graph's nodes as the walk starts; replacements are appended past them and
 * put in place by one topological sort at the end. */
static af_status canonicalize_graph(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(g->nodes[i], k)); k++)
            st = canonicalize_graph(sub, err);
    }
    pass_scope s;
    if (st || (st = pass_scope_open(&s, g, err))) return st;
    bool hit = false;
    /* the rewrites' own nodes (a Gelu made of a Tanh...) only move before reshapes */
    for (int i = 0, n0 = g->nnodes; i < g->nnodes && !st; i++)
        if (!pass_dead(&s, g->nodes[i]))
            st = i < n0 ? rewrite_at(&s, g->nodes[i], &hit, err) : act_before_reshape(&s, g->nodes[i], &hit);
    if (!st) st = pass_fake_quant(&s, &hit, err);
    pass_scope_sweep(&s);
    pass_scope_close(&s);
    return !st && hit ? af_graph_toposort(g, err) : st;
}

af_status af_pass_canonicalize(af_graph *g, af_error *err) {
    af_status st = canonicalize_graph(g, err);
    return st ? st : pass_fix_captures(g, err);
}
