/* What the neural-network reference kernels (nn.c, conv.c, pool.c) share: element access through
 * double, input lookup, and the sliding-window geometry of convolution and pooling.
 *
 * Invariant: every helper here either succeeds or fails with a message naming the node; none
 * reads outside a tensor's data when the tensor's dims and nbytes agree with each other. */
#ifndef AF_KERNELS_NN_COMMON_H
#define AF_KERNELS_NN_COMMON_H

#include "kernels/ref/ref.h"

/* Spatial dims handled by convolution and pooling. Lower-rank windows are padded in front with
 * size-1 dims (a 1-D conv is a 3-D conv of depth 1 and height 1), so one loop nest serves all. */
#define NN_MAXSP 3

/* Input slot i, or NULL when the node has fewer inputs or the optional input is omitted. */
static inline const af_tensor *nn_in(const af_node *n, const af_tensor *const *in, int i) {
    return i < n->nin ? in[i] : NULL;
}

/* Output slot i when the node produces it (present in the graph), else NULL. */
static inline af_tensor *nn_out(const af_node *n, af_tensor *out, int i) {
    return (i < n->nout && n->out[i] != NULL) ? &out[i] : NULL;
}

/* Float element types that the double-precision reference loops accept. */
bool nn_is_float(af_dtype t);
/* Integer element types (not bool). */
bool nn_is_int(af_dtype t);

/* fmax with one answer for signed zeros (b when a == b) and NaN (the other operand): C leaves
 * fmax(+0, -0) open, and gcc, which may swap fmax's operands, answers differently in different
 * code, so kernels that must agree bit for bit (RoiAlign's reference and fast kernels) use this. */
static inline double nn_fmax(double a, double b) {
    return a > b || b != b ? a : b;
}

/* Clamp v to [lo, hi]; NaN becomes lo so that integer conversion stays defined. */
static inline double nn_clamp(double v, double lo, double hi) {
    if (!(v >= lo))
        return lo;
    return v > hi ? hi : v;
}

/* Store v as element i of t. Integer types round half to even and saturate, which is what ONNX's
 * quantizing ops ask for and keeps every conversion defined behaviour. */
static inline void nn_put(af_tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)t->data)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)t->data)[i] = v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)t->data)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)t->data)[i] = af_float_to_bf16((float)v); break;
    case AF_DTYPE_INT8: ((int8_t *)t->data)[i] = (int8_t)nn_clamp(nearbyint(v), -128, 127); break;
    case AF_DTYPE_UINT8: ((uint8_t *)t->data)[i] = (uint8_t)nn_clamp(nearbyint(v), 0, 255); break;
    case AF_DTYPE_INT16:
        ((int16_t *)t->data)[i] = (int16_t)nn_clamp(nearbyint(v), -32768, 32767);
        break;
    case AF_DTYPE_UINT16: ((uint16_t *)t->data)[i] = (uint16_t)nn_clamp(nearbyint(v), 0, 65535); break;
    case AF_DTYPE_INT32:
        ((int32_t *)t->data)[i] = (int32_t)nn_clamp(nearbyint(v), -2147483648.0, 2147483647.0);
        break;
    case AF_DTYPE_UINT32:
        ((uint32_t *)t->data)[i] = (uint32_t)nn_clamp(nearbyint(v), 0, 4294967295.0);
        break;
    case AF_DTYPE_INT64:
        /* 2^63 is not representable; the largest double below it is the upper bound. */
        ((int64_t *)t->data)[i] =
            (int64_t)nn_clamp(nearbyint(v), -9223372036854775808.0, 9223372036854774784.0);
        break;
    case AF_DTYPE_UINT64:
        ((uint64_t *)t->data)[i] = (uint64_t)nn_clamp(nearbyint(v), 0, 18446744073709549568.0);
        break;
    case AF_DTYPE_BOOL: ((uint8_t *)t->data)[i] = v != 0.0; break;
    default: break;
    }
}

/* Element i of an integer tensor as int64 (wrapping uint64). */
static inline int64_t nn_geti(const af_tensor *t, int64_t i) {
    switch (t->dtype) {
    case AF_DTYPE_INT64: return ((const int64_t *)t->data)[i];
    case AF_DTYPE_UINT64: return (int64_t)((const uint64_t *)t->data)[i];
    default: return (int64_t)af_tensor_get_double(t, i); /* every narrower integer is exact in double */
    }
}

/* Store v into an integer tensor, keeping the low bits (ONNX integer overflow wraps). */
static inline void nn_puti(af_tensor *t, int64_t i, uint64_t v) {
    switch (t->dtype) {
    case AF_DTYPE_INT8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case AF_DTYPE_UINT8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case AF_DTYPE_INT16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    case AF_DTYPE_UINT16: ((uint16_t *)t->data)[i] = (uint16_t)v; break;
    case AF_DTYPE_INT32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case AF_DTYPE_UINT32: ((uint32_t *)t->data)[i] = (uint32_t)v; break;
    case AF_DTYPE_INT64: ((int64_t *)t->data)[i] = (int64_t)v; break;
    case AF_DTYPE_UINT64: ((uint64_t *)t->data)[i] = v; break;
    default: break;
    }
}

/* Product of dims [from, to) of t; -1 when one is unknown or it overflows. */
int64_t nn_prod(const af_tensor *t, int from, int to);

/* A malloc'ed copy of t's elements as doubles (caller frees); AF_ERR_NOMEM on failure.
 * The hot loops of conv and matmul read these instead of switching on the dtype per element. */
af_status nn_load(const af_node *n, const af_tensor *t, double **out, af_error *err);

/* Check that an output computed by a shape function still matches what the kernel derives;
 * a mismatch is our bug (the executor runs the shape function before the kernel). */
af_status nn_check_out(const af_node *n, const af_tensor *y, int rank, const int64_t *dims,
                       af_error *err);

/* ---- sliding windows (conv.c, pool.c) -------------------------------------------------------- */

typedef enum nn_autopad {
    NN_PAD_NOTSET,
    NN_PAD_SAME_UPPER,
    NN_PAD_SAME_LOWER,
    NN_PAD_VALID
} nn_autopad;

/* The geometry of a window sliding over the spatial dims of an [N, C, spatial...] tensor.
 * Arrays are indexed by padded spatial dim (NN_MAXSP of them; the first NN_MAXSP - nsp are
 * size-1 dims with unit kernel, stride and dilation and no padding). out[] is -1 when unknown. */
typedef struct nn_window {
    int nsp; /* real spatial dims, 1..NN_MAXSP */
    int64_t in[NN_MAXSP], out[NN_MAXSP];
    int64_t k[NN_MAXSP], s[NN_MAXSP], d[NN_MAXSP];
    int64_t pb[NN_MAXSP], pe[NN_MAXSP]; /* padding at the beginning and at the end */
} nn_window;

/* Parse the auto_pad attribute. */
af_status nn_autopad_parse(const af_node *n, nn_autopad *pad, af_error *err);

/* Fill w for input x (rank 2 + nsp, spatial dims possibly -1) and kernel k[0..nsp) from the
 * node's strides, dilations, pads and auto_pad attributes. ceil_mode rounds the output size up
 * (pooling). An output size below 1 is an error when the input size is known. */
af_status nn_window_init(const af_node *n, const af_tensor *x, const int64_t *k, int nsp,
                         bool ceil_mode, nn_window *w, af_error *err);

/* ConvTranspose's window (conv.c): X [N, C, in...] and W [C, M/group, k...] as types; w->in is
 * X's spatial size and w->out Y's, pads as ONNX derives them from pads, output_shape, auto_pad
 * and output_padding. */
af_status nn_conv_transpose_window(const af_node *n, const af_tensor *x, const af_tensor *wt,
                                   nn_window *w, af_error *err);

/* Output positions o in [*lo, *hi) of padded dim i whose input index o*s - pb + kk*d falls
 * inside [0, in): the loop bounds that keep the inner conv and pool loops free of tests. */
void nn_window_range(const nn_window *w, int i, int64_t kk, int64_t *lo, int64_t *hi);

/* Softmax, LogSoftmax, Hardmax: X as outer x len x inner (before opset 13 X flattened to 2-D at
 * axis, from 13 on along the one axis). */
af_status nn_softmax_geom(const af_node *n, const af_tensor *x, int64_t *outer, int64_t *len,
                          int64_t *inner, af_error *err);
/* LayerNormalization's checked axis: it normalises over dims [axis, rank). */
af_status nn_layernorm_axis(const af_node *n, const af_tensor *const *in, int *axis,
                            af_error *err);

/* A NonMaxSuppression candidate, and the selection order shared by the reference and the fast
 * kernel (qsort comparator): score descending, then box index ascending (a stable, total order). */
typedef struct nms_cand {
    double score;
    int64_t box;
} nms_cand;
int nms_cmp(const void *a, const void *b);

/* RoiAlign's coordinate_transformation_mode: the attribute, default half_pixel, from opset 16
 * on; before it RoiAlign had no half-pixel shift, which opset 16 names output_half_pixel (what
 * torchvision's aligned=False computes: its Mask R-CNN exports at opsets 11 to 13). */
const char *roi_align_mode(const af_node *n);

#endif
