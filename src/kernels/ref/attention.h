/* FusedAttention's geometry (attention.c has the op's description): what the reference kernel
 * (attention.c) and the fast one (kernels/fast/attention.c) share.
 *
 * Invariant: an attn_run from attn_prepare only describes rows and columns that lie inside its
 * tensors. */
#ifndef AF_KERNELS_REF_ATTENTION_H
#define AF_KERNELS_REF_ATTENTION_H

#include "kernels/ref/ref.h"

/* Where one head row of a tensor lives: element (b, s, h, d) is at
 * (b * sb + s * ss + h * sh + col + d). Order 0 (batch-major rows [B, S, width]): sb = S*width,
 * ss = width, sh = D; order 1 (sequence-major rows [S, B, width]): sb = width, ss = B*width,
 * sh = D; order 2 (head-major [B, H, S, D], e.g. past keys concatenated with new ones):
 * sb = H*S*D, ss = D, sh = S*D, col 0. */
typedef struct attn_view {
    const float *data;
    int64_t width; /* last dim */
    int64_t col;   /* first column of head 0 */
    int order;     /* 0 batch-major rows, 1 sequence-major rows, 2 head-major */
    int64_t sb, ss, sh;
} attn_view;

typedef struct attn_geom {
    int64_t B, H, D, E, Sq, Sk;
    float scale;
    float fill;    /* the score of a key the keep mask drops */
    int layout[4];
    int64_t offsets[3];
    int out_rank;
    bool heads_merged;
} attn_geom;


/* Address of head h's row (b, s) in v. Callers keep b < B, s < S, h < H: attn_geom_of checked
 * that every such row lies inside the tensor. */
static inline const float *attn_row(const attn_view *v, int64_t b, int64_t s, int64_t h) {
    return v->data + b * v->sb + s * v->ss + h * v->sh + v->col;
}

/* One FusedAttention checked against its run-time inputs and output: the geometry, the q, k, v
 * views, the additive mask and the keep mask (NULL when none) with their strides over
 * (b, h, i, j), and the output. */
typedef struct attn_run {
    attn_geom g;
    attn_view views[3];
    const float *mask;
    int64_t mst[4];
    const unsigned char *keep;
    int64_t kst[4];
    float *y;
} attn_run;

/* Check node n and fill r; *done when there was nothing to compute (no rows or no keys: the
 * output is zeroed). */
af_status attn_prepare(const af_node *n, const af_tensor *const *in, af_tensor *out, attn_run *r,
                     bool *done, af_error *err);

#endif
