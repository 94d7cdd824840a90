/* Helpers every kernel file shares: axes, broadcasting and strides. */
#include "kernels/kernel.h"

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
