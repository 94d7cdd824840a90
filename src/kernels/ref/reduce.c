/* Reference kernels for reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/
 * SumSquare, ArgMax/ArgMin, TopK and CumSum (ONNX semantics, opsets 7..17, plus the axes input
 * that opset 18 gives every Reduce op).
 *
 * Invariant: integers accumulate in int64 with wrapping (two's complement) arithmetic, floats in
 * double, so no input makes the arithmetic undefined; results are converted to the output type
 * once, at the end. Ties in ArgMax/ArgMin/TopK go to the lower index (ArgMax/ArgMin: the higher
 * with select_last_index). */
#include "kernels/ref/tensor_util.h"

#include <stdlib.h>

/* ---- Reduce* ------------------------------------------------------------------------------ */

/* Which axes to reduce. *noop: noop_with_empty_axes with no axes (output = input). *known
 * false when the axes input's value is not known yet. */
af_status tn_reduce_axes(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                         bool *red, bool *noop, bool *known, af_error *err) {
    int64_t opset = af_graph_opset(n->graph);
    bool from_input = opset >= 18 || (n->op == AF_OP_REDUCE_SUM && opset >= 13);
    int axes[AF_MAX_RANK], naxes;
    bool given;
    af_status st = tn_axes(n, tn_in(n, in, 1), from_input, "axes", x->rank, axes, &naxes,
                           &given, known, err);
    if (st || !*known)
        return st;
    *noop = false;
    for (int i = 0; i < x->rank; i++)
        red[i] = naxes == 0;
    for (int i = 0; i < naxes; i++)
        red[axes[i]] = true;
    if (naxes == 0 && af_attr_int(n, "noop_with_empty_axes", 0))
        *noop = true;
    return AF_OK;
}

af_status shape_reduce(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    bool keep = af_attr_int(n, "keepdims", 1) != 0;
    if (x->rank < 0) {
        tn_unknown_rank(out, x->dtype);
        return AF_OK;
    }
    bool red[AF_MAX_RANK], noop, known;
    af_status st = tn_reduce_axes(n, in, x, red, &noop, &known, err);
    if (st)
        return st;
    int64_t dims[AF_MAX_RANK];
    int r = 0;
    if (!known) {
        if (!keep) {
            tn_unknown_rank(out, x->dtype);
            return AF_OK;
        }
        for (int i = 0; i < x->rank; i++)
            dims[i] = -1;
        af_tensor_set_type(out, x->dtype, x->rank, dims);
        return AF_OK;
    }
    if (noop) {
        af_tensor_type_copy(out, x);
        return AF_OK;
    }
    for (int i = 0; i < x->rank; i++) {
        if (!red[i])
            dims[r++] = x->dims[i];
        else if (keep)
            dims[r++] = 1;
    }
    af_tensor_set_type(out, x->dtype, r, dims);
    return AF_OK;
}

typedef enum red_kind {
    K_SUM, K_MEAN, K_MAX, K_MIN, K_PROD, K_L1, K_L2, K_LOGSUM, K_LSE, K_SSQ
} red_kind;

static red_kind reduce_kind(af_op op) {
    switch (op) {
    case AF_OP_REDUCE_MEAN: return K_MEAN;
    case AF_OP_REDUCE_MAX: return K_MAX;
    case AF_OP_REDUCE_MIN: return K_MIN;
    case AF_OP_REDUCE_PROD: return K_PROD;
    case AF_OP_REDUCE_L1: return K_L1;
    case AF_OP_REDUCE_L2: return K_L2;
    case AF_OP_REDUCE_LOG_SUM: return K_LOGSUM;
    case AF_OP_REDUCE_LOG_SUM_EXP: return K_LSE;
    case AF_OP_REDUCE_SUM_SQUARE: return K_SSQ;
    default: return K_SUM;
    }
}

/* Integer reductions that stay exact in int64 (the rest go through double). */
static bool int_path(red_kind k, af_dtype dt) {
    return !tn_is_float(dt) && k != K_L2 && k != K_LOGSUM && k != K_LSE;
}

/* Running state: acc[o] for float kinds, iacc[o] for integer kinds; aux[o] holds the max for
 * LogSumExp (first pass). */
typedef struct red_state {
    red_kind kind;
    bool ints;
    double *acc, *aux;
    int64_t *iacc;
} red_state;

static void red_init(red_state *s, int64_t m) {
    for (int64_t o = 0; o < m; o++) {
        if (s->ints)
            s->iacc[o] = s->kind == K_PROD ? 1 : s->kind == K_MAX ? INT64_MIN
                         : s->kind == K_MIN ? INT64_MAX : 0;
        else
            s->acc[o] = s->kind == K_PROD ? 1.0 : s->kind == K_MAX ? -INFINITY
                        : s->kind == K_MIN ? INFINITY : 0.0;
    }
}

static void red_int(red_state *s, int64_t o, int64_t v) {
    int64_t *a = &s->iacc[o];
    switch (s->kind) {
    case K_MAX: if (v > *a) *a = v; break;
    case K_MIN: if (v < *a) *a = v; break;
    case K_PROD: *a = (int64_t)((uint64_t)*a * (uint64_t)v); break;
    case K_L1: {
        uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
        *a = (int64_t)((uint64_t)*a + mag);
        break;
    }
    case K_SSQ: *a = (int64_t)((uint64_t)*a + (uint64_t)v * (uint64_t)v); break;
    default: *a = (int64_t)((uint64_t)*a + (uint64_t)v); break;
    }
}

static void red_float(red_state *s, int64_t o, double v) {
    double *a = &s->acc[o];
    switch (s->kind) {
    case K_MAX: if (v > *a || v != v) *a = v; break;
    case K_MIN: if (v < *a || v != v) *a = v; break;
    case K_PROD: *a *= v; break;
    case K_L1: *a += fabs(v); break;
    case K_L2: case K_SSQ: *a += v * v; break;
    case K_LSE:
        if (isfinite(s->aux[o]))
            *a += exp(v - s->aux[o]);
        break;
    default: *a += v; break;
    }
}

/* Output offset of each input element: kept axes keep their stride in the output. */
static void reduce_strides(const af_tensor *x, const bool *red, int64_t *os) {
    int64_t s = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        os[i] = red[i] ? 0 : s;
        if (!red[i])
            s *= x->dims[i];
    }
}

af_status ref_reduce(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    (void)ex;
    TN_READY(n, out, 1, err);
    const af_tensor *x = in[0];
    bool red[AF_MAX_RANK], noop, known;
    af_status st = tn_reduce_axes(n, in, x, red, &noop, &known, err);
    if (st)
        return st;
    if (!known)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "axes unknown at run time");
    if (!tn_is_numeric(x->dtype) || x->dtype == AF_DTYPE_BOOL)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type %s",
                            af_dtype_name(x->dtype));
    int64_t total = af_tensor_numel(x), m = af_tensor_numel(out);
    if (noop) {
        if (total > 0)
            memcpy(out->data, x->data, (size_t)total * af_dtype_size(x->dtype));
        return AF_OK;
    }
    red_state s = {reduce_kind(n->op), int_path(reduce_kind(n->op), x->dtype), NULL, NULL, NULL};
    void *mem = af_calloc((size_t)m + 1, 2 * sizeof(double));
    if (!mem)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    s.acc = mem;
    s.iacc = mem;
    s.aux = (double *)mem + m + 1;
    int64_t os[AF_MAX_RANK], idx[AF_MAX_RANK];
    reduce_strides(x, red, os);
    if (s.kind == K_LSE) {
        red_state mx = {K_MAX, false, s.aux, NULL, NULL};
        red_init(&mx, m);
        memset(idx, 0, sizeof idx);
        for (int64_t i = 0; i < total; i++) {
            int64_t o = 0;
            for (int a = 0; a < x->rank; a++)
                o += idx[a] * os[a];
            red_float(&mx, o, af_tensor_get_double(x, i));
            tn_next(idx, x->dims, x->rank);
        }
    }
    red_init(&s, m);
    memset(idx, 0, sizeof idx);
    for (int64_t i = 0; i < total; i++) {
        int64_t o = 0;
        for (int a = 0; a < x->rank; a++)
            o += idx[a] * os[a];
        if (s.ints)
            red_int(&s, o, tn_geti(x, i));
        else
            red_float(&s, o, af_tensor_get_double(x, i));
        tn_next(idx, x->dims, x->rank);
    }
    int64_t cnt = m > 0 ? total / m : 0;
    for (int64_t o = 0; o < m; o++) {
        if (s.ints) {
            int64_t v = s.iacc[o];
            tn_seti(out, o, s.kind == K_MEAN ? (cnt ? v / cnt : 0) : v);
            continue;
        }
        double v = s.acc[o];
        switch (s.kind) {
        case K_MEAN: v /= (double)cnt; break;
        case K_L2: v = sqrt(v); break;
        case K_LOGSUM: v = log(v); break;
        case K_LSE: v = isfinite(s.aux[o]) ? s.aux[o] + log(v) : s.aux[o]; break;
        default: break;
        }
        tn_setd(out, o, v);
    }
    af_free(mem);
    return AF_OK;
}

/* ---- ArgMax / ArgMin ---------------------------------------------------------------------- */

af_status shape_arg(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "data", err);
    bool keep = af_attr_int(n, "keepdims", 1) != 0;
    if (x->rank < 0) {
        tn_unknown_rank(out, AF_DTYPE_INT64);
        return AF_OK;
    }
    int axis;
    if (!af_axis(af_attr_int(n, "axis", 0), x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    int64_t dims[AF_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != axis)
            dims[r++] = x->dims[i];
        else if (keep)
            dims[r++] = 1;
    }
    af_tensor_set_type(out, AF_DTYPE_INT64, r, dims);
    return AF_OK;
}

af_status ref_arg(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0];
    int axis;
    if (!af_axis(af_attr_int(n, "axis", 0), x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range");
    if (!tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type %s",
                            af_dtype_name(x->dtype));
    int64_t outer = tn_prod(x->dims, 0, axis), dim = x->dims[axis];
    int64_t inner = tn_prod(x->dims, axis + 1, x->rank);
    if (dim == 0 && outer * inner > 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "reduced axis is empty");
    /* want = sign of cmp(candidate, best) that replaces best; 0 too with select_last_index. */
    int want = n->op == AF_OP_ARGMIN ? -1 : 1;
    bool last = af_attr_int(n, "select_last_index", 0) != 0;
    int64_t *o = out->data;
    for (int64_t a = 0; a < outer; a++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = a * dim * inner + i, best = 0;
            for (int64_t j = 1; j < dim; j++) {
                int c = tn_cmp(x, base + j * inner, x, base + best * inner);
                if (c == want || (last && c == 0))
                    best = j;
            }
            o[a * inner + i] = best;
        }
    }
    return AF_OK;
}

/* ---- TopK --------------------------------------------------------------------------------- */

static af_status topk_params(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                             int *axis, int64_t *k, af_error *err) {
    if (!af_axis(af_attr_int(n, "axis", -1), x->rank, axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis out of range for rank %d",
                            x->rank);
    *k = -1;
    if (af_graph_opset(n->graph) < 10) {
        *k = af_attr_int(n, "k", -1);
    } else {
        const af_tensor *kt = tn_in(n, in, 1);
        if (!kt)
            return tn_missing(n, "K", err);
        if (!kt->data)
            return AF_OK;
        int cnt;
        int64_t v;
        if (!tn_ints(kt, &v, 1, &cnt) || cnt != 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "K must be one int64");
        *k = v;
    }
    if (*k < 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "K must be >= 0");
    if (x->dims[*axis] >= 0 && *k > x->dims[*axis])
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "K %lld above axis size %lld",
                            (long long)*k, (long long)x->dims[*axis]);
    return AF_OK;
}

af_status shape_topk(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x)
        return tn_missing(n, "X", err);
    if (n->nout != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "TopK has 2 outputs");
    if (x->rank < 0) {
        tn_unknown_rank(&out[0], x->dtype);
        tn_unknown_rank(&out[1], AF_DTYPE_INT64);
        return AF_OK;
    }
    int axis;
    int64_t k;
    af_status st = topk_params(n, in, x, &axis, &k, err);
    if (st)
        return st;
    af_tensor_type_copy(&out[0], x);
    out[0].dims[axis] = k;
    af_tensor_type_copy(&out[1], &out[0]);
    out[1].dtype = AF_DTYPE_INT64;
    return AF_OK;
}

typedef struct topk_ctx {
    const af_tensor *x;
    int64_t base, stride;
    int sign; /* -1: largest first */
} topk_ctx;

static int topk_cmp(void *p, int64_t a, int64_t b) {
    const topk_ctx *c = p;
    return c->sign * tn_cmp(c->x, c->base + a * c->stride, c->x, c->base + b * c->stride);
}

af_status ref_topk(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    TN_READY(n, out, n->nout, err);
    (void)ex;
    const af_tensor *x = in[0];
    int axis;
    int64_t k;
    size_t es;
    af_status st = topk_params(n, in, x, &axis, &k, err);
    if (!st)
        st = tn_esize(n, x, &es, err);
    if (st)
        return st;
    if (!tn_is_numeric(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    int64_t outer = tn_prod(x->dims, 0, axis), dim = x->dims[axis];
    int64_t inner = tn_prod(x->dims, axis + 1, x->rank);
    int64_t *buf = af_malloc(sizeof(int64_t) * (size_t)(2 * dim + 1));
    if (!buf)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    /* A stable sort on value alone keeps equal values in index order. */
    topk_ctx c = {x, 0, inner, af_attr_int(n, "largest", 1) ? -1 : 1};
    int64_t *ind = out[1].data;
    for (int64_t a = 0; a < outer; a++) {
        for (int64_t i = 0; i < inner; i++) {
            c.base = a * dim * inner + i;
            for (int64_t j = 0; j < dim; j++)
                buf[j] = j;
            tn_sort(buf, dim, buf + dim, topk_cmp, &c);
            for (int64_t j = 0; j < k; j++) {
                int64_t o = (a * k + j) * inner + i;
                memcpy((char *)out[0].data + (size_t)o * es,
                       (const char *)x->data + (size_t)(c.base + buf[j] * inner) * es, es);
                ind[o] = buf[j];
            }
        }
    }
    af_free(buf);
    return AF_OK;
}

/* ---- CumSum ------------------------------------------------------------------------------- */

af_status shape_cumsum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const af_tensor *x = tn_in(n, in, 0);
    if (!x || !tn_in(n, in, 1))
        return tn_missing(n, "x/axis", err);
    af_tensor_type_copy(out, x);
    return AF_OK;
}

af_status ref_cumsum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *ex, af_error *err) {
    TN_READY(n, out, 1, err);
    (void)ex;
    const af_tensor *x = in[0], *at = in[1];
    int64_t av;
    int cnt, axis;
    if (!tn_ints(at, &av, 1, &cnt) || cnt != 1)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "axis must be one int32/int64");
    if (!af_axis(av, x->rank, &axis))
        return af_node_fail(err, n, AF_ERR_RUNTIME, "axis %lld out of range", (long long)av);
    if (!tn_is_numeric(x->dtype) || x->dtype == AF_DTYPE_BOOL)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported type");
    bool excl = af_attr_int(n, "exclusive", 0) != 0, rev = af_attr_int(n, "reverse", 0) != 0;
    bool fl = tn_is_float(x->dtype);
    int64_t outer = tn_prod(x->dims, 0, axis), dim = x->dims[axis];
    int64_t inner = tn_prod(x->dims, axis + 1, x->rank);
    for (int64_t a = 0; a < outer; a++) {
        for (int64_t i = 0; i < inner; i++) {
            double dacc = 0;
            uint64_t iacc = 0;
            for (int64_t s = 0; s < dim; s++) {
                int64_t j = rev ? dim - 1 - s : s, e = (a * dim + j) * inner + i;
                if (excl) {
                    if (fl)
                        tn_setd(out, e, dacc);
                    else
                        tn_seti(out, e, (int64_t)iacc);
                }
                if (fl)
                    dacc += af_tensor_get_double(x, e);
                else
                    iacc += (uint64_t)tn_geti(x, e);
                if (!excl) {
                    if (fl)
                        tn_setd(out, e, dacc);
                    else
                        tn_seti(out, e, (int64_t)iacc);
                }
            }
        }
    }
    return AF_OK;
}
