/* codes: uint8 activations between int8 convolutions (issue 18). It runs last, after packing.
 *
 * An int8 conv converts its float32 input to the uint8 codes of its input quantization before
 * its U8S8 products: its producer wrote a float32 tensor that is read back only to be
 * converted, where ONNX Runtime passes uint8. Here, when every reader of a channels-last
 * FusedConv's output is an int8 conv on the U8S8 core reading it as X with one x_scale s and
 * x_zero_point z, the producer gets y_scale = s, y_zero_point = z and writes those codes (UINT8,
 * kernels/fast/conv.c) and the readers take them as they are: a quarter of the bytes, no
 * conversion, the very codes the readers made before (to_u8 on the same floats). A last epilogue
 * step fq(s, z) is dropped: the codes of y and of fq(y) are the same. Producers are the convs
 * whose kernels write codes: int8 ones on U8S8 and float32 depthwise ones (a MobileNet's
 * depthwise conv between its int8 expand and projection).
 *
 * Each candidate is checked by the kernels themselves: the producer and every reader must still
 * take the new types (their shape functions, and their preparation when every dim is known),
 * else the value stays float32; with dims unknown (a dynamic batch) only epilogues whose
 * operands are scalars or per-channel vectors qualify, as the vector steps read those whatever
 * the batch. AUTOFUSION_CODES=0 turns the pass off (A/B measurements, tests).
 *
 * Then, in any quantized graph, a Relu or Clip right before an output quantization (a last fq
 * step, or the codes) is dropped where the quantization implies it (drop_implied_clamp).
 *
 * Invariant: a value becomes UINT8 only with every one of its readers checked, so no kernel ever
 * reads codes it does not take; graph outputs and values read by another graph stay float32. */
#include "ir/epilogue.h"
#include "kernels/fast/dispatch.h"
#include "kernels/ref/fused.h"
#include "lower/lower.h"
#include "passes/rewrite.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An int8 conv on the U8S8 core, packed and channels-last. */
static bool int8_conv(const af_node *n) {
    return n->op == AF_OP_FUSED_CONV && fused_quant_on(n) && af_attr_int(n, "w_packed", 0) == 1 &&
           n->nin > 1 && n->in[1] && n->in[1]->type.dtype == AF_DTYPE_INT8;
}

/* A producer whose kernel can write codes (the kernel has the last word: takes()). */
static bool codes_producer(const af_node *p) {
    return int8_conv(p) || (p->op == AF_OP_FUSED_CONV && af_attr_int(p, "w_packed", 0) == 2 &&
                            p->nout == 1 && af_attr_int(p, "pro_w", -1) < 0);
}

/* Does the kernel of n take its inputs' types as they are now: its shape function, and when
 * every type is known its preparation too (which also reads the epilogue's operand kinds)? */
static bool takes(const af_node *n) {
    const af_tensor **types = af_malloc(sizeof *types * (size_t)(n->nin > 0 ? n->nin : 1));
    af_tensor *out = af_calloc((size_t)(n->nout > 0 ? n->nout : 1), sizeof *out);
    bool ok = types && out, known = true;
    for (int k = 0; ok && k < n->nin; k++) {
        types[k] = n->in[k] ? &n->in[k]->type : NULL;
        known = known && (!types[k] || af_tensor_known(types[k]));
    }
    ok = ok && af_kernel_shape(n, types, out, NULL) == AF_OK;
    if (ok && known) {
        void *st = af_kernel_prepare(n, types);
        ok = st != NULL;
        af_kernel_release(st);
    }
    af_free(out);
    af_free(types);
    return ok;
}

/* With dims unknown: are p's epilogue steps vector steps whatever the dims, no plugin's op and
 * every operand a scalar or a per-channel vector ([M], or ones and M) of known shape? (A
 * residual's kind depends on the batch.) */
static bool plain_operands(const af_node *p, int64_t m) {
    const int64_t *ep = NULL;
    int n = af_attr_ints(p, "epilogue", &ep);
    for (int s = 0; s + 2 < n; s += 3) {
        if (ep[s] == AF_EP_CUSTOM_UNARY || ep[s] == AF_EP_CUSTOM_BINARY) return false;
        if (ep[s + 1] < 0) continue; /* unary */
        const af_value *x = ep[s + 1] < p->nin ? p->in[ep[s + 1]] : NULL;
        if (!x || !af_tensor_known(&x->type)) return false;
        int64_t numel = af_tensor_numel(&x->type);
        const af_tensor *t = &x->type;
        if (numel != 1 && !(numel == m && t->rank >= 1 && t->dims[t->rank - 1] == m)) return false;
    }
    return true;
}

/* Drop step k of p's epilogue program (k < 0: counted from the end). */
static bool drop_step(af_node *p, int k) {
    int64_t e[3 * AF_EP_MAX_STEPS];
    float q[2 * AF_EP_MAX_STEPS];
    int n = af_epilogue_steps(p, e, q);
    if (k < 0) k += n;
    if (k < 0 || k >= n) return false;
    memmove(e + 3 * k, e + 3 * (k + 1), (size_t)(3 * (n - k - 1)) * sizeof *e);
    memmove(q + 2 * k, q + 2 * (k + 1), (size_t)(2 * (n - k - 1)) * sizeof *q);
    return af_epilogue_set_steps(p, e, q, n - 1);
}

/* The code of y in the quantization (s, z), as fq and to_u8 compute it. */
static float code_of(float y, float s, int z) {
    float q = nearbyintf(y / s) + (float)z;
    return q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
}

/* A Relu or Clip as the last step before p's output is quantized (a last fq step, or its
 * codes) is implied by the quantization when its lower bound's code is 0 and its upper one's
 * 255: codes are monotonic in y, so every clamped y had that code anyway (a NaN stays a NaN,
 * or code 0, either way). Dropped: two of the dozen vector ops of an int8 conv's epilogue per
 * output vector (a Relu6 before a [0, 6] quantization, a Relu before a zero point 0). */
static af_status drop_implied_clamp(af_node *p, af_error *err) {
    int64_t ep[3 * AF_EP_MAX_STEPS];
    float pr[2 * AF_EP_MAX_STEPS];
    int n = af_epilogue_steps(p, ep, pr);
    float s = af_attr_float(p, "y_scale", 0.0f);
    int z = (int)af_attr_int(p, "y_zero_point", 0), k = n - 1;
    if (s == 0.0f) { /* no codes: a last fq step */
        if (!af_last_fq(p, &s, &z)) return AF_OK;
        k = n - 2;
    }
    if (k < 0 || (ep[3 * k] != AF_EP_RELU && ep[3 * k] != AF_EP_CLIP)) return AF_OK;
    float lo = ep[3 * k] == AF_EP_RELU ? 0.0f : pr[2 * k], hi = ep[3 * k] == AF_EP_RELU ? INFINITY : pr[2 * k + 1];
    if (code_of(lo, s, z) != 0.0f || code_of(hi, s, z) != 255.0f) return AF_OK;
    return drop_step(p, k) ? AF_OK : af_node_fail(err, p, AF_ERR_NOMEM, "out of memory");
}

/* y as codes, when its producer and readers agree (see the top); the types back otherwise. */
static af_status try_codes(af_value *y, af_error *err) {
    af_node *p = y->producer;
    if (!p || p->nout != 1 || y->is_output || y->nuses < 1 || y->type.dtype != AF_DTYPE_FLOAT ||
        y->type.rank < 3 || y->type.dims[y->type.rank - 1] < 1 || !codes_producer(p) ||
        (!af_tensor_known(&y->type) && !plain_operands(p, y->type.dims[y->type.rank - 1])))
        return AF_OK;
    const af_node *r0 = y->uses[0].node;
    float s = af_attr_float(r0, "x_scale", 0.0f);
    int64_t z = af_attr_int(r0, "x_zero_point", -1);
    for (int u = 0; u < y->nuses; u++) {
        const af_node *r = y->uses[u].node;
        if (r->graph != p->graph || y->uses[u].slot != 0 || !int8_conv(r) ||
            af_attr_float(r, "x_scale", 0.0f) != s || af_attr_int(r, "x_zero_point", -1) != z)
            return AF_OK;
    }
    if (!af_node_set_float(p, "y_scale", s) || !af_node_set_int(p, "y_zero_point", z))
        return af_node_fail(err, p, AF_ERR_NOMEM, "out of memory");
    y->type.dtype = AF_DTYPE_UINT8;
    bool ok = takes(p);
    for (int u = 0; ok && u < y->nuses; u++) ok = takes(y->uses[u].node);
    if (!ok) {
        y->type.dtype = AF_DTYPE_FLOAT;
        af_node_drop_attr(p, "y_scale");
        af_node_drop_attr(p, "y_zero_point");
        return AF_OK;
    }
    float ls;
    int lz;
    if (af_last_fq(p, &ls, &lz) && ls == s && lz == z && !drop_step(p, -1))
        return af_node_fail(err, p, AF_ERR_NOMEM, "out of memory");
    return AF_OK;
}

static af_status codes_graph(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_node *n = g->nodes[i];
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(n, k)); k++) st = codes_graph(sub, err);
        if (!st && n->op == AF_OP_FUSED_CONV && n->nout == 1 && n->out[0]) st = try_codes(n->out[0], err);
    }
    for (int i = 0; i < g->nnodes && !st; i++)
        if (g->nodes[i]->op == AF_OP_FUSED_CONV || g->nodes[i]->op == AF_OP_FUSED_MATMUL ||
            g->nodes[i]->op == AF_OP_FUSED_ELEMENTWISE)
            st = drop_implied_clamp(g->nodes[i], err);
    return st;
}

af_status af_pass_codes(af_graph *g, af_error *err) {
    const char *env = getenv("AUTOFUSION_CODES");
    if ((env && !strcmp(env, "0")) || !af_graph_has_quant(g)) return AF_OK;
    af_status st = codes_graph(g, err);
    return st ? st : af_graph_infer_shapes(g, err); /* the shape functions agree with the new types */
}
