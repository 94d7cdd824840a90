/* Neural-network kernel tests: Conv (groups, depthwise, dilations, strides, asymmetric pads,
 * every auto_pad, 1-D to 3-D) and ConvTranspose (output_padding, output_shape, groups,
 * auto_pad) against naive formulas written here from the ONNX spec, on small random tensors;
 * MatMul with 1-D operands and batch broadcasting; Gemm, Softmax across the opset 13 change,
 * pooling and LayerNormalization spot checks; shape inference with unknown dims; and the
 * rejection of inconsistent inputs with a status instead of a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "runtime/exec.h"
#include "kernels/fast/dispatch.h"
#include "kernels/ref/ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building and running one node ---------------------------------------------------------- */

#define MAXATTR 16

static af_node *mk(af_arena *a, int opset, const char *op, int nin, int nout) {
    af_graph *g = af_graph_new(a, "test_nn", NULL);
    assert_non_null(g);
    g->opsets = af_arena_calloc(a, 1, sizeof(af_opset));
    g->opsets[0].domain = "";
    g->opsets[0].version = opset;
    g->nopsets = 1;
    af_op id = af_op_lookup("", op);
    assert_int_not_equal(id, AF_OP_COUNT);
    af_node *n = af_node_new(g, id, op, nin, nout);
    assert_non_null(n);
    for (int i = 0; i < nin + nout; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%d", i);
        af_value *v = af_value_new(g, af_arena_strdup(a, name));
        if (i < nin)
            af_node_set_input(n, i, v);
        else
            af_node_set_output(n, i - nin, v);
    }
    n->attrs = af_arena_calloc(a, MAXATTR, sizeof(af_attr));
    return n;
}

static af_attr *add_attr(af_node *n, const char *name, af_attr_type t) {
    assert_true(n->nattrs < MAXATTR);
    af_attr *at = &n->attrs[n->nattrs++];
    at->name = name;
    at->type = t;
    return at;
}

static void set_int(af_node *n, const char *name, int64_t v) {
    add_attr(n, name, AF_ATTR_INT)->i = v;
}

static void set_float(af_node *n, const char *name, float v) {
    add_attr(n, name, AF_ATTR_FLOAT)->f = v;
}

static void set_str(af_node *n, const char *name, const char *v) {
    af_attr *at = add_attr(n, name, AF_ATTR_STRING);
    at->s = v;
    at->slen = strlen(v);
}

static void set_ints(af_node *n, const char *name, int count, const int64_t *v) {
    af_attr *at = add_attr(n, name, AF_ATTR_INTS);
    at->n = count;
    at->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    memcpy(at->ints, v, (size_t)count * sizeof(int64_t));
}

static af_tensor *rand_tensor(int rank, const int64_t *dims) {
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, rank, dims);
    assert_non_null(t);
    float *p = t->data;
    for (int64_t i = 0; i < af_tensor_numel(t); i++)
        p[i] = (float)tu_rnd();
    return t;
}

/* Shape function, allocation and kernel, as the executor does them. */
static af_status run(af_node *n, const af_tensor *const *in, af_tensor *out) {
    af_error err;
    for (int i = 0; i < n->nout; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].rank = -1;
    }
    af_status st = af_kernel_shape(n, in, out, &err);
    for (int i = 0; st == AF_OK && i < n->nout; i++)
        st = af_tensor_alloc(&out[i], &err);
    if (st == AF_OK)
        st = af_runtime_kernel(NULL, n, in, out, &err);
    if (st != AF_OK)
        assert_non_null(strstr(err.message, n->op_type)); /* messages name the node */
    return st;
}

static void release(af_tensor *out, int n) {
    for (int i = 0; i < n; i++)
        af_tensor_release(&out[i]);
}

static void check_dims(const af_tensor *t, int rank, const int64_t *dims) {
    assert_int_equal(t->rank, rank);
    for (int i = 0; i < rank; i++)
        assert_int_equal(t->dims[i], dims[i]);
}

static void check_close(const af_tensor *y, const double *expect, double tol) {
    const float *p = y->data;
    for (int64_t i = 0; i < af_tensor_numel(y); i++)
        if (fabs(p[i] - expect[i]) > tol) {
            fprintf(stderr, "element %lld: got %.7g expected %.7g\n", (long long)i, p[i],
                    expect[i]);
            fail();
        }
}

/* ---- Conv against the naive formula ----------------------------------------------------------- */

typedef struct conv_cfg {
    const char *name;
    int nsp;
    int64_t batch, c, m, group;
    int64_t in[3], k[3], s[3], d[3], pads[6];
    const char *auto_pad; /* NULL: NOTSET with pads */
    bool bias;
} conv_cfg;

static const conv_cfg conv_cfgs[] = {
    {"2-D padded", 2, 2, 3, 4, 1, {7, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, NULL, true},
    {"2-D groups, dilation, asymmetric pads", 2, 1, 4, 6, 2, {8, 7}, {3, 2}, {2, 1}, {1, 2},
     {0, 1, 2, 0}, NULL, false},
    {"depthwise x2", 2, 1, 4, 8, 4, {6, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, NULL, true},
    {"1-D strided dilated", 1, 2, 2, 3, 1, {10}, {3}, {3}, {2}, {2, 1}, NULL, true},
    {"3-D grouped", 3, 1, 2, 2, 2, {4, 5, 3}, {2, 3, 2}, {1, 2, 1}, {2, 1, 1}, {0, 1, 1, 1, 0, 0},
     NULL, true},
    {"SAME_UPPER", 2, 1, 2, 3, 1, {7, 5}, {4, 3}, {2, 2}, {1, 1}, {0}, "SAME_UPPER", true},
    {"SAME_LOWER", 2, 1, 2, 3, 1, {7, 5}, {4, 3}, {2, 2}, {1, 1}, {0}, "SAME_LOWER", false},
    {"VALID", 2, 1, 3, 2, 1, {7, 5}, {3, 2}, {2, 3}, {1, 1}, {0}, "VALID", true},
    {"1x1 strided", 2, 1, 5, 3, 1, {5, 5}, {1, 1}, {2, 2}, {1, 1}, {0}, NULL, false},
};

/* Per-dim output size and begin padding, from the ONNX spec formulas. */
static void conv_expect_geom(const conv_cfg *c, int64_t *out, int64_t *pb) {
    for (int i = 0; i < c->nsp; i++) {
        int64_t dk = (c->k[i] - 1) * c->d[i] + 1, in = c->in[i], s = c->s[i];
        if (!c->auto_pad) {
            pb[i] = c->pads[i];
            out[i] = (in + c->pads[i] + c->pads[c->nsp + i] - dk) / s + 1;
        } else if (!strcmp(c->auto_pad, "VALID")) {
            pb[i] = 0;
            out[i] = (in - dk) / s + 1;
        } else {
            out[i] = (in + s - 1) / s;
            int64_t total = (out[i] - 1) * s + dk - in;
            if (total < 0)
                total = 0;
            pb[i] = !strcmp(c->auto_pad, "SAME_UPPER") ? total / 2 : (total + 1) / 2;
        }
    }
}

/* y[b, m, o...] = bias[m] + sum over c in m's group and kernel taps of x * w. */
static double *conv_naive(const conv_cfg *c, const float *x, const float *w, const float *b,
                          const int64_t *out, const int64_t *pb, int64_t *total) {
    int64_t osz = 1, ksz = 1, isz = 1;
    for (int i = 0; i < c->nsp; i++) {
        osz *= out[i];
        ksz *= c->k[i];
        isz *= c->in[i];
    }
    int64_t cg = c->c / c->group, mg = c->m / c->group;
    *total = c->batch * c->m * osz;
    double *y = calloc((size_t)*total, sizeof(double));
    for (int64_t yi = 0; yi < *total; yi++) {
        int64_t r = yi, o[3];
        for (int i = c->nsp - 1; i >= 0; i--) {
            o[i] = r % out[i];
            r /= out[i];
        }
        int64_t m = r % c->m, bb = r / c->m;
        double acc = b ? b[m] : 0.0;
        for (int64_t cc = 0; cc < cg; cc++)
            for (int64_t kf = 0; kf < ksz; kf++) {
                int64_t kr = kf, xoff = 0;
                bool inside = true;
                int64_t kk[3];
                for (int i = c->nsp - 1; i >= 0; i--) {
                    kk[i] = kr % c->k[i];
                    kr /= c->k[i];
                }
                for (int i = 0; i < c->nsp; i++) {
                    int64_t p = o[i] * c->s[i] - pb[i] + kk[i] * c->d[i];
                    inside = inside && p >= 0 && p < c->in[i];
                    xoff = xoff * c->in[i] + p;
                }
                if (!inside)
                    continue;
                int64_t ch = (m / mg) * cg + cc;
                acc += (double)x[(bb * c->c + ch) * isz + xoff] * w[(m * cg + cc) * ksz + kf];
            }
        y[yi] = acc;
    }
    return y;
}

static void test_conv_naive(void **state) {
    (void)state;
    for (size_t ci = 0; ci < AF_COUNT(conv_cfgs); ci++) {
        const conv_cfg *c = &conv_cfgs[ci];
        af_arena *a = af_arena_new();
        af_node *n = mk(a, 17, "Conv", c->bias ? 3 : 2, 1);
        int64_t xd[5] = {c->batch, c->c}, wd[5] = {c->m, c->c / c->group}, bd[1] = {c->m};
        for (int i = 0; i < c->nsp; i++) {
            xd[2 + i] = c->in[i];
            wd[2 + i] = c->k[i];
        }
        af_tensor *x = rand_tensor(c->nsp + 2, xd), *w = rand_tensor(c->nsp + 2, wd);
        af_tensor *b = c->bias ? rand_tensor(1, bd) : NULL;
        if (c->group != 1)
            set_int(n, "group", c->group);
        set_ints(n, "strides", c->nsp, c->s);
        set_ints(n, "dilations", c->nsp, c->d);
        if (c->auto_pad)
            set_str(n, "auto_pad", c->auto_pad);
        else
            set_ints(n, "pads", 2 * c->nsp, c->pads);
        if (ci % 2)
            set_ints(n, "kernel_shape", c->nsp, c->k); /* else inferred from W */
        const af_tensor *in[3] = {x, w, b};
        af_tensor out[1];
        fprintf(stderr, "conv case: %s\n", c->name);
        assert_int_equal(run(n, in, out), AF_OK);
        int64_t o[3], pb[3], total, yd[5] = {c->batch, c->m};
        conv_expect_geom(c, o, pb);
        for (int i = 0; i < c->nsp; i++)
            yd[2 + i] = o[i];
        check_dims(&out[0], c->nsp + 2, yd);
        double *expect = conv_naive(c, x->data, w->data, b ? b->data : NULL, o, pb, &total);
        assert_int_equal(af_tensor_numel(&out[0]), total);
        check_close(&out[0], expect, 1e-4);
        free(expect);
        release(out, 1);
        af_tensor_free(x);
        af_tensor_free(w);
        af_tensor_free(b);
        af_arena_free(a);
    }
}

/* ---- ConvTranspose against the naive scatter ------------------------------------------------- */

typedef struct convt_cfg {
    const char *name;
    int nsp;
    int64_t c, mg, group;
    int64_t in[2], k[2], s[2], d[2], pads[4], op[2];
    int64_t oshape[2]; /* 0: not given */
    const char *auto_pad;
    int64_t expect_out[2];
} convt_cfg;

static const convt_cfg convt_cfgs[] = {
    /* out = s*(in-1) + output_padding + dk - pads: 2*2+1+3-1-0 = 7, 3*3+2+2-0-1 = 12 */
    {"pads and output_padding", 2, 2, 3, 1, {3, 4}, {3, 2}, {2, 3}, {1, 1}, {1, 0, 0, 1}, {1, 2},
     {0}, NULL, {7, 12}},
    /* full 7 x 11; output_shape 6 x 10 takes one unit of padding, at the beginning */
    {"output_shape", 2, 2, 3, 1, {3, 4}, {3, 2}, {2, 3}, {1, 1}, {0}, {0}, {6, 10}, NULL, {6, 10}},
    {"groups and dilation", 2, 4, 1, 2, {3, 3}, {2, 2}, {1, 2}, {2, 1}, {0}, {0}, {0}, NULL,
     {5, 6}},
    {"1-D SAME_UPPER", 1, 1, 2, 1, {4}, {3}, {2}, {1}, {0}, {0}, {0}, "SAME_UPPER", {8}},
};

static void test_conv_transpose(void **state) {
    (void)state;
    for (size_t ci = 0; ci < AF_COUNT(convt_cfgs); ci++) {
        const convt_cfg *c = &convt_cfgs[ci];
        af_arena *a = af_arena_new();
        af_node *n = mk(a, 17, "ConvTranspose", 3, 1);
        int nsp = c->nsp;
        int64_t m = c->mg * c->group;
        int64_t xd[4] = {1, c->c}, wd[4] = {c->c, c->mg}, bd[1] = {m};
        for (int i = 0; i < nsp; i++) {
            xd[2 + i] = c->in[i];
            wd[2 + i] = c->k[i];
        }
        af_tensor *x = rand_tensor(nsp + 2, xd), *w = rand_tensor(nsp + 2, wd), *b = rand_tensor(1, bd);
        set_int(n, "group", c->group);
        set_ints(n, "strides", nsp, c->s);
        set_ints(n, "dilations", nsp, c->d);
        set_ints(n, "pads", 2 * nsp, c->pads);
        set_ints(n, "output_padding", nsp, c->op);
        if (c->oshape[0])
            set_ints(n, "output_shape", nsp, c->oshape);
        if (c->auto_pad)
            set_str(n, "auto_pad", c->auto_pad);
        const af_tensor *in[3] = {x, w, b};
        af_tensor out[1];
        fprintf(stderr, "convtranspose case: %s\n", c->name);
        assert_int_equal(run(n, in, out), AF_OK);
        int64_t yd[4] = {1, m, c->expect_out[0], c->expect_out[1]};
        check_dims(&out[0], nsp + 2, yd);
        /* Scatter into the full extent, then crop at the begin padding the spec derives. */
        int64_t full[2] = {1, 1}, pb[2] = {0, 0}, o[2] = {1, 1}, in2[2] = {1, 1}, k2[2] = {1, 1};
        int64_t s2[2] = {1, 1}, d2[2] = {1, 1};
        for (int i = 0; i < nsp; i++) {
            int j = 2 - nsp + i;
            in2[j] = c->in[i];
            k2[j] = c->k[i];
            s2[j] = c->s[i];
            d2[j] = c->d[i];
            o[j] = c->expect_out[i];
            full[j] = c->s[i] * (c->in[i] - 1) + c->op[i] + (c->k[i] - 1) * c->d[i] + 1;
            int64_t total = full[j] - o[j];
            if (c->oshape[0] || c->auto_pad)
                pb[j] = c->auto_pad && !strcmp(c->auto_pad, "SAME_UPPER") ? total / 2
                                                                          : total - total / 2;
            else
                pb[j] = c->pads[i];
        }
        int64_t cg = c->c / c->group;
        double *yfull = calloc((size_t)(m * full[0] * full[1]), sizeof(double));
        const float *xv = x->data, *wv = w->data, *bv = b->data;
        for (int64_t ch = 0; ch < c->c; ch++)
            for (int64_t mm = 0; mm < c->mg; mm++)
                for (int64_t i0 = 0; i0 < in2[0]; i0++)
                    for (int64_t i1 = 0; i1 < in2[1]; i1++)
                        for (int64_t k0 = 0; k0 < k2[0]; k0++)
                            for (int64_t k1 = 0; k1 < k2[1]; k1++) {
                                int64_t p0 = i0 * s2[0] + k0 * d2[0], p1 = i1 * s2[1] + k1 * d2[1];
                                int64_t oc = (ch / cg) * c->mg + mm;
                                yfull[(oc * full[0] + p0) * full[1] + p1] +=
                                    (double)xv[(ch * in2[0] + i0) * in2[1] + i1] *
                                    wv[((ch * c->mg + mm) * k2[0] + k0) * k2[1] + k1];
                            }
        double *expect = calloc((size_t)(m * o[0] * o[1]), sizeof(double));
        for (int64_t oc = 0; oc < m; oc++)
            for (int64_t y0 = 0; y0 < o[0]; y0++)
                for (int64_t y1 = 0; y1 < o[1]; y1++) {
                    int64_t f0 = y0 + pb[0], f1 = y1 + pb[1];
                    double v = f0 < full[0] && f1 < full[1] ? yfull[(oc * full[0] + f0) * full[1] + f1] : 0.0;
                    expect[(oc * o[0] + y0) * o[1] + y1] = v + bv[oc];
                }
        check_close(&out[0], expect, 1e-4);
        free(yfull);
        free(expect);
        release(out, 1);
        af_tensor_free(x);
        af_tensor_free(w);
        af_tensor_free(b);
        af_arena_free(a);
    }
}

/* ---- MatMul: numpy semantics ------------------------------------------------------------------ */

typedef struct mm_cfg {
    int ra, rb;
    int64_t a[4], b[4];
    int ry;
    int64_t y[4];
} mm_cfg;

static const mm_cfg mm_cfgs[] = {
    {1, 1, {3}, {3}, 0, {0}},                                  /* dot product: a scalar */
    {1, 3, {3}, {2, 3, 4}, 2, {2, 4}},                         /* 1-D A: prepend 1, then drop */
    {4, 1, {2, 1, 2, 3}, {3}, 3, {2, 1, 2}},                   /* 1-D B: append 1, then drop */
    {4, 3, {2, 1, 3, 4}, {5, 4, 2}, 4, {2, 5, 3, 2}},          /* batch broadcast both ways */
    {2, 3, {3, 4}, {2, 4, 1}, 3, {2, 3, 1}},                   /* 2-D A against a batch */
};

static void test_matmul_broadcast(void **state) {
    (void)state;
    for (size_t ci = 0; ci < AF_COUNT(mm_cfgs); ci++) {
        const mm_cfg *c = &mm_cfgs[ci];
        af_arena *a = af_arena_new();
        af_node *n = mk(a, 13, "MatMul", 2, 1);
        af_tensor *ta = rand_tensor(c->ra, c->a), *tb = rand_tensor(c->rb, c->b);
        const af_tensor *in[2] = {ta, tb};
        af_tensor out[1];
        assert_int_equal(run(n, in, out), AF_OK);
        check_dims(&out[0], c->ry, c->y);
        /* Promote to [batch..., M, K] x [batch..., K, N] over a common batch rank of 2. */
        int64_t ad[4] = {1, 1, 1, 1}, bd[4] = {1, 1, 1, 1};
        if (c->ra == 1) {
            ad[3] = c->a[0];
        } else {
            for (int i = 0; i < c->ra; i++)
                ad[4 - c->ra + i] = c->a[i];
        }
        if (c->rb == 1) {
            bd[2] = c->b[0];
        } else {
            for (int i = 0; i < c->rb; i++)
                bd[4 - c->rb + i] = c->b[i];
        }
        int64_t b0 = ad[0] > bd[0] ? ad[0] : bd[0], b1 = ad[1] > bd[1] ? ad[1] : bd[1];
        int64_t M = ad[2], K = ad[3], N = bd[3];
        const float *av = ta->data, *bv = tb->data;
        double *expect = calloc((size_t)(b0 * b1 * M * N), sizeof(double));
        for (int64_t i0 = 0; i0 < b0; i0++)
            for (int64_t i1 = 0; i1 < b1; i1++)
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0.0;
                        int64_t ab = (ad[0] == 1 ? 0 : i0) * ad[1] + (ad[1] == 1 ? 0 : i1);
                        int64_t bb = (bd[0] == 1 ? 0 : i0) * bd[1] + (bd[1] == 1 ? 0 : i1);
                        for (int64_t k = 0; k < K; k++)
                            s += (double)av[(ab * M + i) * K + k] * bv[(bb * K + k) * N + j];
                        expect[((i0 * b1 + i1) * M + i) * N + j] = s;
                    }
        assert_int_equal(af_tensor_numel(&out[0]), b0 * b1 * M * N);
        check_close(&out[0], expect, 1e-5);
        free(expect);
        release(out, 1);
        af_tensor_free(ta);
        af_tensor_free(tb);
        af_arena_free(a);
    }
}

static void test_matmul_int64(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *n = mk(a, 13, "MatMul", 2, 1);
    int64_t ad[2] = {1, 2}, bd[2] = {2, 1};
    af_tensor *ta = af_tensor_new(AF_DTYPE_INT64, 2, ad), *tb = af_tensor_new(AF_DTYPE_INT64, 2, bd);
    int64_t *av = ta->data, *bv = tb->data;
    av[0] = (int64_t)1 << 40; /* the product needs more than double's 53 bits */
    av[1] = 3;
    bv[0] = ((int64_t)1 << 20) + 1;
    bv[1] = 5;
    const af_tensor *in[2] = {ta, tb};
    af_tensor out[1];
    assert_int_equal(run(n, in, out), AF_OK);
    assert_int_equal(((int64_t *)out[0].data)[0], (((int64_t)1 << 60) + ((int64_t)1 << 40) + 15));
    release(out, 1);
    af_tensor_free(ta);
    af_tensor_free(tb);
    af_arena_free(a);
}

/* ---- Gemm, Softmax, pooling, LayerNormalization ------------------------------------------------ */

static af_tensor *f32(int rank, const int64_t *dims, const float *v) {
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, rank, dims);
    memcpy(t->data, v, t->nbytes);
    return t;
}

static void test_gemm_trans_broadcast(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *n = mk(a, 13, "Gemm", 3, 1);
    set_int(n, "transA", 1);
    set_int(n, "transB", 1);
    set_float(n, "alpha", 2.0f);
    set_float(n, "beta", 0.5f);
    /* A^T = [[1,2,3],[4,5,6]], B^T = [[1,0],[0,1],[1,1]], C = [10, 20] per column. */
    int64_t ad[2] = {3, 2}, bd[2] = {2, 3}, cd[1] = {2};
    af_tensor *ta = f32(2, ad, (float[]){1, 4, 2, 5, 3, 6});
    af_tensor *tb = f32(2, bd, (float[]){1, 0, 1, 0, 1, 1});
    af_tensor *tc = f32(1, cd, (float[]){10, 20});
    const af_tensor *in[3] = {ta, tb, tc};
    af_tensor out[1];
    assert_int_equal(run(n, in, out), AF_OK);
    int64_t yd[2] = {2, 2};
    check_dims(&out[0], 2, yd);
    check_close(&out[0], (double[]){2 * 4 + 5, 2 * 5 + 10, 2 * 10 + 5, 2 * 11 + 10}, 1e-6);
    release(out, 1);
    af_tensor_free(ta);
    af_tensor_free(tb);
    af_tensor_free(tc);
    af_arena_free(a);
}

/* Before opset 13, Softmax normalises the flattened [d0, d1*d2] rows; from 13, axis 1 only. */
static void test_softmax_opsets(void **state) {
    (void)state;
    int64_t xd[3] = {1, 2, 2};
    af_tensor *x = f32(3, xd, (float[]){0, 1, 2, 3});
    for (int opset = 11; opset <= 13; opset += 2) {
        af_arena *a = af_arena_new();
        af_node *n = mk(a, opset, "Softmax", 1, 1);
        set_int(n, "axis", 1);
        const af_tensor *in[1] = {x};
        af_tensor out[1];
        assert_int_equal(run(n, in, out), AF_OK);
        double e[4];
        if (opset < 13) {
            double s = 1 + exp(1) + exp(2) + exp(3);
            for (int i = 0; i < 4; i++)
                e[i] = exp(i) / s;
        } else {
            /* columns {0, 2} and {1, 3} */
            e[0] = 1 / (1 + exp(2));
            e[2] = exp(2) / (1 + exp(2));
            e[1] = exp(1) / (exp(1) + exp(3));
            e[3] = exp(3) / (exp(1) + exp(3));
        }
        check_close(&out[0], e, 1e-6);
        release(out, 1);
        af_arena_free(a);
    }
    af_tensor_free(x);
}

static void test_pool_ceil_and_indices(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *n = mk(a, 12, "MaxPool", 1, 2);
    set_ints(n, "kernel_shape", 2, (int64_t[]){2, 2});
    set_ints(n, "strides", 2, (int64_t[]){2, 2});
    set_int(n, "ceil_mode", 1);
    int64_t xd[4] = {1, 1, 3, 3};
    af_tensor *x = f32(4, xd, (float[]){1, 9, 2, 3, 4, 8, 7, 5, 6});
    const af_tensor *in[1] = {x};
    af_tensor out[2];
    assert_int_equal(run(n, in, out), AF_OK);
    int64_t yd[4] = {1, 1, 2, 2};
    check_dims(&out[0], 4, yd);
    check_close(&out[0], (double[]){9, 8, 7, 6}, 0);
    const int64_t *idx = out[1].data;
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 5);
    assert_int_equal(idx[2], 6);
    assert_int_equal(idx[3], 8);
    release(out, 2);

    /* AveragePool: count_include_pad divides the corner window by 4, not by 1. */
    af_node *p = mk(a, 11, "AveragePool", 1, 1);
    set_ints(p, "kernel_shape", 2, (int64_t[]){2, 2});
    set_ints(p, "pads", 4, (int64_t[]){1, 1, 0, 0});
    set_ints(p, "strides", 2, (int64_t[]){2, 2});
    set_int(p, "count_include_pad", 1);
    assert_int_equal(run(p, in, out), AF_OK);
    check_close(&out[0], (double[]){1.0 / 4, (9 + 2) / 4.0, (3 + 7) / 4.0, (4 + 8 + 5 + 6) / 4.0},
                1e-6);
    release(out, 1);
    af_tensor_free(x);
    af_arena_free(a);
}

static void test_layernorm_stats(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *n = mk(a, 17, "LayerNormalization", 3, 3);
    set_float(n, "epsilon", 0.0f);
    int64_t xd[2] = {2, 2}, sd[1] = {2};
    af_tensor *x = f32(2, xd, (float[]){1, 3, 2, 4});
    af_tensor *s = f32(1, sd, (float[]){1, 2}), *b = f32(1, sd, (float[]){0, 1});
    const af_tensor *in[3] = {x, s, b};
    af_tensor out[3];
    assert_int_equal(run(n, in, out), AF_OK);
    int64_t md[2] = {2, 1};
    check_dims(&out[1], 2, md);
    check_close(&out[0], (double[]){-1, 3, -1, 3}, 1e-6);
    check_close(&out[1], (double[]){2, 3}, 1e-6);
    check_close(&out[2], (double[]){1, 1}, 1e-6);
    release(out, 3);
    af_tensor_free(x);
    af_tensor_free(s);
    af_tensor_free(b);
    af_arena_free(a);
}

/* ---- compile-time shapes and bad inputs ---------------------------------------------------- */

static void test_conv_shape_unknown_dims(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_node *n = mk(a, 17, "Conv", 2, 1);
    set_ints(n, "strides", 2, (int64_t[]){2, 2});
    set_str(n, "auto_pad", "SAME_UPPER");
    af_tensor x = {.dtype = AF_DTYPE_FLOAT, .rank = 4, .dims = {-1, 3, -1, 9}};
    af_tensor w = {.dtype = AF_DTYPE_FLOAT, .rank = 4, .dims = {8, 3, 3, 3}};
    const af_tensor *in[2] = {&x, &w};
    af_tensor out[1] = {{.rank = -1}};
    af_error err;
    assert_int_equal(af_kernel_shape(n, in, out, &err), AF_OK);
    check_dims(&out[0], 4, (int64_t[]){-1, 8, -1, 5});
    /* Unknown rank stays unknown. */
    x.rank = -1;
    w.rank = -1;
    assert_int_equal(af_kernel_shape(n, in, out, &err), AF_OK);
    assert_int_equal(out[0].rank, -1);
    af_arena_free(a);
}

static void test_bad_inputs(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    af_tensor out[1] = {{.rank = -1}};
    /* Conv: W expects 2 channels per group, X has 3. */
    af_node *n = mk(a, 17, "Conv", 2, 1);
    af_tensor x = {.dtype = AF_DTYPE_FLOAT, .rank = 4, .dims = {1, 3, 5, 5}};
    af_tensor w = {.dtype = AF_DTYPE_FLOAT, .rank = 4, .dims = {4, 2, 3, 3}};
    const af_tensor *in[2] = {&x, &w};
    assert_int_equal(af_kernel_shape(n, in, out, &err), AF_ERR_INVALID_MODEL);
    /* Kernel larger than the padded input. */
    w.dims[1] = 3;
    w.dims[2] = 9;
    assert_int_equal(af_kernel_shape(n, in, out, &err), AF_ERR_INVALID_MODEL);
    /* Huge dilation: the extent overflows and is rejected, not wrapped. */
    w.dims[2] = 3;
    set_ints(n, "dilations", 2, (int64_t[]){INT64_MAX / 2, 1});
    assert_int_equal(af_kernel_shape(n, in, out, &err), AF_ERR_INVALID_MODEL);
    /* MatMul: inner dims differ. */
    af_node *m = mk(a, 13, "MatMul", 2, 1);
    af_tensor ma = {.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {2, 3}};
    af_tensor mb = {.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {4, 2}};
    const af_tensor *min[2] = {&ma, &mb};
    assert_int_equal(af_kernel_shape(m, min, out, &err), AF_ERR_INVALID_MODEL);
    /* Batch dims that do not broadcast. */
    af_tensor ba = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {2, 2, 3}};
    af_tensor bb = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {3, 3, 2}};
    const af_tensor *bin[2] = {&ba, &bb};
    assert_int_equal(af_kernel_shape(m, bin, out, &err), AF_ERR_INVALID_MODEL);
    /* BatchNormalization in training mode is refused, not run wrongly. */
    af_node *bn = mk(a, 15, "BatchNormalization", 5, 1);
    set_int(bn, "training_mode", 1);
    af_tensor bx = {.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {2, 3}};
    af_tensor bp = {.dtype = AF_DTYPE_FLOAT, .rank = 1, .dims = {3}};
    const af_tensor *bnin[5] = {&bx, &bp, &bp, &bp, &bp};
    assert_int_equal(af_kernel_shape(bn, bnin, out, &err), AF_ERR_UNSUPPORTED);
    /* MaxUnpool: an index outside the output is a runtime error. */
    af_node *u = mk(a, 11, "MaxUnpool", 2, 1);
    set_ints(u, "kernel_shape", 2, (int64_t[]){2, 2});
    set_ints(u, "strides", 2, (int64_t[]){2, 2});
    int64_t ud[4] = {1, 1, 1, 1};
    af_tensor *ux = f32(4, ud, (float[]){1});
    af_tensor *ui = af_tensor_new(AF_DTYPE_INT64, 4, ud);
    ((int64_t *)ui->data)[0] = 4;
    const af_tensor *uin[2] = {ux, ui};
    af_tensor uout[1];
    assert_int_equal(run(u, uin, uout), AF_ERR_RUNTIME);
    release(uout, 1);
    af_tensor_free(ux);
    af_tensor_free(ui);
    af_arena_free(a);
}

int main(void) {
    tu_rng = 12345;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_naive),
        cmocka_unit_test(test_conv_transpose),
        cmocka_unit_test(test_matmul_broadcast),
        cmocka_unit_test(test_matmul_int64),
        cmocka_unit_test(test_gemm_trans_broadcast),
        cmocka_unit_test(test_softmax_opsets),
        cmocka_unit_test(test_pool_ceil_and_indices),
        cmocka_unit_test(test_layernorm_stats),
        cmocka_unit_test(test_conv_shape_unknown_dims),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
