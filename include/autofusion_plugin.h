/* autofusion plugins: custom operators and fusion rules from shared libraries.
 *
 * A plugin is a shared library that exports one function,
 *
 *     const af_plugin_desc *af_plugin_describe(void);
 *
 * returning a description of what it adds (static data: it must stay valid while the process
 * runs). It is loaded with `--plugin=lib.so` (repeatable) on the command line, with
 * AUTOFUSION_PLUGINS=a.so:b.so in the environment, or with af_plugin_load() from C, before the
 * models that need it are prepared.
 *
 * Custom operators (af_custom_op) are ONNX nodes of the plugin's domain: shape inference and a
 * kernel, and a class. An ELEMWISE op that also gives `map` (y = f(x) over an array) and a
 * BROADCAST op that gives `map2` (y = f(x, b), b broadcast to x) join fusion like built-in
 * activations and binary ops: the generic fuser places them in the epilogue of the conv, GEMM or
 * fused op before them, where they run on each output tile while it is in cache.
 *
 * Custom fusion rules (af_custom_rule) run before the built-in ones, appear in the fusion report,
 * `--list-fusions` and the switches (--disable_fusion, AUTOFUSION_DISABLE_LIST,
 * --fusion_switch_file) under their own name, and replace what they match by one node of a custom
 * op (the rule's fused kernel, registered by the same plugin or an earlier one).
 *
 * A compiled .afm records the custom ops it uses; loading it without their plugin is an error
 * that names them. Every problem with a plugin (missing file, missing entry point, another ABI
 * version, a name registered twice, a malformed description) is a clear error, never a crash.
 *
 * Threads: compute runs on one thread at a time per node; map and map2 run from the worker
 * threads concurrently, each call on its own piece of the output, and must be thread-safe
 * (pure functions of their arguments are). params runs once, when the op joins an epilogue: its
 * values are stored in the compiled model.
 *
 * ABI: a plugin is built against AF_PLUGIN_ABI_VERSION and says so in its description; another
 * version is refused. Strings are UTF-8, NUL-terminated. Functions return 0 on success, or
 * non-zero after writing a one-line reason into msg (msg_len bytes, always NUL-terminated).
 */
#ifndef AUTOFUSION_PLUGIN_H
#define AUTOFUSION_PLUGIN_H

#include "autofusion.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AF_PLUGIN_ABI_VERSION 1

/* A node of the graph (opaque), read through af_plugin_graph. */
typedef struct af_pnode af_pnode;

/* What a plugin may ask about a node while inferring shapes, computing or matching. */
typedef struct af_plugin_graph {
    const char *(*op_type)(const af_pnode *n);
    const char *(*domain)(const af_pnode *n); /* "" for ai.onnx */
    const char *(*name)(const af_pnode *n);
    int (*num_inputs)(const af_pnode *n);
    int (*num_outputs)(const af_pnode *n);
    /* Who input i is: two inputs (of any nodes) read the same tensor iff these are equal; NULL
     * for an omitted input. Opaque: only for comparing. */
    const void *(*input_id)(const af_pnode *n, int input);
    /* The node producing input i; NULL for a graph input, a constant or an omitted input. */
    const af_pnode *(*producer)(const af_pnode *n, int input);
    /* Readers of output o (-1 when the output is a graph output: it cannot be fused away). */
    int (*num_readers)(const af_pnode *n, int output);
    const af_pnode *(*reader)(const af_pnode *n, int output, int k);
    /* Input i's type (dims -1 where unknown); data is set when it is a constant. 0 or -1. */
    int (*input_type)(const af_pnode *n, int input, af_tensor *type);
    long long (*attr_int)(const af_pnode *n, const char *name, long long dflt);
    float (*attr_float)(const af_pnode *n, const char *name, float dflt);
} af_plugin_graph;

typedef enum af_custom_class {
    AF_CUSTOM_ELEMWISE = 0,  /* y[i] = f(x[i]), one float input */
    AF_CUSTOM_BROADCAST = 1, /* y[i] = f(x[i], b[i]), b broadcasting to x */
    AF_CUSTOM_OPAQUE = 2     /* anything else: runs as its own node */
} af_custom_class;

typedef struct af_custom_op {
    const char *domain; /* not "" / "ai.onnx" / "ai.autofusion" */
    const char *name;
    af_custom_class op_class;
    /* out[0..nout): dtype, rank and dims (-1 unknown) from the inputs' types. */
    int (*infer)(const af_pnode *node, const af_plugin_graph *g, int nin,
                 const af_tensor *const *in, int nout, af_tensor *out, char *msg, size_t msg_len);
    /* The kernel: outputs arrive allocated (dims known, zeroed). */
    int (*compute)(const af_pnode *node, const af_plugin_graph *g, int nin,
                   const af_tensor *const *in, int nout, af_tensor *out, char *msg,
                   size_t msg_len);
    /* Up to 2 parameters of the node (from its attributes) that map / map2 receive; may be NULL
     * (both 0). Taken when the op joins an epilogue. */
    void (*params)(const af_pnode *node, const af_plugin_graph *g, float p[2]);
    /* ELEMWISE: y[i] = f(x[i]) for i < n (y may be x). Float32. NULL: the op does not fuse. */
    void (*map)(const float p[2], const float *x, float *y, long long n);
    /* BROADCAST: y[i] = f(x[i], b[i]) for i < n, x the fused chain's value, b the operand
     * (y may be x). NULL: the op does not fuse. */
    void (*map2)(const float p[2], const float *x, const float *b, float *y, long long n);
} af_custom_op;

#define AF_PLUGIN_MATCH_MAX 16

/* What a rule's check says it matched. */
typedef struct af_plugin_match {
    const af_pnode *nodes[AF_PLUGIN_MATCH_MAX]; /* the covered nodes, the anchor first */
    int nnodes;
    struct {
        int node, input; /* fused input k is input `input` of covered node `node` */
    } inputs[AF_PLUGIN_MATCH_MAX];
    int ninputs;
    int out_node, out_output; /* the pattern's output: output `out_output` of covered node */
    struct {
        const char *name; /* static */
        int is_float;
        long long i;
        float f;
    } attrs[8]; /* attributes of the fused node */
    int nattrs;
} af_plugin_match;

typedef struct af_custom_rule {
    const char *name;       /* "NameFusionOp": report, switches, --list-fusions */
    const char *pattern;    /* for --list-fusions ("Mul+Add") */
    const char *conditions; /* for --list-fusions */
    const char *anchor_domain, *anchor_op; /* the op whose nodes check is offered ("" ai.onnx) */
    /* NULL to fuse (m filled), else a short static reason (a near miss in the report). The
     * engine then checks what it always checks: every covered intermediate is read only inside
     * the match and is not a graph output. */
    const char *(*check)(const af_pnode *anchor, const af_plugin_graph *g, af_plugin_match *m);
    const char *fused_domain, *fused_op; /* the custom op that replaces the match */
} af_custom_rule;

typedef struct af_plugin_desc {
    int abi_version; /* AF_PLUGIN_ABI_VERSION */
    const char *name;
    const af_custom_op *ops;
    int nops;
    const af_custom_rule *rules;
    int nrules;
} af_plugin_desc;

/* The entry point a plugin exports. */
typedef const af_plugin_desc *(*af_plugin_describe_fn)(void);

/* Load a plugin (once per path: loading it again does nothing). */
af_status af_plugin_load(const char *path, af_error *err);
/* Load every plugin of AUTOFUSION_PLUGINS (colon-separated paths); those loaded already are
 * found by path and skipped, so sessions may call it each time. */
af_status af_plugin_load_env(af_error *err);

#ifdef __cplusplus
}
#endif
#endif
