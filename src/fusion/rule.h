/* The rule writer's API: what a rule's check and apply receive, and the engine's helpers for
 * matching, guarding, building epilogue programs and committing a rewrite.
 *
 * A rule is one row of rules.def plus two functions in src/fusion/rules/<family>.c:
 *   const char *check(af_fusion_ctx *cx, af_node *anchor, af_match *m)
 *       Looks at the graph around `anchor` WITHOUT changing it and fills m: the nodes it covers
 *       (anchor first), the pattern's output value(s) in m->out, and whatever apply needs in the
 *       scratch fields. Returns NULL (fuse it), AF_NO_MATCH (the pattern is not here: nothing to
 *       report) or a short static reason ("output feeds 2 consumers"): the pattern is here but a
 *       condition refuses it, which the report lists as a near miss.
 *   af_status apply(af_fusion_ctx *cx, af_match *m, af_error *err)
 *       Builds the fused node(s) with af_node_new_ours and hands each to fuse_commit. Fails only when
 *       out of memory; a rewrite the fused op's shape function rejects is declined by fuse_commit
 *       (a near miss), never half done.
 * Between the two the engine runs the standard guards on m, so rules need not repeat them:
 *   - every covered node is in the anchor's graph;
 *   - every output of a covered node that is not kept (m->keep) and not a pattern output
 *     (m->out) is an intermediate: not a graph output and read only by covered nodes;
 *   - the pattern outputs and the anchor's first input and output are float32.
 * Rules check the rest (constants, shapes, broadcasts, attributes) with the helpers below;
 * fuse_edge and fuse_fits give the standard reasons so that the report speaks one language.
 *
 * Invariant: a rewrite is complete or not started: fuse_commit either puts the fused node in
 * place of the match or leaves the graph as it was. */
#ifndef AF_FUSION_RULE_H
#define AF_FUSION_RULE_H

#include "fusion/fusion.h"
#include "kernels/ref/epilogue.h"

/* check's answer when the pattern is not present at the anchor (not a near miss). */
extern const char af_no_match[];
#define AF_NO_MATCH af_no_match

#define AF_MATCH_MAX 64 /* nodes one match may cover (bits of af_match.keep) */
#define AF_MATCH_OUT_MAX 8

typedef struct af_fusion_ctx af_fusion_ctx;

/* An epilogue program under construction: steps with their operand values. */
typedef struct fuse_epi {
    int n;
    int64_t op[AF_EP_MAX_STEPS];
    int64_t flags[AF_EP_MAX_STEPS];
    float p0[AF_EP_MAX_STEPS], p1[AF_EP_MAX_STEPS];
    af_value *operand[AF_EP_MAX_STEPS]; /* binary steps; NULL for unary ones */
    const struct af_custom_op *custom[AF_EP_MAX_STEPS]; /* custom steps: the plugin's op */
} fuse_epi;

typedef struct af_match {
    af_node *node[AF_MATCH_MAX]; /* covered nodes, anchor first */
    int n;
    uint64_t keep;               /* bit i: node[i] stays (something outside also reads it) */
    af_value *out[AF_MATCH_OUT_MAX]; /* values read after the pattern */
    int nout;
    const char *report_as; /* count this match under another name (static); NULL: the rule's */
    const char *partial;   /* a condition that stopped the match short of a bigger pattern
                              (the report notes it as a near miss although something fused) */
    /* Scratch from check to apply, free for the rule's use. */
    fuse_epi epi;
    af_node *core;
    af_value *val[8];
    int64_t ival[8];
    float fval[8];
} af_match;

/* Declarations of every rule's check and apply. */
#define AF_RULE(id, name, pattern, anchor, check, apply, conditions, precision)                  \
    const char *check(af_fusion_ctx *, af_node *, af_match *);                                 \
    af_status apply(af_fusion_ctx *, af_match *, af_error *);
#include "fusion/rules.def"
#undef AF_RULE

/* ---- matching and guards (engine.c) ---------------------------------------------------------- */

/* Add n to the covered nodes; false when the match is full (the rule then refuses). */
bool fuse_match_add(af_match *m, af_node *n);
/* Index of n among the covered nodes, or -1. */
int fuse_match_index(const af_match *m, const af_node *n);
/* Mark node n (covered) as kept: it stays in the graph for its other readers. */
void fuse_match_keep(af_match *m, const af_node *n);
/* Set the single pattern output. */
void fuse_match_output(af_match *m, af_value *v);

/* The standard intermediate guard: NULL when v may disappear inside a fused op (one reader, not a
 * graph output), else "intermediate is a graph output" / "output feeds N consumers". */
const char *fuse_edge(const af_value *v);
/* The standard broadcast guard: NULL when `operand` broadcasts unidirectionally (numpy) to the
 * type `out` with every dim known, else "broadcast does not fit the output" / "shape is not
 * known". */
const char *fuse_fits(const af_tensor *operand, const af_tensor *out);

/* ---- epilogue programs (chain.c) -------------------------------------------------------------- */

void fuse_epi_init(fuse_epi *e);
/* The epilogue op and parameters of an activation node (Relu, Clip with constant bounds,
 * LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Silu, Gelu, Tanh, Elu, and Max / Min of in[0] and
 * a constant float32 scalar as a Clip with one bound); false for anything else. */
bool fuse_act_op(const af_node *n, int64_t *op, float *p0, float *p1);
/* Append node n, which reads the chain value y (its other input, for a binary op, is the operand),
 * as a step of a program whose output type is `out` (a plugin's ELEMWISE op with map, or its
 * BROADCAST op with map2, is a custom step). NULL when appended; AF_NO_MATCH when n is
 * not an op an epilogue can express this way (or the program is full); else a reason (the operand
 * does not fit the output, dtype...). */
const char *fuse_epi_append(fuse_epi *e, const af_node *n, const af_value *y, const af_tensor *out);
/* Load the program of an existing fused node: its operands are its inputs from `first` on. */
const char *fuse_epi_load(fuse_epi *e, const af_node *fused, int first);
/* Operand count (one input slot each, in step order). */
int fuse_epi_operands(const fuse_epi *e);
/* Write the program into dst: operands into inputs first.. (dst must have them), attributes
 * "epilogue"/"epilogue_params" (none when the program is empty). */
af_status fuse_epi_emit(af_node *dst, const fuse_epi *e, int first, af_error *err);

/* ---- fused cores (core.c) --------------------------------------------------------------------- */

/* The core of a FusedConv, FusedMatMul or FusedElementwise taken from a Conv, MatMul, Gemm or an
 * existing fused node, with its epilogue program so far (rules append steps to c->epi). */
typedef struct fuse_core {
    af_node *src;
    af_op op;         /* AF_OP_FUSED_CONV, AF_OP_FUSED_MATMUL or AF_OP_FUSED_ELEMENTWISE */
    int nfixed;       /* inputs before the epilogue operands: 3, 5 or 1 */
    af_value *in[5];  /* those inputs (NULL: omitted) */
    bool ln;          /* FusedMatMul: LayerNorm prologue (in[3], in[4]) with ln_epsilon */
    bool ln_rms;      /* ... an RMSNorm prologue instead (in[3] only; attribute ln_rms 1) */
    float ln_epsilon;
    float c_scale;    /* Gemm: beta, folded into a new constant C when not 1 */
    int c_step;       /* Gemm: C's epilogue step, or -1 (C in the bias slot or absent) */
    fuse_epi epi;
} fuse_core;

/* Is op one a core can be taken from? */
bool fuse_core_op(af_op op);
/* Describe src's core without changing the graph: NULL, AF_NO_MATCH (src is not a core op) or a
 * reason (a Gemm C that cannot be expressed, a malformed fused node). */
const char *fuse_core_init(fuse_core *c, af_node *src);
/* Make the fused node (appended to src's graph, output slot empty, ready for fuse_commit): fixed
 * inputs, src's attributes, trans/alpha for a Gemm, ln_epsilon, the epilogue. NULL when out of
 * memory (err set). */
af_node *fuse_core_build(fuse_core *c, const char *name, af_error *err);

/* ---- building and committing (engine.c) ------------------------------------------------------- */

/* Copy src's attributes to dst, except the epilogue and provenance ones. */
bool fuse_copy_attrs(af_node *dst, const af_node *src);

/* Put `fused` (built by af_node_new_ours, inputs set, output slot empty) in place of the covered nodes
 * whose bits are set in `covers`: its shape function must accept the inputs and give `out`'s
 * type, else the rewrite is declined (fused is removed, the graph untouched, the engine records a
 * near miss). On success: fused produces `out`, sits right after the last covered node, carries
 * the provenance attributes, and every covered node not kept is removed. Covered kept nodes count
 * in fused_nodes but stay. Returns AF_OK in both cases; an error only when out of memory. */
af_status fuse_commit(af_fusion_ctx *cx, af_match *m, af_node *fused, af_value *out,
                    uint64_t covers, af_error *err);
/* True when the last fuse_commit of this match was declined. */
bool fuse_declined(const af_fusion_ctx *cx);
/* Remove n when nothing reads its outputs any more and none is a graph output (e.g. a kept
 * LayerNorm whose readers all became fused). */
void fuse_remove_if_dead(af_fusion_ctx *cx, af_node *n);
/* Every bit of a match of n nodes. */
/* BatchNormalization in inference mode with constant float32 parameters [C] over X's dim 1 and
 * unused statistics outputs: what fuse_bn_node takes. */
bool fuse_bn_inference(const af_node *bn);
/* The FusedElementwise(X, s, t, operands of e...) computing e's steps after y = x * s + t, with
 * s = scale / sqrt(var + eps), t = B - mean * s as new constants [C, 1, ...] (appended to bn's
 * graph, output slot empty). e holds the steps that follow the BN (none: a plain BN); NULL when
 * out of memory. */
af_node *fuse_bn_node(af_node *bn, fuse_epi *e, af_error *err);

static inline uint64_t fuse_all(const af_match *m) {
    return m->n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << m->n) - 1);
}

#endif
