/* GEMM side by side with OpenBLAS in one process: autofusion's af_gemm_run (B packed once, as
 * constant weights are at compile time) against cblas_sgemm on the same row-major operands, on
 * convolution and transformer shapes, single thread unless --threads=N.
 *
 *   build/bench/gemm_bench [--threads=N] [--reps=N] [--isa=avx512|avx2|generic] [--cold]
 *                          [--type=f32|f16|bf16|u8s8|u8s7] [--shape=M,N,K]
 *
 * --cold gives every run its own copy of B (and of the packed B), cycling through 512 MB of
 * them, so the weights come from memory as they do in a model larger than the caches.
 *
 * Each shape runs `reps` times alternating the two libraries; the table gives the best and the
 * median time of each as GFLOP/s and the ratio of medians (OpenBLAS / ours: > 1 means faster).
 * Outputs are compared (max abs difference relative to the largest output). --type runs our side
 * in half-precision B or bfloat16 A and B (--precision_mode's GEMMs; A converted before timing,
 * as B is packed before it), or in int8 (u8s8: A as uint8 codes of scale 1/254 and zero point 128,
 * B as int8 of scale 1/254: the int8 form's GEMM, its error that of 8-bit operands; u8s7: the
 * same with B's weights within [-63, 63], scale 1/126, and af_gemm.w7 set: VPMADDUBSW's exact
 * path on CPUs without VNNI), OpenBLAS in float32. */
#include "kernels/simd/cpu.h"
#include "kernels/fast/gemm.h"
#include "runtime/exec.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct job {
    af_gemm g;
} job;

static void run(af_exec *x, void *ctx) { af_gemm_run(x, &((job *)ctx)->g); }

int main(int argc, char **argv) {
    int threads = 1, reps = 30, cold = 0, one[3] = {0, 0, 0}, w7 = 0;
    af_gemm_type type = AF_GEMM_F32;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--threads=", 10)) threads = atoi(argv[i] + 10);
        else if (!strncmp(argv[i], "--reps=", 7)) reps = atoi(argv[i] + 7);
        else if (!strcmp(argv[i], "--cold")) cold = 1;
        else if (!strncmp(argv[i], "--shape=", 8) &&
                 sscanf(argv[i] + 8, "%d,%d,%d", &one[0], &one[1], &one[2]) == 3 && one[0] > 0 &&
                 one[1] > 0 && one[2] > 0)
            continue; /* only this shape */
        else if (!strcmp(argv[i], "--type=f16")) type = AF_GEMM_F16;
        else if (!strcmp(argv[i], "--type=bf16")) type = AF_GEMM_BF16;
        else if (!strcmp(argv[i], "--type=f32")) type = AF_GEMM_F32;
        else if (!strcmp(argv[i], "--type=u8s8")) type = AF_GEMM_U8S8;
        else if (!strcmp(argv[i], "--type=u8s7")) type = AF_GEMM_U8S8, w7 = 1;
        else if (!strncmp(argv[i], "--isa=", 6)) {
            int isa = af_isa_parse(argv[i] + 6);
            if (isa < AF_ISA_GENERIC) {
                fprintf(stderr, "gemm_bench: unknown ISA '%s'\n", argv[i] + 6);
                return 2;
            }
            af_isa_set((af_isa)isa);
        } else {
            fprintf(stderr, "usage: gemm_bench [--threads=N] [--reps=N] [--isa=NAME] [--cold] "
                            "[--type=f32|f16|bf16|u8s8|u8s7] [--shape=M,N,K]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    openblas_set_num_threads(threads);
    af_runtime *rt = NULL;
    af_error err;
    if (threads > 1 && af_runtime_new(threads, &rt, &err)) {
        fprintf(stderr, "gemm_bench: %s\n", err.message);
        return 1;
    }
    /* The shapes (conv layers as Cout x spatial x K, transformer projections) and the
     * conv layers as our NHWC convolution runs them (spatial x Cout x K). */
    static const int shapes[][3] = {{64, 3136, 576},  {256, 784, 1152}, {512, 196, 2304},
                                    {128, 768, 768},  {128, 3072, 768}, {197, 2304, 768},
                                    {3136, 64, 576},  {784, 256, 1152}, {196, 512, 2304},
                                    {128, 2304, 768}, {197, 768, 3072}, {49, 2048, 512}};
    static const char *const tnames[] = {"f32", "f16", "bf16", "u8s8"};
    printf("ISA %s, %s GEMM, %d thread(s), %d runs each, B %s; %s\n", af_isa_name(af_isa_get()),
           tnames[type], threads, reps, cold ? "from memory (--cold)" : "in cache",
           openblas_get_config());
    printf("| M | N | K | ours GFLOP/s (best/median) | OpenBLAS GFLOP/s (best/median) | OpenBLAS / ours (median time) | max rel diff |\n");
    printf("|--:|--:|--:|--:|--:|--:|--:|\n");
    size_t nshapes = one[0] ? 1 : sizeof shapes / sizeof shapes[0];
    for (size_t s = 0; s < nshapes; s++) {
        const int *sh = one[0] ? one : shapes[s];
        int M = sh[0], N = sh[1], K = sh[2];
        size_t bfl = (size_t)K * N, pfl = af_gemm_packed_bytes(type, K, N) / sizeof(float);
        int copies = cold ? (int)((256u << 20) / (bfl * sizeof(float))) + 1 : 1;
        float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * bfl * (size_t)copies);
        float *C1 = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
        /* 64-byte aligned, as the runtime keeps packed weights: B rows are whole lines */
        float *P = aligned_alloc(64, (sizeof(float) * pfl * (size_t)copies + 63) / 64 * 64);
        double *t1 = malloc(sizeof(double) * (size_t)reps), *t2 = malloc(sizeof(double) * (size_t)reps);
        uint16_t *A16 = malloc(sizeof(uint16_t) * (size_t)M * K);
        if (!A || !B || !C1 || !C2 || !P || !t1 || !t2 || !A16) return 1;
        srand(1);
        for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t i = 0; i < bfl; i++) B[i] = (float)rand() / RAND_MAX - 0.5f;
        for (int c = 1; c < copies; c++) memcpy(B + bfl * (size_t)c, B, bfl * sizeof(float));
        /* u8s8: K rounded up to 4 (zero rows of B, zero-point bytes of A) */
        int64_t kq = type == AF_GEMM_U8S8 ? af_gemm_u8s8_k(K) : K;
        uint8_t *A8 = malloc((size_t)M * (size_t)kq + 1);
        int8_t *B8 = malloc(bfl + 1);
        float *scale = malloc(sizeof(float) * (size_t)N);
        if (!A8 || !B8 || !scale) return 1;
        float wq = w7 ? 126.0f : 254.0f; /* B in [-0.5, 0.5]: codes within +-63 or +-127 */
        for (size_t i = 0; i < bfl; i++) B8[i] = (int8_t)lrintf(B[i] * wq);
        for (int i = 0; i < N; i++) scale[i] = 1.0f / (254.0f * wq);
        for (int m = 0; m < M; m++) {
            af_vec()->to_u8(A + (size_t)m * K, A8 + (size_t)m * kq, K, 1.0f / 254.0f, 128);
            memset(A8 + (size_t)m * kq + K, 128, (size_t)(kq - K));
        }
        for (int c = 0; c < copies; c++) {
            if (type == AF_GEMM_U8S8)
                af_gemm_pack_u8s8(B8, K, N, N, 1, (char *)P + af_gemm_packed_bytes(type, K, N) * (size_t)c);
            else
                af_gemm_pack_type(type, B + bfl * (size_t)c, K, N, N, 1, P + pfl * (size_t)c);
        }
        af_vec()->to_bf16(A, A16, (int64_t)M * K);
        static const int64_t tap0[1] = {0};
        job j = {{type == AF_GEMM_BF16 ? (const void *)A16 : type == AF_GEMM_U8S8 ? (const void *)A8 : (const void *)A,
                  1, M, 0, kq, tap0, 1, kq, P, N, C1, N, NULL, 0, 0, type, NULL, NULL, 0, 0, 0, scale, 128, w7}};
        for (int w = 0; w < 2; w++) { /* warm-up */
            af_runtime_call(rt, run, &j);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C2, N);
        }
        for (int r = 0; r < reps; r++) {
            int c = r % copies;
            j.g.b = type == AF_GEMM_U8S8 ? (const void *)((char *)P + af_gemm_packed_bytes(type, K, N) * (size_t)c)
                                         : (const void *)(P + pfl * (size_t)c);
            double t = now();
            af_runtime_call(rt, run, &j);
            t1[r] = now() - t;
            t = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K,
                        B + bfl * (size_t)c, N, 0.0f, C2, N);
            t2[r] = now() - t;
        }
        qsort(t1, (size_t)reps, sizeof(double), cmp);
        qsort(t2, (size_t)reps, sizeof(double), cmp);
        double md = 0, mx = 0;
        for (size_t i = 0; i < (size_t)M * N; i++) {
            md = fmax(md, fabs((double)C1[i] - C2[i]));
            mx = fmax(mx, fabs((double)C2[i]));
        }
        double fl = 2.0 * M * N * K / 1e9, m1 = t1[reps / 2], m2 = t2[reps / 2];
        printf("| %d | %d | %d | %.1f / %.1f | %.1f / %.1f | %.2f | %.1e |\n", M, N, K, fl / t1[0],
               fl / m1, fl / t2[0], fl / m2, m2 / m1, mx > 0 ? md / mx : md);
        free(A), free(B), free(C1), free(C2), free(P), free(t1), free(t2), free(A16);
        free(A8), free(B8), free(scale);
    }
    af_runtime_free(rt);
    return 0;
}
