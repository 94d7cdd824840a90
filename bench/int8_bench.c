/* The int8 form (quant = 1) against float32 on ResNet-50's bottleneck convolutions, in one
 * process, interleaved: first the machine's calibrated GEMM rates (a fresh measurement, as the
 * lowering's int8 decision reads them), then per stage a graph of its three convs (1x1 reduce,
 * 3x3, 1x1 expand; bias and Relu on the first two, as after fusion) built twice from the same
 * weights: quantized (int8 weights per output channel, each conv's input fake-quantized, the
 * graph lowered so that the convs run on the U8S8 core) and plain float32 (the fp32 model); NHWC
 * in through a Transpose the layout pass cancels, a GlobalAveragePool out, so each graph is its
 * three convs. Both
 * run alternately `reps` times at each thread count; the table gives the best and the median
 * times and the ratios of each (on a busy machine the best runs are the ones nothing else
 * interrupted).
 *
 *   build/bench/int8_bench [--reps=N] [--threads=N]   (1 to N threads, default 2)
 */
#include "driver/compile.h"
#include "passes/passes.h"
#include "ir/epilogue.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"
#include "runtime/machine.h"
#include "runtime/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 1;
static double rnd(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

typedef struct stage {
    int64_t c, mid, h; /* in/out channels, bottleneck channels, spatial size */
} stage;

/* One conv of the stack: quantized (int8 W, scales) or float32 (the dequantized W). */
static af_value *conv(af_graph *g, af_value *x, int64_t cin, int64_t m, int64_t k, bool relu,
                      bool quant) {
    int64_t wd[4] = {m, cin, k, k}, n = m * cin * k * k;
    af_value *w = quant ? af_value_new_const(g, af_graph_unique_name(g, "wq"), AF_DTYPE_INT8, 4, wd)
                        : af_value_new_f32(g, "w", 4, wd);
    af_value *b = af_value_new_f32(g, "b", 1, &m);
    float ws[2048];
    for (int64_t o = 0; o < m; o++) ws[o] = (float)(0.5 / sqrt((double)(cin * k * k)) / 127.0 * (1.2 + 0.2 * rnd()));
    for (int64_t i = 0; i < n; i++) {
        int8_t q = (int8_t)lrint(rnd() * 127.0);
        if (quant) ((int8_t *)w->type.data)[i] = q;
        else ((float *)w->type.data)[i] = (float)q * ws[i / (cin * k * k)];
    }
    for (int64_t o = 0; o < m; o++) ((float *)b->type.data)[o] = (float)(0.1 * rnd());
    af_node *f = af_node_new_ours(g, AF_OP_FUSED_CONV, af_graph_unique_name(g, "conv"), 3);
    af_node_set_input(f, 0, x);
    af_node_set_input(f, 1, w);
    af_node_set_input(f, 2, b);
    af_node_set_output(f, 0, af_value_new(g, af_graph_unique_name(g, "y")));
    int64_t ks[2] = {k, k}, ones[2] = {1, 1}, pads[4] = {k / 2, k / 2, k / 2, k / 2};
    af_node_set_ints(f, "kernel_shape", ks, 2);
    af_node_set_ints(f, "strides", ones, 2);
    af_node_set_ints(f, "dilations", ones, 2);
    af_node_set_ints(f, "pads", pads, 4);
    if (relu) {
        int64_t prog[3] = {AF_EP_RELU, -1, 0};
        float params[2] = {0, 0};
        af_node_set_ints(f, "epilogue", prog, 3);
        af_node_set_floats(f, "epilogue_params", params, 2);
    }
    if (quant) {
        af_node_set_int(f, "quant", 1);
        af_node_set_float(f, "x_scale", relu || cin != m ? 0.02f : 0.02f);
        af_node_set_int(f, "x_zero_point", 0);
        af_node_set_floats(f, "w_scale", ws, (int)m);
    }
    return f->out[0];
}

static af_value *transpose(af_graph *g, af_value *x, const int64_t *perm) {
    af_node *t = af_node_new(g, AF_OP_TRANSPOSE, af_graph_unique_name(g, "perm"), 1, 1);
    af_node_set_input(t, 0, x);
    af_node_set_output(t, 0, af_value_new(g, af_graph_unique_name(g, "t")));
    af_node_set_ints(t, "perm", perm, 4);
    return t->out[0];
}

static af_graph *build(af_arena *a, const stage *s, bool quant) {
    rng = 42;
    af_graph *g = af_graph_new(a, "int8_bench", NULL);
    g->name = "int8_bench";
    g->opsets = af_arena_calloc(a, 2, sizeof(af_opset));
    g->opsets[0] = (af_opset){"", 17};
    g->opsets[1] = (af_opset){AF_DOMAIN, 1};
    g->nopsets = 2;
    g->inputs = af_arena_calloc(a, 1, sizeof(af_value *));
    g->outputs = af_arena_calloc(a, 1, sizeof(af_value *));
    af_value *x = af_value_new(g, "x");
    int64_t xd[4] = {1, s->h, s->h, s->c};
    x->is_input = true;
    af_tensor_set_type(&x->type, AF_DTYPE_FLOAT, 4, xd);
    g->inputs[g->ninputs++] = x;
    /* NHWC in through the model's own Transpose, which the layout pass goes through, and the
     * mean over positions out: the graph is the three convs, as inside a model, not the
     * reorders at its edges */
    static const int64_t to_nchw[4] = {0, 3, 1, 2};
    af_value *y = transpose(g, x, to_nchw);
    y = conv(g, y, s->c, s->mid, 1, true, quant);
    y = conv(g, y, s->mid, s->mid, 3, true, quant);
    y = conv(g, y, s->mid, s->c, 1, false, quant);
    /* out through a GlobalAveragePool (channels-last too): a [1, C, 1, 1] output, no reorder */
    af_node *gp = af_node_new(g, AF_OP_GLOBAL_AVERAGE_POOL, af_graph_unique_name(g, "pool"), 1, 1);
    af_node_set_input(gp, 0, y);
    af_node_set_output(gp, 0, af_value_new(g, af_graph_unique_name(g, "pooled")));
    y = gp->out[0];
    y->is_output = true;
    g->outputs[g->noutputs++] = y;
    return g;
}

typedef struct prepared {
    af_arena *a;
    af_graph *g;
    af_plan *p;
    void *arena;
} prepared;

static void prepare(prepared *r, const stage *s, bool quant, const af_precision_cfg *pc) {
    af_error err;
    r->a = af_arena_new();
    r->g = build(r->a, s, quant);
    if (af_graph_infer_shapes(r->g, &err) || af_lower(r->g, pc, &err) || af_plan_build(r->g, &r->p, &err)) {
        fprintf(stderr, "int8_bench: %s\n", err.message);
        exit(1);
    }
    r->arena = r->p->arena_size ? aligned_alloc(64, (r->p->arena_size + 63) & ~(uint64_t)63) : NULL;
    int nint8 = 0;
    for (int i = 0; i < r->g->nnodes; i++)
        nint8 += !strcmp(af_attr_str(r->g->nodes[i], "precision", ""), "int8");
    if (quant && nint8 != 3) fprintf(stderr, "int8_bench: only %d of 3 convs run int8\n", nint8);
    if (getenv("INT8_BENCH_DEBUG"))
        for (int i = 0; i < r->g->nnodes; i++)
            fprintf(stderr, "%s %s cl=%lld packed=%lld prec=%s why=%s\n", r->g->nodes[i]->name,
                    r->g->nodes[i]->op_type, (long long)af_attr_int(r->g->nodes[i], "channels_last", 0),
                    (long long)af_attr_int(r->g->nodes[i], "w_packed", 0),
                    af_attr_str(r->g->nodes[i], "precision", "-"), af_attr_str(r->g->nodes[i], "precision_why", "-"));
}

static double run_once(prepared *r, af_runtime *rt, const af_tensor *x) {
    af_tensor out;
    af_error err;
    memset(&out, 0, sizeof out);
    const af_tensor *in[1] = {x};
    double t = now();
    if (af_exec_graph_planned(r->g, r->p, r->arena, rt, in, &out, &err)) {
        fprintf(stderr, "int8_bench: %s\n", err.message);
        exit(1);
    }
    t = now() - t;
    af_tensor_release(&out);
    return t;
}

int main(int argc, char **argv) {
    int reps = 30, maxt = 2;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--reps=", 7)) reps = atoi(argv[i] + 7);
        else if (!strncmp(argv[i], "--threads=", 10)) maxt = atoi(argv[i] + 10);
    }
    if (reps < 1) reps = 1;
    if (maxt < 1 || maxt > 8) maxt = 2;
    char path[64];
    snprintf(path, sizeof path, "/tmp/int8_bench_machine.%ld.json", (long)getpid());
    af_machine mach;
    af_machine_calibrate(path, &mach, NULL);
    unlink(path);
    printf("ISA %s, VNNI %s: GEMM fp32 %.0f GFLOP/s, int8 %.0f GOP/s (%.2fx)\n",
           af_isa_name(af_isa_get()), af_cpu_vnni() ? "yes" : "no", mach.gemm_flops / 1e9,
           mach.gemm_int8_ops / 1e9, mach.gemm_int8_ops / mach.gemm_flops);
    af_precision_cfg pc = {AF_PREC_FP32, NULL, mach.gemm_flops, 0, mach.gemm_int8_ops};
    static const stage stages[] = {{256, 64, 56}, {512, 128, 28}, {1024, 256, 14}, {2048, 512, 7}};
    printf("| stage (C, mid, HxW) | threads | fp32 best / median | int8 best / median | int8 / fp32 (best, median) |\n");
    printf("|---|--:|--:|--:|--:|\n");
    double tot[8][4] = {{0}};
    const char *only = getenv("INT8_BENCH_STAGE"); /* one stage, by index (profiling) */
    for (size_t si = 0; si < sizeof stages / sizeof stages[0]; si++) {
        const stage *s = &stages[si];
        if (only && atoi(only) != (int)si) continue;
        prepared f, q;
        prepare(&f, s, false, &pc);
        prepare(&q, s, true, &pc);
        int64_t xd[4] = {1, s->h, s->h, s->c};
        af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 4, xd);
        for (int64_t i = 0; i < af_tensor_numel(x); i++) ((float *)x->data)[i] = (float)(rnd() > 0 ? rnd() * 2 : 0);
        for (int th = 1; th <= maxt; th++) {
            /* a runtime per graph, as a session has: scratch kept, kernels prepared */
            af_runtime *rf = NULL, *rq = NULL;
            af_error err;
            if (af_runtime_new(th, &rf, &err) || af_runtime_new(th, &rq, &err) ||
                af_runtime_prepare(rf, f.g, &err) || af_runtime_prepare(rq, q.g, &err)) {
                fprintf(stderr, "int8_bench: %s\n", err.message);
                return 1;
            }
            double *tf = malloc(sizeof(double) * (size_t)reps), *tq = malloc(sizeof(double) * (size_t)reps);
            for (int w = 0; w < 3; w++) run_once(&f, rf, x), run_once(&q, rq, x);
            for (int r = 0; r < reps; r++) {
                tf[r] = run_once(&f, rf, x);
                tq[r] = run_once(&q, rq, x);
            }
            qsort(tf, (size_t)reps, sizeof(double), cmp);
            qsort(tq, (size_t)reps, sizeof(double), cmp);
            double mf = tf[reps / 2], mq = tq[reps / 2];
            tot[th - 1][0] += mf;
            tot[th - 1][1] += mq;
            tot[th - 1][2] += tf[0];
            tot[th - 1][3] += tq[0];
            printf("| %lld, %lld, %lldx%lld | %d | %.3f / %.3f ms | %.3f / %.3f ms | %.2f, %.2f |\n",
                   (long long)s->c, (long long)s->mid, (long long)s->h, (long long)s->h, th,
                   tf[0] * 1e3, mf * 1e3, tq[0] * 1e3, mq * 1e3, tq[0] / tf[0], mq / mf);
            free(tf);
            free(tq);
            af_runtime_free(rf);
            af_runtime_free(rq);
        }
        af_tensor_free(x);
        for (prepared *r = &f; r; r = r == &f ? &q : NULL) {
            free(r->arena);
            af_plan_free(r->p);
            af_arena_free(r->a);
        }
    }
    for (int th = 1; th <= maxt && th <= 8; th++)
        printf("| all four | %d | %.3f / %.3f ms | %.3f / %.3f ms | %.2f, %.2f |\n", th,
               tot[th - 1][2] * 1e3, tot[th - 1][0] * 1e3, tot[th - 1][3] * 1e3,
               tot[th - 1][1] * 1e3, tot[th - 1][3] / tot[th - 1][2], tot[th - 1][1] / tot[th - 1][0]);
    return 0;
}
