/* The AVX-512 vector kernels again, with -mavx512vnni: the same table as vec_avx512.c except
 * that the U8S8 micro-kernels use VPDPBUSD. af_vec() picks this table when the CPU has
 * AVX512_VNNI but not AVX512_BF16 (with both it picks vec_avx512bf16.c, compiled with both
 * flags). Compiled without that flag (an older compiler), it is a copy of the AVX-512 table.
 *
 * Invariant: nothing else in the library is compiled with these flags. */
#define VW 16
#define VEC_MR 12
#define VEC_NAME "avx512"
#define VEC_TABLE af_vec_avx512vnni
#include "kernels/simd/vec_impl.h"
