/* Reference recurrent layers (ONNX opsets 7..17): RNN, GRU and LSTM, forward, reverse or
 * bidirectional, with sequence_lens, initial states, peepholes, clip, input_forget,
 * linear_before_reset, every activation ONNX lists, and opset 14's batch-first layout.
 *
 * Invariant: all operand shapes are checked against (num_directions, batch, seq, input,
 * hidden) in rnn_prepare before the loops index them; sequence lengths are checked against
 * seq_length. Steps past a batch entry's length leave its state alone and its Y rows zero. */
#include "kernels/ref/nn_common.h"
#include "kernels/ref/rnn.h"

#include <ctype.h>
#include <stdlib.h>

/* An activation's ONNX name, whether it takes alpha / beta, and their defaults. */
static const struct {
    const char *name;
    bool has_alpha, has_beta;
    double alpha, beta;
} rnn_fns[] = {
    [FN_RELU] = {"relu", false, false, 0, 0},
    [FN_TANH] = {"tanh", false, false, 0, 0},
    [FN_SIGMOID] = {"sigmoid", false, false, 0, 0},
    [FN_AFFINE] = {"affine", true, true, 1.0, 0.0},
    [FN_LEAKYRELU] = {"leakyrelu", true, false, 0.01, 0},
    [FN_THRESHOLDEDRELU] = {"thresholdedrelu", true, false, 1.0, 0},
    [FN_SCALEDTANH] = {"scaledtanh", true, true, 1.0, 1.0},
    [FN_HARDSIGMOID] = {"hardsigmoid", true, true, 0.2, 0.5},
    [FN_ELU] = {"elu", true, false, 1.0, 0},
    [FN_SOFTSIGN] = {"softsign", false, false, 0, 0},
    [FN_SOFTPLUS] = {"softplus", false, false, 0, 0},
};


static double rnn_apply(const rnn_act *a, double x) {
    switch (a->fn) {
    case FN_RELU: return x > 0 ? x : 0;
    case FN_TANH: return tanh(x);
    case FN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case FN_AFFINE: return a->alpha * x + a->beta;
    case FN_LEAKYRELU: return x >= 0 ? x : a->alpha * x;
    case FN_THRESHOLDEDRELU: return x > a->alpha ? x : 0;
    case FN_SCALEDTANH: return a->alpha * tanh(a->beta * x);
    case FN_HARDSIGMOID: return nn_clamp(a->alpha * x + a->beta, 0.0, 1.0);
    case FN_ELU: return x >= 0 ? x : a->alpha * (exp(x) - 1.0);
    case FN_SOFTSIGN: return x / (1.0 + fabs(x));
    case FN_SOFTPLUS: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); /* no overflow */
    }
    return x;
}


static rnn_kind rnn_kind_of(const af_node *n) {
    return n->op == AF_OP_LSTM ? RNN_LSTM : n->op == AF_OP_GRU ? RNN_GRU : RNN_SIMPLE;
}

static bool rnn_name_is(const char *s, const char *lower) {
    for (; *s && *lower; s++, lower++)
        if (tolower((unsigned char)*s) != *lower)
            return false;
    return *s == '\0' && *lower == '\0';
}

/* Activations from the attributes, defaults when absent. alpha and beta values are taken in
 * order by the activations that use them. */
static af_status rnn_acts(const af_node *n, rnn_geom *g, af_error *err) {
    static const rnn_fn dflt[3][3] = {
        {FN_TANH}, {FN_SIGMOID, FN_TANH}, {FN_SIGMOID, FN_TANH, FN_TANH}};
    const af_attr *a = af_node_attr(n, "activations");
    int total = g->nact * g->ndir;
    if (a && a->type == AF_ATTR_STRINGS && a->n != total && !(a->n == g->nact && g->ndir == 2))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%d activations, expected %d", a->n,
                            total);
    const float *alphas = NULL, *betas = NULL;
    int na = af_attr_floats(n, "activation_alpha", &alphas), ia = 0;
    int nb = af_attr_floats(n, "activation_beta", &betas), ib = 0;
    for (int i = 0; i < total; i++) {
        rnn_act *act = &g->act[i];
        act->fn = dflt[g->kind][i % g->nact];
        if (a && a->type == AF_ATTR_STRINGS) {
            const char *name = a->strings[i % a->n];
            size_t f = 0;
            while (f < AF_COUNT(rnn_fns) && !rnn_name_is(name, rnn_fns[f].name))
                f++;
            if (f == AF_COUNT(rnn_fns))
                return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "activation '%s'", name);
            act->fn = (rnn_fn)f;
        }
        act->alpha = rnn_fns[act->fn].alpha;
        act->beta = rnn_fns[act->fn].beta;
        if (rnn_fns[act->fn].has_alpha && ia < na)
            act->alpha = alphas[ia++];
        if (rnn_fns[act->fn].has_beta && ib < nb)
            act->beta = betas[ib++];
    }
    return AF_OK;
}

/* Check that t (when given and its rank known) has dims `want` (entries < 0 are free). */
static af_status rnn_dims(const af_node *n, const af_tensor *t, const char *what, int rank,
                          const int64_t *want, af_error *err) {
    if (!t || t->rank < 0)
        return AF_OK;
    if (t->rank != rank)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s has rank %d, expected %d", what,
                            t->rank, rank);
    for (int i = 0; i < rank; i++)
        if (t->dims[i] >= 0 && want[i] >= 0 && t->dims[i] != want[i])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s dim %d is %lld, expected %lld",
                                what, i, (long long)t->dims[i], (long long)want[i]);
    return AF_OK;
}

/* Inputs: X, W, R, B, sequence_lens, initial_h, and for LSTM initial_c, P. */
af_status rnn_prepare(const af_node *n, const af_tensor *const *in, rnn_geom *g,
                      af_error *err) {
    memset(g, 0, sizeof(*g));
    g->kind = rnn_kind_of(n);
    g->gates = g->kind == RNN_LSTM ? 4 : g->kind == RNN_GRU ? 3 : 1;
    g->nact = g->kind == RNN_LSTM ? 3 : g->kind == RNN_GRU ? 2 : 1;
    const af_tensor *x = nn_in(n, in, 0), *w = nn_in(n, in, 1), *r = nn_in(n, in, 2);
    if (!x || !w || !r)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing X, W or R");
    for (int i = 0; i < n->nin; i++)
        if (in[i] && i != 4 && (!nn_is_float(in[i]->dtype) || in[i]->dtype != x->dtype))
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "input %d is %s", i,
                                af_dtype_name(in[i]->dtype));
    const af_tensor *sl = nn_in(n, in, 4);
    if (sl && sl->dtype != AF_DTYPE_INT32 && sl->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "sequence_lens must be int32");
    const char *dir = af_attr_str(n, "direction", "forward");
    if (strcmp(dir, "forward") == 0 || strcmp(dir, "reverse") == 0) {
        g->ndir = 1;
        g->reverse = dir[0] == 'r';
    } else if (strcmp(dir, "bidirectional") == 0) {
        g->ndir = 2;
    } else {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "direction '%s'", dir);
    }
    g->layout = (int)af_attr_int(n, "layout", 0);
    if (g->layout != 0 && g->layout != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "layout must be 0 or 1");
    const af_attr *clip = af_node_attr(n, "clip");
    g->clip = clip ? clip->f : 0.0;
    if (x->rank >= 0 && x->rank != 3)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "X must be 3-D");
    g->seq = x->rank == 3 ? x->dims[g->layout ? 1 : 0] : -1;
    g->batch = x->rank == 3 ? x->dims[g->layout ? 0 : 1] : -1;
    g->input = x->rank == 3 ? x->dims[2] : -1;
    g->hidden = af_attr_int(n, "hidden_size", -1);
    if (g->hidden < 0 && r->rank == 3)
        g->hidden = r->dims[2];
    int64_t gh = -1;
    if (g->hidden >= 0 && !af_mul_i64(g->hidden, g->gates, &gh))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "hidden_size too large");
    int64_t wd[3] = {g->ndir, gh, g->input}, rd[3] = {g->ndir, gh, g->hidden};
    int64_t bd[2] = {g->ndir, gh >= 0 ? 2 * gh : -1}, pd[2] = {g->ndir, g->hidden >= 0 ? 3 * g->hidden : -1};
    int64_t hd[3] = {g->layout ? g->batch : g->ndir, g->layout ? g->ndir : g->batch, g->hidden};
    af_status st;
    if ((st = rnn_dims(n, w, "W", 3, wd, err)) != AF_OK ||
        (st = rnn_dims(n, r, "R", 3, rd, err)) != AF_OK ||
        (st = rnn_dims(n, nn_in(n, in, 3), "B", 2, bd, err)) != AF_OK ||
        (st = rnn_dims(n, sl, "sequence_lens", 1, &g->batch, err)) != AF_OK ||
        (st = rnn_dims(n, nn_in(n, in, 5), "initial_h", 3, hd, err)) != AF_OK)
        return st;
    if (g->kind == RNN_LSTM &&
        ((st = rnn_dims(n, nn_in(n, in, 6), "initial_c", 3, hd, err)) != AF_OK ||
         (st = rnn_dims(n, nn_in(n, in, 7), "P", 2, pd, err)) != AF_OK))
        return st;
    return rnn_acts(n, g, err);
}

af_status shape_rnn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                       af_error *err) {
    rnn_geom g;
    af_status st = rnn_prepare(n, in, &g, err);
    if (st != AF_OK)
        return st;
    af_dtype dt = in[0]->dtype;
    int64_t y[4] = {g.seq, g.ndir, g.batch, g.hidden}, yb[4] = {g.batch, g.seq, g.ndir, g.hidden};
    int64_t h[3] = {g.ndir, g.batch, g.hidden}, hb[3] = {g.batch, g.ndir, g.hidden};
    /* Omitted outputs get their type too: the executor allocates every slot. */
    if (n->nout > 0)
        af_tensor_set_type(&out[0], dt, 4, g.layout ? yb : y);
    for (int i = 1; i < (g.kind == RNN_LSTM ? 3 : 2) && i < n->nout; i++)
        af_tensor_set_type(&out[i], dt, 3, g.layout ? hb : h);
    return AF_OK;
}

/* Double copies of every operand and the state of one run. */
typedef struct rnn_data {
    double *x, *w, *r, *b, *p, *h0, *c0;
    int64_t *len;
    double *h, *c, *gate, *tmp; /* state [batch, hidden], gate pre-activations, scratch */
} rnn_data;

static void rnn_data_free(rnn_data *d) {
    af_free(d->x);
    af_free(d->w);
    af_free(d->r);
    af_free(d->b);
    af_free(d->p);
    af_free(d->h0);
    af_free(d->c0);
    af_free(d->len);
    af_free(d->h);
    af_free(d->c);
    af_free(d->gate);
    af_free(d->tmp);
}

static af_status rnn_load(const af_node *n, const af_tensor *const *in, const rnn_geom *g,
                          rnn_data *d, af_error *err) {
    memset(d, 0, sizeof(*d));
    for (int i = 0; i < n->nin; i++)
        if (in[i] && !af_tensor_known(in[i]))
            return af_node_fail(err, n, AF_ERR_INTERNAL, "input %d unknown at run time", i);
    af_status st = nn_load(n, in[0], &d->x, err);
    if (st == AF_OK)
        st = nn_load(n, in[1], &d->w, err);
    if (st == AF_OK)
        st = nn_load(n, in[2], &d->r, err);
    if (st == AF_OK && nn_in(n, in, 3))
        st = nn_load(n, in[3], &d->b, err);
    if (st == AF_OK && nn_in(n, in, 5))
        st = nn_load(n, in[5], &d->h0, err);
    if (st == AF_OK && g->kind == RNN_LSTM && nn_in(n, in, 6))
        st = nn_load(n, in[6], &d->c0, err);
    if (st == AF_OK && g->kind == RNN_LSTM && nn_in(n, in, 7))
        st = nn_load(n, in[7], &d->p, err);
    if (st != AF_OK)
        return st;
    int64_t bhn, ghn;
    if (!af_mul_i64(g->batch, g->hidden, &bhn) || !af_mul_i64(g->gates, g->hidden, &ghn))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "batch x hidden overflows");
    size_t bh = (size_t)bhn + 1;
    d->len = af_malloc((size_t)(g->batch + 1) * sizeof(int64_t));
    d->h = af_calloc(bh, sizeof(double));
    d->c = af_calloc(bh, sizeof(double));
    d->gate = af_calloc((size_t)ghn + 1, sizeof(double));
    d->tmp = af_calloc((size_t)(g->hidden + 1), sizeof(double));
    if (!d->len || !d->h || !d->c || !d->gate || !d->tmp)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    const af_tensor *sl = nn_in(n, in, 4);
    for (int64_t b = 0; b < g->batch; b++) {
        d->len[b] = sl ? nn_geti(sl, b) : g->seq;
        if (d->len[b] < 0 || d->len[b] > g->seq)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "sequence_lens[%lld] = %lld",
                                (long long)b, (long long)d->len[b]);
    }
    return AF_OK;
}

/* Index of state [dir, b, j] in the layout of initial_h and Y_h. */
static int64_t rnn_hidx(const rnn_geom *g, int dir, int64_t b, int64_t j) {
    return g->layout ? ((b * g->ndir + dir) * g->hidden + j)
                     : ((dir * g->batch + b) * g->hidden + j);
}

/* sum_k v[k] * m[row, k] for a row-major matrix with `cols` columns. */
static double rnn_dot(const double *v, const double *m, int64_t row, int64_t cols) {
    double s = 0.0;
    const double *mr = m + row * cols;
    for (int64_t k = 0; k < cols; k++)
        s += v[k] * mr[k];
    return s;
}

static double rnn_clip(const rnn_geom *g, double v) {
    return g->clip > 0.0 ? nn_clamp(v, -g->clip, g->clip) : v;
}

/* One time step of one batch entry: x is its input row, h (and c) its state, updated in place. */
static void rnn_step(const af_node *n, const rnn_geom *g, const rnn_data *d, int dir,
                     const double *x, double *h, double *c) {
    int64_t hs = g->hidden, gh = g->gates * hs;
    const double *w = d->w + dir * gh * g->input, *r = d->r + dir * gh * hs;
    const double *wb = d->b ? d->b + dir * 2 * gh : NULL, *rb = wb ? wb + gh : NULL;
    const rnn_act *act = &g->act[dir * g->nact];
    double *pre = d->gate, *nh = d->tmp;
    /* Pre-activations of every gate: x W^T + h R^T + Wb + Rb (GRU's h gate handled below). */
    for (int64_t q = 0; q < gh; q++) {
        pre[q] = rnn_dot(x, w, q, g->input) + (wb ? wb[q] : 0.0);
        if (!(g->kind == RNN_GRU && q >= 2 * hs))
            pre[q] += rnn_dot(h, r, q, hs) + (rb ? rb[q] : 0.0);
    }
    if (g->kind == RNN_SIMPLE) {
        for (int64_t j = 0; j < hs; j++)
            nh[j] = rnn_apply(&act[0], rnn_clip(g, pre[j]));
    } else if (g->kind == RNN_GRU) {
        bool lbr = af_attr_int(n, "linear_before_reset", 0) != 0;
        double *z = pre, *rg = pre + hs, *hh = pre + 2 * hs;
        for (int64_t j = 0; j < 2 * hs; j++)
            pre[j] = rnn_apply(&act[0], rnn_clip(g, pre[j]));
        for (int64_t j = 0; j < hs; j++) {
            double rec;
            if (lbr) {
                rec = rg[j] * (rnn_dot(h, r, 2 * hs + j, hs) + (rb ? rb[2 * hs + j] : 0.0));
            } else {
                /* (r .* h) R_h^T, one row at a time. */
                const double *rr = r + (2 * hs + j) * hs;
                rec = rb ? rb[2 * hs + j] : 0.0;
                for (int64_t k = 0; k < hs; k++)
                    rec += rg[k] * h[k] * rr[k];
            }
            nh[j] = rnn_apply(&act[1], rnn_clip(g, hh[j] + rec));
        }
        for (int64_t j = 0; j < hs; j++)
            nh[j] = (1.0 - z[j]) * nh[j] + z[j] * h[j];
    } else {
        const double *p = d->p ? d->p + dir * 3 * hs : NULL;
        bool couple = af_attr_int(n, "input_forget", 0) != 0;
        for (int64_t j = 0; j < hs; j++) {
            double ig = pre[j] + (p ? p[j] * c[j] : 0.0);
            double fg = pre[2 * hs + j] + (p ? p[2 * hs + j] * c[j] : 0.0);
            ig = rnn_apply(&act[0], rnn_clip(g, ig));
            fg = couple ? 1.0 - ig : rnn_apply(&act[0], rnn_clip(g, fg));
            double cg = rnn_apply(&act[1], rnn_clip(g, pre[3 * hs + j]));
            double cn = fg * c[j] + ig * cg;
            double og = pre[hs + j] + (p ? p[hs + j] * cn : 0.0);
            og = rnn_apply(&act[0], rnn_clip(g, og));
            c[j] = cn;
            nh[j] = og * rnn_apply(&act[2], cn);
        }
    }
    memcpy(h, nh, (size_t)hs * sizeof(double));
}

static af_status rnn_kernel(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    rnn_geom g;
    rnn_data d;
    af_status st = rnn_prepare(n, in, &g, err);
    if (st != AF_OK)
        return st;
    af_tensor *y = nn_out(n, out, 0), *yh = nn_out(n, out, 1);
    af_tensor *yc = g.kind == RNN_LSTM ? nn_out(n, out, 2) : NULL;
    int64_t yd[4] = {g.seq, g.ndir, g.batch, g.hidden}, ydb[4] = {g.batch, g.seq, g.ndir, g.hidden};
    int64_t hd[3] = {g.ndir, g.batch, g.hidden}, hdb[3] = {g.batch, g.ndir, g.hidden};
    if (y && (st = nn_check_out(n, y, 4, g.layout ? ydb : yd, err)) != AF_OK)
        return st;
    for (int i = 0; i < 2; i++) {
        af_tensor *t = i == 0 ? yh : yc;
        if (t && (st = nn_check_out(n, t, 3, g.layout ? hdb : hd, err)) != AF_OK)
            return st;
    }
    if ((st = rnn_load(n, in, &g, &d, err)) != AF_OK) {
        rnn_data_free(&d);
        return st;
    }
    if (y && y->data)
        memset(y->data, 0, y->nbytes); /* steps past a sequence's length stay zero */
    int64_t hs = g.hidden;
    for (int dir = 0; dir < g.ndir; dir++) {
        bool reverse = g.reverse || dir == 1;
        for (int64_t b = 0; b < g.batch; b++) {
            double *h = d.h + b * hs, *c = d.c + b * hs;
            for (int64_t j = 0; j < hs; j++) {
                h[j] = d.h0 ? d.h0[rnn_hidx(&g, dir, b, j)] : 0.0;
                c[j] = d.c0 ? d.c0[rnn_hidx(&g, dir, b, j)] : 0.0;
            }
            for (int64_t t = 0; t < d.len[b]; t++) {
                int64_t ti = reverse ? d.len[b] - 1 - t : t;
                const double *x = d.x + (g.layout ? (b * g.seq + ti) : (ti * g.batch + b)) * g.input;
                rnn_step(n, &g, &d, dir, x, h, c);
                for (int64_t j = 0; y && j < hs; j++) {
                    int64_t yi = g.layout ? ((b * g.seq + ti) * g.ndir + dir) * hs + j
                                          : ((ti * g.ndir + dir) * g.batch + b) * hs + j;
                    nn_put(y, yi, h[j]);
                }
            }
            for (int64_t j = 0; j < hs; j++) {
                if (yh)
                    nn_put(yh, rnn_hidx(&g, dir, b, j), h[j]);
                if (yc)
                    nn_put(yc, rnn_hidx(&g, dir, b, j), c[j]);
            }
        }
    }
    rnn_data_free(&d);
    return AF_OK;
}

af_status ref_rnn(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    return rnn_kernel(n, in, out, err);
}
af_status ref_gru(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *ex, af_error *err) {
    (void)ex;
    return rnn_kernel(n, in, out, err);
}
af_status ref_lstm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *ex, af_error *err) {
    (void)ex;
    return rnn_kernel(n, in, out, err);
}
