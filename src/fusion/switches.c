/* Fusion switches: which rules are off and why. Sources: --disable_fusion=A,B, the environment
 * (AUTOFUSION_DISABLE_LIST, alias GE_FUSION_DISABLE_LIST) and ATC's switch file in its two forms
 * (lines "Name:off", or JSON {"Switch":{"GraphFusion":{"ALL":"off","Name":"on"}}}; its UBFusion
 * section names Ascend buffer fusions that have no meaning here and is ignored).
 *
 * Invariant: a source is parsed completely into a copy of the config and only then committed, so
 * an error (unknown name, bad value, malformed file) leaves the caller's config unchanged. */
#include "fusion/fusion.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Names accepted for a rule besides its own. */
static const struct {
    const char *name;
    int rule;
} aliases[] = {
    {"MatMulBiasReluFusionOp", AF_RULE_MATMUL_BIAS_ACT},
};

#define MAX_SWITCH_FILE (1 << 20)
#define ALL AF_RULE_MAX /* lookup's id of "ALL": every rule */

/* Rule of name[0..len) and its static spelling; "ALL" is ALL; -1 when unknown. Plugin rules
 * are found once their plugin is loaded. */
static int lookup(const char *name, size_t len, const char **spelled) {
    for (int r = 0; r < af_fusion_rule_count(); r++) {
        const char *s = af_fusion_rule_name(r);
        if (strlen(s) == len && !strncmp(s, name, len)) {
            *spelled = s;
            return r;
        }
    }
    for (size_t i = 0; i < AF_COUNT(aliases); i++) {
        if (strlen(aliases[i].name) == len && !strncmp(aliases[i].name, name, len)) {
            *spelled = aliases[i].name;
            return aliases[i].rule;
        }
    }
    if (len == 3 && !strncmp(name, "ALL", 3)) {
        *spelled = "ALL";
        return ALL;
    }
    return -1;
}

int af_fusion_rule_find(const char *name) {
    const char *spelled;
    int r = name ? lookup(name, strlen(name), &spelled) : -1;
    return r == ALL ? -1 : r;
}

static af_status unknown(af_error *err, const char *where, const char *name, size_t len) {
    char valid[1024] = "";
    size_t used = 0;
    int nr = af_fusion_rule_count(), na = (int)AF_COUNT(aliases);
    for (int r = 0; r <= nr + na; r++) {
        const char *s = r < nr ? af_fusion_rule_name(r) : r < nr + na ? aliases[r - nr].name : "ALL";
        int k = snprintf(valid + used, sizeof valid - used, "%s%s", used ? ", " : "", s);
        if (k < 0 || (size_t)k >= sizeof valid - used) break;
        used += (size_t)k;
    }
    return af_fail(err, AF_ERR_INVALID_ARG, "%s: unknown fusion '%.*s'; valid names: %s", where,
                   len > 200 ? 200 : (int)len, name, valid);
}

static void set_rule(af_fusion_config *cfg, int r, bool off, const char *spelled,
                     const char *source) {
    int lo = r == ALL ? 0 : r, hi = r == ALL ? af_fusion_rule_count() : r + 1;
    for (int k = lo; k < hi; k++) {
        cfg->disabled[k] = off;
        cfg->disabled_as[k] = off ? (r == ALL ? af_fusion_rule_name(k) : spelled) : NULL;
        cfg->disabled_by[k] = off ? source : NULL;
    }
}

void af_fusion_config_init(af_fusion_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
}

af_status af_fusion_disable_list(af_fusion_config *cfg, const char *list, const char *source,
                                 af_error *err) {
    af_fusion_config next = *cfg;
    const char *p = list ? list : "";
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        size_t len = strcspn(p, ", \t\r\n");
        if (!len) break;
        const char *spelled;
        int r = lookup(p, len, &spelled);
        if (r < 0) return unknown(err, source, p, len);
        set_rule(&next, r, true, spelled, source);
        p += len;
    }
    *cfg = next;
    return AF_OK;
}

af_status af_fusion_config_env(af_fusion_config *cfg, af_error *err) {
    static const char *const vars[] = {"AUTOFUSION_DISABLE_LIST", "GE_FUSION_DISABLE_LIST"};
    for (size_t i = 0; i < AF_COUNT(vars); i++) {
        const char *v = getenv(vars[i]);
        if (!v) continue;
        af_status st = af_fusion_disable_list(cfg, v, vars[i], err);
        if (st != AF_OK) return st;
    }
    return AF_OK;
}

bool af_fusion_log_requested(void) {
    static const char *const vars[] = {"AUTOFUSION_FUSION_LOG", "GE_GRAPH_FUSION_LOG"};
    for (size_t i = 0; i < AF_COUNT(vars); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v && strcmp(v, "0")) return true;
    }
    return false;
}

/* "on" -> 0, "off" -> 1, else -1. */
static int parse_off(const char *v, size_t len) {
    if (len == 2 && !strncasecmp(v, "on", 2)) return 0;
    if (len == 3 && !strncasecmp(v, "off", 3)) return 1;
    return -1;
}

static const char *const SOURCE = "--fusion_switch_file";

/* JSON form: ALL first, then the named entries. */
static af_status parse_json(af_fusion_config *cfg, const char *path, const char *data, size_t len,
                            af_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return af_fail(err, AF_ERR_PARSE, "%s:%d: malformed switch file: %s", path, jerr.line,
                       jerr.text);
    af_status st = AF_OK;
    json_t *gf = json_object_get(json_object_get(root, "Switch"), "GraphFusion");
    if (!json_is_object(gf)) {
        st = af_fail(err, AF_ERR_PARSE, "%s: switch file has no Switch.GraphFusion object", path);
        goto done;
    }
    for (int pass = 0; pass < 2 && st == AF_OK; pass++) {
        const char *key;
        json_t *val;
        json_object_foreach(gf, key, val) {
            const char *spelled;
            int r = lookup(key, strlen(key), &spelled);
            if (r < 0) {
                st = unknown(err, path, key, strlen(key));
                break;
            }
            if ((r == ALL) != (pass == 0)) continue;
            const char *v = json_string_value(val);
            int off = v ? parse_off(v, strlen(v)) : -1;
            if (off < 0) {
                st = af_fail(err, AF_ERR_INVALID_ARG, "%s: %s must be \"on\" or \"off\"", path,
                             key);
                break;
            }
            set_rule(cfg, r, off, spelled, SOURCE);
        }
    }
done:
    json_decref(root);
    return st;
}

static void trim(const char **s, size_t *len) {
    while (*len && isspace((unsigned char)**s)) {
        (*s)++;
        (*len)--;
    }
    while (*len && isspace((unsigned char)(*s)[*len - 1])) (*len)--;
}

/* Line form "Name:on|off"; '#' starts a comment. ALL lines apply before the named ones. */
static af_status parse_lines(af_fusion_config *cfg, const char *path, const char *data,
                             size_t len, af_error *err) {
    for (int pass = 0; pass < 2; pass++) {
        size_t pos = 0;
        int line = 0;
        while (pos < len) {
            const char *s = data + pos;
            const char *nl = memchr(s, '\n', len - pos);
            size_t n = nl ? (size_t)(nl - s) : len - pos;
            pos += n + 1;
            line++;
            const char *hash = memchr(s, '#', n);
            if (hash) n = (size_t)(hash - s);
            trim(&s, &n);
            if (!n) continue;
            const char *colon = memchr(s, ':', n);
            if (!colon)
                return af_fail(err, AF_ERR_PARSE, "%s:%d: expected Name:on or Name:off", path,
                               line);
            const char *name = s, *val = colon + 1;
            size_t nlen = (size_t)(colon - s), vlen = n - nlen - 1;
            trim(&name, &nlen);
            trim(&val, &vlen);
            const char *spelled;
            int r = lookup(name, nlen, &spelled);
            if (r < 0) {
                char where[512];
                snprintf(where, sizeof where, "%s:%d", path, line);
                return unknown(err, where, name, nlen);
            }
            int off = parse_off(val, vlen);
            if (off < 0)
                return af_fail(err, AF_ERR_INVALID_ARG, "%s:%d: value must be on or off", path,
                               line);
            if ((r == ALL) == (pass == 0)) set_rule(cfg, r, off, spelled, SOURCE);
        }
    }
    return AF_OK;
}

af_status af_fusion_switch_file(af_fusion_config *cfg, const char *path, af_error *err) {
    unsigned char *data = NULL;
    size_t len = 0;
    if (!path || af_read_file(path, &data, &len) != 0)
        return af_fail(err, AF_ERR_IO, "%s: cannot read the fusion switch file",
                       path ? path : "(null)");
    af_status st;
    if (len > MAX_SWITCH_FILE) {
        st = af_fail(err, AF_ERR_PARSE, "%s: switch file is larger than %d bytes", path,
                     MAX_SWITCH_FILE);
    } else {
        af_fusion_config next = *cfg;
        size_t i = 0;
        while (i < len && isspace(data[i])) i++;
        if (i < len && data[i] == '{')
            st = parse_json(&next, path, (const char *)data, len, err);
        else
            st = parse_lines(&next, path, (const char *)data, len, err);
        if (st == AF_OK) *cfg = next;
    }
    af_free(data);
    return st;
}
