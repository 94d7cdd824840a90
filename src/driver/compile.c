/* The compile driver (compile.h): the order of the stages, in af_compile's table. After every
 * stage the IR invariants are checked in debug builds, so a pass that breaks them is caught
 * where it ran. */
#include "driver/compile.h"
#include "kernels/simd/cpu.h"
#include "passes/passes.h"
#include "runtime/machine.h"

#include <string.h>

/* Where a stage belongs: the simplification (fused or not: the unfused baseline of --no_fusion
 * and `bench --compare` folds and drops copies as the fused graph does, so that the two differ
 * by fusion alone), the fusion (skipped with no_fusion), the lowering (skipped with no_lower and
 * under AUTOFUSION_ISA=reference), or always. Canonicalize belongs to the fusion: it turns
 * several nodes into one op (a LayerNorm from seven), which is what a fusion does; the nodes it
 * replaces each run on a fast kernel (docs/design.md, section 7). */
typedef enum stage_group { ALWAYS, SIMPLIFY, QUANT, FUSE, LOWER } stage_group;

typedef struct stage_ctx {
    const af_fusion_config *fusion;
    af_fusion_report *rep; /* NULL: no report */
    const af_precision_cfg *prec;
    bool fusing; /* the fusion stages run (af_optimize) */
    const af_quant_table *quant; /* int8: the calibrated ranges (NULL: no quantization) */
    const char *keep_fp32;
    af_quant_result *qres; /* what the quantize stage decided */
} stage_ctx;

typedef struct stage {
    const char *name;
    stage_group group;
    af_status (*run)(af_graph *g, const stage_ctx *c, af_error *err);
} stage;

static af_status shapes(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_graph_infer_shapes(g, err);
}

static af_status simplify(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_simplify(g, err);
}

/* The first simplify: when the int8 rule will run, the DequantizeLinear of 8-bit weights stays
 * for it (passes/fold.c); the simplify after fusion folds what it left. */
static af_status simplify_first(af_graph *g, const stage_ctx *c, af_error *err) {
    bool keep = c->fusion ? !c->fusion->disabled[AF_RULE_QUANT_CONV_MATMUL] : c->fusing;
    return af_pass_simplify_ex(g, keep, err);
}

static af_status quantize(af_graph *g, const stage_ctx *c, af_error *err) {
    if (!c->quant) return AF_OK;
    return af_pass_quantize(g, c->quant, c->keep_fp32, c->qres, err);
}

static af_status canonicalize(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_canonicalize(g, err);
}

static af_status fuse(af_graph *g, const stage_ctx *c, af_error *err) {
    return af_fuse(g, c->fusion, c->rep, err);
}

static af_status lower(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_lower(g, err);
}

static af_status int8(af_graph *g, const stage_ctx *c, af_error *err) {
    return af_pass_int8(g, c->prec, err);
}

static af_status layout(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_layout(g, err);
}

static af_status precision(af_graph *g, const stage_ctx *c, af_error *err) {
    return af_pass_precision(g, c->prec, err);
}

static af_status pack(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_pack(g, err);
}

static af_status codes(af_graph *g, const stage_ctx *c, af_error *err) {
    (void)c;
    return af_pass_codes(g, err);
}

/* THE order. The plan of the final graph comes last (af_compile). */
static const stage stages[] = {
    {"shapes", ALWAYS, shapes},             /* types of every value, from the model's inputs */
    {"simplify", SIMPLIFY, simplify_first}, /* folding (shape subgraphs too), Identity, dead code */
    {"quantize", QUANT, quantize},          /* int8: QDQ form from the calibrated ranges */
    {"canonicalize", FUSE, canonicalize},   /* LayerNorm, Gelu, Silu, HardSwish in one form each */
    {"fuse", FUSE, fuse},                   /* the rule table (fusion/rules.def) */
    {"simplify", FUSE, simplify},           /* what fusion left dead */
    {"lower", LOWER, lower},                /* Conv/MatMul/Gemm cores, BatchNorm scale-and-shift */
    {"int8", LOWER, int8},                  /* int8-form cores: U8S8 GEMM or back to float32 */
    {"layout", LOWER, layout},              /* channels-last convolution regions */
    {"simplify", LOWER, simplify},          /* the reorders nobody reads */
    {"precision", LOWER, precision},        /* which cores run bf16 / fp16 (--precision_mode) */
    {"pack", LOWER, pack},                  /* weights in GEMM panel order; SE gates into 1x1 convs */
    {"codes", LOWER, codes},                /* uint8 activations between int8 convs */
};

/* Nodes of g and of every subgraph. */
static int count_nodes(const af_graph *g) {
    int n = g->nnodes;
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i]->nattrs; a++) {
            const af_attr *at = &g->nodes[i]->attrs[a];
            if (at->g) n += count_nodes(at->g);
            for (int k = 0; at->graphs && k < at->n; k++) n += count_nodes(at->graphs[k]);
        }
    return n;
}

/* Run the stages of the groups in `groups` (a mask of 1 << group) in table order. */
static af_status run_groups(af_graph *g, unsigned groups, const stage_ctx *c, af_error *err) {
    for (size_t i = 0; i < AF_COUNT(stages); i++) {
        if (!(groups >> stages[i].group & 1)) continue;
        af_status st = stages[i].run(g, c, err);
#ifndef NDEBUG
        if (!st) st = af_graph_verify(g, err);
#endif
        if (st) return st;
    }
    return AF_OK;
}

af_status af_optimize(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                      af_error *err) {
    stage_ctx c = {.fusion = cfg, .rep = rep, .fusing = true};
    if (rep && !rep->ops_before) rep->ops_before = count_nodes(g);
    af_status st = run_groups(g, 1u << SIMPLIFY | 1u << FUSE, &c, err);
    if (!st && rep) rep->ops_after = count_nodes(g);
    return st;
}

af_status af_simplify(af_graph *g, af_error *err) {
    stage_ctx c = {0};
    return run_groups(g, 1u << SIMPLIFY, &c, err);
}

af_status af_lower(af_graph *g, const af_precision_cfg *prec, af_error *err) {
    stage_ctx c = {.prec = prec};
    if (af_isa_get() == AF_ISA_REFERENCE) return AF_OK;
    return run_groups(g, 1u << LOWER, &c, err);
}

static af_value *find_input(const af_graph *g, const char *name) {
    for (int i = 0; i < g->ninputs; i++)
        if (!strcmp(g->inputs[i]->name, name)) return g->inputs[i];
    return NULL;
}

/* Apply "name:1,3,224,224;name2:4,5" to the graph inputs' declared dims. */
af_status af_apply_input_shape(af_graph *g, const char *spec, af_error *err) {
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (p[i] == ':') colon = p + i;
        if (!colon)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "--input_shape: '%.*s' is not name:d1,d2,...", (int)len, p);
        char name[256];
        size_t nlen = (size_t)(colon - p);
        if (nlen >= sizeof name) return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: name too long");
        memcpy(name, p, nlen);
        name[nlen] = 0;
        af_value *v = find_input(g, name);
        if (!v) return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: the model has no input '%s'", name);
        int64_t dims[AF_MAX_RANK];
        int rank = 0;
        const char *q = colon + 1, *stop = p + len;
        while (q < stop) {
            char *e;
            long long d = strtoll(q, &e, 10);
            if (e == q || e > stop || d < 0 || rank == AF_MAX_RANK)
                return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: bad dims for '%s'", name);
            dims[rank++] = d;
            q = e;
            if (q < stop && *q == ',') q++;
        }
        if (v->type.rank >= 0 && v->type.rank != rank)
            return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: '%s' has rank %d, not %d",
                           name, v->type.rank, rank);
        for (int i = 0; i < rank; i++)
            if (v->type.rank >= 0 && v->type.dims[i] >= 0 && v->type.dims[i] != dims[i])
                return af_fail(err, AF_ERR_INVALID_ARG,
                               "--input_shape: dim %d of '%s' is fixed to %lld by the model", i,
                               name, (long long)v->type.dims[i]);
        v->type.rank = rank;
        memcpy(v->type.dims, dims, sizeof(int64_t) * (size_t)rank);
        p = end ? end + 1 : p + len;
    }
    return af_graph_infer_shapes(g, err);
}

/* The switches in force: --fusion_switch_file, then the environment, then --disable_fusion. */
static af_status fusion_config(const af_options *o, af_fusion_config *cfg, af_error *err) {
    af_fusion_config_init(cfg);
    af_status st = AF_OK;
    if (o->fusion_switch_file) st = af_fusion_switch_file(cfg, o->fusion_switch_file, err);
    if (!st) st = af_fusion_config_env(cfg, err);
    if (!st && o->disable_fusion)
        st = af_fusion_disable_list(cfg, o->disable_fusion, "--disable_fusion", err);
    return st;
}

/* --precision_mode as a configuration for the lowering. */
static af_status precision_config(const af_options *o, const char *file, af_precision_cfg *pc,
                                  af_error *err) {
    pc->mode = AF_PREC_FP32;
    pc->keep_fp32 = o->keep_fp32;
    if (!o->precision_mode) return AF_OK;
    int m = af_precision_parse(o->precision_mode);
    if (m < 0)
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: unknown precision mode '%s': fp32, bf16, fp16, mixed or int8 (ATC's "
                       "force_fp32, must_keep_origin_dtype, force_fp16, allow_fp32_to_fp16, "
                       "allow_mix_precision, allow_mix_precision_bf16 also work)",
                       file, o->precision_mode);
    pc->mode = (af_precision)m;
    if (pc->mode == AF_PREC_BF16 || pc->mode == AF_PREC_MIXED) { /* does bf16 pay here? */
        const af_machine *mach = af_machine_get();
        pc->gemm_flops = mach->gemm_flops;
        pc->gemm_bf16_flops = mach->gemm_bf16_flops;
    }
    return AF_OK;
}

/* Appends to *live the data of every constant g and its subgraphs still use: read by a node, or
 * a graph input or output (what the .afm writer keeps). false when out of memory. */
static bool live_data(const af_graph *g, const void ***live, int *n, int *cap) {
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        if (!v->is_const || !v->type.data || !(v->nuses || v->is_input || v->is_output)) continue;
        if (*n == *cap) {
            const void **more = af_realloc(*live, (size_t)(*cap = 2 * *cap + 64) * sizeof **live);
            if (!more) return false;
            *live = more;
        }
        (*live)[(*n)++] = v->type.data;
    }
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i]->nattrs; a++) {
            const af_attr *at = &g->nodes[i]->attrs[a];
            if (at->g && !live_data(at->g, live, n, cap)) return false;
            for (int k = 0; at->graphs && k < at->n; k++)
                if (!live_data(at->graphs[k], live, n, cap)) return false;
        }
    return true;
}

/* Give back the data of the constants the passes replaced (weights before BatchNorm folding,
 * before packing...), so that a compiled session holds one copy of its weights. */
static af_status sweep_constants(af_graph *g, af_error *err) {
    const void **live = NULL;
    int n = 0, cap = 0;
    bool ok = live_data(g, &live, &n, &cap);
    if (ok && af_arena_sweep_data(g->arena, live, (size_t)n)) af_heap_trim();
    af_free(live);
    return ok ? AF_OK : af_fail(err, AF_ERR_NOMEM, "%s: out of memory", g->file ? g->file : "<model>");
}

/* The report's precision section under int8: the quantize stage's decisions. */
static af_status report_int8(af_fusion_report *r, const af_quant_table *t,
                             const af_quant_result *q, af_error *err) {
    char note[256];
    snprintf(note, sizeof note,
             "calibrated on %d sample%s (%s); activations uint8 per tensor, weights int8 per %s%s; "
             "every other op float32", t->samples, t->samples == 1 ? "" : "s", t->method,
             q->per_tensor_weights ? "tensor (opset < 13)" : "output channel",
             t->weight_max == 63 ? " within +-63 (7 bits: without AVX512_VNNI the int8 products "
                                   "are exact only so)" : "");
    af_status st = af_fusion_report_precision(r, NULL, "int8", note, err);
    for (int i = 0; i < q->n && !st; i++)
        st = af_fusion_report_add_precision(r, q->e[i].node, q->e[i].op, "",
                                            q->e[i].int8 ? "int8" : "fp32", q->e[i].why, err);
    return st;
}

af_status af_compile(af_graph *g, const char *file, const af_options *opt, af_compiled *out,
                     af_error *err) {
    return af_compile_with(g, file, opt, NULL, out, err);
}

af_status af_compile_with(af_graph *g, const char *file, const af_options *opt,
                          const af_quant_table *calib, af_compiled *out, af_error *err) {
    af_fusion_config cfg;
    af_precision_cfg pc = {.mode = AF_PREC_FP32};
    af_quant_result qres = {0};
    memset(out, 0, sizeof *out);
    bool int8 = opt->precision_mode && af_precision_parse(opt->precision_mode) == AF_PREC_INT8;
    if (int8 && !calib)
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: --precision_mode=int8 needs --calibration_data=DIR", file);
    /* as ATC does with inconsistent options: refuse calibration that nothing would use */
    if (!int8 && ((opt->calibration_data && *opt->calibration_data) ||
                  (opt->calibration_method && *opt->calibration_method)))
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: --calibration_data and --calibration_method are for "
                       "--precision_mode=int8 (the mode here is %s)", file,
                       opt->precision_mode && *opt->precision_mode ? opt->precision_mode : "fp32");
    stage_ctx qc = {.quant = int8 ? calib : NULL, .keep_fp32 = opt->keep_fp32, .qres = &qres};
    /* float16/bfloat16 computed in float32 (passes/widen.c), then the types of every value;
     * the report counts the model's nodes, not the casts widening adds at its edges */
    int model_nodes = count_nodes(g);
    bool quantized = int8 || af_graph_is_quantized(g); /* the report's quantization section */
    af_status st = af_pass_widen_halves(g, err);
    if (!st) st = opt->input_shape ? af_apply_input_shape(g, opt->input_shape, err)
                                   : af_graph_infer_shapes(g, err);
#ifndef NDEBUG
    /* Debug builds check the IR's invariants after every stage that builds or changes it. */
    if (!st) st = af_graph_verify(g, err);
#endif
    if (!st && !opt->no_fusion) st = fusion_config(opt, &cfg, err);
    if (!st && !opt->no_fusion) {
        af_fusion_report_init(&out->report, file, af_machine_get());
        out->report.ops_before = model_nodes;
        out->fused = true;
        qc.fusion = &cfg;
        qc.rep = &out->report;
        st = run_groups(g, 1u << SIMPLIFY | 1u << QUANT | 1u << FUSE, &qc, err);
        if (!st) out->report.ops_after = count_nodes(g);
    } else if (!st) {
        /* the unfused baseline: everything but the fusion */
        st = run_groups(g, 1u << SIMPLIFY | 1u << QUANT, &qc, err);
    }
    /* Fused or not, the graph then runs on the fast kernels. */
    if (!st && !opt->no_lower) st = precision_config(opt, file, &pc, err);
    bool quant = !st && af_graph_has_quant(g);
    if (!st && !opt->no_lower && quant) { /* does int8 pay here? */
        const af_machine *mach = af_machine_get();
        pc.gemm_flops = mach->gemm_flops;
        pc.gemm_int8_ops = mach->gemm_int8_ops;
    }
    if (!st && !opt->no_lower) st = af_lower(g, &pc, err);
    out->precision = int8 ? "int8" : af_precision_name(pc.mode);
    /* the report lists each core's precision: our int8 (with the calibration it came from), a
     * low-precision mode, or a model quantized in its file (int8 ops, and the ones left in
     * float32 with why) */
    if (!st && out->fused && int8) st = report_int8(&out->report, calib, &qres, err);
    else if (!st && !opt->no_lower && out->fused && (pc.mode != AF_PREC_FP32 || quant)) {
        const char *note = NULL;
        af_precision_supported(pc.mode, &note);
        st = af_fusion_report_precision(&out->report, g, out->precision, note, err);
    }
    af_quant_result_free(&qres);
    if (!st && out->fused && quantized) st = af_fusion_report_quant(&out->report, g, err);
    if (!st) st = af_plan_build(g, &out->plan, err);
    if (!st) st = sweep_constants(g, err);
    if (st) af_compiled_free(out);
    return st;
}

void af_compiled_free(af_compiled *c) {
    if (c->fused) af_fusion_report_free(&c->report);
    af_plan_free(c->plan);
    memset(c, 0, sizeof *c);
}
