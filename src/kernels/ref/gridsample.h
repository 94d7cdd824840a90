/* GridSample's geometry, shared by the reference kernel (gridsample.c) and the fast one
 * (kernels/fast/gridsample.c): the attributes, and the taps of one sampling point (which pixels of
 * the input it reads, with which weights). Sampling is separable: a point's taps are the product
 * of each spatial axis's own taps (1 for nearest, 2 for linear, 4 for cubic), so one routine
 * serves 1-D, 2-D and 3-D inputs and every mode.
 *
 * Invariant: every tap offset gs_taps gives lies inside the input volume; a tap outside it (zeros
 * padding, a NaN or huge coordinate) is left out, never clamped into a wrong pixel. */
#ifndef AF_KERNELS_GRIDSAMPLE_H
#define AF_KERNELS_GRIDSAMPLE_H

#include "kernels/ref/ref.h"

/* Spatial axes (X is [N, C, D1..Dr], r <= GS_MAX_DIMS) and taps of one point (4^r for cubic). */
enum { GS_MAX_DIMS = 3, GS_MAX_TAPS = 64 };

typedef enum gs_mode { GS_LINEAR, GS_NEAREST, GS_CUBIC } gs_mode;
typedef enum gs_pad { GS_ZEROS, GS_BORDER, GS_REFLECTION } gs_pad;

typedef struct gs_opts {
    gs_mode mode;
    gs_pad pad;
    bool align;
    int r; /* spatial axes; 0 while X's rank is unknown */
} gs_opts;

/* Reads n's attributes (the mode names of n's opset) and checks the input types and ranks. */
af_status gs_prepare(const af_node *n, const af_tensor *const *in, gs_opts *o, af_error *err);

/* The taps of the point whose normalised coordinates are g[0..r) (innermost axis first, as the
 * grid lists them) in a volume of dims size[0..r) (outermost first): returns their number and
 * writes each one's element offset in the volume and weight. */
int gs_taps(const gs_opts *o, const int64_t *size, const double *g, int64_t *off, double *w);

#endif
