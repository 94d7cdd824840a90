/* The reference application of an epilogue program (ir/epilogue.h: decoded by
 * af_epilogue_parse) to a fused op's output: scalar, step by step, in float between steps like
 * the unfused chain of ops it replaces.
 *
 * Invariant: applying a program never fails: af_epilogue_parse has checked every step. */
#ifndef AF_KERNELS_REF_EPILOGUE_H
#define AF_KERNELS_REF_EPILOGUE_H

#include "ir/epilogue.h"
#include "kernels/ref/ref.h"

/* Fake quantization (AF_EP_FAKE_QUANT): (clamp(round_half_even(x / s) + z, 0, 255) - z) * s,
 * as a QuantizeLinear to 8 bits and a DequantizeLinear with the same scale and zero point (z in
 * the uint8 domain) compute it: x / s divided in float32, the rounding under the default
 * rounding mode (nearbyintf: ties to even). The integer in between is exact in float, so the
 * one rounding is that of the product. NaN stays NaN. */
static inline float af_fake_quant(float x, float s, float z) {
    float q = nearbyintf(x / s) + z;
    q = q < 0.0f ? 0.0f : q;
    q = q > 255.0f ? 255.0f : q;
    return (q - z) * s;
}

/* y = op(x) for a unary op accepted by af_ep_unary_check. */
float af_ep_unary(af_ep_op op, float x, float p0, float p1);
/* Apply ep to the contiguous run y[0..len) of the output whose first element has multi-index
 * idx[0..ep->rank) (row-major order: the run may wrap across rows). */
void af_epilogue_apply(const af_epilogue *ep, float *y, int64_t len, const int64_t *idx);
/* The same for y[offset..offset+len) of the whole output y (the index is derived from offset). */
void af_epilogue_apply_at(const af_epilogue *ep, float *y, int64_t offset, int64_t len);

#endif
