/* The layout pass: convolutions and what runs between them work channels-last (NHWC; NWC and
 * NDHWC for 1-D and 3-D convolutions), the layout in which the GEMM core reads a convolution's
 * input in place (a tap is a contiguous run of channels, see kernels/fast/gemm.h) and every
 * per-channel operand is a vector along the last dim. A region has one rank: its ops take
 * activations of the rank of the conv that started it.
 *
 * How: walking the nodes in order, a node that can run channels-last (a FusedConv always;
 * pooling, elementwise ops, Concat, constant Slices, a Gather of channels, GroupNorm, Resize,
 * Pad, SqueezeExcite and ConvPoolFc when one of their inputs is already channels-last) gets its
 * inputs in NHWC: the NHWC twin of a value when one exists, a Transpose to NHWC otherwise (one
 * per value, shared), constants permuted at compile time. Each of its outputs v of the region's
 * rank becomes a new NHWC value v', and v itself is then computed by a
 * Transpose(v') back to NCHW right after it, for whoever still reads NCHW (a graph output, a
 * Reshape...). Transposes that nobody reads are removed by the dead-code pass that follows, so
 * a chain of channels-last ops has reorders only at its edges, never between two of its ops.
 * The model's own Transposes between the two layouts are such reorders too (model_reorder):
 * ConvNeXt's blocks, which permute to NHWC around their LayerNorm and Linear layers and back,
 * then run channels-last from end to end.
 *
 * Each If/Loop/Scan body is a graph of its own with its own regions; a 4-D value a body reads
 * from an enclosing graph gets its Transpose inside the body.
 *
 * Invariant: every value keeps its meaning (name, NCHW type) for its readers; a converted node
 * computes the permutation of what it computed before. Nodes are only inserted right before
 * or after the node being converted, so the order stays topological.
 */
#include "fusion/rule.h"
#include "lower/lower.h"
#include "passes/rewrite.h"

#include <string.h>

/* NCHW -> NHWC and back, by rank (3 to 5): channels move last, and back to dim 1. */
static const int64_t to_nhwc[6][5] = {[3] = {0, 2, 1}, [4] = {0, 2, 3, 1}, [5] = {0, 2, 3, 4, 1}};
static const int64_t to_nchw[6][5] = {[3] = {0, 2, 1}, [4] = {0, 3, 1, 2}, [5] = {0, 4, 1, 2, 3}};

static bool spatial_rank(int rank) {
    return rank >= 3 && rank <= 5;
}

typedef struct layout {
    af_graph *g;
    af_value **twin;  /* by value id: its NHWC version, or NULL */
    int ntwin;
    int pos;          /* index in g->nodes of the node being converted */
} layout;

/* The NHWC twin of v, or NULL. Twins are indexed by value id, so only values of L->g have
 * them: a body's nodes may read values of enclosing graphs (captures), whose ids are another
 * graph's; those get a Transpose inside the body at each reader. */
static af_value *twin_of(const layout *L, const af_value *v) {
    return v->graph == L->g && v->id < L->ntwin ? L->twin[v->id] : NULL;
}

/* How a node's input slots relate to the layout. */
typedef enum slot_kind {
    S_KEEP,    /* not a layout-carrying tensor (weights, bias, shapes) */
    S_ACT,     /* a 4-D activation */
    S_OPERAND  /* a broadcast operand of an elementwise step: 4-D activation or constant */
} slot_kind;

/* Elementwise ops that compute the same in any layout (their row of the op table). */
static bool is_unary_elementwise(af_op op) {
    return af_ops[op].layout == AF_LAYOUT_UNARY;
}

static bool is_binary_elementwise(af_op op) {
    return af_ops[op].layout == AF_LAYOUT_BINARY;
}

static bool rank4_f32(const af_value *v) {
    return v && v->type.dtype == AF_DTYPE_FLOAT && v->type.rank == 4;
}

static bool spatial_f32(const af_value *v) {
    return v && v->type.dtype == AF_DTYPE_FLOAT && spatial_rank(v->type.rank);
}

/* The 2-D pooling windows the channels-last pooling kernels take. */
static bool pool_ok(const af_node *n) {
    const int64_t *v = NULL;
    int nk = af_attr_ints(n, "kernel_shape", &v);
    if (nk != 2 || n->nout != 1 || !rank4_f32(n->in[0])) return false;
    int nd = af_attr_ints(n, "dilations", &v);
    for (int i = 0; i < nd; i++)
        if (v[i] != 1) return false;
    return af_attr_int(n, "storage_order", 0) == 0;
}

/* A constant int64 vector of at most `max` values. */
static bool const_ints(const af_value *v, int max) {
    return v && af_value_is_const(v) && v->type.dtype == AF_DTYPE_INT64 && v->type.rank == 1 &&
           v->type.dims[0] >= 1 && v->type.dims[0] <= max;
}

/* A Slice whose starts, ends, axes and steps are constants (opset 10 on): its axes are then
 * remapped to the channels-last order. */
static bool slice_ok(const af_node *n) {
    if (af_graph_opset(n->graph) < 10 || n->nin < 4 || n->nout != 1 || !n->out[0]) return false;
    int r = n->in[0]->type.rank;
    for (int i = 1; i < n->nin; i++)
        if (n->in[i] && !const_ints(n->in[i], r)) return false;
    return n->in[1] && n->in[2] && n->in[3] && n->out[0]->type.rank == r;
}

/* A Gather of channels (axis 1) by a constant 1-D index (a channel shuffle, canonicalize.c). */
static bool gather_ok(const af_node *n) {
    int r = n->in[0]->type.rank;
    int64_t axis = af_attr_int(n, "axis", 0);
    return n->nin == 2 && n->nout == 1 && n->out[0] && (axis == 1 || axis == 1 - r) &&
           const_ints(n->in[1], 1 << 24) && n->out[0]->type.rank == r;
}

/* Resize (opset 11 on) of an NCHW (NCW, NCDHW) image whose roi, scales and sizes are
 * constants: run on the channels-last image with those vectors permuted, it computes the
 * permuted result (its sampling is per axis). Not with opset 18's axes, nor
 * keep_aspect_ratio_policy. */
static bool resize_ok(const af_node *n) {
    int r = n->out[0]->type.rank;
    if (af_graph_opset(n->graph) < 11 || n->nout != 1 || !spatial_rank(r) ||
        af_node_attr(n, "axes") || af_node_attr(n, "keep_aspect_ratio_policy"))
        return false;
    for (int i = 1; i < n->nin && i < 4; i++) {
        const af_value *v = n->in[i];
        if (!v) continue;
        int64_t numel = af_tensor_numel(&v->type);
        if (!af_value_is_const(v) || v->type.rank != 1 ||
            (numel != 0 && numel != (i == 1 ? 2 * r : r)))
            return false;
    }
    return n->nin <= 4;
}

/* Pad (opset 11 on) with constant pads and no axes input: on the channels-last image with the
 * pads permuted (begins, then ends), it pads the same elements. */
static bool pad_ok(const af_node *n) {
    int r = n->out[0]->type.rank;
    const af_value *p = n->nin > 1 ? n->in[1] : NULL;
    return af_graph_opset(n->graph) >= 11 && n->nout == 1 && spatial_rank(r) && n->nin <= 3 && p &&
           af_value_is_const(p) && p->type.rank == 1 && af_tensor_numel(&p->type) == 2 * r;
}

/* Slot kind of input i of n, for a node that can run channels-last. */
static slot_kind slot_of(const af_node *n, int i) {
    switch (n->op) {
    case AF_OP_FUSED_CONV: return i == 0 ? S_ACT : i >= 3 ? S_OPERAND : S_KEEP;
    case AF_OP_CONV_POOL_FC: return i == 0 ? S_ACT : i >= 5 ? S_OPERAND : S_KEEP;
    case AF_OP_SQUEEZE_EXCITE: return i == 0 ? S_ACT : S_KEEP;
    case AF_OP_FUSED_ELEMENTWISE: return i == 0 ? S_ACT : S_OPERAND;
    case AF_OP_CONCAT: return S_ACT;
    case AF_OP_SLICE: case AF_OP_GATHER: return i == 0 ? S_ACT : S_KEEP;
    case AF_OP_GROUP_NORM: return i == 0 ? S_ACT : i >= 3 ? S_OPERAND : S_KEEP;
    case AF_OP_RESIZE: return i == 0 ? S_ACT : S_KEEP; /* roi, scales, sizes: permute_vector */
    case AF_OP_PAD: return i == 0 ? S_ACT : S_KEEP;    /* pads: permute_vector */
    case AF_OP_MAX_POOL: case AF_OP_AVERAGE_POOL: case AF_OP_GLOBAL_AVERAGE_POOL:
    case AF_OP_GLOBAL_MAX_POOL:
        return i == 0 ? S_ACT : S_KEEP;
    default: return is_unary_elementwise(n->op) && i > 0 ? S_KEEP : S_OPERAND;
    }
}

/* Can n run channels-last at all (given its kinds of inputs)? */
static bool capable(const af_node *n) {
    if (n->nout < 1 || !n->out[0] || n->nin < 1 || n->out[0]->type.dtype != AF_DTYPE_FLOAT)
        return false;
    if (is_unary_elementwise(n->op) || is_binary_elementwise(n->op))
        return n->nout == 1 && spatial_rank(n->out[0]->type.rank);
    if (!spatial_f32(n->in[0])) return false;
    switch (n->op) {
    case AF_OP_FUSED_CONV:
    case AF_OP_CONV_POOL_FC:
        /* The int8 form (quant = 1) goes channels-last only where int8.c chose int8. */
        return n->nin >= 2 && af_value_is_const(n->in[1]) &&
               (!af_attr_int(n, "quant", 0) || !strcmp(af_attr_str(n, "precision", ""), "int8")) &&
               n->in[1]->type.rank == n->in[0]->type.rank && !af_attr_int(n, "channels_last", 0);
    case AF_OP_SQUEEZE_EXCITE:
    case AF_OP_GLOBAL_AVERAGE_POOL:
    case AF_OP_GLOBAL_MAX_POOL:
        return rank4_f32(n->in[0]) && n->nout == 1;
    case AF_OP_FUSED_ELEMENTWISE:
    case AF_OP_GROUP_NORM:
        return n->nout == 1;
    case AF_OP_MAX_POOL:
    case AF_OP_AVERAGE_POOL:
        return pool_ok(n);
    case AF_OP_CONCAT:
        return n->nout == 1 && spatial_rank(n->out[0]->type.rank);
    case AF_OP_SLICE:
        return slice_ok(n);
    case AF_OP_GATHER:
        return gather_ok(n);
    case AF_OP_RESIZE:
        return resize_ok(n);
    case AF_OP_PAD:
        return pad_ok(n);
    default:
        return false;
    }
}

/* The rank of the region n would join: its output's (a conv's input has the same). */
static int region_rank(const af_node *n) {
    return n->op == AF_OP_FUSED_CONV || n->op == AF_OP_CONV_POOL_FC ? n->in[0]->type.rank
                                                                    : n->out[0]->type.rank;
}

/* Is input v of slot kind k something the converted node, of region rank r, can take? */
static bool input_ok(const af_value *v, slot_kind k, int r) {
    if (!v || k == S_KEEP) return true;
    if (v->type.dtype != AF_DTYPE_FLOAT || v->type.rank < 0) return false;
    if (v->type.rank == r) return true; /* its twin, or a Transpose makes it NHWC */
    if (k == S_ACT || v->type.rank > r) return false;
    /* A lower-rank operand: constants are permuted; a runtime one only when it is a scalar. */
    if (af_value_is_const(v)) return true;
    for (int d = 0; d < v->type.rank; d++)
        if (v->type.dims[d] != 1) return false;
    return true;
}

/* Worth converting: a FusedConv always; others when an activation input is already NHWC. */
static bool wanted(const layout *L, const af_node *n) {
    if (!capable(n)) return false;
    bool any = n->op == AF_OP_FUSED_CONV || n->op == AF_OP_CONV_POOL_FC;
    int r = region_rank(n);
    for (int i = 0; i < n->nin; i++) {
        slot_kind k = slot_of(n, i);
        const af_value *v = n->in[i];
        if (!input_ok(v, k, r)) return false;
        if (v && k != S_KEEP && twin_of(L, v)) any = true;
    }
    return any;
}

/* Move the node just appended to position `at`, keeping L->pos on the node being converted. */
static void place_at(layout *L, int at) {
    af_node_move_last_to(L->g, at);
    if (at <= L->pos) L->pos++;
}

/* Does perm only move dims of size 1 past the others (the dims of other sizes keep their
 * order)? Then the bytes are the same before and after: one channel, or no spatial extent. */
static bool moves_only_ones(const af_tensor *x, const int64_t *perm) {
    int64_t last = -1;
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[perm[i]] == 1) continue;
        if (perm[i] < last) return false;
        last = perm[i];
    }
    return true;
}

/* A node of ours producing y from x that reorders NCHW <-> NHWC (to_last) or back: a Transpose,
 * or a Reshape when the bytes are the same either way. Appended last, output y set. */
static af_node *reorder_node(af_graph *g, af_value *x, af_value *y, bool to_last,
                             const char *name) {
    int r = x->type.rank;
    const int64_t *perm = to_last ? to_nhwc[r] : to_nchw[r];
    bool trivial = moves_only_ones(&x->type, perm);
    af_node *t;
    af_value *shape = trivial ? af_value_new_reshape_shape(g, &x->type, &y->type) : NULL;
    if (shape) {
        t = af_node_new(g, AF_OP_RESHAPE, name, 2, 1);
        if (t) af_node_set_input(t, 1, shape);
    } else {
        t = af_node_new(g, AF_OP_TRANSPOSE, name, 1, 1);
        af_attr *a = t ? af_node_add_attr(t, "perm", AF_ATTR_INTS) : NULL;
        if (!a) return NULL;
        a->ints = (int64_t *)perm;
        a->n = r;
    }
    if (!t) return NULL;
    af_node_set_input(t, 0, x);
    af_node_set_output(t, 0, y);
    return t;
}

static af_value *new_nhwc_value(af_graph *g, const af_value *v, const char *suffix) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s", v->name ? v->name : "v", suffix);
    af_value *t = af_value_new(g, af_graph_unique_name(g, buf));
    if (!t) return NULL;
    t->type = v->type;
    t->type.data = NULL;
    t->type.nbytes = 0;
    t->type.owns_data = 0;
    for (int d = 0; d < v->type.rank; d++) t->type.dims[d] = v->type.dims[to_nhwc[v->type.rank][d]];
    return t;
}

static bool grow_twins(layout *L) {
    if (L->g->nvalues <= L->ntwin) return true;
    int n = L->g->nvalues + 64;
    af_value **t = af_arena_calloc(L->g->arena, (size_t)n, sizeof *t);
    if (!t) return false;
    if (L->ntwin) memcpy(t, L->twin, sizeof *t * (size_t)L->ntwin);
    L->twin = t;
    L->ntwin = n;
    return true;
}

/* The NHWC version of a 4-D non-constant value: its twin, or a new Transpose before node pos. */
static af_value *nhwc_of(layout *L, af_value *v, af_error *err) {
    if (twin_of(L, v)) return twin_of(L, v);
    af_value *t = new_nhwc_value(L->g, v, "_nhwc");
    af_node *tr = t ? reorder_node(L->g, v, t, true, af_graph_unique_name(L->g, "to_nhwc")) : NULL;
    if (!tr || !grow_twins(L)) {
        af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
        return NULL;
    }
    place_at(L, L->pos);
    if (v->graph == L->g) L->twin[v->id] = t;
    return t;
}

/* A constant operand of rank <= r, as it broadcasts against a channels-last output of rank r:
 * expanded to rank r (numpy aligns it from the right against N, C, spatial dims), then permuted
 * (channels last). Scalars stay. */
static af_value *permute_const(layout *L, af_value *c, int r, af_error *err) {
    const af_tensor *t = &c->type;
    int64_t numel = af_tensor_numel(t);
    if (numel <= 1 || t->rank == 0) return c;
    int64_t dr[5] = {1, 1, 1, 1, 1}, nd[5];
    for (int i = 0; i < t->rank; i++) dr[r - t->rank + i] = t->dims[i];
    for (int i = 0; i < r; i++) nd[i] = dr[to_nhwc[r][i]];
    af_value *p = af_value_new_f32(L->g, "nhwc_const", r, nd);
    if (!p) {
        af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
        return NULL;
    }
    /* Element (n, positions..., ch) of the result reads (n, ch, positions...) of the source. */
    const float *s = t->data;
    float *d = p->type.data;
    int64_t ch = dr[1], pos = numel / (dr[0] * ch);
    for (int64_t n = 0; n < dr[0]; n++)
        for (int64_t q = 0; q < pos; q++)
            for (int64_t k = 0; k < ch; k++) *d++ = s[(n * ch + k) * pos + q];
    return p;
}

/* A constant vector of per-axis values of a rank-r tensor (Resize's scales and sizes: r; its
 * roi and Pad's pads: starts then ends, 2r) in channels-last axis order. */
static af_value *permute_vector(layout *L, af_value *c, int r, af_error *err) {
    const af_tensor *t = &c->type;
    int64_t numel = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype);
    if (numel == 0) return c;
    af_value *p = af_value_new_const(L->g, af_graph_unique_name(L->g, "nhwc_vector"), t->dtype,
                                     1, t->dims);
    if (!p) {
        af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
        return NULL;
    }
    for (int64_t g = 0; g < numel / r; g++)
        for (int i = 0; i < r; i++)
            memcpy((char *)p->type.data + (size_t)(r * g + i) * es,
                   (const char *)t->data + (size_t)(r * g + to_nhwc[r][i]) * es, es);
    return p;
}

static bool set_channels_last(af_node *n) {
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, "channels_last")) {
            n->attrs[a].i = 1;
            return true;
        }
    return af_node_set_int(n, "channels_last", 1);
}

/* An axis in channels-last order (rank r): N stays, C moves last, the spatial dims move up
 * one. */
static int64_t remap_axis(int64_t ax, int r) {
    if (ax < 0) ax += r;
    return ax >= 0 && ax < r ? to_nchw[r][ax] : ax;
}

/* Concat's and Gather's axis attribute. */
static void remap_axis_attr(af_node *n, int r) {
    for (int a = 0; a < n->nattrs; a++)
        if (!strcmp(n->attrs[a].name, "axis")) n->attrs[a].i = remap_axis(n->attrs[a].i, r);
}

/* A Slice's axes: a new constant (the old one may be shared). */
static bool remap_slice_axes(layout *L, af_node *n, int r) {
    const af_value *old = n->in[3];
    int64_t k = old->type.dims[0];
    af_value *ax = af_value_new_const(L->g, af_graph_unique_name(L->g, "nhwc_axes"), AF_DTYPE_INT64, 1, &k);
    if (!ax) return false;
    for (int64_t i = 0; i < k; i++)
        ((int64_t *)ax->type.data)[i] = remap_axis(((const int64_t *)old->type.data)[i], r);
    af_node_set_input(n, 3, ax);
    return true;
}

static af_status convert(layout *L, af_node *n, af_error *err) {
    int rank = region_rank(n);
    for (int i = 0; i < n->nin; i++) {
        af_value *v = n->in[i];
        slot_kind k = slot_of(n, i);
        if (!v || k == S_KEEP) continue;
        af_value *r = v->type.rank == rank && !af_value_is_const(v) ? nhwc_of(L, v, err)
                      : af_value_is_const(v) ? permute_const(L, v, rank, err) : v;
        if (!r) return err ? err->code : AF_ERR_NOMEM;
        if (r != v) af_node_set_input(n, i, r);
    }
    for (int i = 1; (n->op == AF_OP_RESIZE || (n->op == AF_OP_PAD && i == 1)) && i < n->nin; i++) {
        af_value *v = n->in[i];
        af_value *pv = v ? permute_vector(L, v, rank, err) : NULL;
        if (v && !pv) return err ? err->code : AF_ERR_NOMEM;
        if (pv != v) af_node_set_input(n, i, pv);
    }
    bool ok = true;
    if (n->op == AF_OP_FUSED_CONV || n->op == AF_OP_CONV_POOL_FC || n->op == AF_OP_SQUEEZE_EXCITE ||
        n->op == AF_OP_MAX_POOL || n->op == AF_OP_AVERAGE_POOL ||
        n->op == AF_OP_GLOBAL_AVERAGE_POOL || n->op == AF_OP_GLOBAL_MAX_POOL ||
        n->op == AF_OP_GROUP_NORM)
        ok = set_channels_last(n);
    if (n->op == AF_OP_CONCAT || n->op == AF_OP_GATHER) remap_axis_attr(n, rank);
    if (n->op == AF_OP_SLICE) ok = ok && remap_slice_axes(L, n, rank);
    if (!ok) return af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
    /* Outputs of the region's rank get an NHWC twin, and the NCHW value a Transpose from it. */
    for (int o = 0; o < n->nout; o++) {
        af_value *v = n->out[o];
        if (!v || v->type.rank != rank) continue;
        af_value *t = new_nhwc_value(L->g, v, "_nhwc");
        if (!t || !grow_twins(L)) return af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
        af_node_set_output(n, o, t);
        if (!reorder_node(L->g, t, v, false, af_graph_unique_name(L->g, "to_nchw")))
            return af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
        place_at(L, L->pos + 1);
        L->twin[v->id] = t;
    }
    return AF_OK;
}

/* Would reader n of y (once y has a twin) run channels-last without a new reorder for its other
 * inputs? A conv always (its region starts there anyway); another op when each of its other
 * activation inputs is a constant or has a twin already. ConvNeXt's layer scale and residual
 * (the residual is the block's input, channels-last) qualify; ViT's Concat of the class token
 * with the permuted patches does not (it would need the token reordered, and a reorder back
 * for the LayerNorm after it). */
static bool joins_region(const layout *L, const af_node *n, const af_value *y) {
    if (n->graph != L->g || !capable(n)) return false;
    if (n->op == AF_OP_FUSED_CONV || n->op == AF_OP_CONV_POOL_FC) return n->in[0] == y;
    int r = region_rank(n);
    for (int i = 0; i < n->nin; i++) {
        const af_value *v = n->in[i];
        slot_kind k = slot_of(n, i);
        if (!v || v == y || k == S_KEEP) continue;
        if (!input_ok(v, k, r)) return false;
        if (v->type.rank == r && !af_value_is_const(v) && !twin_of(L, v)) return false;
    }
    return true;
}

static bool read_into_region(const layout *L, const af_value *y) {
    for (int u = 0; u < y->nuses; u++)
        if (joins_region(L, y->uses[u].node, y)) return true;
    return false;
}

/* A model's own Transpose between NCHW and NHWC (ConvNeXt's permutes around its LayerNorms and
 * Linear layers, the [N, C, T] -> [N, T, C] after Whisper's and wav2vec2's convolutions) is a
 * reorder like the pass's own, so a region goes through it instead of paying for it:
 *  - to NHWC, of a value x that has a twin: its output y is that twin, element for element (the
 *    same dims, the same bytes), so y's readers read the twin and the Transpose dies;
 *  - to NCHW, of any value z: z is the NHWC twin of its output, so channels-last readers of the
 *    output read z (and the Transpose dies when nobody else reads the NCHW value); only when
 *    one of those readers joins a region at no cost (joins_region), else the twin would
 *    start a region of elementwise ops with reorders around it.
 * Not when y is a graph output or read inside a body (those keep the Transpose). */
static void model_reorder(layout *L, af_node *n) {
    af_value *x = n->nin == 1 ? n->in[0] : NULL, *y = n->nout == 1 ? n->out[0] : NULL;
    if (n->op != AF_OP_TRANSPOSE || !spatial_f32(x) || !y || y->type.dtype != AF_DTYPE_FLOAT ||
        y->graph != L->g || y->is_output)
        return;
    int r = x->type.rank;
    const int64_t *perm;
    if (y->type.rank != r || af_attr_ints(n, "perm", &perm) != r) return;
    for (int u = 0; u < y->nuses; u++)
        if (y->uses[u].node->graph != L->g) return;
    size_t bytes = sizeof(int64_t) * (size_t)r;
    af_value *t = twin_of(L, x);
    if (!memcmp(perm, to_nhwc[r], bytes) && t && af_same_shape(&t->type, &y->type)) {
        af_value_replace_uses(y, t);
    } else if (!memcmp(perm, to_nchw[r], bytes) && x->graph == L->g && !af_value_is_const(x) &&
               y->id < L->ntwin && !L->twin[y->id] && read_into_region(L, y)) {
        L->twin[y->id] = x;
    }
}

/* One graph; its bodies are graphs of their own, each with its regions. */
static af_status layout_graph(af_graph *g, af_error *err) {
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        af_graph *sub;
        for (int k = 0; !st && (sub = pass_subgraph(g->nodes[i], k)); k++) st = layout_graph(sub, err);
    }
    layout L = {g, NULL, 0, 0};
    if (!st && !grow_twins(&L)) return af_fail(err, AF_ERR_NOMEM, "out of memory in the layout pass");
    for (L.pos = 0; L.pos < g->nnodes && !st; L.pos++) {
        af_node *n = g->nodes[L.pos];
        if (wanted(&L, n)) st = convert(&L, n, err);
        else model_reorder(&L, n);
    }
    return st;
}

af_status af_pass_layout(af_graph *g, af_error *err) {
    af_status st = layout_graph(g, err);
    if (!st) st = pass_fix_captures(g, err);
    return st ? st : af_graph_infer_shapes(g, err);
}
