/* Constant folding. A node whose inputs are all constants runs once, now, through the op table's
 * shape function and reference kernel; its output values become constants holding the result
 * (same values, same names, so consumers and graph outputs need no rewiring) and the node goes.
 * Shape and Size fold as soon as their input's dims are all known, whatever its data: with
 * static shapes, the Shape->Gather->Concat->Reshape arithmetic of exported models disappears.
 *
 * Invariant: folding never changes what the graph computes. Control flow is not folded (its
 * kernels need an executor frame), nor are sampling ops; anything a kernel refuses, or that
 * would be too large to store or too slow to precompute, stays a node and runs (or fails) at
 * run time as before.
 */
#include "passes/rewrite.h"
#include "kernels/fast/dispatch.h"

#include <string.h>

/* Largest result stored as a constant, in elements over all outputs. */
#define FOLD_MAX_ELEMS ((int64_t)16 << 20)
/* Results above this may not be larger than the inputs they replace: a broadcast or a
 * ConstantOfShape would otherwise bloat the model with data computed as cheaply at run time. */
#define FOLD_GROW_ELEMS ((int64_t)1 << 20)
/* Ops whose cost grows with inputs times outputs (Conv, Gemm, MatMul, pooling, recurrences,
 * DFT, fused ops) fold only when both are small, so that compiling never runs a long reference
 * loop. */
#define FOLD_HEAVY_OUT ((int64_t)1 << 16)
#define FOLD_HEAVY_IN ((int64_t)1 << 20)

/* ONNX's sampling ops draw new values on every run; matched by name so that a row added to the
 * op table later is covered without touching this file. */
static bool random_op(af_op op) {
    const char *name = af_ops[op].name;
    return !strncmp(name, "Random", 6) || !strcmp(name, "Bernoulli") ||
           !strcmp(name, "Multinomial");
}

static bool foldable_op(const af_node *n) {
    if (n->op >= AF_OP_COUNT || n->nout < 1 || random_op(n->op)) return false;
    if (n->op == AF_OP_IF || n->op == AF_OP_LOOP || n->op == AF_OP_SCAN) return false;
    return pass_subgraph(n, 0) == NULL;
}

static bool inputs_const(const af_node *n) {
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] && !af_value_is_const(n->in[k])) return false;
    return true;
}

static int64_t input_elems(const af_node *n) {
    int64_t total = 0;
    for (int k = 0; k < n->nin; k++) {
        int64_t c = n->in[k] ? af_tensor_numel(&n->in[k]->type) : 0;
        if (c > 0 && !af_add_i64(total, c, &total)) return INT64_MAX;
    }
    return total;
}

/* Elements of the outputs whose dims are known (unknown ones count 0 until computed). */
static int64_t output_elems(const af_node *n, const af_tensor *out) {
    int64_t total = 0;
    for (int o = 0; o < n->nout; o++) {
        int64_t c = af_tensor_known(&out[o]) ? af_tensor_numel(&out[o]) : 0;
        if (c < 0 || !af_add_i64(total, c, &total)) return INT64_MAX;
    }
    return total;
}

static bool heavy_op(af_op op) {
    switch (op) {
    case AF_OP_EINSUM: case AF_OP_RNN: case AF_OP_GRU: case AF_OP_LSTM: case AF_OP_DFT:
    case AF_OP_STFT: return true;
    default:
        return af_ops[op].cls == AF_CLASS_OUT_FUSABLE ||
               (af_op_is_ours(op) && af_ops[op].cls != AF_CLASS_ELEMWISE);
    }
}

static bool size_ok(const af_node *n, const af_tensor *out) {
    int64_t res = output_elems(n, out), src = input_elems(n);
    if (res > FOLD_MAX_ELEMS) return false;
    if (res > FOLD_GROW_ELEMS && res > src) return false;
    if (heavy_op(n->op)) return res <= FOLD_HEAVY_OUT && src <= FOLD_HEAVY_IN;
    return true;
}

/* Run n on its constant inputs into out[0..nout) as the executor would. False (out released)
 * when the node cannot or should not be computed now; the reason does not matter here, since
 * the node then simply stays. */
static bool compute(const af_node *n, const af_tensor **in, af_tensor *out) {
    af_error scratch;
    for (int k = 0; k < n->nin; k++) in[k] = n->in[k] ? &n->in[k]->type : NULL;
    for (int o = 0; o < n->nout; o++) out[o].rank = -1;
    bool ok = af_kernel_shape(n, in, out, &scratch) == AF_OK && size_ok(n, out);
    for (int o = 0; o < n->nout && ok; o++) {
        if (out[o].rank > AF_MAX_RANK) ok = false;
        else if (af_tensor_known(&out[o])) ok = af_tensor_alloc(&out[o], &scratch) == AF_OK;
    }
    ok = ok && af_kernel_run(n, in, out, NULL, &scratch) == AF_OK;
    for (int o = 0; o < n->nout && ok; o++)
        ok = !n->out[o] || (out[o].data && af_tensor_known(&out[o]) && af_dtype_size(out[o].dtype));
    ok = ok && size_ok(n, out);
    if (!ok)
        for (int o = 0; o < n->nout; o++) af_tensor_release(&out[o]);
    return ok;
}

/* Give n's output values the computed tensors (copied into the graph's arena) and drop n. */
static af_status store(pass_scope *s, af_node *n, af_tensor *out, af_error *err) {
    af_status st = AF_OK;
    for (int o = 0; o < n->nout && !st; o++) {
        af_value *v = n->out[o];
        if (!v) continue;
        void *data = af_arena_alloc_data(s->g->arena, out[o].nbytes ? out[o].nbytes : 1);
        if (!data) {
            st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory folding constants");
            break;
        }
        memcpy(data, out[o].data, out[o].nbytes);
        v->type.dtype = out[o].dtype;
        v->type.rank = out[o].rank;
        memcpy(v->type.dims, out[o].dims, sizeof v->type.dims);
        v->type.data = data;
        v->type.nbytes = out[o].nbytes;
        v->type.owns_data = 0;
        memset(v->dim_param, 0, sizeof v->dim_param);
        v->is_const = true;
    }
    for (int o = 0; o < n->nout; o++) af_tensor_release(&out[o]);
    return st ? st : pass_kill(s, n, err);
}

static af_status fold_node(pass_scope *s, af_node *n, bool *changed, af_error *err) {
    /* On the heap: a node may have very many inputs or outputs. */
    const af_tensor **in = af_calloc((size_t)n->nin + 1, sizeof(af_tensor *));
    af_tensor *out = af_calloc((size_t)n->nout + 1, sizeof(af_tensor));
    af_status st = AF_OK;
    if (!in || !out) st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory folding constants");
    else if (compute(n, in, out)) {
        st = store(s, n, out, err);
        *changed = true;
    }
    af_free(in);
    af_free(out);
    return st;
}

/* Shape's [start, end) window (opset 15), clamped as the kernel does. */
static void shape_op_window(const af_node *n, int rank, int64_t *lo, int64_t *hi) {
    int64_t a = af_attr_int(n, "start", 0), b = af_attr_int(n, "end", rank);
    if (a < 0) a += rank;
    if (b < 0) b += rank;
    *lo = a < 0 ? 0 : a > rank ? rank : a;
    *hi = b < *lo ? *lo : b > rank ? rank : b;
}

/* Shape or Size of a value whose dims are all known, whether or not its data is. */
static af_status fold_shape(pass_scope *s, af_node *n, bool *changed, af_error *err) {
    const af_tensor *x = &n->in[0]->type;
    if (!af_tensor_known(x) || n->nout != 1) return AF_OK;
    af_tensor out = {.dtype = AF_DTYPE_INT64, .rank = n->op == AF_OP_SHAPE ? 1 : 0};
    int64_t lo = 0, hi = 0, count = af_tensor_numel(x);
    if (n->op == AF_OP_SHAPE) {
        shape_op_window(n, x->rank, &lo, &hi);
        out.dims[0] = hi - lo;
    } else if (count < 0) {
        return AF_OK; /* the element count overflows: let the kernel report it */
    }
    af_status st = af_tensor_alloc(&out, err);
    if (st) return st;
    int64_t *d = out.data;
    if (n->op == AF_OP_SHAPE)
        for (int64_t i = lo; i < hi; i++) d[i - lo] = x->dims[i];
    else
        d[0] = count;
    *changed = true;
    return store(s, n, &out, err);
}

/* A DequantizeLinear of 8-bit constant weights that a Conv, MatMul or Gemm reads as its weights
 * (input 1). Before fusion it stays: folded, the int8 rule (fusion/rules/quant.c) would see
 * float weights and could not take the 8-bit values and their scale back exactly; what the rule
 * leaves is folded by the simplify after fusion (s->keep_qweights clear). */
static bool quantized_weights(const af_node *n) {
    if (n->op != AF_OP_DEQUANTIZE_LINEAR || n->nin < 2 || !n->in[0] || n->nout != 1 ||
        !n->out[0] || (n->in[0]->type.dtype != AF_DTYPE_INT8 && n->in[0]->type.dtype != AF_DTYPE_UINT8))
        return false;
    const af_value *y = n->out[0];
    for (int u = 0; u < y->nuses; u++) {
        af_op op = y->uses[u].node->op;
        if (y->uses[u].slot == 1 && (op == AF_OP_CONV || op == AF_OP_MATMUL || op == AF_OP_GEMM))
            return true;
    }
    return false;
}

af_status pass_fold_constants(pass_scope *s, bool *changed, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < s->g->nnodes && !st; i++) {
        af_node *n = s->g->nodes[i];
        if (pass_dead(s, n) || !foldable_op(n) || (s->keep_qweights && quantized_weights(n)))
            continue;
        if (inputs_const(n))
            st = fold_node(s, n, changed, err);
        else if ((n->op == AF_OP_SHAPE || n->op == AF_OP_SIZE) && n->nin >= 1 && n->in[0])
            st = fold_shape(s, n, changed, err);
    }
    return st;
}
