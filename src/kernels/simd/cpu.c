/* CPU features, caches and cores from cpuinfo (see cpu.h), read once per process.
 *
 * Invariant: the ISA in force is never above what this CPU supports. */
#include "kernels/simd/cpu.h"
#include "kernels/simd/amx.h"
#include "kernels/simd/vec.h"

#include <cpuinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    af_isa best;
    int bf16;    /* AVX512_BF16, and not switched off by AUTOFUSION_BF16=0 */
    int vnni;    /* AVX512_VNNI, and not switched off by AUTOFUSION_VNNI=0 */
    int amx_off; /* AUTOFUSION_AMX=0 */
    size_t l1d, l2;
    int cores;
    atomic_int isa; /* the ISA in force */
} cpu;

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static const char *const isa_names[] = {"reference", "generic", "avx2", "avx512"};

int af_isa_parse(const char *name) {
    for (int i = 0; i < (int)(sizeof isa_names / sizeof isa_names[0]); i++)
        if (!strcmp(name, isa_names[i])) return i;
    return -1;
}

const char *af_isa_name(af_isa isa) {
    return (unsigned)isa < sizeof isa_names / sizeof isa_names[0] ? isa_names[isa] : "?";
}

static void cpu_init(void) {
    cpu.best = AF_ISA_GENERIC;
    cpu.l1d = 32 << 10;
    cpu.l2 = 1 << 20;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpu.cores = n > 0 ? (int)n : 1;
    if (cpuinfo_initialize()) {
        if (cpuinfo_has_x86_avx512f() && cpuinfo_has_x86_avx512bw() && cpuinfo_has_x86_avx512vl() &&
            cpuinfo_has_x86_avx512dq() && cpuinfo_has_x86_fma3())
            cpu.best = AF_ISA_AVX512;
        else if (cpuinfo_has_x86_avx2() && cpuinfo_has_x86_fma3())
            cpu.best = AF_ISA_AVX2;
        const char *bf = getenv("AUTOFUSION_BF16"), *amx = getenv("AUTOFUSION_AMX");
        cpu.amx_off = amx && !strcmp(amx, "0");
        cpu.bf16 = cpuinfo_has_x86_avx512bf16() && !(bf && !strcmp(bf, "0"));
        const char *vn = getenv("AUTOFUSION_VNNI");
        cpu.vnni = cpuinfo_has_x86_avx512vnni() && !(vn && !strcmp(vn, "0"));
        const struct cpuinfo_cache *l1 = cpuinfo_get_l1d_cache(0), *l2 = cpuinfo_get_l2_cache(0);
        /* A cache shared by several cores counts for its share only. */
        if (l1 && l1->size) cpu.l1d = l1->size;
        if (l2 && l2->size) {
            uint32_t sharing = l2->processor_count ? l2->processor_count : 1;
            const struct cpuinfo_core *c = cpuinfo_get_core(0);
            uint32_t per_core = c && c->processor_count ? c->processor_count : 1;
            cpu.l2 = l2->size / (sharing / per_core ? sharing / per_core : 1);
        }
        if (cpuinfo_get_cores_count() > 0) cpu.cores = (int)cpuinfo_get_cores_count();
    }
    af_isa isa = cpu.best;
    const char *env = getenv("AUTOFUSION_ISA");
    if (env && *env) {
        int want = af_isa_parse(env);
        if (want < 0)
            fprintf(stderr, "autofusion: AUTOFUSION_ISA='%s' is not one of reference, generic, "
                            "avx2, avx512; using %s\n", env, isa_names[isa]);
        else if ((af_isa)want < isa)
            isa = (af_isa)want;
    }
    atomic_store(&cpu.isa, (int)isa);
}

af_isa af_isa_best(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu.best;
}

af_isa af_isa_get(void) {
    pthread_once(&cpu_once, cpu_init);
    return (af_isa)atomic_load(&cpu.isa);
}

af_isa af_isa_set(af_isa isa) {
    pthread_once(&cpu_once, cpu_init);
    if (isa > cpu.best) isa = cpu.best;
    if (isa < AF_ISA_REFERENCE) isa = AF_ISA_REFERENCE;
    atomic_store(&cpu.isa, (int)isa);
    return isa;
}

int af_amx_available(void); /* kernels/gemm_amx.c */

int af_cpu_amx(void) {
    return af_isa_get() == AF_ISA_AVX512 && !cpu.amx_off && af_amx_available();
}

int af_cpu_bf16(void) {
    return af_isa_get() == AF_ISA_AVX512 && cpu.bf16;
}

int af_cpu_vnni(void) {
    return af_isa_get() == AF_ISA_AVX512 && cpu.vnni;
}

size_t af_cpu_l1d(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu.l1d;
}

size_t af_cpu_l2(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu.l2;
}

int af_cpu_cores(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu.cores;
}

const af_vec_ops *af_vec(void) {
    switch (af_isa_get()) {
    /* The bfloat16 table carries the VNNI kernels too (every AVX512_BF16 CPU has VNNI; with
     * AUTOFUSION_VNNI=0 its U8S8 kernels still compute the same sums). */
    case AF_ISA_AVX512:
        return af_cpu_bf16()   ? &af_vec_avx512bf16
               : af_cpu_vnni() ? &af_vec_avx512vnni
                               : &af_vec_avx512;
    case AF_ISA_AVX2: return &af_vec_avx2;
    default: return &af_vec_generic;
    }
}
