/* The plugin registry (see plugin.h and include/autofusion_plugin.h): loading shared libraries
 * and checking what they describe before anything of it is registered.
 *
 * Invariant: a description is registered whole or not at all; every registered op has its
 * functions, a domain of its own and a name no other op has; every rule has a check, a name no
 * rule has and a fused op that is registered. Entries are only appended (under a lock), and
 * readers see an entry only after it is complete. */
#include "ir/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PLUGINS = 32 };

static struct {
    pthread_mutex_t lock;
    const af_custom_op *ops[AF_PLUGIN_MAX_OPS];
    const char *op_owner[AF_PLUGIN_MAX_OPS];
    atomic_int nops;
    const af_custom_rule *rules[AF_PLUGIN_MAX_RULES];
    const char *rule_owner[AF_PLUGIN_MAX_RULES]; /* the plugin's name */
    atomic_int nrules;
    char *paths[MAX_PLUGINS]; /* resolved paths of loaded plugins */
    const char *names[MAX_PLUGINS];
    int nplugins;
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *dom(const char *d) {
    return d && strcmp(d, "ai.onnx") ? d : "";
}

const af_custom_op *af_plugin_op(const char *domain, const char *name) {
    int n = atomic_load(&reg.nops);
    for (int i = 0; name && i < n; i++)
        if (!strcmp(reg.ops[i]->name, name) && !strcmp(dom(reg.ops[i]->domain), dom(domain)))
            return reg.ops[i];
    return NULL;
}

const char *af_plugin_op_key_of(const af_custom_op *op, char *buf, size_t len) {
    snprintf(buf, len, "%s:%s", op->domain, op->name);
    return buf;
}

const af_custom_op *af_plugin_op_key(const char *key) {
    const char *colon = key ? strrchr(key, ':') : NULL;
    if (!colon) return NULL;
    char d[256];
    size_t l = (size_t)(colon - key);
    if (l >= sizeof d) return NULL;
    memcpy(d, key, l);
    d[l] = '\0';
    return af_plugin_op(d, colon + 1);
}

int af_plugin_rule_count(void) {
    return atomic_load(&reg.nrules);
}

const af_custom_rule *af_plugin_rule(int i) {
    return i >= 0 && i < af_plugin_rule_count() ? reg.rules[i] : NULL;
}

const char *af_plugin_rule_owner(int i) {
    return i >= 0 && i < af_plugin_rule_count() ? reg.rule_owner[i] : NULL;
}

/* ---- checking a description ---------------------------------------------------------------- */

static bool ours(const char *d) {
    return !*dom(d) || !strcmp(d, AF_DOMAIN) || !strcmp(d, "ai.onnx.preview.training");
}

static af_status check_ops(const af_plugin_desc *d, const char *path, af_error *err) {
    if (d->nops < 0 || d->nops > AF_PLUGIN_MAX_OPS - atomic_load(&reg.nops) || (d->nops && !d->ops))
        return af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': %d ops (room for %d more)", path,
                       d->nops, AF_PLUGIN_MAX_OPS - atomic_load(&reg.nops));
    for (int i = 0; i < d->nops; i++) {
        const af_custom_op *o = &d->ops[i];
        if (!o->name || !*o->name || !o->domain)
            return af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': op %d has no name or domain",
                           path, i);
        if (ours(o->domain))
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "plugin '%s': op '%s' is in domain '%s': custom ops need a domain of "
                           "their own", path, o->name, o->domain);
        if (!o->infer || !o->compute)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "plugin '%s': op '%s:%s' has no shape inference or no kernel", path,
                           o->domain, o->name);
        if ((unsigned)o->op_class > AF_CUSTOM_OPAQUE)
            return af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': op '%s:%s' has class %d", path,
                           o->domain, o->name, (int)o->op_class);
        const af_custom_op *prev = af_plugin_op(o->domain, o->name);
        for (int k = 0; k < i && !prev; k++)
            if (!strcmp(d->ops[k].name, o->name) && !strcmp(d->ops[k].domain, o->domain))
                prev = &d->ops[k];
        if (prev) {
            const char *owner = path;
            for (int k = 0; k < atomic_load(&reg.nops); k++)
                if (reg.ops[k] == prev) owner = reg.op_owner[k];
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "plugin '%s': op '%s:%s' is already defined (by '%s')", path,
                           o->domain, o->name, owner);
        }
    }
    return AF_OK;
}

/* The fused op of a rule: registered already, or one of this description's ops. */
static bool op_known(const af_plugin_desc *d, const char *domain, const char *name) {
    if (af_plugin_op(domain, name)) return true;
    for (int k = 0; k < d->nops; k++)
        if (!strcmp(d->ops[k].name, name) && !strcmp(dom(d->ops[k].domain), dom(domain)))
            return true;
    return false;
}

static af_status check_rules(const af_plugin_desc *d, const char *path,
                             bool (*rule_taken)(const char *name), af_error *err) {
    if (d->nrules < 0 || d->nrules > AF_PLUGIN_MAX_RULES - af_plugin_rule_count() ||
        (d->nrules && !d->rules))
        return af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': %d rules (room for %d more)", path,
                       d->nrules, AF_PLUGIN_MAX_RULES - af_plugin_rule_count());
    for (int i = 0; i < d->nrules; i++) {
        const af_custom_rule *r = &d->rules[i];
        if (!r->name || !*r->name || !r->check || !r->anchor_op || !r->fused_op || !r->fused_domain)
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "plugin '%s': rule %d needs a name, a check, an anchor op and a fused op",
                           path, i);
        bool dup = rule_taken(r->name);
        for (int k = 0; k < i && !dup; k++) dup = !strcmp(d->rules[k].name, r->name);
        if (dup)
            return af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': rule '%s' is already defined",
                           path, r->name);
        if (!op_known(d, r->fused_domain, r->fused_op))
            return af_fail(err, AF_ERR_INVALID_ARG,
                           "plugin '%s': rule '%s' fuses into '%s:%s', which no plugin defines",
                           path, r->name, r->fused_domain, r->fused_op);
    }
    return AF_OK;
}

/* ---- loading --------------------------------------------------------------------------------- */

af_status af_plugin_register(const char *path, bool (*rule_taken)(const char *name),
                             af_error *err) {
    char real[PATH_MAX];
    if (!path || !*path) return af_fail(err, AF_ERR_INVALID_ARG, "plugin: empty path");
    if (!realpath(path, real))
        return af_fail(err, AF_ERR_IO, "cannot load plugin '%s': no such file", path);
    pthread_mutex_lock(&reg.lock);
    af_status st = AF_OK;
    for (int i = 0; i < reg.nplugins; i++)
        if (!strcmp(reg.paths[i], real)) goto done; /* loaded already */
    if (reg.nplugins == MAX_PLUGINS) {
        st = af_fail(err, AF_ERR_INVALID_ARG, "cannot load plugin '%s': %d plugins at most", path,
                     MAX_PLUGINS);
        goto done;
    }
    void *h = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        st = af_fail(err, AF_ERR_IO, "cannot load plugin '%s': %s", path, why ? why : "dlopen failed");
        goto done;
    }
    af_plugin_describe_fn describe = NULL;
    *(void **)&describe = dlsym(h, "af_plugin_describe");
    const af_plugin_desc *d = describe ? describe() : NULL;
    if (!describe)
        st = af_fail(err, AF_ERR_INVALID_ARG,
                     "plugin '%s' exports no af_plugin_describe (not an autofusion plugin?)", path);
    else if (!d)
        st = af_fail(err, AF_ERR_INVALID_ARG, "plugin '%s': af_plugin_describe returned NULL", path);
    else if (d->abi_version != AF_PLUGIN_ABI_VERSION)
        st = af_fail(err, AF_ERR_INVALID_ARG,
                     "plugin '%s' was built for plugin ABI version %d; this autofusion has "
                     "version %d (rebuild it against include/autofusion_plugin.h)",
                     path, d->abi_version, AF_PLUGIN_ABI_VERSION);
    if (!st) st = check_ops(d, path, err);
    if (!st) st = check_rules(d, path, rule_taken, err);
    char *copy = st ? NULL : af_strdup(real);
    if (!st && !copy) st = af_fail(err, AF_ERR_NOMEM, "out of memory");
    if (st) {
        dlclose(h);
        goto done;
    }
    /* Registered whole: the library stays loaded for the life of the process. */
    reg.paths[reg.nplugins] = copy;
    reg.names[reg.nplugins++] = d->name ? d->name : copy;
    for (int i = 0; i < d->nops; i++) {
        int k = atomic_load(&reg.nops);
        reg.ops[k] = &d->ops[i];
        reg.op_owner[k] = copy;
        atomic_store(&reg.nops, k + 1);
    }
    for (int i = 0; i < d->nrules; i++) {
        int k = atomic_load(&reg.nrules);
        reg.rules[k] = &d->rules[i];
        reg.rule_owner[k] = reg.names[reg.nplugins - 1];
        atomic_store(&reg.nrules, k + 1);
    }
done:
    pthread_mutex_unlock(&reg.lock);
    return st;
}

/* ---- what plugins may ask about a node ------------------------------------------------------- */

static const af_node *nd(const af_pnode *n) {
    return (const af_node *)n;
}

static const char *g_op_type(const af_pnode *n) { return nd(n)->op_type; }
static const char *g_domain(const af_pnode *n) { return dom(nd(n)->domain); }
static const char *g_name(const af_pnode *n) { return nd(n)->name; }
static int g_num_inputs(const af_pnode *n) { return nd(n)->nin; }
static int g_num_outputs(const af_pnode *n) { return nd(n)->nout; }

static const void *g_input_id(const af_pnode *n, int i) {
    const af_node *x = nd(n);
    return i >= 0 && i < x->nin ? (const void *)x->in[i] : NULL;
}

static const af_pnode *g_producer(const af_pnode *n, int i) {
    const af_node *x = nd(n);
    const af_value *v = i >= 0 && i < x->nin ? x->in[i] : NULL;
    return v && v->producer ? (const af_pnode *)v->producer : NULL;
}

static int g_num_readers(const af_pnode *n, int o) {
    const af_node *x = nd(n);
    const af_value *v = o >= 0 && o < x->nout ? x->out[o] : NULL;
    if (!v) return 0;
    return v->is_output ? -1 : v->nuses;
}

static const af_pnode *g_reader(const af_pnode *n, int o, int k) {
    const af_node *x = nd(n);
    const af_value *v = o >= 0 && o < x->nout ? x->out[o] : NULL;
    return v && k >= 0 && k < v->nuses ? (const af_pnode *)v->uses[k].node : NULL;
}

static int g_input_type(const af_pnode *n, int i, af_tensor *type) {
    const af_node *x = nd(n);
    const af_value *v = i >= 0 && i < x->nin ? x->in[i] : NULL;
    if (!v || !type) return -1;
    *type = v->type;
    if (!v->is_const) type->data = NULL;
    return 0;
}

static long long g_attr_int(const af_pnode *n, const char *name, long long dflt) {
    return (long long)af_attr_int(nd(n), name, dflt);
}

static float g_attr_float(const af_pnode *n, const char *name, float dflt) {
    return af_attr_float(nd(n), name, dflt);
}

const af_plugin_graph af_plugin_graph_api = {
    g_op_type, g_domain, g_name, g_num_inputs, g_num_outputs, g_input_id, g_producer,
    g_num_readers, g_reader, g_input_type, g_attr_int, g_attr_float,
};
