/* MultiHeadAttentionFusionOp and the FusedAttention kernel.
 *
 * Kernel: FusedAttention nodes built by hand (BERT's [B,S,E] rows, torchvision's packed
 * [S,B,3E] read through column offsets, mixed row orders, cross attention over several key
 * blocks, fully masked blocks and rows) against attention written out here in double from its
 * definition; shape inference with unknown dims; hostile attributes and inputs refused with a
 * status.
 * Rule: the models of gen_attention_models.py (in $AF_ATTN_MODELS) imported twice, one copy fused
 * with only this rule enabled: the exact FusedAttention count, a valid graph, the near miss's
 * reason when it must not fire, and fused-vs-unfused outputs within rtol 1e-4.
 * Lowering: the same models through the whole pipeline (every rule, then af_lower): separate Q,
 * K and V projections of one input become one packed GEMM the attention reads at column
 * offsets {0, E, 2E}; outputs against the unfused model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#include "fusion/fusion.h"
#include "driver/compile.h"
#include "runtime/machine.h"
#include "kernels/fast/dispatch.h"
#include "kernels/ref/ref.h"
#include "onnx/onnx.h"
#include "passes/passes.h"
#include "runtime/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hand-built FusedAttention nodes ------------------------------------------------------------ */

typedef struct geom {
    int64_t B, H, D, Sq, Sk;
    int layout[4];     /* q, k, v, out: 0 [B,S,..], 1 [S,B,..], 2 [B,H,S,D] (q, k, v) */
    int64_t width[3];  /* last dim of q, k, v */
    int64_t col[3];    /* first column of head 0 */
    int out_rank;
    bool merged;       /* mask against [B*H, Sq, Sk] */
    float scale;
    int keep_rank;     /* a keep mask (bool) of these dims when > 0 */
    int64_t keep_dims[4];
    float fill;        /* the score where keep is false */
} geom;

static af_tensor *rand_tensor(int rank, const int64_t *dims) {
    af_tensor *t = af_tensor_new(AF_DTYPE_FLOAT, rank, dims);
    assert_non_null(t);
    float *p = t->data;
    for (int64_t i = 0; i < af_tensor_numel(t); i++) p[i] = (float)tu_rnd();
    return t;
}

static void set_ints(af_node *n, const char *name, const int64_t *v, int count) {
    af_attr *a = af_node_add_attr(n, name, AF_ATTR_INTS);
    assert_non_null(a);
    a->ints = af_arena_calloc(n->graph->arena, (size_t)count + 1, sizeof(int64_t));
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)count);
    a->n = count;
}

static af_node *fa_node(af_arena *a, const geom *g, int nin) {
    af_graph *gr = af_graph_new(a, "test_attention", NULL);
    af_node *n = af_node_new(gr, AF_OP_FUSED_ATTENTION, "attn", nin, 1);
    assert_non_null(n);
    n->domain = AF_DOMAIN;
    af_node_add_attr(n, "num_heads", AF_ATTR_INT)->i = g->H;
    af_node_add_attr(n, "head_dim", AF_ATTR_INT)->i = g->D;
    af_node_add_attr(n, "scale", AF_ATTR_FLOAT)->f = g->scale;
    af_node_add_attr(n, "out_rank", AF_ATTR_INT)->i = g->out_rank;
    af_node_add_attr(n, "heads_merged", AF_ATTR_INT)->i = g->merged;
    int64_t lay[4] = {g->layout[0], g->layout[1], g->layout[2], g->layout[3]};
    set_ints(n, "layout", lay, 4);
    set_ints(n, "offsets", g->col, 3);
    if (g->keep_rank) af_node_add_attr(n, "fill", AF_ATTR_FLOAT)->f = g->fill;
    return n;
}

/* Dims of q (i = 0) or k/v for the geometry's row order; the rank (3, or 4 head-major). */
static int in_dims(const geom *g, int i, int64_t *d) {
    int64_t S = i == 0 ? g->Sq : g->Sk;
    if (g->layout[i] == 2) {
        d[0] = g->B, d[1] = g->H, d[2] = S, d[3] = g->D;
        return 4;
    }
    d[0] = g->layout[i] ? S : g->B;
    d[1] = g->layout[i] ? g->B : S;
    d[2] = g->width[i];
    return 3;
}

/* x[b, s, h, d] of input i, from the definition of the layout. */
static double at(const geom *g, const af_tensor *t, int i, int64_t b, int64_t s, int64_t h,
                 int64_t d) {
    if (g->layout[i] == 2)
        return ((const float *)t->data)[((b * g->H + h) * t->dims[2] + s) * g->D + d];
    int64_t row = g->layout[i] ? s * g->B + b : b * t->dims[1] + s;
    return ((const float *)t->data)[row * g->width[i] + g->col[i] + h * g->D + d];
}

static int64_t mask_off(const geom *g, const af_tensor *m, int64_t b, int64_t h, int64_t i,
                        int64_t j) {
    int64_t full[4] = {b, h, i, j}, merged[3] = {b * g->H + h, i, j};
    const int64_t *idx = g->merged ? merged : full;
    int trank = g->merged ? 3 : 4;
    int64_t off = 0;
    for (int a = 0; a < m->rank; a++) {
        int64_t k = m->dims[a] == 1 ? 0 : idx[trank - m->rank + a];
        off = off * m->dims[a] + k;
    }
    return off;
}

static double mask_at(const geom *g, const af_tensor *m, int64_t b, int64_t h, int64_t i,
                      int64_t j) {
    return af_tensor_get_double(m, mask_off(g, m, b, h, i, j));
}

/* Attention from its definition, in double: softmax over all keys at once. */
static void reference(const geom *g, const af_tensor *const *in, const af_tensor *mask,
                      const af_tensor *keep, double *out) {
    int64_t E = g->H * g->D;
    double *sc = malloc(sizeof(double) * (size_t)g->Sk);
    assert_non_null(sc);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h++)
            for (int64_t i = 0; i < g->Sq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < g->Sk; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < g->D; d++)
                        dot += at(g, in[0], 0, b, i, h, d) * at(g, in[1], 1, b, j, h, d);
                    sc[j] = dot * g->scale + (mask ? mask_at(g, mask, b, h, i, j) : 0.0);
                    if (keep && mask_at(g, keep, b, h, i, j) == 0.0) sc[j] = g->fill;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int64_t j = 0; j < g->Sk; j++) sum += exp(sc[j] - mx);
                int64_t row = g->layout[3] ? i * g->B + b : b * g->Sq + i;
                for (int64_t d = 0; d < g->D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < g->Sk; j++)
                        acc += exp(sc[j] - mx) / sum * at(g, in[2], 2, b, j, h, d);
                    out[row * E + h * g->D + d] = acc;
                }
            }
    free(sc);
}

/* Shape function, allocation, kernel: as the executor runs a node. */
static af_status run(af_node *n, const af_tensor *const *in, af_tensor *out, af_error *err) {
    memset(out, 0, sizeof *out);
    out->rank = -1;
    af_status st = af_kernel_shape(n, in, out, err);
    if (st == AF_OK) st = af_tensor_alloc(out, err);
    if (st == AF_OK) st = af_runtime_kernel(NULL, n, in, out, err);
    return st;
}

/* Run geometry g with fresh random q, k, v (q, k, v one packed tensor when `packed`) and an
 * optional mask of mask_rank dims; compare with the reference. */
static void check_geom(const geom *g, bool packed, int mask_rank, const int64_t *mask_dims,
                       float mask_fill_inf_keys) {
    af_arena *a = af_arena_new();
    af_node *n = fa_node(a, g, g->keep_rank ? 5 : mask_rank ? 4 : 3);
    af_tensor *t[5] = {NULL, NULL, NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        int64_t d[4];
        int r = in_dims(g, i, d);
        t[i] = packed && i ? t[0] : rand_tensor(r, d);
    }
    if (g->keep_rank) {
        /* Causal (key j visible to query i when j <= i + Sk - Sq) where the last two axes are
         * [Sq, Sk]; else random, about 2 in 3 kept. */
        const int64_t *kd = g->keep_dims;
        int kr = g->keep_rank;
        t[4] = af_tensor_new(AF_DTYPE_BOOL, kr, kd);
        assert_non_null(t[4]);
        unsigned char *p = t[4]->data;
        bool causal = kr >= 2 && kd[kr - 2] == g->Sq && kd[kr - 1] == g->Sk;
        for (int64_t e = 0; e < af_tensor_numel(t[4]); e++) {
            int64_t jj = e % kd[kr - 1], ii = kr >= 2 ? e / kd[kr - 1] % kd[kr - 2] : 0;
            p[e] = causal ? jj <= ii + g->Sk - g->Sq : tu_rnd() > -0.3;
        }
    }
    if (mask_rank) {
        t[3] = rand_tensor(mask_rank, mask_dims);
        /* Mask the first `mask_fill_inf_keys` keys with -inf in the last mask axis (which
         * indexes keys when it is not 1). */
        float *p = t[3]->data;
        int64_t last = mask_dims[mask_rank - 1];
        for (int64_t e = 0; e < af_tensor_numel(t[3]); e++)
            if (last > 1 && e % last < (int64_t)mask_fill_inf_keys) p[e] = -INFINITY;
    }
    af_tensor y, yr;
    af_error err;
    const af_tensor *in[5] = {t[0], t[1], t[2], t[3], t[4]};
    assert_int_equal(run(n, in, &y, &err), AF_OK);
    /* The reference twin on the same inputs. */
    memset(&yr, 0, sizeof yr);
    yr.rank = -1;
    assert_int_equal(af_kernel_shape(n, in, &yr, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(&yr, &err), AF_OK);
    assert_int_equal(ref_attention(n, in, &yr, NULL, &err), AF_OK);
    int64_t E = g->H * g->D, rows = g->B * g->Sq;
    assert_int_equal(y.rank, g->out_rank);
    assert_int_equal(af_tensor_numel(&y), rows * E);
    if (g->out_rank == 3) {
        assert_int_equal(y.dims[g->layout[3] ? 1 : 0], g->B);
        assert_int_equal(y.dims[g->layout[3] ? 0 : 1], g->Sq);
    }
    double *want = malloc(sizeof(double) * (size_t)(rows * E));
    assert_non_null(want);
    reference(g, in, t[3], t[4], want);
    for (int k = 0; k < 2; k++) {
        const float *got = k ? yr.data : y.data;
        for (int64_t i = 0; i < rows * E; i++) {
            if (isnan(want[i])) {
                assert_true(isnan(got[i]));
                continue;
            }
            if (fabs(got[i] - want[i]) > 1e-5 + 1e-4 * fabs(want[i]))
                fail_msg("%s kernel, element %lld: got %g, want %g", k ? "ref" : "fast",
                         (long long)i, got[i], want[i]);
        }
    }
    free(want);
    af_tensor_release(&y);
    af_tensor_release(&yr);
    for (int i = 0; i < 5; i++)
        if (t[i] && !(packed && i && i < 3)) af_tensor_free(t[i]);
    af_arena_free(a);
}

static void test_kernel_bert_layout(void **state) {
    (void)state;
    geom g = {.B = 2, .H = 2, .D = 4, .Sq = 5, .Sk = 5, .width = {8, 8, 8}, .out_rank = 3,
              .scale = 0.5f};
    int64_t md[4] = {2, 1, 1, 5};
    check_geom(&g, false, 4, md, 0);
    check_geom(&g, false, 0, NULL, 0);
}

static void test_kernel_vit_packed(void **state) {
    (void)state;
    /* [S, B, 3E] read in place by q, k and v; output rows s*B + b of [S*B, E]. */
    geom g = {.B = 2, .H = 2, .D = 4, .Sq = 7, .Sk = 7, .layout = {1, 1, 1, 1},
              .width = {24, 24, 24}, .col = {0, 8, 16}, .out_rank = 2, .merged = true,
              .scale = 0.35f};
    int64_t md[3] = {4, 1, 7};
    check_geom(&g, true, 3, md, 0);
    check_geom(&g, true, 0, NULL, 0);
}

static void test_kernel_vit_sized(void **state) {
    (void)state;
    /* A ViT-B head's size: several query tiles, a 16-wide last key panel, no mask (the softmax
     * then takes the scale and P V the normalisation); a negative scale keeps them apart. */
    geom g = {.B = 1, .H = 2, .D = 64, .Sq = 197, .Sk = 197, .width = {128, 128, 128},
              .out_rank = 3, .scale = 0.125f};
    check_geom(&g, false, 0, NULL, 0);
    g.scale = -0.125f;
    check_geom(&g, false, 0, NULL, 0);
}

static void test_kernel_cross_blocks(void **state) {
    (void)state;
    /* Several key blocks and a partial query tile; every row order mixed. */
    geom g = {.B = 2, .H = 3, .D = 5, .Sq = 19, .Sk = 150, .layout = {1, 0, 1, 1},
              .width = {15, 20, 17}, .col = {0, 5, 2}, .out_rank = 3, .scale = 0.7f};
    int64_t md[2] = {19, 150};
    check_geom(&g, false, 2, md, 0);
    int64_t md1[1] = {150};
    check_geom(&g, false, 1, md1, 0);
}

static void test_kernel_masked_blocks(void **state) {
    (void)state;
    /* The first key block is all -inf (the running max starts at -inf and must not poison the
     * row); with every key masked a row is NaN, as the unfused Softmax gives. */
    geom g = {.B = 1, .H = 2, .D = 3, .Sq = 9, .Sk = 130, .width = {6, 6, 6}, .out_rank = 3,
              .scale = 1.0f};
    int64_t md[4] = {1, 1, 9, 130};
    check_geom(&g, false, 4, md, 70);
    check_geom(&g, false, 4, md, 130);
}

static void test_kernel_causal_past(void **state) {
    (void)state;
    /* GPT-2 with past keys: q rows [B, Sq, E], k and v head-major [B, H, Sk, D] with Sk > Sq,
     * a causal keep mask [1, 1, Sq, Sk] (finite fill, as torch.finfo.min), then with an additive
     * mask too and a -inf fill. */
    geom g = {.B = 2, .H = 3, .D = 5, .Sq = 6, .Sk = 11, .layout = {0, 2, 2, 0},
              .width = {15, 5, 5}, .out_rank = 3, .scale = 0.45f, .keep_rank = 4,
              .keep_dims = {1, 1, 6, 11}, .fill = -3.4028235e38f};
    check_geom(&g, false, 0, NULL, 0);
    int64_t md[4] = {1, 3, 6, 11};
    g.fill = -INFINITY;
    check_geom(&g, false, 4, md, 0);
    /* Every row order at once, q head-major too, and a random keep mask [B, 1, 1, Sk] with
     * rows where every key may be dropped (-inf fill: NaN, as the unfused graph). */
    geom h = {.B = 2, .H = 2, .D = 4, .Sq = 5, .Sk = 9, .layout = {2, 1, 2, 1},
              .width = {8, 12, 8}, .col = {0, 4, 0}, .out_rank = 2, .scale = 1.0f,
              .keep_rank = 4, .keep_dims = {2, 1, 1, 9}, .fill = -7.0f};
    check_geom(&h, false, 0, NULL, 0);
}

static void test_kernel_causal_blocks(void **state) {
    (void)state;
    /* More keys than one fast-kernel block (1024): the online softmax with the keep mask, a
     * partial query tile; heads merged ([B*H, Sq, Sk] keep of rank 3). */
    geom g = {.B = 1, .H = 2, .D = 3, .Sq = 17, .Sk = 1100, .layout = {0, 2, 2, 0},
              .width = {6, 3, 3}, .out_rank = 3, .scale = 0.8f, .keep_rank = 2,
              .keep_dims = {17, 1100}, .fill = -1e30f};
    check_geom(&g, false, 0, NULL, 0);
    g.merged = true;
    g.keep_rank = 3;
    g.keep_dims[0] = 2, g.keep_dims[1] = 1, g.keep_dims[2] = 1100;
    check_geom(&g, false, 0, NULL, 0);
}

static void test_shape_unknown_dims(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    geom g = {.B = 2, .H = 2, .D = 4, .layout = {1, 1, 1, 0}, .width = {8, 8, 8},
              .out_rank = 3, .scale = 1};
    af_node *n = fa_node(a, &g, 3);
    af_tensor q = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {-1, 2, 8}};
    af_tensor k = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {-1, -1, 8}};
    const af_tensor *in[3] = {&q, &k, &k};
    af_tensor y = {.rank = -1};
    af_error err;
    assert_int_equal(af_kernel_shape(n, in, &y, &err), AF_OK);
    assert_int_equal(y.rank, 3);
    assert_int_equal(y.dims[0], 2); /* out is batch-major: [B, Sq, E] */
    assert_int_equal(y.dims[1], -1);
    assert_int_equal(y.dims[2], 8);
    af_arena_free(a);
}

/* Each hostile variant must fail with a status, never crash or read outside. */
static void test_hostile(void **state) {
    (void)state;
    geom base = {.B = 2, .H = 2, .D = 4, .Sq = 5, .Sk = 5, .width = {8, 8, 8}, .out_rank = 3,
                 .scale = 1};
    for (int c = 0; c < 13; c++) {
        af_arena *a = af_arena_new();
        geom g = base;
        if (c == 0) g.col[1] = 1;            /* columns past the width */
        if (c == 1) g.H = INT64_MAX / 2;     /* H*D overflows */
        if (c == 2) g.layout[2] = 3;         /* bad layout */
        if (c == 3) g.out_rank = 4;
        if (c == 4) g.D = 0;
        if (c == 9) g.layout[1] = 2;         /* head-major k that is rank 3 */
        if (c >= 10) g.keep_rank = 4, g.fill = -1.0f;
        if (c == 12) g.fill = NAN;
        af_node *n = fa_node(a, &g, c == 5 ? 4 : c >= 10 ? 5 : 3);
        int64_t d[3];
        in_dims(&base, 0, d);
        af_tensor *q = rand_tensor(3, d), *k = rand_tensor(3, d), *m = NULL;
        if (c == 5) {
            int64_t md[4] = {2, 3, 1, 5}; /* 3 heads: does not broadcast to 2 */
            m = rand_tensor(4, md);
        }
        if (c == 6) k->dims[1] = 4; /* v has 5 keys, k 4: dims disagree (data is larger) */
        if (c == 7) k->dtype = AF_DTYPE_INT32;
        if (c == 8) k->rank = 2, k->dims[1] = 40;
        af_tensor *keep = NULL;
        if (c >= 10) {
            int64_t kd[4] = {1, 1, 5, c == 11 ? 4 : 5}; /* c 11: 4 keys of 5 */
            keep = af_tensor_new(c == 10 ? AF_DTYPE_FLOAT : AF_DTYPE_BOOL, 4, kd);
            assert_non_null(keep);
        }
        const af_tensor *in[5] = {q, k, q, m, keep};
        af_tensor y;
        af_error err;
        if (c == 6) in[2] = q;
        assert_int_not_equal(run(n, in, &y, &err), AF_OK);
        assert_non_null(strstr(err.message, "FusedAttention"));
        af_tensor_release(&y);
        af_tensor_free(q);
        af_tensor_free(k);
        af_tensor_free(m);
        af_tensor_free(keep);
        af_arena_free(a);
    }
}

/* ---- the rule on models ---------------------------------------------------------------------- */

typedef struct model_case {
    const char *name;
    int fused;          /* FusedAttention nodes expected */
    const char *reason; /* substring of the near miss's reason, or NULL */
} model_case;

static const model_case cases[] = {
    {"bert_block", 1, NULL},
    {"bert_mul_swapped", 1, NULL},
    {"vit_block", 1, NULL},
    {"vit_mask", 1, NULL},
    {"cross", 1, NULL},
    {"bert2", 2, NULL},
    {"vit2", 2, NULL},
    {"nm_scores_output", 0, "graph output"},
    {"nm_scores_reader", 0, "consumers"},
    {"nm_shape_input", 0, "not constant"},
    {"nm_perm", 0, "inner split"},
    {"nm_mask_grows", 0, "broadcast"},
    {"nm_double", 0, "float32"},
    {"nm_mask_scaled", 0, "before the scale"},
    {"gpt2_causal_past", 1, NULL},
    {"gpt2_causal_bias", 1, NULL},
    {"gpt2_long_past", 1, NULL},
    {"gpt2_one_token", 1, NULL},
    {"t5_bias", 1, NULL},
    {"nm_where_scaled", 0, "last step before the softmax"},
    {"nm_where_fill", 0, "constant scalar"},
    {"nm_where_grows", 0, "broadcast"},
    {"swin_window", 1, NULL},
    {"nm_swin_heads_outer", 0, "right outside the heads"},
    {"nm_swin_packed_out", 0, "graph output"},
};

static const char *models_dir(void) {
    const char *d = getenv("AF_ATTN_MODELS");
    return d && *d ? d : "attention_models";
}

static af_model *load(const char *name) {
    char path[1024];
    af_model *m = NULL;
    af_error err;
    snprintf(path, sizeof path, "%s/%s.onnx", models_dir(), name);
    if (tu_load(path, &m, &err) != AF_OK) fail_msg("%s", err.message);
    return m;
}

/* Run g on the case's saved inputs (NULL for a graph input without a file: its default). */
static af_tensor *run_model(const char *name, const af_graph *g) {
    af_tensor in[16];
    const af_tensor *pin[16];
    af_error err;
    assert_true(g->ninputs <= 16);
    for (int i = 0; i < g->ninputs; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.in%d.npy", models_dir(), name, i);
        memset(&in[i], 0, sizeof in[i]);
        FILE *f = fopen(path, "rb");
        pin[i] = NULL;
        if (!f) continue;
        fclose(f);
        if (af_tensor_load_npy(path, &in[i], &err) != AF_OK) fail_msg("%s", err.message);
        pin[i] = &in[i];
    }
    af_tensor *out = calloc((size_t)g->noutputs, sizeof *out);
    assert_non_null(out);
    if (af_exec_graph(g, pin, out, &err) != AF_OK) fail_msg("%s: %s", name, err.message);
    for (int i = 0; i < g->ninputs; i++) af_tensor_release(&in[i]);
    return out;
}

static int count_op(const af_graph *g, af_op op) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) c += g->nodes[i]->op == op;
    return c;
}

static void compare(const char *name, const af_tensor *want, const af_tensor *got, int n) {
    for (int o = 0; o < n; o++) {
        assert_int_equal(want[o].dtype, got[o].dtype);
        assert_int_equal(af_tensor_numel(&want[o]), af_tensor_numel(&got[o]));
        for (int64_t i = 0; i < af_tensor_numel(&want[o]); i++) {
            double w = af_tensor_get_double(&want[o], i), h = af_tensor_get_double(&got[o], i);
            if (fabs(w - h) > 1e-4 * fabs(w) + 1e-5)
                fail_msg("%s output %d element %lld: fused %.9g, unfused %.9g", name, o,
                         (long long)i, h, w);
        }
    }
}

static void free_outputs(af_tensor *t, int n) {
    for (int i = 0; i < n; i++) af_tensor_release(&t[i]);
    free(t);
}

static void test_rule_models(void **state) {
    (void)state;
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    for (int r = 0; r < AF_RULE_COUNT; r++) cfg.disabled[r] = r != AF_RULE_MULTI_HEAD_ATTENTION;
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const model_case *mc = &cases[c];
        af_model *ref = load(mc->name), *fused = load(mc->name);
        af_fusion_report rep;
        af_error err;
        af_fusion_report_init(&rep, mc->name, af_machine_get());
        /* As the pipeline does: simplify first (ViT's Slice bounds become constants), then
         * canonicalize (at one token, GPT-2's head Transposes become Reshapes). */
        if (af_pass_simplify(fused->graph, &err) != AF_OK ||
            af_pass_canonicalize(fused->graph, &err) != AF_OK ||
            af_fuse(fused->graph, &cfg, &rep, &err) != AF_OK)
            fail_msg("%s", err.message);
        if (af_graph_verify(fused->graph, &err) != AF_OK) fail_msg("%s", err.message);
        int n = count_op(fused->graph, AF_OP_FUSED_ATTENTION);
        if (n != mc->fused) fail_msg("%s: %d FusedAttention, want %d", mc->name, n, mc->fused);
        assert_int_equal(af_fusion_report_applied(&rep, AF_RULE_MULTI_HEAD_ATTENTION), mc->fused);
        if (mc->reason) {
            bool seen = false;
            for (int i = 0; i < rep.nmisses; i++)
                seen |= rep.misses[i].rule == AF_RULE_MULTI_HEAD_ATTENTION &&
                        strstr(rep.misses[i].reason, mc->reason) != NULL;
            if (!seen)
                fail_msg("%s: no near miss saying '%s' (%d misses%s%s)", mc->name, mc->reason,
                         rep.nmisses, rep.nmisses ? ", first: " : "",
                         rep.nmisses ? rep.misses[0].reason : "");
        } else {
            /* Nothing of the attention block is left: no Softmax in these models outside it. */
            assert_int_equal(count_op(fused->graph, AF_OP_SOFTMAX), 0);
        }
        af_tensor *want = run_model(mc->name, ref->graph);
        af_tensor *got = run_model(mc->name, fused->graph);
        assert_int_equal(ref->graph->noutputs, fused->graph->noutputs);
        compare(mc->name, want, got, ref->graph->noutputs);
        free_outputs(want, ref->graph->noutputs);
        free_outputs(got, fused->graph->noutputs);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(fused);
    }
}

/* Every FusedAttention of the lowered graph reads q, k and v from one FusedMatMul (the model's
 * own packed projection, or the three merged by the lowering), at offsets 0, E and 2E. */
static void check_merged(const char *name, const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->op != AF_OP_FUSED_ATTENTION) continue;
        const af_node *p = n->in[0]->producer;
        const int64_t *off = NULL, *bs = NULL;
        int64_t e = af_attr_int(n, "num_heads", 0) * af_attr_int(n, "head_dim", 0);
        if (n->in[1] != n->in[0] || n->in[2] != n->in[0] || !p || p->op != AF_OP_FUSED_MATMUL)
            fail_msg("%s: %s reads q, k, v from separate tensors", name, n->name);
        assert_int_equal(af_attr_ints(n, "offsets", &off), 3);
        assert_int_equal(off[0], 0);
        assert_int_equal(off[1], e);
        assert_int_equal(off[2], 2 * e);
        assert_int_equal(af_attr_int(p, "b_packed", 0), 1);
        assert_int_equal(af_attr_ints(p, "b_shape", &bs), 2);
        assert_int_equal(bs[1], 3 * e);
    }
}

static void test_lowered_qkv(void **state) {
    (void)state;
    static const char *const names[] = {"bert_block", "bert_mul_swapped", "bert2", "vit2"};
    af_fusion_config cfg;
    af_fusion_config_init(&cfg);
    for (size_t c = 0; c < AF_COUNT(names); c++) {
        af_model *ref = load(names[c]), *low = load(names[c]);
        af_fusion_report rep;
        af_error err;
        af_fusion_report_init(&rep, names[c], af_machine_get());
        if (af_optimize(low->graph, &cfg, &rep, &err) != AF_OK ||
            af_lower(low->graph, NULL, &err) != AF_OK || af_graph_verify(low->graph, &err) != AF_OK)
            fail_msg("%s: %s", names[c], err.message);
        assert_true(count_op(low->graph, AF_OP_FUSED_ATTENTION) > 0);
        check_merged(names[c], low->graph);
        af_tensor *want = run_model(names[c], ref->graph);
        af_tensor *got = run_model(names[c], low->graph);
        compare(names[c], want, got, ref->graph->noutputs);
        free_outputs(want, ref->graph->noutputs);
        free_outputs(got, low->graph->noutputs);
        af_fusion_report_free(&rep);
        af_model_free(ref);
        af_model_free(low);
    }
}

int main(void) {
    tu_rng = 42;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_bert_layout),  cmocka_unit_test(test_kernel_vit_packed),
        cmocka_unit_test(test_kernel_vit_sized),
        cmocka_unit_test(test_kernel_cross_blocks), cmocka_unit_test(test_kernel_masked_blocks),
        cmocka_unit_test(test_kernel_causal_past),  cmocka_unit_test(test_kernel_causal_blocks),
        cmocka_unit_test(test_shape_unknown_dims),  cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_rule_models),         cmocka_unit_test(test_lowered_qkv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
