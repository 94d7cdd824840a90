/* ONNX conformance: run every case of Debian's libonnx-testdata (node, pytorch-converted,
 * pytorch-operator, simple) and compare with the expected outputs (rtol 1e-3, atol 1e-5).
 * Cases on the skip list (tests/conformance_skip.txt, "suite/case  reason") are not run; any
 * other case must pass. Each case runs in a child process so that a crash or a hang is reported
 * as that case's failure instead of ending the run.
 *
 * usage: conformance [--data=DIR] [--skip=FILE] [--filter=SUBSTR] [--all] [-v] [--list-failures]
 */
#include "autofusion.h"
#include "onnx/onnx.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
static int verbose;

typedef struct skip {
    char **names;
    int n;
} skip;

static void load_skip(const char *path, skip *s) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "conformance: cannot read skip list %s\n", path);
        exit(2);
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || !*p) continue;
        size_t len = strcspn(p, " \t\n");
        char *name = strndup(p, len);
        s->names = realloc(s->names, sizeof(char *) * (size_t)(s->n + 1));
        s->names[s->n++] = name;
    }
    fclose(f);
}

static bool skipped(const skip *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], id)) return true;
    return false;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted entry names of a directory that start with `prefix`. */
static int list_dir(const char *dir, const char *prefix, char ***out) {
    DIR *d = opendir(dir);
    int n = 0;
    *out = NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        *out = realloc(*out, sizeof(char *) * (size_t)(n + 1));
        (*out)[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof(char *), cmp_str);
    return n;
}

static void free_list(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

/* Whether an snprintf into a path buffer of `size` bytes, which returned r, fit: a path that
 * does not fit is reported as the case's failure instead of being opened truncated. */
static bool path_fits(int r, size_t size, const char *dir) {
    if (r >= 0 && (size_t)r < size) return true;
    printf("    path too long under %s\n", dir);
    return false;
}

static bool is_float(af_dtype t) {
    return t == AF_DTYPE_FLOAT || t == AF_DTYPE_DOUBLE || t == AF_DTYPE_FLOAT16 ||
           t == AF_DTYPE_BFLOAT16;
}

static bool compare(const char *name, const af_tensor *got, const af_tensor *want) {
    char a[128], b[128];
    if (got->dtype != want->dtype) {
        printf("    output '%s': dtype %s, expected %s\n", name, af_dtype_name(got->dtype),
               af_dtype_name(want->dtype));
        return false;
    }
    bool same = got->rank == want->rank;
    for (int i = 0; same && i < got->rank; i++) same = got->dims[i] == want->dims[i];
    if (!same) {
        printf("    output '%s': shape %s, expected %s\n", name, af_dims_str(got, a, sizeof a),
               af_dims_str(want, b, sizeof b));
        return false;
    }
    int64_t n = af_tensor_numel(want);
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        double x = 0, y = 0;
        if (is_float(want->dtype)) {
            x = af_tensor_get_double(got, i);
            y = af_tensor_get_double(want, i);
            ok = (isnan(x) && isnan(y)) || x == y || fabs(x - y) <= 1e-5 + 1e-3 * fabs(y);
        } else {
            ok = af_tensor_get_int(got, i) == af_tensor_get_int(want, i);
            x = (double)af_tensor_get_int(got, i);
            y = (double)af_tensor_get_int(want, i);
        }
        if (!ok) {
            printf("    output '%s': element %lld is %g, expected %g\n", name, (long long)i, x, y);
            return false;
        }
    }
    return true;
}

/* Run one test_data_set directory; true when every output matches. */
static bool run_set(af_session *s, const char *dir) {
    char path[4096];
    int nin = af_session_input_count(s), nout = af_session_output_count(s);
    char **files;
    int nfiles = list_dir(dir, "input_", &files);
    af_tensor *in = calloc((size_t)nfiles + 1, sizeof(af_tensor));
    const af_tensor **inp = calloc((size_t)nfiles + 1, sizeof(af_tensor *));
    const char **names = calloc((size_t)nfiles + 1, sizeof(char *));
    char **pbnames = calloc((size_t)nfiles + 1, sizeof(char *));
    af_tensor **out = calloc((size_t)nout + 1, sizeof(af_tensor *));
    bool ok = true;
    af_error err;
    for (int i = 0; i < nfiles && ok; i++) {
        if (!path_fits(snprintf(path, sizeof path, "%s/input_%d.pb", dir, i), sizeof path, dir)) {
            ok = false;
            break;
        }
        if (af_tensor_load_pb(path, &in[i], &pbnames[i], &err)) {
            printf("    %s\n", err.message);
            ok = false;
            break;
        }
        /* Older test data stores bfloat16 tensors as uint16 (data_type 4). */
        af_tensor declared;
        if (i < nin && !af_session_input_type(s, i, &declared) &&
            declared.dtype == AF_DTYPE_BFLOAT16 && in[i].dtype == AF_DTYPE_UINT16)
            in[i].dtype = AF_DTYPE_BFLOAT16;
        inp[i] = &in[i];
        /* Inputs are listed in the order of the graph's inputs; the file's name wins when it
         * names one. */
        names[i] = i < nin ? af_session_input_name(s, i) : "";
        for (int k = 0; pbnames[i] && k < nin; k++)
            if (!strcmp(pbnames[i], af_session_input_name(s, k))) names[i] = pbnames[i];
    }
    if (ok && af_session_run(s, names, inp, (size_t)nfiles, out, &err)) {
        printf("    run: %s\n", err.message);
        ok = false;
    }
    for (int i = 0; ok && i < nout; i++) {
        af_tensor want = {0};
        if (!path_fits(snprintf(path, sizeof path, "%s/output_%d.pb", dir, i), sizeof path, dir)) {
            ok = false;
            break;
        }
        if (af_tensor_load_pb(path, &want, NULL, &err)) {
            printf("    %s\n", err.message);
            ok = false;
            break;
        }
        if (want.dtype == AF_DTYPE_UINT16 && out[i]->dtype == AF_DTYPE_BFLOAT16)
            want.dtype = AF_DTYPE_BFLOAT16;
        ok = compare(af_session_output_name(s, i), out[i], &want);
        af_tensor_release(&want);
    }
    for (int i = 0; i < nout; i++) af_tensor_free(out[i]);
    for (int i = 0; i < nfiles; i++) {
        af_tensor_release(&in[i]);
        free(pbnames[i]);
    }
    free(in);
    free(inp);
    free(names);
    free(pbnames);
    free(out);
    free_list(files, nfiles);
    return ok;
}

static int run_case(const char *dir) {
    char path[4096];
    if (!path_fits(snprintf(path, sizeof path, "%s/model.onnx", dir), sizeof path, dir)) return 1;
    af_session *s = NULL;
    af_error err;
    if (af_session_new(path, NULL, &s, &err)) {
        printf("    load: %s\n", err.message);
        return 1;
    }
    char **sets;
    int nsets = list_dir(dir, "test_data_set_", &sets);
    bool ok = nsets > 0;
    for (int i = 0; i < nsets && ok; i++) {
        ok = path_fits(snprintf(path, sizeof path, "%s/%s", dir, sets[i]), sizeof path, dir) &&
             run_set(s, path);
    }
    free_list(sets, nsets);
    af_session_free(s);
    return ok ? 0 : 1;
}

/* Fork so that a crash is one failed case; the child's messages show only with -v. */
static bool run_isolated(const char *dir) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!verbose) {
            if (!freopen("/dev/null", "w", stdout)) _exit(3);
        }
        alarm(120);
        int rc = run_case(dir);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return false;
    if (WIFSIGNALED(status)) {
        if (verbose) printf("    crashed or timed out (signal %d)\n", WTERMSIG(status));
        return false;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(int argc, char **argv) {
    const char *data = "/usr/share/libonnx-testdata/data", *skip_path = NULL, *filter = NULL;
    bool all = false, list_failures = false;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--data=", 7)) data = argv[i] + 7;
        else if (!strncmp(argv[i], "--skip=", 7)) skip_path = argv[i] + 7;
        else if (!strncmp(argv[i], "--filter=", 9)) filter = argv[i] + 9;
        else if (!strcmp(argv[i], "--all")) all = true;
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--list-failures")) list_failures = true;
        else {
            fprintf(stderr, "usage: conformance [--data=DIR] [--skip=FILE] [--filter=S] [--all] [-v] [--list-failures]\n");
            return 2;
        }
    }
    skip sk = {0};
    if (skip_path && !all) load_skip(skip_path, &sk);
    int passed = 0, failed = 0, skipped_n = 0, total = 0;
    for (size_t su = 0; su < sizeof suites / sizeof suites[0]; su++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", data, suites[su]);
        char **cases;
        int n = list_dir(dir, "test_", &cases);
        for (int i = 0; i < n; i++) {
            char id[1024], cdir[8192];
            snprintf(id, sizeof id, "%s/%s", suites[su], cases[i]);
            if (filter && !strstr(id, filter)) continue;
            total++;
            if (skipped(&sk, id)) {
                skipped_n++;
                continue;
            }
            snprintf(cdir, sizeof cdir, "%s/%s", dir, cases[i]);
            if (verbose) printf("%s\n", id);
            if (run_isolated(cdir)) {
                passed++;
            } else {
                failed++;
                printf(list_failures ? "%s\n" : "FAIL %s\n", id);
            }
        }
        free_list(cases, n);
    }
    for (int i = 0; i < sk.n; i++) free(sk.names[i]);
    free(sk.names);
    if (total == 0) {
        fprintf(stderr, "conformance: no cases found under %s\n", data);
        return 2;
    }
    printf("conformance: %d cases, pass rate %.1f%%\n", total, 100.0 * passed / total);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped_n);
    return failed ? 1 : 0;
}
