/* Plugins for the plugin tests (tests/plugins/test_plugins.py), one source built once per
 * variant (tests/CMakeLists.txt):
 *   PLUGIN_GOOD        an OPAQUE op ai.test:Reverse (reverses the last axis; runs as its own
 *                      node) and three rules that must do no harm: RejectAllFusionOp (its check
 *                      refuses every Conv), BadMatchFusionOp (claims a match with indices out
 *                      of range) and ForeignNodeFusionOp (claims a node that is not in the graph)
 *   PLUGIN_NO_ENTRY    exports no af_plugin_describe
 *   PLUGIN_NULL_DESC   af_plugin_describe returns NULL
 *   PLUGIN_BAD_ABI     built for another ABI version
 *   PLUGIN_DUP_OP      defines ai.example:ScaledTanh again (loaded after the example plugin)
 *   PLUGIN_DUP_RULE    a rule named like a built-in one (ConvBNReluFusionOp)
 *   PLUGIN_BAD_RULE    a rule that fuses into an op no plugin defines
 *   PLUGIN_OURS        an op in the ai.onnx domain
 */
#include "autofusion_plugin.h"

#include <stdio.h>
#include <string.h>

static int infer_same(const af_pnode *node, const af_plugin_graph *g, int nin,
                      const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                      size_t len) {
    (void)node, (void)g;
    if (nin != 1 || nout != 1 || !in[0] || in[0]->dtype != AF_DTYPE_FLOAT) {
        snprintf(msg, len, "Reverse wants one float32 input");
        return 1;
    }
    out[0] = *in[0];
    out[0].data = NULL;
    out[0].nbytes = 0;
    out[0].owns_data = 0;
    return 0;
}

static int compute_reverse(const af_pnode *node, const af_plugin_graph *g, int nin,
                           const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                           size_t len) {
    (void)node, (void)g, (void)nin, (void)nout, (void)msg, (void)len;
    long long n = 1, w = in[0]->rank > 0 ? in[0]->dims[in[0]->rank - 1] : 1;
    for (int i = 0; i < in[0]->rank; i++) n *= in[0]->dims[i];
    const float *x = in[0]->data;
    float *y = out[0].data;
    for (long long r = 0; w > 0 && r < n / w; r++)
        for (long long i = 0; i < w; i++) y[r * w + i] = x[r * w + w - 1 - i];
    return 0;
}

static const char *reject_all(const af_pnode *anchor, const af_plugin_graph *g,
                              af_plugin_match *m) {
    (void)anchor, (void)g, (void)m;
    return "this rule refuses every Conv";
}

static const char *bad_match(const af_pnode *anchor, const af_plugin_graph *g,
                             af_plugin_match *m) {
    (void)g;
    m->nodes[0] = anchor;
    m->nnodes = 1;
    m->inputs[0].node = 5; /* no such covered node */
    m->inputs[0].input = 0;
    m->ninputs = 1;
    return NULL;
}

static const char *foreign_node(const af_pnode *anchor, const af_plugin_graph *g,
                                af_plugin_match *m) {
    (void)g;
    static char not_a_node[256];
    m->nodes[0] = anchor;
    m->nodes[1] = (const af_pnode *)not_a_node;
    m->nnodes = 2;
    m->ninputs = 0;
    return NULL;
}

static const af_custom_op ops[] = {
#if defined(PLUGIN_DUP_OP)
    {"ai.example", "ScaledTanh", AF_CUSTOM_OPAQUE, infer_same, compute_reverse, NULL, NULL, NULL},
#elif defined(PLUGIN_OURS)
    {"ai.onnx", "Reverse", AF_CUSTOM_OPAQUE, infer_same, compute_reverse, NULL, NULL, NULL},
#else
    {"ai.test", "Reverse", AF_CUSTOM_OPAQUE, infer_same, compute_reverse, NULL, NULL, NULL},
#endif
};

static const af_custom_rule rules[] = {
#if defined(PLUGIN_DUP_RULE)
    {"ConvBNReluFusionOp", "Conv", NULL, "", "Conv", reject_all, "ai.test", "Reverse"},
#elif defined(PLUGIN_BAD_RULE)
    {"NowhereFusionOp", "Conv", NULL, "", "Conv", reject_all, "ai.test", "Nowhere"},
#endif
    {"RejectAllFusionOp", "Conv", "never", "", "Conv", reject_all, "ai.test", "Reverse"},
    {"BadMatchFusionOp", "Conv", "a broken match", "", "Conv", bad_match, "ai.test", "Reverse"},
    {"ForeignNodeFusionOp", "Conv", "a node of no graph", "", "Conv", foreign_node, "ai.test",
     "Reverse"},
};

static const af_plugin_desc desc = {
#ifdef PLUGIN_BAD_ABI
    AF_PLUGIN_ABI_VERSION + 1,
#else
    AF_PLUGIN_ABI_VERSION,
#endif
    "autofusion test plugin", ops, (int)(sizeof ops / sizeof ops[0]), rules,
    (int)(sizeof rules / sizeof rules[0]),
};

#if defined(PLUGIN_NO_ENTRY)
const af_plugin_desc *not_the_entry_point(void) {
    return &desc;
}
#elif defined(PLUGIN_NULL_DESC)
const af_plugin_desc *af_plugin_describe(void) {
    return desc.nops < 0 ? &desc : NULL;
}
#else
const af_plugin_desc *af_plugin_describe(void) {
    return &desc;
}
#endif
