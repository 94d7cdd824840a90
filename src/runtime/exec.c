/* The reference executor (see exec.h). For every node: look up its inputs (in this frame or an
 * enclosing one), run the op's shape function on the actual inputs, allocate the outputs whose
 * shapes are known, run the kernel, then free every intermediate whose last reader has run.
 *
 * A planned run (af_exec_graph_planned, plan.h) differs in one place: an output the plan places
 * gets its arena slot instead of an allocation (zeroed as kernels expect, unless it is computed
 * in place over its input 0, whose bytes it must keep, or its kernel writes every element). Everything else (subgraph bodies, values
 * the plan leaves out, a value whose run-time size does not fit its slot) is allocated as
 * before. Invariant: a tensor pointing into the arena never owns its data, so releasing it is
 * only forgetting it; the graph outputs, never planned, are moved to the caller. */
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"
#include "runtime/plan.h"
#include "runtime/profile.h"

#include <pthreadpool.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

typedef struct frame {
    const af_graph *g;
    struct frame *parent;
    af_tensor *vals;          /* tensors computed in this frame, by value id */
    const af_tensor **bound;  /* what each value id refers to: vals[i], an input, a constant */
    int *left;                /* readers not yet run, by value id */
    const af_plan *plan;      /* the main graph's plan in a planned run, else NULL */
    unsigned char *arena;     /* where the plan's offsets point */
} frame;

struct af_runtime {
    pthreadpool_t pool; /* NULL with one thread: loops run on the caller */
    int threads;
    void *scratch;
    size_t scratch_size;
    af_profile *prof; /* NULL unless profiling */
    void *frame;      /* the main graph's per-value arrays, kept between runs */
    size_t frame_size;
};

struct af_exec {
    frame *f;
    af_runtime *rt; /* the session's, or `own` for a run without one */
    af_runtime own;
};

/* ---- runtime ------------------------------------------------------------------------------------- */

af_status af_runtime_new(int threads, af_runtime **out, af_error *err) {
    *out = NULL;
    if (threads < 0) return af_fail(err, AF_ERR_INVALID_ARG, "--threads must be >= 0, got %d", threads);
    af_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    rt->threads = threads ? threads : af_cpu_cores();
    if (rt->threads > 1) {
        rt->pool = pthreadpool_create((size_t)rt->threads);
        if (!rt->pool) {
            free(rt);
            return af_fail(err, AF_ERR_NOMEM, "cannot start %d threads", threads);
        }
        rt->threads = (int)pthreadpool_get_threads_count(rt->pool);
    }
    *out = rt;
    return AF_OK;
}

void af_runtime_free(af_runtime *rt) {
    if (!rt) return;
    af_profile_free(rt->prof);
    if (rt->pool) pthreadpool_destroy(rt->pool);
    free(rt->scratch);
    free(rt->frame);
    free(rt);
}

int af_runtime_threads(const af_runtime *rt) { return rt ? rt->threads : 1; }

af_status af_runtime_profile(af_runtime *rt, bool on, af_error *err) {
    if (!on) {
        af_profile_free(rt->prof);
        rt->prof = NULL;
        return AF_OK;
    }
    if (!rt->prof && !(rt->prof = af_profile_new()))
        return af_fail(err, AF_ERR_NOMEM, "out of memory starting the profile");
    return AF_OK;
}

af_profile *af_runtime_profile_get(af_runtime *rt) { return rt ? rt->prof : NULL; }

int af_exec_threads(const af_exec *x) { return x && x->rt ? x->rt->threads : 1; }

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
    pthreadpool_parallelize_1d(x->rt->pool, par_part, &j, (size_t)j.parts, 0);
}

void *af_exec_scratch(af_exec *x, size_t bytes) {
    af_runtime *rt = x ? x->rt : NULL;
    if (!rt) return NULL;
    if (bytes <= rt->scratch_size) return rt->scratch;
    size_t size = (bytes + 4095) & ~(size_t)4095;
    void *p = af_alloc_big(size);
    if (!p) return NULL;
    free(rt->scratch);
    rt->scratch = p;
    rt->scratch_size = size;
    return p;
}

static const af_tensor *lookup(const frame *f, const af_value *v) {
    while (f && f->g != v->graph) f = f->parent;
    return f ? f->bound[v->id] : NULL;
}

/* Visit each value of g's own scope that node n reads: inputs and subgraph captures. */
static void count_reads(const af_graph *g, const af_node *n, int *left, int delta) {
    for (int k = 0; k < n->nin; k++)
        if (n->in[k] && n->in[k]->graph == g) left[n->in[k]->id] += delta;
    for (int a = 0; a < n->nattrs; a++) {
        const af_attr *at = &n->attrs[a];
        int ng = at->g ? 1 : (at->graphs ? at->n : 0);
        for (int s = 0; s < ng; s++) {
            const af_graph *sub = at->g ? at->g : at->graphs[s];
            for (int c = 0; c < sub->ncaptures; c++)
                if (sub->captures[c]->graph == g) left[sub->captures[c]->id] += delta;
        }
    }
}

static void free_dead(frame *f, const af_node *n) {
    const af_graph *g = f->g;
    /* Inputs and captures whose readers are all done. */
    for (int k = 0; k < n->nin; k++) {
        const af_value *v = n->in[k];
        if (v && v->graph == g && f->left[v->id] == 0 && !v->is_output) af_tensor_release(&f->vals[v->id]);
    }
    for (int a = 0; a < n->nattrs; a++) {
        const af_attr *at = &n->attrs[a];
        int ng = at->g ? 1 : (at->graphs ? at->n : 0);
        for (int s = 0; s < ng; s++) {
            const af_graph *sub = at->g ? at->g : at->graphs[s];
            for (int c = 0; c < sub->ncaptures; c++) {
                const af_value *v = sub->captures[c];
                if (v->graph == g && f->left[v->id] == 0 && !v->is_output)
                    af_tensor_release(&f->vals[v->id]);
            }
        }
    }
    /* Outputs nobody reads. */
    for (int o = 0; o < n->nout; o++) {
        const af_value *v = n->out[o];
        if (v && f->left[v->id] == 0 && !v->is_output) af_tensor_release(&f->vals[v->id]);
    }
}

static bool dims_known(const af_tensor *t) {
    if (t->rank < 0) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 0) return false;
    return true;
}

/* In a planned run, give output o of n its slot in the arena; false when the plan leaves it
 * out or its run-time size does not fit (then it is allocated as usual). *done is set when the
 * output is a view computed in place: its bytes are already there and the kernel is skipped. */
static bool place(const frame *f, const af_node *n, int o, const af_tensor *const *in,
                  af_tensor *t, bool *done) {
    const af_value *v = n->out[o];
    if (!f->plan || !v || v->graph != f->g) return false;
    const af_plan_slot *s = &f->plan->slots[v->id];
    int64_t count = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), bytes;
    if (s->offset < 0 || count < 0 || es == 0 || !af_mul_size((size_t)count, es, &bytes) ||
        bytes > s->size)
        return false;
    unsigned char *p = f->arena + s->offset;
    /* In place: the input's bytes are there only if the input itself got its slot. */
    bool over_input = s->inplace_of >= 0 && o == 0 && n->nin > 0 && n->in[0] &&
                      n->in[0]->id == s->inplace_of && in[0] && in[0]->data == p;
    if (over_input && !af_plan_inplace_ok(n, in[0], t)) return false;
    if (!over_input && !af_plan_op_writes_all(n->op)) memset(p, 0, bytes);
    t->data = p;
    t->nbytes = bytes;
    t->owns_data = 0;
    if (over_input && af_plan_op_is_view(n->op)) *done = true;
    return true;
}

/* Slots of a node's inputs and outputs on the stack for the usual counts (no allocation per
 * node), on the heap past them (a node may have very many). */
enum { STACK_IN = 32, STACK_OUT = 8 };

static af_status run_node(af_exec *x, frame *f, const af_node *n, af_error *err) {
    const af_tensor *in_stack[STACK_IN];
    af_tensor out_stack[STACK_OUT];
    bool heap_in = n->nin > STACK_IN, heap_out = n->nout > STACK_OUT;
    const af_tensor **in = heap_in ? calloc((size_t)n->nin + 1, sizeof(af_tensor *)) : in_stack;
    af_tensor *out = heap_out ? calloc((size_t)n->nout + 1, sizeof(af_tensor)) : out_stack;
    if (!heap_out) memset(out_stack, 0, sizeof(af_tensor) * (size_t)(n->nout > 0 ? n->nout : 1));
    af_status st = AF_OK;
    if (!in || !out) {
        st = af_node_fail(err, n, AF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int k = 0; k < n->nin && !st; k++) {
        in[k] = n->in[k] ? lookup(f, n->in[k]) : NULL;
        if (n->in[k] && (!in[k] || !in[k]->data))
            st = af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input '%s' has no value",
                              n->in[k]->name);
    }
    for (int o = 0; o < n->nout; o++) out[o].rank = -1;
    if (!st) st = af_ops[n->op].shape(n, in, out, err);
    bool done_in_place = false;
    for (int o = 0; o < n->nout && !st; o++) {
        if (out[o].rank > AF_MAX_RANK)
            st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output rank %d exceeds %d",
                              out[o].rank, AF_MAX_RANK);
        else if (dims_known(&out[o]) && !place(f, n, o, in, &out[o], &done_in_place))
            st = af_tensor_alloc(&out[o], err);
        if (st == AF_ERR_NOMEM || st == AF_ERR_INVALID_ARG)
            st = af_node_fail(err, n, st, "output %d: %s", o, err ? err->message : "");
    }
    af_profile *prof = x->rt->prof;
    double t0 = prof ? af_profile_now(prof) : 0;
    if (!st && !done_in_place) st = af_ops[n->op].kernel(n, in, out, x, err);
    if (prof && !st) af_profile_add(prof, n, NULL, t0, af_profile_now(prof) - t0);
    for (int o = 0; o < n->nout && !st; o++)
        if (n->out[o] && !out[o].data)
            st = af_node_fail(err, n, AF_ERR_INTERNAL, "kernel left output %d unset", o);
    for (int o = 0; out && o < n->nout; o++) {
        if (!st && n->out[o]) {
            af_tensor_release(&f->vals[n->out[o]->id]);
            f->vals[n->out[o]->id] = out[o];
        } else {
            af_tensor_release(&out[o]);
        }
    }
done:
    if (heap_in) free(in);
    if (heap_out) free(out);
    return st;
}

static af_status run_frame(af_exec *x, frame *f, const af_tensor *const *inputs, int ninputs,
                           af_tensor *outputs, af_error *err) {
    const af_graph *g = f->g;
    const char *file = g->file ? g->file : "<model>";
    for (int i = 0; i < g->nvalues; i++) {
        const af_value *v = g->values[i];
        f->bound[i] = v->is_const ? &v->type : &f->vals[i];
    }
    for (int i = 0; i < g->ninputs; i++) {
        const af_value *v = g->inputs[i];
        if (i < ninputs && inputs && inputs[i]) f->bound[v->id] = inputs[i];
        else if (!v->is_const)
            return af_fail(err, AF_ERR_INVALID_ARG, "%s: input '%s' was not given", file, v->name);
    }
    for (int i = 0; i < g->nnodes; i++) count_reads(g, g->nodes[i], f->left, 1);

    frame *outer = x->f;
    x->f = f;
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        const af_node *n = g->nodes[i];
        st = run_node(x, f, n, err);
        if (st) break;
        count_reads(g, n, f->left, -1);
        free_dead(f, n);
    }
    x->f = outer;
    int done = 0;
    for (; done < g->noutputs && !st; done++) {
        const af_value *v = g->outputs[done];
        const af_tensor *t = lookup(f, v);
        if (!t || !t->data) {
            st = af_fail(err, AF_ERR_INVALID_MODEL, "%s: output '%s' has no value", file, v->name);
            break;
        }
        if (v->graph == g && t == &f->vals[v->id] && t->owns_data) {
            outputs[done] = f->vals[v->id]; /* move */
            memset(&f->vals[v->id], 0, sizeof(af_tensor));
            f->bound[v->id] = &outputs[done];
        } else {
            memset(&outputs[done], 0, sizeof(af_tensor));
            st = af_tensor_copy(&outputs[done], t, err);
        }
    }
    if (st)
        for (int i = 0; i < done; i++) af_tensor_release(&outputs[i]);
    return st;
}

/* The per-value arrays of a frame. The main graph's come from the runtime (made by the first
 * run, zeroed by every later one: a steady-state run allocates nothing here); subgraph frames
 * allocate theirs. */
static bool frame_alloc(af_exec *x, frame *f, bool top) {
    size_t n = (size_t)f->g->nvalues + 1;
    size_t bytes = n * (sizeof(af_tensor) + sizeof(af_tensor *) + sizeof(int));
    unsigned char *m;
    if (top && x->rt != &x->own) {
        af_runtime *rt = x->rt;
        if (rt->frame_size < bytes) {
            free(rt->frame);
            rt->frame_size = 0;
            if (!(rt->frame = malloc(bytes))) return false;
            rt->frame_size = bytes;
        }
        m = rt->frame;
        memset(m, 0, bytes);
    } else if (!(m = calloc(1, bytes))) {
        return false;
    }
    f->vals = (af_tensor *)m;
    f->bound = (const af_tensor **)(m + n * sizeof(af_tensor));
    f->left = (int *)(m + n * (sizeof(af_tensor) + sizeof(af_tensor *)));
    return true;
}

static af_status exec_in(af_exec *x, frame *parent, const af_graph *g, const af_plan *plan,
                         void *arena, const af_tensor *const *inputs, int ninputs,
                         af_tensor *outputs, af_error *err) {
    frame f = {g, parent, NULL, NULL, NULL, plan, arena};
    bool top = parent == NULL;
    af_status st;
    if (!frame_alloc(x, &f, top))
        return af_fail(err, AF_ERR_NOMEM, "out of memory starting a run");
    st = run_frame(x, &f, inputs, ninputs, outputs, err);
    for (int i = 0; i < g->nvalues; i++) af_tensor_release(&f.vals[i]);
    if (!top || x->rt == &x->own) free(f.vals);
    return st;
}

/* A run with the given runtime, or a one-thread one of its own whose scratch dies with it. */
static af_status exec_top(const af_graph *g, const af_plan *p, void *arena, af_runtime *rt,
                          const af_tensor *const *inputs, af_tensor *outputs, af_error *err) {
    af_exec x = {NULL, rt, {NULL, 1, NULL, 0, NULL, NULL, 0}};
    if (!rt) x.rt = &x.own;
    af_status st = exec_in(&x, NULL, g, p, arena, inputs, g->ninputs, outputs, err);
    free(x.own.scratch);
    return st;
}

void af_runtime_call(af_runtime *rt, void (*fn)(af_exec *x, void *ctx), void *ctx) {
    af_exec x = {NULL, rt, {NULL, 1, NULL, 0, NULL, NULL, 0}};
    if (!rt) x.rt = &x.own;
    fn(&x, ctx);
    free(x.own.scratch);
}

af_status af_runtime_kernel(af_runtime *rt, const af_node *n, const af_tensor *const *in,
                            af_tensor *out, af_error *err) {
    af_exec x = {NULL, rt, {NULL, 1, NULL, 0, NULL, NULL, 0}};
    if (!rt) x.rt = &x.own;
    af_status st = af_ops[n->op].kernel(n, in, out, &x, err);
    free(x.own.scratch);
    return st;
}

af_status af_exec_graph(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                        af_error *err) {
    return exec_top(g, NULL, NULL, NULL, inputs, outputs, err);
}

static void nothing(void *ctx, size_t i) {
    (void)ctx, (void)i;
}

af_status af_exec_graph_planned(const af_graph *g, const af_plan *p, void *arena,
                                af_runtime *rt, const af_tensor *const *inputs,
                                af_tensor *outputs, af_error *err) {
    if (g->parent || p->nvalues != g->nvalues || (p->arena_size && !arena))
        return af_fail(err, AF_ERR_INTERNAL, "%s: the memory plan does not belong to this graph",
                       g->file ? g->file : "<model>");
    af_status st = exec_top(g, p, arena, rt, inputs, outputs, err);
    /* Between runs the workers sleep instead of spinning: an idle session then leaves the
     * cores to whoever needs them (another session, another process). */
    if (rt && rt->pool)
        pthreadpool_parallelize_1d(rt->pool, nothing, NULL, (size_t)rt->threads,
                                   PTHREADPOOL_FLAG_YIELD_WORKERS);
    return st;
}

af_status af_exec_subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                           int ninputs, af_tensor *outputs, af_error *err) {
    if (ninputs != body->ninputs)
        return af_fail(err, AF_ERR_INVALID_MODEL, "%s: subgraph '%s' takes %d inputs, given %d",
                       body->file ? body->file : "<model>", body->name ? body->name : "",
                       body->ninputs, ninputs);
    return exec_in(x, x->f, body, NULL, NULL, inputs, ninputs, outputs, err);
}
