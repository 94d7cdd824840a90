/* Memory plan tests (runtime/plan.h), as correctness properties, never timings.
 *
 * Every plan made here is held to an independent checker (its own liveness, written apart from
 * plan.c): every pair of planned values live at the same node is disjoint in the arena unless
 * one is in place over the other along a chain the planner may make; in place only for the
 * ops of the allowed list, over an input that dies there and is read through no other slot;
 * every value inside the arena with its exact size; the reported lower bound recomputed; and
 * arena <= 1.2 x lower bound. Then a planned run must equal the unplanned run bit for bit (twice,
 * over an arena filled with garbage first, so no kernel may rely on stale or zero memory it did
 * not get). Graphs: small hand-built chains, every conformance model (as imported and
 * optimized), and torch exports of ResNet-18, a 2-layer BERT and the seed's TestModel
 * ($AF_PLAN_MODELS, written by tests/gen_plan_models.py). The .afm part: a round trip keeps the
 * plan, a file without a plan still runs, and forged plans (overlapping, outside the arena,
 * wrong size, misaligned, in place where not allowed, unordered) with recomputed checksums are
 * refused at load with a message naming the fault. Last, the runtime's parallel loop: its
 * pieces cover every item once, slots stay in range and never run twice at once, and the
 * threads take work from a slow one.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"
#include "cli.h"

#include "format/afm.h"
#include "driver/compile.h"
#include "passes/passes.h"
#include "runtime/exec.h"
#include "driver/session.h"
#include "runtime/plan.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
    return p;
}

/* ---- the independent checker ----------------------------------------------------------------- */

static uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

static void mark_reads(const af_graph *g, const af_graph *sg, int pos, int *last) {
    for (int c = 0; c < sg->ncaptures; c++)
        if (sg->captures[c]->graph == g && last[sg->captures[c]->id] < pos)
            last[sg->captures[c]->id] = pos;
    for (int i = 0; i < sg->nnodes; i++) {
        const af_node *n = sg->nodes[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] && n->in[k]->graph == g && last[n->in[k]->id] < pos)
                last[n->in[k]->id] = pos;
        for (int a = 0; a < n->nattrs; a++) {
            if (n->attrs[a].type == AF_ATTR_GRAPH) mark_reads(g, n->attrs[a].g, pos, last);
            for (int s = 0; n->attrs[a].type == AF_ATTR_GRAPHS && s < n->attrs[a].n; s++)
                mark_reads(g, n->attrs[a].graphs[s], pos, last);
        }
    }
}

static const char *const INPLACE_OPS[] = {"Relu", "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div",
                                          "FusedElementwise", "Reshape", "Flatten", "Squeeze",
                                          "Unsqueeze"};

static bool inplace_op(const af_node *n, bool *view) {
    const char *name = af_ops[n->op].name;
    for (size_t i = 0; i < AF_COUNT(INPLACE_OPS); i++)
        if (!strcmp(name, INPLACE_OPS[i])) {
            *view = i >= 8;
            return true;
        }
    return false;
}

static int root_of(const af_plan *p, int v) {
    while (p->slots[v].inplace_of >= 0) v = p->slots[v].inplace_of;
    return v;
}

typedef struct plan_stats {
    int planned, inplace;
    uint64_t arena, bound;
} plan_stats;

/* Check p against g as described at the top; fail_msg names `what` and the fault. */
static plan_stats verify_plan(const af_graph *g, const af_plan *p, const char *what) {
    int nv = g->nvalues;
    int *def = malloc(((size_t)nv + 1) * sizeof *def), *last = malloc(((size_t)nv + 1) * sizeof *last);
    for (int i = 0; i < nv; i++) def[i] = last[i] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] && n->in[k]->graph == g) last[n->in[k]->id] = i;
        for (int a = 0; a < n->nattrs; a++) {
            if (n->attrs[a].type == AF_ATTR_GRAPH) mark_reads(g, n->attrs[a].g, i, last);
            for (int s = 0; n->attrs[a].type == AF_ATTR_GRAPHS && s < n->attrs[a].n; s++)
                mark_reads(g, n->attrs[a].graphs[s], i, last);
        }
        for (int o = 0; o < n->nout; o++)
            if (n->out[o]) def[n->out[o]->id] = i;
    }
    for (int i = 0; i < nv; i++)
        if (last[i] < def[i]) last[i] = def[i];
    assert_int_equal(p->nvalues, nv);
    plan_stats st = {0, 0, p->arena_size, 0};
    for (int i = 0; i < nv; i++) {
        const af_plan_slot *s = &p->slots[i];
        const af_value *v = g->values[i];
        if (s->offset < 0) continue;
        st.planned++;
        const af_node *n = v->producer;
        if (!n || v->is_input || v->is_const || v->is_output || def[i] < 0)
            fail_msg("%s: '%s' is planned but is not an intermediate", what, v->name);
        if (n->op == AF_OP_IF || n->op == AF_OP_LOOP || n->op == AF_OP_SCAN)
            fail_msg("%s: '%s' comes from control flow", what, v->name);
        int64_t count = af_tensor_numel(&v->type);
        if (count <= 0 || !af_dtype_size(v->type.dtype))
            fail_msg("%s: '%s' is planned with an unknown type", what, v->name);
        uint64_t bytes = (uint64_t)count * af_dtype_size(v->type.dtype);
        if (s->size != align64(bytes) || s->offset % 64 ||
            (uint64_t)s->offset + s->size > p->arena_size)
            fail_msg("%s: '%s' has bytes %lld..+%llu for %llu in an arena of %llu", what, v->name,
                     (long long)s->offset, (unsigned long long)s->size,
                     (unsigned long long)bytes, (unsigned long long)p->arena_size);
        if (s->inplace_of < 0) continue;
        st.inplace++;
        bool view = false;
        const af_value *src = g->values[s->inplace_of];
        if (!inplace_op(n, &view) || n->out[0] != v || n->in[0] != src)
            fail_msg("%s: '%s' (%s) is in place over '%s', which the op does not allow", what,
                     v->name, n->op_type, src->name);
        if (last[src->id] != def[i])
            fail_msg("%s: '%s' overwrites '%s', which is read later", what, v->name, src->name);
        for (int k = 1; k < n->nin; k++)
            if (n->in[k] == src) fail_msg("%s: '%s' overwrites a twice-read input", what, v->name);
        if (!view) {
            assert_int_equal(src->type.rank, v->type.rank);
            assert_memory_equal(src->type.dims, v->type.dims, sizeof(int64_t) * (size_t)v->type.rank);
        }
        if (p->slots[src->id].offset != s->offset || p->slots[src->id].size != s->size)
            fail_msg("%s: '%s' is in place but not at its input's bytes", what, v->name);
    }
    /* Every pair. */
    for (int i = 0; i < nv; i++) {
        const af_plan_slot *a = &p->slots[i];
        if (a->offset < 0) continue;
        for (int j = i + 1; j < nv; j++) {
            const af_plan_slot *b = &p->slots[j];
            if (b->offset < 0) continue;
            bool time = def[i] <= last[j] && def[j] <= last[i];
            bool bytes = (uint64_t)a->offset < (uint64_t)b->offset + b->size &&
                         (uint64_t)b->offset < (uint64_t)a->offset + a->size;
            if (time && bytes && root_of(p, i) != root_of(p, j))
                fail_msg("%s: '%s' and '%s' are live at once and overlap", what,
                         g->values[i]->name, g->values[j]->name);
        }
    }
    /* The lower bound: per node, the bytes of the distinct chains live there. */
    for (int t = 0; t < g->nnodes; t++) {
        uint64_t sum = 0;
        for (int r = 0; r < nv; r++) {
            if (p->slots[r].offset < 0 || p->slots[r].inplace_of >= 0) continue;
            int lo = def[r], hi = last[r];
            for (int i = 0; i < nv; i++)
                if (p->slots[i].offset >= 0 && p->slots[i].inplace_of >= 0 && root_of(p, i) == r &&
                    last[i] > hi)
                    hi = last[i];
            if (lo <= t && t <= hi) sum += p->slots[r].size;
        }
        if (sum > st.bound) st.bound = sum;
    }
    assert_int_equal(st.bound, p->lower_bound);
    assert_int_equal(st.planned, p->nplanned);
    assert_int_equal(st.inplace, p->ninplace);
    if (st.bound && st.arena * 5 > st.bound * 6)
        fail_msg("%s: arena %llu bytes is more than 1.2 x the lower bound %llu", what,
                 (unsigned long long)st.arena, (unsigned long long)st.bound);
    free(def);
    free(last);
    return st;
}

/* ---- planned and unplanned runs ----------------------------------------------------------------- */

static bool same_bits(const af_tensor *a, const af_tensor *b) {
    if (a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return !a->nbytes || !memcmp(a->data, b->data, a->nbytes);
}

static void release_all(af_tensor *t, int n) {
    for (int i = 0; i < n; i++) af_tensor_release(&t[i]);
}

/* Run g without and with p (twice, over an arena of garbage) and compare bit for bit. Returns
 * false when the unplanned run itself fails (a model the executor does not run). */
static bool compare_runs(const af_graph *g, const af_plan *p, const af_tensor *const *inputs,
                         const char *what) {
    int n = g->noutputs;
    af_tensor *a = calloc((size_t)n + 1, sizeof *a), *b = calloc((size_t)n + 1, sizeof *b);
    af_error err;
    if (af_exec_graph(g, inputs, a, &err)) {
        if (getenv("AF_TEST_VERBOSE")) printf("%s: does not run: %s\n", what, err.message);
        free(a);
        free(b);
        return false;
    }
    void *arena = p->arena_size ? aligned_alloc(64, (size_t)p->arena_size) : NULL;
    if (arena) memset(arena, 0xa5, (size_t)p->arena_size);
    for (int rep = 0; rep < 2; rep++) {
        if (af_exec_graph_planned(g, p, arena, NULL, inputs, b, &err))
            fail_msg("%s: the planned run fails: %s", what, err.message);
        for (int i = 0; i < n; i++)
            if (!same_bits(&a[i], &b[i]))
                fail_msg("%s: output %d of the planned run %d differs", what, i, rep);
        release_all(b, n);
    }
    release_all(a, n);
    free(arena);
    free(a);
    free(b);
    return true;
}

/* ---- hand-built chains ---------------------------------------------------------------------------- */

static af_value *input(af_graph *g, const char *name, int rank, const int64_t *dims) {
    af_value *v = af_value_new(g, name);
    v->type.dtype = AF_DTYPE_FLOAT;
    v->type.rank = rank;
    memcpy(v->type.dims, dims, sizeof(int64_t) * (size_t)rank);
    v->is_input = true;
    g->inputs[g->ninputs++] = v;
    return v;
}

static af_value *konst(af_graph *g, const char *name, af_dtype dt, int rank, const int64_t *dims,
                       const void *data) {
    af_value *v = af_value_new_const(g, name, dt, rank, dims);
    memcpy(v->type.data, data, v->type.nbytes);
    return v;
}

/* Node `op` reading in[0..nin) and writing one new value called `name`. */
static af_value *op(af_graph *g, const char *type, const char *name, int nin, af_value *const *in) {
    af_node *n = af_node_new(g, af_op_lookup("", type), name, nin, 1);
    assert_non_null(n);
    n->domain = "";
    for (int k = 0; k < nin; k++) af_node_set_input(n, k, in[k]);
    af_node_set_output(n, 0, af_value_new(g, name));
    return n->out[0];
}

static void output(af_graph *g, af_value *v) {
    v->is_output = true;
    g->outputs[g->noutputs++] = v;
}

static void finish_graph(af_graph *g) {
    af_error err;
    if (af_graph_infer_shapes(g, &err) || af_graph_verify(g, &err)) fail_msg("%s", err.message);
}

static const af_value *find(const af_graph *g, const char *name) {
    for (int i = 0; i < g->nvalues; i++)
        if (!strcmp(g->values[i]->name, name)) return g->values[i];
    fail_msg("no value '%s'", name);
    return NULL;
}

static const char *over(const af_graph *g, const af_plan *p, const char *name) {
    int src = p->slots[find(g, name)->id].inplace_of;
    return src < 0 ? "-" : g->values[src]->name;
}

static void random_inputs(const af_graph *g, af_tensor *in, const af_tensor **bound) {
    uint32_t r = 99;
    for (int i = 0; i < g->ninputs; i++) {
        memset(&in[i], 0, sizeof in[i]);
        in[i].dtype = g->inputs[i]->type.dtype;
        in[i].rank = g->inputs[i]->type.rank;
        memcpy(in[i].dims, g->inputs[i]->type.dims, sizeof in[i].dims);
        assert_int_equal(af_tensor_alloc(&in[i], NULL), AF_OK);
        for (size_t k = 0; k < in[i].nbytes / 4; k++) {
            r = r * 1664525u + 1013904223u;
            ((float *)in[i].data)[k] = (float)(r >> 8) / (float)(1u << 23) - 1.0f;
        }
        bound[i] = &in[i];
    }
}

/* x -> Relu r -> Sigmoid s -> Add(s, c) a -> Mul(a, a) m -> Reshape rs -> Tanh t -> Mul(t, x) y:
 * s over r, a over s, rs over m, t over rs; not m (a is read twice), not y (an output).
 * Plus Add(c, x): its output is larger than input 0, never in place; and a value read by two
 * later nodes, never overwritten before the second. */
static void test_chain_inplace(void **state) {
    (void)state;
    af_arena *ar = af_arena_new();
    af_graph *g = tu_graph(ar, "chain", 8);
    int64_t xd[] = {2, 3, 4}, cd[] = {4}, sd[] = {2};
    float c[4] = {0.5f, -1, 2, 0.25f};
    int64_t shape[2] = {4, 6}, shape3[3] = {2, 3, 4}, s3d[] = {3};
    af_value *x = input(g, "x", 3, xd), *cv = konst(g, "c", AF_DTYPE_FLOAT, 1, cd, c);
    af_value *sh = konst(g, "shape", AF_DTYPE_INT64, 1, sd, shape);
    af_value *r = op(g, "Relu", "r", 1, &x);
    af_value *s = op(g, "Sigmoid", "s", 1, &r);
    af_value *a = op(g, "Add", "a", 2, (af_value *[]){s, cv});
    af_value *m = op(g, "Mul", "m", 2, (af_value *[]){a, a});
    af_value *rs = op(g, "Reshape", "rs", 2, (af_value *[]){m, sh});
    af_value *t = op(g, "Tanh", "t", 1, &rs);
    af_value *b = op(g, "Add", "b", 2, (af_value *[]){cv, x});  /* [4] + [2,3,4] */
    af_value *bt = op(g, "Tanh", "bt", 1, &b);                 /* b is read again below */
    af_value *b2 = op(g, "Sub", "b2", 2, (af_value *[]){b, bt});
    af_value *sh3 = konst(g, "shape3", AF_DTYPE_INT64, 1, s3d, shape3);
    af_value *t2 = op(g, "Reshape", "t2", 2, (af_value *[]){t, sh3});
    af_value *y = op(g, "Mul", "y", 2, (af_value *[]){t2, b2});
    output(g, y);
    finish_graph(g);
    af_plan *p = NULL;
    af_error err;
    assert_int_equal(af_plan_build(g, &p, &err), AF_OK);
    verify_plan(g, p, "chain");
    assert_string_equal(over(g, p, "r"), "-");
    assert_string_equal(over(g, p, "s"), "r");
    assert_string_equal(over(g, p, "a"), "s");
    assert_string_equal(over(g, p, "m"), "-");
    assert_string_equal(over(g, p, "rs"), "m");
    assert_string_equal(over(g, p, "t"), "rs");
    assert_string_equal(over(g, p, "b"), "-");  /* larger than c */
    assert_string_equal(over(g, p, "bt"), "-"); /* b is read by b2 later */
    assert_string_equal(over(g, p, "b2"), "b"); /* Sub(b, bt): b dies here */
    assert_string_equal(over(g, p, "t2"), "t");
    assert_int_equal(p->slots[y->id].offset, -1);
    af_tensor in[1];
    const af_tensor *bound[1];
    random_inputs(g, in, bound);
    assert_true(compare_runs(g, p, bound, "chain"));
    af_tensor_release(&in[0]);
    af_plan_free(p);
    af_arena_free(ar);
}

/* A subgraph reading an intermediate keeps it alive until the node that owns the subgraph has
 * run: If(cond) whose branches read `h` captured from the main graph. */
static void test_capture_keeps_alive(void **state) {
    (void)state;
    af_arena *ar = af_arena_new();
    af_graph *g = tu_graph(ar, "chain", 8);
    int64_t xd[] = {8}, one[] = {1};
    uint8_t yes = 1;
    af_value *x = input(g, "x", 1, xd);
    af_value *h = op(g, "Relu", "h", 1, &x);
    af_value *k = op(g, "Sigmoid", "k", 1, &x);
    af_value *cond = konst(g, "cond", AF_DTYPE_BOOL, 0, one, &yes);
    af_graph *then = af_graph_new(ar, "chain", g), *other = af_graph_new(ar, "chain", g);
    af_graph *br[2] = {then, other};
    for (int i = 0; i < 2; i++) {
        br[i]->name = i ? "else" : "then";
        br[i]->outputs = af_arena_calloc(ar, 2, sizeof(af_value *));
        af_value *cap = af_graph_find(br[i], "h");
        af_node *n = af_node_new(br[i], af_op_lookup("", i ? "Neg" : "Abs"), i ? "neg" : "abs", 1, 1);
        n->domain = "";
        af_node_set_input(n, 0, cap);
        af_node_set_output(n, 0, af_value_new(br[i], i ? "o_else" : "o_then"));
        n->out[0]->is_output = true;
        br[i]->outputs[br[i]->noutputs++] = n->out[0];
    }
    af_node *iff = af_node_new(g, AF_OP_IF, "if", 1, 1);
    iff->domain = "";
    af_node_set_input(iff, 0, cond);
    af_node_set_output(iff, 0, af_value_new(g, "f"));
    af_node_add_attr(iff, "then_branch", AF_ATTR_GRAPH)->g = then;
    af_node_add_attr(iff, "else_branch", AF_ATTR_GRAPH)->g = other;
    af_value *z = op(g, "Add", "z", 2, (af_value *[]){iff->out[0], k});
    output(g, z);
    finish_graph(g);
    af_plan *p = NULL;
    af_error err;
    assert_int_equal(af_plan_build(g, &p, &err), AF_OK);
    verify_plan(g, p, "capture");
    /* h (read by the If) and k (read after it) are both planned and never share bytes. */
    const af_plan_slot *sh = &p->slots[h->id], *sk = &p->slots[k->id];
    assert_true(sh->offset >= 0 && sk->offset >= 0);
    assert_true(sh->offset != sk->offset);
    assert_int_equal(p->slots[iff->out[0]->id].offset, -1); /* control flow: not planned */
    af_tensor in[1];
    const af_tensor *bound[1];
    random_inputs(g, in, bound);
    assert_true(compare_runs(g, p, bound, "capture"));
    af_tensor_release(&in[0]);
    af_plan_free(p);
    af_arena_free(ar);
}

/* ---- real models ------------------------------------------------------------------------------ */

static const char *models_dir(void) {
    const char *d = getenv("AF_PLAN_MODELS");
    if (!d || access(d, R_OK)) {
        printf("AF_PLAN_MODELS is not set (tests/gen_plan_models.py writes the models): skipped\n");
        return NULL;
    }
    return d;
}

/* Load NAME.onnx (optimized when asked) and its inputs NAME.in<i>.npy. */
static af_model *load_model(const char *name, bool optimized, af_tensor *in, const af_tensor **bound) {
    char path[1024];
    af_model *m = NULL;
    af_error err;
    snprintf(path, sizeof path, "%s/%s.onnx", models_dir(), name);
    if (tu_load(path, &m, &err)) fail_msg("%s", err.message);
    if (optimized && af_optimize(m->graph, NULL, NULL, &err)) fail_msg("%s", err.message);
    for (int i = 0; i < m->graph->ninputs; i++) {
        snprintf(path, sizeof path, "%s/%s.in%d.npy", models_dir(), name, i);
        if (af_tensor_load_npy(path, &in[i], &err)) fail_msg("%s", err.message);
        bound[i] = &in[i];
    }
    return m;
}

static void check_model(const char *name, bool optimized) {
    af_tensor in[4];
    const af_tensor *bound[4];
    af_model *m = load_model(name, optimized, in, bound);
    af_plan *p = NULL;
    af_error err;
    char what[128];
    snprintf(what, sizeof what, "%s%s", name, optimized ? " (optimized)" : "");
    if (af_plan_build(m->graph, &p, &err)) fail_msg("%s: %s", what, err.message);
    plan_stats s = verify_plan(m->graph, p, what);
    printf("%-24s %4d nodes, %4d planned, %3d in place: arena %9llu bytes, lower bound %9llu, "
           "ratio %.3f\n", what, m->graph->nnodes, s.planned, s.inplace,
           (unsigned long long)s.arena, (unsigned long long)s.bound, af_plan_ratio(p));
    assert_true(s.planned > 0);
    if (!compare_runs(m->graph, p, bound, what)) fail_msg("%s: does not run", what);
    af_plan_free(p);
    for (int i = 0; i < m->graph->ninputs; i++) af_tensor_release(&in[i]);
    af_model_free(m);
}

static void test_real_models(void **state) {
    (void)state;
    if (!models_dir()) skip();
    static const char *names[] = {"testmodel", "resnet18", "bert_small"};
    for (size_t i = 0; i < AF_COUNT(names); i++) {
        check_model(names[i], false);
        check_model(names[i], true);
    }
}

/* ---- every conformance model ------------------------------------------------------------------ */

#define DATA "/usr/share/libonnx-testdata/data"
static const char *suites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

/* Inputs of test_data_set_0 bound to g's inputs (by the file's name, else by position). */
static int load_pb_inputs(const char *dir, const af_graph *g, af_tensor *in, const af_tensor **bound) {
    char path[4096];
    int n = 0;
    for (; n < 64; n++) {
        char *name = NULL;
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, n);
        if (access(path, R_OK)) break;
        if (af_tensor_load_pb(path, &in[n], &name, NULL)) return -1;
        int k = n;
        for (int j = 0; name && j < g->ninputs; j++)
            if (!strcmp(name, g->inputs[j]->name)) k = j;
        free(name);
        if (k < g->ninputs) {
            if (g->inputs[k]->type.dtype == AF_DTYPE_BFLOAT16 && in[n].dtype == AF_DTYPE_UINT16)
                in[n].dtype = AF_DTYPE_BFLOAT16;
            bound[k] = &in[n];
        }
    }
    return n;
}

typedef struct conf_tally {
    int models, planned_models, ran, values, inplace;
    double worst;
    char worst_id[1100];
} conf_tally;

static void conformance_case(const char *dir, const char *id, bool optimized, conf_tally *t) {
    char path[4096];
    af_model *m = NULL;
    af_error err;
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (tu_load(path, &m, &err)) return;
    if (m->graph->ninputs > 64 || (optimized && af_optimize(m->graph, NULL, NULL, &err))) {
        af_model_free(m);
        return;
    }
    af_plan *p = NULL;
    if (af_plan_build(m->graph, &p, &err)) fail_msg("%s: %s", id, err.message);
    plan_stats s = verify_plan(m->graph, p, id);
    t->models++;
    t->planned_models += s.planned > 0;
    t->values += s.planned;
    t->inplace += s.inplace;
    if (af_plan_ratio(p) > t->worst) {
        t->worst = af_plan_ratio(p);
        snprintf(t->worst_id, sizeof t->worst_id, "%s", id);
    }
    af_tensor in[64] = {{0}};
    const af_tensor *bound[64] = {0};
    int nin = load_pb_inputs(dir, m->graph, in, bound);
    if (nin >= 0 && compare_runs(m->graph, p, bound, id)) t->ran++;
    for (int i = 0; i < nin; i++) af_tensor_release(&in[i]);
    af_plan_free(p);
    af_model_free(m);
}

static void conformance_plans(bool optimized) {
    conf_tally t = {0};
    if (access(DATA, R_OK)) skip();
    for (size_t s = 0; s < AF_COUNT(suites); s++) {
        char sdir[1024];
        snprintf(sdir, sizeof sdir, "%s/%s", DATA, suites[s]);
        DIR *d = opendir(sdir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "test_", 5)) continue;
            char dir[2048], id[1100];
            snprintf(dir, sizeof dir, "%s/%s", sdir, e->d_name);
            snprintf(id, sizeof id, "%s/%s%s", suites[s], e->d_name, optimized ? " (optimized)" : "");
            conformance_case(dir, id, optimized, &t);
        }
        closedir(d);
    }
    printf("conformance plans%s: %d models, %d with planned values (%d values, %d in place), %d "
           "runs identical with and without the plan; worst ratio %.3f (%s)\n",
           optimized ? " (optimized)" : "", t.models, t.planned_models, t.values, t.inplace,
           t.ran, t.worst, t.worst_id);
    assert_true(t.models > 900);
    assert_true(t.ran > 900);
}

static void test_conformance_plans(void **state) {
    (void)state;
    conformance_plans(false);
}

static void test_conformance_optimized_plans(void **state) {
    (void)state;
    conformance_plans(true);
}

/* ---- sessions ---------------------------------------------------------------------------------- */

/* A session plans its graph and runs twice in its arena, as af_exec_graph does without it. */
static void test_session_runs_planned(void **state) {
    (void)state;
    if (!models_dir()) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/testmodel.onnx", models_dir());
    af_session *s = NULL;
    af_error err;
    if (af_session_new(path, NULL, &s, &err)) fail_msg("%s", err.message);
    const af_plan *p = af_session_plan(s);
    assert_non_null(p);
    assert_true(p->nplanned > 0);
    af_tensor x = {0};
    snprintf(path, sizeof path, "%s/testmodel.in0.npy", models_dir());
    assert_int_equal(af_tensor_load_npy(path, &x, &err), AF_OK);
    const char *names[] = {af_session_input_name(s, 0)};
    const af_tensor *inputs[] = {&x};
    af_tensor *o1[1] = {NULL}, *o2[1] = {NULL};
    assert_int_equal(af_session_run(s, names, inputs, 1, o1, &err), AF_OK);
    assert_int_equal(af_session_run(s, names, inputs, 1, o2, &err), AF_OK);
    assert_true(same_bits(o1[0], o2[0]));
    af_tensor ref[1] = {{0}};
    const af_tensor *bound[] = {&x};
    assert_int_equal(af_exec_graph(af_session_model(s)->graph, bound, ref, &err), AF_OK);
    assert_true(same_bits(o1[0], &ref[0]));
    af_tensor_release(&ref[0]);
    af_tensor_free(o1[0]);
    af_tensor_free(o2[0]);
    af_tensor_release(&x);
    af_session_free(s);
}

/* int64 [b, t] BERT inputs: ids (i*7 + j) % 900 + 1, mask 1 except the last `pad` of row 1. */
static void bert_inputs(int64_t b, int64_t t, int64_t pad, af_tensor *ids, af_tensor *mask) {
    af_error err;
    const int64_t dims[2] = {b, t};
    af_tensor_set_type(ids, AF_DTYPE_INT64, 2, dims);
    af_tensor_set_type(mask, AF_DTYPE_INT64, 2, dims);
    assert_int_equal(af_tensor_alloc(ids, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(mask, &err), AF_OK);
    for (int64_t i = 0; i < b * t; i++) {
        ((int64_t *)ids->data)[i] = (i * 7) % 900 + 1;
        ((int64_t *)mask->data)[i] = !(i / t == 1 && i % t >= t - pad);
    }
}

/* One run of the dynamic BERT at [b, t]: the same bits as the unplanned executor; returns the
 * plan it used. */
static const af_plan *run_shape(af_session *s, int64_t b, int64_t t) {
    af_tensor ids = {0}, mask = {0};
    af_error err;
    bert_inputs(b, t, t / 3, &ids, &mask);
    const char *names[] = {"input_ids", "attention_mask"};
    const af_tensor *inputs[] = {&ids, &mask};
    af_tensor *out[2] = {NULL, NULL}, ref[2] = {{0}, {0}};
    if (af_session_run(s, names, inputs, 2, out, &err)) fail_msg("%s", err.message);
    assert_int_equal(af_exec_graph(af_session_model(s)->graph, inputs, ref, &err), AF_OK);
    for (int o = 0; o < 2; o++) {
        assert_int_equal(out[o]->dims[0], b);
        assert_true(same_bits(out[o], &ref[o]));
        af_tensor_free(out[o]);
        af_tensor_release(&ref[o]);
    }
    af_tensor_release(&ids);
    af_tensor_release(&mask);
    return af_session_last_plan(s);
}

/* A dynamic model plans per shape signature: a new shape gets a plan that places the values
 * whose compiled dims are symbolic (in place where the op allows), a shape seen before reuses
 * its plan (and arena), and the fifth new shape evicts the least recently used. */
static void test_plans_per_shape(void **state) {
    (void)state;
    if (!models_dir()) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/bert_dynamic.onnx", models_dir());
    af_session *s = NULL;
    af_error err;
    if (af_session_new(path, NULL, &s, &err)) fail_msg("%s", err.message);
    const af_plan *compiled = af_session_plan(s);
    const af_plan *a = run_shape(s, 2, 16), *b = run_shape(s, 3, 7);
    assert_ptr_not_equal(a, compiled);
    assert_ptr_not_equal(a, b);
    assert_true(a->nplanned > compiled->nplanned);
    /* views and activations of values whose compiled dims are symbolic go in place too */
    assert_true(a->ninplace > compiled->ninplace);
    assert_ptr_equal(run_shape(s, 2, 16), a); /* back to an earlier shape: its plan */
    run_shape(s, 1, 5);
    run_shape(s, 4, 9);
    run_shape(s, 1, 11); /* a fifth signature: 3 x 7, used least recently, goes */
    assert_ptr_equal(run_shape(s, 2, 16), a);
    af_session_free(s);
}

/* Allocations of one run of s at b x t (af_alloc_count). */
static int64_t run_allocations(af_session *s, int64_t b, int64_t t, af_status *st, af_error *err) {
    af_tensor ids = {0}, mask = {0};
    bert_inputs(b, t, 0, &ids, &mask);
    const char *names[] = {"input_ids", "attention_mask"};
    const af_tensor *inputs[] = {&ids, &mask};
    af_tensor *out[2] = {NULL, NULL};
    af_alloc_fault(0, false);
    *st = af_session_run(s, names, inputs, 2, out, err);
    int64_t n = af_alloc_count();
    af_tensor_free(out[0]);
    af_tensor_free(out[1]);
    af_tensor_release(&ids);
    af_tensor_release(&mask);
    return n;
}

/* --input_shape_range: the smallest and largest shapes are planned when the session is made
 * (their first run allocates no more than a repeated one), shapes outside are refused naming
 * the input and the dim, and a malformed range is an error naming the input. */
static void test_shape_ranges(void **state) {
    (void)state;
    if (!models_dir()) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/bert_dynamic.onnx", models_dir());
    af_options opt;
    af_options_init(&opt);
    opt.input_shape_range = "input_ids:1~4,2~16;attention_mask:1~4,2~16";
    af_session *s = NULL, *plain = NULL;
    af_error err;
    af_status st;
    if (af_session_new(path, &opt, &s, &err)) fail_msg("%s", err.message);
    if (af_session_new(path, NULL, &plain, &err)) fail_msg("%s", err.message);
    /* a first run inside the range (planned now) makes what every session makes once */
    run_allocations(s, 3, 9, &st, &err);
    assert_int_equal(st, AF_OK);
    run_allocations(plain, 3, 9, &st, &err);
    for (int k = 0; k < 2; k++) {
        int64_t b = k ? 4 : 1, t = k ? 16 : 2;
        int64_t first = run_allocations(s, b, t, &st, &err), again = run_allocations(s, b, t, &st, &err);
        assert_int_equal(st, AF_OK);
        int64_t plain_first = run_allocations(plain, b, t, &st, &err);
        int64_t plain_again = run_allocations(plain, b, t, &st, &err);
        assert_int_equal(again, plain_again);
        /* planned already: at most the kernels' scratch grows (to the largest shape's) */
        assert_true(first <= again + 1);
        assert_true(plain_first > first + 2); /* signature, plan, arena */
    }
    run_allocations(s, 2, 17, &st, &err);
    assert_int_equal(st, AF_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "input 'input_ids' dim 1 is 17, outside the range 2~16"));
    af_session_free(s);
    af_session_free(plain);
    static const char *bad[][2] = {{"input_ids:1~4", "'input_ids' has rank 2, not 1"},
                                   {"input_ids:4~1,2", "bad dims for 'input_ids'"},
                                   {"input_ids:1,2;nope:1", "no input 'nope'"},
                                   {"input_ids", "is not name:"}};
    for (size_t i = 0; i < AF_COUNT(bad); i++) {
        opt.input_shape_range = bad[i][0];
        assert_int_equal(af_session_new(path, &opt, &s, &err), AF_ERR_INVALID_ARG);
        if (!strstr(err.message, bad[i][1])) fail_msg("%s: %s", bad[i][0], err.message);
    }
}

/* ---- concurrent runs -------------------------------------------------------------------------- */

enum { CONC_THREADS = 8, CONC_RUNS = 6 };

typedef struct conc_arg {
    af_session *s;
    const af_tensor *in[2][2]; /* two shapes: ids, mask */
    af_tensor *want[2][2]; /* per shape, both outputs */
    _Atomic int bad;
} conc_arg;

static void *conc_worker(void *p) {
    conc_arg *a = p;
    const char *names[] = {"input_ids", "attention_mask"};
    for (int r = 0; r < CONC_RUNS; r++) {
        af_tensor *out[2] = {NULL, NULL};
        af_error err;
        int k = r % 2;
        if (af_session_run(a->s, names, a->in[k], 2, out, &err) != AF_OK ||
            !same_bits(out[0], a->want[k][0]) || !same_bits(out[1], a->want[k][1]))
            atomic_store(&a->bad, 1);
        af_tensor_free(out[0]);
        af_tensor_free(out[1]);
    }
    return NULL;
}

/* 8 threads run one session (2 worker threads, a dynamic model, two shapes in turn): every
 * result has the bits of a run made alone. */
static void test_threads_concurrent_runs(void **state) {
    (void)state;
    if (!models_dir()) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/bert_dynamic.onnx", models_dir());
    af_options opt;
    af_options_init(&opt);
    opt.threads = 2;
    af_session *s = NULL;
    af_error err;
    if (af_session_new(path, &opt, &s, &err)) fail_msg("%s", err.message);
    conc_arg a = {s, {{0}}, {{0}}, 0};
    af_tensor in[2][2] = {{{0}}};
    const char *names[] = {"input_ids", "attention_mask"};
    for (int k = 0; k < 2; k++) {
        bert_inputs(k ? 3 : 2, k ? 7 : 16, 2, &in[k][0], &in[k][1]);
        a.in[k][0] = &in[k][0], a.in[k][1] = &in[k][1];
        if (af_session_run(s, names, a.in[k], 2, a.want[k], &err)) fail_msg("%s", err.message);
    }
    pthread_t t[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, conc_worker, &a), 0);
    for (int i = 0; i < CONC_THREADS; i++) pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&a.bad), 0);
    for (int k = 0; k < 2; k++) {
        af_tensor_free(a.want[k][0]);
        af_tensor_free(a.want[k][1]);
        af_tensor_release(&in[k][0]);
        af_tensor_release(&in[k][1]);
    }
    af_session_free(s);
}

/* ---- .afm ------------------------------------------------------------------------------------- */

/* The plan of `b` (a loaded graph) is `a`'s, value by value (matched by name). */
static void expect_same_plan(const af_graph *ga, const af_plan *a, const af_graph *gb,
                             const af_plan *b) {
    assert_int_equal(a->arena_size, b->arena_size);
    assert_int_equal(a->lower_bound, b->lower_bound);
    assert_int_equal(a->nplanned, b->nplanned);
    assert_int_equal(a->ninplace, b->ninplace);
    for (int i = 0; i < ga->nvalues; i++) {
        const af_plan_slot *sa = &a->slots[i];
        if (sa->offset < 0) continue;
        const af_value *vb = find(gb, ga->values[i]->name);
        const af_plan_slot *sb = &b->slots[vb->id];
        assert_int_equal(sa->offset, sb->offset);
        assert_int_equal(sa->size, sb->size);
        assert_int_equal(sa->inplace_of < 0, sb->inplace_of < 0);
        if (sa->inplace_of >= 0)
            assert_string_equal(ga->values[sa->inplace_of]->name, gb->values[sb->inplace_of]->name);
    }
}

static void test_afm_round_trip(void **state) {
    (void)state;
    if (!models_dir()) skip();
    static const char *names[] = {"testmodel", "bert_small"};
    for (size_t k = 0; k < AF_COUNT(names); k++) {
        af_tensor in[4];
        const af_tensor *bound[4];
        af_model *m = load_model(names[k], true, in, bound), *l = NULL;
        af_plan *p = NULL, *q = NULL;
        af_error err;
        const char *path = tmp_path("model.afm");
        assert_int_equal(af_plan_build(m->graph, &p, &err), AF_OK);
        if (af_afm_save(path, m->graph, NULL, &err)) fail_msg("%s", err.message);
        if (af_afm_load_with_plan(path, &l, NULL, &q, &err)) fail_msg("%s", err.message);
        assert_non_null(q);
        expect_same_plan(m->graph, p, l->graph, q);
        verify_plan(l->graph, q, names[k]);
        assert_true(compare_runs(l->graph, q, bound, names[k]));
        /* A session on the file takes its plan. */
        af_session *s = NULL;
        if (af_session_new(path, NULL, &s, &err)) fail_msg("%s", err.message);
        expect_same_plan(m->graph, p, af_session_model(s)->graph, af_session_plan(s));
        af_session_free(s);
        /* inspect shows the arena. */
        char *text = NULL, want[160];
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_int_equal(cli_inspect(path, f, &err), AF_OK);
        fclose(f);
        snprintf(want, sizeof want, "arena: %llu bytes (lower bound %llu, ratio %.3f)",
                 (unsigned long long)p->arena_size, (unsigned long long)p->lower_bound,
                 af_plan_ratio(p));
        if (!strstr(text, want)) fail_msg("inspect lacks '%s':\n%s", want, text);
        free(text);
        af_plan_free(p);
        af_plan_free(q);
        af_model_free(l);
        for (int i = 0; i < m->graph->ninputs; i++) af_tensor_release(&in[i]);
        af_model_free(m);
    }
}

/* A file without a plan loads with none and still runs; a plan of another shape than ours (every
 * value apart, nothing in place) is accepted and runs the same. */
static void test_afm_other_plans(void **state) {
    (void)state;
    if (!models_dir()) skip();
    af_tensor in[1];
    const af_tensor *bound[1];
    af_model *m = load_model("testmodel", false, in, bound), *l = NULL;
    af_plan *q = (af_plan *)1;
    af_error err;
    const char *path = tmp_path("noplan.afm");
    assert_int_equal(af_afm_save_with_plan(path, m->graph, NULL, NULL, &err), AF_OK);
    assert_int_equal(af_afm_load_with_plan(path, &l, NULL, &q, &err), AF_OK);
    assert_null(q);
    af_model_free(l);
    af_session *s = NULL;
    if (af_session_new(path, NULL, &s, &err)) fail_msg("%s", err.message);
    assert_non_null(af_session_plan(s)); /* made at load */
    const char *names[] = {af_session_input_name(s, 0)};
    af_tensor *out[1] = {NULL};
    assert_int_equal(af_session_run(s, names, bound, 1, out, &err), AF_OK);
    af_tensor_free(out[0]);
    af_session_free(s);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(cli_inspect(path, f, &err), AF_OK);
    fclose(f);
    assert_non_null(strstr(text, "arena: not planned"));
    free(text);

    af_plan *p = NULL, *apart = af_plan_new(m->graph->nvalues);
    assert_int_equal(af_plan_build(m->graph, &p, &err), AF_OK);
    for (int i = 0; i < m->graph->nvalues; i++)
        if (p->slots[i].offset >= 0) {
            apart->slots[i] = (af_plan_slot){(int64_t)apart->arena_size, p->slots[i].size, -1};
            apart->arena_size += p->slots[i].size;
        }
    path = tmp_path("apart.afm");
    assert_int_equal(af_afm_save_with_plan(path, m->graph, NULL, apart, &err), AF_OK);
    if (af_afm_load_with_plan(path, &l, NULL, &q, &err)) fail_msg("%s", err.message);
    assert_int_equal(q->arena_size, apart->arena_size);
    assert_true(compare_runs(l->graph, q, bound, "apart"));
    /* Saving a plan that does not hold is refused. */
    for (int i = 0; i < m->graph->nvalues; i++)
        if (apart->slots[i].offset > 0) apart->slots[i].offset = 0;
    assert_int_equal(af_afm_save_with_plan(tmp_path("bad.afm"), m->graph, NULL, apart, &err),
                     AF_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "overlap"));
    af_plan_free(q);
    af_plan_free(p);
    af_plan_free(apart);
    af_model_free(l);
    af_tensor_release(&in[0]);
    af_model_free(m);
}

/* The header (afm.h): a table of 12 sections from byte 32, 32 bytes each; the plan is section
 * 10; the header's checksum is its last 8 of 424 bytes. Plan: u64 arena, u32 n, u32 0, then n
 * entries {u32 value, u32 in place over, u64 offset, u64 size}. */
enum { NSEC = 12, HDR = 32 + NSEC * 32 + 8, SEC_PLAN = 10, ENTRY = 24 };

static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void wr64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

static void forge_checksums(unsigned char *b) {
    for (int s = 0; s < NSEC; s++) {
        unsigned char *e = b + 32 + 32 * s;
        wr64(e + 24, af_afm_section_hash(b + rd64(e + 8), rd64(e + 16)));
    }
    wr64(b + HDR - 8, XXH64(b, HDR - 8, 0));
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void expect_refused(unsigned char *b, size_t len, const char *needle, const char *what) {
    const char *path = tmp_path("forged.afm");
    af_model *m = (af_model *)1;
    af_plan *p = (af_plan *)1;
    af_error err;
    forge_checksums(b);
    write_bytes(path, b, len);
    af_status st = af_afm_load_with_plan(path, &m, NULL, &p, &err);
    if (st == AF_OK) fail_msg("%s: loaded", what);
    assert_null(m);
    assert_null(p);
    assert_memory_equal(err.message, path, strlen(path));
    if (!strstr(err.message, needle)) fail_msg("%s: '%s' lacks '%s'", what, err.message, needle);
    /* A session refuses it too. */
    af_session *s = (af_session *)1;
    assert_int_not_equal(af_session_new(path, NULL, &s, &err), AF_OK);
    assert_null(s);
}

static void test_forged_plans(void **state) {
    (void)state;
    if (!models_dir()) skip();
    af_tensor in[1];
    const af_tensor *bound[1];
    af_model *m = load_model("testmodel", false, in, bound);
    af_error err;
    const char *path = tmp_path("good.afm");
    assert_int_equal(af_afm_save(path, m->graph, NULL, &err), AF_OK);
    unsigned char *good;
    size_t len;
    assert_int_equal(af_read_file(path, &good, &len), 0);
    unsigned char *b = malloc(len);
    uint64_t plan = rd64(good + 32 + 32 * SEC_PLAN + 8);
    uint64_t arena = rd64(good + plan);
    uint32_t n;
    memcpy(&n, good + plan + 8, 4);
    assert_true(n >= 3);
    unsigned char *e0 = b + plan + 16, *e1 = e0 + ENTRY;
    uint32_t none = UINT32_MAX;

    memcpy(b, good, len); /* everything at offset 0, nothing in place */
    for (uint32_t i = 0; i < n; i++) {
        wr64(e0 + ENTRY * i + 8, 0);
        memcpy(e0 + ENTRY * i + 4, &none, 4);
    }
    expect_refused(b, len, "overlap", "all at offset 0");
    memcpy(b, good, len);
    wr64(e0 + 8, arena);
    expect_refused(b, len, "inside the arena", "an offset at the arena's end");
    memcpy(b, good, len);
    wr64(e0 + 8, (uint64_t)1 << 62);
    expect_refused(b, len, "beyond any arena", "a huge offset");
    memcpy(b, good, len);
    wr64(b + plan, arena - 64);
    expect_refused(b, len, "inside the arena", "a short arena");
    memcpy(b, good, len);
    wr64(e0 + 8, rd64(e0 + 8) + 8);
    expect_refused(b, len, "aligned", "a misaligned offset");
    memcpy(b, good, len);
    wr64(e0 + 16, rd64(e0 + 16) + 64);
    expect_refused(b, len, "needs", "a wrong size");
    memcpy(b, good, len); /* entry 1 in place over entry 0's value */
    memcpy(e1 + 4, e0, 4);
    expect_refused(b, len, "may not overwrite", "in place where not allowed");
    memcpy(b, good, len);
    memcpy(e1, e0, 4);
    expect_refused(b, len, "next value", "a value planned twice");
    memcpy(b, good, len); /* a graph input planned */
    uint32_t zero = 0;
    memcpy(e0, &zero, 4);
    expect_refused(b, len, "cannot be planned", "a graph input");

    free(b);
    free(good);
    af_tensor_release(&in[0]);
    af_model_free(m);
}

/* ---- setup ------------------------------------------------------------------------------------ */

/* ---- the parallel loop ---------------------------------------------------------------------- */

enum { PAR_MAX_PIECES = 4096 };

typedef struct par_ctx {
    int64_t n;
    int slots, slow;              /* slot `slow` (-1: none) sleeps after each of its pieces */
    double ns;                    /* the work the loop is said to be */
    _Atomic int busy[AF_EXEC_MAX_SLOTS], bad, npieces;
    struct { int64_t b, e; int slot; } piece[PAR_MAX_PIECES];
} par_ctx;

static void par_piece(void *p, int slot, int64_t b, int64_t e) {
    par_ctx *c = p;
    if (slot < 0 || slot >= c->slots || b >= e || atomic_exchange(&c->busy[slot], 1)) {
        atomic_store(&c->bad, 1);
        return;
    }
    int k = atomic_fetch_add(&c->npieces, 1);
    if (k < PAR_MAX_PIECES) {
        c->piece[k].b = b, c->piece[k].e = e;
        c->piece[k].slot = slot;
    }
    if (slot == c->slow) usleep(2000);
    atomic_store(&c->busy[slot], 0);
}

static void par_call(af_exec *x, void *p) {
    par_ctx *c = p;
    af_exec_parallel(x, c->n, c->ns, par_piece, c);
}

static int by_begin(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void test_threads_parallel_loop(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 2, 3, 5, 100, 1000, ((int64_t)1 << 32) + 5};
    for (int threads = 1; threads <= 3; threads++) {
        af_runtime *rt = NULL;
        af_error err;
        assert_int_equal(af_runtime_new(threads, &rt, &err), AF_OK);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            par_ctx *c = calloc(1, sizeof *c);
            assert_non_null(c);
            c->n = ns[i];
            c->slots = ns[i] < threads ? (int)ns[i] : threads;
            c->slow = ns[i] >= 100 && ns[i] < 100000 && threads > 1 ? 0 : -1;
            c->ns = 1e12;
            af_runtime_call(rt, par_call, c);
            int np = atomic_load(&c->npieces);
            if (atomic_load(&c->bad) || np > PAR_MAX_PIECES)
                fail_msg("%d threads, %lld items: a bad slot or range, or overlapping calls of a slot",
                         threads, (long long)ns[i]);
            int64_t (*pc)[2] = malloc((size_t)np * sizeof *pc), at = 0, foreign = 0;
            assert_non_null(pc);
            for (int k = 0; k < np; k++) {
                pc[k][0] = c->piece[k].b, pc[k][1] = c->piece[k].e;
                foreign += c->piece[k].slot != 0 && c->piece[k].b < ns[i] / c->slots;
            }
            qsort(pc, (size_t)np, sizeof *pc, by_begin);
            for (int k = 0; k < np; k++) {
                if (pc[k][0] != at)
                    fail_msg("%d threads, %lld items: item %lld covered %s", threads,
                             (long long)ns[i], (long long)at, pc[k][0] > at ? "never" : "twice");
                at = pc[k][1];
            }
            assert_int_equal(at, ns[i]);
            /* slot 0 sleeps 2 ms per piece: the others, long done, must have taken from it */
            if (c->slow == 0 && !foreign)
                fail_msg("%d threads, %lld items: nothing of the slow slot's share moved", threads,
                         (long long)ns[i]);
            free(pc);
            /* work below a hand-off stays on the caller: one call over everything */
            memset(c, 0, sizeof *c);
            c->n = ns[i], c->slots = 1, c->slow = -1, c->ns = 10.0;
            af_runtime_call(rt, par_call, c);
            assert_int_equal(atomic_load(&c->npieces), 1);
            assert_int_equal(c->piece[0].b, 0);
            assert_int_equal(c->piece[0].e, ns[i]);
            free(c);
        }
        af_runtime_free(rt);
    }
}

static int setup(void **state) {
    (void)state;
    struct stat sb;
    bool shm = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0;
    snprintf(tmp_dir, sizeof tmp_dir, "%s/af_test_plan_XXXXXX", shm ? "/dev/shm" : "/tmp");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_inplace),
        cmocka_unit_test(test_capture_keeps_alive),
        cmocka_unit_test(test_real_models),
        cmocka_unit_test(test_conformance_plans),
        cmocka_unit_test(test_conformance_optimized_plans),
        cmocka_unit_test(test_session_runs_planned),
        cmocka_unit_test(test_plans_per_shape),
        cmocka_unit_test(test_threads_concurrent_runs),
        cmocka_unit_test(test_shape_ranges),
        cmocka_unit_test(test_afm_round_trip),
        cmocka_unit_test(test_afm_other_plans),
        cmocka_unit_test(test_forged_plans),
        cmocka_unit_test(test_threads_parallel_loop),
    };
    if (getenv("AF_TEST_FILTER")) cmocka_set_test_filter(getenv("AF_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
