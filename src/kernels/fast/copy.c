/* The fast data-movement kernels, for every dtype by element size, in parallel when big:
 *   - Pad (constant, reflect, edge, wrap; negative pads crop; any rank): the output walked as
 *     rows along its last dim (the outer dims counted once per row, never per element); a row
 *     is a memcpy of the contiguous run of its source row, plus the few padded elements on
 *     either side from a table of their sources computed once per call;
 *   - Slice, Expand and Tile: a strided view of the input copied into the dense output, its dims
 *     collapsed first (dims of 1 dropped, neighbours merged where the view steps through them
 *     as one), then rows of the innermost dim: a memcpy (stride 1), a fill (stride 0, a
 *     broadcast) or an element loop (a step);
 *   - Concat, Split and Gather: a list of contiguous blocks (per outer index and input, output,
 *     or index), each one memcpy;
 *   - ConstantOfShape: the value as a view of stride 0 (a fill);
 *   - Trilu: per row of each matrix, a memcpy of the span it keeps and a memset of the span it
 *     zeroes (one at each end of the row: the diagonal's column splits it).
 *
 * Invariant: each output element gets exactly the bytes the reference kernel gives it (the
 * same plans: tn_pad_plan / tn_pad_src, tn_slice_view, tn_split_sizes, the same broadcast and
 * index rules), so results are bit-identical. Tensors are checked to hold their elements and
 * their dims to agree with each other, and every index is checked, before anything is written;
 * otherwise AF_DECLINED and the reference kernel reports the problem. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"
#include "kernels/simd/vec.h"

#include <string.h>

/* A tensor whose data holds its elements (of size es). */
static bool cp_ready(const af_tensor *t, size_t es) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    return count >= 0 && es > 0 && t->rank <= AF_MAX_RANK &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / es));
}

/* n copies of the element at v into y. */
static void cp_fill(char *y, const unsigned char *v, size_t es, int64_t n) {
    if (n <= 0) return;
    bool zero = true;
    for (size_t b = 0; b < es; b++) zero = zero && v[b] == 0;
    if (zero) {
        memset(y, 0, (size_t)n * es);
        return;
    }
    memcpy(y, v, es);
    int64_t done = 1; /* doubling copies */
    while (done < n) {
        int64_t k = done < n - done ? done : n - done;
        af_copy(y + (size_t)done * es, y, (size_t)k * es);
        done += k;
    }
}

/* ---- Pad --------------------------------------------------------------------------------------- */

typedef struct pad_job {
    const tn_pad_plan_t *p;
    const char *x;
    char *y;
    int rank;
    const int64_t *xd, *yd;
    int64_t xs[AF_MAX_RANK];
    int64_t w, xw;            /* last dim of y and x */
    int64_t lo, hi;           /* y's last-dim run [lo, hi) reads x[lo - pad .. hi - pad) */
    const int64_t *tab;       /* source (or -1: fill) of each last-dim coordinate of y */
} pad_job;

static void pad_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const pad_job *j = ctx;
    const tn_pad_plan_t *p = j->p;
    size_t es = p->es;
    int outer = j->rank - 1;
    int64_t idx[AF_MAX_RANK];
    for (int64_t r = begin, d = outer - 1; d >= 0; d--) {
        idx[d] = r % j->yd[d];
        r /= j->yd[d];
    }
    for (int64_t r = begin; r < end; r++) {
        char *y = j->y + (size_t)(r * j->w) * es;
        int64_t off = 0;
        bool fill = false;
        for (int d = 0; d < outer && !fill; d++) {
            int64_t c = tn_pad_src(idx[d] - p->pads[d], j->xd[d], p->mode);
            fill = c < 0;
            off += c * j->xs[d];
        }
        if (fill) {
            cp_fill(y, p->fill, es, j->w);
        } else {
            const char *x = j->x + (size_t)off * es;
            int64_t pb = p->pads[outer];
            for (int64_t c = 0; c < j->lo; c++)
                memcpy(y + (size_t)c * es, j->tab[c] < 0 ? (const void *)p->fill : x + (size_t)j->tab[c] * es, es);
            if (j->hi > j->lo)
                af_copy(y + (size_t)j->lo * es, x + (size_t)(j->lo - pb) * es, (size_t)(j->hi - j->lo) * es);
            for (int64_t c = j->hi > j->lo ? j->hi : j->lo; c < j->w; c++)
                memcpy(y + (size_t)c * es, j->tab[c] < 0 ? (const void *)p->fill : x + (size_t)j->tab[c] * es, es);
        }
        for (int d = outer - 1; d >= 0; d--) {
            if (++idx[d] < j->yd[d]) break;
            idx[d] = 0;
        }
    }
}

af_status fast_pad(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)err;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || t->rank < 1 || t->rank > AF_MAX_RANK || out[0].rank != t->rank ||
        out[0].dtype != t->dtype || t->dtype == AF_DTYPE_STRING)
        return AF_DECLINED;
    size_t es = af_dtype_size(t->dtype);
    if (!cp_ready(t, es) || !cp_ready(&out[0], es)) return AF_DECLINED;
    af_error quiet = {0};
    tn_pad_plan_t p;
    if (tn_pad_plan(n, in, &out[0], &p, &quiet) != AF_OK || p.es != es) return AF_DECLINED;
    int r = t->rank;
    /* The output's dims must be the plan's (the shape function's). */
    for (int a = 0; a < r; a++)
        if (out[0].dims[a] != t->dims[a] + p.pads[a] + p.pads[a + r]) return AF_DECLINED;
    int64_t total = af_tensor_numel(&out[0]);
    if (total == 0) return AF_OK;
    pad_job j = {.p = &p, .x = t->data, .y = out[0].data, .rank = r, .xd = t->dims,
                 .yd = out[0].dims, .w = out[0].dims[r - 1], .xw = t->dims[r - 1]};
    if (j.w == 0) return AF_OK;
    af_strides(t, j.xs);
    int64_t pb = p.pads[r - 1];
    j.lo = pb < 0 ? 0 : pb;
    j.hi = pb + j.xw < j.w ? pb + j.xw : j.w;
    if (j.hi < j.lo) j.hi = j.lo;
    int64_t *tab = af_malloc((size_t)j.w * sizeof *tab);
    if (!tab) return AF_DECLINED;
    for (int64_t c = 0; c < j.w; c++) tab[c] = tn_pad_src(c - pb, j.xw, p.mode);
    j.tab = tab;
    af_exec_parallel(x, total / j.w, af_exec_work_ns(x, 0.0, 2.0 * (double)total * (double)es),
                     pad_rows, &j);
    af_free(tab);
    return AF_OK;
}

/* ---- strided views: Slice, Expand, Tile ----------------------------------------------------------- */

enum { CP_CHUNK = 1 << 16 }; /* elements of a row piece */

typedef struct sv_job {
    const char *x;
    char *y;
    size_t es;
    int rank; /* collapsed */
    int64_t dims[TN_MAX_VIEW], st[TN_MAX_VIEW];
    int64_t off;
    int64_t chunks, chunk;
} sv_job;

/* n elements from x with stride st (0: one element repeated) to y. */
static void sv_row(char *y, const char *x, int64_t st, int64_t n, size_t es) {
    if (st == 1) {
        af_copy(y, x, (size_t)n * es);
    } else if (st == 0) {
        cp_fill(y, (const unsigned char *)x, es, n);
    } else {
        switch (es) {
        case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)y)[i] = ((const uint32_t *)x)[i * st]; break;
        case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)y)[i] = ((const uint64_t *)x)[i * st]; break;
        case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = ((const uint16_t *)x)[i * st]; break;
        case 1: for (int64_t i = 0; i < n; i++) ((uint8_t *)y)[i] = ((const uint8_t *)x)[i * st]; break;
        default:
            for (int64_t i = 0; i < n; i++) memcpy(y + (size_t)i * es, x + (size_t)(i * st) * es, es);
        }
    }
}

/* Items are (outer row, piece of the row). */
static void sv_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const sv_job *j = ctx;
    int outer = j->rank - 1;
    int64_t n = j->dims[outer], st = j->st[outer], idx[TN_MAX_VIEW], off = j->off;
    int64_t row = begin / j->chunks, piece = begin % j->chunks;
    for (int d = outer - 1; d >= 0; d--) {
        idx[d] = row % j->dims[d];
        row /= j->dims[d];
        off += idx[d] * j->st[d];
    }
    row = begin / j->chunks;
    for (int64_t it = begin; it < end; it++) {
        int64_t i0 = piece * j->chunk, len = n - i0 < j->chunk ? n - i0 : j->chunk;
        sv_row(j->y + (size_t)(row * n + i0) * j->es, j->x + (size_t)(off + i0 * st) * j->es, st,
               len, j->es);
        if (++piece < j->chunks) continue;
        piece = 0;
        row++;
        for (int d = outer - 1; d >= 0; d--) {
            off += j->st[d];
            if (++idx[d] < j->dims[d]) break;
            off -= idx[d] * j->st[d];
            idx[d] = 0;
        }
    }
}

/* y (dense, dims[0..rank)) = x read from element off with strides st. The caller has checked
 * that every offset the view reaches lies inside x. */
static void sv_copy(af_exec *ex, char *y, const char *x, size_t es, int64_t off, int rank,
                    const int64_t *dims, const int64_t *st) {
    sv_job j = {.x = x, .y = y, .es = es, .off = off};
    int64_t total = 1;
    for (int d = 0; d < rank; d++) {
        total *= dims[d];
        if (dims[d] == 1) continue;
        if (j.rank > 0 && j.st[j.rank - 1] == st[d] * dims[d]) {
            j.dims[j.rank - 1] *= dims[d];
            j.st[j.rank - 1] = st[d];
        } else {
            j.dims[j.rank] = dims[d];
            j.st[j.rank++] = st[d];
        }
    }
    if (total == 0) return;
    if (j.rank == 0) {
        j.rank = 1;
        j.dims[0] = 1;
        j.st[0] = 0;
    }
    int64_t n = j.dims[j.rank - 1];
    j.chunks = (n + CP_CHUNK - 1) / CP_CHUNK;
    j.chunk = (n + j.chunks - 1) / j.chunks;
    af_exec_parallel(ex, total / n * j.chunks,
                     af_exec_work_ns(ex, 0.0, 2.0 * (double)total * (double)es), sv_rows, &j);
}

/* Input 0 and output 0 of one element size, both holding their elements. */
static bool cp_io(const af_node *n, const af_tensor *const *in, const af_tensor *out, size_t *es) {
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || t->rank < 0 || t->dtype != out->dtype || t->dtype == AF_DTYPE_STRING) return false;
    *es = af_dtype_size(t->dtype);
    return *es > 0 && cp_ready(t, *es) && cp_ready(out, *es);
}

af_status fast_slice(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)err;
    size_t es;
    int64_t off, vs[AF_MAX_RANK];
    af_error quiet = {0};
    if (!cp_io(n, in, &out[0], &es) || out[0].rank != in[0]->rank ||
        tn_slice_view(n, in, &out[0], &off, vs, &quiet) != AF_OK)
        return AF_DECLINED;
    if (af_tensor_numel(&out[0]) > 0)
        sv_copy(x, out[0].data, in[0]->data, es, off, out[0].rank, out[0].dims, vs);
    return AF_OK;
}

/* t's dims broadcast (numpy) to y's. */
static bool cp_fits(const af_tensor *t, const af_tensor *y) {
    if (t->rank > y->rank) return false;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i], w = y->dims[y->rank - t->rank + i];
        if (d != 1 && d != w) return false;
    }
    return true;
}

af_status fast_expand(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    size_t es;
    if (!cp_io(n, in, &out[0], &es) || out[0].rank > AF_MAX_RANK || !cp_fits(in[0], &out[0]))
        return AF_DECLINED;
    int64_t vs[AF_MAX_RANK];
    af_broadcast_strides(in[0], &out[0], vs);
    sv_copy(x, out[0].data, in[0]->data, es, 0, out[0].rank, out[0].dims, vs);
    return AF_OK;
}

/* ConstantOfShape: the value (float 0 without one) broadcast to the output, a view of stride 0
 * everywhere (one fill, in parallel chunks when big). */
af_status fast_constant_of_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                 af_exec *x, af_error *err) {
    (void)in;
    (void)err;
    static const float zero = 0.0f;
    const af_attr *a = af_node_attr(n, "value");
    const af_tensor *v = a && a->type == AF_ATTR_TENSOR ? a->t : NULL;
    af_dtype dt = v ? v->dtype : AF_DTYPE_FLOAT;
    size_t es = af_dtype_size(dt);
    if ((a && (!v || !v->data || af_tensor_numel(v) != 1)) || es == 0 || dt == AF_DTYPE_STRING ||
        out[0].dtype != dt || out[0].rank > AF_MAX_RANK || !cp_ready(&out[0], es))
        return AF_DECLINED;
    int64_t vs[AF_MAX_RANK] = {0};
    sv_copy(x, out[0].data, v ? v->data : (const void *)&zero, es, 0, out[0].rank, out[0].dims, vs);
    return AF_OK;
}

/* The output viewed as [rep0, d0, rep1, d1, ...], the repeat axes with stride 0. */
af_status fast_tile(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                    af_error *err) {
    (void)err;
    size_t es;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!cp_io(n, in, &out[0], &es) || out[0].rank != t->rank || t->rank > AF_MAX_RANK)
        return AF_DECLINED;
    int64_t xs[AF_MAX_RANK], vd[TN_MAX_VIEW], vs[TN_MAX_VIEW];
    af_strides(t, xs);
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] == 0) return out[0].dims[i] == 0 ? AF_OK : AF_DECLINED;
        if (out[0].dims[i] % t->dims[i]) return AF_DECLINED;
        vd[2 * i] = out[0].dims[i] / t->dims[i];
        vs[2 * i] = 0;
        vd[2 * i + 1] = t->dims[i];
        vs[2 * i + 1] = xs[i];
    }
    sv_copy(x, out[0].data, t->data, es, 0, 2 * t->rank, vd, vs);
    return AF_OK;
}

/* ---- Trilu ---------------------------------------------------------------------------------------- */

typedef struct tri_job {
    const char *x;
    char *y;
    size_t es;
    int64_t rows, cols, k; /* k clamped to [-rows, cols]: i + k + 1 cannot overflow */
    bool upper;
} tri_job;

/* Rows [begin, end) over all the matrices. Row i keeps the columns j with j - i >= k (upper) or
 * j - i <= k (lower): upper zeroes [0, i + k) and keeps the rest, lower keeps [0, i + k] and
 * zeroes the rest, the split clamped to the row. */
static void tri_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const tri_job *j = ctx;
    size_t row = (size_t)j->cols * j->es;
    for (int64_t r = begin; r < end; r++) {
        int64_t split = r % j->rows + j->k + (j->upper ? 0 : 1);
        split = split < 0 ? 0 : split > j->cols ? j->cols : split;
        size_t cut = (size_t)split * j->es;
        const char *x = j->x + (size_t)r * row;
        char *y = j->y + (size_t)r * row;
        if (j->upper) {
            memset(y, 0, cut);
            af_copy(y + cut, x + cut, row - cut);
        } else {
            af_copy(y, x, cut);
            memset(y + cut, 0, row - cut);
        }
    }
}

/* Trilu of any element size; k from the optional input (one int32 or int64), 0 without it. */
af_status fast_trilu(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)err;
    size_t es;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL, *kt = tn_in(n, in, 1);
    if (!cp_io(n, in, &out[0], &es) || t->rank < 2 || out[0].rank != t->rank) return AF_DECLINED;
    for (int d = 0; d < t->rank; d++)
        if (out[0].dims[d] != t->dims[d]) return AF_DECLINED;
    if (kt && (!tn_is_index_type(kt->dtype) || af_tensor_numel(kt) != 1 ||
               !cp_ready(kt, af_dtype_size(kt->dtype))))
        return AF_DECLINED; /* the reference reports it */
    tri_job j = {.x = t->data, .y = out[0].data, .es = es, .rows = t->dims[t->rank - 2],
                 .cols = t->dims[t->rank - 1], .upper = af_attr_int(n, "upper", 1) != 0};
    int64_t total = af_tensor_numel(t), k = kt ? tn_geti(kt, 0) : 0;
    if (total == 0) return AF_OK;
    j.k = k < -j.rows ? -j.rows : k > j.cols ? j.cols : k;
    af_exec_parallel(x, total / j.cols, af_exec_work_ns(x, 0.0, 2.0 * (double)total * (double)es),
                     tri_rows, &j);
    return AF_OK;
}

/* ---- DepthToSpace, SpaceToDepth ------------------------------------------------------------------
 * Output row by output row (parallel over them), any element size. DepthToSpace's row
 * (n, c, h * b + i) interleaves b input rows of W: element w * b + j is row (n, src(i, j), h)'s
 * w, src = (i * b + j) * C' + c in DCR mode, c * b * b + i * b + j in CRD. SpaceToDepth's row
 * (n, (i * b + j) * C + c, h) takes every b-th element of input row (n, c, h * b + i) from j.
 * (Both had only the reference kernel: a pixel-shuffle upsampler spent a third of its time there.) */
typedef struct ds_job {
    const char *x;
    char *y;
    size_t es;
    int64_t b, c, h, w; /* the input's C, H, W; b the block size */
    bool d2s, crd;
} ds_job;

/* y[k * ys] = x[k * xs] for k < n, elements of es bytes (one of the strides is 1: an
 * interleave or its inverse). */
static void ds_copy(char *y, int64_t ys, const char *x, int64_t xs, int64_t n, size_t es) {
    switch (es) {
    case 4:
        for (int64_t k = 0; k < n; k++) memcpy(y + 4 * k * ys, x + 4 * k * xs, 4);
        break;
    case 2:
        for (int64_t k = 0; k < n; k++) memcpy(y + 2 * k * ys, x + 2 * k * xs, 2);
        break;
    case 8:
        for (int64_t k = 0; k < n; k++) memcpy(y + 8 * k * ys, x + 8 * k * xs, 8);
        break;
    default:
        for (int64_t k = 0; k < n; k++) memcpy(y + es * (size_t)(k * ys), x + es * (size_t)(k * xs), es);
    }
}

static void ds_rows(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const ds_job *j = ctx;
    int64_t b = j->b, plane = j->h * j->w;
    size_t es = j->es;
    if (j->d2s) { /* output rows (n, c', oh) of W * b, oh = h * b + i */
        int64_t cq = j->c / (b * b), oh = j->h * b;
        for (int64_t r = begin; r < end; r++) {
            int64_t n = r / (cq * oh), c = r / oh % cq, h = r % oh / b, i = r % oh % b;
            char *y = j->y + es * (size_t)(r * j->w * b);
            for (int64_t jj = 0; jj < b; jj++) {
                int64_t src = j->crd ? c * b * b + i * b + jj : (i * b + jj) * cq + c;
                const char *x = j->x + es * (size_t)((n * j->c + src) * plane + h * j->w);
                ds_copy(y + es * (size_t)jj, b, x, 1, j->w, es);
            }
        }
        return;
    }
    int64_t oc = j->c * b * b, oh = j->h / b, ow = j->w / b; /* rows (n, oc, h) of W / b */
    for (int64_t r = begin; r < end; r++) {
        int64_t n = r / (oc * oh), q = r / oh % oc, h = r % oh;
        int64_t ij = q / j->c, c = q % j->c, i = ij / b, jj = ij % b;
        const char *x = j->x + es * (size_t)((n * j->c + c) * plane + (h * b + i) * j->w + jj);
        ds_copy(j->y + es * (size_t)(r * ow), 1, x, b, ow, es);
    }
}

/* DepthToSpace and SpaceToDepth of a 4-D tensor of any element size; declined (the reference
 * reports it) unless the output has the dims the op gives. */
af_status fast_depth_space(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                           af_error *err) {
    (void)err;
    size_t es;
    const af_tensor *t = n->nin == 1 ? in[0] : NULL;
    int64_t b = af_attr_int(n, "blocksize", 0);
    if (!cp_io(n, in, &out[0], &es) || t->rank != 4 || out[0].rank != 4 || b < 1 || b > 65536)
        return AF_DECLINED;
    ds_job j = {t->data, out[0].data, es, b, t->dims[1], t->dims[2], t->dims[3],
                n->op == AF_OP_DEPTH_TO_SPACE, !strcmp(af_attr_str(n, "mode", "DCR"), "CRD")};
    const int64_t *d = t->dims, *o = out[0].dims;
    bool ok = j.d2s ? j.c % (b * b) == 0 && o[1] == j.c / (b * b) && o[2] == j.h * b && o[3] == j.w * b
                    : j.h % b == 0 && j.w % b == 0 && o[1] == j.c * b * b && o[2] == j.h / b &&
                          o[3] == j.w / b;
    if (!ok || o[0] != d[0]) return AF_DECLINED;
    int64_t total = af_tensor_numel(t), rows = o[0] * o[1] * o[2];
    if (total == 0) return AF_OK;
    af_exec_parallel(x, rows, af_exec_work_ns(x, 0.0, 4.0 * (double)total * (double)es), ds_rows, &j);
    return AF_OK;
}

/* ---- block lists: Concat, Split, Gather ----------------------------------------------------------- */

typedef struct bl_job {
    int kind; /* 0 Concat, 1 Split, 2 Gather */
    const af_tensor *const *in;
    af_tensor *out;
    int nparts;           /* inputs (Concat), outputs (Split) or indices (Gather) */
    const size_t *bytes;  /* per part: one block's bytes (Concat, Split) */
    const size_t *at;     /* per part: its offset within an outer row of the big side */
    size_t row;           /* bytes of an outer row of the big side */
    const int64_t *idx;   /* Gather: the normalised indices */
    int64_t dim;          /* Gather: the axis length */
    size_t inner;         /* Gather: bytes of a block */
    const char *x;        /* Split, Gather: the input */
    int64_t shuffle;      /* Gather: g > 1 when it is a channel shuffle of 4-byte elements */
} bl_job;

/* Gather's items [begin, end): the (outer row, index) pair advanced without a division per
 * item (a channel shuffle gathers single floats, millions of them). */
static void bl_gather(const bl_job *j, int64_t begin, int64_t end) {
    int64_t o = begin / j->nparts, p = begin % j->nparts;
    char *dst = (char *)j->out[0].data + (size_t)begin * j->inner;
    for (int64_t it = begin; it < end; it++, dst += j->inner) {
        const char *src = j->x + ((size_t)o * (size_t)j->dim + (size_t)j->idx[p]) * j->inner;
        switch (j->inner) { /* one element: a move, not a call */
        case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
        case 8: *(uint64_t *)dst = *(const uint64_t *)src; break;
        default: af_copy(dst, src, j->inner);
        }
        if (++p == j->nparts) p = 0, o++;
    }
}

/* A channel shuffle (ShuffleNet's Reshape [g, C/g], Transpose, Reshape, which canonicalize.c
 * makes a Gather of channels, on channels-last rows): single floats with idx[i * g + k] =
 * k * (dim / g) + i, each outer row of dim floats the transpose of a g x dim / g matrix: outer
 * rows [begin, end), without the per-element index lookups of bl_gather. */
static void bl_shuffle(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const bl_job *j = ctx;
    int64_t dim = j->dim, g = j->shuffle, q = dim / g;
    for (int64_t o = begin; o < end; o++) {
        const uint32_t *x = (const uint32_t *)j->x + o * dim;
        uint32_t *y = (uint32_t *)j->out[0].data + o * dim;
        if (g == 2) {
            const uint32_t *x1 = x + q;
            for (int64_t i = 0; i < q; i++) {
                y[2 * i] = x[i];
                y[2 * i + 1] = x1[i];
            }
            continue;
        }
        for (int64_t k = 0; k < g; k++)
            for (int64_t i = 0; i < q; i++) y[i * g + k] = x[k * q + i];
    }
}

static void bl_blocks(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const bl_job *j = ctx;
    if (j->kind == 2) {
        bl_gather(j, begin, end);
        return;
    }
    for (int64_t it = begin; it < end; it++) {
        int64_t o = it / j->nparts;
        int p = (int)(it % j->nparts);
        switch (j->kind) {
        case 0:
            af_copy((char *)j->out[0].data + (size_t)o * j->row + j->at[p],
                   (const char *)j->in[p]->data + (size_t)o * j->bytes[p], j->bytes[p]);
            break;
        case 1:
            if (j->out[p].data && j->bytes[p])
                af_copy((char *)j->out[p].data + (size_t)o * j->bytes[p],
                       j->x + (size_t)o * j->row + j->at[p], j->bytes[p]);
            break;
        default: break;
        }
    }
}

static void bl_run(af_exec *ex, bl_job *j, int64_t outer, double bytes) {
    if (outer > 0 && j->nparts > 0)
        af_exec_parallel(ex, outer * j->nparts, af_exec_work_ns(ex, 0.0, 2.0 * bytes), bl_blocks, j);
}

/* The g (2 to 16) for which idx [dim] of a 4-byte element gather is a channel shuffle
 * (idx[i * g + k] = k * (dim / g) + i); 0 when it is none. */
static int64_t shuffle_groups(const int64_t *idx, int64_t nidx, int64_t dim, size_t inner) {
    if (inner != 4 || nidx != dim || dim < 4 || idx[0] != 0) return 0;
    int64_t g = 0;
    for (int64_t c = 2; c <= 16 && !g; c++)
        if (dim % c == 0 && idx[1] == dim / c) g = c;
    for (int64_t t = 0; g && t < dim; t++)
        if (idx[t] != t % g * (dim / g) + t / g) g = 0;
    return g;
}

/* Gather: a channel shuffle walks whole outer rows, anything else (outer row, index) items. */
static void run_gather(af_exec *ex, bl_job *j, int64_t outer, double bytes) {
    if (j->shuffle && outer > 0)
        af_exec_parallel(ex, outer, af_exec_work_ns(ex, 0.0, 2.0 * bytes), bl_shuffle, j);
    else
        bl_run(ex, j, outer, bytes);
}

/* Inputs of the output's rank and dtype, equal dims but along the axis, whose lengths add up. */
af_status fast_concat(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    af_tensor *y = &out[0];
    int axis;
    size_t es = af_dtype_size(y->dtype);
    if (n->nin < 1 || y->rank < 1 || y->rank > AF_MAX_RANK || es == 0 ||
        y->dtype == AF_DTYPE_STRING || !cp_ready(y, es) ||
        !af_axis(af_attr_int(n, "axis", 0), y->rank, &axis))
        return AF_DECLINED;
    size_t *bytes = af_malloc(2 * (size_t)n->nin * sizeof *bytes), *at = bytes + n->nin, row = 0;
    if (!bytes) return AF_DECLINED;
    int64_t sum = 0, outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= y->dims[d];
    for (int d = axis + 1; d < y->rank; d++) inner *= y->dims[d];
    bool ok = true;
    for (int i = 0; ok && i < n->nin; i++) {
        const af_tensor *t = in[i];
        ok = t && t->dtype == y->dtype && t->rank == y->rank && cp_ready(t, es);
        for (int d = 0; ok && d < y->rank; d++) ok = d == axis || t->dims[d] == y->dims[d];
        if (!ok) break;
        sum += t->dims[axis];
        at[i] = row;
        bytes[i] = (size_t)(t->dims[axis] * inner) * es;
        row += bytes[i];
    }
    if (!ok || sum != y->dims[axis]) {
        af_free(bytes);
        return AF_DECLINED;
    }
    bl_job j = {.kind = 0, .in = in, .out = y, .nparts = n->nin, .bytes = bytes, .at = at,
                .row = row};
    bl_run(x, &j, outer, (double)outer * (double)row);
    af_free(bytes);
    return AF_OK;
}

/* Outputs of x's rank and dtype whose lengths along the axis are the split's (tn_split_sizes);
 * an output without data is skipped, as the reference does. */
af_status fast_split(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)err;
    size_t es;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || n->nout < 1 || t->rank < 1 || t->rank > AF_MAX_RANK ||
        t->dtype == AF_DTYPE_STRING || (es = af_dtype_size(t->dtype)) == 0 || !cp_ready(t, es))
        return AF_DECLINED;
    int64_t *sizes = af_malloc((size_t)n->nout * sizeof *sizes);
    size_t *bytes = af_malloc(2 * (size_t)n->nout * sizeof *bytes), *at = bytes + n->nout, row = 0;
    int axis;
    af_error quiet = {0};
    bool ok = sizes && bytes && tn_split_sizes(n, in, &axis, sizes, &quiet) == AF_OK;
    int64_t outer = 1, inner = 1, sum = 0;
    for (int d = 0; ok && d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; ok && d < t->rank; d++) inner *= t->dims[d];
    for (int i = 0; ok && i < n->nout; i++) {
        af_tensor *o = &out[i];
        ok = sizes[i] >= 0;
        sum += sizes[i];
        at[i] = row;
        bytes[i] = (size_t)(sizes[i] * inner) * es;
        row += bytes[i];
        if (!ok || !o->data) continue;
        ok = o->dtype == t->dtype && o->rank == t->rank && cp_ready(o, es);
        for (int d = 0; ok && d < t->rank; d++)
            ok = o->dims[d] == (d == axis ? sizes[i] : t->dims[d]);
    }
    if (ok && sum == t->dims[axis]) {
        bl_job j = {.kind = 1, .out = out, .nparts = n->nout, .bytes = bytes, .at = at,
                    .row = row, .x = t->data};
        bl_run(x, &j, outer, (double)outer * (double)row);
    }
    af_free(sizes);
    af_free(bytes);
    return ok && sum == t->dims[axis] ? AF_OK : AF_DECLINED;
}

/* Every index checked (int32 or int64, negative from the end) before anything is copied. */
af_status fast_gather(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)err;
    size_t es;
    const af_tensor *t = n->nin == 2 ? in[0] : NULL, *ix = n->nin == 2 ? in[1] : NULL;
    af_tensor *y = &out[0];
    int axis;
    if (!t || !ix || !cp_io(n, in, y, &es) || t->rank < 1 || ix->rank < 0 ||
        !tn_is_index_type(ix->dtype) || !cp_ready(ix, af_dtype_size(ix->dtype)) ||
        !af_axis(af_attr_int(n, "axis", 0), t->rank, &axis) ||
        y->rank != t->rank - 1 + ix->rank || y->rank > AF_MAX_RANK)
        return AF_DECLINED;
    int k = 0;
    for (int i = 0; i < axis; i++)
        if (y->dims[k++] != t->dims[i]) return AF_DECLINED;
    for (int i = 0; i < ix->rank; i++)
        if (y->dims[k++] != ix->dims[i]) return AF_DECLINED;
    for (int i = axis + 1; i < t->rank; i++)
        if (y->dims[k++] != t->dims[i]) return AF_DECLINED;
    int64_t nidx = af_tensor_numel(ix), outer = 1, inner = 1, dim = t->dims[axis];
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    if (nidx == 0 || outer == 0 || inner == 0) return AF_OK;
    int64_t *idx = af_malloc((size_t)nidx * sizeof *idx);
    if (!idx) return AF_DECLINED;
    for (int64_t i = 0; i < nidx; i++)
        if (!tn_index(ix, i, dim, &idx[i])) {
            af_free(idx);
            return AF_DECLINED;
        }
    bl_job j = {.kind = 2, .out = y, .idx = idx, .dim = dim, .inner = (size_t)inner * es,
                .x = t->data};
    /* Items are (outer, index) pairs; nparts counts indices (at most what an int holds). */
    if (nidx > INT32_MAX) {
        af_free(idx);
        return AF_DECLINED;
    }
    j.nparts = (int)nidx;
    j.shuffle = shuffle_groups(idx, nidx, dim, j.inner);
    run_gather(x, &j, outer, (double)outer * (double)nidx * (double)j.inner);
    af_free(idx);
    return AF_OK;
}

/* ---- Cast ---------------------------------------------------------------------------------------
 * The conversions that models spend time in: float32 to and from IEEE half (the edges of a
 * float16 model, which computes in float32, and a converter's Cast islands) and from bfloat16,
 * through the vector table; integers and bool to float32 with C's conversion, as the reference
 * converts them (one rounding, to nearest). The same dtype is a copy. Anything else (float to
 * integer, which saturates; to bfloat16, whose denormals the vector conversion may flush;
 * integer to integer, shape arithmetic on a few elements) is the reference's, and the
 * dispatcher says so before running (fast_cast_takes). */

typedef struct cast_job {
    const void *x;
    void *y;
    af_dtype from, to;
    int64_t count;
} cast_job;

enum { CAST_CHUNK = 4096 }; /* elements per parallel item */

#define CAST_LOOP(T)                                                                              \
    for (int64_t i = 0; i < len; i++) y[i] = (float)((const T *)j->x)[b + i];

static void cast_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const cast_job *j = ctx;
    const af_vec_ops *v = af_vec();
    int64_t b = begin * CAST_CHUNK, e = end * CAST_CHUNK < j->count ? end * CAST_CHUNK : j->count;
    int64_t len = e - b;
    if (j->to == AF_DTYPE_FLOAT16) {
        v->to_f16((const float *)j->x + b, (uint16_t *)j->y + b, len);
        return;
    }
    float *y = (float *)j->y + b;
    switch (j->from) {
    case AF_DTYPE_FLOAT16: v->from_f16((const uint16_t *)j->x + b, y, len); break;
    case AF_DTYPE_BFLOAT16: v->from_bf16((const uint16_t *)j->x + b, y, len); break;
    case AF_DTYPE_DOUBLE: CAST_LOOP(double) break;
    case AF_DTYPE_INT8: CAST_LOOP(int8_t) break;
    case AF_DTYPE_UINT8: CAST_LOOP(uint8_t) break;
    case AF_DTYPE_BOOL: /* any nonzero byte is true */
        for (int64_t i = 0; i < len; i++) y[i] = ((const uint8_t *)j->x)[b + i] != 0;
        break;
    case AF_DTYPE_INT16: CAST_LOOP(int16_t) break;
    case AF_DTYPE_UINT16: CAST_LOOP(uint16_t) break;
    case AF_DTYPE_INT32: CAST_LOOP(int32_t) break;
    case AF_DTYPE_UINT32: CAST_LOOP(uint32_t) break;
    case AF_DTYPE_INT64: CAST_LOOP(int64_t) break;
    case AF_DTYPE_UINT64: CAST_LOOP(uint64_t) break;
    default: AF_ASSERT(!"dtype checked by fast_cast");
    }
}
#undef CAST_LOOP

bool fast_cast_takes(af_dtype from, af_dtype to) {
    if (from == to) return true;
    if (to == AF_DTYPE_FLOAT16) return from == AF_DTYPE_FLOAT;
    if (to != AF_DTYPE_FLOAT) return false;
    switch (from) {
    case AF_DTYPE_FLOAT16: case AF_DTYPE_BFLOAT16: case AF_DTYPE_DOUBLE: case AF_DTYPE_INT8:
    case AF_DTYPE_UINT8: case AF_DTYPE_BOOL: case AF_DTYPE_INT16: case AF_DTYPE_UINT16:
    case AF_DTYPE_INT32: case AF_DTYPE_UINT32: case AF_DTYPE_INT64: case AF_DTYPE_UINT64:
        return true;
    default: return false;
    }
}

af_status fast_cast(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                    af_error *err) {
    (void)err;
    const af_tensor *a = n->nin >= 1 ? in[0] : NULL;
    af_tensor *y = &out[0];
    if (!a || !cp_ready(a, af_dtype_size(a->dtype)) || !cp_ready(y, af_dtype_size(y->dtype)) ||
        af_tensor_numel(a) != af_tensor_numel(y))
        return AF_DECLINED;
    int64_t count = af_tensor_numel(a);
    if (a->dtype == y->dtype) {
        if (count > 0) af_copy(y->data, a->data, (size_t)count * af_dtype_size(a->dtype));
        return AF_OK;
    }
    if (!fast_cast_takes(a->dtype, y->dtype)) return AF_DECLINED;
    cast_job j = {a->data, y->data, a->dtype, y->dtype, count};
    double bytes = (double)count * (double)(af_dtype_size(a->dtype) + af_dtype_size(y->dtype));
    af_exec_parallel(x, (count + CAST_CHUNK - 1) / CAST_CHUNK, af_exec_work_ns(x, (double)count, bytes),
                     cast_range, &j);
    return AF_OK;
}
