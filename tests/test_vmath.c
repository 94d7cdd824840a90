/* kernels/simd/vmath.h against double-precision libm, for one vector width per build: VW comes from
 * -DVW= (16 with the AVX-512 flags, 8 with -mavx2 -mfma, 4 with none; default 4), e.g.
 *   gcc -O3 -std=c11 -D_GNU_SOURCE -ffp-contract=fast -Wall -Wextra -Werror -DVW=16 \
 *       -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -Isrc tests/test_vmath.c -lcmocka -lm
 *
 * Each function runs on a dense sweep: a grid of step 2^-12 over [-100, 100] and a coarser one
 * up to 1e5, the floats around multiples of pi/2 up to 2e5 and the closest ones below 2^25
 * (sin and cos), every float within
 * 4096 ulps of each point where a function switches formula or saturates, a log sweep of tiny
 * and huge magnitudes down to the denormals, random bit patterns (huge values, NaN payloads) and
 * the special values. Each result must lie within the row's ulp bound where the exact value is
 * a normal float (and x is in the row's ulp range), within its absolute bound elsewhere; NaN must
 * give NaN and nothing else may, and overflow must give inf. The measured maxima are printed.
 * A second table pins the exact values the contracts promise (saturation, signed zeros,
 * infinities), and a third the helpers' NaN conventions.
 *
 * Invariant: the references are double libm, written in the form that has no cancellation
 * (erfc for the negative GELU side, x / (1 + e^-2u) for the tanh GELU), so their own error is
 * far below float's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef VW
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));

#include "kernels/simd/vmath.h"

/* ---- references ---------------------------------------------------------------------------- */

static double ref_sigmoid(double x) {
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}

/* GELU's limits at +-inf: +inf, and 0 rather than inf * 0. */
static double ref_gelu_erf(double x) {
    if (isinf(x)) return x > 0 ? x : 0;
    return 0.5 * x * erfc(-x * M_SQRT1_2);
}

static double ref_gelu_tanh(double x) {
    if (isinf(x)) return x > 0 ? x : 0;
    double u = 0.7978845608 * (x + 0.044715 * x * x * x);
    return x / (1 + exp(-2 * u));
}

static double ref_silu(double x) {
    if (isinf(x)) return x > 0 ? x : 0;
    return x * ref_sigmoid(x);
}

static double ref_softplus(double x) {
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

/* ---- the functions under test, one vector at a time ------------------------------------------ */

static vf f_exp(vf x) { return vm_exp(x); }
static vf f_expm1(vf x) { return vm_expm1(x); }
static vf f_sigmoid(vf x) { return vm_sigmoid(x); }
static vf f_tanh(vf x) { return vm_tanh(x); }
static vf f_erf(vf x) { return vm_erf(x); }
static vf f_gelu_erf(vf x) { return vm_gelu_erf(x); }
static vf f_gelu_tanh(vf x) { return vm_gelu_tanh(x); }
static vf f_softplus(vf x) { return vm_softplus(x); }
static vf f_silu(vf x) { return vm_silu(x); }
static vf f_log(vf x) { return vm_log(x); }
static vf f_sin(vf x) { return vm_sin(x); }
static vf f_cos(vf x) { return vm_cos(x); }

typedef struct fcase {
    const char *name;
    vf (*f)(vf);
    double (*ref)(double);
    double max_ulp; /* where the exact value is a normal float and x in [ulp_from, ulp_to] */
    double ulp_from, ulp_to;
    double max_abs; /* everywhere else */
} fcase;

/* The bounds hold with margin for every VW, compiler and FMA or not (vmath.h lists the
 * measured maxima). GELU's negative side is ill-conditioned (a 1-ulp change of x moves the
 * result by up to ~200 ulps at x = -10), so below x = -1 it is held to an absolute bound. */
static const fcase cases[] = {
    {"exp", f_exp, exp, 1.5, -INFINITY, INFINITY, FLT_MIN},
    {"expm1", f_expm1, expm1, 2.0, -INFINITY, INFINITY, FLT_MIN},
    {"sigmoid", f_sigmoid, ref_sigmoid, 2.5, -INFINITY, INFINITY, FLT_MIN},
    {"tanh", f_tanh, tanh, 1.5, -INFINITY, INFINITY, FLT_MIN},
    {"erf", f_erf, erf, 1.5, -INFINITY, INFINITY, FLT_MIN},
    {"gelu_erf", f_gelu_erf, ref_gelu_erf, 4.0, -1.0, INFINITY, 8e-8},
    {"gelu_tanh", f_gelu_tanh, ref_gelu_tanh, 3.0, -1.0, INFINITY, 8e-8},
    {"softplus", f_softplus, ref_softplus, 3.0, -INFINITY, INFINITY, FLT_MIN},
    {"log", f_log, log, 2.5, -INFINITY, INFINITY, FLT_MIN},
    /* below -88.72 vm_silu returns -2.61e-37 for results smaller than that */
    {"silu", f_silu, ref_silu, 2.5, VM_SILU_LO, INFINITY, 2.7e-37},
    /* sin and cos are accurate below 2^25 and only bounded (|f| <= 1) above */
    {"sin", f_sin, sin, 2.0, -0x1p25, 0x1p25, 2.0},
    {"cos", f_cos, cos, 2.0, -0x1p25, 0x1p25, 2.0},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* ---- inputs -------------------------------------------------------------------------------- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

typedef struct sweep {
    float *x;
    size_t n, cap;
} sweep;

static void add(sweep *s, float x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1 << 20;
        s->x = realloc(s->x, s->cap * sizeof(float));
        assert_non_null(s->x);
    }
    s->x[s->n++] = x;
}

/* Where some function changes formula, saturates or flushes (both signs are added). */
static const float edges[] = {
    VM_EXP_LO, VM_EXP_HI, 88.3762626f /* n = 128 */, 0.34657359f /* n = +-1 */,
    1.03972077f /* n = +-2 */, 17.3286795f /* expm1 reaches -1 */, 16.6355324f /* sigmoid 1 */,
    VM_SILU_LO,
    VM_TANH_SMALL, 9.01091290f /* tanh 1 */, VM_TANH_CLAMP, VM_ERF_SMALL,
    3.91920590f /* erf 1 */, VM_ERF_CLAMP, VM_ERF_CLAMP * 1.41421356f, 10.1f, 16.0f, 1.0f, 0.0f,
};

/* The floats below 2^25 closest to a multiple of pi/2 (an exhaustive search in long double):
 * sin's and cos's reduction is hardest there. */
static const float near_pio2[] = {252.898209f, 505.796417f, 4.71238899f, 52516.4336f,
                                  1011.59283f, 2709675.5f, 9.42477798f, 105032.867f};

static sweep make_sweep(void) {
    sweep s = {0};
    for (int i = -100 * 4096; i <= 100 * 4096; i++) add(&s, (float)i / 4096.0f);
    for (int i = 0; i < 1 << 18; i++) add(&s, 100.0f + (float)i * 0.381f); /* up to 1e5 */
    for (int k = 1; k < 1 << 17; k++) { /* the floats around k pi/2, up to 2e5 */
        uint32_t b = to_bits((float)(k * M_PI_2));
        for (int d = -1; d <= 1; d++) add(&s, from_bits(b + (uint32_t)d));
    }
    for (size_t i = 0; i < sizeof near_pio2 / sizeof near_pio2[0]; i++)
        for (int sign = 0; sign < 2; sign++) add(&s, from_bits(to_bits(near_pio2[i]) | (uint32_t)sign << 31));
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int sign = 0; sign < 2; sign++) {
            uint32_t b = to_bits(edges[e]) | (uint32_t)sign << 31;
            for (int k = -4096; k <= 4096; k++)
                if ((int64_t)(b & 0x7fffffffu) + k >= 0) add(&s, from_bits(b + (uint32_t)k));
        }
    for (int e = -149; e <= 127; e++)
        for (int m = 0; m < 64; m++) {
            float x = ldexpf(1.0f + (float)m / 64.0f, e);
            add(&s, x);
            add(&s, -x);
        }
    uint32_t r = 1;
    for (int i = 0; i < 1 << 20; i++) {
        r = r * 1664525u + 1013904223u;
        add(&s, from_bits(r));
    }
    const float special[] = {0.0f, -0.0f, FLT_MIN, -FLT_MIN, 0x1p-149f, -0x1p-149f, 0x1p-127f,
                             -0x1p-130f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN, -NAN,
                             from_bits(0x7f800001u), from_bits(0x7fc00123u),
                             from_bits(0xffffffffu), from_bits(0x7fbfffffu)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) add(&s, special[i]);
    while (s.n % VW) add(&s, 0.0f);
    return s;
}

/* ---- the sweep ------------------------------------------------------------------------------ */

/* The spacing of floats at r (|r| rounded to float's binade), 2^-149 below FLT_MIN. */
static double ulp_of(double r) {
    int e;
    if (fabs(r) < FLT_MIN) return 0x1p-149;
    frexp(r, &e);
    return ldexp(1.0, e - 24);
}

/* Fails unless y is an acceptable float for x under c; adds to the maxima. */
static void check_one(const fcase *c, float x, float y, double *max_ulp, double *max_abs) {
    double r = c->ref(x);
    if (isnan(x)) {
        if (!isnan(y)) fail_msg("%s(NaN 0x%08x) = %a, expected NaN", c->name, to_bits(x), y);
        return;
    }
    if (isnan(r)) { /* log of a negative, sin and cos of inf */
        if (!isnan(y)) fail_msg("%s(%a) = %a, expected NaN", c->name, x, y);
        return;
    }
    if (isnan(y)) fail_msg("%s(%a) = NaN, expected %.9g", c->name, x, r);
    if (fabs(r) >= FLT_MAX * (1.0 + 0x1p-24)) { /* rounds to inf */
        if (!(isinf(y) && (y > 0) == (r > 0)))
            fail_msg("%s(%a) = %a, expected %sinf", c->name, x, y, r > 0 ? "+" : "-");
        return;
    }
    if (isinf(y) && fabs(r) <= FLT_MAX) fail_msg("%s(%a) = %a, expected %.9g", c->name, x, y, r);
    double err = fabs((double)y - r);
    if (fabs(r) >= FLT_MIN && x >= c->ulp_from && x <= c->ulp_to) {
        double u = err / ulp_of(r);
        if (u > *max_ulp) *max_ulp = u;
        if (u > c->max_ulp)
            fail_msg("%s(%.9g) = %.9g, expected %.9g: %.2f ulp > %.2f", c->name, x, y, r, u,
                     c->max_ulp);
    } else if (err > c->max_abs) {
        fail_msg("%s(%.9g) = %.9g, expected %.9g: abs error %.3g > %.3g", c->name, x, y, r, err,
                 c->max_abs);
    }
    if (fabs(r) <= 1.0 && fabs(x) <= c->ulp_to && err > *max_abs) *max_abs = err;
}

static void test_sweep(void **state) {
    (void)state;
    sweep s = make_sweep();
    for (int i = 0; i < NCASES; i++) {
        const fcase *c = &cases[i];
        double max_ulp = 0, max_abs = 0;
        for (size_t j = 0; j < s.n; j += VW) {
            vf x, y;
            memcpy(&x, s.x + j, sizeof x);
            y = c->f(x);
            for (int k = 0; k < VW; k++) check_one(c, x[k], y[k], &max_ulp, &max_abs);
        }
        printf("VW=%-2d %-9s max %.3f ulp (bound %.1f), max abs %.3g where |f| <= 1 "
               "(%zu inputs)\n", VW, c->name, max_ulp, c->max_ulp, max_abs, s.n);
    }
    free(s.x);
}

/* ---- exact values ---------------------------------------------------------------------------- */

typedef struct exact {
    int fn; /* index into cases */
    float x, want;
    int sign; /* the sign of a zero must match too */
} exact;

static const exact exacts[] = {
    {0, 0.0f, 1.0f, 0},          {0, -0.0f, 1.0f, 0},           {0, -INFINITY, 0.0f, 1},
    {0, INFINITY, INFINITY, 0},  {0, -87.4f, 0.0f, 1},          {0, -1000.0f, 0.0f, 1},
    {0, 89.0f, INFINITY, 0},     {0, 1e-30f, 1.0f, 0},          {1, 0.0f, 0.0f, 0},
    {1, -INFINITY, -1.0f, 0},    {1, -20.0f, -1.0f, 0},         {1, INFINITY, INFINITY, 0},
    {1, 0x1p-30f, 0x1p-30f, 0},  {2, 0.0f, 0.5f, 0},            {2, -88.8f, 0.0f, 1},
    {2, -1e30f, 0.0f, 1},        {2, -INFINITY, 0.0f, 1},       {2, 17.0f, 1.0f, 0},
    {2, 1e30f, 1.0f, 0},         {2, INFINITY, 1.0f, 0},        {3, 0.0f, 0.0f, 1},
    {3, -0.0f, -0.0f, 1},        {3, 9.1f, 1.0f, 0},            {3, -9.1f, -1.0f, 0},
    {3, 1e30f, 1.0f, 0},         {3, -INFINITY, -1.0f, 0},      {3, 0x1p-140f, 0x1p-140f, 0},
    {4, 0.0f, 0.0f, 1},          {4, -0.0f, -0.0f, 1},          {4, 3.93f, 1.0f, 0},
    {4, -3.93f, -1.0f, 0},       {4, INFINITY, 1.0f, 0},        {4, -1e30f, -1.0f, 0},
    {5, 0.0f, 0.0f, 0},          {5, INFINITY, INFINITY, 0},    {5, -INFINITY, 0.0f, 0},
    {5, 1e30f, 1e30f, 0},        {5, -1e30f, 0.0f, 0},          {6, 0.0f, 0.0f, 0},
    {6, INFINITY, INFINITY, 0},  {6, -INFINITY, 0.0f, 0},       {6, 1e30f, 1e30f, 0},
    {6, -1e30f, 0.0f, 0},         {7, INFINITY, INFINITY, 0},
    {7, -INFINITY, 0.0f, 0},      {7, 1e30f, 1e30f, 0},          {7, -1000.0f, 0.0f, 0},
    {10, 0.0f, 0.0f, 1},         {10, -0.0f, -0.0f, 1},         {11, 0.0f, 1.0f, 0},
    {11, -0.0f, 1.0f, 0},
};

static void test_exact(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof exacts / sizeof exacts[0]; i++) {
        const exact *e = &exacts[i];
        vf x = vm_splat(e->x);
        float y = cases[e->fn].f(x)[VW - 1];
        if (y != e->want || (e->sign && signbit(y) != signbit(e->want)))
            fail_msg("%s(%a) = %a, expected %a", cases[e->fn].name, e->x, y, e->want);
    }
}

/* ---- helpers ------------------------------------------------------------------------------- */

static vf lanes(float a, float b) {
    vf v = vm_splat(b);
    v[0] = a;
    return v;
}

static void test_helpers(void **state) {
    (void)state;
    assert_true(signbit(vm_splat(-0.0f)[VW - 1]));
    vf nan = vm_splat(NAN), one = vm_splat(1.0f), two = vm_splat(2.0f);
    assert_true(vm_max(one, two)[0] == 2.0f && vm_min(one, two)[0] == 1.0f);
    /* b when either is NaN */
    assert_true(isnan(vm_max(one, nan)[0]) && vm_max(nan, one)[0] == 1.0f);
    assert_true(isnan(vm_min(one, nan)[0]) && vm_min(nan, one)[0] == 1.0f);
    vf s = vm_select(lanes(1.0f, 0.0f) > 0.5f, two, one);
    assert_true(s[0] == 2.0f && s[VW - 1] == 1.0f);
    assert_true(vm_abs(vm_splat(-3.0f))[0] == 3.0f && !signbit(vm_abs(vm_splat(-0.0f))[0]));
    assert_true(vm_copysign(two, vm_splat(-0.0f))[0] == -2.0f);
    const float r[][2] = {{0.5f, 0.0f}, {1.5f, 2.0f}, {2.5f, 2.0f}, {-2.5f, -2.0f},
                          {-2.6f, -3.0f}, {4194303.5f, 4194304.0f}, {-7.49f, -7.0f}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        assert_true(vm_rint(vm_splat(r[i][0]))[0] == r[i][1]);
}

/* Past 2^25 sin and cos are not accurate, but every finite x still gives a value in [-1, 1]. */
static void test_trig_bounded(void **state) {
    (void)state;
    uint32_t r = 7;
    for (int i = 0; i < 1 << 16; i++) {
        r = r * 1664525u + 1013904223u;
        vf x = vm_splat(from_bits((r & 0x80000000u) | (0x4c000000u + r % (0x7f800000u - 0x4c000000u))));
        float s = vm_sin(x)[0], c = vm_cos(x)[0];
        if (!(fabsf(s) <= 1.0f && fabsf(c) <= 1.0f))
            fail_msg("sin/cos(%a) = %a / %a, outside [-1, 1]", x[0], s, c);
    }
}

int main(void) {
    /* The 16- and 8-lane builds are compiled for AVX-512 / AVX2: skip them (ctest's code 77)
     * on a CPU without those instructions rather than die of SIGILL. */
#if VW == 16
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq")) return 77;
#elif VW == 8
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 77;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_trig_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
