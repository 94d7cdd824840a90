/* The reference application of an epilogue program (ir/epilogue.h: decoded by
 * af_epilogue_parse) to a fused op's output: scalar, step by step, in float between steps like
 * the unfused chain of ops it replaces.
 *
 * Invariant: applying a program never fails: af_epilogue_parse has checked every step. */
#ifndef AF_KERNELS_REF_EPILOGUE_H
#define AF_KERNELS_REF_EPILOGUE_H

#include "ir/epilogue.h"
#include "kernels/ref/ref.h"

/* y = op(x) for a unary op accepted by af_ep_unary_check. */
float af_ep_unary(af_ep_op op, float x, float p0, float p1);
/* Apply ep to the contiguous run y[0..len) of the output whose first element has multi-index
 * idx[0..ep->rank) (row-major order: the run may wrap across rows). */
void af_epilogue_apply(const af_epilogue *ep, float *y, int64_t len, const int64_t *idx);
/* The same for y[offset..offset+len) of the whole output y (the index is derived from offset). */
void af_epilogue_apply_at(const af_epilogue *ep, float *y, int64_t offset, int64_t len);

#endif
