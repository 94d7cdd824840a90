/* The bfloat16 GEMM block on AMX (Intel's Advanced Matrix Extensions: eight tile registers of
 * 16 rows x 64 bytes and the TMUL unit), for CPUs with AMX-BF16 whose kernel grants the tile
 * state to the process. One TDPBF16PS multiplies a 16 x 32 bfloat16 tile of A by a 32 x 16
 * tile of B (stored as 16 rows of bfloat16 pairs: exactly a packed BF16 panel, see fast/gemm.h) into
 * 16 x 16 float32 sums: 8192 multiply-adds per instruction, about 14 times the float32 FMA rate
 * of AVX-512 on the same core.
 *
 * Tiles: 0-3 accumulate C (up to 32 rows x 32 columns), 4-5 hold A (rows 0-15, 16-31), 6-7
 * hold B (columns 0-15, 16-31). Every tile is configured 16 x 64 bytes once per thread and
 * call (af_amx_begin); a block with fewer rows still loads 16 rows of A and drops the extra
 * results, so A must be readable that far (fast/gemm.h says how far).
 *
 * Compiled with -mamx-tile -mamx-bf16 only (CMakeLists.txt); nothing here runs unless
 * af_amx_available() said yes. */
#include "kernels/simd/amx.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; XCR0 bits 17-18 enabled by the OS; then the
 * kernel's permission to use the tile data state (Linux 5.16 and later). */
static void amx_init(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int af_amx_available(void) {
    pthread_once(&amx_once, amx_init);
    return amx_ok;
}

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Eight tiles of 16 rows x 64 bytes. A constant in memory: gcc 12 does not see that
 * ldtilecfg reads its operand and drops the stores that build one on the stack. */
static const tile_config amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void af_amx_begin(void) {
    _tile_loadconfig(&amx_config);
}

void af_amx_end(void) {
    _tile_release();
}

/* NR row tiles x NC column tiles; the tile numbers must be constants, hence one body per shape. */
static inline __attribute__((always_inline)) void amx_body(const int NR, const int NC,
                                                           const af_amx_args *p) {
    _tile_zero(0);
    if (NC == 2) _tile_zero(1);
    if (NR == 2) _tile_zero(2);
    if (NR == 2 && NC == 2) _tile_zero(3);
    const int64_t astride = p->rs * 2, bstride = p->w * 4;
    for (int64_t t = 0; t < p->ntaps; t++) {
        const uint16_t *a = p->a + p->tap_off[t];
        const char *b = (const char *)p->b + t * (p->tap_len / 2) * bstride;
        for (int64_t k = 0; k < p->tap_len; k += 32, a += 32, b += 16 * bstride) {
            _tile_loadd(4, a, astride);
            _tile_loadd(6, b, bstride);
            if (NC == 2) _tile_loadd(7, b + 64, bstride);
            _tile_dpbf16ps(0, 4, 6);
            if (NC == 2) _tile_dpbf16ps(1, 4, 7);
            if (NR == 2) {
                _tile_loadd(5, a + 16 * p->rs, astride);
                _tile_dpbf16ps(2, 5, 6);
                if (NC == 2) _tile_dpbf16ps(3, 5, 7);
            }
        }
    }
    const int64_t cs = p->ldc * 4;
    _tile_stored(0, p->c, cs);
    if (NC == 2) _tile_stored(1, p->c + 16, cs);
    if (NR == 2) _tile_stored(2, p->c + 16 * p->ldc, cs);
    if (NR == 2 && NC == 2) _tile_stored(3, p->c + 16 * p->ldc + 16, cs);
}

void af_amx_block(const af_amx_args *p) {
    if (p->rows > 16) {
        if (p->w > 16) amx_body(2, 2, p);
        else amx_body(2, 1, p);
    } else {
        if (p->w > 16) amx_body(1, 2, p);
        else amx_body(1, 1, p);
    }
}
#else
int af_amx_available(void) {
    return 0;
}
void af_amx_begin(void) {}
void af_amx_end(void) {}
void af_amx_block(const af_amx_args *p) {
    (void)p;
}
#endif
