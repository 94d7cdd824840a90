/* Reference kernels for layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
 * Split, Slice, Gather, Expand, Tile, Pad, DepthToSpace, SpaceToDepth, ReverseSequence, Shape,
 * Size, ConstantOfShape, Range, EyeLike and Trilu (ONNX semantics, opsets 7..17).
 *
 * Invariant: these ops move elements without looking at them, so they copy by element size and
 * work for every fixed-size dtype (float16, bool, complex included). Each op has one parameter
 * function shared by its shape function and its kernel, so both always agree on the output
 * shape; every offset a kernel computes is derived from checked parameters and stays in bounds. */
#include "kernels/ref/tensor_util.h"

#include <stdlib.h>

static void unknown_dims(af_tensor *out, af_dtype dt, int rank) {
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < rank; i++)
        dims[i] = -1;
    af_tensor_set_type(out, dt, rank, dims);
}

static void copy_bytes(void *dst, const void *src, size_t len) {
    if (len)
        memcpy(dst, src, len);
}

/* Plain element-preserving copy for ops whose output is the input with another shape. */
static af_status copy_all(const af_node *n, const af_tensor *x, af_tensor *out, af_error *err) {
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t cnt = af_tensor_numel(x);
    if (cnt != af_tensor_numel(out))
        return af_node_fail(err, n, AF_ERR_RUNTIME, "element count changes from %lld to %lld",
                            (long long)cnt, (long long)af_tensor_numel(out));
    copy_bytes(out->data, x->data, (size_t)cnt * es);
    return AF_OK;
}

af_status ref_copy(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)x;
    if (!tn_in(n, in, 0))
        return tn_missing(n, "data", err);
    return copy_all(n, in[0], out, err);
}

/* ---- Reshape ----------------------------------------------------------------------------- */

af_status shape_reshape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *s = tn_in(n, in, 1);
    int64_t shp[AF_MAX_RANK];
    int cnt = 0;
    if (!x)
        return tn_missing(n, "data", err);
    if (!s) {
        /* Reshape-1 kept the shape in an attribute. */
        const int64_t *a = NULL;
        cnt = af_attr_ints(n, "shape", &a);
        if (cnt < 0)
            return tn_missing(n, "shape", err);
        if (cnt > AF_MAX_RANK)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "rank %d above %d", cnt, AF_MAX_RANK);
        for (int i = 0; i < cnt; i++)
            shp[i] = a[i];
    } else if (!s->data) {
        if (s->rank == 1 && s->dims[0] >= 0 && s->dims[0] <= AF_MAX_RANK)
            unknown_dims(out, x->dtype, (int)s->dims[0]);
        else
            tn_unknown_rank(out, x->dtype);
        return AF_OK;
    } else if (!tn_ints(s, shp, AF_MAX_RANK, &cnt)) {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "shape must be a 1-D int64 tensor of at most %d values", AF_MAX_RANK);
    }
    bool allowzero = af_attr_int(n, "allowzero", 0) != 0;
    int64_t dims[AF_MAX_RANK], known = 1;
    int infer = -1;
    bool unknown = false, has_zero = false;
    for (int i = 0; i < cnt; i++) {
        int64_t v = shp[i], d;
        if (v == -1) {
            if (infer >= 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "shape has more than one -1");
            infer = i;
            dims[i] = -1;
            continue;
        }
        if (v < -1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "negative dim %lld in shape",
                                (long long)v);
        if (v == 0 && !allowzero) {
            if (x->rank >= 0 && i >= x->rank)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "shape[%d] = 0 copies a dim the rank-%d input lacks", i,
                                    x->rank);
            d = x->rank < 0 ? -1 : x->dims[i];
        } else {
            d = v;
        }
        has_zero |= v == 0;
        dims[i] = d;
        if (d < 0)
            unknown = true;
        else if (!af_mul_i64(known, d, &known))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "shape overflows");
    }
    if (allowzero && has_zero && infer >= 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "allowzero shape with both 0 and -1");
    int64_t total = af_tensor_known(x) ? af_tensor_numel(x) : -1;
    if (infer >= 0 && total >= 0 && !unknown) {
        if (known == 0) {
            if (total != 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "cannot infer -1 next to 0");
            dims[infer] = 0;
        } else if (total % known != 0) {
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "cannot reshape %lld elements with -1 and %lld others",
                                (long long)total, (long long)known);
        } else {
            dims[infer] = total / known;
        }
    } else if (infer < 0 && total >= 0 && !unknown && total != known) {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "cannot reshape %lld elements into %lld", (long long)total,
                            (long long)known);
    }
    if (infer >= 0 && dims[infer] == AF_DIM_UNKNOWN && x->rank >= 0) {
        /* Symbolic dims: the -1 is the total over the others, when that divides exactly. */
        dims[infer] = 1;
        dims[infer] = af_dim_div(n->graph, af_dims_product(n->graph, x->dims, x->rank),
                                 af_dims_product(n->graph, dims, cnt));
    }
    af_tensor_set_type(out, x->dtype, cnt, dims);
    return AF_OK;
}

/* ---- Flatten ----------------------------------------------------------------------------- */

af_status shape_flatten(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "input", err);
    if (x->rank < 0) {
        unknown_dims(out, x->dtype, 2);
        return AF_OK;
    }
    int64_t axis = af_attr_int(n, "axis", 1);
    if (axis < 0)
        axis += x->rank;
    if (axis < 0 || axis > x->rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    int64_t dims[2] = {af_dims_product(n->graph, x->dims, (int)axis),
                       af_dims_product(n->graph, x->dims + axis, x->rank - (int)axis)};
    af_tensor_set_type(out, x->dtype, 2, dims);
    return AF_OK;
}

/* ---- Squeeze / Unsqueeze ------------------------------------------------------------------ */

/* Squeeze/Unsqueeze took axes as an attribute before opset 13 and as input 1 since. */
static bool axes_from_input(const af_node *n, int since) {
    return af_graph_opset(n->graph) >= since;
}

af_status shape_squeeze(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *a = tn_in(n, in, 1);
    if (!x)
        return tn_missing(n, "data", err);
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int axes[AF_MAX_RANK], naxes;
    bool given, known;
    af_status st = tn_axes(n, a, axes_from_input(n, 13), "axes", x->rank, axes, &naxes, &given,
                           &known, err);
    if (st)
        return st;
    if (!known) {
        if (a && a->rank == 1 && a->dims[0] >= 0 && a->dims[0] <= x->rank)
            unknown_dims(out, x->dtype, x->rank - (int)a->dims[0]);
        else
            tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    bool drop[AF_MAX_RANK] = {false};
    if (given) {
        for (int i = 0; i < naxes; i++) {
            if (x->dims[axes[i]] > 1 || x->dims[axes[i]] == 0)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "cannot squeeze axis %d of size %lld", axes[i],
                                    (long long)x->dims[axes[i]]);
            drop[axes[i]] = true;
        }
    } else {
        for (int i = 0; i < x->rank; i++) {
            if (x->dims[i] < 0) {
                tn_unknown_rank(out, x->dtype);
                return AF_OK;
            }
            drop[i] = x->dims[i] == 1;
        }
    }
    int64_t dims[AF_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i])
            dims[r++] = x->dims[i];
    af_tensor_set_type(out, x->dtype, r, dims);
    return AF_OK;
}

af_status shape_unsqueeze(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *a = tn_in(n, in, 1);
    if (!x)
        return tn_missing(n, "data", err);
    bool from_input = axes_from_input(n, 13);
    int64_t cnt;
    if (from_input) {
        if (!a)
            return tn_missing(n, "axes", err);
        if (a->rank > 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axes must be 1-D");
        cnt = a->rank == 1 ? a->dims[0] : a->rank == 0 ? 1 : -1;
    } else {
        const int64_t *v;
        cnt = af_attr_ints(n, "axes", &v);
        if (cnt < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing attribute 'axes'");
    }
    if (x->rank < 0 || cnt < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    if (x->rank + cnt > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "rank %lld above %d",
                            (long long)(x->rank + cnt), AF_MAX_RANK);
    int r = x->rank + (int)cnt;
    int axes[AF_MAX_RANK], naxes;
    bool given, known;
    af_status st = tn_axes(n, a, from_input, "axes", r, axes, &naxes, &given, &known, err);
    if (st)
        return st;
    if (!known) {
        unknown_dims(out, x->dtype, r);
        return AF_OK;
    }
    if (!given || naxes != cnt)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad axes");
    bool ins[AF_MAX_RANK] = {false};
    for (int i = 0; i < naxes; i++)
        ins[axes[i]] = true;
    int64_t dims[AF_MAX_RANK];
    for (int i = 0, j = 0; i < r; i++)
        dims[i] = ins[i] ? 1 : x->dims[j++];
    af_tensor_set_type(out, x->dtype, r, dims);
    return AF_OK;
}

/* ---- Transpose --------------------------------------------------------------------------- */

af_status tn_transpose_perm(const af_node *n, int rank, int *perm, af_error *err) {
    const int64_t *p = NULL;
    int cnt = af_attr_ints(n, "perm", &p);
    if (cnt < 0) {
        for (int i = 0; i < rank; i++)
            perm[i] = rank - 1 - i;
        return AF_OK;
    }
    if (cnt != rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "perm has %d values for rank %d", cnt,
                            rank);
    bool seen[AF_MAX_RANK] = {false};
    for (int i = 0; i < rank; i++) {
        if (p[i] < 0 || p[i] >= rank || seen[p[i]])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "perm is not a permutation");
        seen[p[i]] = true;
        perm[i] = (int)p[i];
    }
    return AF_OK;
}

af_status shape_transpose(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int perm[AF_MAX_RANK];
    af_status st = tn_transpose_perm(n, x->rank, perm, err);
    if (st)
        return st;
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        dims[i] = x->dims[perm[i]];
    af_tensor_set_type(out, x->dtype, x->rank, dims);
    return AF_OK;
}

af_status ref_transpose(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    (void)ex;
    TN_READY(n, out, 1, err);
    const af_tensor *x = in[0];
    int perm[AF_MAX_RANK];
    size_t es;
    af_status st = tn_transpose_perm(n, x->rank, perm, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t xs[AF_MAX_RANK], vs[AF_MAX_RANK];
    af_strides(x, xs);
    for (int i = 0; i < x->rank; i++)
        vs[i] = xs[perm[i]];
    tn_copy_strided(out->data, x->data, 0, out->rank, out->dims, vs, es);
    return AF_OK;
}

/* ---- Concat ------------------------------------------------------------------------------ */

af_status shape_concat(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_attr *aa = af_node_attr(n, "axis");
    if (!aa)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing attribute 'axis'");
    if (n->nin < 1)
        return tn_missing(n, "inputs", err);
    int rank = -1;
    af_dtype dt = AF_DTYPE_UNDEFINED;
    for (int i = 0; i < n->nin; i++) {
        const af_tensor *t = tn_in(n, in, i);
        if (!t)
            return tn_missing(n, "inputs", err);
        if (dt == AF_DTYPE_UNDEFINED)
            dt = t->dtype;
        else if (t->dtype != dt && t->dtype != AF_DTYPE_UNDEFINED)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "inputs differ in type");
        if (t->rank >= 0) {
            if (rank >= 0 && t->rank != rank)
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "inputs differ in rank");
            rank = t->rank;
        }
    }
    if (rank < 0) {
        tn_unknown_rank(out, dt);
        return AF_OK;
    }
    int axis;
    if (!af_axis(aa->i, rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis %lld out of range for rank %d",
                            (long long)aa->i, rank);
    int64_t dims[AF_MAX_RANK];
    for (int d = 0; d < rank; d++)
        dims[d] = d == axis ? 0 : -1;
    for (int i = 0; i < n->nin; i++) {
        const af_tensor *t = in[i];
        for (int d = 0; d < rank; d++) {
            int64_t v = t->rank < 0 ? -1 : t->dims[d];
            if (d == axis) {
                /* A symbolic sum (past + new keys) when the graph is there to name it. */
                if (n->graph && dims[d] != AF_DIM_UNKNOWN)
                    dims[d] = af_dim_add(n->graph, dims[d], v);
                else if (dims[d] >= 0 && (v < 0 || !af_add_i64(dims[d], v, &dims[d])))
                    dims[d] = -1;
            } else if (v >= 0) {
                if (dims[d] >= 0 && dims[d] != v)
                    return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                        "inputs differ in dim %d (%lld vs %lld)", d,
                                        (long long)dims[d], (long long)v);
                dims[d] = v;
            } else if (af_dim_is_sym(v) && dims[d] == AF_DIM_UNKNOWN) {
                dims[d] = v; /* the inputs must agree there: a number, if one has it, wins */
            }
        }
    }
    af_tensor_set_type(out, dt, rank, dims);
    return AF_OK;
}

af_status ref_concat(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    int axis;
    size_t es;
    af_status st = tn_esize(n, out, &es, err);
    if (st)
        return st;
    if (!af_axis(af_attr_int(n, "axis", 0), out->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    int64_t outer = tn_prod(out->dims, 0, axis);
    char *dst = out->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int i = 0; i < n->nin; i++) {
            const af_tensor *t = in[i];
            size_t chunk = (size_t)tn_prod(t->dims, axis, t->rank) * es;
            copy_bytes(dst, (const char *)t->data + (size_t)o * chunk, chunk);
            dst += chunk;
        }
    }
    return AF_OK;
}

/* ---- Split ------------------------------------------------------------------------------- */

/* Sizes of the outputs along the axis; sizes[i] = -1 when unknown. */
static af_status split_sizes(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                             int *axis, int64_t *sizes, af_error *err) {
    int64_t a = af_attr_int(n, "axis", 0);
    if (!af_axis(a, x->rank, axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis %lld out of range for rank %d",
                            (long long)a, x->rank);
    int64_t dim = x->dims[*axis];
    int nout = n->nout;
    const af_tensor *s = af_graph_opset(n->graph) >= 13 ? tn_in(n, in, 1) : NULL;
    const int64_t *sv = NULL;
    int64_t *buf = NULL;
    int cnt = -1;
    if (s) {
        if (!s->data) {
            for (int i = 0; i < nout; i++)
                sizes[i] = -1;
            return AF_OK;
        }
        if (s->rank != 1 || s->dims[0] != nout ||
            (s->dtype != AF_DTYPE_INT64 && s->dtype != AF_DTYPE_INT32))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "split must hold %d int64 values",
                                nout);
        buf = sizes;
        for (int i = 0; i < nout; i++)
            buf[i] = tn_geti(s, i);
        sv = buf;
        cnt = nout;
    } else {
        cnt = af_attr_ints(n, "split", &sv);
    }
    if (cnt >= 0) {
        if (cnt != nout)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "split has %d values for %d outputs",
                                cnt, nout);
        int64_t sum = 0;
        for (int i = 0; i < nout; i++) {
            if (sv[i] < 0 || !af_add_i64(sum, sv[i], &sum))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad split value");
            sizes[i] = sv[i];
        }
        if (dim >= 0 && sum != dim)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "split sums to %lld, axis has %lld", (long long)sum,
                                (long long)dim);
        return AF_OK;
    }
    /* Opset 18's num_outputs: parts of ceil(dim / num_outputs), the last one what is left
     * (possibly empty, as in ONNX's reference). */
    const af_attr *no = af_graph_opset(n->graph) >= 18 ? af_node_attr(n, "num_outputs") : NULL;
    if (no) {
        if (no->type != AF_ATTR_INT || no->i != nout)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "num_outputs is not the %d outputs",
                                nout);
        int64_t part = dim < 0 ? -1 : (dim + nout - 1) / nout;
        if (dim >= 0 && part * (nout - 1) > dim)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "an axis of %lld cannot give %d parts of %lld",
                                (long long)dim, nout, (long long)part);
        for (int i = 0; i < nout; i++)
            sizes[i] = dim < 0 ? -1 : i < nout - 1 ? part : dim - part * (nout - 1);
        return AF_OK;
    }
    if (dim >= 0 && dim % nout != 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis of %lld not divisible into %d",
                            (long long)dim, nout);
    for (int i = 0; i < nout; i++)
        sizes[i] = dim < 0 ? -1 : dim / nout;
    return AF_OK;
}

af_status shape_split(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "input", err);
    if (n->nout < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "no outputs");
    if (x->rank < 0) {
        for (int i = 0; i < n->nout; i++)
            tn_unknown_rank(&out[i], x->dtype);
        return AF_OK;
    }
    int axis;
    int64_t *sizes = af_calloc((size_t)n->nout, sizeof *sizes);
    if (!sizes)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    af_status st = split_sizes(n, in, x, &axis, sizes, err);
    for (int i = 0; !st && i < n->nout; i++) {
        int64_t dims[AF_MAX_RANK];
        memcpy(dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
        dims[axis] = sizes[i];
        af_tensor_set_type(&out[i], x->dtype, x->rank, dims);
    }
    af_free(sizes);
    return st;
}

af_status tn_split_sizes(const af_node *n, const af_tensor *const *in, int *axis,
                         int64_t *sizes, af_error *err) {
    return split_sizes(n, in, in[0], axis, sizes, err);
}

af_status ref_split(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    TN_READY(n, out, n->nout, err);
    (void)ex;
    const af_tensor *x = in[0];
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int axis;
    int64_t *sizes = af_calloc((size_t)n->nout, sizeof *sizes);
    if (!sizes)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    st = split_sizes(n, in, x, &axis, sizes, err);
    if (!st) {
        int64_t outer = tn_prod(x->dims, 0, axis);
        size_t inner = (size_t)tn_prod(x->dims, axis + 1, x->rank) * es;
        size_t row = (size_t)x->dims[axis] * inner;
        size_t at = 0;
        for (int i = 0; i < n->nout; i++) {
            size_t chunk = (size_t)sizes[i] * inner;
            if (out[i].data)
                for (int64_t o = 0; o < outer; o++)
                    copy_bytes((char *)out[i].data + (size_t)o * chunk,
                               (const char *)x->data + (size_t)o * row + at, chunk);
            at += chunk;
        }
    }
    af_free(sizes);
    return st;
}

/* ---- Slice ------------------------------------------------------------------------------- */

typedef struct slice_plan {
    int64_t start[AF_MAX_RANK], step[AF_MAX_RANK], count[AF_MAX_RANK];
    bool known[AF_MAX_RANK];
} slice_plan;

/* Values of a starts/ends/axes/steps list: attribute before opset 10, input since. */
static af_status slice_list(const af_node *n, const af_tensor *const *in, int slot,
                            const char *name, int64_t *v, int *cnt, bool *have, bool *known,
                            af_error *err) {
    *have = false;
    *known = true;
    if (af_graph_opset(n->graph) < 10) {
        const int64_t *a = NULL;
        int c = af_attr_ints(n, name, &a);
        if (c < 0)
            return AF_OK;
        if (c > AF_MAX_RANK)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "too many %s", name);
        memcpy(v, a, sizeof(int64_t) * (size_t)c);
        *cnt = c;
        *have = true;
        return AF_OK;
    }
    const af_tensor *t = tn_in(n, in, slot);
    if (!t)
        return AF_OK;
    *have = true;
    if (!t->data) {
        *known = false;
        return AF_OK;
    }
    if (!tn_ints(t, v, AF_MAX_RANK, cnt))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "%s must be a 1-D int64 tensor of at most %d values", name,
                            AF_MAX_RANK);
    return AF_OK;
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Resolve one axis: ONNX's clamping rules, then the element count. */
static void slice_axis(int64_t dim, int64_t s, int64_t e, int64_t step, int64_t *start,
                       int64_t *count) {
    if (dim == 0) { /* the clamping ranges below would be empty */
        *start = 0;
        *count = 0;
        return;
    }
    if (s < 0)
        s += dim;
    if (e < 0)
        e += dim;
    if (step > 0) {
        s = clamp64(s, 0, dim);
        e = clamp64(e, 0, dim);
        *count = e > s ? (int64_t)((uint64_t)(e - s - 1) / (uint64_t)step) + 1 : 0;
    } else {
        s = clamp64(s, 0, dim - 1);
        e = clamp64(e, -1, dim - 1);
        uint64_t mag = (uint64_t)0 - (uint64_t)step;
        *count = s > e ? (int64_t)((uint64_t)(s - e - 1) / mag) + 1 : 0;
    }
    *start = s;
}

static af_status slice_plan_make(const af_node *n, const af_tensor *const *in,
                                 const af_tensor *x, slice_plan *p, af_error *err) {
    int64_t st[AF_MAX_RANK], en[AF_MAX_RANK], ax[AF_MAX_RANK], sp[AF_MAX_RANK];
    int ns = 0, ne = 0, na = 0, nsp = 0;
    bool hs, he, ha, hsp, ks, ke, ka, ksp;
    af_status r;
    if ((r = slice_list(n, in, 1, "starts", st, &ns, &hs, &ks, err)) ||
        (r = slice_list(n, in, 2, "ends", en, &ne, &he, &ke, err)) ||
        (r = slice_list(n, in, 3, "axes", ax, &na, &ha, &ka, err)) ||
        (r = slice_list(n, in, 4, "steps", sp, &nsp, &hsp, &ksp, err)))
        return r;
    if (!hs || !he)
        return tn_missing(n, "starts/ends", err);
    for (int i = 0; i < x->rank; i++) {
        p->start[i] = 0;
        p->step[i] = 1;
        p->count[i] = x->dims[i];
        p->known[i] = x->dims[i] != AF_DIM_UNKNOWN; /* a symbol stays where nothing is sliced */
    }
    if (!ks || !ke || !ka || !ksp) {
        /* Values not known yet: only the axes that a known axes list leaves alone keep their
         * dims (without a list, every axis may be sliced). */
        bool listed = ha && ka;
        for (int i = 0; i < x->rank; i++)
            p->known[i] = listed && x->dims[i] != AF_DIM_UNKNOWN;
        for (int i = 0; listed && i < na; i++) {
            int a;
            if (af_axis(ax[i], x->rank, &a))
                p->known[a] = false;
        }
        return AF_OK;
    }
    if (ne != ns || (ha && na != ns) || (hsp && nsp != ns))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "starts, ends, axes and steps differ in length");
    bool seen[AF_MAX_RANK] = {false};
    for (int i = 0; i < ns; i++) {
        int a;
        int64_t av = ha ? ax[i] : i;
        if (!af_axis(av, x->rank, &a) || seen[a])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad or repeated axis %lld",
                                (long long)av);
        seen[a] = true;
        int64_t step = hsp ? sp[i] : 1;
        if (step == 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "step is 0");
        p->step[a] = step;
        if (x->dims[a] < 0) {
            p->known[a] = false;
            continue;
        }
        slice_axis(x->dims[a], st[i], en[i], step, &p->start[a], &p->count[a]);
    }
    return AF_OK;
}

af_status shape_slice(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    slice_plan p;
    af_status st = slice_plan_make(n, in, x, &p, err);
    if (st)
        return st;
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        dims[i] = p.known[i] ? p.count[i] : -1;
    af_tensor_set_type(out, x->dtype, x->rank, dims);
    return AF_OK;
}

af_status tn_slice_view(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                        int64_t *off, int64_t *vs, af_error *err) {
    const af_tensor *x = in[0];
    slice_plan p;
    size_t es;
    af_status st = slice_plan_make(n, in, x, &p, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t xs[AF_MAX_RANK];
    af_strides(x, xs);
    *off = 0;
    if (out->rank != x->rank)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "slice shape mismatch");
    for (int i = 0; i < x->rank; i++) {
        if (p.count[i] != out->dims[i])
            return af_node_fail(err, n, AF_ERR_INTERNAL, "slice shape mismatch");
        *off += p.start[i] * xs[i];
        /* A step is only taken when count > 1, and then it stays inside the axis. */
        vs[i] = p.count[i] > 1 ? p.step[i] * xs[i] : 0;
    }
    return AF_OK;
}

af_status ref_slice(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    int64_t vs[AF_MAX_RANK], off;
    af_status st = tn_slice_view(n, in, out, &off, vs, err);
    if (st || af_tensor_numel(out) == 0)
        return st;
    tn_copy_strided(out->data, x->data, off, x->rank, out->dims, vs, af_dtype_size(x->dtype));
    return AF_OK;
}

/* ---- Gather ------------------------------------------------------------------------------ */

af_status shape_gather(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *ix = tn_in(n, in, 1);
    if (!x || !ix)
        return tn_missing(n, "data/indices", err);
    if (!tn_is_index_type(ix->dtype) && ix->dtype != AF_DTYPE_UNDEFINED)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "indices must be int32 or int64");
    if (x->rank < 0 || ix->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int axis;
    if (!af_axis(af_attr_int(n, "axis", 0), x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    int r = x->rank - 1 + ix->rank;
    if (r > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "rank %d above %d", r, AF_MAX_RANK);
    int64_t dims[AF_MAX_RANK];
    int k = 0;
    for (int i = 0; i < axis; i++)
        dims[k++] = x->dims[i];
    for (int i = 0; i < ix->rank; i++)
        dims[k++] = ix->dims[i];
    for (int i = axis + 1; i < x->rank; i++)
        dims[k++] = x->dims[i];
    af_tensor_set_type(out, x->dtype, r, dims);
    return AF_OK;
}

af_status ref_gather(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *ix = in[1];
    size_t es;
    int axis;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    if (!af_axis(af_attr_int(n, "axis", 0), x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    int64_t outer = tn_prod(x->dims, 0, axis), dim = x->dims[axis], nidx = af_tensor_numel(ix);
    size_t inner = (size_t)tn_prod(x->dims, axis + 1, x->rank) * es;
    char *dst = out->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t k = 0; k < nidx; k++) {
            int64_t j;
            if (!tn_index(ix, k, dim, &j))
                return tn_bad_index(n, ix, k, dim, err);
            copy_bytes(dst, (const char *)x->data + ((size_t)o * (size_t)dim + (size_t)j) * inner,
                       inner);
            dst += inner;
        }
    }
    return AF_OK;
}

/* ---- Expand ------------------------------------------------------------------------------ */

af_status shape_expand(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *s = tn_in(n, in, 1);
    if (!x || !s)
        return tn_missing(n, "input/shape", err);
    if (!s->data) {
        if (x->rank >= 0 && s->rank == 1 && s->dims[0] >= 0 && s->dims[0] <= AF_MAX_RANK)
            unknown_dims(out, x->dtype, x->rank > s->dims[0] ? x->rank : (int)s->dims[0]);
        else
            tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    af_tensor shape = {0};
    int cnt;
    if (!tn_ints(s, shape.dims, AF_MAX_RANK, &cnt))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "shape must be a 1-D int64 tensor of at most %d values", AF_MAX_RANK);
    for (int i = 0; i < cnt; i++)
        if (shape.dims[i] < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "negative dim in shape");
    shape.rank = cnt;
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    af_tensor o = {0};
    if (!af_broadcast_dims(x, &shape, &o))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "shape does not broadcast with input");
    af_tensor_set_type(out, x->dtype, o.rank, o.dims);
    return AF_OK;
}

af_status ref_expand(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t vs[AF_MAX_RANK];
    af_broadcast_strides(x, out, vs);
    tn_copy_strided(out->data, x->data, 0, out->rank, out->dims, vs, es);
    return AF_OK;
}

/* ---- Tile -------------------------------------------------------------------------------- */

af_status shape_tile(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *r = tn_in(n, in, 1);
    if (!x || !r)
        return tn_missing(n, "input/repeats", err);
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    if (!r->data) {
        unknown_dims(out, x->dtype, x->rank);
        return AF_OK;
    }
    int64_t rep[AF_MAX_RANK], dims[AF_MAX_RANK];
    int cnt;
    if (!tn_ints(r, rep, AF_MAX_RANK, &cnt) || cnt != x->rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "repeats must hold %d int64 values",
                            x->rank);
    for (int i = 0; i < x->rank; i++) {
        if (rep[i] < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "negative repeat");
        if (x->dims[i] < 0)
            dims[i] = -1;
        else if (!af_mul_i64(x->dims[i], rep[i], &dims[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "tiled dim overflows");
    }
    af_tensor_set_type(out, x->dtype, x->rank, dims);
    return AF_OK;
}

af_status ref_tile(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    /* View the output as [rep0, d0, rep1, d1, ...]: the repeat axes have stride 0. */
    int64_t xs[AF_MAX_RANK], vd[TN_MAX_VIEW], vs[TN_MAX_VIEW];
    af_strides(x, xs);
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[i] == 0)
            return AF_OK;
        vd[2 * i] = out->dims[i] / x->dims[i];
        vs[2 * i] = 0;
        vd[2 * i + 1] = x->dims[i];
        vs[2 * i + 1] = xs[i];
    }
    tn_copy_strided(out->data, x->data, 0, 2 * x->rank, vd, vs, es);
    return AF_OK;
}

/* ---- Pad --------------------------------------------------------------------------------- */

typedef tn_pad_mode pad_mode;

/* pads (begin..., end...): attribute before opset 11, input 1 since. *known false when the
 * input's value is not known yet. */
static af_status pad_params(const af_node *n, const af_tensor *const *in, int rank,
                            int64_t *pads, pad_mode *mode, bool *known, af_error *err) {
    const char *m = af_attr_str(n, "mode", "constant");
    if (!strcmp(m, "constant"))
        *mode = PAD_CONSTANT;
    else if (!strcmp(m, "reflect"))
        *mode = PAD_REFLECT;
    else if (!strcmp(m, "edge"))
        *mode = PAD_EDGE;
    else if (!strcmp(m, "wrap"))
        *mode = PAD_WRAP;
    else
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unknown mode '%s'", m);
    *known = true;
    int cnt;
    if (af_graph_opset(n->graph) < 11) {
        const int64_t *a = NULL;
        cnt = af_attr_ints(n, "pads", &a);
        if (cnt < 0)
            cnt = af_attr_ints(n, "paddings", &a); /* Pad-1's name */
        if (cnt < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing attribute 'pads'");
        if (cnt != 2 * rank)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pads has %d values for rank %d",
                                cnt, rank);
        memcpy(pads, a, sizeof(int64_t) * (size_t)cnt);
        return AF_OK;
    }
    const af_tensor *p = tn_in(n, in, 1);
    const af_tensor *ax = af_graph_opset(n->graph) >= 18 ? tn_in(n, in, 3) : NULL;
    if (!p)
        return tn_missing(n, "pads", err);
    if (!p->data || (ax && !ax->data)) {
        *known = false;
        return AF_OK;
    }
    if (!ax) {
        if (!tn_ints(p, pads, 2 * AF_MAX_RANK, &cnt) || cnt != 2 * rank)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pads must hold %d int64 values",
                                2 * rank);
        return AF_OK;
    }
    /* Opset 18's axes: pads (begin..., end...) for those axes only, the others unpadded. */
    int64_t axes[AF_MAX_RANK], given[2 * AF_MAX_RANK];
    int na;
    bool seen[AF_MAX_RANK] = {false};
    if (!tn_ints(ax, axes, AF_MAX_RANK, &na) || na > rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axes must hold at most %d int64 values",
                            rank);
    if (!tn_ints(p, given, 2 * AF_MAX_RANK, &cnt) || cnt != 2 * na)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pads must hold %d int64 values", 2 * na);
    memset(pads, 0, sizeof(int64_t) * (size_t)(2 * rank));
    for (int i = 0; i < na; i++) {
        int a;
        if (!af_axis(axes[i], rank, &a) || seen[a])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axes[%d] = %lld is out of range or repeated",
                                i, (long long)axes[i]);
        seen[a] = true;
        pads[a] = given[i];
        pads[rank + a] = given[na + i];
    }
    return AF_OK;
}

af_status shape_pad(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int64_t pads[2 * AF_MAX_RANK], dims[AF_MAX_RANK];
    pad_mode mode;
    bool known;
    af_status st = pad_params(n, in, x->rank, pads, &mode, &known, err);
    if (st)
        return st;
    if (!known) {
        unknown_dims(out, x->dtype, x->rank);
        return AF_OK;
    }
    for (int i = 0; i < x->rank; i++) {
        int64_t d = x->dims[i];
        /* A crop never exceeds the axis, so output coordinate - begin pad cannot overflow. */
        if (d >= 0 && (pads[i] < -d || pads[i + x->rank] < -d || !af_add_i64(d, pads[i], &d) ||
                       !af_add_i64(d, pads[i + x->rank], &d) || d < 0))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "pads make axis %d negative", i);
        dims[i] = d;
    }
    af_tensor_set_type(out, x->dtype, x->rank, dims);
    return AF_OK;
}

int64_t tn_pad_src(int64_t c, int64_t d, tn_pad_mode mode) {
    if (c >= 0 && c < d)
        return c;
    switch (mode) {
    case PAD_EDGE:
        return c < 0 ? 0 : d - 1;
    case PAD_REFLECT: {
        if (d == 1)
            return 0;
        int64_t period = 2 * (d - 1);
        int64_t m = c % period;
        if (m < 0)
            m += period;
        return m < d ? m : period - m;
    }
    case PAD_WRAP: {
        int64_t m = c % d;
        return m < 0 ? m + d : m;
    }
    default:
        return -1;
    }
}

af_status tn_pad_plan(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                      tn_pad_plan_t *p, af_error *err) {
    const af_tensor *x = in[0];
    bool known;
    af_status st = pad_params(n, in, x->rank, p->pads, &p->mode, &known, err);
    if (!st)
        st = tn_esize(n, x, &p->es, err);
    if (st)
        return st;
    if (af_tensor_numel(out) == 0)
        return AF_OK;
    if (p->mode != PAD_CONSTANT && af_tensor_numel(x) == 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "cannot %s-pad an empty tensor",
                            af_attr_str(n, "mode", ""));
    /* The fill value: one element of x's type. */
    memset(p->fill, 0, sizeof p->fill);
    if (p->es > sizeof p->fill)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "element type too large");
    const af_tensor *cv = af_graph_opset(n->graph) >= 11 ? tn_in(n, in, 2) : NULL;
    if (cv && af_tensor_numel(cv) > 0) {
        if (cv->dtype != x->dtype)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "constant_value type differs");
        memcpy(p->fill, cv->data, p->es);
    } else if (af_graph_opset(n->graph) < 11 && tn_is_numeric(x->dtype)) {
        af_tensor one = *x;
        one.data = p->fill;
        tn_setd(&one, 0, af_attr_float(n, "value", 0.0f));
    }
    return AF_OK;
}

af_status ref_pad(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    tn_pad_plan_t p;
    af_status st = tn_pad_plan(n, in, out, &p, err);
    int64_t total = af_tensor_numel(out);
    if (st || total == 0)
        return st;
    size_t es = p.es;
    int r = x->rank;
    int64_t xs[AF_MAX_RANK], idx[AF_MAX_RANK] = {0};
    af_strides(x, xs);
    char *dst = out->data;
    for (int64_t k = 0; k < total; k++, dst += es) {
        int64_t off = 0;
        bool pad = false;
        for (int a = 0; a < r; a++) {
            int64_t c = tn_pad_src(idx[a] - p.pads[a], x->dims[a], p.mode);
            if (c < 0) {
                pad = true;
                break;
            }
            off += c * xs[a];
        }
        memcpy(dst, pad ? (const void *)p.fill : (const char *)x->data + (size_t)off * es, es);
        tn_next(idx, out->dims, r);
    }
    return AF_OK;
}

/* ---- DepthToSpace / SpaceToDepth --------------------------------------------------------- */

/* Input X and blocksize of DepthToSpace / SpaceToDepth; with es (kernels only) also X's element
 * size. *b is written on every path, so callers never see it unset. */
static af_status block_params(const af_node *n, const af_tensor *const *in, const af_tensor **xp,
                              int64_t *b, size_t *es, af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    *xp = x;
    *b = af_attr_int(n, "blocksize", 0);
    if (!x)
        return tn_missing(n, "input", err);
    if (*b <= 0 || *b > (1 << 20))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad blocksize %lld", (long long)*b);
    if (x->rank >= 0 && x->rank != 4)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input must be 4-D");
    return es ? tn_esize(n, x, es, err) : AF_OK;
}

af_status shape_depth_to_space(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    const af_tensor *x;
    int64_t b;
    af_status st = block_params(n, in, &x, &b, NULL, err);
    if (st)
        return st;
    if (x->rank < 0) {
        unknown_dims(out, x->dtype, 4);
        return AF_OK;
    }
    int64_t c = x->dims[1], dims[4] = {x->dims[0], -1, -1, -1};
    if (c >= 0) {
        if (c % (b * b) != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "channels not divisible by %lld",
                                (long long)(b * b));
        dims[1] = c / (b * b);
    }
    for (int i = 2; i < 4; i++)
        if (x->dims[i] >= 0 && !af_mul_i64(x->dims[i], b, &dims[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "dims overflow");
    af_tensor_set_type(out, x->dtype, 4, dims);
    return AF_OK;
}

af_status ref_depth_to_space(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x;
    int64_t b;
    size_t es;
    af_status st = block_params(n, in, &x, &b, &es, err);
    if (st)
        return st;
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], c2 = C / (b * b);
    int64_t hw = H * W;
    bool crd = !strcmp(af_attr_str(n, "mode", "DCR"), "CRD");
    /* Output viewed as [N, C', H, b, W, b]; the strides name where each block index lives in
     * the input's channel axis for the two modes. */
    int64_t vd[6] = {N, c2, H, b, W, b};
    int64_t vs[6] = {C * hw, crd ? b * b * hw : hw, W, crd ? b * hw : b * c2 * hw, 1,
                     crd ? hw : c2 * hw};
    tn_copy_strided(out->data, x->data, 0, 6, vd, vs, es);
    return AF_OK;
}

af_status shape_space_to_depth(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  af_error *err) {
    const af_tensor *x;
    int64_t b;
    af_status st = block_params(n, in, &x, &b, NULL, err);
    if (st)
        return st;
    if (x->rank < 0) {
        unknown_dims(out, x->dtype, 4);
        return AF_OK;
    }
    int64_t dims[4] = {x->dims[0], -1, -1, -1};
    if (x->dims[1] >= 0 && !af_mul_i64(x->dims[1], b * b, &dims[1]))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "dims overflow");
    for (int i = 2; i < 4; i++) {
        if (x->dims[i] < 0)
            continue;
        if (x->dims[i] % b != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "spatial dims not divisible by %lld",
                                (long long)b);
        dims[i] = x->dims[i] / b;
    }
    af_tensor_set_type(out, x->dtype, 4, dims);
    return AF_OK;
}

af_status ref_space_to_depth(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x;
    int64_t b;
    size_t es;
    af_status st = block_params(n, in, &x, &b, &es, err);
    if (st)
        return st;
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    /* Output viewed as [N, b, b, C, H/b, W/b]. */
    int64_t vd[6] = {N, b, b, C, H / b, W / b};
    int64_t vs[6] = {C * H * W, W, 1, H * W, b * W, b};
    tn_copy_strided(out->data, x->data, 0, 6, vd, vs, es);
    return AF_OK;
}

/* ---- ReverseSequence --------------------------------------------------------------------- */

/* The batch and time axes; *ba and *ta are written on every path (the ONNX defaults 1 and 0 on
 * failure) so that callers never see them unset. */
static af_status revseq_axes(const af_node *n, const af_tensor *x, int *ba, int *ta,
                             af_error *err) {
    *ba = 1;
    *ta = 0;
    int64_t b = af_attr_int(n, "batch_axis", 1), t = af_attr_int(n, "time_axis", 0);
    if ((b != 0 && b != 1) || (t != 0 && t != 1) || b == t)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "batch_axis and time_axis must be 0 and 1");
    if (x->rank >= 0 && x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input must have rank >= 2");
    *ba = (int)b;
    *ta = (int)t;
    return AF_OK;
}

af_status shape_reverse_sequence(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                    af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    int ba, ta;
    if (!x || !tn_in(n, in, 1))
        return tn_missing(n, "input/sequence_lens", err);
    af_status st = revseq_axes(n, x, &ba, &ta, err);
    if (st)
        return st;
    af_tensor_type_copy(out, x);
    return AF_OK;
}

af_status ref_reverse_sequence(const af_node *n, const af_tensor *const *in,
                                     af_tensor *out, af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *lens = in[1];
    int ba, ta;
    size_t es;
    af_status st = revseq_axes(n, x, &ba, &ta, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t nb = x->dims[ba], nt = x->dims[ta];
    if (!tn_is_index_type(lens->dtype) || af_tensor_numel(lens) != nb)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "sequence_lens must hold %lld integers",
                            (long long)nb);
    size_t inner = (size_t)tn_prod(x->dims, 2, x->rank) * es;
    for (int64_t i0 = 0; i0 < x->dims[0]; i0++) {
        for (int64_t i1 = 0; i1 < x->dims[1]; i1++) {
            int64_t b = ba == 0 ? i0 : i1, t = ta == 0 ? i0 : i1;
            int64_t len = tn_geti(lens, b);
            if (len < 0 || len > nt)
                return af_node_fail(err, n, AF_ERR_RUNTIME, "sequence length %lld not in [0, %lld]",
                                    (long long)len, (long long)nt);
            int64_t s = t < len ? len - 1 - t : t;
            int64_t src = ta == 0 ? s * x->dims[1] + i1 : i0 * x->dims[1] + s;
            copy_bytes((char *)out->data + (size_t)(i0 * x->dims[1] + i1) * inner,
                       (const char *)x->data + (size_t)src * inner, inner);
        }
    }
    return AF_OK;
}

/* ---- Shape / Size ------------------------------------------------------------------------ */

static void shape_op_range(const af_node *n, int rank, int64_t *lo, int64_t *hi) {
    int64_t s = af_attr_int(n, "start", 0), e = af_attr_int(n, "end", rank);
    if (s < 0)
        s += rank;
    if (e < 0)
        e += rank;
    *lo = clamp64(s, 0, rank);
    *hi = clamp64(e, 0, rank);
    if (*hi < *lo)
        *hi = *lo;
}

af_status shape_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    int64_t lo, hi;
    if (x->rank < 0) {
        unknown_dims(out, AF_DTYPE_INT64, 1);
        return AF_OK;
    }
    shape_op_range(n, x->rank, &lo, &hi);
    int64_t d = hi - lo;
    af_tensor_set_type(out, AF_DTYPE_INT64, 1, &d);
    return AF_OK;
}

af_status ref_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    (void)err;
    int64_t lo, hi;
    shape_op_range(n, in[0]->rank, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        ((int64_t *)out->data)[i - lo] = in[0]->dims[i];
    return AF_OK;
}

af_status shape_size(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    if (!tn_in(n, in, 0))
        return tn_missing(n, "data", err);
    af_tensor_set_type(out, AF_DTYPE_INT64, 0, NULL);
    return AF_OK;
}

af_status ref_size(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    int64_t c = af_tensor_numel(in[0]);
    if (c < 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "element count overflows");
    *(int64_t *)out->data = c;
    return AF_OK;
}

/* ---- ConstantOfShape --------------------------------------------------------------------- */

static af_status cos_value(const af_node *n, const af_tensor **v, af_error *err) {
    const af_attr *a = af_node_attr(n, "value");
    *v = NULL;
    if (!a)
        return AF_OK;
    if (a->type != AF_ATTR_TENSOR || !a->t || !a->t->data || af_tensor_numel(a->t) != 1 ||
        af_dtype_size(a->t->dtype) == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "value must be a one-element tensor");
    *v = a->t;
    return AF_OK;
}

af_status shape_constant_of_shape(const af_node *n, const af_tensor *const *in,
                                     af_tensor *out, af_error *err) {
    const af_tensor *s = tn_in(n, in, 0), *v;
    if (!s)
        return tn_missing(n, "input", err);
    af_status st = cos_value(n, &v, err);
    if (st)
        return st;
    af_dtype dt = v ? v->dtype : AF_DTYPE_FLOAT;
    if (!s->data) {
        if (s->rank == 1 && s->dims[0] >= 0 && s->dims[0] <= AF_MAX_RANK)
            unknown_dims(out, dt, (int)s->dims[0]);
        else
            tn_unknown_rank(out, dt);
        return AF_OK;
    }
    int64_t dims[AF_MAX_RANK];
    int cnt;
    if (!tn_ints(s, dims, AF_MAX_RANK, &cnt))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "shape must be a 1-D int64 tensor of at most %d values", AF_MAX_RANK);
    for (int i = 0; i < cnt; i++)
        if (dims[i] < 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "negative dim in shape");
    af_tensor_set_type(out, dt, cnt, dims);
    return AF_OK;
}

af_status ref_constant_of_shape(const af_node *n, const af_tensor *const *in,
                                      af_tensor *out, af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    (void)in;
    const af_tensor *v;
    af_status st = cos_value(n, &v, err);
    if (st)
        return st;
    int64_t cnt = af_tensor_numel(out);
    size_t es = af_dtype_size(out->dtype);
    if (!v) {
        if (cnt > 0)
            memset(out->data, 0, (size_t)cnt * es);
        return AF_OK;
    }
    for (int64_t i = 0; i < cnt; i++)
        memcpy((char *)out->data + (size_t)i * es, v->data, es);
    return AF_OK;
}

/* ---- Range ------------------------------------------------------------------------------- */

static af_status range_count(const af_node *n, const af_tensor *s, const af_tensor *l,
                             const af_tensor *d, int64_t *cnt, af_error *err) {
    if (af_tensor_numel(s) != 1 || af_tensor_numel(l) != 1 || af_tensor_numel(d) != 1 || s->dtype != l->dtype ||
        s->dtype != d->dtype || !tn_is_numeric(s->dtype) || s->dtype == AF_DTYPE_BOOL)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "start, limit and delta must be numeric scalars of one type");
    if (tn_is_float(s->dtype)) {
        double a = af_tensor_get_double(s, 0), b = af_tensor_get_double(l, 0), c = af_tensor_get_double(d, 0);
        double k = c == 0 ? NAN : ceil((b - a) / c);
        if (k != k || k > 1e15)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad range");
        *cnt = k > 0 ? (int64_t)k : 0;
        return AF_OK;
    }
    int64_t a = tn_geti(s, 0), b = tn_geti(l, 0), c = tn_geti(d, 0), diff;
    if (c == 0 || __builtin_sub_overflow(b, a, &diff))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad range");
    if ((diff > 0 && c < 0) || (diff < 0 && c > 0) || diff == 0) {
        *cnt = 0;
        return AF_OK;
    }
    uint64_t ud = diff > 0 ? (uint64_t)diff : (uint64_t)0 - (uint64_t)diff;
    uint64_t uc = c > 0 ? (uint64_t)c : (uint64_t)0 - (uint64_t)c;
    *cnt = (int64_t)((ud - 1) / uc + 1);
    return AF_OK;
}

af_status shape_range(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const af_tensor *s = tn_in(n, in, 0), *l = tn_in(n, in, 1), *d = tn_in(n, in, 2);
    if (!s || !l || !d)
        return tn_missing(n, "start/limit/delta", err);
    int64_t cnt = -1;
    if (s->data && l->data && d->data) {
        af_status st = range_count(n, s, l, d, &cnt, err);
        if (st)
            return st;
    }
    af_tensor_set_type(out, s->dtype, 1, &cnt);
    return AF_OK;
}

af_status ref_range(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    int64_t cnt;
    af_status st = range_count(n, in[0], in[1], in[2], &cnt, err);
    if (st)
        return st;
    if (cnt != out->dims[0])
        return af_node_fail(err, n, AF_ERR_INTERNAL, "range length mismatch");
    if (tn_is_float(out->dtype)) {
        double a = af_tensor_get_double(in[0], 0), c = af_tensor_get_double(in[2], 0);
        for (int64_t i = 0; i < cnt; i++)
            tn_setd(out, i, a + (double)i * c);
    } else {
        /* Wrapping arithmetic: every value lies between start and limit, so no real wrap. */
        uint64_t a = (uint64_t)tn_geti(in[0], 0), c = (uint64_t)tn_geti(in[2], 0);
        for (int64_t i = 0; i < cnt; i++)
            tn_seti(out, i, (int64_t)(a + (uint64_t)i * c));
    }
    return AF_OK;
}

/* ---- EyeLike ----------------------------------------------------------------------------- */

af_status shape_eye_like(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "input", err);
    if (x->rank >= 0 && x->rank != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input must be 2-D");
    af_dtype dt = (af_dtype)af_attr_int(n, "dtype", x->dtype);
    if (!tn_is_numeric(dt))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported dtype %d", (int)dt);
    af_tensor_type_copy(out, x);
    out->dtype = dt;
    if (x->rank < 0)
        unknown_dims(out, dt, 2);
    return AF_OK;
}

af_status ref_eye_like(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    (void)in;
    (void)err;
    int64_t rows = out->dims[0], cols = out->dims[1], k = af_attr_int(n, "k", 0);
    if (rows * cols > 0)
        memset(out->data, 0, (size_t)(rows * cols) * af_dtype_size(out->dtype));
    /* Outside (-rows, cols) the diagonal misses the matrix; inside, i + k cannot overflow. */
    if (k <= -rows || k >= cols)
        return AF_OK;
    for (int64_t i = 0; i < rows; i++)
        if (i + k >= 0 && i + k < cols)
            tn_seti(out, i * cols + i + k, 1);
    return AF_OK;
}

/* ---- Trilu ------------------------------------------------------------------------------- */

af_status shape_trilu(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "input", err);
    if (x->rank >= 0 && x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input must have rank >= 2");
    af_tensor_type_copy(out, x);
    return AF_OK;
}

af_status ref_trilu(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *kt = tn_in(n, in, 1);
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t k = 0;
    if (kt) {
        if (!tn_is_index_type(kt->dtype) || af_tensor_numel(kt) != 1)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "k must be one int64");
        k = tn_geti(kt, 0);
    }
    bool upper = af_attr_int(n, "upper", 1) != 0;
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    int64_t mats = tn_prod(x->dims, 0, x->rank - 2), at = 0;
    for (int64_t m = 0; m < mats; m++) {
        for (int64_t i = 0; i < rows; i++) {
            for (int64_t j = 0; j < cols; j++, at++) {
                int64_t diag = j - i; /* |j - i| is below any dim, no overflow */
                bool keep = upper ? diag >= k : diag <= k;
                char *d = (char *)out->data + (size_t)at * es;
                if (keep)
                    memcpy(d, (const char *)x->data + (size_t)at * es, es);
                else
                    memset(d, 0, es);
            }
        }
    }
    return AF_OK;
}
