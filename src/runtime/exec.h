/* The reference executor: runs a graph node by node with the op table's kernels.
 * Each run keeps one frame per graph being executed (subgraphs of If/Loop/Scan push a frame whose
 * parent is the enclosing one, so captured values are found by walking up). Intermediate tensors
 * are freed as soon as their last reader has run. */
#ifndef AF_EXEC_H
#define AF_EXEC_H

#include "ir/ir.h"

/* Run g. inputs[i] binds g->inputs[i] (NULL: use its initializer default; error if none).
 * outputs[0..g->noutputs) receive tensors owning their data. On error nothing leaks. */
af_status af_exec_graph(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                        af_error *err);

/* For control-flow kernels: run subgraph `body` inside the frame of the node being executed. */
af_status af_exec_subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                           int ninputs, af_tensor *outputs, af_error *err);

#endif
