/* The fusion engine, its built-in rules, the switches, the report and the cost model.
 *
 * Rules: the models of gen_fusion_models.py (in $AF_FUSION_MODELS_DIR) imported twice, one copy
 * fused: per rule a positive case with the exact count of each fused op and of all nodes, a
 * graph that verifies, the provenance attributes, and fused-vs-unfused outputs within rtol 1e-4;
 * near misses (an intermediate with a second consumer, an intermediate that is a graph output,
 * weights that are not constant, a broadcast that does not fit, float64) where the rule must not
 * fire and the report must name the node and the reason.
 * Switches: both switch-file forms, the environment lists, unknown names and bad values.
 * Report: text and JSON content. Cost model: calibration, cache file, re-measure when corrupt.
 * The unfused baseline (no_fusion): simplified as the fused graph is, so BatchNorms whose
 * parameters come through Identity nodes still run on fast kernels (the dispatcher's query). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "driver/compile.h"
#include "fusion/fusion.h"
#include "ir/epilogue.h"
#include "kernels/fast/dispatch.h"
#include "runtime/machine.h"
#include "kernels/simd/cpu.h"
#include "onnx/onnx.h"
#include "runtime/exec.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

static char tmpdir[256];

static af_model *load(const char *name) {
    const char *dir = getenv("AF_FUSION_MODELS_DIR");
    if (!dir) fail_msg("AF_FUSION_MODELS_DIR is not set (run through ctest)");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
    af_model *m = NULL;
    af_error err;
    if (tu_load(path, &m, &err) != AF_OK) fail_msg("%s: %s", name, err.message);
    return m;
}

/* Nodes of op (AF_OP_COUNT: every node) in g and its subgraphs. */
static int count_op(const af_graph *g, af_op op) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        c += op == AF_OP_COUNT || n->op == op;
        for (int a = 0; a < n->nattrs; a++)
            if (n->attrs[a].g) c += count_op(n->attrs[a].g, op);
    }
    return c;
}

static int count_fused(const af_graph *g) {
    return count_op(g, AF_OP_FUSED_CONV) + count_op(g, AF_OP_FUSED_MATMUL) +
           count_op(g, AF_OP_FUSED_ELEMENTWISE) + count_op(g, AF_OP_CONV_POOL_FC) +
           count_op(g, AF_OP_SQUEEZE_EXCITE);
}

/* Random inputs for every graph input; the caller frees them with free_tensors. */
static af_tensor **make_inputs(const af_graph *g) {
    af_tensor **in = calloc((size_t)g->ninputs + 1, sizeof *in);
    assert_non_null(in);
    for (int i = 0; i < g->ninputs; i++) {
        const af_tensor *t = &g->inputs[i]->type;
        in[i] = af_tensor_new(t->dtype, t->rank, t->dims);
        assert_non_null(in[i]);
        for (int64_t k = 0; k < af_tensor_numel(in[i]); k++) {
            if (t->dtype == AF_DTYPE_FLOAT) ((float *)in[i]->data)[k] = (float)tu_rnd();
            else if (t->dtype == AF_DTYPE_DOUBLE) ((double *)in[i]->data)[k] = tu_rnd();
            else if (t->dtype == AF_DTYPE_BOOL) ((uint8_t *)in[i]->data)[k] = 1;
        }
    }
    return in;
}

static void free_tensors(af_tensor **t, int n) {
    for (int i = 0; i < n; i++) af_tensor_free(t[i]);
    free(t);
}

static af_tensor *run(const af_graph *g, af_tensor **in) {
    af_tensor *out = calloc((size_t)g->noutputs + 1, sizeof *out);
    assert_non_null(out);
    af_error err;
    if (af_exec_graph(g, (const af_tensor *const *)in, out, &err) != AF_OK)
        fail_msg("run: %s", err.message);
    return out;
}

/* Outputs of the unfused and the fused graph agree within rtol 1e-4 (plus a tiny atol). */
static void same_outputs(const char *name, const af_graph *ref, const af_graph *fused) {
    assert_int_equal(ref->noutputs, fused->noutputs);
    af_tensor **in = make_inputs(ref);
    af_tensor *want = run(ref, in), *got = run(fused, in);
    for (int o = 0; o < ref->noutputs; o++) {
        assert_int_equal(want[o].dtype, AF_DTYPE_FLOAT);
        assert_int_equal(got[o].dtype, AF_DTYPE_FLOAT);
        assert_int_equal(want[o].rank, got[o].rank);
        int64_t n = af_tensor_numel(&want[o]);
        assert_int_equal(n, af_tensor_numel(&got[o]));
        const float *w = want[o].data, *f = got[o].data;
        for (int64_t i = 0; i < n; i++)
            if (!(fabs((double)w[i] - f[i]) <= 1e-4 * fabs((double)w[i]) + 1e-5))
                fail_msg("%s: output %d [%lld]: unfused %.8g, fused %.8g", name, o, (long long)i,
                         (double)w[i], (double)f[i]);
        af_tensor_release(&want[o]);
        af_tensor_release(&got[o]);
    }
    free(want);
    free(got);
    free_tensors(in, ref->ninputs);
}

/* Fuse a loaded model with cfg (NULL: all rules), checking the result verifies. */
static void fuse(af_model *m, const af_fusion_config *cfg, af_fusion_report *rep) {
    af_error err;
    if (af_fuse(m->graph, cfg, rep, &err) != AF_OK) fail_msg("af_fuse: %s", err.message);
    if (af_graph_verify(m->graph, &err) != AF_OK) fail_msg("verify: %s", err.message);
}

/* The first node of op in g or its subgraphs. */
static const af_node *first_of(const af_graph *g, af_op op) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->op == op) return n;
        for (int a = 0; a < n->nattrs; a++) {
            const af_node *s = n->attrs[a].g ? first_of(n->attrs[a].g, op) : NULL;
            if (s) return s;
        }
    }
    return NULL;
}

static char *print_report(const af_fusion_report *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    af_fusion_report_print(r, f);
    fclose(f);
    return buf;
}

/* ---- positive cases --------------------------------------------------------------------------- */

typedef struct want_op {
    af_op op;
    int count;
} want_op;

typedef struct positive {
    const char *model;
    int rule;              /* the rule whose applied count is checked */
    int applied;
    int nodes_after;       /* every node, subgraphs included */
    want_op ops[3];        /* exact counts (unused entries have count 0 and op 0) */
    const char *fusion_rule; /* provenance of the first fused node of ops[0].op, or NULL */
} positive;

static const positive positives[] = {
    {"conv_bn_relu", AF_RULE_CONV_BN_RELU, 1, 1, {{AF_OP_FUSED_CONV, 1}}, "ConvBNReluFusionOp"},
    {"conv_bn_add_relu", AF_RULE_CONV_BN_RELU, 1, 1, {{AF_OP_FUSED_CONV, 1}}, NULL},
    {"conv_dw_dilated", AF_RULE_CONV_BN_RELU, 1, 1, {{AF_OP_FUSED_CONV, 1}}, NULL},
    {"conv_bn_prelu", AF_RULE_CONV_BN_RELU, 2, 2, {{AF_OP_FUSED_CONV, 2}, {AF_OP_PRELU, 0}}, NULL},
    {"convt_bn_relu", AF_RULE_CONV_TRANSPOSE_BN_RELU, 1, 1,
     {{AF_OP_FUSED_CONV, 1}, {AF_OP_CONV_TRANSPOSE, 0}, {AF_OP_BATCH_NORMALIZATION, 0}},
     "ConvTransposeBNReluFusionOp"},
    {"convt_bn_add_act_1d", AF_RULE_CONV_TRANSPOSE_BN_RELU, 1, 1,
     {{AF_OP_FUSED_CONV, 1}, {AF_OP_ADD, 0}, {AF_OP_LEAKY_RELU, 0}}, "ConvTransposeBNReluFusionOp"},
    {"conv_acts", AF_RULE_CONV_BN_RELU, 11, 11, {{AF_OP_FUSED_CONV, 11}, {AF_OP_CONV, 0}}, NULL},
    {"matmul_bias_relu", AF_RULE_MATMUL_BIAS_ACT, 1, 1, {{AF_OP_FUSED_MATMUL, 1}},
     "MatMulBiasReluFusionOp"},
    {"matmul_bias_gelu_3d", AF_RULE_MATMUL_BIAS_ACT, 1, 1, {{AF_OP_FUSED_MATMUL, 1}},
     "MatMulBiasActFusionOp"},
    {"gemm_sigmoid", AF_RULE_MATMUL_BIAS_ACT, 1, 1, {{AF_OP_FUSED_MATMUL, 1}, {AF_OP_GEMM, 0}},
     NULL},
    {"matmul_add_residual", AF_RULE_MATMUL_BIAS_ACT, 1, 1, {{AF_OP_FUSED_MATMUL, 1}}, NULL},
    {"layernorm_matmul", AF_RULE_LAYER_NORM_MATMUL, 1, 4,
     {{AF_OP_FUSED_MATMUL, 2}, {AF_OP_LAYER_NORMALIZATION, 1}, {AF_OP_ADD, 1}}, NULL},
    {"layernorm_gemm", AF_RULE_LAYER_NORM_MATMUL, 1, 1,
     {{AF_OP_FUSED_MATMUL, 1}, {AF_OP_LAYER_NORMALIZATION, 0}}, "LayerNormMatMulFusionOp"},
    {"rmsnorm_matmul", AF_RULE_RMS_NORM_MATMUL, 1, 4,
     {{AF_OP_FUSED_MATMUL, 2}, {AF_OP_RMS_NORMALIZATION, 1}, {AF_OP_ADD, 1}}, NULL},
    {"rmsnorm_transpose_matmul", AF_RULE_RMS_NORM_MATMUL, 1, 2,
     {{AF_OP_FUSED_MATMUL, 1}, {AF_OP_RMS_NORMALIZATION, 0}, {AF_OP_TRANSPOSE, 1}},
     "RMSNormMatMulFusionOp"},
    {"conv_pool_fc", AF_RULE_CONV_POOL_FC, 1, 1, {{AF_OP_CONV_POOL_FC, 1}, {AF_OP_FUSED_CONV, 0}},
     "ConvBNReluFusionOp,ConvPoolFcFusionOp"},
    {"conv_pool_matmul", AF_RULE_CONV_POOL_FC, 1, 1, {{AF_OP_CONV_POOL_FC, 1}},
     "ConvPoolFcFusionOp"},
    {"squeeze_excite", AF_RULE_SQUEEZE_EXCITE, 1, 1, {{AF_OP_SQUEEZE_EXCITE, 1}},
     "SqueezeExciteFusionOp"},
    {"squeeze_excite_hard", AF_RULE_SQUEEZE_EXCITE, 1, 1, {{AF_OP_SQUEEZE_EXCITE, 1}}, NULL},
    {"ew_chain", AF_RULE_ELEMENTWISE, 1, 1, {{AF_OP_FUSED_ELEMENTWISE, 1}},
     "ElementwiseFusionOp"},
    {"ew_matmul", AF_RULE_ELEMENTWISE, 1, 1, {{AF_OP_FUSED_MATMUL, 1}}, "ElementwiseFusionOp"},
    {"conv_max_min", AF_RULE_CONV_BN_RELU, 1, 1, {{AF_OP_FUSED_CONV, 1}, {AF_OP_MAX, 0}, {AF_OP_MIN, 0}},
     NULL},
    {"ew_extend_conv", AF_RULE_ELEMENTWISE, 1, 1, {{AF_OP_FUSED_CONV, 1}},
     "ConvBNReluFusionOp,ElementwiseFusionOp"},
    {"if_subgraph", AF_RULE_CONV_BN_RELU, 1, 3, {{AF_OP_FUSED_CONV, 1}, {AF_OP_CONV, 0}}, NULL},
    {"bn_relu", AF_RULE_BN_ACT, 1, 1, {{AF_OP_FUSED_ELEMENTWISE, 1}, {AF_OP_RELU, 0}},
     "BatchNormActFusionOp"},
    {"pad_avgpool", AF_RULE_PAD_WINDOW, 1, 1, {{AF_OP_AVERAGE_POOL, 1}, {AF_OP_PAD, 0}},
     "PadWindowFusionOp"},
    {"pad_conv_1d", AF_RULE_PAD_WINDOW, 1, 1, {{AF_OP_FUSED_CONV, 1}, {AF_OP_PAD, 0}}, NULL},
    {"pad_maxpool_3d", AF_RULE_PAD_WINDOW, 1, 1, {{AF_OP_MAX_POOL, 1}, {AF_OP_PAD, 0}}, NULL},
};

static void test_positive(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof positives / sizeof positives[0]; c++) {
        const positive *p = &positives[c];
        af_model *ref = load(p->model), *m = load(p->model);
        af_fusion_report rep;
        af_fusion_report_init(&rep, p->model, af_machine_get());
        fuse(m, NULL, &rep);
        int applied = af_fusion_report_applied(&rep, p->rule);
        if (applied != p->applied)
            fail_msg("%s: rule %s applied %d times, want %d", p->model,
                     af_fusion_rule_name(p->rule), applied, p->applied);
        for (int k = 0; k < 3; k++) {
            if (!p->ops[k].op) continue;
            int got = count_op(m->graph, p->ops[k].op);
            if (got != p->ops[k].count)
                fail_msg("%s: %d %s nodes, want %d", p->model, got, af_ops[p->ops[k].op].name,
                         p->ops[k].count);
        }
        if (count_op(m->graph, AF_OP_COUNT) != p->nodes_after)
            fail_msg("%s: %d nodes after fusion, want %d", p->model,
                     count_op(m->graph, AF_OP_COUNT), p->nodes_after);
        assert_int_equal(rep.ops_before, count_op(ref->graph, AF_OP_COUNT));
        assert_int_equal(rep.ops_after, p->nodes_after);
        const af_node *f = first_of(m->graph, p->ops[0].op);
        assert_non_null(f);
        /* A fused op is ours; PadWindow's result is the ONNX window op with grown pads. */
        assert_string_equal(f->domain, af_op_is_ours(f->op) ? "ai.autofusion" : "");
        const af_attr *fn = af_node_attr(f, "fused_nodes");
        assert_non_null(fn);
        assert_true(fn->type == AF_ATTR_STRINGS && fn->n >= 2);
        if (p->fusion_rule) assert_string_equal(af_attr_str(f, "fusion_rule", ""), p->fusion_rule);
        same_outputs(p->model, ref->graph, m->graph);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* The residual block's FusedConv: BN folded (no BN input), Add and Relu in the epilogue. */
static void test_conv_epilogue(void **state) {
    (void)state;
    af_model *m = load("conv_bn_add_relu");
    fuse(m, NULL, NULL);
    const af_node *f = first_of(m->graph, AF_OP_FUSED_CONV);
    assert_non_null(f);
    assert_int_equal(f->nin, 4);
    assert_non_null(f->in[2]); /* the folded bias */
    assert_ptr_equal(f->in[3], m->graph->inputs[0]);
    const int64_t *ep;
    assert_int_equal(af_attr_ints(f, "epilogue", &ep), 6);
    assert_int_equal(ep[0], 1); /* AF_EP_ADD, operand input 3 */
    assert_int_equal(ep[1], 3);
    assert_int_equal(ep[3], 5); /* AF_EP_RELU */
    assert_int_equal(ep[4], -1);
    const af_attr *fn = af_node_attr(f, "fused_nodes");
    assert_int_equal(fn->n, 4);
    af_model_free(m);
}

/* The RMSNorm prologue: FusedMatMul with ln_rms 1, the Scale as ln_scale and no ln_bias; an
 * RMSNorm read as B is left alone (no prologue there, nothing to report). */
static void test_rmsnorm_prologue(void **state) {
    (void)state;
    af_model *m = load("rmsnorm_matmul");
    fuse(m, NULL, NULL);
    int seen = 0;
    for (int i = 0; i < m->graph->nnodes; i++) {
        const af_node *f = m->graph->nodes[i];
        if (f->op != AF_OP_FUSED_MATMUL) continue;
        seen++;
        assert_int_equal(af_attr_int(f, "ln_rms", 0), 1);
        assert_true(f->nin >= 5 && f->in[3] && !f->in[4]);
        assert_float_equal(af_attr_float(f, "ln_epsilon", 0), 1e-6f, 1e-12);
    }
    assert_int_equal(seen, 2);
    af_model_free(m);
    af_model *ref = load("nm_rms_as_b");
    m = load("nm_rms_as_b");
    fuse(m, NULL, NULL);
    assert_int_equal(count_op(m->graph, AF_OP_RMS_NORMALIZATION), 1);
    assert_int_equal(count_fused(m->graph), 0);
    same_outputs("nm_rms_as_b", ref->graph, m->graph);
    af_model_free(ref);
    af_model_free(m);
}

/* ---- near misses ------------------------------------------------------------------------------ */

typedef struct near_miss {
    const char *model;
    int rule;
    const char *node;
    const char *reason;
    af_op absent;   /* must not appear */
    bool nothing;   /* no fused op at all */
} near_miss;

/* The BN + Relu after a conv that ConvBNRelu refused still fuse (BatchNormAct): those cases
 * only require that no FusedConv is made. */
static const near_miss misses[] = {
    {"nm_two_consumers", AF_RULE_CONV_BN_RELU, "conv_shared", "output feeds 2 consumers",
     AF_OP_FUSED_CONV, false},
    {"nm_graph_output", AF_RULE_CONV_BN_RELU, "conv_out", "intermediate is a graph output",
     AF_OP_FUSED_CONV, false},
    {"nm_nonconst_weights", AF_RULE_CONV_BN_RELU, "conv_w_input", "weights are not constant",
     AF_OP_FUSED_CONV, false},
    {"nm_convt_nonconst_weights", AF_RULE_CONV_TRANSPOSE_BN_RELU, "convt_w_input",
     "weights are not constant", AF_OP_FUSED_CONV, false},
    {"nm_broadcast", AF_RULE_CONV_BN_RELU, "conv_bcast", "broadcast does not fit the output",
     AF_OP_FUSED_CONV, true},
    {"nm_broadcast_matmul", AF_RULE_MATMUL_BIAS_ACT, "mm_bcast",
     "broadcast does not fit the output", AF_OP_FUSED_MATMUL, true},
    {"nm_dtype", AF_RULE_CONV_BN_RELU, "conv_f64", "dtype is not float32", AF_OP_FUSED_CONV, true},
    {"nm_se_gate_output", AF_RULE_SQUEEZE_EXCITE, "gap_se", "intermediate is a graph output",
     AF_OP_SQUEEZE_EXCITE, false},
    {"nm_ln_axis", AF_RULE_LAYER_NORM_MATMUL, "ln_axis", "normalisation axis is not the last",
     AF_OP_FUSED_MATMUL, true},
    {"nm_rms_axis", AF_RULE_RMS_NORM_MATMUL, "rms_axis", "normalisation axis is not the last",
     AF_OP_FUSED_MATMUL, true},
    {"nm_matmul_two_consumers", AF_RULE_MATMUL_BIAS_ACT, "mm_shared", "output feeds 2 consumers",
     AF_OP_FUSED_MATMUL, true},
    {"nm_matmul_dtype", AF_RULE_MATMUL_BIAS_ACT, "mm_f64", "dtype is not float32",
     AF_OP_FUSED_MATMUL, true},
    {"nm_cpf_graph_output", AF_RULE_CONV_POOL_FC, "gap_out", "intermediate is a graph output",
     AF_OP_CONV_POOL_FC, true},
    {"nm_ew_broadcast", AF_RULE_ELEMENTWISE, "mul_bcast", "broadcast does not fit the output",
     AF_OP_FUSED_MATMUL, true},
    {"nm_pad_reflect", AF_RULE_PAD_WINDOW, "pad_reflect", "Pad is not constant-mode",
     AF_OP_FUSED_CONV, true},
    {"nm_pad_channels", AF_RULE_PAD_WINDOW, "pad_channels", "Pad pads the batch or channels",
     AF_OP_FUSED_CONV, false},
};

static void test_near_misses(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof misses / sizeof misses[0]; c++) {
        const near_miss *nm = &misses[c];
        af_model *ref = load(nm->model), *m = load(nm->model);
        af_fusion_report rep;
        af_fusion_report_init(&rep, nm->model, af_machine_get());
        fuse(m, NULL, &rep);
        if (count_op(m->graph, nm->absent))
            fail_msg("%s: %s was made", nm->model, af_ops[nm->absent].name);
        if (nm->nothing) {
            assert_int_equal(count_fused(m->graph), 0);
            assert_int_equal(count_op(m->graph, AF_OP_COUNT), count_op(ref->graph, AF_OP_COUNT));
        }
        bool found = false;
        for (int i = 0; i < rep.nmisses; i++)
            found |= rep.misses[i].rule == nm->rule && !strcmp(rep.misses[i].node, nm->node) &&
                     !strcmp(rep.misses[i].reason, nm->reason);
        if (!found) {
            for (int i = 0; i < rep.nmisses; i++)
                fprintf(stderr, "  miss: %s %s: %s\n", af_fusion_rule_name(rep.misses[i].rule),
                        rep.misses[i].node, rep.misses[i].reason);
            fail_msg("%s: no near miss '%s' at %s", nm->model, nm->reason, nm->node);
        }
        assert_int_equal(af_fusion_report_applied(&rep, nm->rule), 0);
        if (!nm->nothing) same_outputs(nm->model, ref->graph, m->graph);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* ---- the int8 rule ----------------------------------------------------------------------------- */

/* Quantized models go through the whole optimizer (simplify keeps the weights' DequantizeLinear,
 * canonicalize pairs QuantizeLinear with DequantizeLinear, fusion, simplify): `fused` with
 * af_optimize, `ref` with af_simplify (the unfused baseline: weights folded to float, the
 * QuantizeLinear / DequantizeLinear nodes as they are). */
static void optimize_pair(af_model *ref, af_model *m, af_fusion_report *rep) {
    af_error err;
    if (af_simplify(ref->graph, &err) != AF_OK) fail_msg("af_simplify: %s", err.message);
    if (af_optimize(m->graph, NULL, rep, &err) != AF_OK) fail_msg("af_optimize: %s", err.message);
    if (af_graph_verify(m->graph, &err) != AF_OK) fail_msg("verify: %s", err.message);
}

typedef struct quant_case {
    const char *model;
    int applied, nodes_after; /* QuantConvMatMul's matches; every node after */
    want_op ops[3];
} quant_case;

static const quant_case quant_cases[] = {
    {"q_conv_relu", 1, 1, {{AF_OP_FUSED_CONV, 1}, {AF_OP_QUANTIZE_LINEAR, 0}}},
    {"q_gemm_matmul", 2, 2, {{AF_OP_FUSED_MATMUL, 2}, {AF_OP_DEQUANTIZE_LINEAR, 0}}},
    /* the fake quantizations before the MaxPool and the Concat went */
    {"q_pool_concat", 2, 4, {{AF_OP_FUSED_CONV, 2}, {AF_OP_QUANTIZE_DEQUANTIZE, 0}}},
    /* the fq before the Resize went; the one before the Transpose moved after it */
    {"q_resize_transpose", 2, 4, {{AF_OP_FUSED_CONV, 1}, {AF_OP_FUSED_MATMUL, 1}, {AF_OP_QUANTIZE_DEQUANTIZE, 0}}},
};

/* Each quantized FusedConv / FusedMatMul of g has the int8 form's attributes and INT8 weights. */
static int check_quant_nodes(const af_graph *g) {
    int seen = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if ((n->op != AF_OP_FUSED_CONV && n->op != AF_OP_FUSED_MATMUL) || !af_attr_int(n, "quant", 0))
            continue;
        seen++;
        const float *ws;
        assert_true(af_attr_float(n, "x_scale", 0) > 0);
        int64_t z = af_attr_int(n, "x_zero_point", -1);
        assert_true(z >= 0 && z <= 255);
        assert_true(af_attr_floats(n, "w_scale", &ws) >= 1);
        assert_true(af_value_is_const(n->in[1]));
        assert_int_equal(n->in[1]->type.dtype, AF_DTYPE_INT8);
        assert_non_null(strstr(af_attr_str(n, "fusion_rule", ""), "QuantConvMatMulFusionOp"));
    }
    return seen;
}

static void test_quant(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(quant_cases); c++) {
        const quant_case *q = &quant_cases[c];
        af_model *ref = load(q->model), *m = load(q->model);
        af_fusion_report rep;
        af_fusion_report_init(&rep, q->model, af_machine_get());
        optimize_pair(ref, m, &rep);
        int applied = af_fusion_report_applied(&rep, AF_RULE_QUANT_CONV_MATMUL);
        if (applied != q->applied)
            fail_msg("%s: QuantConvMatMul applied %d times, want %d", q->model, applied, q->applied);
        for (int k = 0; k < 3; k++)
            if (q->ops[k].op && count_op(m->graph, q->ops[k].op) != q->ops[k].count)
                fail_msg("%s: %d %s nodes, want %d", q->model, count_op(m->graph, q->ops[k].op),
                         af_ops[q->ops[k].op].name, q->ops[k].count);
        if (count_op(m->graph, AF_OP_COUNT) != q->nodes_after)
            fail_msg("%s: %d nodes, want %d", q->model, count_op(m->graph, AF_OP_COUNT),
                     q->nodes_after);
        assert_int_equal(check_quant_nodes(m->graph), q->applied);
        af_error err;
        assert_int_equal(af_fusion_report_quant(&rep, m->graph, &err), AF_OK);
        assert_int_equal(rep.int8_cores, q->applied);
        assert_int_equal(rep.nqfloat, 0);
        char *text = print_report(&rep);
        assert_non_null(strstr(text, "Quantized model: "));
        free(text);
        same_outputs(q->model, ref->graph, m->graph);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* The com.microsoft QOperator ops run on their reference kernels as imported (no pass) and as
 * DequantizeLinear -> float op -> QuantizeLinear after the optimizer: the same numbers but
 * where the float32 and the double paths round a value across a quantization step (the outputs
 * are dequantized with scale 0.01). The channels-last QLinearGlobalAveragePool has no QDQ form
 * and stays. */
static void test_quant_ms(void **state) {
    (void)state;
    af_model *raw = load("q_ms_ops"), *m = load("q_ms_ops");
    af_error err;
    if (af_optimize(m->graph, NULL, NULL, &err) != AF_OK) fail_msg("af_optimize: %s", err.message);
    assert_int_equal(count_op(m->graph, AF_OP_QLINEAR_ADD) + count_op(m->graph, AF_OP_QLINEAR_MUL) +
                         count_op(m->graph, AF_OP_QLINEAR_SIGMOID) +
                         count_op(m->graph, AF_OP_QLINEAR_LEAKY_RELU) +
                         count_op(m->graph, AF_OP_QLINEAR_CONCAT),
                     0);
    assert_int_equal(count_op(m->graph, AF_OP_QLINEAR_GLOBAL_AVERAGE_POOL), 1);
    af_tensor **in = make_inputs(raw->graph);
    af_tensor *want = run(raw->graph, in), *got = run(m->graph, in);
    for (int o = 0; o < 2; o++) {
        int64_t n = af_tensor_numel(&want[o]), off = 0;
        assert_int_equal(n, af_tensor_numel(&got[o]));
        assert_int_equal(n, o == 0 ? 8 : 5);
        const float *w = want[o].data, *f = got[o].data;
        for (int64_t i = 0; i < n; i++) {
            assert_true(fabs((double)w[i] - f[i]) <= 0.0101);
            off += w[i] != f[i];
        }
        assert_true(off <= n / 4);
        af_tensor_release(&want[o]);
        af_tensor_release(&got[o]);
    }
    free(want);
    free(got);
    free_tensors(in, raw->graph->ninputs);
    af_model_free(raw);
    af_model_free(m);
}

/* The conv stays float (its weights folded to float32 after fusion) with the reason. */
static const near_miss quant_misses[] = {
    {"nm_q_weight_input", AF_RULE_QUANT_CONV_MATMUL, "qconv_w_input",
     "quantized weights are not constant", AF_OP_COUNT, false},
    {"nm_q_zp_channels", AF_RULE_QUANT_CONV_MATMUL, "qconv_zp", "weight zero point is per channel",
     AF_OP_COUNT, false},
    {"nm_q_shift", AF_RULE_QUANT_CONV_MATMUL, "qconv_shift", "shifted weights leave [-128, 127]",
     AF_OP_COUNT, false},
    {"nm_q_params_differ", AF_RULE_QUANT_CONV_MATMUL, "qconv_differ",
     "input is not a QuantizeLinear -> DequantizeLinear pair with one set of constant per-tensor "
     "parameters", AF_OP_COUNT, false},
};

static void test_quant_misses(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(quant_misses); c++) {
        const near_miss *nm = &quant_misses[c];
        af_model *ref = load(nm->model), *m = load(nm->model);
        af_fusion_report rep;
        af_fusion_report_init(&rep, nm->model, af_machine_get());
        optimize_pair(ref, m, &rep);
        assert_int_equal(af_fusion_report_applied(&rep, nm->rule), 0);
        assert_int_equal(check_quant_nodes(m->graph), 0);
        bool found = false;
        for (int i = 0; i < rep.nmisses; i++)
            found |= rep.misses[i].rule == nm->rule && !strcmp(rep.misses[i].node, nm->node) &&
                     !strcmp(rep.misses[i].reason, nm->reason);
        if (!found) {
            for (int i = 0; i < rep.nmisses; i++)
                fprintf(stderr, "  miss: %s %s: %s\n", af_fusion_rule_name(rep.misses[i].rule),
                        rep.misses[i].node, rep.misses[i].reason);
            fail_msg("%s: no near miss '%s' at %s", nm->model, nm->reason, nm->node);
        }
        /* the report's quantization section lists the conv in float32 with the reason */
        af_error err;
        assert_int_equal(af_fusion_report_quant(&rep, m->graph, &err), AF_OK);
        assert_int_equal(rep.int8_cores, 0);
        assert_int_equal(rep.nqfloat, 1);
        assert_string_equal(rep.qfloat[0].why, nm->reason);
        char *text = print_report(&rep);
        assert_non_null(strstr(text, nm->reason));
        assert_non_null(strstr(text, "Quantized model: 0 of 1 Conv/MatMul/Gemm cores int8"));
        free(text);
        /* the weights run as float32 constants: what the rule did not take was folded */
        if (strcmp(nm->model, "nm_q_weight_input") && count_op(m->graph, AF_OP_DEQUANTIZE_LINEAR) !=
                                                         !strcmp(nm->model, "nm_q_params_differ"))
            fail_msg("%s: %d DequantizeLinear left", nm->model,
                     count_op(m->graph, AF_OP_DEQUANTIZE_LINEAR));
        same_outputs(nm->model, ref->graph, m->graph);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* FakeQuantShare on a ResNet identity block (tests/gen_fusion_models.py, residual): the
 * quantized conv that read the block input h moves onto fq(h), fq joins the stem conv's
 * epilogue, and the residual Add + Relu the last conv's: three FusedConv, no FusedElementwise.
 * When the conv quantizes h with other parameters, fq(h) stays a QuantizeDequantize node (the
 * last conv reads it as its residual) and the report names the reason. Both against the
 * unfused graph. */
static void test_fq_share(void **state) {
    (void)state;
    static const struct {
        const char *model;
        int applied, fq_nodes;
    } cases[] = {{"q_residual", 1, 0}, {"nm_q_share_differ", 0, 1}};
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        af_model *ref = load(cases[c].model), *m = load(cases[c].model);
        af_fusion_report rep;
        af_fusion_report_init(&rep, cases[c].model, af_machine_get());
        optimize_pair(ref, m, &rep);
        assert_int_equal(af_fusion_report_applied(&rep, AF_RULE_QUANT_CONV_MATMUL), 3);
        assert_int_equal(af_fusion_report_applied(&rep, AF_RULE_FQ_SHARE), cases[c].applied);
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_CONV), 3);
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_ELEMENTWISE), 0);
        assert_int_equal(count_op(m->graph, AF_OP_QUANTIZE_DEQUANTIZE), cases[c].fq_nodes);
        assert_int_equal(count_op(m->graph, AF_OP_COUNT), 3 + cases[c].fq_nodes);
        assert_int_equal(check_quant_nodes(m->graph), 3);
        bool found = false;
        for (int i = 0; i < rep.nmisses; i++)
            found |= rep.misses[i].rule == AF_RULE_FQ_SHARE &&
                     !strcmp(rep.misses[i].reason,
                             "input also read unquantized or with other parameters");
        assert_int_equal(found, cases[c].applied == 0);
        if (cases[c].applied) {
            /* the stem's epilogue ends with fq(h); the last conv reads fq(h) as its residual */
            const af_node *stem = NULL, *last = NULL;
            for (int i = 0; i < m->graph->nnodes; i++) {
                const af_node *n = m->graph->nodes[i];
                if (strstr(n->name, "qstem")) stem = n;
                if (strstr(n->name, "qconv2")) last = n;
            }
            assert_non_null(stem);
            assert_non_null(last);
            const int64_t *ep = NULL;
            int ne = af_attr_ints(stem, "epilogue", &ep);
            assert_true(ne >= 3 && ep[ne - 3] == AF_EP_FAKE_QUANT);
            assert_true(last->nin > 3 && last->in[3] == stem->out[0]);
        }
        same_outputs(cases[c].model, ref->graph, m->graph);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* ---- switches --------------------------------------------------------------------------------- */

static const char *write_tmp(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_switch_file_lines(void **state) {
    (void)state;
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    af_error err;
    const char *p = write_tmp("sw.cfg", "# ATC style\nElementwiseFusionOp:on\n\nALL:off\n"
                                        "  MatMulBiasReluFusionOp : off  # alias\n");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_OK);
    for (int r = 0; r < AF_RULE_COUNT; r++) assert_int_equal(cfg.disabled[r], r != AF_RULE_ELEMENTWISE);
    assert_string_equal(cfg.disabled_by[AF_RULE_CONV_BN_RELU], "--fusion_switch_file");
    assert_string_equal(cfg.disabled_as[AF_RULE_MATMUL_BIAS_ACT], "MatMulBiasReluFusionOp");
    assert_null(cfg.disabled_by[AF_RULE_ELEMENTWISE]);
}

static void test_switch_file_json(void **state) {
    (void)state;
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    af_error err;
    const char *p = write_tmp("sw.json", "{\"Switch\": {\"GraphFusion\": {\"ConvBNReluFusionOp\": "
                                         "\"on\", \"ALL\": \"off\"}, \"UBFusion\": "
                                         "{\"TbeEltwiseFusionPass\": \"off\"}}}");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_OK);
    for (int r = 0; r < AF_RULE_COUNT; r++) assert_int_equal(cfg.disabled[r], r != AF_RULE_CONV_BN_RELU);
}

static void test_switch_errors(void **state) {
    (void)state;
    af_fusion_config cfg, before;
    af_fusion_config_init(&cfg);
    af_error err;
    assert_int_equal(af_fusion_disable_list(&cfg, "ConvPoolFcFusionOp", "--disable_fusion", &err),
                     AF_OK);
    before = cfg;
    assert_int_equal(af_fusion_disable_list(&cfg, "ElementwiseFusionOp,NoSuchFusionOp",
                                            "--disable_fusion", &err),
                     AF_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "NoSuchFusionOp"));
    for (int r = 0; r < AF_RULE_COUNT; r++)
        assert_non_null(strstr(err.message, af_fusion_rule_name(r)));
    assert_memory_equal(&cfg, &before, sizeof cfg);
    const char *p = write_tmp("bad1.cfg", "ConvBNReluFusionOp:maybe\n");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_ERR_INVALID_ARG);
    p = write_tmp("bad2.cfg", "ConvBNReluFusionOp:off\nFooFusionOp:off\n");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "bad2.cfg:2"));
    p = write_tmp("bad3.json", "{\"Switch\": {\"GraphFusion\": {\"ALL\": \"off\",}}");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_ERR_PARSE);
    p = write_tmp("bad4.json", "{\"Switch\": {}}");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_ERR_PARSE);
    p = write_tmp("bad5.json", "{\"Switch\": {\"GraphFusion\": {\"ALL\": 0}}}");
    assert_int_equal(af_fusion_switch_file(&cfg, p, &err), AF_ERR_INVALID_ARG);
    assert_int_equal(af_fusion_switch_file(&cfg, "/nonexistent/sw.cfg", &err), AF_ERR_IO);
    assert_memory_equal(&cfg, &before, sizeof cfg);
    assert_int_equal(af_fusion_rule_find("MatMulBiasReluFusionOp"), AF_RULE_MATMUL_BIAS_ACT);
    assert_int_equal(af_fusion_rule_find("ALL"), -1);
}

static void test_switch_env(void **state) {
    (void)state;
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    af_error err;
    setenv("AUTOFUSION_DISABLE_LIST", "MatMulBiasReluFusionOp, ElementwiseFusionOp", 1);
    setenv("GE_FUSION_DISABLE_LIST", "ConvPoolFcFusionOp", 1);
    assert_int_equal(af_fusion_config_env(&cfg, &err), AF_OK);
    assert_true(cfg.disabled[AF_RULE_MATMUL_BIAS_ACT]);
    assert_true(cfg.disabled[AF_RULE_ELEMENTWISE]);
    assert_true(cfg.disabled[AF_RULE_CONV_POOL_FC]);
    assert_false(cfg.disabled[AF_RULE_CONV_BN_RELU]);
    assert_string_equal(cfg.disabled_by[AF_RULE_MATMUL_BIAS_ACT], "AUTOFUSION_DISABLE_LIST");
    assert_string_equal(cfg.disabled_by[AF_RULE_CONV_POOL_FC], "GE_FUSION_DISABLE_LIST");
    setenv("GE_FUSION_DISABLE_LIST", "Bogus", 1);
    assert_int_equal(af_fusion_config_env(&cfg, &err), AF_ERR_INVALID_ARG);
    unsetenv("AUTOFUSION_DISABLE_LIST");
    unsetenv("GE_FUSION_DISABLE_LIST");
    setenv("AUTOFUSION_FUSION_LOG", "0", 1);
    assert_false(af_fusion_log_requested());
    setenv("GE_GRAPH_FUSION_LOG", "1", 1);
    assert_true(af_fusion_log_requested());
    unsetenv("AUTOFUSION_FUSION_LOG");
    unsetenv("GE_GRAPH_FUSION_LOG");
}

/* A disabled rule does not fire and the report says why; with ALL off nothing changes. (With
 * ConvBNRelu alone off, BatchNormAct would take the BN and Relu.) */
static void test_disabled(void **state) {
    (void)state;
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    af_error err;
    assert_int_equal(af_fusion_disable_list(&cfg, "ConvBNReluFusionOp,BatchNormActFusionOp",
                                            "--disable_fusion", &err),
                     AF_OK);
    af_model *m = load("conv_bn_relu");
    af_fusion_report rep;
    af_fusion_report_init(&rep, "conv_bn_relu.onnx", af_machine_get());
    fuse(m, &cfg, &rep);
    assert_int_equal(count_fused(m->graph), 0);
    char *text = print_report(&rep);
    assert_non_null(strstr(text, "[AF]   Disabled: ConvBNReluFusionOp (--disable_fusion)"));
    free(text);
    af_fusion_report_free(&rep);
    af_model_free(m);

    const char *all[] = {"conv_pool_fc", "layernorm_matmul", "ew_chain", "squeeze_excite"};
    af_fusion_config_init(&cfg);
    assert_int_equal(af_fusion_disable_list(&cfg, "ALL", "--disable_fusion", &err), AF_OK);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        af_model *ref = load(all[i]);
        m = load(all[i]);
        fuse(m, &cfg, NULL);
        assert_int_equal(count_op(m->graph, AF_OP_COUNT), count_op(ref->graph, AF_OP_COUNT));
        same_outputs(all[i], ref->graph, m->graph);
        af_model_free(ref);
        af_model_free(m);
    }
}

/* ---- report ----------------------------------------------------------------------------------- */

static void test_report_text(void **state) {
    (void)state;
    af_model *m = load("conv_bn_relu");
    af_fusion_report rep;
    af_fusion_report_init(&rep, "conv_bn_relu.onnx", af_machine_get());
    fuse(m, NULL, &rep);
    char *text = print_report(&rep);
    const char *want[] = {"[AF] Graph Fusion Report: conv_bn_relu.onnx\n",
                          "[AF]   Pattern: ConvBNRelu ", "Matched: 1 ",
                          "Fused into: ConvBNReluFusionOp ", "Estimated speedup: ",
                          "[AF] Total operators before fusion: 3\n",
                          "[AF] Total operators after fusion: 1\n",
                          "[AF] Overall estimated speedup: "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) fail_msg("report lacks '%s':\n%s", want[i], text);
    assert_null(strstr(text, "Near misses"));
    free(text);
    af_fusion_report_free(&rep);
    af_model_free(m);

    m = load("nm_two_consumers");
    af_fusion_report_init(&rep, "nm.onnx", af_machine_get());
    fuse(m, NULL, &rep);
    text = print_report(&rep);
    if (!strstr(text, "Near misses: 1 (Conv conv_shared: output feeds 2 consumers)"))
        fail_msg("report lacks the near miss:\n%s", text);
    free(text);
    af_fusion_report_free(&rep);
    af_model_free(m);

    m = load("matmul_bias_relu");
    af_fusion_report_init(&rep, "mm.onnx", af_machine_get());
    fuse(m, NULL, &rep);
    text = print_report(&rep);
    if (!strstr(text, "Pattern: MatMulBiasRelu ") ||
        !strstr(text, "Fused into: MatMulBiasReluFusionOp "))
        fail_msg("report lacks the Relu variant:\n%s", text);
    free(text);
    af_fusion_report_free(&rep);
    af_model_free(m);
}

static json_t *get(json_t *o, const char *path) {
    char key[128];
    const char *full = path;
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = json_object_get(o, key);
        path += n + (path[n] == '.');
    }
    if (!o) fail_msg("JSON lacks %s", full);
    return o;
}

static void test_report_json(void **state) {
    (void)state;
    af_model *m = load("conv_bn_relu");
    af_fusion_report rep;
    af_fusion_report_init(&rep, "conv_bn_relu.onnx", af_machine_get());
    fuse(m, NULL, &rep);
    char path[512];
    snprintf(path, sizeof path, "%s/report.json", tmpdir);
    af_error err;
    assert_int_equal(af_fusion_report_write_json(&rep, path, &err), AF_OK);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    assert_string_equal(json_string_value(get(root, "model")), "conv_bn_relu.onnx");
    assert_int_equal(json_integer_value(get(root, "graph_fusion.ConvBNReluFusionOp.match_times")), 1);
    assert_int_equal(json_integer_value(get(root, "graph_fusion.ConvBNReluFusionOp.effect_times")), 1);
    assert_string_equal(json_string_value(get(root, "graph_fusion.ConvBNReluFusionOp.fused_into")),
                        "ConvBNReluFusionOp");
    assert_true(json_number_value(get(root, "graph_fusion.ConvBNReluFusionOp.estimated_speedup")) > 0);
    assert_int_equal(json_array_size(get(root, "graph_fusion.ConvBNReluFusionOp.near_misses")), 0);
    assert_true(json_is_false(get(root, "graph_fusion.ConvBNReluFusionOp.disabled")));
    assert_int_equal(json_integer_value(get(root, "graph_fusion.ElementwiseFusionOp.effect_times")), 0);
    assert_int_equal(json_integer_value(get(root, "ops_before")), 3);
    assert_int_equal(json_integer_value(get(root, "ops_after")), 1);
    assert_true(json_number_value(get(root, "overall_estimated_speedup")) > 0);
    assert_true(json_number_value(get(root, "machine.peak_gflops")) > 0);
    json_decref(root);
    af_fusion_report_free(&rep);
    af_model_free(m);

    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    assert_int_equal(af_fusion_disable_list(&cfg, "SqueezeExciteFusionOp", "--disable_fusion", &err),
                     AF_OK);
    m = load("nm_two_consumers");
    af_fusion_report_init(&rep, "nm.onnx", af_machine_get());
    fuse(m, &cfg, &rep);
    char *s = af_fusion_report_json(&rep);
    assert_non_null(s);
    root = json_loads(s, 0, &je);
    free(s);
    assert_non_null(root);
    json_t *nm = get(root, "graph_fusion.ConvBNReluFusionOp.near_misses");
    assert_int_equal(json_array_size(nm), 1);
    assert_string_equal(json_string_value(get(json_array_get(nm, 0), "node")), "conv_shared");
    assert_string_equal(json_string_value(get(json_array_get(nm, 0), "reason")),
                        "output feeds 2 consumers");
    assert_int_equal(json_integer_value(get(root, "graph_fusion.ConvBNReluFusionOp.match_times")), 1);
    assert_int_equal(json_integer_value(get(root, "graph_fusion.ConvBNReluFusionOp.effect_times")), 0);
    assert_true(json_is_true(get(root, "graph_fusion.SqueezeExciteFusionOp.disabled")));
    assert_string_equal(json_string_value(get(root, "graph_fusion.SqueezeExciteFusionOp.disabled_by")),
                        "--disable_fusion");
    json_decref(root);
    af_fusion_report_free(&rep);
    af_model_free(m);
}

static void test_list(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    af_fusion_list(f);
    fclose(f);
    for (int r = 0; r < AF_RULE_COUNT; r++) {
        assert_non_null(strstr(buf, af_fusion_rule_name(r)));
        assert_non_null(strstr(buf, af_fusion_rule_pattern(r)));
    }
    assert_non_null(strstr(buf, "MatMulBiasReluFusionOp"));
    free(buf);
}

/* ---- cost model ------------------------------------------------------------------------------- */

/* The records of the machine file at path marked as measured on a quiet machine, so that
 * they are read back whatever the load was while the tests measured them. */
static void mark_quiet(const char *path) {
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e), *rec;
    const char *isa;
    assert_non_null(root);
    json_object_foreach(root, isa, rec) {
        if (json_is_object(rec)) json_object_set_new(rec, "busy_cores", json_real(0.0));
    }
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
}

static void test_machine(void **state) {
    (void)state;
    char path[512], buf[512];
    snprintf(path, sizeof path, "%s/cache/machine.json", tmpdir);
    assert_string_equal(af_machine_path(buf, sizeof buf), getenv("AUTOFUSION_MACHINE_FILE"));
    af_machine a, b;
    af_error err;
    unlink(path);
    assert_int_equal(af_machine_calibrate(path, &a, &err), AF_OK);
    assert_true(a.flops > 1e8 && a.bandwidth > 1e8);
    assert_int_equal(access(path, R_OK), 0);
    mark_quiet(path);
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_true(fabs(a.flops - b.flops) <= 1e-6 * a.flops);
    assert_true(fabs(a.bandwidth - b.bandwidth) <= 1e-6 * a.bandwidth);
    assert_string_equal(a.isa, b.isa);
    /* Another ISA's record joins the file without evicting this one. */
    af_isa best = af_isa_get();
    af_isa_set(AF_ISA_GENERIC);
    af_machine gen;
    assert_int_equal(af_machine_calibrate(path, &gen, &err), AF_OK);
    assert_string_equal(gen.isa, "generic");
    mark_quiet(path);
    af_isa_set(best);
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_true(fabs(a.flops - b.flops) <= 1e-6 * a.flops); /* read back, not measured again */
    /* A record measured on a busy machine a while ago is measured again, keeping the best of
     * each figure; a quiet one, or a busy one measured within the minute, is read back. */
    const char *busy = "{\"version\": 10, \"%s\": {\"peak_gflops\": 0.5, \"gemm_gflops\": 0.5, "
                       "\"gemm_bf16_gflops\": 0, \"gemm_int8_gops\": 0, \"bandwidth_gbs\": 0.5, "
                       "\"l2_bandwidth_gbs\": 0.5, \"l3_bandwidth_gbs\": 0.5, \"l2_bytes\": 4096, "
                       "\"handoff_us\": 9000, \"wake_us\": 9000, \"busy_cores\": %s, "
                       "\"measurements\": 1, \"measured_at\": %.0f}}";
    char rec[1024];
    double recent = (double)time(NULL) - 5;
    snprintf(rec, sizeof rec, busy, a.isa, "1.5", 1e9);
    write_tmp("cache/machine.json", rec);
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_int_equal(b.measurements, 2);
    assert_true(b.flops > 1e9 && b.bandwidth > 1e9 && b.handoff_ns < 9e6 && b.wake_ns < 9e6);
    assert_true(b.busy_cores <= 1.5 && b.gemm_flops <= b.flops && b.measured_at > recent);
    snprintf(rec, sizeof rec, busy, a.isa, "0.1", 1e9);
    write_tmp("cache/machine.json", rec);
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_true(b.measurements == 1 && b.flops == 0.5e9 && b.handoff_ns == 9e6);
    snprintf(rec, sizeof rec, busy, a.isa, "1.5", recent);
    write_tmp("cache/machine.json", rec);
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_true(b.measurements == 1 && b.flops == 0.5e9);
    write_tmp("cache/machine.json", "{\"version\": 1, \"peak_gflops\": -3}");
    assert_int_equal(af_machine_calibrate(path, &b, &err), AF_OK);
    assert_true(b.flops > 1e8);
    /* Roofline: a big MatMul is compute-bound, a Relu memory-bound. */
    assert_true(af_cost_time(&a, 1e9, 1.0) > af_cost_time(&a, 1.0, 1.0));
    assert_true(af_cost_time(&a, 1.0, 1e9) > af_cost_time(&a, 1.0, 1.0));
}

/* Nodes of g (and its bodies) the dispatcher leaves on a reference kernel; the first in *first. */
static int reference_nodes(const af_graph *g, const af_node **first) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (af_kernel_choice(n, NULL) == AF_KERNEL_REFERENCE && !c++ && first && !*first) *first = n;
        for (int a = 0; a < n->nattrs; a++)
            if (n->attrs[a].g) c += reference_nodes(n->attrs[a].g, first);
    }
    return c;
}

/* --no_fusion runs the simplification too: the Identity nodes through which torch passes
 * deduplicated BatchNorm parameters fold away, the BatchNorms are lowered (scale and shift) and
 * no node is left on a reference kernel; nothing is fused; outputs as the imported graph's. */
static void test_no_fusion_simplifies(void **state) {
    (void)state;
    af_model *ref = load("bn_identity"), *m = load("bn_identity");
    assert_int_equal(count_op(m->graph, AF_OP_IDENTITY), 17);
    assert_int_equal(reference_nodes(m->graph, NULL), 6); /* 3 Conv, 3 BatchNormalization */
    af_options opt;
    af_options_init(&opt);
    opt.no_fusion = 1;
    af_compiled c;
    af_error err;
    if (af_compile(m->graph, "bn_identity", &opt, &c, &err)) fail_msg("%s", err.message);
    assert_false(c.fused);
    assert_int_equal(count_op(m->graph, AF_OP_IDENTITY), 0);
    if (af_isa_get() != AF_ISA_REFERENCE) {
        const af_node *slow = NULL;
        int n = reference_nodes(m->graph, &slow);
        if (n) fail_msg("%d nodes on reference kernels, e.g. %s (%s)", n, slow->name, slow->op_type);
        assert_int_equal(count_op(m->graph, AF_OP_BATCH_NORMALIZATION), 0);
        assert_int_equal(count_op(m->graph, AF_OP_FUSED_CONV), 3);
        assert_int_equal(count_op(m->graph, AF_OP_RELU), 3); /* not fused into the convs */
        assert_int_equal(count_fused(m->graph), 6);         /* 3 convs, 3 scale-and-shifts */
    }
    same_outputs("bn_identity", ref->graph, m->graph);
    af_compiled_free(&c);
    af_model_free(m);
    af_model_free(ref);
}

/* The dispatcher's kinds: a fast row, an op without one, an op that needs none, another dtype. */
static void test_kernel_choice(void **state) {
    (void)state;
    af_model *m = load("bn_identity");
    const af_node *relu = first_of(m->graph, AF_OP_RELU), *bn = first_of(m->graph, AF_OP_BATCH_NORMALIZATION),
                  *id = first_of(m->graph, AF_OP_IDENTITY);
    bool fast = af_isa_get() != AF_ISA_REFERENCE;
    assert_int_equal(af_kernel_choice(relu, NULL), fast ? AF_KERNEL_FAST : AF_KERNEL_REFERENCE);
    assert_int_equal(af_kernel_choice(bn, NULL), AF_KERNEL_REFERENCE);
    assert_int_equal(af_kernel_choice(id, NULL), AF_KERNEL_DIRECT);
    af_tensor i64 = {.dtype = AF_DTYPE_INT64, .rank = 1, .dims = {4}};
    const af_tensor *types[1] = {&i64};
    assert_int_equal(af_kernel_choice(relu, types), AF_KERNEL_REFERENCE);
    assert_string_equal(af_kernel_kind_name(AF_KERNEL_FAST), "fast");
    assert_string_equal(af_kernel_kind_name(AF_KERNEL_REFERENCE), "reference");
    assert_string_equal(af_kernel_kind_name(AF_KERNEL_DIRECT), "direct");
    /* what ran: the Relu's fast kernel, or the reference one when it declines (int64 data) */
    int64_t dims[1] = {4};
    af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 1, dims), *xi = af_tensor_new(AF_DTYPE_INT64, 1, dims);
    af_tensor out = {0};
    af_kernel_kind ran = AF_KERNEL_DIRECT;
    af_error err;
    const af_tensor *in[1] = {x};
    assert_int_equal(af_kernel_shape(relu, in, &out, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    assert_int_equal(af_kernel_run_kind(relu, in, &out, NULL, &ran, &err), AF_OK);
    assert_int_equal(ran, fast ? AF_KERNEL_FAST : AF_KERNEL_REFERENCE);
    af_tensor_release(&out);
    in[0] = xi;
    memset(&out, 0, sizeof out);
    assert_int_equal(af_kernel_shape(relu, in, &out, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(&out, &err), AF_OK);
    assert_int_equal(af_kernel_run_kind(relu, in, &out, NULL, &ran, &err), AF_OK);
    assert_int_equal(ran, AF_KERNEL_REFERENCE);
    af_tensor_release(&out);
    af_tensor_free(x);
    af_tensor_free(xi);
    af_model_free(m);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void) {
    tu_rng = 99;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/af_test_fusion_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char mf[512];
    snprintf(mf, sizeof mf, "%s/cache/machine.json", tmpdir);
    setenv("AUTOFUSION_MACHINE_FILE", mf, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_positive),        cmocka_unit_test(test_conv_epilogue),
        cmocka_unit_test(test_rmsnorm_prologue),
        cmocka_unit_test(test_near_misses),     cmocka_unit_test(test_switch_file_lines),
        cmocka_unit_test(test_quant),           cmocka_unit_test(test_quant_misses),
        cmocka_unit_test(test_quant_ms),        cmocka_unit_test(test_fq_share),
        cmocka_unit_test(test_switch_file_json), cmocka_unit_test(test_switch_errors),
        cmocka_unit_test(test_switch_env),      cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_report_text),     cmocka_unit_test(test_report_json),
        cmocka_unit_test(test_list),            cmocka_unit_test(test_machine),
        cmocka_unit_test(test_no_fusion_simplifies), cmocka_unit_test(test_kernel_choice),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    return rc;
}
