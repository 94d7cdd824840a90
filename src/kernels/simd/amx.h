/* AMX (amx.c): the bfloat16 tile block the GEMM (kernels/fast/gemm.c) runs its BF16 products on
 * when the CPU and the operating system allow.
 *
 * Invariant: af_amx_block runs only after af_amx_available() said yes on this process. */
#ifndef AF_KERNELS_SIMD_AMX_H
#define AF_KERNELS_SIMD_AMX_H

#include <stdint.h>

/* AMX-BF16 is present and the tile state was granted to this process (checked once). */
int af_amx_available(void);
/* Configure the tiles on the calling thread / give them back (around a run of blocks). */
void af_amx_begin(void);
void af_amx_end(void);
/* One block of C = A x B in bfloat16: `rows` (1..32; 16 or 32 are computed, and stored) rows
 * from a (row stride rs, taps as af_gemm) times one packed panel b of width w (16 or 32),
 * written whole (16 or 32 rows x w columns) at c with row stride ldc. */
typedef struct af_amx_args {
    const uint16_t *a;
    int64_t rs;
    const int64_t *tap_off;
    int64_t ntaps, tap_len;
    const uint32_t *b;
    int64_t w, rows;
    float *c;
    int64_t ldc;
} af_amx_args;
void af_amx_block(const af_amx_args *p);

#endif
