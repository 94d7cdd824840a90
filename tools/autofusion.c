/* The autofusion command line (DESIGN.md section 1 is the contract).
 * Options are accepted as --a_b or --a-b, and --k=v or --k v. Every failure prints one line
 * naming the file and the reason, and exits non-zero. */
#include "autofusion.h"
#include "onnx/onnx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_INPUTS 64

typedef struct args {
    const char *model;
    const char *output_dir;
    const char *input_shape;
    const char *input_name[MAX_INPUTS];
    const char *input_file[MAX_INPUTS];
    int ninputs;
    unsigned long seed;
} args;

static int usage(FILE *f) {
    fprintf(f,
            "autofusion %s: operator-fusion compiler and runtime for ONNX models on CPUs\n"
            "\n"
            "usage:\n"
            "  autofusion run MODEL.onnx [--input NAME=FILE ...] [--output_dir DIR]\n"
            "                 [--input_shape=\"name:1,3,224,224;...\"] [--seed N]\n"
            "      FILE is .npy or an ONNX TensorProto (.pb); inputs not given get random data of\n"
            "      the declared shape (symbolic dims are 1 unless --input_shape sets them).\n"
            "      Each output is written as DIR/<name>.npy and summarised on one line.\n"
            "  autofusion --version | --help\n",
            AF_VERSION);
    return f == stderr ? 2 : 0;
}

/* "--input-shape" and "--input_shape" are the same option. */
static bool opt_is(const char *arg, const char *name, const char **inline_val) {
    if (arg[0] != '-' || arg[1] != '-') return false;
    const char *a = arg + 2;
    size_t i = 0;
    for (; name[i]; i++) {
        char c = a[i] == '-' ? '_' : a[i];
        if (c != name[i]) return false;
    }
    if (a[i] == '=') {
        *inline_val = a + i + 1;
        return true;
    }
    if (a[i] == 0) {
        *inline_val = NULL;
        return true;
    }
    return false;
}

/* Value of an option: inline (--k=v) or the next argument (--k v). */
static const char *opt_value(int argc, char **argv, int *i, const char *inline_val) {
    if (inline_val) return inline_val;
    if (*i + 1 < argc) return argv[++*i];
    fprintf(stderr, "autofusion: option %s needs a value\n", argv[*i]);
    exit(2);
}

static int parse_run(int argc, char **argv, args *a) {
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (opt_is(argv[i], "input", &v)) {
            const char *spec = opt_value(argc, argv, &i, v);
            const char *eq = strrchr(spec, '=');
            if (!eq || eq == spec || !eq[1]) {
                fprintf(stderr, "autofusion: --input wants NAME=FILE, got '%s'\n", spec);
                return 2;
            }
            if (a->ninputs == MAX_INPUTS) {
                fprintf(stderr, "autofusion: too many --input options\n");
                return 2;
            }
            a->input_name[a->ninputs] = strndup(spec, (size_t)(eq - spec));
            a->input_file[a->ninputs++] = eq + 1;
        } else if (opt_is(argv[i], "output_dir", &v)) {
            a->output_dir = opt_value(argc, argv, &i, v);
        } else if (opt_is(argv[i], "input_shape", &v)) {
            a->input_shape = opt_value(argc, argv, &i, v);
        } else if (opt_is(argv[i], "seed", &v)) {
            a->seed = strtoul(opt_value(argc, argv, &i, v), NULL, 10);
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "autofusion run: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!a->model) {
            a->model = argv[i];
        } else {
            fprintf(stderr, "autofusion run: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!a->model) {
        fprintf(stderr, "autofusion run: no model given\n");
        return 2;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static af_status load_input(const char *path, af_tensor *t, af_error *err) {
    if (ends_with(path, ".npy")) return af_tensor_load_npy(path, t, err);
    return af_tensor_load_pb(path, t, NULL, err);
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

static double tensor_sum(const af_tensor *t) {
    double s = 0;
    int64_t n = af_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) s += af_tensor_get_double(t, i);
    return s;
}

/* DIR/<name>.npy with characters outside [A-Za-z0-9_.-] replaced by '_'. */
static void output_path(char *buf, size_t len, const char *dir, const char *name) {
    size_t o = (size_t)snprintf(buf, len, "%s/", dir);
    for (const char *p = name; *p && o + 5 < len; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        buf[o++] = ok ? c : '_';
    }
    snprintf(buf + o, len - o, ".npy");
}

static int cmd_run(int argc, char **argv) {
    args a = {0};
    int rc = parse_run(argc, argv, &a);
    af_session *s = NULL;
    af_tensor *in[MAX_INPUTS] = {0}, **out = NULL;
    const char *names[MAX_INPUTS];
    int nin = 0, nout = 0;
    af_error err;
    if (rc) goto done;
    rc = 1;
    af_options opt;
    af_options_init(&opt);
    opt.input_shape = a.input_shape;
    if (af_session_new(a.model, &opt, &s, &err)) {
        fprintf(stderr, "autofusion: %s\n", err.message);
        goto done;
    }
    uint64_t state = 0x9E3779B97F4A7C15ULL ^ a.seed;
    int declared = af_session_input_count(s);
    if (declared > MAX_INPUTS) {
        fprintf(stderr, "autofusion: %s: more than %d inputs\n", a.model, MAX_INPUTS);
        goto done;
    }
    for (int i = 0; i < a.ninputs; i++) {
        in[nin] = calloc(1, sizeof(af_tensor));
        if (!in[nin] || load_input(a.input_file[i], in[nin], &err)) {
            fprintf(stderr, "autofusion: %s\n", in[nin] ? err.message : "out of memory");
            goto done;
        }
        names[nin++] = a.input_name[i];
    }
    for (int k = 0; k < declared; k++) {
        const char *name = af_session_input_name(s, k);
        bool given = false;
        for (int i = 0; i < a.ninputs; i++) given |= !strcmp(a.input_name[i], name);
        if (given) continue;
        af_tensor type;
        af_session_input_type(s, k, &type);
        in[nin] = random_input(&type, &state);
        if (!in[nin]) {
            fprintf(stderr, "autofusion: %s: cannot make random data for input '%s' (%s)\n",
                    a.model, name, af_dtype_name(type.dtype));
            goto done;
        }
        names[nin++] = name;
    }
    nout = af_session_output_count(s);
    out = calloc((size_t)nout + 1, sizeof(af_tensor *));
    if (!out || af_session_run(s, names, (const af_tensor *const *)in, (size_t)nin, out, &err)) {
        fprintf(stderr, "autofusion: %s\n", out ? err.message : "out of memory");
        goto done;
    }
    if (a.output_dir && mkdir(a.output_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "autofusion: %s: cannot create directory: %s\n", a.output_dir,
                strerror(errno));
        goto done;
    }
    for (int i = 0; i < nout; i++) {
        char dims[256], path[4096];
        printf("output %s shape %s dtype %s sum %.6g\n", af_session_output_name(s, i),
               af_dims_str(out[i], dims, sizeof dims), af_dtype_name(out[i]->dtype),
               tensor_sum(out[i]));
        if (!a.output_dir) continue;
        output_path(path, sizeof path, a.output_dir, af_session_output_name(s, i));
        if (af_tensor_save_npy(path, out[i], &err)) {
            fprintf(stderr, "autofusion: %s\n", err.message);
            goto done;
        }
    }
    rc = 0;
done:
    for (int i = 0; out && i < nout; i++) af_tensor_free(out[i]);
    free(out);
    for (int i = 0; i < nin; i++) {
        if (in[i]) af_tensor_release(in[i]);
        free(in[i]);
    }
    for (int i = 0; i < a.ninputs; i++) free((char *)a.input_name[i]);
    af_session_free(s);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return usage(stdout);
    if (!strcmp(cmd, "--version")) {
        printf("autofusion %s\n", AF_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "run")) return cmd_run(argc, argv);
    fprintf(stderr, "autofusion: unknown command '%s' (try --help)\n", cmd);
    return 2;
}
