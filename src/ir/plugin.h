/* The plugin registry (plugin.c): custom ops and rules from shared libraries (see
 * include/autofusion_plugin.h), process-wide, filled by af_plugin_load and only added to.
 *
 * Custom ops live in the graph as AF_OP_CUSTOM nodes keeping their own domain and op_type;
 * kernels and shape functions find their af_custom_op by that pair.
 *
 * Invariant: a registered op or rule is never removed or changed, so pointers to them stay valid
 * for the process. */
#ifndef AF_IR_PLUGIN_H
#define AF_IR_PLUGIN_H

#include "autofusion_plugin.h"
#include "ir/ir.h"

#define AF_PLUGIN_MAX_OPS 256
#define AF_PLUGIN_MAX_RULES 32

/* The registered op (domain "" means ai.onnx), or NULL. */
const af_custom_op *af_plugin_op(const char *domain, const char *name);
/* The op of a "domain:name" key, or NULL. */
const af_custom_op *af_plugin_op_key(const char *key);
/* "domain:name" of op into buf. */
const char *af_plugin_op_key_of(const af_custom_op *op, char *buf, size_t len);
/* Registered rules, in load order. */
int af_plugin_rule_count(void);
const af_custom_rule *af_plugin_rule(int i);
/* The name of the plugin that registered rule i. */
const char *af_plugin_rule_owner(int i);
/* The graph queries plugins receive; nodes are af_node. */
extern const af_plugin_graph af_plugin_graph_api;

/* Load the plugin at path and register what it describes, whole or not at all. rule_taken
 * tells whether a rule name is already in use (the fusion stage's table: fusion/plugins.c). The
 * public af_plugin_load (include/autofusion_plugin.h) is this with that check. */
af_status af_plugin_register(const char *path, bool (*rule_taken)(const char *name),
                             af_error *err);

#endif
