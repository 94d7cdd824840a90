/* Fused kernel tests: every fused op (FusedConv, FusedMatMul, FusedElementwise, ConvPoolFc,
 * SqueezeExcite) against the equivalent chain of unfused reference ops built in the same graph
 * from the same constants and run with af_exec_graph; odd shapes (row tails, 1-D and 3-D conv,
 * groups and depthwise, dilation, stride, padding, auto_pad, batched and broadcast matmul, trans
 * flags, 1-D operands), every epilogue op, operands broadcast per channel / as a full residual /
 * as a scalar / reversed, the LayerNorm prologue; shape functions with unknown dims; and bad
 * epilogue programs rejected with a status naming the node instead of a crash. The int8 form
 * (quant = 1: an INT8 W, x_scale, x_zero_point, w_scale) against the float op fed the
 * fake-quantized X and the dequantized W built here; bad quantization attributes rejected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "kernels/ref/epilogue.h"
#include "kernels/fast/dispatch.h"
#include "runtime/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- graph building ---------------------------------------------------------------------------- */

static af_value *scalar(af_graph *g, float v) {
    af_value *c = af_value_new_const(g, af_graph_unique_name(g, "s"), AF_DTYPE_FLOAT, 0, NULL);
    assert_non_null(c);
    *(float *)c->type.data = v;
    return c;
}

static af_value *ints_const(af_graph *g, int count, const int64_t *v) {
    int64_t dims[1] = {count};
    af_value *c = af_value_new_const(g, af_graph_unique_name(g, "i"), AF_DTYPE_INT64, 1, dims);
    assert_non_null(c);
    memcpy(c->type.data, v, (size_t)count * sizeof(int64_t));
    return c;
}

/* A node with nin inputs, the first `given` from ins[] (the others set later), and one fresh
 * output value. */
static af_node *addn(af_graph *g, const char *op, int nin, af_value *const *ins, int given) {
    af_op id = af_op_lookup(strcmp(op, "Gelu") == 0 || strcmp(op, "Silu") == 0 ||
                                    strcmp(op, "QuantizeDequantize") == 0 ||
                                    strncmp(op, "Fused", 5) == 0 ||
                                    strcmp(op, "ConvPoolFc") == 0 ||
                                    strcmp(op, "SqueezeExcite") == 0
                                ? AF_DOMAIN
                                : "",
                            op);
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, NULL, nin, 1);
    assert_non_null(n);
    if (af_op_is_ours(id))
        n->domain = AF_DOMAIN;
    for (int i = 0; ins && i < given && i < nin; i++)
        if (ins[i])
            af_node_set_input(n, i, ins[i]);
    af_node_set_output(n, 0, af_value_new(g, af_graph_unique_name(g, "t")));
    return n;
}

static af_node *add(af_graph *g, const char *op, int nin, af_value *const *ins) {
    return addn(g, op, nin, ins, nin);
}

static af_value *op1(af_graph *g, const char *op, af_value *x) {
    return add(g, op, 1, &x)->out[0];
}

static af_value *op2(af_graph *g, const char *op, af_value *x, af_value *y) {
    af_value *ins[2] = {x, y};
    return add(g, op, 2, ins)->out[0];
}

static void set_int(af_node *n, const char *name, int64_t v) {
    af_attr *at = af_node_add_attr(n, name, AF_ATTR_INT);
    assert_non_null(at);
    at->i = v;
}

static void set_float(af_node *n, const char *name, float v) {
    af_attr *at = af_node_add_attr(n, name, AF_ATTR_FLOAT);
    assert_non_null(at);
    at->f = v;
}

static void set_str(af_node *n, const char *name, const char *v) {
    af_attr *at = af_node_add_attr(n, name, AF_ATTR_STRING);
    assert_non_null(at);
    at->s = v;
    at->slen = strlen(v);
}

static void set_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *at = af_node_add_attr(n, name, AF_ATTR_INTS);
    assert_non_null(at);
    at->n = count;
    at->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    memcpy(at->ints, v, (size_t)count * sizeof(int64_t));
}

static void set_floats(af_node *n, const char *name, int count, const float *v) {
    af_attr *at = af_node_add_attr(n, name, AF_ATTR_FLOATS);
    assert_non_null(at);
    at->n = count;
    at->floats = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(float));
    memcpy(at->floats, v, (size_t)count * sizeof(float));
}

static void mark_output(af_graph *g, af_value *v) {
    v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

/* ---- epilogue programs ------------------------------------------------------------------------- */

/* One step of a test program; binary steps name their operand's shape (rank -1: none). */
typedef struct step {
    af_ep_op op;
    float p0, p1;
    bool reversed;
    int rank;
    int64_t dims[AF_MAX_RANK];
} step;

#define MAXSTEPS 16

typedef struct prog {
    int n;
    step s[MAXSTEPS];
    af_value *operand[MAXSTEPS];
} prog;

static int prog_operands(const prog *p) {
    int k = 0;
    for (int i = 0; i < p->n; i++)
        k += af_ep_is_binary(p->s[i].op);
    return k;
}

/* Create the operand constants of p (divisors away from zero). */
static void prog_make_operands(af_graph *g, prog *p) {
    for (int i = 0; i < p->n; i++)
        if (af_ep_is_binary(p->s[i].op))
            p->operand[i] = p->s[i].op == AF_EP_DIV
                                ? tu_const(g, p->s[i].rank, p->s[i].dims, 0.5, 1.5)
                                : tu_const(g, p->s[i].rank, p->s[i].dims, -1.0, 1.0);
}

/* Attach p to fused node n whose operand inputs start at slot `first`. */
static void prog_attach(af_node *n, const prog *p, int first) {
    int64_t ints[3 * MAXSTEPS];
    float params[2 * MAXSTEPS];
    int slot = first;
    for (int i = 0; i < p->n; i++) {
        ints[3 * i] = p->s[i].op;
        ints[3 * i + 1] = -1;
        ints[3 * i + 2] = p->s[i].reversed ? AF_EP_REVERSED : 0;
        params[2 * i] = p->s[i].p0;
        params[2 * i + 1] = p->s[i].p1;
        if (af_ep_is_binary(p->s[i].op)) {
            ints[3 * i + 1] = slot;
            af_node_set_input(n, slot++, p->operand[i]);
        }
    }
    if (p->n > 0) {
        set_ints(n, "epilogue", 3 * p->n, ints);
        set_floats(n, "epilogue_params", 2 * p->n, params);
    }
}

/* The same program as a chain of ONNX (and canonical) ops after y. */
static af_value *prog_chain(af_graph *g, const prog *p, af_value *y) {
    static const char *binop[] = {"", "Add", "Sub", "Mul", "Div"};
    for (int i = 0; i < p->n; i++) {
        const step *s = &p->s[i];
        af_node *n;
        switch (s->op) {
        case AF_EP_ADD:
        case AF_EP_SUB:
        case AF_EP_MUL:
        case AF_EP_DIV:
            y = s->reversed ? op2(g, binop[s->op], p->operand[i], y)
                            : op2(g, binop[s->op], y, p->operand[i]);
            break;
        case AF_EP_PRELU:
            y = s->reversed ? op2(g, "PRelu", p->operand[i], y) : op2(g, "PRelu", y, p->operand[i]);
            break;
        case AF_EP_RELU: y = op1(g, "Relu", y); break;
        case AF_EP_CLIP: {
            af_value *ins[3] = {y, scalar(g, s->p0), scalar(g, s->p1)};
            y = add(g, "Clip", 3, ins)->out[0];
            break;
        }
        case AF_EP_LEAKY_RELU:
            n = add(g, "LeakyRelu", 1, &y);
            set_float(n, "alpha", s->p0);
            y = n->out[0];
            break;
        case AF_EP_SIGMOID: y = op1(g, "Sigmoid", y); break;
        case AF_EP_HARD_SIGMOID:
            n = add(g, "HardSigmoid", 1, &y);
            set_float(n, "alpha", s->p0);
            set_float(n, "beta", s->p1);
            y = n->out[0];
            break;
        case AF_EP_HARD_SWISH: y = op1(g, "HardSwish", y); break;
        case AF_EP_SILU: y = op1(g, "Silu", y); break;
        case AF_EP_GELU:
            n = add(g, "Gelu", 1, &y);
            set_str(n, "approximate", s->p0 != 0.0f ? "tanh" : "none");
            y = n->out[0];
            break;
        case AF_EP_TANH: y = op1(g, "Tanh", y); break;
        case AF_EP_ELU:
            n = add(g, "Elu", 1, &y);
            set_float(n, "alpha", s->p0);
            y = n->out[0];
            break;
        case AF_EP_FAKE_QUANT:
            n = add(g, "QuantizeDequantize", 1, &y);
            set_float(n, "scale", s->p0);
            set_float(n, "zero_point", s->p1);
            y = n->out[0];
            break;
        case AF_EP_CUSTOM_UNARY:
        case AF_EP_CUSTOM_BINARY: fail_msg("custom steps are tested with plugins (test_plugin)");
        }
    }
    return y;
}

/* Step constructors. */
static step un(af_ep_op op, float p0, float p1) {
    step s = {op, p0, p1, false, -1, {0}};
    return s;
}

static step bin(af_ep_op op, bool reversed, int rank, const int64_t *dims) {
    step s = {op, 0, 0, reversed, rank, {0}};
    for (int i = 0; i < rank; i++)
        s.dims[i] = dims[i];
    return s;
}

/* Every unary op with typical parameters. */
static step all_unary(int i) {
    static const step u[] = {
        {AF_EP_RELU, 0, 0, false, -1, {0}},       {AF_EP_CLIP, -0.3f, 0.4f, false, -1, {0}},
        {AF_EP_LEAKY_RELU, 0.1f, 0, false, -1, {0}}, {AF_EP_SIGMOID, 0, 0, false, -1, {0}},
        {AF_EP_HARD_SIGMOID, 0.3f, 0.4f, false, -1, {0}}, {AF_EP_HARD_SWISH, 0, 0, false, -1, {0}},
        {AF_EP_SILU, 0, 0, false, -1, {0}},       {AF_EP_GELU, 0, 0, false, -1, {0}},
        {AF_EP_GELU, 1, 0, false, -1, {0}},       {AF_EP_TANH, 0, 0, false, -1, {0}},
        {AF_EP_ELU, 0.7f, 0, false, -1, {0}},     {AF_EP_FAKE_QUANT, 0.05f, 131, false, -1, {0}},
    };
    return u[i % (int)AF_COUNT(u)];
}
#define NUNARY 12

/* ---- running and comparing ----------------------------------------------------------------------- */

/* Run g (outputs: fused first, reference second) and compare with rtol 1e-4. */
static void run_compare(af_graph *g) {
    af_tensor out[2];
    af_error err = {0};
    memset(out, 0, sizeof out);
    af_status st = af_exec_graph(g, NULL, out, &err);
    if (st != AF_OK)
        fprintf(stderr, "exec failed: %s\n", err.message);
    assert_int_equal(st, AF_OK);
    assert_int_equal(out[0].rank, out[1].rank);
    for (int i = 0; i < out[0].rank; i++)
        assert_int_equal(out[0].dims[i], out[1].dims[i]);
    const float *a = out[0].data, *b = out[1].data;
    int64_t total = af_tensor_numel(&out[0]);
    assert_true(total > 0);
    for (int64_t i = 0; i < total; i++)
        /* equal infinities pass too: a fake-quantized zero divides into one */
        if (!(a[i] == b[i] || fabs((double)a[i] - b[i]) <= 1e-5 + 1e-4 * fabs((double)b[i]))) {
            fprintf(stderr, "element %lld: fused %.8g reference %.8g\n", (long long)i, a[i], b[i]);
            fail();
        }
    af_tensor_release(&out[0]);
    af_tensor_release(&out[1]);
}

/* Run g expecting failure with a message naming a node. */
static void run_fails(af_graph *g) {
    af_tensor out[2];
    af_error err = {0};
    memset(out, 0, sizeof out);
    af_status st = af_exec_graph(g, NULL, out, &err);
    assert_int_not_equal(st, AF_OK);
    assert_non_null(strstr(err.message, "node"));
}

/* ---- FusedConv ----------------------------------------------------------------------------------- */

typedef struct conv_case {
    int nsp;
    int64_t batch, c, m, group;
    int64_t in[3], k[3], s[3], d[3], pads[6];
    const char *auto_pad; /* NULL: pads */
    bool bias;
} conv_case;

static void set_conv_attrs(af_node *n, const conv_case *cc) {
    set_int(n, "group", cc->group);
    set_ints(n, "strides", cc->nsp, cc->s);
    set_ints(n, "dilations", cc->nsp, cc->d);
    set_ints(n, "kernel_shape", cc->nsp, cc->k);
    if (cc->auto_pad)
        set_str(n, "auto_pad", cc->auto_pad);
    else
        set_ints(n, "pads", 2 * cc->nsp, cc->pads);
}

/* Conv X, W, B constants of a case. */
static void conv_consts(af_graph *g, const conv_case *cc, af_value **x, af_value **w,
                        af_value **b) {
    int64_t xd[5] = {cc->batch, cc->c}, wd[5] = {cc->m, cc->c / cc->group};
    for (int i = 0; i < cc->nsp; i++) {
        xd[2 + i] = cc->in[i];
        wd[2 + i] = cc->k[i];
    }
    *x = tu_const(g, cc->nsp + 2, xd, -1.0, 1.0);
    *w = tu_const(g, cc->nsp + 2, wd, -1.0, 1.0);
    int64_t bd[1] = {cc->m};
    *b = cc->bias ? tu_const(g, 1, bd, -1.0, 1.0) : NULL;
}

static void conv_case_run(const conv_case *cc, prog *p) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    af_value *x, *w, *b;
    conv_consts(g, cc, &x, &w, &b);
    prog_make_operands(g, p);
    af_value *ins[3] = {x, w, b};
    af_node *f = addn(g, "FusedConv", 3 + prog_operands(p), ins, 3);
    set_conv_attrs(f, cc);
    set_str(f, "fusion_rule", "TestRule");
    prog_attach(f, p, 3);
    af_node *r = add(g, "Conv", b ? 3 : 2, ins);
    set_conv_attrs(r, cc);
    mark_output(g, f->out[0]);
    mark_output(g, prog_chain(g, p, r->out[0]));
    run_compare(g);
    af_arena_free(a);
}

static const conv_case conv_cases[] = {
    /* 2-D, pads and stride 2, bias */
    {2, 2, 3, 4, 1, {7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 2}, NULL, true},
    /* 1-D, dilation 2, groups 2, no bias */
    {1, 1, 4, 6, 2, {11}, {3}, {1}, {2}, {2, 1}, NULL, false},
    /* 3-D depthwise, SAME_UPPER, stride 2 */
    {3, 1, 3, 3, 3, {5, 6, 7}, {3, 2, 3}, {2, 1, 2}, {1, 1, 1}, {0}, "SAME_UPPER", true},
    /* 2-D, SAME_LOWER with dilation, odd row tail */
    {2, 1, 2, 5, 1, {6, 13}, {2, 3}, {1, 1}, {2, 2}, {0}, "SAME_LOWER", true},
    /* 2-D VALID with a 1x1 kernel */
    {2, 3, 5, 2, 1, {4, 5}, {1, 1}, {1, 1}, {1, 1}, {0}, "VALID", false},
    /* 2-D 3x3 pad 1 on rows of 40: the three-kernel-columns-per-pass interior path */
    {2, 1, 3, 4, 1, {5, 40}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, NULL, true},
    /* 1x1, stride 2, with pads: the strided path with four input channels per pass */
    {2, 1, 6, 3, 1, {7, 9}, {1, 1}, {2, 2}, {1, 1}, {1, 1, 0, 1}, NULL, true},
};

/* Per-channel operand shape [M, 1...] of a case. */
static int per_channel(const conv_case *cc, int64_t *dims) {
    dims[0] = cc->m;
    for (int i = 0; i < cc->nsp; i++)
        dims[1 + i] = 1;
    return cc->nsp + 1;
}

/* Output shape of a case by running Conv's shape function on types only. */
static int conv_out_dims(const conv_case *cc, int64_t *dims) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    af_value *x, *w, *b;
    conv_consts(g, cc, &x, &w, &b);
    af_value *ins[3] = {x, w, b};
    af_node *r = add(g, "Conv", b ? 3 : 2, ins);
    set_conv_attrs(r, cc);
    const af_tensor *in[3] = {&x->type, &w->type, b ? &b->type : NULL};
    af_tensor y;
    af_error err;
    assert_int_equal(af_kernel_shape(r, in, &y, &err), AF_OK);
    for (int i = 0; i < y.rank; i++)
        dims[i] = y.dims[i];
    int rank = y.rank;
    af_arena_free(a);
    return rank;
}

static void test_fused_conv_geometries(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(conv_cases); c++) {
        const conv_case *cc = &conv_cases[c];
        int64_t pc[AF_MAX_RANK], full[AF_MAX_RANK];
        int pcr = per_channel(cc, pc), fr = conv_out_dims(cc, full);
        prog p = {0};
        p.s[p.n++] = bin(AF_EP_ADD, false, pcr, pc);     /* per-channel (folded BN shift) */
        p.s[p.n++] = bin(AF_EP_ADD, c % 2 == 1, fr, full); /* residual */
        p.s[p.n++] = all_unary((int)c);
        conv_case_run(cc, &p);
    }
}

static void test_fused_conv_every_op(void **state) {
    (void)state;
    const conv_case *cc = &conv_cases[0];
    int64_t pc[AF_MAX_RANK], full[AF_MAX_RANK], last[1];
    int pcr = per_channel(cc, pc), fr = conv_out_dims(cc, full);
    last[0] = full[fr - 1];
    for (int i = 0; i < NUNARY; i++) {
        prog p = {0};
        p.s[p.n++] = all_unary(i);
        conv_case_run(cc, &p);
    }
    static const af_ep_op binops[] = {AF_EP_ADD, AF_EP_SUB, AF_EP_MUL, AF_EP_DIV, AF_EP_PRELU};
    for (size_t b = 0; b < AF_COUNT(binops); b++)
        for (int rev = 0; rev < 2; rev++) {
            af_ep_op op = binops[b];
            prog p = {0};
            /* PRelu's slope broadcasts to its x: reversed (the operand is the x), only a full one */
            if (op != AF_EP_PRELU || !rev) {
                p.s[p.n++] = bin(op, rev, pcr, pc);
                p.s[p.n++] = bin(op, rev, 0, NULL); /* scalar */
                p.s[p.n++] = bin(op, rev, 1, last);  /* along the row */
            }
            p.s[p.n++] = bin(op == AF_EP_DIV ? AF_EP_MUL : op, rev, fr, full);
            conv_case_run(cc, &p);
        }
    /* No epilogue at all: a plain conv. */
    prog p = {0};
    conv_case_run(cc, &p);
    /* A long chain of everything on the 3-D depthwise case. */
    prog q = {0};
    pcr = per_channel(&conv_cases[2], pc);
    for (int i = 0; i < NUNARY; i++) {
        q.s[q.n++] = all_unary(i);
        if (q.n < MAXSTEPS)
            q.s[q.n++] = bin(AF_EP_MUL, i % 2, pcr, pc);
        if (q.n >= MAXSTEPS)
            break;
    }
    conv_case_run(&conv_cases[2], &q);
}

/* ---- FusedMatMul ----------------------------------------------------------------------------------- */

static void test_fused_matmul_gemm(void **state) {
    (void)state;
    /* 2-D with trans flags, alpha and a 1-D bias against Gemm. */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            af_arena *a = af_arena_new();
            af_graph *g = tu_graph(a, "test_fused", 8);
            int64_t ad[2] = {ta ? 7 : 5, ta ? 5 : 7}, bd[2] = {tb ? 3 : 7, tb ? 7 : 3};
            int64_t nd[1] = {3}, yd[2] = {5, 3};
            af_value *A = tu_const(g, 2, ad, -1.0, 1.0), *B = tu_const(g, 2, bd, -1.0, 1.0), *bias = tu_const(g, 1, nd, -1.0, 1.0);
            prog p = {0};
            p.s[p.n++] = bin(AF_EP_ADD, false, 2, yd);
            p.s[p.n++] = un(AF_EP_GELU, (float)tb, 0);
            prog_make_operands(g, &p);
            af_value *ins[3] = {A, B, bias};
            af_node *f = addn(g, "FusedMatMul", 5 + prog_operands(&p), ins, 3);
            set_int(f, "trans_a", ta);
            set_int(f, "trans_b", tb);
            set_float(f, "alpha", 0.75f);
            prog_attach(f, &p, 5);
            af_node *r = add(g, "Gemm", 3, ins);
            set_int(r, "transA", ta);
            set_int(r, "transB", tb);
            set_float(r, "alpha", 0.75f);
            mark_output(g, f->out[0]);
            mark_output(g, prog_chain(g, &p, r->out[0]));
            run_compare(g);
            af_arena_free(a);
        }
}

/* Batched A and B (numpy broadcast), optional trans_b and LayerNorm (or RMSNorm) prologue,
 * against [LayerNormalization | RMSNormalization] -> [Transpose B] -> MatMul -> Add bias ->
 * epilogue chain. */
typedef struct mm_case {
    int ar, br;
    int64_t ad[4], bd[4]; /* B as stored (with trans_b: last two dims swapped) */
    bool tb, ln, ln_bias, bias;
    int64_t n;
    bool rms; /* with ln: ln_rms, no ln_bias */
} mm_case;

static void mm_case_run(const mm_case *mc, prog *p) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    int64_t kd[1] = {mc->ad[mc->ar - 1]}, nd[1] = {mc->n};
    af_value *A = tu_const(g, mc->ar, mc->ad, -1.0, 1.0), *B = tu_const(g, mc->br, mc->bd, -1.0, 1.0);
    af_value *bias = mc->bias ? tu_const(g, 1, nd, -1.0, 1.0) : NULL;
    af_value *lns = mc->ln ? tu_const(g, 1, kd, 0.5, 1.5) : NULL;
    af_value *lnb = mc->ln && mc->ln_bias ? tu_const(g, 1, kd, -1.0, 1.0) : NULL;
    prog_make_operands(g, p);
    af_value *ins[5] = {A, B, bias, lns, lnb};
    af_node *f = addn(g, "FusedMatMul", 5 + prog_operands(p), ins, 5);
    set_int(f, "trans_b", mc->tb);
    if (mc->ln)
        set_float(f, "ln_epsilon", 1e-3f);
    if (mc->rms)
        set_int(f, "ln_rms", 1);
    prog_attach(f, p, 5);
    af_value *ra = A, *rb = B;
    if (mc->ln) {
        af_value *lin[3] = {A, lns, lnb};
        af_node *ln = add(g, mc->rms ? "RMSNormalization" : "LayerNormalization", lnb ? 3 : 2, lin);
        set_int(ln, "axis", -1);
        set_float(ln, "epsilon", 1e-3f);
        ra = ln->out[0];
    }
    if (mc->tb) {
        int64_t perm[4] = {0, 1, 2, 3};
        perm[mc->br - 2] = mc->br - 1;
        perm[mc->br - 1] = mc->br - 2;
        af_node *t = add(g, "Transpose", 1, &rb);
        set_ints(t, "perm", mc->br, perm);
        rb = t->out[0];
    }
    af_value *y = op2(g, "MatMul", ra, rb);
    if (bias)
        y = op2(g, "Add", y, bias);
    mark_output(g, f->out[0]);
    mark_output(g, prog_chain(g, p, y));
    run_compare(g);
    af_arena_free(a);
}

static void test_fused_matmul_batched(void **state) {
    (void)state;
    static const mm_case cases[] = {
        /* 3-D A with 2-D B, LN prologue with bias, 1-D bias */
        {3, 2, {2, 5, 7}, {7, 3}, false, true, true, true, 3, false},
        /* 4-D broadcast batch with trans_b, LN without bias */
        {4, 4, {2, 1, 3, 4}, {1, 3, 5, 4}, true, true, false, false, 5, false},
        /* 2-D A with 3-D B */
        {2, 3, {3, 6}, {4, 6, 2}, false, false, false, true, 2, false},
        /* 1-D B: output [3] */
        {2, 1, {3, 4}, {4}, false, false, false, false, 1, false},
        /* 1-D A with LN: output [2, 5] */
        {1, 3, {6}, {2, 6, 5}, false, true, true, true, 5, false},
        /* odd sizes: K = 17, N = 9 */
        {3, 2, {3, 2, 17}, {17, 9}, false, true, true, true, 9, false},
        /* RMSNorm prologue: odd K, 3-D A; 4-D broadcast batch with trans_b */
        {3, 2, {3, 2, 37}, {37, 9}, false, true, false, true, 9, true},
        {4, 4, {2, 1, 3, 20}, {1, 3, 5, 20}, true, true, false, false, 5, true},
    };
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const mm_case *mc = &cases[c];
        /* Output dims: as numpy. */
        int64_t yd[AF_MAX_RANK];
        int yr = 0;
        int nba = mc->ar > 1 ? mc->ar - 2 : 0, nbb = mc->br > 1 ? mc->br - 2 : 0;
        int nb = nba > nbb ? nba : nbb;
        for (int i = 0; i < nb; i++) {
            int ia = i - (nb - nba), ib = i - (nb - nbb);
            int64_t da = ia >= 0 ? mc->ad[ia] : 1, db = ib >= 0 ? mc->bd[ib] : 1;
            yd[yr++] = da > db ? da : db;
        }
        if (mc->ar > 1)
            yd[yr++] = mc->ad[mc->ar - 2];
        if (mc->br > 1)
            yd[yr++] = mc->n;
        int64_t last[1] = {yd[yr - 1]};
        prog p = {0};
        p.s[p.n++] = bin(AF_EP_ADD, false, yr, yd);      /* residual */
        p.s[p.n++] = bin(AF_EP_MUL, true, 1, last);      /* per column */
        p.s[p.n++] = bin(AF_EP_SUB, c % 2 == 0, 0, NULL); /* scalar */
        p.s[p.n++] = all_unary((int)c + 3);
        mm_case_run(mc, &p);
    }
}

/* ---- FusedElementwise -------------------------------------------------------------------------- */

static void test_fused_elementwise(void **state) {
    (void)state;
    for (int i = 0; i < NUNARY; i++) {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t xd[3] = {2, 3, 5}, cd[2] = {3, 1}, rd[1] = {5};
        af_value *x = tu_const(g, 3, xd, -1.0, 1.0);
        prog p = {0};
        p.s[p.n++] = bin(AF_EP_ADD, false, 2, cd);
        p.s[p.n++] = all_unary(i);
        p.s[p.n++] = bin(AF_EP_DIV, i % 2 == 1, 1, rd);
        p.s[p.n++] = bin(AF_EP_SUB, true, 3, xd);
        prog_make_operands(g, &p);
        af_node *f = addn(g, "FusedElementwise", 1 + prog_operands(&p), &x, 1);
        prog_attach(f, &p, 1);
        mark_output(g, f->out[0]);
        mark_output(g, prog_chain(g, &p, x));
        run_compare(g);
        af_arena_free(a);
    }
}

/* Runs that wrap across rows (and start mid-row) give what element-by-element application gives. */
static void test_epilogue_runs_wrap(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    int64_t xd[3] = {2, 3, 5}, cd[2] = {3, 1}, rd[1] = {5}, bd[3] = {2, 1, 5};
    af_value *x = tu_const(g, 3, xd, -1.0, 1.0);
    prog p = {0};
    p.s[p.n++] = bin(AF_EP_ADD, false, 2, cd);
    p.s[p.n++] = bin(AF_EP_MUL, true, 1, rd);
    p.s[p.n++] = un(AF_EP_TANH, 0, 0);
    p.s[p.n++] = bin(AF_EP_SUB, true, 3, bd);
    prog_make_operands(g, &p);
    af_node *f = addn(g, "FusedElementwise", 1 + prog_operands(&p), &x, 1);
    prog_attach(f, &p, 1);
    const af_tensor *in[4];
    for (int i = 0; i < f->nin; i++)
        in[i] = &f->in[i]->type;
    af_epilogue ep;
    af_error err;
    assert_int_equal(af_epilogue_parse(f, in, &x->type, &ep, &err), AF_OK);
    float whole[30], part[30], one[30];
    memcpy(whole, x->type.data, sizeof whole);
    memcpy(part, whole, sizeof whole);
    memcpy(one, whole, sizeof whole);
    int64_t zero[3] = {0, 0, 0};
    af_epilogue_apply(&ep, whole, 30, zero);
    af_epilogue_apply_at(&ep, part, 0, 7);
    af_epilogue_apply_at(&ep, part, 7, 17);
    af_epilogue_apply_at(&ep, part, 24, 6);
    for (int i = 0; i < 30; i++)
        af_epilogue_apply_at(&ep, one, i, 1);
    for (int i = 0; i < 30; i++) {
        assert_true(whole[i] == one[i]);
        assert_true(part[i] == one[i]);
    }
    af_arena_free(a);
}

/* ---- ConvPoolFc ------------------------------------------------------------------------------------ */

static void test_conv_pool_fc(void **state) {
    (void)state;
    for (int v = 0; v < 3; v++) {
        const conv_case *cc = &conv_cases[v];
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        af_value *x, *w, *b;
        conv_consts(g, cc, &x, &w, &b);
        int tb = v != 1, classes = 5;
        int64_t wfd[2] = {tb ? classes : cc->m, tb ? cc->m : classes}, bfd[2] = {1, classes};
        af_value *wfc = tu_const(g, 2, wfd, -1.0, 1.0), *bfc = v == 2 ? NULL : tu_const(g, v == 0 ? 1 : 2, v == 0 ? bfd + 1 : bfd, -1.0, 1.0);
        int64_t pc[AF_MAX_RANK], full[AF_MAX_RANK];
        int pcr = per_channel(cc, pc), fr = conv_out_dims(cc, full);
        prog p = {0};
        p.s[p.n++] = bin(AF_EP_MUL, false, pcr, pc);
        p.s[p.n++] = bin(AF_EP_ADD, true, fr, full);
        p.s[p.n++] = all_unary(v);
        prog_make_operands(g, &p);
        af_value *ins[5] = {x, w, b, wfc, bfc};
        af_node *f = addn(g, "ConvPoolFc", 5 + prog_operands(&p), ins, 5);
        set_conv_attrs(f, cc);
        set_int(f, "fc_trans_b", tb);
        prog_attach(f, &p, 5);
        af_node *r = add(g, "Conv", b ? 3 : 2, ins);
        set_conv_attrs(r, cc);
        af_value *y = prog_chain(g, &p, r->out[0]);
        y = op1(g, "GlobalAveragePool", y);
        y = op1(g, "Flatten", y);
        af_value *gin[3] = {y, wfc, bfc};
        af_node *gm = add(g, "Gemm", bfc ? 3 : 2, gin);
        set_int(gm, "transB", tb);
        mark_output(g, f->out[0]);
        mark_output(g, gm->out[0]);
        run_compare(g);
        af_arena_free(a);
    }
}

/* ---- SqueezeExcite --------------------------------------------------------------------------------- */

static void test_squeeze_excite(void **state) {
    (void)state;
    for (int v = 0; v < 4; v++) {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t xd[4] = {2, 6, 5, 3}, w1d[4] = {3, 6, 1, 1}, w2d[4] = {6, 3, 1, 1};
        int64_t b1d[1] = {3}, b2d[1] = {6};
        int xr = v == 3 ? 3 : 4; /* a 1-D spatial case */
        af_value *x = tu_const(g, xr, xd, -1.0, 1.0), *w1 = tu_const(g, xr, w1d, -1.0, 1.0), *w2 = tu_const(g, xr, w2d, -1.0, 1.0);
        af_value *b1 = v == 2 ? NULL : tu_const(g, 1, b1d, -1.0, 1.0), *b2 = tu_const(g, 1, b2d, -1.0, 1.0);
        step act = all_unary(v * 3), gate = v % 2 ? un(AF_EP_HARD_SIGMOID, 1.0f / 6.0f, 0.5f)
                                                  : un(AF_EP_SIGMOID, 0, 0);
        af_value *ins[5] = {x, w1, b1, w2, b2};
        af_node *f = add(g, "SqueezeExcite", 5, ins);
        int64_t aop = act.op, gop = gate.op;
        float ap[2] = {act.p0, act.p1}, gp[2] = {gate.p0, gate.p1};
        set_ints(f, "act", 1, &aop);
        set_floats(f, "act_params", 2, ap);
        set_ints(f, "gate", 1, &gop);
        set_floats(f, "gate_params", 2, gp);
        prog pa = {0}, pg = {0};
        pa.s[pa.n++] = act;
        pg.s[pg.n++] = gate;
        af_value *s = op1(g, "GlobalAveragePool", x);
        af_value *c1[3] = {s, w1, b1}, *c2[3] = {NULL, w2, b2};
        s = prog_chain(g, &pa, add(g, "Conv", b1 ? 3 : 2, c1)->out[0]);
        c2[0] = s;
        s = prog_chain(g, &pg, add(g, "Conv", 3, c2)->out[0]);
        mark_output(g, f->out[0]);
        mark_output(g, op2(g, "Mul", x, s));
        run_compare(g);
        af_arena_free(a);
    }
}

/* ---- shape functions with unknown dims ---------------------------------------------------------------- */

static void test_shapes_unknown(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    af_error err;
    af_tensor x = {AF_DTYPE_FLOAT, 4, {-1, 3, -1, 8}, NULL, 0, 0};
    af_tensor w = {AF_DTYPE_FLOAT, 4, {4, 3, 3, 3}, NULL, 0, 0};
    af_tensor opnd = {AF_DTYPE_FLOAT, 3, {4, 1, 1}, NULL, 0, 0};
    const af_tensor *in[4] = {&x, &w, NULL, &opnd};
    af_node *f = add(g, "FusedConv", 4, NULL);
    int64_t prog1[3] = {AF_EP_ADD, 3, 0};
    set_ints(f, "epilogue", 3, prog1);
    af_tensor y;
    assert_int_equal(af_kernel_shape(f, in, &y, &err), AF_OK);
    assert_int_equal(y.rank, 4);
    assert_int_equal(y.dims[0], -1);
    assert_int_equal(y.dims[1], 4);
    assert_int_equal(y.dims[2], -1);
    assert_int_equal(y.dims[3], 6);

    /* Unknown ranks. */
    af_tensor ua = {AF_DTYPE_FLOAT, -1, {0}, NULL, 0, 0};
    af_tensor b2 = {AF_DTYPE_FLOAT, 2, {8, 5}, NULL, 0, 0};
    const af_tensor *min[2] = {&ua, &b2};
    af_node *m = add(g, "FusedMatMul", 2, NULL);
    assert_int_equal(af_kernel_shape(m, min, &y, &err), AF_OK);
    assert_int_equal(y.rank, -1);
    af_tensor a3 = {AF_DTYPE_FLOAT, 3, {-1, -1, 8}, NULL, 0, 0};
    min[0] = &a3;
    assert_int_equal(af_kernel_shape(m, min, &y, &err), AF_OK);
    assert_int_equal(y.rank, 3);
    assert_int_equal(y.dims[0], -1);
    assert_int_equal(y.dims[1], -1);
    assert_int_equal(y.dims[2], 5);
    const af_tensor *ein[1] = {&ua};
    af_node *e = add(g, "FusedElementwise", 1, NULL);
    assert_int_equal(af_kernel_shape(e, ein, &y, &err), AF_OK);
    assert_int_equal(y.rank, -1);
    af_tensor wfc = {AF_DTYPE_FLOAT, 2, {4, 10}, NULL, 0, 0};
    const af_tensor *cin[5] = {&x, &w, NULL, &wfc, NULL};
    af_node *c = add(g, "ConvPoolFc", 5, NULL);
    assert_int_equal(af_kernel_shape(c, cin, &y, &err), AF_OK);
    assert_int_equal(y.rank, 2);
    assert_int_equal(y.dims[0], -1);
    assert_int_equal(y.dims[1], 10);
    af_tensor w1 = {AF_DTYPE_FLOAT, 4, {2, 3, 1, 1}, NULL, 0, 0};
    af_tensor w2 = {AF_DTYPE_FLOAT, 4, {3, 2, 1, 1}, NULL, 0, 0};
    const af_tensor *sin[5] = {&ua, &w1, NULL, &w2, NULL};
    af_node *se = add(g, "SqueezeExcite", 5, NULL);
    int64_t act = AF_EP_RELU, gate = AF_EP_SIGMOID;
    set_ints(se, "act", 1, &act);
    set_ints(se, "gate", 1, &gate);
    assert_int_equal(af_kernel_shape(se, sin, &y, &err), AF_OK);
    assert_int_equal(y.rank, -1);
    sin[0] = &x;
    assert_int_equal(af_kernel_shape(se, sin, &y, &err), AF_OK);
    assert_int_equal(y.rank, 4);
    assert_int_equal(y.dims[3], 8);
    af_arena_free(a);
}

/* ---- bad programs and inputs ----------------------------------------------------------------------- */

/* A FusedConv with epilogue ints/params as given and an extra operand of the given type at slot 3
 * (NULL: none); it must fail cleanly. */
static void bad_conv(int nints, const int64_t *ints, int nparams, const float *params,
                     af_dtype opdt, int oprank, const int64_t *opdims) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    int64_t xd[4] = {1, 2, 5, 5}, wd[4] = {3, 2, 3, 3};
    af_value *ins[4] = {tu_const(g, 4, xd, -1.0, 1.0), tu_const(g, 4, wd, -1.0, 1.0), NULL, NULL};
    if (oprank >= 0) {
        ins[3] = af_value_new_const(g, "opnd", opdt, oprank, opdims);
        assert_non_null(ins[3]);
    }
    af_node *f = add(g, "FusedConv", 4, ins);
    if (nints >= 0)
        set_ints(f, "epilogue", nints, ints);
    if (nparams >= 0)
        set_floats(f, "epilogue_params", nparams, params);
    mark_output(g, f->out[0]);
    run_fails(g);
    af_arena_free(a);
}

static void test_bad_epilogues(void **state) {
    (void)state;
    int64_t pc[3] = {3, 1, 1}, bad[3] = {4, 1, 1}, row[1] = {7};
    float p2[2] = {0, 0}, p4[4] = {0};
    int64_t unknown[3] = {99, -1, 0}, zero_op[3] = {0, -1, 0};
    bad_conv(3, unknown, 2, p2, AF_DTYPE_FLOAT, -1, NULL);
    bad_conv(3, zero_op, 2, p2, AF_DTYPE_FLOAT, -1, NULL);
    int64_t add_oob[3] = {AF_EP_ADD, 7, 0}, add_neg[3] = {AF_EP_ADD, -1, 0};
    int64_t add_missing[3] = {AF_EP_ADD, 2, 0}, add_ok[3] = {AF_EP_ADD, 3, 0};
    bad_conv(3, add_oob, 2, p2, AF_DTYPE_FLOAT, 3, pc);
    bad_conv(3, add_neg, 2, p2, AF_DTYPE_FLOAT, 3, pc);
    bad_conv(3, add_missing, 2, p2, AF_DTYPE_FLOAT, 3, pc); /* slot 2 (B) omitted */
    bad_conv(3, add_ok, 2, p2, AF_DTYPE_INT64, 3, pc);      /* operand not float */
    bad_conv(3, add_ok, 2, p2, AF_DTYPE_FLOAT, 3, bad);     /* does not broadcast */
    bad_conv(3, add_ok, 2, p2, AF_DTYPE_FLOAT, 1, row);     /* last dim 7 vs 3 */
    int64_t big[5] = {1, 3, 3, 3, 3};
    bad_conv(3, add_ok, 2, p2, AF_DTYPE_FLOAT, 5, big);     /* rank above the output's */
    bad_conv(2, add_ok, 2, p2, AF_DTYPE_FLOAT, 3, pc);      /* not 3 ints per step */
    bad_conv(3, add_ok, 4, p4, AF_DTYPE_FLOAT, 3, pc);      /* params count */
    int64_t relu_opnd[3] = {AF_EP_RELU, 3, 0}, flags[3] = {AF_EP_ADD, 3, 6};
    bad_conv(3, relu_opnd, 2, p2, AF_DTYPE_FLOAT, 3, pc);
    bad_conv(3, flags, 2, p2, AF_DTYPE_FLOAT, 3, pc);
    int64_t gelu[3] = {AF_EP_GELU, -1, 0}, clip[3] = {AF_EP_CLIP, -1, 0};
    float gp[2] = {2.0f, 0.0f};
    bad_conv(3, gelu, 2, gp, AF_DTYPE_FLOAT, -1, NULL);
    bad_conv(3, clip, -1, NULL, AF_DTYPE_FLOAT, -1, NULL);  /* Clip without params */
    bad_conv(-1, NULL, 2, p2, AF_DTYPE_FLOAT, -1, NULL);    /* params without program */
    int64_t many[3 * (AF_EP_MAX_STEPS + 1)];
    for (int i = 0; i <= AF_EP_MAX_STEPS; i++) {
        many[3 * i] = AF_EP_RELU;
        many[3 * i + 1] = -1;
        many[3 * i + 2] = 0;
    }
    bad_conv(3 * (AF_EP_MAX_STEPS + 1), many, -1, NULL, AF_DTYPE_FLOAT, -1, NULL);
}

static void test_bad_inputs(void **state) {
    (void)state;
    /* FusedMatMul: inner dims disagree; bias of the wrong length; LN scale of the wrong length. */
    for (int v = 0; v < 3; v++) {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t ad[2] = {3, 4}, bd[2] = {v == 0 ? 5 : 4, 2}, nd[1] = {v == 1 ? 3 : 2}, kd[1] = {5};
        af_value *ins[4] = {tu_const(g, 2, ad, -1.0, 1.0), tu_const(g, 2, bd, -1.0, 1.0), tu_const(g, 1, nd, -1.0, 1.0), v == 2 ? tu_const(g, 1, kd, -1.0, 1.0) : NULL};
        af_node *f = add(g, "FusedMatMul", 4, ins);
        mark_output(g, f->out[0]);
        run_fails(g);
        af_arena_free(a);
    }
    /* FusedMatMul ln_rms: without ln_scale; with an ln_bias. */
    for (int v = 0; v < 2; v++) {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t ad[2] = {3, 4}, bd[2] = {4, 2}, kd[1] = {4};
        af_value *ins[5] = {tu_const(g, 2, ad, -1.0, 1.0), tu_const(g, 2, bd, -1.0, 1.0), NULL,
                            v ? tu_const(g, 1, kd, 0.5, 1.5) : NULL, v ? tu_const(g, 1, kd, -1.0, 1.0) : NULL};
        af_node *f = add(g, "FusedMatMul", 5, ins);
        set_int(f, "ln_rms", 1);
        mark_output(g, f->out[0]);
        run_fails(g);
        af_arena_free(a);
    }
    /* RMSNormalization with a third input. */
    {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t xd[2] = {3, 4}, kd[1] = {4};
        af_value *ins[3] = {tu_const(g, 2, xd, -1.0, 1.0), tu_const(g, 1, kd, 0.5, 1.5), tu_const(g, 1, kd, -1.0, 1.0)};
        mark_output(g, add(g, "RMSNormalization", 3, ins)->out[0]);
        run_fails(g);
        af_arena_free(a);
    }
    /* SqueezeExcite: gate not a sigmoid; W2 channels differ from X. */
    for (int v = 0; v < 2; v++) {
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        int64_t xd[4] = {1, 4, 2, 2}, w1d[4] = {2, 4, 1, 1}, w2d[4] = {v ? 3 : 4, 2, 1, 1};
        af_value *ins[5] = {tu_const(g, 4, xd, -1.0, 1.0), tu_const(g, 4, w1d, -1.0, 1.0), NULL, tu_const(g, 4, w2d, -1.0, 1.0), NULL};
        af_node *f = add(g, "SqueezeExcite", 5, ins);
        int64_t act = AF_EP_RELU, gate = v ? AF_EP_SIGMOID : AF_EP_RELU;
        set_ints(f, "act", 1, &act);
        set_ints(f, "gate", 1, &gate);
        mark_output(g, f->out[0]);
        run_fails(g);
        af_arena_free(a);
    }
    /* ConvPoolFc: FC features differ from conv channels. */
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    int64_t xd[4] = {1, 2, 4, 4}, wd[4] = {3, 2, 3, 3}, fd[2] = {4, 6};
    af_value *ins[5] = {tu_const(g, 4, xd, -1.0, 1.0), tu_const(g, 4, wd, -1.0, 1.0), NULL, tu_const(g, 2, fd, -1.0, 1.0), NULL};
    af_node *f = add(g, "ConvPoolFc", 5, ins);
    mark_output(g, f->out[0]);
    run_fails(g);
    af_arena_free(a);
    /* int64 constant unused: FusedConv on int64 X is unsupported. */
    a = af_arena_new();
    g = tu_graph(a, "test_fused", 8);
    int64_t one[1] = {1};
    af_value *xi = ints_const(g, 1, one);
    af_value *cins[2] = {xi, xi};
    f = add(g, "FusedConv", 2, cins);
    mark_output(g, f->out[0]);
    run_fails(g);
    af_arena_free(a);
}

/* ---- the int8 form (quant = 1) ------------------------------------------------------------------ */

/* An INT8 constant with values uniform in [-128, 127]. */
static af_value *i8_const(af_graph *g, int rank, const int64_t *dims) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "q"), AF_DTYPE_INT8, rank, dims);
    assert_non_null(v);
    int8_t *p = v->type.data;
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++)
        p[i] = (int8_t)((int)floor((tu_rnd() + 1.0) * 128.0) - 128);
    return v;
}

/* fq(X) of a float constant, written out here from the design's formula (division by s, round
 * half to even, clamp to [0, 255] in the uint8 domain). */
static af_value *fq_const(af_graph *g, const af_value *x, float s, int z) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "fq"), AF_DTYPE_FLOAT,
                                     x->type.rank, x->type.dims);
    assert_non_null(v);
    const float *src = x->type.data;
    float *dst = v->type.data;
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++) {
        float q = nearbyintf(src[i] / s) + (float)z;
        q = q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
        dst[i] = (q - (float)z) * s;
    }
    return v;
}

/* W * w_scale[channel] of an INT8 constant, channel = i / inner % channels. */
static af_value *deq_const(af_graph *g, const af_value *w, const float *ws, int nws,
                           int64_t inner, int64_t channels) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "dq"), AF_DTYPE_FLOAT,
                                     w->type.rank, w->type.dims);
    assert_non_null(v);
    const int8_t *src = w->type.data;
    float *dst = v->type.data;
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++)
        dst[i] = (float)src[i] * ws[nws == 1 ? 0 : i / inner % channels];
    return v;
}

static void set_quant(af_node *n, float s, int z, int nws, const float *ws) {
    set_int(n, "quant", 1);
    set_float(n, "x_scale", s);
    set_int(n, "x_zero_point", z);
    set_floats(n, "w_scale", nws, ws);
}

/* Scales around 0.01 (so W * w_scale is about [-1.3, 1.3]), one or one per channel. */
static int make_scales(float *ws, int64_t channels, bool per_channel) {
    int nws = per_channel ? (int)channels : 1;
    for (int i = 0; i < nws; i++)
        ws[i] = 0.01f * (float)(1.25 + 0.75 * tu_rnd());
    return nws;
}

/* A quantized FusedConv (X in [-1.5, 1.5], scale s, zero point z: s = 0.01 sends codes past
 * both ends of [0, 255] for z = 0 and z = 255) against the float FusedConv of fq(X) and the
 * dequantized W built above, both with program p. */
static void quant_conv_run(const conv_case *cc, prog *p, float s, int z, bool per_ch) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    af_value *x, *wf, *b;
    conv_consts(g, cc, &x, &wf, &b);
    for (int64_t i = 0; i < af_tensor_numel(&x->type); i++)
        ((float *)x->type.data)[i] *= 1.5f;
    af_value *wq = i8_const(g, wf->type.rank, wf->type.dims);
    float ws[64];
    int nws = make_scales(ws, cc->m, per_ch);
    int64_t inner = af_tensor_numel(&wq->type) / cc->m;
    af_value *xr = fq_const(g, x, s, z), *wr = deq_const(g, wq, ws, nws, inner, cc->m);
    prog_make_operands(g, p);
    af_value *ins[3] = {x, wq, b}, *rins[3] = {xr, wr, b};
    af_node *f = addn(g, "FusedConv", 3 + prog_operands(p), ins, 3);
    set_conv_attrs(f, cc);
    set_quant(f, s, z, nws, ws);
    prog_attach(f, p, 3);
    af_node *r = addn(g, "FusedConv", 3 + prog_operands(p), rins, 3);
    set_conv_attrs(r, cc);
    prog_attach(r, p, 3);
    mark_output(g, f->out[0]);
    mark_output(g, r->out[0]);
    run_compare(g);
    af_arena_free(a);
}

static void test_quant_conv(void **state) {
    (void)state;
    static const int zeros[3] = {0, 255, 131};
    for (size_t c = 0; c < AF_COUNT(conv_cases); c++)
        for (int zi = 0; zi < 3; zi++) {
            const conv_case *cc = &conv_cases[c];
            int64_t pc[AF_MAX_RANK], full[AF_MAX_RANK];
            int pcr = per_channel(cc, pc), fr = conv_out_dims(cc, full);
            prog p = {0};
            p.s[p.n++] = bin(AF_EP_ADD, false, fr, full); /* residual */
            p.s[p.n++] = zi == 2 ? bin(AF_EP_MUL, false, pcr, pc) : un(AF_EP_RELU, 0, 0);
            quant_conv_run(cc, &p, zi == 2 ? 0.02f : 0.01f, zeros[zi], (c + (size_t)zi) % 2 == 0);
        }
}

/* A quantized FusedMatMul against the float FusedMatMul of fq(A) and the dequantized B. */
static void quant_mm_run(const mm_case *mc, prog *p, float s, int z, bool per_ch) {
    af_arena *a = af_arena_new();
    af_graph *g = tu_graph(a, "test_fused", 8);
    int64_t nd[1] = {mc->n};
    af_value *A = tu_const(g, mc->ar, mc->ad, -1.5, 1.5), *B = i8_const(g, mc->br, mc->bd);
    af_value *bias = mc->bias ? tu_const(g, 1, nd, -1.0, 1.0) : NULL;
    float ws[64];
    int nws = make_scales(ws, mc->n, per_ch);
    int64_t k = mc->ad[mc->ar - 1];
    af_value *Ar = fq_const(g, A, s, z), *Br = deq_const(g, B, ws, nws, mc->tb ? k : 1, mc->n);
    prog_make_operands(g, p);
    af_value *ins[5] = {A, B, bias, NULL, NULL}, *rins[5] = {Ar, Br, bias, NULL, NULL};
    af_node *f = addn(g, "FusedMatMul", 5 + prog_operands(p), ins, 5);
    set_int(f, "trans_b", mc->tb);
    set_quant(f, s, z, nws, ws);
    prog_attach(f, p, 5);
    af_node *r = addn(g, "FusedMatMul", 5 + prog_operands(p), rins, 5);
    set_int(r, "trans_b", mc->tb);
    prog_attach(r, p, 5);
    mark_output(g, f->out[0]);
    mark_output(g, r->out[0]);
    run_compare(g);
    af_arena_free(a);
}

static void test_quant_matmul(void **state) {
    (void)state;
    static const mm_case cases[] = {
        /* 2-D, bias */
        {2, 2, {5, 7}, {7, 3}, false, false, false, true, 3, false},
        /* trans_b, no bias */
        {2, 2, {4, 9}, {6, 9}, true, false, false, false, 6, false},
        /* 3-D A over a 2-D B */
        {3, 2, {2, 3, 5}, {5, 4}, false, false, false, true, 4, false},
        /* 3-D A over a 3-D trans_b B */
        {3, 3, {2, 3, 5}, {2, 4, 5}, true, false, false, true, 4, false},
    };
    static const int zeros[3] = {0, 255, 128};
    for (size_t c = 0; c < AF_COUNT(cases); c++)
        for (int zi = 0; zi < 3; zi++) {
            prog p = {0};
            int64_t nd[1] = {cases[c].n};
            p.s[p.n++] = zi == 1 ? bin(AF_EP_ADD, false, 1, nd) : un(AF_EP_RELU, 0, 0);
            quant_mm_run(&cases[c], &p, zi == 2 ? 0.02f : 0.01f, zeros[zi], (c + (size_t)zi) % 2 == 1);
        }
}

/* Bad quantization attributes, each rejected with a status naming the node and the reason. */
typedef struct bad_quant {
    bool mm;       /* FusedMatMul (else FusedConv) */
    bool w_float;  /* W float32 (else int8) */
    int quant;     /* the quant attribute (-1: none) */
    float x_scale;
    int64_t z;
    int nws;
    const char *why; /* in the message */
} bad_quant;

static void test_quant_bad_attrs(void **state) {
    (void)state;
    static const bad_quant cases[] = {
        {false, false, 1, 0.0f, 0, 1, "x_scale"},
        {false, false, 1, -0.5f, 0, 1, "x_scale"},
        {true, false, 1, INFINITY, 0, 1, "x_scale"},
        {false, false, 1, NAN, 0, 1, "x_scale"},
        {false, false, 1, 0.1f, 256, 1, "x_zero_point"},
        {true, false, 1, 0.1f, -1, 1, "x_zero_point"},
        {false, false, 1, 0.1f, 0, 2, "w_scale"},
        {true, false, 1, 0.1f, 0, 4, "w_scale"},
        {true, false, 1, 0.1f, 0, 0, "w_scale"},
        {false, true, 1, 0.1f, 0, 1, "int8 W"},
        {true, true, 1, 0.1f, 0, 1, "int8 W"},
        {false, false, -1, 0.1f, 0, 1, "quant"},
        {false, false, 2, 0.1f, 0, 1, "quant"},
    };
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const bad_quant *bq = &cases[c];
        af_arena *a = af_arena_new();
        af_graph *g = tu_graph(a, "test_fused", 8);
        /* Conv: X [1, 2, 4, 4], W [3, 2, 3, 3]; MatMul: A [2, 5], B [5, 3]. */
        int64_t xd[4] = {1, 2, 4, 4}, wd[4] = {3, 2, 3, 3}, ad[2] = {2, 5}, bd[2] = {5, 3};
        af_value *x = bq->mm ? tu_const(g, 2, ad, -1.0, 1.0) : tu_const(g, 4, xd, -1.0, 1.0);
        af_value *w = bq->w_float ? (bq->mm ? tu_const(g, 2, bd, -1.0, 1.0) : tu_const(g, 4, wd, -1.0, 1.0))
                                  : (bq->mm ? i8_const(g, 2, bd) : i8_const(g, 4, wd));
        af_value *ins[2] = {x, w};
        af_node *f = add(g, bq->mm ? "FusedMatMul" : "FusedConv", 2, ins);
        float ws[4] = {0.1f, 0.1f, 0.1f, 0.1f};
        if (bq->quant >= 0)
            set_int(f, "quant", bq->quant);
        set_float(f, "x_scale", bq->x_scale);
        set_int(f, "x_zero_point", bq->z);
        if (bq->nws > 0)
            set_floats(f, "w_scale", bq->nws, ws);
        mark_output(g, f->out[0]);
        af_tensor out[2];
        af_error err = {0};
        memset(out, 0, sizeof out);
        assert_int_not_equal(af_exec_graph(g, NULL, out, &err), AF_OK);
        if (!strstr(err.message, "node") || !strstr(err.message, bq->why)) {
            fprintf(stderr, "case %zu: '%s' does not say '%s'\n", c, err.message, bq->why);
            fail();
        }
        af_arena_free(a);
    }
}

int main(void) {
    tu_rng = 0x5eed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_conv_geometries),
        cmocka_unit_test(test_fused_conv_every_op),
        cmocka_unit_test(test_fused_matmul_gemm),
        cmocka_unit_test(test_fused_matmul_batched),
        cmocka_unit_test(test_fused_elementwise),
        cmocka_unit_test(test_epilogue_runs_wrap),
        cmocka_unit_test(test_conv_pool_fc),
        cmocka_unit_test(test_squeeze_excite),
        cmocka_unit_test(test_shapes_unknown),
        cmocka_unit_test(test_bad_epilogues),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_quant_conv),
        cmocka_unit_test(test_quant_matmul),
        cmocka_unit_test(test_quant_bad_attrs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
