/* What the passes share (internal to src/passes): a per-graph scope that knows which values are
 * pinned (graph outputs, whose names must survive) and which nodes a pass removed; readers for
 * constants; creation of replacement nodes; capture lists of subgraphs.
 *
 * Invariant: between pass_scope_open and pass_scope_close, a removed node stays in g->nodes,
 * detached (it reads nothing and produces nothing) and flagged dead, so a walk over g->nodes by
 * index stays valid while nodes go; pass_scope_sweep drops the dead in one compaction.
 */
#ifndef AF_PASSES_REWRITE_H
#define AF_PASSES_REWRITE_H

#include "passes/passes.h"

typedef struct pass_scope {
    af_graph *g;
    bool *pinned; /* by value id: an output of g, or of a subgraph nested in g */
    int npinned;
    bool *dead; /* by node id: removed by this pass, not swept yet */
    int ndead;
    int removed; /* nodes removed since open */
    /* constant folding leaves DequantizeLinear of 8-bit constant weights alone (the int8
     * fusion rule reads them; simplify before fusion sets it) */
    bool keep_qweights;
} pass_scope;

af_status pass_scope_open(pass_scope *s, af_graph *g, af_error *err);
void pass_scope_close(pass_scope *s);
/* Is v's name part of the graph's interface (so v must keep its producer's meaning and name)?
 * Values of enclosing graphs count as pinned: a pass over g never rewires them. */
bool pass_pinned(const pass_scope *s, const af_value *v);
bool pass_dead(const pass_scope *s, const af_node *n);
/* Detach n and flag it dead. */
af_status pass_kill(pass_scope *s, af_node *n, af_error *err);
/* Drop dead nodes from g->nodes (keeps the order of the rest). */
void pass_scope_sweep(pass_scope *s);

/* The one node of s->g reading v, when v is read exactly once and is not pinned; else NULL. */
af_node *pass_sole_user(const pass_scope *s, const af_value *v);
/* The live producer of v in s->g when it is an `op` node, else NULL. */
af_node *pass_producer(const pass_scope *s, const af_value *v, af_op op);

/* A constant holding one number (any rank, all dims 1): its value in *out. */
bool pass_scalar(const af_value *v, double *out);
/* k-th subgraph held by n's attributes, or NULL past the last. */
af_graph *pass_subgraph(const af_node *n, int k);

/* A new node of s->g computing `op`, named after `anchor` (the node it replaces, e.g.
 * "/mlp/Erf_1" gives "/mlp/Gelu_1"), in our domain when the op is ours. Appended at the end
 * of g->nodes: the caller restores the order with af_graph_toposort. */
af_node *pass_node_new(pass_scope *s, af_op op, const af_node *anchor, int nin, int nout);

/* Rebuild the capture lists of every subgraph nested in g (bottom-up) after rewiring. */
af_status pass_fix_captures(af_graph *g, af_error *err);

/* ConvInteger / MatMulInteger read as float by Casts become float32 Conv / MatMul over the
 * shifted input and weights (integer.c); *changed is set when one was. */
af_status pass_integer_as_float(af_graph *g, bool *changed, af_error *err);
/* QLinearConv / QLinearMatMul become DequantizeLinear -> Conv / MatMul -> QuantizeLinear
 * (qdq.c); *changed is set when one did. */
af_status pass_qoperator_as_qdq(af_graph *g, bool *changed, af_error *err);
/* QuantizeLinear -> DequantizeLinear pairs with the same constant per-tensor parameters become
 * QuantizeDequantize nodes, and those that data movement separates from an equal one go
 * (qdq.c); *hit is set when something changed (replacements are appended: toposort after). */
af_status pass_fake_quant(pass_scope *s, bool *hit, af_error *err);
/* Einsum n of two operands as Transpose / Reshape -> MatMul -> Reshape / Transpose where its
 * equation is a batched matrix product (einsum.c); *hit is set when it was rewritten. */
af_status pass_einsum_matmul(pass_scope *s, af_node *n, bool *hit, af_error *err);
/* Constant folding of one graph (fold.c); *changed is set when a node was folded. */
af_status pass_fold_constants(pass_scope *s, bool *changed, af_error *err);
/* Every If of g whose condition is a constant replaced by the branch it takes (fold_if.c);
 * *changed is set when one was. Capture lists are stale until pass_fix_captures. */
af_status pass_fold_if(af_graph *g, bool *changed, af_error *err);
/* Shape arithmetic over symbolic dims (symbolic.c): Reshape and Expand shapes computed from
 * Shape become constants where the symbols allow, as do shape values that are all numbers. */
af_status pass_fold_symbolic(pass_scope *s, bool *changed, af_error *err);

#endif
