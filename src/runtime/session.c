/* The public session API (include/autofusion.h): load, describe, run.
 * A session owns its model; inputs are checked against the declared types before anything
 * runs, so a wrong dtype or shape is a clear error rather than a kernel failure.
 * Once the graph is final (optimised, or loaded compiled) the session holds its memory plan
 * (runtime/plan.h) and one arena, made at the first run and reused by every later one: a
 * session therefore runs one inference at a time, and a second concurrent af_session_run is
 * refused rather than allowed to share the arena. */
#include "format/afm.h"
#include "fusion/fusion.h"
#include "passes/passes.h"
#include "runtime/exec.h"
#include "kernels/simd/cpu.h"
#include "runtime/plan.h"
#include "runtime/profile.h"
#include "runtime/session.h"
#include "ir/plugin.h"

#include <stdatomic.h>
#include <string.h>

struct af_session {
    af_model *model;
    af_options opt;
    bool fused;                 /* the optimisation pipeline ran (report is valid) */
    af_fusion_report report;
    char *report_text, *report_json; /* rendered on demand */
    af_plan *plan;              /* NULL: every intermediate is allocated when produced */
    af_runtime *rt;             /* threads and kernel scratch */
    void *arena;                /* plan->arena_size bytes, made by the first run */
    atomic_int running;         /* a run is using the arena */
    const char *precision;      /* static: the mode's canonical name */
};

void af_options_init(af_options *opt) {
    memset(opt, 0, sizeof *opt);
}

static af_value *find_input(const af_graph *g, const char *name) {
    for (int i = 0; i < g->ninputs; i++)
        if (!strcmp(g->inputs[i]->name, name)) return g->inputs[i];
    return NULL;
}

/* Apply "name:1,3,224,224;name2:4,5" to the graph inputs' declared dims. */
static af_status apply_input_shape(af_graph *g, const char *spec, af_error *err) {
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (p[i] == ':') colon = p + i;
        if (!colon)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "--input_shape: '%.*s' is not name:d1,d2,...", (int)len, p);
        char name[256];
        size_t nlen = (size_t)(colon - p);
        if (nlen >= sizeof name) return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: name too long");
        memcpy(name, p, nlen);
        name[nlen] = 0;
        af_value *v = find_input(g, name);
        if (!v) return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: the model has no input '%s'", name);
        int64_t dims[AF_MAX_RANK];
        int rank = 0;
        const char *q = colon + 1, *stop = p + len;
        while (q < stop) {
            char *e;
            long long d = strtoll(q, &e, 10);
            if (e == q || e > stop || d < 0 || rank == AF_MAX_RANK)
                return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: bad dims for '%s'", name);
            dims[rank++] = d;
            q = e;
            if (q < stop && *q == ',') q++;
        }
        if (v->type.rank >= 0 && v->type.rank != rank)
            return af_fail(err, AF_ERR_INVALID_ARG, "--input_shape: '%s' has rank %d, not %d",
                           name, v->type.rank, rank);
        for (int i = 0; i < rank; i++)
            if (v->type.rank >= 0 && v->type.dims[i] >= 0 && v->type.dims[i] != dims[i])
                return af_fail(err, AF_ERR_INVALID_ARG,
                               "--input_shape: dim %d of '%s' is fixed to %lld by the model", i,
                               name, (long long)v->type.dims[i]);
        v->type.rank = rank;
        memcpy(v->type.dims, dims, sizeof(int64_t) * (size_t)rank);
        p = end ? end + 1 : p + len;
    }
    return af_graph_infer_shapes(g, err);
}

/* The switches in force: --fusion_switch_file, then the environment, then --disable_fusion. */
static af_status fusion_config(const af_options *o, af_fusion_config *cfg, af_error *err) {
    af_fusion_config_init(cfg);
    af_status st = AF_OK;
    if (o->fusion_switch_file) st = af_fusion_switch_file(cfg, o->fusion_switch_file, err);
    if (!st) st = af_fusion_config_env(cfg, err);
    if (!st && o->disable_fusion)
        st = af_fusion_disable_list(cfg, o->disable_fusion, "--disable_fusion", err);
    return st;
}

static af_status optimize(af_session *s, af_error *err) {
    af_fusion_config cfg;
    af_status st = fusion_config(&s->opt, &cfg, err);
    if (st) return st;
    af_fusion_report_init(&s->report, s->model->path);
    s->fused = true;
    return af_optimize(s->model->graph, &cfg, &s->report, err);
}

/* --precision_mode as a configuration for the lowering. */
static af_status precision_config(const af_options *o, const char *file, af_precision_cfg *pc,
                                  af_error *err) {
    pc->mode = AF_PREC_FP32;
    pc->keep_fp32 = o->keep_fp32;
    if (!o->precision_mode) return AF_OK;
    int m = af_precision_parse(o->precision_mode);
    if (m < 0)
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: unknown precision mode '%s': fp32, bf16, fp16 or mixed (ATC's "
                       "force_fp32, must_keep_origin_dtype, force_fp16, allow_fp32_to_fp16, "
                       "allow_mix_precision, allow_mix_precision_bf16 also work)",
                       file, o->precision_mode);
    pc->mode = (af_precision)m;
    return AF_OK;
}

/* Lower for the fast kernels in the session's precision, and record it in the report. */
static af_status lower(af_session *s, af_error *err) {
    af_precision_cfg pc;
    af_status st = precision_config(&s->opt, s->model->path, &pc, err);
    if (!st) st = af_lower_precision(s->model->graph, &pc, err);
    s->precision = af_precision_name(pc.mode);
    const char *note = NULL;
    if (!st && s->fused && pc.mode != AF_PREC_FP32) {
        af_precision_supported(pc.mode, &note);
        st = af_fusion_report_precision(&s->report, s->model->graph, s->precision, note, err);
    }
    return st;
}

/* The plan of the final graph: the compiled file's when it has one and no --input_shape
 * changed the types it was made for, else one made now. */
static af_status make_plan(af_session *s, af_plan **file_plan, af_error *err) {
    if (*file_plan && !s->opt.input_shape) {
        s->plan = *file_plan;
        *file_plan = NULL;
        return AF_OK;
    }
    return af_plan_build(s->model->graph, &s->plan, err);
}

static af_status finish(af_model *m, af_plan *file_plan, const af_options *opt, bool compiled,
                        const char *file_precision, af_session **out, af_error *err) {
    af_session *s = calloc(1, sizeof *s);
    af_status st = AF_OK;
    if (!s) {
        st = af_fail(err, AF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->model = m;
    if (opt) s->opt = *opt;
    else af_options_init(&s->opt);
    if (s->opt.input_shape) {
        st = apply_input_shape(m->graph, s->opt.input_shape, err);
        if (st) goto fail;
    }
#ifndef NDEBUG
    /* Debug builds check the IR's invariants after every stage that builds or changes it. */
    st = af_graph_verify(m->graph, err);
    if (st) goto fail;
#endif
    /* A compiled model is already optimised; --no_fusion runs the graph as imported. */
    if (!compiled && !s->opt.no_fusion) {
        st = optimize(s, err);
        if (st) goto fail;
    }
    /* Fused or not, the graph then runs on the fast kernels (a compiled model already does). */
    s->precision = "fp32";
    for (int p = 0; compiled && file_precision && p <= AF_PREC_MIXED; p++)
        if (!strcmp(file_precision, af_precision_name((af_precision)p)))
            s->precision = af_precision_name((af_precision)p);
    if (!compiled && !s->opt.no_lower) {
        st = lower(s, err);
        if (st) goto fail;
    }
    if (s->fused && af_fusion_log_requested()) af_fusion_report_print(&s->report, stderr);
    st = make_plan(s, &file_plan, err);
    if (!st) st = af_runtime_new(s->opt.threads, &s->rt, err);
    if (st) goto fail;
    /* Borrowed strings are not kept past this call. */
    s->opt.input_shape = s->opt.disable_fusion = s->opt.fusion_switch_file = NULL;
    s->opt.precision_mode = s->opt.keep_fp32 = NULL;
    *out = s;
    return AF_OK;
fail:
    if (s && s->fused) af_fusion_report_free(&s->report);
    if (s) af_plan_free(s->plan);
    if (s) af_runtime_free(s->rt);
    free(s);
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
    const char *prec = NULL;
    for (int i = 0; i < meta.nkv; i++)
        if (!strcmp(meta.kv[i].key, "precision_mode")) prec = meta.kv[i].value;
    return st ? st : finish(m, plan, opt, compiled, prec, out, err);
}

af_status af_session_new_from_bytes(const void *bytes, size_t len, const char *name,
                                    const af_options *opt, af_session **out, af_error *err) {
    af_model *m = NULL;
    *out = NULL;
    af_status st = af_plugin_load_env(err);
    if (!st) st = af_model_load_bytes(bytes, len, name, &m, err);
    return st ? st : finish(m, NULL, opt, false, NULL, out, err);
}

const char *af_session_report(af_session *s, int json) {
    if (!s->fused) return NULL;
    if (json) {
        if (!s->report_json) s->report_json = af_fusion_report_json(&s->report);
        return s->report_json;
    }
    if (!s->report_text) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) return NULL;
        af_fusion_report_print(&s->report, f);
        fclose(f);
        s->report_text = buf;
    }
    return s->report_text;
}

af_model *af_session_model(const af_session *s) { return s->model; }

const af_plan *af_session_plan(const af_session *s) { return s->plan; }

const af_fusion_report *af_session_fusion_report(const af_session *s) {
    return s->fused ? &s->report : NULL;
}

void af_session_free(af_session *s) {
    if (!s) return;
    if (s->fused) af_fusion_report_free(&s->report);
    free(s->report_text);
    free(s->report_json);
    af_plan_free(s->plan);
    af_runtime_free(s->rt);
    free(s->arena);
    af_model_free(s->model);
    free(s);
}

int af_session_input_count(const af_session *s) { return s->model->graph->ninputs; }
int af_session_output_count(const af_session *s) { return s->model->graph->noutputs; }

const char *af_session_input_name(const af_session *s, int i) {
    return i >= 0 && i < s->model->graph->ninputs ? s->model->graph->inputs[i]->name : NULL;
}

const char *af_session_output_name(const af_session *s, int i) {
    return i >= 0 && i < s->model->graph->noutputs ? s->model->graph->outputs[i]->name : NULL;
}

static af_status type_of(const af_value *v, af_tensor *t, af_error *err) {
    if (!v) return af_fail(err, AF_ERR_INVALID_ARG, "index out of range");
    memset(t, 0, sizeof *t);
    t->dtype = v->type.dtype;
    t->rank = v->type.rank;
    memcpy(t->dims, v->type.dims, sizeof t->dims);
    return AF_OK;
}

af_status af_session_input_type(const af_session *s, int i, af_tensor *t) {
    const af_graph *g = s->model->graph;
    return type_of(i >= 0 && i < g->ninputs ? g->inputs[i] : NULL, t, NULL);
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

/* Run with the plan, in the session's arena (made now if this is the first run). */
static af_status run_planned(af_session *s, const af_tensor *const *bound, af_tensor *res,
                             af_error *err) {
    if (atomic_exchange(&s->running, 1))
        return af_fail(err, AF_ERR_INVALID_ARG,
                       "%s: the session is already running (a session runs one inference at a "
                       "time; use one session per thread)", s->model->path);
    af_status st = AF_OK;
    if (!s->arena && s->plan->arena_size) {
        s->arena = af_alloc_big((size_t)s->plan->arena_size);
        if (!s->arena)
            st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory allocating the %llu-byte arena",
                         s->model->path, (unsigned long long)s->plan->arena_size);
    }
    af_profile *prof = af_runtime_profile_get(s->rt);
    double t0 = prof ? af_profile_now(prof) : 0;
    if (!st) st = af_exec_graph_planned(s->model->graph, s->plan, s->arena, s->rt, bound, res, err);
    if (prof && !st) af_profile_add(prof, NULL, "model_run", t0, af_profile_now(prof) - t0);
    atomic_store(&s->running, 0);
    return st;
}

af_status af_session_run(af_session *s, const char *const *names, const af_tensor *const *inputs,
                         size_t ninputs, af_tensor **outputs, af_error *err) {
    const af_graph *g = s->model->graph;
    const af_tensor **bound = calloc((size_t)g->ninputs + 1, sizeof(af_tensor *));
    af_tensor *res = calloc((size_t)g->noutputs + 1, sizeof(af_tensor));
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
    st = s->plan ? run_planned(s, bound, res, err) : af_exec_graph(g, bound, res, err);
    if (st) goto done;
    for (; made < g->noutputs; made++) {
        outputs[made] = malloc(sizeof(af_tensor));
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
    free(bound);
    free(res);
    return st;
}

af_status af_session_profile_start(af_session *s, af_error *err) {
    return af_runtime_profile(s->rt, true, err);
}

af_status af_session_profile_end(af_session *s, const char *path, af_error *err) {
    af_profile *p = af_runtime_profile_get(s->rt);
    if (!p) return af_fail(err, AF_ERR_INVALID_ARG, "%s: profiling was not started", s->model->path);
    af_status st = af_profile_write(p, path, s->model->path, af_isa_name(af_isa_get()), err);
    af_runtime_profile(s->rt, false, NULL);
    return st;
}

int af_session_threads(const af_session *s) { return af_runtime_threads(s->rt); }

const char *af_session_precision(const af_session *s) {
    return s->precision;
}

const char *af_session_isa(const af_session *s) {
    (void)s;
    return af_isa_name(af_isa_get());
}
