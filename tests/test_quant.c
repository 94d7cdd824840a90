/* The int8 form of FusedConv / FusedMatMul (quant = 1, kernels/ref/fused_quant.c) through the
 * lowering (lower/int8.c) and the fast kernels: every graph is built twice from the same seed;
 * one copy runs as built on the reference kernels (AF_ISA_REFERENCE), the other is lowered and
 * run on each ISA this CPU has with 1 and 2 threads (2 threads: the bits of 1 thread's), within
 * float rounding of the reference (and, on the best ISA, the same bits after a round trip
 * through an .afm file). On a CPU with AVX512_VNNI the dense convs and the matmuls run on the
 * U8S8 core (checked: "precision" int8, packed int8 weights) and the grouped / depthwise ones
 * fall back to float32 (precision_why); with a calibrated int8 rate under 1.2x fp32 every node
 * falls back (under --precision_mode=bf16 too), cores sharing an activation through one
 * QuantizeDequantize. Cases: 1x1, 3x3 stride 1 and 2 with padding, dilation, channels not a
 * multiple of 4, 1-D and 3-D, batch 2, zero points 0, 255 and inner, per-tensor and per-channel
 * scales, epilogues (bias, Relu, residual, a sigmoid on the tile), matmuls with trans_b and a
 * batched A; and bad quantization attributes rejected by the lowering's shape inference naming
 * the node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "driver/compile.h"
#include "format/afm.h"
#include "ir/epilogue.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"
#include "runtime/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- building ------------------------------------------------------------------------------------ */

static void set_int(af_node *n, const char *name, int64_t v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INT);
    assert_non_null(a);
    a->i = v;
}

static void set_float(af_node *n, const char *name, float v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_FLOAT);
    assert_non_null(a);
    a->f = v;
}

static void set_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INTS);
    assert_non_null(a);
    a->n = count;
    a->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
}

static void set_floats(af_node *n, const char *name, int count, const float *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_FLOATS);
    assert_non_null(a);
    a->n = count;
    a->floats = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(float));
    memcpy(a->floats, v, (size_t)count * sizeof(float));
}

/* Set: weights within [-64, 64] (7 bits: int8 on CPUs without VNNI too, lower/int8.c). */
static bool w7;

static af_value *i8_const(af_graph *g, int rank, const int64_t *dims) {
    af_value *v = af_value_new_const(g, af_graph_unique_name(g, "q"), AF_DTYPE_INT8, rank, dims);
    assert_non_null(v);
    int8_t *p = v->type.data;
    for (int64_t i = 0; i < af_tensor_numel(&v->type); i++)
        p[i] = w7 ? (int8_t)(i % 11 == 0 ? (i % 2 ? 64 : -64) : tu_rnd() * 64.9)
                  : (int8_t)(i % 11 == 0 ? (i % 2 ? 127 : -128) : tu_rnd() * 127.9);
    return v;
}

/* One quantized node: conv (nsp spatial dims; group; k, s, d, pads per dim) or matmul (A dims
 * x, B [K, N] or [N, K] with trans_b). */
typedef struct qcase {
    const char *name;
    bool mm;
    int64_t x[5]; /* the input's dims (0 ends) */
    int64_t m, group, k[3], s[3], d[3], pads[6];
    bool tb;
    int z;
    float xs;
    bool per_channel;
    int ep; /* 0 none; 1 bias + Relu; 2 bias + residual + Relu; 3 residual + sigmoid */
    bool int8; /* runs on the U8S8 core when the CPU has VNNI */
} qcase;

static int rank_of(const qcase *c) {
    int r = 0;
    while (r < 5 && c->x[r]) r++;
    return r;
}

static void mark_output(af_graph *g, af_value *v) {
    v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

/* g's float32 input "x" of the given dims. */
static af_value *graph_input(af_graph *g, int rank, const int64_t *dims) {
    af_value *x = af_value_new(g, "x");
    assert_non_null(x);
    x->is_input = true;
    af_tensor_set_type(&x->type, AF_DTYPE_FLOAT, rank, dims);
    g->inputs[g->ninputs++] = x;
    return x;
}

static af_graph *build(af_arena *a, const qcase *c) {
    tu_rng = 7;
    af_graph *g = tu_graph(a, "test_quant", 8);
    int r = rank_of(c), nsp = r - 2;
    af_value *x = graph_input(g, r, c->x);
    int64_t kk = c->x[r - 1], wd[5], nch = c->m;
    af_value *w;
    if (c->mm) {
        wd[0] = c->tb ? c->m : kk;
        wd[1] = c->tb ? kk : c->m;
        w = i8_const(g, 2, wd);
    } else {
        wd[0] = c->m;
        wd[1] = c->x[1] / c->group;
        for (int i = 0; i < nsp; i++) wd[2 + i] = c->k[i];
        w = i8_const(g, r, wd);
    }
    af_value *bias = c->ep == 1 || c->ep == 2 ? tu_const(g, 1, &nch, -1.0, 1.0) : NULL;
    int nin = c->mm ? 5 : 3, slot = nin;
    af_node *n = af_node_new(g, c->mm ? AF_OP_FUSED_MATMUL : AF_OP_FUSED_CONV, "qnode",
                             nin + (c->ep >= 2), 1);
    assert_non_null(n);
    n->domain = AF_DOMAIN;
    af_node_set_input(n, 0, x);
    af_node_set_input(n, 1, w);
    if (bias) af_node_set_input(n, 2, bias);
    af_node_set_output(n, 0, af_value_new(g, "y"));
    if (c->mm) {
        set_int(n, "trans_b", c->tb);
    } else {
        set_int(n, "group", c->group);
        set_ints(n, "kernel_shape", nsp, c->k);
        set_ints(n, "strides", nsp, c->s);
        set_ints(n, "dilations", nsp, c->d);
        set_ints(n, "pads", 2 * nsp, c->pads);
    }
    float ws[64];
    int nws = c->per_channel ? (int)c->m : 1;
    for (int i = 0; i < nws; i++) ws[i] = (float)(0.004 * (1.5 + tu_rnd()));
    set_int(n, "quant", 1);
    set_float(n, "x_scale", c->xs);
    set_int(n, "x_zero_point", c->z);
    set_floats(n, "w_scale", nws, ws);
    af_error err;
    if (c->ep >= 2) { /* the residual: the output's shape, known once the node's is inferred */
        if (af_graph_infer_shapes(g, &err)) fail_msg("%s: %s", c->name, err.message);
        af_tensor *yt = &n->out[0]->type;
        af_value *res = tu_const(g, yt->rank, yt->dims, -1.0, 1.0);
        af_node_set_input(n, slot, res);
        int64_t prog[6] = {AF_EP_ADD, slot, 0, c->ep == 2 ? AF_EP_RELU : AF_EP_SIGMOID, -1, 0};
        float params[4] = {0};
        set_ints(n, "epilogue", 6, prog);
        set_floats(n, "epilogue_params", 4, params);
    } else if (c->ep == 1) {
        int64_t prog[3] = {AF_EP_RELU, -1, 0};
        float params[2] = {0};
        set_ints(n, "epilogue", 3, prog);
        set_floats(n, "epilogue_params", 2, params);
    }
    mark_output(g, n->out[0]);
    if (af_graph_infer_shapes(g, &err)) fail_msg("%s: %s", c->name, err.message);
    return g;
}

/* ---- running -------------------------------------------------------------------------------------- */

static af_tensor *input_of(const qcase *c) {
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, rank_of(c), c->x);
    assert_non_null(t);
    tu_rng = 99;
    for (int64_t i = 0; i < af_tensor_numel(t); i++) ((float *)t->data)[i] = (float)(1.5 * tu_rnd());
    return t;
}

static void run(const qcase *c, af_graph *g, const af_tensor *x, af_tensor *out, af_runtime *rt) {
    af_error err;
    const af_tensor *in[1] = {x};
    af_plan *p = NULL;
    assert_int_equal(af_plan_build(g, &p, &err), AF_OK);
    void *arena = p->arena_size ? aligned_alloc(64, (p->arena_size + 63) & ~(uint64_t)63) : NULL;
    af_status st = af_exec_graph_planned(g, p, arena, rt, in, out, &err);
    free(arena);
    af_plan_free(p);
    if (st) fail_msg("%s [%s]: %s", c->name, af_isa_name(af_isa_get()), err.message);
}

/* Within float rounding of the reference: the int8 sums are exact, the reference's are double
 * sums of float-rounded products. */
static void compare(const qcase *c, const af_tensor *want, const af_tensor *got) {
    assert_int_equal(want->rank, got->rank);
    int64_t n = af_tensor_numel(want);
    const float *a = want->data, *b = got->data;
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(a[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= 1e-4 * fabs(a[i]) + 2e-5 * (scale > 1 ? scale : 1)))
            fail_msg("%s (%s): element %lld: %.8g, reference %.8g", c->name,
                     af_isa_name(af_isa_get()), (long long)i, b[i], a[i]);
}

/* The quantized node, by its name (the layout pass may put a reorder after it). */
static const af_node *qnode(const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        if (!strcmp(g->nodes[i]->name, "qnode")) return g->nodes[i];
    fail_msg("no node qnode");
    return NULL;
}

/* The reference once; then lowered with cfg on every ISA, 1 and 2 threads; the int8 decision
 * checked where expect_int8 says (on the best ISA). */
static void check_cfg(const qcase *c, const af_precision_cfg *cfg, bool slow_int8) {
    af_tensor *x = input_of(c);
    af_isa best = af_isa_best();
    af_arena *ra = af_arena_new();
    af_graph *rg = build(ra, c);
    af_isa_set(AF_ISA_REFERENCE);
    af_tensor want;
    memset(&want, 0, sizeof want);
    run(c, rg, x, &want, NULL);
    af_runtime *rt2 = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt2, &err), AF_OK);
    for (af_isa isa = AF_ISA_GENERIC; isa <= best; isa++) {
        af_isa_set(isa);
        af_arena *a = af_arena_new();
        af_graph *g = build(a, c);
        if (af_lower(g, cfg, &err)) fail_msg("%s: %s", c->name, err.message);
        const af_node *n = qnode(g);
        const char *prec = af_attr_str(n, "precision", "");
        /* without VNNI: 7-bit weights and a measured rate (cfg) */
        bool want_int8 = c->int8 && !slow_int8 && (af_cpu_vnni() || (w7 && cfg && cfg->gemm_flops > 0));
        if (want_int8 != !strcmp(prec, "int8"))
            fail_msg("%s [%s]: precision '%s' (%s)", c->name, af_isa_name(isa), prec,
                     af_attr_str(n, "precision_why", "-"));
        if (want_int8 && (n->in[1]->type.dtype != AF_DTYPE_INT8 || n->in[1]->type.rank != 1))
            fail_msg("%s: int8 weights not packed", c->name);
        if (!want_int8 && (af_attr_int(n, "quant", 0) ||
                           strncmp(af_attr_str(n, "precision_why", ""), "int8:", 5)))
            fail_msg("%s [%s]: not rewritten to float32 with a reason", c->name, af_isa_name(isa));
        af_tensor one, two;
        memset(&one, 0, sizeof one);
        memset(&two, 0, sizeof two);
        run(c, g, x, &one, NULL);
        compare(c, &want, &one);
        run(c, g, x, &two, rt2);
        if (one.nbytes != two.nbytes || memcmp(one.data, two.data, one.nbytes))
            fail_msg("%s on %s: 2 threads differ from 1", c->name, af_isa_name(isa));
        if (isa == best) { /* the lowered graph through an .afm (packed int8 weights) */
            char path[64];
            snprintf(path, sizeof path, "/tmp/test_quant.%ld.afm", (long)getpid());
            af_model *m = NULL;
            if (af_afm_save(path, g, NULL, &err) || af_afm_load(path, &m, NULL, &err))
                fail_msg("%s: %s", c->name, err.message);
            unlink(path);
            af_tensor_release(&two);
            memset(&two, 0, sizeof two);
            run(c, m->graph, x, &two, NULL);
            if (one.nbytes != two.nbytes || memcmp(one.data, two.data, one.nbytes))
                fail_msg("%s: the .afm computes other bits", c->name);
            af_model_free(m);
        }
        af_tensor_release(&one);
        af_tensor_release(&two);
        af_arena_free(a);
    }
    af_isa_set(best);
    af_runtime_free(rt2);
    af_tensor_release(&want);
    af_arena_free(ra);
    af_tensor_free(x);
}

static const qcase cases[] = {
    {"1x1", false, {1, 16, 8, 8}, 24, 1, {1, 1}, {1, 1}, {1, 1}, {0}, false, 0, 0.01f, true, 1, true},
    {"3x3 pad 1, C 5", false, {1, 5, 9, 7}, 33, 1, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false, 255, 0.01f, false, 2, true},
    {"3x3 stride 2", false, {2, 8, 11, 11}, 16, 1, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, 128, 0.02f, true, 3, true},
    {"3x3 dilation 2", false, {1, 4, 10, 9}, 8, 1, {3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, false, 37, 0.01f, true, 0, true},
    {"1x1 stride 2 pad", false, {1, 12, 7, 9}, 20, 1, {1, 1}, {2, 2}, {1, 1}, {1, 0, 1, 1}, false, 0, 0.01f, false, 1, true},
    {"1-D k5", false, {2, 6, 17}, 10, 1, {5}, {1}, {1}, {2, 2}, false, 200, 0.01f, true, 2, true},
    {"3-D 3x3x3", false, {1, 4, 5, 6, 7}, 8, 1, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, false, 0, 0.01f, true, 1, true},
    {"grouped", false, {1, 8, 6, 6}, 8, 2, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false, 128, 0.01f, true, 1, false},
    {"depthwise", false, {1, 8, 6, 6}, 8, 8, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false, 0, 0.01f, false, 2, false},
    {"matmul", true, {5, 37}, 19, 0, {0}, {0}, {0}, {0}, false, 0, 0.01f, true, 1, true},
    {"matmul trans_b batched", true, {3, 4, 40}, 24, 0, {0}, {0}, {0}, {0}, true, 255, 0.02f, false, 2, true},
    {"matmul odd K", true, {13, 3}, 50, 0, {0}, {0}, {0}, {0}, false, 129, 0.01f, true, 3, true},
};

static void test_quant_lowered(void **state) {
    (void)state;
    for (size_t i = 0; i < AF_COUNT(cases); i++) check_cfg(&cases[i], NULL, false);
}

/* A calibrated int8 rate under 1.2x the fp32 rate: every node runs float32 (precision_why). */
static void test_quant_slow_int8(void **state) {
    (void)state;
    af_precision_cfg cfg = {AF_PREC_FP32, NULL, 100e9, 0, 110e9};
    check_cfg(&cases[1], &cfg, true);
    check_cfg(&cases[9], &cfg, true);
    /* under --precision_mode=bf16 too: the int8 decision and its reason stand */
    af_precision_cfg bf = {AF_PREC_BF16, NULL, 100e9, 400e9, 110e9};
    check_cfg(&cases[9], &bf, true);
    check_cfg(&cases[7], &bf, false);
}

/* 7-bit weights with a fast calibrated int8 rate: the U8S8 core on every ISA, VNNI or not
 * (VPMADDUBSW's exact path on AVX2 and AVX-512 without VNNI, the widened bytes on the generic
 * one), the reference's numbers; 8-bit weights without VNNI stay float32, with the reason. */
static void test_quant_7bit(void **state) {
    (void)state;
    af_precision_cfg fast = {AF_PREC_FP32, NULL, 100e9, 0, 300e9};
    w7 = true;
    for (size_t i = 0; i < AF_COUNT(cases); i++) check_cfg(&cases[i], &fast, false);
    w7 = false;
    check_cfg(&cases[0], &fast, false);
    check_cfg(&cases[9], &fast, false);
}

/* Two cores reading one activation with the same quantization (BERT's Q, K, V projections)
 * fall back to float32 through one shared QuantizeDequantize, and compute the reference's. */
static void test_quant_shared_fq(void **state) {
    (void)state;
    af_precision_cfg slow = {AF_PREC_FP32, NULL, 100e9, 0, 110e9};
    af_tensor want[2], got[2];
    memset(want, 0, sizeof want);
    memset(got, 0, sizeof got);
    int64_t xd[2] = {6, 20};
    af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 2, xd);
    assert_non_null(x);
    for (int64_t i = 0; i < 120; i++) ((float *)x->data)[i] = (float)(1.5 * tu_rnd());
    af_isa best = af_isa_best();
    for (int lowered = 0; lowered < 2; lowered++) {
        af_arena *a = af_arena_new();
        tu_rng = 5;
        af_graph *g = tu_graph(a, "test_quant", 8);
        af_value *xv = af_value_new(g, "x");
        xv->is_input = true;
        af_tensor_set_type(&xv->type, AF_DTYPE_FLOAT, 2, xd);
        g->inputs[g->ninputs++] = xv;
        for (int k = 0; k < 2; k++) {
            int64_t bd[2] = {20, 9 + k};
            af_node *n = af_node_new(g, AF_OP_FUSED_MATMUL, k ? "proj_k" : "proj_q", 2, 1);
            assert_non_null(n);
            n->domain = AF_DOMAIN;
            af_node_set_input(n, 0, xv);
            af_node_set_input(n, 1, i8_const(g, 2, bd));
            af_node_set_output(n, 0, af_value_new(g, k ? "yk" : "yq"));
            float ws = 0.005f;
            set_int(n, "quant", 1);
            set_float(n, "x_scale", 0.02f);
            set_int(n, "x_zero_point", 120);
            set_floats(n, "w_scale", 1, &ws);
            mark_output(g, n->out[0]);
        }
        af_error err;
        if (af_graph_infer_shapes(g, &err)) fail_msg("%s", err.message);
        qcase c = {"shared fq", true, {6, 20}, 0, 0, {0}, {0}, {0}, {0}, false, 0, 0, false, 0, false};
        af_isa_set(lowered ? best : AF_ISA_REFERENCE);
        if (lowered) {
            if (af_lower(g, &slow, &err)) fail_msg("%s", err.message);
            int fq = 0;
            for (int i = 0; i < g->nnodes; i++) fq += g->nodes[i]->op == AF_OP_QUANTIZE_DEQUANTIZE;
            assert_int_equal(fq, 1);
        }
        run(&c, g, x, lowered ? got : want, NULL);
        af_arena_free(a);
    }
    af_isa_set(best);
    for (int o = 0; o < 2; o++) {
        qcase c = {"shared fq", true, {6, 20}, 0, 0, {0}, {0}, {0}, {0}, false, 0, 0, false, 0, false};
        compare(&c, &want[o], &got[o]);
        af_tensor_release(&want[o]);
        af_tensor_release(&got[o]);
    }
    af_tensor_free(x);
}

/* A float32 fallback whose X comes from a fused op with an epilogue program (MobileNet-v2's
 * expand conv before a depthwise one): the fake quantization becomes the producer's last
 * epilogue step, no QuantizeDequantize node, when X's other readers quantize it alike (the
 * second fallback then reads X as it is); when one quantizes with another scale, each keeps
 * its own QuantizeDequantize node and the producer's program is untouched. The producer is a
 * FusedElementwise Relu so that both paths see the same X bits; the lowered graph on the best
 * ISA against the unlowered reference. */
static void test_quant_producer_fq(void **state) {
    (void)state;
    af_precision_cfg slow = {AF_PREC_FP32, NULL, 100e9, 0, 110e9};
    int64_t xd[2] = {6, 20};
    af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 2, xd);
    assert_non_null(x);
    for (int64_t i = 0; i < 120; i++) ((float *)x->data)[i] = (float)(1.5 * tu_rnd());
    af_isa best = af_isa_best();
    for (int differ = 0; differ < 2; differ++) {
        af_tensor want[2], got[2];
        memset(want, 0, sizeof want);
        memset(got, 0, sizeof got);
        for (int lowered = 0; lowered < 2; lowered++) {
            af_arena *a = af_arena_new();
            tu_rng = 5;
            af_graph *g = tu_graph(a, "test_quant", 8);
            af_value *xv = graph_input(g, 2, xd);
            af_node *p = af_node_new(g, AF_OP_FUSED_ELEMENTWISE, "producer", 1, 1);
            assert_non_null(p);
            p->domain = AF_DOMAIN;
            af_node_set_input(p, 0, xv);
            af_node_set_output(p, 0, af_value_new(g, "h"));
            int64_t relu[3] = {5, -1, 0};
            set_ints(p, "epilogue", 3, relu);
            for (int k = 0; k < 2; k++) {
                int64_t bd[2] = {20, 9 + k};
                af_node *n = af_node_new(g, AF_OP_FUSED_MATMUL, k ? "proj_k" : "proj_q", 2, 1);
                assert_non_null(n);
                n->domain = AF_DOMAIN;
                af_node_set_input(n, 0, p->out[0]);
                af_node_set_input(n, 1, i8_const(g, 2, bd));
                af_node_set_output(n, 0, af_value_new(g, k ? "yk" : "yq"));
                float ws = 0.005f;
                set_int(n, "quant", 1);
                set_float(n, "x_scale", differ && k ? 0.03f : 0.02f);
                set_int(n, "x_zero_point", 3);
                set_floats(n, "w_scale", 1, &ws);
                mark_output(g, n->out[0]);
            }
            af_error err;
            if (af_graph_infer_shapes(g, &err)) fail_msg("%s", err.message);
            qcase c = {"producer fq", true, {6, 20}, 0, 0, {0}, {0}, {0}, {0}, false, 0, 0, false, 0, false};
            af_isa_set(lowered ? best : AF_ISA_REFERENCE);
            if (lowered) {
                if (af_lower(g, &slow, &err)) fail_msg("%s", err.message);
                int fq = 0;
                for (int i = 0; i < g->nnodes; i++) fq += g->nodes[i]->op == AF_OP_QUANTIZE_DEQUANTIZE;
                assert_int_equal(fq, differ ? 2 : 0);
                const int64_t *ep = NULL;
                int ne = af_attr_ints(p, "epilogue", &ep);
                assert_int_equal(ne, differ ? 3 : 6);
                if (!differ) assert_int_equal(ep[3], AF_EP_FAKE_QUANT);
            }
            run(&c, g, x, lowered ? got : want, NULL);
            af_arena_free(a);
        }
        af_isa_set(best);
        for (int o = 0; o < 2; o++) {
            qcase c = {"producer fq", true, {6, 20}, 0, 0, {0}, {0}, {0}, {0}, false, 0, 0, false, 0, false};
            compare(&c, &want[o], &got[o]);
            af_tensor_release(&want[o]);
            af_tensor_release(&got[o]);
        }
    }
    af_tensor_free(x);
}

/* ---- codes between int8 convs (lower/codes.c) ------------------------------------------------ */

/* A conv node reading x: int8 (quant, x_scale xs, zero point z, int8 W) or float32 (W in
 * [-0.5, 0.5]); k x k, pad k / 2, group; bias and the unary step act. */
static af_value *conv_node(af_graph *g, const char *name, af_value *x, int64_t m, int64_t k,
                           int64_t group, bool int8, float xs, int z, int act) {
    int64_t c = x->type.dims[1], wd[4] = {m, c / group, k, k}, ks[2] = {k, k}, one[2] = {1, 1};
    int64_t pads[4] = {k / 2, k / 2, k / 2, k / 2}, relu[3] = {act, -1, 0};
    af_node *n = af_node_new(g, AF_OP_FUSED_CONV, name, 3, 1);
    assert_non_null(n);
    n->domain = AF_DOMAIN;
    af_node_set_input(n, 0, x);
    af_node_set_input(n, 1, int8 ? i8_const(g, 4, wd) : tu_const(g, 4, wd, -0.5, 0.5));
    af_node_set_input(n, 2, tu_const(g, 1, &m, -1.0, 1.0));
    af_node_set_output(n, 0, af_value_new(g, af_graph_unique_name(g, "y")));
    set_int(n, "group", group);
    set_ints(n, "kernel_shape", 2, ks);
    set_ints(n, "strides", 2, one);
    set_ints(n, "dilations", 2, one);
    set_ints(n, "pads", 4, pads);
    set_ints(n, "epilogue", 3, relu);
    if (int8) {
        float ws = 0.004f;
        set_int(n, "quant", 1);
        set_float(n, "x_scale", xs);
        set_int(n, "x_zero_point", z);
        set_floats(n, "w_scale", 1, &ws);
    }
    af_error err;
    if (af_graph_infer_shapes(g, &err)) fail_msg("%s: %s", name, err.message);
    return n->out[0];
}

/* Chains whose middle activation becomes codes where the CPU runs int8 cores: an int8 1x1 conv
 * to 24 channels read by an int8 3x3 (the codes copied into its bordered image), to 10 channels
 * (not a multiple of 4: copied position by position) read by an int8 1x1 conv, a float32
 * depthwise conv read by an int8 1x1 (its codes read in place), and an int8 conv whose Sigmoid
 * runs on the stored tile (codes converted from the tile; the others from the registers).
 * Lowered with the codes pass and without (AUTOFUSION_CODES=0): the same bits, on every ISA
 * and at 2 threads; with VNNI the middle value is UINT8 and its producer has y_scale; a Relu
 * before codes with zero point 0 is dropped, one before zero point 7 kept. */
static void test_quant_codes(void **state) {
    (void)state;
    static const struct {
        int64_t mid, k2;
        bool dw;
        int act, z;
    } chains[] = {{24, 3, false, AF_EP_RELU, 7}, {10, 1, false, AF_EP_RELU, 0},
                  {12, 1, true, AF_EP_RELU, 0}, {16, 1, false, AF_EP_SIGMOID, 3}};
    int64_t xd[4] = {2, 12, 9, 11};
    af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 4, xd);
    assert_non_null(x);
    for (int64_t i = 0; i < af_tensor_numel(x); i++) ((float *)x->data)[i] = (float)(2.0 * tu_rnd() - 0.5);
    af_runtime *rt2 = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt2, &err), AF_OK);
    af_isa best = af_isa_best();
    for (size_t ci = 0; ci < AF_COUNT(chains); ci++)
        for (af_isa isa = AF_ISA_GENERIC; isa <= best; isa++) {
            af_isa_set(isa);
            af_tensor got[3];
            memset(got, 0, sizeof got);
            for (int codes = 0; codes < 2; codes++) {
                af_arena *a = af_arena_new();
                tu_rng = 11;
                af_graph *g = tu_graph(a, "test_quant", 8);
                af_value *xv = graph_input(g, 4, xd);
                int act = chains[ci].act, z = chains[ci].z;
                af_value *h = chains[ci].dw ? conv_node(g, "first", xv, 12, 3, 12, false, 0, 0, act)
                                            : conv_node(g, "first", xv, chains[ci].mid, 1, 1, true, 0.01f, 7, act);
                mark_output(g, conv_node(g, "second", h, 16, chains[ci].k2, 1, true, 0.02f, z, AF_EP_RELU));
                setenv("AUTOFUSION_CODES", codes ? "1" : "0", 1);
                af_status st = af_lower(g, NULL, &err);
                unsetenv("AUTOFUSION_CODES");
                if (st) fail_msg("chain %zu: %s", ci, err.message);
                const af_node *second = NULL;
                for (int i = 0; i < g->nnodes; i++)
                    if (!strcmp(g->nodes[i]->name, "second")) second = g->nodes[i];
                assert_non_null(second);
                h = second->in[0]; /* (the layout pass made it channels-last) */
                bool want = codes && !strcmp(af_attr_str(second, "precision", ""), "int8");
                bool is = h->type.dtype == AF_DTYPE_UINT8 && af_attr_float(h->producer, "y_scale", 0) == 0.02f;
                if (want != is) fail_msg("chain %zu on %s: codes %d, want %d", ci, af_isa_name(isa), is, want);
                const int64_t *ep = NULL;
                int steps = af_attr_ints(h->producer, "epilogue", &ep) / 3;
                if (want && steps != (act == AF_EP_RELU && z == 0 ? 0 : 1))
                    fail_msg("chain %zu: %d steps left before the codes", ci, steps);
                qcase c = {"codes", false, {2, 12, 9, 11}, 0, 0, {0}, {0}, {0}, {0}, false, 0, 0, false, 0, false};
                run(&c, g, x, &got[codes], NULL);
                if (codes) {
                    run(&c, g, x, &got[2], rt2);
                    if (got[1].nbytes != got[2].nbytes || memcmp(got[1].data, got[2].data, got[1].nbytes))
                        fail_msg("chain %zu on %s: 2 threads differ", ci, af_isa_name(isa));
                }
                af_arena_free(a);
            }
            if (got[0].nbytes != got[1].nbytes || memcmp(got[0].data, got[1].data, got[0].nbytes))
                fail_msg("chain %zu on %s: codes change the output", ci, af_isa_name(isa));
            for (int i = 0; i < 3; i++) af_tensor_release(&got[i]);
        }
    af_isa_set(best);
    af_runtime_free(rt2);
    af_tensor_free(x);
}

/* Bad quantization attributes fail shape inference, before any lowering, naming the node. */
static void test_quant_bad(void **state) {
    (void)state;
    static const struct {
        const char *attr;
        float f;
        int64_t i;
    } bad[] = {{"x_scale", 0.0f, 0}, {"x_scale", INFINITY, 0}, {"x_zero_point", 0, 300}};
    for (size_t b = 0; b < AF_COUNT(bad); b++) {
        af_arena *a = af_arena_new();
        af_graph *g = build(a, &cases[0]);
        af_node *n = (af_node *)qnode(g);
        for (int i = 0; i < n->nattrs; i++)
            if (!strcmp(n->attrs[i].name, bad[b].attr)) {
                n->attrs[i].f = bad[b].f;
                n->attrs[i].i = bad[b].i;
            }
        af_error err;
        memset(&err, 0, sizeof err);
        assert_int_not_equal(af_graph_infer_shapes(g, &err), AF_OK);
        if (!strstr(err.message, "qnode") || !strstr(err.message, bad[b].attr))
            fail_msg("'%s' does not name the node and %s", err.message, bad[b].attr);
        af_arena_free(a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_lowered),
        cmocka_unit_test(test_quant_slow_int8),
        cmocka_unit_test(test_quant_7bit),
        cmocka_unit_test(test_quant_shared_fq),
        cmocka_unit_test(test_quant_producer_fq),
        cmocka_unit_test(test_quant_bad),
        cmocka_unit_test(test_quant_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
