/* Tensors: sizes, allocation and element access. A tensor with data == NULL describes a type;
 * owns_data says whether data is freed with the tensor (it is not when it points into a mapped
 * model file).
 *
 * Invariant: element access reads only inside data; callers have checked the index against the
 * dims (af_tensor_has_data). */
#include "ir/ir.h"

#include <string.h>

size_t af_dtype_size(af_dtype t) {
    switch (t) {
    case AF_DTYPE_BOOL: case AF_DTYPE_UINT8: case AF_DTYPE_INT8: return 1;
    case AF_DTYPE_UINT16: case AF_DTYPE_INT16: case AF_DTYPE_FLOAT16: case AF_DTYPE_BFLOAT16: return 2;
    case AF_DTYPE_FLOAT: case AF_DTYPE_INT32: case AF_DTYPE_UINT32: return 4;
    case AF_DTYPE_INT64: case AF_DTYPE_UINT64: case AF_DTYPE_DOUBLE: case AF_DTYPE_COMPLEX64: return 8;
    case AF_DTYPE_COMPLEX128: return 16;
    default: return 0;
    }
}

const char *af_dtype_name(af_dtype t) {
    static const char *names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16",
                                  "int32", "int64", "string", "bool", "float16", "double",
                                  "uint32", "uint64", "complex64", "complex128", "bfloat16"};
    return (unsigned)t < AF_COUNT(names) ? names[t] : "unknown";
}

int64_t af_tensor_numel(const af_tensor *t) {
    if (t->rank < 0 || t->rank > AF_MAX_RANK) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 0 || !af_mul_i64(n, t->dims[i], &n)) return -1;
    return n;
}

af_status af_tensor_alloc(af_tensor *t, af_error *err) {
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), bytes;
    if (n < 0 || es == 0)
        return af_fail(err, AF_ERR_INVALID_ARG, "cannot allocate a %s tensor of shape with unknown or overflowing dims",
                       af_dtype_name(t->dtype));
    if (!af_mul_size((size_t)n, es, &bytes) || bytes > ((size_t)1 << 40))
        return af_fail(err, AF_ERR_NOMEM, "tensor of %lld elements is too large", (long long)n);
    t->data = af_buffer_alloc(bytes); /* a valid pointer for empty tensors too */
    if (!t->data) return af_fail(err, AF_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
    t->nbytes = bytes;
    t->owns_data = 1;
    return AF_OK;
}

void af_tensor_release(af_tensor *t) {
    if (t->owns_data) af_buffer_free(t->data);
    t->data = NULL;
    t->nbytes = 0;
    t->owns_data = 0;
}

af_status af_tensor_copy(af_tensor *dst, const af_tensor *src, af_error *err) {
    dst->dtype = src->dtype;
    dst->rank = src->rank;
    memcpy(dst->dims, src->dims, sizeof dst->dims);
    af_status st = af_tensor_alloc(dst, err);
    if (st) return st;
    if (src->data && dst->nbytes) memcpy(dst->data, src->data, dst->nbytes);
    return AF_OK;
}

af_tensor *af_tensor_new(af_dtype dtype, int rank, const int64_t *dims) {
    if (rank < 0 || rank > AF_MAX_RANK || (rank && !dims)) return NULL;
    af_tensor *t = af_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    if (af_tensor_alloc(t, NULL)) {
        af_free(t);
        return NULL;
    }
    return t;
}

void af_tensor_free(af_tensor *t) {
    if (!t) return;
    af_tensor_release(t);
    af_free(t);
}

int64_t af_tensor_get_int(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_INT64: return ((const int64_t *)p)[i];
    case AF_DTYPE_INT32: return ((const int32_t *)p)[i];
    case AF_DTYPE_INT16: return ((const int16_t *)p)[i];
    case AF_DTYPE_INT8: return ((const int8_t *)p)[i];
    case AF_DTYPE_UINT8: case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    case AF_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case AF_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case AF_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i];
    case AF_DTYPE_FLOAT: case AF_DTYPE_DOUBLE: case AF_DTYPE_FLOAT16: case AF_DTYPE_BFLOAT16: {
        double d = af_tensor_get_double(t, i);
        if (!(d >= -9.2e18 && d <= 9.2e18)) return d > 0 ? INT64_MAX : INT64_MIN;
        return (int64_t)d;
    }
    default: return 0;
    }
}

const char *af_dims_str(const af_tensor *t, char *buf, size_t len) {
    size_t o = 0;
    if (t->rank < 0) {
        snprintf(buf, len, "[?]");
        return buf;
    }
    o += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->rank && o < len; i++)
        o += t->dims[i] < 0 ? (size_t)snprintf(buf + o, len - o, i ? ",?" : "?")
                            : (size_t)snprintf(buf + o, len - o, i ? ",%lld" : "%lld",
                                               (long long)t->dims[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- axes, broadcasting, strides ------------------------------------------------------------ */

bool af_axis(int64_t axis, int rank, int *out) {
    if (axis < -(int64_t)rank || axis >= rank) return false;
    *out = (int)(axis < 0 ? axis + rank : axis);
    return true;
}

bool af_broadcast_dims(const af_tensor *a, const af_tensor *b, af_tensor *out) {
    if (a->rank < 0 || b->rank < 0) {
        out->rank = -1;
        return true;
    }
    int r = a->rank > b->rank ? a->rank : b->rank;
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1, d;
        if (da == db) d = da;
        else if (da == 1) d = db;
        else if (db == 1) d = da;
        else if (da < 0 || db < 0) d = da < 0 ? (db >= 0 && db != 1 ? db : -1) : da;
        else return false;
        out->dims[i] = d;
    }
    return true;
}

void af_strides(const af_tensor *t, int64_t *strides) {
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

void af_broadcast_strides(const af_tensor *t, const af_tensor *to, int64_t *strides) {
    int64_t own[AF_MAX_RANK];
    af_strides(t, own);
    for (int i = 0; i < to->rank; i++) {
        int it = i - (to->rank - t->rank);
        strides[i] = it < 0 || (t->dims[it] == 1 && to->dims[i] != 1) ? 0 : own[it];
    }
}

void af_tensor_type_copy(af_tensor *dst, const af_tensor *src) {
    dst->dtype = src->dtype;
    dst->rank = src->rank;
    memcpy(dst->dims, src->dims, sizeof dst->dims);
}

void af_tensor_set_type(af_tensor *t, af_dtype dtype, int rank, const int64_t *dims) {
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank && i < AF_MAX_RANK; i++) t->dims[i] = dims ? dims[i] : -1;
}

bool af_tensor_to_ints(const af_tensor *t, int64_t *v, int max, int *n) {
    if (!t || !t->data || t->rank > 1) return false;
    if (t->dtype != AF_DTYPE_INT64 && t->dtype != AF_DTYPE_INT32) return false;
    int64_t cnt = af_tensor_numel(t);
    if (cnt < 0 || cnt > max) return false;
    for (int64_t i = 0; i < cnt; i++) v[i] = af_tensor_get_int(t, i);
    *n = (int)cnt;
    return true;
}

bool af_same_shape(const af_tensor *a, const af_tensor *b) {
    if (a->rank < 0 || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] == AF_DIM_UNKNOWN || a->dims[i] != b->dims[i]) return false;
    return true;
}

bool af_tensor_known(const af_tensor *t) {
    if (!t || t->rank < 0) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 0) return false;
    return true;
}

bool af_tensor_has_data(const af_tensor *t) {
    int64_t numel = t ? af_tensor_numel(t) : -1;
    size_t need;
    if (numel < 0 || !af_mul_size((size_t)numel, af_dtype_size(t->dtype), &need)) return false;
    return need == 0 || (t->data != NULL && t->nbytes >= need);
}
