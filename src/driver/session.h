/* What the CLI (tools/) and the tests need from a session beyond the public API: the one
 * internal header the CLI includes, so it brings the fusion report and rule table
 * (fusion/fusion.h) and the tensor files (onnx/onnx.h: .npy, .pb) along.
 *
 * Invariant: everything returned is borrowed from the session and lives as long as it. */
#ifndef AF_DRIVER_SESSION_H
#define AF_DRIVER_SESSION_H

#include "autofusion.h"
#include "fusion/fusion.h"
#include "onnx/onnx.h"

/* Write the session's graph as a compiled model (format/afm.h) at path, with its memory plan,
 * its precision mode, its fusion report and the command line that made it (may be NULL). */
af_status af_session_save(af_session *s, const char *path, const char *command_line,
                          af_error *err);
/* Write the session's graph as ONNX (onnx/export.h: fused ops in domain ai.autofusion), for
 * Netron. */
af_status af_session_export_onnx(const af_session *s, const char *path, af_error *err);

/* The model (graph, arena, mapping) the session runs; borrowed. */
af_model *af_session_model(const af_session *s);
/* The report of the optimisation that prepared the session; NULL when none ran. */
const af_fusion_report *af_session_fusion_report(const af_session *s);

#endif
