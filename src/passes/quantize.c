/* Post-training int8 quantization (--precision_mode=int8, passes.h): the float32 graph, after
 * the first simplify and before fusion, rewritten in the canonical QDQ form (the int8 design of
 * issue 18) from the activation ranges that calibration measured (driver/calibrate.c):
 *
 *   x -> QuantizeLinear(s_x, z_x: uint8) -> DequantizeLinear -> Conv/MatMul/Gemm
 *                    Wq (int8 constant) -> DequantizeLinear(s_w per output channel, 0) ---^
 *
 * Activations are uint8 asymmetric per tensor (the range [lo, hi], widened to hold 0, over 255
 * steps); weights int8 symmetric per output channel (zero point 0, scale max|w| / 127, or / 63
 * when the table asks for 7-bit weights (af_quant_table.weight_max); per
 * tensor before opset 13, whose DequantizeLinear has no axis); biases stay float32; an inference
 * BatchNormalization after a Conv is folded into it first. A value read
 * by several quantized ops gets one Q/DQ pair; the output of a quantized op (after its
 * Relu/Clip, `activated`) that no quantized op reads gets one too, and the two inputs of a
 * residual join whose sum is quantized are read through pairs (join_sum): the placement of
 * ONNX Runtime's quantizer, whose runtime needs it to run the exported model on integers.
 * Other float readers keep reading the float value.
 *
 * What stays float32, each with its reason in the report: an op whose activation is a model
 * input, the first convolution (it reads the raw input), the classifier head (a Gemm/MatMul
 * from which no Conv/MatMul/Gemm follows), products of two activations (attention's Q x K^T
 * and P x V), Softmax and LayerNormalization (and every other op: they are not quantized), and
 * what --keep_fp32 names (node names or op types).
 *
 * Invariant: only the top-level graph is quantized; a graph without candidates is untouched. */
#include "passes/passes.h"
#include "passes/rewrite.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- candidates ---------------------------------------------------------------------------- */

static bool is_gemm_op(af_op op) {
    return op == AF_OP_CONV || op == AF_OP_MATMUL || op == AF_OP_GEMM;
}

/* The weight input of a candidate n: a float32 constant of a shape its op quantizes per
 * channel; NULL when n is not a candidate (then *why says why, for the ops the report lists). */
static const af_value *weights_of(const af_node *n, const char **why) {
    *why = NULL;
    if (!is_gemm_op(n->op) || n->nin < 2 || !n->in[0] || !n->in[1]) return NULL;
    const af_value *x = n->in[0], *w = n->in[1];
    if (!af_value_is_const(w) && !af_value_is_const(x) && n->op == AF_OP_MATMUL) {
        *why = "a product of two activations (attention's Q x K^T or P x V) stays float32";
        return NULL;
    }
    if (!af_value_is_const(w) || !af_value_is_f32(w) || !af_value_is_f32(x) ||
        af_value_is_const(x)) {
        *why = "the weights are not a float32 constant";
        return NULL;
    }
    int r = w->type.rank;
    if ((n->op == AF_OP_CONV && r < 3) || (n->op != AF_OP_CONV && r < 2) ||
        (n->op == AF_OP_GEMM && r != 2)) {
        *why = "weights of a shape without output channels";
        return NULL;
    }
    if (n->op == AF_OP_GEMM && af_attr_int(n, "transA", 0)) {
        *why = "a Gemm with transA stays float32";
        return NULL;
    }
    return w;
}

/* The value y becomes through single-reader Relu/Clip steps (the activation ONNX Runtime folds
 * into the op before it). */
static const af_value *activated(const af_value *y) {
    for (const af_node *r; !y->is_output && (r = af_value_sole_reader(y)) &&
                           (r->op == AF_OP_RELU || r->op == AF_OP_CLIP) && r->out[0];)
        y = r->out[0];
    return y;
}

/* A residual join: an Add of two float32 activations of its output's shape; the value its
 * sum becomes through single-reader Relu/Clip steps, or NULL. When that value is quantized (a
 * candidate reads it), the Add's inputs get a Q/DQ pair each too, as ONNX Runtime's quantizer
 * and torch's quantized add write them: then ONNX Runtime runs the Add and the convs before it
 * on integers (QLinearAdd, QLinearConv), where it ran those convs on dequantized weights in
 * float32. */
static const af_value *join_sum(const af_node *n) {
    if (n->op != AF_OP_ADD || n->nin != 2 || n->nout != 1 || !n->out[0]) return NULL;
    for (int k = 0; k < 2; k++) {
        const af_value *x = n->in[k];
        if (!x || af_value_is_const(x) || !af_value_is_f32(x) || x->type.rank != n->out[0]->type.rank)
            return NULL;
        for (int d = 0; d < x->type.rank; d++)
            if (x->type.dims[d] != n->out[0]->type.dims[d] || x->type.dims[d] < 0) return NULL;
    }
    return activated(n->out[0]);
}

/* Does a candidate read v as its activation? */
static bool candidate_reads(const af_value *v) {
    for (int u = 0; u < v->nuses; u++) {
        const char *why;
        if (v->uses[u].slot == 0 && v->uses[u].node->graph == v->graph && weights_of(v->uses[u].node, &why))
            return true;
    }
    return false;
}

/* The axis of the weights that holds the output channels. */
static int channel_axis(const af_node *n, const af_value *w) {
    if (n->op == AF_OP_CONV) return 0;
    if (n->op == AF_OP_GEMM) return af_attr_int(n, "transB", 0) ? 0 : 1;
    return w->type.rank - 1; /* MatMul: [..., K, N] */
}

af_status af_quant_activations(const af_graph *g, const af_value ***out, int *n, af_error *err) {
    *out = NULL;
    *n = 0;
    const af_value **v = af_calloc(2 * (size_t)g->nnodes + 1, sizeof *v);
    if (!v) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->nnodes; i++) {
        const char *why;
        const af_node *node = g->nodes[i];
        const af_value *sum = join_sum(node), *list[2] = {NULL, NULL};
        if (sum && candidate_reads(sum)) {
            list[0] = node->in[0], list[1] = node->in[1];
        } else if (weights_of(node, &why) && node->out[0]) {
            list[0] = node->in[0]->is_input ? NULL : node->in[0];
            list[1] = activated(node->out[0]); /* its output, quantized too (below) */
        }
        for (int k = 0; k < 2; k++) {
            bool seen = !list[k];
            for (int j = 0; j < *n && !seen; j++) seen = v[j] == list[k];
            if (!seen) v[(*n)++] = list[k];
        }
    }
    *out = v;
    return AF_OK;
}

/* ---- the decisions ------------------------------------------------------------------------- */

static af_status add_entry(af_quant_result *r, const af_node *n, bool int8, const char *why,
                           af_error *err) {
    af_quant_decision *e = af_realloc(r->e, sizeof *e * (size_t)(r->n + 1));
    if (!e) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    r->e = e;
    e = &r->e[r->n];
    e->node = af_strdup(n->name);
    e->op = af_strdup(n->op_type ? n->op_type : af_ops[n->op].name);
    e->why = why ? af_strdup(why) : NULL;
    e->int8 = int8;
    if (!e->node || !e->op || (why && !e->why)) {
        af_free(e->node), af_free(e->op), af_free(e->why);
        return af_fail(err, AF_ERR_NOMEM, "out of memory");
    }
    r->n++;
    r->nint8 += int8;
    return AF_OK;
}

void af_quant_result_free(af_quant_result *r) {
    for (int i = 0; i < r->n; i++) af_free(r->e[i].node), af_free(r->e[i].op), af_free(r->e[i].why);
    af_free(r->e);
    memset(r, 0, sizeof *r);
}

/* Does the list (--keep_fp32) name n: its name or its op type? */
static bool kept(const af_node *n, const char *list) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, ", ");
        size_t l = strcspn(p, ",");
        while (l && p[l - 1] == ' ') l--;
        if (l && ((strlen(n->name) == l && !strncmp(n->name, p, l)) ||
                  (strlen(af_ops[n->op].name) == l && !strncmp(af_ops[n->op].name, p, l))))
            return true;
        p += strcspn(p, ",");
    }
    return false;
}

/* Every entry of --keep_fp32 names a node or an op type of g, else AF_ERR_INVALID_ARG. */
static af_status check_keep(const af_graph *g, const char *list, af_error *err) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, ", ");
        size_t l = strcspn(p, ",");
        while (l && p[l - 1] == ' ') l--;
        bool found = l == 0;
        for (int i = 0; i < g->nnodes && !found; i++) {
            const af_node *n = g->nodes[i];
            found = (strlen(n->name) == l && !strncmp(n->name, p, l)) ||
                    (strlen(af_ops[n->op].name) == l && !strncmp(af_ops[n->op].name, p, l));
        }
        if (!found)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "%s: --keep_fp32 entry '%.*s' names no node or op type of the model "
                           "(under int8, node names as the model has them, or Conv, MatMul, Gemm)",
                           g->file ? g->file : "model", (int)l, p);
        p += strcspn(p, ",");
    }
    return AF_OK;
}

/* reach[i]: a Conv/MatMul/Gemm follows node i (reads one of its outputs, directly or not). */
static bool *downstream_gemms(const af_graph *g) {
    bool *reach = af_calloc((size_t)g->nnodes + 1, sizeof *reach);
    for (int i = g->nnodes - 1; reach && i >= 0; i--) {
        const af_node *n = g->nodes[i];
        for (int o = 0; o < n->nout && !reach[i]; o++)
            for (int u = 0; n->out[o] && u < n->out[o]->nuses && !reach[i]; u++) {
                const af_node *r = n->out[o]->uses[u].node;
                if (r->graph != g) { /* read inside a body: count it as followed */
                    reach[i] = true;
                    break;
                }
                reach[i] = is_gemm_op(r->op) || (r->id > i && r->id < g->nnodes && reach[r->id]);
            }
    }
    return reach;
}

/* The first ReduceMean of a LayerNorm written out (x - mean(x), ...): read by a Sub of x. */
static bool decomposed_layernorm(const af_node *n) {
    if (n->op != AF_OP_REDUCE_MEAN || !n->in[0] || !n->out[0]) return false;
    for (int u = 0; u < n->out[0]->nuses; u++) {
        const af_node *r = n->out[0]->uses[u].node;
        if (r->op == AF_OP_SUB && r->nin == 2 && r->in[0] == n->in[0] && r->in[1] == n->out[0])
            return true;
    }
    return false;
}

/* ---- the rewrite --------------------------------------------------------------------------- */

/* Per-tensor uint8 parameters of the range [lo, hi] (widened to hold 0). */
static void act_params(float lo, float hi, float *scale, uint8_t *zp) {
    double l = fmin(lo, 0.0), h = fmax(hi, 0.0);
    double s = (h - l) / 255.0;
    if (!(s > 0) || !isfinite(s) || !((float)s > 0)) {
        *scale = 1.0f; /* a constant zero: any scale holds it */
        *zp = 0;
        return;
    }
    *scale = (float)s;
    double z = nearbyint(-l / (double)*scale);
    *zp = (uint8_t)(z < 0 ? 0 : z > 255 ? 255 : z);
}

static af_value *scalar_const(af_graph *g, const char *hint, af_dtype t) {
    const char *name = af_graph_unique_name(g, hint);
    return name ? af_value_new_const(g, name, t, 0, NULL) : NULL;
}

/* A node of op `op` named after base + suffix, reading in[0..nin), writing a new value of
 * dtype t and x's dims (named after x). */
static af_value *qdq_node(af_graph *g, af_op op, const char *base, const char *suffix,
                          af_value *const *in, int nin, const af_value *x, af_dtype t) {
    char hint[512];
    snprintf(hint, sizeof hint, "%s%s", base, suffix);
    const char *nname = af_graph_unique_name(g, hint);
    af_node *n = nname ? af_node_new(g, op, nname, nin, 1) : NULL;
    snprintf(hint, sizeof hint, "%s%s", x->name, suffix);
    const char *vname = n ? af_graph_unique_name(g, hint) : NULL;
    af_value *y = vname ? af_value_new(g, vname) : NULL;
    if (!y) return NULL;
    for (int k = 0; k < nin; k++) af_node_set_input(n, k, in[k]);
    af_node_set_output(n, 0, y);
    af_tensor_type_copy(&y->type, &x->type);
    y->type.dtype = t;
    for (int d = 0; d < AF_MAX_RANK; d++) y->dim_param[d] = x->dim_param[d];
    return y;
}

/* x -> Q -> DQ: the fake-quantized float value. */
static af_value *quantize_activation(af_graph *g, af_value *x, float lo, float hi) {
    float s;
    uint8_t z;
    act_params(lo, hi, &s, &z);
    af_value *sv = scalar_const(g, "x_scale", AF_DTYPE_FLOAT);
    af_value *zv = sv ? scalar_const(g, "x_zero_point", AF_DTYPE_UINT8) : NULL;
    if (!zv) return NULL;
    *(float *)sv->type.data = s;
    *(uint8_t *)zv->type.data = z;
    af_value *in[3] = {x, sv, zv};
    af_value *q = qdq_node(g, AF_OP_QUANTIZE_LINEAR, x->name, "/QuantizeLinear", in, 3, x,
                           AF_DTYPE_UINT8);
    if (!q) return NULL;
    in[0] = q;
    return qdq_node(g, AF_OP_DEQUANTIZE_LINEAR, x->name, "/DequantizeLinear", in, 3, x,
                    AF_DTYPE_FLOAT);
}

/* DQ(Wq): w int8 symmetric per slice of `axis` (axis < 0: per tensor). NULL when out of memory
 * or *bad when a weight is not finite. */
static af_value *quantize_weights(af_graph *g, const af_node *n, const af_value *w, int axis,
                                  int wmax, bool *bad) {
    const af_tensor *wt = &w->type;
    int64_t total = af_tensor_numel(wt), m = axis < 0 ? 1 : wt->dims[axis], inner = 1;
    for (int d = axis + 1; axis >= 0 && d < wt->rank; d++) inner *= wt->dims[d];
    const float *src = wt->data;
    char hint[512];
    snprintf(hint, sizeof hint, "%s/quantized", w->name);
    const char *qname = af_graph_unique_name(g, hint);
    af_value *q = qname ? af_value_new_const(g, qname, AF_DTYPE_INT8, wt->rank, wt->dims) : NULL;
    af_value *sv = q ? af_value_new_f32(g, "w_scale", axis < 0 ? 0 : 1, &m) : NULL;
    const char *zname = sv ? af_graph_unique_name(g, "w_zero_point") : NULL;
    af_value *zv = zname ? af_value_new_const(g, zname, AF_DTYPE_INT8, axis < 0 ? 0 : 1, &m) : NULL;
    double *amax = zv ? af_calloc((size_t)m + 1, sizeof *amax) : NULL;
    if (!amax) return NULL;
    for (int64_t i = 0; i < total; i++) {
        if (!isfinite(src[i])) *bad = true;
        int64_t c = axis < 0 ? 0 : (i / inner) % m;
        amax[c] = fmax(amax[c], fabs(src[i]));
    }
    float *scale = sv->type.data;
    for (int64_t c = 0; c < m; c++) scale[c] = amax[c] > 0 ? (float)(amax[c] / wmax) : 1.0f;
    for (int64_t c = 0; c < m; c++) *bad |= !(scale[c] > 0) || !isfinite(scale[c]);
    af_free(amax);
    if (*bad) return NULL;
    int8_t *dst = q->type.data;
    for (int64_t i = 0; i < total; i++) {
        int64_t c = axis < 0 ? 0 : (i / inner) % m;
        double v = nearbyint((double)src[i] / (double)scale[c]);
        dst[i] = (int8_t)(v < -wmax ? -wmax : v > wmax ? wmax : v);
    }
    af_value *in[3] = {q, sv, zv};
    af_value *y = qdq_node(g, AF_OP_DEQUANTIZE_LINEAR, n->name, "/weights/DequantizeLinear", in,
                           3, w, AF_DTYPE_FLOAT);
    if (y && axis >= 0 && !af_node_set_int(y->producer, "axis", axis)) return NULL;
    return y;
}

/* The calibrated range of the value called `name`; false when calibration has none. */
static bool range_of(const af_quant_table *t, const char *name, float *lo, float *hi) {
    for (int i = 0; t && i < t->n; i++)
        if (!strcmp(t->names[i], name)) {
            *lo = t->lo[i], *hi = t->hi[i];
            return isfinite(*lo) && isfinite(*hi);
        }
    return false;
}

/* The inference BatchNormalization that is the only reader of conv's output, with constant
 * float32 parameters of one value per output channel; NULL when there is none. */
static af_node *bn_after(const af_node *conv) {
    const af_value *y = conv->out[0];
    af_node *bn = y && !y->is_output ? af_value_sole_reader(y) : NULL;
    if (!bn || bn->op != AF_OP_BATCH_NORMALIZATION || bn->nin < 5 || bn->in[0] != y ||
        af_attr_int(bn, "training_mode", 0) || !bn->out[0])
        return NULL;
    for (int o = 1; o < bn->nout; o++)
        if (bn->out[o] && (bn->out[o]->nuses || bn->out[o]->is_output)) return NULL;
    int64_t m = conv->in[1]->type.dims[0];
    for (int k = 1; k < 5; k++) {
        const af_value *p = bn->in[k];
        if (!af_value_is_const(p) || !af_value_is_f32(p) || af_tensor_numel(&p->type) != m)
            return NULL;
    }
    const af_value *b = conv->nin > 2 ? conv->in[2] : NULL;
    if (b && (!af_value_is_const(b) || !af_value_is_f32(b) || af_tensor_numel(&b->type) != m))
        return NULL;
    return bn;
}

/* Conv -> BatchNormalization as one Conv with the normalisation in its weights and bias, so
 * that the weights are quantized as they are used (ONNX Runtime's quantizer folds it first
 * too) and the QDQ model is DQ -> Conv -> Relu, the pattern int8 convolutions match. The Conv
 * then writes the BatchNormalization's output value (names downstream unchanged). */
static af_status fold_bn(af_graph *g, af_node *conv, af_node *bn, af_error *err) {
    const af_value *w = conv->in[1], *b = conv->nin > 2 ? conv->in[2] : NULL;
    int64_t m = w->type.dims[0], inner = af_tensor_numel(&w->type) / (m ? m : 1);
    const float *gamma = bn->in[1]->type.data, *beta = bn->in[2]->type.data;
    const float *mean = bn->in[3]->type.data, *var = bn->in[4]->type.data;
    double eps = af_attr_float(bn, "epsilon", 1e-5f);
    char hint[512];
    snprintf(hint, sizeof hint, "%s/bn_folded", w->name);
    const char *wname = af_graph_unique_name(g, hint);
    af_value *wf = wname ? af_value_new_const(g, wname, AF_DTYPE_FLOAT, w->type.rank, w->type.dims)
                         : NULL;
    af_value *bf = wf ? af_value_new_f32(g, "bias_bn_folded", 1, &m) : NULL;
    if (!bf) return af_node_fail(err, conv, AF_ERR_NOMEM, "out of memory");
    const float *src = w->type.data, *bias = b ? b->type.data : NULL;
    float *dw = wf->type.data, *db = bf->type.data;
    for (int64_t c = 0; c < m; c++) {
        double s = gamma[c] / sqrt((double)var[c] + eps);
        for (int64_t i = 0; i < inner; i++) dw[c * inner + i] = (float)(src[c * inner + i] * s);
        db[c] = (float)(((bias ? bias[c] : 0.0) - mean[c]) * s + beta[c]);
    }
    af_node_set_input(conv, 1, wf);
    if (conv->nin > 2) af_node_set_input(conv, 2, bf);
    else if (af_node_add_input(conv, bf) < 0) return af_node_fail(err, conv, AF_ERR_NOMEM, "out of memory");
    af_value *y = bn->out[0];
    af_node_remove(bn);
    af_node_set_output(conv, 0, y);
    return AF_OK;
}

/* Every Conv candidate followed by a foldable BatchNormalization, folded. */
static af_status fold_batchnorms(af_graph *g, af_error *err) {
    for (int i = 0; i < g->nnodes; i++) {
        af_node *n = g->nodes[i], *bn;
        const char *why;
        if (n->op != AF_OP_CONV || !weights_of(n, &why) || !(bn = bn_after(n))) continue;
        af_status st = fold_bn(g, n, bn, err);
        if (st) return st;
    }
    return AF_OK;
}

/* Why candidate n stays float32 (NULL: it is quantized). */
static const char *sensitive(const af_graph *g, const af_node *n, const bool *reach,
                             int first_conv, const char *keep) {
    if (n->in[0]->is_input) return "reads the model input";
    if (n->id == first_conv) return "the first convolution (it reads the raw input)";
    if (n->op != AF_OP_CONV && !reach[n->id])
        return "the classifier head (no Conv/MatMul/Gemm follows it)";
    if (kept(n, keep)) return "--keep_fp32";
    (void)g;
    return NULL;
}

af_status af_pass_quantize(af_graph *g, const af_quant_table *t, const char *keep_fp32,
                           af_quant_result *res, af_error *err) {
    memset(res, 0, sizeof *res);
    const char *file = g->file ? g->file : "model";
    int64_t opset = af_graph_opset(g);
    if (opset < 10)
        return af_fail(err, AF_ERR_UNSUPPORTED,
                       "%s: int8 needs opset 10 or later (QuantizeLinear); the model is opset %lld",
                       file, (long long)opset);
    res->per_tensor_weights = opset < 13; /* DequantizeLinear's axis came with opset 13 */
    af_status st = check_keep(g, keep_fp32, err);
    if (!st) st = fold_batchnorms(g, err);
    if (st) return st;
    af_graph_renumber(g);
    bool *reach = downstream_gemms(g);
    af_value **fq = af_calloc((size_t)g->nvalues + 1, sizeof *fq); /* by value id: its Q/DQ */
    int nnodes = g->nnodes, nvals = g->nvalues, first_conv = -1;
    bool *quantized = af_calloc((size_t)nnodes + 1, sizeof *quantized); /* by node index */
    if (!reach || !fq || !quantized) {
        af_free(reach), af_free(fq), af_free(quantized);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", file);
    }
    for (int i = 0; i < nnodes && first_conv < 0; i++) {
        const char *why;
        if (g->nodes[i]->op == AF_OP_CONV && weights_of(g->nodes[i], &why)) first_conv = i;
    }
    bool changed = false;
    for (int i = 0; i < nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        const char *why = NULL;
        const af_value *w = weights_of(n, &why);
        if (!w) {
            if (why) st = add_entry(res, n, false, why, err);
            else if (n->op == AF_OP_SOFTMAX)
                st = add_entry(res, n, false, "softmax stays float32 (attention probabilities "
                                              "are precision-sensitive)", err);
            else if (n->op == AF_OP_LAYER_NORMALIZATION)
                st = add_entry(res, n, false, "normalisation stays float32 (mean and variance "
                                              "are precision-sensitive)", err);
            else if (decomposed_layernorm(n))
                st = add_entry(res, n, false, "a LayerNorm (ReduceMean, Sub, Pow, Sqrt, Div) "
                                              "stays float32 (mean and variance are "
                                              "precision-sensitive)", err);
            continue;
        }
        why = sensitive(g, n, reach, first_conv, keep_fp32);
        float lo = 0, hi = 0;
        if (!why && !range_of(t, n->in[0]->name, &lo, &hi))
            why = "no calibration range for its input";
        af_value *x = n->in[0];
        if (!why && !fq[x->id] && !(fq[x->id] = quantize_activation(g, x, lo, hi)))
            st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        bool bad = false;
        af_value *wq = NULL;
        if (!why && !st &&
            !(wq = quantize_weights(g, n, w, res->per_tensor_weights ? -1 : channel_axis(n, w),
                                    t->weight_max > 0 && t->weight_max < 127 ? t->weight_max : 127,
                                    &bad))) {
            if (bad) why = "the weights are not finite";
            else st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        }
        if (!why && !st) {
            af_node_set_input(n, 0, fq[x->id]);
            af_node_set_input(n, 1, wq);
            changed = quantized[i] = true;
        }
        if (!st) st = add_entry(res, n, !why, why, err);
    }
    /* the outputs of the quantized ops (after their Relu/Clip) that no quantized op reads, as
     * ONNX Runtime's quantizer writes them: it runs a Conv/MatMul on integers only with a
     * QuantizeLinear after it (DQ -> op -> Q); without one it ran our BERT-Base export on
     * dequantized weights at 1.8x its float32 time */
    for (int i = 0; i < nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        if (!quantized[i]) continue;
        af_value *y = (af_value *)activated(n->out[0]); /* (a value of g: this pass rewrites g) */
        float lo, hi;
        bool here = y->nuses > 0;
        for (int u = 0; here && u < y->nuses; u++) here = y->uses[u].node->graph == g;
        if (!here || y->is_output || y->id >= nvals || fq[y->id] || !range_of(t, y->name, &lo, &hi))
            continue;
        if (!(fq[y->id] = quantize_activation(g, y, lo, hi))) {
            st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
            break;
        }
        const af_node *q = fq[y->id]->producer->in[0]->producer; /* the QuantizeLinear of y */
        for (int u = y->nuses - 1; u >= 0; u--)
            if (y->uses[u].node != q) af_node_set_input(y->uses[u].node, y->uses[u].slot, fq[y->id]);
        changed = true;
    }
    /* the joins whose sum the loops above quantized: their inputs too (an input already read
     * through a pair, a quantized op's output, is a value made here) */
    for (int i = 0; i < nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        const af_value *sum = join_sum(n);
        if (!sum || sum->id >= nvals || !fq[sum->id]) continue;
        for (int k = 0; k < 2 && !st; k++) {
            af_value *x = n->in[k];
            float lo, hi;
            if (x->id >= nvals || (!fq[x->id] && !range_of(t, x->name, &lo, &hi))) continue;
            if (!fq[x->id] && !(fq[x->id] = quantize_activation(g, x, lo, hi)))
                st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
            else af_node_set_input(n, k, fq[x->id]);
            changed = true;
        }
    }
    af_free(reach);
    af_free(fq);
    af_free(quantized);
    if (!st && changed) st = af_graph_toposort(g, err);
    if (!st && changed) st = af_graph_infer_shapes(g, err);
    if (st) af_quant_result_free(res);
    return st;
}
