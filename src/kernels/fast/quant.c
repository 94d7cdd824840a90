/* Fast linear quantization: QuantizeLinear and DequantizeLinear (float32 <-> int8 / uint8, per
 * tensor or per axis) and DynamicQuantizeLinear, the bits of the reference kernels (ref/quant.c).
 *
 * Quantize divides in float32 as the reference does, rounds half to even by the 1.5 * 2^23
 * trick (exact below 2^22; the quotient is clamped there first, which changes nothing once
 * saturated) and saturates with NaN going to the bottom as nn_clamp sends it. Dequantize
 * multiplies (x - zero point), an exact small integer, by the scale in float32: one rounding of
 * the exact product, as the reference's double product rounded to float.
 *
 * Built with -fno-trapping-math (CMakeLists.txt), so that the compare-and-select loops
 * vectorize: nothing here reads floating-point exception flags.
 *
 * Invariant: anything but float32 scales, float32 data on the float side and 8-bit data on the
 * other (int32 dequantization, other float types) is AF_DECLINED before anything is written. */
#include "kernels/fast/fast.h"

#include <math.h>
#include <string.h>

static bool q8(af_dtype t) {
    return t == AF_DTYPE_UINT8 || t == AF_DTYPE_INT8;
}

/* t holds its elements of type dt (count may be 0). */
static bool holds(const af_tensor *t, af_dtype dt) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && t->dtype == dt && (count == 0 || t->data) &&
           (uint64_t)count <= (uint64_t)t->nbytes / af_dtype_size(dt);
}

/* A quantization's parameters over x: one (scale, zero point) per tensor, or one per slice of
 * `axis` (len values, each applying to `inner` consecutive elements). */
typedef struct qparams {
    const float *scale;
    const void *zp; /* NULL: 0 */
    af_dtype qt;    /* the 8-bit type */
    int64_t outer, len, inner;
} qparams;

static bool qparams_of(const af_node *n, const af_tensor *x, const af_tensor *s,
                       const af_tensor *zp, af_dtype qt, qparams *p) {
    int64_t sn = s ? af_tensor_numel(s) : -1, total = af_tensor_numel(x);
    if (!holds(s, AF_DTYPE_FLOAT) || sn < 1 || s->rank > 1 || total < 0 || !q8(qt) ||
        (zp && (!holds(zp, qt) || af_tensor_numel(zp) != sn)))
        return false;
    *p = (qparams){s->data, zp ? zp->data : NULL, qt, 1, 1, total};
    if (s->rank == 0 || sn == 1) return true;
    int axis;
    if (!af_axis(af_attr_int(n, "axis", 1), x->rank, &axis) || x->dims[axis] != sn) return false;
    p->len = sn;
    p->inner = 1;
    for (int d = axis + 1; d < x->rank; d++) p->inner *= x->dims[d];
    p->outer = p->inner && sn ? total / (p->inner * sn) : 0;
    return true;
}

static float zp_at(const qparams *p, int64_t k) {
    if (!p->zp) return 0.0f;
    return p->qt == AF_DTYPE_UINT8 ? (float)((const uint8_t *)p->zp)[k]
                                   : (float)((const int8_t *)p->zp)[k];
}

/* round half to even of v, |v| <= 2^22 */
static inline float round_even(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: the sum's last bit is the units */
    return (v + magic) - magic;
}

/* x[0..count) / scale, rounded, + zp, saturated into y: branch-free, one loop per type so
 * that it vectorizes. Clamping the quotient to +-2^22 first keeps the rounding trick exact and
 * sends NaN to the bottom (as nn_clamp does: every comparison with NaN is false). */
#define QUANTIZE_LOOP(T, LO, HI)                                                              \
    for (int64_t i = 0; i < count; i++) {                                                    \
        float v = x[i] / scale;                                                               \
        v = v > -4194304.0f ? v : -4194304.0f; /* NaN too */                                 \
        v = v < 4194304.0f ? v : 4194304.0f;                                                  \
        v = round_even(v) + zp;                                                               \
        v = v < (HI) ? v : (HI);                                                              \
        v = v > (LO) ? v : (LO);                                                              \
        ((T *)y)[i] = (T)(int)v;                                                              \
    }

static void quantize_run(const float *x, int64_t count, float scale, float zp, af_dtype qt,
                         void *y) {
    if (qt == AF_DTYPE_UINT8) QUANTIZE_LOOP(uint8_t, 0.0f, 255.0f)
    else QUANTIZE_LOOP(int8_t, -128.0f, 127.0f)
}

static void dequantize_run(const void *x, af_dtype qt, int64_t count, float scale, float zp,
                           float *y) {
    if (qt == AF_DTYPE_UINT8)
        for (int64_t i = 0; i < count; i++) y[i] = ((float)((const uint8_t *)x)[i] - zp) * scale;
    else
        for (int64_t i = 0; i < count; i++) y[i] = ((float)((const int8_t *)x)[i] - zp) * scale;
}

/* Items are slices of `inner` elements, (outer, len) in order; a long per-tensor run is cut
 * into pieces of CHUNK. */
enum { CHUNK = 16384 };

typedef struct qjob {
    const qparams *p;
    const void *x;
    void *y;
    bool quantize;
    int64_t piece, pieces; /* elements per item, items per slice */
} qjob;

static void q_range(void *ctx, int slot, int64_t b, int64_t e) {
    (void)slot;
    const qjob *j = ctx;
    const qparams *p = j->p;
    for (int64_t it = b; it < e; it++) {
        int64_t slice = it / j->pieces, part = it % j->pieces, k = slice % p->len;
        int64_t start = slice * p->inner + part * j->piece;
        int64_t count = p->inner - part * j->piece < j->piece ? p->inner - part * j->piece : j->piece;
        if (j->quantize)
            quantize_run((const float *)j->x + start, count, p->scale[k], zp_at(p, k), p->qt,
                         (char *)j->y + start);
        else
            dequantize_run((const char *)j->x + start, p->qt, count, p->scale[k], zp_at(p, k),
                           (float *)j->y + start);
    }
}

static af_status q_parallel(af_exec *ex, const qparams *p, const void *x, void *y, bool quantize) {
    int64_t piece = p->inner < CHUNK ? (p->inner ? p->inner : 1) : CHUNK;
    qjob j = {p, x, y, quantize, piece, p->inner ? (p->inner + piece - 1) / piece : 0};
    int64_t total = p->outer * p->len * p->inner;
    af_exec_parallel(ex, p->outer * p->len * j.pieces, af_exec_work_ns(ex, 4.0 * (double)total, 5.0 * (double)total),
                     q_range, &j);
    return AF_OK;
}

AF_FAST_KERNEL(fast_quantize) {
    (void)err;
    const af_tensor *xt = in[0], *s = n->nin > 1 ? in[1] : NULL, *zp = n->nin > 2 ? in[2] : NULL;
    af_dtype qt = zp ? zp->dtype : AF_DTYPE_UINT8;
    qparams p;
    if (!holds(xt, AF_DTYPE_FLOAT) || !qparams_of(n, xt, s, zp, qt, &p) || !holds(&out[0], qt) ||
        af_tensor_numel(&out[0]) != af_tensor_numel(xt))
        return AF_DECLINED;
    return q_parallel(x, &p, xt->data, out[0].data, true);
}

AF_FAST_KERNEL(fast_dequantize) {
    (void)err;
    const af_tensor *xt = in[0], *s = n->nin > 1 ? in[1] : NULL, *zp = n->nin > 2 ? in[2] : NULL;
    qparams p;
    if (!xt || !q8(xt->dtype) || !holds(xt, xt->dtype) || !qparams_of(n, xt, s, zp, xt->dtype, &p) ||
        !holds(&out[0], AF_DTYPE_FLOAT) || af_tensor_numel(&out[0]) != af_tensor_numel(xt))
        return AF_DECLINED;
    return q_parallel(x, &p, xt->data, out[0].data, false);
}

/* DynamicQuantizeLinear: the range in parallel (per slot, then combined), then the uint8 data
 * as a per-tensor QuantizeLinear with the reference's scale and zero point. */
typedef struct range_job {
    const float *x;
    int64_t total;
    float lo[AF_EXEC_MAX_SLOTS], hi[AF_EXEC_MAX_SLOTS];
} range_job;

/* lo, hi of x[0..count) and *lo, *hi. A NaN never wins a comparison, as in the reference;
 * min and max are otherwise order-free (equal zeros of either sign give the same scale and zero
 * point), so four lanes of four run apart and meet at the end. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static v4f pick(v4i m, v4f a, v4f b) { /* m ? a : b, lane by lane */
    return (v4f)(((v4i)a & m) | ((v4i)b & ~m));
}

static void range_of(const float *x, int64_t count, float *lo, float *hi) {
    float l = *lo, h = *hi;
    int64_t i = 0;
    if (count >= 16) {
        v4f vl[4], vh[4];
        for (int k = 0; k < 4; k++) vl[k] = (v4f){l, l, l, l}, vh[k] = (v4f){h, h, h, h};
        for (; i + 16 <= count; i += 16)
            for (int k = 0; k < 4; k++) {
                v4f v;
                memcpy(&v, x + i + 4 * k, sizeof v);
                vl[k] = pick(v < vl[k], v, vl[k]);
                vh[k] = pick(v > vh[k], v, vh[k]);
            }
        for (int k = 0; k < 4; k++)
            for (int e = 0; e < 4; e++) {
                l = vl[k][e] < l ? vl[k][e] : l;
                h = vh[k][e] > h ? vh[k][e] : h;
            }
    }
    for (; i < count; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    *lo = l, *hi = h;
}

static void range_part(void *ctx, int slot, int64_t b, int64_t e) {
    range_job *j = ctx;
    int64_t end = e * CHUNK < j->total ? e * CHUNK : j->total;
    range_of(j->x + b * CHUNK, end - b * CHUNK, &j->lo[slot], &j->hi[slot]);
}

AF_FAST_KERNEL(fast_dyn_quantize) {
    (void)err;
    const af_tensor *xt = in[0];
    af_tensor *ys = n->nout > 1 ? &out[1] : NULL, *yz = n->nout > 2 ? &out[2] : NULL;
    int64_t total = xt ? af_tensor_numel(xt) : -1;
    if (!holds(xt, AF_DTYPE_FLOAT) || total < 1 || !holds(&out[0], AF_DTYPE_UINT8) ||
        af_tensor_numel(&out[0]) != total || (ys && !holds(ys, AF_DTYPE_FLOAT)) ||
        (yz && !holds(yz, AF_DTYPE_UINT8)) || (ys && af_tensor_numel(ys) != 1) ||
        (yz && af_tensor_numel(yz) != 1))
        return AF_DECLINED;
    range_job r = {.x = xt->data, .total = total}; /* lo, hi start at 0: the range holds 0 */
    af_exec_parallel(x, (total + CHUNK - 1) / CHUNK, af_exec_work_ns(x, 2.0 * (double)total, 4.0 * (double)total),
                     range_part, &r);
    float lo = 0.0f, hi = 0.0f;
    for (int s = 0; s < AF_EXEC_MAX_SLOTS; s++) {
        lo = r.lo[s] < lo ? r.lo[s] : lo;
        hi = r.hi[s] > hi ? r.hi[s] : hi;
    }
    float scale = (hi - lo) / 255.0f;
    if (scale == 0.0f) scale = 1.0f; /* all zeros: as the reference */
    float zp = nearbyintf(-lo / scale);
    zp = !(zp >= 0.0f) ? 0.0f : zp > 255.0f ? 255.0f : zp;
    uint8_t zp8 = (uint8_t)zp;
    qparams p = {&scale, &zp8, AF_DTYPE_UINT8, 1, 1, total};
    q_parallel(x, &p, xt->data, out[0].data, true);
    if (ys) ((float *)ys->data)[0] = scale;
    if (yz) ((uint8_t *)yz->data)[0] = zp8;
    return AF_OK;
}
