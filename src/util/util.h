/* Small shared helpers: the arena, overflow-checked arithmetic, assertions, half floats.
 *
 * Invariant: nothing here knows the IR; every layer may use it. */
#ifndef AF_UTIL_H
#define AF_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Our own bugs: always on, never used for anything read from a file. */
#define AF_ASSERT(c)                                                                        \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "autofusion: internal error at %s:%d: %s\n", __FILE__, __LINE__, \
                    #c);                                                                    \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#define AF_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* A bump allocator: everything allocated from it is released by af_arena_free at once. */
typedef struct af_arena af_arena;
af_arena *af_arena_new(void);
void af_arena_free(af_arena *a);
/* Zeroed, 16-byte aligned memory; NULL when out of memory or size overflows. */
void *af_arena_alloc(af_arena *a, size_t size);
void *af_arena_calloc(af_arena *a, size_t n, size_t size);
/* NUL-terminated copy of len bytes. */
char *af_arena_strndup(af_arena *a, const char *s, size_t len);
char *af_arena_strdup(af_arena *a, const char *s);
/* Grow an arena array of elements of `size` bytes to hold at least `need` (old copy is left). */
bool af_arena_grow(af_arena *a, void **arr, int *cap, int need, size_t size);
/* Memory for a constant's data, as af_arena_alloc; a large one gets a block of its own, which
 * af_arena_sweep_data may free once no constant uses it. */
void *af_arena_alloc_data(af_arena *a, size_t size);
/* Free every data block of af_arena_alloc_data that none of the `n` pointers `live` points
 * into (the data of the constants still in use); returns the bytes freed. */
size_t af_arena_sweep_data(af_arena *a, const void *const *live, size_t n);

/* ---- the heap (alloc.c) ----------------------------------------------------------------------
 * Every heap allocation of the library goes through these, never malloc and its kin directly,
 * so that tests can inject failures. Zero-byte requests return a unique pointer. */
void *af_malloc(size_t bytes);
void *af_calloc(size_t n, size_t size);
void *af_realloc(void *p, size_t bytes);
void af_free(void *p);
char *af_strdup(const char *s);
/* Memory for big buffers (arena blocks, the run arena, kernel scratch): 64-byte aligned; from
 * 2 MiB on, 2 MiB aligned with the transparent-huge-page hint (fewer TLB misses while weights
 * stream). Release with af_free(). NULL when out of memory. */
void *af_alloc_big(size_t bytes);
/* Zeroed pages of their own (mmap), page-aligned, for memory that must go back to the system
 * the moment it is freed (af_free_pages with the same size): a constant's data. */
void *af_alloc_pages(size_t bytes);
void af_free_pages(void *p, size_t bytes);
/* Hand the heap's free pages back to the system (after freeing much at once: a compile's
 * replaced constants, a session): the C library otherwise keeps them for later requests. The
 * tensor buffers af_buffer_free kept go too. */
void af_heap_trim(void);
/* Tensor data (af_tensor_alloc, af_tensor_release): zeroed like af_calloc; af_buffer_free
 * keeps up to AF_BUFFER_SLOTS buffers of 128 KiB or more (256 MiB in all) for the next
 * af_buffer_alloc of a size they fit, and frees the rest. Any buffer of the af_malloc family
 * may be given to af_buffer_free. */
#define AF_BUFFER_SLOTS 32
void *af_buffer_alloc(size_t bytes);
void af_buffer_free(void *p);
/* Fault injection, for tests: the nth allocation from now fails (and, when persistent, every
 * one after it); nth <= 0 disarms. af_alloc_count() is the number of allocations since the last
 * af_alloc_fault call, so a test can count a run's allocations and then fail each in turn. */
void af_alloc_fault(int64_t nth, bool persistent);
int64_t af_alloc_count(void);
/* While paused, allocations are neither counted nor failed (a test's own, between the
 * library's). */
void af_alloc_pause(bool on);

/* Overflow-checked helpers: return false on overflow. */
static inline bool af_mul_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool af_add_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}
static inline bool af_mul_size(size_t a, size_t b, size_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}

/* IEEE half and bfloat16 conversions (scalar, exact rounding to nearest even). */
float af_half_to_float(uint16_t h);
uint16_t af_float_to_half(float f);
float af_bf16_to_float(uint16_t h);
uint16_t af_float_to_bf16(float f);

/* write(2) all n bytes (retrying short writes and EINTR); false on error (errno set). */
bool af_write_all(int fd, const void *p, size_t n);
/* Create `path` atomically: `fill` writes the contents to a new file next to it, which is
 * synced and renamed into place, so a failure never leaves a partial file. Returns 0, or an
 * errno value; *created tells whether the temporary file could be made at all. */
int af_write_atomic(const char *path, bool (*fill)(int fd, const void *ctx), const void *ctx,
                    bool *created);

/* Read a whole file (for small inputs: .npy, .pb). Caller frees *data. */
int af_read_file(const char *path, unsigned char **data, size_t *len);

/* memcpy for the kernels' bulk copies. glibc's memcpy moves 4 KiB and more with REP MOVSB on
 * CPUs with FSRM, and on AMD Zen 3 that runs at 5-6 GB/s instead of about 100 when the
 * destination starts 1 to 31 bytes after the source modulo 4 KiB (the loads wait on the
 * stores they seem to alias), which a row copy into a padded or offset tensor often does.
 * Such copies run backwards in 64-byte pieces (util.c), the others go to memcpy unchanged.
 * Measured on an AMD EPYC (Zen 3) with glibc 2.36: BENCHMARKS.md. */
void af_copy(void *dst, const void *src, size_t n);

#endif
