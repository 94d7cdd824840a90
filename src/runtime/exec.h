/* The reference executor: runs a graph node by node with the op table's kernels.
 * Each run keeps one frame per graph being executed (subgraphs of If/Loop/Scan push a frame whose
 * parent is the enclosing one, so captured values are found by walking up). Intermediate tensors
 * are freed as soon as their last reader has run. */
#ifndef AF_EXEC_H
#define AF_EXEC_H

#include "ir/ir.h"

/* ---- the runtime: threads and scratch ---------------------------------------------------------
 * A runtime is the thread pool (pthreadpool: persistent workers, low-latency parallel loops) and
 * the scratch memory that kernels borrow while they run. A session owns one; a run without one
 * (af_exec_graph) is single-threaded and frees its scratch when it ends. Scratch grows to the
 * largest request and then stays, so a steady-state run allocates nothing for it. */
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
/* fn(x, ctx) with an af_exec on rt (may be NULL): for tests and benchmarks that call kernels
 * directly. */
void af_runtime_call(af_runtime *rt, void (*fn)(af_exec *x, void *ctx), void *ctx);
/* Node n's kernel on inputs in and outputs out (allocated as the executor would), on rt (may be
 * NULL: one thread). For tests. */
af_status af_runtime_kernel(af_runtime *rt, const af_node *n, const af_tensor *const *in,
                            af_tensor *out, af_error *err);

/* For kernels. Threads available to this run (1 without a runtime). */
int af_exec_threads(const af_exec *x);
/* fn(ctx, slot, begin, end) over pieces that cover [0, n) once, run in parallel; returns when
 * every item is done. x may be NULL (one call over all of [0, n)). Slots are 0 to
 * min(af_exec_threads(), n, AF_EXEC_MAX_SLOTS) - 1. Slot s starts on the s-th of that many
 * contiguous, nearly equal shares and takes its pieces from the front; a slot whose share is
 * done takes the back half of what is left of another's (balancing threads that run at
 * different speeds: a neighbour on the core, data in the other core's cache). So fn is called
 * several times per slot, never twice at once for one slot: a slot may index per-thread
 * scratch or state kept between its calls, but what fn computes for an item must not depend
 * on the slot or the pieces (that keeps results the same from run to run). */
enum { AF_EXEC_MAX_SLOTS = 64 };
typedef void (*af_range_fn)(void *ctx, int slot, int64_t begin, int64_t end);
void af_exec_parallel(af_exec *x, int64_t n, af_range_fn fn, void *ctx);
/* `bytes` of 64-byte aligned scratch, valid until the calling kernel returns (one request per
 * kernel call: a second one may return the same memory). NULL when out of memory. */
void *af_exec_scratch(af_exec *x, size_t bytes);

/* Run g. inputs[i] binds g->inputs[i] (NULL: use its initializer default; error if none).
 * outputs[0..g->noutputs) receive tensors owning their data. On error nothing leaks. */
af_status af_exec_graph(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                        af_error *err);

/* For control-flow kernels: run subgraph `body` inside the frame of the node being executed. */
af_status af_exec_subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                           int ninputs, af_tensor *outputs, af_error *err);

#endif
