/* IR -> ONNX: write a graph (typically the optimized, fused one) as an ONNX ModelProto file that
 * onnx.load, onnx.checker (for the standard ops) and Netron read.
 *
 * Our ops are written in domain "ai.autofusion" (opset version 1, imported only when used) with
 * their attributes, so fused ops show their provenance ("fusion_rule", "fused_nodes") and their
 * epilogue; constants become initializers (raw_data; constants that nothing reads or returns,
 * such as weights a pass replaced, are left out); values with a known type get a
 * ValueInfoProto (graph inputs and outputs always, intermediates in value_info). Our importer
 * reads the file back into an equivalent graph.
 *
 * Invariant: the file is written whole or not at all (a temporary file renamed into place). */
#ifndef AF_ONNX_EXPORT_H
#define AF_ONNX_EXPORT_H

#include "ir/ir.h"

/* Write the main graph g to path (ir_version 8). The file is written under a temporary name and
 * renamed into place. Models of 2 GiB or more are refused (protobuf's limit; ONNX then needs
 * external data, which the exporter does not write). */
af_status af_onnx_export(const af_graph *g, const char *path, af_error *err);

#endif
