/* Reference AffineGrid (ONNX opset 20; torch's F.affine_grid): the sampling grid GridSample reads
 * in a spatial transformer. theta [N, 2, 3] maps each output pixel's normalised position
 * (x, y, 1) to where it samples, giving grid [N, H, W, 2]; theta [N, 3, 4] does the same for
 * volumes, [N, D, H, W, 3]. size is the int64 [N, C, H, W] or [N, C, D, H, W] of the image.
 * Positions along an axis of length L are -1 + (2 i + 1) / L (pixel centres), or with
 * align_corners -1 + 2 i / (L - 1) (the corner pixels at +-1; 0 when L = 1, as in torch).
 *
 * Invariant: size is read only once known (a constant, or at run time), checked to have 4 or 5
 * non-negative entries agreeing with theta's N and rows before it sizes the output. */
#include "kernels/ref/nn_common.h"

/* The output dims [N, spatial..., r] from theta and size; -1 where not known yet. */
static af_status ag_dims(const af_node *n, const af_tensor *const *in, int *rank, int64_t *dims,
                         af_error *err) {
    const af_tensor *theta = nn_in(n, in, 0), *size = nn_in(n, in, 1);
    if (!theta || !size)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing theta or size");
    if (!nn_is_float(theta->dtype) || size->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "theta must be floating point and size int64");
    int64_t len = size->rank == 1 ? size->dims[0] : -1;
    int r = len == 4                                  ? 2
            : len == 5                                ? 3
            : theta->rank == 3 && theta->dims[1] >= 2 ? (int)theta->dims[1]
                                                      : 0;
    if (r != 2 && r != 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "size must hold 4 or 5 values");
    if (theta->rank >= 0 && (theta->rank != 3 || (theta->dims[1] >= 0 && theta->dims[1] != r) ||
                             (theta->dims[2] >= 0 && theta->dims[2] != r + 1)))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "theta must be [N, %d, %d] for size of %d values", r, r + 1, r + 2);
    *rank = r + 2;
    for (int i = 0; i < *rank; i++)
        dims[i] = -1;
    dims[r + 1] = r;
    dims[0] = theta->rank == 3 ? theta->dims[0] : -1;
    if (!size->data)
        return AF_OK;
    if (af_tensor_numel(size) != r + 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "size must hold %d values", r + 2);
    for (int i = 0; i < r + 2; i++) {
        int64_t v = nn_geti(size, i);
        if (v < 0 || (i == 0 && dims[0] >= 0 && v != dims[0]))
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "size[%d] = %lld does not fit theta",
                                i, (long long)v);
        if (i == 0 || i >= 2)
            dims[i == 0 ? 0 : i - 1] = v;
    }
    return AF_OK;
}

af_status shape_affine_grid(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    int rank;
    int64_t dims[5];
    af_status st = ag_dims(n, in, &rank, dims, err);
    if (!st)
        af_tensor_set_type(out, in[0]->dtype, rank, dims);
    return st;
}

/* Normalised position of pixel i of an axis of length len. */
static double ag_pos(int64_t i, int64_t len, bool align) {
    if (align)
        return len > 1 ? -1.0 + 2.0 * (double)i / (double)(len - 1) : 0.0;
    return -1.0 + (2.0 * (double)i + 1.0) / (double)len;
}

af_status ref_affine_grid(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *ex,
                          af_error *err) {
    (void)ex;
    int rank;
    int64_t dims[5];
    af_status st = ag_dims(n, in, &rank, dims, err);
    if (!st)
        st = nn_check_out(n, &out[0], rank, dims, err);
    if (st)
        return st;
    const af_tensor *theta = in[0];
    int r = rank - 2;
    bool align = af_attr_int(n, "align_corners", 0) != 0;
    int64_t points = 1; /* per batch item */
    for (int i = 1; i <= r; i++)
        points *= dims[i];
    for (int64_t b = 0; b < dims[0]; b++) {
        for (int64_t p = 0; p < points; p++) {
            double pos[4]; /* x (innermost axis), y, [z], 1 */
            int64_t rest = p;
            for (int a = 0; a < r; a++) { /* axis r is W (x), r - 1 is H (y), ... */
                int64_t len = dims[r - a];
                pos[a] = ag_pos(rest % len, len, align);
                rest /= len;
            }
            pos[r] = 1.0;
            for (int j = 0; j < r; j++) {
                double v = 0;
                for (int k = 0; k <= r; k++)
                    v += af_tensor_get_double(theta, (b * r + j) * (r + 1) + k) * pos[k];
                nn_put(&out[0], (b * points + p) * r + j, v);
            }
        }
    }
    return AF_OK;
}
