/* Helpers private to the tensor-manipulation, indexing, reduction and resize reference kernels
 * (the tn_ group: tensor.c, gather.c, reduce.c, resize.c).
 *
 * Invariant: nothing here trusts a tensor's contents. Readers of index-like inputs check dtype
 * and length; element accessors never convert a double to an integer outside its range (that is
 * undefined behaviour in C); strided copies only touch offsets the caller has bounds-checked. */
#ifndef AF_TENSOR_UTIL_H
#define AF_TENSOR_UTIL_H

#include "kernels/ref/ref.h"

/* Maximum rank of the internal views (Tile and DepthToSpace split each axis in two). */
#define TN_MAX_VIEW (2 * AF_MAX_RANK)

/* Input i of n, or NULL when omitted (past n->nin, a NULL slot, or an unnamed value). */
const af_tensor *tn_in(const af_node *n, const af_tensor *const *in, int i);
/* Whether the dtype is floating point (float, double, float16, bfloat16). */
bool tn_is_float(af_dtype dt);
/* Whether the dtype holds numbers we can read with af_tensor_get_double/tn_geti (not string or
 * complex). */
bool tn_is_numeric(af_dtype dt);

/* AF_ERR_INVALID_MODEL naming the missing input `what`. */
af_status tn_missing(const af_node *n, const char *what, af_error *err);
/* Gives out dtype dt and an unknown rank (compile time, when the rank cannot be known yet). */
void tn_unknown_rank(af_tensor *out, af_dtype dt);
/* Product of dims[lo..hi); -1 when one is unknown or it overflows. */
int64_t tn_prod(const int64_t *dims, int lo, int hi);
/* Whether the dtype is one ONNX allows for indices (int32 or int64). */
bool tn_is_index_type(af_dtype dt);
/* Index k of ix normalised against dim (negative counts from the end) into *out; false when
 * it is out of range. */
bool tn_index(const af_tensor *ix, int64_t k, int64_t dim, int64_t *out);
/* AF_ERR_RUNTIME naming index k of ix, which is out of range for an axis of size dim. */
af_status tn_bad_index(const af_node *n, const af_tensor *ix, int64_t k, int64_t dim,
                       af_error *err);

/* Element i as int64 (floats truncate toward zero, saturating); as double: af_tensor_get_double. */
int64_t tn_geti(const af_tensor *t, int64_t i);
/* Store into element i, converting to t's dtype (integers round to nearest and saturate; bool
 * stores v != 0). */
void tn_setd(af_tensor *t, int64_t i, double v);
void tn_seti(af_tensor *t, int64_t i, int64_t v);
/* Total order on the values of elements i of a and j of b (same dtype); NaN sorts above all. */
int tn_cmp(const af_tensor *a, int64_t i, const af_tensor *b, int64_t j);

/* Integer values of an int32/int64 tensor of rank 0 or 1 into v[0..*cnt); false when the dtype
 * is wrong, data is missing or it holds more than max values. */
bool tn_ints(const af_tensor *t, int64_t *v, int max, int *cnt);

/* Element size of t's dtype; AF_ERR_UNSUPPORTED for strings and undefined types. */
af_status tn_esize(const af_node *n, const af_tensor *t, size_t *es, af_error *err);

/* Resize's sampling, per axis (resize.c): output coordinate o of axis a reads up to 4 input
 * indices (clamped into the axis) with weights, or is outside the input (tf_crop_and_resize:
 * the element is the extrapolation value). The reference kernel samples with these; the fast
 * kernel reads the same tables. */
typedef struct tn_rz_taps {
    int n;
    bool outside;
    int64_t idx[4];
    double w[4];
} tn_rz_taps;

typedef struct tn_rz_plan {
    bool nearest;
    double extrapolation;
    tn_rz_taps *taps;               /* one block: the taps of every axis, from af_calloc */
    tn_rz_taps *axis[AF_MAX_RANK]; /* axis a's out->dims[a] taps */
} tn_rz_plan;

/* The taps of Resize / Upsample node n from x (= in[0]) to out (ready, of the shape the shape
 * function gives). On success plan->taps must be freed (af_free); it is NULL (no taps) when out
 * is empty. */
af_status tn_resize_plan(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                         tn_rz_plan *plan, af_error *err);

/* Pad (tensor.c): the mode, pads (begin..., end...) and the fill element of node n from x =
 * in[0] to out (the shape function's). The fast kernel reads the same plan. */
typedef enum tn_pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP } tn_pad_mode;
typedef struct tn_pad_plan_t {
    tn_pad_mode mode;
    int64_t pads[2 * AF_MAX_RANK];
    size_t es;               /* x's element size */
    unsigned char fill[16];  /* constant mode's value, one element */
} tn_pad_plan_t;
af_status tn_pad_plan(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                      tn_pad_plan_t *p, af_error *err);
/* Source coordinate of coordinate c (output coordinate - begin pad) on an axis of size d;
 * -1 for constant padding. */
int64_t tn_pad_src(int64_t c, int64_t d, tn_pad_mode mode);

/* Slice (tensor.c): out (the shape function's dims) is x = in[0] read from element *off with
 * strides vs[0..rank) (0 along axes of one element); the offsets stay inside x. */
af_status tn_slice_view(const af_node *n, const af_tensor *const *in, const af_tensor *out,
                        int64_t *off, int64_t *vs, af_error *err);
/* Split (tensor.c): the axis and the n->nout sizes along it of x = in[0]. */
af_status tn_split_sizes(const af_node *n, const af_tensor *const *in, int *axis,
                         int64_t *sizes, af_error *err);

/* AF_ERR_INVALID_MODEL unless out[0..nout) all have data: a kernel that does not allocate its
 * outputs relies on the shape function having fixed every dim from the inputs. */
af_status tn_ready(const af_node *n, const af_tensor *out, int nout, af_error *err);
#define TN_READY(n, out, nout, err)                                                         \
    do {                                                                                    \
        af_status ready_ = tn_ready(n, out, nout, err);                                     \
        if (ready_)                                                                         \
            return ready_;                                                                  \
    } while (0)

/* Give out a type and data when the shape function could not (data-dependent shapes): uses the
 * already-allocated buffer when its shape matches, otherwise allocates. */
af_status tn_out_alloc(const af_node *n, af_tensor *out, af_dtype dt, int rank,
                       const int64_t *dims, af_error *err);

/* dst[k] = src[off + sum_a idx_a * strides[a]] for every index of `dims` in row-major order,
 * copying elements of es bytes. Offsets and strides are in elements; the caller guarantees that
 * every reached offset lies inside src. rank may be up to TN_MAX_VIEW. */
void tn_copy_strided(void *dst, const void *src, int64_t off, int rank, const int64_t *dims,
                     const int64_t *strides, size_t es);

/* Advance a row-major multi-index; returns false after the last one. */
bool tn_next(int64_t *idx, const int64_t *dims, int rank);

/* Axes from attribute `name` (or from input tensor `t` when from_input), normalised against
 * rank and checked for duplicates. *given is false when there are none (attribute absent or
 * input omitted). Returns AF_ERR_INVALID_MODEL on bad axes; *known false when the input's value
 * is not known yet (compile time). */
af_status tn_axes(const af_node *n, const af_tensor *t, bool from_input, const char *name,
                  int rank, int *axes, int *naxes, bool *given, bool *known, af_error *err);

/* Stable merge sort of v[0..n) by cmp(ctx, a, b); tmp has room for n values. */
void tn_sort(int64_t *v, int64_t n, int64_t *tmp, int (*cmp)(void *ctx, int64_t a, int64_t b),
             void *ctx);

/* Transpose's perm (default: the dims reversed), checked to be a permutation of rank axes. */
af_status tn_transpose_perm(const af_node *n, int rank, int *perm, af_error *err);
/* Which axes of x a Reduce* node reduces (red[i]), from its attribute or input as its opset
 * says. *noop: noop_with_empty_axes with no axes (output = input). *known false when the axes
 * input's value is not known yet. */
af_status tn_reduce_axes(const af_node *n, const af_tensor *const *in, const af_tensor *x,
                         bool *red, bool *noop, bool *known, af_error *err);

/* The reduction of ScatterElements / ScatterND ("none", "add", "mul", "max", "min"): an
 * unknown one is AF_ERR_UNSUPPORTED naming it (gather.c). */
typedef enum scat_red { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN } scat_red;
af_status tn_scatter_reduction(const af_node *n, scat_red *r, af_error *err);

#endif
