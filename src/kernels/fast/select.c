/* The fast data-dependent indexing kernels, for every dtype by element size (the detectors'
 * post-processing runs them on boxes, scores and int64 indices, hundreds of times a run):
 *   - ScatterElements: the data copied, then each update stored at its index (or combined
 *     with what is there: reduction add, mul, max, min on float32, int32 and int64, in index
 *     order as the reference), walked as rows of the indices' last dim (the outer coordinates
 *     counted once per row);
 *   - GatherElements: the same walk, each output element read from its index (14 ms for 1M
 *     float32 elements on the reference kernel's element-by-element offsets, 1.1 here);
 *   - GatherND (any batch_dims): one offset per index tuple, then one copy per tuple (a store
 *     for the 4- and 8-byte elements of a gather of single elements);
 *   - NonZero (bool, integers, float32; rank 1 and up): one pass to count, one to write the
 *     coordinates.
 *
 * Invariant: each output element gets exactly the bytes the reference kernel gives it (the same
 * index rules: tn_index; the same order: a later update to one element wins). Tensors are
 * checked to hold their elements and their dims to agree, and every index is checked before
 * anything is written; otherwise AF_DECLINED and the reference kernel reports the problem. */
#include "kernels/fast/fast.h"
#include "kernels/ref/tensor_util.h"

#include <math.h>
#include <string.h>

/* A tensor whose data holds its elements (of size es). */
static bool sel_ready(const af_tensor *t) {
    int64_t count = t ? af_tensor_numel(t) : -1;
    size_t es = t ? af_dtype_size(t->dtype) : 0;
    return count >= 0 && es > 0 && t->rank >= 0 && t->rank <= AF_MAX_RANK &&
           (count == 0 || (t->data && (uint64_t)count <= (uint64_t)t->nbytes / es));
}

static bool sel_same_type(const af_tensor *a, const af_tensor *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Element k of an int32 or int64 index tensor, normalised against dim; false when out of range. */
static inline bool sel_index(const void *ix, bool i64, int64_t k, int64_t dim, int64_t *out) {
    int64_t j = i64 ? ((const int64_t *)ix)[k] : ((const int32_t *)ix)[k];
    if (j < 0) j += dim;
    *out = j;
    return j >= 0 && j < dim;
}

static inline void sel_copy(char *dst, const char *src, size_t es) {
    switch (es) {
    case 4: memcpy(dst, src, 4); break; /* one load and store each */
    case 8: memcpy(dst, src, 8); break;
    case 2: memcpy(dst, src, 2); break;
    case 1: *dst = *src; break;
    default: memcpy(dst, src, es); break;
    }
}

/* ---- ScatterElements and GatherElements --------------------------------------------------------- */

typedef struct sc_geom {
    int rank, axis;
    int64_t xs[AF_MAX_RANK]; /* data strides */
    const int64_t *idims;    /* the indices' dims */
} sc_geom;

enum { SC_CHECK, SC_SCATTER, SC_GATHER };

/* *y = red(*y, *u) for reduction red (not RED_NONE) on dtype t (float32, int32,
 * int64): the reference's results (floats: the float op, which the reference's double one
 * rounds to; integers wrap). */
static void sc_combine(char *y, const char *u, af_dtype t, scat_red red) {
    if (t == AF_DTYPE_FLOAT) {
        float a, b;
        memcpy(&a, y, 4), memcpy(&b, u, 4);
        float v = red == RED_ADD   ? a + b
                  : red == RED_MUL ? a * b
                  : red == RED_MAX ? fmaxf(a, b)
                                   : fminf(a, b);
        memcpy(y, &v, 4);
        return;
    }
    int64_t a, b, v;
    if (t == AF_DTYPE_INT64) {
        memcpy(&a, y, 8), memcpy(&b, u, 8);
    } else {
        int32_t a32, b32;
        memcpy(&a32, y, 4), memcpy(&b32, u, 4);
        a = a32, b = b32;
    }
    v = red == RED_ADD   ? (int64_t)((uint64_t)a + (uint64_t)b)
        : red == RED_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
        : (red == RED_MAX) == (a > b) ? a : b;
    if (t == AF_DTYPE_INT64) memcpy(y, &v, 8);
    else {
        int32_t v32 = (int32_t)(uint32_t)(uint64_t)v;
        memcpy(y, &v32, 4);
    }
}

/* Every index element k with its data offset off, walked as rows of the indices' last dim;
 * false (at the first bad index) when one is out of range. SC_SCATTER copies update k to y at
 * off, SC_GATHER x at off to y's element k, SC_CHECK only checks. */
static bool sc_walk(const sc_geom *g, const af_tensor *ix, const af_tensor *x, char *y,
                    const char *up, size_t es, int what, scat_red red) {
    bool i64 = ix->dtype == AF_DTYPE_INT64;
    int last = g->rank - 1;
    int64_t w = g->idims[last], rows = af_tensor_numel(ix) / (w > 0 ? w : 1), dim = x->dims[g->axis];
    int64_t idx[AF_MAX_RANK] = {0};
    if (w == 0) return true;
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = 0;
        for (int a = 0; a < last; a++)
            if (a != g->axis) base += idx[a] * g->xs[a];
        const int64_t k0 = r * w;
        for (int64_t j = 0; j < w; j++) {
            int64_t v;
            if (!sel_index(ix->data, i64, k0 + j, dim, &v)) return false;
            if (what == SC_CHECK) continue;
            int64_t off = g->axis == last ? base + v : base + v * g->xs[g->axis] + j;
            if (what == SC_SCATTER && red != RED_NONE) sc_combine(y + (size_t)off * es, up + (size_t)(k0 + j) * es, x->dtype, red);
            else if (what == SC_SCATTER) sel_copy(y + (size_t)off * es, up + (size_t)(k0 + j) * es, es);
            else sel_copy(y + (size_t)(k0 + j) * es, (const char *)x->data + (size_t)off * es, es);
        }
        tn_next(idx, g->idims, last);
    }
    return true;
}

af_status fast_scatter_elements(const af_node *n, const af_tensor *const *in, af_tensor *out,
                                af_exec *x, af_error *err) {
    (void)x;
    (void)err;
    const af_tensor *d = n->nin >= 3 ? in[0] : NULL, *ix = n->nin >= 3 ? in[1] : NULL;
    const af_tensor *up = n->nin >= 3 ? in[2] : NULL;
    sc_geom g;
    if (!d || !ix || !up || !sel_ready(d) || !sel_ready(ix) || !sel_ready(up) || !sel_ready(&out[0]) ||
        !tn_is_index_type(ix->dtype) || d->rank < 1 || ix->rank != d->rank ||
        !sel_same_type(&out[0], d) || up->dtype != d->dtype || up->rank != ix->rank ||
        !af_axis(af_attr_int(n, "axis", 0), d->rank, &g.axis))
        return AF_DECLINED;
    scat_red red;
    af_error quiet = {0};
    if (tn_scatter_reduction(n, &red, &quiet) != AF_OK ||
        (red != RED_NONE && d->dtype != AF_DTYPE_FLOAT && d->dtype != AF_DTYPE_INT64 &&
         d->dtype != AF_DTYPE_INT32))
        return AF_DECLINED;
    for (int a = 0; a < d->rank; a++)
        if (up->dims[a] != ix->dims[a] || (a != g.axis && ix->dims[a] > d->dims[a])) return AF_DECLINED;
    g.rank = d->rank;
    g.idims = ix->dims;
    af_strides(d, g.xs);
    size_t es = af_dtype_size(d->dtype);
    if (!sc_walk(&g, ix, d, NULL, NULL, es, SC_CHECK, RED_NONE)) return AF_DECLINED; /* the reference reports */
    if (out[0].data != d->data && af_tensor_numel(d) > 0)
        af_copy(out[0].data, d->data, (size_t)af_tensor_numel(d) * es);
    sc_walk(&g, ix, d, out[0].data, up->data, es, SC_SCATTER, red);
    return AF_OK;
}

af_status fast_gather_elements(const af_node *n, const af_tensor *const *in, af_tensor *out,
                               af_exec *x, af_error *err) {
    (void)x;
    (void)err;
    const af_tensor *d = n->nin == 2 ? in[0] : NULL, *ix = n->nin == 2 ? in[1] : NULL;
    sc_geom g;
    if (!d || !ix || !sel_ready(d) || !sel_ready(ix) || !sel_ready(&out[0]) ||
        !tn_is_index_type(ix->dtype) || d->rank < 1 || ix->rank != d->rank ||
        out[0].dtype != d->dtype || out[0].rank != ix->rank ||
        !af_axis(af_attr_int(n, "axis", 0), d->rank, &g.axis))
        return AF_DECLINED;
    for (int a = 0; a < d->rank; a++)
        if (out[0].dims[a] != ix->dims[a] || (a != g.axis && ix->dims[a] > d->dims[a])) return AF_DECLINED;
    g.rank = d->rank;
    g.idims = ix->dims;
    af_strides(d, g.xs);
    size_t es = af_dtype_size(d->dtype);
    if (!sc_walk(&g, ix, d, NULL, NULL, es, SC_CHECK, RED_NONE)) return AF_DECLINED; /* the reference reports */
    sc_walk(&g, ix, d, out[0].data, NULL, es, SC_GATHER, RED_NONE);
    return AF_OK;
}

/* ---- GatherND ------------------------------------------------------------------------------------ */

typedef struct gnd_job {
    const char *x;
    char *y;
    const int64_t *offs; /* the source offset (elements) of each tuple */
    size_t len;          /* bytes of one slice */
} gnd_job;

static void gnd_range(void *ctx, int slot, int64_t begin, int64_t end) {
    (void)slot;
    const gnd_job *j = ctx;
    if (j->len == 4 || j->len == 8) {
        for (int64_t t = begin; t < end; t++)
            sel_copy(j->y + (size_t)t * j->len, j->x + (size_t)j->offs[t], j->len);
        return;
    }
    for (int64_t t = begin; t < end; t++)
        af_copy(j->y + (size_t)t * j->len, j->x + (size_t)j->offs[t], j->len);
}

af_status fast_gather_nd(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_exec *x, af_error *err) {
    (void)err;
    const af_tensor *d = n->nin >= 2 ? in[0] : NULL, *ix = n->nin >= 2 ? in[1] : NULL;
    if (!d || !ix || !sel_ready(d) || !sel_ready(ix) || !sel_ready(&out[0]) ||
        !tn_is_index_type(ix->dtype) || out[0].dtype != d->dtype || ix->rank < 1 || d->rank < 1)
        return AF_DECLINED;
    int64_t b = af_attr_int(n, "batch_dims", 0);
    int q = ix->rank;
    int64_t m = ix->dims[q - 1];
    if (b < 0 || b >= q || b >= d->rank || m < 1 || m > d->rank - b) return AF_DECLINED;
    for (int i = 0; i < b; i++)
        if (ix->dims[i] != d->dims[i]) return AF_DECLINED;
    int64_t batches = tn_prod(d->dims, 0, (int)b), per = tn_prod(ix->dims, (int)b, q - 1);
    int64_t xbatch = tn_prod(d->dims, (int)b, d->rank), slice = tn_prod(d->dims, (int)(b + m), d->rank);
    size_t es = af_dtype_size(d->dtype);
    int64_t tuples = batches * per;
    if (batches < 0 || per < 0 || xbatch < 0 || slice < 0 || af_tensor_numel(&out[0]) != tuples * slice)
        return AF_DECLINED;
    if (tuples == 0 || slice == 0) return AF_OK;
    int64_t *offs = af_malloc((size_t)tuples * sizeof(int64_t));
    if (!offs) return AF_DECLINED;
    bool i64 = ix->dtype == AF_DTYPE_INT64;
    for (int64_t t = 0; t < tuples; t++) {
        int64_t o = 0;
        for (int64_t k = 0; k < m; k++) {
            int64_t v, dim = d->dims[b + k];
            if (!sel_index(ix->data, i64, t * m + k, dim, &v)) {
                af_free(offs);
                return AF_DECLINED; /* the reference reports the bad tuple */
            }
            o = o * dim + v;
        }
        offs[t] = (int64_t)(((size_t)(t / per * xbatch) + (size_t)(o * slice)) * es);
    }
    gnd_job j = {d->data, out[0].data, offs, (size_t)slice * es};
    double bytes = 2.0 * (double)tuples * (double)j.len;
    af_exec_parallel(x, tuples, af_exec_work_ns(x, 0.0, bytes), gnd_range, &j);
    af_free(offs);
    return AF_OK;
}

/* ---- NonZero ------------------------------------------------------------------------------------- */

/* Whether element i is not zero: by value for float32 (-0 is zero, NaN is not), by bytes for
 * bool and the integer types. */
static inline bool nz_at(const char *p, size_t es, bool f32, int64_t i) {
    if (f32) return ((const float *)p)[i] != 0.0f;
    switch (es) {
    case 1: return p[i] != 0;
    case 2: return ((const uint16_t *)p)[i] != 0;
    case 4: return ((const uint32_t *)p)[i] != 0;
    default: return ((const uint64_t *)p)[i] != 0;
    }
}

static bool nz_type(af_dtype dt) {
    switch (dt) {
    case AF_DTYPE_FLOAT: case AF_DTYPE_BOOL: case AF_DTYPE_INT8: case AF_DTYPE_UINT8:
    case AF_DTYPE_INT16: case AF_DTYPE_UINT16: case AF_DTYPE_INT32: case AF_DTYPE_UINT32:
    case AF_DTYPE_INT64: case AF_DTYPE_UINT64:
        return true;
    default:
        return false;
    }
}

af_status fast_non_zero(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_exec *x, af_error *err) {
    (void)x;
    const af_tensor *t = n->nin >= 1 ? in[0] : NULL;
    if (!t || !sel_ready(t) || !nz_type(t->dtype) || t->rank < 1) return AF_DECLINED;
    size_t es = af_dtype_size(t->dtype);
    bool f32 = t->dtype == AF_DTYPE_FLOAT;
    int64_t total = af_tensor_numel(t), cnt = 0;
    const char *p = t->data;
    for (int64_t i = 0; i < total; i++) cnt += nz_at(p, es, f32, i);
    int r = t->rank;
    int64_t dims[2] = {r, cnt};
    if (out[0].data && !(out[0].dtype == AF_DTYPE_INT64 && out[0].rank == 2 &&
                         out[0].dims[0] == r && out[0].dims[1] == cnt && sel_ready(&out[0])))
        return AF_DECLINED;
    if (!out[0].data) {
        af_tensor_set_type(&out[0], AF_DTYPE_INT64, 2, dims);
        af_status st = af_tensor_alloc(&out[0], err);
        if (st != AF_OK) return af_node_fail(err, n, st, "out of memory");
    }
    int64_t *o = out[0].data, k = 0;
    if (t->rank == 1) { /* one coordinate: the element's position */
        for (int64_t i = 0; i < total; i++)
            if (nz_at(p, es, f32, i)) o[k++] = i;
        return AF_OK;
    }
    int64_t idx[AF_MAX_RANK] = {0};
    for (int64_t i = 0; i < total; i++) {
        if (nz_at(p, es, f32, i)) {
            for (int a = 0; a < t->rank; a++) o[a * cnt + k] = idx[a];
            k++;
        }
        tn_next(idx, t->dims, t->rank);
    }
    return AF_OK;
}
