/* Half precision in the file, float32 inside (af_pass_widen_halves; the first stage, before
 * shapes): a model that computes in float16 or bfloat16 runs on the float32 kernels.
 *
 * Every float16/bfloat16 value of the graph and of its bodies becomes float32: constants are
 * widened (exactly: every half is a float), Casts to a half type cast to float32 (and
 * simplify then drops those that copy), and ops that make a tensor of a type named by an
 * attribute (ConstantOfShape, EyeLike, the Random ops) make float32. Only the model's
 * interface keeps its types: a half input is cast to float32 as the run starts and a half
 * output is cast back from float32 at the end, so a caller gives and gets what the model
 * declares.
 *
 * Why: float16 converters (onnxconverter-common, torch .half()) write whole graphs in half
 * precision with Cast islands around the ops they leave in float32; on a CPU without float16
 * arithmetic ONNX Runtime itself casts each fp16 node's inputs to float32 and back. Computing
 * the island in float32 once is exact where float16 rounds (the result differs from a float16
 * computation by at most the float16 rounding of each op), and the fused kernels then see an
 * ordinary float32 graph. Storage of the weights in half precision is --precision_mode=fp16's.
 *
 * Invariant: afterwards no value of the graph except the main graph's declared inputs and
 * outputs is float16 or bfloat16. */
#include "passes/rewrite.h"

#include <stdio.h>
#include <string.h>

static bool is_half(af_dtype t) {
    return t == AF_DTYPE_FLOAT16 || t == AF_DTYPE_BFLOAT16;
}

static af_status nomem(const af_graph *g, af_error *err) {
    return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", g->file ? g->file : "model");
}

/* t's half data as float32, in g's arena. */
static af_status widen_data(af_graph *g, af_tensor *t, af_error *err) {
    size_t n = t->nbytes / 2;
    float *dst = af_arena_alloc_data(g->arena, n ? n * sizeof(float) : 1);
    if (!dst) return nomem(g, err);
    const uint16_t *src = t->data;
    for (size_t i = 0; i < n; i++)
        dst[i] = t->dtype == AF_DTYPE_FLOAT16 ? af_half_to_float(src[i]) : af_bf16_to_float(src[i]);
    t->dtype = AF_DTYPE_FLOAT;
    t->data = dst;
    t->nbytes = n * sizeof(float);
    return AF_OK;
}

/* A new value of g typed as v but float32, named after it. */
static af_value *float_twin(af_graph *g, const af_value *v) {
    char hint[256];
    snprintf(hint, sizeof hint, "%s/float", v->name);
    const char *name = af_graph_unique_name(g, hint);
    af_value *f = name ? af_value_new(g, name) : NULL;
    if (!f) return NULL;
    af_tensor_type_copy(&f->type, &v->type);
    f->type.dtype = AF_DTYPE_FLOAT;
    memcpy(f->dim_param, v->dim_param, sizeof f->dim_param);
    return f;
}

/* A Cast node from -> to (to's type), at position pos of g's nodes (-1: last). */
static bool add_cast(af_graph *g, af_value *from, af_value *to, int pos) {
    af_node *n = af_node_new(g, AF_OP_CAST, to->name, 1, 1);
    if (!n || !af_node_set_int(n, "to", to->type.dtype)) return false;
    af_node_set_input(n, 0, from);
    af_node_set_output(n, 0, to);
    if (pos >= 0) af_node_move_last_to(g, pos);
    return true;
}

/* The attribute-typed outputs: the dtype attributes of the ops that make tensors. */
static void widen_attrs(af_node *n) {
    for (int i = 0; i < n->nattrs; i++) {
        af_attr *a = &n->attrs[i];
        bool typed = (n->op == AF_OP_CAST && !strcmp(a->name, "to")) ||
                     (n->op != AF_OP_CAST && !strcmp(a->name, "dtype"));
        if (typed && a->type == AF_ATTR_INT && is_half((af_dtype)a->i)) a->i = AF_DTYPE_FLOAT;
    }
}

/* A half constant-valued attribute (ConstantOfShape's value) widened. */
static af_status widen_attr_tensors(af_graph *g, af_node *n, af_error *err) {
    for (int i = 0; i < n->nattrs; i++) {
        af_attr *a = &n->attrs[i];
        if (a->type == AF_ATTR_TENSOR && a->t && a->t->data && is_half(a->t->dtype)) {
            af_status st = widen_data(g, a->t, err);
            if (st) return st;
        }
    }
    return AF_OK;
}

/* The main graph's half inputs and outputs: casts at the boundary. */
static af_status cast_interface(af_graph *g, af_error *err) {
    for (int i = 0; i < g->ninputs; i++) { /* its readers read its float32 cast */
        af_value *in = g->inputs[i];
        if (!is_half(in->type.dtype) || in->is_const || in->is_output) continue;
        af_value *f = float_twin(g, in);
        if (!f) return nomem(g, err);
        af_value_replace_uses(in, f);
        if (!add_cast(g, in, f, 0)) return nomem(g, err);
    }
    for (int i = 0; i < g->noutputs; i++) { /* its producer writes float32, cast to it */
        af_value *out = g->outputs[i];
        if (!is_half(out->type.dtype) || !out->producer) continue;
        af_value *f = float_twin(g, out);
        if (!f) return nomem(g, err);
        af_value_replace_uses(out, f);
        af_node_set_output(out->producer, out->producer_slot, f);
        if (!add_cast(g, f, out, -1)) return nomem(g, err);
    }
    return AF_OK;
}

/* Every half value and node of g (and its bodies) to float32, the interface aside. */
static af_status widen_graph(af_graph *g, af_error *err) {
    for (int i = 0; i < g->nvalues; i++) {
        af_value *v = g->values[i];
        if (!is_half(v->type.dtype)) continue;
        bool interface = !g->parent && ((v->is_input && !v->is_const) || v->is_output);
        if (interface) continue;
        if (v->is_const && v->type.data) {
            af_status st = widen_data(g, &v->type, err);
            if (st) return st;
        } else {
            v->type.dtype = AF_DTYPE_FLOAT;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i];
        widen_attrs(n);
        af_status st = widen_attr_tensors(g, n, err);
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(n, k)); k++) st = widen_graph(sub, err);
        if (st) return st;
    }
    return AF_OK;
}

/* Does n make a half tensor by an attribute (Cast's "to", a "dtype", a half value)? */
static bool makes_half(const af_node *n) {
    for (int i = 0; i < n->nattrs; i++) {
        const af_attr *a = &n->attrs[i];
        if ((a->type == AF_ATTR_INT && (!strcmp(a->name, "to") || !strcmp(a->name, "dtype")) &&
             is_half((af_dtype)a->i)) ||
            (a->type == AF_ATTR_TENSOR && a->t && is_half(a->t->dtype)))
            return true;
    }
    return false;
}

/* Does g or a body nested in it hold a half value, or a node that makes one? (Types of node
 * outputs are not inferred yet: a Cast to float16 is known by its attribute.) */
static bool has_halves(const af_graph *g) {
    for (int i = 0; i < g->nvalues; i++)
        if (is_half(g->values[i]->type.dtype)) return true;
    for (int i = 0; i < g->nnodes; i++) {
        const af_graph *sub;
        if (makes_half(g->nodes[i])) return true;
        for (int k = 0; (sub = pass_subgraph(g->nodes[i], k)); k++)
            if (has_halves(sub)) return true;
    }
    return false;
}

af_status af_pass_widen_halves(af_graph *g, af_error *err) {
    if (!has_halves(g)) return AF_OK;
    af_status st = widen_graph(g, err);
    if (!st) st = cast_interface(g, err);
    if (!st) st = pass_fix_captures(g, err);
    return st;
}
