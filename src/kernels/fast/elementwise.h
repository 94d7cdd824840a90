/* What the fast kernels share from elementwise.c: the vector epilogue run over a whole tensor.
 *
 * Invariant: fast_ep_run writes each of the numel outputs exactly once, in parallel pieces. */
#ifndef AF_KERNELS_FAST_ELEMENTWISE_H
#define AF_KERNELS_FAST_ELEMENTWISE_H

#include "kernels/kernel.h"
#include "kernels/simd/vec.h"

/* y = x through the vector epilogue v, for a tensor of numel floats (rows of v->cols); x may be
 * y (in place) or NULL (y already holds the values). In parallel on ex. */
void fast_ep_run(af_exec *ex, const af_vep *v, const float *x, float *y, int64_t numel);

#endif
