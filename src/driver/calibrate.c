/* int8 calibration (calibrate.h): samples from a folder, the float32 model run over them, a
 * range per activation. */
#include "driver/calibrate.h"
#include "driver/compile.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { HIST_BINS = 2048, QUANT_BINS = 256, MAX_SAMPLES = 100000 };

/* ---- the method ---------------------------------------------------------------------------- */

typedef enum method { MINMAX, PERCENTILE, ENTROPY } method;

static af_status parse_method(const char *s, method *m, double *pct, af_error *err) {
    *m = PERCENTILE;
    *pct = 99.99;
    if (!s || !strcmp(s, "percentile")) return AF_OK;
    if (!strcmp(s, "minmax")) return *m = MINMAX, AF_OK;
    if (!strcmp(s, "entropy")) return *m = ENTROPY, AF_OK;
    if (!strncmp(s, "percentile:", 11) || !strncmp(s, "percentile=", 11)) {
        char *end;
        double p = strtod(s + 11, &end);
        if (end != s + 11 && !*end && p > 0 && p <= 100) return *pct = p, AF_OK;
    }
    return af_fail(err, AF_ERR_INVALID_ARG,
                   "--calibration_method: '%s' is not minmax, percentile, percentile:P (0 < P <= "
                   "100) or entropy", s);
}

/* ---- the samples --------------------------------------------------------------------------- */

/* The model inputs a sample gives (graph inputs without a default), in graph order. */
typedef struct sample_set {
    const af_graph *g;
    const char *dir;
    int nin;
    const af_value **in; /* the inputs */
    char **folders;      /* one per sample (subfolder mode), NULL in flat mode */
    int nsamples;
    af_tensor *whole;    /* flat mode: per input, the file as loaded */
    bool split;          /* flat mode: the files hold the samples along dim 0 */
} sample_set;

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_strs(char **v, int n) {
    for (int i = 0; v && i < n; i++) af_free(v[i]);
    af_free(v);
}

/* The entries of dir (hidden ones aside), sorted; *n of them. */
static af_status list_dir(const char *dir, char ***out, int *n, af_error *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return af_fail(err, AF_ERR_IO, "--calibration_data: %s: cannot open the folder: %s", dir,
                       strerror(errno));
    char **v = NULL;
    int cap = 0;
    struct dirent *e;
    af_status st = AF_OK;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (*n == cap) {
            char **more = af_realloc(v, sizeof *v * (size_t)(cap = 2 * cap + 16));
            if (!more) {
                st = af_fail(err, AF_ERR_NOMEM, "out of memory");
                break;
            }
            v = more;
        }
        if (!(v[*n] = af_strdup(e->d_name))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    if (st) {
        free_strs(v, *n);
        *n = 0;
        return st;
    }
    if (*n) qsort(v, (size_t)*n, sizeof *v, cmp_str);
    *out = v;
    return AF_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* The file of input k in folder dir (.npy first, then input_k.pb); false when neither. */
static bool input_file(const sample_set *s, const char *dir, int k, char *path, size_t len) {
    char name[512];
    af_npy_file_name(name, sizeof name, s->in[k]->name);
    snprintf(path, len, "%s/%s", dir, name);
    if (is_file(path)) return true;
    snprintf(path, len, "%s/input_%d.pb", dir, k);
    return is_file(path);
}

/* Every .npy of dir names an input; one file per input exists. */
static af_status check_folder(const sample_set *s, const char *dir, af_error *err) {
    char **names = NULL;
    int n = 0;
    af_status st = list_dir(dir, &names, &n, err);
    for (int i = 0; i < n && !st; i++) {
        if (!ends_with(names[i], ".npy")) continue;
        bool known = false;
        for (int k = 0; k < s->nin && !known; k++) {
            char want[512];
            af_npy_file_name(want, sizeof want, s->in[k]->name);
            known = !strcmp(want, names[i]);
        }
        if (!known) {
            char list[512] = "";
            for (int k = 0; k < s->nin; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                         s->in[k]->name);
            st = af_fail(err, AF_ERR_INVALID_ARG,
                         "--calibration_data: %s/%s names no input of the model (its inputs: %s)",
                         dir, names[i], list);
        }
    }
    free_strs(names, n);
    for (int k = 0; k < s->nin && !st; k++) {
        char path[4096], want[512];
        if (input_file(s, dir, k, path, sizeof path)) continue;
        af_npy_file_name(want, sizeof want, s->in[k]->name);
        st = af_fail(err, AF_ERR_INVALID_ARG,
                     "--calibration_data: %s has no file for input '%s' (%s or input_%d.pb)", dir,
                     s->in[k]->name, want, k);
    }
    return st;
}

static af_status load_tensor(const char *path, af_tensor *t, af_error *err) {
    memset(t, 0, sizeof *t);
    af_status st = ends_with(path, ".npy") ? af_tensor_load_npy(path, t, err)
                                           : af_tensor_load_pb(path, t, NULL, err);
    if (st) {
        char msg[sizeof err->message];
        snprintf(msg, sizeof msg, "%s", err ? err->message : "");
        return af_fail(err, st, "--calibration_data: %s", msg);
    }
    return AF_OK;
}

/* Does t fit input v: its dtype, its rank, every declared dim (all but dim 0 when `batched`)? */
static bool fits(const af_value *v, const af_tensor *t, bool batched) {
    if (v->type.dtype && t->dtype != v->type.dtype) return false;
    if (v->type.rank < 0) return true;
    if (t->rank != v->type.rank) return false;
    for (int d = batched ? 1 : 0; d < t->rank; d++)
        if (v->type.dims[d] >= 0 && v->type.dims[d] != t->dims[d]) return false;
    return true;
}

static af_status misfit(const af_value *v, const af_tensor *t, const char *path, af_error *err) {
    char a[128], b[128];
    return af_fail(err, AF_ERR_INVALID_ARG,
                   "--calibration_data: %s: input '%s' must be %s of shape %s, got %s of shape %s",
                   path, v->name, af_dtype_name(v->type.dtype), af_dims_str(&v->type, a, sizeof a),
                   af_dtype_name(t->dtype), af_dims_str(t, b, sizeof b));
}

static void samples_free(sample_set *s) {
    free_strs(s->folders, s->nsamples);
    for (int k = 0; s->whole && k < s->nin; k++) af_tensor_release(&s->whole[k]);
    af_free(s->whole);
    af_free(s->in);
    memset(s, 0, sizeof *s);
}

/* Flat mode: the files of dir loaded once; N samples when every file is N of the model's
 * dim-0-of-1 inputs. */
static af_status open_flat(sample_set *s, af_error *err) {
    af_status st = check_folder(s, s->dir, err);
    if (!st && !(s->whole = af_calloc((size_t)s->nin + 1, sizeof *s->whole)))
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    int64_t n = -1;
    for (int k = 0; k < s->nin && !st; k++) {
        char path[4096];
        input_file(s, s->dir, k, path, sizeof path);
        af_tensor *t = &s->whole[k];
        if ((st = load_tensor(path, t, err))) break;
        const af_value *v = s->in[k];
        bool one = v->type.rank > 0 && v->type.dims[0] == 1 && t->rank == v->type.rank;
        if (fits(v, t, false)) {
            if (n > 1 && one) st = misfit(v, t, path, err); /* the others hold N */
            n = n < 0 ? 1 : n;
        } else if (one && t->dims[0] > 1 && fits(v, t, true) && (n < 0 || n == t->dims[0] ||
                                                                 (n == 1 && k == 0))) {
            n = t->dims[0];
        } else {
            st = misfit(v, t, path, err);
        }
    }
    if (!st && n > MAX_SAMPLES)
        st = af_fail(err, AF_ERR_INVALID_ARG, "--calibration_data: %s: %lld samples, at most %d",
                     s->dir, (long long)n, MAX_SAMPLES);
    if (!st) {
        s->split = n > 1;
        s->nsamples = (int)(n < 1 ? 1 : n);
        /* a file of one sample beside files of N: each must be N */
        for (int k = 0; k < s->nin && !st && s->split; k++)
            if (s->whole[k].dims[0] != n) {
                char path[4096];
                input_file(s, s->dir, k, path, sizeof path);
                st = misfit(s->in[k], &s->whole[k], path, err);
            }
    }
    return st;
}

static af_status samples_open(const af_graph *g, const char *dir, sample_set *s, af_error *err) {
    memset(s, 0, sizeof *s);
    s->g = g;
    s->dir = dir;
    if (!is_dir(dir))
        return af_fail(err, AF_ERR_INVALID_ARG, "--calibration_data: %s is not a folder", dir);
    s->in = af_calloc((size_t)g->ninputs + 1, sizeof *s->in);
    if (!s->in) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->ninputs; i++)
        if (!g->inputs[i]->is_const) s->in[s->nin++] = g->inputs[i];
    char **names = NULL, **sub = NULL;
    int n = 0, folders = 0;
    af_status st = list_dir(dir, &names, &n, err);
    if (!st && !(sub = af_calloc((size_t)n + 1, sizeof *sub)))
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!is_dir(path)) continue;
        if (!(sub[folders] = af_strdup(path))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        else folders++;
    }
    free_strs(names, n);
    if (st) {
        free_strs(sub, folders);
        af_free(s->in);
        s->in = NULL;
        return st;
    }
    bool any_file = false;
    for (int k = 0; k < s->nin && !any_file; k++) {
        char path[4096];
        any_file = input_file(s, dir, k, path, sizeof path);
    }
    if (folders) {
        s->folders = sub;
        s->nsamples = folders;
        for (int i = 0; i < folders && !st; i++) st = check_folder(s, sub[i], err);
    } else {
        af_free(sub);
        if (!any_file) {
            char want[512];
            af_npy_file_name(want, sizeof want, s->nin ? s->in[0]->name : "input");
            st = af_fail(err, AF_ERR_INVALID_ARG,
                         "--calibration_data: %s holds no calibration sample: no subfolders and "
                         "no input files (%s or input_0.pb)", dir, want);
        } else {
            st = open_flat(s, err);
        }
    }
    if (st) samples_free(s);
    return st;
}

/* Sample i's tensor of input k into *t (borrowed from s->whole in flat mode, loaded and owned
 * otherwise: release it). */
static af_status sample_input(const sample_set *s, int i, int k, af_tensor *t, af_error *err) {
    const af_value *v = s->in[k];
    if (!s->folders) {
        *t = s->whole[k];
        t->owns_data = 0;
        if (s->split) {
            size_t row = s->whole[k].nbytes / (size_t)s->whole[k].dims[0];
            t->dims[0] = 1;
            t->data = (char *)s->whole[k].data + row * (size_t)i;
            t->nbytes = row;
        }
        return AF_OK;
    }
    char path[4096];
    input_file(s, s->folders[i], k, path, sizeof path);
    af_status st = load_tensor(path, t, err);
    if (!st && !fits(v, t, false)) {
        st = misfit(v, t, path, err);
        af_tensor_release(t);
    }
    return st;
}

/* ---- the calibration graph ----------------------------------------------------------------- */

/* The copy of m that calibration runs, its observed activations as outputs nout0... */
typedef struct calib_graph {
    af_model *m;
    const af_value **act;
    int nact, nout0; /* activations; the model's own outputs before them */
    int *slot;       /* per activation, its index in g->outputs */
    af_runtime *rt;
} calib_graph;

static void calib_graph_free(calib_graph *c) {
    af_runtime_free(c->rt);
    af_free(c->act);
    af_free(c->slot);
    af_model_free(c->m);
    memset(c, 0, sizeof *c);
}

static af_status calib_graph_make(const af_model *src, const af_options *opt, calib_graph *c,
                                  af_error *err) {
    memset(c, 0, sizeof *c);
    af_status st = src->dir ? af_model_load(src->path, &c->m, err)
                            : af_model_load_bytes(src->map, src->map_len, src->path, &c->m, err);
    if (st) return st;
    af_graph *g = c->m->graph;
    st = af_pass_widen_halves(g, err);
    if (!st) st = opt->input_shape ? af_apply_input_shape(g, opt->input_shape, err)
                                   : af_graph_infer_shapes(g, err);
    if (!st) st = af_simplify(g, err);
    if (!st) st = af_quant_activations(g, &c->act, &c->nact, err);
    af_value **outs = NULL;
    c->nout0 = g->noutputs;
    if (!st && !(c->slot = af_calloc((size_t)c->nact + 1, sizeof *c->slot)))
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    if (!st && !(outs = af_arena_calloc(g->arena, (size_t)(g->noutputs + c->nact + 1), sizeof *outs)))
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    if (!st) {
        int n = g->noutputs;
        memcpy(outs, g->outputs, sizeof *outs * (size_t)n);
        for (int a = 0; a < c->nact; a++) {
            af_value *v = (af_value *)c->act[a];
            c->slot[a] = -1;
            for (int o = 0; o < n && c->slot[a] < 0; o++)
                if (outs[o] == v) c->slot[a] = o;
            if (c->slot[a] < 0) {
                c->slot[a] = n;
                outs[n++] = v;
                v->is_output = true;
            }
        }
        g->outputs = outs;
        g->noutputs = n;
    }
    if (!st) st = af_lower(g, NULL, err);
    if (!st) st = af_runtime_new(opt->threads, &c->rt, err);
    if (!st) st = af_runtime_prepare(c->rt, g, err);
    if (st) calib_graph_free(c);
    return st;
}

/* ---- the statistics ------------------------------------------------------------------------ */

typedef struct act_stats {
    double lo, hi, amax;
    double *hist; /* HIST_BINS counts of |x| over [0, amax] (second pass) */
} act_stats;

static void observe_range(act_stats *a, const af_tensor *t) {
    int64_t n = af_tensor_numel(t);
    const float *x = t->data;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) continue; /* NaN */
        if (x[i] < a->lo) a->lo = x[i];
        if (x[i] > a->hi) a->hi = x[i];
    }
    a->amax = fmax(fabs(a->lo), fabs(a->hi));
}

static void observe_hist(act_stats *a, const af_tensor *t) {
    int64_t n = af_tensor_numel(t);
    const float *x = t->data;
    double w = a->amax / HIST_BINS;
    if (!(w > 0) || !isfinite(w)) return;
    for (int64_t i = 0; i < n; i++) {
        double v = fabs(x[i]);
        if (v != v || v == 0) continue; /* exact zeros (a ReLU's) quantize exactly at any range */
        int b = (int)(v / w);
        a->hist[b >= HIST_BINS ? HIST_BINS - 1 : b < 0 ? 0 : b] += 1;
    }
}

/* The bin k at whose upper edge the p-th percentile of the histogram lies. */
static int percentile_bin(const double *h, double p) {
    double total = 0, run = 0;
    for (int k = 0; k < HIST_BINS; k++) total += h[k];
    double want = p / 100.0 * total;
    for (int k = 0; k < HIST_BINS; k++)
        if ((run += h[k]) >= want) return k + 1;
    return HIST_BINS;
}

/* KL(p || q) of two histograms of n bins, each normalised here; infinity where q has no mass
 * under p's. */
static double kl_divergence(const double *p, const double *q, int n) {
    double sp = 0, sq = 0, d = 0;
    for (int k = 0; k < n; k++) sp += p[k], sq += q[k];
    if (!(sp > 0) || !(sq > 0)) return INFINITY;
    for (int k = 0; k < n; k++) {
        if (p[k] <= 0) continue;
        if (q[k] <= 0) return INFINITY;
        d += p[k] / sp * log((p[k] / sp) / (q[k] / sq));
    }
    return d;
}

/* TensorRT's entropy calibration (as pytorch-quantization computes it): for each threshold of
 * i bins (nq..2048), the reference P is the histogram cut at i with the outliers added to its
 * last bin, the candidate Q the first i bins merged into nq levels and spread back evenly over
 * their nonzero bins; the threshold is the edge of the i with the least KL(P || Q) (the last of
 * equals). nq is the levels |x| gets: 128 for a signed tensor (TensorRT's int8), 256 for one
 * that is never negative (a ReLU's output: uint8 spends every level on [0, hi]). Returns i. */
static int entropy_bin(const double *h, int nq) {
    double *p = af_malloc(sizeof *p * HIST_BINS), *q = af_malloc(sizeof *q * HIST_BINS);
    double sum[QUANT_BINS];
    int cnt[QUANT_BINS], best = HIST_BINS;
    double best_d = INFINITY, tail = 0;
    if (!p || !q) {
        af_free(p), af_free(q);
        return HIST_BINS;
    }
    for (int k = nq; k < HIST_BINS; k++) tail += h[k];
    for (int i = nq; i <= HIST_BINS; i++) {
        if (i > nq) tail -= h[i - 1];
        memcpy(p, h, sizeof *p * (size_t)i);
        p[i - 1] += tail;
        memset(sum, 0, sizeof sum);
        memset(cnt, 0, sizeof cnt);
        for (int k = 0; k < i; k++) {
            int j = (int)((int64_t)k * nq / i);
            if (h[k] != 0) sum[j] += h[k], cnt[j]++;
        }
        for (int k = 0; k < i; k++) {
            int j = (int)((int64_t)k * nq / i);
            q[k] = h[k] != 0 ? sum[j] / cnt[j] : 0;
        }
        double d = kl_divergence(p, q, i);
        if (d <= best_d) best_d = d, best = i;
    }
    af_free(p), af_free(q);
    return best;
}

/* One pass over the samples: ranges (hist false) or histograms. */
static af_status run_pass(calib_graph *c, const sample_set *s, act_stats *a, bool hist,
                          af_error *err) {
    const af_graph *g = c->m->graph;
    const af_tensor **in = af_calloc((size_t)g->ninputs + 1, sizeof *in);
    af_tensor *t = af_calloc((size_t)s->nin + 1, sizeof *t);
    af_tensor *out = af_calloc((size_t)g->noutputs + 1, sizeof *out);
    af_status st = in && t && out ? AF_OK : af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->nsamples && !st; i++) {
        int loaded = 0;
        for (int k = 0; k < s->nin && !st; k++, loaded++) st = sample_input(s, i, k, &t[k], err);
        for (int j = 0, k = 0; !st && j < g->ninputs; j++)
            in[j] = g->inputs[j]->is_const ? NULL : &t[k++];
        if (!st) {
            st = af_exec_graph_on(g, c->rt, in, out, err);
            if (st) {
                char msg[sizeof err->message];
                snprintf(msg, sizeof msg, "%s", err ? err->message : "");
                st = af_fail(err, st, "calibration sample %d (%s): %s", i + 1,
                             s->folders ? s->folders[i] : s->dir, msg);
            }
        }
        for (int k = 0; !st && k < c->nact; k++) {
            const af_tensor *y = &out[c->slot[k]];
            if (y->dtype != AF_DTYPE_FLOAT) continue;
            if (hist) observe_hist(&a[k], y);
            else observe_range(&a[k], y);
        }
        if (!st)
            for (int o = 0; o < g->noutputs; o++) af_tensor_release(&out[o]);
        for (int k = 0; k < loaded; k++) af_tensor_release(&t[k]);
    }
    af_free(in), af_free(t), af_free(out);
    return st;
}

void af_quant_table_free(af_quant_table *t) {
    if (!t) return;
    free_strs(t->names, t->n);
    af_free(t->lo);
    af_free(t->hi);
    af_free(t);
}

static af_quant_table *table_new(int n) {
    af_quant_table *t = af_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->names = af_calloc((size_t)n + 1, sizeof *t->names);
    t->lo = af_calloc((size_t)n + 1, sizeof *t->lo);
    t->hi = af_calloc((size_t)n + 1, sizeof *t->hi);
    if (!t->names || !t->lo || !t->hi) {
        af_quant_table_free(t);
        return NULL;
    }
    /* 7-bit weights where VPDPBUSD is missing: VPMADDUBSW's int16 pair sums are exact only
     * then (lower/int8.c), as ONNX Runtime's reduce_range advises for such CPUs */
    t->weight_max = af_cpu_vnni() ? 127 : 63;
    return t;
}

static af_quant_table *table_copy(const af_quant_table *src) {
    af_quant_table *t = table_new(src->n);
    for (int i = 0; t && i < src->n; i++) {
        if (!(t->names[i] = af_strdup(src->names[i]))) {
            af_quant_table_free(t);
            return NULL;
        }
        t->n++;
        t->lo[i] = src->lo[i], t->hi[i] = src->hi[i];
    }
    if (t) {
        t->samples = src->samples;
        t->weight_max = src->weight_max;
        memcpy(t->method, src->method, sizeof t->method);
    }
    return t;
}

static af_status calibrate(const af_model *m, const af_options *opt, af_quant_table **out,
                           af_error *err) {
    method meth;
    double pct;
    af_status st = parse_method(opt->calibration_method, &meth, &pct, err);
    if (st) return st;
    calib_graph c;
    if ((st = calib_graph_make(m, opt, &c, err))) return st;
    sample_set s;
    act_stats *a = NULL;
    af_quant_table *t = NULL;
    if ((st = samples_open(c.m->graph, opt->calibration_data, &s, err))) {
        calib_graph_free(&c);
        return st;
    }
    if (!(a = af_calloc((size_t)c.nact + 1, sizeof *a))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < c.nact; k++) a[k].lo = INFINITY, a[k].hi = -INFINITY;
    if (!st) st = run_pass(&c, &s, a, false, err);
    if (!st && meth != MINMAX) {
        for (int k = 0; !st && k < c.nact; k++)
            if (!(a[k].hist = af_calloc(HIST_BINS, sizeof *a[k].hist)))
                st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        if (!st) st = run_pass(&c, &s, a, true, err);
    }
    if (!st && !(t = table_new(c.nact))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < c.nact; k++) {
        double lo = a[k].lo, hi = a[k].hi;
        if (meth != MINMAX && a[k].amax > 0 && isfinite(a[k].amax)) {
            int bin = meth == ENTROPY ? entropy_bin(a[k].hist, lo >= 0 ? 256 : 128)
                                      : percentile_bin(a[k].hist, pct);
            double th = a[k].amax * bin / HIST_BINS;
            lo = fmax(lo, -th), hi = fmin(hi, th);
        }
        if (!(t->names[k] = af_strdup(c.act[k]->name))) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        else t->n++;
        t->lo[k] = (float)lo, t->hi[k] = (float)hi; /* infinite: never seen (the op stays float) */
    }
    if (!st) {
        t->samples = s.nsamples;
        if (meth == PERCENTILE) snprintf(t->method, sizeof t->method, "percentile %g", pct);
        else snprintf(t->method, sizeof t->method, "%s", meth == MINMAX ? "minmax" : "entropy");
        *out = t;
        t = NULL;
    }
    for (int k = 0; a && k < c.nact; k++) af_free(a[k].hist);
    af_free(a);
    af_quant_table_free(t);
    samples_free(&s);
    calib_graph_free(&c);
    return st;
}

/* ---- the cache ----------------------------------------------------------------------------- */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cache_key;
static af_quant_table *cache_table;

/* What identifies a calibration: the model's bytes (a hash), the folder, the method, the input
 * shapes. NULL when out of memory. */
static char *key_of(const af_model *m, const af_options *opt) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *p = m->map;
    size_t n = m->map_len, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    char dir[4096];
    if (!realpath(opt->calibration_data, dir)) snprintf(dir, sizeof dir, "%s", opt->calibration_data);
    size_t len = strlen(dir) + 256 + (opt->input_shape ? strlen(opt->input_shape) : 0) +
                 (opt->calibration_method ? strlen(opt->calibration_method) : 0);
    char *k = af_malloc(len);
    if (k)
        snprintf(k, len, "%016llx/%zu\n%s\n%s\n%s", (unsigned long long)h, n, dir,
                 opt->calibration_method ? opt->calibration_method : "",
                 opt->input_shape ? opt->input_shape : "");
    return k;
}

af_status af_calibrate(const af_model *m, const af_options *opt, af_quant_table **out,
                       af_error *err) {
    *out = NULL;
    if (!opt->calibration_data || !*opt->calibration_data)
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: --precision_mode=int8 needs --calibration_data=DIR (a folder of "
                       "calibration samples)", m->path);
    char *key = key_of(m, opt);
    if (!key) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&cache_lock);
    if (cache_key && !strcmp(cache_key, key)) *out = table_copy(cache_table);
    pthread_mutex_unlock(&cache_lock);
    if (*out) {
        af_free(key);
        return AF_OK;
    }
    af_status st = calibrate(m, opt, out, err);
    af_quant_table *copy = st ? NULL : table_copy(*out);
    pthread_mutex_lock(&cache_lock);
    if (copy) {
        af_free(cache_key);
        af_quant_table_free(cache_table);
        cache_key = key;
        cache_table = copy;
        key = NULL;
    }
    pthread_mutex_unlock(&cache_lock);
    af_free(key);
    return st;
}
