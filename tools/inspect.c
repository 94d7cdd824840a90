/* `autofusion inspect MODEL.afm`: what a compiled file holds, read through the format's API
 * (format/afm.h): header, writer version and command line, metadata, graph inputs and outputs,
 * the op histogram, every fused op with its provenance (attributes "fusion_rule" and
 * "fused_nodes") and precision (attribute "precision"), the weights size (bytes of every
 * constant), the nodes that run on a reference kernel on this machine (the dispatcher's choice,
 * kernels/fast/dispatch.h: a slow path where the op or its case has no fast kernel) and the
 * arena: "arena: N bytes (lower bound M, ratio R), ..." from the stored plan, or "not
 * planned". */
#include "cli.h"
#include "format/afm.h"
#include "kernels/fast/dispatch.h"
#include "kernels/simd/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stats {
    int nodes, fused, nconst, slow; /* slow: nodes on a reference kernel */
    uint64_t weight_bytes;
    const char **ops; /* distinct op names, with their counts */
    int *counts, nops, cap;
} stats;

static bool count_op(stats *s, const char *name) {
    for (int i = 0; i < s->nops; i++)
        if (!strcmp(s->ops[i], name)) {
            s->counts[i]++;
            return true;
        }
    if (s->nops == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        const char **ops = realloc(s->ops, (size_t)cap * sizeof *ops);
        if (ops) s->ops = ops;
        int *counts = realloc(s->counts, (size_t)cap * sizeof *counts);
        if (counts) s->counts = counts;
        if (!ops || !counts) return false;
        s->cap = cap;
    }
    s->ops[s->nops] = name;
    s->counts[s->nops++] = 1;
    return true;
}

static bool gather(stats *s, const af_graph *g) {
    for (int i = 0; i < g->nvalues; i++)
        if (g->values[i]->is_const) {
            s->nconst++;
            s->weight_bytes += g->values[i]->type.nbytes;
        }
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        s->nodes++;
        s->fused += af_node_attr(n, "fusion_rule") != NULL;
        s->slow += af_kernel_choice(n, NULL) == AF_KERNEL_REFERENCE;
        if (!count_op(s, n->op_type)) return false;
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_TENSOR) s->weight_bytes += at->t->nbytes;
            for (int k = 0; at->type == AF_ATTR_TENSORS && k < at->n; k++)
                s->weight_bytes += at->tensors[k]->nbytes;
            if (at->type == AF_ATTR_GRAPH && !gather(s, at->g)) return false;
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                if (!gather(s, at->graphs[k])) return false;
        }
    }
    return true;
}

/* Text from the file, with control characters shown as '?': a hostile name must not drive the
 * terminal. */
static void put_text(FILE *out, const char *s) {
    for (; *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
}

static void print_fused(FILE *out, const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        const af_attr *rule = af_node_attr(n, "fusion_rule"),
                      *from = af_node_attr(n, "fused_nodes");
        if (rule && rule->type == AF_ATTR_STRING) {
            fputs("    ", out);
            put_text(out, n->name);
            fprintf(out, " (%s) by ", n->op_type);
            put_text(out, rule->s);
            const af_attr *prec = af_node_attr(n, "precision");
            if (prec && prec->type == AF_ATTR_STRING) {
                fputs(" in ", out);
                put_text(out, prec->s);
            }
            if (from && from->type == AF_ATTR_STRINGS) {
                fprintf(out, ", from %d node%s:", from->n, from->n == 1 ? "" : "s");
                for (int k = 0; k < from->n; k++) {
                    fputc(' ', out);
                    put_text(out, from->strings[k]);
                }
            }
            fputc('\n', out);
        }
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_GRAPH) print_fused(out, at->g);
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                print_fused(out, at->graphs[k]);
        }
    }
}

/* Every node of g and its bodies that runs on a reference kernel: name (op). */
static void print_slow(FILE *out, const af_graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const af_node *n = g->nodes[i];
        if (af_kernel_choice(n, NULL) == AF_KERNEL_REFERENCE) {
            fputs("    ", out);
            put_text(out, n->name);
            fputs(" (", out);
            put_text(out, n->op_type);
            fputs(")\n", out);
        }
        for (int a = 0; a < n->nattrs; a++) {
            const af_attr *at = &n->attrs[a];
            if (at->type == AF_ATTR_GRAPH) print_slow(out, at->g);
            for (int k = 0; at->type == AF_ATTR_GRAPHS && k < at->n; k++)
                print_slow(out, at->graphs[k]);
        }
    }
}

/* The values of vs whose is_const is `consts` (-1: all) under title (nothing when none). */
static void print_values(FILE *out, const char *title, af_value *const *vs, int n, int consts) {
    bool titled = false;
    for (int i = 0; i < n; i++) {
        char dims[256];
        if (consts >= 0 && vs[i]->is_const != (bool)consts) continue;
        if (!titled) fprintf(out, "%s:\n", title);
        titled = true;
        fputs("    ", out);
        put_text(out, vs[i]->name);
        fprintf(out, " %s%s\n", af_dtype_name(vs[i]->type.dtype),
                af_dims_str(&vs[i]->type, dims, sizeof dims));
    }
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* A short form of a metadata value (a report in JSON is long): at most 80 characters, each run
 * of white space shown as one space, other control characters as '?'. */
static void print_short(FILE *out, const char *s) {
    size_t full = strlen(s), shown = 0;
    const char *p = s;
    for (; *p && shown < 80; p++) {
        if (is_space(*p) && p > s && is_space(p[-1])) continue;
        unsigned char c = (unsigned char)*p;
        fputc(is_space(*p) ? ' ' : c < 0x20 || c == 0x7f ? '?' : c, out);
        shown++;
    }
    if (*p) fprintf(out, " ... (%zu bytes)", full);
}

af_status cli_inspect(const char *path, FILE *out, af_error *err) {
    af_afm_info *info = NULL;
    af_model *m = NULL;
    af_plan *plan = NULL;
    af_afm_meta meta;
    stats s = {0};
    af_status st = af_afm_read_meta(path, &info, err);
    if (!st) st = af_afm_load_with_plan(path, &m, &meta, &plan, err);
    if (!st && !gather(&s, m->graph)) st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    if (st) goto done;
    fprintf(out, "%s: autofusion compiled model, format version %u, %llu bytes, checksums OK\n",
            path, info->format_version, (unsigned long long)info->file_size);
    fputs("written by: autofusion ", out);
    put_text(out, meta.version);
    fputs("\ncommand line: ", out);
    put_text(out, *meta.command_line ? meta.command_line : "(none recorded)");
    fputc('\n', out);
    for (int i = 0; i < meta.nkv; i++) {
        fputs("meta ", out);
        put_text(out, meta.kv[i].key);
        fputs(": ", out);
        print_short(out, meta.kv[i].value);
        fputc('\n', out);
    }
    fprintf(out, "sections:\n");
    for (int i = 0; i < info->nsections; i++)
        fprintf(out, "    %-10s offset %12llu  size %12llu\n", info->sections[i].name,
                (unsigned long long)info->sections[i].offset,
                (unsigned long long)info->sections[i].size);
    const af_graph *g = m->graph;
    fprintf(out, "opsets:");
    for (int i = 0; i < g->nopsets; i++) {
        fputc(' ', out);
        put_text(out, *g->opsets[i].domain ? g->opsets[i].domain : "ai.onnx");
        fprintf(out, " %lld", (long long)g->opsets[i].version);
    }
    fputc('\n', out);
    print_values(out, "inputs", g->inputs, g->ninputs, 0);
    /* initializers listed as inputs (IR version < 4): a run may override them */
    print_values(out, "inputs with defaults", g->inputs, g->ninputs, 1);
    print_values(out, "outputs", g->outputs, g->noutputs, -1);
    fprintf(out, "ops: %d nodes (%d fused)\n", s.nodes, s.fused);
    for (int done = 0; done < s.nops; done++) { /* by count, largest first */
        int best = done;
        for (int i = done + 1; i < s.nops; i++)
            if (s.counts[i] > s.counts[best]) best = i;
        const char *name = s.ops[best];
        int count = s.counts[best];
        s.ops[best] = s.ops[done];
        s.counts[best] = s.counts[done];
        s.ops[done] = name;
        s.counts[done] = count;
        fprintf(out, "    %-24s %d\n", name, count);
    }
    fprintf(out, "fused ops with provenance:%s\n", s.fused ? "" : " none");
    print_fused(out, g);
    if (s.slow) {
        fprintf(out, "reference kernels: %d node%s, a slow path (no fast kernel for the op or its "
                "case on %s):\n", s.slow, s.slow == 1 ? "" : "s", af_isa_name(af_isa_get()));
        print_slow(out, g);
    } else {
        fprintf(out, "reference kernels: none (every node runs on a fast kernel or needs none)\n");
    }
    fprintf(out, "weights: %llu bytes (%.1f MiB) in %d constants\n",
            (unsigned long long)s.weight_bytes, (double)s.weight_bytes / (1024.0 * 1024.0),
            s.nconst);
    if (plan)
        fprintf(out, "arena: %llu bytes (lower bound %llu, ratio %.3f), %d intermediates "
                "planned, %d in place\n", (unsigned long long)plan->arena_size,
                (unsigned long long)plan->lower_bound, af_plan_ratio(plan), plan->nplanned,
                plan->ninplace);
    else
        fprintf(out, "arena: not planned (the file carries no memory plan; loading makes one)\n");
done:
    af_plan_free(plan);
    free(s.ops);
    free(s.counts);
    af_model_free(m);
    af_afm_info_free(info);
    return st;
}
