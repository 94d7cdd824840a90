/* Channels-last pooling (channels_last = 1, made by the layout pass): MaxPool and AveragePool
 * over 2-D windows without dilation, GlobalAveragePool and GlobalMaxPool, on X [N, H, W, C]
 * (float32), vectorised along the channels (vec.h), one output row per task.
 *
 * Invariant: the geometry comes from the same window code as the NCHW kernels (nn_window_init
 * on the NCHW view of X), so both layouts agree on output sizes, padding and ceil_mode. */
#include "kernels/ref/nn_common.h"
#include "kernels/fast/fast.h"
#include "kernels/simd/vec.h"

typedef struct pool_cl {
    nn_window w;
    int64_t n, h, wd, c;
    int max, include_pad;
} pool_cl;

static af_status cl_setup(const af_node *n, const af_tensor *const *in, bool global, int max,
                          pool_cl *p, af_tensor *y, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input X");
    if (x->dtype != AF_DTYPE_FLOAT || x->rank != 4 || n->nout != 1)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED,
                            "channels-last %s takes one 4-D float32 input and one output",
                            n->op_type);
    p->max = max;
    p->n = x->dims[0];
    p->h = x->dims[1];
    p->wd = x->dims[2];
    p->c = x->dims[3];
    int64_t dims[4] = {x->dims[0], 1, 1, x->dims[3]};
    if (!global) {
        const int64_t *ks = NULL, *dl = NULL;
        if (af_attr_ints(n, "kernel_shape", &ks) != 2)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "channels-last pooling is 2-D");
        int nd = af_attr_ints(n, "dilations", &dl);
        for (int i = 0; i < nd; i++)
            if (dl[i] != 1)
                return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "channels-last pooling with dilations");
        if (ks[0] < 1 || ks[1] < 1)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "bad kernel_shape");
        af_tensor xv = {x->dtype, 4, {x->dims[0], x->dims[3], x->dims[1], x->dims[2]}, NULL, 0, 0};
        af_status st = nn_window_init(n, &xv, ks, 2, af_attr_int(n, "ceil_mode", 0) != 0, &p->w, err);
        if (st != AF_OK) return st;
        dims[1] = p->w.out[1];
        dims[2] = p->w.out[2];
        p->include_pad = af_attr_int(n, "count_include_pad", 0) != 0;
    }
    af_tensor_set_type(y, AF_DTYPE_FLOAT, 4, dims);
    return AF_OK;
}

static af_status pool_cl_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                  bool global, int max, af_error *err) {
    pool_cl p;
    return cl_setup(n, in, global, max, &p, &out[0], err);
}

typedef struct pool_job {
    const pool_cl *p;
    const float *x;
    float *y;
    bool global;
} pool_job;

static void pool_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pool_job *j = ctx;
    const pool_cl *p = j->p;
    const af_vec_ops *v = af_vec();
    if (j->global) { /* one task per image: sum or max over its H * W rows of C */
        for (int64_t b = begin; b < end; b++) {
            float *y = j->y + b * p->c;
            v->reduce_rows(j->x + b * p->h * p->wd * p->c, p->h * p->wd, p->c, p->max, y);
            if (!p->max)
                for (int64_t c = 0; c < p->c; c++) y[c] /= (float)(p->h * p->wd);
        }
        return;
    }
    const nn_window *w = &p->w;
    for (int64_t r = begin; r < end; r++) {
        int64_t b = r / w->out[1], oh = r % w->out[1];
        af_pool_row row = {j->x + b * p->h * p->wd * p->c, p->h, p->wd, p->c,
                           w->k[1], w->k[2], w->s[1], w->s[2], w->pb[1], w->pb[2],
                           w->pe[1], w->pe[2], p->max, p->include_pad, oh, w->out[2],
                           j->y + r * w->out[2] * p->c};
        v->pool_row(&row);
    }
}

static af_status pool_cl_run(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                   bool global, int max, af_exec *ex, af_error *err) {
    pool_cl p;
    af_tensor t;
    af_status st = cl_setup(n, in, global, max, &p, &t, err);
    if (st == AF_OK) st = nn_check_out(n, &out[0], t.rank, t.dims, err);
    if (st != AF_OK) return st;
    if (!af_tensor_known(in[0]) || !in[0]->data)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input unknown at run time");
    if (global && p.h * p.wd == 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "global pooling over an empty image");
    pool_job j = {&p, in[0]->data, out[0].data, global};
    double taps = global ? 1.0 : (double)(p.w.k[1] * p.w.k[2]);
    double ns = af_exec_work_ns(ex, (double)af_tensor_numel(&out[0]) * taps,
                                4.0 * (double)(af_tensor_numel(in[0]) + af_tensor_numel(&out[0])));
    af_exec_parallel(ex, global ? p.n : p.n * t.dims[1], ns, pool_rows, &j);
    return AF_OK;
}

#define POOL_ENTRY(name, global, max)                                                             \
    af_status fast_shape_##name(const af_node *n, const af_tensor *const *in, af_tensor *out,     \
                                af_error *err) {                                                  \
        return pool_cl_shape(n, in, out, global, max, err);                                    \
    }                                                                                             \
    af_status fast_##name(const af_node *n, const af_tensor *const *in, af_tensor *out,           \
                          af_exec *ex, af_error *err) {                                           \
        return pool_cl_run(n, in, out, global, max, ex, err);                               \
    }
POOL_ENTRY(maxpool, false, 1)
POOL_ENTRY(avgpool, false, 0)
POOL_ENTRY(global_maxpool, true, 1)
POOL_ENTRY(global_avgpool, true, 0)
