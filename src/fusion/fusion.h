/* The fusion stage: the rule table (rules.def), the engine that applies it (af_fuse), the
 * switches that turn rules off, the fusion report and the roofline cost model behind its
 * estimated speedups. This header is what the pipeline and the CLI use; rule writers also read
 * src/fusion/rule.h.
 *
 * Fused ops (domain "ai.autofusion", rows in src/ir/ops_fused.def, kernels src/kernels/fused*.c).
 * Every fused node carries "fusion_rule" STRING (the rules that built it, comma-separated in the
 * order they applied: a ready --disable_fusion value) and "fused_nodes" STRINGS (the names of the
 * original nodes it replaces). Most carry an epilogue program ("epilogue" INTS, 3 per step
 * {op, operand, flags}; "epilogue_params" FLOATS, 2 per step; see ir/epilogue.h) whose
 * operands are inputs of the fused node that broadcast unidirectionally to its output.
 *   FusedConv        [X, W, B?, operands...]; every Conv attribute + epilogue. BatchNorm is
 *                    already folded into W and B. With transposed = 1 a ConvTranspose instead:
 *                    its attributes, W [C, M/group, k...].
 *   FusedMatMul      [A, B, bias?, ln_scale?, ln_bias?, operands...]; trans_a, trans_b, alpha,
 *                    ln_epsilon (LayerNorm prologue over A's last dim, iff ln_scale is given),
 *                    ln_rms (1: the prologue is an RMSNorm, x / sqrt(mean(x^2) + eps) * ln_scale,
 *                    no ln_bias) + epilogue. Y = epilogue(alpha * LN(A) x B + bias), numpy
 *                    MatMul semantics.
 *   FusedElementwise [X, operands...]; epilogue over X (output shaped like X).
 *   ConvPoolFc       [X, Wc, Bc?, Wfc, Bfc?, operands...]; Conv attributes + epilogue (on the
 *                    conv output) + fc_trans_b: Gemm(GlobalAveragePool(conv), Wfc) + Bfc.
 *   SqueezeExcite    [X, W1, B1?, W2, B2?]; act/act_params, gate/gate_params (one epilogue op
 *                    and its 2 params each): Y = X * gate(conv2(act(conv1(GAP(X))))).
 *   FusedAttention   [q, k, v, mask?]; see kernels/ref/attention.c.
 * ("?" marks an optional input: the slot exists and holds NULL when omitted.)
 *
 * Ownership: a config is a plain value; a report owns copies of every string it holds and is
 * released with af_fusion_report_free.
 *
 * Invariant: a rule id names the same rule in the table, the report and every switch; built-in
 * ids come first, plugins' after. */
#ifndef AF_FUSION_H
#define AF_FUSION_H

#include "ir/ir.h"
#include "ir/plugin.h"

#include <stdbool.h>
#include <stdio.h>

/* ---- the rule table ------------------------------------------------------------------------ */

typedef enum af_rule_id {
#define AF_RULE(id, name, pattern, anchor, check, apply, conditions, precision) AF_RULE_##id,
#include "fusion/rules.def"
#undef AF_RULE
    AF_RULE_COUNT
} af_rule_id;

/* Rule ids: the built-in rules, 0..AF_RULE_COUNT, then the plugins' rules in load order, up to
 * af_fusion_rule_count() (< AF_RULE_MAX). */
#define AF_RULE_MAX (AF_RULE_COUNT + AF_PLUGIN_MAX_RULES)
int af_fusion_rule_count(void);
bool af_fusion_rule_is_plugin(int r);
/* Name, pattern and conditions of rule r (static strings); NULL when r is out of range. */
const char *af_fusion_rule_name(int r);
const char *af_fusion_rule_pattern(int r);
const char *af_fusion_rule_conditions(int r);
/* NULL when rule r is not precision-sensitive, else what of its fused op stays float32 under
 * --precision_mode=mixed (rules.def's last column). */
const char *af_fusion_rule_precision(int r);
/* Rule id of a name or alias ("MatMulBiasReluFusionOp" is MatMulBiasActFusionOp); -1 if none. */
int af_fusion_rule_find(const char *name);
/* `autofusion --list-fusions`: every rule with its pattern and conditions, in table order, then
 * the plugins' rules. */
void af_fusion_list(FILE *f);

/* ---- switches (switches.c) ----------------------------------------------------------------- */

typedef struct af_fusion_config {
    bool disabled[AF_RULE_MAX];
    const char *disabled_as[AF_RULE_MAX]; /* the name as the user spelled it (static) */
    const char *disabled_by[AF_RULE_MAX]; /* where: "--disable_fusion", "AUTOFUSION_DISABLE_LIST",
                                               "GE_FUSION_DISABLE_LIST", "--fusion_switch_file" */
} af_fusion_config;

/* Every rule on. The CLI then applies, in this order: af_fusion_switch_file (--fusion_switch_file),
 * af_fusion_config_env (environment), af_fusion_disable_list (--disable_fusion): a later source
 * can only add to what is off, except that a switch file's "X:on" turns X back on after its
 * own "ALL:off". */
void af_fusion_config_init(af_fusion_config *cfg);
/* Turn off the rules named in `list` (comma- or space-separated; "ALL" is every rule), recording
 * `source` (a static string) as the reason. An unknown name is AF_ERR_INVALID_ARG with a message
 * that lists the valid names; cfg is then unchanged. */
af_status af_fusion_disable_list(af_fusion_config *cfg, const char *list, const char *source,
                                 af_error *err);
/* AUTOFUSION_DISABLE_LIST, then its alias GE_FUSION_DISABLE_LIST, when set. */
af_status af_fusion_config_env(af_fusion_config *cfg, af_error *err);
/* ATC's switch file in either form: lines "Name:off" / "Name:on" ('#' comments, blank lines), or
 * JSON {"Switch": {"GraphFusion": {"ALL": "off", "Name": "on"}}}. "ALL" applies first, then the
 * named entries. Errors: AF_ERR_IO (unreadable), AF_ERR_PARSE (malformed), AF_ERR_INVALID_ARG
 * (unknown name or a value other than on/off); cfg is unchanged on error. */
af_status af_fusion_switch_file(af_fusion_config *cfg, const char *path, af_error *err);
/* AUTOFUSION_FUSION_LOG (alias GE_GRAPH_FUSION_LOG) is set to something other than "" or "0". */
bool af_fusion_log_requested(void);

/* The machine the estimates are for (measured by runtime/machine.c): one core's rates, the FMA
 * peak, what the GEMM core reaches, and copy bandwidth for buffers in L2, in the next level (a
 * few times L2) and in memory. */
typedef struct af_machine {
    double flops;      /* float32 FLOP/s of an FMA loop (an FMA counts 2) */
    double gemm_flops; /* FLOP/s of the GEMM core (kernels/fast/gemm.h) on a cache-resident problem */
    double gemm_bf16_flops; /* the same in bfloat16 (AMX or AVX512_BF16); 0 without either */
    double gemm_int8_ops;   /* the same in int8 (U8S8 on AVX512_VNNI), 2 per multiply-add; 0
                               without VNNI */
    double bandwidth;  /* bytes/s (read + write) to and from memory */
    double l2_bandwidth, l3_bandwidth; /* the same within L2 and within 8 x L2 */
    double l2_bytes;   /* per-core L2 size (cpuinfo) */
    double handoff_ns, wake_ns; /* a parallel loop reaching a spinning / a sleeping worker */
    double busy_cores; /* what other work kept busy while this was measured, in cores (the
                          least over the measurements merged) */
    int measurements;  /* how many calibrations were merged into these figures */
    double measured_at; /* when the last one was taken (seconds since 1970) */
    char isa[16];      /* the kernels' ISA when measured: "avx512", "avx2", "generic" */
} af_machine;

/* ---- the report (report.c) ------------------------------------------------------------------ */

/* One line of the report: the matches of a rule counted under one name (a rule may report some
 * matches under another name, as MatMulBiasActFusionOp does with MatMulBiasReluFusionOp). */
typedef struct af_fusion_stat {
    int rule;
    const char *fused_into; /* static */
    int matched;            /* match_times: applied + near misses (near misses count once, on
                               the rule's own name) */
    int applied;            /* effect_times */
    double t_unfused, t_fused; /* estimated seconds of the replaced nodes / the fused nodes */
} af_fusion_stat;

/* The pattern was found at `node` but a condition refused it. */
typedef struct af_fusion_miss {
    int rule;
    char *node;    /* node name (owned) */
    char *op_type; /* owned */
    const char *reason; /* static */
} af_fusion_miss;

/* The precision one op of the final graph runs in (after lowering): the fused ops and every
 * GEMM core, when a precision mode other than fp32 was asked for. */
typedef struct af_precision_entry {
    char *node, *op, *rules; /* owned; rules "" for an op no rule made */
    char *precision;         /* owned: "fp32", "bf16", "fp16" */
    char *why;               /* owned; NULL unless it stays fp32 against the mode */
    bool prologue_fp32;      /* mixed: its sensitive prologue reads float32 */
} af_precision_entry;

/* A Conv / MatMul / Gemm (or the fused op made from one) of a quantized model that runs in
 * float32, and why. */
typedef struct af_quant_core {
    char *node, *op, *why; /* owned */
} af_quant_core;

#define AF_FUSION_MAX_STATS (2 * AF_RULE_MAX)

typedef struct af_fusion_report {
    char *model; /* owned */
    af_fusion_stat stats[AF_FUSION_MAX_STATS];
    int nstats;
    af_fusion_miss *misses;
    int nmisses, misses_cap;
    af_fusion_config cfg; /* copy of the switches in force (for the Disabled lines) */
    int ops_before, ops_after; /* node counts, subgraphs included */
    double t_before, t_after;  /* estimated seconds of the whole graph */
    af_machine machine;                /* the machine the estimates are for */
    char *precision_mode;              /* owned; NULL: fp32 (no precision section) */
    char *precision_note;              /* owned; e.g. why the mode fell back to fp32 */
    af_precision_entry *prec;
    int nprec;
    /* quantized models (af_fusion_report_quant): the quantization section */
    bool quantized;
    int int8_cores;        /* GEMM cores running int8 */
    af_quant_core *qfloat; /* the GEMM cores left in float32 */
    int nqfloat;
    char *qother;          /* owned: the other ops, "Add x8, MaxPool x1", or NULL */
} af_fusion_report;

/* Empty report for `model` (a name for the header line; may be NULL), with estimates for
 * machine m (runtime/machine.h: af_machine_get). */
void af_fusion_report_init(af_fusion_report *r, const char *model, const af_machine *m);
void af_fusion_report_free(af_fusion_report *r);
/* The text report, every line prefixed "[AF] ". */
void af_fusion_report_print(const af_fusion_report *r, FILE *f);
/* The JSON report as a malloc'd string (af_free() it); NULL when out of memory. Keys: "model",
 * "graph_fusion" {name: {pattern, match_times, effect_times, fused_into, estimated_speedup,
 * near_misses [{node, op_type, reason}], disabled, disabled_by}}, "ops_before", "ops_after",
 * "overall_estimated_speedup", "machine" {peak_gflops, bandwidth_gbs}, with a precision mode
 * "precision" {mode, note, ops [{node, op, rules, precision, why, prologue_fp32}]}, and for a
 * quantized model "quantization" {int8_cores, float_cores [{node, op, why}], other_ops}. */
char *af_fusion_report_json(const af_fusion_report *r);
af_status af_fusion_report_write_json(const af_fusion_report *r, const char *path, af_error *err);
/* Record the precision of every reported op of g (fused ops and GEMM cores, as the precision
 * pass marked them; g NULL: none) under `mode`, with `note` (may be NULL) for the whole graph. */
af_status af_fusion_report_precision(af_fusion_report *r, const af_graph *g, const char *mode,
                                     const char *note, af_error *err);
/* One more precision entry (g NULL above leaves the list to these): int8, whose decisions the
 * quantize pass made before fusion, on the model's own nodes. */
af_status af_fusion_report_add_precision(af_fusion_report *r, const char *node, const char *op,
                                         const char *rules, const char *precision,
                                         const char *why, af_error *err);
/* Does g (or a body) hold quantization: QuantizeLinear, DequantizeLinear, a QOperator op
 * (QLinear*), DynamicQuantizeLinear, ConvInteger or MatMulInteger? */
bool af_graph_is_quantized(const af_graph *g);
/* The quantization section of the report of a quantized model, from its final graph g: how
 * many GEMM cores (Conv, MatMul, Gemm and the fused ops made of them) run int8, every one left
 * in float32 with why (the int8 rule's near miss, the lowering's precision_why, or no quantized
 * input or weights), and the other compute ops by type (float32 between quantization points:
 * the int8 form covers GEMM cores only). Sets r->quantized. */
af_status af_fusion_report_quant(af_fusion_report *r, const af_graph *g, af_error *err);
/* Applied matches of rule r over all its names (handy for tests and summaries). */
int af_fusion_report_applied(const af_fusion_report *r, int rule);
/* Overall estimated speedup: t_before / t_after (1 when nothing was estimated). */
double af_fusion_report_speedup(const af_fusion_report *r);

/* ---- the engine (engine.c) ------------------------------------------------------------------ */

/* Apply every enabled rule (cfg NULL: all) to g and its subgraphs, in table order, then re-infer
 * shapes. rep (may be NULL) receives counts, near misses and cost estimates; af_fuse sets
 * rep->ops_before only when it is still 0, so the caller may record the count of the graph as
 * imported. On error the graph is still valid (each rewrite is complete or not started). */
af_status af_fuse(af_graph *g, const af_fusion_config *cfg, af_fusion_report *rep,
                  af_error *err);

/* ---- the cost model (cost.c) ---------------------------------------------------------------- */


/* Roofline inputs of one node from its input/output types (unknown dims count as 1). */
double af_cost_flops(const af_node *n);
double af_cost_bytes(const af_node *n);
/* Estimated seconds: max(flops / peak, bytes / bandwidth). */
double af_cost_time(const af_machine *m, double flops, double bytes);
/* Estimated seconds of node n doing `flops`: the roofline with the GEMM core's rate for
 * convolutions and matrix products (the FMA peak for the rest), and each tensor it reads or
 * writes moved at the bandwidth of where a tensor of its size lives when the previous op just
 * wrote it (L2, the next level, memory); constants of more than 64 KiB count as coming from
 * memory (a model's weights do not stay in cache between runs). */
double af_cost_node_time(const af_machine *m, const af_node *n, double flops);

#endif
