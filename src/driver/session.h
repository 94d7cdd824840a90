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

/* af_session_save and af_session_export_onnx are public (autofusion.h). */

/* The model (graph, arena, mapping) the session runs; borrowed. */
af_model *af_session_model(const af_session *s);
/* The report of the optimisation that prepared the session; NULL when none ran. */
const af_fusion_report *af_session_fusion_report(const af_session *s);

#endif
