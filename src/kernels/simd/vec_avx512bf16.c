/* The AVX-512 vector kernels again, with -mavx512bf16 -mavx512vnni: the same table as
 * vec_avx512.c except that the BF16 micro-kernels use the AVX512_BF16 dot product (vdpbf16ps)
 * and the float32 to bfloat16 conversion vcvtneps2bf16, and the U8S8 ones VPDPBUSD. af_vec()
 * picks this table when the CPU has AVX512_BF16 and AVX512_VNNI (cpu.h: af_cpu_bf16,
 * af_cpu_vnni). Compiled without those flags (an older compiler), it is a copy of the AVX-512
 * table.
 *
 * Invariant: nothing else in the library is compiled with these flags. */
#define VW 16
#define VEC_MR 12
#define VEC_NAME "avx512"
#define VEC_TABLE af_vec_avx512bf16
#include "kernels/simd/vec_impl.h"
