/* The one GEMM core behind FusedMatMul, FusedConv and attention: C = A x B with the epilogue
 * program applied to each output tile right after it is computed.
 *
 * B (the weights, K x N) is packed once into panels of AF_GEMM_NR = 32 columns (the last one 16
 * wide when at most 16 columns are left), each panel K rows of its width, zero padded past N:
 * panel p starts at float 32 * p * K. Constant weights are packed at compile time (the lower
 * pass) and stored packed in the .afm; the format is the same for every ISA.
 *
 * A is never packed: the micro-kernels broadcast its elements straight from the tensor, so A can
 * be a row-major matrix, or the NHWC input of a convolution read through tap offsets (implicit
 * GEMM, no im2col).
 *
 * Low precision (af_gemm_type, vec.h): B packed in half precision or in bfloat16 pairs, A in
 * float32 or bfloat16 as the type says (the caller converts A once per call); C and the
 * epilogue are float32 whatever the type, but for an epilogue whose output is codes
 * (af_vep.codes: uint8, written through the epilogue's coordinates; U8S8 only, and c unused).
 *
 * Work is split in M tiles (at most the ISA's MR rows, balanced so every tile is nearly full)
 * times blocks of B panels sized to an eighth of the L2 cache, so a block stays in L2 while
 * every M tile passes over it; threads take contiguous ranges of (block, tile) items.
 *
 * Invariant: packed panels have the same layout on every ISA, so a packed .afm runs anywhere. */
#ifndef AF_KERNELS_GEMM_H
#define AF_KERNELS_GEMM_H

#include "kernels/simd/vec.h"
#include "kernels/kernel.h"

/* Floats of a packed K x N matrix. */
size_t af_gemm_packed_floats(int64_t k, int64_t n);
/* Pack B[kk][j] = b[kk * sk + j * sn] (kk < k, j < n) into dst (af_gemm_packed_floats(k, n)
 * floats). sk = n, sn = 1 for a row-major K x N matrix; sk = 1, sn = k for its transpose. */
void af_gemm_pack(const float *b, int64_t k, int64_t n, int64_t sk, int64_t sn, float *dst);
/* BF16 operands come in blocks of 32 along K (an AMX tile's depth): packed B has K rounded up
 * with zero rows, and A (converted by the caller) has every tap padded with zeros to a multiple
 * of 32 elements. af_gemm_bf16_k(k) is that rounded K. */
#define AF_GEMM_BF16_KB 32
int64_t af_gemm_bf16_k(int64_t k);
/* Bytes of a packed K x N matrix of type t. */
size_t af_gemm_packed_bytes(af_gemm_type t, int64_t k, int64_t n);
/* af_gemm_pack in type t: F32 as above; F16 the same layout in halves; BF16 one 32-bit word per
 * panel column for each pair of K rows (row 2i in its low half, 2i + 1 in its high half, 0 past
 * K up to af_gemm_bf16_k(k)), rounded to nearest even. dst holds af_gemm_packed_bytes(t, k, n). */
void af_gemm_pack_type(af_gemm_type t, const float *b, int64_t k, int64_t n, int64_t sk,
                       int64_t sn, void *dst);

/* U8S8 (the int8 form, vec.h): B int8 in quads along K, K rounded up to a multiple of
 * AF_GEMM_U8S8_KB with zero rows: each panel row is one 32-bit word per column holding K rows
 * 4i .. 4i + 3 in its bytes, low to high (VPDPBUSD's layout); after the last panel, the int32
 * column sums of B, one per panel column (0 past N). A holds uint8 codes, every tap a multiple of
 * 4 bytes long. af_gemm_u8s8_k(k) is the rounded K. */
#define AF_GEMM_U8S8_KB 4
int64_t af_gemm_u8s8_k(int64_t k);
/* Pack the int8 B[kk][j] = b[kk * sk + j * sn] into dst (af_gemm_packed_bytes(U8S8, k, n)). */
void af_gemm_pack_u8s8(const int8_t *b, int64_t k, int64_t n, int64_t sk, int64_t sn, void *dst);
/* Are the count int8 weights at w all within [-64, 64] (af_gemm.w7)? */
bool af_gemm_int8_7bit(const int8_t *w, int64_t count);
/* The column sums of a U8S8 B packed for k rows (rounded or not) and n columns. */
const int32_t *af_gemm_u8s8_colsum(const void *packed, int64_t k, int64_t n);

/* One C = A x B. Output row m = o * mi + i (o < mo, i < mi) reads A at a + o * rs_o + i * rs_i,
 * its element k = t * tap_len + j at + tap_off[t] + j (K = ntaps * tap_len); it is written at
 * c + m * ldc, columns [0, n). A plain M x K matrix: mo = 1, mi = M, rs_i = lda, one tap
 * {0} of length K. ep (may be NULL) sees output (ep_row0 + m, ep_col0 + column). Offsets and
 * strides count elements of A's type; BF16 needs tap_len a multiple of AF_GEMM_BF16_KB, and
 * A readable 32 rows (of rs_i) past each tile's first row (AMX loads whole 16-row tiles and
 * drops the rows it does not need). */
typedef struct af_gemm {
    const void *a;
    int64_t mo, mi, rs_o, rs_i;
    const int64_t *tap_off;
    int64_t ntaps, tap_len;
    const void *b; /* packed, in type's format */
    int64_t n;
    float *c;
    int64_t ldc;
    const af_vep *ep;
    int64_t ep_row0, ep_col0;
    af_gemm_type type; /* F32 unless set */
    /* NULL, or (F32, one tap) B's row k multiplied by b_rowscale[k]: each thread scales each
     * block of B it runs, as it starts it, into its own part of b_scratch (slots x
     * af_gemm_rowscale_floats floats, 64-byte aligned), where the block stays in L2. */
    const float *b_rowscale;
    float *b_scratch;
    /* A range of B's rows (F32 and F16 only; zeros: all of them): the products use rows
     * [k0, k0 + ntaps * tap_len) of B packed with kp rows per panel (kp 0: ntaps * tap_len), so
     * a convolution can multiply one kernel position's rows of its packed weights. */
    int64_t k0, kp;
    /* Output rows between outer indices o and o + 1 (0: mi): output row m of (o, i) is
     * o * cs_o + i, for C (c + m * ldc) and the epilogue (ep_row0 + m) alike, so a GEMM can
     * cover a rectangle of a convolution's output positions narrower than its rows. */
    int64_t cs_o;
    /* U8S8: A's zero point and the scale of each of the n columns (C = (A x B - qzero *
     * colsum) * qscale, then ep); A offsets and strides count bytes. */
    const float *qscale;
    int32_t qzero;
    /* U8S8: B's weights are all within [-64, 64] (see af_ukr_args.w7); 0 when unknown. */
    int32_t w7;
} af_gemm;

/* Floats of one thread's part of b_scratch for a K x N B. */
size_t af_gemm_rowscale_floats(int64_t k, int64_t n);

/* Run g on x's threads (x may be NULL: the calling thread). */
void af_gemm_run(af_exec *x, const af_gemm *g);
/* The same for one tile of rows (mo = 1, mi at most the ISA's micro-kernel rows, af_vec()->mr)
 * on the calling thread, without the blocking and threading set-up: for callers that run many
 * small products of their own (Winograd's 36 per tile block). */
void af_gemm_rows(const af_gemm *g);

#endif
