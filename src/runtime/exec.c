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
#include "kernels/fast/dispatch.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"
#include "runtime/machine.h"
#include "runtime/plan.h"
#include "runtime/profile.h"

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
    af_workers *w;
    af_profile *prof; /* NULL unless profiling */
    void *frame;      /* the main graph's per-value arrays, kept between runs */
    size_t frame_size;
    const af_graph *graph; /* the main graph the kernels were prepared for (NULL: none) */
    void **prepared;       /* by node position in graph->nodes: af_kernel_prepare's, or NULL */
};

/* One run: what its kernels see (x, first, so that the subgraph hook finds the run from it)
 * and the session's runtime (NULL: a run without one, on one thread). x.frame is the frame of
 * the node being executed. */
typedef struct run {
    af_exec x;
    af_runtime *rt;
} run;

/* ---- runtime ------------------------------------------------------------------------------------- */

af_status af_runtime_new(int threads, af_runtime **out, af_error *err) {
    *out = NULL;
    if (threads < 0) return af_fail(err, AF_ERR_INVALID_ARG, "--threads must be >= 0, got %d", threads);
    af_runtime *rt = af_calloc(1, sizeof *rt);
    if (!rt) return af_fail(err, AF_ERR_NOMEM, "out of memory");
    if (!threads) threads = af_cpu_cores();
    af_parallel_costs c;
    af_parallel_costs_default(&c);
    if (threads > 1) { /* the calibrated machine (measured once per machine, then cached) */
        const af_machine *m = af_machine_get();
        c.handoff_ns = (int64_t)m->handoff_ns;
        c.wake_ns = (int64_t)m->wake_ns;
        /* spin as long as a wake-up costs: idle spinning then never wastes more than twice
         * what sleeping at once would have cost (the ski-rental rule); a spinning worker takes
         * its core from whoever else wants it */
        c.spin_ns = c.wake_ns < 5000 ? 5000 : c.wake_ns > 200000 ? 200000 : c.wake_ns;
        c.flops_per_ns = m->gemm_flops / 1e9;
        c.bytes_per_ns = m->l3_bandwidth / 1e9;
    }
    af_status st = af_workers_new(threads, &c, &rt->w, err);
    if (st) {
        af_free(rt);
        return st;
    }
    *out = rt;
    return AF_OK;
}

void af_runtime_free(af_runtime *rt) {
    if (!rt) return;
    for (int i = 0; rt->prepared && i < rt->graph->nnodes; i++) af_kernel_release(rt->prepared[i]);
    af_free(rt->prepared);
    af_profile_free(rt->prof);
    af_workers_free(rt->w);
    af_free(rt->frame);
    af_free(rt);
}

int af_runtime_threads(const af_runtime *rt) { return rt ? af_workers_threads(rt->w) : 1; }

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

af_status af_runtime_prepare(af_runtime *rt, const af_graph *g, af_error *err) {
    if (rt->prepared) return af_fail(err, AF_ERR_INTERNAL, "the runtime is prepared already");
    void **p = af_calloc((size_t)g->nnodes + 1, sizeof *p);
    const af_tensor **types = NULL;
    int cap = 0;
    for (int i = 0; p && i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (n->nin > cap) {
            af_free(types);
            cap = n->nin;
            if (!(types = af_malloc(sizeof *types * (size_t)cap))) break;
        }
        for (int k = 0; k < n->nin; k++) types[k] = n->in[k] ? &n->in[k]->type : NULL;
        /* A prepared node skips its shape function: its outputs' types must be known. */
        bool known = true;
        for (int o = 0; o < n->nout; o++) known = known && (!n->out[o] || af_tensor_known(&n->out[o]->type));
        p[i] = known ? af_kernel_prepare(n, types) : NULL;
    }
    bool oom = !p || (cap && !types);
    af_free(types);
    if (oom) {
        for (int i = 0; p && i < g->nnodes; i++) af_kernel_release(p[i]);
        af_free(p);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", g->file ? g->file : "<model>");
    }
    rt->graph = g;
    rt->prepared = p;
    return AF_OK;
}

/* Node n's prepared state, when n belongs to the graph rt was prepared for and this run's
 * inputs have the types it was prepared with. */
static const void *prepared_for(const run *r, const frame *f, const af_node *n,
                                const af_tensor *const *in) {
    const af_runtime *rt = r->rt;
    if (!rt || f->g != rt->graph || n->id < 0 || n->id >= rt->graph->nnodes ||
        rt->graph->nodes[n->id] != n || !rt->prepared[n->id])
        return NULL;
    for (int k = 0; k < n->nin; k++) {
        const af_tensor *t = n->in[k] ? &n->in[k]->type : NULL;
        if (!t != !in[k]) return NULL;
        if (t && (t->dtype != in[k]->dtype || t->rank != in[k]->rank ||
                  memcmp(t->dims, in[k]->dims, sizeof(int64_t) * (size_t)t->rank)))
            return NULL;
    }
    return rt->prepared[n->id];
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
    if (!over_input && !af_ops[n->op].writes_all) memset(p, 0, bytes);
    t->data = p;
    t->nbytes = bytes;
    t->owns_data = 0;
    if (over_input && af_ops[n->op].inplace == AF_INPLACE_VIEW) *done = true;
    return true;
}

/* Outside the plan, a view (Reshape, Flatten, Squeeze, Unsqueeze) whose input 0 dies at this
 * node and owns its heap buffer takes that buffer over instead of copying it: a value whose
 * shape only the data gives is never planned (Faster R-CNN's roi features, 7.5 MB, flattened
 * for its box head, were copied every run). *done is set: the bytes are already there. */
static bool take_over(frame *f, const af_node *n, int o, const af_tensor *const *in,
                      af_tensor *t, bool *done) {
    const af_value *v = n->nin > 0 ? n->in[0] : NULL;
    if (o != 0 || n->op >= AF_OP_COUNT || af_ops[n->op].inplace != AF_INPLACE_VIEW || !v ||
        v->graph != f->g || v->is_output || v->is_const || f->left[v->id] != 1 ||
        f->bound[v->id] != &f->vals[v->id])
        return false; /* another reader (a second input slot, a body's capture) or not ours */
    af_tensor *src = &f->vals[v->id];
    if (in[0] != src || !src->owns_data || !src->data || !af_plan_inplace_ok(n, src, t))
        return false;
    t->data = src->data;
    t->nbytes = src->nbytes;
    t->owns_data = 1;
    src->owns_data = 0; /* released as a borrowed buffer when its last reader (this node) is done */
    *done = true;
    return true;
}

/* Slots of a node's inputs and outputs on the stack for the usual counts (no allocation per
 * node), on the heap past them (a node may have very many). */
enum { STACK_IN = 32, STACK_OUT = 8 };

static af_status run_node(run *r, frame *f, const af_node *n, af_error *err) {
    const af_tensor *in_stack[STACK_IN];
    af_tensor out_stack[STACK_OUT];
    bool heap_in = n->nin > STACK_IN, heap_out = n->nout > STACK_OUT;
    const af_tensor **in = heap_in ? af_calloc((size_t)n->nin + 1, sizeof(af_tensor *)) : in_stack;
    af_tensor *out = heap_out ? af_calloc((size_t)n->nout + 1, sizeof(af_tensor)) : out_stack;
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
    /* A prepared node's inputs have the types it was prepared (and its shapes inferred) for:
     * its outputs have their values' types, and the shape function need not run again. */
    const void *prepared = st ? NULL : prepared_for(r, f, n, in);
    if (prepared)
        for (int o = 0; o < n->nout; o++)
            if (n->out[o]) af_tensor_type_copy(&out[o], &n->out[o]->type);
    if (!st && !prepared) st = af_kernel_shape(n, in, out, err);
    bool done_in_place = false;
    for (int o = 0; o < n->nout && !st; o++) {
        if (out[o].rank > AF_MAX_RANK)
            st = af_node_fail(err, n, AF_ERR_UNSUPPORTED, "output rank %d exceeds %d",
                              out[o].rank, AF_MAX_RANK);
        else if (af_tensor_known(&out[o]) && !place(f, n, o, in, &out[o], &done_in_place) &&
                 !take_over(f, n, o, in, &out[o], &done_in_place))
            st = af_tensor_alloc(&out[o], err);
        if (st == AF_ERR_NOMEM || st == AF_ERR_INVALID_ARG)
            st = af_node_fail(err, n, st, "output %d: %s", o, err ? err->message : "");
    }
    af_profile *prof = r->rt ? r->rt->prof : NULL;
    double t0 = prof ? af_profile_now(prof) : 0;
    r->x.prepared = prepared;
    /* which kernel ran, for the profile (a view done in place ran none: its op is direct) */
    af_kernel_kind ran = AF_KERNEL_DIRECT;
    if (!st && !done_in_place) st = af_kernel_run_kind(n, in, out, &r->x, &ran, err);
    r->x.prepared = NULL;
    if (prof && !st) af_profile_add(prof, n, NULL, (int)ran, t0, af_profile_now(prof) - t0);
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
    if (heap_in) af_free(in);
    if (heap_out) af_free(out);
    return st;
}

static af_status run_frame(run *r, frame *f, const af_tensor *const *inputs, int ninputs,
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

    frame *outer = r->x.frame;
    r->x.frame = f;
    af_status st = AF_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        const af_node *n = g->nodes[i];
        st = run_node(r, f, n, err);
        if (st) break;
        count_reads(g, n, f->left, -1);
        free_dead(f, n);
    }
    r->x.frame = outer;
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
static bool frame_alloc(run *r, frame *f, bool top) {
    size_t n = (size_t)f->g->nvalues + 1;
    size_t bytes = n * (sizeof(af_tensor) + sizeof(af_tensor *) + sizeof(int));
    unsigned char *m;
    if (top && r->rt) {
        af_runtime *rt = r->rt;
        if (rt->frame_size < bytes) {
            af_free(rt->frame);
            rt->frame_size = 0;
            if (!(rt->frame = af_malloc(bytes))) return false;
            rt->frame_size = bytes;
        }
        m = rt->frame;
        memset(m, 0, bytes);
    } else if (!(m = af_calloc(1, bytes))) {
        return false;
    }
    f->vals = (af_tensor *)m;
    f->bound = (const af_tensor **)(m + n * sizeof(af_tensor));
    f->left = (int *)(m + n * (sizeof(af_tensor) + sizeof(af_tensor *)));
    return true;
}

static af_status exec_in(run *r, frame *parent, const af_graph *g, const af_plan *plan,
                         void *arena, const af_tensor *const *inputs, int ninputs,
                         af_tensor *outputs, af_error *err) {
    frame f = {g, parent, NULL, NULL, NULL, plan, arena};
    bool top = parent == NULL;
    af_status st;
    if (!frame_alloc(r, &f, top))
        return af_fail(err, AF_ERR_NOMEM, "out of memory starting a run");
    st = run_frame(r, &f, inputs, ninputs, outputs, err);
    for (int i = 0; i < g->nvalues; i++) af_tensor_release(&f.vals[i]);
    if (!top || !r->rt) af_free(f.vals);
    return st;
}

static af_status subgraph(af_exec *x, const af_graph *body, const af_tensor *const *inputs,
                          int ninputs, af_tensor *outputs, af_error *err) {
    if (ninputs != body->ninputs)
        return af_fail(err, AF_ERR_INVALID_MODEL, "%s: subgraph '%s' takes %d inputs, given %d",
                       body->file ? body->file : "<model>", body->name ? body->name : "",
                       body->ninputs, ninputs);
    return exec_in((run *)x, x->frame, body, NULL, NULL, inputs, ninputs, outputs, err);
}

/* A run on rt's workers (rt NULL: one thread, scratch of its own freed at the end). */
static void run_init(run *r, af_runtime *rt) {
    af_exec_init(&r->x, rt ? rt->w : NULL, subgraph);
    r->rt = rt;
}

static af_status exec_top(const af_graph *g, const af_plan *p, void *arena, af_runtime *rt,
                          const af_tensor *const *inputs, af_tensor *outputs, af_error *err) {
    run r;
    run_init(&r, rt);
    af_status st = exec_in(&r, NULL, g, p, arena, inputs, g->ninputs, outputs, err);
    af_exec_release(&r.x);
    return st;
}

void af_runtime_call(af_runtime *rt, void (*fn)(af_exec *x, void *ctx), void *ctx) {
    run r;
    run_init(&r, rt);
    fn(&r.x, ctx);
    af_exec_release(&r.x);
}

af_status af_runtime_kernel(af_runtime *rt, const af_node *n, const af_tensor *const *in,
                            af_tensor *out, af_error *err) {
    run r;
    run_init(&r, rt);
    af_status st = af_kernel_run(n, in, out, &r.x, err);
    af_exec_release(&r.x);
    return st;
}

af_status af_exec_graph(const af_graph *g, const af_tensor *const *inputs, af_tensor *outputs,
                        af_error *err) {
    return exec_top(g, NULL, NULL, NULL, inputs, outputs, err);
}

af_status af_exec_graph_on(const af_graph *g, af_runtime *rt, const af_tensor *const *inputs,
                           af_tensor *outputs, af_error *err) {
    af_status st = exec_top(g, NULL, NULL, rt, inputs, outputs, err);
    if (rt) af_workers_park(rt->w);
    return st;
}

af_status af_exec_graph_planned(const af_graph *g, const af_plan *p, void *arena,
                                af_runtime *rt, const af_tensor *const *inputs,
                                af_tensor *outputs, af_error *err) {
    if (g->parent || p->nvalues != g->nvalues || (p->arena_size && !arena))
        return af_fail(err, AF_ERR_INTERNAL, "%s: the memory plan does not belong to this graph",
                       g->file ? g->file : "<model>");
    af_status st = exec_top(g, p, arena, rt, inputs, outputs, err);
    if (rt) af_workers_park(rt->w);
    return st;
}
