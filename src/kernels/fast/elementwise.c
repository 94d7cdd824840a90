/* Fast paths of the float32 elementwise and row ops: unary activations and math, Add / Sub /
 * Mul / Div (and Pow by a constant 2 or 0.5) whose operands broadcast as the vector epilogue
 * can read them (same shape, per last-dim vector, per row, scalar), and the row-wise
 * LayerNormalization and Softmax over the last axis. The elementwise ones run through the
 * vector epilogue of vec.h, in parallel, in cache-sized pieces: one copy of the operand that
 * has the output's shape, then the step applied in place. Also the Transposes that move whole
 * rows (the layout pass's NCHW <-> NHWC reorders), in blocks.
 *
 * Invariant: a fast path only takes what it computes exactly as the reference kernel defines
 * it (up to float rounding); anything else returns false and the reference kernel runs. Inputs
 * have been checked against the output by the caller. */
#include "kernels/fast/elementwise.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"

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
            if (j->x && j->x != j->y) memcpy(j->y + off, j->x + off, (size_t)len * sizeof(float));
            v->ep_tile(j->v, j->y + off, len, 0, off, 1, len);
        }
        return;
    }
    int64_t step = j->cols >= PIECE ? 1 : PIECE / j->cols;
    for (int64_t r = begin; r < end; r += step) {
        int64_t nr = end - r < step ? end - r : step;
        float *y = j->y + r * j->cols;
        if (j->x && j->x != j->y) memcpy(y, j->x + r * j->cols, (size_t)(nr * j->cols) * sizeof(float));
        v->ep_tile(j->v, y, j->cols, r, 0, nr, j->cols);
    }
}

void fk_ep_run(af_exec *ex, const af_vep *v, const float *x, float *y, int64_t numel) {
    if (numel <= 0) return;
    bool by_rows = false;
    for (int s = 0; s < v->nsteps; s++)
        by_rows = by_rows || v->steps[s].kind == AF_VEP_ROW || v->steps[s].kind == AF_VEP_COL;
    int64_t cols = v->cols > 0 ? v->cols : 1;
    ep_job j = {v, x, y, by_rows ? numel / cols : 1, by_rows ? cols : numel};
    /* Flat runs split in pieces; the generic fallback needs whole rows too. */
    if (v->generic && !by_rows) j.rows = 1;
    int64_t items = j.rows == 1 ? numel : j.rows;
    /* Small tensors are not worth waking the other threads for. */
    af_exec_parallel(numel < 4 * PIECE ? NULL : ex, items, ep_range, &j);
}

/* The epilogue op of a unary ONNX op, with its parameters; false when there is none. */
static bool unary_op(const af_node *n, int *op, float *p0, float *p1) {
    *p0 = *p1 = 0.0f;
    switch (n->op) {
    case AF_OP_RELU: *op = AF_EP_RELU; return true;
    case AF_OP_SIGMOID: *op = AF_EP_SIGMOID; return true;
    case AF_OP_TANH: *op = AF_EP_TANH; return true;
    case AF_OP_HARD_SWISH: *op = AF_EP_HARD_SWISH; return true;
    case AF_OP_SILU: *op = AF_EP_SILU; return true;
    case AF_OP_LEAKY_RELU: *op = AF_EP_LEAKY_RELU; *p0 = af_attr_float(n, "alpha", 0.01f); return true;
    case AF_OP_ELU: *op = AF_EP_ELU; *p0 = af_attr_float(n, "alpha", 1.0f); return true;
    case AF_OP_HARD_SIGMOID:
        *op = AF_EP_HARD_SIGMOID;
        *p0 = af_attr_float(n, "alpha", 0.2f);
        *p1 = af_attr_float(n, "beta", 0.5f);
        return true;
    case AF_OP_GELU: {
        const char *a = af_attr_str(n, "approximate", "none");
        *op = AF_EP_GELU;
        *p0 = strcmp(a, "tanh") ? 0.0f : 1.0f;
        return !strcmp(a, "none") || !strcmp(a, "tanh");
    }
    case AF_OP_ERF: *op = AF_VUN_ERF; return true;
    case AF_OP_EXP: *op = AF_VUN_EXP; return true;
    case AF_OP_SOFTPLUS: *op = AF_VUN_SOFTPLUS; return true;
    case AF_OP_SQRT: *op = AF_VUN_SQRT; return true;
    case AF_OP_RECIPROCAL: *op = AF_VUN_RECIPROCAL; return true;
    case AF_OP_NEG: *op = AF_VUN_NEG; return true;
    case AF_OP_ABS: *op = AF_VUN_ABS; return true;
    default: return false;
    }
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

bool fk_fast_map(int op, float p0, float p1, const af_tensor *x, af_tensor *y, af_exec *ex) {
    if (af_isa_get() == AF_ISA_REFERENCE || x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT)
        return false;
    int64_t count = af_tensor_numel(x);
    if (count < 0 || count != af_tensor_numel(y)) return false;
    un_job j = {op, p0, p1, x->data, y->data};
    af_exec_parallel(count < 4 * PIECE ? NULL : ex, count, un_range, &j);
    return true;
}

bool fk_fast_unary(const af_node *n, const af_tensor *x, af_tensor *y, af_exec *ex) {
    int op;
    float p0, p1;
    return unary_op(n, &op, &p0, &p1) && fk_fast_map(op, p0, p1, x, y, ex);
}

/* The epilogue op of a binary ONNX op; Pow by a constant scalar 2 or 0.5 becomes a unary op. */
static bool binary_op(const af_node *n, const af_tensor *b, int *op, bool *unary) {
    *unary = false;
    switch (n->op) {
    case AF_OP_ADD: *op = AF_EP_ADD; return true;
    case AF_OP_SUB: *op = AF_EP_SUB; return true;
    case AF_OP_MUL: *op = AF_EP_MUL; return true;
    case AF_OP_DIV: *op = AF_EP_DIV; return true;
    case AF_OP_POW:
        if (b->dtype != AF_DTYPE_FLOAT || af_tensor_numel(b) != 1) return false;
        *unary = true;
        if (((const float *)b->data)[0] == 2.0f) *op = AF_VUN_SQUARE;
        else if (((const float *)b->data)[0] == 0.5f) *op = AF_VUN_SQRT;
        else return false;
        return true;
    default: return false;
    }
}

static bool same_dims(const af_tensor *a, const af_tensor *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

bool fk_fast_binary(const af_node *n, const af_tensor *a, const af_tensor *b, af_tensor *y,
                    af_exec *ex) {
    int op;
    bool unary;
    if (af_isa_get() == AF_ISA_REFERENCE || a->dtype != AF_DTYPE_FLOAT ||
        b->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT || y->rank < 1 ||
        !binary_op(n, b, &op, &unary))
        return false;
    int64_t count = af_tensor_numel(y);
    if (unary) return same_dims(a, y) && fk_fast_map(op, 0.0f, 0.0f, a, y, ex);
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
    if (v.generic) return false; /* the reference kernel's broadcast iterator is as good */
    fk_ep_run(ex, &v, x->data, y->data, count);
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

static void smax_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const row_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        float *y = j->y + r * j->len;
        if (y != j->x + r * j->len) memcpy(y, j->x + r * j->len, (size_t)j->len * sizeof(float));
        v->softmax_row(y, j->len);
    }
}

bool fk_fast_layernorm(const af_tensor *x, const af_tensor *scale, const af_tensor *bias,
                       float eps, int64_t rows, int64_t len, af_tensor *y, af_exec *ex) {
    if (af_isa_get() == AF_ISA_REFERENCE || x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT ||
        scale->dtype != AF_DTYPE_FLOAT || af_tensor_numel(scale) != len || len < 1 ||
        (bias && (bias->dtype != AF_DTYPE_FLOAT || af_tensor_numel(bias) != len)))
        return false;
    row_job j = {x->data, scale->data, bias ? bias->data : NULL, y->data, len, eps};
    af_exec_parallel(rows * len < 4 * PIECE ? NULL : ex, rows, ln_rows, &j);
    return true;
}

bool fk_fast_softmax(const af_tensor *x, int64_t rows, int64_t len, af_tensor *y, af_exec *ex) {
    if (af_isa_get() == AF_ISA_REFERENCE || x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT ||
        len < 1)
        return false;
    row_job j = {x->data, NULL, NULL, y->data, len, 0.0f};
    af_exec_parallel(rows * len < 4 * PIECE ? NULL : ex, rows, smax_rows, &j);
    return true;
}

typedef struct sum_job {
    const float *x;
    float *y;
    int64_t len;
    bool mean;
} sum_job;

static void sum_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const sum_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t r = begin; r < end; r++) {
        float s = v->row_sum(j->x + r * j->len, j->len);
        j->y[r] = j->mean ? s / (float)j->len : s;
    }
}

bool fk_fast_row_sums(const af_tensor *x, int64_t rows, int64_t len, bool mean, af_tensor *y,
                      af_exec *ex) {
    if (af_isa_get() == AF_ISA_REFERENCE || x->dtype != AF_DTYPE_FLOAT || y->dtype != AF_DTYPE_FLOAT ||
        len < 1 || af_tensor_numel(y) != rows)
        return false;
    sum_job j = {x->data, y->data, len, mean};
    af_exec_parallel(rows * len < 4 * PIECE ? NULL : ex, rows, sum_rows, &j);
    return true;
}

/* ---- Transpose ------------------------------------------------------------------------------ */

typedef struct tr_job {
    const float *x;
    float *y;
    int64_t r, c, cblocks; /* x [B, r, c] -> y [B, c, r] */
} tr_job;

enum { TR_BLOCK = 16 }; /* 16 x 16 floats: one cache line per row of the block on both sides */

/* Items are (batch, block of 16 columns of x = rows of y). */
static void tr_blocks(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const tr_job *j = ctx;
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / j->cblocks, c0 = it % j->cblocks * TR_BLOCK;
        int64_t c1 = c0 + TR_BLOCK < j->c ? c0 + TR_BLOCK : j->c;
        const float *x = j->x + b * j->r * j->c;
        float *y = j->y + b * j->r * j->c;
        for (int64_t r0 = 0; r0 < j->r; r0 += TR_BLOCK) {
            int64_t r1 = r0 + TR_BLOCK < j->r ? r0 + TR_BLOCK : j->r;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) y[c * j->r + r] = x[r * j->c + c];
        }
    }
}

bool fk_fast_transpose(const af_tensor *x, const int *perm, af_tensor *y, af_exec *ex) {
    if (af_isa_get() == AF_ISA_REFERENCE || x->dtype != AF_DTYPE_FLOAT || x->rank < 2 ||
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
    /* Taken: [R, C] -> [C, R] and [B, R, C] -> [B, C, R]. */
    tr_job j = {x->data, y->data, 0, 0, 0};
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
        return false;
    }
    j.cblocks = (j.c + TR_BLOCK - 1) / TR_BLOCK;
    af_exec_parallel(batch * j.r * j.c < 4 * PIECE ? NULL : ex, batch * j.cblocks, tr_blocks, &j);
    return true;
}
