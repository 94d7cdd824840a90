/* The vector kernels, written once with GCC vector extensions and compiled once per ISA (see
 * vec.h): vec_avx512.c, vec_avx2.c and vec_generic.c define VW (floats per vector), VEC_MR (rows
 * of the largest micro-kernel), VEC_NAME and VEC_TABLE, then include this file. Each such file
 * is compiled with its ISA's flags only (CMakeLists.txt), so nothing here runs on a CPU that
 * lacks the instructions: cpu.c picks the table.
 *
 * Invariant: loads and stores touch only [p, p + n) of the ranges the caller passes; partial
 * vectors go through a zero-padded local copy, so every lane of a tail computes exactly what a
 * full vector would. */
#include "kernels/ref/epilogue.h"
#include "kernels/simd/vec.h"
#include "util/util.h"

#include <math.h>
#include <string.h>

typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));

#include "kernels/simd/vmath.h"

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, vf v) {
    memcpy(p, &v, sizeof v);
}

static inline vf vsplat(float s) {
    return (vf){0} + s;
}

/* The first n (< VW) floats of p, the other lanes 0; and the store of the first n lanes. With
 * AVX-512 and AVX2 these are masked moves (no byte outside [p, p + n) is touched, faults
 * included); elsewhere a copy through a local vector. */
#if defined(__AVX512F__) && VW == 16
#include <immintrin.h>
static inline vf vload_part(const float *p, int64_t n) {
    __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
    vf r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static inline void vstore_part(float *p, vf v, int64_t n) {
    __m512 x;
    memcpy(&x, &v, sizeof x);
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), x);
}
#elif defined(__AVX2__) && VW == 8
#include <immintrin.h>
static inline __m256i part_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline vf vload_part(const float *p, int64_t n) {
    __m256 v = _mm256_maskload_ps(p, part_mask(n));
    vf r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static inline void vstore_part(float *p, vf v, int64_t n) {
    __m256 x;
    memcpy(&x, &v, sizeof x);
    _mm256_maskstore_ps(p, part_mask(n), x);
}
#else
static inline vf vload_part(const float *p, int64_t n) {
    float t[VW] = {0};
    memcpy(t, p, (size_t)n * sizeof(float));
    return vload(t);
}

static inline void vstore_part(float *p, vf v, int64_t n) {
    float t[VW];
    vstore(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
}
#endif

/* ---- elementwise functions ---------------------------------------------------------------------- */

static inline vf vclamp01(vf x) {
    return vm_min(vm_max(x, vsplat(0.0f)), vsplat(1.0f));
}

/* x rounded half to even: x + 2^23 (with x's sign) has no fraction bits left, so the FPU's
 * rounding is the result; from |x| = 2^23 on every float is an integer (and NaN, inf stay). */
static inline vf vround_even(vf x) {
    vf m = vm_copysign(vsplat(8388608.0f), x);
    return vm_select(vm_abs(x) < 8388608.0f, (x + m) - m, x);
}

/* GELU's tanh form as an op of its own: un_rows picks the form once, outside its loops (with
 * the choice inside, gcc kept it in the loop and, out of registers, reloaded the constants every
 * vector: erf GELU took 43 TSC cycles per 16 floats, 89 instructions a vector). */
enum { UN_GELU_TANH = 99 };

/* f(x) for an epilogue activation (af_ep_op) or an af_vun_op. Comparisons are written so that
 * NaN goes where the reference kernels send it (Relu(NaN) = NaN, as `x < 0 ? 0 : x`: that is
 * vm_max(0, x), x second, one maxps; -0 stays -0 both ways). */
static inline __attribute__((always_inline)) vf un_apply(int op, vf x, float p0, float p1) {
    switch (op) {
    case AF_EP_RELU: return vm_max(vsplat(0.0f), x);
    case AF_EP_CLIP: /* x < lo ? lo : x, then > hi ? hi: with min > max the result is max */
        return vm_min(vsplat(p1), vm_max(vsplat(p0), x));
    case AF_EP_LEAKY_RELU: return vm_select(x < 0.0f, x * p0, x);
    case AF_EP_SIGMOID: return vm_sigmoid(x);
    case AF_EP_HARD_SIGMOID: return vclamp01(x * p0 + p1);
    case AF_EP_HARD_SWISH: return x * vclamp01(x * (1.0f / 6.0f) + 0.5f);
    case AF_EP_SILU: return vm_silu(x);
    case AF_EP_GELU: return vm_gelu_erf(x); /* p0 = 0; 1 is UN_GELU_TANH */
    case UN_GELU_TANH: return vm_gelu_tanh(x);
    case AF_EP_TANH: return vm_tanh(x);
    case AF_EP_ELU: return vm_select(x < 0.0f, vm_expm1(x) * p0, x);
    case AF_EP_FAKE_QUANT: /* af_fake_quant: the bounds -z, 255 - z are integers, so clamping
                            * before the rounding is the same as clamping after it */
        return vm_rint(vm_min(vsplat(255.0f - p1), vm_max(vsplat(-p1), x / p0))) * p0;
    case AF_VUN_EXP: return vm_exp(x);
    case AF_VUN_ERF: return vm_erf(x);
    case AF_VUN_RECIPROCAL: return vsplat(1.0f) / x;
    case AF_VUN_NEG: return -x;
    case AF_VUN_ABS: return vm_abs(x);
    case AF_VUN_SQUARE: return x * x;
    case AF_VUN_SOFTPLUS: return vm_softplus(x);
    case AF_VUN_ROUND: return vround_even(x);
    case AF_VUN_FLOOR: { vf r = vround_even(x); return vm_select(r > x, r - 1.0f, r); }
    case AF_VUN_CEIL: { vf r = vround_even(x); return vm_select(r < x, r + 1.0f, r); }
    case AF_VUN_SIGN: /* zeros and NaN as they are */
        return vm_select(x > 0.0f, vsplat(1.0f), vm_select(x < 0.0f, vsplat(-1.0f), x));
    case AF_VUN_SOFTSIGN: return x / (1.0f + vm_abs(x));
    case AF_VUN_MISH: return x * vm_tanh(vm_softplus(x));
    case AF_VUN_LOG: return vm_log(x);
    case AF_VUN_SELU: return vm_select(x > 0.0f, x * p1, vm_expm1(x) * (p0 * p1));
    case AF_VUN_CELU: return vm_select(x > 0.0f, x, vm_expm1(x / p0) * p0);
    case AF_VUN_SIN: return vm_sin(x);
    case AF_VUN_COS: return vm_cos(x);
    default: return x;
    }
}

static inline vf bin_apply(int op, int rev, vf y, vf b) {
    if (rev) {
        vf t = y;
        y = b;
        b = t;
    }
    switch (op) {
    case AF_EP_ADD: return y + b;
    case AF_EP_SUB: return y - b;
    case AF_EP_MUL: return y * b;
    case AF_EP_PRELU: return vm_select(y < 0.0f, y * b, y); /* NaN: not < 0, stays */
    default: return y / b;
    }
}

/* ---- low-precision operands ----------------------------------------------------------------- */

typedef uint32_t vu __attribute__((vector_size(VW * 4), aligned(4)));

/* VW halves at p, widened. */
static inline vf vload_half(const uint16_t *p) {
#if defined(__AVX512F__) && VW == 16
    __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    vf r;
    memcpy(&r, &v, sizeof r);
    return r;
#elif defined(__F16C__) && VW == 8
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    vf r;
    memcpy(&r, &v, sizeof r);
    return r;
#else
    vf r;
    for (int i = 0; i < VW; i++) r[i] = af_half_to_float(p[i]);
    return r;
#endif
}

static inline vu vload_u(const void *p) {
    vu v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The low and high bfloat16 of each 32-bit word, as float32 (exact: a bfloat16 is the top half
 * of a float32). */
static inline vf bf16_lo(vu w) {
    return (vf)(w << 16);
}

static inline vf bf16_hi(vu w) {
    return (vf)(w & 0xffff0000u);
}

static inline float bf16_word_lo(uint32_t w) {
    uint32_t u = w << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_word_hi(uint32_t w) {
    uint32_t u = w & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void to_bf16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512BF16__) && VW == 16
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
#else
    for (; i + VW <= n; i += VW) {
        vu u = vload_u(x + i);
        vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
        r = (r & ~nan) | (((u >> 16) | 0x40u) & nan);
        for (int l = 0; l < VW; l++) y[i + l] = (uint16_t)r[l];
    }
#endif
    for (; i < n; i++) y[i] = af_float_to_bf16(x[i]);
}

/* The uint8 codes: clamp(x / s, -z, 255 - z) rounded to nearest even plus z, the same as
 * rounding first and clamping after (the bounds are integers); a NaN fails the first compare
 * and becomes -z, code 0. With AVX-512 the conversion itself rounds (VCVTPS2DQ with the
 * rounding in the instruction) and z is added to the integers; elsewhere the magic number
 * rounds (within 2^22). The last n % VW floats go through one partial vector: a scalar loop
 * there took a fifth of the time of 24-channel rows converted one at a time. */
static inline vi u8_codes(vf x, vf s, vf lo, vf hi, vf z) {
    vf v = vm_min(hi, vm_max(x / s, lo));
#if defined(__AVX512F__) && VW == 16
    __m512 vv;
    memcpy(&vv, &v, sizeof vv);
    __m512i q = _mm512_cvt_roundps_epi32(vv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vi r;
    memcpy(&r, &q, sizeof r);
    return r + __builtin_convertvector(z, vi);
#else
    return __builtin_convertvector(((v + 12582912.0f) - 12582912.0f) + z, vi);
#endif
}

/* The first m (<= VW) codes of q (each in [0, 255]) to y. */
static inline void u8_store(uint8_t *y, vi q, int64_t m) {
#if defined(__AVX512F__) && VW == 16
    __m512i qi;
    memcpy(&qi, &q, sizeof qi);
    if (m == VW) _mm_storeu_si128((__m128i *)y, _mm512_cvtepi32_epi8(qi));
    else _mm512_mask_cvtepi32_storeu_epi8(y, (__mmask16)((1u << m) - 1), qi);
#else
    for (int l = 0; l < m; l++) y[l] = (uint8_t)q[l];
#endif
}

static void to_u8(const float *x, uint8_t *y, int64_t n, float s, int z) {
    vf sv = vsplat(s), lov = vsplat((float)-z), hiv = vsplat((float)(255 - z)), zv = vsplat((float)z);
    for (int64_t i = 0; i < n; i += VW) {
        int64_t m = n - i < VW ? n - i : VW;
        u8_store(y + i, u8_codes(m == VW ? vload(x + i) : vload_part(x + i, m), sv, lov, hiv, zv), m);
    }
}

static void round_f16(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__) && VW == 16
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
#elif defined(__F16C__) && VW == 8
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
#endif
    for (; i < n; i++) y[i] = af_half_to_float(af_float_to_half(x[i]));
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__) && VW == 16
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__) && VW == 8
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = af_float_to_half(x[i]);
}

static void from_f16(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
#if (defined(__AVX512F__) && VW == 16) || (defined(__F16C__) && VW == 8)
    for (; i + VW <= n; i += VW) vstore(y + i, vload_half(x + i));
#endif
    for (; i < n; i++) y[i] = af_half_to_float(x[i]);
}

static void from_bf16(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        vu u;
        for (int l = 0; l < VW; l++) u[l] = (uint32_t)x[i + l] << 16;
        vf f;
        memcpy(&f, &u, sizeof f);
        vstore(y + i, f);
    }
    for (; i < n; i++) y[i] = af_bf16_to_float(x[i]);
}

/* ---- GEMM micro-kernels ------------------------------------------------------------------------ */

/* acc += row k of A (MR broadcasts) x row k of B (NV vectors): float32 or half B. */
#define UKR_STEP(MR, NV, BT)                                                                      \
    do {                                                                                          \
        vf bv[2];                                                                                 \
        for (int j = 0; j < NV; j++)                                                              \
            bv[j] = BT == AF_GEMM_F16 ? vload_half((const uint16_t *)b + j * VW)                  \
                                      : vload((const float *)b + j * VW);                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            float s = ar[r / 3][(r % 3) * rs];                                                    \
            for (int j = 0; j < NV; j++) acc[r][j] += s * bv[j];                                  \
        }                                                                                         \
    } while (0)

/* acc += the pair k of A rows (bfloat16 at 2k, 2k + 1) x the pair row k of B: the AVX512_BF16
 * dot product where this file is compiled for it, else both halves widened and two FMAs. */
#if defined(__AVX512BF16__) && VW == 16
#define UKR_STEP_BF16(MR, NV)                                                                     \
    do {                                                                                          \
        __m512bh bw[2];                                                                           \
        for (int j = 0; j < NV; j++) bw[j] = (__m512bh)_mm512_loadu_si512((const uint32_t *)b + j * VW); \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            uint32_t w;                                                                           \
            memcpy(&w, (const uint16_t *)a + r * rs + 2 * k, sizeof w);                           \
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);                                    \
            for (int j = 0; j < NV; j++)                                                          \
                acc[r][j] = (vf)_mm512_dpbf16_ps((__m512)acc[r][j], av, bw[j]);                   \
        }                                                                                         \
    } while (0)
#else
#define UKR_STEP_BF16(MR, NV)                                                                     \
    do {                                                                                          \
        vf blo[2], bhi[2];                                                                        \
        for (int j = 0; j < NV; j++) {                                                            \
            vu w = vload_u((const uint32_t *)b + j * VW);                                         \
            blo[j] = bf16_lo(w);                                                                  \
            bhi[j] = bf16_hi(w);                                                                  \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            uint32_t w;                                                                           \
            memcpy(&w, (const uint16_t *)a + r * rs + 2 * k, sizeof w);                           \
            float lo = bf16_word_lo(w), hi = bf16_word_hi(w);                                     \
            for (int j = 0; j < NV; j++) acc[r][j] += lo * blo[j] + hi * bhi[j];                  \
        }                                                                                         \
    } while (0)
#endif

#define UKR_ANY_STEP(MR, NV, BT)                                                                  \
    do {                                                                                          \
        if (BT == AF_GEMM_BF16) UKR_STEP_BF16(MR, NV);                                            \
        else UKR_STEP(MR, NV, BT);                                                                \
    } while (0)

/* The loops over the accumulators, unrolled completely: one left rolled (gcc's own limit is 16
 * iterations) indexes acc with a variable, which puts the whole array in memory; it was there
 * after every K loop, a store and a load per register for each epilogue step (a 1x1 conv from
 * 64 channels with a bias, residual and Relu: 4% of its time). */
#define UKR_FOR(v, n) _Pragma("GCC unroll 24") for (int v = 0; v < (n); v++)

/* vector j of a row: whole, or the last one's first p->last floats */
#define UKR_LOAD(q, j) (j == NV - 1 && last < VW ? vload_part(q, last) : vload(q))

/* The epilogue's start in registers (bias, residual, clamp) and the store of the MR x NV
 * accumulator vectors acc: the end of every micro-kernel. CODES (a constant): the kernel may
 * store codes (af_ukr_args.codes); only the U8S8 ones do, so the float kernels' code stays as
 * it was without the branch. */
#define UKR_FINISH_BODY(MR, NV, acc, p, CODES)                                                    \
    const int64_t last = p->last;                                                                 \
    if (p->bias)                                                                                  \
        UKR_FOR(j, NV) {                                                                          \
            vf bv = UKR_LOAD(p->bias + j * VW, j);                                                \
            UKR_FOR(r, MR) acc[r][j] += bv;                                                       \
        }                                                                                         \
    if (p->prog) {                                                                                \
        for (int s = 0; s < p->prog->n; s++) {                                                    \
            const int op = p->prog->s[s].op;                                                      \
            const float p0 = p->prog->s[s].p0, p1 = p->prog->s[s].p1;                             \
            if (op == AF_EP_ADD)                                                                  \
                UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] += UKR_LOAD(p->res + r * p->ldres + j * VW, j); \
            else if (op == AF_EP_RELU)                                                            \
                UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = un_apply(AF_EP_RELU, acc[r][j], p0, p1); \
            else if (op == AF_EP_CLIP)                                                            \
                UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = un_apply(AF_EP_CLIP, acc[r][j], p0, p1); \
            else                                                                                  \
                UKR_FOR(r, MR) UKR_FOR(j, NV)                                                     \
                    acc[r][j] = un_apply(AF_EP_FAKE_QUANT, acc[r][j], p0, p1);                    \
        }                                                                                         \
    } else {                                                                                      \
        if (p->res)                                                                               \
            UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] += UKR_LOAD(p->res + r * p->ldres + j * VW, j); \
        if (p->clamp) { /* un_apply's Clip */                                                     \
            vf lo = vsplat(p->clamp[0]), hi = vsplat(p->clamp[1]);                                \
            UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = vm_min(hi, vm_max(lo, acc[r][j]));          \
        }                                                                                         \
    }                                                                                             \
    /* C's base and stride in locals: the vector stores may alias anything, p included, so        \
     * read through p they were loaded again before every store (48 loads a 12x32 tile). */       \
    const int64_t ldc = p->ldc;                                                                   \
    if (CODES && p->codes) {                                                                      \
        uint8_t *const c8 = p->codes;                                                             \
        const vf cs = vsplat(p->codes_scale), cz = vsplat((float)p->codes_zero);                  \
        const vf clo = vsplat((float)-p->codes_zero), chi = vsplat((float)(255 - p->codes_zero)); \
        UKR_FOR(r, MR) UKR_FOR(j, NV)                                                             \
            u8_store(c8 + r * ldc + j * VW, u8_codes(acc[r][j], cs, clo, chi, cz),                \
                     j == NV - 1 ? last : VW);                                                    \
    } else {                                                                                      \
        float *const c = p->c;                                                                    \
        UKR_FOR(r, MR) UKR_FOR(j, NV) {                                                           \
            float *q = c + r * ldc + j * VW;                                                      \
            if (j == NV - 1 && last < VW) vstore_part(q, acc[r][j], last);                        \
            else vstore(q, acc[r][j]);                                                            \
        }                                                                                         \
    }                                                                                             \

#define UKR_FINISH(MR, NV, acc, p, CODES)                                                         \
    do {                                                                                          \
        UKR_FINISH_BODY(MR, NV, acc, p, CODES)                                                    \
    } while (0)

/* MR x NV vectors of C, accumulated over every tap in registers and stored once. MR, NV, PF and
 * BT are constants at each instantiation below, so the accumulator array lives in registers and
 * the loops unroll completely; PF = 0 instantiations have no prefetch code in their K loop at
 * all (a run-time test there costs registers the row pointers need). */
static inline __attribute__((always_inline)) void ukr_body(const int MR, const int NV, const int PF,
                                                           const int BT, const af_ukr_args *p) {
    vf acc[VEC_MR][2];
    UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = (vf){0};
    /* The tile's residual and destination lines are needed only after the K loop: asking for
     * them now hides their memory latency behind it (short K loops would otherwise wait). */
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV * VW; j += 16) {
            if (p->res) __builtin_prefetch(p->res + r * p->ldres + j, 0, 3);
            __builtin_prefetch(p->c + r * p->ldc + j, 1, 3);
        }
    const int esz = BT == AF_GEMM_F16 ? 2 : 4; /* bytes per B element (a pair word for BF16) */
    const char *b = p->b, *pfp = p->pf;
    const int64_t rs = p->rs, bs = p->bstride * esz, pfs = p->pf_step;
    const int64_t len = BT == AF_GEMM_BF16 ? p->tap_len / 2 : p->tap_len;
    int64_t pfn = p->pf_steps;
    for (int64_t t = 0; t < p->ntaps; t++) {
        const void *a = BT == AF_GEMM_BF16 ? (const void *)((const uint16_t *)p->a + p->tap_off[t])
                                           : (const void *)((const float *)p->a + p->tap_off[t]);
        int64_t k = 0;
        /* float A rows through four pointers a third of the tile apart, advanced with k: row r
         * is ar[r / 3][(r % 3) * rs], an address of one base and the row stride (scaled by 4 or
         * 8), so the K loop keeps 5 registers for A where 12 row offsets spilled. */
        const float *ar[4];
        for (int q = 0; q < (MR + 2) / 3; q++) ar[q] = (const float *)a + q * 3 * rs;
        if (PF) { /* two lines requested per step, for as many steps as asked */
            int64_t kp = pfn < len ? pfn : len;
            for (; k < kp; k++, b += bs, pfp += pfs) {
                __builtin_prefetch(pfp, 0, 2);
                __builtin_prefetch(pfp + 64, 0, 2);
                UKR_ANY_STEP(MR, NV, BT);
                for (int q = 0; q < (MR + 2) / 3; q++) ar[q]++;
            }
            pfn -= kp;
        }
        for (; k < len; k++, b += bs) {
            UKR_ANY_STEP(MR, NV, BT);
            for (int q = 0; q < (MR + 2) / 3; q++) ar[q]++;
        }
    }
    UKR_FINISH(MR, NV, acc, p, 0);
}

/* One or two rows of A against a whole panel of B (up to AF_GEMM_NR / VW vectors) in one pass:
 * the products of few rows (a batch-1 classifier, a decoder's step), whose time is B's stream
 * from memory. ukr_body takes two vectors a call, so on AVX2 a 32-wide panel was read twice,
 * each pass using half of every line, and one row's two accumulators made each K step wait on
 * the last one's FMA: 14 GB/s from memory (1 x 4096 x 9216, gemm_bench) where this reads 19,
 * as fast as a plain read loop. Each output is summed in the order ukr_body sums it (one FMA per k, in
 * k order), so a row's result does not depend on the tile it falls in: products split by
 * threads into pieces of one or two rows stay bit for bit those of one thread. */
#define ROW_NV (AF_GEMM_NR / VW)
static inline __attribute__((always_inline)) void ukr_row_body(const int MR, const int NV, const int PF,
                                                               const int BT, const af_ukr_args *p) {
    vf acc[2][ROW_NV];
    UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = (vf){0};
    for (int r = 0; r < MR; r++) {
        if (p->res) __builtin_prefetch(p->res + r * p->ldres, 0, 3);
        __builtin_prefetch(p->c + r * p->ldc, 1, 3);
    }
    const int esz = BT == AF_GEMM_F16 ? 2 : 4;
    const char *b = p->b, *pfp = p->pf;
    const int64_t rs = p->rs, bs = p->bstride * esz, pfs = p->pf_step, len = p->tap_len;
    int64_t pfn = p->pf_steps;
    for (int64_t t = 0; t < p->ntaps; t++) {
        const float *a = (const float *)p->a + p->tap_off[t];
        for (int64_t k = 0; k < len; k++, b += bs) {
            if (PF && pfn > 0) { /* two lines requested per K step, for as many steps as asked */
                __builtin_prefetch(pfp, 0, 2);
                __builtin_prefetch(pfp + 64, 0, 2);
                pfp += pfs, pfn--;
            }
            UKR_FOR(j, NV) {
                vf bj = BT == AF_GEMM_F16 ? vload_half((const uint16_t *)b + j * VW)
                                          : vload((const float *)b + j * VW);
                UKR_FOR(r, MR) acc[r][j] += a[r * rs + k] * bj;
            }
        }
    }
    UKR_FINISH(MR, NV, acc, p, 0);
}

/* acc += the quad k of each A row (4 uint8 codes) x the quad row k of B (4 int8 per column):
 * VPDPBUSD where this file is compiled for AVX512_VNNI, else the bytes widened to int32 lanes
 * (the same exact sums: |acc| stays below 2^31 for K <= 65536, which the lowering checks). */
#if defined(__AVX512VNNI__) && VW == 16
#define UKR_STEP_U8S8(MR, NV)                                                                     \
    do {                                                                                          \
        __m512i bw[2];                                                                            \
        for (int j = 0; j < NV; j++) bw[j] = _mm512_loadu_si512((const uint32_t *)b + j * VW);   \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            uint32_t w;                                                                           \
            memcpy(&w, ar[r / 3] + (r % 3) * rs, sizeof w);                                       \
            __m512i av = _mm512_set1_epi32((int)w);                                               \
            for (int j = 0; j < NV; j++)                                                          \
                acc[r][j] = (vi)_mm512_dpbusd_epi32((__m512i)acc[r][j], av, bw[j]);               \
        }                                                                                         \
    } while (0)
#else
#define UKR_STEP_U8S8(MR, NV)                                                                     \
    do {                                                                                          \
        vi b0[2], b1[2], b2[2], b3[2];                                                            \
        for (int j = 0; j < NV; j++) {                                                            \
            vu w = vload_u((const uint32_t *)b + j * VW);                                         \
            b0[j] = (vi)(w << 24) >> 24;                                                          \
            b1[j] = (vi)(w << 16) >> 24;                                                          \
            b2[j] = (vi)(w << 8) >> 24;                                                           \
            b3[j] = (vi)w >> 24;                                                                  \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            const uint8_t *q = ar[r / 3] + (r % 3) * rs;                                          \
            int32_t a0 = q[0], a1 = q[1], a2 = q[2], a3 = q[3];                                   \
            for (int j = 0; j < NV; j++)                                                          \
                acc[r][j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];                   \
        }                                                                                         \
    } while (0)
#endif

/* The same with B's weights within [-64, 64] (af_ukr_args.w7): where VPDPBUSD is missing,
 * VPMADDUBSW's pairs a0 b0 + a1 b1 (saturated to int16) cannot saturate, |255 x 64 x 2| <
 * 32768, so VPMADDUBSW, VPMADDWD by ones and an add give the exact quad sums: on Zen 3 the
 * GEMM runs at 2.1-2.5x its fp32 rate this way, the widened bytes at 0.5x. */
#if defined(__AVX512VNNI__) && VW == 16
#define UKR_STEP_U8S7(MR, NV) UKR_STEP_U8S8(MR, NV)
#elif (defined(__AVX512BW__) && VW == 16) || (defined(__AVX2__) && VW == 8)
#if VW == 16
typedef __m512i vbytes;
#define VB_LOAD(p) _mm512_loadu_si512(p)
#define VB_SET1(w) _mm512_set1_epi32(w)
#define VB_QUAD(a, b, one) _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), one)
#define VB_ONES() _mm512_set1_epi16(1)
#else
typedef __m256i vbytes;
#define VB_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VB_SET1(w) _mm256_set1_epi32(w)
#define VB_QUAD(a, b, one) _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one)
#define VB_ONES() _mm256_set1_epi16(1)
#endif
#define UKR_STEP_U8S7(MR, NV)                                                                     \
    do {                                                                                          \
        vbytes bw[2], one = VB_ONES();                                                            \
        for (int j = 0; j < NV; j++) bw[j] = VB_LOAD((const uint32_t *)b + j * VW);               \
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                   \
            uint32_t w;                                                                           \
            memcpy(&w, ar[r / 3] + (r % 3) * rs, sizeof w);                                       \
            vbytes av = VB_SET1((int)w);                                                          \
            for (int j = 0; j < NV; j++) {                                                        \
                vbytes q = VB_QUAD(av, bw[j], one);                                               \
                vi qi;                                                                            \
                memcpy(&qi, &q, sizeof qi);                                                       \
                acc[r][j] += qi;                                                                  \
            }                                                                                     \
        }                                                                                         \
    } while (0)
#else
#define UKR_STEP_U8S7(MR, NV) UKR_STEP_U8S8(MR, NV)
#endif

/* The U8S8 micro-kernel: int32 accumulators over every tap, then in registers
 * (acc - qzero * colsum[j]) * qscale[j] (the int8 form's dequantization, exact up to the float
 * conversion and the one rounding of the product) and UKR_FINISH. */
static inline __attribute__((always_inline)) void ukr_u8s8_body(const int MR, const int NV,
                                                                const int PF, const int W7,
                                                                const af_ukr_args *p) {
    vi acc[VEC_MR][2];
#if defined(__AVX512VNNI__) && VW == 16
    /* VPDPBUSD adds in wrapping arithmetic, so the sums can start from the zero point's share
     * - qzero * colsum[j] (one vector op fewer per output vector in the epilogue) */
    {
        const int64_t last = p->last;
        UKR_FOR(j, NV) {
            vu zc = (vu)(vi)UKR_LOAD((const float *)(p->colsum + j * VW), j) * (0u - (uint32_t)p->qzero);
            UKR_FOR(r, MR) acc[r][j] = (vi)zc;
        }
    }
#define U8S8_ZERO_FIRST 1
#else
    UKR_FOR(r, MR) UKR_FOR(j, NV) acc[r][j] = (vi){0};
#define U8S8_ZERO_FIRST 0
#endif
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV * VW; j += 16) {
            if (p->res) __builtin_prefetch(p->res + r * p->ldres + j, 0, 3);
            if (p->c) __builtin_prefetch(p->c + r * p->ldc + j, 1, 3);
        }
    const char *b = p->b, *pfp = p->pf;
    const int64_t rs = p->rs, bs = p->bstride * 4, pfs = p->pf_step, len = p->tap_len / 4;
    int64_t pfn = p->pf_steps;
    for (int64_t t = 0; t < p->ntaps; t++) {
        int64_t k = 0;
        const uint8_t *ar[4]; /* as in ukr_body: rows r at ar[r / 3] + (r % 3) * rs */
        for (int q = 0; q < (MR + 2) / 3; q++) ar[q] = (const uint8_t *)p->a + p->tap_off[t] + q * 3 * rs;
        if (PF) {
            int64_t kp = pfn < len ? pfn : len;
            for (; k < kp; k++, b += bs, pfp += pfs) {
                __builtin_prefetch(pfp, 0, 2);
                __builtin_prefetch(pfp + 64, 0, 2);
                if (W7) UKR_STEP_U8S7(MR, NV);
                else UKR_STEP_U8S8(MR, NV);
                for (int q = 0; q < (MR + 2) / 3; q++) ar[q] += 4;
            }
            pfn -= kp;
        }
        for (; k < len; k++, b += bs) {
            if (W7) UKR_STEP_U8S7(MR, NV);
            else UKR_STEP_U8S8(MR, NV);
            for (int q = 0; q < (MR + 2) / 3; q++) ar[q] += 4;
        }
    }
    vf out[VEC_MR][2];
    {
        const int64_t last = p->last;
        UKR_FOR(j, NV) {
            /* the zero point's share, in wrapping arithmetic (the difference fits in int32) */
            vu zc = U8S8_ZERO_FIRST ? (vu){0}
                                    : (vu)(vi)UKR_LOAD((const float *)(p->colsum + j * VW), j) * (uint32_t)p->qzero;
            vf sc = UKR_LOAD(p->qscale + j * VW, j);
            UKR_FOR(r, MR) out[r][j] = __builtin_convertvector((vi)((vu)acc[r][j] - zc), vf) * sc;
        }
    }
    UKR_FINISH(MR, NV, out, p, 1);
}
#undef U8S8_ZERO_FIRST

#undef UKR_FOR

#define UKR(T, BT, NV, MR)                                                                     \
    static void ukr_##T##_##NV##_##MR(const af_ukr_args *p) {                                   \
        if (BT == AF_GEMM_U8S8 && p->w7 && p->pf_steps) ukr_u8s8_body(MR, NV, 1, 1, p);         \
        else if (BT == AF_GEMM_U8S8 && p->w7) ukr_u8s8_body(MR, NV, 0, 1, p);                   \
        else if (BT == AF_GEMM_U8S8 && p->pf_steps) ukr_u8s8_body(MR, NV, 1, 0, p);             \
        else if (BT == AF_GEMM_U8S8) ukr_u8s8_body(MR, NV, 0, 0, p);                            \
        else if (p->pf_steps) ukr_body(MR, NV, 1, BT, p);                                       \
        else ukr_body(MR, NV, 0, BT, p);                                                        \
    }
#define UKR_ROWS(T, BT, NV)                                                                    \
    UKR(T, BT, NV, 1) UKR(T, BT, NV, 2) UKR(T, BT, NV, 3) UKR(T, BT, NV, 4) UKR(T, BT, NV, 5)  \
    UKR(T, BT, NV, 6)
#if VEC_MR > 6
#define UKR_ROWS_HI(T, BT, NV)                                                                 \
    UKR(T, BT, NV, 7) UKR(T, BT, NV, 8) UKR(T, BT, NV, 9) UKR(T, BT, NV, 10)                   \
    UKR(T, BT, NV, 11) UKR(T, BT, NV, 12)
#define UKR_HI(T, NV)                                                                          \
    , ukr_##T##_##NV##_7, ukr_##T##_##NV##_8, ukr_##T##_##NV##_9, ukr_##T##_##NV##_10,         \
        ukr_##T##_##NV##_11, ukr_##T##_##NV##_12
#else
#define UKR_ROWS_HI(T, BT, NV)
#define UKR_HI(T, NV)
#endif
#define UKR_TYPE(T, BT)                                                                        \
    UKR_ROWS(T, BT, 1) UKR_ROWS(T, BT, 2) UKR_ROWS_HI(T, BT, 1) UKR_ROWS_HI(T, BT, 2)
UKR_TYPE(f32, AF_GEMM_F32)
UKR_TYPE(f16, AF_GEMM_F16)
UKR_TYPE(bf16, AF_GEMM_BF16)
UKR_TYPE(u8s8, AF_GEMM_U8S8)
#define UKR_TABLE(T, NV)                                                                       \
    { NULL, ukr_##T##_##NV##_1, ukr_##T##_##NV##_2, ukr_##T##_##NV##_3, ukr_##T##_##NV##_4,    \
      ukr_##T##_##NV##_5, ukr_##T##_##NV##_6 UKR_HI(T, NV) }
#define UKR_TYPE_TABLE(T) { UKR_TABLE(T, 1), UKR_TABLE(T, 2) }

/* The row kernels of float32 and half B: [rows - 1][vectors], as many vectors as a panel has. */
#define UKR_ROW(T, BT, MR, NV)                                                                 \
    static void ukr_row_##T##_##MR##_##NV(const af_ukr_args *p) {                               \
        if (p->pf_steps) ukr_row_body(MR, NV, 1, BT, p);                                        \
        else ukr_row_body(MR, NV, 0, BT, p);                                                    \
    }
#define UKR_ROW_2(T, BT, MR) UKR_ROW(T, BT, MR, 1) UKR_ROW(T, BT, MR, 2)
#define UKR_ROW_4(T, BT, MR) UKR_ROW_2(T, BT, MR) UKR_ROW(T, BT, MR, 3) UKR_ROW(T, BT, MR, 4)
#define UKR_ROW_8(T, BT, MR)                                                                   \
    UKR_ROW_4(T, BT, MR) UKR_ROW(T, BT, MR, 5) UKR_ROW(T, BT, MR, 6) UKR_ROW(T, BT, MR, 7)     \
    UKR_ROW(T, BT, MR, 8)
#define ROW_ENTRIES_2(T, MR) NULL, ukr_row_##T##_##MR##_1, ukr_row_##T##_##MR##_2
#define ROW_ENTRIES_4(T, MR) ROW_ENTRIES_2(T, MR), ukr_row_##T##_##MR##_3, ukr_row_##T##_##MR##_4
#define ROW_ENTRIES_8(T, MR)                                                                   \
    ROW_ENTRIES_4(T, MR), ukr_row_##T##_##MR##_5, ukr_row_##T##_##MR##_6,                      \
        ukr_row_##T##_##MR##_7, ukr_row_##T##_##MR##_8
#if ROW_NV == 2
#define UKR_ROWS_OF(T, BT, MR) UKR_ROW_2(T, BT, MR)
#define ROW_ENTRIES(T, MR) ROW_ENTRIES_2(T, MR)
#elif ROW_NV == 4
#define UKR_ROWS_OF(T, BT, MR) UKR_ROW_4(T, BT, MR)
#define ROW_ENTRIES(T, MR) ROW_ENTRIES_4(T, MR)
#else
#define UKR_ROWS_OF(T, BT, MR) UKR_ROW_8(T, BT, MR)
#define ROW_ENTRIES(T, MR) ROW_ENTRIES_8(T, MR)
#endif
UKR_ROWS_OF(f32, AF_GEMM_F32, 1)
UKR_ROWS_OF(f32, AF_GEMM_F32, 2)
UKR_ROWS_OF(f16, AF_GEMM_F16, 1)
UKR_ROWS_OF(f16, AF_GEMM_F16, 2)
#define ROW_TABLE(T) { { ROW_ENTRIES(T, 1) }, { ROW_ENTRIES(T, 2) } }

/* dst rows = op(src rows), rows x cols floats (row strides lds, ldd; dst may be src). The
 * switch stands outside the loops, so each loop has its op as a constant: the math's constants
 * stay in registers and nothing is dispatched per vector (dispatching per vector made SiLU 3x
 * slower). */
#define UN_ROWS(OP)                                                                               \
    for (int64_t r = 0; r < rows; r++) {                                                          \
        const float *x = src + r * lds;                                                           \
        float *y = dst + r * ldd;                                                                 \
        int64_t j = 0;                                                                            \
        for (; j + VW <= cols; j += VW) vstore(y + j, un_apply(OP, vload(x + j), p0, p1));        \
        if (j < cols) vstore_part(y + j, un_apply(OP, vload_part(x + j, cols - j), p0, p1), cols - j); \
    }

static void un_rows(int op, float p0, float p1, const float *src, int64_t lds, float *dst,
                    int64_t ldd, int64_t rows, int64_t cols) {
    switch (op) {
    case AF_EP_RELU: UN_ROWS(AF_EP_RELU) break;
    case AF_EP_CLIP: UN_ROWS(AF_EP_CLIP) break;
    case AF_EP_LEAKY_RELU: UN_ROWS(AF_EP_LEAKY_RELU) break;
    case AF_EP_SIGMOID: UN_ROWS(AF_EP_SIGMOID) break;
    case AF_EP_HARD_SIGMOID: UN_ROWS(AF_EP_HARD_SIGMOID) break;
    case AF_EP_HARD_SWISH: UN_ROWS(AF_EP_HARD_SWISH) break;
    case AF_EP_SILU: UN_ROWS(AF_EP_SILU) break;
    case AF_EP_GELU:
        if (p0 == 0.0f) UN_ROWS(AF_EP_GELU)
        else UN_ROWS(UN_GELU_TANH)
        break;
    case AF_EP_TANH: UN_ROWS(AF_EP_TANH) break;
    case AF_EP_ELU: UN_ROWS(AF_EP_ELU) break;
    case AF_EP_FAKE_QUANT: UN_ROWS(AF_EP_FAKE_QUANT) break;
    case AF_VUN_EXP: UN_ROWS(AF_VUN_EXP) break;
    case AF_VUN_ERF: UN_ROWS(AF_VUN_ERF) break;
    case AF_VUN_RECIPROCAL: UN_ROWS(AF_VUN_RECIPROCAL) break;
    case AF_VUN_NEG: UN_ROWS(AF_VUN_NEG) break;
    case AF_VUN_ABS: UN_ROWS(AF_VUN_ABS) break;
    case AF_VUN_SQUARE: UN_ROWS(AF_VUN_SQUARE) break;
    case AF_VUN_SOFTPLUS: UN_ROWS(AF_VUN_SOFTPLUS) break;
    case AF_VUN_FLOOR: UN_ROWS(AF_VUN_FLOOR) break;
    case AF_VUN_CEIL: UN_ROWS(AF_VUN_CEIL) break;
    case AF_VUN_ROUND: UN_ROWS(AF_VUN_ROUND) break;
    case AF_VUN_SIGN: UN_ROWS(AF_VUN_SIGN) break;
    case AF_VUN_SOFTSIGN: UN_ROWS(AF_VUN_SOFTSIGN) break;
    case AF_VUN_MISH: UN_ROWS(AF_VUN_MISH) break;
    case AF_VUN_LOG: UN_ROWS(AF_VUN_LOG) break;
    case AF_VUN_SELU: UN_ROWS(AF_VUN_SELU) break;
    case AF_VUN_CELU: UN_ROWS(AF_VUN_CELU) break;
    case AF_VUN_SIN: UN_ROWS(AF_VUN_SIN) break;
    case AF_VUN_COS: UN_ROWS(AF_VUN_COS) break;
    default: UN_ROWS(0) break; /* identity */
    }
}

/* y (op)= the binary step's operand over the tile, the operand read as its kind says. KIND, OP
 * and REV are constants at each instantiation (bin_rows picks one), so nothing is decided per
 * vector: with the kind and op tested in the loop, P V's 1 / sum scaling in attention took 10
 * TSC cycles per 16 floats, a tenth of the P V product. */
static inline __attribute__((always_inline)) void
bin_rows_k(const int KIND, const int OP, const int REV, const af_vep *v, const af_vep_step *st,
           float *c, int64_t ldc, int64_t row0, int64_t col0, int64_t rows, int64_t cols) {
    const bool lanes = KIND == AF_VEP_COL || KIND == AF_VEP_FULL; /* a vector of operands each */
    for (int64_t r = 0; r < rows; r++) {
        float *y = c + r * ldc;
        int64_t row = row0 + r;
        const float *x = KIND == AF_VEP_COL ? st->x + col0 : st->x + row * v->cols + col0;
        vf b = vsplat(KIND == AF_VEP_SCALAR ? st->x[0] : KIND == AF_VEP_ROW ? st->x[row] : 0.0f);
        int64_t j = 0;
        for (; j + VW <= cols; j += VW)
            vstore(y + j, bin_apply(OP, REV, vload(y + j), lanes ? vload(x + j) : b));
        if (j < cols) {
            int64_t n = cols - j;
            vf t = bin_apply(OP, REV, vload_part(y + j, n), lanes ? vload_part(x + j, n) : b);
            vstore_part(y + j, t, n);
        }
    }
}

/* One instantiation per (kind, op, order); ops other than these five do not reach a vep. */
#define BIN_CASE(KIND, OP, REV)                                                                   \
    case OP * 2 + REV: bin_rows_k(KIND, OP, REV, v, st, c, ldc, row0, col0, rows, cols); break;
#define BIN_ROWS_OPS(KIND)                                                                        \
    switch (st->op * 2 + (st->rev != 0)) {                                                        \
        BIN_CASE(KIND, AF_EP_ADD, 0) BIN_CASE(KIND, AF_EP_ADD, 1)                                 \
        BIN_CASE(KIND, AF_EP_SUB, 0) BIN_CASE(KIND, AF_EP_SUB, 1)                                 \
        BIN_CASE(KIND, AF_EP_MUL, 0) BIN_CASE(KIND, AF_EP_MUL, 1)                                 \
        BIN_CASE(KIND, AF_EP_PRELU, 0) BIN_CASE(KIND, AF_EP_PRELU, 1)                             \
        BIN_CASE(KIND, AF_EP_DIV, 0)                                                              \
    default: bin_rows_k(KIND, AF_EP_DIV, 1, v, st, c, ldc, row0, col0, rows, cols); break;        \
    }

static void bin_rows(const af_vep *v, const af_vep_step *st, float *c, int64_t ldc, int64_t row0,
                     int64_t col0, int64_t rows, int64_t cols) {
    switch (st->kind) {
    case AF_VEP_SCALAR: BIN_ROWS_OPS(AF_VEP_SCALAR) break;
    case AF_VEP_COL: BIN_ROWS_OPS(AF_VEP_COL) break;
    case AF_VEP_ROW: BIN_ROWS_OPS(AF_VEP_ROW) break;
    default: BIN_ROWS_OPS(AF_VEP_FULL) break;
    }
}
#undef BIN_ROWS_OPS
#undef BIN_CASE

static void ep_tile(const af_vep *v, float *c, int64_t ldc, int64_t row0, int64_t col0,
                    int64_t rows, int64_t cols) {
    bool flat = ldc == cols;
    for (int s = 0; s < v->nsteps; s++) {
        const af_vep_step *st = &v->steps[s];
        if (st->kind == AF_VEP_NONE && flat) un_rows(st->op, st->p0, st->p1, c, 0, c, 0, 1, rows * cols);
        else if (st->kind == AF_VEP_NONE) un_rows(st->op, st->p0, st->p1, c, ldc, c, ldc, rows, cols);
        else bin_rows(v, st, c, ldc, row0, col0, rows, cols);
    }
    for (int64_t r = 0; r < rows && v->generic; r++) /* c is inside v->y at (row, col) */
        af_epilogue_apply_at(v->generic, v->y, (row0 + r) * v->cols + col0, cols);
}

static void unary(int op, float p0, float p1, const float *x, float *y, int64_t n) {
    if (op == AF_VUN_SQRT) { /* vectorised by the compiler (-fno-math-errno) */
        for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        return;
    }
    un_rows(op, p0, p1, x, 0, y, 0, 1, n);
}

/* v with its lanes swapped in pairs of groups of s lanes (s = VW / 2 ... 1): the steps of a
 * lane reduction as a tree. */
#if VW == 16
#define VSWAP8(v) __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)
#define VSWAP4(v) __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11)
#define VSWAP2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)
#define VSWAP1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14)
#define VREDUCE(v, op) (v = op(v, VSWAP8(v)), v = op(v, VSWAP4(v)), v = op(v, VSWAP2(v)), v = op(v, VSWAP1(v)))
#elif VW == 8
#define VSWAP4(v) __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3)
#define VSWAP2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5)
#define VSWAP1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6)
#define VREDUCE(v, op) (v = op(v, VSWAP4(v)), v = op(v, VSWAP2(v)), v = op(v, VSWAP1(v)))
#else
#define VSWAP2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1)
#define VSWAP1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2)
#define VREDUCE(v, op) (v = op(v, VSWAP2(v)), v = op(v, VSWAP1(v)))
#endif
static inline vf vadd2(vf a, vf b) {
    return a + b;
}

/* Lane sum, as a tree (log2 VW dependent adds: the lanes one after another were VW of them,
 * a quarter of a 197-key softmax row's time in attention). */
static inline float vsum(vf v) {
    VREDUCE(v, vadd2);
    return v[0];
}

/* Sum of x[0..n) (float accumulation in VW lanes, as wide as the vector). */
static float row_sum(const float *x, int64_t n) {
    vf acc = {0};
    int64_t i = 0;
    for (; i + VW <= n; i += VW) acc += vload(x + i);
    if (i < n) acc += vload_part(x + i, n - i);
    return vsum(acc);
}

/* How far ahead of its reads gemv prefetches w: squeeze-excite weights (up to 1.2 MB a layer in
 * EfficientNet-B4) come from memory once per image, where the hardware's streams alone
 * measured 14 GB/s and this 20 GB/s. */
#define GEMV_PF_BYTES 4096

/* Rows o..o+3 of gemv: x read once for the four, two accumulators a row (even and odd vectors,
 * the tail in the odd one: the single-row loop's order, so each y is the same bits either way).
 * One row at a time, x was loaded again for every row, and the loads bound the loop: an LSTM's
 * 512 x 128 recurrence, read every step, ran at half the rate. */
static inline void gemv4(const float *w, int64_t ldw, const float *x, int64_t n, float *y) {
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        vf x0 = vload(x + i), x1 = vload(x + i + VW);
        a0 += vload(w0 + i) * x0, b0 += vload(w0 + i + VW) * x1;
        a1 += vload(w1 + i) * x0, b1 += vload(w1 + i + VW) * x1;
        a2 += vload(w2 + i) * x0, b2 += vload(w2 + i + VW) * x1;
        a3 += vload(w3 + i) * x0, b3 += vload(w3 + i + VW) * x1;
    }
    if (i + VW <= n) {
        vf x0 = vload(x + i);
        a0 += vload(w0 + i) * x0, a1 += vload(w1 + i) * x0;
        a2 += vload(w2 + i) * x0, a3 += vload(w3 + i) * x0;
        i += VW;
    }
    if (i < n) {
        vf x0 = vload_part(x + i, n - i);
        b0 += vload_part(w0 + i, n - i) * x0, b1 += vload_part(w1 + i, n - i) * x0;
        b2 += vload_part(w2 + i, n - i) * x0, b3 += vload_part(w3 + i, n - i) * x0;
    }
    y[0] = vsum(a0 + b0), y[1] = vsum(a1 + b1), y[2] = vsum(a2 + b2), y[3] = vsum(a3 + b3);
}

static void gemv(const float *w, int64_t ldw, const float *x, int64_t rows, int64_t n, float *y) {
    if (rows <= 0) return;
    const char *pf = (const char *)w, *end = (const char *)(w + (rows - 1) * ldw + n);
    int64_t o0 = 0;
    for (; o0 + 4 <= rows; o0 += 4) {
        const char *to = (const char *)(w + (o0 + 3) * ldw + n) + GEMV_PF_BYTES;
        for (; pf < to && pf < end; pf += 64) __builtin_prefetch(pf, 0, 3);
        gemv4(w + o0 * ldw, ldw, x, n, y + o0);
    }
    for (int64_t o = o0; o < rows; o++) {
        const float *wr = w + o * ldw;
        /* every line up to GEMV_PF_BYTES past this row, once */
        const char *to = (const char *)(wr + n) + GEMV_PF_BYTES;
        for (; pf < to && pf < end; pf += 64) __builtin_prefetch(pf, 0, 3);
        vf a0 = {0}, a1 = {0};
        int64_t i = 0;
        for (; i + 2 * VW <= n; i += 2 * VW) {
            a0 += vload(wr + i) * vload(x + i);
            a1 += vload(wr + i + VW) * vload(x + i + VW);
        }
        for (; i + VW <= n; i += VW) a0 += vload(wr + i) * vload(x + i);
        if (i < n) a1 += vload_part(wr + i, n - i) * vload_part(x + i, n - i);
        y[o] = vsum(a0 + a1);
    }
}

static void layernorm(const float *x, float *y, int64_t n, float eps, const float *scale,
                      const float *bias) {
    float mean = row_sum(x, n) / (float)n;
    vf m = vsplat(mean), acc = {0};
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        vf d = vload(x + i) - m;
        acc += d * d;
    }
    if (i < n) { /* the padded lanes of the tail are 0 - mean: keep them out */
        float t[VW] = {0};
        for (int64_t j = i; j < n; j++) t[j - i] = (x[j] - mean) * (x[j] - mean);
        acc += vload(t);
    }
    float inv = 1.0f / sqrtf(vsum(acc) / (float)n + eps);
    vf iv = vsplat(inv);
    for (i = 0; i + VW <= n; i += VW) {
        vf t = (vload(x + i) - m) * iv * vload(scale + i);
        vstore(y + i, bias ? t + vload(bias + i) : t);
    }
    for (; i < n; i++) {
        float t = (x[i] - mean) * inv * scale[i];
        y[i] = bias ? t + bias[i] : t;
    }
}

/* RMSNorm: no mean, so the tail's padded lanes (zeros) add nothing to the sum of squares. */
static void rmsnorm(const float *x, float *y, int64_t n, float eps, const float *scale) {
    vf acc0 = {0}, acc1 = {0};
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        vf a = vload(x + i), b = vload(x + i + VW);
        acc0 += a * a;
        acc1 += b * b;
    }
    for (; i + VW <= n; i += VW) {
        vf a = vload(x + i);
        acc0 += a * a;
    }
    if (i < n) {
        vf a = vload_part(x + i, n - i);
        acc1 += a * a;
    }
    vf iv = vsplat(1.0f / sqrtf(vsum(acc0 + acc1) / (float)n + eps));
    for (i = 0; i + VW <= n; i += VW) vstore(y + i, vload(x + i) * iv * vload(scale + i));
    if (i < n)
        vstore_part(y + i, vload_part(x + i, n - i) * iv * vload_part(scale + i, n - i), n - i);
}

/* ---- depthwise convolution ------------------------------------------------------------------------ */

/* Input row of kernel row kh (inside the image) of the output row p describes. */
static inline const float *dw_xrow(const af_dw_row *p, int64_t kh) {
    return p->xrows ? p->xrows[kh] : p->x + (p->oh * p->sh - p->ph + kh * p->dh) * p->w * p->c;
}

/* The epilogue's leading Relu or Clip on n sums in registers (cl = {lo, hi}), as the GEMM's
 * micro-kernels apply it: a pass over the stored block for it cost 3x3 layers of 32 to 72
 * channels about a tenth of their time. */
#define DW_CLAMP(acc, n, cl)                                                                       \
    do {                                                                                          \
        vf lo_ = vsplat((cl)[0]), hi_ = vsplat((cl)[1]);                                          \
        for (int i_ = 0; i_ < (n); i_++) (acc)[i_] = vm_min(hi_, vm_max(lo_, (acc)[i_]));         \
    } while (0)

/* Channels [c0, c0 + nc) of outputs ow0 .. ow0 + NB - 1, all of whose kernel columns are inside
 * the row (checked by the caller); the outputs share each weight vector load. Each output's
 * sum is a chain of dependent FMAs (one per tap), and the NB chains are what the two FMA ports
 * overlap: 8 instead of 4 took a 5x5 layer of 12x12x1632 from 28 to 25.6 TSC cycles per output
 * vector (alone, in L2). What bounds it then is the L2: each output row reads its KH input
 * rows again. */
static inline __attribute__((always_inline)) void dw_block(const int NB, const af_dw_row *p,
                                                          int64_t khlo, int64_t khhi, int64_t ow0,
                                                          int64_t c0, int64_t nc, const float *cl) {
    const int64_t c = p->c;
    vf acc[8];
    vf bv = p->bias ? (nc == VW ? vload(p->bias + c0) : vload_part(p->bias + c0, nc)) : (vf){0};
    for (int i = 0; i < NB; i++) acc[i] = bv;
    for (int64_t kh = khlo; kh < khhi; kh++) {
        const float *xr = dw_xrow(p, kh);
        if (!xr) continue;
        xr += c0;
        const float *wr = p->wt + kh * p->kw * c + c0;
        for (int64_t kw = 0; kw < p->kw; kw++) {
            vf wv = nc == VW ? vload(wr + kw * c) : vload_part(wr + kw * c, nc);
            const float *xp = xr + (ow0 * p->sw - p->pw + kw * p->dw) * c;
            for (int i = 0; i < NB; i++) {
                const float *q = xp + i * p->sw * c;
                acc[i] += (nc == VW ? vload(q) : vload_part(q, nc)) * wv;
            }
        }
    }
    if (cl) DW_CLAMP(acc, NB, cl);
    for (int i = 0; i < NB; i++) {
        float *y = p->y + (ow0 + i) * c + c0;
        if (nc == VW) vstore(y, acc[i]);
        else vstore_part(y, acc[i], nc);
    }
}

/* The same for stride SW (1 or 2) and dilation 1 with KW kernel columns: the (NB - 1) * SW + KW
 * input columns a kernel row covers are each loaded once and shared by the NB outputs and KW taps
 * (27 loads per 36 FMAs for 3x3, stride 1 and 4 outputs instead of 45; 19 per 40 for 5x5,
 * stride 2 and 8 outputs instead of 45: a stride-2 layer ran each output's own loads before,
 * and its edge columns one at a time, and took about twice ONNX Runtime's time). */
static inline __attribute__((always_inline)) void dw_block_s1(const int NB, const int KW,
                                                             const int SW, const int FULL,
                                                             const int EDGE, const af_dw_row *p,
                                                             int64_t khlo, int64_t khhi,
                                                             int64_t ow0, int64_t c0, int64_t nc,
                                                             const float *cl) {
#define DW_LD(q) (FULL ? vload(q) : vload_part(q, nc))
    const int64_t c = p->c;
    const int NX = (NB - 1) * SW + KW;
    vf acc[8];
    vf bv = p->bias ? DW_LD(p->bias + c0) : (vf){0};
    for (int i = 0; i < NB; i++) acc[i] = bv;
    /* EDGE: some input columns lie in the padding; they are zeros (adding 0 * w to a sum
     * leaves it as it was, up to the sign of a zero), so an edge block runs as an inner one. */
    bool in[7 * 2 + 5];
    const int64_t iw0 = ow0 * SW - p->pw;
    for (int q = 0; q < NX; q++) in[q] = !EDGE || (iw0 + q >= 0 && iw0 + q < p->w);
    for (int64_t kh = khlo; kh < khhi; kh++) {
        /* one pointer stepped by c: 12 precomputed column pointers spilled to vector registers,
         * and moving them back took the FMA ports */
        const float *xq = dw_xrow(p, kh);
        if (!xq) continue;
        xq += iw0 * c + c0;
        const float *wq = p->wt + kh * KW * c + c0;
        vf wv[5];
        _Pragma("GCC unroll 5") for (int kw = 0; kw < KW; kw++, wq += c) wv[kw] = DW_LD(wq);
        if (SW == 1 && VW == 16) { /* every column, then every tap (measured faster than below
                                    * at stride 1 with AVX-512's 32 registers; with AVX2's 16 the
                                    * 10 columns, 8 sums and 3 weights spilled: 3x3 on 32
                                    * channels at 112x112 took 0.186 ms, ONNX Runtime 0.135) */
            vf xv[8 + 4];
            for (int q = 0; q < NX; q++, xq += c) xv[q] = in[q] ? DW_LD(xq) : (vf){0};
            for (int kw = 0; kw < KW; kw++)
                for (int i = 0; i < NB; i++) acc[i] += xv[i + kw] * wv[kw];
            continue;
        }
        /* Else input column by input column, into every output whose window it is in;
         * each column is used as soon as it is loaded, so only KW weights, NB sums and a
         * column or two are live (all 19 columns of 5x5 held at once spilled). */
        _Pragma("GCC unroll 20") for (int q = 0; q < NX; q++, xq += c) {
            vf xv = in[q] ? DW_LD(xq) : (vf){0};
            _Pragma("GCC unroll 5") for (int kw = 0; kw < KW; kw++)
                if (q >= kw && (q - kw) % SW == 0 && (q - kw) / SW < NB) acc[(q - kw) / SW] += xv * wv[kw];
        }
    }
    if (cl) DW_CLAMP(acc, NB, cl);
    for (int i = 0; i < NB; i++) {
        float *y = p->y + (ow0 + i) * c + c0;
        if (FULL) vstore(y, acc[i]);
        else vstore_part(y, acc[i], nc);
    }
#undef DW_LD
}

/* Whether dw_block_s1 takes p: stride 1 or 2 and dilation 1 along the row, 3 or 5 kernel
 * columns. */
static bool dw_s1(const af_dw_row *p) {
    return (p->sw == 1 || p->sw == 2) && p->dw == 1 && (p->kw == 3 || p->kw == 5);
}

/* A block of NB outputs (NB a constant at each call, so the loops unroll); edge: some of their
 * windows reach into the padding (dw_block_s1 only). */
static inline __attribute__((always_inline)) void dw_blocks(const int NB, const af_dw_row *p,
                                                           int64_t khlo, int64_t khhi, int64_t ow,
                                                           int64_t cc, int64_t ce, bool edge,
                                                           const float *cl) {
    for (int64_t c0 = cc; c0 < ce; c0 += VW) {
        int64_t nc = ce - c0 < VW ? ce - c0 : VW;
        bool full = nc == VW;
#define DW_S1(KW, SW, FULL, EDGE) dw_block_s1(NB, KW, SW, FULL, EDGE, p, khlo, khhi, ow, c0, nc, cl)
#define DW_KW(KW, SW) full ? (edge ? DW_S1(KW, SW, 1, 1) : DW_S1(KW, SW, 1, 0)) : (edge ? DW_S1(KW, SW, 0, 1) : DW_S1(KW, SW, 0, 0))
        if (!dw_s1(p)) dw_block(NB, p, khlo, khhi, ow, c0, nc, cl);
        else if (p->sw == 1) p->kw == 3 ? DW_KW(3, 1) : DW_KW(5, 1);
        else p->kw == 3 ? DW_KW(3, 2) : DW_KW(5, 2);
#undef DW_KW
#undef DW_S1
    }
}

/* First index i >= 0 with lo <= base + i * step, for step > 0. */
static int64_t first_at_least(int64_t base, int64_t step, int64_t lo) {
    return base >= lo ? 0 : (lo - base + step - 1) / step;
}

/* Channels [c0, ce) of output ow, over the kernel columns inside the row only (the edge
 * columns), four vectors of channels at a time: four independent sums, where one sum per call
 * waited on its own FMA latency at every tap. The column range and the row pointers are worked
 * out once, outside the loops (recomputing them per tap took about 20 instructions per FMA).
 * Together these made the edge columns of a 12-wide 5x5 layer 3x cheaper. */
static void dw_one(const af_dw_row *p, int64_t khlo, int64_t khhi, int64_t ow, int64_t c0,
                   int64_t ce, const float *cl) {
    const int64_t c = p->c, iw0 = ow * p->sw - p->pw, xs = p->dw * c;
    int64_t kwlo = first_at_least(iw0, p->dw, 0), kwhi = p->kw;
    while (kwhi > kwlo && iw0 + (kwhi - 1) * p->dw >= p->w) kwhi--;
    for (; c0 + 4 * VW <= ce; c0 += 4 * VW) {
        vf acc[4];
        for (int i = 0; i < 4; i++) acc[i] = p->bias ? vload(p->bias + c0 + i * VW) : (vf){0};
        for (int64_t kh = khlo; kh < khhi; kh++) {
            const float *q = dw_xrow(p, kh);
            if (!q) continue;
            q += iw0 * c + c0;
            const float *wq = p->wt + kh * p->kw * c + c0;
            for (int64_t kw = kwlo; kw < kwhi; kw++)
                for (int i = 0; i < 4; i++)
                    acc[i] += vload(q + kw * xs + i * VW) * vload(wq + kw * c + i * VW);
        }
        if (cl) DW_CLAMP(acc, 4, cl);
        for (int i = 0; i < 4; i++) vstore(p->y + ow * c + c0 + i * VW, acc[i]);
    }
    for (; c0 < ce; c0 += VW) {
        int64_t nc = ce - c0 < VW ? ce - c0 : VW;
        vf acc = p->bias ? vload_part(p->bias + c0, nc) : (vf){0};
        for (int64_t kh = khlo; kh < khhi; kh++) {
            const float *q = dw_xrow(p, kh);
            if (!q) continue;
            q += iw0 * c + c0;
            const float *wq = p->wt + kh * p->kw * c + c0;
            for (int64_t kw = kwlo; kw < kwhi; kw++)
                acc += vload_part(q + kw * xs, nc) * vload_part(wq + kw * c, nc);
        }
        if (cl) DW_CLAMP(&acc, 1, cl);
        vstore_part(p->y + ow * c + c0, acc, nc);
    }
}

/* Channels per pass over the row when the weights of all of them are more than a third of L1
 * (16 KB): 4 vectors' worth, whose weights (6.4 KB for 5x5) stay in L1 while every output
 * column of the row uses them; passing over all the channels at each column read the whole
 * weight set (96 KB at 960 channels, 5x5) from L2 every four outputs (13-16% slower there).
 * Smaller sets stay in L1 anyway, and one pass reads each input position once. */
static int64_t dw_chunk(const af_dw_row *p) {
    return p->kh * p->kw * p->c * 4 > 16384 ? 4 * VW : p->c;
}

/* The epilogue over outputs [ow, ow + nb) of channels [cc, ce). */
static void dw_ep(const af_dw_row *p, int64_t ow, int64_t nb, int64_t cc, int64_t ce) {
    if (p->ep && (p->ep->nsteps || p->ep->generic))
        ep_tile(p->ep, p->y + ow * p->c + cc, p->c, p->row0 + ow, cc, nb, ce - cc);
}

/* The pooled mean's sums of outputs [ow, ow + nb), channels [cc, ce): each vector of sums read
 * and written once for the nb outputs (per output, the masked store of a partial vector made
 * the next output's load wait for it: 7% of EfficientNet-B4's 24-channel block). */
static void dw_sum(const af_dw_row *p, int64_t ow, int64_t nb, int64_t cc, int64_t ce) {
    if (!p->sum) return;
    const float *y = p->y + ow * p->c;
    for (int64_t c0 = cc; c0 < ce; c0 += VW) {
        int64_t n = ce - c0 < VW ? ce - c0 : VW;
        vf acc = n == VW ? vload(p->sum + c0) : vload_part(p->sum + c0, n);
        for (int64_t i = 0; i < nb; i++)
            acc += n == VW ? vload(y + i * p->c + c0) : vload_part(y + i * p->c + c0, n);
        if (n == VW) vstore(p->sum + c0, acc);
        else vstore_part(p->sum + c0, acc, n);
    }
}

/* Block by block along the row, each block through the epilogue and into the sums while it is
 * in L1. */
static void dw_row(const af_dw_row *pin) {
    /* A leading Relu or Clip of the epilogue runs in registers (DW_CLAMP); the rest after each
     * block, through ep_tile, from a copy of the program without it. */
    af_dw_row pr = *pin;
    const af_dw_row *p = &pr;
    af_vep rest;
    float clamp[2];
    const float *cl = NULL;
    const af_vep *e = pin->ep;
    if (e && !e->generic && e->nsteps > 0 && e->steps[0].kind == AF_VEP_NONE &&
        (e->steps[0].op == AF_EP_RELU || e->steps[0].op == AF_EP_CLIP)) {
        clamp[0] = e->steps[0].op == AF_EP_RELU ? 0.0f : e->steps[0].p0;
        clamp[1] = e->steps[0].op == AF_EP_RELU ? INFINITY : e->steps[0].p1;
        cl = clamp;
        memcpy(&rest, e, offsetof(af_vep, steps));
        rest.nsteps = e->nsteps - 1;
        memcpy(rest.steps, e->steps + 1, sizeof(af_vep_step) * (size_t)rest.nsteps);
        pr.ep = &rest;
    }
    const int64_t ih0 = p->oh * p->sh - p->ph, span = (p->kw - 1) * p->dw;
    /* Kernel rows inside the image, and the output columns whose whole window is inside. */
    int64_t khlo = first_at_least(ih0, p->dh, 0), khhi = p->kh;
    while (khhi > khlo && ih0 + (khhi - 1) * p->dh >= p->h) khhi--;
    int64_t owlo = first_at_least(-p->pw, p->sw, 0), owhi = owlo;
    while (owhi < p->ow && owhi * p->sw - p->pw + span < p->w) owhi++;
    const int64_t chunk = dw_chunk(p);
    /* Eight or four outputs share their loads: any eight with stride 1 or 2 (the padding read as
     * zeros; edge columns one at a time were twice as slow per vector, a third of a 12-wide 5x5
     * row), else whole windows only; a leftover column goes alone. */
    const bool s1 = dw_s1(p);
    const int64_t lo = s1 ? 0 : owlo, hi = s1 ? p->ow : owhi;
    for (int64_t cc = 0; cc < p->c; cc += chunk) {
        int64_t ce = p->c - cc < chunk ? p->c : cc + chunk;
        for (int64_t ow = 0; ow < p->ow;) {
            int nb = ow >= lo && ow + 8 <= hi ? 8 : ow >= lo && ow + 4 <= hi ? 4 : 1;
            bool edge = ow < owlo || ow + nb > owhi;
            if (nb == 8) dw_blocks(8, p, khlo, khhi, ow, cc, ce, edge, cl);
            else if (nb == 4) dw_blocks(4, p, khlo, khhi, ow, cc, ce, edge, cl);
            else dw_one(p, khlo, khhi, ow, cc, ce, cl);
            dw_ep(p, ow, nb, cc, ce);
            dw_sum(p, ow, nb, cc, ce);
            ow += nb;
        }
    }
}

/* ---- Winograd F(4x4, 3x3) transforms ----------------------------------------------------------------
 * The matrices of Lavin and Gray (points 0, +-1, +-2, infinity):
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
 * (G, for the weights, is applied once at packing time: passes/lower.c.) */

static inline void bt6(const vf *d, vf *t) {
    t[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    t[1] = -4.0f * (d[1] + d[2]) + d[3] + d[4];
    t[2] = 4.0f * (d[1] - d[2]) - d[3] + d[4];
    t[3] = 2.0f * (d[3] - d[1]) - d[2] + d[4];
    t[4] = 2.0f * (d[1] - d[3]) - d[2] + d[4];
    t[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
}

static inline void at6(const vf *m, vf *o) {
    vf s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
    o[0] = m[0] + s12 + s34;
    o[1] = d12 + 2.0f * d34;
    o[2] = s12 + 4.0f * s34;
    o[3] = d12 + 8.0f * d34 + m[5];
}

static inline vf vload_n(const float *p, int64_t n) {
    return n == VW ? vload(p) : vload_part(p, n);
}

static inline void vstore_n(float *p, vf v, int64_t n) {
    if (n == VW) vstore(p, v);
    else vstore_part(p, v, n);
}

static void wino_in(const float *x, int64_t rs, int64_t c, float *v, int64_t vs) {
    for (int64_t k = 0; k < c; k += VW) {
        int64_t n = c - k < VW ? c - k : VW;
        vf t[6][6], col[6], r[6];
        for (int j = 0; j < 6; j++) { /* B^T d: down each column of the patch */
            for (int i = 0; i < 6; i++) col[i] = vload_n(x + i * rs + j * c + k, n);
            bt6(col, r);
            for (int i = 0; i < 6; i++) t[i][j] = r[i];
        }
        for (int i = 0; i < 6; i++) { /* (B^T d) B: along each row */
            bt6(t[i], r);
            for (int j = 0; j < 6; j++) vstore_n(v + (i * 6 + j) * vs + k, r[j], n);
        }
    }
}

static void wino_out(const float *m, int64_t ms, int64_t c, float *y) {
    for (int64_t k = 0; k < c; k += VW) {
        int64_t n = c - k < VW ? c - k : VW;
        vf t[4][6], row[6], r[4];
        for (int j = 0; j < 6; j++) {
            for (int i = 0; i < 6; i++) row[i] = vload_n(m + (i * 6 + j) * ms + k, n);
            at6(row, r);
            for (int i = 0; i < 4; i++) t[i][j] = r[i];
        }
        for (int i = 0; i < 4; i++) {
            at6(t[i], r);
            for (int j = 0; j < 4; j++) vstore_n(y + (i * 4 + j) * c + k, r[j], n);
        }
    }
}

/* ---- grouped convolution rows (af_grp_row) ------------------------------------------------------ */

/* v's lanes picked by idx: lane l of the result is v[idx[l]]. */
#if (defined(__AVX512F__) && VW == 16) || (defined(__AVX2__) && VW == 8)
#if VW == 16
typedef __m512 vperm_f;
typedef __m512i vperm_i;
#define VPERM(x, i) _mm512_permutexvar_ps(i, x)
#else
typedef __m256 vperm_f;
typedef __m256i vperm_i;
#define VPERM(x, i) _mm256_permutevar8x32_ps(x, i)
#endif
static inline vf vperm(vf v, vi idx) {
    vperm_f x;
    vperm_i i;
    memcpy(&x, &v, sizeof x);
    memcpy(&i, &idx, sizeof i);
    x = VPERM(x, i);
    memcpy(&v, &x, sizeof v);
    return v;
}
#else
static inline vf vperm(vf v, vi idx) {
    vf r;
    for (int l = 0; l < VW; l++) r[l] = v[idx[l]];
    return r;
}
#endif

/* Outputs per block at most: with G x P accumulators and P loads of X in registers. */
#define GRP_MAXP (VW == 16 ? 8 : 4)

/* Outputs [o0, o0 + P) of lanes [v0, v0 + nl): G accumulators per output (see af_grp_row),
 * rotated back by rot[d] and summed. */
static inline __attribute__((always_inline)) void grp_block(const int G, const int P,
                                                             const af_grp_row *p, int64_t o0,
                                                             int64_t v0, int64_t nl, const vi *rot) {
    /* (the loops over q and d unrolled: the accumulators must be registers) */
    vf acc[GRP_MAXP][8];
    _Pragma("GCC unroll 8") for (int q = 0; q < P; q++)
        _Pragma("GCC unroll 8") for (int d = 0; d < G; d++) acc[q][d] = (vf){0};
    const int64_t c = p->c, xs = p->xs;
    const float *x0 = p->x + o0 * xs + v0;
    const float *wb = p->wt + (v0 / AF_GRP_LANES * p->ntaps * G * AF_GRP_LANES + v0 % AF_GRP_LANES);
    for (int64_t t = 0; t < p->ntaps; t++, wb += G * AF_GRP_LANES) {
        const float *xb = x0 + p->taps[t];
        vf xv[GRP_MAXP];
        _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) xv[q] = vload_n(xb + q * xs, nl);
        _Pragma("GCC unroll 8") for (int d = 0; d < G; d++) {
            vf wv = vload(wb + d * AF_GRP_LANES); /* (the block's lanes past C are zeros) */
            _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) acc[q][d] += xv[q] * wv;
        }
    }
    _Pragma("GCC unroll 8") for (int q = 0; q < P; q++) {
        vf s = acc[q][0];
        _Pragma("GCC unroll 8") for (int d = 1; d < G; d++) s += vperm(acc[q][d], rot[d]);
        vstore_n(p->y + (o0 + q) * c + v0, s, nl);
    }
}

/* The row for one G that divides VW: P outputs at a time as registers allow (G x P
 * accumulators), channel vector by channel vector (a vector's weights stay in L1 along the row;
 * a partial last vector holds whole groups, its other lanes zeros). */
static inline __attribute__((always_inline)) void grp_row_g(const int G, const af_grp_row *p) {
    enum { ACC = VW == 16 ? 24 : 12 }; /* accumulators: of 32 or 16 vector registers */
    const int P = ACC / G < GRP_MAXP ? ACC / G : GRP_MAXP;
    vi rot[8];
    for (int d = 0; d < G; d++)
        for (int l = 0; l < VW; l++) rot[d][l] = l - l % G + (l % G - d + G) % G;
    for (int64_t v0 = 0; v0 < p->c; v0 += VW) {
        int64_t nl = p->c - v0 < VW ? p->c - v0 : VW, o = 0;
        for (; o + P <= p->ow; o += P) grp_block(G, P, p, o, v0, nl, rot);
        for (; o < p->ow; o++) grp_block(G, 1, p, o, v0, nl, rot);
    }
}

/* Any G (a G that does not divide VW: one output at a time, scalar). */
static void grp_row_any(const af_grp_row *p) {
    const int64_t c = p->c, gw = p->g;
    for (int64_t o = 0; o < p->ow; o++)
        for (int64_t j = 0; j < c; j++) {
            int64_t gi = j / gw, m = j % gw;
            float s = 0.0f;
            for (int64_t t = 0; t < p->ntaps; t++)
                for (int64_t ci = 0; ci < gw; ci++)
                    s += p->x[o * p->xs + p->taps[t] + gi * gw + ci] *
                         p->wt[((j / AF_GRP_LANES * p->ntaps + t) * gw + (m - ci + gw) % gw) * AF_GRP_LANES +
                               (gi * gw + ci) % AF_GRP_LANES];
            p->y[o * c + j] = s;
        }
}

static void grp_row(const af_grp_row *p) {
    if (p->g == 2 && VW % 2 == 0) grp_row_g(2, p);
    else if (p->g == 4 && VW % 4 == 0) grp_row_g(4, p);
    else if (p->g == 8 && VW % 8 == 0) grp_row_g(8, p);
    else grp_row_any(p);
    if (p->ep && (p->ep->nsteps || p->ep->generic)) ep_tile(p->ep, p->y, p->c, p->row0, 0, p->ow, p->c);
}

/* ---- pooling -------------------------------------------------------------------------------------- */

/* Window positions kk < k at o * s - pb + kk inside [lo, hi). */
static int64_t window_count(int64_t o, int64_t s, int64_t pb, int64_t k, int64_t lo, int64_t hi) {
    int64_t a = o * s - pb, b = a + k;
    a = a > lo ? a : lo;
    b = b < hi ? b : hi;
    return b > a ? b - a : 0;
}

/* One output of a pooling row over the window [hlo, hhi) x [wlo, whi): four vectors of channels
 * at a time, four independent chains of max or add (one vector at a time waited on each op's
 * latency at every window position: SqueezeNet's 3x3 MaxPools took 1.5x ONNX Runtime's time). */
static inline __attribute__((always_inline)) void pool_out(const int MAX, const af_pool_row *p,
                                                         int64_t hlo, int64_t hhi, int64_t wlo,
                                                         int64_t whi, int64_t ow, float scale) {
    const int64_t c = p->c;
    for (int64_t c0 = 0; c0 < c; c0 += 4 * VW) {
        int64_t nv = (c - c0 + VW - 1) / VW, last;
        if (nv > 4) nv = 4;
        last = c - c0 - (nv - 1) * VW; /* floats of the last vector, 1..VW */
        vf acc[4];
        for (int v = 0; v < 4; v++) acc[v] = vsplat(MAX ? -INFINITY : 0.0f);
        for (int64_t ih = hlo; ih < hhi; ih++)
            for (int64_t iw = wlo; iw < whi; iw++) {
                const float *q = p->x + (ih * p->w + iw) * c + c0;
                for (int v = 0; v < 4; v++) {
                    if (v >= nv) break;
                    vf x = v == nv - 1 && last < VW ? vload_part(q + v * VW, last) : vload(q + v * VW);
                    acc[v] = MAX ? vm_max(acc[v], x) : acc[v] + x;
                }
            }
        float *y = p->y + ow * c + c0;
        for (int v = 0; v < 4; v++) {
            if (v >= nv) break;
            vf r = MAX ? acc[v] : acc[v] * vsplat(scale);
            if (v == nv - 1 && last < VW) vstore_part(y + v * VW, r, last);
            else vstore(y + v * VW, r);
        }
    }
}

static void pool_row(const af_pool_row *p) {
    const int64_t ih0 = p->oh * p->sh - p->ph;
    int64_t hlo = ih0 < 0 ? 0 : ih0, hhi = ih0 + p->kh < p->h ? ih0 + p->kh : p->h;
    for (int64_t ow = 0; ow < p->ow; ow++) {
        int64_t iw0 = ow * p->sw - p->pw;
        int64_t wlo = iw0 < 0 ? 0 : iw0, whi = iw0 + p->kw < p->w ? iw0 + p->kw : p->w;
        int64_t count = p->include_pad
                            ? window_count(p->oh, p->sh, p->ph, p->kh, -p->ph, p->h + p->pe_h) *
                                  window_count(ow, p->sw, p->pw, p->kw, -p->pw, p->w + p->pe_w)
                            : (hhi - hlo) * (whi - wlo);
        float scale = count > 0 ? 1.0f / (float)count : 0.0f;
        if (p->max) pool_out(1, p, hlo, hhi, wlo, whi, ow, scale);
        else pool_out(0, p, hlo, hhi, wlo, whi, ow, scale);
    }
}

static void reduce_rows(const float *x, int64_t rows, int64_t cols, int max, float *out) {
    for (int64_t j = 0; j < cols; j += VW) {
        int64_t nc = cols - j < VW ? cols - j : VW;
        vf acc = nc == VW ? vload(x + j) : vload_part(x + j, nc);
        for (int64_t r = 1; r < rows; r++) {
            const float *q = x + r * cols + j;
            vf v = nc == VW ? vload(q) : vload_part(q, nc);
            acc = max ? vm_max(acc, v) : acc + v;
        }
        if (nc == VW) vstore(out + j, acc);
        else vstore_part(out + j, acc, nc);
    }
}

static void scale_rows(const float *x, const float *s, int64_t rows, int64_t cols, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        vf f = vsplat(s[r]);
        int64_t j = 0;
        for (; j + VW <= cols; j += VW) vstore(yr + j, vload(xr + j) * f);
        if (j < cols) vstore_part(yr + j, vload_part(xr + j, cols - j) * f, cols - j);
    }
}

/* ---- reductions ----------------------------------------------------------------------------------- */

static inline float red_identity(int kind) {
    switch (kind) {
    case AF_VRED_PROD: return 1.0f;
    case AF_VRED_MAX: return -INFINITY;
    case AF_VRED_MIN: return INFINITY;
    default: return 0.0f;
    }
}

/* acc (fold) v; a NaN already in acc stays (vm_max / vm_min give their second operand, v, when
 * either is NaN, so a NaN in v is taken). */
static inline __attribute__((always_inline)) vf red_step(const int kind, vf acc, vf v, vf shift) {
    switch (kind) {
    case AF_VRED_ABS: return acc + vm_abs(v);
    case AF_VRED_SQ: return acc + v * v;
    case AF_VRED_EXP: return acc + vm_exp(v - shift);
    case AF_VRED_PROD: return acc * v;
    case AF_VRED_MAX: return vm_select(acc != acc, acc, vm_max(acc, v));
    case AF_VRED_MIN: return vm_select(acc != acc, acc, vm_min(acc, v));
    default: return acc + v;
    }
}

/* How the lanes (or accumulators) of a fold combine: sums add, the others fold again. */
static inline __attribute__((always_inline)) vf red_join(const int kind, vf a, vf b) {
    switch (kind) {
    case AF_VRED_PROD: return a * b;
    case AF_VRED_MAX: return red_step(AF_VRED_MAX, a, b, b);
    case AF_VRED_MIN: return red_step(AF_VRED_MIN, a, b, b);
    default: return a + b;
    }
}

/* The kind is a constant in each instance (one per case of reduce_run's switch), so the loop
 * holds no branch on it. Four accumulators: a sum's add latency is not the bound. */
static inline __attribute__((always_inline)) float red_run_k(const int kind, const float *x,
                                                             int64_t n, float shift) {
    const vf id = vsplat(red_identity(kind)), sh = vsplat(shift);
    vf a0 = id, a1 = id, a2 = id, a3 = id;
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        a0 = red_step(kind, a0, vload(x + i), sh);
        a1 = red_step(kind, a1, vload(x + i + VW), sh);
        a2 = red_step(kind, a2, vload(x + i + 2 * VW), sh);
        a3 = red_step(kind, a3, vload(x + i + 3 * VW), sh);
    }
    for (; i + VW <= n; i += VW) a0 = red_step(kind, a0, vload(x + i), sh);
    if (i < n) { /* the padding lanes hold the identity (EXP: -inf, e^-inf = 0) */
        vi lane;
        for (int l = 0; l < VW; l++) lane[l] = l;
        vf pad = kind == AF_VRED_EXP ? vsplat(-INFINITY) : id;
        a1 = red_step(kind, a1, vm_select(lane < (int32_t)(n - i), vload_part(x + i, n - i), pad), sh);
    }
    vf a = red_join(kind, red_join(kind, a0, a1), red_join(kind, a2, a3));
    float r = a[0];
    for (int l = 1; l < VW; l++) r = red_join(kind, vsplat(r), vsplat(a[l]))[0];
    return r;
}

static float reduce_run(int kind, const float *x, int64_t n, float shift) {
    switch (kind) {
    case AF_VRED_ABS: return red_run_k(AF_VRED_ABS, x, n, shift);
    case AF_VRED_SQ: return red_run_k(AF_VRED_SQ, x, n, shift);
    case AF_VRED_EXP: return red_run_k(AF_VRED_EXP, x, n, shift);
    case AF_VRED_PROD: return red_run_k(AF_VRED_PROD, x, n, shift);
    case AF_VRED_MAX: return red_run_k(AF_VRED_MAX, x, n, shift);
    case AF_VRED_MIN: return red_run_k(AF_VRED_MIN, x, n, shift);
    default: return red_run_k(AF_VRED_SUM, x, n, shift);
    }
}

static inline __attribute__((always_inline)) void red_acc_k(const int kind, const float *x,
                                                            int64_t n, float *acc,
                                                            const float *shift) {
    int64_t j = 0;
    vf sh = {0};
    for (; j + VW <= n; j += VW) {
        vf v = vload(x + j);
        if (kind == AF_VRED_EXP) sh = vload(shift + j);
        if (kind == AF_VRED_SQ && shift) v -= vload(shift + j);
        vstore(acc + j, red_step(kind, vload(acc + j), v, sh));
    }
    if (j < n) { /* lanes past n are computed on zeros and not stored */
        vf v = vload_part(x + j, n - j);
        if (kind == AF_VRED_EXP) sh = vload_part(shift + j, n - j);
        if (kind == AF_VRED_SQ && shift) v -= vload_part(shift + j, n - j);
        vstore_part(acc + j, red_step(kind, vload_part(acc + j, n - j), v, sh), n - j);
    }
}

static void reduce_acc(int kind, const float *x, int64_t n, float *acc, const float *shift) {
    switch (kind) {
    case AF_VRED_ABS: red_acc_k(AF_VRED_ABS, x, n, acc, shift); break;
    case AF_VRED_SQ: red_acc_k(AF_VRED_SQ, x, n, acc, shift); break;
    case AF_VRED_EXP: red_acc_k(AF_VRED_EXP, x, n, acc, shift); break;
    case AF_VRED_PROD: red_acc_k(AF_VRED_PROD, x, n, acc, shift); break;
    case AF_VRED_MAX: red_acc_k(AF_VRED_MAX, x, n, acc, shift); break;
    case AF_VRED_MIN: red_acc_k(AF_VRED_MIN, x, n, acc, shift); break;
    default: red_acc_k(AF_VRED_SUM, x, n, acc, shift); break;
    }
}

/* Lanes 0, 2, 4, ... of the 2 * VW floats at p: a stride-2 gather from two plain loads. */
static inline vf vload_even(const float *p) {
    vf a = vload(p), b = vload(p + VW);
#if VW == 16
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
#elif VW == 8
    return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
#else
    return __builtin_shufflevector(a, b, 0, 2, 4, 6);
#endif
}

/* One output of pool_line, every tap tested (the borders, strides above 2). */
static inline float pool_one(const float *x, int64_t n, int64_t o, int64_t k, int64_t s,
                             int64_t d, int64_t pb, int max) {
    float acc = max ? -INFINITY : 0.0f;
    bool first = true;
    for (int64_t t = 0; t < k; t++) {
        int64_t i = o * s - pb + t * d;
        if (i < 0 || i >= n) continue;
        float v = x[i];
        if (!max) acc += v;
        else if (first || v > acc) acc = v;
        first = false;
    }
    return acc;
}

static void pool_line(const float *x, int64_t n, float *y, int64_t m, int64_t k, int64_t s,
                      int64_t d, int64_t pb, int max, const float *scale) {
    /* [lo, hi): the outputs whose every tap is inside x */
    int64_t lo = (pb + s - 1) / s, last = n - 1 - (k - 1) * d + pb;
    int64_t hi = last < 0 ? 0 : last / s + 1;
    hi = hi < m ? hi : m;
    lo = lo < hi ? lo : hi;
    int64_t o = 0;
    for (; o < lo; o++) y[o] = pool_one(x, n, o, k, s, d, pb, max);
    /* whole vectors of outputs; stride 2 loads 2 VW floats per tap, so its last vector stops
     * where that would pass the end of x */
    if (s <= 2)
        for (; o + VW <= hi && (s == 1 || o * 2 - pb + (k - 1) * d + 2 * VW <= n); o += VW) {
            const float *q = x + o * s - pb;
            vf acc = s == 1 ? vload(q) : vload_even(q);
            for (int64_t t = 1; t < k; t++) {
                vf v = s == 1 ? vload(q + t * d) : vload_even(q + t * d);
                acc = max ? vm_max(v, acc) : acc + v;
            }
            vstore(y + o, acc);
        }
    /* the rest of the inside outputs, fewer than a vector: masked loads of the taps' elements
     * (every one inside x), stride 2 gathering even lanes from two of them */
    if (s <= 2 && o < hi) {
        int64_t nc = hi - o, span = s * (nc - 1) + 1;
        const float *q = x + o * s - pb;
        vf acc = {0};
        for (int64_t t = 0; t < k; t++) {
            const float *r = q + t * d;
            vf v;
            if (s == 1) {
                v = vload_part(r, nc);
            } else {
                vf a = vload_part(r, span < VW ? span : VW), b = vload_part(r + VW, span > VW ? span - VW : 0);
#if VW == 16
                v = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
#elif VW == 8
                v = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
#else
                v = __builtin_shufflevector(a, b, 0, 2, 4, 6);
#endif
            }
            acc = t == 0 ? v : max ? vm_max(v, acc) : acc + v;
        }
        vstore_part(y + o, acc, nc);
        o = hi;
    }
    for (; o < m; o++) y[o] = pool_one(x, n, o, k, s, d, pb, max);
    if (scale) {
        int64_t i = 0;
        for (; i + VW <= m; i += VW) vstore(y + i, vload(y + i) * vload(scale + i));
        for (; i < m; i++) y[i] *= scale[i];
    }
}

/* Mean, then the squared deviations from it (not E[x^2] - mean^2, which cancels). */
static void moments(const float *x, int64_t n, float *mean, float *var) {
    float m = red_run_k(AF_VRED_SUM, x, n, 0.0f) / (float)n;
    vf mv = vsplat(m), a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        vf d0 = vload(x + i) - mv, d1 = vload(x + i + VW) - mv;
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    for (; i + VW <= n; i += VW) {
        vf d = vload(x + i) - mv;
        a0 += d * d;
    }
    float q = vsum(a0 + a1);
    for (; i < n; i++) q += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = q / (float)n;
}

/* (x - mean) k + bias, not x k + (bias - mean k): that one loses the digits of a plane whose
 * mean is large against its spread. */
static void norm_affine(const float *x, float *y, int64_t n, float mean, float k, float bias) {
    vf m = vsplat(mean), kv = vsplat(k), bv = vsplat(bias);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vstore(y + i, (vload(x + i) - m) * kv + bv);
    if (i < n) vstore_part(y + i, (vload_part(x + i, n - i) - m) * kv + bv, n - i);
}

/* ---- broadcast rows --------------------------------------------------------------------------- */

/* a (op) b as the reference kernel computes it (in double, rounded: the same bits for these
 * ops); MAX and MIN return the first NaN operand (maxps(a, b) already returns b when either
 * is NaN). */
static inline __attribute__((always_inline)) vf vbin(int op, vf a, vf b) {
    switch (op) {
    case AF_VBIN_ADD: return a + b;
    case AF_VBIN_SUB: return a - b;
    case AF_VBIN_MUL: return a * b;
    case AF_VBIN_DIV: return a / b;
    case AF_VBIN_MAX: return vm_select(a != a, a, vm_max(a, b));
    case AF_VBIN_MIN: return vm_select(a != a, a, vm_min(a, b));
    default: return a;
    }
}

static inline __attribute__((always_inline)) vi vcmp(int op, vf a, vf b) {
    switch (op) {
    case AF_VBIN_EQ: return a == b;
    case AF_VBIN_LT: return a < b;
    case AF_VBIN_GT: return a > b;
    case AF_VBIN_LE: return a <= b;
    default: return a >= b;
    }
}

/* s in every lane, -0 kept (vsplat adds it to +0, which makes -0 +0). */
static inline vf vbcast(float s) {
    vf v;
    for (int l = 0; l < VW; l++) v[l] = s;
    return v;
}

/* Operand p at lane offset i: a vector of s = 1 or the splat of s = 0. */
static inline __attribute__((always_inline)) vf vld_s(const float *p, int64_t s, int64_t i,
                                                      int64_t n) {
    if (!s) return vbcast(p[0]);
    return n == VW ? vload(p + i) : vload_part(p + i, n);
}

/* y[c * ldy + r] = x[r * ldx + c] for r < rows, c < cols: 8 x 8 tiles transposed in registers
 * (eight-float vectors whatever the ISA's width), the edges element by element. Element by
 * element, an NHWC -> NCHW transpose of 112 x 112 x 32 floats ran at 5.8 GB/s on Zen 3
 * (0.28 ms; ONNX Runtime's reorder of it 0.08). */
typedef float v8f __attribute__((vector_size(32)));
#define V8_LD(p) ({ v8f v_; memcpy(&v_, (p), sizeof v_); v_; })
#define V8_ST(p, v) do { v8f v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)
#define V8_MIX(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)

static void transpose(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows,
                      int64_t cols) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            const float *p = x + r * ldx + c;
            v8f a[8], t[8], u[8];
            for (int i = 0; i < 8; i++) a[i] = V8_LD(p + i * ldx);
            /* rows i and i + 1 interleaved, per 128-bit half: columns 0, 1 (4, 5) in t[i],
             * columns 2, 3 (6, 7) in t[i + 1] */
            for (int i = 0; i < 8; i += 2) {
                t[i] = V8_MIX(a[i], a[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
                t[i + 1] = V8_MIX(a[i], a[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
            }
            /* then four rows: u[h + q] holds column q (low half) and q + 4 (high) of rows
             * h .. h + 3 */
            for (int h = 0; h < 8; h += 4)
                for (int i = 0; i < 2; i++) {
                    u[h + 2 * i] = V8_MIX(t[h + i], t[h + i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
                    u[h + 2 * i + 1] = V8_MIX(t[h + i], t[h + i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
                }
            float *q = y + c * ldy + r;
            for (int i = 0; i < 4; i++) { /* the halves of rows 0-3 and 4-7 joined */
                V8_ST(q + i * ldy, V8_MIX(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11));
                V8_ST(q + (i + 4) * ldy, V8_MIX(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15));
            }
        }
        for (; c < cols; c++)
            for (int64_t i = 0; i < 8; i++) y[c * ldy + r + i] = x[(r + i) * ldx + c];
    }
    for (; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) y[c * ldy + r] = x[r * ldx + c];
}
#undef V8_LD
#undef V8_ST
#undef V8_MIX

/* One loop per (op, strides) so that neither is decided inside it. */
#define BIN_LOOP(OP, SA, SB)                                                                     \
    do {                                                                                         \
        int64_t i = 0;                                                                           \
        for (; i + VW <= n; i += VW) vstore(y + i, vbin(OP, vld_s(a, SA, i, VW), vld_s(b, SB, i, VW))); \
        if (i < n)                                                                               \
            vstore_part(y + i, vbin(OP, vld_s(a, SA, i, n - i), vld_s(b, SB, i, n - i)), n - i); \
    } while (0)
#define BIN_STRIDES(OP)                                                                          \
    case OP:                                                                                     \
        if (sa && sb) BIN_LOOP(OP, 1, 1);                                                        \
        else if (sa) BIN_LOOP(OP, 1, 0);                                                         \
        else if (sb) BIN_LOOP(OP, 0, 1);                                                         \
        else BIN_LOOP(OP, 0, 0);                                                                 \
        break

static void binary_row(int op, const float *a, int64_t sa, const float *b, int64_t sb, float *y,
                       int64_t n) {
    switch (op) {
        BIN_STRIDES(AF_VBIN_ADD);
        BIN_STRIDES(AF_VBIN_SUB);
        BIN_STRIDES(AF_VBIN_MUL);
        BIN_STRIDES(AF_VBIN_DIV);
        BIN_STRIDES(AF_VBIN_MAX);
        BIN_STRIDES(AF_VBIN_MIN);
    default: break;
    }
}

static inline void store_mask(uint8_t *y, vi m, int64_t n) {
    for (int64_t l = 0; l < n; l++) y[l] = (uint8_t)(m[l] & 1);
}

#define CMP_LOOP(OP, SA, SB)                                                                     \
    do {                                                                                         \
        int64_t i = 0;                                                                           \
        for (; i + VW <= n; i += VW) store_mask(y + i, vcmp(OP, vld_s(a, SA, i, VW), vld_s(b, SB, i, VW)), VW); \
        if (i < n)                                                                               \
            store_mask(y + i, vcmp(OP, vld_s(a, SA, i, n - i), vld_s(b, SB, i, n - i)), n - i); \
    } while (0)
#define CMP_STRIDES(OP)                                                                          \
    case OP:                                                                                     \
        if (sa && sb) CMP_LOOP(OP, 1, 1);                                                        \
        else if (sa) CMP_LOOP(OP, 1, 0);                                                         \
        else if (sb) CMP_LOOP(OP, 0, 1);                                                         \
        else CMP_LOOP(OP, 0, 0);                                                                 \
        break

static void compare_row(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                        uint8_t *y, int64_t n) {
    switch (op) {
        CMP_STRIDES(AF_VBIN_EQ);
        CMP_STRIDES(AF_VBIN_LT);
        CMP_STRIDES(AF_VBIN_GT);
        CMP_STRIDES(AF_VBIN_LE);
        CMP_STRIDES(AF_VBIN_GE);
    default: break;
    }
}

static void blend_row(const float *const *x, const float *w, int taps, float *y, int64_t n) {
    int64_t i = 0;
    vf w0 = vsplat(w[0]);
    if (taps == 2) { /* linear: the common case, kept apart so that it runs in registers */
        vf w1 = vsplat(w[1]);
        for (; i + VW <= n; i += VW) vstore(y + i, vload(x[0] + i) * w0 + vload(x[1] + i) * w1);
        if (i < n)
            vstore_part(y + i, vload_part(x[0] + i, n - i) * w0 + vload_part(x[1] + i, n - i) * w1,
                        n - i);
        return;
    }
    for (; i < n; i += VW) {
        int64_t m = n - i < VW ? n - i : VW;
        vf acc = (m == VW ? vload(x[0] + i) : vload_part(x[0] + i, m)) * w0;
        for (int k = 1; k < taps; k++)
            acc += (m == VW ? vload(x[k] + i) : vload_part(x[k] + i, m)) * vsplat(w[k]);
        if (m == VW) vstore(y + i, acc);
        else vstore_part(y + i, acc, m);
    }
}

/* ---- softmax --------------------------------------------------------------------------------------- */

/* Lane max (NaN-free v), as a tree. */
static inline float vmax_lanes(vf v) {
    VREDUCE(v, vm_max);
    return v[0];
}

/* Lanes [0, n) of v, -inf in the others. */
static inline vf vpart_or_ninf(vf v, int64_t n) {
    vi lane;
    for (int l = 0; l < VW; l++) lane[l] = l;
    return vm_select(lane < (int32_t)n, v, vsplat(-INFINITY));
}

static float softmax_exp(float *x, int64_t n, float scale) {
    vf mv = vsplat(-INFINITY);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) mv = vm_max(mv, vload(x + i));
    if (i < n) mv = vm_max(mv, vpart_or_ninf(vload_part(x + i, n - i), n - i));
    float m = vmax_lanes(mv);
    vf ms = vsplat(m), sv = vsplat(scale), acc = {0};
    for (i = 0; i + VW <= n; i += VW) {
        vf e = vm_exp((vload(x + i) - ms) * sv);
        vstore(x + i, e);
        acc += e;
    }
    if (i < n) { /* the tail's padding lanes are exp(-inf) = 0 in the sum */
        vf e = vm_exp((vpart_or_ninf(vload_part(x + i, n - i), n - i) - ms) * sv);
        vstore_part(x + i, e, n - i);
        acc += e;
    }
    return vsum(acc);
}

static void softmax_row(float *x, int64_t n) {
    vf inv = vsplat(1.0f / softmax_exp(x, n, 1.0f));
    int64_t i = 0;
    for (; i + VW <= n; i += VW) vstore(x + i, vload(x + i) * inv);
    for (; i < n; i++) x[i] *= inv[0];
}

/* A block of at most VW columns at a time, its rows read three times while in cache. */
static void softmax_cols(const float *x, float *y, int64_t len, int64_t stride, int64_t cols,
                         int log) {
    for (int64_t j = 0; j < cols; j += VW) {
        int64_t nc = cols - j < VW ? cols - j : VW;
#define SC_LD(p) (nc == VW ? vload(p) : vload_part(p, nc))
#define SC_ST(p, v) (nc == VW ? vstore(p, v) : vstore_part(p, v, nc))
        vf m = SC_LD(x + j);
        for (int64_t r = 1; r < len; r++) {
            vf v = SC_LD(x + r * stride + j);
            m = vm_select(v > m, v, m); /* the reference's `v > max`: a NaN first stays */
        }
        vf s = {0};
        for (int64_t r = 0; r < len; r++) {
            vf e = vm_exp(SC_LD(x + r * stride + j) - m);
            s += e;
            if (!log) SC_ST(y + r * stride + j, e);
        }
        if (!log) {
            vf inv = vsplat(1.0f) / s;
            for (int64_t r = 0; r < len; r++) SC_ST(y + r * stride + j, SC_LD(y + r * stride + j) * inv);
        } else {
            vf ls;
            for (int l = 0; l < VW; l++) ls[l] = logf(s[l]);
            for (int64_t r = 0; r < len; r++)
                SC_ST(y + r * stride + j, (SC_LD(x + r * stride + j) - m) - ls);
        }
#undef SC_LD
#undef SC_ST
    }
}

const af_vec_ops VEC_TABLE = {
    .name = VEC_NAME,
    .vw = VW,
    .mr = VEC_MR,
    .ukr = {UKR_TYPE_TABLE(f32), UKR_TYPE_TABLE(f16), UKR_TYPE_TABLE(bf16), UKR_TYPE_TABLE(u8s8)},
    .ukr_row = {ROW_TABLE(f32), ROW_TABLE(f16)},
    .to_bf16 = to_bf16,
    .to_u8 = to_u8,
    .round_f16 = round_f16,
    .to_f16 = to_f16,
    .from_f16 = from_f16,
    .from_bf16 = from_bf16,
    .ep_tile = ep_tile,
    .unary = unary,
    .layernorm = layernorm,
    .rmsnorm = rmsnorm,
    .gemv = gemv,
    .dw_row = dw_row,
    .grp_row = grp_row,
    .wino_in = wino_in,
    .wino_out = wino_out,
    .pool_row = pool_row,
    .softmax_row = softmax_row,
    .softmax_exp = softmax_exp,
    .row_sum = row_sum,
    .reduce_rows = reduce_rows,
    .scale_rows = scale_rows,
    .reduce_run = reduce_run,
    .reduce_acc = reduce_acc,
    .moments = moments,
    .norm_affine = norm_affine,
    .pool_line = pool_line,
    .softmax_cols = softmax_cols,
    .binary_row = binary_row,
    .compare_row = compare_row,
    .blend_row = blend_row,
    .transpose = transpose,
};
