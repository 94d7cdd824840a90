/* The executor: runs a graph node by node, each with the kernel the dispatcher chooses.
 * Each run keeps one frame per graph being executed (subgraphs of If/Loop/Scan push a frame whose
 * parent is the enclosing one, so captured values are found by walking up). Intermediate tensors
 * are freed as soon as their last reader has run.
 *
 * Invariant: a run returns its outputs owned by the caller and leaves nothing allocated on
 * error. */
#ifndef AF_EXEC_H
#define AF_EXEC_H

#include "kernels/kernel.h"

/* ---- the runtime ------------------------------------------------------------------------------
 * A runtime is a session's worker set (threads and kernel scratch, kernels/kernel.h), its
 * profile, and the main graph's per-value arrays kept between runs. A run without one
 * (af_exec_graph) is single-threaded and frees its scratch when it ends. */
typedef struct af_runtime af_runtime;

/* threads: 0 for every core. */
af_status af_runtime_new(int threads, af_runtime **out, af_error *err);
void af_runtime_free(af_runtime *rt);
int af_runtime_threads(const af_runtime *rt);
/* Profiling: on, every node run through rt is recorded until it is turned off (which drops
 * the records); af_runtime_profile_get gives the records (NULL when off). */
struct af_profile;
af_status af_runtime_profile(af_runtime *rt, bool on, af_error *err);
struct af_profile *af_runtime_profile_get(af_runtime *rt);
/* Prepare the kernels of g's nodes once (kernels/fast/dispatch.h: af_kernel_prepare), for the
 * runs of g on rt: a node then gets its prepared state on every run whose inputs have its
 * values' types. Once per runtime; g must outlive rt and stay as it is. */
af_status af_runtime_prepare(af_runtime *rt, const af_graph *g, af_error *err);
/* fn(x, ctx) with an af_exec on rt (may be NULL): for tests and benchmarks that call kernels
 * directly. */
void af_runtime_call(af_runtime *rt, void (*fn)(af_exec *x, void *ctx), void *ctx);
/* Node n's kernel (as the dispatcher chooses it) on inputs in and outputs out (allocated as the
 * executor would), on rt (may be NULL: one thread). For tests. */
af_status af_runtime_kernel(af_runtime *rt, const af_node *n, const af_tensor *const *in,
                            af_tensor *out, af_error *err);

/* Run g. inputs[i] binds g->inputs[i] (NULL: use its initializer default; error if none).
 * outputs[0..g->noutputs) receive tensors owning their data. On error nothing leaks. */
af_status af_exec_graph(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                        af_error *err);
/* The same on rt's threads (rt prepared for g, or not), without a memory plan: every
 * intermediate is allocated, so any input dims go (int8 calibration runs a graph this way). */
af_status af_exec_graph_on(const af_graph *g, af_runtime *rt, const af_tensor *const *inputs,
                           af_tensor *outputs, af_error *err);

#endif
