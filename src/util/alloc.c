/* Every heap allocation of the library goes through here (util.h: af_malloc and its kin), so
 * that a test can make the n-th one fail and check that the failure is a clean error: SQLite's
 * fault injection. Invariant: with no fault armed, these are the C library's functions plus
 * one relaxed atomic increment. */
#include "util/util.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <stdatomic.h>
#include <sys/mman.h>

static _Atomic int64_t counted; /* allocations since the last af_alloc_fault */
static _Atomic int64_t fail_at; /* 0: none armed, else the allocation number that fails */
static _Atomic bool fail_after; /* every allocation from fail_at on fails too */
static _Atomic bool paused;     /* neither counted nor failed */

void af_alloc_fault(int64_t nth, bool persistent) {
    atomic_store(&counted, 0);
    atomic_store(&fail_after, persistent);
    atomic_store(&fail_at, nth > 0 ? nth : 0);
}

int64_t af_alloc_count(void) { return atomic_load(&counted); }

void af_alloc_pause(bool on) { atomic_store(&paused, on); }

/* True when this allocation is to fail. */
static bool injected(void) {
    if (atomic_load_explicit(&paused, memory_order_relaxed)) return false;
    int64_t at = atomic_load_explicit(&fail_at, memory_order_relaxed);
    int64_t k = atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed) + 1;
    return at && (k == at || (k > at && atomic_load(&fail_after)));
}

void *af_malloc(size_t bytes) { return injected() ? NULL : malloc(bytes ? bytes : 1); }

void *af_calloc(size_t n, size_t size) {
    return injected() ? NULL : calloc(n ? n : 1, size ? size : 1);
}

void *af_realloc(void *p, size_t bytes) {
    return injected() ? NULL : realloc(p, bytes ? bytes : 1);
}

void af_free(void *p) { free(p); }

char *af_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = af_malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

void *af_alloc_pages(size_t bytes) {
    if (injected()) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (bytes >= ((size_t)2 << 20)) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void af_free_pages(void *p, size_t bytes) {
    if (p) munmap(p, bytes);
}

void af_heap_trim(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

void *af_alloc_big(size_t bytes) {
    if (injected()) return NULL;
    const size_t huge = (size_t)2 << 20;
    if (bytes >= huge) {
        size_t n = (bytes + huge - 1) & ~(huge - 1);
        void *p = aligned_alloc(huge, n);
        if (p) madvise(p, n, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages still work */
        return p;
    }
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}
