/* Reference optimizer steps of the ai.onnx.preview.training domain (version 1): Adagrad, Adam and
 * Momentum. Each computes one update of k tensors at once: inputs are R (learning rate), T
 * (update count), then k X's, k G's (gradients) and the k's of each state tensor; outputs are
 * the k new X's followed by the k's of each new state, all shaped like their X.
 *
 * Invariant: the input and output counts are checked to form whole groups of k before any slot
 * is read, and every G and state tensor must have exactly its X's shape, so the elementwise loops
 * index all of them with X's element count. */
#include "kernels/ref/nn_common.h"

typedef enum train_algo { TRAIN_ADAGRAD, TRAIN_ADAM, TRAIN_MOMENTUM } train_algo;

/* Tensor lists per optimized tensor: inputs (X, G, states...) and outputs (X_new, states...). */
static const int train_in_lists[] = {3, 4, 3};
static const int train_out_lists[] = {2, 3, 2};

/* Whether two known-rank types have the same dims where both are known. */
static bool train_same_shape(const af_tensor *a, const af_tensor *b) {
    if (a->rank < 0 || b->rank < 0)
        return true;
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] >= 0 && b->dims[i] >= 0 && a->dims[i] != b->dims[i])
            return false;
    return true;
}

/* Rank 0, or rank 1 with one element. */
static bool train_scalar(const af_tensor *t) {
    return t->rank <= 0 || (t->rank == 1 && (t->dims[0] < 0 || t->dims[0] == 1));
}

/* Check the signature; *k is the number of tensors optimized together. */
static af_status train_prepare(const af_node *n, const af_tensor *const *in, train_algo algo,
                               int *k, af_error *err) {
    int nl = train_in_lists[algo], ol = train_out_lists[algo];
    if (n->nin < 2 + nl || (n->nin - 2) % nl != 0 || n->nout != (n->nin - 2) / nl * ol)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "%d inputs and %d outputs do not form whole groups of %d and %d",
                            n->nin, n->nout, nl, ol);
    *k = (n->nin - 2) / nl;
    const af_tensor *r = in[0], *t = in[1];
    if (!r || !t)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing R or T");
    if ((r->dtype != AF_DTYPE_FLOAT && r->dtype != AF_DTYPE_DOUBLE) || !train_scalar(r))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "R must be a float or double scalar");
    if (t->dtype != AF_DTYPE_INT64 || !train_scalar(t))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "T must be an int64 scalar");
    for (int i = 0; i < *k; i++) {
        const af_tensor *x = in[2 + i];
        if (!x)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input %d", 2 + i);
        if (x->dtype != AF_DTYPE_FLOAT && x->dtype != AF_DTYPE_DOUBLE)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "%s on %s", n->op_type,
                                af_dtype_name(x->dtype));
        for (int j = 1; j < nl; j++) {
            const af_tensor *s = in[2 + j * *k + i];
            if (!s || s->dtype != x->dtype || !train_same_shape(s, x))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                    "input %d must be present with the type and shape of input %d",
                                    2 + j * *k + i, 2 + i);
        }
    }
    if (algo == TRAIN_MOMENTUM) {
        static const char *const required[] = {"alpha", "beta", "mode", "norm_coefficient"};
        for (size_t i = 0; i < AF_COUNT(required); i++)
            if (!af_node_attr(n, required[i]))
                return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing attribute %s",
                                    required[i]);
        const char *mode = af_attr_str(n, "mode", "");
        if (strcmp(mode, "standard") != 0 && strcmp(mode, "nesterov") != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "mode '%s' is not standard or nesterov", mode);
    }
    return AF_OK;
}

static af_status train_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             train_algo algo, af_error *err) {
    int k;
    af_status st = train_prepare(n, in, algo, &k, err);
    if (st)
        return st;
    for (int j = 0; j < train_out_lists[algo]; j++)
        for (int i = 0; i < k; i++)
            af_tensor_type_copy(&out[j * k + i], in[2 + i]);
    return AF_OK;
}

af_status shape_adagrad(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    return train_shape(n, in, out, TRAIN_ADAGRAD, err);
}

af_status shape_adam(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    return train_shape(n, in, out, TRAIN_ADAM, err);
}

af_status shape_momentum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    return train_shape(n, in, out, TRAIN_MOMENTUM, err);
}

/* The scalar inputs R and T, once the signature is checked. *r and *t are written on every path
 * (0 on failure). */
static af_status train_scalars(const af_node *n, const af_tensor *const *in, double *r,
                               int64_t *t, af_error *err) {
    *r = 0.0;
    *t = 0;
    if (af_tensor_numel(in[0]) != 1 || af_tensor_numel(in[1]) != 1 || !in[0]->data ||
        in[0]->nbytes < af_dtype_size(in[0]->dtype) || !in[1]->data ||
        in[1]->nbytes < sizeof(int64_t))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "R or T has no value");
    *r = af_tensor_get_double(in[0], 0);
    *t = nn_geti(in[1], 0);
    return AF_OK;
}

/* Load input `slot` as doubles after checking it has exactly `numel` elements. */
static af_status train_load(const af_node *n, const af_tensor *const *in, int slot,
                            int64_t numel, double **v, af_error *err) {
    *v = NULL;
    if (af_tensor_numel(in[slot]) != numel)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d has %lld elements, expected %lld",
                            slot, (long long)af_tensor_numel(in[slot]), (long long)numel);
    return nn_load(n, in[slot], v, err);
}

/* One optimizer step for tensor i of k: the elementwise update of each algorithm's pseudo code
 * in the ONNX specification. */
static af_status train_one(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           train_algo algo, int k, int i, double r, int64_t t, af_error *err) {
    int nl = train_in_lists[algo], ol = train_out_lists[algo];
    const af_tensor *x = in[2 + i];
    int64_t numel = af_tensor_numel(x);
    double *v[4] = {NULL, NULL, NULL, NULL}; /* X, G, then the states */
    af_status st = AF_OK;
    for (int j = 0; j < ol && !st; j++)
        st = nn_check_out(n, &out[j * k + i], x->rank, x->dims, err);
    for (int j = 0; j < nl && !st; j++)
        st = train_load(n, in, 2 + j * k + i, numel, &v[j], err);
    if (st)
        goto done;
    double norm = af_attr_float(n, "norm_coefficient", 0.0f);
    af_tensor *xo = &out[i], *s1 = &out[k + i], *s2 = algo == TRAIN_ADAM ? &out[2 * k + i] : NULL;
    if (algo == TRAIN_ADAGRAD) {
        double decay = af_attr_float(n, "decay_factor", 0.0f);
        double eps = af_attr_float(n, "epsilon", 1e-6f);
        double rate = r / (1.0 + (double)t * decay);
        for (int64_t e = 0; e < numel; e++) {
            double g = norm * v[0][e] + v[1][e], h = v[2][e] + g * g;
            nn_put(xo, e, v[0][e] - rate * g / (sqrt(h) + eps));
            nn_put(s1, e, h);
        }
    } else if (algo == TRAIN_ADAM) {
        double alpha = af_attr_float(n, "alpha", 0.9f), beta = af_attr_float(n, "beta", 0.999f);
        double eps = af_attr_float(n, "epsilon", 1e-6f);
        double post = af_attr_float(n, "norm_coefficient_post", 0.0f);
        double rate = t > 0 ? r * sqrt(1.0 - pow(beta, (double)t)) / (1.0 - pow(alpha, (double)t))
                            : r;
        for (int64_t e = 0; e < numel; e++) {
            double g = norm * v[0][e] + v[1][e];
            double m = alpha * v[2][e] + (1.0 - alpha) * g;
            double h = beta * v[3][e] + (1.0 - beta) * g * g;
            nn_put(xo, e, (1.0 - post) * (v[0][e] - rate * m / (sqrt(h) + eps)));
            nn_put(s1, e, m);
            nn_put(s2, e, h);
        }
    } else {
        double alpha = af_attr_float(n, "alpha", 0.0f), beta = af_attr_float(n, "beta", 0.0f);
        bool nesterov = strcmp(af_attr_str(n, "mode", ""), "nesterov") == 0;
        double b = t > 0 ? beta : 1.0; /* the first step takes the whole gradient */
        for (int64_t e = 0; e < numel; e++) {
            double g = norm * v[0][e] + v[1][e];
            double m = alpha * v[2][e] + b * g;
            nn_put(xo, e, v[0][e] - r * (nesterov ? g + alpha * m : m));
            nn_put(s1, e, m);
        }
    }
done:
    for (int j = 0; j < 4; j++)
        af_free(v[j]);
    return st;
}

static af_status train_run(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           train_algo algo, af_error *err) {
    int k;
    double r;
    int64_t t;
    af_status st = train_prepare(n, in, algo, &k, err);
    if (st || (st = train_scalars(n, in, &r, &t, err)))
        return st;
    for (int i = 0; i < k && !st; i++)
        st = train_one(n, in, out, algo, k, i, r, t, err);
    return st;
}

af_status ref_adagrad(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *x, af_error *err) {
    (void)x;
    return train_run(n, in, out, TRAIN_ADAGRAD, err);
}

af_status ref_adam(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                         af_error *err) {
    (void)x;
    return train_run(n, in, out, TRAIN_ADAM, err);
}

af_status ref_momentum(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *x, af_error *err) {
    (void)x;
    return train_run(n, in, out, TRAIN_MOMENTUM, err);
}
