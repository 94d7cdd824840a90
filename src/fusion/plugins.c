/* Plugins as the public API loads them (include/autofusion_plugin.h): the registry (ir/plugin.c)
 * with the fusion stage's check that a plugin's rule names are new.
 *
 * Invariant: no plugin rule shares a name with a built-in rule or another plugin's. */
#include "fusion/fusion.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static bool rule_taken(const char *name) { return af_fusion_rule_find(name) >= 0; }

af_status af_plugin_load(const char *path, af_error *err) {
    return af_plugin_register(path, rule_taken, err);
}

af_status af_plugin_load_env(af_error *err) {
    const char *env = getenv("AUTOFUSION_PLUGINS");
    for (const char *p = env; p && *p;) {
        size_t l = strcspn(p, ":");
        char path[PATH_MAX];
        if (l && l < sizeof path) {
            memcpy(path, p, l);
            path[l] = '\0';
            af_error e;
            af_status st = af_plugin_load(path, &e);
            if (st) return af_fail(err, st, "AUTOFUSION_PLUGINS: %s", e.message);
        }
        p += l + (p[l] == ':');
    }
    return AF_OK;
}
