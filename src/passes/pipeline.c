/* The optimisation pipeline: the order of the passes, in one function. After every pass the IR
 * invariants are checked in debug builds, so a pass that breaks them is caught where it ran. */
#include "fusion/fusion.h"
#include "kernels/simd/cpu.h"
#include "passes/passes.h"

typedef struct pass {
    const char *name;
    af_status (*run)(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep, af_error *err);
} pass;

static af_status simplify(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                          af_error *err) {
    (void)cfg, (void)rep;
    return af_pass_simplify(g, err);
}

static af_status canonicalize(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                              af_error *err) {
    (void)cfg, (void)rep;
    return af_pass_canonicalize(g, err);
}

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

af_status af_optimize(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                      af_error *err) {
    static const pass passes[] = {
        {"simplify", simplify},         /* folding (shape subgraphs too), Identity, dead code */
        {"canonicalize", canonicalize}, /* LayerNorm, Gelu, Silu, HardSwish in one form each */
        {"fuse", af_fuse},              /* the rule table (src/fusion/rules.def) */
        {"simplify", simplify},         /* what fusion left dead */
    };
    if (rep && !rep->ops_before) rep->ops_before = count_nodes(g);
    for (size_t i = 0; i < AF_COUNT(passes); i++) {
        af_status st = passes[i].run(g, cfg, rep, err);
#ifndef NDEBUG
        if (!st) st = af_graph_verify(g, err);
#endif
        if (st) return st;
    }
    if (rep) rep->ops_after = count_nodes(g);
    return AF_OK;
}

af_status af_lower_precision(af_graph *g, const af_precision_cfg *prec, af_error *err) {
    static const struct {
        const char *name;
        af_status (*run)(af_graph *g, af_error *err); /* NULL: the precision pass, which reads prec */
    } passes[] = {
        {"lower", af_pass_lower},       /* Conv/MatMul/Gemm cores, BatchNorm scale-and-shift */
        {"layout", af_pass_layout},     /* channels-last convolution regions */
        {"simplify", af_pass_simplify}, /* the reorders nobody reads */
        {"precision", NULL},            /* which cores run bf16 / fp16 (--precision_mode) */
        {"pack", af_pass_pack},         /* weights in GEMM panel order; SE gates into 1x1 convs */
    };
    if (af_isa_get() == AF_ISA_REFERENCE) return AF_OK;
    for (size_t i = 0; i < AF_COUNT(passes); i++) {
        af_status st = passes[i].run ? passes[i].run(g, err) : af_pass_precision(g, prec, err);
#ifndef NDEBUG
        if (!st) st = af_graph_verify(g, err);
#endif
        if (st) return st;
    }
    return AF_OK;
}

af_status af_lower(af_graph *g, af_error *err) {
    return af_lower_precision(g, NULL, err);
}
