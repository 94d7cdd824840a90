/* The vector kernels for portable vector C (4 lanes; SSE2 on x86-64): 6 x 8 micro-kernels.
 * Compiled with this ISA's flags only (CMakeLists.txt); see vec_impl.h.
 *
 * Invariant: this table runs on any x86-64 CPU. */
#define VW 4
#define VEC_MR 6
#define VEC_NAME "generic"
#define VEC_TABLE af_vec_generic
#include "kernels/simd/vec_impl.h"
