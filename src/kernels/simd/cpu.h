/* The CPU the kernels run on: which instruction set the vector kernels use (chosen at run time
 * from cpuinfo, never at build time), the cache sizes the GEMM blocks for, and the core count.
 *
 * Invariant: af_isa_get() never returns an ISA the CPU lacks. AUTOFUSION_ISA (or af_isa_set)
 * may only lower it: "avx512", "avx2", "generic" (portable vector C, no ISA extension) or
 * "reference" (the plain reference kernels: no lowering pass, no fast paths), so the tests and
 * users can run the slower paths on a fast machine. */
#ifndef AF_KERNELS_CPU_H
#define AF_KERNELS_CPU_H

#include <stddef.h>

typedef enum af_isa {
    AF_ISA_REFERENCE = 0, /* reference kernels only (double accumulation, no layout changes) */
    AF_ISA_GENERIC = 1,   /* vector kernels in portable C (4-lane vectors, baseline x86-64) */
    AF_ISA_AVX2 = 2,      /* AVX2 + FMA, 8 lanes */
    AF_ISA_AVX512 = 3     /* AVX-512 F/BW/VL/DQ + FMA, 16 lanes */
} af_isa;

/* The best ISA this CPU supports. */
af_isa af_isa_best(void);
/* The ISA in force: the best one, lowered by AUTOFUSION_ISA or af_isa_set. */
af_isa af_isa_get(void);
/* Force an ISA (clamped to af_isa_best); returns the one in force. For tests and benchmarks. */
af_isa af_isa_set(af_isa isa);
/* "reference", "generic", "avx2", "avx512". */
const char *af_isa_name(af_isa isa);
/* Parse a name as above; -1 when unknown. */
int af_isa_parse(const char *name);

/* The CPU has the AVX512_BF16 dot product, the ISA in force is AVX-512, and AUTOFUSION_BF16 is
 * not "0" (which makes the BF16 kernels widen to float32 instead, for tests). */
int af_cpu_bf16(void);

/* The CPU has AVX512_VNNI (VPDPBUSD, the U8S8 GEMM's dot product), the ISA in force is AVX-512,
 * and AUTOFUSION_VNNI is not "0" (which makes the lowering run quantized ops in float32). */
int af_cpu_vnni(void);

/* AMX-BF16 tiles usable (kernels/gemm_amx.c), the ISA in force is AVX-512, and AUTOFUSION_AMX
 * is not "0": BF16 GEMMs then run on AMX. */
int af_cpu_amx(void);

/* Per-core data cache sizes in bytes (conservative defaults when cpuinfo cannot tell). */
size_t af_cpu_l1d(void);
size_t af_cpu_l2(void);
/* Physical cores (at least 1). */
int af_cpu_cores(void);

#endif
