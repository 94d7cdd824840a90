/* Two builds of the library side by side in one process: an A/B of a change, with both sides
 * sharing the machine's state (caches, frequency, whatever else runs) run by run.
 *
 *   build/bench/ab_bench libA.so libB.so MODEL [--threads=N] [--iterations=N] [--warmup=N]
 *
 * Each library is a shared build of the whole library (bench/ab.sh makes them from two
 * checkouts), linked -Bsymbolic and opened RTLD_LOCAL, so each keeps its own code and state and
 * only the public API (include/autofusion.h) is called. Both sessions compile MODEL, get the same
 * inputs (seeded), and then run alternately, the side that goes first swapping every iteration.
 * Prints one line: the model, the medians and minima of both, B / A of the medians, and the
 * median of the paired ratios B_i / A_i of the runs made back to back (the figure least moved by
 * a machine whose speed drifts), with its quartiles. */
#include "autofusion.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct lib {
    void *h;
    af_status (*session_new)(const char *, const af_options *, af_session **, af_error *);
    void (*session_free)(af_session *);
    int (*input_count)(const af_session *);
    const char *(*input_name)(const af_session *, int);
    af_status (*input_type)(const af_session *, int, af_tensor *);
    int (*output_count)(const af_session *);
    af_status (*run)(af_session *, const char *const *, const af_tensor *const *, size_t,
                     af_tensor **, af_error *);
    void (*options_init)(af_options *);
    af_tensor *(*tensor_new)(af_dtype, int, const int64_t *);
    void (*tensor_free)(af_tensor *);
} lib;

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "ab_bench: %s\n", dlerror());
        exit(2);
    }
    return p;
}

static void lib_open(lib *l, const char *path) {
    l->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l->h) {
        fprintf(stderr, "ab_bench: %s\n", dlerror());
        exit(2);
    }
    *(void **)&l->session_new = sym(l->h, "af_session_new");
    *(void **)&l->session_free = sym(l->h, "af_session_free");
    *(void **)&l->input_count = sym(l->h, "af_session_input_count");
    *(void **)&l->input_name = sym(l->h, "af_session_input_name");
    *(void **)&l->input_type = sym(l->h, "af_session_input_type");
    *(void **)&l->output_count = sym(l->h, "af_session_output_count");
    *(void **)&l->run = sym(l->h, "af_session_run");
    *(void **)&l->options_init = sym(l->h, "af_options_init");
    *(void **)&l->tensor_new = sym(l->h, "af_tensor_new");
    *(void **)&l->tensor_free = sym(l->h, "af_tensor_free");
}

enum { MAX_IO = 16 };

typedef struct side {
    lib l;
    af_session *s;
    af_tensor *in[MAX_IO];
    const char *names[MAX_IO];
    int nin, nout;
    double *ms;
} side;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The same inputs on both sides: floats in [-1, 1), integers in [0, 10), masks of ones. */
static void make_inputs(side *sd, uint64_t seed) {
    sd->nin = sd->l.input_count(sd->s);
    if (sd->nin > MAX_IO) {
        fprintf(stderr, "ab_bench: more than %d inputs\n", MAX_IO);
        exit(2);
    }
    for (int i = 0; i < sd->nin; i++) {
        af_tensor t;
        sd->l.input_type(sd->s, i, &t);
        for (int d = 0; d < t.rank; d++)
            if (t.dims[d] < 0) t.dims[d] = 1;
        sd->in[i] = sd->l.tensor_new(t.dtype, t.rank, t.dims);
        sd->names[i] = sd->l.input_name(sd->s, i);
        int64_t n = 1;
        for (int d = 0; d < t.rank; d++) n *= t.dims[d];
        bool mask = strstr(sd->names[i], "mask") != NULL;
        for (int64_t k = 0; k < n; k++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            double u = (double)(seed >> 11) / (double)(1ULL << 53);
            if (t.dtype == AF_DTYPE_FLOAT) ((float *)sd->in[i]->data)[k] = (float)(2 * u - 1);
            else if (t.dtype == AF_DTYPE_INT64) ((int64_t *)sd->in[i]->data)[k] = mask ? 1 : (int64_t)(u * 10);
            else if (t.dtype == AF_DTYPE_INT32) ((int32_t *)sd->in[i]->data)[k] = mask ? 1 : (int32_t)(u * 10);
        }
    }
    sd->nout = sd->l.output_count(sd->s);
}

static double run_once(side *sd) {
    af_tensor *out[MAX_IO] = {NULL};
    af_error err;
    double t0 = now_ms();
    if (sd->l.run(sd->s, sd->names, (const af_tensor *const *)sd->in, (size_t)sd->nin, out, &err)) {
        fprintf(stderr, "ab_bench: %s\n", err.message);
        exit(1);
    }
    double t = now_ms() - t0;
    for (int i = 0; i < sd->nout && i < MAX_IO; i++) sd->l.tensor_free(out[i]);
    return t;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: ab_bench libA.so libB.so MODEL [--threads=N] [--iterations=N] "
                        "[--warmup=N]\n");
        return 2;
    }
    int threads = 1, iters = 20, warmup = 3;
    for (int i = 4; i < argc; i++) {
        if (!strncmp(argv[i], "--threads=", 10)) threads = atoi(argv[i] + 10);
        else if (!strncmp(argv[i], "--iterations=", 13)) iters = atoi(argv[i] + 13);
        else if (!strncmp(argv[i], "--warmup=", 9)) warmup = atoi(argv[i] + 9);
    }
    side sd[2];
    memset(sd, 0, sizeof sd);
    for (int k = 0; k < 2; k++) {
        lib_open(&sd[k].l, argv[1 + k]);
        af_options opt;
        sd[k].l.options_init(&opt);
        opt.threads = threads;
        af_error err;
        if (sd[k].l.session_new(argv[3], &opt, &sd[k].s, &err)) {
            fprintf(stderr, "ab_bench: %s: %s\n", argv[1 + k], err.message);
            return 1;
        }
        make_inputs(&sd[k], 42);
        sd[k].ms = calloc((size_t)iters, sizeof(double));
    }
    for (int i = 0; i < warmup; i++)
        for (int k = 0; k < 2; k++) run_once(&sd[k]);
    for (int i = 0; i < iters; i++)
        for (int j = 0; j < 2; j++) {
            int k = (i + j) % 2; /* who goes first alternates */
            sd[k].ms[i] = run_once(&sd[k]);
        }
    double *ratio = calloc((size_t)iters, sizeof(double));
    for (int i = 0; i < iters; i++) ratio[i] = sd[1].ms[i] / sd[0].ms[i];
    qsort(ratio, (size_t)iters, sizeof(double), cmp);
    double med[2], min[2];
    for (int k = 0; k < 2; k++) {
        qsort(sd[k].ms, (size_t)iters, sizeof(double), cmp);
        med[k] = iters % 2 ? sd[k].ms[iters / 2]
                           : (sd[k].ms[iters / 2 - 1] + sd[k].ms[iters / 2]) / 2;
        min[k] = sd[k].ms[0];
    }
    const char *base = strrchr(argv[3], '/');
    printf("%-22s threads %d  A median %8.3f min %8.3f  B median %8.3f min %8.3f  B/A %.4f "
           "(min %.4f)  paired %.4f [%.4f, %.4f]\n", base ? base + 1 : argv[3], threads, med[0],
           min[0], med[1], min[1], med[1] / med[0], min[1] / min[0], ratio[iters / 2],
           ratio[iters / 4], ratio[3 * iters / 4]);
    free(ratio);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < sd[k].nin; i++) sd[k].l.tensor_free(sd[k].in[i]);
        sd[k].l.session_free(sd[k].s);
        free(sd[k].ms);
    }
    return 0;
}
