/* Vectorised float32 math for the kernels' epilogues and softmax: exp, expm1, sigmoid, tanh, erf,
 * the two GELUs, log, sin and cos, written once with GCC vector extensions so that one source compiles to
 * AVX-512, AVX2 or SSE2 code by the flags of the file that includes it.
 *
 * The includer defines VW (floats per vector) and the types
 *     typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
 *     typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));
 * before including this file.
 *
 * Invariant: every function is straight-line lane-wise code (no branch on lane values, no
 * table, no libm, no intrinsic but x86 min/max, which vm_min/vm_max define exactly), so lane i
 * of a result depends only on lane i of the input, and a tail vector padded with anything
 * gives the same lanes [0, n) as a full one. The code
 * relies on IEEE round-to-nearest and must not be built with -ffast-math (or
 * -fassociative-math / -ffinite-math-only): the rounding trick and the NaN selects depend on
 * it. Contraction into FMA (-ffp-contract=fast) is expected and only makes results better.
 *
 * Error bounds: maxima over every one of the 2^32 floats against double libm, for gcc 12 at
 * VW 16 (AVX-512, FMA) / VW 4 (SSE2, no FMA); VW 8 and clang 14 give the same maxima on
 * tests/test_vmath.c's sweep, which asserts the bounds in its table. ulp: the spacing of floats
 * at the exact value; "normal": where the exact value is a normal float.
 *   vm_exp        0.92 / 1.19 ulp   x in [-87.34, 88.72] (normal); 0 below, +inf above
 *   vm_expm1      1.53 / 1.66 ulp   where normal; -1 below -87.34, +inf above 88.72
 *   vm_sigmoid    2.40 ulp          where normal (x >= -87.34; 0 below); abs 8.9e-8 anywhere
 *   vm_tanh       1.36 / 1.34 ulp   where normal (everywhere but denormal x, returned as is)
 *   vm_erf        1.13 / 1.30 ulp   likewise; abs 7.7e-8 anywhere
 *   vm_gelu_erf   3.53 / 3.62 ulp   x >= -1 (test_vmath sweep, VW 4 / VW 8); abs 8e-8 for x < -1
 *   vm_gelu_tanh  2.60 ulp          x >= -1; abs 4.7e-8 for x < -1
 *   vm_softplus   2.38 ulp          where normal; 0 where e^x is not (x < -87.34)
 *   vm_silu       2.23 ulp          x >= -88.72, where normal (test_vmath's sweep, not all
 *                                   floats); abs 2.61e-37 below -88.72
 *   vm_log        1.80 ulp          x > 0, denormals included (test_vmath's sweep)
 *   vm_sin        1.48 / 1.49 ulp   |x| < 2^25, where normal (test_vmath's sweep, VW 8 / VW 4,
 *                                   with the floats closest to multiples of pi/2); in [-1, 1]
 *                                   beyond, NaN for +-inf
 *   vm_cos        1.48 / 1.51 ulp   likewise
 * (GELU below -1 is ill-conditioned in float: rounding x / sqrt2 or the cubic alone moves the
 * result by up to ~200 ulps at x = -10, so only the absolute error is small there.) None
 * returns NaN for a non-NaN input but vm_log for a negative one and vm_sin and vm_cos for an
 * infinite one; NaN in gives NaN out. Cost at VW 16 (AVX-512, whose
 * vscalefps saves one of the exponent's two instructions): exp about 16 vector instructions,
 * expm1 20, sigmoid 21 + a division, tanh 26 + a division, erf 33, gelu_erf 36, gelu_tanh 23 + a
 * division, softplus 27 + a division, silu 15 + a division; at VW 8 (AVX2) sin and cos about
 * 45, 20 of them the reduction in double (conversions both ways).
 *
 * The polynomial coefficients are minimax fits (Lawson's iteration on Chebyshev nodes, exact
 * values from mpmath) rounded to float one at a time, lowest order first, refitting the rest
 * after each rounding so that the rounding errors are absorbed. */
#ifndef AF_VMATH_H
#define AF_VMATH_H

#include <stdint.h>

#ifndef VW
#error "define VW and the vf and vi vector types before including kernels/simd/vmath.h"
#endif

#define VM_INLINE static inline __attribute__((always_inline))

/* Unsigned lanes, for shifts and sign bits (a signed left shift of a negative is undefined). */
typedef uint32_t vm_vu __attribute__((vector_size(VW * 4), aligned(4)));

/* ---- helpers ------------------------------------------------------------------------------ */

/* s in every lane. Written as s - 0 rather than 0 + s so that -0.0f stays -0. */
VM_INLINE vf vm_splat(float s) {
    return s - (vf){0};
}

VM_INLINE vm_vu vm_bits(vf x) {
    return (vm_vu)x;
}

VM_INLINE vf vm_from_bits(vm_vu u) {
    return (vf)u;
}

/* a where mask is all ones, b where it is zero (mask: a vector comparison's result). C has no
 * vector ?:, so this is the bitwise form; compilers turn it into a blend. */
VM_INLINE vf vm_select(vi mask, vf a, vf b) {
    return (vf)(((vi)a & mask) | ((vi)b & ~mask));
}

/* a > b ? a : b, so b when either is NaN, like x86 maxps(a, b): pass the operand that may be
 * NaN second to keep the NaN, first to drop it. Where the build has x86 vectors of this width,
 * maxps itself: the same result in every lane (NaN, equal zeros: b), one instruction where the
 * select compiles to a compare and two masked ones. */
#if VW == 16 && defined(__AVX512F__)
#define VM_MINMAX(op, a, b) vm_from_ps(_mm512_##op##_ps(vm_ps(a), vm_ps(b)))
#elif VW == 8 && defined(__AVX__)
#define VM_MINMAX(op, a, b) vm_from_ps(_mm256_##op##_ps(vm_ps(a), vm_ps(b)))
#elif VW == 4 && defined(__SSE__)
#define VM_MINMAX(op, a, b) vm_from_ps(_mm_##op##_ps(vm_ps(a), vm_ps(b)))
#endif
#ifdef VM_MINMAX
#include <immintrin.h>
#if VW == 16
typedef __m512 vm_ps_t;
#elif VW == 8
typedef __m256 vm_ps_t;
#else
typedef __m128 vm_ps_t;
#endif
VM_INLINE vm_ps_t vm_ps(vf a) {
    vm_ps_t r;
    __builtin_memcpy(&r, &a, sizeof r);
    return r;
}
VM_INLINE vf vm_from_ps(vm_ps_t a) {
    vf r;
    __builtin_memcpy(&r, &a, sizeof r);
    return r;
}
#endif

VM_INLINE vf vm_max(vf a, vf b) {
#ifdef VM_MINMAX
    return VM_MINMAX(max, a, b);
#else
    return vm_select(a > b, a, b);
#endif
}

/* a < b ? a : b, so b when either is NaN, like x86 minps(a, b). */
VM_INLINE vf vm_min(vf a, vf b) {
#ifdef VM_MINMAX
    return VM_MINMAX(min, a, b);
#else
    return vm_select(a < b, a, b);
#endif
}

VM_INLINE vf vm_abs(vf x) {
    return vm_from_bits(vm_bits(x) & 0x7fffffffu);
}

/* |a| with the sign of s. */
VM_INLINE vf vm_copysign(vf a, vf s) {
    return vm_from_bits((vm_bits(a) & 0x7fffffffu) | (vm_bits(s) & 0x80000000u));
}

/* x rounded to the nearest integer, ties to even, for |x| < 2^22 (larger |x| give garbage).
 * Adding 1.5 * 2^23 leaves no fraction bits, so the FPU rounds; the 0.5 * 2^23 margin keeps
 * negative x in the same binade. A zero result is +0 even for x in (-0.5, -0]. */
VM_INLINE vf vm_rint(vf x) {
    const float magic = 12582912.0f;
    return (x + magic) - magic;
}

/* ---- exp and expm1 -------------------------------------------------------------------------- */

/* exp(x) = 2^n * e^r with n = rint(x / ln2) and r = x - n * ln2 in [-ln2/2, ln2/2]. */
#define VM_LOG2E 1.44269502f
#define VM_MAGIC 12582912.0f /* 1.5 * 2^23: the low mantissa bits of x/ln2 + magic hold n */
/* ln2 = VM_LN2_HI + VM_LN2_LO; VM_LN2_HI has 15 significant bits, so n * VM_LN2_HI is exact
 * for |n| < 512 and x - n * VM_LN2_HI is exact too (Cody and Waite). VM_LN2_LO is positive,
 * which keeps r = -0 for x = -0. */
#define VM_LN2_HI 0.693145752f
#define VM_LN2_LO 1.42860677e-06f
/* Below VM_EXP_LO e^x is not a normal float: results there are flushed (exp 0, expm1 -1).
 * VM_EXP_LO is the first float above -126 ln2, so where n = -126 the polynomial is >= 1 and
 * the exponent arithmetic below never reaches the denormal range. */
#define VM_EXP_LO -87.3365402f
/* The largest float below 128 ln2: e^x is finite up to it and +inf after it. */
#define VM_EXP_HI 88.7228317f

/* Reduction shared by exp and expm1: r, and t whose low 9 bits hold n (two's complement). */
VM_INLINE vf vm_exp_reduce(vf x, vf *t) {
    *t = x * VM_LOG2E + VM_MAGIC;
    vf n = *t - VM_MAGIC;
    vf r = x - n * VM_LN2_HI;
    return r - n * VM_LN2_LO;
}

/* (e^r - 1 - r) / r^2 on [-0.3466, 0.3466]: relative error 1.4e-8 in e^r - 1 from the
 * polynomial, 5.6e-9 in e^r. */
VM_INLINE vf vm_exp_q(vf r) {
    vf q = r * 0.00138699624f + 0.0083662523f;
    q = q * r + 0.0416674428f;
    q = q * r + 0.166665465f;
    return q * r + 0.49999997f;
}

/* p * 2^n for n = t's integer (the low bits of t hold n, as vm_exp_reduce leaves them), where
 * p * 2^n is a normal float or n = 128 and p < 1. On AVX-512 one vscalefps, which takes n as
 * a float; elsewhere n added to the exponent field as an integer (a shift and an add, both on
 * the two ports the polynomial's FMAs use). Exact either way, so both give the same bits.
 * Adding to the field rather than multiplying by 2^n also covers n = 128, where 2^n is not a
 * float but the result is. */
VM_INLINE vf vm_ldexp(vf p, vf t) {
#if VW == 16 && defined(__AVX512F__)
    return vm_from_ps(_mm512_scalef_ps(vm_ps(p), vm_ps(t - VM_MAGIC)));
#else
    return vm_from_bits(vm_bits(p) + (vm_bits(t) << 23));
#endif
}

/* e^(n ln2 + r) from the reduction's r and t. */
VM_INLINE vf vm_exp_finish(vf r, vf t) {
    vf p = vm_exp_q(r) * r + 1.0f;
    p = p * r + 1.0f;
    return vm_ldexp(p, t);
}

/* e^x for x in [VM_EXP_LO, VM_EXP_HI], without range handling: outside it, and for a NaN with
 * payload bits (they shift into the exponent), the result is garbage, so callers that may see
 * such x select them away. */
VM_INLINE vf vm_exp_core(vf x) {
    vf t;
    vf r = vm_exp_reduce(x, &t);
    return vm_exp_finish(r, t);
}

/* e^x: 0 below VM_EXP_LO (no denormals), +inf above VM_EXP_HI, NaN for NaN. */
VM_INLINE vf vm_exp(vf x) {
    vf y = vm_exp_core(x);
    y = vm_select(x < VM_EXP_LO, vm_splat(0.0f), y);
    /* ~(x <= hi) is also set for NaN, and x + inf is then NaN, else +inf. */
    return vm_select(~(x <= VM_EXP_HI), x + __builtin_inff(), y);
}

/* e^x - 1 with relative accuracy near 0 (ELU): -1 below VM_EXP_LO, +inf above VM_EXP_HI, NaN
 * for NaN; -0 gives +0. As e^x - 1 = 2^n (e^r - 1) + (2^n - 1), with e^r - 1 computed without
 * the 1 so that n = 0 loses nothing. 2^n is formed as 2 * 2^(n-1) so that n = 128 stays finite;
 * at n = -126, 2^(n-1) comes out as 0, which gives the right -1. */
VM_INLINE vf vm_expm1(vf x) {
    vf t;
    vf r = vm_exp_reduce(x, &t);
    vf u = (r * r) * vm_exp_q(r) + r;
    vf h = vm_from_bits((vm_bits(t) << 23) + (126u << 23)); /* 2^(n-1) */
    vf y = 2.0f * (h * u + (h - 0.5f));
    y = vm_select(x < VM_EXP_LO, vm_splat(-1.0f), y);
    return vm_select(~(x <= VM_EXP_HI), x + __builtin_inff(), y);
}

/* 1 / (1 + e^-x), taken as e^x / (1 + e^x) for x < 0: with e = e^-|x| <= 1 the sum 1 + e
 * lies in [1, 2], where its rounding costs half an ulp at most (1 + e^-x near a power of two
 * above 2 would cost a whole one). Exactly 1 from x = 16.64 on, 0 below VM_EXP_LO (the exact
 * value is not a normal float there); NaN for NaN. */
VM_INLINE vf vm_sigmoid(vf x) {
    vf e = vm_exp(-vm_abs(x));
    return vm_select(x < 0.0f, e, vm_splat(1.0f)) / (1.0f + e);
}

/* x * sigmoid(x) = x / (1 + e^-x) with one division: e^-x by the exp core on an argument kept
 * in its range, so no selects. x is first raised to -88.72 (about -128 ln2, where e^-x is still
 * finite), which changes only results below 2.61e-37 in magnitude (-inf gives -2.61e-37, not -0);
 * above 87.34 e^-x is taken as e^-87.34, which 1 absorbs. NaN stays NaN (it is the operand
 * vm_max passes through). The reduction takes -u from u = min(87.34, x) with the sign in its
 * constants, as vm_exp_reduce(-u) would compute it to the bit, one negation fewer. Measured
 * 19% faster than x * vm_sigmoid(x) at VW 16 (EfficientNet's SiLU), and the folded negation
 * with vscalefps 9% faster again (15 vector instructions and the division). */
#define VM_SILU_LO -88.7228317f
VM_INLINE vf vm_silu(vf x) {
    vf xc = vm_max(vm_splat(VM_SILU_LO), x);
    vf u = vm_min(vm_splat(-VM_EXP_LO), xc);
    vf t = u * -VM_LOG2E + VM_MAGIC, n = t - VM_MAGIC;
    vf r = n * -VM_LN2_HI - u;
    r = r - n * VM_LN2_LO;
    return xc / (1.0f + vm_exp_finish(r, t));
}

/* ---- tanh ----------------------------------------------------------------------------------- */

/* Below this |x| tanh is an odd polynomial; above it 1 - 2 / (e^2|x| + 1) subtracts at most
 * 0.45 from 1, which costs less than a bit. */
#define VM_TANH_SMALL 0.625f
/* tanh(|x|) rounds to 1 from 9.02 on; clamping there keeps e^2|x| finite. */
#define VM_TANH_CLAMP 10.0f

/* tanh(a) for a in [0, VM_TANH_SMALL]: a + a^3 P(a^2), relative error 4.5e-9 from the
 * polynomial. */
VM_INLINE vf vm_tanh_small(vf a) {
    vf a2 = a * a;
    vf p = a2 * -0.00569229666f + 0.0206281673f;
    p = p * a2 - 0.0537365153f;
    p = p * a2 + 0.133314058f;
    p = p * a2 - 0.333332807f;
    return (a * a2) * p + a;
}

/* tanh(x): odd, so computed on |x| and given x's sign back (tanh(-0) = -0); exactly +-1 from
 * |x| = 9.02 on; NaN for NaN. */
VM_INLINE vf vm_tanh(vf x) {
    vf a = vm_abs(x);
    vf e = vm_exp_core(2.0f * vm_min(vm_splat(VM_TANH_CLAMP), a));
    vf big = 1.0f - 2.0f / (e + 1.0f);
    /* NaN fails the comparison and takes the polynomial: exp_core may lose a NaN's payload
     * bits into the exponent. */
    vf y = vm_select(a >= VM_TANH_SMALL, big, vm_tanh_small(a));
    return vm_copysign(y, x);
}

/* ---- softplus ------------------------------------------------------------------------------- */

/* log1p(t) for t in [0, 1] as 2 atanh(s), s = t / (2 + t) in [0, 1/3]: the odd series
 * 2s (1 + s^2/3 + s^4/5 + ...) to s^14 / 15 (the next term is below 2^-28 relative), with no
 * cancellation anywhere on the interval. */
VM_INLINE vf vm_log1p01(vf t) {
    vf s = t / (2.0f + t), s2 = s * s;
    vf p = s2 * (1.0f / 15.0f) + (1.0f / 13.0f);
    p = p * s2 + (1.0f / 11.0f);
    p = p * s2 + (1.0f / 9.0f);
    p = p * s2 + (1.0f / 7.0f);
    p = p * s2 + (1.0f / 5.0f);
    p = p * s2 + (1.0f / 3.0f);
    return (2.0f * s) * (p * s2) + 2.0f * s;
}

/* log(x) = e ln2 + log1p(m - 1) for x = 2^e m with m in [sqrt(1/2), sqrt(2)): the series of
 * vm_log1p01 holds there too (|s| <= 0.172, every term of s's sign, no cancellation), and e ln2
 * is exact in its high part, so neither log(1 + tiny) nor log(1 - tiny) cancels. Denormal x is
 * scaled by 2^23 first. log(+0) = log(-0) = -inf, negative x (and -inf) NaN, +inf and NaN as
 * they are. */
VM_INLINE vf vm_log(vf x) {
    vi tiny = x < 1.17549435e-38f; /* FLT_MIN: denormals (and zeros, negatives: selected below) */
    vm_vu t = vm_bits(vm_select(tiny, x * 8388608.0f, x)) + (0x3f800000u - 0x3f3504f3u);
    vi e = (vi)(t >> 23) - 127 - (tiny & 23);
    vf m = vm_from_bits((t & 0x007fffffu) + 0x3f3504f3u); /* in [sqrt(1/2), sqrt(2)) */
    vf ef = __builtin_convertvector(e, vf);
    vf y = ef * VM_LN2_HI + (ef * VM_LN2_LO + vm_log1p01(m - 1.0f));
    y = vm_select(x == 0.0f, vm_splat(-__builtin_inff()), y);
    y = vm_select(x < 0.0f, vm_splat(__builtin_nanf("")), y);
    return vm_select((x == __builtin_inff()) | (x != x), x, y);
}

/* ---- sin and cos ---------------------------------------------------------------------------- */

/* Double lanes for the reduction, VW of them (two registers' worth). */
typedef double vm_vd __attribute__((vector_size(VW * 8), aligned(8)));
typedef int64_t vm_vl __attribute__((vector_size(VW * 8), aligned(8)));

/* x = n pi/2 + r in double (Cody and Waite, a 2-part pi/2): VM_PIO2_HI has 27 significant bits,
 * so n * VM_PIO2_HI is exact for |n| < 2^26 and x - n * VM_PIO2_HI is exact too (the two lie
 * within a factor of two); what is left of pi/2 is below 2^-85. So r is within 2^-55 + 2^-52
 * |r| of the exact remainder up to |x| = 2^25, where no float comes closer to a multiple of
 * pi/2 than 4.2e-9 = 2^-27.8 (x = 252.898209; an exhaustive search): r's relative error stays
 * below 2^-27. In float the same needs FMA (the generic build has none) or more pieces of
 * pi/2, short ones, for less range. */
#define VM_2_OVER_PI 0.63661977236758134
#define VM_PIO2_HI 0x1.921fb54p+0
#define VM_PIO2_LO 0x1.10b4611a62633p-30
#define VM_MAGIC_D 6755399441055744.0 /* 1.5 * 2^52: the low mantissa bits of t hold n */
/* The float just above pi/4: |r| never exceeds it below |x| = 2^49 (n rounded in double). */
#define VM_PIO4 0.785398185f

/* r as a float and q = n mod 2^32. r is clamped to [-VM_PIO4, VM_PIO4], which changes nothing
 * where the reduction is accurate and keeps results in [-1, 1] for huge x (n * VM_PIO2_HI not
 * exact, or the magic constant's integer trick past 2^51): there they are not accurate, only
 * bounded. inf and NaN give r = NaN. */
VM_INLINE vf vm_trig_reduce(vf x, vi *q) {
    vm_vd xd = __builtin_convertvector(x, vm_vd);
    vm_vd t = xd * VM_2_OVER_PI + VM_MAGIC_D;
    vm_vd n = t - VM_MAGIC_D;
    vm_vd r = (xd - n * VM_PIO2_HI) - n * VM_PIO2_LO;
    *q = __builtin_convertvector((vm_vl)t, vi); /* the low 32 bits: truncation, no overflow */
    vf rf = __builtin_convertvector(r, vf);
    return vm_min(vm_splat(VM_PIO4), vm_max(vm_splat(-VM_PIO4), rf)); /* NaN passes both */
}

/* sin(q pi/2 + r) for r in [-VM_PIO4, VM_PIO4]: sin r or cos r as q is even or odd, negated
 * for q mod 4 in {2, 3}. sin r = r + r^3 P(r^2), relative error 3.96e-9 from the polynomial;
 * cos r = 1 - r^2/2 + r^4 Q(r^2), 1.2e-10. (sin(-0) comes out +0: see vm_sin.) */
VM_INLINE vf vm_sin_quadrant(vf r, vi q) {
    vf z = r * r;
    vf s = z * -0.000195182918f + 0.00833218917f;
    s = s * z - 0.166666552f;
    s = (r * z) * s + r;
    vf c = z * 2.44323273e-05f - 0.00138873095f;
    c = c * z + 0.0416666456f;
    vf h = 0.5f * z, w = 1.0f - h;
    c = w + ((z * z) * c + ((1.0f - w) - h)); /* (1 - w) - h: w's rounding error, exactly */
    vf y = vm_select((q & 1) != 0, c, s);
    return vm_from_bits(vm_bits(y) ^ (((vm_vu)q << 30) & 0x80000000u));
}

/* sin(x): accurate for |x| < 2^25, in [-1, 1] for any finite x, NaN for inf and NaN; sin(-0)
 * = -0, which the polynomial's r + r^3 P (P(0) < 0) loses and a select restores. */
VM_INLINE vf vm_sin(vf x) {
    vi q;
    vf r = vm_trig_reduce(x, &q);
    return vm_select(x == 0.0f, x, vm_sin_quadrant(r, q));
}

/* cos(x) = sin(x + pi/2): one quadrant on. Range and specials as vm_sin. */
VM_INLINE vf vm_cos(vf x) {
    vi q;
    vf r = vm_trig_reduce(x, &q);
    return vm_sin_quadrant(r, q + 1);
}

/* log(1 + e^x) = max(x, 0) + log1p(e^-|x|): the log's argument stays in [0, 1], so neither side
 * overflows or cancels; +inf for +inf, 0 for -inf and below -87.34 (e^x is not a normal float
 * there), NaN for NaN. */
VM_INLINE vf vm_softplus(vf x) {
    return vm_max(x, vm_splat(0.0f)) + vm_log1p01(vm_exp(-vm_abs(x)));
}

/* ---- erf and GELU --------------------------------------------------------------------------- */

/* Below this |x| erf is an odd polynomial; above it erf = 1 - erfc with erfc = e^Q. */
#define VM_ERF_SMALL 0.875f
/* Q is fitted up to here: erf needs it only to 3.92 (it rounds to 1 from there), GELU's
 * negative tail follows erfc down to x = -4.5 sqrt2 = -6.36, beyond which it is below 7e-10. */
#define VM_ERF_CLAMP 4.5f

/* erf(a) for a in [0, VM_ERF_SMALL]: a + a P(a^2), P's constant being 2/sqrt(pi) - 1 so that
 * the leading term a * 2/sqrt(pi) carries no rounding of that constant; relative error 1.4e-8
 * from the polynomial. */
VM_INLINE vf vm_erf_small(vf a) {
    vf a2 = a * a;
    vf p = a2 * -0.000603880559f + 0.00500202086f;
    p = p * a2 - 0.0267722793f;
    p = p * a2 + 0.112819627f;
    p = p * a2 - 0.376125067f;
    p = p * a2 + 0.128379151f;
    return a * p + a;
}

/* erfc(a) for a in [VM_ERF_SMALL, VM_ERF_CLAMP] as e^Q(a), Q a polynomial fit of log erfc
 * (absolute error 2.1e-8, so erfc's relative error is that plus exp's). */
VM_INLINE vf vm_erfc_tail(vf a) {
    vf q = a * -7.76978695e-08f + 3.29541149e-06f;
    q = q * a - 6.13100492e-05f;
    q = q * a + 0.000675915973f;
    q = q * a - 0.0050137816f;
    q = q * a + 0.0269439351f;
    q = q * a - 0.110765778f;
    q = q * a - 0.631275296f;
    q = q * a - 1.13047814f;
    q = q * a + 0.000365718151f;
    return vm_exp_core(q);
}

/* erf(x): odd (erf(-0) = -0), exactly +-1 from |x| = 3.92 on, NaN for NaN. */
VM_INLINE vf vm_erf(vf x) {
    vf a = vm_abs(x);
    vf e = vm_erfc_tail(vm_min(vm_splat(VM_ERF_CLAMP), a));
    vf y = vm_select(a >= VM_ERF_SMALL, 1.0f - e, vm_erf_small(a)); /* NaN: see vm_tanh */
    return vm_copysign(y, x);
}

/* erfc(a) = e^Q(a) for a in [0, VM_ERF_CLAMP], Q(a) = a P(a) with P of degree 10: a minimax fit
 * of log erfc weighted by erfc^0.5 (Q's error matters as much as erfc is large), coefficients
 * rounded to float one at a time and the rest refitted. P is summed by Estrin's scheme, in
 * four dependent steps where Horner's rule takes ten: GELU is latency-bound otherwise. Near
 * 0 every term is small, so the float evaluation loses nothing there; at large a its error
 * (some 1e-6 in Q) only scales an erfc below 1e-4. */
VM_INLINE vf vm_erfc_exp(vf a) {
    vf a2 = a * a, a4 = a2 * a2, a8 = a4 * a4;
    vf p01 = a * -0.636619091f - 1.12837923f;
    vf p23 = a * 0.0191165507f - 0.102773599f;
    vf p45 = a * -0.00183918676f + 0.000271656638f;
    vf p67 = a * -0.000192031948f + 0.000782373943f;
    vf p89 = a * -2.65471499e-06f + 2.95910049e-05f;
    vf p07 = (p67 * a2 + p45) * a4 + (p23 * a2 + p01);
    vf p = (1.0576322e-07f * a2 + p89) * a8 + p07;
    return vm_exp_core(a * p);
}

/* 0.5 x (1 + erf(x / sqrt2)) = 0.5 x erfc(|x| / sqrt2) for x < 0 and 0.5 x (2 - erfc(x /
 * sqrt2)) for x >= 0: one exponential of a fitted polynomial over the whole range, where a
 * polynomial for erf near 0 and an exponential for the tail, both computed and one selected,
 * took 1.35 against 1.06 ns an element (Zen 3, AVX2, vec unary over 16K floats) for 2.43 ulp
 * against 3.6 now: Q's own rounding near -1 (x near -1) is most of the difference, and 3.6
 * ulp is far inside any model's tolerance.
 * The negative tail does not cancel; below x = -VM_ERF_CLAMP * sqrt2 (|result| < 7e-10) the
 * result is -0, as for x = -inf (the limit, not inf * 0). NaN: e is garbage, 0.5 x NaN. */
VM_INLINE vf vm_gelu_erf(vf x) {
    vf a = vm_abs(x * 0.707106769f);
    vf e = vm_erfc_exp(vm_min(vm_splat(VM_ERF_CLAMP), a));
    vf y = (0.5f * x) * vm_select(x < 0.0f, e, 2.0f - e);
    return vm_select((a > VM_ERF_CLAMP) & (x < 0.0f), vm_splat(-0.0f), y);
}

/* 0.5 x (1 + tanh(u)) with u = 0.7978845608 (x + 0.044715 x^3), computed as x / (1 + e^-2u)
 * (the same value) so that the negative tail has no cancellation. -0 below x = -16 (the value
 * underflows from x = -10.1 on), which also gives -0 rather than NaN for x = -inf. */
VM_INLINE vf vm_gelu_tanh(vf x) {
    vf m2u = x * ((x * x) * -0.0713548139f - 1.59576917f); /* -2u */
    vf y = x / (1.0f + vm_exp(m2u));
    return vm_select(x < -16.0f, vm_splat(-0.0f), y);
}

#endif
