/* The GEMM core (kernels/fast/gemm.h) and the vector epilogue against plain double loops, on every ISA
 * this CPU has (generic, AVX2, AVX-512): every micro-kernel size (M tails 1..MR), N tails inside
 * a vector and inside a panel, 16-wide last panels, K = 0 and odd K, tap offsets (the implicit
 * GEMM of a convolution), outer/inner row strides, one and two threads (same bits), and every
 * epilogue op with operands per column, per row, full-size, scalar and in a generic broadcast
 * (which must fall back to the reference epilogue); and the low-precision types (half B, and
 * bfloat16 A and B in pairs along K, odd K padded) against double loops over the same rounded
 * operands; the int8 type U8S8 (uint8 codes of A, int8 B in quads with column sums, zero points
 * 0 and 255, per-tensor and per-column scales, taps, epilogues) against exact integer sums and
 * against the generic twin, and the uint8 conversion of A against the reference's formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "kernels/simd/cpu.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/epilogue.h"
#include "kernels/ref/fused.h"
#include "runtime/exec.h"
#include "util/util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *rnd_buf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)tu_rnd();
    return p;
}

/* A GEMM problem in the general form of af_gemm: mo x mi rows, taps over A. */
typedef struct prob {
    int64_t mo, mi, rs_o, rs_i, ntaps, tap_len, n;
    int64_t tap_off[9];
    size_t a_len;
    int64_t kb; /* rows of B that are packed (0: all K); the rest are zero (a padded K) */
} prob;

static int64_t prob_k(const prob *p) { return p->ntaps * p->tap_len; }

/* A[m][k] of problem p from its tensor a. */
static double a_at(const prob *p, const float *a, int64_t m, int64_t k) {
    int64_t o = m / p->mi, i = m % p->mi, t = k / p->tap_len, j = k % p->tap_len;
    return a[o * p->rs_o + i * p->rs_i + p->tap_off[t] + j];
}

/* C = A x B in double, then the reference epilogue (ep may be NULL). */
static void naive_gemm(const prob *p, const float *a, const float *b, const af_epilogue *ep,
                     float *c) {
    int64_t m = p->mo * p->mi, k = prob_k(p);
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < p->n; j++) {
            double s = 0;
            for (int64_t kk = 0; kk < k; kk++) s += a_at(p, a, r, kk) * b[kk * p->n + j];
            c[r * p->n + j] = (float)s;
        }
    if (ep) af_epilogue_apply_at(ep, c, 0, m * p->n);
}

/* |got - want| within float rounding of a K-term sum (scaled by sqrt(K)) after the epilogue. */
static void expect_close(const float *got, const float *want, int64_t count, int64_t k,
                         const char *what) {
    double tol = 2e-6 * sqrt((double)(k > 0 ? k : 1)) + 1e-6;
    for (int64_t i = 0; i < count; i++) {
        double d = fabs((double)got[i] - want[i]), scale = fabs(want[i]) > 1 ? fabs(want[i]) : 1;
        if (!(d <= tol * scale) && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s: element %lld: got %.9g, want %.9g", what, (long long)i, got[i], want[i]);
    }
}

typedef struct run_ctx {
    const af_gemm *g;
} run_ctx;

static void call_gemm(af_exec *x, void *ctx) { af_gemm_run(x, ((run_ctx *)ctx)->g); }

/* x rounded as the type stores it. */
static float round_to(af_gemm_type t, float x) {
    if (t == AF_GEMM_F16) return af_half_to_float(af_float_to_half(x));
    if (t == AF_GEMM_BF16) return af_bf16_to_float(af_float_to_bf16(x));
    return x;
}

/* When set (float32 only), B's row k is multiplied by rowscale[k] inside the GEMM
 * (b_rowscale), and the reference multiplies it beforehand. */
static const float *rowscale;

/* When set, A and B hold small integers (float32 only): every product sum is exact, in the
 * kernels as in the double reference, so that a fake quantization after it rounds to the
 * same code in both (a sum one ulp off can otherwise land on the other side of a step). */
static bool int_data;

/* Run p in type t on the ISA in force with `threads` threads and compare with the double
 * reference over the same rounded operands. */
static void check_prob_t(const prob *p, const af_epilogue *ep, int threads, const char *what,
                         af_gemm_type t) {
    int64_t m = p->mo * p->mi, k = prob_k(p), kb = p->kb ? p->kb : k;
    /* AMX reads up to 32 rows past a tile's first: A gets that much slack (zeros). */
    size_t slack = (size_t)(32 * p->rs_i + p->tap_off[p->ntaps - 1] + p->tap_len);
    float *a = rnd_buf(p->a_len + slack), *b = rnd_buf((size_t)(k * p->n));
    void *packed = malloc(af_gemm_packed_bytes(t, kb, p->n) + 4);
    uint16_t *a16 = calloc(p->a_len + slack, sizeof(uint16_t));
    float *c = malloc((size_t)(m * p->n + 1) * sizeof(float));
    float *want = malloc((size_t)(m * p->n + 1) * sizeof(float));
    assert_true(packed && a16 && c && want);
    if (int_data) {
        for (size_t i = 0; i < p->a_len; i++) a[i] = rintf(4.0f * a[i]);
        for (int64_t i = 0; i < k * p->n; i++) b[i] = rintf(4.0f * b[i]);
    }
    af_gemm_pack_type(t, b, kb, p->n, p->n, 1, packed);
    for (int64_t i = 0; i < k * p->n; i++) b[i] = i < kb * p->n ? round_to(t, b[i]) : 0.0f;
    for (size_t i = 0; i < p->a_len; i++) { /* the caller's conversion of A */
        a[i] = round_to(t, a[i]);
        a16[i] = af_float_to_bf16(a[i]);
    }
    af_vep v;
    af_vep_build(ep, c, p->n, &v);
    af_gemm g = {t == AF_GEMM_BF16 ? (const void *)a16 : (const void *)a, p->mo, p->mi, p->rs_o,
                 p->rs_i, p->tap_off, p->ntaps, p->tap_len, packed, p->n, c, p->n, &v, 0, 0, t,
                 NULL, NULL, 0, 0, 0, NULL, 0, 0};
    float *bscratch = NULL;
    if (rowscale) {
        size_t per = af_gemm_rowscale_floats(k, p->n);
        bscratch = aligned_alloc(64, ((size_t)threads * per * sizeof(float) + 63) / 64 * 64);
        assert_non_null(bscratch);
        g.b_rowscale = rowscale;
        g.b_scratch = bscratch;
        for (int64_t i = 0; i < k * p->n; i++) b[i] *= rowscale[i / p->n];
    }
    af_runtime *rt = NULL;
    af_error err;
    if (threads > 1) assert_int_equal(af_runtime_new(threads, &rt, &err), AF_OK);
    for (int64_t i = 0; i < m * p->n; i++) c[i] = NAN; /* every output must be written */
    run_ctx ctx = {&g};
    af_runtime_call(rt, call_gemm, &ctx);
    af_runtime_free(rt);
    naive_gemm(p, a, b, ep, want);
    static const char *const types[] = {"f32", "f16", "bf16"};
    char buf[256];
    snprintf(buf, sizeof buf, "%s [%s, %s, M %lld (%lldx%lld), N %lld, K %lld, %d threads]", what,
             af_isa_name(af_isa_get()), types[t], (long long)m, (long long)p->mo, (long long)p->mi,
             (long long)p->n, (long long)k, threads);
    expect_close(c, want, m * p->n, k, buf);
    free(bscratch);
    free(a);
    free(b);
    free(packed);
    free(a16);
    free(c);
    free(want);
}

static void check_prob(const prob *p, const af_epilogue *ep, int threads, const char *what) {
    check_prob_t(p, ep, threads, what, AF_GEMM_F32);
}

/* A plain row-major M x K times K x N. */
static prob plain(int64_t m, int64_t n, int64_t k) {
    prob p = {1, m, 0, k, 1, k, n, {0}, (size_t)(m * k), 0};
    return p;
}

/* Run body once per ISA this CPU has (and restore the best one). */
#define FOR_EACH_ISA(isa)                                                                       \
    for (af_isa isa = AF_ISA_GENERIC; isa <= af_isa_best() && af_isa_set(isa) == isa; isa++)

static void test_shapes(void **state) {
    (void)state;
    static const int64_t ms[] = {1, 2, 3, 5, 6, 7, 8, 13, 14, 15, 28, 29, 64, 197};
    static const int64_t ns[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 50, 64, 100};
    static const int64_t ks[] = {0, 1, 3, 17, 64};
    FOR_EACH_ISA(isa) {
        for (size_t i = 0; i < AF_COUNT(ms); i++)
            for (size_t j = 0; j < AF_COUNT(ns); j++) {
                prob p = plain(ms[i], ns[j], ks[(i + j) % AF_COUNT(ks)]);
                check_prob(&p, NULL, 1, "plain");
            }
    }
    af_isa_set(af_isa_best());
}

static void test_large_and_threads(void **state) {
    (void)state;
    FOR_EACH_ISA(isa) {
        prob p = plain(197, 300, 768); /* several panel blocks when L2 is small, M tails */
        check_prob(&p, NULL, 1, "large");
        check_prob(&p, NULL, 2, "large");
        prob q = plain(3, 2100, 129);
        check_prob(&q, NULL, 2, "wide");
        prob t = plain(601, 72, 96); /* B small next to A and C: a part of the M tiles per thread */
        check_prob(&t, NULL, 3, "tall");
        /* a short K: items of several micro-kernel tiles (gemm.c gemm_group), split evenly */
        prob sk = plain(1000, 50, 16);
        for (int th = 1; th <= 3; th++) check_prob(&sk, NULL, th, "short K");
        /* one and two rows take the row kernels (whole panels a call), B prefetched ahead
         * when a block is one panel; odd K leaves one step outside the unrolled loop */
        for (int64_t m = 1; m <= 2; m++) {
            prob r = plain(m, 300, 767 + m);
            check_prob(&r, NULL, 1, "few rows");
            check_prob(&r, NULL, 2, "few rows");
            prob w = plain(m, 2100, 129);
            check_prob(&w, NULL, 2, "few rows, wide");
        }
    }
    af_isa_set(af_isa_best());
}

/* A range of B's rows and a box of outputs (conv.c's valid-taps path): B packed with kp = 35
 * rows, the GEMM multiplying rows 14 to 27 only (k0, two taps of 7), over 3 x 5 rows written
 * into a 4 x 8 grid of outputs from (1, 2) on (cs_o = 8), adding into what C holds (a residual
 * that is C itself) and then Relu; the outputs outside the box keep their values. */
static void test_row_range(void **state) {
    (void)state;
    enum { KP = 35, K0 = 14, TL = 7, N = 40, MO = 3, MI = 5, RS_O = 50, RS_I = 9, OW = 8, ROWS = 32, ROW0 = 10 };
    static const int64_t tap_off[2] = {0, 11};
    FOR_EACH_ISA(isa) {
        for (int threads = 1; threads <= 2; threads++) {
            size_t alen = (size_t)((MO - 1) * RS_O + (MI - 1) * RS_I + 11 + TL);
            float *a = rnd_buf(alen), *b = rnd_buf(KP * N), *c = rnd_buf(ROWS * N);
            float *want = malloc(ROWS * N * sizeof(float)), *packed = malloc(af_gemm_packed_floats(KP, N) * sizeof(float));
            assert_true(want && packed);
            af_gemm_pack(b, KP, N, N, 1, packed);
            for (int64_t r = 0; r < ROWS; r++)
                for (int64_t j = 0; j < N; j++) {
                    int64_t o = r / OW - ROW0 / OW, i = r % OW - ROW0 % OW;
                    double v = c[r * N + j];
                    if (o >= 0 && o < MO && i >= 0 && i < MI) {
                        for (int t = 0; t < 2; t++)
                            for (int64_t e = 0; e < TL; e++)
                                v += (double)a[o * RS_O + i * RS_I + tap_off[t] + e] * b[(K0 + t * TL + e) * N + j];
                        v = v > 0 ? v : 0;
                    }
                    want[r * N + j] = (float)v;
                }
            af_vep v;
            memset(&v, 0, sizeof v);
            v.nsteps = 2;
            v.cols = N;
            v.y = c;
            v.steps[0] = (af_vep_step){AF_EP_ADD, AF_VEP_FULL, 0, 0.0f, 0.0f, c};
            v.steps[1] = (af_vep_step){AF_EP_RELU, AF_VEP_NONE, 0, 0.0f, 0.0f, NULL};
            af_gemm g = {a, MO, MI, RS_O, RS_I, tap_off, 2, TL, packed, N, c + ROW0 * N, N, &v, ROW0, 0,
                         AF_GEMM_F32, NULL, NULL, K0, KP, OW, NULL, 0, 0};
            af_runtime *rt = NULL;
            af_error err;
            if (threads > 1) assert_int_equal(af_runtime_new(threads, &rt, &err), AF_OK);
            run_ctx ctx = {&g};
            af_runtime_call(rt, call_gemm, &ctx);
            af_runtime_free(rt);
            char buf[128];
            snprintf(buf, sizeof buf, "row range [%s, %d threads]", af_isa_name(isa), threads);
            expect_close(c, want, ROWS * N, 2 * TL, buf);
            free(a);
            free(b);
            free(c);
            free(want);
            free(packed);
        }
    }
    af_isa_set(af_isa_best());
}

/* A 3x3 convolution over an NHWC input [H+2, W+2, C] (already padded) as implicit GEMM: rows are
 * output positions (outer: output row, inner: column, stride `s`), one tap per kernel row of
 * length 3 * C (the three kernel columns are contiguous in NHWC). */
static void test_taps(void **state) {
    (void)state;
    FOR_EACH_ISA(isa) {
        for (int64_t s = 1; s <= 2; s++) {
            int64_t H = 9, W = 11, C = 5, OH = (H + 2 - 3) / s + 1, OW = (W + 2 - 3) / s + 1;
            int64_t Wp = W + 2;
            prob p = {OH, OW, s * Wp * C, s * C, 3, 3 * C, 19, {0, Wp * C, 2 * Wp * C},
                      (size_t)((H + 2) * Wp * C), 0};
            check_prob(&p, NULL, 1, "taps");
            check_prob(&p, NULL, 2, "taps");
            /* 40 x 40 outputs of K = 18: whole output rows an item */
            int64_t H2 = 40, C2 = 2, Wp2 = H2 + 2;
            prob big = {H2, H2, Wp2 * C2, C2, 3, 3 * C2, 21, {0, Wp2 * C2, 2 * Wp2 * C2},
                        (size_t)((H2 + 2) * Wp2 * C2), 0};
            check_prob(&big, NULL, 1, "taps, short K");
            check_prob(&big, NULL, 2, "taps, short K");
            /* 1 to 4 output channels: dot products per output (gemm.c narrow_run) */
            for (int64_t n = 1; n <= 4; n++) {
                prob q = p;
                q.n = n;
                check_prob(&q, NULL, 1, "taps, few columns");
                check_prob(&q, NULL, 2, "taps, few columns");
            }
            /* an output row of 2 and then 1 position: the row kernels over the taps */
            for (int64_t ow = 2; ow >= 1; ow--) {
                prob q = p;
                q.mi = ow;
                check_prob(&q, NULL, 1, "taps, few rows");
            }
        }
    }
    af_isa_set(af_isa_best());
}

/* An epilogue over output [M, N] with steps `ops` (unary ones, and binary ones taking operands
 * in turn from `opnds` with their ranks and dims). */
typedef struct ep_case {
    const char *name;
    int nsteps;
    int64_t prog[8][3];
    float params[8][2];
} ep_case;

static void fill_ep(af_epilogue *ep, const ep_case *ec, int64_t m, int64_t n, float *col,
                    float *row, float *full, float *sc, float *gen) {
    memset(ep, 0, sizeof *ep);
    ep->rank = 2;
    ep->dims[0] = m;
    ep->dims[1] = n;
    ep->nsteps = ec->nsteps;
    for (int s = 0; s < ec->nsteps; s++) {
        af_ep_step *st = &ep->steps[s];
        st->op = (af_ep_op)ec->prog[s][0];
        st->reversed = ec->prog[s][2] != 0;
        st->p0 = ec->params[s][0];
        st->p1 = ec->params[s][1];
        switch (ec->prog[s][1]) {
        case AF_VEP_COL: st->operand = col; st->strides[1] = 1; break;
        case AF_VEP_ROW: st->operand = row; st->strides[0] = 1; break;
        case AF_VEP_FULL: st->operand = full; st->strides[0] = n; st->strides[1] = 1; break;
        case AF_VEP_SCALAR: st->operand = sc; break;
        case -1: st->operand = gen; st->strides[0] = 1; st->strides[1] = 2; break; /* strided */
        default: break;
        }
    }
}

/* One epilogue case on an m x n x k product, at 1 and 2 threads. */
static void check_ep_case(const ep_case *c, int64_t m, int64_t n, int64_t k) {
    float *col = rnd_buf((size_t)n), *row = rnd_buf((size_t)m);
    float *full = rnd_buf((size_t)(m * n)), *gen = rnd_buf((size_t)(m + 2 * n));
    float sc = 0.75f;
    for (int64_t i = 0; i < m; i++) row[i] += 2.0f; /* divisors away from 0 */
    if (!strncmp(c->name, "nan", 3)) col[1] = NAN;
    af_epilogue ep;
    fill_ep(&ep, c, m, n, col, row, full, &sc, gen);
    prob p = plain(m, n, k);
    check_prob(&p, &ep, 1, c->name);
    check_prob(&p, &ep, 2, c->name);
    free(col);
    free(row);
    free(full);
    free(gen);
}

static void test_epilogue(void **state) {
    (void)state;
    static const ep_case cases[] = {
        {"bias+relu", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}},
        {"scale-shift+residual+clip", 4,
         {{AF_EP_MUL, AF_VEP_COL, 0}, {AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_ADD, AF_VEP_FULL, 0},
          {AF_EP_CLIP, 0, 0}}, {{0}, {0}, {0}, {0.0f, 6.0f}}},
        {"row sub/div", 2, {{AF_EP_SUB, AF_VEP_ROW, 1}, {AF_EP_DIV, AF_VEP_ROW, 0}}, {{0}}},
        {"scalar mul, reversed sub", 2, {{AF_EP_MUL, AF_VEP_SCALAR, 0}, {AF_EP_SUB, AF_VEP_FULL, 1}}, {{0}}},
        {"leaky+sigmoid", 2, {{AF_EP_LEAKY_RELU, 0, 0}, {AF_EP_SIGMOID, 0, 0}}, {{0.1f, 0}}},
        {"hard sigmoid, hard swish", 2, {{AF_EP_HARD_SWISH, 0, 0}, {AF_EP_HARD_SIGMOID, 0, 0}},
         {{0}, {0.2f, 0.5f}}},
        {"silu", 1, {{AF_EP_SILU, 0, 0}}, {{0}}},
        {"gelu erf", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_GELU, 0, 0}}, {{0}, {0.0f, 0}}},
        {"gelu tanh", 1, {{AF_EP_GELU, 0, 0}}, {{1.0f, 0}}},
        {"tanh, elu", 2, {{AF_EP_TANH, 0, 0}, {AF_EP_ELU, 0, 0}}, {{0}, {1.3f, 0}}},
        {"generic broadcast", 2, {{AF_EP_ADD, -1, 0}, {AF_EP_RELU, 0, 0}}, {{0}}},
        /* a Relu or Clip after the bias and residual runs in the micro-kernel's registers */
        {"bias+residual+relu", 3,
         {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_ADD, AF_VEP_FULL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}},
        {"relu, then sigmoid", 2, {{AF_EP_RELU, 0, 0}, {AF_EP_SIGMOID, 0, 0}}, {{0}}},
        {"bias+clip, min above max", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_CLIP, 0, 0}},
         {{0}, {0.5f, -0.5f}}},
        /* NaN in column 1 (the bias): Relu and Clip keep it, in registers as on the tile */
        {"nan: bias+relu, clip", 3,
         {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_RELU, 0, 0}, {AF_EP_CLIP, 0, 0}},
         {{0}, {0}, {-0.3f, 0.4f}}},
    };
    /* these cases (by index) also with K in blocks (gemm.c's k_block: an A of 197 x 3100 floats
     * is larger than any L2 here): the bias and residual come with the first block, the
     * clamp and the other steps after the last */
    static const size_t k_blocked[] = {1, 4, 10, 11};
    FOR_EACH_ISA(isa) {
        for (size_t c = 0; c < AF_COUNT(cases); c++) {
            check_ep_case(&cases[c], 29, 37, 20);
            check_ep_case(&cases[c], 1, 37, 21); /* the row kernels' epilogue */
            check_ep_case(&cases[c], 2, 70, 20);
            check_ep_case(&cases[c], 400, 37, 16); /* items of several tiles */
            check_ep_case(&cases[c], 29, 3, 20);   /* few columns: the epilogue per row */
        }
        for (size_t c = 0; c < AF_COUNT(k_blocked); c++) check_ep_case(&cases[k_blocked[c]], 197, 37, 3100);
    }
    /* Fake quantizations around a residual and a Relu (a quantized ResNet block's last conv):
     * in one K block the micro-kernels run them in registers (gemm.c split_ep, up to
     * AF_REG_MAX steps; the rest on the tile), in several K blocks on the stored tile. */
    static const ep_case fq[] = {
        {"bias, fq, residual, relu, fq", 5,
         {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_FAKE_QUANT, 0, 0}, {AF_EP_ADD, AF_VEP_FULL, 0},
          {AF_EP_RELU, 0, 0}, {AF_EP_FAKE_QUANT, 0, 0}},
         {{0}, {0.75f, 100.0f}, {0}, {0}, {0.5f, 3.0f}}},
        {"fq, clip, fq, residual, relu, fq, clip, fq: past the registers' six", 8,
         {{AF_EP_FAKE_QUANT, 0, 0}, {AF_EP_CLIP, 0, 0}, {AF_EP_FAKE_QUANT, 0, 0},
          {AF_EP_ADD, AF_VEP_FULL, 0}, {AF_EP_RELU, 0, 0}, {AF_EP_FAKE_QUANT, 0, 0},
          {AF_EP_CLIP, 0, 0}, {AF_EP_FAKE_QUANT, 0, 0}},
         {{1.5f, 0.0f}, {-6.0f, 9.0f}, {0.25f, 128.0f}, {0}, {0}, {0.125f, 255.0f}, {-3.0f, 2.5f},
          {0.75f, 7.0f}}},
    };
    int_data = true;
    FOR_EACH_ISA(isa) {
        for (size_t c = 0; c < AF_COUNT(fq); c++) {
            check_ep_case(&fq[c], 29, 37, 20);
            check_ep_case(&fq[c], 1, 37, 21);
            check_ep_case(&fq[c], 400, 37, 16);
            check_ep_case(&fq[c], 197, 37, 3100);
        }
    }
    int_data = false;
    af_isa_set(af_isa_best());
}

/* B's rows scaled inside the GEMM (a squeeze-excite gate on a 1x1 conv's weights): one block
 * and several (K 768: two 32-wide panels a block on a 2 MiB L2, a 16-wide last panel), each
 * thread scaling the blocks it runs, with and without an epilogue. */
static void test_rowscale(void **state) {
    (void)state;
    float *r = rnd_buf(768), *col = rnd_buf(300);
    for (int i = 0; i < 768; i++) r[i] += 1.5f; /* mostly positive, some negative */
    static const ep_case bias_silu = {"bias+silu", 2,
                                      {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_SILU, 0, 0}}, {{0}}};
    af_epilogue ep;
    fill_ep(&ep, &bias_silu, 197, 300, col, NULL, NULL, NULL, NULL);
    rowscale = r;
    FOR_EACH_ISA(isa) {
        prob p = plain(197, 300, 768), q = plain(13, 50, 17);
        check_prob(&p, NULL, 1, "rowscale");
        check_prob(&p, &ep, 2, "rowscale, bias+silu");
        check_prob(&q, NULL, 2, "rowscale, one block");
    }
    rowscale = NULL;
    free(r);
    free(col);
    af_isa_set(af_isa_best());
}


/* vep_kind must classify the common broadcasts of an NHWC conv output and fall back otherwise. */
static void test_vep_kinds(void **state) {
    (void)state;
    af_epilogue ep = {0};
    ep.rank = 4;
    int64_t dims[4] = {1, 5, 6, 7};
    memcpy(ep.dims, dims, sizeof dims);
    ep.nsteps = 4;
    float x[256];
    int64_t st[4][4] = {{0, 0, 0, 1}, {210, 42, 7, 1}, {0, 0, 0, 0}, {0, 6, 1, 0}};
    for (int s = 0; s < 4; s++) {
        ep.steps[s].op = AF_EP_ADD;
        ep.steps[s].operand = x;
        memcpy(ep.steps[s].strides, st[s], sizeof st[s]);
    }
    af_vep v;
    af_vep_build(&ep, x, 7, &v);
    assert_int_equal(v.nsteps, 4);
    assert_int_equal(v.steps[0].kind, AF_VEP_COL);
    assert_int_equal(v.steps[1].kind, AF_VEP_FULL);
    assert_int_equal(v.steps[2].kind, AF_VEP_SCALAR);
    assert_int_equal(v.steps[3].kind, AF_VEP_ROW);
    assert_null(v.generic);
    ep.steps[3].strides[2] = 0; /* [1, 5, 1, 1]: per-H, not one of the kinds */
    af_vep_build(&ep, x, 7, &v);
    assert_non_null(v.generic);
    assert_int_equal(v.nsteps, 0); /* the whole program runs through the reference epilogue */
    float b = 1.0f;
    af_vep_prepend(&v, AF_EP_ADD, AF_VEP_SCALAR, &b); /* kernels' own steps stay vectorised */
    assert_int_equal(v.nsteps, 1);
}

/* Half and bfloat16 operands: shapes with every tail, K from 0 to 768, a 3x3 convolution over
 * 32 channels, the epilogue, and a K of 17 padded to 32. */
static void test_low_precision(void **state) {
    (void)state;
    static const int64_t ms[] = {1, 2, 5, 12, 13, 29, 197};
    static const int64_t ns[] = {7, 16, 33, 100};
    static const int64_t ks[] = {0, 32, 96, 64, 768};
    af_epilogue ep;
    int64_t en = 33;
    float *col = rnd_buf((size_t)en);
    ep_case bias_relu = {"bias+relu", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}};
    FOR_EACH_ISA(isa) {
        for (af_gemm_type t = AF_GEMM_F16; t <= AF_GEMM_BF16; t++) {
            for (size_t i = 0; i < AF_COUNT(ms); i++)
                for (size_t j = 0; j < AF_COUNT(ns); j++) {
                    prob p = plain(ms[i], ns[j], ks[(i + j) % AF_COUNT(ks)]);
                    check_prob_t(&p, NULL, 1 + (int)(i % 2), "plain", t);
                }
            int64_t H = 7, W = 9, C = 32, Wp = W + 2; /* 32 + the rows AMX reads past the end */
            prob taps = {H, W, Wp * C, C, 3, 3 * C, 40, {0, Wp * C, 2 * Wp * C},
                         (size_t)((H + 2 + 4) * Wp * C), 0};
            check_prob_t(&taps, NULL, 2, "taps", t);
            /* bfloat16 K = 17 padded to 32: B's rows 17..31 are zero. */
            prob odd = plain(13, 50, t == AF_GEMM_BF16 ? 32 : 17);
            odd.kb = 17;
            check_prob_t(&odd, NULL, 1, "odd K", t);
            fill_ep(&ep, &bias_relu, 29, en, col, NULL, NULL, NULL, NULL);
            prob e = plain(29, en, 64);
            check_prob_t(&e, &ep, 2, "epilogue", t);
        }
    }
    free(col);
    af_isa_set(af_isa_best());
}

/* The vector conversions against the scalar ones, bit for bit: bfloat16 rounding to nearest
 * even (ties, NaN, infinities; denormals may flush to zero, as the AVX512_BF16 conversion
 * does) and rounding to half values (overflow to infinity). */
static void test_conversions(void **state) {
    (void)state;
    enum { N = 1000 };
    float x[N], h[N];
    uint16_t b[N];
    for (int i = 0; i < N; i++) x[i] = (float)tu_rnd() * ldexpf(1.0f, i % 40) * (i % 3 ? 1.0f : 1e-6f);
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f,
                                    1e-40f, 1.00390625f, 1.01171875f, 7e4f, -1e9f};
    memcpy(x, special, sizeof special);
    FOR_EACH_ISA(isa) {
        af_vec()->to_bf16(x, b, N);
        af_vec()->round_f16(x, h, N);
        for (int i = 0; i < N; i++) {
            float hr = af_half_to_float(af_float_to_half(x[i]));
            bool flushed = fabsf(x[i]) < FLT_MIN && (b[i] & 0x7fff) == 0; /* AVX512_BF16: DAZ */
            if (b[i] != af_float_to_bf16(x[i]) && !(isnan(x[i]) && (b[i] & 0x7fff) > 0x7f80) &&
                !flushed)
                fail_msg("%s to_bf16(%.9g) = 0x%04x, want 0x%04x", af_isa_name(isa), x[i], b[i],
                         af_float_to_bf16(x[i]));
            if (memcmp(&h[i], &hr, sizeof hr) && !(isnan(h[i]) && isnan(hr)))
                fail_msg("%s round_f16(%.9g) = %.9g, want %.9g", af_isa_name(isa), x[i], h[i], hr);
        }
    }
    af_isa_set(af_isa_best());
}

/* Fake quantization (AF_EP_FAKE_QUANT) in the vector kernels gives the reference's bits, lane
 * for lane, on every ISA and every tail length: ties of x / s (round half to even), values that
 * saturate at both ends, signed zeros, infinities and NaN, int8-style (z 128) and uint8-style
 * (z 0, z 255) zero points, through the unary kernel and through the epilogue of a tile. */
static void test_fake_quant(void **state) {
    (void)state;
    enum { N = 300 };
    static const float sz[][2] = {{0.05f, 128.0f}, {0.1f, 0.0f}, {0.0173f, 255.0f}, {3.0f, 7.0f}};
    float x[N], y[N], want[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)((i % 97) - 48) * 0.025f; /* multiples of s / 2 for s = 0.05: ties */
        if (i % 5 == 1) x[i] = (float)(i - 150) * 0.0137f;
    }
    x[3] = -0.0f, x[7] = 0.0f, x[11] = INFINITY, x[13] = -INFINITY, x[17] = NAN;
    x[19] = 1e30f, x[23] = -1e30f, x[29] = 0.075f, x[31] = -0.125f;
    FOR_EACH_ISA(isa) {
        for (size_t c = 0; c < AF_COUNT(sz); c++) {
            float s = sz[c][0], z = sz[c][1];
            for (int i = 0; i < N; i++) want[i] = af_fake_quant(x[i], s, z);
            for (int64_t n = 1; n <= 40; n++) { /* every tail, from the same start */
                memset(y, 0, sizeof y);
                af_vec()->unary(AF_EP_FAKE_QUANT, s, z, x, y, n);
                assert_memory_equal(y, want, (size_t)n * sizeof(float));
            }
            memcpy(y, x, sizeof y);
            af_epilogue ep = {.nsteps = 1, .rank = 2, .dims = {12, 25}};
            ep.steps[0] = (af_ep_step){.op = AF_EP_FAKE_QUANT, .p0 = s, .p1 = z};
            af_vep v;
            af_vep_build(&ep, y, 25, &v);
            af_vec()->ep_tile(&v, y, 25, 0, 0, 12, 25);
            assert_memory_equal(y, want, 300 * sizeof(float));
        }
    }
    af_isa_set(af_isa_best());
}

static void test_packing(void **state) {
    (void)state;
    /* Panel widths: 50 columns leave 18 after the first panel, more than 16: two 32-wide. */
    assert_int_equal(af_gemm_packed_floats(3, 50), 3 * 64);
    assert_int_equal(af_gemm_packed_floats(3, 48), 3 * 48);
    assert_int_equal(af_gemm_packed_floats(3, 7), 3 * 16);
    assert_int_equal(af_gemm_packed_floats(0, 7), 0);
    float b[6] = {1, 2, 3, 4, 5, 6}, d[48];
    af_gemm_pack(b, 3, 2, 1, 3, d); /* the transpose of a 2 x 3 matrix */
    assert_true(d[0] == 1 && d[1] == 4 && d[2] == 0 && d[16] == 2 && d[17] == 5);
    assert_true(d[32] == 3 && d[33] == 6 && d[47] == 0);
}

/* ---- U8S8 ------------------------------------------------------------------------------------------ */

/* Problem p (tap_len a multiple of 4; K rows of B past kb zero) in U8S8 on the ISA in force:
 * A uint8 codes, B int8 ([-128, 127], both ends included), A's zero point z, scales per column
 * or one for all, ep applied after; against (sum (a - z) b) * scale in exact integers, then the
 * reference epilogue. The output goes to got (m x n) for the twin comparison. */
/* Set: B's weights within [-64, 64] (both ends taken), and af_gemm.w7 says so (the
 * VPMADDUBSW path of CPUs without VNNI, exact for such weights whatever A's codes). */
static bool u8_w7;

static void check_u8s8(const prob *p, const af_epilogue *ep, int threads, int z, bool per_col,
                       const char *what, float *got) {
    int64_t m = p->mo * p->mi, k = prob_k(p), kb = p->kb ? p->kb : k;
    uint8_t *a = malloc(p->a_len + 1);
    int8_t *b = malloc((size_t)(k * p->n) + 1);
    void *packed = malloc(af_gemm_packed_bytes(AF_GEMM_U8S8, kb, p->n));
    float *scale = malloc((size_t)p->n * sizeof(float)), *c = got;
    float *want = malloc((size_t)(m * p->n + 1) * sizeof(float));
    assert_true(a && b && packed && scale && want);
    for (size_t i = 0; i < p->a_len; i++) a[i] = (uint8_t)(i % 7 == 0 ? (i % 2 ? 255 : 0) : (tu_rnd() + 1.0) * 127.9);
    for (int64_t i = 0; i < k * p->n; i++)
        b[i] = i >= kb * p->n ? 0
               : u8_w7 ? (int8_t)(i % 5 == 0 ? (i % 2 ? 64 : -64) : tu_rnd() * 64.9)
                       : (int8_t)(i % 5 == 0 ? (i % 2 ? 127 : -128) : tu_rnd() * 127.9);
    for (int64_t j = 0; j < p->n; j++) scale[j] = per_col || j == 0 ? (float)(0.01 * (1.5 + tu_rnd())) : scale[0];
    af_gemm_pack_u8s8(b, kb, p->n, p->n, 1, packed);
    af_vep v;
    af_vep_build(ep, c, p->n, &v);
    af_gemm g = {a, p->mo, p->mi, p->rs_o, p->rs_i, p->tap_off, p->ntaps, p->tap_len, packed, p->n,
                 c, p->n, &v, 0, 0, AF_GEMM_U8S8, NULL, NULL, 0, 0, 0, scale, z, u8_w7};
    af_runtime *rt = NULL;
    af_error err;
    if (threads > 1) assert_int_equal(af_runtime_new(threads, &rt, &err), AF_OK);
    for (int64_t i = 0; i < m * p->n; i++) c[i] = NAN;
    run_ctx ctx = {&g};
    af_runtime_call(rt, call_gemm, &ctx);
    af_runtime_free(rt);
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < p->n; j++) {
            int64_t acc = 0;
            for (int64_t kk = 0; kk < k; kk++) {
                int64_t o = r / p->mi, i = r % p->mi, t = kk / p->tap_len, jj = kk % p->tap_len;
                acc += ((int64_t)a[o * p->rs_o + i * p->rs_i + p->tap_off[t] + jj] - z) * b[kk * p->n + j];
            }
            want[r * p->n + j] = (float)((double)acc * scale[j]);
        }
    if (ep) af_epilogue_apply_at(ep, want, 0, m * p->n);
    char buf[256];
    snprintf(buf, sizeof buf, "%s [%s, %s, M %lld, N %lld, K %lld, z %d, %s, %d threads]", what,
             af_isa_name(af_isa_get()), u8_w7 ? "u8s8 7-bit" : "u8s8", (long long)m, (long long)p->n, (long long)k, z,
             per_col ? "per column" : "per tensor", threads);
    expect_close(c, want, m * p->n, k, buf);
    free(a);
    free(b);
    free(packed);
    free(scale);
    free(want);
}

/* Each case on every ISA this CPU has, 1 and 2 threads, from the same random operands; every
 * ISA's output within float rounding of the generic twin's (the integer sums are exact). */
static void u8s8_case(const prob *p, const af_epilogue *ep, int z, bool per_col, const char *what) {
    int64_t cnt = p->mo * p->mi * p->n;
    float *twin = malloc((size_t)(cnt + 1) * sizeof(float)), *c = malloc((size_t)(cnt + 1) * sizeof(float));
    assert_true(twin && c);
    uint64_t seed = tu_rng;
    FOR_EACH_ISA(isa)
        for (int threads = 1; threads <= 2; threads++) {
            tu_rng = seed;
            check_u8s8(p, ep, threads, z, per_col, what, isa == AF_ISA_GENERIC && threads == 1 ? twin : c);
            if (isa == AF_ISA_GENERIC && threads == 1) continue;
            for (int64_t i = 0; i < cnt; i++)
                if (!(fabs((double)c[i] - twin[i]) <= 1e-6 * (1.0 + fabs((double)twin[i]))))
                    fail_msg("%s [%s, %d threads]: element %lld: %.9g, generic twin %.9g", what,
                             af_isa_name(isa), threads, (long long)i, c[i], twin[i]);
        }
    af_isa_set(af_isa_best());
    free(twin);
    free(c);
}

/* 7-bit weights: plain products, K not a multiple of 4, conv taps, an epilogue; the same
 * exact sums on every ISA (VPMADDUBSW's int16 pairs of 255 x 64 x 2 stay below 32768). */
static void test_u8s8_w7(void **state) {
    (void)state;
    u8_w7 = true;
    static const int64_t ms[] = {1, 6, 13, 29};
    static const int64_t ns[] = {7, 16, 33, 100};
    for (size_t i = 0; i < AF_COUNT(ms); i++)
        for (size_t j = 0; j < AF_COUNT(ns); j++) {
            prob p = plain(ms[i], ns[j], (int64_t)(4 + 36 * ((i + j) % 4)));
            u8s8_case(&p, NULL, (i + j) % 2 ? 255 : 0, j % 2 == 0, "7-bit plain");
        }
    prob odd = plain(13, 50, 20);
    odd.kb = 17;
    u8s8_case(&odd, NULL, 131, true, "7-bit odd K");
    int64_t H = 9, W = 11, C = 8, Wp = W + 2;
    prob taps = {H, W, Wp * C, C, 9, C, 19,
                 {0, C, 2 * C, Wp * C, Wp * C + C, Wp * C + 2 * C, 2 * Wp * C, 2 * Wp * C + C, 2 * Wp * C + 2 * C},
                 (size_t)((H + 2) * Wp * C), 0};
    u8s8_case(&taps, NULL, 0, true, "7-bit taps");
    static const ep_case relu = {"bias+relu", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}};
    float *col = rnd_buf(37);
    af_epilogue ep;
    fill_ep(&ep, &relu, 29, 37, col, NULL, NULL, NULL, NULL);
    prob p = plain(29, 37, 40);
    u8s8_case(&p, &ep, 255, false, "7-bit bias+relu");
    free(col);
    u8_w7 = false;
}

static void test_u8s8(void **state) {
    (void)state;
    static const int64_t ms[] = {1, 5, 12, 13, 29};
    static const int64_t ns[] = {7, 16, 33, 100};
    static const int64_t ks[] = {4, 8, 36, 64, 516};
    for (size_t i = 0; i < AF_COUNT(ms); i++)
        for (size_t j = 0; j < AF_COUNT(ns); j++) {
            prob p = plain(ms[i], ns[j], ks[(i + j) % AF_COUNT(ks)]);
            u8s8_case(&p, NULL, (i + j) % 2 ? 255 : 0, j % 2 == 0, "plain");
        }
    /* odd K = 17 rounded to 20: B's rows 17..19 zero, A's padding bytes anything */
    prob odd = plain(13, 50, 20);
    odd.kb = 17;
    u8s8_case(&odd, NULL, 131, true, "odd K");
    /* a 3x3 conv's taps over a bordered image of 8 channels, stride 1 and 2 */
    for (int64_t s = 1; s <= 2; s++) {
        int64_t H = 9, W = 11, C = 8, OH = (H + 2 - 3) / s + 1, OW = (W + 2 - 3) / s + 1, Wp = W + 2;
        prob p = {OH, OW, s * Wp * C, s * C, 9, C, 19,
                  {0, C, 2 * C, Wp * C, Wp * C + C, Wp * C + 2 * C, 2 * Wp * C, 2 * Wp * C + C, 2 * Wp * C + 2 * C},
                  (size_t)((H + 2) * Wp * C), 0};
        u8s8_case(&p, NULL, 255, s == 1, "taps");
        u8s8_case(&p, NULL, 0, s == 2, "taps");
    }
    /* epilogues: bias + Relu, bias + residual + Relu in registers, and steps on the tile */
    static const ep_case eps[] = {
        {"bias+relu", 2, {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}},
        {"bias+residual+relu", 3,
         {{AF_EP_ADD, AF_VEP_COL, 0}, {AF_EP_ADD, AF_VEP_FULL, 0}, {AF_EP_RELU, 0, 0}}, {{0}}},
        {"residual, sigmoid", 2, {{AF_EP_ADD, AF_VEP_FULL, 0}, {AF_EP_SIGMOID, 0, 0}}, {{0}}},
    };
    int64_t m = 29, n = 37;
    float *col = rnd_buf((size_t)n), *full = rnd_buf((size_t)(m * n));
    for (size_t e = 0; e < AF_COUNT(eps); e++) {
        af_epilogue ep;
        fill_ep(&ep, &eps[e], m, n, col, NULL, full, NULL, NULL);
        prob p = plain(m, n, 40);
        u8s8_case(&p, &ep, e % 2 ? 255 : 0, e != 1, eps[e].name);
    }
    free(col);
    free(full);
    /* packing: quads along K in the bytes of each column's word, column sums after the panels */
    int8_t b[10] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10}; /* 5 x 2, row-major */
    size_t bytes = af_gemm_packed_bytes(AF_GEMM_U8S8, 5, 2);
    assert_int_equal(bytes, 4 * (2 * 16 + 16));
    int8_t *d = malloc(bytes);
    assert_non_null(d);
    af_gemm_pack_u8s8(b, 5, 2, 2, 1, d);
    assert_true(d[0] == 1 && d[1] == 3 && d[2] == 5 && d[3] == 7 && d[4] == -2 && d[7] == -8);
    assert_true(d[8] == 0 && d[64] == 9 && d[65] == 0 && d[68] == -10);
    const int32_t *cs = af_gemm_u8s8_colsum(d, 5, 2);
    assert_true(cs[0] == 25 && cs[1] == -30 && cs[2] == 0 && cs[15] == 0);
    free(d);
}

/* Near ties, where x * (1 / s) and x / s can round to different codes: x within 6 ulps of
 * (k + 1/2) s for every k in the uint8 range, many scales, fake quantization and to_u8 against
 * the references bit for bit on every ISA. The vector quantizers divide, as QuantizeLinear
 * does; a reciprocal with a fallback near ties was tried and measured slower on Zen 5. */
static void test_quant_ties(void **state) {
    (void)state;
    enum { K = 520, U = 13, N = K * U };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(N);
    assert_true(x && y && q);
    for (int t = 0; t < 40; t++) {
        float s = (float)(1e-4 * pow(1e5, tu_rnd() * 0.5 + 0.5)), z = (float)(t * 37 % 256);
        for (int k = 0; k < K; k++)
            for (int u = 0; u < U; u++) {
                float v = ((float)(k - K / 2) + 0.5f) * s;
                for (int d = u - U / 2; d > 0; d--) v = nextafterf(v, INFINITY);
                for (int d = u - U / 2; d < 0; d++) v = nextafterf(v, -INFINITY);
                x[k * U + u] = v;
            }
        FOR_EACH_ISA(isa) {
            af_vec()->unary(AF_EP_FAKE_QUANT, s, z, x, y, N);
            af_vec()->to_u8(x, q, N, s, (int)z);
            for (int i = 0; i < N; i++) {
                float want = af_fake_quant(x[i], s, z), code = fused_quant_code(x[i], s, z);
                if (memcmp(&y[i], &want, sizeof want) || (float)q[i] != code)
                    fail_msg("%s: x %.9g s %.9g z %g: fq %.9g (want %.9g), code %d (want %g)",
                             af_isa_name(isa), x[i], s, z, y[i], want, q[i], code);
            }
        }
    }
    af_isa_set(af_isa_best());
    free(x);
    free(y);
    free(q);
}

/* The uint8 codes of A (vec to_u8) against the reference's formula, bit for bit: ties to even,
 * both clamps, NaN and infinities, every zero point class, on every ISA. */
static void test_to_u8(void **state) {
    (void)state;
    enum { N = 1003 };
    float x[N];
    uint8_t y[N];
    for (int i = 0; i < N; i++) x[i] = (float)(tu_rnd() * 3.0);
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0.005f, 0.015f, -0.005f,
                                    -0.015f, 1.275f, 1.285f, -1.285f, 2.555f, 1e30f, -1e30f, 0.025f};
    memcpy(x, special, sizeof special);
    static const float scales[] = {0.01f, 0.02f, 1.0f / 255.0f};
    static const int zeros[] = {0, 128, 255, 7};
    FOR_EACH_ISA(isa)
        for (size_t si = 0; si < AF_COUNT(scales); si++)
            for (size_t zi = 0; zi < AF_COUNT(zeros); zi++) {
                af_vec()->to_u8(x, y, N, scales[si], zeros[zi]);
                for (int i = 0; i < N; i++) {
                    float want = fused_quant_code(x[i], scales[si], (float)zeros[zi]);
                    if ((float)y[i] != want)
                        fail_msg("%s to_u8(%.9g, s %g, z %d) = %d, want %g", af_isa_name(isa), x[i],
                                 scales[si], zeros[zi], y[i], want);
                }
            }
    af_isa_set(af_isa_best());
}

int main(void) {
    tu_rng = 0x5eed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packing),
        cmocka_unit_test(test_fake_quant),
        cmocka_unit_test(test_vep_kinds),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_large_and_threads),
        cmocka_unit_test(test_rowscale),
        cmocka_unit_test(test_taps),
        cmocka_unit_test(test_row_range),
        cmocka_unit_test(test_epilogue),
        cmocka_unit_test(test_low_precision),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_u8s8),
        cmocka_unit_test(test_u8s8_w7),
        cmocka_unit_test(test_to_u8),
        cmocka_unit_test(test_quant_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
