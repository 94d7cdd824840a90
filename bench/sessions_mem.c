/* Memory of N sessions of one model in one process: are the weights shared or copied?
 *
 *   build/bench/sessions_mem MODEL [--sessions=8] [--threads=N] [--input_shape="name:1,128;..."]
 *
 * Opens sessions of MODEL (.afm or .onnx) one after another, up to --sessions, keeping them all
 * open, and runs each once right after opening it. After each step it prints the process's
 * VmRSS, RssAnon and RssFile (/proc/self/status), its proportional set size Pss, Pss_Anon and
 * Pss_File (/proc/self/smaps_rollup) and how much the system's used memory (MemTotal - MemFree -
 * Buffers - Cached - SReclaimable, as free(1) counts it) grew since before the first session.
 * Then it prints the growth per added session between 1 and N sessions.
 *
 * How to read it: an .afm is mapped read-only (MAP_PRIVATE, never written), so its weights are
 * page-cache pages. RssFile counts a page once per mapping that maps it, so it grows by the
 * file's size with every session even when nothing is copied; Pss divides each page by the
 * number of its mappings, and the system's used memory does not count the page cache at all.
 * Weights copied per session show as RssAnon (and Pss_Anon, and system used) growing by about
 * the weight size per session; weights shared show as RssAnon growing only by the session's own
 * arena and bookkeeping, Pss_File staying at about one copy of the file.
 * Only the public API (include/autofusion.h) is used. The machine's other processes move the
 * system figure; the process's own figures are exact. */
#include "autofusion.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { MAX_IO = 16, MAX_SESSIONS = 64 };

typedef struct mem {
    long rss, anon, file, pss, pss_anon, pss_file, sys_used; /* kB */
} mem;

static long field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    size_t k = strlen(key);
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') {
            v = strtol(line + k + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static mem measure(void) {
    mem m;
    m.rss = field("/proc/self/status", "VmRSS");
    m.anon = field("/proc/self/status", "RssAnon");
    m.file = field("/proc/self/status", "RssFile");
    m.pss = field("/proc/self/smaps_rollup", "Pss");
    m.pss_anon = field("/proc/self/smaps_rollup", "Pss_Anon");
    m.pss_file = field("/proc/self/smaps_rollup", "Pss_File");
    m.sys_used = field("/proc/meminfo", "MemTotal") - field("/proc/meminfo", "MemFree") -
                 field("/proc/meminfo", "Buffers") - field("/proc/meminfo", "Cached") -
                 field("/proc/meminfo", "SReclaimable");
    return m;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void row(const char *what, int k, const mem *m, const mem *base, double ms) {
    printf("%-5s %2d  %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %11.1f %9.1f\n", what, k,
           m->rss / 1024.0, m->anon / 1024.0, m->file / 1024.0, m->pss / 1024.0,
           m->pss_anon / 1024.0, m->pss_file / 1024.0, (m->sys_used - base->sys_used) / 1024.0,
           ms);
}

/* Run s once on inputs of its declared shape (unknown dims 1): floats in [-1, 1), integers in
 * [0, 10), masks of ones. */
static int run_once(af_session *s) {
    af_tensor *in[MAX_IO] = {NULL}, *out[MAX_IO] = {NULL};
    const char *names[MAX_IO];
    int nin = af_session_input_count(s), nout = af_session_output_count(s);
    if (nin > MAX_IO || nout > MAX_IO) {
        fprintf(stderr, "sessions_mem: more than %d inputs or outputs\n", MAX_IO);
        return 1;
    }
    uint64_t seed = 42;
    for (int i = 0; i < nin; i++) {
        af_tensor t;
        af_session_input_type(s, i, &t);
        for (int d = 0; d < t.rank; d++)
            if (t.dims[d] < 0) t.dims[d] = 1;
        in[i] = af_tensor_new(t.dtype, t.rank, t.dims);
        names[i] = af_session_input_name(s, i);
        if (!in[i]) return 1;
        bool mask = strstr(names[i], "mask") != NULL;
        int64_t n = af_tensor_numel(in[i]);
        for (int64_t k = 0; k < n; k++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            double u = (double)(seed >> 11) / (double)(1ULL << 53);
            if (t.dtype == AF_DTYPE_FLOAT) ((float *)in[i]->data)[k] = (float)(2 * u - 1);
            else if (t.dtype == AF_DTYPE_INT64) ((int64_t *)in[i]->data)[k] = mask ? 1 : (int64_t)(u * 10);
            else if (t.dtype == AF_DTYPE_INT32) ((int32_t *)in[i]->data)[k] = mask ? 1 : (int32_t)(u * 10);
        }
    }
    af_error err;
    int rc = 0;
    if (af_session_run(s, names, (const af_tensor *const *)in, (size_t)nin, out, &err)) {
        fprintf(stderr, "sessions_mem: %s\n", err.message);
        rc = 1;
    }
    for (int i = 0; i < nout; i++) af_tensor_free(out[i]);
    for (int i = 0; i < nin; i++) af_tensor_free(in[i]);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: sessions_mem MODEL [--sessions=8] [--threads=N] "
                        "[--input_shape=\"name:d,d;...\"]\n");
        return 2;
    }
    const char *model = argv[1], *shape = NULL;
    int n = 8, threads = 2;
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--sessions=", 11)) n = atoi(argv[i] + 11);
        else if (!strncmp(argv[i], "--threads=", 10)) threads = atoi(argv[i] + 10);
        else if (!strncmp(argv[i], "--input_shape=", 14)) shape = argv[i] + 14;
        else {
            fprintf(stderr, "sessions_mem: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (n < 1 || n > MAX_SESSIONS) {
        fprintf(stderr, "sessions_mem: --sessions must be 1..%d\n", MAX_SESSIONS);
        return 2;
    }
    struct stat sb;
    if (stat(model, &sb) != 0) {
        perror(model);
        return 1;
    }
    printf("%s: %lld bytes (%.1f MiB), %d threads per session%s%s\n", model,
           (long long)sb.st_size, sb.st_size / 1048576.0, threads, shape ? ", input_shape " : "",
           shape ? shape : "");
    printf("step   N     VmRSS   RssAnon   RssFile       Pss  Pss_Anon  Pss_File  sys used +  "
           "ms (MiB)\n");
    af_session *s[MAX_SESSIONS] = {NULL};
    mem base = measure(), at_run[MAX_SESSIONS + 1];
    at_run[0] = base;
    row("start", 0, &base, &base, 0);
    for (int k = 1; k <= n; k++) {
        af_options opt;
        af_options_init(&opt);
        opt.threads = threads;
        opt.input_shape = shape;
        af_error err;
        double t0 = now_ms();
        if (af_session_new(model, &opt, &s[k - 1], &err) != AF_OK) {
            fprintf(stderr, "sessions_mem: %s\n", err.message);
            return 1;
        }
        double t1 = now_ms();
        mem m = measure();
        row("new", k, &m, &base, t1 - t0);
        if (run_once(s[k - 1])) return 1;
        at_run[k] = measure();
        row("run", k, &at_run[k], &base, now_ms() - t1);
    }
    printf("per added session, after its run (MiB):\n");
    for (int k = 2; k <= n; k *= 2) {
        const mem *a = &at_run[1], *b = &at_run[k];
        double d = k - 1;
        printf("  1 -> %d sessions: RssAnon %+.1f  RssFile %+.1f  Pss %+.1f  Pss_Anon %+.1f  "
               "Pss_File %+.1f  sys used %+.1f\n", k, (b->anon - a->anon) / 1024.0 / d,
               (b->file - a->file) / 1024.0 / d, (b->pss - a->pss) / 1024.0 / d,
               (b->pss_anon - a->pss_anon) / 1024.0 / d, (b->pss_file - a->pss_file) / 1024.0 / d,
               (b->sys_used - a->sys_used) / 1024.0 / d);
    }
    printf("first session over the start: RssAnon %+.1f  RssFile %+.1f  Pss %+.1f  sys used %+.1f\n",
           (at_run[1].anon - base.anon) / 1024.0, (at_run[1].file - base.file) / 1024.0,
           (at_run[1].pss - base.pss) / 1024.0, (at_run[1].sys_used - base.sys_used) / 1024.0);
    for (int k = 0; k < n; k++) af_session_free(s[k]);
    mem end = measure();
    row("freed", 0, &end, &base, 0);
    return 0;
}
