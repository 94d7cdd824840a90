/* The machine the cost model estimates for (fusion/fusion.h: af_machine), measured on this
 * machine, one core, once: an FMA loop with independent accumulators, the GEMM core on a
 * cache-resident problem (what convolutions and matrix products reach; also in bfloat16 and in
 * int8 where the CPU has the dot products, which the lowering compares with float32), memcpy within L2, within
 * a few times L2 and of a 64 MiB buffer (where a tensor of each size lives right after its
 * producer wrote it). The rates are cached as JSON in $XDG_CACHE_HOME/autofusion/machine.json
 * (else ~/.cache/autofusion/machine.json; $AUTOFUSION_MACHINE_FILE overrides the path), per
 * kernel ISA, so that a process measures only when nothing is cached, or when what is cached was
 * measured on a busy machine a minute or more ago (keeping the best figures: REMEASURE_S).
 *
 * Invariant: a record is used only when every rate in it is finite and within wide sane bounds,
 * and only for the ISA it was measured on. */
#include "runtime/machine.h"
#include "kernels/fast/gemm.h"
#include "kernels/simd/cpu.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- measuring ----------------------------------------------------------------------------- */

/* One FMA loop: `iters` iterations of `flops_per_iter` FLOPs on independent accumulators. The
 * x86-64 loops are inline assembly so that the measurement does not depend on how this file
 * was optimised (a Debug build measures the same peak as a Release one). */
typedef struct fma_loop {
    const char *isa;
    double flops_per_iter;
    void (*run)(long iters);
} fma_loop;

#if defined(__x86_64__)
static void fma_avx512(long iters) {
    __asm__ volatile("vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
                     "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
                     "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"
                     "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"
                     "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"
                     "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"
                     "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"
                     "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"
                     "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"
                     "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"
                     "vxorps %%xmm10, %%xmm10, %%xmm10\n\t"
                     "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"
                     "vxorps %%xmm12, %%xmm12, %%xmm12\n\t"
                     "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"
                     "1:\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm0\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm1\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm2\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm3\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm4\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm5\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm6\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm7\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm8\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm9\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm10\n\t"
                     "vfmadd231ps %%zmm12, %%zmm13, %%zmm11\n\t"
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper"
                     : "+r"(iters)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc");
}

static void fma_avx2(long iters) {
    __asm__ volatile("vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
                     "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
                     "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"
                     "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"
                     "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"
                     "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"
                     "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"
                     "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"
                     "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"
                     "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"
                     "vxorps %%xmm10, %%xmm10, %%xmm10\n\t"
                     "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"
                     "vxorps %%xmm12, %%xmm12, %%xmm12\n\t"
                     "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"
                     "1:\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm0\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm1\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm2\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm3\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm4\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm5\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm6\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm7\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm8\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm9\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm10\n\t"
                     "vfmadd231ps %%ymm12, %%ymm13, %%ymm11\n\t"
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper"
                     : "+r"(iters)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc");
}

/* Without FMA: 6 independent multiplies and 6 independent adds of 4 lanes per iteration. */
static void fma_sse(long iters) {
    __asm__ volatile("xorps %%xmm0, %%xmm0\n\t"
                     "xorps %%xmm1, %%xmm1\n\t"
                     "xorps %%xmm2, %%xmm2\n\t"
                     "xorps %%xmm3, %%xmm3\n\t"
                     "xorps %%xmm4, %%xmm4\n\t"
                     "xorps %%xmm5, %%xmm5\n\t"
                     "xorps %%xmm6, %%xmm6\n\t"
                     "xorps %%xmm7, %%xmm7\n\t"
                     "xorps %%xmm8, %%xmm8\n\t"
                     "xorps %%xmm9, %%xmm9\n\t"
                     "xorps %%xmm10, %%xmm10\n\t"
                     "xorps %%xmm11, %%xmm11\n\t"
                     "xorps %%xmm12, %%xmm12\n\t"
                     "1:\n\t"
                     "mulps %%xmm12, %%xmm0\n\t"
                     "addps %%xmm12, %%xmm1\n\t"
                     "mulps %%xmm12, %%xmm2\n\t"
                     "addps %%xmm12, %%xmm3\n\t"
                     "mulps %%xmm12, %%xmm4\n\t"
                     "addps %%xmm12, %%xmm5\n\t"
                     "mulps %%xmm12, %%xmm6\n\t"
                     "addps %%xmm12, %%xmm7\n\t"
                     "mulps %%xmm12, %%xmm8\n\t"
                     "addps %%xmm12, %%xmm9\n\t"
                     "mulps %%xmm12, %%xmm10\n\t"
                     "addps %%xmm12, %%xmm11\n\t"
                     "dec %0\n\t"
                     "jnz 1b"
                     : "+r"(iters)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "cc");
}

#else
/* Portable fallback: 8 independent accumulators the compiler may keep in registers. */
static volatile float fma_sink;
static void fma_c(long iters) {
    float a[8] = {0}, m = 1.0f, c = 1e-7f;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 8; k++) a[k] = a[k] * m + c;
    fma_sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}
#endif

static fma_loop pick_loop(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return (fma_loop){"avx512", 12 * 16 * 2, fma_avx512};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return (fma_loop){"avx2", 12 * 8 * 2, fma_avx2};
    return (fma_loop){"sse", 12 * 4, fma_sse};
#else
    return (fma_loop){"c", 8 * 2, fma_c};
#endif
}

/* Best FLOP/s over 8 runs of about 20 ms each. */
static double measure_flops(fma_loop *l) {
    long iters = 1 << 14;
    double t = 0.0;
    for (;;) {
        double t0 = now();
        l->run(iters);
        t = now() - t0;
        if (t >= 0.002 || iters > (1L << 40)) break;
        iters *= 4;
    }
    long run = t > 0.0 ? (long)((double)iters * 0.02 / t) : iters;
    if (run < 1) run = 1;
    double best = 0.0; /* best of 8: a shared machine's other tenants only ever slow it down */
    for (int rep = 0; rep < 8; rep++) {
        double t0 = now();
        l->run(run);
        double dt = now() - t0;
        if (dt > 0.0 && (double)run * l->flops_per_iter / dt > best)
            best = (double)run * l->flops_per_iter / dt;
    }
    return best;
}

/* Best copy bandwidth (bytes read + written per second) of a `size` buffer (halved while
 * memory runs short) over about 100 ms of af_copy, the kernels' copy: two mallocs of the same
 * size end up 16 bytes apart modulo 4 KiB, where glibc's memcpy crawls on AMD Zen 3 (util.h);
 * with it this machine file held 6 GB/s "within L2" against 77 GB/s beyond (version 7). */
static double measure_bandwidth(size_t size) {
    char *a = NULL, *b = NULL;
    while (size >= ((size_t)64 << 10)) {
        a = af_malloc(size);
        b = af_malloc(size);
        if (a && b) break;
        af_free(a);
        af_free(b);
        a = b = NULL;
        size /= 2;
    }
    if (!a) return 1e9; /* no memory to measure with: a modest figure keeps estimates finite */
    memset(a, 1, size);
    memset(b, 2, size);
    double best = 0.0, start = now();
    for (int rep = 0; rep < 5000 && (rep < 3 || now() - start < 0.1); rep++) {
        double t0 = now();
        af_copy(b, a, size);
        double dt = now() - t0;
        a[rep % size] = b[(rep * 7919) % size]; /* keep the copies observable */
        if (dt > 0.0 && 2.0 * (double)size / dt > best) best = 2.0 * (double)size / dt;
    }
    af_free(a);
    af_free(b);
    return best > 0.0 ? best : 1e9;
}

/* Best rate of the GEMM core in type t (F32, BF16 or U8S8; the ISA in force, one thread) on a
 * 192 x 256 x 512 problem whose operands stay in cache: what convolutions and matrix products
 * run at (U8S8: 2 operations per multiply-add, as FLOPs count). A BF16 A holds 32 rows more than
 * M (AMX reads whole tiles). */
/* GFLOP/s (GOP/s for int8) of type t; w7: U8S8 with weights within [-64, 64] (af_gemm.w7). */
static double measure_gemm(af_gemm_type t, int w7) {
    enum { M = 192, N = 256, K = 512 };
    size_t es = t == AF_GEMM_BF16 ? sizeof(uint16_t) : t == AF_GEMM_U8S8 ? 1 : sizeof(float);
    void *a = af_calloc((size_t)(M + 32) * K, es);
    float *b = af_malloc(sizeof(float) * K * N), *c = af_malloc(sizeof(float) * M * N);
    float *scale = af_malloc(sizeof(float) * N);
    int8_t *b8 = af_malloc((size_t)K * N);
    void *p = af_malloc(af_gemm_packed_bytes(t, K, N));
    double best = 0.0;
    if (a && b && c && p && scale && b8) {
        for (int i = 0; i < M * K; i++) {
            float v = (float)(i % 7) * 0.1f;
            if (t == AF_GEMM_BF16) ((uint16_t *)a)[i] = af_float_to_bf16(v);
            else if (t == AF_GEMM_U8S8) ((uint8_t *)a)[i] = (uint8_t)(i % 251);
            else ((float *)a)[i] = v;
        }
        for (int i = 0; i < K * N; i++) {
            b[i] = (float)(i % 5) * 0.1f;
            b8[i] = (int8_t)(w7 ? i % 127 - 63 : i % 253 - 126);
        }
        for (int i = 0; i < N; i++) scale[i] = 1e-4f;
        if (t == AF_GEMM_U8S8) af_gemm_pack_u8s8(b8, K, N, N, 1, p);
        else af_gemm_pack_type(t, b, K, N, N, 1, p);
        static const int64_t tap0[1] = {0};
        af_gemm g = {a, 1, M, 0, K, tap0, 1, K, p, N, c, N, NULL, 0, 0, t, NULL, NULL, 0, 0, 0, scale, 3, w7};
        double start = now();
        for (int rep = 0; rep < 400 && (rep < 5 || now() - start < 0.1); rep++) {
            double t0 = now();
            af_gemm_run(NULL, &g);
            double dt = now() - t0;
            if (dt > 0.0 && 2.0 * M * N * K / dt > best) best = 2.0 * M * N * K / dt;
        }
    }
    af_free(a);
    af_free(b);
    af_free(c);
    af_free(p);
    af_free(scale);
    af_free(b8);
    return best;
}

/* The third fastest of 9 probes of a 2-thread worker set: a parallel loop's round trip through
 * a worker that is spinning, and through one that is asleep. Near the fastest, because anything
 * else on the machine only adds to a latency (a median taken under load once recorded 4 ms),
 * but not a single lucky one. */
static void measure_handoff(double *spin_ns, double *wake_ns) {
    *spin_ns = 1500, *wake_ns = 30000;
    af_workers *w;
    if (af_workers_new(2, NULL, &w, NULL) != AF_OK) return;
    for (int asleep = 0; asleep < 2; asleep++) {
        int64_t v[9];
        for (int i = 0; i < 9; i++) {
            v[i] = af_workers_probe(w, asleep);
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                int64_t t = v[j];
                v[j] = v[j - 1], v[j - 1] = t;
            }
        }
        *(asleep ? wake_ns : spin_ns) = (double)v[2];
    }
    af_workers_free(w);
}

/* ---- the cache file ------------------------------------------------------------------------ */

const char *af_machine_path(char *buf, size_t len) {
    const char *env = getenv("AUTOFUSION_MACHINE_FILE"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env && *env) n = snprintf(buf, len, "%s", env);
    else if (xdg && xdg[0] == '/') n = snprintf(buf, len, "%s/autofusion/machine.json", xdg);
    else if (home && *home) n = snprintf(buf, len, "%s/.cache/autofusion/machine.json", home);
    else return NULL;
    return n > 0 && (size_t)n < len ? buf : NULL;
}

static bool sane(double v, double lo, double hi) {
    return isfinite(v) && v >= lo && v <= hi;
}

static double num(json_t *root, const char *key) {
    return json_number_value(json_object_get(root, key));
}

/* The file's format version: a file of another version is measured again (8: the bandwidths
 * through af_copy; 9: the int8 rate on CPUs without VNNI, with 7-bit weights; 10: the load
 * during the measurement, so that a record taken on a busy machine is taken again). */
#define MACHINE_VERSION 10

/* A calibration while other work keeps more than LOADED_CORES cores busy is provisional: on
 * these 2-vCPU machines the other vCPU can be the same core's SMT sibling, and a record taken
 * beside a model export held 163 GFLOP/s for the GEMM core (278 quiet) and a 37 us hand-off
 * (1.2 us quiet), which kept nearly every loop of the small convnets serial at 2 threads
 * (MobileNet-V3-Small 1.46x ONNX Runtime, 0.98x after a quiet calibration) and stayed so until
 * the file was deleted. A process that finds a provisional record at least REMEASURE_S old
 * measures again and keeps the best of each figure (other tenants only ever slow a measurement
 * down), until one measurement is quiet. The wait keeps a lasting load (a parallel build, a
 * test suite) from re-measuring in every process, and spreads the measurements over time, so
 * that one transient load does not spoil them all. */
#define LOADED_CORES 0.3
#define REMEASURE_S 60

/* The file holds one record per ISA ({"version": 9, "avx512": {...}, "avx2": {...}}), so that
 * runs on different ISAs (the tests' AUTOFUSION_ISA variants) do not evict each other's. Load
 * the record of the kernels' ISA now in force. */
static bool load(const char *path, af_machine *m) {
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return false;
    const char *isa = af_isa_name(af_isa_get());
    json_t *r = json_integer_value(json_object_get(root, "version")) == MACHINE_VERSION
                    ? json_object_get(root, isa) : NULL;
    double gf = num(r, "peak_gflops"), gg = num(r, "gemm_gflops"), bw = num(r, "bandwidth_gbs");
    double b2 = num(r, "l2_bandwidth_gbs"), b3 = num(r, "l3_bandwidth_gbs"), l2 = num(r, "l2_bytes");
    double ho = num(r, "handoff_us"), wk = num(r, "wake_us"), gb = num(r, "gemm_bf16_gflops");
    double gi = num(r, "gemm_int8_gops"), busy = num(r, "busy_cores"), at = num(r, "measured_at");
    json_int_t runs = json_integer_value(json_object_get(r, "measurements"));
    bool ok = r && sane(gf, 0.01, 1e6) && sane(gg, 0.01, 1e6) && sane(bw, 0.01, 1e5) &&
              sane(b2, 0.01, 1e5) && sane(b3, 0.01, 1e5) && sane(l2, 1024, 1e10) &&
              sane(ho, 0.0, 1e5) && sane(wk, 0.0, 1e5) && sane(gb, 0.0, 1e6) && sane(gi, 0.0, 1e6) &&
              sane(busy, 0.0, 1e4) && sane(at, 0.0, 1e12) && runs >= 1 && runs <= INT32_MAX;
    if (ok) {
        m->flops = gf * 1e9;
        m->gemm_flops = gg * 1e9;
        m->gemm_bf16_flops = gb * 1e9;
        m->gemm_int8_ops = gi * 1e9;
        m->bandwidth = bw * 1e9;
        m->l2_bandwidth = b2 * 1e9;
        m->l3_bandwidth = b3 * 1e9;
        m->l2_bytes = l2;
        m->handoff_ns = ho * 1e3;
        m->wake_ns = wk * 1e3;
        m->busy_cores = busy;
        m->measurements = (int)runs;
        m->measured_at = at;
        snprintf(m->isa, sizeof m->isa, "%s", isa);
    }
    json_decref(root);
    return ok;
}

/* mkdir -p of path's folder. */
static void make_parents(const char *path) {
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s", path);
    if (n <= 0 || (size_t)n >= sizeof dir) return;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) return;
        *p = '/';
    }
}

/* m's record into the file (the other ISAs' records kept), written atomically (temporary file,
 * then rename); failures only mean the next run measures. */
static void store(const char *path, const af_machine *m) {
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root || !json_is_object(root) ||
        json_integer_value(json_object_get(root, "version")) != MACHINE_VERSION) {
        json_decref(root);
        root = json_pack("{s:i}", "version", MACHINE_VERSION);
    }
    json_t *r = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:f}",
                          "peak_gflops",
                          m->flops / 1e9, "gemm_gflops", m->gemm_flops / 1e9, "gemm_bf16_gflops",
                          m->gemm_bf16_flops / 1e9, "gemm_int8_gops", m->gemm_int8_ops / 1e9,
                          "bandwidth_gbs", m->bandwidth / 1e9,
                          "l2_bandwidth_gbs", m->l2_bandwidth / 1e9,
                          "l3_bandwidth_gbs", m->l3_bandwidth / 1e9, "l2_bytes", m->l2_bytes,
                          "handoff_us", m->handoff_ns / 1e3, "wake_us", m->wake_ns / 1e3,
                          "busy_cores", m->busy_cores, "measurements", m->measurements,
                          "measured_at", m->measured_at);
    if (!root || !r || json_object_set_new(root, m->isa, r)) {
        json_decref(root);
        return;
    }
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (n > 0 && (size_t)n < sizeof tmp) {
        make_parents(path);
        if (json_dump_file(root, tmp, JSON_INDENT(2)) == 0 && rename(tmp, path) != 0)
            unlink(tmp);
    }
    json_decref(root);
}

/* Seconds of CPU time the whole machine has spent busy (every CPU, /proc/stat) and this process
 * (every thread); false where /proc/stat cannot be read. */
static bool cpu_seconds(double *machine, double *own) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec ts;
    if (n < 4 || hz <= 0 || clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return false;
    /* user, nice, system, then (idle, iowait), irq, softirq, steal */
    *machine = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz;
    *own = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return true;
}

/* Every rate of the current ISA, and the cores other work kept busy meanwhile. */
static void measure(af_machine *m) {
    memset(m, 0, sizeof *m);
    double busy0, own0, busy1, own1, t0 = now();
    bool loadable = cpu_seconds(&busy0, &own0);
    fma_loop l = pick_loop();
    m->flops = measure_flops(&l);
    if (!(m->flops > 0.0)) m->flops = 1e9;
    m->gemm_flops = measure_gemm(AF_GEMM_F32, 0);
    if (af_cpu_amx() || af_cpu_bf16()) m->gemm_bf16_flops = measure_gemm(AF_GEMM_BF16, 0);
    /* int8 on VPDPBUSD; elsewhere the 7-bit weights' VPMADDUBSW path (lower/int8.c), or on
     * the generic ISA the widened bytes, which never pay */
    m->gemm_int8_ops = measure_gemm(AF_GEMM_U8S8, !af_cpu_vnni());
    if (!(m->gemm_flops > 0.0) || m->gemm_flops > m->flops) m->gemm_flops = m->flops;
    m->l2_bytes = (double)af_cpu_l2();
    m->bandwidth = measure_bandwidth((size_t)64 << 20);
    m->l2_bandwidth = measure_bandwidth(af_cpu_l2() / 4); /* two buffers inside L2 */
    m->l3_bandwidth = measure_bandwidth(af_cpu_l2() * 4);
    measure_handoff(&m->handoff_ns, &m->wake_ns);
    double dt = now() - t0;
    if (loadable && cpu_seconds(&busy1, &own1) && dt > 0.0) {
        double other = ((busy1 - busy0) - (own1 - own0)) / dt;
        m->busy_cores = other > 0.0 ? other : 0.0;
    }
    m->measurements = 1;
    m->measured_at = (double)time(NULL);
    snprintf(m->isa, sizeof m->isa, "%s", af_isa_name(af_isa_get()));
}

static double max2(double a, double b) { return a > b ? a : b; }
static double min2(double a, double b) { return a < b ? a : b; }

/* The best of two measurements of one machine: the higher rates, the shorter latencies. */
static void merge(af_machine *m, const af_machine *f) {
    m->flops = max2(m->flops, f->flops);
    m->gemm_flops = min2(max2(m->gemm_flops, f->gemm_flops), m->flops);
    m->gemm_bf16_flops = max2(m->gemm_bf16_flops, f->gemm_bf16_flops);
    m->gemm_int8_ops = max2(m->gemm_int8_ops, f->gemm_int8_ops);
    m->bandwidth = max2(m->bandwidth, f->bandwidth);
    m->l2_bandwidth = max2(m->l2_bandwidth, f->l2_bandwidth);
    m->l3_bandwidth = max2(m->l3_bandwidth, f->l3_bandwidth);
    m->handoff_ns = min2(m->handoff_ns, f->handoff_ns);
    m->wake_ns = min2(m->wake_ns, f->wake_ns);
    m->busy_cores = min2(m->busy_cores, f->busy_cores);
    m->measurements++;
    m->measured_at = f->measured_at;
}

af_status af_machine_calibrate(const char *path, af_machine *m, af_error *err) {
    (void)err;
    char buf[4096];
    if (!path) path = af_machine_path(buf, sizeof buf);
    memset(m, 0, sizeof *m);
    bool cached = path && load(path, m);
    if (cached && (m->busy_cores <= LOADED_CORES || (double)time(NULL) - m->measured_at < REMEASURE_S))
        return AF_OK;
    af_machine fresh;
    measure(&fresh);
    if (cached) merge(m, &fresh);
    else *m = fresh;
    if (path) store(path, m);
    return AF_OK;
}

static af_machine machine;
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;

static void machine_init(void) {
    af_machine_calibrate(NULL, &machine, NULL);
}

const af_machine *af_machine_get(void) {
    pthread_once(&machine_once, machine_init);
    return &machine;
}

