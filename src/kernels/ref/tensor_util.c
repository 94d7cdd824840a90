/* Helpers of the tn_ kernel group: typed element access, index-input readers, strided copies.
 *
 * Invariant: every conversion is defined for every input bit pattern (saturating casts, NaN
 * handled), so hostile tensor contents can give wrong numbers but never undefined behaviour. */
#include "kernels/ref/tensor_util.h"

#include <stdlib.h>

const af_tensor *tn_in(const af_node *n, const af_tensor *const *in, int i) {
    if (i < 0 || i >= n->nin || !in)
        return NULL;
    return in[i];
}

bool tn_is_float(af_dtype dt) {
    return dt == AF_DTYPE_FLOAT || dt == AF_DTYPE_DOUBLE || dt == AF_DTYPE_FLOAT16 ||
           dt == AF_DTYPE_BFLOAT16;
}

bool tn_is_numeric(af_dtype dt) {
    switch (dt) {
    case AF_DTYPE_FLOAT: case AF_DTYPE_DOUBLE: case AF_DTYPE_FLOAT16: case AF_DTYPE_BFLOAT16:
    case AF_DTYPE_UINT8: case AF_DTYPE_INT8: case AF_DTYPE_UINT16: case AF_DTYPE_INT16:
    case AF_DTYPE_INT32: case AF_DTYPE_INT64: case AF_DTYPE_UINT32: case AF_DTYPE_UINT64:
    case AF_DTYPE_BOOL:
        return true;
    default:
        return false;
    }
}

/* double -> int64 without undefined behaviour: NaN is 0, out-of-range values saturate. */
af_status tn_missing(const af_node *n, const char *what, af_error *err) {
    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input '%s'", what);
}

void tn_unknown_rank(af_tensor *out, af_dtype dt) {
    out->dtype = dt;
    out->rank = -1;
}

int64_t tn_prod(const int64_t *dims, int lo, int hi) {
    int64_t p = 1;
    for (int i = lo; i < hi; i++)
        if (dims[i] < 0 || !af_mul_i64(p, dims[i], &p))
            return -1;
    return p;
}

bool tn_is_index_type(af_dtype dt) {
    return dt == AF_DTYPE_INT64 || dt == AF_DTYPE_INT32;
}

bool tn_index(const af_tensor *ix, int64_t k, int64_t dim, int64_t *out) {
    int64_t j = tn_geti(ix, k);
    if (j < 0)
        j += dim;
    *out = j;
    return j >= 0 && j < dim;
}

af_status tn_bad_index(const af_node *n, const af_tensor *ix, int64_t k, int64_t dim,
                       af_error *err) {
    return af_node_fail(err, n, AF_ERR_RUNTIME, "index %lld out of range [-%lld, %lld)",
                        (long long)tn_geti(ix, k), (long long)dim, (long long)dim);
}

static int64_t d2i(double v) {
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

static uint64_t d2u(double v) {
    if (v != v || v <= 0)
        return 0;
    if (v >= 18446744073709551615.0)
        return UINT64_MAX;
    return (uint64_t)v;
}

static int64_t clampi(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

int64_t tn_geti(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    case AF_DTYPE_INT8: return ((const int8_t *)p)[i];
    case AF_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case AF_DTYPE_INT16: return ((const int16_t *)p)[i];
    case AF_DTYPE_INT32: return ((const int32_t *)p)[i];
    case AF_DTYPE_INT64: return ((const int64_t *)p)[i];
    case AF_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case AF_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i]; /* two's complement wrap */
    default: return d2i(af_tensor_get_double(t, i));
    }
}

void tn_setd(af_tensor *t, int64_t i, double v) {
    void *p = t->data;
    double r = nearbyint(v);
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)p)[i] = v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)p)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = af_float_to_bf16((float)v); break;
    case AF_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case AF_DTYPE_UINT64: ((uint64_t *)p)[i] = d2u(r); break;
    default: tn_seti(t, i, d2i(r)); break;
    }
}

void tn_seti(af_tensor *t, int64_t i, int64_t v) {
    void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)clampi(v, 0, UINT8_MAX); break;
    case AF_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case AF_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)clampi(v, INT8_MIN, INT8_MAX); break;
    case AF_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)clampi(v, 0, UINT16_MAX); break;
    case AF_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)clampi(v, INT16_MIN, INT16_MAX); break;
    case AF_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)clampi(v, INT32_MIN, INT32_MAX); break;
    case AF_DTYPE_INT64: ((int64_t *)p)[i] = v; break;
    case AF_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)clampi(v, 0, UINT32_MAX); break;
    case AF_DTYPE_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    default: tn_setd(t, i, (double)v); break;
    }
}

static int cmpd(double a, double b) {
    bool na = a != a, nb = b != b;
    if (na || nb)
        return na - nb;
    return (a > b) - (a < b);
}

int tn_cmp(const af_tensor *a, int64_t i, const af_tensor *b, int64_t j) {
    if (tn_is_float(a->dtype))
        return cmpd(af_tensor_get_double(a, i), af_tensor_get_double(b, j));
    if (a->dtype == AF_DTYPE_UINT64) {
        uint64_t x = ((const uint64_t *)a->data)[i], y = ((const uint64_t *)b->data)[j];
        return (x > y) - (x < y);
    }
    int64_t x = tn_geti(a, i), y = tn_geti(b, j);
    return (x > y) - (x < y);
}

bool tn_ints(const af_tensor *t, int64_t *v, int max, int *cnt) {
    if (!t || !t->data || t->rank > 1 || !af_tensor_known(t))
        return false;
    if (t->dtype != AF_DTYPE_INT64 && t->dtype != AF_DTYPE_INT32)
        return false;
    int64_t n = af_tensor_numel(t);
    if (n < 0 || n > max)
        return false;
    for (int64_t i = 0; i < n; i++)
        v[i] = tn_geti(t, i);
    *cnt = (int)n;
    return true;
}

af_status tn_esize(const af_node *n, const af_tensor *t, size_t *es, af_error *err) {
    *es = af_dtype_size(t->dtype);
    if (*es == 0)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "unsupported element type %s",
                            af_dtype_name(t->dtype));
    return AF_OK;
}

af_status tn_ready(const af_node *n, const af_tensor *out, int nout, af_error *err) {
    for (int i = 0; i < nout; i++)
        if (!out[i].data && (i == 0 || n->out == NULL || n->out[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "output %d: shape not inferable from the inputs", i);
    return AF_OK;
}

af_status tn_out_alloc(const af_node *n, af_tensor *out, af_dtype dt, int rank,
                       const int64_t *dims, af_error *err) {
    if (out->data) {
        bool same = out->dtype == dt && out->rank == rank;
        for (int i = 0; same && i < rank; i++)
            same = out->dims[i] == dims[i];
        if (same)
            return AF_OK;
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output buffer has the wrong shape");
    }
    af_tensor_set_type(out, dt, rank, dims);
    return af_tensor_alloc(out, err);
}

bool tn_next(int64_t *idx, const int64_t *dims, int rank) {
    for (int a = rank - 1; a >= 0; a--) {
        if (++idx[a] < dims[a])
            return true;
        idx[a] = 0;
    }
    return false;
}

static void copy_elem(char *dst, const char *src, size_t es) {
    switch (es) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, es); break;
    }
}

void tn_copy_strided(void *dst, const void *src, int64_t off, int rank, const int64_t *dims,
                     const int64_t *strides, size_t es) {
    AF_ASSERT(rank >= 0 && rank <= TN_MAX_VIEW);
    for (int a = 0; a < rank; a++)
        if (dims[a] == 0)
            return;
    char *d = dst;
    const char *s = src;
    if (rank == 0) {
        copy_elem(d, s + off * (int64_t)es, es);
        return;
    }
    int64_t idx[TN_MAX_VIEW] = {0};
    int last = rank - 1;
    int64_t n = dims[last], st = strides[last];
    for (;;) {
        int64_t o = off;
        for (int a = 0; a < last; a++)
            o += idx[a] * strides[a];
        if (st == 1) {
            memcpy(d, s + o * (int64_t)es, (size_t)n * es);
            d += (size_t)n * es;
        } else {
            for (int64_t k = 0; k < n; k++, d += es)
                copy_elem(d, s + (o + k * st) * (int64_t)es, es);
        }
        if (!tn_next(idx, dims, last))
            return;
    }
}

af_status tn_axes(const af_node *n, const af_tensor *t, bool from_input, const char *name,
                  int rank, int *axes, int *naxes, bool *given, bool *known, af_error *err) {
    int64_t v[AF_MAX_RANK + 1];
    int cnt = 0;
    *naxes = 0;
    *given = false;
    *known = true;
    if (from_input) {
        if (!t)
            return AF_OK;
        *given = true;
        if (!t->data) {
            *known = false;
            return AF_OK;
        }
        if (!tn_ints(t, v, AF_MAX_RANK + 1, &cnt))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "axes must be a 1-D int64 tensor of at most %d values",
                                AF_MAX_RANK);
    } else {
        const int64_t *a = NULL;
        int c = af_attr_ints(n, name, &a);
        if (c < 0)
            return AF_OK;
        *given = true;
        if (c > AF_MAX_RANK)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "too many axes (%d)", c);
        for (int i = 0; i < c; i++)
            v[i] = a[i];
        cnt = c;
    }
    if (rank < 0) {
        *known = false;
        *naxes = cnt;
        return AF_OK;
    }
    if (cnt > rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%d axes for a rank-%d tensor", cnt,
                            rank);
    for (int i = 0; i < cnt; i++) {
        if (!af_axis(v[i], rank, &axes[i]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis %lld out of range for rank %d",
                                (long long)v[i], rank);
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i])
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis %lld repeated",
                                    (long long)v[i]);
    }
    *naxes = cnt;
    return AF_OK;
}

void tn_sort(int64_t *v, int64_t n, int64_t *tmp, int (*cmp)(void *ctx, int64_t a, int64_t b),
             void *ctx) {
    /* Bottom-up: merge runs of width 1, 2, 4... alternating between v and tmp. */
    int64_t *src = v, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = cmp(ctx, src[j], src[i]) < 0 ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v)
        memcpy(v, src, sizeof(int64_t) * (size_t)n);
}
