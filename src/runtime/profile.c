/* The per-node profile (see profile.h). Recording appends to a growing array, so only a
 * profiled run allocates; the trace is built with jansson when written.
 *
 * Invariant: recording never fails a run: a record that cannot be stored is dropped. */
#include "runtime/profile.h"
#include "kernels/fast/dispatch.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct prof_event {
    const af_node *node;
    const char *what;
    int kernel; /* af_kernel_kind, or -1 */
    double start, dur;
} prof_event;

struct af_profile {
    prof_event *ev;
    size_t n, cap, dropped;
    struct timespec t0;
};

af_profile *af_profile_new(void) {
    af_profile *p = af_calloc(1, sizeof *p);
    if (p) clock_gettime(CLOCK_MONOTONIC, &p->t0);
    return p;
}

void af_profile_free(af_profile *p) {
    if (!p) return;
    af_free(p->ev);
    af_free(p);
}

double af_profile_now(const af_profile *p) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - p->t0.tv_sec) * 1e6 + (double)(t.tv_nsec - p->t0.tv_nsec) / 1e3;
}

void af_profile_add(af_profile *p, const af_node *n, const char *what, int kernel,
                    double start_us, double dur_us) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 1024;
        prof_event *ev = af_realloc(p->ev, cap * sizeof *ev);
        if (!ev) {
            p->dropped++;
            return;
        }
        p->ev = ev;
        p->cap = cap;
    }
    p->ev[p->n++] = (prof_event){n, what, kernel, start_us, dur_us};
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(const void *const *)a, y = (uintptr_t)*(const void *const *)b;
    return (x > y) - (x < y);
}

/* "Resize x3, Pad x1" from the op types of the distinct nodes in[0..n), most first (ties by
 * name), cut with "..." where buf ends. */
static void op_counts(const af_node **in, size_t n, char *buf, size_t len) {
    const char *ops[64];
    int counts[64], nops = 0;
    bool more = false;
    for (size_t i = 0; i < n; i++) {
        int k = 0;
        while (k < nops && strcmp(ops[k], in[i]->op_type)) k++;
        if (k == nops && nops == 64) {
            more = true;
            continue;
        }
        if (k == nops) ops[nops] = in[i]->op_type, counts[nops++] = 0;
        counts[k]++;
    }
    size_t o = 0;
    buf[0] = 0;
    for (int done = 0; done < nops; done++) {
        int best = done;
        for (int k = done + 1; k < nops; k++)
            if (counts[k] > counts[best] || (counts[k] == counts[best] && strcmp(ops[k], ops[best]) < 0))
                best = k;
        const char *op = ops[best];
        int c = counts[best];
        ops[best] = ops[done], counts[best] = counts[done];
        int w = snprintf(buf + o, len - o, "%s%s x%d", done ? ", " : "", op, c);
        if (w < 0 || (size_t)w >= len - o) {
            more = true;
            break;
        }
        o += (size_t)w;
    }
    if (more && len >= 4) strcpy(buf + (o + 4 < len ? o : len - 4), "...");
}

void af_profile_reference(const af_profile *p, af_reference_stats *out) {
    memset(out, 0, sizeof *out);
    double runs_us = 0, top_us = 0, ref_us = 0;
    size_t nref = 0;
    for (size_t i = 0; i < p->n; i++) {
        const prof_event *e = &p->ev[i];
        if (!e->node) runs_us += e->dur;
        else if (!e->node->graph || !e->node->graph->parent) top_us += e->dur;
        if (e->node && e->kernel == AF_KERNEL_REFERENCE) ref_us += e->dur, nref++;
    }
    /* a run without its "model_run" record (an executor used alone) counts its main graph's
     * nodes; a body's nodes are inside their If or Loop node's time */
    out->run_ms = (runs_us > 0 ? runs_us : top_us) / 1e3;
    out->reference_ms = ref_us / 1e3;
    const af_node **nodes = nref ? af_malloc(nref * sizeof *nodes) : NULL;
    if (!nodes) { /* none, or out of memory: counted by record, without their ops */
        out->nodes = (int)nref;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->ev[i].node && p->ev[i].kernel == AF_KERNEL_REFERENCE) nodes[k++] = p->ev[i].node;
    qsort(nodes, nref, sizeof *nodes, cmp_ptr);
    size_t distinct = 0;
    for (size_t i = 0; i < nref; i++)
        if (!i || nodes[i] != nodes[i - 1]) nodes[distinct++] = nodes[i];
    out->nodes = (int)distinct;
    op_counts(nodes, distinct, out->ops, sizeof out->ops);
    af_free(nodes);
}

/* "a,b,c" from a STRINGS attribute, or NULL. */
static char *joined(const af_node *n, const char *name) {
    const af_attr *a = af_node_attr(n, name);
    if (!a || a->type != AF_ATTR_STRINGS || a->n <= 0) return NULL;
    size_t len = 1;
    for (int i = 0; i < a->n; i++) len += strlen(a->strings[i]) + 1;
    char *s = af_malloc(len);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < a->n; i++) {
        if (i) strcat(s, ",");
        strcat(s, a->strings[i]);
    }
    return s;
}

static json_t *event_json(const prof_event *e, const char *model, const char *isa, int pid) {
    json_t *o = json_object(), *args = json_object();
    if (!o || !args) {
        json_decref(o);
        json_decref(args);
        return NULL;
    }
    char name[512];
    if (e->node)
        snprintf(name, sizeof name, "%s_kernel_time", e->node->name);
    else
        snprintf(name, sizeof name, "%s", e->what ? e->what : "model_run");
    json_object_set_new(o, "cat", json_string(e->node ? "Node" : "Session"));
    json_object_set_new(o, "pid", json_integer(pid));
    json_object_set_new(o, "tid", json_integer(0));
    json_object_set_new(o, "dur", json_integer((json_int_t)(e->dur + 0.5)));
    json_object_set_new(o, "ts", json_integer((json_int_t)(e->start + 0.5)));
    json_object_set_new(o, "ph", json_string("X"));
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(args, "model", json_string(model ? model : ""));
    json_object_set_new(args, "isa", json_string(isa ? isa : ""));
    if (e->node) {
        json_object_set_new(args, "op_name", json_string(e->node->op_type));
        if (e->kernel >= 0)
            json_object_set_new(args, "kernel", json_string(af_kernel_kind_name((af_kernel_kind)e->kernel)));
        const char *rule = af_attr_str(e->node, "fusion_rule", NULL);
        if (rule) json_object_set_new(args, "fusion_rule", json_string(rule));
        char *fused = joined(e->node, "fused_nodes");
        if (fused) json_object_set_new(args, "fused_nodes", json_string(fused));
        af_free(fused);
    }
    json_object_set_new(o, "args", args);
    return o;
}

af_status af_profile_write(const af_profile *p, const char *path, const char *model,
                           const char *isa, af_error *err) {
    json_t *arr = json_array();
    if (!arr) return af_fail(err, AF_ERR_NOMEM, "out of memory writing the profile");
    int pid = (int)getpid();
    for (size_t i = 0; i < p->n; i++) {
        json_t *o = event_json(&p->ev[i], model, isa, pid);
        if (!o || json_array_append_new(arr, o)) {
            json_decref(arr);
            return af_fail(err, AF_ERR_NOMEM, "out of memory writing the profile");
        }
    }
    int rc = json_dump_file(arr, path, JSON_INDENT(1));
    json_decref(arr);
    if (rc) return af_fail(err, AF_ERR_IO, "%s: cannot write the profile", path);
    if (p->dropped)
        return af_fail(err, AF_ERR_NOMEM, "%s: %zu profile events did not fit in memory", path,
                       p->dropped);
    return AF_OK;
}
