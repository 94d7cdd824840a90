/* The memory plan: where each intermediate tensor of a main graph lives in one arena.
 *
 * Time is the position of a node in graph->nodes (topological order is the execution order).
 * A value is planned when a node of the main graph produces it, it is not a graph input,
 * constant or output (outputs are handed to the caller, who owns them), its type is fully known
 * and numeric, and its producer is not a control-flow op (If/Loop/Scan build their outputs from
 * subgraph runs). Its live range runs from its producer to its last reader; a node whose
 * subgraphs read the value (captures, at any depth) counts as a reader.
 *
 * Invariant (checked by af_plan_check, which the .afm loader runs on every stored plan): two
 * planned values whose live ranges share a node never share a byte of the arena, except a value
 * produced in place over its producer's input 0 (same offset, same size), which the planner
 * allows only for the ops of its own conservative table (plan.c) and only when that input dies
 * at that node and is not read through another input slot.
 *
 * Sizes are the values' bytes rounded up to 64, so every offset is 64-byte aligned.
 * Ownership: af_plan_build / af_plan_new give a plan that the caller releases with af_plan_free.
 */
#ifndef AF_RUNTIME_PLAN_H
#define AF_RUNTIME_PLAN_H

#include "ir/ir.h"
#include "runtime/exec.h"

#define AF_PLAN_ALIGN 64
/* A plan never asks for more than this (the largest tensor af_tensor_alloc makes, 1 TiB). */
#define AF_PLAN_MAX_BYTES ((uint64_t)1 << 40)

typedef struct af_plan_slot {
    int64_t offset; /* byte offset in the arena; -1: not planned (allocated when produced) */
    uint64_t size;  /* bytes reserved: the value's bytes rounded up to AF_PLAN_ALIGN */
    int inplace_of; /* id of the value whose buffer it takes over (input 0 of its producer), or -1 */
} af_plan_slot;

typedef struct af_plan {
    int nvalues;         /* graph->nvalues of the graph it was made for */
    af_plan_slot *slots; /* by value id, nvalues of them */
    uint64_t arena_size; /* bytes of the arena: the end of the highest planned buffer */
    /* Filled by af_plan_build and af_plan_check: */
    uint64_t lower_bound; /* max over nodes of the bytes of distinct planned buffers live there:
                             no placement of these buffers fits in less */
    int nplanned, ninplace;
} af_plan;

/* The plan of main graph g (g->parent == NULL): every value that can be planned is placed
 * (partial when some shapes are dynamic; the rest is allocated at run time). *out is NULL on
 * error (AF_ERR_NOMEM, or AF_ERR_INVALID_ARG for a subgraph). */
af_status af_plan_build(const af_graph *g, af_plan **out, af_error *err);
/* The plan of g for one shape of its inputs (inputs: by graph input, NULL for those not given):
 * the types of every value inferred again from those inputs' dtypes and dims (never their
 * data), so that values whose compiled dims are symbolic get slots too. A dynamic model's
 * session makes one per shape signature. */
af_status af_plan_build_for(const af_graph *g, const af_tensor *const *inputs, af_plan **out,
                            af_error *err);

/* An empty plan for a graph of nvalues values (every slot unplanned), for loaders to fill. */
af_plan *af_plan_new(int nvalues);
void af_plan_free(af_plan *p);

/* Check p against g: the invariant above, every planned value plannable with exactly its
 * type's size, inside the arena; then fill lower_bound, nplanned and ninplace.
 * AF_ERR_INVALID_MODEL with a message naming the values at fault. */
af_status af_plan_check(const af_graph *g, af_plan *p, af_error *err);

/* arena_size / lower_bound (1 when nothing is planned). */
double af_plan_ratio(const af_plan *p);

/* For the executor. May output `out` (the run-time type of node n's output 0) be computed over
 * `in0` (its input 0), byte for byte where the plan put it in place? Checks the op's in-place
 * kind (its row of the op table, ir/ops.def) and that the two types match as the op needs. */
bool af_plan_inplace_ok(const af_node *n, const af_tensor *in0, const af_tensor *out);

/* Run main graph g like af_exec_graph (runtime/exec.h), with the values p places living in
 * `arena` (p->arena_size bytes, AF_PLAN_ALIGN-aligned, owned by the caller; its contents need
 * not be zero). A value whose run-time size does not fit its slot is allocated as usual. One
 * run at a time per arena. rt (may be NULL: one thread) gives the threads and scratch. Defined
 * in exec.c. */
af_status af_exec_graph_planned(const af_graph *g, const af_plan *p, void *arena,
                                af_runtime *rt, const af_tensor *const *inputs,
                                af_tensor *outputs, af_error *err);

/* The plan of a session's model (NULL when it has none), borrowed. Defined in session.c. */
const af_plan *af_session_plan(const af_session *s);
/* The plan the last run used: for a model with dynamic input dims, its shape signature's (the
 * session keeps the plans of the 4 signatures used last); else af_session_plan's. */
const af_plan *af_session_last_plan(const af_session *s);

#endif
