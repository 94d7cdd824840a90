/* The vector kernels for AVX-512 (16 lanes): 12 x 32 micro-kernels, 24 accumulators.
 * Compiled with this ISA's flags only (CMakeLists.txt); see vec_impl.h.
 *
 * Invariant: nothing else in the library is compiled with these flags. */
#define VW 16
#define VEC_MR 12
#define VEC_NAME "avx512"
#define VEC_TABLE af_vec_avx512
#include "kernels/simd/vec_impl.h"
