/* Reference signal-processing ops (ONNX opset 17): DFT (its axis an input from opset 20),
 * STFT, the Hann, Hamming and Blackman windows, and MelWeightMatrix.
 *
 * Complex tensors are real tensors with a trailing dim of 2 (real, imaginary); a trailing dim
 * of 1 is a real signal. Transforms are computed directly from the definition,
 * X[k] = sum_j x[j] exp(-+2 pi i j k / L), in double, with a table of the L twiddle factors so
 * that no angle is recomputed per term.
 *
 * Invariant: every length read from an input (dft_length, frame_step, frame_length, window size,
 * mel parameters) is checked before it sizes a loop or an allocation; signal reads stay inside
 * [0, min(signal length, L)) of each line and filter-bank writes inside the output, whatever the
 * band edges computed from the data. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

#define SIG_TWO_PI 6.283185307179586476925286766559

/* The signal ops first appeared in opset 17; an older model naming them is not valid ONNX. */
static af_status sig_opset(const af_node *n, af_error *err) {
    if (af_graph_opset(n->graph) < 17)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s needs opset 17, model has %lld",
                            n->op_type, (long long)af_graph_opset(n->graph));
    return AF_OK;
}

/* Rank 0, or rank 1 with one element (exporters write both for "a scalar"). */
static bool sig_is_scalar(const af_tensor *t) {
    return t->rank <= 0 || (t->rank == 1 && (t->dims[0] < 0 || t->dims[0] == 1));
}

/* Whether t's data holds its one element (false at compile time for non-constant values). */
static bool sig_has_value(const af_tensor *t) {
    return t->data && t->rank >= 0 && af_tensor_numel(t) == 1 &&
           t->nbytes >= af_dtype_size(t->dtype);
}

/* A scalar int32/int64 input. *known is false (and *v -1) when its value is not available yet,
 * as at compile time. */
static af_status sig_int_input(const af_node *n, const af_tensor *t, const char *what, int64_t *v,
                               bool *known, af_error *err) {
    *v = -1;
    *known = false;
    if (!t)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input %s", what);
    if (t->dtype != AF_DTYPE_INT32 && t->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be int32 or int64, got %s", what,
                            af_dtype_name(t->dtype));
    if (!sig_is_scalar(t))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be a scalar", what);
    if (sig_has_value(t)) {
        *v = nn_geti(t, 0);
        *known = true;
    }
    return AF_OK;
}

/* A scalar floating-point input; same conventions as sig_int_input. */
static af_status sig_float_input(const af_node *n, const af_tensor *t, const char *what,
                                 double *v, bool *known, af_error *err) {
    *v = 0.0;
    *known = false;
    if (!t)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input %s", what);
    if (!nn_is_float(t->dtype))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be a float type, got %s", what,
                            af_dtype_name(t->dtype));
    if (!sig_is_scalar(t))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be a scalar", what);
    if (sig_has_value(t)) {
        *v = af_tensor_get_double(t, 0);
        *known = true;
    }
    return AF_OK;
}

/* A 0/1 attribute. *v is written on every path (the default on failure), like the inputs above. */
static af_status sig_flag(const af_node *n, const char *name, int64_t dflt, bool *v,
                          af_error *err) {
    *v = dflt == 1;
    int64_t i = af_attr_int(n, name, dflt);
    if (i != 0 && i != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must be 0 or 1, got %lld", name,
                            (long long)i);
    *v = i == 1;
    return AF_OK;
}

/* The output_datatype attribute of the generators: any numeric type but bool. *dt is written on
 * every path (float on failure). */
static af_status sig_out_dtype(const af_node *n, af_dtype *dt, af_error *err) {
    *dt = AF_DTYPE_FLOAT;
    int64_t v = af_attr_int(n, "output_datatype", AF_DTYPE_FLOAT);
    if (v == AF_DTYPE_FLOAT || v == AF_DTYPE_DOUBLE || v == AF_DTYPE_FLOAT16 ||
        v == AF_DTYPE_BFLOAT16 || (v >= 0 && v <= AF_DTYPE_BFLOAT16 && nn_is_int((af_dtype)v))) {
        *dt = (af_dtype)v;
        return AF_OK;
    }
    return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "output_datatype %lld is not a numeric type",
                        (long long)v);
}

/* malloc of count doubles (at least one, so that empty loops still get a valid pointer). */
static double *sig_doubles(int64_t count) {
    size_t bytes;
    if (count < 1)
        count = 1;
    if (!af_mul_size((size_t)count, sizeof(double), &bytes))
        return NULL;
    return af_malloc(bytes);
}

/* ---- the transform of one line ----------------------------------------------------------------- */

/* cos and sin of 2 pi m / len for m in [0, len): one table serves every line of a transform. */
typedef struct sig_twiddle {
    int64_t len;
    double *cs, *sn;
} sig_twiddle;

static af_status sig_twiddle_init(const af_node *n, int64_t len, sig_twiddle *t, af_error *err) {
    t->len = len;
    t->cs = sig_doubles(len);
    t->sn = sig_doubles(len);
    if (!t->cs || !t->sn)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for a DFT of length %lld",
                            (long long)len);
    for (int64_t m = 0; m < len; m++) {
        double a = SIG_TWO_PI * (double)m / (double)len;
        t->cs[m] = cos(a);
        t->sn[m] = sin(a);
    }
    return AF_OK;
}

static void sig_twiddle_free(sig_twiddle *t) {
    af_free(t->cs);
    af_free(t->sn);
}

/* y[k] for k < nout of the length-len DFT of x (nx <= len samples, the rest zero). Forward uses
 * exp(-i a), inverse exp(+i a) and a 1/len scale. The angle index j*k mod len is kept by
 * addition, so it never overflows. */
static void sig_dft_line(const sig_twiddle *tw, const double *xr, const double *xi, int64_t nx,
                         int64_t nout, bool inverse, double *yr, double *yi) {
    double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / (double)tw->len : 1.0;
    for (int64_t k = 0; k < nout; k++) {
        int64_t step = k % tw->len, m = 0;
        double re = 0.0, im = 0.0;
        for (int64_t j = 0; j < nx; j++) {
            double c = tw->cs[m], s = sign * tw->sn[m];
            re += xr[j] * c - xi[j] * s;
            im += xr[j] * s + xi[j] * c;
            m += step;
            if (m >= tw->len)
                m -= tw->len;
        }
        yr[k] = re * scale;
        yi[k] = im * scale;
    }
}

/* ---- DFT ------------------------------------------------------------------------------------- */

/* What DFT derives from its inputs and attributes; lengths are -1 when unknown. */
typedef struct dft_plan {
    int axis;
    int64_t len;  /* transform length L (dft_length, or the input's axis dim) */
    int64_t nout; /* L, or L/2 + 1 when onesided */
    bool inverse, onesided;
} dft_plan;

/* The axis: an attribute (default 1) in opset 17, a scalar input (default -2) from opset 20.
 * The input must be known when the model is compiled (exporters write a constant). */
static af_status dft_axis(const af_node *n, const af_tensor *const *in, int64_t *axis,
                          af_error *err) {
    if (af_graph_opset(n->graph) < 20) {
        *axis = af_attr_int(n, "axis", 1);
        return AF_OK;
    }
    const af_tensor *a = nn_in(n, in, 2);
    bool known = true;
    *axis = -2;
    af_status st = a ? sig_int_input(n, a, "axis", axis, &known, err) : AF_OK;
    if (!st && !known)
        st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "axis input not known when compiling");
    return st;
}

static af_status dft_prepare(const af_node *n, const af_tensor *const *in, dft_plan *p,
                             af_tensor *type, af_error *err) {
    af_status st = sig_opset(n, err);
    if (st)
        return st;
    const af_tensor *x = nn_in(n, in, 0), *dl = nn_in(n, in, 1);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input");
    if (!nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "DFT on %s", af_dtype_name(x->dtype));
    if ((st = sig_flag(n, "inverse", 0, &p->inverse, err)) ||
        (st = sig_flag(n, "onesided", 0, &p->onesided, err)))
        return st;
    bool dl_known = true;
    p->len = -1;
    if (dl) {
        if ((st = sig_int_input(n, dl, "dft_length", &p->len, &dl_known, err)))
            return st;
        if (dl_known && p->len < 1)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "dft_length %lld must be >= 1",
                                (long long)p->len);
    }
    if (x->rank < 0) {
        af_tensor_set_type(type, x->dtype, -1, NULL);
        return AF_OK;
    }
    int r = x->rank;
    int64_t axis;
    if ((st = dft_axis(n, in, &axis, err)))
        return st;
    /* The batch dim may be transformed too; the trailing (real, imaginary) dim may not. */
    if (r < 2 || axis < -r || axis > r - 2 || axis == -1 || !af_axis(axis, r, &p->axis))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "axis %lld invalid for input rank %d",
                            (long long)axis, r);
    int64_t comp = x->dims[r - 1];
    if (comp >= 0 && comp != 1 && comp != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "last dim must be 1 (real) or 2 (complex), got %lld", (long long)comp);
    if (comp == 2 && p->onesided)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "onesided needs a real input");
    if (!dl)
        p->len = x->dims[p->axis];
    if (p->len == 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "DFT of an empty axis");
    p->nout = p->len < 0 ? -1 : p->onesided ? p->len / 2 + 1 : p->len;
    af_tensor_type_copy(type, x);
    type->dims[p->axis] = p->nout;
    type->dims[r - 1] = 2;
    return AF_OK;
}

af_status shape_dft(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    dft_plan p;
    return dft_prepare(n, in, &p, &out[0], err);
}

af_status ref_dft(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x_,
                        af_error *err) {
    (void)x_;
    dft_plan p;
    af_tensor type = {0};
    af_status st = dft_prepare(n, in, &p, &type, err);
    if (st)
        return st;
    af_tensor *y = &out[0];
    if ((st = nn_check_out(n, y, type.rank, type.dims, err)))
        return st;
    const af_tensor *x = in[0];
    int r = x->rank;
    int64_t outer = nn_prod(x, 0, p.axis), dim = x->dims[p.axis];
    int64_t inner = nn_prod(x, p.axis + 1, r - 1), comp = x->dims[r - 1];
    int64_t nx = dim < p.len ? dim : p.len;
    double *xv = NULL, *buf = sig_doubles(2 * nx + 2 * p.nout);
    sig_twiddle tw = {0};
    if (!buf) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = nn_load(n, x, &xv, err)) || (st = sig_twiddle_init(n, p.len, &tw, err)))
        goto fail;
    double *xr = buf, *xi = buf + nx, *yr = xi + nx, *yi = yr + p.nout;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            for (int64_t j = 0; j < nx; j++) {
                int64_t at = ((o * dim + j) * inner + i) * comp;
                xr[j] = xv[at];
                xi[j] = comp == 2 ? xv[at + 1] : 0.0;
            }
            sig_dft_line(&tw, xr, xi, nx, p.nout, p.inverse, yr, yi);
            for (int64_t k = 0; k < p.nout; k++) {
                int64_t at = ((o * p.nout + k) * inner + i) * 2;
                nn_put(y, at, yr[k]);
                nn_put(y, at + 1, yi[k]);
            }
        }
    }
fail:
    sig_twiddle_free(&tw);
    af_free(xv);
    af_free(buf);
    return st;
}

/* ---- STFT ------------------------------------------------------------------------------------ */

/* What STFT derives: frames of `len` samples every `step` samples; -1 when unknown. */
typedef struct stft_plan {
    int64_t step, len, frames, nout;
    bool onesided;
} stft_plan;

static af_status stft_prepare(const af_node *n, const af_tensor *const *in, stft_plan *p,
                              af_tensor *type, af_error *err) {
    af_status st = sig_opset(n, err);
    if (st)
        return st;
    const af_tensor *x = nn_in(n, in, 0), *step = nn_in(n, in, 1);
    const af_tensor *win = nn_in(n, in, 2), *fl = nn_in(n, in, 3);
    if (!x || !step)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing signal or frame_step");
    if (!nn_is_float(x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "STFT on %s", af_dtype_name(x->dtype));
    if ((st = sig_flag(n, "onesided", 1, &p->onesided, err)))
        return st;
    bool known;
    if ((st = sig_int_input(n, step, "frame_step", &p->step, &known, err)))
        return st;
    if (known && p->step < 1)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "frame_step %lld must be >= 1",
                            (long long)p->step);
    p->len = -1;
    if (fl) {
        if ((st = sig_int_input(n, fl, "frame_length", &p->len, &known, err)))
            return st;
        if (known && p->len < 1)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "frame_length %lld must be >= 1",
                                (long long)p->len);
    }
    if (win) {
        if (win->dtype != x->dtype)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "window must be %s like the signal",
                                af_dtype_name(x->dtype));
        if (win->rank >= 0 && win->rank != 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "window must be 1-D");
        int64_t w = win->rank == 1 ? win->dims[0] : -1;
        if (w >= 0 && p->len >= 0 && w != p->len)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "window length %lld differs from frame_length %lld", (long long)w,
                                (long long)p->len);
        if (!fl)
            p->len = w;
        if (w == 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "empty window");
    } else if (!fl) {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "needs a window or a frame_length");
    }
    if (x->rank >= 0 && x->rank != 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "signal must be [batch, length, 1 or 2]");
    int64_t batch = x->rank == 3 ? x->dims[0] : -1, slen = x->rank == 3 ? x->dims[1] : -1;
    int64_t comp = x->rank == 3 ? x->dims[2] : -1;
    if (comp >= 0 && comp != 1 && comp != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "last dim must be 1 (real) or 2 (complex), got %lld", (long long)comp);
    if (comp == 2 && p->onesided)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "onesided needs a real signal");
    p->frames = -1;
    if (slen >= 0 && p->len >= 0) {
        if (slen < p->len)
            return af_node_fail(err, n, AF_ERR_RUNTIME,
                                "signal length %lld is shorter than the frame length %lld",
                                (long long)slen, (long long)p->len);
        if (p->step >= 1)
            p->frames = (slen - p->len) / p->step + 1;
    }
    p->nout = p->len < 0 ? -1 : p->onesided ? p->len / 2 + 1 : p->len;
    int64_t dims[4] = {batch, p->frames, p->nout, 2};
    af_tensor_set_type(type, x->dtype, 4, dims);
    return AF_OK;
}

af_status shape_stft(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    stft_plan p;
    return stft_prepare(n, in, &p, &out[0], err);
}

af_status ref_stft(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x_, af_error *err) {
    (void)x_;
    stft_plan p;
    af_tensor type = {0};
    af_status st = stft_prepare(n, in, &p, &type, err);
    if (st)
        return st;
    af_tensor *y = &out[0];
    if ((st = nn_check_out(n, y, type.rank, type.dims, err)))
        return st;
    const af_tensor *x = in[0], *win = nn_in(n, in, 2);
    int64_t batch = x->dims[0], slen = x->dims[1], comp = x->dims[2];
    double *xv = NULL, *wv = NULL, *buf = sig_doubles(2 * p.len + 2 * p.nout);
    sig_twiddle tw = {0};
    if (!buf) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = nn_load(n, x, &xv, err)) || (win && (st = nn_load(n, win, &wv, err))) ||
        (st = sig_twiddle_init(n, p.len, &tw, err)))
        goto fail;
    double *xr = buf, *xi = buf + p.len, *yr = xi + p.len, *yi = yr + p.nout;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t f = 0; f < p.frames; f++) {
            /* frames was derived so that the last frame ends inside the signal */
            int64_t start = b * slen + f * p.step;
            for (int64_t j = 0; j < p.len; j++) {
                double w = wv ? wv[j] : 1.0;
                xr[j] = w * xv[(start + j) * comp];
                xi[j] = comp == 2 ? w * xv[(start + j) * comp + 1] : 0.0;
            }
            sig_dft_line(&tw, xr, xi, p.len, p.nout, false, yr, yi);
            for (int64_t k = 0; k < p.nout; k++) {
                int64_t at = ((b * p.frames + f) * p.nout + k) * 2;
                nn_put(y, at, yr[k]);
                nn_put(y, at + 1, yi[k]);
            }
        }
    }
fail:
    sig_twiddle_free(&tw);
    af_free(xv);
    af_free(wv);
    af_free(buf);
    return st;
}

/* ---- windows --------------------------------------------------------------------------------- */

/* Generalized cosine window w[k] = a0 - a1 cos(t) + a2 cos(2t), t = 2 pi k / N. */
typedef struct sig_cosine {
    double a0, a1, a2;
} sig_cosine;

/* The window size from input 0 (-1 when unknown, at compile time) and the attributes. */
static af_status window_prepare(const af_node *n, const af_tensor *const *in, int64_t *size,
                                af_dtype *dt, bool *periodic, af_error *err) {
    af_status st = sig_opset(n, err);
    bool known;
    if (st || (st = sig_out_dtype(n, dt, err)) || (st = sig_flag(n, "periodic", 1, periodic, err)))
        return st;
    if ((st = sig_int_input(n, nn_in(n, in, 0), "size", size, &known, err)))
        return st;
    if (known && *size < 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "window size %lld is negative",
                            (long long)*size);
    return AF_OK;
}

af_status shape_window(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    int64_t size;
    af_dtype dt;
    bool periodic;
    af_status st = window_prepare(n, in, &size, &dt, &periodic, err);
    if (!st)
        af_tensor_set_type(&out[0], dt, 1, &size);
    return st;
}

static af_status window_run(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            sig_cosine c, af_error *err) {
    int64_t size;
    af_dtype dt;
    bool periodic;
    af_status st = window_prepare(n, in, &size, &dt, &periodic, err);
    if (st || (st = nn_check_out(n, &out[0], 1, &size, err)))
        return st;
    /* A periodic window is the first `size` points of a symmetric window of size + 1. */
    int64_t period = periodic ? size : size - 1;
    for (int64_t k = 0; k < size; k++) {
        /* A one-point symmetric window has no period; numpy and torch make it [1]. */
        double t = period > 0 ? SIG_TWO_PI * (double)k / (double)period : 0.0;
        double v = period > 0 ? c.a0 - c.a1 * cos(t) + c.a2 * cos(2.0 * t) : 1.0;
        nn_put(&out[0], k, v);
    }
    return AF_OK;
}

af_status ref_hann_window(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_exec *x, af_error *err) {
    (void)x;
    return window_run(n, in, out, (sig_cosine){0.5, 0.5, 0.0}, err);
}

af_status ref_hamming_window(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   af_exec *x, af_error *err) {
    (void)x;
    return window_run(n, in, out, (sig_cosine){25.0 / 46.0, 21.0 / 46.0, 0.0}, err);
}

af_status ref_blackman_window(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                    af_exec *x, af_error *err) {
    (void)x;
    return window_run(n, in, out, (sig_cosine){0.42, 0.5, 0.08}, err);
}

/* ---- MelWeightMatrix ------------------------------------------------------------------------- */

/* The inputs of MelWeightMatrix; `known` is false until every value is available. */
typedef struct mel_params {
    int64_t bins, dft_len, rate;
    double lo, hi;
    bool known;
} mel_params;

static af_status mel_prepare(const af_node *n, const af_tensor *const *in, mel_params *p,
                             af_dtype *dt, af_error *err) {
    af_status st = sig_opset(n, err);
    bool k[5];
    if (st || (st = sig_out_dtype(n, dt, err)) ||
        (st = sig_int_input(n, nn_in(n, in, 0), "num_mel_bins", &p->bins, &k[0], err)) ||
        (st = sig_int_input(n, nn_in(n, in, 1), "dft_length", &p->dft_len, &k[1], err)) ||
        (st = sig_int_input(n, nn_in(n, in, 2), "sample_rate", &p->rate, &k[2], err)) ||
        (st = sig_float_input(n, nn_in(n, in, 3), "lower_edge_hertz", &p->lo, &k[3], err)) ||
        (st = sig_float_input(n, nn_in(n, in, 4), "upper_edge_hertz", &p->hi, &k[4], err)))
        return st;
    if (k[0] && p->bins < 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "num_mel_bins %lld is negative",
                            (long long)p->bins);
    if (k[1] && p->dft_len < 1)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "dft_length %lld must be >= 1",
                            (long long)p->dft_len);
    if (k[2] && p->rate < 1)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "sample_rate %lld must be >= 1",
                            (long long)p->rate);
    p->known = k[0] && k[1] && k[2] && k[3] && k[4];
    return AF_OK;
}

af_status shape_mel(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    mel_params p;
    af_dtype dt;
    af_status st = mel_prepare(n, in, &p, &dt, err);
    if (st)
        return st;
    int64_t dims[2] = {p.dft_len < 0 ? -1 : p.dft_len / 2 + 1, p.bins};
    af_tensor_set_type(&out[0], dt, 2, dims);
    return AF_OK;
}

static double mel_of_hz(double hz) {
    return 2595.0 * log10(1.0 + hz / 700.0);
}

static double hz_of_mel(double mel) {
    return 700.0 * (pow(10.0, mel / 2595.0) - 1.0);
}

/* The bins + 2 band edges as spectrogram bin indices: points equally spaced on the mel scale
 * between the edge frequencies (the step divides the range by bins + 2, as ONNX's reference
 * does), each mapped to floor((dft_length + 1) * hz / sample_rate). */
static af_status mel_edges(const af_node *n, const mel_params *p, int64_t *edge, af_error *err) {
    double lo = mel_of_hz(p->lo), hi = mel_of_hz(p->hi);
    double step = (hi - lo) / (double)(p->bins + 2);
    for (int64_t i = 0; i < p->bins + 2; i++) {
        double hz = hz_of_mel(lo + (double)i * step);
        double e = floor((double)(p->dft_len + 1) * hz / (double)p->rate);
        /* Beyond 2^53 the slopes below would lose their integer exactness; such an edge can
         * only come from nonsense inputs (or NaN from an edge below -700 Hz). */
        if (!(fabs(e) <= 9007199254740992.0))
            return af_node_fail(err, n, AF_ERR_RUNTIME,
                                "mel band edge %lld is not finite for these frequencies",
                                (long long)i);
        edge[i] = (int64_t)e;
    }
    return AF_OK;
}

af_status ref_mel(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                        af_error *err) {
    (void)x;
    mel_params p;
    af_dtype dt;
    af_status st = mel_prepare(n, in, &p, &dt, err);
    if (st)
        return st;
    if (!p.known)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "inputs have no values");
    af_tensor *y = &out[0];
    int64_t nspec = p.dft_len / 2 + 1, dims[2] = {nspec, p.bins};
    if ((st = nn_check_out(n, y, 2, dims, err)))
        return st;
    size_t bytes;
    int64_t *edge = NULL;
    if (!af_mul_size((size_t)p.bins + 2, sizeof(int64_t), &bytes) || !(edge = af_malloc(bytes)))
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    if ((st = mel_edges(n, &p, edge, err))) {
        af_free(edge);
        return st;
    }
    /* Band i rises from edge i to a peak of 1 at edge i+1 and falls to edge i+2; writes outside
     * the [0, nspec) spectrogram rows are dropped. The falling side is written second, so at
     * the peak it is the one kept (both are 1 there). */
    for (int64_t i = 0; i < p.bins; i++) {
        int64_t l = edge[i], c = edge[i + 1], h = edge[i + 2];
        if (c == l) {
            if (c >= 0 && c < nspec)
                nn_put(y, c * p.bins + i, 1.0);
        } else {
            for (int64_t j = l > 0 ? l : 0; j <= c && j < nspec; j++)
                nn_put(y, j * p.bins + i, (double)(j - l) / (double)(c - l));
        }
        if (h > c) {
            for (int64_t j = c > 0 ? c : 0; j < h && j < nspec; j++)
                nn_put(y, j * p.bins + i, (double)(h - j) / (double)(h - c));
        }
    }
    af_free(edge);
    return AF_OK;
}
