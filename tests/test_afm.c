/* Compiled model (.afm) and ONNX export tests.
 *
 *  - round trips: a small conv net built here, a graph carrying every attribute kind on our own
 *    ops (with subgraphs), and every conformance model (plain and optimized): save, load, same
 *    IR (names, types, attributes, constants, subgraphs) and bit-identical outputs;
 *  - damage: every truncation and every single-bit flip of a file is a clean error; words
 *    overwritten with hostile values and the checksums recomputed (a forger's file) never crash
 *    the loader, and what loads still verifies and runs, with its memory plan too (the plan's
 *    own forgeries are in test_plan.c);
 *  - metadata, `inspect`, bad files;
 *  - export: the ONNX file re-imports to the same outputs and passes onnx.checker (when
 *    /usr/bin/python3 has onnx).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"
#include "cli.h"

#include "format/afm.h"
#include "driver/compile.h"
#include "onnx/export.h"
#include "passes/passes.h"
#include "runtime/exec.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

/* A forged file may ask the executor for a tensor of hundreds of GiB; the allocation fails and
 * the run reports AF_ERR_NOMEM, as it does outside AddressSanitizer (which would abort). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* In memory when possible: the damage tests write tens of thousands of small files. */
static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
    return p;
}

/* ---- building graphs ------------------------------------------------------------------------- */

static uint32_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

static af_graph *new_graph(af_arena *a, const char *file, af_graph *parent) {
    af_graph *g = af_graph_new(a, file, parent);
    assert_non_null(g);
    g->name = parent ? "body" : "net";
    if (!parent) {
        g->opsets = af_arena_calloc(a, 2, sizeof(af_opset));
        g->opsets[0] = (af_opset){"", 17};
        g->opsets[1] = (af_opset){AF_DOMAIN, 1};
        g->nopsets = 2;
    }
    g->inputs = af_arena_calloc(a, 8, sizeof(af_value *));
    g->outputs = af_arena_calloc(a, 8, sizeof(af_value *));
    return g;
}

static af_value *add_input(af_graph *g, const char *name, af_dtype dt, int rank,
                           const int64_t *dims) {
    af_value *v = af_value_new(g, name);
    v->type.dtype = dt;
    v->type.rank = rank;
    for (int i = 0; i < rank; i++) v->type.dims[i] = dims[i];
    v->is_input = true;
    g->inputs[g->ninputs++] = v;
    return v;
}

static void add_output(af_graph *g, af_value *v) {
    if (v->graph == g) v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

/* A float constant with random values (positive when `positive`, e.g. variances). */
static af_value *konst(af_graph *g, const char *name, int rank, const int64_t *dims,
                       bool positive) {
    af_value *v = af_value_new_const(g, name, AF_DTYPE_FLOAT, rank, dims);
    assert_non_null(v);
    float *p = v->type.data;
    for (size_t i = 0; i < v->type.nbytes / 4; i++)
        p[i] = positive ? 0.5f + fabsf(frand()) : frand();
    return v;
}

/* A node of op `op` (looked up in `domain`) reading `in` and writing nout new values named
 * "<name>:k". */
static af_node *add_node(af_graph *g, const char *domain, const char *op, const char *name,
                         int nin, af_value *const *in, int nout) {
    af_op id = af_op_lookup(domain, op);
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, name, nin, nout);
    assert_non_null(n);
    n->domain = domain;
    for (int k = 0; k < nin; k++)
        if (in[k]) af_node_set_input(n, k, in[k]);
    for (int k = 0; k < nout; k++) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s:%d", name, k);
        af_node_set_output(n, k, af_value_new(g, af_arena_strdup(g->arena, buf)));
    }
    return n;
}

static void attr_int(af_node *n, const char *name, int64_t v) {
    af_node_add_attr(n, name, AF_ATTR_INT)->i = v;
}
static void attr_float(af_node *n, const char *name, float v) {
    af_node_add_attr(n, name, AF_ATTR_FLOAT)->f = v;
}
static void attr_str(af_node *n, const char *name, const char *s, size_t len) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_STRING);
    a->s = af_arena_strndup(n->graph->arena, s, len);
    a->slen = len;
}
static void attr_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INTS);
    a->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    if (count) memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
    a->n = count;
}
static void attr_floats(af_node *n, const char *name, int count, const float *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_FLOATS);
    a->floats = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(float));
    if (count) memcpy(a->floats, v, (size_t)count * sizeof(float));
    a->n = count;
}
static void attr_strs(af_node *n, const char *name, int count, const char *const *v) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_STRINGS);
    a->strings = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(char *));
    for (int k = 0; k < count; k++) a->strings[k] = v[k];
    a->n = count;
}

static af_tensor *arena_tensor(af_arena *a, af_dtype dt, int rank, const int64_t *dims) {
    af_tensor *t = af_arena_alloc(a, sizeof *t);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->nbytes = (size_t)af_tensor_numel(t) * af_dtype_size(dt);
    t->data = af_arena_alloc(a, t->nbytes);
    for (size_t i = 0; i < t->nbytes; i++) ((uint8_t *)t->data)[i] = (uint8_t)(i * 37 + 11);
    return t;
}

/* X[1,3,12,12] -> Conv 3x3 -> BatchNorm -> Relu -> grouped dilated Conv -> Add residual -> Relu
 * -> GlobalAveragePool -> Flatten -> Gemm -> Y[1,10]: a ResNet in miniature. */
static af_graph *conv_net(af_arena *a) {
    rng = 777;
    af_graph *g = new_graph(a, "convnet", NULL);
    int64_t xd[] = {1, 3, 12, 12}, w1d[] = {8, 3, 3, 3}, cd[] = {8}, w2d[] = {8, 4, 3, 3},
            fcd[] = {10, 8}, fbd[] = {10};
    af_value *x = add_input(g, "input", AF_DTYPE_FLOAT, 4, xd);
    af_value *in1[] = {x, konst(g, "w1", 4, w1d, false), konst(g, "b1", 1, cd, false)};
    af_node *c1 = add_node(g, "", "Conv", "conv1", 3, in1, 1);
    attr_ints(c1, "kernel_shape", 2, (int64_t[]){3, 3});
    attr_ints(c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
    af_value *in2[] = {c1->out[0], konst(g, "bn_scale", 1, cd, false),
                       konst(g, "bn_bias", 1, cd, false), konst(g, "bn_mean", 1, cd, false),
                       konst(g, "bn_var", 1, cd, true)};
    af_node *bn = add_node(g, "", "BatchNormalization", "bn1", 5, in2, 1);
    attr_float(bn, "epsilon", 1e-5f);
    af_node *r1 = add_node(g, "", "Relu", "relu1", 1, bn->out, 1);
    af_value *in3[] = {r1->out[0], konst(g, "w2", 4, w2d, false), konst(g, "b2", 1, cd, false)};
    af_node *c2 = add_node(g, "", "Conv", "conv2", 3, in3, 1);
    attr_int(c2, "group", 2);
    attr_ints(c2, "dilations", 2, (int64_t[]){2, 2});
    attr_ints(c2, "pads", 4, (int64_t[]){2, 2, 2, 2});
    af_value *in4[] = {c2->out[0], r1->out[0]};
    af_node *add = add_node(g, "", "Add", "add", 2, in4, 1);
    af_node *r2 = add_node(g, "", "Relu", "relu2", 1, add->out, 1);
    af_node *gap = add_node(g, "", "GlobalAveragePool", "gap", 1, r2->out, 1);
    af_node *fl = add_node(g, "", "Flatten", "flatten", 1, gap->out, 1);
    attr_int(fl, "axis", 1);
    af_value *in5[] = {fl->out[0], konst(g, "fc_w", 2, fcd, false),
                       konst(g, "fc_b", 1, fbd, false)};
    af_node *fc = add_node(g, "", "Gemm", "fc", 3, in5, 1);
    attr_int(fc, "transB", 1);
    add_output(g, fc->out[0]);
    af_error err;
    assert_int_equal(af_graph_infer_shapes(g, &err), AF_OK);
    return g;
}

/* Our ops with every attribute kind: a Gelu whose extra attributes are one of each kind (a
 * kernel ignores attributes it does not read), subgraph attributes that capture outer values,
 * and a FusedConv with its epilogue and provenance. */
static af_graph *attr_net(af_arena *a) {
    rng = 4242;
    af_graph *g = new_graph(a, "attrnet", NULL);
    int64_t xd[] = {1, 2, 5, 5}, wd[] = {3, 2, 3, 3}, bd[] = {3}, td[] = {2, 3}, sd[] = {4};
    af_value *x = add_input(g, "x", AF_DTYPE_FLOAT, 4, xd);
    af_value *scale = konst(g, "scale", 1, sd, false);
    af_node *gelu = add_node(g, AF_DOMAIN, "Gelu", "gelu", 1, &x, 1);
    attr_str(gelu, "approximate", "tanh", 4);
    attr_float(gelu, "f", -2.5f);
    attr_int(gelu, "i", INT64_MIN);
    attr_str(gelu, "s", "a\0b\xff", 4); /* bytes, not text */
    af_attr *t = af_node_add_attr(gelu, "t", AF_ATTR_TENSOR);
    t->t = arena_tensor(a, AF_DTYPE_INT64, 2, td);
    attr_floats(gelu, "fs", 3, (float[]){1.5f, -0.0f, INFINITY});
    attr_ints(gelu, "is", 3, (int64_t[]){-1, 0, INT64_MAX});
    attr_ints(gelu, "empty", 0, NULL);
    attr_strs(gelu, "ss", 3, (const char *[]){"alpha", "", "gamma"});
    af_attr *ts = af_node_add_attr(gelu, "ts", AF_ATTR_TENSORS);
    ts->tensors = af_arena_calloc(a, 3, sizeof(af_tensor *));
    ts->tensors[0] = arena_tensor(a, AF_DTYPE_UINT8, 1, bd);
    ts->tensors[1] = arena_tensor(a, AF_DTYPE_DOUBLE, 0, NULL);
    ts->n = 2;
    /* Subgraphs: one reads `scale` of the main graph, a nested one reads `x` two levels up. */
    af_graph *s1 = new_graph(a, "attrnet", g);
    af_node *id1 = add_node(s1, "", "Identity", "s1_id", 1, &scale, 1);
    add_output(s1, id1->out[0]);
    af_graph *s2 = new_graph(a, "attrnet", g), *s3 = new_graph(a, "attrnet", s2);
    af_node *id3 = add_node(s3, "", "Neg", "s3_neg", 1, &x, 1);
    add_output(s3, id3->out[0]);
    add_output(s3, scale); /* an outer value passed through */
    af_node *holder = add_node(s2, AF_DOMAIN, "Silu", "s2_silu", 1, &scale, 1);
    af_node_add_attr(holder, "inner", AF_ATTR_GRAPH)->g = s3;
    add_output(s2, holder->out[0]);
    af_node_add_attr(gelu, "g", AF_ATTR_GRAPH)->g = s1;
    af_attr *gs = af_node_add_attr(gelu, "gs", AF_ATTR_GRAPHS);
    gs->graphs = af_arena_calloc(a, 2, sizeof(af_graph *));
    gs->graphs[0] = s2;
    gs->n = 1;
    /* Record the captures as the importer does. */
    af_graph_find(s1, "scale");
    af_graph_find(s3, "x");
    af_graph_find(s3, "scale");
    af_graph_find(s2, "scale");
    /* FusedConv(x) with bias, Relu and a per-channel Mul by `cscale` in its epilogue. */
    int64_t csd[] = {3, 1, 1};
    af_value *fin[] = {gelu->out[0], konst(g, "fw", 4, wd, false), konst(g, "fb", 1, bd, false),
                       konst(g, "cscale", 3, csd, false)};
    af_node *fc = add_node(g, AF_DOMAIN, "FusedConv", "fused_conv", 4, fin, 1);
    attr_ints(fc, "kernel_shape", 2, (int64_t[]){3, 3});
    attr_ints(fc, "pads", 4, (int64_t[]){1, 1, 1, 1});
    attr_ints(fc, "strides", 2, (int64_t[]){1, 1});
    attr_ints(fc, "dilations", 2, (int64_t[]){1, 1});
    attr_int(fc, "group", 1);
    attr_ints(fc, "epilogue", 6, (int64_t[]){5, -1, 0, 3, 3, 0});
    attr_floats(fc, "epilogue_params", 4, (float[]){0, 0, 0, 0});
    attr_str(fc, "fusion_rule", "ConvBNReluFusionOp", 18);
    attr_strs(fc, "fused_nodes", 3, (const char *[]){"conv", "bn", "relu"});
    add_output(g, fc->out[0]);
    add_output(g, gelu->out[0]);
    af_error err;
    assert_int_equal(af_graph_toposort(g, &err), AF_OK);
    assert_int_equal(af_graph_infer_shapes(g, &err), AF_OK);
    assert_int_equal(af_graph_verify(g, &err), AF_OK);
    return g;
}

/* ---- comparing graphs and runs (no cmocka asserts: also used in forked children) ------------- */

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), false)

static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool same_tensor(const af_tensor *a, const af_tensor *b, bool data) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    if (!data) return true;
    return a->nbytes == b->nbytes && (!a->nbytes || !memcmp(a->data, b->data, a->nbytes));
}

static int depth(const af_graph *g) {
    int d = 0;
    for (; g->parent; g = g->parent) d++;
    return d;
}

/* Same value: same name, same kind, same graph level (names are unique in a graph). */
static bool same_value(const af_value *a, const af_value *b) {
    if (!a || !b) return a == b;
    return !strcmp(a->name, b->name) && a->is_const == b->is_const &&
           depth(a->graph) == depth(b->graph);
}

static bool same_graph(const af_graph *a, const af_graph *b, char *why, size_t whylen);

static bool same_attr(const af_attr *a, const af_attr *b, char *why, size_t whylen) {
    if (strcmp(a->name, b->name) || a->type != b->type)
        return WHY("attribute '%s' became '%s' type %d", a->name, b->name, (int)b->type);
    bool list = a->type >= AF_ATTR_FLOATS && a->type <= AF_ATTR_GRAPHS;
    if (list && a->n != b->n) return WHY("attribute '%s': %d items became %d", a->name, a->n, b->n);
    for (int k = 0; k < (list ? a->n : 1); k++) {
        bool ok = true;
        switch (a->type) {
        case AF_ATTR_FLOAT: ok = !memcmp(&a->f, &b->f, 4); break;
        case AF_ATTR_INT: ok = a->i == b->i; break;
        case AF_ATTR_STRING: ok = a->slen == b->slen && !memcmp(a->s, b->s, a->slen); break;
        case AF_ATTR_TENSOR: ok = same_tensor(a->t, b->t, true); break;
        case AF_ATTR_GRAPH: ok = same_graph(a->g, b->g, why, whylen); break;
        case AF_ATTR_FLOATS: ok = !memcmp(&a->floats[k], &b->floats[k], 4); break;
        case AF_ATTR_INTS: ok = a->ints[k] == b->ints[k]; break;
        case AF_ATTR_STRINGS: ok = !strcmp(a->strings[k], b->strings[k]); break;
        case AF_ATTR_TENSORS: ok = same_tensor(a->tensors[k], b->tensors[k], true); break;
        case AF_ATTR_GRAPHS: ok = same_graph(a->graphs[k], b->graphs[k], why, whylen); break;
        default: ok = false;
        }
        if (!ok) {
            if (a->type != AF_ATTR_GRAPH && a->type != AF_ATTR_GRAPHS)
                snprintf(why, whylen, "attribute '%s' item %d differs", a->name, k);
            return false;
        }
    }
    return true;
}

/* Does g or one of its subgraphs return v? */
static bool returned(const af_graph *g, const af_value *v) {
    for (int i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == v) return true;
    for (int i = 0; i < g->nnodes; i++)
        for (int a = 0; a < g->nodes[i]->nattrs; a++) {
            const af_attr *at = &g->nodes[i]->attrs[a];
            if (at->type == AF_ATTR_GRAPH && returned(at->g, v)) return true;
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                if (returned(at->graphs[k], v)) return true;
        }
    return false;
}

/* The writers leave out values nothing produces, reads or returns. */
static bool live(const af_value *v) {
    return v->producer || v->is_input || v->is_output || v->nuses > 0 || returned(v->graph, v);
}

static bool same_graph(const af_graph *a, const af_graph *b, char *why, size_t whylen) {
    if (!same_str(a->name, b->name)) return WHY("graph name '%s' became '%s'", a->name, b->name);
    int nlive = 0;
    for (int i = 0; i < a->nvalues; i++) nlive += live(a->values[i]);
    if (nlive != b->nvalues || a->nnodes != b->nnodes || a->ninputs != b->ninputs ||
        a->noutputs != b->noutputs)
        return WHY("graph '%s': counts differ (values %d/%d nodes %d/%d)", a->name, nlive,
                   b->nvalues, a->nnodes, b->nnodes);
    for (int i = 0, j = 0; i < a->nvalues; i++) {
        if (!live(a->values[i])) continue;
        const af_value *x = a->values[i], *y = b->values[j++];
        if (!same_value(x, y) || x->is_input != y->is_input || x->is_output != y->is_output ||
            !same_tensor(&x->type, &y->type, x->is_const))
            return WHY("value %d '%s' differs", i, x->name);
        for (int d = 0; d < x->type.rank; d++)
            if (!same_str(x->dim_param[d], y->dim_param[d]))
                return WHY("value '%s': dim_param", x->name);
        if (x->producer && (!y->producer || x->producer->id != y->producer->id ||
                            x->producer_slot != y->producer_slot))
            return WHY("value '%s': producer differs", x->name);
    }
    for (int i = 0; i < a->ninputs; i++)
        if (!same_value(a->inputs[i], b->inputs[i])) return WHY("input %d differs", i);
    for (int i = 0; i < a->noutputs; i++)
        if (!same_value(a->outputs[i], b->outputs[i])) return WHY("output %d differs", i);
    for (int i = 0; i < a->nnodes; i++) {
        const af_node *x = a->nodes[i], *y = b->nodes[i];
        if (x->op != y->op || strcmp(x->name, y->name) || strcmp(af_ops[x->op].name, y->op_type) ||
            x->nin != y->nin || x->nout != y->nout || x->nattrs != y->nattrs)
            return WHY("node %d '%s' differs", i, x->name);
        for (int k = 0; k < x->nin; k++)
            if (!same_value(x->in[k], y->in[k]))
                return WHY("node '%s' input %d differs", x->name, k);
        for (int k = 0; k < x->nout; k++)
            if (!same_value(x->out[k], y->out[k]))
                return WHY("node '%s' output %d differs", x->name, k);
        for (int k = 0; k < x->nattrs; k++)
            if (!same_attr(&x->attrs[k], &y->attrs[k], why, whylen)) return false;
    }
    /* The loader recomputes captures from what is read: a subset of the IR's list (passes may
     * leave a capture nothing reads any more). */
    for (int i = 0; i < b->ncaptures; i++) {
        bool found = false;
        for (int k = 0; k < a->ncaptures && !found; k++)
            found = same_value(a->captures[k], b->captures[i]);
        if (!found) return WHY("graph '%s': capture '%s' is new", b->name, b->captures[i]->name);
    }
    return true;
}

/* Run g on inputs bound by position; outputs[] receive tensors (release them). */
static af_status run(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                     af_error *err) {
    memset(outputs, 0, sizeof(af_tensor) * (size_t)g->noutputs);
    return af_exec_graph(g, inputs, outputs, err);
}

static bool same_outputs(const af_tensor *a, const af_tensor *b, int n, char *why, size_t whylen) {
    for (int i = 0; i < n; i++)
        if (!same_tensor(&a[i], &b[i], true)) return WHY("output %d differs", i);
    return true;
}

static void release_all(af_tensor *t, int n) {
    for (int i = 0; i < n; i++) af_tensor_release(&t[i]);
}

/* Random inputs of the declared types; false when a type is not fully known. */
static bool make_inputs(const af_graph *g, af_tensor *in) {
    for (int i = 0; i < g->ninputs; i++) {
        memset(&in[i], 0, sizeof in[i]);
        const af_tensor *t = &g->inputs[i]->type;
        if (af_tensor_numel(t) < 0 || !af_dtype_size(t->dtype) || af_tensor_numel(t) > (1 << 22))
            return false;
        in[i].dtype = t->dtype;
        in[i].rank = t->rank;
        memcpy(in[i].dims, t->dims, sizeof in[i].dims);
        if (af_tensor_alloc(&in[i], NULL)) return false;
        if (t->dtype == AF_DTYPE_FLOAT)
            for (int64_t k = 0; k < af_tensor_numel(t); k++) ((float *)in[i].data)[k] = frand();
    }
    return true;
}

/* Save g, load it back, check the IR and the outputs on `inputs` against g's. */
static void check_round_trip(const af_graph *g, const af_tensor *const *inputs, const char *name) {
    af_error err;
    af_model *m = NULL;
    af_afm_meta meta;
    char why[512] = "";
    const char *path = tmp_path(name);
    assert_int_equal(af_afm_save(path, g, NULL, &err), AF_OK);
    if (af_afm_load(path, &m, &meta, &err)) fail_msg("%s", err.message);
    assert_string_equal(meta.version, AF_VERSION);
    if (!same_graph(g, m->graph, why, sizeof why)) fail_msg("%s: %s", name, why);
    af_tensor *a = calloc((size_t)g->noutputs, sizeof *a),
              *b = calloc((size_t)g->noutputs, sizeof *b);
    if (run(g, inputs, a, &err)) fail_msg("original: %s", err.message);
    if (run(m->graph, inputs, b, &err)) fail_msg("loaded: %s", err.message);
    if (!same_outputs(a, b, g->noutputs, why, sizeof why)) fail_msg("%s: %s", name, why);
    release_all(a, g->noutputs);
    release_all(b, g->noutputs);
    free(a);
    free(b);
    af_model_free(m);
}

/* The compile pipeline, every rule on. */
static af_status optimize(af_graph *g, af_error *err) { return af_optimize(g, NULL, NULL, err); }

static int count_op(const af_graph *g, const char *op) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) c += !strcmp(af_ops[g->nodes[i]->op].name, op);
    return c;
}

/* ---- round trips ----------------------------------------------------------------------------- */

static void test_convnet_round_trip(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = conv_net(a);
    af_tensor in[1];
    assert_true(make_inputs(g, in));
    const af_tensor *inp[] = {&in[0]};
    check_round_trip(g, inp, "convnet.afm");

    /* The optimized graph: fused ops with folded constants. */
    af_error err;
    if (optimize(g, &err)) fail_msg("optimize: %s", err.message);
    assert_true(count_op(g, "FusedConv") + count_op(g, "ConvPoolFc") >= 1);
    check_round_trip(g, inp, "convnet_fused.afm");
    af_tensor_release(&in[0]);
    af_arena_free(a);
}

static void test_attr_kinds_round_trip(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = attr_net(a);
    af_tensor in[1];
    assert_true(make_inputs(g, in));
    const af_tensor *inp[] = {&in[0]};
    check_round_trip(g, inp, "attrs.afm");
    /* The loaded subgraphs capture what they read, through every level. */
    af_model *m = NULL;
    af_error err;
    assert_int_equal(af_afm_load(tmp_path("attrs.afm"), &m, NULL, &err), AF_OK);
    const af_attr *gs = af_node_attr(m->graph->nodes[0], "gs");
    assert_non_null(gs);
    const af_graph *s2 = gs->graphs[0], *s3 = s2->nodes[0]->attrs[0].g;
    assert_int_equal(s3->ncaptures, 2); /* x and scale */
    assert_int_equal(s2->ncaptures, 2); /* scale (its own read) and x (for s3) */
    assert_ptr_equal(s3->parent, s2);
    assert_ptr_equal(s2->parent, m->graph);
    af_model_free(m);
    af_tensor_release(&in[0]);
    af_arena_free(a);
}

/* ---- every conformance model ----------------------------------------------------------------- */

static const char *suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
#define DATA "/usr/share/libonnx-testdata/data"

/* Inputs of test_data_set_0 bound to g's inputs (by the file's name, else by position). */
static int load_inputs(const char *dir, const af_graph *g, af_tensor *in, const af_tensor **bound) {
    char path[4096];
    int n = 0;
    for (; n < 64; n++) {
        char *name = NULL;
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, n);
        if (access(path, R_OK)) break;
        if (af_tensor_load_pb(path, &in[n], &name, NULL)) return -1;
        int k = n;
        for (int j = 0; name && j < g->ninputs; j++)
            if (!strcmp(name, g->inputs[j]->name)) k = j;
        free(name);
        if (k < g->ninputs) {
            if (g->inputs[k]->type.dtype == AF_DTYPE_BFLOAT16 && in[n].dtype == AF_DTYPE_UINT16)
                in[n].dtype = AF_DTYPE_BFLOAT16;
            if (g->inputs[k]->type.dtype && g->inputs[k]->type.dtype != in[n].dtype) return -1;
            bound[k] = &in[n];
        }
    }
    return n;
}

/* Child process: one case, plain then optimized. Writes a byte to `fd` once the original runs
 * (so a crash afterwards is ours), exits 0 when both round trips match, 1 on a mismatch, 3 when
 * the original itself does not load or run. */
static int conformance_case(const char *dir, const char *id, int fd, bool optimized) {
    char path[4096], why[512] = "";
    af_error err;
    af_model *m = NULL, *l = NULL;
    af_tensor in[64] = {{0}};
    const af_tensor *bound[64] = {0};
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (tu_load(path, &m, &err) || m->graph->ninputs > 64) return 3;
    if (optimized && optimize(m->graph, &err)) return 3;
    int nin = load_inputs(dir, m->graph, in, bound);
    if (nin < 0) return 3;
    int nout = m->graph->noutputs;
    af_tensor *a = calloc((size_t)nout + 1, sizeof *a), *b = calloc((size_t)nout + 1, sizeof *b);
    if (run(m->graph, bound, a, &err)) return 3;
    if (write(fd, "1", 1) != 1) return 1;
    snprintf(path, sizeof path, "%s/conf_%d.afm", tmp_dir, (int)getpid());
    if (af_afm_save(path, m->graph, NULL, &err) || af_afm_load(path, &l, NULL, &err)) {
        fprintf(stderr, "%s: %s\n", id, err.message);
        return 1;
    }
    unlink(path);
    if (!same_graph(m->graph, l->graph, why, sizeof why)) {
        fprintf(stderr, "%s%s: IR differs: %s\n", id, optimized ? " (optimized)" : "", why);
        return 1;
    }
    if (run(l->graph, bound, b, &err)) {
        fprintf(stderr, "%s: loaded model fails: %s\n", id, err.message);
        return 1;
    }
    if (!same_outputs(a, b, nout, why, sizeof why)) {
        fprintf(stderr, "%s%s: %s\n", id, optimized ? " (optimized)" : "", why);
        return 1;
    }
    release_all(a, nout);
    release_all(b, nout);
    free(a);
    free(b);
    for (int i = 0; i < nin; i++) af_tensor_release(&in[i]);
    af_model_free(l);
    af_model_free(m);
    return 0;
}

/* Children running at once, each one case. */
#define JOBS 8

typedef struct job {
    pid_t pid;
    int fd; /* read end of the child's "the original ran" pipe */
    char id[1040];
} job;

typedef struct tally {
    int passed, failed, unrun;
} tally;

/* Wait for one child and count its result. */
static void reap(job *jobs, int *njobs, tally *t, bool optimized) {
    int status = 0;
    pid_t pid = wait(&status);
    assert_true(pid > 0);
    int k = 0;
    while (k < *njobs && jobs[k].pid != pid) k++;
    assert_true(k < *njobs);
    char c;
    bool ran = read(jobs[k].fd, &c, 1) == 1; /* written before the child exits, if at all */
    close(jobs[k].fd);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        t->passed++;
    } else if (!ran) {
        t->unrun++;
    } else {
        t->failed++;
        fprintf(stderr, "FAIL %s%s (%s %d)\n", jobs[k].id, optimized ? " (optimized)" : "",
                WIFSIGNALED(status) ? "signal" : "exit",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    jobs[k] = jobs[--*njobs];
}

static void conformance_round_trips(bool optimized) {
    tally t = {0};
    job jobs[JOBS];
    int njobs = 0;
    if (access(DATA, R_OK)) skip();
    for (size_t s = 0; s < AF_COUNT(suites); s++) {
        char sdir[1024];
        snprintf(sdir, sizeof sdir, "%s/%s", DATA, suites[s]);
        DIR *d = opendir(sdir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "test_", 5)) continue;
            if (njobs == JOBS) reap(jobs, &njobs, &t, optimized);
            job *j = &jobs[njobs];
            char dir[2048];
            snprintf(dir, sizeof dir, "%s/%s", sdir, e->d_name);
            snprintf(j->id, sizeof j->id, "%s/%s", suites[s], e->d_name);
            int fds[2];
            assert_int_equal(pipe(fds), 0);
            fflush(NULL);
            j->pid = fork();
            assert_true(j->pid >= 0);
            if (j->pid == 0) {
                close(fds[0]);
                alarm(120);
                _exit(conformance_case(dir, j->id, fds[1], optimized));
            }
            close(fds[1]);
            j->fd = fds[0];
            njobs++;
        }
        closedir(d);
    }
    while (njobs > 0) reap(jobs, &njobs, &t, optimized);
    printf("conformance round trips%s: %d identical, %d differ, %d not runnable before saving\n",
           optimized ? " (optimized)" : "", t.passed, t.failed, t.unrun);
    assert_int_equal(t.failed, 0);
    assert_true(t.passed > 900);
}

static void test_conformance_round_trips(void **state) {
    (void)state;
    conformance_round_trips(false);
}

static void test_conformance_optimized_round_trips(void **state) {
    (void)state;
    conformance_round_trips(true);
}

/* ---- damaged and forged files ---------------------------------------------------------------- */

static unsigned char *read_all(const char *path, size_t *len) {
    unsigned char *buf;
    assert_int_equal(af_read_file(path, &buf, len), 0);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The header layout (afm.h): section table at 32, 32 bytes per entry, 12 sections (the plan is
 * section 10, the weights 11), header checksum in the last 8 of 424 bytes. */
enum { NSEC = 12, HDR = 424 };

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Recompute every checksum, as a forger would. Offsets that left the file are left alone. */
static void forge_checksums(unsigned char *b, size_t len) {
    for (int s = 0; s < NSEC; s++) {
        unsigned char *e = b + 32 + 32 * s;
        uint64_t off = rd64(e + 8), size = rd64(e + 16);
        if (off <= len && size <= len - off) {
            uint64_t h = af_afm_section_hash(b + off, size);
            memcpy(e + 24, &h, 8);
        }
    }
    uint64_t h = XXH64(b, HDR - 8, 0);
    memcpy(b + HDR - 8, &h, 8);
}

/* Load must fail with "<path>: ..." and leave *out NULL. */
static void expect_load_error(const char *path, const char *what) {
    af_model *m = (af_model *)1;
    af_error err;
    af_status st = af_afm_load(path, &m, NULL, &err);
    if (st == AF_OK) fail_msg("%s: loaded", what);
    assert_null(m);
    assert_int_equal(err.code, st);
    assert_memory_equal(err.message, path, strlen(path));
}

/* Sizes of the test files, to keep the exhaustive loops honest. */
static void save_small(af_arena *a, const char *name) {
    af_error err;
    assert_int_equal(af_afm_save(tmp_path(name), attr_net(a), NULL, &err), AF_OK);
}

static void test_truncations(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    save_small(a, "small.afm");
    size_t len;
    unsigned char *buf = read_all(tmp_path("small.afm"), &len);
    const char *cut = tmp_path("cut.afm");
    for (size_t n = 0; n < len; n++) {
        write_bytes(cut, buf, n);
        expect_load_error(cut, "a truncated file");
    }
    /* And one byte too many. */
    unsigned char *more = malloc(len + 1);
    memcpy(more, buf, len);
    more[len] = 0;
    write_bytes(cut, more, len + 1);
    expect_load_error(cut, "a file with a trailing byte");
    free(more);
    free(buf);
    af_arena_free(a);
}

static void test_bit_flips(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    save_small(a, "small.afm");
    size_t len;
    unsigned char *buf = read_all(tmp_path("small.afm"), &len);
    const char *bad = tmp_path("flip.afm");
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (unsigned char)(1u << bit);
            write_bytes(bad, buf, len);
            expect_load_error(bad, "a flipped bit");
            buf[i] ^= (unsigned char)(1u << bit);
        }
    free(buf);
    af_arena_free(a);
}

/* A forged file either fails cleanly or loads into a graph that verifies and runs (or fails
 * to run) without crashing, with and without the memory plan it carries. */
static int try_forged(const char *path) {
    af_model *m = NULL;
    af_plan *plan = NULL;
    af_error err;
    af_status st = af_afm_load_with_plan(path, &m, NULL, &plan, &err);
    if (st) {
        if (strncmp(err.message, path, strlen(path)))
            fail_msg("message without the path: %s", err.message);
        assert_null(m);
        assert_null(plan);
        return 0;
    }
    assert_int_equal(af_graph_verify(m->graph, &err), AF_OK);
    af_tensor in[8];
    const af_graph *g = m->graph;
    if (g->ninputs <= 8 && make_inputs(g, in)) {
        const af_tensor *inp[8];
        for (int i = 0; i < g->ninputs; i++) inp[i] = &in[i];
        af_tensor *out = calloc((size_t)g->noutputs + 1, sizeof *out);
        run(g, inp, out, &err);
        release_all(out, g->noutputs);
        if (plan) {
            void *arena = plan->arena_size ? aligned_alloc(64, (size_t)plan->arena_size) : NULL;
            if (!plan->arena_size || arena)
                af_exec_graph_planned(g, plan, arena, NULL, inp, out, &err);
            release_all(out, g->noutputs);
            free(arena);
        }
        free(out);
        release_all(in, g->ninputs);
    }
    af_plan_free(plan);
    af_model_free(m);
    return 1;
}

/* Every word of the structured sections of one file, overwritten with hostile values. */
static void forge_words(const char *path) {
    size_t len;
    unsigned char *buf = read_all(path, &len);
    uint64_t wstart = rd64(buf + 32 + 32 * (NSEC - 1) + 8);
    const char *bad = tmp_path("forged.afm");
    static const uint32_t hostile[] = {0xffffffffu, 0xfffffffeu, 0x7fffffffu, 0x80000000u, 0, 1,
                                       2, 64, 1000};
    int loaded = 0, tried = 0;
    /* Every 32-bit word of the header and the structured sections (not the weights' bytes). */
    for (size_t off = 8; off + 4 <= wstart; off += 4) {
        uint32_t orig;
        memcpy(&orig, buf + off, 4);
        uint32_t vals[AF_COUNT(hostile) + 2];
        memcpy(vals, hostile, sizeof hostile);
        vals[AF_COUNT(hostile)] = orig + 1;
        vals[AF_COUNT(hostile) + 1] = orig - 1;
        for (size_t k = 0; k < AF_COUNT(vals); k++) {
            if (vals[k] == orig) continue;
            unsigned char *b = malloc(len);
            memcpy(b, buf, len);
            memcpy(b + off, &vals[k], 4);
            forge_checksums(b, len);
            write_bytes(bad, b, len);
            loaded += try_forged(bad);
            tried++;
            free(b);
        }
    }
    printf("forged files: %d tried, %d still loaded (benign changes), the rest refused\n", tried,
           loaded);
    free(buf);
}

/* The attribute net, and the conv net, whose file carries a memory plan with entries. */
static void test_forged_files(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    save_small(a, "small.afm");
    forge_words(tmp_path("small.afm"));
    af_error err;
    af_graph *g = conv_net(a);
    assert_int_equal(af_afm_save(tmp_path("convnet.afm"), g, NULL, &err), AF_OK);
    af_model *m = NULL;
    af_plan *plan = NULL;
    assert_int_equal(af_afm_load_with_plan(tmp_path("convnet.afm"), &m, NULL, &plan, &err), AF_OK);
    assert_non_null(plan);
    assert_true(plan->nplanned >= 5);
    af_plan_free(plan);
    af_model_free(m);
    forge_words(tmp_path("convnet.afm"));
    af_arena_free(a);
}

/* Specific forgeries and the reasons they get. */
static void expect_forged_error(unsigned char *b, size_t len, const char *needle) {
    const char *bad = tmp_path("forged1.afm");
    af_model *m = NULL;
    af_error err;
    forge_checksums(b, len);
    write_bytes(bad, b, len);
    assert_int_not_equal(af_afm_load(bad, &m, NULL, &err), AF_OK);
    if (!strstr(err.message, needle)) fail_msg("'%s' lacks '%s'", err.message, needle);
}

static uint64_t sec_off(const unsigned char *b, int s) { return rd64(b + 32 + 32 * s + 8); }

static void test_forged_reasons(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    save_small(a, "small.afm");
    size_t len;
    unsigned char *buf = read_all(tmp_path("small.afm"), &len), *b = malloc(len);
    uint32_t big = 0x7ffffff0;
    /* Node 0's first input points past the values. */
    memcpy(b, buf, len);
    uint64_t nodes = sec_off(b, 5), refs = sec_off(b, 7);
    uint32_t in_first;
    memcpy(&in_first, b + nodes + 16, 4);
    memcpy(b + refs + 4 * in_first, &big, 4);
    expect_forged_error(b, len, "refers to value");
    /* A section that leaves the file. */
    memcpy(b, buf, len);
    uint64_t huge = (uint64_t)1 << 40;
    memcpy(b + 32 + 32 * 4 + 16, &huge, 8);
    expect_forged_error(b, len, "do not fit");
    /* A constant whose bytes leave the weights section: value records are 128 bytes, the
     * tensor's data offset is at 40 + 72. */
    memcpy(b, buf, len);
    uint64_t values = sec_off(b, 4), wsize = rd64(b + 32 + 32 * 11 + 16);
    int found = 0;
    for (uint64_t r = values; r < sec_off(b, 5) && !found; r += 128) {
        uint32_t flags;
        memcpy(&flags, b + r + 4, 4);
        if (flags & 4) {
            memcpy(b + r + 40 + 72, &wsize, 8);
            found = 1;
        }
    }
    assert_true(found);
    expect_forged_error(b, len, "weights");
    /* An unknown op. */
    memcpy(b, buf, len);
    uint64_t strings = sec_off(b, 0);
    unsigned char *gelu = memmem(b + strings, len - strings, "Gelu", 5);
    assert_non_null(gelu);
    memcpy(gelu, "Gulp", 4);
    expect_forged_error(b, len, "not supported");
    /* Another version: the one before (XXH64 checksums) and the one after. */
    af_model *m = NULL;
    af_error err;
    for (unsigned char v = 2; v <= 4; v += 2) {
        char want[96];
        memcpy(b, buf, len);
        b[8] = v;
        forge_checksums(b, len);
        write_bytes(tmp_path("vx.afm"), b, len);
        assert_int_equal(af_afm_load(tmp_path("vx.afm"), &m, NULL, &err), AF_ERR_UNSUPPORTED);
        assert_null(m);
        snprintf(want, sizeof want, "format version %u is not supported (this build reads version 3)",
                 v);
        if (!strstr(err.message, want)) fail_msg("'%s' lacks '%s'", err.message, want);
    }
    free(b);
    free(buf);
    af_arena_free(a);
}

static void test_bad_files(void **state) {
    (void)state;
    af_model *m = NULL;
    af_error err;
    assert_int_equal(af_afm_load(tmp_path("missing.afm"), &m, NULL, &err), AF_ERR_IO);
    assert_int_equal(af_afm_load(tmp_dir, &m, NULL, &err), AF_ERR_IO);
    write_bytes(tmp_path("empty.afm"), "", 0);
    expect_load_error(tmp_path("empty.afm"), "an empty file");
    /* An ONNX model is not a compiled model. */
    af_arena *a = af_arena_new();
    assert_int_equal(af_onnx_export(conv_net(a), tmp_path("net.onnx"), &err), AF_OK);
    assert_int_equal(af_afm_load(tmp_path("net.onnx"), &m, NULL, &err), AF_ERR_INVALID_MODEL);
    assert_non_null(strstr(err.message, "magic"));
    af_arena_free(a);
}

/* ---- metadata and inspect -------------------------------------------------------------------- */

static void test_meta_and_inspect(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = attr_net(a);
    af_afm_kv kv[] = {{"precision_mode", "fp32"},
                      {"fusion_report", "{\"model\": \"attrnet\",\n \"x\": 1}"}};
    af_afm_meta meta = {NULL, "autofusion compile --model=attrnet.onnx --output=attrs", kv, 2};
    af_error err;
    const char *path = tmp_path("meta.afm");
    assert_int_equal(af_afm_save(path, g, &meta, &err), AF_OK);

    af_afm_info *info = NULL;
    assert_int_equal(af_afm_read_meta(path, &info, &err), AF_OK);
    assert_int_equal(info->format_version, AF_AFM_FORMAT_VERSION);
    assert_string_equal(info->meta.version, AF_VERSION);
    assert_string_equal(info->meta.command_line, meta.command_line);
    assert_int_equal(info->meta.nkv, 2);
    assert_string_equal(info->meta.kv[1].value, kv[1].value);
    assert_string_equal(info->sections[info->nsections - 1].name, "weights");
    assert_int_equal(info->sections[info->nsections - 1].offset % 64, 0);
    af_afm_info_free(info);

    af_model *m = NULL;
    af_afm_meta got;
    assert_int_equal(af_afm_load(path, &m, &got, &err), AF_OK);
    assert_string_equal(got.kv[0].key, "precision_mode");
    assert_string_equal(m->producer_name, "autofusion");
    /* Constants point into the mapping, 64-byte aligned. */
    for (int i = 0; i < m->graph->nvalues; i++) {
        const af_value *v = m->graph->values[i];
        if (!v->is_const) continue;
        assert_true((const char *)v->type.data >= (const char *)m->map &&
                    (const char *)v->type.data < (const char *)m->map + m->map_len);
        assert_int_equal((uintptr_t)v->type.data % 64, 0);
    }
    af_model_free(m);

    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    assert_int_equal(cli_inspect(path, f, &err), AF_OK);
    fclose(f);
    static const char *needles[] = {"format version 3", "command line: autofusion compile",
                                    "meta precision_mode: fp32", "FusedConv", "Gelu",
                                    "by ConvBNReluFusionOp, from 3 nodes: conv bn relu",
                                    "weights:", "arena: 0 bytes (lower bound 0, ratio 1.000)"};
    for (size_t i = 0; i < AF_COUNT(needles); i++)
        if (!strstr(text, needles[i])) fail_msg("inspect lacks '%s':\n%s", needles[i], text);
    free(text);
    af_arena_free(a);
}

/* ---- ONNX export ----------------------------------------------------------------------------- */

static bool have_onnx(void) {
    static int have = -1;
    if (have < 0) have = system("/usr/bin/python3 -c 'import onnx' >/dev/null 2>&1") == 0;
    return have;
}

/* onnx.load and onnx.checker.check_model(full_check) on the file. */
static void expect_checker_ok(const char *path) {
    if (!have_onnx()) return;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import onnx,sys; m=onnx.load(sys.argv[1]); "
             "onnx.checker.check_model(m, full_check=True)\" %s",
             path);
    if (system(cmd) != 0) fail_msg("onnx.checker rejects %s", path);
}

/* Export g, check the file, re-import it and compare outputs (bitwise) and the graph's shape. */
static void check_export(af_graph *g, const af_tensor *const *inputs, const char *name) {
    af_error err;
    const char *path = tmp_path(name);
    if (af_onnx_export(g, path, &err)) fail_msg("%s", err.message);
    expect_checker_ok(path);
    af_model *m = NULL;
    if (tu_load(path, &m, &err)) fail_msg("re-import: %s", err.message);
    assert_int_equal(m->graph->nnodes, g->nnodes);
    for (int i = 0; i < g->nnodes; i++) {
        assert_int_equal(m->graph->nodes[i]->op, g->nodes[i]->op);
        assert_int_equal(m->graph->nodes[i]->nattrs, g->nodes[i]->nattrs);
    }
    af_tensor *a = calloc((size_t)g->noutputs, sizeof *a),
              *b = calloc((size_t)g->noutputs, sizeof *b);
    char why[256];
    if (run(g, inputs, a, &err)) fail_msg("original: %s", err.message);
    if (run(m->graph, inputs, b, &err)) fail_msg("re-imported: %s", err.message);
    if (!same_outputs(a, b, g->noutputs, why, sizeof why)) fail_msg("%s: %s", name, why);
    release_all(a, g->noutputs);
    release_all(b, g->noutputs);
    free(a);
    free(b);
    af_model_free(m);
}

static void test_export(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_graph *g = conv_net(a);
    af_tensor in[1];
    assert_true(make_inputs(g, in));
    const af_tensor *inp[] = {&in[0]};
    check_export(g, inp, "convnet.onnx");
    af_error err;
    if (optimize(g, &err)) fail_msg("optimize: %s", err.message);
    check_export(g, inp, "convnet_fused.onnx");
    af_tensor_release(&in[0]);

    /* Our ops with every attribute kind: the exported file re-imports to the same attributes. */
    af_arena *b = af_arena_new();
    af_graph *h = attr_net(b);
    af_tensor x[1];
    assert_true(make_inputs(h, x));
    const af_tensor *xp[] = {&x[0]};
    check_export(h, xp, "attrs.onnx");
    af_model *m = NULL;
    assert_int_equal(tu_load(tmp_path("attrs.onnx"), &m, &err), AF_OK);
    char why[512] = "";
    for (int i = 0; i < h->nnodes; i++)
        for (int k = 0; k < h->nodes[i]->nattrs; k++) {
            const af_attr *want = &h->nodes[i]->attrs[k];
            const af_attr *got = af_node_attr(m->graph->nodes[i], want->name);
            assert_non_null(got);
            if (want->type != AF_ATTR_GRAPH && want->type != AF_ATTR_GRAPHS &&
                !same_attr(want, got, why, sizeof why))
                fail_msg("%s", why);
        }
    assert_string_equal(m->graph->nodes[0]->domain, AF_DOMAIN);
    af_model_free(m);
    af_tensor_release(&x[0]);
    af_arena_free(b);
    af_arena_free(a);
}

/* ---- setup ----------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    struct stat sb;
    bool shm = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0;
    snprintf(tmp_dir, sizeof tmp_dir, "%s/af_test_afm_XXXXXX", shm ? "/dev/shm" : "/tmp");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    if (getenv("AF_TEST_KEEP")) return 0; /* keep the files for a look */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convnet_round_trip),
        cmocka_unit_test(test_attr_kinds_round_trip),
        cmocka_unit_test(test_conformance_round_trips),
        cmocka_unit_test(test_conformance_optimized_round_trips),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_forged_files),
        cmocka_unit_test(test_forged_reasons),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_meta_and_inspect),
        cmocka_unit_test(test_export),
    };
    /* AF_TEST_FILTER=test_bit_flips runs one test (cmocka's glob). */
    if (getenv("AF_TEST_FILTER")) cmocka_set_test_filter(getenv("AF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
