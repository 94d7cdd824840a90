/* Every heap allocation of the library goes through here (util.h: af_malloc and its kin), so
 * that a test can make the n-th one fail and check that the failure is a clean error: SQLite's
 * fault injection. Invariant: with no fault armed, these are the C library's functions plus
 * one relaxed atomic increment. */
#include "util/util.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
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

/* A run's outputs are allocated during the run and freed by its caller after it. Freed, the
 * C library gave the top of its heap back to the system (its trim threshold follows the largest
 * block it has mapped), so every run faulted those pages in again: a GPT-2 step with 5 MB of
 * logits and present keys and values took 1400 page faults a run, 7% of its time
 * (MALLOC_TRIM_THRESHOLD_ set high: 40.0 -> 37.3 ms). The buffers are kept here instead, and
 * the next request of a size one fits (within a quarter over) takes it, zeroed in place. */
#define BUFFER_MIN ((size_t)128 << 10)
#define BUFFER_TOTAL ((size_t)256 << 20)

static struct {
    pthread_mutex_t mu;
    int n;
    void *p[AF_BUFFER_SLOTS]; /* oldest first */
    size_t size[AF_BUFFER_SLOTS], total;
} kept = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, 0};

static void kept_remove(int i) {
    kept.total -= kept.size[i];
    kept.n--;
    memmove(kept.p + i, kept.p + i + 1, sizeof(void *) * (size_t)(kept.n - i));
    memmove(kept.size + i, kept.size + i + 1, sizeof(size_t) * (size_t)(kept.n - i));
}

void *af_buffer_alloc(size_t bytes) {
#ifdef __GLIBC__
    if (bytes >= BUFFER_MIN) {
        if (injected()) return NULL;
        void *p = NULL;
        pthread_mutex_lock(&kept.mu);
        int best = -1;
        for (int i = 0; i < kept.n; i++)
            if (kept.size[i] >= bytes && kept.size[i] - bytes <= bytes / 4 &&
                (best < 0 || kept.size[i] < kept.size[best]))
                best = i;
        if (best >= 0) {
            p = kept.p[best];
            kept_remove(best);
        }
        pthread_mutex_unlock(&kept.mu);
        if (p) return memset(p, 0, bytes);
        return calloc(bytes, 1); /* injected() was asked above */
    }
#endif
    return af_calloc(bytes ? bytes : 1, 1);
}

void af_buffer_free(void *p) {
#ifdef __GLIBC__
    size_t size = p ? malloc_usable_size(p) : 0;
    if (size >= BUFFER_MIN && size <= BUFFER_TOTAL) {
        void *old[AF_BUFFER_SLOTS];
        int nold = 0;
        pthread_mutex_lock(&kept.mu);
        while (kept.n && (kept.n == AF_BUFFER_SLOTS || kept.total + size > BUFFER_TOTAL)) {
            old[nold++] = kept.p[0];
            kept_remove(0);
        }
        kept.p[kept.n] = p;
        kept.size[kept.n++] = size;
        kept.total += size;
        pthread_mutex_unlock(&kept.mu);
        for (int i = 0; i < nold; i++) free(old[i]);
        return;
    }
#endif
    free(p);
}

void af_heap_trim(void) {
#ifdef __GLIBC__
    pthread_mutex_lock(&kept.mu);
    while (kept.n) {
        free(kept.p[0]);
        kept_remove(0);
    }
    pthread_mutex_unlock(&kept.mu);
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
