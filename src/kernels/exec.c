/* What kernels run with (kernel.h): the worker set (pthreadpool and scratch), the parallel loop
 * with work taken from slow threads, and the hook through which control flow reaches the
 * executor. Invariant: a parallel loop runs each item exactly once and returns after the last. */
#include "kernels/kernel.h"

#include <pthreadpool.h>
#include <stdatomic.h>
#include <string.h>

struct af_workers {
    pthreadpool_t pool; /* NULL with one thread: loops run on the caller */
    int threads;
    void *scratch;
    size_t scratch_size;
};

af_status af_workers_new(int threads, af_workers **out, af_error *err) {
    *out = NULL;
    if (threads < 1) return af_fail(err, AF_ERR_INVALID_ARG, "%d threads", threads);
    af_workers *w = af_calloc(1, sizeof *w);
    if (!w) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    w->threads = threads;
    if (w->threads > 1) {
        w->pool = pthreadpool_create((size_t)w->threads);
        if (!w->pool) {
            af_free(w);
            return af_fail(err, AF_ERR_NOMEM, "cannot start %d threads", threads);
        }
        w->threads = (int)pthreadpool_get_threads_count(w->pool);
    }
    *out = w;
    return AF_OK;
}

void af_workers_free(af_workers *w) {
    if (!w) return;
    if (w->pool) pthreadpool_destroy(w->pool);
    af_free(w->scratch);
    af_free(w);
}

int af_workers_threads(const af_workers *w) { return w ? w->threads : 1; }

static void nothing(void *ctx, size_t i) {
    (void)ctx, (void)i;
}

void af_workers_idle(af_workers *w) {
    if (w && w->pool)
        pthreadpool_parallelize_1d(w->pool, nothing, NULL, (size_t)w->threads,
                                   PTHREADPOOL_FLAG_YIELD_WORKERS);
}

void af_exec_init(af_exec *x, af_workers *w, af_subgraph_fn subgraph) {
    memset(x, 0, sizeof *x);
    x->w = w;
    x->subgraph = subgraph;
}

void af_exec_release(af_exec *x) {
    af_free(x->own);
    x->own = NULL;
    x->own_size = 0;
}

int af_exec_threads(const af_exec *x) { return x ? af_workers_threads(x->w) : 1; }

/* A slot's share of a parallel loop: items [next, end) packed in one word (next in the high
 * half), on a cache line of its own, so that its owner taking from the front and a thief taking
 * from the back each claim items with one compare-and-swap, and the owner's claims do not
 * bounce the line while nobody steals. */
typedef struct par_share {
    _Alignas(64) _Atomic uint64_t range;
} par_share;

typedef struct par_job {
    af_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
    bool fixed;
    par_share share[AF_EXEC_MAX_SLOTS];
} par_job;

static uint64_t pack(uint64_t next, uint64_t end) { return next << 32 | end; }

/* Claims [*b, *e) from the front of s: a quarter of what is left (at least one item), so the
 * pieces shrink as the share runs out and a thief finds something to take until near the end. */
static bool take_front(par_share *s, int64_t *b, int64_t *e) {
    uint64_t r = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        uint64_t next = r >> 32, end = r & 0xffffffffu, c = (end - next + 3) / 4;
        if (next >= end) return false;
        if (atomic_compare_exchange_weak(&s->range, &r, pack(next + c, end))) {
            *b = (int64_t)next, *e = (int64_t)(next + c);
            return true;
        }
    }
}

/* Moves the back half of what is left of s (at least one item) into the empty share mine. */
static bool steal(par_share *s, par_share *mine) {
    uint64_t r = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        uint64_t next = r >> 32, end = r & 0xffffffffu, c = (end - next + 1) / 2;
        if (next >= end) return false;
        if (atomic_compare_exchange_weak(&s->range, &r, pack(next, end - c))) {
            atomic_store(&mine->range, pack(end - c, end));
            return true;
        }
    }
}

static void par_part(void *p, size_t i) {
    par_job *j = p;
    par_share *mine = &j->share[i];
    int64_t b, e;
    if (j->fixed) { /* more items than a share holds: the static split */
        j->fn(j->ctx, (int)i, j->n * (int64_t)i / j->parts, j->n * (int64_t)(i + 1) / j->parts);
        return;
    }
    for (int k = 1;;) {
        while (take_front(mine, &b, &e)) j->fn(j->ctx, (int)i, b, e);
        /* victims from the next slot on, so that thieves spread over them */
        while (k < j->parts && !steal(&j->share[(i + (size_t)k) % (size_t)j->parts], mine)) k++;
        if (k == j->parts) return;
    }
}

void af_exec_parallel(af_exec *x, int64_t n, af_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int t = af_exec_threads(x);
    if (t <= 1 || n == 1) {
        fn(ctx, 0, 0, n);
        return;
    }
    if (t > AF_EXEC_MAX_SLOTS) t = AF_EXEC_MAX_SLOTS;
    par_job j = {fn, ctx, n, n < t ? (int)n : t, n > (int64_t)UINT32_MAX, {{0}}};
    for (int s = 0; s < j.parts; s++)
        atomic_init(&j.share[s].range,
                    pack((uint64_t)(n * s / j.parts), (uint64_t)(n * (s + 1) / j.parts)));
    pthreadpool_parallelize_1d(x->w->pool, par_part, &j, (size_t)j.parts, 0);
}

/* Grow *p (of *size bytes) to hold `bytes`, page-rounded; false when out of memory. */
static bool grow(void **p, size_t *size, size_t bytes) {
    if (bytes <= *size) return true;
    size_t want = (bytes + 4095) & ~(size_t)4095;
    void *q = af_alloc_big(want);
    if (!q) return false;
    af_free(*p);
    *p = q;
    *size = want;
    return true;
}

void *af_exec_scratch(af_exec *x, size_t bytes) {
    if (!x) return NULL;
    if (x->w) return grow(&x->w->scratch, &x->w->scratch_size, bytes) ? x->w->scratch : NULL;
    return grow(&x->own, &x->own_size, bytes) ? x->own : NULL;
}

af_status af_exec_subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                           int ninputs, af_tensor *outputs, af_error *err) {
    if (!x || !x->subgraph)
        return af_fail(err, AF_ERR_INTERNAL, "%s: a subgraph cannot run outside the executor",
                       body->file ? body->file : "<model>");
    return x->subgraph(x, body, inputs, ninputs, outputs, err);
}
