/* The vector kernels: one table of functions per ISA (src/kernels/simd/vec_impl.h compiled three
 * times: vec_avx512.c, vec_avx2.c, vec_generic.c), and af_vec() to get the table of the ISA in
 * force (cpu.h). Everything that runs per element in the fast paths lives behind this table:
 * the GEMM micro-kernels, the vector epilogue, and the row kernels of the other fast ops.
 *
 * Invariant: every function here reads and writes only the ranges its arguments describe; the
 * callers (gemm.c, the fast paths of the op kernels) have checked those ranges against the
 * tensors. Results agree with the reference kernels within float rounding (and the error bounds
 * of vmath.h for exp, tanh and erf); all ISAs compute the same formulas, lane for lane. */
#ifndef AF_KERNELS_VEC_H
#define AF_KERNELS_VEC_H

#include "ir/epilogue.h"

#include <stdint.h>

/* Columns of one packed B panel, whatever the ISA (so packed weights are portable). */
#define AF_GEMM_NR 32
/* Most rows a micro-kernel computes at once (AVX-512: 12 rows x 2 vectors = 24 accumulators;
 * 14 rows would use 28 but leave too few general registers for the row pointers). */
#define AF_GEMM_MR_MAX 12

/* Element types of a GEMM's operands (gemm.h), the precisions of --precision_mode:
 *   F32   A and B float32;
 *   F16   A float32 (holding values the caller rounded to half precision), B packed in IEEE
 *         half, widened in registers: fp32 arithmetic on half-precision data;
 *   BF16  A bfloat16, B packed in pairs of bfloat16 along K (the element pairs of the
 *         AVX512_BF16 dot product), fp32 accumulation;
 *   U8S8  the int8 form of FusedConv / FusedMatMul (quant = 1): A the uint8 codes of the
 *         activation, B int8 packed in quads along K (one 32-bit word per column for 4 K rows,
 *         VPDPBUSD's layout), exact int32 accumulation, then in registers
 *         c = (acc - qzero * colsum[j]) * qscale[j] before the epilogue. */
typedef enum af_gemm_type {
    AF_GEMM_F32 = 0,
    AF_GEMM_F16 = 1,
    AF_GEMM_BF16 = 2,
    AF_GEMM_U8S8 = 3
} af_gemm_type;
#define AF_GEMM_TYPES 4

/* One micro-kernel call: rows [0, mr) x columns [0, nv * vw) of C = A x B, overwritten.
 * Row r of A is read at a + r * rs; its k-th element (k = t * tap_len + i) at
 * a + r * rs + tap_off[t] + i: a plain matrix has one tap at offset 0, a convolution one tap per
 * kernel row (or per kernel position) so that A is the input tensor itself, never an im2col copy.
 * B row k is at b + k * bstride (a packed panel, see gemm.h). Offsets count elements of the
 * operands' type (af_gemm_type); with BF16, B "rows" are pairs of K rows (one 32-bit word per
 * column) and tap_len is even. */
/* A longer start of the epilogue in registers, for a GEMM in one K block (gemm.c split_ep):
 * after the bias, up to AF_REG_MAX steps in the program's order, each AF_EP_ADD (+ the residual
 * res), AF_EP_RELU, AF_EP_CLIP (p0, p1) or AF_EP_FAKE_QUANT (p0 scale, p1 zero point). A
 * quantized ResNet's last conv of a block ends with fq, + residual, Relu, fq: run on the stored
 * tile, those four passes (the fq's a division each) were a quarter of its time. */
#define AF_REG_MAX 6
typedef struct af_reg_prog {
    int n;
    struct {
        int op;
        float p0, p1;
    } s[AF_REG_MAX];
} af_reg_prog;

typedef struct af_ukr_args {
    const void *a;
    int64_t rs;
    const int64_t *tap_off;
    int64_t ntaps, tap_len;
    const void *b;
    int64_t bstride;
    float *c;
    int64_t ldc;
    /* The start of the epilogue program, applied in registers before the store (gemm.c picks
     * it): + bias[j], then + res[r * ldres + j], then (clamp not NULL) x < clamp[0] ? clamp[0]
     * : x, then x > clamp[1] ? clamp[1] : x, which is Relu (0, +inf) and Clip as the epilogue
     * computes them. (Other activations run on the stored tile, through ep_tile: one dispatch
     * per tile instead of one per register.) */
    const float *bias, *res;
    int64_t ldres;
    const float *clamp;
    /* Bringing data in from memory while computing: for the first pf_steps k steps, the two
     * cache lines at pf, pf + 64 bytes are requested and pf advances by pf_step bytes: B itself
     * some rows ahead of the K loop, or the rows of A the next tile reads. */
    const void *pf;
    int64_t pf_steps, pf_step;
    /* Columns of C's last vector per row in [1, VW]: fewer than VW are stored (and bias and res
     * read) with masks, so a panel's last columns need no tile aside. */
    int64_t last;
    /* U8S8 only: the column sums of B and the scales of these columns (read like bias), and
     * A's zero point: c = (acc - qzero * colsum[j]) * qscale[j], before bias and the rest. With
     * U8S8, A offsets count bytes, B rows are quads of K rows and tap_len is a multiple of 4. */
    const int32_t *colsum;
    const float *qscale;
    int32_t qzero;
    /* U8S8: every weight of B is within [-64, 64] (the packer checked; lower.c "w_7bit"), so
     * CPUs without VNNI may sum byte pairs in int16 (VPMADDUBSW) without saturating. */
    int32_t w7;
    /* Not NULL: after the bias, this program (its ADD reads res), in place of res and clamp. */
    const af_reg_prog *prog;
    /* U8S8 kernels only. Not NULL (then c is NULL): the outputs stored as the uint8 codes of
     * the quantization (codes_scale, codes_zero), vec to_u8's arithmetic, at codes + r * ldc +
     * column. */
    uint8_t *codes;
    float codes_scale;
    int32_t codes_zero;
} af_ukr_args;

typedef void (*af_ukr_fn)(const af_ukr_args *p);

/* The epilogue program in the form the vector kernels run: the output seen as rows x cols (cols
 * = its last dim), each binary operand classified by how it broadcasts over that view. */
typedef enum af_vep_kind {
    AF_VEP_NONE = 0, /* unary step */
    AF_VEP_SCALAR,   /* one value for every element */
    AF_VEP_COL,      /* x[col]: bias, per-channel scale/shift in channels-last layout */
    AF_VEP_ROW,      /* x[row]: per-row mean/scale (LayerNorm pieces) */
    AF_VEP_FULL      /* x[row * cols + col]: a residual of the output's shape */
} af_vep_kind;

typedef struct af_vep_step {
    int op;   /* af_ep_op */
    int kind; /* af_vep_kind */
    int rev;  /* y = x (op) y */
    float p0, p1;
    const float *x;
} af_vep_step;

/* Room for the steps a kernel puts before the program (alpha, bias). */
#define AF_VEP_MAX_STEPS (AF_EP_MAX_STEPS + 4)

typedef struct af_vep {
    int nsteps;
    int64_t cols; /* the output's last dim */
    /* When some operand of the program broadcasts in another way, the program runs through the
     * reference epilogue after the vector steps (then only the prepended ones): generic points
     * at it and y at the whole output. */
    const af_epilogue *generic;
    float *y;
    /* Not NULL: the output is stored as the uint8 codes of the program's result y in the
     * quantization (s, z): output (row, col) becomes codes[row * cols + col] =
     * clamp(round_half_even(y / s) + z, 0, 255) (vec to_u8) instead of y. Only the GEMM driver
     * takes such a program, for U8S8 products (gemm.h). */
    uint8_t *codes;
    float codes_scale;
    int codes_zero;
    af_vep_step steps[AF_VEP_MAX_STEPS];
} af_vep;

/* Classify ep's steps for an output of ep->dims written at y (cols = last dim, 1 for a scalar
 * output). ep may be NULL: an empty program over rows of `cols`. */
void af_vep_build(const af_epilogue *ep, float *y, int64_t cols, af_vep *v);
/* Put a step before the others (op af_ep_op, kind af_vep_kind, operand x). */
void af_vep_prepend(af_vep *v, int op, int kind, const float *x);

/* One output row of a channels-last depthwise convolution (one input channel per output
 * channel): y[ow][c] = bias[c] + sum over valid (kh, kw) of x[ih][iw][c] * w[kh * kw_n + kw][c],
 * ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw; then the epilogue ep (rows = output
 * positions from row0, cols = channels) on each block of outputs while it is in cache. */
typedef struct af_dw_row {
    const float *x; /* [h][w][c] */
    int64_t h, w, c;
    const float *wt;   /* [kh * kw][c] */
    const float *bias; /* [c] or NULL */
    int64_t kh, kw, sh, sw, dh, dw, ph, pw;
    int64_t oh, ow; /* this row, and its output columns */
    float *y;       /* [ow][c] */
    const af_vep *ep;
    int64_t row0;
    float *sum; /* NULL, or [c]: every output of the row (after the epilogue) is added here */
    /* NULL: input row ih is at x + ih * w * c. Else xrows[k] is the row kernel row k reads
     * (ih = oh * sh - ph + k * dh), for the rows inside the image, or NULL for a row to skip (a
     * 3-D conv's rows outside the input's depth); x is then unused. */
    const float *const *xrows;
} af_dw_row;

/* One output row of a channels-last grouped convolution whose groups have as many output as
 * input channels, G = Cg = Mg (ResNeXt's and RegNet's 3x3 convs): output position o, channel
 * j = gi * G + m: y[o][j] = sum over kernel positions t and c < G of
 * x[o * xs + taps[t] + gi * G + c] * W[j][c][t]; then the epilogue ep (bias included) on the
 * row's ow x C outputs (output positions from row0). Every position a window reads must exist
 * (the caller passes a zero-bordered image). wt is in blocks of AF_GRP_LANES channels, C
 * rounded up (zero weights), [C / AF_GRP_LANES][ntaps][G][AF_GRP_LANES]: channel
 * i = gi * G + c of block i / AF_GRP_LANES holds at [t][d][i % AF_GRP_LANES]
 * W[gi * G + (c + d) % G][c][t] (a vector's weights contiguous: laid out [ntaps][G][C], those
 * of one vector were C floats apart, and at C = 256 their 72 lines fell into 4 sets of L1),
 * so that with channels
 * along the vector lanes, lane gi * G + c of accumulator d collects input channel c's share of
 * output channel gi * G + (c + d) % G: one FMA per product without moving X's lanes, and the
 * G accumulators rotated back into place once per output (G permutes where moving X's lanes
 * took one per product). */
#define AF_GRP_LANES 16 /* a multiple of every vector width */

typedef struct af_grp_row {
    const float *x;      /* the row's first window's origin */
    const int64_t *taps; /* [ntaps]: each kernel position's offset from a window's origin */
    int64_t ntaps, xs;   /* xs: floats from one output's window to the next one's */
    int64_t c, g;        /* channels (a multiple of g), group width G */
    const float *wt;
    int64_t ow;
    float *y; /* [ow][c] */
    const af_vep *ep;
    int64_t row0;
} af_grp_row;

/* Kernel rows a depthwise conv reads through xrows at most (KH, or KD * KH for a 3-D one). */
#define AF_DW_MAX_ROWS 64

/* One output row of channels-last MaxPool / AveragePool over a 2-D window (no dilation):
 * y[ow][c] = max or mean over the window positions inside x; the mean divides by the count of
 * positions inside the padded image [-ph, h + pe_h) x [-pw, w + pe_w) when include_pad, else by
 * the count inside x (0 for an empty window gives 0). */
typedef struct af_pool_row {
    const float *x; /* [h][w][c] */
    int64_t h, w, c;
    int64_t kh, kw, sh, sw, ph, pw, pe_h, pe_w;
    int max, include_pad;
    int64_t oh, ow;
    float *y; /* [ow][c] */
} af_pool_row;

/* What reduce_run and reduce_acc fold: the combination of f(x) over the elements. Max and Min
 * keep a NaN once they see one (the reference reductions do); EXP sums e^(x - shift). */
typedef enum af_vred {
    AF_VRED_SUM = 0, /* + x */
    AF_VRED_ABS,     /* + |x| */
    AF_VRED_SQ,      /* + x * x */
    AF_VRED_EXP,     /* + e^(x - shift) */
    AF_VRED_PROD,    /* * x */
    AF_VRED_MAX,
    AF_VRED_MIN
} af_vred;
/* Ops of the broadcast row functions (binary_row, compare_row). MAX and MIN propagate NaN (the
 * first NaN operand), as the reference kernel's numpy semantics. */
typedef enum af_vbin_op {
    AF_VBIN_ADD = 1,
    AF_VBIN_SUB,
    AF_VBIN_MUL,
    AF_VBIN_DIV,
    AF_VBIN_MAX,
    AF_VBIN_MIN,
    AF_VBIN_EQ, /* the comparisons: compare_row only */
    AF_VBIN_LT,
    AF_VBIN_GT,
    AF_VBIN_LE,
    AF_VBIN_GE
} af_vbin_op;

typedef struct af_vec_ops {
    const char *name;
    int vw;    /* floats per vector */
    int mr;    /* rows of the largest micro-kernel */
    /* [af_gemm_type][vectors - 1][rows]: nv * vw columns per call */
    af_ukr_fn ukr[AF_GEMM_TYPES][2][AF_GEMM_MR_MAX + 1];
    /* [F32 or F16][rows - 1][vectors]: one or two rows against up to a whole panel
     * (AF_GEMM_NR / vw vectors) in one call, the same contract otherwise (last: of vector nv) */
    af_ukr_fn ukr_row[2][2][AF_GEMM_NR / 4 + 1];
    /* Apply v to the tile of `rows` x `cols` outputs at c (row stride ldc) whose first element
     * is output (row0, col0). */
    void (*ep_tile)(const af_vep *v, float *c, int64_t ldc, int64_t row0, int64_t col0,
                    int64_t rows, int64_t cols);
    /* y[i] = f(x[i]) for an epilogue activation (af_ep_op) or an af_vun_op; y may be x. */
    void (*unary)(int op, float p0, float p1, const float *x, float *y, int64_t n);
    /* One row of LayerNorm: y = (x - mean) / sqrt(var + eps) * scale (+ bias; may be NULL),
     * mean and (biased) variance over x[0..n), n >= 1; y may be x. */
    void (*layernorm)(const float *x, float *y, int64_t n, float eps, const float *scale,
                      const float *bias);
    /* One row of RMSNorm: y = x / sqrt(mean(x^2) + eps) * scale over x[0..n), n >= 1; y may
     * be x. */
    void (*rmsnorm)(const float *x, float *y, int64_t n, float eps, const float *scale);
    void (*dw_row)(const af_dw_row *p);
    void (*grp_row)(const af_grp_row *p);
    /* Winograd F(4x4, 3x3), channels along the vectors. wino_in: the 6x6 input patch at x
     * (rows rs floats apart, positions c apart, c channels) to V = B^T d B, element (i, j) of
     * channel k at v[(i * 6 + j) * vs + k]. wino_out: Y = A^T m A from the 36 products (element
     * (i, j) of channel k at m[(i * 6 + j) * ms + k], c channels) into the 4 x 4 outputs at
     * y[(i * 4 + j) * c + k]. */
    void (*wino_in)(const float *x, int64_t rs, int64_t c, float *v, int64_t vs);
    void (*wino_out)(const float *m, int64_t ms, int64_t c, float *y);
    void (*pool_row)(const af_pool_row *p);
    /* x[0..n) = softmax(x): exp(x - max) / sum, n >= 1 (a row of -inf gives NaN, as the
     * reference Softmax does). */
    void (*softmax_row)(float *x, int64_t n);
    /* Softmax (log 0) or LogSoftmax (log 1, y = (x - max) - ln sum) along the middle axis of
     * x [len][cols] whose rows are `stride` floats apart, for each of the cols columns, into y
     * laid out alike; len >= 1 (a column of -inf gives NaN, as the reference does). */
    void (*softmax_cols)(const float *x, float *y, int64_t len, int64_t stride, int64_t cols,
                         int log);
    /* x[i] = e^(scale (x[i] - max x)) for scale > 0, unnormalised; returns their sum (the
     * attention kernel folds 1 / sum into its P V product). */
    float (*softmax_exp)(float *x, int64_t n, float scale);
    /* y[o] = sum_i w[o * ldw + i] * x[i] for o < rows, i < n (a matrix-vector product over rows
     * of w, ldw apart: they may overlap, as a convolution's windows do). */
    void (*gemv)(const float *w, int64_t ldw, const float *x, int64_t rows, int64_t n, float *y);
    /* y[i] = x[i] in bfloat16, rounded to nearest even (NaN stays NaN; float32 denormals may
     * become zero, as AVX512_BF16's conversion makes them). */
    void (*to_bf16)(const float *x, uint16_t *y, int64_t n);
    /* y[i] = clamp(round_half_even(x[i] / s) + z, 0, 255), a NaN coded 0: the uint8 codes of
     * the int8 form's activation (kernels/ref/fused_quant.c), s > 0, z in [0, 255]. */
    void (*to_u8)(const float *x, uint8_t *y, int64_t n, float s, int z);
    /* y[i] = x[i] rounded to the nearest IEEE half value (beyond 65504: infinity), as float;
     * y may be x. */
    void (*round_f16)(const float *x, float *y, int64_t n);
    /* Cast's conversions: y[i] = x[i] in IEEE half (rounded to nearest even, beyond 65504
     * infinity), and half or bfloat16 x[i] widened to float (exact). */
    void (*to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*from_f16)(const uint16_t *x, float *y, int64_t n);
    void (*from_bf16)(const uint16_t *x, float *y, int64_t n);
    /* Sum of x[0..n) (float, accumulated in vector lanes). */
    float (*row_sum)(const float *x, int64_t n);
    /* out[j] = sum (or max) over r < rows of x[r * cols + j], rows >= 1. */
    void (*reduce_rows)(const float *x, int64_t rows, int64_t cols, int max, float *out);
    /* The af_vred fold of x[0..n), n >= 1, started from its identity (0, 1, -inf, +inf), in
     * vector lanes, the lanes combined last. shift: EXP's (finite). */
    float (*reduce_run)(int kind, const float *x, int64_t n, float shift);
    /* acc[j] = acc[j] (fold) x[j] for j < n; EXP adds e^(x[j] - shift[j]), SQ (x[j] -
     * shift[j])^2 when shift is not NULL (NULL for the others). */
    void (*reduce_acc)(int kind, const float *x, int64_t n, float *acc, const float *shift);
    /* Mean and biased variance of x[0..n), n >= 1: two passes (the squared deviations from
     * the mean, not E[x^2] - mean^2). */
    void (*moments)(const float *x, int64_t n, float *mean, float *var);
    /* y[i] = (x[i] - mean) * k + bias for i < n (y may be x): a normalisation's write. */
    void (*norm_affine)(const float *x, float *y, int64_t n, float mean, float k, float bias);
    /* One line of 1-D pooling along a contiguous axis, for o < m: y[o] = the max (max != 0)
     * or the sum of x[o * s - pb + t * d] over the taps t < k that fall inside x[0..n), times
     * scale[o] when scale is not NULL; an empty window gives -inf (max) or 0. The max is
     * `v > acc ? v : acc` from the first tap inside, as the reference's. */
    void (*pool_line)(const float *x, int64_t n, float *y, int64_t m, int64_t k, int64_t s,
                      int64_t d, int64_t pb, int max, const float *scale);
    /* y[r * cols + j] = x[r * cols + j] * s[r] for r < rows, j < cols (y may be x). */
    void (*scale_rows)(const float *x, const float *s, int64_t rows, int64_t cols, float *y);
    /* y[i] = a[i * sa] (op) b[i * sb] for i < n, sa and sb 0 (a broadcast scalar) or 1, op
     * ADD..MIN of af_vbin_op; y may be a or b. */
    void (*binary_row)(int op, const float *a, int64_t sa, const float *b, int64_t sb, float *y,
                       int64_t n);
    /* y[i] = a[i * sa] (op) b[i * sb] as 0 / 1 bytes, op EQ..GE of af_vbin_op. */
    void (*compare_row)(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                        uint8_t *y, int64_t n);
    /* y[i] = sum over k < taps of w[k] * x[k][i], i < n (Resize's rows; taps 1 to 4). */
    void (*blend_row)(const float *const *x, const float *w, int taps, float *y, int64_t n);
    /* y[c * ldy + r] = x[r * ldx + c] for r < rows, c < cols (x and y do not overlap). */
    void (*transpose)(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows,
                      int64_t cols);
} af_vec_ops;

/* af_vec_avx512bf16 is af_vec_avx512 with its BF16 micro-kernels on the AVX512_BF16 dot product
 * (the others widen bfloat16 to float32 and use FMAs: same results up to rounding) and its U8S8
 * ones on AVX512_VNNI's VPDPBUSD; af_vec_avx512vnni has the VNNI ones only (CPUs with VNNI but
 * no BF16). Elsewhere U8S8 widens the bytes to int32 lanes: the same sums, exactly. */
extern const af_vec_ops af_vec_avx512, af_vec_avx512bf16, af_vec_avx512vnni, af_vec_avx2,
    af_vec_generic;

/* The table of the ISA in force (the generic one under AF_ISA_REFERENCE). */
const af_vec_ops *af_vec(void);

#endif
