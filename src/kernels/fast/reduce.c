/* The fast float32 reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,SumSquare,LogSum,LogSumExp}
 * over any set of axes, ArgMax / ArgMin along one axis, and the normalisations by planes:
 * InstanceNormalization and our GroupNorm (one vector pass per plane or group for its mean, one
 * for the variance, one to write; GroupNorm then runs its epilogue on the group in cache).
 *
 * A reduction first drops the dims of 1 and merges neighbouring axes that are both reduced or
 * both kept, so X becomes runs of alternating kind (at most rank of them). Two forms follow
 * from the last run:
 *   reduced ("rows"): each output element folds contiguous runs of L elements (vec reduce_run),
 *     one per combination of the other reduced runs; the outputs are the parallel items;
 *   kept ("columns"): each output row of L elements accumulates rows of X (vec reduce_acc), one
 *     per combination of the reduced runs; the items are (output row, block of columns), so a
 *     reduction to one row still runs in parallel.
 * A rows form with few outputs of many elements each (a reduction to a scalar) folds fixed
 * chunks of each output's elements in parallel and joins the partials in order.
 * Both visit X's elements in memory order for each output, as the reference does (the
 * reference adds in double, these in float lanes: results agree within float rounding).
 *
 * Invariant: every tensor read or written is float32 (int64 for Arg*) and holds its elements;
 * anything else (other dtypes, empty tensors, axes not known, noop_with_empty_axes) is
 * AF_DECLINED before anything is written, and the reference kernel runs it. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"
#include "kernels/simd/vec.h"
#include "ir/epilogue.h"

#include <math.h>
#include <string.h>

/* A float32 (or other dtype dt) tensor whose data holds all its elements. */
static bool ready(const af_tensor *t, af_dtype dt) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && t->dtype == dt &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / af_dtype_size(dt)));
}

/* ---- Reduce* ---------------------------------------------------------------------------------- */

/* What the op folds (af_vred) and how the fold becomes the output. */
typedef enum post { P_NONE, P_MEAN, P_SQRT, P_LOG, P_LSE } post;

static void reduce_kind(af_op op, int *fold, post *p) {
    *p = P_NONE;
    switch (op) {
    case AF_OP_REDUCE_MEAN: *fold = AF_VRED_SUM; *p = P_MEAN; break;
    case AF_OP_REDUCE_MAX: *fold = AF_VRED_MAX; break;
    case AF_OP_REDUCE_MIN: *fold = AF_VRED_MIN; break;
    case AF_OP_REDUCE_PROD: *fold = AF_VRED_PROD; break;
    case AF_OP_REDUCE_L1: *fold = AF_VRED_ABS; break;
    case AF_OP_REDUCE_L2: *fold = AF_VRED_SQ; *p = P_SQRT; break;
    case AF_OP_REDUCE_SUM_SQUARE: *fold = AF_VRED_SQ; break;
    case AF_OP_REDUCE_LOG_SUM: *fold = AF_VRED_SUM; *p = P_LOG; break;
    case AF_OP_REDUCE_LOG_SUM_EXP: *fold = AF_VRED_MAX; *p = P_LSE; break; /* then EXP */
    default: *fold = AF_VRED_SUM; break;
    }
}

typedef struct red_job {
    const float *x;
    float *y, *sum; /* sum: LogSumExp's sums in the column form (y holds the maxima) */
    int fold;
    post post;
    float count; /* elements per output */
    /* runs: size and stride in X; red[i]: reduced */
    int nruns;
    int64_t size[AF_MAX_RANK], stride[AF_MAX_RANK];
    bool red[AF_MAX_RANK];
    int64_t len;         /* the last run's size */
    int64_t combos;      /* combinations of the reduced runs that are iterated */
    int64_t blocks, blk; /* column form: blocks of blk columns per output row */
} red_job;

/* Offset in X of the kept runs' coordinates for output element (rows form) or output row
 * (columns form) o: the kept runs other than the last one in the columns form. */
static int64_t kept_base(const red_job *j, int64_t o, int upto) {
    int64_t off = 0;
    for (int r = upto - 1; r >= 0; r--) {
        if (j->red[r]) continue;
        off += o % j->size[r] * j->stride[r];
        o /= j->size[r];
    }
    return off;
}

/* Offset of combination c of the reduced runs before run `upto`, in memory order. */
static int64_t red_off(const red_job *j, int64_t c, int upto) {
    int64_t off = 0;
    for (int r = upto - 1; r >= 0; r--) {
        if (!j->red[r]) continue;
        off += c % j->size[r] * j->stride[r];
        c /= j->size[r];
    }
    return off;
}

static float finish(const red_job *j, float v, float m) {
    switch (j->post) {
    case P_MEAN: return v / j->count;
    case P_SQRT: return sqrtf(v);
    case P_LOG: return logf(v);
    case P_LSE: return isfinite(m) ? m + logf(v) : m;
    default: return v;
    }
}

static float fold_join(int fold, float a, float b) {
    switch (fold) {
    case AF_VRED_PROD: return a * b;
    case AF_VRED_MAX: return a != a ? a : (b > a || b != b ? b : a);
    case AF_VRED_MIN: return a != a ? a : (b < a || b != b ? b : a);
    default: return a + b;
    }
}

/* The fold of output o's runs (rows form); shift: EXP's. */
static float fold_rows(const red_job *j, const af_vec_ops *v, int fold, int64_t base, float shift) {
    int last = j->nruns - 1;
    float acc = v->reduce_run(fold, j->x + base + red_off(j, 0, last), j->len, shift);
    for (int64_t c = 1; c < j->combos; c++)
        acc = fold_join(fold, acc, v->reduce_run(fold, j->x + base + red_off(j, c, last), j->len, shift));
    return acc;
}

static void rows_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const red_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t o = begin; o < end; o++) {
        int64_t base = kept_base(j, o, j->nruns - 1);
        float m = fold_rows(j, v, j->fold, base, 0.0f), s = m;
        if (j->post == P_LSE && isfinite(m)) s = fold_rows(j, v, AF_VRED_EXP, base, m);
        j->y[o] = finish(j, s, m);
    }
}

/* Few outputs over many elements (a reduction to a scalar): each output's elements, in memory
 * order, cut into chunks of CHUNK whatever the thread count, a partial fold per (output,
 * chunk) in parallel, the partials joined in order: the same bits at any thread count. */
enum { CHUNK = 65536 };

typedef struct part_job {
    const red_job *j;
    int fold;
    const float *shift; /* EXP: per output */
    float *part;        /* [m][nq] */
    int64_t nq;
} part_job;

static void part_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const part_job *p = ctx;
    const red_job *j = p->j;
    const af_vec_ops *v = af_vec();
    int last = j->nruns - 1;
    int64_t total = j->combos * j->len;
    for (int64_t it = begin; it < end; it++) {
        int64_t o = it / p->nq, r = it % p->nq * CHUNK, stop = r + CHUNK < total ? r + CHUNK : total;
        int64_t base = kept_base(j, o, last);
        float sh = p->shift ? p->shift[o] : 0.0f, acc = 0.0f;
        for (bool first = true; r < stop; first = false) {
            int64_t c = r / j->len, i = r % j->len, len = j->len - i < stop - r ? j->len - i : stop - r;
            float f = v->reduce_run(p->fold, j->x + base + red_off(j, c, last) + i, len, sh);
            acc = first ? f : fold_join(p->fold, acc, f);
            r += len;
        }
        p->part[it] = acc;
    }
}

/* partial folds of every output into p->part, then joined into out[o] */
static void partials(af_exec *x, double ns, part_job *p, int64_t m, float *out) {
    af_exec_parallel(x, m * p->nq, ns, part_range, p);
    for (int64_t o = 0; o < m; o++) {
        float acc = p->part[o * p->nq];
        for (int64_t q = 1; q < p->nq; q++) acc = fold_join(p->fold, acc, p->part[o * p->nq + q]);
        out[o] = acc;
    }
}

static af_status rows_split(red_job *j, int64_t m, double ns, af_exec *x) {
    int64_t nq = (j->combos * j->len + CHUNK - 1) / CHUNK;
    float *mem = af_exec_scratch(x, (size_t)(m * nq + 2 * m) * sizeof(float));
    if (!mem) return AF_DECLINED;
    float *mx = mem + m * nq, *sum = mx + m;
    part_job p = {j, j->fold, NULL, mem, nq};
    partials(x, ns, &p, m, mx);
    if (j->post == P_LSE) { /* (a sum under a maximum that is not finite is not used) */
        p.fold = AF_VRED_EXP;
        p.shift = mx;
        partials(x, ns, &p, m, sum);
        for (int64_t o = 0; o < m; o++) j->y[o] = finish(j, sum[o], mx[o]);
        return AF_OK;
    }
    for (int64_t o = 0; o < m; o++) j->y[o] = finish(j, mx[o], mx[o]);
    return AF_OK;
}

static void fill(float *p, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

static void cols_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const red_job *j = ctx;
    const af_vec_ops *v = af_vec();
    int last = j->nruns - 1;
    for (int64_t it = begin; it < end; it++) {
        int64_t row = it / j->blocks, c0 = it % j->blocks * j->blk;
        int64_t nc = j->len - c0 < j->blk ? j->len - c0 : j->blk;
        int64_t base = kept_base(j, row, last) + c0;
        float *y = j->y + row * j->len + c0;
        fill(y, nc, j->fold == AF_VRED_MAX ? -INFINITY : j->fold == AF_VRED_MIN ? INFINITY
                    : j->fold == AF_VRED_PROD ? 1.0f : 0.0f);
        for (int64_t c = 0; c < j->combos; c++)
            v->reduce_acc(j->fold, j->x + base + red_off(j, c, last), nc, y, NULL);
        if (j->post == P_LSE) {
            /* sums of e^(x - max) where the max is finite (the others keep the max) */
            float *s = j->sum + row * j->len + c0;
            fill(s, nc, 0.0f);
            for (int64_t c = 0; c < j->combos; c++)
                v->reduce_acc(AF_VRED_EXP, j->x + base + red_off(j, c, last), nc, s, y);
            for (int64_t i = 0; i < nc; i++) y[i] = finish(j, s[i], y[i]);
        } else if (j->post != P_NONE) {
            for (int64_t i = 0; i < nc; i++) y[i] = finish(j, y[i], 0.0f);
        }
    }
}

/* Runs of X after dropping dims of 1 and merging neighbours of the same kind; at least one
 * run, and the last one kept when no dim is left or nothing is reduced. */
static void make_runs(const af_tensor *x, const bool *red, red_job *j) {
    j->nruns = 0;
    for (int a = 0; a < x->rank; a++) {
        if (x->dims[a] == 1) continue;
        if (j->nruns > 0 && j->red[j->nruns - 1] == red[a]) {
            j->size[j->nruns - 1] *= x->dims[a];
            continue;
        }
        j->red[j->nruns] = red[a];
        j->size[j->nruns++] = x->dims[a];
    }
    if (j->nruns == 0) {
        j->red[0] = false;
        j->size[j->nruns++] = 1;
    }
    int64_t s = 1;
    for (int r = j->nruns - 1; r >= 0; r--) {
        j->stride[r] = s;
        s *= j->size[r];
    }
}

af_status fast_reduce(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    bool red[AF_MAX_RANK], noop, known;
    const af_tensor *t = in[0];
    if (n->nin < 1 || n->nout != 1 || !ready(t, AF_DTYPE_FLOAT) ||
        !ready(&out[0], AF_DTYPE_FLOAT) || t->rank < 0 || t->rank > AF_MAX_RANK ||
        tn_reduce_axes(n, in, t, red, &noop, &known, NULL) || !known || noop)
        return AF_DECLINED;
    int64_t total = af_tensor_numel(t), m = af_tensor_numel(&out[0]);
    red_job j;
    memset(&j, 0, sizeof j);
    make_runs(t, red, &j);
    int64_t kept = 1;
    for (int r = 0; r < j.nruns; r++) kept *= j.red[r] ? 1 : j.size[r];
    if (total <= 0 || m != kept) return AF_DECLINED; /* empty reductions: the reference's */
    j.x = t->data;
    j.y = out[0].data;
    reduce_kind(n->op, &j.fold, &j.post);
    j.count = (float)(total / m);
    j.len = j.size[j.nruns - 1];
    bool rows = j.red[j.nruns - 1];
    j.combos = total / m / (rows ? j.len : 1);
    double flops = (j.post == P_LSE ? 20.0 : 1.0) * (double)total;
    double ns = af_exec_work_ns(x, flops, 4.0 * (double)total);
    if (rows && m < 16 && j.combos * j.len >= 2 * CHUNK) return rows_split(&j, m, ns, x);
    if (rows) {
        af_exec_parallel(x, m, ns, rows_range, &j);
        return AF_OK;
    }
    /* Columns: blocks of at most 4096 floats, smaller when there are few output rows, so that
     * two threads have several items each. */
    int64_t outrows = m / j.len, nb = (j.len + 4095) / 4096;
    if (outrows * nb < 16) {
        int64_t want = (16 + outrows - 1) / outrows, most = (j.len + 63) / 64;
        nb = want < most ? want : most;
    }
    j.blk = ((j.len + nb - 1) / nb + 15) / 16 * 16;
    j.blocks = (j.len + j.blk - 1) / j.blk;
    if (j.post == P_LSE) {
        j.sum = af_exec_scratch(x, (size_t)m * sizeof(float));
        if (!j.sum) return AF_DECLINED;
    }
    af_exec_parallel(x, outrows * j.blocks, ns, cols_range, &j);
    return AF_OK;
}

/* ---- ArgMax / ArgMin ------------------------------------------------------------------------ */

/* The reference's order (tn_cmp): NaN above everything, NaNs equal to each other. */
static inline int cmp_nan_high(float a, float b) {
    bool na = a != a, nb = b != b;
    if (na || nb) return (int)na - (int)nb;
    return (a > b) - (a < b);
}

typedef struct arg_job {
    const float *x;
    int64_t *y;
    int64_t dim, inner, iblocks;
    int want; /* the sign of cmp(candidate, best) that replaces best */
    bool last;
} arg_job;

enum { ARG_BLOCK = 256 };

/* One row along the axis (inner == 1): the extreme by a vector fold, then its first (or last)
 * index by comparison; rows holding a NaN take the exact scalar loop. */
static int64_t arg_row(const arg_job *j, const float *x, const af_vec_ops *v) {
    float e = v->reduce_run(j->want > 0 ? AF_VRED_MAX : AF_VRED_MIN, x, j->dim, 0.0f);
    if (e == e) {
        if (j->last) {
            for (int64_t i = j->dim - 1; i > 0; i--)
                if (x[i] == e) return i;
            return 0;
        }
        for (int64_t i = 0; i < j->dim; i++)
            if (x[i] == e) return i;
        return 0;
    }
    int64_t best = 0;
    for (int64_t i = 1; i < j->dim; i++) {
        int c = cmp_nan_high(x[i], x[best]);
        if (c == j->want || (j->last && c == 0)) best = i;
    }
    return best;
}

static void arg_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const arg_job *j = ctx;
    const af_vec_ops *v = af_vec();
    float best[ARG_BLOCK];
    for (int64_t it = begin; it < end; it++) {
        int64_t a = it / j->iblocks, i0 = it % j->iblocks * ARG_BLOCK;
        if (j->inner == 1) {
            j->y[a] = arg_row(j, j->x + a * j->dim, v);
            continue;
        }
        int64_t ni = j->inner - i0 < ARG_BLOCK ? j->inner - i0 : ARG_BLOCK;
        const float *x = j->x + a * j->dim * j->inner + i0;
        int64_t *y = j->y + a * j->inner + i0;
        af_copy(best, x, (size_t)ni * sizeof(float));
        for (int64_t i = 0; i < ni; i++) y[i] = 0;
        for (int64_t d = 1; d < j->dim; d++) {
            const float *row = x + d * j->inner;
            for (int64_t i = 0; i < ni; i++) {
                int c = cmp_nan_high(row[i], best[i]);
                if (c == j->want || (j->last && c == 0)) {
                    best[i] = row[i];
                    y[i] = d;
                }
            }
        }
    }
}

af_status fast_arg(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)err;
    const af_tensor *t = n->nin == 1 ? in[0] : NULL;
    int axis;
    if (!t || n->nout != 1 || !ready(t, AF_DTYPE_FLOAT) || !ready(&out[0], AF_DTYPE_INT64) ||
        t->rank < 1 || !af_axis(af_attr_int(n, "axis", 0), t->rank, &axis))
        return AF_DECLINED;
    arg_job j = {t->data, out[0].data, t->dims[axis], tn_prod(t->dims, axis + 1, t->rank), 0,
                 n->op == AF_OP_ARGMIN ? -1 : 1, af_attr_int(n, "select_last_index", 0) != 0};
    int64_t outer = tn_prod(t->dims, 0, axis);
    if (j.dim < 1 || outer * j.inner < 1 || af_tensor_numel(&out[0]) != outer * j.inner)
        return AF_DECLINED;
    j.iblocks = (j.inner + ARG_BLOCK - 1) / ARG_BLOCK;
    int64_t total = af_tensor_numel(t);
    af_exec_parallel(x, outer * j.iblocks, af_exec_work_ns(x, 2.0 * (double)total, 4.0 * (double)total),
                     arg_range, &j);
    return AF_OK;
}

/* ---- InstanceNormalization --------------------------------------------------------------------- */

typedef struct in_job {
    const float *x, *scale, *bias;
    float *y;
    int64_t c, inner;
    float eps;
} in_job;

static void in_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const in_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t p = begin; p < end; p++) {
        float mean, var;
        v->moments(j->x + p * j->inner, j->inner, &mean, &var);
        v->norm_affine(j->x + p * j->inner, j->y + p * j->inner, j->inner, mean,
                       j->scale[p % j->c] / sqrtf(var + j->eps), j->bias[p % j->c]);
    }
}

/* X [N, C, ...] float32 with C-element float32 scale and B: vec moments and norm_affine per
 * (n, c) plane, the planes in parallel. */
af_status fast_instancenorm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_exec *x, af_error *err) {
    (void)err;
    if (n->nin != 3 || n->nout != 1 || !ready(in[0], AF_DTYPE_FLOAT) ||
        !ready(in[1], AF_DTYPE_FLOAT) || !ready(in[2], AF_DTYPE_FLOAT) ||
        !ready(&out[0], AF_DTYPE_FLOAT) || in[0]->rank < 2)
        return AF_DECLINED;
    const af_tensor *t = in[0];
    in_job j = {t->data, in[1]->data, in[2]->data, out[0].data, t->dims[1],
                tn_prod(t->dims, 2, t->rank), af_attr_float(n, "epsilon", 1e-5f)};
    int64_t planes = t->dims[0] * j.c, total = af_tensor_numel(t);
    if (planes < 1 || j.inner < 1 || af_tensor_numel(&out[0]) != total ||
        af_tensor_numel(in[1]) != j.c || af_tensor_numel(in[2]) != j.c)
        return AF_DECLINED;
    af_exec_parallel(x, planes, af_exec_work_ns(x, 5.0 * (double)total, 12.0 * (double)total),
                     in_range, &j);
    return AF_OK;
}

/* ---- GroupNorm (ours: kernels/ref/nn.c) ------------------------------------------------------ */

typedef struct gn_job {
    const float *x, *scale, *bias;
    float *y;
    int64_t groups, cpg, inner, cols;
    float eps;
    const af_vep *v;
} gn_job;

/* Items are (n, group): the group's channels are contiguous, so its moments are one run; then
 * each channel's write with its scale and bias, then the epilogue while the group is in cache
 * (a group is whole rows of the output's last dim). */
static void gn_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gn_job *j = ctx;
    const af_vec_ops *v = af_vec();
    int64_t count = j->cpg * j->inner;
    for (int64_t g = begin; g < end; g++) {
        const float *x = j->x + g * count;
        float *y = j->y + g * count;
        float mean, var;
        v->moments(x, count, &mean, &var);
        float inv = 1.0f / sqrtf(var + j->eps);
        for (int64_t c = 0; c < j->cpg; c++) {
            int64_t ch = g % j->groups * j->cpg + c;
            v->norm_affine(x + c * j->inner, y + c * j->inner, j->inner, mean, inv * j->scale[ch],
                           j->bias[ch]);
        }
        if (j->v->nsteps || j->v->generic)
            v->ep_tile(j->v, y, j->cols, g * count / j->cols, 0, count / j->cols, j->cols);
    }
}

/* ---- GroupNorm channels-last (the layout pass's form: X [N, positions..., C]) ------------------ */

enum { GNCL_CBLOCK = 64, GNCL_ROWS = 64 };

typedef struct gncl_job {
    const float *x, *scale, *bias;
    float *y;
    int64_t pos, c, groups, cpg, cblocks, rblocks;
    float eps;
    double *mean, *var; /* per (n, channel): sums, then per group in the group's first channel */
    float *mu, *a;      /* per (n, channel): y = (x - mu) * a + bias */
    const af_vep *v;
} gncl_job;

/* Items (n, block of channels): each channel's sum over positions (pass 0), or its sum of
 * squared deviations from its group's mean (pass 1), rows added in vector lanes (vec
 * reduce_acc) into float sums that go into double ones every GNCL_ROWS rows, so that a long
 * run of positions (wav2vec2's 3199) loses no more than 64 float additions do. Element by
 * element in double this took 1.8 of wav2vec2's 70 ms. */
static void gncl_sums(const gncl_job *j, int64_t begin, int64_t end, int pass) {
    const af_vec_ops *v = af_vec();
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / j->cblocks, c0 = it % j->cblocks * GNCL_CBLOCK;
        int64_t nc = j->c - c0 < GNCL_CBLOCK ? j->c - c0 : GNCL_CBLOCK;
        double acc[GNCL_CBLOCK] = {0};
        float part[GNCL_CBLOCK], mu[GNCL_CBLOCK];
        for (int64_t k = 0; pass && k < nc; k++)
            mu[k] = (float)j->mean[b * j->c + (c0 + k) / j->cpg * j->cpg];
        const float *x = j->x + b * j->pos * j->c + c0;
        for (int64_t p0 = 0; p0 < j->pos; p0 += GNCL_ROWS) {
            int64_t rows = j->pos - p0 < GNCL_ROWS ? j->pos - p0 : GNCL_ROWS;
            memset(part, 0, sizeof part);
            for (int64_t p = p0; p < p0 + rows; p++)
                v->reduce_acc(pass ? AF_VRED_SQ : AF_VRED_SUM, x + p * j->c, nc, part, pass ? mu : NULL);
            for (int64_t k = 0; k < nc; k++) acc[k] += part[k];
        }
        memcpy((pass ? j->var : j->mean) + b * j->c + c0, acc, (size_t)nc * sizeof(double));
    }
}

static void gncl_mean(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    gncl_sums(ctx, begin, end, 0);
}

static void gncl_var(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    gncl_sums(ctx, begin, end, 1);
}

/* Per (n, group): the channels' sums joined in channel order and divided by the group's
 * count, kept in the group's first channel (the mean after pass 0, the variance after 1). */
static void gncl_join(const gncl_job *j, int64_t n, double *s) {
    double count = (double)(j->cpg * j->pos);
    for (int64_t g = 0; g < n * j->groups; g++) {
        double t = 0;
        for (int64_t k = 0; k < j->cpg; k++) t += s[g * j->cpg + k];
        s[g * j->cpg] = t / count;
    }
}

/* Items (n, block of rows): y = (x - mu) * a + bias per channel (not x * a + (bias - mu a),
 * which loses the digits of a channel whose mean is large against its spread), then the
 * epilogue on those rows. */
static void gncl_write(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gncl_job *j = ctx;
    const af_vec_ops *v = af_vec();
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / j->rblocks, p0 = it % j->rblocks * GNCL_ROWS;
        int64_t rows = j->pos - p0 < GNCL_ROWS ? j->pos - p0 : GNCL_ROWS;
        const float *mu = j->mu + b * j->c, *a = j->a + b * j->c;
        int64_t row0 = b * j->pos + p0;
        for (int64_t r = 0; r < rows; r++) {
            float *y = j->y + (row0 + r) * j->c;
            v->binary_row(AF_VBIN_SUB, j->x + (row0 + r) * j->c, 1, mu, 1, y, j->c);
            v->binary_row(AF_VBIN_MUL, y, 1, a, 1, y, j->c);
            v->binary_row(AF_VBIN_ADD, y, 1, j->bias, 1, y, j->c);
        }
        if (j->v->nsteps || j->v->generic)
            v->ep_tile(j->v, j->y + row0 * j->c, j->c, row0, 0, rows, j->c);
    }
}

/* Checks of the channels-last form; errors rather than declines, since the reference kernel
 * reads only the NCHW form. */
static af_status gncl_check(const af_node *n, const af_tensor *const *in, af_error *err) {
    const af_tensor *t = in[0];
    int64_t groups = af_attr_int(n, "num_groups", 0), c = t && t->rank >= 3 ? t->dims[t->rank - 1] : -1;
    if (n->nin < 3 || n->nout != 1 || !t || t->dtype != AF_DTYPE_FLOAT || t->rank < 3 || groups < 1 ||
        c < 1 || c % groups || !in[1] || !in[2] || in[1]->dtype != AF_DTYPE_FLOAT ||
        in[2]->dtype != AF_DTYPE_FLOAT || af_tensor_numel(in[1]) != c || af_tensor_numel(in[2]) != c)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "channels-last GroupNorm needs float32 X [N, ..., C], num_groups "
                            "dividing C, scale and bias of C");
    return AF_OK;
}

af_status fast_shape_group_norm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_error *err) {
    af_status st = gncl_check(n, in, err);
    if (st != AF_OK) return st;
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, in[0]->rank, in[0]->dims);
    return af_epilogue_validate(n, in, &out[0], err);
}

static af_status group_norm_cl(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *x, af_error *err) {
    af_status st = gncl_check(n, in, err);
    const af_tensor *t = in[0];
    if (st == AF_OK && (!ready(t, AF_DTYPE_FLOAT) || !ready(in[1], AF_DTYPE_FLOAT) ||
                        !ready(in[2], AF_DTYPE_FLOAT) || !ready(&out[0], AF_DTYPE_FLOAT) ||
                        af_tensor_numel(&out[0]) != af_tensor_numel(t)))
        st = af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing at run time");
    af_epilogue ep;
    if (st == AF_OK) st = af_epilogue_parse(n, in, &out[0], &ep, err);
    if (st != AF_OK) return st;
    int64_t nb = t->dims[0], c = t->dims[t->rank - 1], total = af_tensor_numel(t);
    if (total == 0) return AF_OK;
    size_t per = (size_t)(nb * c);
    unsigned char *mem = af_exec_scratch(x, per * (2 * sizeof(double) + 2 * sizeof(float)));
    if (!mem) return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory for GroupNorm scratch");
    af_vep v;
    af_vep_build(&ep, out[0].data, c, &v);
    int64_t groups = af_attr_int(n, "num_groups", 0), pos = total / (nb * c);
    gncl_job j = {t->data, in[1]->data, in[2]->data, out[0].data, pos, c, groups, c / groups,
                  (c + GNCL_CBLOCK - 1) / GNCL_CBLOCK, (pos + GNCL_ROWS - 1) / GNCL_ROWS,
                  af_attr_float(n, "epsilon", 1e-5f), (double *)mem, (double *)mem + per,
                  (float *)((double *)mem + 2 * per), (float *)((double *)mem + 2 * per) + per, &v};
    double read_ns = af_exec_work_ns(x, 2.0 * (double)total, 4.0 * (double)total);
    af_exec_parallel(x, nb * j.cblocks, read_ns, gncl_mean, &j);
    gncl_join(&j, nb, j.mean);
    af_exec_parallel(x, nb * j.cblocks, read_ns, gncl_var, &j);
    gncl_join(&j, nb, j.var);
    for (int64_t i = 0; i < nb * c; i++) {
        int64_t first = i / j.cpg * j.cpg;
        j.mu[i] = (float)j.mean[first];
        j.a[i] = (float)(1.0 / sqrt(j.var[first] + j.eps)) * j.scale[i % c];
    }
    af_exec_parallel(x, nb * j.rblocks,
                     af_exec_work_ns(x, (2.0 + 10.0 * ep.nsteps) * (double)total, 8.0 * (double)total),
                     gncl_write, &j);
    return AF_OK;
}

af_status fast_group_norm(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *x, af_error *err) {
    if (af_attr_int(n, "channels_last", 0)) return group_norm_cl(n, in, out, x, err);
    if (n->nin < 3 || n->nout != 1 || !ready(in[0], AF_DTYPE_FLOAT) ||
        !ready(in[1], AF_DTYPE_FLOAT) || !ready(in[2], AF_DTYPE_FLOAT) ||
        !ready(&out[0], AF_DTYPE_FLOAT) || in[0]->rank < 3 ||
        af_tensor_numel(&out[0]) != af_tensor_numel(in[0]))
        return AF_DECLINED;
    const af_tensor *t = in[0];
    int64_t groups = af_attr_int(n, "num_groups", 0), c = t->dims[1];
    if (groups < 1 || c < 1 || c % groups || af_tensor_numel(in[1]) != c ||
        af_tensor_numel(in[2]) != c || t->dims[0] < 1)
        return AF_DECLINED;
    af_epilogue ep;
    af_error scratch;
    if (af_epilogue_parse(n, in, &out[0], &ep, &scratch) != AF_OK) return AF_DECLINED;
    af_vep v;
    gn_job j = {t->data, in[1]->data, in[2]->data, out[0].data, groups, c / groups,
                tn_prod(t->dims, 2, t->rank), t->dims[t->rank - 1],
                af_attr_float(n, "epsilon", 1e-5f), &v};
    if (j.inner < 1) return AF_DECLINED;
    af_vep_build(&ep, out[0].data, j.cols, &v);
    int64_t total = af_tensor_numel(t);
    af_exec_parallel(x, t->dims[0] * groups,
                     af_exec_work_ns(x, (5.0 + 10.0 * ep.nsteps) * (double)total, 12.0 * (double)total),
                     gn_range, &j);
    return AF_OK;
}
