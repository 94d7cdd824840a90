/* The per-node profile: while a runtime has one, every node a run executes is recorded (node,
 * start, duration) and af_profile_write renders the records as a Chrome trace (the JSON array
 * of "X" events that ONNX Runtime's profiler writes and Perfetto / chrome://tracing open), with
 * each event's op, the kind of kernel that ran it (args.kernel: "fast", "reference" or
 * "direct", as ONNX Runtime names each node's provider), the original nodes it fused and its
 * fusion rule. af_profile_reference sums up the nodes that ran on reference kernels.
 *
 * Ownership: a profile borrows the nodes it records; write it before the graph goes.
 *
 * Invariant: events are in the order the nodes ran. */
#ifndef AF_RUNTIME_PROFILE_H
#define AF_RUNTIME_PROFILE_H

#include "ir/ir.h"

typedef struct af_profile af_profile;

af_profile *af_profile_new(void);
void af_profile_free(af_profile *p);
/* Microseconds since the profile was made (monotonic clock). */
double af_profile_now(const af_profile *p);
/* Record node n (NULL: a whole run, named `what`) from start_us for dur_us, run by a kernel of
 * kind `kernel` (kernels/fast/dispatch.h: af_kernel_kind; -1: none, a run or a node whose bytes
 * were in place already). Records that do not fit in memory are dropped (and counted). */
void af_profile_add(af_profile *p, const af_node *n, const char *what, int kernel,
                    double start_us, double dur_us);
/* The nodes recorded as run on a reference kernel (AF_KERNEL_REFERENCE), their ops and their
 * share of the recorded runs' time (include/autofusion.h). */
void af_profile_reference(const af_profile *p, af_reference_stats *out);
/* Write the trace to path; `model` and `isa` go into every event's args. */
af_status af_profile_write(const af_profile *p, const char *path, const char *model,
                           const char *isa, af_error *err);

#endif
