/* The fusion report, as text in the seed's shape and as JSON (ATC's fusion_result.json keys
 * match_times/effect_times per pattern, plus ours), and the rule listing of --list-fusions.
 *
 * Invariant: a report owns every string it points to except the static rule names and reasons,
 * so it outlives the model it describes. */
#include "fusion/fusion.h"
#include "passes/rewrite.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void af_fusion_report_init(af_fusion_report *r, const char *model, const af_machine *m) {
    memset(r, 0, sizeof *r);
    r->machine = *m;
    af_fusion_config_init(&r->cfg);
    if (model) {
        size_t n = strlen(model);
        r->model = af_malloc(n + 1);
        if (r->model) memcpy(r->model, model, n + 1);
    }
}

static char *dup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *d = af_malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

void af_fusion_report_free(af_fusion_report *r) {
    for (int i = 0; i < r->nmisses; i++) {
        af_free(r->misses[i].node);
        af_free(r->misses[i].op_type);
    }
    af_free(r->misses);
    for (int i = 0; i < r->nprec; i++) {
        af_precision_entry *e = &r->prec[i];
        af_free(e->node), af_free(e->op), af_free(e->rules), af_free(e->precision), af_free(e->why);
    }
    af_free(r->prec);
    for (int i = 0; i < r->nqfloat; i++)
        af_free(r->qfloat[i].node), af_free(r->qfloat[i].op), af_free(r->qfloat[i].why);
    af_free(r->qfloat);
    af_free(r->qother);
    af_free(r->precision_mode);
    af_free(r->precision_note);
    af_free(r->model);
    memset(r, 0, sizeof *r);
}

/* The precision entries of g's nodes and of the bodies nested in them, in node order. */
static af_status precision_entries(af_fusion_report *r, const af_graph *g, af_error *err) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        const af_graph *sub;
        for (int k = 0; (sub = pass_subgraph(n, k)); k++) {
            af_status st = precision_entries(r, sub, err);
            if (st) return st;
        }
        const char *prec = af_attr_str(n, "precision", NULL);
        if (!prec) continue;
        af_precision_entry *e = af_realloc(r->prec, sizeof *e * (size_t)(r->nprec + 1));
        if (!e) return af_fail(err, AF_ERR_NOMEM, "out of memory");
        r->prec = e;
        e = &r->prec[r->nprec];
        memset(e, 0, sizeof *e);
        e->node = dup(n->name);
        e->op = dup(af_ops[n->op].name);
        e->rules = dup(af_attr_str(n, "fusion_rule", ""));
        e->precision = dup(prec);
        e->why = dup(af_attr_str(n, "precision_why", NULL));
        e->prologue_fp32 = af_attr_int(n, "prologue_fp32", 0) != 0;
        r->nprec++;
        if (!e->node || !e->op || !e->rules || !e->precision ||
            (af_attr_str(n, "precision_why", NULL) && !e->why))
            return af_fail(err, AF_ERR_NOMEM, "out of memory");
    }
    return AF_OK;
}

af_status af_fusion_report_precision(af_fusion_report *r, const af_graph *g, const char *mode,
                                     const char *note, af_error *err) {
    af_free(r->precision_mode);
    af_free(r->precision_note);
    r->precision_mode = dup(mode);
    r->precision_note = dup(note);
    if (!r->precision_mode || (note && !r->precision_note))
        return af_fail(err, AF_ERR_NOMEM, "out of memory");
    return g ? precision_entries(r, g, err) : AF_OK;
}

af_status af_fusion_report_add_precision(af_fusion_report *r, const char *node, const char *op,
                                         const char *rules, const char *precision,
                                         const char *why, af_error *err) {
    af_precision_entry *e = af_realloc(r->prec, sizeof *e * (size_t)(r->nprec + 1));
    if (!e) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    r->prec = e;
    e = &r->prec[r->nprec++];
    memset(e, 0, sizeof *e);
    e->node = dup(node);
    e->op = dup(op);
    e->rules = dup(rules ? rules : "");
    e->precision = dup(precision);
    e->why = dup(why);
    if (!e->node || !e->op || !e->rules || !e->precision || (why && !e->why))
        return af_fail(err, AF_ERR_NOMEM, "out of memory");
    return AF_OK;
}

/* ---- the quantization section -------------------------------------------------------------- */

static bool quant_op(af_op op) {
    switch (op) {
    case AF_OP_QUANTIZE_LINEAR: case AF_OP_DEQUANTIZE_LINEAR: case AF_OP_DYNAMIC_QUANTIZE_LINEAR:
    case AF_OP_CONV_INTEGER: case AF_OP_MATMUL_INTEGER: case AF_OP_QLINEAR_CONV:
    case AF_OP_QLINEAR_MATMUL: case AF_OP_QUANTIZE_DEQUANTIZE:
        return true;
    default:
        return op >= AF_OP_QLINEAR_ADD && op <= AF_OP_QLINEAR_CONCAT; /* com.microsoft */
    }
}

bool af_graph_is_quantized(const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_graph *sub;
        if (quant_op(g->nodes[i]->op)) return true;
        for (int k = 0; (sub = pass_subgraph(g->nodes[i], k)); k++)
            if (af_graph_is_quantized(sub)) return true;
    }
    return false;
}

/* Ops with a GEMM core, which the int8 form can take. */
static bool gemm_core(af_op op) {
    return op == AF_OP_CONV || op == AF_OP_CONV_TRANSPOSE || op == AF_OP_MATMUL ||
           op == AF_OP_GEMM || op == AF_OP_FUSED_CONV || op == AF_OP_FUSED_MATMUL ||
           op == AF_OP_CONV_POOL_FC || op == AF_OP_CONV_INTEGER || op == AF_OP_MATMUL_INTEGER ||
           op == AF_OP_QLINEAR_CONV || op == AF_OP_QLINEAR_MATMUL;
}

/* Why the GEMM core n runs in float32: the lowering's reason, the int8 rule's near miss at n or
 * at a node n was fused from, or what is left. */
static const char *float_why(const af_fusion_report *r, const af_node *n) {
    const char *why = af_attr_str(n, "precision_why", NULL);
    if (why) return why;
    if (n->op == AF_OP_CONV_INTEGER || n->op == AF_OP_MATMUL_INTEGER || n->op == AF_OP_QLINEAR_CONV ||
        n->op == AF_OP_QLINEAR_MATMUL)
        return "integer op kept as it is (weights or zero points of a form no rewrite takes): "
               "reference kernel";
    /* integer.c's float form of ConvInteger/MatMulInteger reads DequantizeLinear(x, 1, zp) of a
     * DynamicQuantizeLinear (through the layout pass's reorders) */
    const af_value *x = n->nin > 0 ? n->in[0] : NULL;
    for (int hop = 0; x && x->producer && hop < 4; hop++, x = x->producer->nin ? x->producer->in[0] : NULL)
        if (x->producer->op == AF_OP_DYNAMIC_QUANTIZE_LINEAR)
            return "dynamically quantized (DynamicQuantizeLinear + ConvInteger/MatMulInteger): "
                   "float32 products of the integer values (passes/integer.c)";
    const af_attr *fused = af_node_attr(n, "fused_nodes");
    for (int i = 0; i < r->nmisses; i++) {
        const af_fusion_miss *m = &r->misses[i];
        if (m->rule != AF_RULE_QUANT_CONV_MATMUL) continue;
        if (!strcmp(m->node, n->name)) return m->reason;
        for (int k = 0; fused && fused->type == AF_ATTR_STRINGS && k < fused->n; k++)
            if (fused->strings[k] && !strcmp(m->node, fused->strings[k])) return m->reason;
    }
    if (r->cfg.disabled[AF_RULE_QUANT_CONV_MATMUL]) return "QuantConvMatMulFusionOp is disabled";
    return "input or weights not quantized (no QuantizeLinear -> DequantizeLinear before it, "
           "or float weights)";
}

/* Tally of the other compute ops by type: counts[op]. */
static af_status quant_walk(af_fusion_report *r, const af_graph *g, int *counts, af_error *err) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        const af_graph *sub;
        for (int k = 0; (sub = pass_subgraph(n, k)); k++) {
            af_status st = quant_walk(r, sub, counts, err);
            if (st) return st;
        }
        if (!gemm_core(n->op)) {
            if (!af_ops[n->op].direct && n->op != AF_OP_CUSTOM) counts[n->op]++;
            continue;
        }
        if (af_attr_int(n, "quant", 0) && !af_attr_str(n, "precision_why", NULL)) {
            r->int8_cores++;
            continue;
        }
        af_quant_core *e = af_realloc(r->qfloat, sizeof *e * (size_t)(r->nqfloat + 1));
        if (!e) return af_fail(err, AF_ERR_NOMEM, "out of memory");
        r->qfloat = e;
        e = &r->qfloat[r->nqfloat++];
        e->node = dup(n->name);
        e->op = dup(af_ops[n->op].name);
        e->why = dup(float_why(r, n));
        if (!e->node || !e->op || !e->why) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    }
    return AF_OK;
}

af_status af_fusion_report_quant(af_fusion_report *r, const af_graph *g, af_error *err) {
    int *counts = af_calloc(AF_OP_COUNT, sizeof *counts);
    if (!counts) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    r->quantized = true;
    af_status st = quant_walk(r, g, counts, err);
    char buf[1024];
    size_t len = 0;
    buf[0] = 0;
    for (int op = 0; op < AF_OP_COUNT && !st; op++)
        if (counts[op] && len < sizeof buf - 64)
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s x%d", len ? ", " : "",
                                    af_ops[op].name, counts[op]);
    af_free(counts);
    if (!st && len && !(r->qother = dup(buf))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    return st;
}

/* "[AF] Quantized model: 20 of 21 Conv/MatMul/Gemm cores run int8", then each core left in
 * float32 with its reason, then the other ops. */
static void print_quant(const af_fusion_report *r, FILE *f) {
    if (!r->quantized) return;
    fprintf(f, "[AF] Quantized model: %d of %d Conv/MatMul/Gemm cores int8 (QuantConvMatMulFusionOp)\n",
            r->int8_cores, r->int8_cores + r->nqfloat);
    for (int i = 0; i < r->nqfloat; i++)
        fprintf(f, "[AF]   float32 %-16s %s: %s\n", r->qfloat[i].op, r->qfloat[i].node,
                r->qfloat[i].why);
    if (r->qother)
        fprintf(f, "[AF]   float32 other ops: %s (between quantization points: int8 runs in the "
                   "Conv/MatMul/Gemm cores only)\n",
                r->qother);
}

/* "[AF] Precision: bf16 (...)": counts per precision, then every op that stays fp32 with its
 * reason (grouped: one line per reason, a few names each) and the low-precision ops. */
static void print_precision(const af_fusion_report *r, FILE *f) {
    if (!r->precision_mode) return;
    int low = 0;
    for (int i = 0; i < r->nprec; i++) low += strcmp(r->prec[i].precision, "fp32") != 0;
    /* a quantized model compiled without a mode: its int8 comes from the file, not the mode */
    bool own = r->quantized && !strcmp(r->precision_mode, "fp32");
    fprintf(f, "[AF] Precision: %s%s, %d of %d ops in low precision%s%s\n", r->precision_mode,
            own ? " (int8 from the model's quantization)" : "", low, r->nprec,
            r->precision_note ? "; " : "", r->precision_note ? r->precision_note : "");
    for (int i = 0; i < r->nprec; i++) {
        const af_precision_entry *e = &r->prec[i];
        fprintf(f, "[AF]   %-5s %-16s %s%s%s%s%s%s\n", e->precision, e->op, e->node,
                e->rules[0] ? " (" : "", e->rules, e->rules[0] ? ")" : "",
                e->why ? ": " : e->prologue_fp32 ? ": LayerNorm prologue in fp32" : "",
                e->why ? e->why : "");
    }
}

int af_fusion_report_applied(const af_fusion_report *r, int rule) {
    int n = 0;
    for (int i = 0; i < r->nstats; i++)
        if (r->stats[i].rule == rule) n += r->stats[i].applied;
    return n;
}

static double ratio(double unfused, double fused) {
    return fused > 0.0 ? unfused / fused : 1.0;
}

double af_fusion_report_speedup(const af_fusion_report *r) {
    return ratio(r->t_before, r->t_after);
}

/* The pattern label: the name without its "FusionOp" suffix (ConvBNRelu, MatMulBiasRelu...). */
static int label_len(const char *name) {
    size_t n = strlen(name), s = strlen("FusionOp");
    return (int)(n > s && !strcmp(name + n - s, "FusionOp") ? n - s : n);
}

static int misses_of(const af_fusion_report *r, int rule) {
    int n = 0;
    for (int i = 0; i < r->nmisses; i++) n += r->misses[i].rule == rule;
    return n;
}

/* "Near misses: 2 (Conv /a: reason; Conv /b: reason) ..." for rule, at most 3 listed. */
static void print_misses(const af_fusion_report *r, int rule, FILE *f) {
    int total = misses_of(r, rule), shown = 0;
    if (!total) return;
    fprintf(f, "[AF]     Near misses: %d (", total);
    for (int i = 0; i < r->nmisses && shown < 3; i++) {
        const af_fusion_miss *m = &r->misses[i];
        if (m->rule != rule) continue;
        fprintf(f, "%s%s %s: %s", shown ? "; " : "", m->op_type, m->node, m->reason);
        shown++;
    }
    fprintf(f, ")%s\n", total > shown ? " ..." : "");
}

void af_fusion_report_print(const af_fusion_report *r, FILE *f) {
    fprintf(f, "[AF] Graph Fusion Report: %s\n", r->model ? r->model : "<model>");
    for (int rule = 0; rule < af_fusion_rule_count(); rule++) {
        bool any = false;
        for (int i = 0; i < r->nstats; i++) {
            const af_fusion_stat *s = &r->stats[i];
            if (s->rule != rule || s->applied == 0) continue;
            fprintf(f, "[AF]   Pattern: %-18.*s Matched: %-4d Fused into: %-26s Estimated speedup: "
                    "%.2fx\n",
                    label_len(s->fused_into), s->fused_into, s->applied, s->fused_into,
                    ratio(s->t_unfused, s->t_fused));
            any = true;
        }
        if (!any && misses_of(r, rule)) {
            const char *name = af_fusion_rule_name(rule);
            fprintf(f, "[AF]   Pattern: %-18.*s Matched: %-4d Fused into: %s\n", label_len(name),
                    name, 0, name);
        }
        print_misses(r, rule, f);
    }
    for (int rule = 0; rule < af_fusion_rule_count(); rule++)
        if (r->cfg.disabled[rule])
            fprintf(f, "[AF]   Disabled: %s (%s)\n",
                    r->cfg.disabled_as[rule] ? r->cfg.disabled_as[rule]
                                             : af_fusion_rule_name(rule),
                    r->cfg.disabled_by[rule] ? r->cfg.disabled_by[rule] : "switch");
    fprintf(f, "[AF] Total operators before fusion: %d\n", r->ops_before);
    fprintf(f, "[AF] Total operators after fusion: %d\n", r->ops_after);
    fprintf(f, "[AF] Overall estimated speedup: %.2fx\n", ratio(r->t_before, r->t_after));
    print_quant(r, f);
    print_precision(r, f);
}

/* The "precision" object of the JSON report; NULL when out of memory. */
static json_t *precision_json(const af_fusion_report *r) {
    json_t *o = json_object(), *ops = json_array();
    int fail = !o || !ops || json_object_set_new(o, "mode", json_string(r->precision_mode));
    if (!fail && r->precision_note)
        fail = json_object_set_new(o, "note", json_string(r->precision_note));
    if (!fail) fail = json_object_set(o, "ops", ops); /* o holds a reference, ops ours */
    for (int i = 0; i < r->nprec && !fail; i++) {
        const af_precision_entry *e = &r->prec[i];
        json_t *x = json_pack("{s:s, s:s, s:s, s:s, s:b}", "node", e->node, "op", e->op, "rules",
                              e->rules, "precision", e->precision, "prologue_fp32",
                              e->prologue_fp32);
        fail = !x || (e->why && json_object_set_new(x, "why", json_string(e->why)));
        if (x) fail |= json_array_append_new(ops, x);
    }
    json_decref(ops);
    if (fail) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The "quantization" object of the JSON report; NULL when out of memory. */
static json_t *quant_json(const af_fusion_report *r) {
    json_t *o = json_object(), *cores = json_array();
    int fail = !o || !cores || json_object_set_new(o, "int8_cores", json_integer(r->int8_cores));
    for (int i = 0; i < r->nqfloat && !fail; i++) {
        json_t *x = json_pack("{s:s, s:s, s:s}", "node", r->qfloat[i].node, "op", r->qfloat[i].op,
                              "why", r->qfloat[i].why);
        fail = !x || json_array_append_new(cores, x);
    }
    if (!fail) fail = json_object_set(o, "float_cores", cores);
    if (!fail) fail = json_object_set_new(o, "other_ops", r->qother ? json_string(r->qother) : json_null());
    json_decref(cores);
    if (fail) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Two decimals, as the text shows. */
static json_t *speedup(double unfused, double fused) {
    return json_real((double)(long long)(ratio(unfused, fused) * 100.0 + 0.5) / 100.0);
}

/* One entry of "graph_fusion"; NULL when out of memory. */
static json_t *pattern_json(const af_fusion_report *r, int rule, const char *name,
                            const af_fusion_stat *s, bool primary) {
    json_t *o = json_object(), *nm = json_array();
    if (!o || !nm) {
        json_decref(o);
        json_decref(nm);
        return NULL;
    }
    int fail = 0;
    fail |= json_object_set_new(o, "pattern", json_string(af_fusion_rule_pattern(rule)));
    fail |= json_object_set_new(o, "match_times", json_integer(s ? s->matched : 0));
    fail |= json_object_set_new(o, "effect_times", json_integer(s ? s->applied : 0));
    fail |= json_object_set_new(o, "fused_into", json_string(name));
    fail |= json_object_set_new(o, "estimated_speedup",
                                s && s->applied ? speedup(s->t_unfused, s->t_fused) : json_null());
    for (int i = 0; primary && i < r->nmisses; i++) {
        const af_fusion_miss *m = &r->misses[i];
        if (m->rule != rule) continue;
        json_t *e = json_pack("{s:s, s:s, s:s}", "node", m->node, "op_type", m->op_type,
                              "reason", m->reason);
        fail |= !e || json_array_append_new(nm, e);
    }
    fail |= json_object_set_new(o, "near_misses", nm);
    fail |= json_object_set_new(o, "disabled", json_boolean(r->cfg.disabled[rule]));
    if (r->cfg.disabled[rule])
        fail |= json_object_set_new(o, "disabled_by", json_string(r->cfg.disabled_by[rule]
                                                                      ? r->cfg.disabled_by[rule]
                                                                      : "switch"));
    if (fail) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *af_fusion_report_json(const af_fusion_report *r) {
    json_t *root = json_object(), *gf = json_object();
    char *out = NULL;
    int fail = !root || !gf;
    for (int rule = 0; rule < af_fusion_rule_count() && !fail; rule++) {
        const char *name = af_fusion_rule_name(rule);
        const af_fusion_stat *own = NULL;
        for (int i = 0; i < r->nstats; i++)
            if (r->stats[i].rule == rule && !strcmp(r->stats[i].fused_into, name))
                own = &r->stats[i];
        json_t *p = pattern_json(r, rule, name, own, true);
        fail |= !p || json_object_set_new(gf, name, p);
        for (int i = 0; i < r->nstats && !fail; i++) {
            const af_fusion_stat *s = &r->stats[i];
            if (s->rule != rule || s == own) continue;
            p = pattern_json(r, rule, s->fused_into, s, false);
            fail |= !p || json_object_set_new(gf, s->fused_into, p);
        }
    }
    if (!fail) {
        fail |= json_object_set_new(root, "model", json_string(r->model ? r->model : ""));
        fail |= json_object_set_new(root, "graph_fusion", gf);
        gf = NULL;
        fail |= json_object_set_new(root, "ops_before", json_integer(r->ops_before));
        fail |= json_object_set_new(root, "ops_after", json_integer(r->ops_after));
        fail |= json_object_set_new(root, "overall_estimated_speedup",
                                    speedup(r->t_before, r->t_after));
        const af_machine *m = &r->machine;
        json_t *mach = json_pack("{s:f, s:f, s:f, s:f, s:f}", "peak_gflops", m->flops / 1e9,
                                 "gemm_gflops", m->gemm_flops / 1e9, "bandwidth_gbs",
                                 m->bandwidth / 1e9, "l2_bandwidth_gbs", m->l2_bandwidth / 1e9,
                                 "l3_bandwidth_gbs", m->l3_bandwidth / 1e9);
        fail |= !mach || json_object_set_new(root, "machine", mach);
        if (r->quantized) {
            json_t *qj = quant_json(r);
            fail |= !qj || json_object_set_new(root, "quantization", qj);
        }
        if (r->precision_mode) {
            json_t *pj = precision_json(r);
            fail |= !pj || json_object_set_new(root, "precision", pj);
        }
    }
    if (!fail) out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(gf);
    json_decref(root);
    return out;
}

af_status af_fusion_report_write_json(const af_fusion_report *r, const char *path,
                                      af_error *err) {
    char *s = af_fusion_report_json(r);
    if (!s) return af_fail(err, AF_ERR_NOMEM, "out of memory writing the fusion report");
    FILE *f = fopen(path, "w");
    af_status st = AF_OK;
    if (!f) {
        st = af_fail(err, AF_ERR_IO, "%s: cannot write the fusion report", path);
    } else {
        bool ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
        if (fclose(f) != 0 || !ok) st = af_fail(err, AF_ERR_IO, "%s: write failed", path);
    }
    af_free(s);
    return st;
}

void af_fusion_list(FILE *f) {
    for (int r = 0; r < af_fusion_rule_count(); r++) {
        fprintf(f, "%s\n  pattern:    %s\n  conditions: %s\n", af_fusion_rule_name(r),
                af_fusion_rule_pattern(r), af_fusion_rule_conditions(r));
        const af_custom_rule *p = af_plugin_rule(r - AF_RULE_COUNT);
        if (p)
            fprintf(f, "  plugin:     %s (fuses into %s:%s)\n", af_plugin_rule_owner(r - AF_RULE_COUNT),
                    p->fused_domain, p->fused_op);
        const char *prec = af_fusion_rule_precision(r);
        fprintf(f, "  precision:  %s%s\n", prec ? "sensitive: fp32 under mixed for " : "insensitive",
                prec ? prec : "");
        if (r == AF_RULE_MATMUL_BIAS_ACT)
            fprintf(f, "  alias:      MatMulBiasReluFusionOp\n");
    }
}

char *af_fusion_rules_json(void) {
    json_t *all = json_array();
    for (int r = 0; all && r < af_fusion_rule_count(); r++) {
        const af_custom_rule *p = af_plugin_rule(r - AF_RULE_COUNT);
        const char *prec = af_fusion_rule_precision(r);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s?, s:s?, s:s?, s:s?}", "name",
                              af_fusion_rule_name(r), "pattern", af_fusion_rule_pattern(r),
                              "conditions", af_fusion_rule_conditions(r), "precision", prec,
                              "plugin", p ? af_plugin_rule_owner(r - AF_RULE_COUNT) : NULL,
                              "fused_op", p ? p->fused_op : NULL, "alias",
                              r == AF_RULE_MATMUL_BIAS_ACT ? "MatMulBiasReluFusionOp" : NULL);
        if (!o || json_array_append_new(all, o)) {
            json_decref(all);
            return NULL;
        }
    }
    char *s = all ? json_dumps(all, JSON_COMPACT) : NULL;
    json_decref(all);
    return s;
}

void af_string_free(char *s) { free(s); }
