/* The fast broadcast kernels: ops of two or more inputs that broadcast (numpy) to their output,
 * walked as rows. The output's dims are collapsed first (dims of 1 dropped, neighbours merged
 * where every input steps through them as one), so that the innermost dim is the longest run
 * along which each input either advances by one element or stays on one (a scalar, a channel's
 * value, a row's value). The outer dims are counted once per row, never per element, and each
 * row is one call of a row function: the vector ones of vec.h for float arithmetic, Max / Min
 * and comparisons, byte loops for the bool ops, copies by element size for Where.
 *
 * Taken: float32 Max, Min, Sum, Mean (any number of inputs), Pow (float exponent), Mod with
 * fmod = 1, PRelu, Add / Sub / Mul / Div in the broadcasts the vector epilogue cannot read
 * (fast_broadcast_binary, called by fast_binary), the comparisons of float32 into bool, And /
 * Or / Xor / Not on bool, and Where of any fixed-size dtype. Opset 7 on (legacy broadcasting is
 * the reference kernel's).
 *
 * Invariant: each output element is computed by the reference kernel's formula on the same
 * float values, so results are bit-identical to the reference (the reference computes in double
 * and rounds: the same bits for + - * / and the exact ops; Pow here is the double pow rounded,
 * as there). Every tensor is checked to hold its elements and to broadcast to the output before
 * anything is written; otherwise AF_DECLINED and the reference kernel runs (and reports). */
#include "kernels/fast/fast.h"
#include "kernels/simd/vec.h"

#include <math.h>
#include <string.h>

enum { BC_MAX_IN = 3, BC_CHUNK = 16384 };

/* The collapsed walk: dims[rank - 1] is the inner run; st[k][d] the element stride of input k
 * along dim d (0 where it broadcasts). The output is dense. */
typedef struct bc_geom {
    int rank, nin;
    int64_t dims[AF_MAX_RANK];
    int64_t st[BC_MAX_IN][AF_MAX_RANK];
} bc_geom;

/* t broadcasts unidirectionally to y (numpy, right-aligned). */
static bool bc_fits(const af_tensor *t, const af_tensor *y) {
    if (t->rank < 0 || t->rank > y->rank) return false;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i], w = y->dims[y->rank - t->rank + i];
        if (d != 1 && d != w) return false;
    }
    return true;
}

/* A tensor of the dtype whose data holds all its elements (size bytes each). */
static bool bc_ready(const af_tensor *t, af_dtype dt) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    size_t size = af_dtype_size(dt);
    return count >= 0 && t->dtype == dt && size > 0 &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / size));
}

static void bc_make(bc_geom *g, const af_tensor *y, const af_tensor *const *ts, int nin) {
    int64_t full[BC_MAX_IN][AF_MAX_RANK];
    for (int k = 0; k < nin; k++) af_broadcast_strides(ts[k], y, full[k]);
    g->rank = 0;
    g->nin = nin;
    for (int d = 0; d < y->rank; d++) {
        if (y->dims[d] == 1) continue;
        bool merge = g->rank > 0;
        for (int k = 0; merge && k < nin; k++)
            merge = g->st[k][g->rank - 1] == full[k][d] * y->dims[d];
        if (merge) {
            g->dims[g->rank - 1] *= y->dims[d];
            for (int k = 0; k < nin; k++) g->st[k][g->rank - 1] = full[k][d];
        } else {
            g->dims[g->rank] = y->dims[d];
            for (int k = 0; k < nin; k++) g->st[k][g->rank] = full[k][d];
            g->rank++;
        }
    }
    if (g->rank == 0) { /* a single element */
        g->rank = 1;
        g->dims[0] = 1;
        for (int k = 0; k < nin; k++) g->st[k][0] = 0;
    }
}

/* One row: y[i] = f(src[k][i * s[k]]), i < n (s[k] 0 or 1). */
typedef void (*bc_row_fn)(const void *op, void *y, const void *const *src, const int64_t *s,
                          int64_t n);

typedef struct bc_job {
    const bc_geom *g;
    bc_row_fn row;
    const void *op;
    const char *src[BC_MAX_IN];
    size_t isize[BC_MAX_IN], osize;
    char *y;
    int64_t chunks, chunk; /* each row cut into `chunks` pieces of `chunk` elements */
} bc_job;

/* Items are (outer row, piece of the row); the outer dims are counted along. */
static void bc_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const bc_job *j = ctx;
    const bc_geom *g = j->g;
    int outer = g->rank - 1;
    int64_t n = g->dims[outer], idx[AF_MAX_RANK], off[BC_MAX_IN] = {0};
    int64_t row = begin / j->chunks, piece = begin % j->chunks;
    for (int d = outer - 1; d >= 0; d--) {
        idx[d] = row % g->dims[d];
        row /= g->dims[d];
        for (int k = 0; k < g->nin; k++) off[k] += idx[d] * g->st[k][d];
    }
    row = begin / j->chunks;
    int64_t s[BC_MAX_IN];
    for (int k = 0; k < g->nin; k++) s[k] = g->st[k][outer];
    for (int64_t it = begin; it < end; it++) {
        int64_t i0 = piece * j->chunk, len = n - i0 < j->chunk ? n - i0 : j->chunk;
        const void *src[BC_MAX_IN];
        for (int k = 0; k < g->nin; k++)
            src[k] = j->src[k] + (size_t)(off[k] + i0 * s[k]) * j->isize[k];
        j->row(j->op, j->y + (size_t)(row * n + i0) * j->osize, src, s, len);
        if (++piece < j->chunks) continue;
        piece = 0;
        row++;
        for (int d = outer - 1; d >= 0; d--) { /* next row: carry through the outer dims */
            for (int k = 0; k < g->nin; k++) off[k] += g->st[k][d];
            if (++idx[d] < g->dims[d]) break;
            for (int k = 0; k < g->nin; k++) off[k] -= idx[d] * g->st[k][d];
            idx[d] = 0;
        }
    }
}

/* Run row over y = f(ts...) broadcast, in parallel; flops: operations per element. */
static void bc_run(af_exec *ex, const af_tensor *y, const af_tensor *const *ts, int nin,
                   bc_row_fn row, const void *op, double flops) {
    int64_t count = af_tensor_numel(y);
    if (count <= 0) return;
    bc_geom g;
    bc_make(&g, y, ts, nin);
    bc_job j = {.g = &g, .row = row, .op = op, .y = y->data, .osize = af_dtype_size(y->dtype)};
    for (int k = 0; k < nin; k++) {
        j.src[k] = ts[k]->data;
        j.isize[k] = af_dtype_size(ts[k]->dtype);
    }
    int64_t n = g.dims[g.rank - 1];
    j.chunks = (n + BC_CHUNK - 1) / BC_CHUNK;
    j.chunk = (n + j.chunks - 1) / j.chunks;
    double bytes = (double)count * (double)(j.osize + j.isize[0] + (nin > 1 ? j.isize[1] : 0));
    af_exec_parallel(ex, count / n * j.chunks, af_exec_work_ns(ex, flops * (double)count, bytes),
                     bc_range, &j);
}

/* ---- rows ------------------------------------------------------------------------------------ */

static void row_vbin(const void *op, void *y, const void *const *src, const int64_t *s,
                     int64_t n) {
    af_vec()->binary_row(*(const int *)op, src[0], s[0], src[1], s[1], y, n);
}

static void row_vcmp(const void *op, void *y, const void *const *src, const int64_t *s,
                     int64_t n) {
    af_vec()->compare_row(*(const int *)op, src[0], s[0], src[1], s[1], y, n);
}

/* Pow in double, rounded (the reference kernel's formula). */
static void row_pow(const void *op, void *y, const void *const *src, const int64_t *s,
                    int64_t n) {
    (void)op;
    const float *a = src[0], *b = src[1];
    float *o = y;
    for (int64_t i = 0; i < n; i++) o[i] = (float)pow((double)a[i * s[0]], (double)b[i * s[1]]);
}

/* PRelu: x < 0 ? x * slope : x (exact in float: one product, rounded once, as the reference's). */
static void row_prelu(const void *op, void *y, const void *const *src, const int64_t *s,
                      int64_t n) {
    (void)op;
    const float *a = src[0], *b = src[1];
    float *o = y;
    for (int64_t i = 0; i < n; i++) {
        float v = a[i * s[0]];
        o[i] = v < 0 ? v * b[i * s[1]] : v;
    }
}

/* C fmod: exact, so fmodf gives the bits of the reference's double fmod. */
static void row_fmod(const void *op, void *y, const void *const *src, const int64_t *s,
                     int64_t n) {
    (void)op;
    const float *a = src[0], *b = src[1];
    float *o = y;
    for (int64_t i = 0; i < n; i++) o[i] = fmodf(a[i * s[0]], b[i * s[1]]);
}

/* Bool ops: operands are true when nonzero, results 0 or 1 (as the reference stores them). */
#define BOOL_ROW(name, expr)                                                                   \
    static void name(const void *op, void *y, const void *const *src, const int64_t *s,      \
                     int64_t n) {                                                              \
        (void)op;                                                                              \
        const uint8_t *a = src[0], *b = src[1];                                                \
        uint8_t *o = y;                                                                        \
        int64_t sa = s[0], sb = s[1];                                                          \
        for (int64_t i = 0; i < n; i++) {                                                      \
            unsigned p = a[i * sa] != 0, q = b[i * sb] != 0;                                   \
            o[i] = (uint8_t)(expr);                                                            \
        }                                                                                      \
    }
BOOL_ROW(row_and, p & q)
BOOL_ROW(row_or, p | q)
BOOL_ROW(row_xor, p ^ q)

/* Where: whole elements of 1, 2, 4 or 8 bytes. */
#define WHERE_ROW(name, T)                                                                     \
    static void name(const void *op, void *y, const void *const *src, const int64_t *s,      \
                     int64_t n) {                                                              \
        (void)op;                                                                              \
        const uint8_t *c = src[0];                                                             \
        const T *a = src[1], *b = src[2];                                                      \
        T *o = y;                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = c[i * s[0]] ? a[i * s[1]] : b[i * s[2]];       \
    }
WHERE_ROW(row_where8, uint8_t)
WHERE_ROW(row_where16, uint16_t)
WHERE_ROW(row_where32, uint32_t)
WHERE_ROW(row_where64, uint64_t)

/* ---- the kernels ----------------------------------------------------------------------------- */

/* Inputs [0, nin) of dtype dt broadcast to out[0] of dtype odt, everything ready. */
static bool bc_inputs_ok(const af_node *n, const af_tensor *const *in, int nin, af_dtype dt,
                         const af_tensor *y, af_dtype odt) {
    if (af_graph_opset(n->graph) < 7 || !bc_ready(y, odt) || y->rank > AF_MAX_RANK) return false;
    for (int k = 0; k < nin; k++)
        if (!in[k] || !bc_ready(in[k], dt) || !bc_fits(in[k], y)) return false;
    return true;
}

static int vbin_of(af_op op) {
    switch (op) {
    case AF_OP_ADD: case AF_OP_SUM: case AF_OP_MEAN: return AF_VBIN_ADD;
    case AF_OP_SUB: return AF_VBIN_SUB;
    case AF_OP_MUL: return AF_VBIN_MUL;
    case AF_OP_DIV: return AF_VBIN_DIV;
    case AF_OP_MAX: return AF_VBIN_MAX;
    case AF_OP_MIN: return AF_VBIN_MIN;
    case AF_OP_EQUAL: return AF_VBIN_EQ;
    case AF_OP_LESS: return AF_VBIN_LT;
    case AF_OP_GREATER: return AF_VBIN_GT;
    case AF_OP_LESS_OR_EQUAL: return AF_VBIN_LE;
    case AF_OP_GREATER_OR_EQUAL: return AF_VBIN_GE;
    default: return 0;
    }
}

/* float32 Add / Sub / Mul / Div / Pow / Mod of two inputs, any broadcast. */
af_status fast_broadcast_binary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_exec *x) {
    int op = vbin_of(n->op);
    bc_row_fn row = row_vbin;
    if (n->op == AF_OP_POW) row = row_pow;
    else if (n->op == AF_OP_MOD && af_attr_int(n, "fmod", 0) != 0) row = row_fmod;
    else if (n->op == AF_OP_PRELU) row = row_prelu;
    else if (!op || op > AF_VBIN_MIN) return AF_DECLINED;
    if (n->nin != 2 || !bc_inputs_ok(n, in, 2, AF_DTYPE_FLOAT, &out[0], AF_DTYPE_FLOAT))
        return AF_DECLINED;
    bc_run(x, &out[0], in, 2, row, &op, row == row_vbin ? 1.0 : 20.0);
    return AF_OK;
}

/* float32 Max, Min, Sum, Mean of one or more inputs: folded left to right into the output (as
 * the reference kernel does: the same roundings). */
af_status fast_variadic(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *x, af_error *err) {
    (void)err;
    int op = vbin_of(n->op);
    if (n->nin < 1 || !op || !bc_inputs_ok(n, in, n->nin, AF_DTYPE_FLOAT, &out[0], AF_DTYPE_FLOAT))
        return AF_DECLINED;
    /* The output's shape must be the broadcast of the inputs (the shape function's): some input
     * has each of its dims. */
    for (int d = 0; d < out[0].rank; d++) {
        bool seen = false;
        for (int k = 0; k < n->nin && !seen; k++) {
            int a = d - (out[0].rank - in[k]->rank);
            seen = a >= 0 && in[k]->dims[a] == out[0].dims[d];
        }
        if (!seen) return AF_DECLINED;
    }
    if (n->nin == 1) { /* a copy, broadcast: the value max(x, x) is x (NaN too) */
        const af_tensor *two[2] = {in[0], in[0]};
        int cp = AF_VBIN_MAX;
        bc_run(x, &out[0], two, 2, row_vbin, &cp, 1.0);
    } else {
        bc_run(x, &out[0], in, 2, row_vbin, &op, 1.0);
    }
    for (int k = 2; k < n->nin; k++) {
        const af_tensor *two[2] = {&out[0], in[k]};
        bc_run(x, &out[0], two, 2, row_vbin, &op, 1.0);
    }
    if (n->op == AF_OP_MEAN && n->nin > 1) {
        float cnt = (float)n->nin;
        af_tensor c = {.dtype = AF_DTYPE_FLOAT, .rank = 0, .data = &cnt, .nbytes = sizeof cnt};
        const af_tensor *two[2] = {&out[0], &c};
        int div = AF_VBIN_DIV;
        bc_run(x, &out[0], two, 2, row_vbin, &div, 1.0);
    }
    return AF_OK;
}

/* Comparisons of float32 into bool. */
af_status fast_compare(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                       af_error *err) {
    (void)err;
    int op = vbin_of(n->op);
    if (n->nin != 2 || op < AF_VBIN_EQ ||
        !bc_inputs_ok(n, in, 2, AF_DTYPE_FLOAT, &out[0], AF_DTYPE_BOOL))
        return AF_DECLINED;
    bc_run(x, &out[0], in, 2, row_vcmp, &op, 1.0);
    return AF_OK;
}

/* And, Or, Xor on bool. */
af_status fast_logical(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                       af_error *err) {
    (void)err;
    bc_row_fn row = n->op == AF_OP_AND ? row_and : n->op == AF_OP_OR ? row_or
                  : n->op == AF_OP_XOR ? row_xor : NULL;
    if (!row || n->nin != 2 || !bc_inputs_ok(n, in, 2, AF_DTYPE_BOOL, &out[0], AF_DTYPE_BOOL))
        return AF_DECLINED;
    bc_run(x, &out[0], in, 2, row, NULL, 1.0);
    return AF_OK;
}

typedef struct not_job {
    const uint8_t *x;
    uint8_t *y;
} not_job;

static void not_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const not_job *j = ctx;
    for (int64_t i = begin; i < end; i++) j->y[i] = j->x[i] == 0;
}

/* Not on bool. */
af_status fast_not(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)err;
    if (n->nin != 1 || !bc_ready(in[0], AF_DTYPE_BOOL) || !bc_ready(&out[0], AF_DTYPE_BOOL) ||
        af_tensor_numel(in[0]) != af_tensor_numel(&out[0]))
        return AF_DECLINED;
    int64_t count = af_tensor_numel(&out[0]);
    not_job j = {in[0]->data, out[0].data};
    af_exec_parallel(x, count, af_exec_work_ns(x, (double)count, 2.0 * (double)count), not_range,
                     &j);
    return AF_OK;
}

/* Where(cond, x, y) for x and y of any dtype of 1, 2, 4 or 8 bytes. */
af_status fast_where(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)err;
    if (n->nin != 3 || !in[0] || !in[1] || !in[2] || in[1]->dtype == AF_DTYPE_STRING)
        return AF_DECLINED;
    af_dtype dt = in[1]->dtype;
    bc_row_fn row = NULL;
    switch (af_dtype_size(dt)) {
    case 1: row = row_where8; break;
    case 2: row = row_where16; break;
    case 4: row = row_where32; break;
    case 8: row = row_where64; break;
    default: return AF_DECLINED;
    }
    if (!bc_inputs_ok(n, in, 1, AF_DTYPE_BOOL, &out[0], dt) ||
        !bc_inputs_ok(n, in + 1, 2, dt, &out[0], dt))
        return AF_DECLINED;
    bc_run(x, &out[0], in, 3, row, NULL, 1.0);
    return AF_OK;
}
