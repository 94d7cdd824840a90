/* The per-node profile (see profile.h). Recording appends to a growing array, so only a
 * profiled run allocates; the trace is built with jansson when written.
 *
 * Invariant: recording never fails a run: a record that cannot be stored is dropped. */
#include "runtime/profile.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct prof_event {
    const af_node *node;
    const char *what;
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

void af_profile_add(af_profile *p, const af_node *n, const char *what, double start_us, double dur_us) {
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
    p->ev[p->n++] = (prof_event){n, what, start_us, dur_us};
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
