/* The public session API (include/autofusion.h): load, describe, run.
 * A session owns its model; inputs are checked against the declared types before anything
 * runs, so a wrong dtype or shape is a clear error rather than a kernel failure.
 * Once the graph is final (optimised, or loaded compiled) the session holds its memory plan
 * (runtime/plan.h) and one arena, made at the first run and reused by every later one.
 *
 * Concurrent runs. af_session_run may be called from any number of threads at once. One run at a
 * time holds the session's arena, plans and worker threads; a run that arrives while they are
 * held does not wait and does not share them: it runs on its caller's thread alone, on the
 * executor that allocates every intermediate (the same kernels, so the same bits). Threads that
 * share a session thus each get a core's worth of work, and a single caller keeps the planned,
 * allocation-free path.
 *
 * A model with dynamic input dims gets a plan per shape signature (the inputs' dims): made at the
 * first run of that signature from the types inferred for it, with its own arena, and kept in a
 * small cache (least recently used out), so a repeated shape allocates no intermediate.
 *
 * Invariant: a session's graph, plan and arena belong together: the plan is the file's only when
 * no --input_shape changed the types it was made for; a cached plan serves only its signature. */
#include "driver/calibrate.h"
#include "driver/compile.h"
#include "driver/session.h"
#include "format/afm.h"
#include "onnx/export.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"
#include "runtime/profile.h"

#include <stdatomic.h>
#include <string.h>

/* The dims an input may take (--input_shape_range): per dim lo..hi. */
typedef struct dim_range {
    int rank; /* 0: the input has no range */
    int64_t lo[AF_MAX_RANK], hi[AF_MAX_RANK];
} dim_range;

/* One shape signature's plan and arena. */
enum { SHAPE_PLANS = 4 };
typedef struct shape_plan {
    int64_t *sig; /* per input: rank, then dims (-1 rank: not given) */
    size_t nsig;
    af_plan *plan;
    void *arena;
    uint64_t used; /* the session's run count at its last use */
} shape_plan;

struct af_session {
    af_model *model;
    af_options opt;
    af_compiled c;              /* report (when fused), precision, plan */
    char *report_text, *report_json; /* rendered on demand */
    af_runtime *rt;             /* threads and kernel scratch */
    void *arena;                /* plan->arena_size bytes, made by the first run */
    atomic_int running;         /* a run holds the arena, the plans and the workers */
    bool dynamic;               /* some input dim is symbolic: plans per shape */
    shape_plan shapes[SHAPE_PLANS];
    uint64_t runs;
    dim_range *ranges;          /* per graph input, or NULL: no --input_shape_range */
    char *range_spec;           /* the spec, kept for af_session_save */
    char model_version[24];     /* the model's model_version in decimal (af_session_metadata) */
};

static af_status parse_ranges(af_session *s, const char *spec, af_error *err);
static af_status preplan(af_session *s, af_error *err);

static void shape_plan_clear(shape_plan *p) {
    af_free(p->sig);
    af_plan_free(p->plan);
    af_free(p->arena);
    memset(p, 0, sizeof *p);
}

const char *af_version(void) { return AF_VERSION; }

void af_options_init(af_options *opt) {
    memset(opt, 0, sizeof *opt);
}

/* A compiled model as the file has it: its precision mode, its plan unless --input_shape
 * changed the types it was made for (then the shapes are inferred again and a new plan made). */
static af_status loaded(af_graph *g, af_plan **file_plan, const char *file_precision,
                        const af_options *opt, af_compiled *c, af_error *err) {
    c->precision = "fp32";
    for (int p = 0; file_precision && p <= AF_PREC_INT8; p++)
        if (!strcmp(file_precision, af_precision_name((af_precision)p)))
            c->precision = af_precision_name((af_precision)p);
    if (*file_plan && !opt->input_shape) {
        c->plan = *file_plan;
        *file_plan = NULL;
        return AF_OK;
    }
    af_status st = opt->input_shape ? af_apply_input_shape(g, opt->input_shape, err) : AF_OK;
#ifndef NDEBUG
    if (!st) st = af_graph_verify(g, err);
#endif
    return st ? st : af_plan_build(g, &c->plan, err);
}

static af_status finish(af_model *m, af_plan *file_plan, const af_options *opt, bool compiled,
                        const char *file_precision, const char *file_range, af_session **out,
                        af_error *err) {
    af_session *s = af_calloc(1, sizeof *s);
    af_status st = AF_OK;
    if (!s) {
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->model = m;
    snprintf(s->model_version, sizeof s->model_version, "%lld", (long long)m->model_version);
    if (opt) s->opt = *opt;
    else af_options_init(&s->opt);
    /* A compiled model is already optimised and lowered; an ONNX one goes through the driver,
     * calibrated first under int8 (a copy of the model run over the samples). */
    af_quant_table *calib = NULL;
    if (!compiled && s->opt.precision_mode &&
        af_precision_parse(s->opt.precision_mode) == AF_PREC_INT8)
        st = af_calibrate(m, &s->opt, &calib, err);
    if (!st)
        st = compiled ? loaded(m->graph, &file_plan, file_precision, &s->opt, &s->c, err)
                      : af_compile_with(m->graph, m->path, &s->opt, calib, &s->c, err);
    af_quant_table_free(calib);
    if (st) goto fail;
    if (s->c.fused && af_fusion_log_requested()) af_fusion_report_print(&s->c.report, stderr);
    st = af_runtime_new(s->opt.threads, &s->rt, err);
    if (!st) st = af_runtime_prepare(s->rt, m->graph, err);
    if (st) goto fail;
    for (int i = 0; i < m->graph->ninputs; i++)
        for (int d = 0; !m->graph->inputs[i]->is_const && d < m->graph->inputs[i]->type.rank; d++)
            s->dynamic |= m->graph->inputs[i]->type.dims[d] < 0;
    const char *range = s->opt.input_shape_range ? s->opt.input_shape_range : file_range;
    if (range && (st = parse_ranges(s, range, err))) goto fail;
    if ((st = preplan(s, err))) goto fail;
    /* Borrowed strings are not kept past this call. */
    s->opt.input_shape = s->opt.disable_fusion = s->opt.fusion_switch_file = NULL;
    s->opt.precision_mode = s->opt.keep_fp32 = s->opt.input_shape_range = NULL;
    s->opt.calibration_data = s->opt.calibration_method = NULL;
    *out = s;
    return AF_OK;
fail:
    if (s) {
        s->model = NULL; /* freed below, as when s was never made */
        af_session_free(s);
    }
    af_plan_free(file_plan);
    af_model_free(m);
    return st;
}

static bool is_afm(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".afm");
}

af_status af_session_new(const char *path, const af_options *opt, af_session **out, af_error *err) {
    af_model *m = NULL;
    af_plan *plan = NULL;
    *out = NULL;
    bool compiled = is_afm(path);
    af_afm_meta meta = {0};
    af_status st = af_plugin_load_env(err);
    if (st) return st;
    st = compiled ? af_afm_load_with_plan(path, &m, &meta, &plan, err)
                            : af_model_load(path, &m, err);
    const char *prec = NULL, *range = NULL;
    for (int i = 0; i < meta.nkv; i++) {
        if (!strcmp(meta.kv[i].key, "precision_mode")) prec = meta.kv[i].value;
        if (!strcmp(meta.kv[i].key, "input_shape_range")) range = meta.kv[i].value;
    }
    return st ? st : finish(m, plan, opt, compiled, prec, range, out, err);
}

af_status af_session_new_from_bytes(const void *bytes, size_t len, const char *name,
                                    const af_options *opt, af_session **out, af_error *err) {
    af_model *m = NULL;
    *out = NULL;
    af_status st = af_plugin_load_env(err);
    if (!st) st = af_model_load_bytes(bytes, len, name, &m, err);
    return st ? st : finish(m, NULL, opt, false, NULL, NULL, out, err);
}

const char *af_session_report(af_session *s, int json) {
    if (!s->c.fused) return NULL;
    if (json) {
        if (!s->report_json) s->report_json = af_fusion_report_json(&s->c.report);
        return s->report_json;
    }
    if (!s->report_text) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) return NULL;
        af_fusion_report_print(&s->c.report, f);
        fclose(f);
        s->report_text = buf;
    }
    return s->report_text;
}

af_model *af_session_model(const af_session *s) { return s->model; }

const af_plan *af_session_plan(const af_session *s) { return s->c.plan; }

const af_plan *af_session_last_plan(const af_session *s) {
    const shape_plan *last = NULL;
    for (int i = 0; s->dynamic && i < SHAPE_PLANS; i++)
        if (s->shapes[i].plan && (!last || s->shapes[i].used > last->used)) last = &s->shapes[i];
    return last ? last->plan : s->c.plan;
}

const af_fusion_report *af_session_fusion_report(const af_session *s) {
    return s->c.fused ? &s->c.report : NULL;
}

void af_session_free(af_session *s) {
    if (!s) return;
    af_compiled_free(&s->c);
    af_free(s->report_text);
    af_free(s->report_json);
    af_runtime_free(s->rt);
    af_free(s->arena);
    for (int i = 0; i < SHAPE_PLANS; i++) shape_plan_clear(&s->shapes[i]);
    af_free(s->ranges);
    af_free(s->range_spec);
    af_model_free(s->model);
    af_free(s);
    af_heap_trim(); /* a model's worth of memory went back to the heap */
}

/* The inputs as the API numbers them: the required ones (no initializer) in graph order, then
 * those with a default, in graph order, as ONNX Runtime lists its inputs and overridable
 * initializers. NULL when i is out of range. */
static const af_value *input_at(const af_session *s, int i) {
    const af_graph *g = s->model->graph;
    int required = af_session_input_count(s);
    bool want_default = i >= required;
    if (want_default) i -= required;
    for (int k = 0; i >= 0 && k < g->ninputs; k++)
        if (g->inputs[k]->is_const == want_default && i-- == 0) return g->inputs[k];
    return NULL;
}

int af_session_input_count(const af_session *s) {
    int n = 0;
    for (int k = 0; k < s->model->graph->ninputs; k++) n += !s->model->graph->inputs[k]->is_const;
    return n;
}

int af_session_default_input_count(const af_session *s) {
    return s->model->graph->ninputs - af_session_input_count(s);
}

int af_session_output_count(const af_session *s) { return s->model->graph->noutputs; }

const char *af_session_input_name(const af_session *s, int i) {
    const af_value *v = input_at(s, i);
    return v ? v->name : NULL;
}

const char *af_session_output_name(const af_session *s, int i) {
    return i >= 0 && i < s->model->graph->noutputs ? s->model->graph->outputs[i]->name : NULL;
}

static af_status type_of(const af_value *v, af_tensor *t, af_error *err) {
    if (!v) return af_fail(err, AF_ERR_INVALID_ARG, "index out of range");
    memset(t, 0, sizeof *t);
    t->dtype = v->type.dtype;
    t->rank = v->type.rank;
    for (int d = 0; d < AF_MAX_RANK; d++) /* symbols are internal: outside, a dim is unknown */
        t->dims[d] = v->type.dims[d] < 0 ? -1 : v->type.dims[d];
    return AF_OK;
}

int af_session_input_has_default(const af_session *s, int i) {
    const af_value *v = input_at(s, i);
    return v && v->is_const;
}

af_status af_session_input_type(const af_session *s, int i, af_tensor *t) {
    return type_of(input_at(s, i), t, NULL);
}

af_status af_session_output_type(const af_session *s, int i, af_tensor *t) {
    const af_graph *g = s->model->graph;
    return type_of(i >= 0 && i < g->noutputs ? g->outputs[i] : NULL, t, NULL);
}

static af_status check_input(const af_model *m, const af_value *v, const af_tensor *t,
                             af_error *err) {
    char a[128], b[128];
    if (!t || (!t->data && af_tensor_numel(t) != 0))
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: input '%s' has no data", m->path, v->name);
    if (v->type.dtype && t->dtype != v->type.dtype)
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: input '%s' must be %s, got %s", m->path,
                       v->name, af_dtype_name(v->type.dtype), af_dtype_name(t->dtype));
    bool ok = t->rank >= 0 && t->rank <= AF_MAX_RANK && af_tensor_numel(t) >= 0;
    if (ok && v->type.rank >= 0) {
        ok = v->type.rank == t->rank;
        for (int i = 0; ok && i < t->rank; i++)
            ok = v->type.dims[i] < 0 || v->type.dims[i] == t->dims[i];
    }
    if (ok) {
        size_t need;
        ok = af_mul_size((size_t)af_tensor_numel(t), af_dtype_size(t->dtype), &need) &&
             (t->nbytes == 0 || t->nbytes >= need);
    }
    if (!ok)
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: input '%s' must have shape %s, got %s",
                       m->path, v->name, af_dims_str(&v->type, a, sizeof a),
                       af_dims_str(t, b, sizeof b));
    return AF_OK;
}

/* Dims named alike are one size: "batch" of input_ids and of attention_mask must agree. */
static af_status check_symbols(const af_model *m, const af_tensor *const *bound, af_error *err) {
    const af_graph *g = m->graph;
    for (int k = 0; k < g->ninputs; k++)
        for (int d = 0; bound[k] && d < g->inputs[k]->type.rank; d++) {
            int64_t sym = g->inputs[k]->type.dims[d];
            for (int j = 0; af_dim_is_sym(sym) && j <= k; j++)
                for (int e = 0; bound[j] && e < (j < k ? g->inputs[j]->type.rank : d); e++) {
                    if (g->inputs[j]->type.dims[e] != sym || bound[j]->dims[e] == bound[k]->dims[d])
                        continue;
                    char name[64];
                    return af_fail(err, AF_ERR_INVALID_ARG,
                                   "%s: input '%s' dim %d (%s) is %lld, but input '%s' dim %d, "
                                   "the same symbol, is %lld",
                                   m->path, g->inputs[k]->name, d,
                                   af_dim_str(g, sym, name, sizeof name),
                                   (long long)bound[k]->dims[d], g->inputs[j]->name, e,
                                   (long long)bound[j]->dims[e]);
                }
        }
    return AF_OK;
}

/* The cached plan of this run's shape signature, made (in the least recently used place) when
 * the signature is new. */
static af_status shape_plan_for(af_session *s, const af_tensor *const *bound, shape_plan **out,
                                af_error *err) {
    const af_graph *g = s->model->graph;
    int64_t sig[64 * (AF_MAX_RANK + 1)];
    size_t n = 0;
    for (int k = 0; k < g->ninputs && n + AF_MAX_RANK + 1 <= AF_COUNT(sig); k++) {
        sig[n++] = bound[k] ? bound[k]->rank : -1;
        for (int d = 0; bound[k] && d < bound[k]->rank; d++) sig[n++] = bound[k]->dims[d];
    }
    shape_plan *lru = &s->shapes[0];
    for (int i = 0; i < SHAPE_PLANS; i++) {
        shape_plan *p = &s->shapes[i];
        if (p->plan && p->nsig == n && !memcmp(p->sig, sig, n * sizeof *sig)) {
            p->used = ++s->runs;
            *out = p;
            return AF_OK;
        }
        if (p->used < lru->used) lru = p;
    }
    shape_plan_clear(lru);
    lru->sig = af_malloc(n * sizeof *sig + 1);
    if (!lru->sig) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", s->model->path);
    memcpy(lru->sig, sig, n * sizeof *sig);
    lru->nsig = n;
    af_status st = af_plan_build_for(g, bound, &lru->plan, err);
    if (st) {
        shape_plan_clear(lru);
        return st;
    }
    lru->used = ++s->runs;
    *out = lru;
    return AF_OK;
}

/* ---- --input_shape_range ------------------------------------------------------------------ */

/* One input's dims "1,1~32,512" into r; false when malformed. */
static bool parse_dims(const char *q, const char *stop, dim_range *r) {
    r->rank = 0;
    while (q < stop) {
        char *e;
        long long lo = strtoll(q, &e, 10), hi = lo;
        if (e == q || e > stop || lo < 0 || r->rank == AF_MAX_RANK) return false;
        if (e < stop && *e == '~') {
            q = e + 1;
            hi = strtoll(q, &e, 10);
            if (e == q || e > stop || hi < lo) return false;
        }
        r->lo[r->rank] = lo, r->hi[r->rank++] = hi;
        q = e;
        if (q < stop && *q == ',' && q + 1 < stop) q++;
        else if (q < stop) return false;
    }
    return r->rank > 0;
}

/* "name:1,1~32,512;name2:..." into s->ranges, checked against the inputs' declared types. */
static af_status parse_ranges(af_session *s, const char *spec, af_error *err) {
    const af_graph *g = s->model->graph;
    const char *file = s->model->path;
    s->ranges = af_calloc((size_t)g->ninputs + 1, sizeof *s->ranges);
    s->range_spec = af_strdup(spec);
    if (!s->ranges || !s->range_spec) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ';'), *stop = end ? end : p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(stop - p));
        int k = 0;
        while (colon && k < g->ninputs && (strlen(g->inputs[k]->name) != (size_t)(colon - p) ||
                                           memcmp(g->inputs[k]->name, p, (size_t)(colon - p))))
            k++;
        if (!colon)
            return af_fail(err, AF_ERR_INVALID_ARG, "%s: --input_shape_range: '%.*s' is not "
                           "name:d1,lo~hi,...", file, (int)(stop - p), p);
        if (k == g->ninputs)
            return af_fail(err, AF_ERR_INVALID_ARG, "%s: --input_shape_range: the model has no "
                           "input '%.*s'", file, (int)(colon - p), p);
        const af_value *v = g->inputs[k];
        dim_range *r = &s->ranges[k];
        if (!parse_dims(colon + 1, stop, r))
            return af_fail(err, AF_ERR_INVALID_ARG, "%s: --input_shape_range: bad dims for '%s' "
                           "(d or lo~hi with lo <= hi, comma-separated)", file, v->name);
        if (v->type.rank >= 0 && v->type.rank != r->rank)
            return af_fail(err, AF_ERR_INVALID_ARG, "%s: --input_shape_range: '%s' has rank %d, "
                           "not %d", file, v->name, v->type.rank, r->rank);
        for (int d = 0; d < r->rank && v->type.rank >= 0; d++)
            if (v->type.dims[d] >= 0 && (v->type.dims[d] < r->lo[d] || v->type.dims[d] > r->hi[d]))
                return af_fail(err, AF_ERR_INVALID_ARG, "%s: --input_shape_range: dim %d of '%s' "
                               "is fixed to %lld by the model", file, d, v->name,
                               (long long)v->type.dims[d]);
        p = end ? end + 1 : stop;
    }
    return AF_OK;
}

static af_status check_ranges(const af_session *s, const af_tensor *const *bound, af_error *err) {
    const af_graph *g = s->model->graph;
    for (int k = 0; s->ranges && k < g->ninputs; k++) {
        const dim_range *r = &s->ranges[k];
        for (int d = 0; bound[k] && d < r->rank; d++)
            if (bound[k]->dims[d] < r->lo[d] || bound[k]->dims[d] > r->hi[d])
                return af_fail(err, AF_ERR_INVALID_ARG, "%s: input '%s' dim %d is %lld, outside "
                               "the range %lld~%lld of --input_shape_range", s->model->path,
                               g->inputs[k]->name, d, (long long)bound[k]->dims[d],
                               (long long)r->lo[d], (long long)r->hi[d]);
    }
    return AF_OK;
}

/* The range of symbolic dim `sym`: from any input whose ranged dim carries it; false if none. */
static bool symbol_range(const af_session *s, int64_t sym, bool high, int64_t *out) {
    const af_graph *g = s->model->graph;
    for (int k = 0; k < g->ninputs; k++)
        for (int d = 0; d < s->ranges[k].rank; d++)
            if (g->inputs[k]->type.dims[d] == sym) {
                *out = high ? s->ranges[k].hi[d] : s->ranges[k].lo[d];
                return true;
            }
    return false;
}

static af_status arena_for(af_session *s, const af_plan *plan, void **arena, af_error *err);

/* Plan (and make the arena of) the smallest and the largest shape the ranges allow, when they
 * give every symbolic dim of the required inputs a range. */
static af_status preplan(af_session *s, af_error *err) {
    const af_graph *g = s->model->graph;
    if (!s->ranges || !s->dynamic || !s->c.plan) return AF_OK;
    af_tensor *t = af_calloc((size_t)g->ninputs + 1, sizeof *t);
    const af_tensor **bound = af_calloc((size_t)g->ninputs + 1, sizeof *bound);
    af_status st = t && bound ? AF_OK : af_fail(err, AF_ERR_NOMEM, "out of memory");
    for (int high = 0; !st && high < 2; high++) {
        bool all = true;
        for (int k = 0; all && k < g->ninputs; k++) {
            const af_value *v = g->inputs[k];
            if (v->is_const) continue;
            t[k] = (af_tensor){.dtype = v->type.dtype, .rank = v->type.rank};
            for (int d = 0; d < v->type.rank; d++) {
                int64_t dim = v->type.dims[d];
                if (s->ranges[k].rank) dim = high ? s->ranges[k].hi[d] : s->ranges[k].lo[d];
                else if (dim < 0 && !symbol_range(s, dim, high, &dim)) all = false;
                t[k].dims[d] = dim;
            }
            bound[k] = &t[k];
        }
        shape_plan *sp = NULL;
        if (all && !(st = shape_plan_for(s, bound, &sp, err))) st = arena_for(s, sp->plan, &sp->arena, err);
    }
    af_free(t);
    af_free(bound);
    return st;
}

/* *arena for plan, made now if it is not yet. */
static af_status arena_for(af_session *s, const af_plan *plan, void **arena, af_error *err) {
    if (*arena || !plan->arena_size) return AF_OK;
    *arena = af_alloc_big((size_t)plan->arena_size);
    return *arena ? AF_OK : af_fail(err, AF_ERR_NOMEM, "%s: out of memory allocating the %llu-byte arena",
                                    s->model->path, (unsigned long long)plan->arena_size);
}

/* Run with the plan, in the session's arena (made now if this is the first run); a dynamic
 * model with the plan and arena of its shape signature. */
static af_status run_planned(af_session *s, const af_tensor *const *bound, af_tensor *res,
                             af_error *err) {
    if (atomic_exchange(&s->running, 1)) /* another thread holds the arena: run on our own */
        return af_exec_graph(s->model->graph, bound, res, err);
    af_status st = AF_OK;
    const af_plan *plan = s->c.plan;
    void **arena = &s->arena;
    shape_plan *sp = NULL;
    if (s->dynamic && !(st = shape_plan_for(s, bound, &sp, err))) {
        plan = sp->plan;
        arena = &sp->arena;
    }
    if (!st) st = arena_for(s, plan, arena, err);
    af_profile *prof = af_runtime_profile_get(s->rt);
    double t0 = prof ? af_profile_now(prof) : 0;
    if (!st) st = af_exec_graph_planned(s->model->graph, plan, *arena, s->rt, bound, res, err);
    if (prof && !st) af_profile_add(prof, NULL, "model_run", -1, t0, af_profile_now(prof) - t0);
    atomic_store(&s->running, 0);
    return st;
}

af_status af_session_run(af_session *s, const char *const *names, const af_tensor *const *inputs,
                         size_t ninputs, af_tensor **outputs, af_error *err) {
    const af_graph *g = s->model->graph;
    const af_tensor **bound = af_calloc((size_t)g->ninputs + 1, sizeof(af_tensor *));
    af_tensor *res = af_calloc((size_t)g->noutputs + 1, sizeof(af_tensor));
    af_status st = AF_OK;
    int made = 0;
    if (!bound || !res) {
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < ninputs; i++) {
        int k = 0;
        while (k < g->ninputs && strcmp(g->inputs[k]->name, names[i])) k++;
        if (k == g->ninputs) {
            st = af_fail(err, AF_ERR_INVALID_ARG, "%s: the model has no input '%s'",
                         s->model->path, names[i]);
            goto done;
        }
        st = check_input(s->model, g->inputs[k], inputs[i], err);
        if (st) goto done;
        bound[k] = inputs[i];
    }
    if ((st = check_symbols(s->model, bound, err)) || (st = check_ranges(s, bound, err))) goto done;
    st = s->c.plan ? run_planned(s, bound, res, err) : af_exec_graph(g, bound, res, err);
    if (st) goto done;
    for (; made < g->noutputs; made++) {
        outputs[made] = af_malloc(sizeof(af_tensor));
        if (!outputs[made]) {
            st = af_fail(err, AF_ERR_NOMEM, "out of memory");
            break;
        }
        *outputs[made] = res[made];
        memset(&res[made], 0, sizeof(af_tensor));
    }
    if (st) {
        for (int i = 0; i < made; i++) {
            af_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
    }
done:
    for (int i = 0; res && i < g->noutputs; i++) af_tensor_release(&res[i]);
    af_free(bound);
    af_free(res);
    return st;
}

af_status af_session_profile_start(af_session *s, af_error *err) {
    return af_runtime_profile(s->rt, true, err);
}

af_status af_session_profile_end(af_session *s, const char *path, af_error *err) {
    af_profile *p = af_runtime_profile_get(s->rt);
    if (!p) return af_fail(err, AF_ERR_INVALID_ARG, "%s: profiling was not started", s->model->path);
    af_status st = path ? af_profile_write(p, path, s->model->path, af_isa_name(af_isa_get()), err)
                        : AF_OK;
    af_runtime_profile(s->rt, false, NULL);
    return st;
}

af_status af_session_reference_stats(af_session *s, af_reference_stats *out, af_error *err) {
    af_profile *p = af_runtime_profile_get(s->rt);
    memset(out, 0, sizeof *out);
    if (!p) return af_fail(err, AF_ERR_INVALID_ARG, "%s: profiling was not started", s->model->path);
    af_profile_reference(p, out);
    return AF_OK;
}

int af_session_threads(const af_session *s) { return af_runtime_threads(s->rt); }

const char *af_session_precision(const af_session *s) {
    return s->c.precision;
}

const char *af_session_isa(const af_session *s) {
    (void)s;
    return af_isa_name(af_isa_get());
}

af_status af_session_save(af_session *s, const char *path, const char *command_line,
                          af_error *err) {
    const char *json = af_session_report(s, 1);
    af_afm_kv kv[] = {{"precision_mode", s->c.precision}, {"fusion_report", json ? json : "{}"},
                      {"input_shape_range", s->range_spec}};
    af_afm_meta meta = {AF_VERSION, command_line, kv, (int)AF_COUNT(kv) - !s->range_spec};
    return af_afm_save_with_plan(path, s->model->graph, &meta, s->c.plan, err);
}

af_status af_session_export_onnx(const af_session *s, const char *path, af_error *err) {
    return af_onnx_export(s->model->graph, path, err);
}

const char *af_session_dim_name(const af_session *s, int output, int i, int d, char *buf,
                                size_t len) {
    const af_graph *g = s->model->graph;
    const af_value *v = output ? (i >= 0 && i < g->noutputs ? g->outputs[i] : NULL) : input_at(s, i);
    if (!v || d < 0 || d >= v->type.rank || !af_dim_is_sym(v->type.dims[d]) || !buf || !len)
        return NULL;
    return af_dim_str(g, v->type.dims[d], buf, len);
}

const char *af_session_metadata(const af_session *s, const char *key) {
    const af_model *m = s->model;
    if (!key) return NULL;
    if (!strcmp(key, "producer_name")) return m->producer_name;
    if (!strcmp(key, "producer_version")) return m->producer_version;
    if (!strcmp(key, "domain")) return m->domain;
    if (!strcmp(key, "description")) return m->doc_string;
    if (!strcmp(key, "graph_name")) return m->graph->name ? m->graph->name : "";
    if (!strcmp(key, "version")) return s->model_version;
    for (int i = 0; i < m->nmeta; i++)
        if (!strcmp(m->meta[2 * i], key)) return m->meta[2 * i + 1];
    return NULL;
}

int af_session_custom_metadata(const af_session *s, int i, const char **key, const char **value) {
    const af_model *m = s->model;
    if (i >= 0 && i < m->nmeta) {
        if (key) *key = m->meta[2 * i];
        if (value) *value = m->meta[2 * i + 1];
    }
    return m->nmeta;
}
