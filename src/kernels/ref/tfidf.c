/* Reference TfIdfVectorizer (ONNX opset 9) for integer inputs: counts the (skip-)n-grams of each
 * row of X that appear in the pool_int64s attribute and writes, at each n-gram's output
 * coordinate, its count (TF), its weight when present (IDF) or count times weight (TFIDF).
 * String pools and inputs are not supported.
 *
 * The pool is laid out as in ONNX: ngram_counts[i] is where the (i+1)-grams start in the pool,
 * each (i+1)-gram takes i+1 consecutive entries, and n-grams are numbered in pool order; that
 * number indexes ngram_indexes (output coordinate) and weights.
 *
 * Invariant: the pool layout is validated once (levels ordered, inside the pool, whole n-grams,
 * one index and weight per n-gram) before any lookup, and an n-gram is only formed from
 * positions inside its row, so no attribute or input value can lead a read or a write out of
 * bounds. */
#include "kernels/ref/nn_common.h"

#include <stdlib.h>

typedef enum tfidf_mode { TFIDF_TF, TFIDF_IDF, TFIDF_TFIDF } tfidf_mode;

/* The validated attributes. */
typedef struct tfidf_spec {
    int64_t min_n, max_n, max_skip;
    tfidf_mode mode;
    const int64_t *pool, *starts, *index;
    int npool, nlevels, ngrams; /* pool entries, n-gram lengths in the pool, n-grams */
    const float *weights;       /* NULL: every weight is 1 */
    int64_t width;              /* output coordinates: max(ngram_indexes) + 1 */
} tfidf_spec;

/* End (exclusive) of pool level l: where the next level starts, or the end of the pool. */
static int64_t tfidf_level_end(const tfidf_spec *s, int l) {
    return l + 1 < s->nlevels ? s->starts[l + 1] : s->npool;
}

static af_status tfidf_spec_read(const af_node *n, tfidf_spec *s, af_error *err) {
    memset(s, 0, sizeof *s);
    if (af_node_attr(n, "pool_strings"))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "string pools are not supported");
    s->min_n = af_attr_int(n, "min_gram_length", 0);
    s->max_n = af_attr_int(n, "max_gram_length", 0);
    s->max_skip = af_attr_int(n, "max_skip_count", 0);
    if (s->min_n < 1 || s->max_n < s->min_n || s->max_skip < 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "needs 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0");
    const char *mode = af_attr_str(n, "mode", "");
    if (!strcmp(mode, "TF"))
        s->mode = TFIDF_TF;
    else if (!strcmp(mode, "IDF"))
        s->mode = TFIDF_IDF;
    else if (!strcmp(mode, "TFIDF"))
        s->mode = TFIDF_TFIDF;
    else
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "mode '%s' is not TF, IDF or TFIDF", mode);
    s->npool = af_attr_ints(n, "pool_int64s", &s->pool);
    s->nlevels = af_attr_ints(n, "ngram_counts", &s->starts);
    s->ngrams = af_attr_ints(n, "ngram_indexes", &s->index);
    if (s->npool < 0 || s->nlevels < 0 || s->ngrams < 0)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "needs pool_int64s, ngram_counts and ngram_indexes");
    int64_t total = 0;
    for (int l = 0; l < s->nlevels; l++) {
        int64_t b = s->starts[l], e = tfidf_level_end(s, l);
        if (b < 0 || e < b || e > s->npool || (e - b) % (l + 1) != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                                "ngram_counts do not split the pool into whole %d-grams", l + 1);
        total += (e - b) / (l + 1);
    }
    if (total != s->ngrams)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL,
                            "pool holds %lld n-grams but ngram_indexes has %d", (long long)total,
                            s->ngrams);
    int nw = af_attr_floats(n, "weights", &s->weights);
    if (nw < 0)
        s->weights = NULL;
    else if (nw != s->ngrams)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "weights has %d values for %d n-grams",
                            nw, s->ngrams);
    for (int i = 0; i < s->ngrams; i++) {
        if (s->index[i] < 0 || s->index[i] == INT64_MAX)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "ngram_indexes[%d] = %lld", i,
                                (long long)s->index[i]);
        if (s->index[i] + 1 > s->width)
            s->width = s->index[i] + 1;
    }
    return AF_OK;
}

/* X must be int32/int64 [C] or [N, C]; the output is float [width] or [N, width]. */
static af_status tfidf_prepare(const af_node *n, const af_tensor *const *in, tfidf_spec *s,
                               af_tensor *type, af_error *err) {
    const af_tensor *x = nn_in(n, in, 0);
    if (!x)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing input");
    if (x->dtype != AF_DTYPE_INT32 && x->dtype != AF_DTYPE_INT64)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "TfIdfVectorizer on %s",
                            af_dtype_name(x->dtype));
    af_status st = tfidf_spec_read(n, s, err);
    if (st)
        return st;
    if (x->rank < 0) {
        af_tensor_set_type(type, AF_DTYPE_FLOAT, -1, NULL);
        return AF_OK;
    }
    if (x->rank != 1 && x->rank != 2)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input must be [C] or [N, C]");
    int64_t dims[2] = {x->dims[0], s->width};
    if (x->rank == 1)
        dims[0] = s->width;
    af_tensor_set_type(type, AF_DTYPE_FLOAT, x->rank, dims);
    return AF_OK;
}

af_status shape_tfidf(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    tfidf_spec s;
    return tfidf_prepare(n, in, &s, &out[0], err);
}

/* Whether the n-gram of row `row` starting at i with stride gap equals pool n-gram e of level
 * n - 1 (the caller keeps i + (n - 1) * gap inside the row). */
static bool tfidf_match(const tfidf_spec *s, const af_tensor *x, int64_t row, int64_t i,
                        int64_t gap, int64_t nlen, int64_t e) {
    const int64_t *g = s->pool + s->starts[nlen - 1] + e * nlen;
    for (int64_t t = 0; t < nlen; t++)
        if (nn_geti(x, row + i + t * gap) != g[t])
            return false;
    return true;
}

/* Add to counts[] the pool n-grams of length nlen found in the row of c items at `row`, for
 * every skip in [0, max_skip] (a 1-gram is the same whatever the skip: counted once). */
static void tfidf_count(const tfidf_spec *s, const af_tensor *x, int64_t row, int64_t c,
                        int64_t nlen, double *counts) {
    int l = (int)nlen - 1;
    int64_t first = 0; /* number of the level's first n-gram */
    for (int k = 0; k < l; k++)
        first += (tfidf_level_end(s, k) - s->starts[k]) / (k + 1);
    int64_t entries = (tfidf_level_end(s, l) - s->starts[l]) / nlen;
    for (int64_t skip = 0; skip <= s->max_skip && (skip == 0 || nlen > 1); skip++) {
        /* gap <= c and nlen <= npool keep span from overflowing */
        int64_t gap = skip + 1, span = (nlen - 1) * gap;
        if (gap > c || span >= c)
            break;
        for (int64_t i = 0; i + span < c; i++)
            for (int64_t e = 0; e < entries; e++)
                if (tfidf_match(s, x, row, i, gap, nlen, e)) {
                    counts[first + e] += 1.0;
                    break;
                }
    }
}

af_status ref_tfidf(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_exec *x_, af_error *err) {
    (void)x_;
    tfidf_spec s;
    af_tensor type = {0};
    af_status st = tfidf_prepare(n, in, &s, &type, err);
    if (st)
        return st;
    af_tensor *y = &out[0];
    if ((st = nn_check_out(n, y, type.rank, type.dims, err)))
        return st;
    const af_tensor *x = in[0];
    int64_t rows = x->rank == 2 ? x->dims[0] : 1, c = x->dims[x->rank - 1];
    size_t need;
    int64_t numel = af_tensor_numel(x);
    if (numel < 0 || !af_mul_size((size_t)numel, af_dtype_size(x->dtype), &need) ||
        (need && (!x->data || x->nbytes < need)))
        return af_node_fail(err, n, AF_ERR_INTERNAL, "input data missing or shorter than its shape");
    double *counts = af_calloc((size_t)(s.ngrams > 0 ? s.ngrams : 1), sizeof(double));
    if (!counts)
        return af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
    int64_t top = s.max_n < s.nlevels ? s.max_n : s.nlevels;
    for (int64_t r = 0; r < rows; r++) {
        memset(counts, 0, (size_t)(s.ngrams > 0 ? s.ngrams : 1) * sizeof(double));
        for (int64_t nlen = s.min_n; nlen <= top; nlen++)
            tfidf_count(&s, x, r * c, c, nlen, counts);
        /* Output coordinates shared by several n-grams add up. */
        for (int i = 0; i < s.ngrams; i++) {
            double w = s.weights ? s.weights[i] : 1.0, v = counts[i];
            if (s.mode == TFIDF_IDF)
                v = v > 0 ? w : 0.0;
            else if (s.mode == TFIDF_TFIDF)
                v *= w;
            int64_t at = r * s.width + s.index[i];
            nn_put(y, at, af_tensor_get_double(y, at) + v);
        }
    }
    af_free(counts);
    return AF_OK;
}
