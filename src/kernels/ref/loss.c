/* Reference losses (ONNX opsets 12..17): NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
 * with optional class weights, ignore_index and reduction none / sum / mean.
 *
 * Invariant: input is [N, C, d...] and target [N, d...] (checked before indexing); every target
 * is either ignore_index or a class in [0, C), otherwise the run fails with a status. "mean"
 * divides by the sum of the weights actually applied (ignored entries weigh 0), as ONNX says. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

/* Shapes: x [N, C, d...], target [N, d...], weight [C] (optional). */
static af_status loss_prepare(const af_node *n, const af_tensor *x, const af_tensor *t,
                              const af_tensor *w, af_error *err) {
    if (!x || !t)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing scores or target");
    if (!nn_is_float(x->dtype) || (w && w->dtype != x->dtype))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                            af_dtype_name(x->dtype));
    if (t->dtype != AF_DTYPE_INT32 && t->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "target must be int32 or int64");
    const char *red = af_attr_str(n, "reduction", "mean");
    if (strcmp(red, "none") != 0 && strcmp(red, "sum") != 0 && strcmp(red, "mean") != 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "reduction '%s'", red);
    if (x->rank < 0)
        return AF_OK;
    if (x->rank < 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "scores must have rank >= 2");
    if (t->rank >= 0) {
        bool ok = t->rank == x->rank - 1;
        for (int i = 0; ok && i < t->rank; i++) {
            int64_t a = t->dims[i], b = x->dims[i == 0 ? 0 : i + 1];
            ok = a < 0 || b < 0 || a == b;
        }
        if (!ok)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "target shape does not match scores");
    }
    if (w && w->rank >= 0 &&
        (w->rank != 1 || (w->dims[0] >= 0 && x->dims[1] >= 0 && w->dims[0] != x->dims[1])))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "weight must be [C]");
    return AF_OK;
}

/* The loss type: [N, d...] for reduction none, a scalar otherwise. */
static void loss_out_type(const af_node *n, const af_tensor *x, af_tensor *y) {
    if (strcmp(af_attr_str(n, "reduction", "mean"), "none") != 0) {
        af_tensor_set_type(y, x->dtype, 0, NULL);
        return;
    }
    if (x->rank < 0) {
        af_tensor_set_type(y, x->dtype, -1, NULL);
        return;
    }
    int64_t dims[AF_MAX_RANK];
    dims[0] = x->dims[0];
    for (int i = 2; i < x->rank; i++)
        dims[i - 1] = x->dims[i];
    af_tensor_set_type(y, x->dtype, x->rank - 1, dims);
}

/* The loss over log-probabilities lp (double, [N, C, inner]), written to y. */
static af_status loss_reduce(const af_node *n, const double *lp, const af_tensor *x,
                             const af_tensor *t, const af_tensor *w, af_tensor *y,
                             af_error *err) {
    const af_attr *ig = af_node_attr(n, "ignore_index");
    const char *red = af_attr_str(n, "reduction", "mean");
    bool none = strcmp(red, "none") == 0;
    int64_t nb = x->dims[0], c = x->dims[1], inner = nn_prod(x, 2, x->rank);
    double sum = 0.0, wsum = 0.0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t ti = b * inner + i, k = nn_geti(t, ti);
            double v = 0.0, wt = 0.0;
            if (!(ig && k == ig->i)) {
                if (k < 0 || k >= c)
                    return af_node_fail(err, n, AF_ERR_RUNTIME, "target %lld outside [0, %lld)",
                                        (long long)k, (long long)c);
                wt = w ? af_tensor_get_double(w, k) : 1.0;
                v = -lp[(b * c + k) * inner + i] * wt;
            }
            if (none)
                nn_put(y, ti, v);
            sum += v;
            wsum += wt;
        }
    if (!none)
        nn_put(y, 0, strcmp(red, "sum") == 0 ? sum : sum / wsum);
    return AF_OK;
}

static af_status loss_ready(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                            af_error *err) {
    for (int i = 0; i < n->nin; i++)
        if (in[i] && (!af_tensor_known(in[i]) || (af_tensor_numel(in[i]) > 0 && !in[i]->data)))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d unknown at run time", i);
    af_tensor t;
    loss_out_type(n, in[0], &t);
    return nn_check_out(n, y, t.rank, t.dims, err);
}

af_status shape_nll_loss(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    af_status st = loss_prepare(n, x, nn_in(n, in, 1), nn_in(n, in, 2), err);
    if (st == AF_OK)
        loss_out_type(n, x, &out[0]);
    return st;
}

af_status ref_nll_loss(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = nn_in(n, in, 0), *w = nn_in(n, in, 2);
    double *lp = NULL;
    af_status st = loss_prepare(n, x, nn_in(n, in, 1), w, err);
    if (st == AF_OK)
        st = loss_ready(n, in, &out[0], err);
    if (st == AF_OK)
        st = nn_load(n, x, &lp, err);
    if (st == AF_OK)
        st = loss_reduce(n, lp, x, in[1], w, &out[0], err);
    af_free(lp);
    return st;
}

/* SoftmaxCrossEntropyLoss: NLL of log_softmax(scores) over axis 1; the optional second output
 * is that log-probability tensor. */
af_status shape_sce_loss(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    af_status st = shape_nll_loss(n, in, out, err);
    if (st == AF_OK && n->nout > 1)
        af_tensor_type_copy(&out[1], in[0]);
    return st;
}

af_status ref_sce_loss(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *ex, af_error *err) {
    (void)ex;
    const af_tensor *x = nn_in(n, in, 0), *w = nn_in(n, in, 2);
    af_tensor *lpo = nn_out(n, out, 1);
    double *lp = NULL;
    af_status st = loss_prepare(n, x, nn_in(n, in, 1), w, err);
    if (st == AF_OK)
        st = loss_ready(n, in, &out[0], err);
    if (st == AF_OK && lpo)
        st = nn_check_out(n, lpo, x->rank, x->dims, err);
    if (st == AF_OK)
        st = nn_load(n, x, &lp, err);
    if (st != AF_OK) {
        af_free(lp);
        return st;
    }
    int64_t nb = x->dims[0], c = x->dims[1], inner = nn_prod(x, 2, x->rank);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < inner; i++) {
            double *row = lp + b * c * inner + i, mx = -INFINITY, s = 0.0;
            for (int64_t k = 0; k < c; k++)
                mx = row[k * inner] > mx || k == 0 ? row[k * inner] : mx;
            for (int64_t k = 0; k < c; k++)
                s += exp(row[k * inner] - mx);
            for (int64_t k = 0; k < c; k++)
                row[k * inner] -= mx + log(s);
        }
    if (lpo)
        for (int64_t i = 0; i < af_tensor_numel(x); i++)
            nn_put(lpo, i, lp[i]);
    st = loss_reduce(n, lp, x, in[1], w, &out[0], err);
    af_free(lp);
    return st;
}
