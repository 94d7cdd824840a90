/* Precision (--precision_mode): which ops of the lowered graph compute in bfloat16 or read
 * half-precision data, decided once per op and written on it as attributes, so the packing pass
 * stores its weights in that type, the kernels convert its activation input once per run, the
 * report lists it and the .afm keeps it:
 *   "precision"      STRING fp32 | bf16 | fp16
 *   "precision_why"  STRING why an op that could not follow the mode stays fp32
 *   "prologue_fp32"  INT    1: the op's sensitive prologue (LayerNorm) reads float32 A
 *
 * What can go low: the GEMM cores, FusedMatMul with constant 2-D weights and channels-last
 * FusedConv; everything else runs float32 in every mode and says why. mixed is bf16 for those
 * cores with the precision-sensitive part of a fused op (rules.def's precision column) kept in
 * float32; bf16 and fp16 round the op's input first. --keep_fp32 names fusion rules, node names
 * (a fused node's own or any it replaced) or op types (FusedConv) that stay float32.
 *
 * Invariant: without a precision mode, or in fp32, the graph is not touched. */
#include "fusion/fusion.h"
#include "fusion/rule.h"
#include "kernels/simd/cpu.h"
#include "lower/lower.h"
#include "passes/rewrite.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    af_precision mode;
} modes[] = {
    {"fp32", AF_PREC_FP32},
    {"bf16", AF_PREC_BF16},
    {"fp16", AF_PREC_FP16},
    {"mixed", AF_PREC_MIXED},
    {"int8", AF_PREC_INT8},
    /* ATC's names for the same things. */
    {"force_fp32", AF_PREC_FP32},
    {"must_keep_origin_dtype", AF_PREC_FP32},
    {"force_fp16", AF_PREC_FP16},
    {"allow_fp32_to_fp16", AF_PREC_FP16},
    {"allow_mix_precision", AF_PREC_MIXED},
    {"allow_mix_precision_bf16", AF_PREC_MIXED},
};

int af_precision_parse(const char *name) {
    for (size_t i = 0; name && i < AF_COUNT(modes); i++)
        if (!strcmp(name, modes[i].name)) return (int)modes[i].mode;
    return -1;
}

const char *af_precision_name(af_precision p) {
    return (unsigned)p <= AF_PREC_INT8 ? modes[p].name : "?";
}

bool af_precision_supported(af_precision p, const char **why) {
    if ((p == AF_PREC_BF16 || p == AF_PREC_MIXED) && !af_cpu_amx() && !af_cpu_bf16()) {
        *why = "this CPU has neither AMX-BF16 nor AVX512_BF16: bfloat16 falls back to fp32";
        return false;
    }
    return true;
}

/* Does `name` (one entry of --keep_fp32) name node n: one of its rules, its own name, a node it
 * replaced, or its op? */
static bool names_node(const af_node *n, const char *name, size_t len) {
    const af_attr *fn = af_node_attr(n, "fused_nodes");
    const char *rules = af_attr_str(n, "fusion_rule", NULL);
    if (strlen(n->name) == len && !strncmp(n->name, name, len)) return true;
    if (strlen(af_ops[n->op].name) == len && !strncmp(af_ops[n->op].name, name, len)) return true;
    for (int i = 0; fn && fn->type == AF_ATTR_STRINGS && i < fn->n; i++)
        if (fn->strings[i] && strlen(fn->strings[i]) == len && !strncmp(fn->strings[i], name, len))
            return true;
    for (const char *r = rules; r && *r;) {
        size_t l = strcspn(r, ",");
        if (l == len && !strncmp(r, name, len)) return true;
        /* a rule's alias (MatMulBiasReluFusionOp) names the same rule */
        char buf[128];
        if (len < sizeof buf) {
            memcpy(buf, name, len);
            buf[len] = '\0';
            int id = af_fusion_rule_find(buf);
            if (id >= 0 && strlen(af_fusion_rule_name(id)) == l &&
                !strncmp(af_fusion_rule_name(id), r, l))
                return true;
        }
        r += l + (r[l] == ',');
    }
    return false;
}

/* Is n kept in float32 by the list? */
static bool kept(const af_node *n, const char *list) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, ", ");
        size_t l = strcspn(p, ",");
        while (l && p[l - 1] == ' ') l--;
        if (l && names_node(n, p, l)) return true;
        p += strcspn(p, ",");
    }
    return false;
}

/* Does a node of g or of a body nested in g carry the name? */
static bool graph_names(const af_graph *g, const char *name, size_t len) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_graph *sub;
        if (names_node(g->nodes[i], name, len)) return true;
        for (int k = 0; (sub = pass_subgraph(g->nodes[i], k)); k++)
            if (graph_names(sub, name, len)) return true;
    }
    return false;
}

/* Every name of the list names something in g, else AF_ERR_INVALID_ARG naming it. */
static af_status check_keep(const af_graph *g, const char *list, af_error *err) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, ", ");
        size_t l = strcspn(p, ",");
        while (l && p[l - 1] == ' ') l--;
        char buf[128];
        bool found = l == 0;
        if (!found && l < sizeof buf) { /* a rule, even one that did not fire here */
            memcpy(buf, p, l);
            buf[l] = '\0';
            found = af_fusion_rule_find(buf) >= 0;
        }
        if (!found) found = graph_names(g, p, l);
        if (!found)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "%s: --keep_fp32 entry '%.*s' names no fusion rule, node or op of the "
                           "model", g->file ? g->file : "model", (int)l, p);
        p += strcspn(p, ",");
    }
    return AF_OK;
}

/* NULL when n's core can compute in low precision, else why not (n is one of the ops the
 * report lists); AF_NO_MATCH for ops that are not reported at all. */
static const char *low_precision_blocker(const af_node *n) {
    switch (n->op) {
    case AF_OP_FUSED_MATMUL: {
        const af_value *b = n->nin > 1 ? n->in[1] : NULL;
        if (!b || !af_value_is_const(b) || !af_value_is_f32(b) || b->type.rank != 2)
            return "B is not a constant matrix (a product of two activations runs fp32)";
        if (af_attr_int(n, "trans_a", 0)) return "A is transposed";
        return NULL;
    }
    case AF_OP_FUSED_CONV:
        if (!af_attr_int(n, "channels_last", 0)) return "not a 2-D convolution";
        if (af_attr_int(n, "transposed", 0)) return "transposed convolution runs fp32";
        return NULL; /* the packing pass may still refuse (depthwise, groups) */
    case AF_OP_FUSED_ATTENTION: return "attention runs fp32 (its softmax is precision-sensitive)";
    case AF_OP_SQUEEZE_EXCITE: return "squeeze-excite runs fp32 (a reduction and a gate)";
    case AF_OP_CONV_POOL_FC: return "the classification head runs fp32";
    case AF_OP_FUSED_ELEMENTWISE: return "elementwise ops run fp32";
    default:
        return af_node_attr(n, "fusion_rule") ? "runs fp32" : AF_NO_MATCH;
    }
}

/* A sensitive rule among those that built n (rules.def's precision column). */
static bool has_sensitive_rule(const af_node *n) {
    for (const char *r = af_attr_str(n, "fusion_rule", NULL); r && *r;) {
        size_t l = strcspn(r, ",");
        char buf[128];
        if (l < sizeof buf) {
            memcpy(buf, r, l);
            buf[l] = '\0';
            int id = af_fusion_rule_find(buf);
            if (id >= 0 && af_fusion_rule_precision(id)) return true;
        }
        r += l + (r[l] == ',');
    }
    return false;
}

/* bfloat16 pays only where its GEMM runs well above float32's: each bf16 op also converts its
 * activation input once per run and rounds it. AMX runs 4-8x fp32 and passes; AVX512_BF16
 * without AMX measured 0.5x on Sapphire Rapids (its dot product issues at half the FMA rate),
 * where bf16 made ResNet-50 2x slower. Hence at least 1.2x the calibrated fp32 rate. */
#define BF16_MIN_GAIN 1.2

/* NULL when bf16 (mode bf16 or mixed) may run on this machine, else why not (in buf). */
static const char *bf16_blocker(const af_precision_cfg *cfg, char *buf, size_t len) {
    const char *why = NULL;
    if (!af_precision_supported(cfg->mode, &why)) return why;
    if (cfg->mode == AF_PREC_FP16 || !(cfg->gemm_flops > 0) ||
        cfg->gemm_bf16_flops >= BF16_MIN_GAIN * cfg->gemm_flops)
        return NULL;
    snprintf(buf, len, "bf16 GEMMs run at %.0f GFLOP/s on this CPU, fp32 at %.0f (%s): fp32 is "
             "faster", cfg->gemm_bf16_flops / 1e9, cfg->gemm_flops / 1e9,
             af_cpu_amx() ? "AMX" : "no AMX");
    return buf;
}

/* Mark the cores of g and of the bodies nested in it. */
static af_status mark_graph(af_graph *g, const af_precision_cfg *cfg, af_error *err) {
    char buf[160];
    const char *unsupported = bf16_blocker(cfg, buf, sizeof buf);
    bool ok = !unsupported;
    const char *low = cfg->mode == AF_PREC_FP16 ? "fp16" : "bf16";
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i];
        af_graph *sub;
        for (int k = 0; (sub = pass_subgraph(n, k)); k++) {
            af_status st = mark_graph(sub, cfg, err);
            if (st) return st;
        }
        /* int8.c decided quantized cores (int8, or float32 with its reason): the mode leaves
         * them as they are */
        if (!strcmp(af_attr_str(n, "precision", ""), "int8") ||
            !strncmp(af_attr_str(n, "precision_why", ""), "int8:", 5))
            continue;
        const char *why = low_precision_blocker(n);
        if (why == AF_NO_MATCH) continue;
        if (!why && kept(n, cfg->keep_fp32)) why = "--keep_fp32";
        if (!why && !ok) why = unsupported;
        bool sensitive = cfg->mode == AF_PREC_MIXED && has_sensitive_rule(n);
        if (!af_node_set_str(n, "precision", why ? "fp32" : low) ||
            (why && !af_node_set_str(n, "precision_why", why)) ||
            (!why && sensitive && !af_node_set_int(n, "prologue_fp32", 1)))
            return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    }
    return AF_OK;
}

af_status af_pass_precision(af_graph *g, const af_precision_cfg *cfg, af_error *err) {
    /* int8: the quantize pass decided before fusion (passes/quantize.c); the cores stay fp32 */
    if (!cfg || cfg->mode == AF_PREC_FP32 || cfg->mode == AF_PREC_INT8) return AF_OK;
    af_status st = check_keep(g, cfg->keep_fp32, err);
    return st ? st : mark_graph(g, cfg, err);
}
