/* The interface every kernel is written against: the function types of a shape function and a
 * kernel, and af_exec, what a kernel runs with (the threads of its parallel loops, scratch
 * memory, and for control flow the executor that runs subgraphs). exec.c implements it
 * (our thread pool); the executor (runtime/exec.c) makes one per run.
 *
 * This folder holds the kernels in three rooms, from the bottom up:
 *   ref/   the reference kernels and every op's shape function: plain ONNX semantics, the
 *          oracle the fast kernels are tested against (no SIMD, no ISA checks, no calls into
 *          fast code);
 *   simd/  the CPU (ISA choice, caches, cores), the vector kernel tables compiled once per ISA,
 *          the vector math;
 *   fast/  the fast kernels (GEMM core, channels-last convolution and pooling, fused ops,
 *          attention, vectorised elementwise ops) and dispatch.c, the one place that decides
 *          which kernel runs a node.
 * Kernels receive tensors whose dims are all known.
 *
 * Invariant: a kernel reads and writes only its inputs, its outputs and the scratch
 * af_exec_scratch gave it. */
#ifndef AF_KERNELS_KERNEL_H
#define AF_KERNELS_KERNEL_H

#include "ir/ir.h"

typedef struct af_exec af_exec;

/* Shape and dtype inference. `in[i]` is NULL for an omitted optional input; an input's data is
 * non-NULL when its value is known (constant at compile time, always at run time). Fill
 * out[0..node->nout). Unknown dims are -1; at run time every dim must be known unless the
 * kernel allocates that output itself (data-dependent shapes, control flow). */
typedef af_status (*af_shape_fn)(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_error *err);
/* A kernel. Outputs whose dims are all known arrive allocated (zeroed, unless the op's row says
 * its kernel writes every element); others have data == NULL and the kernel allocates them with
 * af_tensor_alloc. x may be NULL (one thread, no scratch: constant folding). */
typedef af_status (*af_kernel_fn)(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_exec *x, af_error *err);

/* A fast kernel's answer for a case it does not take (another dtype, a broadcast its vector
 * code cannot read): the dispatcher (fast/dispatch.c) then runs the reference kernel. Never
 * returned past the dispatcher. */
#define AF_DECLINED ((af_status)-1)

/* ---- threads and scratch ------------------------------------------------------------------------
 * A worker set is the thread pool (exec.c: persistent workers that join parallel loops while
 * the caller works, spin briefly, sleep between runs) and the scratch memory kernels borrow while they
 * run. Scratch grows to the largest request and then stays, so a steady-state run allocates
 * nothing for it. */
typedef struct af_workers af_workers;

/* What a parallel loop costs and what work runs at, on one core: the runtime fills it from the
 * machine's calibration (runtime/machine.c). */
typedef struct af_parallel_costs {
    int64_t handoff_ns; /* a loop's round trip through a spinning worker (publish, join, leave) */
    int64_t wake_ns;    /* the same through a sleeping worker */
    int64_t spin_ns;    /* how long an idle worker spins before it sleeps */
    double flops_per_ns, bytes_per_ns; /* for af_exec_work_ns */
} af_parallel_costs;
/* Figures for a worker set nobody has measured. */
void af_parallel_costs_default(af_parallel_costs *c);

/* threads >= 1 (the caller resolves "every core"); costs NULL: the defaults. */
af_status af_workers_new(int threads, const af_parallel_costs *costs, af_workers **out,
                         af_error *err);
void af_workers_free(af_workers *w);
int af_workers_threads(const af_workers *w);
/* A run ended: idle workers sleep now instead of spinning (until the next loop wakes them), so
 * that an idle session leaves the cores to whoever needs them. */
void af_workers_park(af_workers *w);
/* Calibration: ns of a loop's round trip through a worker (published, joined, left, seen to
 * have left), with the workers spinning (asleep false) or asleep (waits up to 100 ms for them
 * to fall asleep). 0 with one thread. */
int64_t af_workers_probe(af_workers *w, bool asleep);

/* A subgraph run by the executor inside the frame of the node being executed (If, Loop, Scan). */
typedef af_status (*af_subgraph_fn)(af_exec *x, const af_graph *body,
                                    const af_tensor *const *inputs, int ninputs,
                                    af_tensor *outputs, af_error *err);

/* What a kernel runs with; the executor fills it. `own` holds the scratch of a run without a
 * worker set (one thread), freed with af_exec_release. */
struct af_exec {
    af_workers *w;           /* NULL: one thread */
    af_subgraph_fn subgraph; /* NULL: no executor (control flow cannot run) */
    void *frame;             /* the executor's: the frame of the node being executed */
    /* The node's prepared state (fast/dispatch.h: af_kernel_prepare) when the executor holds
     * one and this run's inputs have the types it was prepared for; NULL otherwise, and the
     * kernel derives everything from its node and inputs. */
    const void *prepared;
    void *own;
    size_t own_size;
};

/* An exec on w (may be NULL) for the executor's subgraph function (may be NULL). */
void af_exec_init(af_exec *x, af_workers *w, af_subgraph_fn subgraph);
/* Free what a run without a worker set borrowed. */
void af_exec_release(af_exec *x);

/* Threads available to this run (1 without workers, or x NULL). */
int af_exec_threads(const af_exec *x);
/* fn(ctx, slot, begin, end) over pieces that cover [0, n) once, run in parallel; returns when
 * every item is done. `ns` is the whole loop's work on one core (af_exec_work_ns): below about
 * twice a hand-off the loop runs on the caller alone, and sleeping workers are woken only for
 * work worth a wake-up. x may be NULL (one call over all of [0, n)). Slots are 0 to
 * min(af_exec_threads(), n, AF_EXEC_MAX_SLOTS) - 1. Slot s starts on the s-th of that many
 * contiguous, nearly equal shares and takes its pieces from the front; a slot whose share is
 * done takes the back half of what is left of another's (balancing threads that run at
 * different speeds: a neighbour on the core, data in the other core's cache). So fn is called
 * several times per slot, never twice at once for one slot: a slot may index per-thread
 * scratch or state kept between its calls, but what fn computes for an item must not depend
 * on the slot or the pieces (that keeps results the same from run to run). */
enum { AF_EXEC_MAX_SLOTS = 64 };
typedef void (*af_range_fn)(void *ctx, int slot, int64_t begin, int64_t end);
void af_exec_parallel(af_exec *x, int64_t n, double ns, af_range_fn fn, void *ctx);
/* The time on one core of work that does `flops` floating-point operations and moves `bytes`
 * through the caches, at the worker set's calibrated rates. */
double af_exec_work_ns(const af_exec *x, double flops, double bytes);
/* `bytes` of 64-byte aligned scratch, valid until the calling kernel returns (one request per
 * kernel call: a second one may return the same memory). NULL when out of memory or x is NULL. */
void *af_exec_scratch(af_exec *x, size_t bytes);
/* For control-flow kernels: run subgraph `body` inside the frame of the node being executed.
 * AF_ERR_INTERNAL when x has no executor. */
af_status af_exec_subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                           int ninputs, af_tensor *outputs, af_error *err);

#endif
