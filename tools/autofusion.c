/* The autofusion command line (docs/cli.md is the contract).
 * One option table serves every command; options are accepted as --a_b or --a-b, and --k=v or
 * --k v. Every failure prints one line naming the file and the reason and exits non-zero. */
#include "autofusion.h"
#include "autofusion_plugin.h"
#include "driver/session.h"
#include "lower/lower.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef enum { FLAG, STR, INT, INPUT, PLUGIN } opt_kind;
enum { RUN = 1, BENCH = 2, COMPILE = 4, REPORT = 8, INSPECT = 16, VERIFY = 32 };
#define LOADS (RUN | BENCH | COMPILE | REPORT | VERIFY) /* commands that prepare a model */

/* One row per option: name (with '_'), kind, where it goes, which commands take it. */
static const struct opt {
    const char *name;
    opt_kind kind;
    size_t offset;
    int commands;
    const char *help;
} opts[] = {
    {"model", STR, offsetof(cli, model), COMPILE, "M.onnx  the model to compile"},
    {"output", STR, offsetof(cli, output), COMPILE, "OUT  write OUT.afm"},
    {"framework", INT, offsetof(cli, framework), COMPILE, "5  ONNX (ATC's number; the only one)"},
    {"input", INPUT, 0, RUN | BENCH | VERIFY, "NAME=FILE  .npy or TensorProto .pb (repeatable)"},
    {"output_dir", STR, offsetof(cli, output_dir), RUN, "DIR  write each output as DIR/<name>.npy"},
    {"plugin", PLUGIN, 0, LOADS | INSPECT, "LIB.so  load custom ops and fusion rules (repeatable)"},
    {"input_shape", STR, offsetof(cli, input_shape), LOADS, "\"name:1,3,224,224;...\"  fix symbolic dims"},
    {"input_shape_range", STR, offsetof(cli, input_shape_range), LOADS, "\"name:1,1~32,512;...\"  allowed dims (checked, pre-planned)"},
    {"precision_mode", STR, offsetof(cli, precision_mode), LOADS, "fp32|bf16|fp16|mixed|int8  (ATC's force_fp32, force_fp16, allow_mix_precision...)"},
    {"calibration_data", STR, offsetof(cli, calibration_data), LOADS, "DIR  int8: calibration samples (<input>.npy or input_N.pb, or subfolders of them)"},
    {"calibration_method", STR, offsetof(cli, calibration_method), LOADS, "minmax|percentile[:P]|entropy  int8 ranges (default percentile:99.99)"},
    {"keep_fp32", STR, offsetof(cli, keep_fp32), LOADS, "A,B  fusion rules, node names or op types kept in fp32"},
    {"disable_fusion", STR, offsetof(cli, disable_fusion), LOADS, "A,B  switch fusion rules off"},
    {"fusion_switch_file", STR, offsetof(cli, fusion_switch_file), LOADS, "F  ATC switch file (Name:off lines or JSON)"},
    {"no_fusion", FLAG, offsetof(cli, no_fusion), RUN | BENCH, "run the unfused graph (same simplification and kernels)"},
    {"report", STR, offsetof(cli, report), COMPILE, "F.json  write the fusion report as JSON"},
    {"log", STR, offsetof(cli, log), COMPILE, "error|warning|info|debug  info prints the report"},
    {"export_onnx", STR, offsetof(cli, export_onnx), COMPILE, "F.onnx  write the fused graph as ONNX (Netron)"},
    {"seed", INT, offsetof(cli, seed), RUN | BENCH | VERIFY, "N  seed of random inputs (default 0)"},
    {"rtol", STR, offsetof(cli, rtol), VERIFY, "R  relative tolerance per element (default by precision)"},
    {"atol", STR, offsetof(cli, atol), VERIFY, "A  absolute tolerance per element (default by precision)"},
    {"min_cosine", STR, offsetof(cli, min_cosine), VERIFY, "C  pass when each output's cosine with fp32 is >= C (int8's verdict: 0.99)"},
    {"iterations", INT, offsetof(cli, iterations), BENCH, "N  timed runs (default 50)"},
    {"warmup", INT, offsetof(cli, warmup), BENCH, "N  untimed runs first (default 5)"},
    {"threads", INT, offsetof(cli, threads), RUN | BENCH | COMPILE | VERIFY, "N  threads (default all cores)"},
    {"compare", FLAG, offsetof(cli, compare), BENCH, "also time the unfused graph in the same process"},
    {"json", FLAG, offsetof(cli, json), BENCH | REPORT, "print JSON"},
    {"profile", STR, offsetof(cli, profile), BENCH, "F.json  per-node Chrome trace of the timed runs"},
};

static const struct command {
    const char *name;
    int bit;
    const char *args, *help;
} commands[] = {
    {"compile", COMPILE, "--model=M.onnx --output=OUT", "optimise and write OUT.afm, print the fusion report with --log=info"},
    {"run", RUN, "MODEL", "run once (.onnx or .afm), print/write the outputs"},
    {"bench", BENCH, "MODEL", "latency statistics (trtexec style), --compare: fused vs unfused"},
    {"report", REPORT, "MODEL.onnx", "the fusion report without writing a model"},
    {"inspect", INSPECT, "MODEL.afm", "header, command line, ops, fused ops, slow nodes, sizes"},
    {"verify", VERIFY, "MODEL.onnx", "fused / low precision vs unfused fp32; names the culprits when over tolerance"},
};

static int usage(FILE *f) {
    fprintf(f, "autofusion %s: operator-fusion compiler and runtime for ONNX models on CPUs\n\nusage:\n",
            AF_VERSION);
    for (size_t i = 0; i < AF_COUNT(commands); i++)
        fprintf(f, "  autofusion %-8s %-28s %s\n", commands[i].name, commands[i].args, commands[i].help);
    fprintf(f, "  autofusion --list-fusions                     every fusion rule\n"
               "  autofusion --version | --help\n\noptions:\n");
    for (size_t i = 0; i < AF_COUNT(opts); i++) {
        fprintf(f, "  --%-19s %s [", opts[i].name, opts[i].help);
        for (size_t k = 0, first = 1; k < AF_COUNT(commands); k++)
            if (opts[i].commands & commands[k].bit) {
                fprintf(f, "%s%s", first ? "" : " ", commands[k].name);
                first = 0;
            }
        fprintf(f, "]\n");
    }
    fprintf(f, "\nInputs not given get random data of the declared shape (symbolic dims 1); inputs with\n"
               "a default value (an initializer of the same name) keep it.\n"
               "Environment: AUTOFUSION_DISABLE_LIST=A,B (alias GE_FUSION_DISABLE_LIST) switches\n"
               "fusions off; AUTOFUSION_FUSION_LOG=1 (alias GE_GRAPH_FUSION_LOG=1) prints the report;\n"
               "AUTOFUSION_PLUGINS=a.so:b.so loads plugins (include/autofusion_plugin.h).\n");
    return f == stderr ? 2 : 0;
}

/* "--input-shape" and "--input_shape" are the same option; returns the inline value or "". */
static const struct opt *find_opt(const char *arg, const char **inline_val) {
    if (arg[0] != '-' || arg[1] != '-') return NULL;
    for (size_t k = 0; k < AF_COUNT(opts); k++) {
        const char *a = arg + 2, *name = opts[k].name;
        size_t i = 0;
        while (name[i] && (a[i] == name[i] || (a[i] == '-' && name[i] == '_'))) i++;
        if (name[i]) continue;
        if (a[i] == '=') *inline_val = a + i + 1;
        else if (a[i] == 0) *inline_val = NULL;
        else continue;
        return &opts[k];
    }
    return NULL;
}

/* Load one plugin; 0, or 1 after printing why not. */
static int load_plugin(const char *path) {
    af_error err;
    if (af_plugin_load(path, &err) == AF_OK) return 0;
    fprintf(stderr, "autofusion: %s\n", err.message);
    return 1;
}

static int parse(int argc, char **argv, int command, cli *c) {
    c->iterations = 50;
    c->warmup = 5;
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        const struct opt *o = find_opt(argv[i], &v);
        if (!o || !(o->commands & command)) {
            if (argv[i][0] == '-') {
                fprintf(stderr, "autofusion %s: unknown option '%s' (try --help)\n", argv[1], argv[i]);
                return 2;
            }
            if (c->model) {
                fprintf(stderr, "autofusion %s: unexpected argument '%s'\n", argv[1], argv[i]);
                return 2;
            }
            c->model = argv[i];
            continue;
        }
        if (o->kind == FLAG) {
            *(bool *)((char *)c + o->offset) = true;
            continue;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "autofusion: option --%s needs a value\n", o->name);
                return 2;
            }
            v = argv[++i];
        }
        if (o->kind == STR) {
            *(const char **)((char *)c + o->offset) = v;
        } else if (o->kind == INT) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || *end || end == v || n < 0) {
                fprintf(stderr, "autofusion: --%s wants a non-negative integer, got '%s'\n", o->name, v);
                return 2;
            }
            *(long *)((char *)c + o->offset) = n;
        } else if (o->kind == PLUGIN) {
            if (load_plugin(v)) return 2;
        } else {
            const char *eq = strrchr(v, '=');
            if (!eq || eq == v || !eq[1] || c->ninputs == MAX_INPUTS) {
                fprintf(stderr, "autofusion: --input wants NAME=FILE, got '%s'\n", v);
                return 2;
            }
            c->input_name[c->ninputs] = strndup(v, (size_t)(eq - v));
            c->input_file[c->ninputs++] = eq + 1;
        }
    }
    if (!c->model) {
        fprintf(stderr, "autofusion %s: no model given\n", argv[1]);
        return 2;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* xorshift64*: reproducible random inputs without global state. */
static double next_unit(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

static af_tensor *random_input(const af_tensor *type, uint64_t *state) {
    af_tensor shape = *type;
    if (shape.rank < 0) shape.rank = 0;
    for (int i = 0; i < shape.rank; i++)
        if (shape.dims[i] < 0) shape.dims[i] = 1;
    af_tensor *t = af_tensor_new(type->dtype, shape.rank, shape.dims);
    if (!t) return NULL;
    int64_t n = af_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double u = next_unit(state);
        switch (t->dtype) {
        case AF_DTYPE_FLOAT: ((float *)t->data)[i] = (float)(2 * u - 1); break;
        case AF_DTYPE_DOUBLE: ((double *)t->data)[i] = 2 * u - 1; break;
        case AF_DTYPE_INT64: ((int64_t *)t->data)[i] = (int64_t)(u * 10); break;
        case AF_DTYPE_INT32: ((int32_t *)t->data)[i] = (int32_t)(u * 10); break;
        case AF_DTYPE_BOOL: ((uint8_t *)t->data)[i] = u < 0.5; break;
        case AF_DTYPE_UINT8: case AF_DTYPE_INT8: ((uint8_t *)t->data)[i] = (uint8_t)(u * 10); break;
        case AF_DTYPE_FLOAT16: ((uint16_t *)t->data)[i] = af_float_to_half((float)(2 * u - 1)); break;
        default: break; /* other types stay zero */
        }
    }
    return t;
}

void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) af_tensor_free(in->t[i]);
    in->n = 0;
}

int inputs_make(const cli *c, const af_session *s, inputs *in) {
    af_error err;
    uint64_t state = 0x9E3779B97F4A7C15ULL ^ (uint64_t)c->seed;
    for (int i = 0; i < c->ninputs; i++) {
        af_tensor *t = calloc(1, sizeof *t);
        af_status st = !t ? af_fail(&err, AF_ERR_NOMEM, "out of memory")
                       : ends_with(c->input_file[i], ".npy")
                           ? af_tensor_load_npy(c->input_file[i], t, &err)
                           : af_tensor_load_pb(c->input_file[i], t, NULL, &err);
        if (st) {
            free(t);
            fprintf(stderr, "autofusion: %s\n", err.message);
            return 1;
        }
        in->t[in->n] = t;
        in->names[in->n++] = c->input_name[i];
    }
    /* the required inputs only: those with a default keep the model's value */
    int required = af_session_input_count(s);
    for (int k = 0; k < required; k++) {
        const char *name = af_session_input_name(s, k);
        bool given = false;
        for (int i = 0; i < c->ninputs; i++) given |= !strcmp(c->input_name[i], name);
        if (given) continue;
        af_tensor type;
        af_session_input_type(s, k, &type);
        if (in->n == MAX_INPUTS || !(in->t[in->n] = random_input(&type, &state))) {
            fprintf(stderr, "autofusion: %s: cannot make random data for input '%s' (%s)\n",
                    c->model, name, af_dtype_name(type.dtype));
            return 1;
        }
        in->names[in->n++] = name;
    }
    return 0;
}

void cli_options(const cli *c, af_options *opt) {
    af_options_init(opt);
    opt->input_shape = c->input_shape;
    opt->input_shape_range = c->input_shape_range;
    opt->threads = (int)c->threads;
    opt->disable_fusion = c->disable_fusion;
    opt->fusion_switch_file = c->fusion_switch_file;
    opt->precision_mode = c->precision_mode;
    opt->keep_fp32 = c->keep_fp32;
    opt->calibration_data = c->calibration_data;
    opt->calibration_method = c->calibration_method;
}

af_session *cli_session(const cli *c, const af_options *opt) {
    af_session *s = NULL;
    af_error err;
    if (af_session_new(c->model, opt, &s, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        return NULL;
    }
    return s;
}

static af_session *open_session(const cli *c, bool no_fusion) {
    af_options opt;
    cli_options(c, &opt);
    opt.no_fusion = no_fusion;
    return cli_session(c, &opt);
}

static double tensor_sum(const af_tensor *t) {
    double s = 0;
    int64_t n = af_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) s += af_tensor_get_double(t, i);
    return s;
}

/* DIR/<name>.npy (af_npy_file_name). */
static void output_path(char *buf, size_t len, const char *dir, const char *name) {
    size_t o = (size_t)snprintf(buf, len, "%s/", dir);
    if (o < len) af_npy_file_name(buf + o, len - o, name);
}

int run_once(af_session *s, const inputs *in, af_tensor **out) {
    af_error err;
    if (af_session_run(s, in->names, (const af_tensor *const *)in->t, (size_t)in->n, out, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        return 1;
    }
    return 0;
}

void outputs_free(af_tensor **out, int n) {
    for (int i = 0; i < n; i++) {
        af_tensor_free(out[i]);
        out[i] = NULL;
    }
}

static int cmd_run(const cli *c) {
    inputs in = {0};
    af_tensor **out = NULL;
    int rc = 1, nout = 0;
    af_error err;
    af_session *s = open_session(c, c->no_fusion);
    if (!s || inputs_make(c, s, &in)) goto done;
    nout = af_session_output_count(s);
    out = calloc((size_t)nout + 1, sizeof(af_tensor *));
    if (!out || run_once(s, &in, out)) goto done;
    if (c->output_dir && mkdir(c->output_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "autofusion: %s: cannot create directory: %s\n", c->output_dir, strerror(errno));
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        char dims[256], path[4096];
        printf("output %s shape %s dtype %s sum %.6g\n", af_session_output_name(s, i),
               af_dims_str(out[i], dims, sizeof dims), af_dtype_name(out[i]->dtype), tensor_sum(out[i]));
        if (!c->output_dir) continue;
        output_path(path, sizeof path, c->output_dir, af_session_output_name(s, i));
        if (af_tensor_save_npy(path, out[i], &err)) {
            fprintf(stderr, "autofusion: %s\n", err.message);
            goto done;
        }
    }
    rc = 0;
done:
    if (out) outputs_free(out, nout);
    free(out);
    inputs_free(&in);
    af_session_free(s);
    return rc;
}

/* ---- bench --------------------------------------------------------------------------------- */

typedef struct stats {
    double min, median, mean, p90, p99, max, throughput;
    double *samples; /* every timed run, sorted (owned: free it) */
    long n;
} stats;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double percentile(const double *v, long n, double p) {
    long k = (long)ceil(p / 100.0 * (double)n) - 1;
    return v[k < 0 ? 0 : (k >= n ? n - 1 : k)];
}

/* Time c->iterations runs of each of the ns sessions after c->warmup runs each, interleaved
 * (run i of every session before run i + 1 of any), so that a machine whose speed drifts
 * affects them alike; profile[k] (NULL: none) gets the trace of session k's timed runs. ref[k]
 * gets the nodes of session k that ran on reference kernels, from its profiled timed runs, or,
 * without a trace, from one profiled run after them (the timed runs stay unprofiled). */
static int time_sessions(const cli *c, af_session **s, int ns, const inputs *in,
                         const char *const *profile, stats *st, af_reference_stats *ref) {
    int rc = 1, nout[2] = {0, 0};
    af_tensor **out[2] = {NULL, NULL};
    double *ms[2] = {NULL, NULL}, sum[2] = {0, 0};
    af_error err;
    for (int k = 0; k < ns; k++) {
        nout[k] = af_session_output_count(s[k]);
        out[k] = calloc((size_t)nout[k] + 1, sizeof(af_tensor *));
        ms[k] = calloc((size_t)c->iterations + 1, sizeof(double));
        if (!out[k] || !ms[k]) goto done;
    }
    for (long i = 0; i < c->warmup; i++)
        for (int k = 0; k < ns; k++) {
            if (run_once(s[k], in, out[k])) goto done;
            outputs_free(out[k], nout[k]);
        }
    for (int k = 0; k < ns; k++)
        if (profile[k] && af_session_profile_start(s[k], &err)) {
            fprintf(stderr, "autofusion: %s\n", err.message);
            goto done;
        }
    for (long i = 0; i < c->iterations; i++)
        for (int k = 0; k < ns; k++) {
            double t0 = now_ms();
            if (run_once(s[k], in, out[k])) goto done;
            ms[k][i] = now_ms() - t0;
            sum[k] += ms[k][i];
            outputs_free(out[k], nout[k]);
        }
    for (int k = 0; k < ns; k++) {
        if (!profile[k]) {
            if (af_session_profile_start(s[k], &err)) {
                fprintf(stderr, "autofusion: %s\n", err.message);
                goto done;
            }
            if (run_once(s[k], in, out[k])) goto done;
            outputs_free(out[k], nout[k]);
        }
        if (af_session_reference_stats(s[k], &ref[k], &err) ||
            af_session_profile_end(s[k], profile[k], &err)) {
            fprintf(stderr, "autofusion: %s\n", err.message);
            goto done;
        }
    }
    long n = c->iterations;
    for (int k = 0; k < ns; k++) {
        double *v = ms[k];
        qsort(v, (size_t)n, sizeof(double), cmp_double);
        st[k] = (stats){v[0], n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, sum[k] / (double)n,
                        percentile(v, n, 90), percentile(v, n, 99), v[n - 1],
                        1000.0 * (double)n / sum[k], v, n};
        ms[k] = NULL; /* handed to st[k] */
    }
    rc = 0;
done:
    for (int k = 0; k < ns; k++) {
        if (out[k]) outputs_free(out[k], nout[k]);
        free(out[k]);
        free(ms[k]);
    }
    return rc;
}

static void print_stats(const char *label, const stats *s) {
    printf("%-8s latency ms: min %.3f  median %.3f  mean %.3f  p90 %.3f  p99 %.3f  max %.3f"
           "  throughput %.2f/s\n",
           label, s->min, s->median, s->mean, s->p90, s->p99, s->max, s->throughput);
}

/* The share of the run time that nodes on reference kernels took, in percent. */
static double reference_share(const af_reference_stats *r) {
    return r->run_ms > 0 ? 100.0 * r->reference_ms / r->run_ms : 0.0;
}

/* s as a JSON string (a model's op types may hold anything). */
static void json_string_out(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void json_stats(const char *key, const stats *s, const af_reference_stats *r) {
    printf("\"%s\": {\"min_ms\": %.6f, \"median_ms\": %.6f, \"mean_ms\": %.6f, \"p90_ms\": %.6f, "
           "\"p99_ms\": %.6f, \"max_ms\": %.6f, \"throughput\": %.6f, \"samples_ms\": [",
           key, s->min, s->median, s->mean, s->p90, s->p99, s->max, s->throughput);
    for (long i = 0; i < s->n; i++) printf("%s%.4f", i ? ", " : "", s->samples[i]);
    printf("], \"reference_nodes\": %d, \"reference_share\": %.4f, \"reference_ops\": ",
           r->nodes, reference_share(r) / 100.0);
    json_string_out(r->ops);
    printf("}");
}

/* One line on stderr when nodes of a session ran on reference kernels (a slow path): how many,
 * their ops and their share of the run time. */
static void warn_reference(const char *what, const af_reference_stats *r) {
    if (r->nodes <= 0) return;
    fprintf(stderr, "warning: %s%d node%s ran on reference kernels (", what, r->nodes,
            r->nodes == 1 ? "" : "s");
    for (const char *p = r->ops; *p; p++) /* control characters of hostile names as '?' */
        fputc((unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p, stderr);
    fprintf(stderr, "): %.0f%% of the run time\n", reference_share(r));
}

/* Where --compare writes the unfused session's trace: F.json -> F.unfused.json (malloc'd). */
static char *unfused_trace_path(const char *profile) {
    size_t n = strlen(profile), stem = ends_with(profile, ".json") ? n - 5 : n;
    char *p = malloc(n + sizeof ".unfused.json");
    if (p) snprintf(p, n + sizeof ".unfused.json", "%.*s.unfused.json", (int)stem, profile);
    return p;
}

static int cmd_bench(const cli *c) {
    if (c->iterations < 1) {
        fprintf(stderr, "autofusion bench: --iterations must be at least 1\n");
        return 2;
    }
    if (c->compare && ends_with(c->model, ".afm")) {
        fprintf(stderr, "autofusion bench: %s is already fused; --compare needs the .onnx model\n",
                c->model);
        return 2;
    }
    inputs in = {0};
    stats st[2];
    af_reference_stats ref[2];
    memset(st, 0, sizeof st);
    memset(ref, 0, sizeof ref);
    int rc = 1;
    char *utrace = NULL; /* the unfused trace's path */
    double t0 = now_ms();
    af_session *s = open_session(c, c->no_fusion), *u = NULL;
    double load_ms = now_ms() - t0;
    if (!s || inputs_make(c, s, &in)) goto done;
    /* Same kernels, same executor, same inputs: only the fusion passes differ. */
    if (c->compare && !(u = open_session(c, true))) goto done;
    af_session *both[2] = {s, u};
    /* With --compare the unfused runs are traced too, node by node beside the fused ones. */
    if (c->compare && c->profile && !(utrace = unfused_trace_path(c->profile))) goto done;
    const char *traces[2] = {c->profile, utrace};
    if (time_sessions(c, both, c->compare ? 2 : 1, &in, traces, st, ref)) goto done;
    const stats fused = st[0], unfused = st[1];
    if (c->json) {
        printf("{\"model\": \"%s\", \"threads\": %d, \"isa\": \"%s\", \"load_ms\": %.3f, ",
               c->model, af_session_threads(s), af_session_isa(s), load_ms);
        json_stats("fused", &fused, &ref[0]);
        if (c->compare) {
            printf(", ");
            json_stats("unfused", &unfused, &ref[1]);
            printf(", \"speedup\": %.4f", unfused.median / fused.median);
            const af_fusion_report *r = af_session_fusion_report(s);
            if (r && r->t_after > 0) printf(", \"estimated_speedup\": %.4f", r->t_before / r->t_after);
        }
        printf("}\n");
    } else {
        printf("%s: %ld iterations after %ld warm-up runs, %d threads, %s kernels (prepared in %.1f ms)\n",
               c->model, c->iterations, c->warmup, af_session_threads(s), af_session_isa(s), load_ms);
        print_stats("fused", &fused);
        if (c->compare) {
            print_stats("unfused", &unfused);
            printf("speedup (median unfused / fused): %.3fx\n", unfused.median / fused.median);
            const af_fusion_report *r = af_session_fusion_report(s);
            if (r && r->t_after > 0)
                printf("estimated speedup (cost model): %.3fx\n", r->t_before / r->t_after);
        }
    }
    fflush(stdout);
    warn_reference("", &ref[0]);
    if (c->compare) warn_reference("unfused graph: ", &ref[1]);
    rc = 0;
done:
    free(st[0].samples);
    free(st[1].samples);
    free(utrace);
    inputs_free(&in);
    af_session_free(s);
    af_session_free(u);
    return rc;
}

/* ---- compile, report, inspect ---------------------------------------------------------- */

static bool log_info(const cli *c) {
    return c->log && (!strcmp(c->log, "info") || !strcmp(c->log, "debug"));
}

static int check_compile_args(cli *c) {
    static const char *logs[] = {"error", "warning", "info", "debug"};
    if (c->framework && c->framework != 5) {
        fprintf(stderr, "autofusion compile: --framework=%ld is not supported: 5 (ONNX) is the only one\n",
                c->framework);
        return 2;
    }
    bool ok = !c->log;
    for (size_t i = 0; i < AF_COUNT(logs) && !ok; i++) ok = !strcmp(c->log, logs[i]);
    if (!ok) {
        fprintf(stderr, "autofusion compile: --log must be error, warning, info or debug\n");
        return 2;
    }
    if (!c->output) {
        fprintf(stderr, "autofusion compile: --output=OUT is required\n");
        return 2;
    }
    return 0;
}

/* The fused graph as ONNX for Netron: as fusion left it (the report's graph), before the
 * lowering for the fast kernels (channels-last reorders, packed weights) that the .afm holds.
 * Under int8 the quantized model before fusion instead: standard QuantizeLinear /
 * DequantizeLinear around float ops, which ONNX Runtime runs (the same quantization, compared
 * fairly). */
static af_status export_fused(const cli *c, af_error *err) {
    af_options opt;
    af_options_init(&opt);
    opt.input_shape = c->input_shape;
    opt.disable_fusion = c->disable_fusion;
    opt.fusion_switch_file = c->fusion_switch_file;
    opt.no_lower = 1;
    if (c->precision_mode && af_precision_parse(c->precision_mode) == AF_PREC_INT8) {
        cli_options(c, &opt);
        opt.no_fusion = 1;
        opt.no_lower = 1;
    }
    af_session *s = NULL;
    af_status st = af_session_new(c->model, &opt, &s, err);
    if (!st) st = af_session_export_onnx(s, c->export_onnx, err);
    af_session_free(s);
    return st;
}

static int cmd_compile(cli *c) {
    int rc = check_compile_args(c);
    if (rc) return rc;
    af_session *s = open_session(c, false);
    if (!s) return 1;
    rc = 1;
    af_error err;
    char path[4096];
    snprintf(path, sizeof path, "%s%s", c->output, ends_with(c->output, ".afm") ? "" : ".afm");
    const char *json = af_session_report(s, 1), *text = af_session_report(s, 0);
    if (log_info(c) && text) fputs(text, stdout);
    if (c->report && (!json || af_fusion_report_write_json(af_session_fusion_report(s), c->report, &err))) {
        fprintf(stderr, "autofusion: %s\n", json ? err.message : "out of memory");
        goto done;
    }
    if (c->export_onnx && export_fused(c, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        goto done;
    }
    if (af_session_save(s, path, c->command_line, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        goto done;
    }
    printf("wrote %s\n", path);
    rc = 0;
done:
    af_session_free(s);
    return rc;
}

static int cmd_report(const cli *c) {
    af_session *s = open_session(c, false);
    if (!s) return 1;
    const char *r = af_session_report(s, c->json);
    if (r) fputs(r, stdout);
    if (r && c->json) putchar('\n');
    af_session_free(s);
    return r ? 0 : 1;
}

static int cmd_inspect(const cli *c) {
    af_error err;
    if (cli_inspect(c->model, stdout, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        return 1;
    }
    return 0;
}

/* The command line as typed, for the compiled file's header. */
static char *join_args(int argc, char **argv) {
    size_t len = 1;
    for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
    char *s = calloc(len, 1);
    for (int i = 0; s && i < argc; i++) {
        if (i) strcat(s, " ");
        strcat(s, argv[i]);
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return usage(stdout);
    if (!strcmp(cmd, "--version")) {
        printf("autofusion %s\n", AF_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "--list-fusions") || !strcmp(cmd, "--list_fusions")) {
        af_error err;
        if (af_plugin_load_env(&err) != AF_OK) {
            fprintf(stderr, "autofusion: %s\n", err.message);
            return 2;
        }
        for (int i = 2; i < argc; i++) {
            const char *v = NULL;
            const struct opt *o = find_opt(argv[i], &v);
            if (!o || o->kind != PLUGIN || (!v && i + 1 >= argc)) {
                fprintf(stderr, "autofusion --list-fusions: unexpected argument '%s'\n", argv[i]);
                return 2;
            }
            if (load_plugin(v ? v : argv[++i])) return 2;
        }
        af_fusion_list(stdout);
        return 0;
    }
    int command = 0;
    for (size_t i = 0; i < AF_COUNT(commands); i++)
        if (!strcmp(cmd, commands[i].name)) command = commands[i].bit;
    if (!command) {
        fprintf(stderr, "autofusion: unknown command '%s' (try --help)\n", cmd);
        return 2;
    }
    cli c = {0};
    c.command_line = join_args(argc, argv);
    int rc = parse(argc, argv, command, &c);
    if (!rc) {
        switch (command) {
        case RUN: rc = cmd_run(&c); break;
        case BENCH: rc = cmd_bench(&c); break;
        case COMPILE: rc = cmd_compile(&c); break;
        case REPORT: rc = cmd_report(&c); break;
        case VERIFY: rc = cmd_verify(&c); break;
        default: rc = cmd_inspect(&c); break;
        }
    }
    for (int i = 0; i < c.ninputs; i++) free((char *)c.input_name[i]);
    free(c.command_line);
    return rc;
}
