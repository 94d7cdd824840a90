/* What kernels run with (kernel.h): the worker set (our thread pool and scratch), the parallel
 * loop with work taken from slow threads, and the hook through which control flow reaches the
 * executor.
 *
 * The pool. A parallel loop is published as a job: the caller opens a gate for it, wakes
 * sleeping workers, and starts on the items itself.
 * Workers join while the gate is open; once the caller has run out of items to take (its own
 * share, then the back halves of everyone's), it closes the gate and waits only for the workers
 * that joined, which are running. A worker that the operating system has not scheduled (another
 * process holds its core) therefore never delays a loop: its items are taken by the caller.
 * Idle workers spin for about what a wake-up costs (af_parallel_costs.spin_ns), then sleep on a
 * futex; at the end of a run (af_workers_park) they sleep at once.
 *
 * Invariant: a parallel loop runs each item exactly once and returns after the last. */
#include "kernels/kernel.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
    int64_t base; /* items are numbered from base (a loop of more than 2^32 items runs in rounds) */
    int parts;
    par_share share[AF_EXEC_MAX_SLOTS];
} par_job;

/* The gate word: the generation of the job last published (high half), OPEN while workers may
 * join it, and how many workers are inside it (the low 31 bits). */
#define GATE_OPEN ((uint64_t)1 << 31)
#define GATE_COUNT (GATE_OPEN - 1)

struct af_workers {
    int threads;  /* the caller and threads - 1 workers */
    pthread_t *tid;
    _Atomic uint32_t gen;      /* the generation of the job last published: the futex word */
    _Atomic uint64_t gate;
    par_job *job;              /* written before the gate opens, read by workers that joined */
    _Atomic int sleeping;      /* workers waiting on the futex */
    _Atomic bool parked;       /* between runs: idle workers sleep at once */
    _Atomic bool stop;
    af_parallel_costs costs;
    /* What waiting for workers has cost lately: a moving average, over parallel loops, of the
     * caller's wait beyond the loop's whole work (a worker that lost its core mid-piece to
     * another process, or to the hypervisor), halved every 100 ms. A loop runs in parallel
     * only when the half of its work it saves exceeds that. A fixed reaction (4x the last stall
     * for 100 ms) serialised half of ResNet-50's batch-32 loops on an idle machine, whose
     * occasional 10-30 ms hiccups it took for a busy core. Only the caller of a run reads and
     * writes these. */
    double stall_ns;
    int64_t decayed_at;
    void *scratch;
    size_t scratch_size;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expect) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static void par_part(par_job *j, int i);

/* Worker `slot`'s side of a job: join it if the gate is still open, run its part, leave. */
static void join_job(af_workers *w, int slot) {
    uint64_t r = atomic_load_explicit(&w->gate, memory_order_acquire);
    while (r & GATE_OPEN)
        if (atomic_compare_exchange_weak_explicit(&w->gate, &r, r + 1, memory_order_acquire,
                                                  memory_order_acquire)) {
            if (slot < w->job->parts) par_part(w->job, slot);
            atomic_fetch_sub_explicit(&w->gate, 1, memory_order_release);
            return;
        }
}

typedef struct worker_arg {
    af_workers *w;
    int slot;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg a = *(worker_arg *)p;
    af_free(p);
    af_workers *w = a.w;
    uint32_t seen = 0;
    for (;;) {
        /* spin up to spin_ns (not after a run ended), then sleep until a job comes */
        int64_t until = now_ns() + w->costs.spin_ns;
        uint32_t g;
        for (int k = 0; (g = atomic_load_explicit(&w->gen, memory_order_acquire)) == seen; k++) {
            cpu_relax();
            if ((k & 255) == 255 && (atomic_load_explicit(&w->parked, memory_order_relaxed) ||
                                     now_ns() > until)) {
                atomic_fetch_add(&w->sleeping, 1);
                while ((g = atomic_load(&w->gen)) == seen && !atomic_load(&w->stop))
                    futex_wait(&w->gen, seen);
                atomic_fetch_sub(&w->sleeping, 1);
                break;
            }
        }
        if (atomic_load(&w->stop)) return NULL;
        seen = g;
        join_job(w, a.slot);
    }
}

static void stop_workers(af_workers *w, int started) {
    atomic_store(&w->stop, true);
    atomic_fetch_add(&w->gen, 1);
    futex_wake_all(&w->gen);
    for (int i = 0; i < started; i++) pthread_join(w->tid[i], NULL);
}

af_status af_workers_new(int threads, const af_parallel_costs *costs, af_workers **out,
                         af_error *err) {
    *out = NULL;
    if (threads < 1) return af_fail(err, AF_ERR_INVALID_ARG, "%d threads", threads);
    if (threads > AF_EXEC_MAX_SLOTS) threads = AF_EXEC_MAX_SLOTS;
    af_workers *w = af_calloc(1, sizeof *w);
    if (!w) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    w->threads = threads;
    if (costs) w->costs = *costs;
    else af_parallel_costs_default(&w->costs);
    atomic_init(&w->gen, 0);
    atomic_init(&w->gate, 0);
    atomic_init(&w->sleeping, 0);
    atomic_init(&w->stop, false);
    atomic_init(&w->parked, true);
    w->tid = af_calloc((size_t)threads, sizeof *w->tid);
    int started = 0;
    while (w->tid && started < threads - 1) {
        worker_arg *a = af_malloc(sizeof *a);
        if (!a) break;
        *a = (worker_arg){w, started + 1};
        if (pthread_create(&w->tid[started], NULL, worker_main, a)) {
            af_free(a);
            break;
        }
        started++;
    }
    if (started < threads - 1) {
        stop_workers(w, started);
        af_free(w->tid);
        af_free(w);
        return af_fail(err, AF_ERR_NOMEM, "cannot start %d threads", threads);
    }
    *out = w;
    return AF_OK;
}

void af_workers_free(af_workers *w) {
    if (!w) return;
    stop_workers(w, w->threads - 1);
    af_free(w->tid);
    af_free(w->scratch);
    af_free(w);
}

int af_workers_threads(const af_workers *w) { return w ? w->threads : 1; }

void af_workers_park(af_workers *w) {
    if (w) atomic_store_explicit(&w->parked, true, memory_order_relaxed);
}

void af_parallel_costs_default(af_parallel_costs *c) {
    /* what a 2020s server core measures, for a worker set nobody has tuned */
    *c = (af_parallel_costs){.handoff_ns = 1500, .wake_ns = 30000, .spin_ns = 30000,
                             .flops_per_ns = 50, .bytes_per_ns = 20};
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

/* Slot i's part of job j: its share from the front, then what it steals, until every share it
 * looks at is empty. A share nobody joined for is never refilled, so when the caller's part
 * (slot 0) returns, all that is left is in the hands of workers inside the gate. */
static void par_part(par_job *j, int i) {
    par_share *mine = &j->share[i];
    int64_t b, e;
    for (int k = 1;;) {
        while (take_front(mine, &b, &e)) j->fn(j->ctx, i, j->base + b, j->base + e);
        /* victims from the next slot on, so that thieves spread over them */
        while (k < j->parts && !steal(&j->share[(i + k) % j->parts], mine)) k++;
        if (k == j->parts) return;
    }
}

/* One job of n <= 2^32 - 1 items over `parts` slots, the caller on slot 0. */
static void run_job(af_workers *w, par_job *j, int64_t n, double ns) {
    for (int s = 0; s < j->parts; s++)
        atomic_init(&j->share[s].range,
                    pack((uint64_t)(n * s / j->parts), (uint64_t)(n * (s + 1) / j->parts)));
    w->job = j;
    atomic_store_explicit(&w->parked, false, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&w->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&w->gate, (uint64_t)g << 32 | GATE_OPEN, memory_order_release);
    atomic_store(&w->gen, g);
    if (atomic_load(&w->sleeping) > 0) futex_wake_all(&w->gen);
    par_part(j, 0);
    /* close the gate, then wait for the workers inside (they are running: they joined) */
    uint64_t r = atomic_fetch_and_explicit(&w->gate, ~GATE_OPEN, memory_order_acq_rel);
    if (!(r & GATE_COUNT)) { /* nobody to wait for */
        w->stall_ns -= w->stall_ns / 64;
        return;
    }
    int64_t t0 = now_ns();
    for (int k = 0; r & GATE_COUNT; k++) {
        if (k > 4096) sched_yield();
        else cpu_relax();
        r = atomic_load_explicit(&w->gate, memory_order_acquire);
    }
    int64_t waited = now_ns() - t0;
    double excess = (double)waited > ns ? (double)waited - ns : 0.0;
    w->stall_ns += (excess - w->stall_ns) / 64;
}

/* The floor below which loops stay on the caller (see struct af_workers). */
static double loop_floor(af_workers *w) {
    if (w->stall_ns > 0) {
        int64_t t = now_ns();
        if (t - w->decayed_at > 100000000) {
            w->stall_ns /= 2;
            w->decayed_at = t;
        }
    }
    /* The probe's round trip leaves out what the other core's cache costs: a 3-layer MLP's
     * 256x256 products (2-3 us) ran 0.6 us slower split in two. Hence at least 5 us. */
    double base = 2.0 * (double)w->costs.handoff_ns;
    if (base < 5000.0) base = 5000.0;
    return 2.0 * w->stall_ns > base ? 2.0 * w->stall_ns : base;
}

void af_exec_parallel(af_exec *x, int64_t n, double ns, af_range_fn fn, void *ctx) {
    if (n <= 0) return;
    af_workers *w = x ? x->w : NULL;
    /* Splitting saves about half of the work and costs a hand-off: not worth it below twice
     * the hand-off (or the floor a stall raised). A sleeping worker is woken for any loop that
     * goes parallel: the caller does not wait for it (it joins late or not at all), so the
     * wake-up costs the caller one system call, and the worker then spins through the loops
     * that follow. Waking only for loops worth twice a wake-up (40-120 us here) left the
     * worker asleep through whole runs of small convnets: MNASNet ran 9.2 ms at 2 threads
     * against 5.0 ms so. */
    if (!w || w->threads <= 1 || n == 1 || ns < loop_floor(w)) {
        fn(ctx, 0, 0, n);
        return;
    }
    par_job j = {fn, ctx, 0, 0, {{0}}};
    for (int64_t base = 0; base < n; base += UINT32_MAX) {
        int64_t m = n - base < (int64_t)UINT32_MAX ? n - base : (int64_t)UINT32_MAX;
        j.base = base;
        j.parts = m < w->threads ? (int)m : w->threads;
        run_job(w, &j, m, ns * (double)m / (double)n);
    }
}

double af_exec_work_ns(const af_exec *x, double flops, double bytes) {
    af_parallel_costs d;
    const af_parallel_costs *c = x && x->w ? &x->w->costs : &d;
    if (c == &d) af_parallel_costs_default(&d);
    return flops / c->flops_per_ns + bytes / c->bytes_per_ns;
}

/* Probing what a loop costs for bringing in a worker, spinning or asleep. */
typedef struct probe {
    int64_t t0;
    _Atomic int64_t started;
} probe;

static void probe_item(void *p, int slot, int64_t b, int64_t e) {
    probe *pr = p;
    (void)e;
    if (slot != 0) {
        atomic_store(&pr->started, now_ns());
        return;
    }
    /* the caller's item 0: hold on until a worker has started (or 50 ms), so that the caller
     * does not take the worker's item before it arrives */
    while (b == 0 && !atomic_load(&pr->started) && now_ns() - pr->t0 < 50000000) cpu_relax();
}

int64_t af_workers_probe(af_workers *w, bool asleep) {
    if (!w || w->threads < 2) return 0;
    af_exec x;
    af_exec_init(&x, w, NULL);
    if (asleep)
        for (int64_t t = now_ns(); atomic_load(&w->sleeping) < w->threads - 1 &&
                                   now_ns() - t < 100000000;)
            usleep(100);
    probe pr = {now_ns(), 0};
    af_exec_parallel(&x, 2, 1e18, probe_item, &pr);
    /* the whole round trip: the worker's start, its leaving, the caller seeing it leave */
    return atomic_load(&pr.started) ? now_ns() - pr.t0 : 50000000;
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
