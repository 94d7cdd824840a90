/* Reference kernels for data-dependent indexing: GatherElements, GatherND, ScatterElements
 * (and the deprecated Scatter), ScatterND, OneHot, Compress, NonZero and Unique.
 *
 * Invariant: every index read from a tensor is normalised (negative counts from the end) and
 * checked against the axis it addresses before any memory is touched; a bad index is
 * AF_ERR_RUNTIME naming the value, never a wild read or write. */
#include "kernels/ref/tensor_util.h"

#include <stdlib.h>

/* ---- reductions shared by the scatters ---------------------------------------------------- */

af_status tn_scatter_reduction(const af_node *n, scat_red *r, af_error *err) {
    const char *s = af_attr_str(n, "reduction", "none");
    if (!strcmp(s, "none"))
        *r = RED_NONE;
    else if (!strcmp(s, "add"))
        *r = RED_ADD;
    else if (!strcmp(s, "mul"))
        *r = RED_MUL;
    else if (!strcmp(s, "max"))
        *r = RED_MAX;
    else if (!strcmp(s, "min"))
        *r = RED_MIN;
    else
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unknown reduction '%s'", s);
    return AF_OK;
}

/* out[o] = red(out[o], upd[u]). */
static void scatter_one(af_tensor *out, int64_t o, const af_tensor *upd, int64_t u, scat_red r,
                        size_t es) {
    if (r == RED_NONE) {
        memcpy((char *)out->data + (size_t)o * es, (const char *)upd->data + (size_t)u * es, es);
        return;
    }
    if (tn_is_float(out->dtype)) {
        double a = af_tensor_get_double(out, o), b = af_tensor_get_double(upd, u);
        double v = r == RED_ADD   ? a + b
                   : r == RED_MUL ? a * b
                   : r == RED_MAX ? fmax(a, b)
                                  : fmin(a, b);
        tn_setd(out, o, v);
        return;
    }
    int64_t a = tn_geti(out, o), b = tn_geti(upd, u), v;
    if (r == RED_ADD)
        v = (int64_t)((uint64_t)a + (uint64_t)b); /* wraps like the integer type would */
    else if (r == RED_MUL)
        v = (int64_t)((uint64_t)a * (uint64_t)b);
    else
        v = (r == RED_MAX) == (a > b) ? a : b;
    tn_seti(out, o, v);
}

/* ---- GatherElements / ScatterElements ----------------------------------------------------- */

af_status shape_gather_elements(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *ix = tn_in(n, in, 1);
    if (!x || !ix)
        return tn_missing(n, "data/indices", err);
    if (x->rank >= 0 && ix->rank >= 0 && x->rank != ix->rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "data and indices differ in rank");
    af_tensor_type_copy(out, ix);
    out->dtype = x->dtype;
    return AF_OK;
}

/* Checks shared by GatherElements and ScatterElements: indices of the data's rank and no larger
 * than the data outside the axis, so every element offset below is in bounds. */
static af_status elements_check(const af_node *n, const af_tensor *x, const af_tensor *ix,
                                int *axis, af_error *err) {
    if (!tn_is_index_type(ix->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "indices must be int32 or int64");
    if (x->rank != ix->rank || x->rank < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "data and indices differ in rank");
    if (!af_axis(af_attr_int(n, "axis", 0), x->rank, axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    for (int a = 0; a < x->rank; a++)
        if (a != *axis && ix->dims[a] > x->dims[a])
            return af_node_fail(err, n, AF_ERR_RUNTIME, "indices dim %d larger than data's", a);
    return AF_OK;
}

/* Data offset of element k (multi-index idx) of an indices tensor; false on a bad index. */
static bool elements_offset(const af_tensor *x, const af_tensor *ix, int axis, const int64_t *xs,
                            const int64_t *idx, int64_t k, int64_t *off) {
    int64_t j, o = 0;
    if (!tn_index(ix, k, x->dims[axis], &j))
        return false;
    for (int a = 0; a < x->rank; a++)
        o += (a == axis ? j : idx[a]) * xs[a];
    *off = o;
    return true;
}

af_status ref_gather_elements(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                    af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *ix = in[1];
    int axis;
    size_t es;
    af_status st = elements_check(n, x, ix, &axis, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int64_t xs[AF_MAX_RANK], idx[AF_MAX_RANK] = {0}, cnt = af_tensor_numel(ix), off;
    af_strides(x, xs);
    for (int64_t k = 0; k < cnt; k++) {
        if (!elements_offset(x, ix, axis, xs, idx, k, &off))
            return tn_bad_index(n, ix, k, x->dims[axis], err);
        memcpy((char *)out->data + (size_t)k * es, (const char *)x->data + (size_t)off * es, es);
        tn_next(idx, ix->dims, ix->rank);
    }
    return AF_OK;
}

af_status shape_scatter_elements(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                    af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x || !tn_in(n, in, 1) || !tn_in(n, in, 2))
        return tn_missing(n, "data/indices/updates", err);
    af_tensor_type_copy(out, x);
    return AF_OK;
}

static bool same_dims(const af_tensor *a, const af_tensor *b) {
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

af_status ref_scatter_elements(const af_node *n, const af_tensor *const *in,
                                     af_tensor *out, af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *ix = in[1], *up = in[2];
    int axis;
    size_t es;
    scat_red red;
    af_status st = elements_check(n, x, ix, &axis, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (!st)
        st = tn_scatter_reduction(n, &red, err);
    if (st)
        return st;
    if (!same_dims(ix, up) || up->dtype != x->dtype)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "updates must match indices and data");
    if (af_tensor_numel(x) > 0)
        memcpy(out->data, x->data, (size_t)af_tensor_numel(x) * es);
    int64_t xs[AF_MAX_RANK], idx[AF_MAX_RANK] = {0}, cnt = af_tensor_numel(ix), off;
    af_strides(x, xs);
    for (int64_t k = 0; k < cnt; k++) {
        if (!elements_offset(x, ix, axis, xs, idx, k, &off))
            return tn_bad_index(n, ix, k, x->dims[axis], err);
        scatter_one(out, off, up, k, red, es);
        tn_next(idx, ix->dims, ix->rank);
    }
    return AF_OK;
}

/* ---- GatherND / ScatterND ----------------------------------------------------------------- */

af_status shape_gather_nd(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *ix = tn_in(n, in, 1);
    if (!x || !ix)
        return tn_missing(n, "data/indices", err);
    int64_t b = af_attr_int(n, "batch_dims", 0);
    int q = ix->rank, r = x->rank;
    if (q == 0 || r == 0 || b < 0 || (q > 0 && b >= q) || (r > 0 && b >= r))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad ranks or batch_dims");
    if (r < 0 || q < 0 || ix->dims[q - 1] < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int64_t m = ix->dims[q - 1];
    if (m < 1 || m > r - b)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "indices' last dim %lld not in [1, %lld]",
                            (long long)m, (long long)(r - b));
    int orank = q - 1 + r - (int)b - (int)m, k = 0;
    if (orank > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "rank %d above %d", orank, AF_MAX_RANK);
    int64_t dims[AF_MAX_RANK];
    for (int i = 0; i < q - 1; i++)
        dims[k++] = ix->dims[i];
    for (int i = (int)(b + m); i < r; i++)
        dims[k++] = x->dims[i];
    af_tensor_set_type(out, x->dtype, orank, dims);
    return AF_OK;
}

/* Element offset (within one batch of x, dims from `first`) of the m-tuple starting at k. */
static bool nd_offset(const af_tensor *x, const af_tensor *ix, int first, int64_t m, int64_t k,
                      int64_t *off) {
    int64_t o = 0;
    for (int64_t j = 0; j < m; j++) {
        int64_t v, dim = x->dims[first + j];
        if (!tn_index(ix, k + j, dim, &v))
            return false;
        o = o * dim + v;
    }
    *off = o * tn_prod(x->dims, first + (int)m, x->rank);
    return true;
}

af_status ref_gather_nd(const af_node *n, const af_tensor *const *in, af_tensor *out,
                              af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *ix = in[1];
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    if (!tn_is_index_type(ix->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "indices must be int32 or int64");
    int b = (int)af_attr_int(n, "batch_dims", 0), q = ix->rank;
    int64_t m = ix->dims[q - 1];
    for (int i = 0; i < b; i++)
        if (ix->dims[i] != x->dims[i])
            return af_node_fail(err, n, AF_ERR_RUNTIME, "batch dim %d differs", i);
    int64_t batches = tn_prod(x->dims, 0, b), per = tn_prod(ix->dims, b, q - 1);
    int64_t xbatch = tn_prod(x->dims, b, x->rank), slice = tn_prod(x->dims, b + (int)m, x->rank);
    char *dst = out->data;
    for (int64_t bi = 0; bi < batches; bi++) {
        for (int64_t s = 0; s < per; s++) {
            int64_t k = (bi * per + s) * m, off;
            if (!nd_offset(x, ix, b, m, k, &off))
                return af_node_fail(err, n, AF_ERR_RUNTIME, "index tuple %lld out of range",
                                    (long long)(bi * per + s));
            size_t len = (size_t)slice * es;
            if (len)
                memcpy(dst, (const char *)x->data + (size_t)(bi * xbatch + off) * es, len);
            dst += len;
        }
    }
    return AF_OK;
}

af_status ref_scatter_nd(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *ix = in[1], *up = in[2];
    size_t es;
    scat_red red;
    af_status st = tn_esize(n, x, &es, err);
    if (!st)
        st = tn_scatter_reduction(n, &red, err);
    if (st)
        return st;
    if (!tn_is_index_type(ix->dtype) || ix->rank < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "indices must be int32 or int64");
    int q = ix->rank;
    int64_t m = ix->dims[q - 1];
    if (m > x->rank || up->dtype != x->dtype || up->rank != q - 1 + x->rank - m)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "updates do not match data and indices");
    for (int i = 0; i < q - 1; i++)
        if (up->dims[i] != ix->dims[i])
            return af_node_fail(err, n, AF_ERR_RUNTIME, "updates do not match indices");
    for (int i = (int)m; i < x->rank; i++)
        if (up->dims[q - 1 + i - m] != x->dims[i])
            return af_node_fail(err, n, AF_ERR_RUNTIME, "updates do not match data");
    if (af_tensor_numel(x) > 0)
        memcpy(out->data, x->data, (size_t)af_tensor_numel(x) * es);
    int64_t cnt = tn_prod(ix->dims, 0, q - 1), slice = tn_prod(x->dims, (int)m, x->rank);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t off;
        if (!nd_offset(x, ix, 0, m, i * m, &off))
            return af_node_fail(err, n, AF_ERR_RUNTIME, "index tuple %lld out of range",
                                (long long)i);
        for (int64_t e = 0; e < slice; e++)
            scatter_one(out, off + e, up, i * slice + e, red, es);
    }
    return AF_OK;
}

/* ---- OneHot ------------------------------------------------------------------------------- */

/* Depth as an integer, when known; the depth input may be of any numeric type. */
static af_status onehot_depth(const af_node *n, const af_tensor *d, int64_t *depth,
                              af_error *err) {
    *depth = -1;
    if (!d->data)
        return AF_OK;
    if (af_tensor_numel(d) != 1 || !tn_is_numeric(d->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "depth must be one number");
    *depth = tn_geti(d, 0);
    if (*depth < 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "depth %lld below 1", (long long)*depth);
    return AF_OK;
}

af_status shape_one_hot(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    const af_tensor *ix = tn_in(n, in, 0), *d = tn_in(n, in, 1), *v = tn_in(n, in, 2);
    if (!ix || !d || !v)
        return tn_missing(n, "indices/depth/values", err);
    if (ix->rank < 0) {
        tn_unknown_rank(out, v->dtype);
        return AF_OK;
    }
    int r = ix->rank + 1, axis;
    if (r > AF_MAX_RANK)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "rank %d above %d", r, AF_MAX_RANK);
    if (!af_axis(af_attr_int(n, "axis", -1), r, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    int64_t depth, dims[AF_MAX_RANK];
    af_status st = onehot_depth(n, d, &depth, err);
    if (st)
        return st;
    for (int i = 0, j = 0; i < r; i++)
        dims[i] = i == axis ? depth : ix->dims[j++];
    af_tensor_set_type(out, v->dtype, r, dims);
    return AF_OK;
}

af_status ref_one_hot(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *ix = in[0], *v = in[2];
    int64_t depth;
    int axis;
    size_t es;
    af_status st = onehot_depth(n, in[1], &depth, err);
    if (!st)
        st = tn_esize(n, v, &es, err);
    if (st)
        return st;
    if (af_tensor_numel(v) != 2 || !tn_is_numeric(ix->dtype))
        return af_node_fail(err, n, AF_ERR_RUNTIME, "values must hold [off, on]");
    if (!af_axis(af_attr_int(n, "axis", -1), out->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    const char *off = v->data, *on = off + es;
    int64_t total = af_tensor_numel(out);
    for (int64_t i = 0; i < total; i++)
        memcpy((char *)out->data + (size_t)i * es, off, es);
    int64_t outer = tn_prod(ix->dims, 0, axis), inner = tn_prod(ix->dims, axis, ix->rank);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t j;
            if (!tn_index(ix, o * inner + i, depth, &j))
                continue; /* out-of-range indices give an all-off row */
            memcpy((char *)out->data + (size_t)((o * depth + j) * inner + i) * es, on, es);
        }
    }
    return AF_OK;
}

/* ---- Compress ----------------------------------------------------------------------------- */

/* Number of kept slices when the condition is known; -1 otherwise. */
static af_status compress_count(const af_node *n, const af_tensor *c, int64_t dim, int64_t *cnt,
                                af_error *err) {
    *cnt = -1;
    if (!c->data || dim < 0)
        return AF_OK;
    if (c->rank != 1 || !tn_is_numeric(c->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "condition must be 1-D bool");
    int64_t k = 0;
    for (int64_t i = 0; i < c->dims[0]; i++) {
        if (!tn_geti(c, i))
            continue;
        if (i >= dim)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "condition selects %lld past the axis",
                                (long long)i);
        k++;
    }
    *cnt = k;
    return AF_OK;
}

af_status shape_compress(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = tn_in(n, in, 0), *c = tn_in(n, in, 1);
    if (!x || !c)
        return tn_missing(n, "input/condition", err);
    const af_attr *aa = af_node_attr(n, "axis");
    int64_t cnt;
    af_status st;
    if (!aa) {
        int64_t total = af_tensor_known(x) ? af_tensor_numel(x) : -1;
        if ((st = compress_count(n, c, total, &cnt, err)))
            return st;
        af_tensor_set_type(out, x->dtype, 1, &cnt);
        return AF_OK;
    }
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    int axis;
    if (!af_axis(aa->i, x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    if ((st = compress_count(n, c, x->dims[axis], &cnt, err)))
        return st;
    af_tensor_type_copy(out, x);
    out->dims[axis] = cnt;
    return AF_OK;
}

af_status ref_compress(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = in[0], *c = in[1];
    const af_attr *aa = af_node_attr(n, "axis");
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    int axis = 0;
    int64_t outer = 1, dim = af_tensor_numel(x), inner = 1, cnt;
    if (aa) {
        if (!af_axis(aa->i, x->rank, &axis))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
        outer = tn_prod(x->dims, 0, axis);
        dim = x->dims[axis];
        inner = tn_prod(x->dims, axis + 1, x->rank);
    }
    if ((st = compress_count(n, c, dim, &cnt, err)))
        return st;
    int64_t dims[AF_MAX_RANK];
    int rank = 1;
    dims[0] = cnt;
    if (aa) {
        rank = x->rank;
        memcpy(dims, x->dims, sizeof(int64_t) * (size_t)rank);
        dims[axis] = cnt;
    }
    if ((st = tn_out_alloc(n, out, x->dtype, rank, dims, err)))
        return st;
    size_t row = (size_t)inner * es;
    char *dst = out->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < c->dims[0] && i < dim; i++) {
            if (!tn_geti(c, i))
                continue;
            memcpy(dst, (const char *)x->data + (size_t)(o * dim + i) * row, row);
            dst += row;
        }
    }
    return AF_OK;
}

/* ---- NonZero ------------------------------------------------------------------------------ */

static bool nonzero_at(const af_tensor *x, int64_t i) {
    if (tn_is_float(x->dtype))
        return af_tensor_get_double(x, i) != 0;
    return tn_geti(x, i) != 0;
}

static int64_t nonzero_count(const af_tensor *x) {
    int64_t cnt = 0, total = af_tensor_numel(x);
    for (int64_t i = 0; i < total; i++)
        cnt += nonzero_at(x, i);
    return cnt;
}

af_status shape_non_zero(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "X", err);
    if (x->data && !tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    /* A scalar counts as a 1-element vector, as in numpy. */
    int64_t dims[2] = {x->rank < 0 ? -1 : x->rank == 0 ? 1 : x->rank,
                       x->data ? nonzero_count(x) : -1};
    af_tensor_set_type(out, AF_DTYPE_INT64, 2, dims);
    return AF_OK;
}

af_status ref_non_zero(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = in[0];
    if (!tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    int r = x->rank == 0 ? 1 : x->rank;
    int64_t cnt = nonzero_count(x), total = af_tensor_numel(x), dims[2] = {r, cnt};
    af_status st = tn_out_alloc(n, out, AF_DTYPE_INT64, 2, dims, err);
    if (st)
        return st;
    int64_t idx[AF_MAX_RANK] = {0}, k = 0, *o = out->data;
    for (int64_t i = 0; i < total; i++) {
        if (nonzero_at(x, i)) {
            for (int a = 0; a < x->rank; a++)
                o[a * cnt + k] = idx[a];
            k++;
        }
        tn_next(idx, x->dims, x->rank);
    }
    return AF_OK;
}

/* ---- Unique ------------------------------------------------------------------------------- */

/* Items are the elements (no axis) or the slices along the axis: item i covers elements
 * (o * dim + i) * inner + j for every o < outer, j < inner. */
typedef struct uniq_ctx {
    const af_tensor *x;
    int64_t outer, dim, inner;
} uniq_ctx;

static int uniq_cmp(void *p, int64_t a, int64_t b) {
    const uniq_ctx *u = p;
    for (int64_t o = 0; o < u->outer; o++) {
        for (int64_t j = 0; j < u->inner; j++) {
            int c = tn_cmp(u->x, (o * u->dim + a) * u->inner + j, u->x,
                           (o * u->dim + b) * u->inner + j);
            if (c)
                return c;
        }
    }
    return 0;
}

static int first_cmp(void *p, int64_t a, int64_t b) {
    const int64_t *first = p;
    return (first[a] > first[b]) - (first[a] < first[b]);
}

af_status shape_unique(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "X", err);
    const af_attr *aa = af_node_attr(n, "axis");
    int64_t unk = -1;
    if (aa && x->rank >= 0) {
        int axis;
        if (!af_axis(aa->i, x->rank, &axis))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
        af_tensor_type_copy(&out[0], x);
        out[0].dims[axis] = -1;
    } else if (aa) {
        tn_unknown_rank(&out[0], x->dtype);
    } else {
        af_tensor_set_type(&out[0], x->dtype, 1, &unk);
    }
    for (int i = 1; i < n->nout && i < 4; i++)
        af_tensor_set_type(&out[i], AF_DTYPE_INT64, 1, &unk);
    return AF_OK;
}

static af_status unique_outputs(const af_node *n, const af_tensor *x, af_tensor *out,
                                const uniq_ctx *u, int axis, const int64_t *order,
                                const int64_t *group, const int64_t *first, const int64_t *count,
                                int64_t ng, size_t es, af_error *err) {
    int64_t dims[AF_MAX_RANK];
    af_status st;
    if (axis >= 0) {
        memcpy(dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
        dims[axis] = ng;
        st = tn_out_alloc(n, &out[0], x->dtype, x->rank, dims, err);
    } else {
        st = tn_out_alloc(n, &out[0], x->dtype, 1, &ng, err);
    }
    if (st)
        return st;
    /* order[g] is the item of output group g. */
    size_t row = (size_t)u->inner * es;
    for (int64_t o = 0; o < u->outer; o++)
        for (int64_t g = 0; g < ng; g++)
            memcpy((char *)out[0].data + (size_t)(o * ng + g) * row,
                   (const char *)x->data + (size_t)(o * u->dim + first[order[g]]) * row, row);
    int64_t lens[4] = {0, ng, u->dim, ng};
    for (int i = 1; i < n->nout && i < 4; i++) {
        if (!n->out[i])
            continue;
        if ((st = tn_out_alloc(n, &out[i], AF_DTYPE_INT64, 1, &lens[i], err)))
            return st;
        int64_t *o = out[i].data;
        for (int64_t k = 0; k < lens[i]; k++)
            o[k] = i == 1 ? first[order[k]] : i == 3 ? count[order[k]] : group[k];
    }
    return AF_OK;
}

af_status ref_unique(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = in[0];
    size_t es;
    af_status st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    if (!tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    const af_attr *aa = af_node_attr(n, "axis");
    int axis = -1;
    uniq_ctx u = {x, 1, af_tensor_numel(x), 1};
    if (aa) {
        if (!af_axis(aa->i, x->rank, &axis))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
        u.outer = tn_prod(x->dims, 0, axis);
        u.dim = x->dims[axis];
        u.inner = tn_prod(x->dims, axis + 1, x->rank);
    }
    int64_t m = u.dim;
    /* items sorted; per group: its first item and count; per item: its group. */
    int64_t *buf = af_calloc((size_t)(5 * m + 1), sizeof(int64_t));
    if (!buf)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    int64_t *items = buf, *tmp = buf + m, *group = buf + 2 * m, *first = buf + 3 * m,
            *count = buf + 4 * m, ng = 0;
    for (int64_t i = 0; i < m; i++)
        items[i] = i;
    tn_sort(items, m, tmp, uniq_cmp, &u);
    for (int64_t i = 0; i < m; i++) {
        if (i == 0 || uniq_cmp(&u, items[i - 1], items[i]) != 0) {
            first[ng] = items[i]; /* stable sort: the earliest item of the group */
            count[ng++] = 0;
        }
        group[items[i]] = ng - 1;
        count[ng - 1]++;
    }
    /* Output order of the groups: sorted as they are, or by first occurrence. */
    int64_t *order = tmp;
    for (int64_t g = 0; g < ng; g++)
        order[g] = g;
    if (!af_attr_int(n, "sorted", 1)) {
        tn_sort(order, ng, items, first_cmp, first);
        for (int64_t g = 0; g < ng; g++)
            items[order[g]] = g;
        for (int64_t i = 0; i < m; i++)
            group[i] = items[group[i]];
    }
    st = unique_outputs(n, x, out, &u, axis, order, group, first, count, ng, es, err);
    af_free(buf);
    return st;
}
