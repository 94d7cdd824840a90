/* What the CLI and tests need from a session beyond the public API. */
#ifndef AF_SESSION_H
#define AF_SESSION_H

#include "autofusion.h"
#include "fusion/fusion.h"
#include "onnx/onnx.h"

/* The model (graph, arena, mapping) the session runs; borrowed. */
af_model *af_session_model(const af_session *s);
/* The report of the optimisation that prepared the session; NULL when none ran. */
const af_fusion_report *af_session_fusion_report(const af_session *s);

#endif
