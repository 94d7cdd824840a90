/* The vector kernels for AVX2 + FMA (8 lanes): 6 x 16 micro-kernels, 12 accumulators.
 * Compiled with this ISA's flags only (CMakeLists.txt); see vec_impl.h.
 *
 * Invariant: nothing else in the library is compiled with these flags. */
#define VW 8
#define VEC_MR 6
#define VEC_NAME "avx2"
#define VEC_TABLE af_vec_avx2
#include "kernels/simd/vec_impl.h"
