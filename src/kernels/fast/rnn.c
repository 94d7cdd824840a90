/* Recurrent layers (RNN, GRU, LSTM) in float32: each step's gate pre-activations as two
 * matrix-vector products (W x and R h, vec gemv) and its activations over whole gate vectors
 * (vec unary), where the reference kernel converts every operand to double on every run and
 * sums element by element: Silero VAD's 128-unit LSTM step took 0.9 of its 1.15 ms there.
 * With several steps, W x of every step of an entry is one GEMM before the recurrence (W
 * packed once per run): step by step, a 2-layer bidirectional LSTM's second layer read its
 * 512 KB W per step and direction (1.55x ONNX Runtime's time; see BENCHMARKS.md).
 *
 * The geometry, the checks and the step's formulas are the reference's (kernels/ref/rnn.c,
 * rnn.h): gates in ONNX order (LSTM i o f c, GRU z r h), peepholes, clip, input_forget,
 * linear_before_reset, sequence_lens (steps past an entry's length leave its state alone and
 * its Y rows zero), both layouts and directions. Activations with a vector form (sigmoid,
 * tanh, relu, hardsigmoid, leakyrelu, elu, softplus) run here; the others (affine, softsign,
 * scaledtanh, thresholdedrelu) decline to the reference kernel.
 *
 * Invariant: every index is within the operands rnn_prepare checked; an entry's steps stop at
 * its length, which is checked against seq_length before any is run. */
#include "kernels/fast/fast.h"
#include "kernels/fast/gemm.h"
#include "kernels/ref/nn_common.h"
#include "kernels/ref/rnn.h"
#include "kernels/simd/vec.h"
#include "ir/epilogue.h"

#include <string.h>

/* The vector op of an activation (un_apply's: af_ep_op or af_vun_op, with p0 and p1), or -1. */
static int vec_act(const rnn_act *a, float *p0, float *p1) {
    *p0 = (float)a->alpha, *p1 = (float)a->beta;
    switch (a->fn) {
    case FN_SIGMOID: return AF_EP_SIGMOID;
    case FN_TANH: return AF_EP_TANH;
    case FN_RELU: return AF_EP_RELU;
    case FN_HARDSIGMOID: return AF_EP_HARD_SIGMOID;
    case FN_LEAKYRELU: return AF_EP_LEAKY_RELU;
    case FN_ELU: return AF_EP_ELU;
    case FN_SOFTPLUS: return AF_VUN_SOFTPLUS;
    default: return -1;
    }
}

typedef struct rnn_run {
    const rnn_geom *g;
    const float *x, *w, *r, *b, *p, *h0, *c0;
    float *y, *yh, *yc;
    int op[RNN_MAXACT];
    float p0[RNN_MAXACT], p1[RNN_MAXACT];
    bool lbr, couple;
    float *pre, *rec, *h, *c, *tmp; /* [gates * hidden] x 2, then [hidden] x 3 */
    float *wx;     /* with the input products made before the recurrence: [seq][gates * hidden] */
    float *packed; /* the direction's W, packed for the GEMM core */
} rnn_run;

/* Steps from which an entry's W x is one GEMM (below, step by step: packing W costs a pass). */
enum { RNN_GEMM_STEPS = 4 };

/* act k of direction dir over v[0..n) in place, after the clip where asked (the reference clips
 * every pre-activation, not LSTM's cell state). */
static void act_rows(const rnn_run *s, int dir, int k, float *v, int64_t n, bool clip) {
    const rnn_geom *g = s->g;
    if (clip && g->clip > 0.0) {
        float lo = (float)-g->clip, hi = (float)g->clip;
        for (int64_t j = 0; j < n; j++) v[j] = v[j] < lo ? lo : v[j] > hi ? hi : v[j];
    }
    int a = dir * g->nact + k;
    af_vec()->unary(s->op[a], s->p0[a], s->p1[a], v, v, n);
}

/* Index of state [dir, b, j] in the layout of initial_h and Y_h (the reference's rnn_hidx). */
static int64_t hidx(const rnn_geom *g, int dir, int64_t b, int64_t j) {
    return g->layout ? (b * g->ndir + dir) * g->hidden + j : (dir * g->batch + b) * g->hidden + j;
}

/* One step of one batch entry (the reference's rnn_step): x its input row, or wx its W x when
 * not NULL; s->h and s->c its state, updated. */
static void step(const rnn_run *s, int dir, const float *x, const float *wx) {
    const rnn_geom *g = s->g;
    const af_vec_ops *v = af_vec();
    int64_t hs = g->hidden, gh = g->gates * hs;
    const float *w = s->w + dir * gh * g->input, *r = s->r + dir * gh * hs;
    const float *wb = s->b ? s->b + dir * 2 * gh : NULL, *rb = wb ? wb + gh : NULL;
    float *pre = s->pre, *rec = s->rec, *h = s->h, *c = s->c;
    if (wx) memcpy(pre, wx, (size_t)gh * sizeof(float));
    else v->gemv(w, g->input, x, gh, g->input, pre);
    /* GRU's h gate takes its recurrence apart (below); every other row adds R h here */
    int64_t rows = g->kind == RNN_GRU ? 2 * hs : gh;
    v->gemv(r, hs, h, rows, hs, rec);
    for (int64_t q = 0; q < rows; q++) pre[q] += rec[q] + (wb ? wb[q] + rb[q] : 0.0f);
    for (int64_t q = rows; wb && q < gh; q++) pre[q] += wb[q];
    if (g->kind == RNN_SIMPLE) {
        act_rows(s, dir, 0, pre, hs, true);
        memcpy(h, pre, (size_t)hs * sizeof(float));
    } else if (g->kind == RNN_GRU) {
        float *z = pre, *rg = pre + hs, *hh = pre + 2 * hs, *t = s->tmp;
        act_rows(s, dir, 0, pre, 2 * hs, true);
        if (s->lbr) { /* r .* (h R_h^T + Rb_h) */
            v->gemv(r + 2 * hs * hs, hs, h, hs, hs, t);
            for (int64_t j = 0; j < hs; j++) hh[j] += rg[j] * (t[j] + (rb ? rb[2 * hs + j] : 0.0f));
        } else { /* (r .* h) R_h^T + Rb_h */
            for (int64_t j = 0; j < hs; j++) t[j] = rg[j] * h[j];
            v->gemv(r + 2 * hs * hs, hs, t, hs, hs, rec);
            for (int64_t j = 0; j < hs; j++) hh[j] += rec[j] + (rb ? rb[2 * hs + j] : 0.0f);
        }
        act_rows(s, dir, 1, hh, hs, true);
        for (int64_t j = 0; j < hs; j++) h[j] = (1.0f - z[j]) * hh[j] + z[j] * h[j];
    } else {
        const float *p = s->p ? s->p + dir * 3 * hs : NULL;
        float *ig = pre, *og = pre + hs, *fg = pre + 2 * hs, *cg = pre + 3 * hs;
        for (int64_t j = 0; p && j < hs; j++) {
            ig[j] += p[j] * c[j];
            fg[j] += p[2 * hs + j] * c[j];
        }
        act_rows(s, dir, 0, ig, hs, true);
        if (s->couple) for (int64_t j = 0; j < hs; j++) fg[j] = 1.0f - ig[j];
        else act_rows(s, dir, 0, fg, hs, true);
        act_rows(s, dir, 1, cg, hs, true);
        for (int64_t j = 0; j < hs; j++) c[j] = fg[j] * c[j] + ig[j] * cg[j];
        for (int64_t j = 0; p && j < hs; j++) og[j] += p[hs + j] * c[j];
        act_rows(s, dir, 0, og, hs, true);
        memcpy(s->tmp, c, (size_t)hs * sizeof(float));
        act_rows(s, dir, 2, s->tmp, hs, false);
        for (int64_t j = 0; j < hs; j++) h[j] = og[j] * s->tmp[j];
    }
}

/* W x of every step of entry b into s->wx (direction dir's W packed in s->packed). */
static void input_products(const rnn_run *s, af_exec *ex, int64_t b) {
    const rnn_geom *g = s->g;
    static const int64_t tap0[1] = {0};
    int64_t gh = g->gates * g->hidden;
    const float *a = s->x + (g->layout ? b * g->seq : b) * g->input;
    af_gemm gm = {a, 1, g->seq, 0, g->layout ? g->input : g->batch * g->input, tap0, 1, g->input,
                  s->packed, gh, s->wx, gh, NULL, 0, 0, AF_GEMM_F32, NULL, NULL, 0, 0, 0, NULL, 0, 0};
    af_gemm_run(ex, &gm);
}

/* Direction dir of batch entry b over its len steps, Y rows written as they come. */
static void run_entry(const rnn_run *s, af_exec *ex, int dir, int64_t b, int64_t len) {
    const rnn_geom *g = s->g;
    int64_t hs = g->hidden;
    bool reverse = g->reverse || dir == 1;
    if (s->wx) input_products(s, ex, b);
    for (int64_t j = 0; j < hs; j++) {
        s->h[j] = s->h0 ? s->h0[hidx(g, dir, b, j)] : 0.0f;
        s->c[j] = s->c0 ? s->c0[hidx(g, dir, b, j)] : 0.0f;
    }
    for (int64_t t = 0; t < len; t++) {
        int64_t ti = reverse ? len - 1 - t : t;
        step(s, dir, s->x + (g->layout ? b * g->seq + ti : ti * g->batch + b) * g->input,
             s->wx ? s->wx + ti * g->gates * hs : NULL);
        if (s->y) {
            int64_t row = g->layout ? (b * g->seq + ti) * g->ndir + dir : (ti * g->ndir + dir) * g->batch + b;
            memcpy(s->y + row * hs, s->h, (size_t)hs * sizeof(float));
        }
    }
    for (int64_t j = 0; j < hs; j++) {
        if (s->yh) s->yh[hidx(g, dir, b, j)] = s->h[j];
        if (s->yc) s->yc[hidx(g, dir, b, j)] = s->c[j];
    }
}

/* The recurrences of every (direction, batch entry), independent of each other: items of a
 * parallel loop (a bidirectional layer's two directions run at once), each slot with its own
 * state, input products and packed W in `per` floats of mem. */
typedef struct rnn_job {
    const rnn_run *s;
    const af_tensor *sl;
    float *mem;
    size_t per, state, wx; /* floats: a slot's, its state's, its input products' (0: none) */
    af_exec *ex; /* for the input products' GEMM: only when there is one item */
} rnn_job;

static void rnn_items(void *ctx, int slot, int64_t begin, int64_t end) {
    const rnn_job *j = ctx;
    const rnn_geom *g = j->s->g;
    rnn_run s = *j->s;
    int64_t gh = g->gates * g->hidden;
    float *mem = j->mem + (size_t)slot * j->per;
    s.pre = mem, s.rec = mem + gh, s.h = mem + 2 * gh, s.c = s.h + g->hidden, s.tmp = s.c + g->hidden;
    s.wx = j->wx ? mem + j->state : NULL;
    s.packed = j->wx ? s.wx + j->wx : NULL;
    int packed_dir = -1;
    for (int64_t item = begin; item < end; item++) {
        int dir = (int)(item / g->batch);
        int64_t b = item % g->batch;
        if (s.packed && dir != packed_dir)
            af_gemm_pack(s.w + dir * gh * g->input, g->input, gh, 1, g->input, s.packed);
        packed_dir = dir;
        run_entry(&s, j->ex, dir, b, j->sl ? nn_geti(j->sl, b) : g->seq);
    }
}

static bool is_f32(const af_tensor *t) {
    return !t || (t->dtype == AF_DTYPE_FLOAT && t->data);
}

AF_FAST_KERNEL(fast_rnn) {
    rnn_geom g;
    rnn_run s;
    memset(&s, 0, sizeof s);
    s.g = &g;
    for (int i = 0; i < n->nin; i++)
        if (i != 4 && !is_f32(nn_in(n, in, i))) return AF_DECLINED;
    for (int i = 0; i < n->nout; i++)
        if (nn_out(n, out, i) && out[i].dtype != AF_DTYPE_FLOAT) return AF_DECLINED;
    af_error scratch;
    if (rnn_prepare(n, in, &g, &scratch) != AF_OK || g.seq < 0 || g.batch < 0 || g.input < 0 ||
        g.hidden < 0)
        return AF_DECLINED; /* the reference kernel says why */
    for (int a = 0; a < g.nact * g.ndir; a++)
        if ((s.op[a] = vec_act(&g.act[a], &s.p0[a], &s.p1[a])) < 0) return AF_DECLINED;
    af_tensor *y = nn_out(n, out, 0), *yh = nn_out(n, out, 1);
    af_tensor *yc = g.kind == RNN_LSTM ? nn_out(n, out, 2) : NULL;
    int64_t yd[4] = {g.seq, g.ndir, g.batch, g.hidden}, ydb[4] = {g.batch, g.seq, g.ndir, g.hidden};
    int64_t hd[3] = {g.ndir, g.batch, g.hidden}, hdb[3] = {g.batch, g.ndir, g.hidden};
    af_status st = y ? nn_check_out(n, y, 4, g.layout ? ydb : yd, err) : AF_OK;
    if (st == AF_OK && yh) st = nn_check_out(n, yh, 3, g.layout ? hdb : hd, err);
    if (st == AF_OK && yc) st = nn_check_out(n, yc, 3, g.layout ? hdb : hd, err);
    if (st != AF_OK) return st;
    const af_tensor *sl = nn_in(n, in, 4);
    for (int64_t b = 0; sl && b < g.batch; b++) {
        int64_t len = nn_geti(sl, b);
        if (len < 0 || len > g.seq)
            return af_node_fail(err, n, AF_ERR_RUNTIME, "sequence_lens[%lld] = %lld", (long long)b,
                                (long long)len);
    }
    int64_t gh = g.gates * g.hidden, items = g.ndir * g.batch;
    bool gemm = g.seq >= RNN_GEMM_STEPS && g.input > 0 && gh > 0;
    size_t state = (size_t)(2 * gh + 3 * g.hidden + 16) & ~(size_t)15; /* floats, 64-byte multiple */
    size_t wx = gemm ? ((size_t)(g.seq * gh) + 15) & ~(size_t)15 : 0;
    size_t per = state + wx + (gemm ? af_gemm_packed_floats(g.input, gh) : 0);
    int slots = af_exec_threads(x) < AF_EXEC_MAX_SLOTS ? af_exec_threads(x) : AF_EXEC_MAX_SLOTS;
    if (items < slots) slots = items < 1 ? 1 : (int)items;
    float *mem = af_exec_scratch(x, sizeof(float) * per * (size_t)slots);
    if (!mem) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for the recurrence's state");
    s.x = in[0]->data, s.w = in[1]->data, s.r = in[2]->data;
    const af_tensor *t;
    s.b = (t = nn_in(n, in, 3)) ? t->data : NULL;
    s.h0 = (t = nn_in(n, in, 5)) ? t->data : NULL;
    s.c0 = g.kind == RNN_LSTM && (t = nn_in(n, in, 6)) ? t->data : NULL;
    s.p = g.kind == RNN_LSTM && (t = nn_in(n, in, 7)) ? t->data : NULL;
    s.y = y ? y->data : NULL, s.yh = yh ? yh->data : NULL, s.yc = yc ? yc->data : NULL;
    s.lbr = af_attr_int(n, "linear_before_reset", 0) != 0;
    s.couple = af_attr_int(n, "input_forget", 0) != 0;
    if (s.y) memset(s.y, 0, y->nbytes); /* steps past an entry's length stay zero */
    rnn_job j = {&s, sl, mem, per, state, wx, items == 1 ? x : NULL};
    if (items == 1) { /* one recurrence: the GEMM may split across threads instead */
        rnn_items(&j, 0, 0, 1);
        return AF_OK;
    }
    double step_flops = 2.0 * (double)gh * (double)(g.input + g.hidden);
    af_exec_parallel(x, items, af_exec_work_ns(x, step_flops * (double)(g.seq * items), 0.0), rnn_items, &j);
    return AF_OK;
}
