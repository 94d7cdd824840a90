/* Which shape function and which kernel serve a node: the one place that decides (dispatch.c).
 * Everything that runs a node or infers its shape (the shape pass, constant folding, the fusion
 * engine's checks, the executor) goes through here.
 *
 * Invariant: a node's shape function and kernel come from here only. */
#ifndef AF_KERNELS_DISPATCH_H
#define AF_KERNELS_DISPATCH_H

#include "kernels/kernel.h"

/* Node n's shape function: the fast one of a lowered form, else the reference one. */
af_status af_kernel_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err);
/* Run node n: its fast kernel when the op has one and either the ISA in force is not the
 * reference (kernels/simd/cpu.h) or n is in a lowered form; the reference kernel otherwise, and
 * whenever the fast kernel declines. */
af_status af_kernel_run(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                        af_error *err);

/* Which kind of kernel runs a node. */
typedef enum af_kernel_kind {
    AF_KERNEL_FAST = 0,  /* a fast kernel (kernels/fast) */
    AF_KERNEL_REFERENCE, /* the reference kernel, where the op or the case has no fast one: a
                            slow path, named by inspect, the profile and bench's warning */
    AF_KERNEL_DIRECT     /* the reference kernel of an op that needs no other (the op table's
                            .direct: views, metadata, control flow, a plugin's own kernel) */
} af_kernel_kind;

/* "fast", "reference", "direct" (static). */
const char *af_kernel_kind_name(af_kernel_kind k);

/* The kernel af_kernel_run will choose for node n with inputs of the given types (types NULL:
 * the types of n's input values), without running it. A fast kernel still declines at run time
 * what only the data shows (a broadcast its vector code cannot read, a Softmax over a middle
 * axis): af_kernel_run_kind tells what actually ran. */
af_kernel_kind af_kernel_choice(const af_node *n, const af_tensor *const *types);

/* af_kernel_run that also says in *ran (when not NULL) which kind of kernel ran the node. */
af_status af_kernel_run_kind(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *x, af_kernel_kind *ran, af_error *err);

/* Node n's fast kernel prepared for inputs of the given types (every dim known): the attributes
 * it reads, parsed once, and all that follows from them and the types, so that a run only
 * binds its data (kernel.h: af_exec.prepared). NULL when the node has nothing to prepare, will
 * not run fast, has types not all known, or cannot be prepared (its run then reports why).
 * Release with af_kernel_release. */
void *af_kernel_prepare(const af_node *n, const af_tensor *const *types);
void af_kernel_release(void *state);

#endif
