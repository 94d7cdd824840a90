/* The lowering stage (passes/lower.c, layout.c, packing) and the fast kernels it hands nodes to,
 * against the reference executor: every graph is built twice from the same seed; one copy runs
 * as built on the reference kernels (AF_ISA_REFERENCE), the other is fused (or not), lowered and
 * run on each ISA this CPU has (generic, AVX2, AVX-512). Outputs must agree within rtol 1e-4
 * (relative to the output's scale). Cases: convolution geometries (kernel 1 to 7, strides,
 * dilations, symmetric / asymmetric / SAME padding, groups, depthwise, channel counts that are
 * not multiples of a vector, batch 2, Winograd F(4x4, 3x3) with edge tiles), conv + BatchNorm +
 * residual + activation chains, 1-D and 3-D convolutions (the same geometries along one and three
 * spatial dims, depthwise 1-D, residual blocks), ConvTranspose of rank 1 to 3 (every attribute:
 * strides, dilations, pads, output_padding, output_shape, auto_pad, groups, depthwise; fused
 * with BN, residual Add and activations; a U-Net decoder step), pooling,
 * SqueezeExcite and ConvPoolFc in channels-last, Concat on channels, a channels-last value that
 * is also a graph output, and MatMul / Gemm with packed weights. The layout cases also check
 * that reorders stand only at the edges of a channels-last region. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "fusion/fusion.h"
#include "driver/compile.h"
#include "kernels/simd/cpu.h"
#include "passes/passes.h"
#include "runtime/exec.h"
#include "runtime/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* ---- building ------------------------------------------------------------------------------------ */

static af_value *vec(af_graph *g, int64_t n, double lo, double hi) {
    return tu_const(g, 1, &n, lo, hi);
}

static af_node *node(af_graph *g, const char *op, int nin, af_value *const *ins) {
    af_op id = af_op_lookup("", op);
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, NULL, nin, 1);
    assert_non_null(n);
    for (int i = 0; i < nin; i++)
        if (ins[i]) af_node_set_input(n, i, ins[i]);
    af_node_set_output(n, 0, af_value_new(g, af_graph_unique_name(g, "t")));
    return n;
}

/* Types of everything built so far (builders read the dims of what they built). */
static void infer(af_graph *g) {
    af_error err;
    if (af_graph_infer_shapes(g, &err)) fail_msg("%s", err.message);
}

static af_value *op1(af_graph *g, const char *op, af_value *x) {
    af_value *y = node(g, op, 1, &x)->out[0];
    infer(g);
    return y;
}

static af_value *op2(af_graph *g, const char *op, af_value *x, af_value *y) {
    af_value *ins[2] = {x, y};
    af_value *z = node(g, op, 2, ins)->out[0];
    infer(g);
    return z;
}

static void set_int(af_node *n, const char *name, int64_t v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INT);
    assert_non_null(a);
    a->i = v;
}

static void set_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INTS);
    assert_non_null(a);
    a->n = count;
    a->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
}

static void set_str(af_node *n, const char *name, const char *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_STRING);
    assert_non_null(a);
    a->s = v;
    a->slen = strlen(v);
}

/* A 2-D convolution. */
typedef struct conv {
    int64_t m, k[2], s[2], d[2], pads[4], group;
    const char *auto_pad;
    bool bias;
} conv;

static af_value *conv2d(af_graph *g, af_value *x, const conv *c) {
    int64_t cin = x->type.dims[1], wd[4] = {c->m, cin / c->group, c->k[0], c->k[1]};
    double r = 1.0 / sqrt((double)(wd[1] * wd[2] * wd[3]));
    af_value *ins[3] = {x, tu_const(g, 4, wd, -r, r), c->bias ? vec(g, c->m, -0.5, 0.5) : NULL};
    af_node *n = node(g, "Conv", 3, ins);
    set_int(n, "group", c->group);
    set_ints(n, "kernel_shape", 2, c->k);
    set_ints(n, "strides", 2, c->s);
    set_ints(n, "dilations", 2, c->d);
    if (c->auto_pad) set_str(n, "auto_pad", c->auto_pad);
    else set_ints(n, "pads", 4, c->pads);
    infer(g);
    return n->out[0];
}

static af_value *batchnorm(af_graph *g, af_value *x) {
    int64_t ch = x->type.dims[1];
    af_value *ins[5] = {x, vec(g, ch, 0.5, 1.5), vec(g, ch, -0.5, 0.5), vec(g, ch, -0.2, 0.2),
                        vec(g, ch, 0.5, 2.0)};
    af_value *y = node(g, "BatchNormalization", 5, ins)->out[0];
    infer(g);
    return y;
}

static af_value *pool(af_graph *g, const char *op, af_value *x, int64_t k, int64_t s, int64_t p,
                      bool ceil, bool include_pad) {
    af_node *n = node(g, op, 1, &x);
    int64_t ks[2] = {k, k}, ss[2] = {s, s}, ps[4] = {p, p, p, p};
    set_ints(n, "kernel_shape", 2, ks);
    set_ints(n, "strides", 2, ss);
    set_ints(n, "pads", 4, ps);
    if (ceil) set_int(n, "ceil_mode", 1);
    if (include_pad) set_int(n, "count_include_pad", 1);
    infer(g);
    return n->out[0];
}

/* A case: builds the graph after input x, returning its output(s). */
typedef struct lcase {
    const char *name;
    int64_t x[5]; /* x's dims (its rank: those given, 3 to 5) */
    void (*build)(af_graph *g, af_value *x, const void *arg);
    const void *arg;
    int max_reorders; /* Transpose / Reshape nodes the lowered graph may have (-1: any) */
    int min_cl;       /* channels-last nodes it must have */
} lcase;

static int rank_of(const lcase *c) {
    int r = 0;
    while (r < 5 && c->x[r]) r++;
    return r;
}

static void mark_output(af_graph *g, af_value *v) {
    v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

static af_graph *build(af_arena *a, const lcase *c, uint64_t seed) {
    tu_rng = seed;
    af_graph *g = tu_graph(a, "test_lower", 8);
    af_value *x = af_value_new(g, "x");
    x->is_input = true;
    x->type.dtype = AF_DTYPE_FLOAT;
    x->type.rank = rank_of(c);
    memcpy(x->type.dims, c->x, sizeof(int64_t) * (size_t)rank_of(c));
    g->inputs[g->ninputs++] = x;
    c->build(g, x, c->arg);
    af_error err;
    if (af_graph_infer_shapes(g, &err)) fail_msg("%s: %s", c->name, err.message);
    return g;
}

/* ---- running -------------------------------------------------------------------------------------- */

static af_tensor *input_of(const lcase *c) {
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, rank_of(c), c->x);
    assert_non_null(t);
    tu_rng = 99;
    for (int64_t i = 0; i < af_tensor_numel(t); i++) ((float *)t->data)[i] = (float)tu_rnd();
    return t;
}

static void run(const lcase *c, af_graph *g, const af_tensor *x, af_tensor *out, af_runtime *rt) {
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

/* Nodes running channels-last (so that a case cannot pass by not being lowered at all). */
static int count_channels_last(const af_graph *g) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) k += af_attr_int(g->nodes[i], "channels_last", 0) != 0;
    return k;
}

static int count_reorders(const af_graph *g) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        k += g->nodes[i]->op == AF_OP_TRANSPOSE || g->nodes[i]->op == AF_OP_RESHAPE;
    return k;
}

/* Within float rounding of the reference (fp32); within the rounding of the type's inputs for
 * bf16 / fp16 / mixed (8 or 11 significant bits on every GEMM input, float32 sums): max error
 * relative to the largest output, and the cosine of the two outputs. */
static void compare(const lcase *c, const char *mode, af_precision prec, const af_tensor *want,
                    const af_tensor *got) {
    assert_int_equal(want->rank, got->rank);
    for (int d = 0; d < want->rank; d++) assert_int_equal(want->dims[d], got->dims[d]);
    int64_t n = af_tensor_numel(want);
    const float *a = want->data, *b = got->data;
    double scale = 0, dot = 0, na = 0, nb = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(a[i]));
    if (prec == AF_PREC_FP32) {
        for (int64_t i = 0; i < n; i++)
            if (!(fabs((double)a[i] - b[i]) <= 1e-4 * fabs(a[i]) + 2e-5 * (scale > 1 ? scale : 1)))
                fail_msg("%s (%s, %s): element %lld: %.8g, reference %.8g", c->name, mode,
                         af_isa_name(af_isa_get()), (long long)i, b[i], a[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        dot += (double)a[i] * b[i];
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    double tol = prec == AF_PREC_FP16 ? 4e-3 : 4e-2, cosine = na > 0 && nb > 0 ? dot / sqrt(na * nb) : 1;
    if (!(worst <= tol * (scale > 1e-3 ? scale : 1e-3)) || !(cosine >= 0.999))
        fail_msg("%s (%s, %s, %s): max error %.3g of %.3g, cosine %.6f", c->name, mode,
                 af_precision_name(prec), af_isa_name(af_isa_get()), worst, scale, cosine);
}

/* Nodes whose packed weights are in the low-precision type. */
static int count_low(const af_graph *g) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        af_dtype t = n->nin > 1 && n->in[1] ? n->in[1]->type.dtype : AF_DTYPE_FLOAT;
        k += t == AF_DTYPE_BFLOAT16 || t == AF_DTYPE_FLOAT16;
    }
    return k;
}

/* Depthwise convs of the fused graphs checked so far that computed their expand conv
 * themselves (pro_w). */
static int merged_seen;
/* 3-D convs with depthwise weights (w_packed 2) seen by check_prec since last cleared */
static int dw3_seen;
/* convs on the grouped row kernel (w_packed 4) seen by check_prec since last cleared */
static int grp_seen;

/* The reference once; then unfused and fused, lowered in precision `prec`, on every ISA with 1,
 * 2 and 3 threads (more threads than this machine's cores: the threads then run at uneven
 * speeds and take work from each other). With 2 and 3 threads the outputs must be the bits of
 * 1 thread's: no result may depend on which thread computed what. */
static void check_prec(const lcase *c, af_precision prec) {
    af_tensor *x = input_of(c);
    af_isa best = af_isa_best();
    af_arena *ra = af_arena_new();
    af_graph *rg = build(ra, c, 7);
    af_isa_set(AF_ISA_REFERENCE);
    af_tensor want[4];
    memset(want, 0, sizeof want);
    run(c, rg, x, want, NULL);
    af_runtime *rts[3] = {NULL, NULL, NULL};
    af_error err;
    for (int t = 1; t < 3; t++) assert_int_equal(af_runtime_new(t + 1, &rts[t], &err), AF_OK);
    af_precision_cfg pc = {.mode = prec};
    for (af_isa isa = AF_ISA_GENERIC; isa <= best; isa++)
        for (int fuse = 0; fuse < 2; fuse++) {
            af_isa_set(isa);
            af_arena *a = af_arena_new();
            af_graph *g = build(a, c, 7);
            if (fuse && af_optimize(g, NULL, NULL, &err)) fail_msg("%s: %s", c->name, err.message);
            if (af_lower(g, &pc, &err)) fail_msg("%s: %s", c->name, err.message);
            for (int i = 0; fuse && i < g->nnodes; i++)
                merged_seen += af_attr_int(g->nodes[i], "pro_w", -1) >= 0;
            for (int i = 0; i < g->nnodes; i++) {
                const int64_t *ws;
                dw3_seen += af_attr_int(g->nodes[i], "w_packed", 0) == 2 &&
                            af_attr_ints(g->nodes[i], "w_shape", &ws) == 5;
                grp_seen += af_attr_int(g->nodes[i], "w_packed", 0) == 4;
            }
            if (count_channels_last(g) < c->min_cl)
                fail_msg("%s: %d channels-last nodes after lowering (at least %d)", c->name,
                         count_channels_last(g), c->min_cl);
            if (c->max_reorders >= 0 && count_reorders(g) > c->max_reorders)
                fail_msg("%s: %d reorders after lowering (at most %d)", c->name, count_reorders(g),
                         c->max_reorders);
            const char *why = NULL;
            if (prec != AF_PREC_FP32 && af_precision_supported(prec, &why) && count_low(g) < 1)
                fail_msg("%s: no op lowered to %s", c->name, af_precision_name(prec));
            af_tensor one[4];
            memset(one, 0, sizeof one);
            for (int t = 0; t < 3; t++) {
                af_tensor got[4];
                memset(got, 0, sizeof got);
                run(c, g, x, got, rts[t]);
                for (int o = 0; o < rg->noutputs; o++) {
                    compare(c, fuse ? "fused" : "unfused", prec, &want[o], &got[o]);
                    if (t == 0) {
                        one[o] = got[o];
                        continue;
                    }
                    if (got[o].nbytes != one[o].nbytes || memcmp(got[o].data, one[o].data, got[o].nbytes))
                        fail_msg("%s: %s output %d on %s with %d threads differs from 1 thread's",
                                 c->name, fuse ? "fused" : "unfused", o, af_isa_name(isa), t + 1);
                    af_tensor_release(&got[o]);
                }
            }
            /* Kernels prepared once for the graph (a session's runs) give the same bits. */
            af_runtime *prt = NULL;
            af_error err;
            af_tensor got[4];
            memset(got, 0, sizeof got);
            assert_int_equal(af_runtime_new(1, &prt, &err), AF_OK);
            assert_int_equal(af_runtime_prepare(prt, g, &err), AF_OK);
            run(c, g, x, got, prt);
            for (int o = 0; o < rg->noutputs; o++) {
                if (got[o].nbytes != one[o].nbytes || memcmp(got[o].data, one[o].data, got[o].nbytes))
                    fail_msg("%s: %s output %d on %s with prepared kernels differs", c->name,
                             fuse ? "fused" : "unfused", o, af_isa_name(isa));
                af_tensor_release(&got[o]);
            }
            af_runtime_free(prt);
            for (int o = 0; o < rg->noutputs; o++) af_tensor_release(&one[o]);
            af_arena_free(a);
        }
    af_isa_set(best);
    for (int t = 1; t < 3; t++) af_runtime_free(rts[t]);
    for (int o = 0; o < rg->noutputs; o++) af_tensor_release(&want[o]);
    af_arena_free(ra);
    af_tensor_free(x);
}

static void check(const lcase *c) {
    check_prec(c, AF_PREC_FP32);
}

/* ---- cases ---------------------------------------------------------------------------------------- */

static void b_conv(af_graph *g, af_value *x, const void *arg) {
    mark_output(g, conv2d(g, x, arg));
}

/* Conv + BN + Relu, Conv + BN, + residual, + Relu: a ResNet block on the first conv's output. */
static void b_block(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    conv c1 = {16, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, false};
    af_value *y = op1(g, "Relu", batchnorm(g, conv2d(g, x, &c1)));
    conv c2 = {16, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, false};
    af_value *z = batchnorm(g, conv2d(g, y, &c2));
    mark_output(g, op1(g, "Relu", op2(g, "Add", z, y)));
}

/* Conv -> MaxPool / AveragePool / GlobalAveragePool on channels-last; the conv has 24 channels,
 * or *arg (the pooling kernels take four vectors of channels at a time, then the rest). */
static void b_pools(af_graph *g, af_value *x, const void *arg) {
    conv c1 = {arg ? *(const int64_t *)arg : 24, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    af_value *y = conv2d(g, x, &c1);
    af_value *p1 = pool(g, "MaxPool", y, 3, 2, 1, false, false);
    af_value *p2 = pool(g, "AveragePool", p1, 3, 2, 1, true, true);
    af_value *p3 = pool(g, "AveragePool", p2, 2, 1, 1, false, false);
    mark_output(g, op1(g, "GlobalAveragePool", p3));
    mark_output(g, op1(g, "GlobalMaxPool", p2));
}

/* Depthwise conv + SiLU + squeeze-excite + 1x1 projection (an EfficientNet block). */
static void b_se(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    int64_t ch = x->type.dims[1];
    conv dw = {ch, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, ch, NULL, true};
    af_value *y = conv2d(g, x, &dw);
    y = op2(g, "Mul", y, op1(g, "Sigmoid", y));
    af_value *s = op1(g, "GlobalAveragePool", y);
    conv f1 = {4, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    conv f2 = {ch, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    s = op1(g, "Sigmoid", conv2d(g, op1(g, "Relu", conv2d(g, s, &f1)), &f2));
    y = op2(g, "Mul", y, s);
    /* 40 outputs: a whole panel and a 16-wide one, both gated (by the threads' shares). */
    conv pr = {40, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, false};
    mark_output(g, batchnorm(g, conv2d(g, y, &pr)));
}

/* The classification head: conv + Relu, GlobalAveragePool, Flatten, Gemm (ConvPoolFc fused);
 * the conv is arg's geometry (40 outputs), a 1x1 when arg is NULL. */
static void b_head(af_graph *g, af_value *x, const void *arg) {
    static const conv pointwise = {40, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    const conv *c1 = arg ? arg : &pointwise;
    af_value *y = op1(g, "Flatten", op1(g, "GlobalAveragePool", op1(g, "Relu", conv2d(g, x, c1))));
    int64_t wd[2] = {37, 40};
    af_value *ins[3] = {y, tu_const(g, 2, wd, -0.3, 0.3), vec(g, 37, -1, 1)};
    af_node *gm = node(g, "Gemm", 3, ins);
    set_int(gm, "transB", 1);
    mark_output(g, gm->out[0]);
}

/* A 3x3 head conv Winograd takes (the ConvPoolFc output is not the conv's). */
static const conv head_wino = {40, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};

/* Two branches concatenated on channels; the first also a graph output (NCHW for the caller). */
static void b_concat(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    conv a = {8, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    conv b = {12, {3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, 1, NULL, true};
    af_value *ya = conv2d(g, x, &a), *yb = op1(g, "Relu", conv2d(g, x, &b));
    af_value *ins[2] = {ya, yb};
    af_node *cat = node(g, "Concat", 2, ins);
    set_int(cat, "axis", 1);
    infer(g);
    mark_output(g, ya);
    mark_output(g, op1(g, "Tanh", cat->out[0]));
}

/* A conv whose output is read as NCHW by a Reshape: the reorder stays, the result is right. */
static void b_reshape(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    conv a = {6, {3, 3}, {2, 2}, {1, 1}, {0, 1, 1, 0}, 1, NULL, true};
    af_value *y = conv2d(g, x, &a);
    int64_t two = 2, shape[2] = {0, -1};
    af_value *s = af_value_new_const(g, "shape", AF_DTYPE_INT64, 1, &two);
    memcpy(s->type.data, shape, sizeof shape);
    mark_output(g, op2(g, "Reshape", y, s));
}

/* A constant int64 vector. */
static af_value *i64s(af_graph *g, int64_t n, const int64_t *v) {
    af_value *c = af_value_new_const(g, af_graph_unique_name(g, "ints"), AF_DTYPE_INT64, 1, &n);
    assert_non_null(c);
    memcpy(c->type.data, v, (size_t)n * sizeof(int64_t));
    return c;
}

/* A ShuffleNet unit: a channel shuffle (Gather of the channels), a split by two Slices (the
 * second with negative axes and steps given), a conv on one half, Concat: one region. */
static void b_shuffle(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    static const conv pw = {8, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    static const conv half = {4, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    static const int64_t perm[8] = {0, 4, 1, 5, 2, 6, 3, 7}, z[1] = {0}, four[1] = {4},
                         eight[1] = {8}, one[1] = {1}, minus3[1] = {-3};
    af_value *y = op1(g, "Relu", conv2d(g, x, &pw));
    af_node *ga = node(g, "Gather", 2, (af_value *[]){y, i64s(g, 8, perm)});
    set_int(ga, "axis", 1);
    infer(g);
    af_value *s1 = node(g, "Slice", 4, (af_value *[]){ga->out[0], i64s(g, 1, z), i64s(g, 1, four),
                                                     i64s(g, 1, one)})->out[0];
    af_value *s2 = node(g, "Slice", 5, (af_value *[]){ga->out[0], i64s(g, 1, four), i64s(g, 1, eight),
                                                     i64s(g, 1, minus3), i64s(g, 1, one)})->out[0];
    infer(g);
    af_node *cat = node(g, "Concat", 2, (af_value *[]){s1, op1(g, "Relu", conv2d(g, s2, &half))});
    set_int(cat, "axis", 1);
    infer(g);
    mark_output(g, cat->out[0]);
}

/* DenseNet's layer: Concat, then BN + Relu (no conv before them to fold into), then a conv. */
static void b_dense(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    static const conv c3 = {4, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, false};
    af_node *cat = node(g, "Concat", 2, (af_value *[]){x, conv2d(g, x, &c3)});
    set_int(cat, "axis", 1);
    infer(g);
    mark_output(g, conv2d(g, op1(g, "Relu", batchnorm(g, cat->out[0])), &c3));
}

/* Fused, the BN and its Relu are one FusedElementwise (BatchNormActFusionOp), inside the
 * channels-last region. */
static void test_bn_activation(void **state) {
    (void)state;
    lcase c = {"dense layer", {1, 6, 9, 8}, b_dense, NULL, 2, 2};
    check(&c);
    af_arena *a = af_arena_new();
    af_graph *g = build(a, &c, 7);
    af_error err;
    assert_int_equal(af_optimize(g, NULL, NULL, &err), AF_OK);
    assert_int_equal(af_lower(g, NULL, &err), AF_OK);
    int relu = 0, ew = 0;
    for (int i = 0; i < g->nnodes; i++) {
        relu += g->nodes[i]->op == AF_OP_RELU;
        ew += g->nodes[i]->op == AF_OP_FUSED_ELEMENTWISE;
    }
    assert_int_equal(relu, 0);
    assert_int_equal(ew, 1);
    af_arena_free(a);
}

/* A segmentation head: conv, Resize, conv. The Resize runs on the NHWC image with its roi,
 * scales or sizes permuted, so the region has reorders only at its edges. */
typedef struct rs_case {
    const char *mode, *coord;
    float scales[4];   /* all 0: sizes */
    int64_t sizes[4];
    float roi[8];      /* tf_crop_and_resize */
} rs_case;

static void b_resize(af_graph *g, af_value *x, const void *arg) {
    const rs_case *r = arg;
    conv a = {6, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    conv b = {5, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    af_value *y = op1(g, "Relu", conv2d(g, x, &a));
    int64_t four = 4, eight = 8, zero = 0;
    bool sizes = r->scales[0] == 0, crop = !strcmp(r->coord, "tf_crop_and_resize");
    af_value *roi = af_value_new_const(g, "roi", AF_DTYPE_FLOAT, 1, crop ? &eight : &zero);
    af_value *sc = af_value_new_const(g, "scales", AF_DTYPE_FLOAT, 1, sizes ? &zero : &four);
    af_value *sz = sizes ? af_value_new_const(g, "sizes", AF_DTYPE_INT64, 1, &four) : NULL;
    if (crop) memcpy(roi->type.data, r->roi, sizeof r->roi);
    if (!sizes) memcpy(sc->type.data, r->scales, sizeof r->scales);
    if (sizes) memcpy(sz->type.data, r->sizes, sizeof r->sizes);
    af_value *ins[4] = {y, roi, sc, sz};
    af_node *rs = node(g, "Resize", sizes ? 4 : 3, ins);
    set_str(rs, "mode", r->mode);
    set_str(rs, "coordinate_transformation_mode", r->coord);
    infer(g);
    mark_output(g, conv2d(g, rs->out[0], &b));
}

/* conv, Pad (mode), conv: the Pad stays in the region (pads permuted). */
static void b_pad(af_graph *g, af_value *x, const void *arg) {
    conv a = {6, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
    af_value *y = op1(g, "Relu", conv2d(g, x, &a));
    int64_t eight = 8, pads[8] = {0, 0, 1, 2, 0, 0, 2, 1};
    af_value *p = af_value_new_const(g, "pads", AF_DTYPE_INT64, 1, &eight);
    memcpy(p->type.data, pads, sizeof pads);
    af_value *ins[2] = {y, p};
    af_node *pd = node(g, "Pad", 2, ins);
    set_str(pd, "mode", arg);
    infer(g);
    mark_output(g, conv2d(g, pd->out[0], &a));
}

static const rs_case rs_bilinear = {"linear", "half_pixel", {1, 1, 2, 2}, {0}, {0}};
static const rs_case rs_nearest = {"nearest", "asymmetric", {0}, {1, 6, 13, 7}, {0}};
static const rs_case rs_cubic = {"cubic", "align_corners", {1, 1, 1.5f, 0.75f}, {0}, {0}};
static const rs_case rs_crop = {"linear", "tf_crop_and_resize", {0}, {1, 6, 7, 9},
                                {0, 0, 0.1f, -0.2f, 1, 1, 0.8f, 1.1f}};

static const conv geoms[] = {
    {16, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true},     /* pointwise */
    {21, {1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 1, NULL, false},    /* strided pointwise */
    {32, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true},     /* 3x3 same */
    {17, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true},     /* 3x3 stride 2 */
    {8, {3, 3}, {1, 1}, {2, 2}, {2, 1, 0, 3}, 1, NULL, true},      /* dilated, asymmetric pads */
    {12, {5, 5}, {1, 2}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true},     /* valid, mixed strides */
    {64, {7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}, 1, NULL, true},     /* ResNet stem */
    {10, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, "SAME_UPPER", true},
    {8, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 2, NULL, true},      /* 2 groups */
    {20, {3, 1}, {1, 1}, {1, 1}, {1, 0, 1, 0}, 5, NULL, false},    /* 5 groups, 3x1 */
};

static void test_conv_geometries(void **state) {
    (void)state;
    for (size_t i = 0; i < AF_COUNT(geoms); i++) {
        char name[64];
        snprintf(name, sizeof name, "conv geometry %zu", i);
        int64_t cin = geoms[i].group == 5 ? 10 : (i % 2 ? 3 : 20);
        lcase c = {name, {i % 3 == 0 ? 2 : 1, cin, 13, 11}, b_conv, &geoms[i], 2, 1};
        check(&c);
    }
}

/* Winograd F(4x4, 3x3) takes 3x3 stride-1 convs with at least 32 channels each way: output
 * sizes that are not multiples of 4 (edge tiles), asymmetric and no padding, batch 2, and a
 * residual block; held to the same tolerance as direct convolution. */
static void b_wino_block(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    conv c1 = {32, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    af_value *y = op1(g, "Relu", batchnorm(g, conv2d(g, x, &c1)));
    conv c2 = {32, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, false};
    mark_output(g, op1(g, "Relu", op2(g, "Add", batchnorm(g, conv2d(g, y, &c2)), y)));
}

static void test_winograd(void **state) {
    (void)state;
    static const conv ws[] = {
        {48, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true},
        {33, {3, 3}, {1, 1}, {1, 1}, {0, 2, 1, 0}, 1, NULL, true},
        {64, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, false},
    };
    static const int64_t xs[3][4] = {{2, 40, 13, 11}, {1, 32, 9, 14}, {1, 64, 6, 7}};
    for (size_t i = 0; i < AF_COUNT(ws); i++) {
        lcase c = {"winograd", {xs[i][0], xs[i][1], xs[i][2], xs[i][3]}, b_conv, &ws[i], 2, 1};
        check(&c);
    }
    lcase block = {"winograd block", {1, 32, 10, 10}, b_wino_block, NULL, 2, 2};
    check(&block);
}

static void test_depthwise(void **state) {
    (void)state;
    static const conv dws[] = {
        {24, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 24, NULL, true},
        {24, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, 24, NULL, true},
        {40, {3, 3}, {2, 2}, {2, 2}, {1, 2, 0, 1}, 40, NULL, false},
        {7, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 7, NULL, true},
        {20, {5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}, 20, NULL, true},
        /* weights over 16 KB: the row kernel passes over the channels in chunks */
        {200, {5, 5}, {1, 1}, {1, 1}, {2, 2, 2, 2}, 200, NULL, true},
        {470, {3, 3}, {2, 2}, {1, 1}, {1, 0, 1, 1}, 470, NULL, false},
        /* stride 1, padding wider than half the window (blocks of outputs whose windows reach
         * into it, some wholly): blocks of 8 and 4 at the edges, a last column alone */
        {24, {5, 5}, {1, 1}, {1, 1}, {1, 3, 2, 0}, 24, NULL, true},
        {16, {3, 3}, {1, 1}, {1, 1}, {1, 3, 1, 2}, 16, NULL, true},
    };
    for (size_t i = 0; i < AF_COUNT(dws); i++) {
        lcase c = {"depthwise", {i < 5 ? 2 : 1, dws[i].m, i < 5 ? 17 : 9, 10}, b_conv, &dws[i], 2, 1};
        check(&c);
    }
    /* Stride 2 on rows wide enough for blocks of 8 outputs (their shared input columns, the
     * padding read as zeros at both edges): 3x3 and 5x5, channels off the vector width,
     * asymmetric and no padding, odd and even widths. */
    static const conv s2[] = {
        {72, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 72, NULL, true},
        {40, {5, 5}, {2, 2}, {1, 1}, {2, 1, 2, 3}, 40, NULL, true},
        {20, {3, 3}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 20, NULL, false},
        {33, {5, 5}, {1, 2}, {1, 1}, {2, 2, 2, 2}, 33, NULL, true},
    };
    for (size_t i = 0; i < AF_COUNT(s2); i++) {
        lcase c = {"depthwise stride 2", {1, s2[i].m, 11, i % 2 ? 38 : 37}, b_conv, &s2[i], 2, 1};
        check(&c);
    }
}

/* An inverted-residual block: 1x1 expand + BN + SiLU, depthwise conv (geometry arg) + BN +
 * SiLU, optionally a squeeze-excite, 1x1 projection + BN, and the residual when shapes allow. */
typedef struct mb_case {
    int64_t expand;
    conv dw;
    bool se, bn;
    bool fq; /* the expand's output fake-quantized (a QDQ MobileNet's fq, in its epilogue) */
} mb_case;

static void b_mbconv(af_graph *g, af_value *x, const void *arg) {
    const mb_case *m = arg;
    conv ex = {m->expand, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, !m->bn};
    af_value *y = conv2d(g, x, &ex);
    if (m->bn) y = batchnorm(g, y);
    y = op2(g, "Mul", y, op1(g, "Sigmoid", y));
    if (m->fq) {
        af_node *f = af_node_new(g, AF_OP_QUANTIZE_DEQUANTIZE, NULL, 1, 1);
        assert_non_null(f);
        f->domain = AF_DOMAIN;
        af_node_set_input(f, 0, y);
        af_node_set_output(f, 0, af_value_new(g, af_graph_unique_name(g, "t")));
        assert_true(af_node_set_float(f, "scale", 0.05f) && af_node_set_float(f, "zero_point", 100.0f));
        infer(g);
        y = f->out[0];
    }
    conv dw = m->dw;
    dw.m = dw.group = m->expand;
    y = batchnorm(g, conv2d(g, y, &dw));
    y = op2(g, "Mul", y, op1(g, "Sigmoid", y));
    if (m->se) {
        conv f1 = {4, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
        conv f2 = {m->expand, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, true};
        af_value *s = op1(g, "GlobalAveragePool", y);
        s = op1(g, "Sigmoid", conv2d(g, op1(g, "Relu", conv2d(g, s, &f1)), &f2));
        y = op2(g, "Mul", y, s);
    }
    conv pr = {x->type.dims[1], {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1, NULL, false};
    y = batchnorm(g, conv2d(g, y, &pr));
    infer(g);
    bool same = y->type.rank == 4;
    for (int d = 0; same && d < 4; d++) same = y->type.dims[d] == x->type.dims[d];
    if (same) y = op2(g, "Add", y, x);
    mark_output(g, y);
}

/* The expand conv computed inside the depthwise conv (forced for these sizes): stride 1 and 2,
 * 3x3 and 5x5, dilation, asymmetric and no padding, batch 2, channel counts off the vector
 * width, with a squeeze-excite reading the pooled output, an expand whose epilogue ends with a
 * fake quantization (a QDQ MobileNet-v2 whose convs run float32), against the reference. */
static void test_expand_depthwise(void **state) {
    (void)state;
    static const mb_case mbs[] = {
        {48, {0, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 0, NULL, true}, false, true, false},
        {36, {0, {5, 5}, {2, 2}, {1, 1}, {2, 2, 2, 2}, 0, NULL, true}, true, true, false},
        {21, {0, {3, 3}, {1, 1}, {2, 2}, {2, 1, 0, 2}, 0, NULL, true}, false, false, false},
        {40, {0, {3, 3}, {2, 1}, {1, 1}, {0, 0, 0, 0}, 0, NULL, true}, true, true, false},
        {24, {0, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 0, NULL, true}, false, true, true},
    };
    static const int64_t xs[][4] = {{1, 8, 15, 13}, {2, 12, 17, 10}, {1, 7, 9, 19}, {2, 16, 11, 11},
                                    {1, 8, 13, 12}};
    setenv("AUTOFUSION_MERGE_EXPAND", "1", 1);
    for (size_t i = 0; i < AF_COUNT(mbs); i++) {
        merged_seen = 0;
        lcase c = {"expand + depthwise", {xs[i][0], xs[i][1], xs[i][2], xs[i][3]}, b_mbconv, &mbs[i], 2, 2};
        check(&c);
        if (merged_seen == 0) fail_msg("case %zu: the expand conv was not merged", i);
    }
    unsetenv("AUTOFUSION_MERGE_EXPAND");
}

/* The merge by size (AUTOFUSION_MERGE_EXPAND unset) with a dynamic batch, as the zoo's exports
 * have: one image's expanded tensor over half the L2 merges whatever the batch (the size test
 * once multiplied by the unknown batch, -1, and no dynamically exported block merged). */
static void test_expand_depthwise_dynamic(void **state) {
    (void)state;
    static const mb_case mb = {96, {0, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 0, NULL, true}, false, true, false};
    int64_t side = (int64_t)ceil(sqrt(0.75 * (double)af_cpu_l2() / (96.0 * 4.0)));
    lcase c = {"expand + depthwise, dynamic batch", {1, 8, side, side}, b_mbconv, &mb, 2, 2};
    for (int dynamic = 0; dynamic < 2; dynamic++) {
        af_arena *a = af_arena_new();
        af_graph *g = build(a, &c, 7);
        af_error err;
        if (dynamic) {
            g->inputs[0]->type.dims[0] = -1;
            for (int i = 0; i < g->nnodes; i++)
                for (int o = 0; o < g->nodes[i]->nout; o++)
                    if (g->nodes[i]->out[o] && g->nodes[i]->out[o]->type.rank > 0)
                        g->nodes[i]->out[o]->type.dims[0] = -1;
            if (af_graph_infer_shapes(g, &err)) fail_msg("%s", err.message);
        }
        if (af_optimize(g, NULL, NULL, &err) || af_lower(g, NULL, &err)) fail_msg("%s", err.message);
        int merged = 0;
        for (int i = 0; i < g->nnodes; i++) merged += af_attr_int(g->nodes[i], "pro_w", -1) >= 0;
        if (merged != 1) fail_msg("%s batch: %d merged expand convs, expected 1", dynamic ? "dynamic" : "static", merged);
        af_arena_free(a);
    }
}

/* Channels-last regions have reorders at their edges only: the input's and the output's. */
static af_value *transpose(af_graph *g, af_value *x, int r, const int64_t *perm) {
    af_node *t = node(g, "Transpose", 1, &x);
    set_ints(t, "perm", r, perm);
    infer(g);
    return t->out[0];
}

/* x [.., K] times a constant [K, n] plus a bias: a Linear layer on the last axis. */
static af_value *linear(af_graph *g, af_value *x, int64_t n) {
    int64_t wd[2] = {x->type.dims[x->type.rank - 1], n};
    return op2(g, "Add", op2(g, "MatMul", x, tu_const(g, 2, wd, -0.4, 0.4)), vec(g, n, -0.5, 0.5));
}

/* A ConvNeXt block and the start of the next: depthwise 7x7, permute to NHWC, LayerNorm,
 * Linear + Relu, Linear, permute back, layer scale [C, 1, 1], residual; a depthwise conv of
 * the sum. The model's two permutes are the region's reorders: the whole block runs
 * channels-last, with reorders only at the input and the output. With arg, the NHWC
 * LayerNorm input is also a graph output, and the NHWC permute must stay for it. */
static void b_convnext(af_graph *g, af_value *x, const void *arg) {
    static const int64_t nhwc[4] = {0, 2, 3, 1}, nchw[4] = {0, 3, 1, 2};
    int64_t ch = x->type.dims[1], sd[3] = {ch, 1, 1};
    conv dw = {ch, {7, 7}, {1, 1}, {1, 1}, {3, 3, 3, 3}, ch, NULL, true};
    af_value *t = transpose(g, conv2d(g, x, &dw), 4, nhwc);
    af_value *lin[3] = {t, vec(g, ch, 0.5, 1.5), vec(g, ch, -0.5, 0.5)};
    af_node *ln = node(g, "LayerNormalization", 3, lin);
    set_int(ln, "axis", -1);
    infer(g);
    af_value *h = linear(g, op1(g, "Relu", linear(g, ln->out[0], 2 * ch)), ch);
    af_value *y = op2(g, "Mul", tu_const(g, 3, sd, 0.5, 1.5), transpose(g, h, 4, nchw));
    mark_output(g, conv2d(g, op2(g, "Add", y, x), &dw));
    if (arg) mark_output(g, t);
}

static const int64_t pool72 = 72;

static void test_regions(void **state) {
    (void)state;
    static const lcase cases[] = {
        {"resnet block", {1, 8, 12, 12}, b_block, NULL, 2, 2},
        {"pools", {2, 5, 15, 15}, b_pools, NULL, 3, 5},
        {"pools, 72 channels", {1, 5, 13, 14}, b_pools, &pool72, 3, 5},
        {"squeeze-excite", {1, 16, 9, 9}, b_se, NULL, 2, 2},
        {"squeeze-excite, chunked depthwise", {1, 480, 6, 7}, b_se, NULL, 2, 2},
        {"head", {2, 16, 7, 7}, b_head, NULL, 2, 1},
        {"head with a Winograd conv", {1, 32, 16, 16}, b_head, &head_wino, 2, 1},
        {"concat", {1, 6, 10, 10}, b_concat, NULL, 3, 2},
        {"reshape reader", {1, 4, 9, 9}, b_reshape, NULL, 3, 1},
        {"channel shuffle and split", {2, 6, 9, 7}, b_shuffle, NULL, 2, 2},
        {"pad reflect", {1, 4, 9, 11}, b_pad, "reflect", 2, 2},
        {"pad constant", {2, 4, 9, 11}, b_pad, "constant", 2, 2},
        {"pad edge", {1, 4, 8, 7}, b_pad, "edge", 2, 2},
        {"resize bilinear", {1, 4, 9, 11}, b_resize, &rs_bilinear, 2, 2},
        {"resize nearest sizes", {2, 4, 9, 11}, b_resize, &rs_nearest, 2, 2},
        {"resize cubic", {1, 4, 8, 12}, b_resize, &rs_cubic, 2, 2},
        {"resize tf_crop_and_resize", {1, 4, 9, 11}, b_resize, &rs_crop, 2, 2},
        {"convnext block", {1, 16, 9, 9}, b_convnext, NULL, 2, 2},
        {"convnext block, NHWC permute also an output", {2, 8, 7, 6}, b_convnext, "", 4, 2},
    };
    for (size_t i = 0; i < AF_COUNT(cases); i++) check(&cases[i]);
}

/* ---- 1-D and 3-D convolutions -------------------------------------------------------------------- */

/* A convolution over nsp spatial dims (1 or 3). */
typedef struct convn {
    int nsp;
    int64_t m, k[3], s[3], d[3], pads[6], group;
    bool bias;
} convn;

static af_value *convnd(af_graph *g, af_value *x, const convn *c) {
    int64_t cin = x->type.dims[1], wd[5] = {c->m, cin / c->group}, taps = 1;
    for (int i = 0; i < c->nsp; i++) taps *= wd[2 + i] = c->k[i];
    double r = 1.0 / sqrt((double)(wd[1] * taps));
    af_value *ins[3] = {x, tu_const(g, 2 + c->nsp, wd, -r, r), c->bias ? vec(g, c->m, -0.5, 0.5) : NULL};
    af_node *n = node(g, "Conv", 3, ins);
    set_int(n, "group", c->group);
    set_ints(n, "kernel_shape", c->nsp, c->k);
    set_ints(n, "strides", c->nsp, c->s);
    set_ints(n, "dilations", c->nsp, c->d);
    set_ints(n, "pads", 2 * c->nsp, c->pads);
    infer(g);
    return n->out[0];
}

/* Whisper's and wav2vec2's 1-D stem: conv + Relu, [N, C, T] -> [N, T, C], Linear. */
static void b_conv_permute_1d(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    static const int64_t ntc[3] = {0, 2, 1};
    convn c = {1, 12, {3}, {2}, {1}, {1, 1}, 1, true};
    af_value *y = op1(g, "Relu", convnd(g, x, &c));
    mark_output(g, linear(g, transpose(g, y, 3, ntc), 10));
}

/* ViT's token assembly in small: permuted activations [N, C, T] -> [N, T, C] concatenated with
 * tokens that are not channels-last (a Reshape here), then an Add. No conv, no region: the
 * permute must not start one (it would add a reorder for the other tokens and one back). */
static void b_permute_concat(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    static const int64_t ntc[3] = {0, 2, 1};
    int64_t td[3] = {x->type.dims[0], x->type.dims[2], x->type.dims[1]};
    af_value *y = transpose(g, op1(g, "Relu", x), 3, ntc);
    af_value *sh = af_value_new_const(g, "shape", AF_DTYPE_INT64, 1, (int64_t[]){3});
    memcpy(sh->type.data, td, sizeof td);
    af_value *r = op2(g, "Reshape", op1(g, "Neg", x), sh);
    af_value *ins[2] = {r, y};
    af_node *cat = node(g, "Concat", 2, ins);
    set_int(cat, "axis", 1);
    infer(g);
    mark_output(g, op2(g, "Add", cat->out[0], tu_const(g, 1, &td[2], -1, 1)));
}

static void b_convn(af_graph *g, af_value *x, const void *arg) {
    mark_output(g, convnd(g, x, arg));
}

/* Conv + BN + Relu, conv + BN + residual Add + Relu, then a per-channel scale by a constant of
 * rank 2 ([C, 1]-style, expanded and permuted by the layout pass): one channels-last region. */
static void b_blockn(af_graph *g, af_value *x, const void *arg) {
    const convn *c = arg;
    af_value *y = op1(g, "Relu", batchnorm(g, convnd(g, x, c)));
    af_value *z = op1(g, "Relu", op2(g, "Add", batchnorm(g, convnd(g, y, c)), y));
    int64_t sd[4] = {c->m, 1, 1, 1};
    mark_output(g, op2(g, "Mul", z, tu_const(g, c->nsp + 1, sd, 0.5, 1.5)));
}

/* A video classifier's head: conv, pooling over every position, the classifier (ConvPoolFc). */
static void b_headn(af_graph *g, af_value *x, const void *arg) {
    const convn *c = arg;
    af_value *y = op1(g, "Flatten", op1(g, "GlobalAveragePool", op1(g, "Relu", convnd(g, x, c))));
    int64_t wd[2] = {c->m, 11};
    af_value *ins[3] = {y, tu_const(g, 2, wd, -0.3, 0.3), vec(g, 11, -1, 1)};
    mark_output(g, node(g, "Gemm", 3, ins)->out[0]);
}

/* conv, a linear Resize of the spatial axes by `scales` (the first two 1), conv: the Resize
 * stays in the 1-D or 3-D region. */
typedef struct rsn_case {
    convn c;
    float scales[5];
} rsn_case;

static void b_resizen(af_graph *g, af_value *x, const void *arg) {
    const rsn_case *r = arg;
    af_value *y = convnd(g, x, &r->c);
    int64_t nr = y->type.rank, zero = 0;
    af_value *roi = af_value_new_const(g, "roi", AF_DTYPE_FLOAT, 1, &zero);
    af_value *sc = af_value_new_const(g, "scales", AF_DTYPE_FLOAT, 1, &nr);
    memcpy(sc->type.data, r->scales, (size_t)nr * sizeof(float));
    af_value *ins[3] = {y, roi, sc};
    af_node *rs = node(g, "Resize", 3, ins);
    set_str(rs, "mode", "linear");
    infer(g);
    mark_output(g, convnd(g, rs->out[0], &r->c));
}

static const convn geoms1[] = {
    {1, 16, {1}, {1}, {1}, {0, 0}, 1, true},     /* pointwise */
    {1, 12, {3}, {2}, {1}, {1, 1}, 1, true},     /* stride 2 */
    {1, 8, {10}, {5}, {1}, {0, 0}, 1, false},    /* a wav2vec2-style stem */
    {1, 10, {3}, {1}, {2}, {2, 1}, 1, true},     /* dilated, asymmetric pads */
    {1, 12, {5}, {1}, {1}, {2, 2}, 12, true},    /* depthwise */
    {1, 8, {3}, {2}, {1}, {1, 1}, 4, true},      /* 4 groups */
};

static const convn geoms3[] = {
    {3, 16, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0}, 1, true},                    /* pointwise */
    {3, 12, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 1, true},     /* 3x3x3 same */
    {3, 8, {3, 7, 7}, {1, 2, 2}, {1, 1, 1}, {1, 3, 3, 1, 3, 3}, 1, false},     /* an R3D stem */
    {3, 10, {1, 3, 3}, {2, 2, 2}, {1, 1, 1}, {0, 1, 1, 0, 1, 1}, 1, true},     /* (2+1)D spatial */
    {3, 9, {3, 1, 1}, {1, 1, 1}, {2, 1, 1}, {2, 0, 0, 1, 0, 0}, 1, true},      /* temporal, dilated */
    {3, 8, {2, 2, 2}, {2, 1, 2}, {1, 1, 1}, {0, 1, 0, 1, 0, 1}, 2, true},      /* 2 groups */
    {3, 6, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 6, true},      /* depthwise */
    {3, 6, {3, 5, 3}, {2, 2, 1}, {2, 1, 2}, {2, 2, 0, 1, 1, 2}, 6, false},     /* depthwise, strided, dilated */
    {3, 6, {5, 13, 1}, {1, 1, 1}, {1, 1, 1}, {2, 6, 0, 2, 6, 0}, 6, true},     /* depthwise, KD x KH > 64 */
};

/* Groups of G = 2, 4 and 8 input and output channels take the grouped row kernel (vec.h
 * af_grp_row): channels that fill vectors and leave a partial one (whole groups in it, and
 * blocks of 16 weights half used), strides, dilations, asymmetric pads, 1-D to 3-D, a residual
 * block through BN and Relu; and G = 3 (not a divisor of the vector width), which keeps the
 * GEMM panels, alongside. */
static const convn grouped[] = {
    {2, 16, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 4, true},     /* G 4 */
    {2, 24, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 3, true},     /* G 8, stride 2 */
    {2, 40, {3, 3}, {1, 2}, {2, 1}, {2, 0, 1, 1}, 5, false},    /* G 8, C % 16 = 8 */
    {2, 20, {5, 3}, {1, 1}, {1, 1}, {2, 1, 2, 1}, 5, true},     /* G 4, C % 8 = 4 */
    {2, 12, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 6, true},     /* G 2, 1x1 */
    {1, 16, {3}, {1}, {1}, {1, 1}, 2, true},                    /* 1-D, G 8 */
    {3, 16, {3, 3, 3}, {1, 2, 2}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 4, true}, /* 3-D, G 4 */
    {2, 12, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 4, true},     /* G 3: GEMM panels */
};

static void test_grouped(void **state) {
    (void)state;
    for (size_t i = 0; i < AF_COUNT(grouped); i++) {
        const convn *g = &grouped[i];
        int64_t x[5] = {i % 2 ? 1 : 2, g->m, 11, 9, 7};
        if (g->nsp == 1) x[3] = x[4] = 0, x[2] = 23;
        if (g->nsp == 2) x[4] = 0;
        lcase c = {"grouped conv", {x[0], x[1], x[2], x[3], x[4]}, b_convn, g, 2, 1};
        grp_seen = 0;
        check(&c);
        bool small = g->m / g->group == 2 || g->m / g->group == 4 || g->m / g->group == 8;
        if ((grp_seen > 0) != small)
            fail_msg("grouped conv %zu: %d nodes on the grouped kernel", i, grp_seen);
    }
    static const convn blk = {2, 32, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 8, false};
    lcase b = {"grouped conv block", {1, 32, 10, 13}, b_blockn, &blk, 2, 2};
    check(&b);
}

static void test_conv_1d_3d(void **state) {
    (void)state;
    for (size_t i = 0; i < AF_COUNT(geoms1); i++) {
        lcase c = {"conv 1-D", {i % 2 ? 1 : 2, 12, 41}, b_convn, &geoms1[i], 2, 1};
        check(&c);
    }
    for (size_t i = 0; i < AF_COUNT(geoms3); i++) {
        lcase c = {"conv 3-D", {i % 2 ? 1 : 2, i == 2 ? 3 : 6, 5, 13, 11}, b_convn, &geoms3[i], 2, 1};
        check(&c);
    }
    static const convn blk1 = {1, 8, {3}, {1}, {1}, {1, 1}, 1, false};
    static const convn blk3 = {3, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 1, false};
    lcase b1 = {"conv 1-D block", {2, 8, 29}, b_blockn, &blk1, 2, 2};
    lcase b3 = {"conv 3-D block", {1, 8, 4, 9, 7}, b_blockn, &blk3, 2, 2};
    lcase h3 = {"conv 3-D head", {2, 8, 4, 6, 5}, b_headn, &blk3, 2, 1};
    /* an X3D-style depthwise block over channels that fill a vector and part of the next */
    static const convn dw3 = {3, 20, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 20, false};
    lcase d3 = {"conv 3-D depthwise block", {2, 20, 3, 9, 12}, b_blockn, &dw3, 2, 2};
    dw3_seen = 0;
    check(&d3);
    if (dw3_seen == 0) fail_msg("the 3-D depthwise convs took GEMM panels");
    static const rsn_case rs1 = {{1, 8, {3}, {1}, {1}, {1, 1}, 1, true}, {1, 1, 2}};
    static const rsn_case rs3 = {{3, 8, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1, 0, 1, 1}, 1, true},
                                 {1, 1, 1, 2, 1.5f}};
    lcase r1 = {"conv 1-D, Resize, conv", {1, 8, 23}, b_resizen, &rs1, 2, 2};
    lcase r3 = {"conv 3-D, Resize of H and W, conv", {1, 8, 3, 5, 6}, b_resizen, &rs3, 2, 2};
    lcase p1 = {"conv 1-D, permute to [N, T, C], Linear", {2, 8, 21}, b_conv_permute_1d, NULL, 1, 1};
    check(&b1);
    check(&b3);
    lcase pc = {"permute and concat, no conv", {2, 6, 10}, b_permute_concat, NULL, 2, 0};
    check(&p1);
    check(&pc);
    check(&h3);
    check(&r1);
    check(&r3);
    /* 1-D convs take the half and bfloat16 GEMMs as 2-D ones do (3-D ones stay float32). */
    check_prec(&b1, AF_PREC_BF16);
    check_prec(&b1, AF_PREC_FP16);
}

/* ---- ConvTranspose ------------------------------------------------------------------------------- */

/* A ConvTranspose over nsp spatial dims (1 to 3): W [C, m / group, k...]. output_shape (when its
 * first value is not 0) and auto_pad (when not NULL) replace pads as ONNX says. */
typedef struct convt {
    int nsp;
    int64_t m, k[3], s[3], d[3], pads[6], op[3], oshape[3], group;
    const char *auto_pad;
    bool bias;
} convt;

static af_value *convtnd(af_graph *g, af_value *x, const convt *c) {
    int64_t cin = x->type.dims[1], wd[5] = {cin, c->m / c->group}, taps = 1;
    for (int i = 0; i < c->nsp; i++) taps *= wd[2 + i] = c->k[i];
    double r = 1.0 / sqrt((double)(wd[1] * taps));
    af_value *ins[3] = {x, tu_const(g, 2 + c->nsp, wd, -r, r), c->bias ? vec(g, c->m, -0.5, 0.5) : NULL};
    af_node *n = node(g, "ConvTranspose", 3, ins);
    set_int(n, "group", c->group);
    set_ints(n, "kernel_shape", c->nsp, c->k);
    set_ints(n, "strides", c->nsp, c->s);
    set_ints(n, "dilations", c->nsp, c->d);
    set_ints(n, "output_padding", c->nsp, c->op);
    if (c->oshape[0]) set_ints(n, "output_shape", c->nsp, c->oshape);
    if (c->auto_pad) set_str(n, "auto_pad", c->auto_pad);
    else if (!c->oshape[0]) set_ints(n, "pads", 2 * c->nsp, c->pads);
    infer(g);
    return n->out[0];
}

static void b_convt(af_graph *g, af_value *x, const void *arg) {
    mark_output(g, convtnd(g, x, arg));
}

/* ConvTranspose + BN + Relu, then ConvTranspose (stride 1, same size) + BN + residual Add + Relu,
 * then a Sigmoid: ConvTransposeBNReluFusionOp twice with every epilogue kind. */
static void b_convt_block(af_graph *g, af_value *x, const void *arg) {
    const convt *c = arg;
    static const convt same[3] = {{1, 8, {3}, {1}, {1}, {1, 1}, {0}, {0}, 1, NULL, false},
                                  {2, 8, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, {0}, {0}, 1, NULL, false},
                                  {3, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {0}, {0}, 1,
                                   NULL, false}};
    af_value *y = op1(g, "Relu", batchnorm(g, convtnd(g, x, c)));
    af_value *z = op1(g, "Relu", op2(g, "Add", batchnorm(g, convtnd(g, y, &same[c->nsp - 1])), y));
    mark_output(g, op1(g, "Sigmoid", z));
}

/* A U-Net decoder step: conv, ConvTranspose 2x2 stride 2 up, Concat with the skip, conv: one
 * channels-last region. */
static void b_unet_up(af_graph *g, af_value *x, const void *arg) {
    (void)arg;
    static const conv c1 = {16, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    static const convt up = {2, 8, {2, 2}, {2, 2}, {1, 1}, {0}, {0}, {0}, 1, NULL, true};
    static const conv c2 = {6, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true};
    af_value *skip = op1(g, "Relu", conv2d(g, x, &(conv){8, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, NULL, true}));
    af_value *down = op1(g, "Relu", conv2d(g, skip, &c1));
    af_value *u = op1(g, "Relu", convtnd(g, down, &up));
    af_value *ins[2] = {u, skip};
    af_node *cat = node(g, "Concat", 2, ins);
    set_int(cat, "axis", 1);
    infer(g);
    mark_output(g, conv2d(g, cat->out[0], &c2));
}

static const convt geomst[] = {
    /* 1-D: a vocoder's upsampling (k 16, s 8), k 4 s 2, depthwise, dilated with output_padding,
     * 2 groups, stride past the kernel (gaps of bias only), SAME_LOWER */
    {1, 7, {16}, {8}, {1}, {4, 4}, {0}, {0}, 1, NULL, true},
    {1, 12, {4}, {2}, {1}, {1, 2}, {0}, {0}, 1, NULL, false},
    {1, 12, {5}, {2}, {1}, {2, 2}, {1}, {0}, 12, NULL, true},
    {1, 10, {3}, {3}, {2}, {1, 0}, {2}, {0}, 1, NULL, true},
    {1, 8, {3}, {2}, {1}, {1, 1}, {1}, {0}, 2, NULL, true},
    {1, 5, {2}, {3}, {1}, {0, 0}, {0}, {0}, 1, NULL, true},
    {1, 6, {4}, {2}, {1}, {0}, {0}, {0}, 1, "SAME_LOWER", true},
    /* 2-D: U-Net's 2x2 stride 2, 3x3 stride 2 pad 1 output_padding 1, DCGAN's 4x4 stride 2,
     * dilated, asymmetric pads and strides, SAME_UPPER, output_shape, 3 groups, depthwise,
     * stride 1 (a conv with flipped weights), stride past the kernel */
    {2, 8, {2, 2}, {2, 2}, {1, 1}, {0}, {0}, {0}, 1, NULL, true},
    {2, 9, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, {1, 1}, {0}, 1, NULL, true},
    {2, 16, {4, 4}, {2, 2}, {1, 1}, {1, 1, 1, 1}, {0}, {0}, 1, NULL, false},
    {2, 6, {3, 3}, {2, 2}, {2, 2}, {1, 2, 0, 1}, {1, 0}, {0}, 1, NULL, true},
    {2, 7, {3, 5}, {1, 3}, {1, 1}, {2, 0, 1, 3}, {0, 2}, {0}, 1, NULL, true},
    {2, 8, {3, 3}, {2, 2}, {1, 1}, {0}, {0}, {0}, 1, "SAME_UPPER", true},
    {2, 5, {3, 3}, {2, 2}, {1, 1}, {0}, {0}, {28, 25}, 1, NULL, true},
    {2, 15, {3, 3}, {2, 1}, {1, 1}, {1, 1, 1, 1}, {1, 0}, {0}, 3, NULL, true},
    {2, 12, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, {1, 1}, {0}, 12, NULL, true},
    {2, 11, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, {0}, {0}, 1, NULL, true},
    {2, 4, {2, 1}, {3, 2}, {1, 1}, {0}, {0}, {0}, 1, NULL, true},
    /* 3-D: 2x2x2 stride 2, 3x3x3 stride (1, 2, 2) with output_padding, 2 groups, depthwise */
    {3, 8, {2, 2, 2}, {2, 2, 2}, {1, 1, 1}, {0}, {0}, {0}, 1, NULL, true},
    {3, 6, {3, 3, 3}, {1, 2, 2}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {0, 1, 1}, {0}, 1, NULL, true},
    {3, 8, {3, 2, 3}, {2, 2, 1}, {1, 2, 1}, {1, 0, 1, 0, 1, 1}, {1, 0, 0}, {0}, 2, NULL, false},
    {3, 12, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}, {0}, 12, NULL, true},
};

static void test_conv_transpose(void **state) {
    (void)state;
    for (size_t i = 0; i < AF_COUNT(geomst); i++) {
        const convt *c = &geomst[i];
        int64_t b = i % 2 ? 1 : 2, ch = c->group == c->m ? c->m : 12;
        lcase lc = {"ConvTranspose", {b, ch, 13}, b_convt, c, 2, 1};
        if (c->nsp == 2) lc.x[2] = 13, lc.x[3] = 11;
        if (c->nsp == 3) lc.x[2] = 3, lc.x[3] = 7, lc.x[4] = 5;
        check(&lc);
    }
    static const convt up1 = {1, 8, {4}, {2}, {1}, {1, 1}, {0}, {0}, 1, NULL, true};
    static const convt up2 = {2, 8, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, {1, 1}, {0}, 1, NULL, true};
    static const convt up3 = {3, 8, {2, 2, 2}, {2, 2, 2}, {1, 1, 1}, {0}, {0}, {0}, 1, NULL, true};
    const lcase blocks[] = {{"ConvTranspose 1-D block", {2, 6, 17}, b_convt_block, &up1, 2, 2},
                            {"ConvTranspose 2-D block", {1, 6, 7, 9}, b_convt_block, &up2, 2, 2},
                            {"ConvTranspose 3-D block", {1, 6, 3, 4, 5}, b_convt_block, &up3, 2, 2},
                            {"U-Net decoder step", {1, 5, 12, 10}, b_unet_up, NULL, 2, 4}};
    for (size_t i = 0; i < AF_COUNT(blocks); i++) check(&blocks[i]);
    /* Long 1-D inputs: several bands per image, each band's GEMM on its own slab. */
    lcase lng = {"ConvTranspose 1-D, long", {1, 16, 3001}, b_convt, &geomst[0], 2, 1};
    check(&lng);
    /* Under a precision mode ConvTranspose stays float32, and the precision pass says why. */
    const char *why = NULL;
    if (!af_precision_supported(AF_PREC_BF16, &why)) return;
    af_arena *a = af_arena_new();
    af_graph *g = build(a, &blocks[1], 7);
    af_precision_cfg pc = {.mode = AF_PREC_BF16};
    af_error err;
    if (af_optimize(g, NULL, NULL, &err) || af_lower(g, &pc, &err)) fail_msg("%s", err.message);
    int transposed = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (!af_attr_int(n, "transposed", 0)) continue;
        transposed++;
        assert_string_equal(af_attr_str(n, "precision", ""), "fp32");
        assert_string_equal(af_attr_str(n, "precision_why", ""), "transposed convolution runs fp32");
        assert_int_equal(n->in[1]->type.dtype, AF_DTYPE_FLOAT);
    }
    assert_int_equal(transposed, 2);
    af_arena_free(a);
}

/* Dilations past the feature map (an ASPP branch): only the centre tap reads data, the conv
 * is cut down to it (1x1, no padding) and computes the same; a 1-D conv loses its two end taps,
 * one where only one end is dead keeps the rest. */
static void test_dead_taps(void **state) {
    (void)state;
    static const conv aspp = {8, {3, 3}, {1, 1}, {6, 6}, {6, 6, 6, 6}, 1, NULL, true};
    static const conv edge = {5, {3, 3}, {1, 1}, {2, 1}, {3, 1, 0, 1}, 1, NULL, true};
    static const convn one = {1, 6, {3}, {1}, {8}, {8, 8}, 1, true};
    const lcase cases[] = {{"dead taps", {2, 6, 5, 4}, b_conv, &aspp, 2, 1},
                           {"dead taps at one end", {1, 3, 4, 6}, b_conv, &edge, 2, 1},
                           {"dead taps 1-D", {1, 4, 7}, b_convn, &one, 2, 1}};
    static const int64_t want[3][2] = {{1, 1}, {2, 3}, {1, 0}};
    for (int c = 0; c < 3; c++) {
        check(&cases[c]);
        af_arena *a = af_arena_new();
        af_graph *g = build(a, &cases[c], 7);
        af_error err;
        assert_int_equal(af_lower(g, NULL, &err), AF_OK);
        const int64_t *ks = NULL;
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i]->op == AF_OP_FUSED_CONV) af_attr_ints(g->nodes[i], "kernel_shape", &ks);
        assert_non_null(ks);
        assert_int_equal(ks[0], want[c][0]);
        if (want[c][1]) assert_int_equal(ks[1], want[c][1]);
        af_arena_free(a);
    }
}

/* Windows reaching far outside X (dilated convs on small images, as in an ASPP head): the fast
 * kernel runs one GEMM per kernel position over the outputs it reaches, adding into Y, then the
 * epilogue (conv.c, vt_choose); a 3x3 conv with padding 1 keeps the padded path. Geometries:
 * 2-D with bias and batch 2, two groups with strides and asymmetric pads, 5x5, outputs whose
 * windows are all padding (bias and epilogue only), 1-D and 3-D; and an ASPP-style block whose
 * second conv carries BN, a residual Add and Relu into the epilogue pass. */
static void b_dilated_block(af_graph *g, af_value *x, const void *arg) {
    const conv *c = arg;
    af_value *y = op1(g, "Relu", batchnorm(g, conv2d(g, x, c)));
    mark_output(g, op1(g, "Relu", op2(g, "Add", batchnorm(g, conv2d(g, y, c)), y)));
}

static void test_valid_taps(void **state) {
    (void)state;
    static const conv c2[] = {
        {24, {3, 3}, {1, 1}, {6, 6}, {6, 6, 6, 6}, 1, NULL, true},
        {12, {3, 3}, {2, 2}, {5, 4}, {5, 3, 4, 6}, 2, NULL, true},
        {17, {5, 5}, {1, 1}, {3, 3}, {6, 6, 6, 6}, 1, NULL, false},
        {6, {3, 3}, {1, 1}, {1, 1}, {5, 5, 5, 4}, 1, NULL, true},
    };
    static const int64_t xs[4][4] = {{2, 20, 8, 7}, {1, 10, 9, 11}, {1, 9, 7, 9}, {1, 5, 4, 4}};
    for (size_t i = 0; i < AF_COUNT(c2); i++) {
        lcase c = {"valid taps", {xs[i][0], xs[i][1], xs[i][2], xs[i][3]}, b_conv, &c2[i], 2, 1};
        check(&c);
    }
    static const conv blk = {16, {3, 3}, {1, 1}, {5, 5}, {5, 5, 5, 5}, 1, NULL, false};
    lcase b = {"valid taps block", {2, 16, 7, 6}, b_dilated_block, &blk, 2, 2};
    check(&b);
    static const convn one = {1, 8, {3}, {1}, {9}, {9, 9}, 1, true};
    static const convn three = {3, 8, {3, 3, 3}, {1, 1, 1}, {3, 4, 4}, {3, 4, 4, 3, 4, 4}, 1, true};
    lcase c1 = {"valid taps 1-D", {2, 6, 12}, b_convn, &one, 2, 1};
    lcase c3 = {"valid taps 3-D", {1, 6, 4, 6, 5}, b_convn, &three, 2, 1};
    check(&c1);
    check(&c3);
}

/* GroupNorm between convs (a wav2vec2 feature extractor's first layer; a 2-D one): one
 * channels-last region, the GroupNorm's statistics taken over positions of NHWC rows. */
static void b_groupnorm(af_graph *g, af_value *x, const void *arg) {
    const convn *c = arg;
    af_value *y = convnd(g, x, c);
    af_node *gn = af_node_new(g, AF_OP_GROUP_NORM, NULL, 3, 1);
    assert_non_null(gn);
    af_node_set_input(gn, 0, y);
    af_node_set_input(gn, 1, vec(g, c->m, 0.5, 1.5));
    af_node_set_input(gn, 2, vec(g, c->m, -0.5, 0.5));
    af_node_set_output(gn, 0, af_value_new(g, af_graph_unique_name(g, "t")));
    set_int(gn, "num_groups", c->m / 2);
    infer(g);
    mark_output(g, convnd(g, op1(g, "Relu", gn->out[0]), c));
}

static void test_groupnorm_channels_last(void **state) {
    (void)state;
    static const convn c1 = {1, 8, {3}, {1}, {1}, {1, 1}, 1, true};
    static const convn c3 = {3, 6, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1, 0, 1, 1}, 1, false};
    lcase a = {"groupnorm 1-D", {2, 8, 37}, b_groupnorm, &c1, 2, 3};
    lcase b = {"groupnorm 3-D", {1, 6, 3, 7, 5}, b_groupnorm, &c3, 2, 3};
    /* more channels than a block of sums (64) and positions over several of its row chunks */
    static const convn c1w = {1, 72, {3}, {1}, {1}, {1, 1}, 1, true};
    lcase w = {"groupnorm 1-D, 72 channels", {2, 5, 150}, b_groupnorm, &c1w, 2, 3};
    check(&a);
    check(&b);
    check(&w);
}

/* ---- MatMul and Gemm --------------------------------------------------------------------------------- */

typedef struct mm_case {
    int64_t k, n;
    bool gemm, trans_b, bias2d;
} mm_case;

/* x [N, C, H, W] read as a batch of [H, W] matrices times a constant [W, n] (or a Gemm on the
 * flattened input), then Gelu-free: an Add and a Relu so that the fused graph has an epilogue. */
static void b_matmul(af_graph *g, af_value *x, const void *arg) {
    const mm_case *m = arg;
    int64_t k = x->type.dims[3];
    if (!m->gemm) {
        int64_t wd[2] = {k, m->n};
        af_value *y = op2(g, "MatMul", x, tu_const(g, 2, wd, -0.2, 0.2));
        mark_output(g, op1(g, "Relu", op2(g, "Add", y, vec(g, m->n, -1, 1))));
        return;
    }
    af_value *f = op1(g, "Flatten", x);
    int64_t kk = x->type.dims[1] * x->type.dims[2] * k, wd[2] = {m->trans_b ? m->n : kk, m->trans_b ? kk : m->n};
    int64_t cd[2] = {x->type.dims[0], m->n};
    af_value *ins[3] = {f, tu_const(g, 2, wd, -0.1, 0.1), m->bias2d ? tu_const(g, 2, cd, -1, 1) : vec(g, m->n, -1, 1)};
    af_node *gm = node(g, "Gemm", 3, ins);
    if (m->trans_b) set_int(gm, "transB", 1);
    mark_output(g, op1(g, "Sigmoid", gm->out[0]));
}

static void test_matmul(void **state) {
    (void)state;
    static const mm_case mms[] = {
        {0, 50, false, false, false}, {0, 16, false, false, false}, {0, 70, true, true, false},
        {0, 33, true, false, true},
    };
    for (size_t i = 0; i < AF_COUNT(mms); i++) {
        lcase c = {"matmul", {2, 3, 29, 19}, b_matmul, &mms[i], 0, 0};
        check(&c);
    }
}

/* A steady-state run touches no new memory: arena, scratch and frame arrays are made by the
 * first run and reused, so runs after the warm-up take no page faults. */
static void test_steady_state(void **state) {
    (void)state;
    lcase c = {"steady state", {1, 32, 24, 24}, b_wino_block, NULL, 2, 2};
    af_arena *a = af_arena_new();
    af_graph *g = build(a, &c, 7);
    af_error err;
    assert_int_equal(af_optimize(g, NULL, NULL, &err), AF_OK);
    assert_int_equal(af_lower(g, NULL, &err), AF_OK);
    af_plan *p = NULL;
    assert_int_equal(af_plan_build(g, &p, &err), AF_OK);
    void *arena = aligned_alloc(64, (p->arena_size + 63) & ~(uint64_t)63);
    af_runtime *rt = NULL;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    af_tensor *x = input_of(&c);
    const af_tensor *in[1] = {x};
    /* Warm up, then count minor faults over windows of 6 runs. The kernel may fault a page of
     * ours on its own now and then (page migration, huge-page compaction on a busy machine), so
     * one clean window out of five proves the runs themselves map nothing new. */
    long faults = -1;
    for (int w = 0; w < 6 && faults != 0; w++) {
        struct rusage u0, u1;
        getrusage(RUSAGE_SELF, &u0);
        for (int r = 0; r < 6; r++) {
            af_tensor out[1];
            memset(out, 0, sizeof out);
            assert_int_equal(af_exec_graph_planned(g, p, arena, rt, in, out, &err), AF_OK);
            af_tensor_release(&out[0]);
        }
        getrusage(RUSAGE_SELF, &u1);
        if (w > 0) faults = u1.ru_minflt - u0.ru_minflt; /* window 0 is the warm-up */
    }
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator keeps freed memory aside and maps fresh pages */
    assert_int_equal(faults, 0);
#endif
    af_tensor_free(x);
    af_runtime_free(rt);
    free(arena);
    af_plan_free(p);
    af_arena_free(a);
}

/* --precision_mode: bf16, fp16 and mixed on convolutions (pointwise, strided, padded, the
 * stem, 3x3 blocks that Winograd would take in fp32, channel counts that are not multiples of
 * 32), a squeeze-excite block (its gate applied to the converted input), the head and MatMul /
 * Gemm with epilogues, within each type's rounding of the fp32 reference. */
static void test_precision(void **state) {
    (void)state;
    static const mm_case mm = {0, 50, false, false, false}, gm = {0, 33, true, true, false};
    static const lcase cases[] = {
        {"pointwise", {2, 20, 13, 11}, b_conv, &geoms[0], 2, 1},
        {"strided pointwise", {1, 3, 13, 11}, b_conv, &geoms[1], 2, 1},
        {"3x3 same", {1, 20, 13, 11}, b_conv, &geoms[2], 2, 1},
        {"3x3 stride 2", {1, 3, 13, 11}, b_conv, &geoms[3], 2, 1},
        {"dilated", {1, 20, 13, 11}, b_conv, &geoms[4], 2, 1},
        {"stem", {1, 3, 23, 21}, b_conv, &geoms[6], 2, 1},
        {"resnet block", {1, 40, 12, 12}, b_wino_block, NULL, 2, 2},
        {"squeeze-excite", {1, 48, 9, 9}, b_se, NULL, 2, 2},
        {"matmul", {2, 3, 29, 19}, b_matmul, &mm, 0, 0},
        {"gemm", {2, 3, 29, 19}, b_matmul, &gm, 0, 0},
    };
    static const af_precision modes[] = {AF_PREC_BF16, AF_PREC_FP16, AF_PREC_MIXED};
    for (size_t m = 0; m < AF_COUNT(modes); m++)
        for (size_t i = 0; i < AF_COUNT(cases); i++) check_prec(&cases[i], modes[m]);
}

/* bf16 follows the calibrated rates: a machine whose bf16 GEMM is not at least 1.2x its fp32
 * one (AVX512_BF16 without AMX) keeps every core fp32 under bf16 and mixed, and says why with
 * both rates; a fast one (AMX) gets its bf16 cores; unknown rates (0) leave the flags to decide.
 * fp16 (half-precision storage, fp32 arithmetic) does not depend on them. */
static void test_precision_rates(void **state) {
    (void)state;
    static const lcase pw = {"pointwise", {2, 20, 13, 11}, b_conv, &geoms[0], 2, 1};
    const char *why = NULL;
    bool bf16 = af_precision_supported(AF_PREC_BF16, &why);
    static const struct {
        af_precision mode;
        double fp32, bf16;
        bool low; /* (where the CPU has bf16 at all) some core goes low */
    } rows[] = {
        {AF_PREC_BF16, 100e9, 50e9, false}, {AF_PREC_MIXED, 100e9, 119e9, false},
        {AF_PREC_BF16, 100e9, 400e9, true}, {AF_PREC_BF16, 0, 0, true},
        {AF_PREC_FP16, 100e9, 50e9, true},
    };
    for (size_t r = 0; r < AF_COUNT(rows); r++) {
        af_arena *a = af_arena_new();
        af_graph *g = build(a, &pw, 7);
        af_precision_cfg pc = {rows[r].mode, NULL, rows[r].fp32, rows[r].bf16, 0};
        af_error err;
        if (af_lower(g, &pc, &err)) fail_msg("%s", err.message);
        bool expect_low = rows[r].low && (bf16 || rows[r].mode == AF_PREC_FP16);
        if ((count_low(g) > 0) != expect_low)
            fail_msg("row %zu: %d low-precision cores, expected %s", r, count_low(g),
                     expect_low ? "some" : "none");
        for (int i = 0; bf16 && !rows[r].low && i < g->nnodes; i++) {
            const char *w = af_attr_str(g->nodes[i], "precision_why", NULL);
            if (af_attr_str(g->nodes[i], "precision", NULL) && !(w && strstr(w, "fp32 is faster")))
                fail_msg("row %zu: node %s says '%s'", r, g->nodes[i]->name, w ? w : "(nothing)");
        }
        af_arena_free(a);
    }
}

int main(void) {
    tu_rng = 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_state),
        cmocka_unit_test(test_conv_geometries),
        cmocka_unit_test(test_conv_1d_3d),
        cmocka_unit_test(test_conv_transpose),
        cmocka_unit_test(test_bn_activation),
        cmocka_unit_test(test_dead_taps),
        cmocka_unit_test(test_valid_taps),
        cmocka_unit_test(test_groupnorm_channels_last),
        cmocka_unit_test(test_depthwise),
        cmocka_unit_test(test_grouped),
        cmocka_unit_test(test_expand_depthwise),
        cmocka_unit_test(test_expand_depthwise_dynamic),
        cmocka_unit_test(test_winograd),
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_precision),
        cmocka_unit_test(test_precision_rates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
