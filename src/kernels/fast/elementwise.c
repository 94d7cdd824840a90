/* The fast float32 elementwise and row kernels: unary activations and math, Clip, Add / Sub /
 * Mul / Div (and Pow by a constant 2 or 0.5) whose operands broadcast as the vector epilogue
 * can read them (same shape, per last-dim vector, per row, scalar), the row-wise
 * LayerNormalization over the last axes, Softmax and LogSoftmax over any axis, and the Transposes
 * that move whole rows (the layout pass's NCHW <-> NHWC reorders), in blocks (and those that move
 * only dims of 1, a copy of any dtype). The elementwise
 * ones run through the vector epilogue of vec.h, in parallel, in cache-sized pieces: one copy of
 * the operand that has the output's shape, then the step applied in place.
 *
 * Invariant: a kernel only takes what it computes exactly as the reference kernel defines it
 * (up to float rounding), with every tensor it reads or writes checked to hold its elements;
 * anything else is AF_DECLINED and the reference kernel runs it (and reports what is wrong). */
#include "kernels/fast/elementwise.h"
#include "kernels/fast/fast.h"
#include "kernels/ref/nn_common.h"
#include "kernels/ref/tensor_util.h"

#include <math.h>
#include <string.h>

/* Floats per piece: a piece is copied and then finished while it is in L1/L2. */
enum { PIECE = 8192 };

typedef struct ep_job {
    const af_vep *v;
    const float *x;
    float *y;
    int64_t rows, cols; /* rows x cols view; rows == 1: a flat run */
} ep_job;

static void ep_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const ep_job *j = ctx;
    const af_vec_ops *v = af_vec();
    if (j->rows == 1) { /* [begin, end) are flat offsets */
        for (int64_t off = begin; off < end; off += PIECE) {
            int64_t len = end - off < PIECE ? end - off : PIECE;
            if (j->x && j->x != j->y) af_copy(j->y + off, j->x + off, (size_t)len * sizeof(float));
            v->ep_tile(j->v, j->y + off, len, 0, off, 1, len);
        }
        return;
    }
    int64_t step = j->cols >= PIECE ? 1 : PIECE / j->cols;
    for (int64_t r = begin; r < end; r += step) {
        int64_t nr = end - r < step ? end - r : step;
        float *y = j->y + r * j->cols;
        if (j->x && j->x != j->y) af_copy(y, j->x + r * j->cols, (size_t)(nr * j->cols) * sizeof(float));
        v->ep_tile(j->v, y, j->cols, r, 0, nr, j->cols);
    }
}

void fast_ep_run(af_exec *ex, const af_vep *v, const float *x, float *y, int64_t numel) {
    if (numel <= 0) return;
    bool by_rows = false;
    for (int s = 0; s < v->nsteps; s++)
        by_rows = by_rows || v->steps[s].kind == AF_VEP_ROW || v->steps[s].kind == AF_VEP_COL;
    int64_t cols = v->cols > 0 ? v->cols : 1;
    ep_job j = {v, x, y, by_rows ? numel / cols : 1, by_rows ? cols : numel};
    /* Flat runs split in pieces; the generic fallback needs whole rows too. */
    if (v->generic && !by_rows) j.rows = 1;
    int64_t items = j.rows == 1 ? numel : j.rows;
    double ns = af_exec_work_ns(ex, (double)numel * v->nsteps, 8.0 * (double)numel);
    af_exec_parallel(ex, items, ns, ep_range, &j);
}

/* The vector op of a unary ONNX op with its parameters, from its row of the op table: its
 * epilogue step, or its vector function (Selu's and Celu's parameters their attributes, with
 * the reference kernel's defaults); false when it has neither. */
static bool unary_op(const af_node *n, int *op, float *p0, float *p1) {
    if (af_op_ep_step(n, op, p0, p1)) return true;
    *p0 = *p1 = 0.0f;
    *op = af_ops[n->op].vec_unary;
    if (*op == AF_VUN_SELU) {
        *p0 = af_attr_float(n, "alpha", 1.67326319217681884765625f);
        *p1 = af_attr_float(n, "gamma", 1.05070102214813232421875f);
    } else if (*op == AF_VUN_CELU) {
        *p0 = af_attr_float(n, "alpha", 1.0f);
        if (!(*p0 != 0.0f)) return false; /* the reference divides by it */
    }
    return *op != 0;
}

typedef struct un_job {
    int op;
    float p0, p1;
    const float *x;
    float *y;
} un_job;

static void un_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const un_job *j = ctx;
    af_vec()->unary(j->op, j->p0, j->p1, j->x + begin, j->y + begin, end - begin);
}

static bool run_map(int op, float p0, float p1, const af_tensor *x, af_tensor *y, af_exec *ex) {
    if (x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT)
        return false;
    int64_t count = af_tensor_numel(x);
    if (count < 0 || count != af_tensor_numel(y)) return false;
    un_job j = {op, p0, p1, x->data, y->data};
    /* about 20 operations per element for the transcendental ones */
    af_exec_parallel(ex, count, af_exec_work_ns(ex, 20.0 * (double)count, 8.0 * (double)count),
                     un_range, &j);
    return true;
}

static bool run_unary(const af_node *n, const af_tensor *x, af_tensor *y, af_exec *ex) {
    int op;
    float p0, p1;
    return unary_op(n, &op, &p0, &p1) && run_map(op, p0, p1, x, y, ex);
}

/* The epilogue op of a binary ONNX op (its row's .ep); Pow by a constant scalar 2 or 0.5
 * becomes a unary op. */
static bool binary_op(const af_node *n, const af_tensor *b, int *op, bool *unary) {
    *unary = false;
    *op = af_ops[n->op].ep;
    if (af_ep_is_binary(*op)) return true;
    if (n->op != AF_OP_POW || b->dtype != AF_DTYPE_FLOAT || af_tensor_numel(b) != 1) return false;
    *unary = true;
    if (((const float *)b->data)[0] == 2.0f) *op = AF_VUN_SQUARE;
    else if (((const float *)b->data)[0] == 0.5f) *op = AF_VUN_SQRT;
    else return false;
    return true;
}

static bool same_dims(const af_tensor *a, const af_tensor *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

static bool run_binary(const af_node *n, const af_tensor *a, const af_tensor *b, af_tensor *y,
                    af_exec *ex) {
    int op;
    bool unary;
    if (a->dtype != AF_DTYPE_FLOAT ||
        b->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT || y->rank < 1 ||
        !binary_op(n, b, &op, &unary))
        return false;
    int64_t count = af_tensor_numel(y);
    if (unary) return same_dims(a, y) && run_map(op, 0.0f, 0.0f, a, y, ex);
    /* The operand with the output's shape is the chain value; the other one the step's. */
    bool rev = !same_dims(a, y);
    const af_tensor *x = rev ? b : a, *o = rev ? a : b;
    if (!same_dims(x, y)) return false;
    af_epilogue ep;
    memset(&ep, 0, sizeof ep);
    ep.rank = y->rank;
    memcpy(ep.dims, y->dims, sizeof(int64_t) * (size_t)y->rank);
    ep.nsteps = 1;
    ep.steps[0].op = (af_ep_op)op;
    ep.steps[0].reversed = rev;
    ep.steps[0].operand = o->data;
    af_broadcast_strides(o, y, ep.steps[0].strides);
    af_vep v;
    af_vep_build(&ep, y->data, y->dims[y->rank - 1], &v);
    if (v.generic) return false; /* fast_broadcast_binary walks it as rows */
    fast_ep_run(ex, &v, x->data, y->data, count);
    return true;
}

/* ---- rows: LayerNormalization and Softmax ------------------------------------------------------- */

typedef struct row_job {
    const float *x, *scale, *bias;
    float *y;
    int64_t len;
    float eps;
} row_job;

static void ln_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const row_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++)
        v->layernorm(j->x + r * j->len, j->y + r * j->len, j->len, j->eps, j->scale, j->bias);
}

static void rms_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const row_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++)
        v->rmsnorm(j->x + r * j->len, j->y + r * j->len, j->len, j->eps, j->scale);
}

static void smax_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const row_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        float *y = j->y + r * j->len;
        if (y != j->x + r * j->len) af_copy(y, j->x + r * j->len, (size_t)j->len * sizeof(float));
        v->softmax_row(y, j->len);
    }
}

static bool run_layernorm(const af_tensor *x, const af_tensor *scale, const af_tensor *bias,
                       float eps, int64_t rows, int64_t len, af_tensor *y, af_exec *ex) {
    if (x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT ||
        scale->dtype != AF_DTYPE_FLOAT || af_tensor_numel(scale) != len || len < 1 ||
        (bias && (bias->dtype != AF_DTYPE_FLOAT || af_tensor_numel(bias) != len)))
        return false;
    row_job j = {x->data, scale->data, bias ? bias->data : NULL, y->data, len, eps};
    af_exec_parallel(ex, rows, af_exec_work_ns(ex, 8.0 * (double)(rows * len), 12.0 * (double)(rows * len)),
                     ln_rows, &j);
    return true;
}

static bool run_softmax(const af_tensor *x, int64_t rows, int64_t len, af_tensor *y, af_exec *ex) {
    if (x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT ||
        len < 1)
        return false;
    row_job j = {x->data, NULL, NULL, y->data, len, 0.0f};
    af_exec_parallel(ex, rows, af_exec_work_ns(ex, 20.0 * (double)(rows * len), 12.0 * (double)(rows * len)),
                     smax_rows, &j);
    return true;
}

/* ---- Transpose ------------------------------------------------------------------------------ */

typedef struct tr_job {
    const float *x;
    float *y;
    int64_t r, c, cols, cblocks, rblocks; /* x [B, r, c] -> y [B, c, r], items of TR_ROWS x cols */
} tr_job;

/* Items of 64 x 64 floats (16 KiB, within L1 on both sides), transposed in 8 x 8 tiles
 * (vec.h transpose). */
enum { TR_ROWS = 64, TR_COLS = 64 };

/* Few rows (2 <= r <= TR_FEW: an image's 3 colour planes into channels-last) go TR_FEW_COLS
 * columns to an item, each output row written whole, r a constant in the loop; in 16 x 16
 * blocks they did 3 x 16 elements per block: 0.25 ms for a 224 x 224 image on Zen 3, 0.09 now. */
enum { TR_FEW = 4, TR_FEW_COLS = 1024 };

/* Columns [c0, c1) of x [R, c] into y [c, R], R a constant at each call (the loop unrolled). */
static inline __attribute__((always_inline)) void tr_few_cols(const int R, const float *restrict x,
                                                             float *restrict y, int64_t c, int64_t c0,
                                                             int64_t c1) {
    for (int64_t k = c0; k < c1; k++)
        for (int r = 0; r < R; r++) y[k * R + r] = x[r * c + k];
}

/* Items are (batch, block of rows, block of `cols` columns of x = rows of y). */
static void tr_items(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const tr_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / (j->rblocks * j->cblocks), rest = it % (j->rblocks * j->cblocks);
        int64_t r0 = rest / j->cblocks * TR_ROWS, c0 = rest % j->cblocks * j->cols;
        int64_t c1 = c0 + j->cols < j->c ? c0 + j->cols : j->c;
        const float *x = j->x + b * j->r * j->c;
        float *y = j->y + b * j->r * j->c;
        if (j->r <= TR_FEW) {
            if (j->r == 2) tr_few_cols(2, x, y, j->c, c0, c1);
            else if (j->r == 3) tr_few_cols(3, x, y, j->c, c0, c1);
            else tr_few_cols(4, x, y, j->c, c0, c1);
            continue;
        }
        int64_t r1 = r0 + TR_ROWS < j->r ? r0 + TR_ROWS : j->r;
        v->transpose(x + r0 * j->c + c0, j->c, y + c0 * j->r + r0, j->r, r1 - r0, c1 - c0);
    }
}

/* A transpose that keeps X's innermost run last moves whole blocks of `inner` floats: output
 * block b, numbered over the outer runs in output order, is read at the sum of each run's index
 * times its stride in X (Swin's window partition [B, 8, 7, 8, 7, 96] -> [B, 8, 8, 7, 7, 96]
 * moves rows of 672 floats; on the reference's strided copy its 30 Transposes were 1% of the
 * model). */
typedef struct tr_move_job {
    const float *x;
    float *y;
    int n;                                      /* outer runs */
    int64_t size[AF_MAX_RANK], xs[AF_MAX_RANK]; /* per outer run, in output order */
    int64_t inner;
} tr_move_job;

enum { TR_MOVE_MIN = 16 }; /* floats per block: shorter rows stay with the reference */

static void tr_moves(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const tr_move_job *j = ctx;
    int64_t idx[AF_MAX_RANK], off = 0, rem = begin;
    for (int r = j->n - 1; r >= 0; r--) {
        idx[r] = rem % j->size[r];
        rem /= j->size[r];
        off += idx[r] * j->xs[r];
    }
    for (int64_t b = begin; b < end; b++) {
        af_copy(j->y + b * j->inner, j->x + off, (size_t)j->inner * sizeof(float));
        for (int r = j->n - 1; r >= 0; r--) { /* the next block's index, as an odometer */
            off += j->xs[r];
            if (++idx[r] < j->size[r]) break;
            off -= idx[r] * j->xs[r];
            idx[r] = 0;
        }
    }
}

/* Runs [0, runs) of the output (X's first dim of each at start[], size[] elements): blocks when
 * the last run is X's innermost and long enough, else false. */
static bool run_moves(const af_tensor *x, const int *start, const int64_t *size, int runs, af_tensor *y,
                      af_exec *ex) {
    tr_move_job j = {x->data, y->data, runs - 1, {0}, {0}, size[runs - 1]};
    if (j.inner < TR_MOVE_MIN) return false;
    int64_t blocks = 1;
    for (int r = 0; r < j.n; r++) {
        if (start[r] > start[runs - 1]) return false;
        j.size[r] = size[r];
        j.xs[r] = 1;
        for (int q = 0; q < runs; q++)
            if (start[q] > start[r]) j.xs[r] *= size[q];
        blocks *= size[r];
    }
    af_exec_parallel(ex, blocks, af_exec_work_ns(ex, 0.0, 8.0 * (double)(blocks * j.inner)), tr_moves, &j);
    return true;
}

static bool run_transpose(const af_tensor *x, const int *perm, af_tensor *y, af_exec *ex) {
    if (x->dtype != AF_DTYPE_FLOAT || x->rank < 2 ||
        x->rank > AF_MAX_RANK)
        return false;
    /* Dims of 1 do not move anything: number the others, then cut the output's axes into runs
     * that are consecutive in X (each run is one dim of a smaller transpose). */
    int idx[AF_MAX_RANK], nd = 0;
    for (int a = 0; a < x->rank; a++) idx[a] = x->dims[a] == 1 ? -1 : nd++;
    int start[AF_MAX_RANK], last = -2, runs = 0;
    int64_t size[AF_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        int k = idx[perm[i]];
        if (k < 0) continue;
        if (k != last + 1) {
            start[runs] = k;
            size[runs++] = 1;
        }
        size[runs - 1] *= x->dims[perm[i]];
        last = k;
    }
    /* Taken: [R, C] -> [C, R] and [B, R, C] -> [B, C, R]; else blocks moved whole (run_moves). */
    tr_job j = {x->data, y->data, 0, 0, 0, 0, 1};
    int64_t batch;
    if (runs == 2 && start[0] > start[1]) {
        batch = 1;
        j.c = size[0];
        j.r = size[1];
    } else if (runs == 3 && start[0] == 0 && start[1] > start[2]) {
        batch = size[0];
        j.c = size[1];
        j.r = size[2];
    } else {
        return runs > 2 && run_moves(x, start, size, runs, y, ex);
    }
    j.cols = j.r <= TR_FEW ? TR_FEW_COLS : TR_COLS;
    j.cblocks = (j.c + j.cols - 1) / j.cols;
    if (j.r > TR_FEW) j.rblocks = (j.r + TR_ROWS - 1) / TR_ROWS;
    /* strided reads cost about twice a copy */
    af_exec_parallel(ex, batch * j.rblocks * j.cblocks,
                     af_exec_work_ns(ex, 0.0, 16.0 * (double)(batch * j.r * j.c)), tr_items, &j);
    return true;
}

/* ---- the kernels ------------------------------------------------------------------------------ */

/* A float32 tensor whose data holds all its elements. */
static bool f32_ready(const af_tensor *t) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && t->dtype == AF_DTYPE_FLOAT &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / sizeof(float)));
}

/* Input 0 and output 0: float32, ready, the same element count. */
static bool same_ready(const af_node *n, const af_tensor *const *in, const af_tensor *out) {
    return n->nin >= 1 && f32_ready(in[0]) && f32_ready(&out[0]) &&
           af_tensor_numel(in[0]) == af_tensor_numel(&out[0]);
}

static af_status taken(bool ok) { return ok ? AF_OK : AF_DECLINED; }

af_status fast_unary(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)err;
    return taken(n->nin == 1 && same_ready(n, in, out) && run_unary(n, in[0], &out[0], x));
}

/* Bounds: attributes before opset 11, optional float32 scalar inputs from then on. */
af_status fast_clip(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                    af_error *err) {
    (void)err;
    if (n->nin > 3 || !same_ready(n, in, out)) return AF_DECLINED;
    double l = -INFINITY, h = INFINITY;
    if (af_graph_opset(n->graph) < 11) {
        l = af_attr_float(n, "min", -INFINITY);
        h = af_attr_float(n, "max", INFINITY);
    } else {
        const af_tensor *lo = n->nin > 1 ? in[1] : NULL, *hi = n->nin > 2 ? in[2] : NULL;
        if ((lo && (!f32_ready(lo) || af_tensor_numel(lo) != 1)) ||
            (hi && (!f32_ready(hi) || af_tensor_numel(hi) != 1)))
            return AF_DECLINED;
        if (lo) l = ((const float *)lo->data)[0];
        if (hi) h = ((const float *)hi->data)[0];
    }
    return taken(run_map(AF_EP_CLIP, (float)l, (float)h, in[0], &out[0], x));
}

/* t broadcasts unidirectionally (numpy) to y. */
static bool broadcasts_to(const af_tensor *t, const af_tensor *y) {
    if (t->rank > y->rank) return false;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i], w = y->dims[y->rank - t->rank + i];
        if (d != 1 && d != w) return false;
    }
    return true;
}

/* Two inputs that broadcast to the output (opset 7 on: older models' legacy broadcasting is the
 * reference kernel's). */
af_status fast_binary(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    if (n->nin != 2 || af_graph_opset(n->graph) < 7 || !f32_ready(in[0]) || !f32_ready(in[1]) ||
        !f32_ready(&out[0]) || !broadcasts_to(in[0], &out[0]) || !broadcasts_to(in[1], &out[0]))
        return AF_DECLINED;
    if (run_binary(n, in[0], in[1], &out[0], x)) return AF_OK;
    return fast_broadcast_binary(n, in, out, x); /* the other broadcasts, Pow, Mod */
}

/* Over the last axes, Scale and B as whole rows; no Mean / InvStdDev outputs. */
af_status fast_layernorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x, af_error *err) {
    (void)err;
    int axis;
    const af_tensor *scale = n->nin > 1 ? in[1] : NULL, *b = n->nin > 2 ? in[2] : NULL;
    for (int o = 1; o < n->nout; o++)
        if (n->out[o]) return AF_DECLINED;
    if (!same_ready(n, in, out) || !f32_ready(scale) || (b && !f32_ready(b)) ||
        nn_layernorm_axis(n, in, &axis, NULL))
        return AF_DECLINED;
    const af_tensor *t = in[0];
    int64_t outer = nn_prod(t, 0, axis), inner = nn_prod(t, axis, t->rank);
    return taken(run_layernorm(t, scale, b, af_attr_float(n, "epsilon", 1e-5f), outer, inner,
                                   &out[0], x));
}

/* RMSNormalization over the last axes with a whole-row Scale (what canonicalize makes). */
af_status fast_rmsnorm(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                       af_error *err) {
    (void)err;
    int axis;
    if (n->nin != 2 || n->nout != 1 || !same_ready(n, in, out) || !f32_ready(in[1]) ||
        nn_layernorm_axis(n, in, &axis, NULL))
        return AF_DECLINED;
    const af_tensor *t = in[0];
    int64_t rows = nn_prod(t, 0, axis), len = nn_prod(t, axis, t->rank);
    if (t->dtype != AF_DTYPE_FLOAT || out[0].dtype != AF_DTYPE_FLOAT || len < 1 ||
        af_tensor_numel(in[1]) != len)
        return AF_DECLINED;
    row_job j = {t->data, in[1]->data, NULL, out[0].data, len, af_attr_float(n, "epsilon", 1e-5f)};
    af_exec_parallel(x, rows, af_exec_work_ns(x, 4.0 * (double)(rows * len), 8.0 * (double)(rows * len)),
                     rms_rows, &j);
    return AF_OK;
}

typedef struct cols_job {
    const float *x;
    float *y;
    int64_t len, inner, blocks, blk;
    int log;
} cols_job;

/* Items are (outer slab, block of columns); LogSoftmax along the last axis (inner 1) runs its
 * rows as columns of one: the reduction is then per row. */
static void smax_cols(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const cols_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t it = begin; it < end; it++) {
        int64_t o = it / j->blocks, c0 = it % j->blocks * j->blk;
        int64_t nc = j->inner - c0 < j->blk ? j->inner - c0 : j->blk;
        int64_t off = o * j->len * j->inner + c0;
        if (j->inner == 1) { /* a row: its max, its sum of exps, then x - (max + ln sum) */
            const float *x = j->x + off;
            float m = v->reduce_run(AF_VRED_MAX, x, j->len, 0.0f);
            float s = isfinite(m) ? v->reduce_run(AF_VRED_EXP, x, j->len, m) : NAN;
            v->norm_affine(x, j->y + off, j->len, m + logf(s), 1.0f, 0.0f);
            continue;
        }
        v->softmax_cols(j->x + off, j->y + off, j->len, j->inner, nc, j->log);
    }
}

static bool run_cols(const af_tensor *x, int64_t outer, int64_t len, int64_t inner, int log,
                     af_tensor *y, af_exec *ex) {
    if (len < 1 || inner < 1 || outer < 1) return false;
    cols_job j = {x->data, y->data, len, inner, 1, inner, log};
    if (inner > 1) { /* blocks of 256 columns, fewer when that leaves too few items */
        j.blk = 256;
        if (outer * ((inner + 255) / 256) < 8) j.blk = 64;
        j.blocks = (inner + j.blk - 1) / j.blk;
    }
    int64_t total = outer * len * inner;
    af_exec_parallel(ex, outer * j.blocks, af_exec_work_ns(ex, 20.0 * (double)total, 12.0 * (double)total),
                     smax_cols, &j);
    return true;
}

/* Along a last axis of contiguous rows, or along another axis by blocks of columns. */
af_status fast_softmax(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                       af_error *err) {
    (void)err;
    int64_t outer, len, inner;
    if (!same_ready(n, in, out) || nn_softmax_geom(n, in[0], &outer, &len, &inner, NULL))
        return AF_DECLINED;
    if (inner != 1) return taken(run_cols(in[0], outer, len, inner, 0, &out[0], x));
    return taken(run_softmax(in[0], outer, len, &out[0], x));
}

af_status fast_log_softmax(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_exec *x, af_error *err) {
    (void)err;
    int64_t outer, len, inner;
    if (!same_ready(n, in, out) || nn_softmax_geom(n, in[0], &outer, &len, &inner, NULL))
        return AF_DECLINED;
    return taken(run_cols(in[0], outer, len, inner, 1, &out[0], x));
}

/* A tensor of any dtype whose data holds its elements. */
static bool any_ready(const af_tensor *t) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    size_t es = t ? af_dtype_size(t->dtype) : 0;
    return count >= 0 && es > 0 && t->dtype != AF_DTYPE_STRING &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / es));
}

/* Whether perm keeps the dims other than 1 in their order: the transpose is then a copy (the
 * detectors transpose NonZero's [1, n] int64 coordinates to [n, 1] hundreds of times a run). */
static bool moves_nothing(const af_tensor *x, const int *perm) {
    int last = -1;
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[perm[i]] == 1) continue;
        if (perm[i] < last) return false;
        last = perm[i];
    }
    return true;
}

af_status fast_transpose(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x, af_error *err) {
    (void)err;
    int perm[AF_MAX_RANK];
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!any_ready(t) || !any_ready(&out[0]) || t->dtype != out[0].dtype || t->rank > AF_MAX_RANK ||
        af_tensor_numel(t) != af_tensor_numel(&out[0]) || tn_transpose_perm(n, t->rank, perm, NULL))
        return AF_DECLINED;
    if (moves_nothing(t, perm)) { /* any dtype */
        if (af_tensor_numel(t) > 0)
            af_copy(out[0].data, t->data, (size_t)af_tensor_numel(t) * af_dtype_size(t->dtype));
        return AF_OK;
    }
    if (!same_ready(n, in, out)) return AF_DECLINED;
    return taken(run_transpose(in[0], perm, &out[0], x));
}
