/* The compiled model file (.afm): the loader (afm.h has the layout).
 *
 * Invariant: no byte of the file is used before the header and section checksums match, and no
 * index, count, offset or length is used before it is checked against the section it points
 * into; the IR it builds satisfies af_graph_verify (node order is re-checked with
 * af_graph_toposort, use lists are rebuilt by af_node_set_input, subgraph captures are
 * recomputed from what nodes read). */
#include "format/afm_layout.h"
#include "ir/plugin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every op of meta's "plugin_ops" is registered; else an error naming those that are not. */
static af_status check_plugin_ops(const char *file, const af_afm_meta *meta, af_error *err) {
    const char *ops = NULL;
    for (int i = 0; i < meta->nkv; i++)
        if (!strcmp(meta->kv[i].key, "plugin_ops")) ops = meta->kv[i].value;
    char missing[1024] = "";
    for (const char *p = ops; p && *p;) {
        size_t l = strcspn(p, ",");
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)(l < sizeof key ? l : sizeof key - 1), p);
        if (!af_plugin_op_key(key)) list_add(missing, sizeof missing, key);
        p += l + (p[l] == ',');
    }
    if (!missing[0]) return AF_OK;
    char shown[2 * sizeof missing];
    size_t k = 0;
    for (const char *p = missing; *p; p++) { /* "a,b" as "a, b" */
        shown[k++] = *p;
        if (*p == ',') shown[k++] = ' ';
    }
    shown[k] = '\0';
    return af_fail(err, AF_ERR_UNSUPPORTED,
                   "%s: the model needs custom ops that no loaded plugin defines: %s (give their "
                   "plugin with --plugin or AUTOFUSION_PLUGINS)", file, shown);
}

typedef struct section {
    const uint8_t *p;
    uint64_t size;
} section;

/* A mapped, checksum-verified file and what the loader has decoded so far. */
typedef struct loader {
    const char *file;
    const uint8_t *base;
    size_t len;
    uint32_t version;
    section sec[NSEC];
    uint64_t sec_off[NSEC];
    /* strings */
    uint32_t nstr;
    const uint8_t *str_offs, *str_blob;
    /* record counts */
    uint32_t ngraphs, nvalues, nnodes, nattrs, nrefs, nnums, ntensors;
    /* the IR being built */
    af_arena *a;
    af_graph **graphs;
    uint32_t *parent;  /* per graph: index of the enclosing graph, NONE for the main graph */
    bool *claimed;     /* per graph: an attribute holds it */
    af_value **values; /* by index in the values section */
    uint32_t *vgraph;  /* per value: index of its graph */
    uint32_t *last;    /* per value: the last graph that read it from inside a subgraph */
} loader;

static af_status lfail(const loader *L, af_error *err, af_status code, int sec, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));
static af_status lfail(const loader *L, af_error *err, af_status code, int sec, const char *fmt,
                       ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (sec < 0) return af_fail(err, code, "%s: %s", L->file, reason);
    return af_fail(err, code, "%s: %s: %s", L->file, SEC_NAME[sec], reason);
}

#define BAD(sec, ...) lfail(L, err, AF_ERR_INVALID_MODEL, sec, __VA_ARGS__)

/* Map the file and check the header and every section's checksum. */
static af_status map_file(loader *L, const char *path, af_error *err) {
    struct stat sb;
    L->file = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lfail(L, err, AF_ERR_IO, -1, "cannot open: %s", strerror(errno));
    af_status st = AF_OK;
    if (fstat(fd, &sb) != 0) st = lfail(L, err, AF_ERR_IO, -1, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = lfail(L, err, AF_ERR_IO, -1, "not a regular file");
    else if (sb.st_size < (off_t)HDR_SIZE)
        st = BAD(-1, "not a compiled model: %lld bytes is shorter than the header (%d bytes)",
                 (long long)sb.st_size, HDR_SIZE);
    if (!st) {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (map == MAP_FAILED) st = lfail(L, err, AF_ERR_IO, -1, "cannot map: %s", strerror(errno));
        else {
            L->base = map;
            L->len = (size_t)sb.st_size;
        }
    }
    close(fd);
    return st;
}

static af_status check_header(loader *L, af_error *err) {
    const uint8_t *h = L->base;
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return BAD(-1, "not a compiled model (bad magic; expected \"AFM1\" and a binary marker)");
    L->version = get32(h + 8);
    if (L->version != AF_AFM_FORMAT_VERSION)
        return lfail(L, err, AF_ERR_UNSUPPORTED, -1,
                     "format version %u is not supported (this build reads version %d)",
                     L->version, AF_AFM_FORMAT_VERSION);
    if (get32(h + 12) != HDR_SIZE || get32(h + 24) != NSEC)
        return BAD(-1, "header: size %u with %u sections, expected %d with %d", get32(h + 12),
                   get32(h + 24), HDR_SIZE, NSEC);
    uint64_t want = get64(h + 16);
    if (want != L->len)
        return BAD(-1, "%s: the header says %llu bytes, the file has %zu",
                   want > L->len ? "truncated" : "trailing bytes", (unsigned long long)want,
                   L->len);
    if (hash_bytes(h, HDR_SIZE - 8) != get64(h + HDR_SIZE - 8))
        return BAD(-1, "header: checksum mismatch (the file is damaged or was altered)");
    if (get32(h + 28) != 0) return BAD(-1, "header: unknown flags 0x%x", get32(h + 28));
    uint64_t end = HDR_SIZE;
    for (int s = 0; s < NSEC; s++) {
        const uint8_t *e = h + HDR_FIXED + HDR_ENTRY * s;
        uint64_t off = get64(e + 8), size = get64(e + 16);
        uint64_t align = s == SEC_WEIGHTS ? WEIGHT_ALIGN : 8;
        if (get32(e) != (uint32_t)s + 1)
            return BAD(-1, "header: section %d has kind %u, expected %d", s, get32(e), s + 1);
        if (off < end || off % align || off > L->len || size > L->len - off)
            return BAD(s, "offset %llu and size %llu do not fit the file (%zu bytes) in order",
                       (unsigned long long)off, (unsigned long long)size, L->len);
        for (uint64_t i = end; i < off; i++) /* padding is zero: no byte goes unchecked */
            if (L->base[i])
                return BAD(s, "nonzero padding byte at offset %llu", (unsigned long long)i);
        L->sec[s] = (section){L->base + off, size};
        L->sec_off[s] = off;
        end = off + size;
    }
    if (end != L->len) return BAD(-1, "%zu bytes follow the last section", L->len - (size_t)end);
    for (int s = 0; s < NSEC; s++)
        if (af_afm_section_hash(L->sec[s].p, L->sec[s].size) !=
            get64(h + HDR_FIXED + HDR_ENTRY * s + 24))
            return BAD(s, "checksum mismatch (the file is damaged or was altered)");
    return AF_OK;
}

/* Record count of a section of fixed-size records after a header of `fixed` bytes. */
static af_status count_records(const loader *L, int s, uint64_t fixed, uint64_t rec,
                               uint32_t *n, af_error *err) {
    uint64_t size = L->sec[s].size;
    if (size < fixed || (size - fixed) % rec)
        return BAD(s, "%llu bytes is not a whole number of %llu-byte records",
                   (unsigned long long)size, (unsigned long long)rec);
    if ((size - fixed) / rec >= INT32_MAX) return BAD(s, "too many records");
    *n = (uint32_t)((size - fixed) / rec);
    return AF_OK;
}

static af_status check_strings(loader *L, af_error *err) {
    const section *s = &L->sec[SEC_STRINGS];
    if (s->size < 8)
        return BAD(SEC_STRINGS, "%llu bytes is too short", (unsigned long long)s->size);
    L->nstr = get32(s->p);
    uint64_t table = 8 + 4 * ((uint64_t)L->nstr + 1);
    if (table > s->size)
        return BAD(SEC_STRINGS, "%u strings do not fit in %llu bytes", L->nstr,
                   (unsigned long long)s->size);
    L->str_offs = s->p + 8;
    L->str_blob = s->p + table;
    uint64_t blob = s->size - table;
    uint32_t prev = get32(L->str_offs);
    if (prev != 0) return BAD(SEC_STRINGS, "the first string starts at %u, not 0", prev);
    for (uint32_t i = 0; i < L->nstr; i++) {
        uint32_t next = get32(L->str_offs + 4 * ((size_t)i + 1));
        if (next <= prev || next > blob)
            return BAD(SEC_STRINGS, "string %u spans bytes %u..%u of %llu", i, prev, next,
                       (unsigned long long)blob);
        if (L->str_blob[next - 1] != 0)
            return BAD(SEC_STRINGS, "string %u is not NUL-terminated", i);
        prev = next;
    }
    if (prev != blob)
        return BAD(SEC_STRINGS, "%llu bytes follow the last string",
                   (unsigned long long)(blob - prev));
    return AF_OK;
}

/* String `id` (NULL for NONE when `nullable`) pointing into the mapping; *len excludes the NUL. */
static af_status get_str(const loader *L, int sec, uint32_t id, bool nullable, const char *what,
                         const char **out, size_t *len, af_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (id == NONE && nullable) return AF_OK;
    if (id >= L->nstr)
        return BAD(sec, "%s refers to string %u (the file has %u)", what, id, L->nstr);
    uint32_t a = get32(L->str_offs + 4 * (size_t)id), b = get32(L->str_offs + 4 * (size_t)id + 4);
    *out = (const char *)L->str_blob + a;
    if (len) *len = b - a - 1;
    return AF_OK;
}

/* A range [first, first + n) of a list of `total` items. */
static bool in_range(uint32_t first, uint32_t n, uint32_t total) {
    return first <= total && n <= total - first;
}

static af_status read_meta(loader *L, af_afm_meta *meta, af_error *err) {
    const section *s = &L->sec[SEC_META];
    uint32_t n = 0;
    af_status st = count_records(L, SEC_META, META_FIXED, 8, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n)
        return BAD(SEC_META, "%u key/value pairs announced, %u stored", get32(s->p + 8), n);
    memset(meta, 0, sizeof *meta);
    st = get_str(L, SEC_META, get32(s->p), false, "the version", &meta->version, NULL, err);
    if (!st)
        st = get_str(L, SEC_META, get32(s->p + 4), true, "the command line", &meta->command_line,
                     NULL, err);
    if (st) return st;
    if (!meta->command_line) meta->command_line = "";
    af_afm_kv *kv = af_arena_calloc(L->a, (size_t)n + 1, sizeof *kv);
    if (!kv) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", L->file);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + META_FIXED + 8 * (size_t)i;
        st = get_str(L, SEC_META, get32(r), false, "a key", &kv[i].key, NULL, err);
        if (!st) st = get_str(L, SEC_META, get32(r + 4), false, "a value", &kv[i].value, NULL, err);
    }
    meta->kv = kv;
    meta->nkv = (int)n;
    return st;
}

/* Structural checks and record counts of every section. */
static af_status open_sections(loader *L, af_error *err) {
    af_status st = check_strings(L, err);
    if (!st) st = count_records(L, SEC_GRAPHS, 0, GRAPH_REC, &L->ngraphs, err);
    if (!st) st = count_records(L, SEC_VALUES, 0, VALUE_REC, &L->nvalues, err);
    if (!st) st = count_records(L, SEC_NODES, 0, NODE_REC, &L->nnodes, err);
    if (!st) st = count_records(L, SEC_ATTRS, 0, ATTR_REC, &L->nattrs, err);
    if (!st) st = count_records(L, SEC_REFS, 0, 4, &L->nrefs, err);
    if (!st) st = count_records(L, SEC_NUMS, 0, 8, &L->nnums, err);
    if (!st) st = count_records(L, SEC_TENSORS, 0, TENSOR_REC, &L->ntensors, err);
    if (!st && L->ngraphs == 0) st = BAD(SEC_GRAPHS, "the file holds no graph");
    return st;
}

/* Decode a tensor record into t. With data, the type must be complete and its bytes must lie
 * (64-byte aligned) inside the weights section; t->data then points into the mapping. */
static af_status read_tensor(const loader *L, int sec, const uint8_t *r, bool with_data,
                             const char *what, af_tensor *t, af_error *err) {
    memset(t, 0, sizeof *t);
    uint32_t dtype = get32(r);
    int32_t rank = (int32_t)get32(r + 4);
    if (dtype > AF_DTYPE_BFLOAT16) return BAD(sec, "%s: data type %u is invalid", what, dtype);
    if (rank < -1 || rank > AF_MAX_RANK) return BAD(sec, "%s: rank %d is invalid", what, rank);
    t->dtype = (af_dtype)dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) {
        t->dims[i] = (int64_t)get64(r + 8 + 8 * i);
        if (t->dims[i] < -1) return BAD(sec, "%s: dim %d is %lld", what, i, (long long)t->dims[i]);
    }
    if (!with_data) return AF_OK;
    uint64_t off = get64(r + 72), nbytes = get64(r + 80);
    int64_t n = af_tensor_numel(t);
    size_t es = af_dtype_size(t->dtype), need;
    if (n < 0 || es == 0 || !af_mul_size((size_t)n, es, &need))
        return BAD(sec, "%s: a constant needs a known shape and a numeric type", what);
    if (nbytes != need)
        return BAD(sec, "%s: holds %llu bytes, its type needs %zu", what,
                   (unsigned long long)nbytes, need);
    const section *w = &L->sec[SEC_WEIGHTS];
    if (off % WEIGHT_ALIGN || off > w->size || nbytes > w->size - off)
        return BAD(
            sec, "%s: bytes %llu..+%llu are not 64-byte aligned inside the weights (%llu bytes)",
            what, (unsigned long long)off, (unsigned long long)nbytes, (unsigned long long)w->size);
    t->nbytes = (size_t)nbytes;
    /* Read-only mapping (see onnx.h). An empty constant still gets a valid pointer. */
    t->data = (void *)(w->p + off);
    return AF_OK;
}

static af_status nomem(const loader *L, af_error *err) {
    return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", L->file);
}

/* ir_version and the opset imports of the main graph. */
static af_status read_model(loader *L, af_model *m, af_opset **opsets, int *nopsets,
                            af_error *err) {
    const section *s = &L->sec[SEC_MODEL];
    uint32_t n = 0;
    af_status st = count_records(L, SEC_MODEL, MODEL_FIXED, OPSET_REC, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n)
        return BAD(SEC_MODEL, "%u opsets announced, %u stored", get32(s->p + 8), n);
    m->ir_version = (int64_t)get64(s->p);
    *opsets = af_arena_calloc(L->a, (size_t)n + 1, sizeof **opsets);
    if (!*opsets) return nomem(L, err);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + MODEL_FIXED + OPSET_REC * (size_t)i;
        st = get_str(L, SEC_MODEL, get32(r), false, "an opset domain", &(*opsets)[i].domain, NULL,
                     err);
        (*opsets)[i].version = (int64_t)get64(r + 8);
    }
    *nopsets = (int)n;
    return st;
}

/* Create every graph with its values. Graphs come in pre-order (each graph is followed by its
 * subgraphs, each of those by its own, before the graph's next sibling), which lets
 * build_nodes record captures in one pass. */
static af_status build_graphs(loader *L, af_model *m, af_opset *opsets, int nopsets,
                              af_error *err) {
    const section *gs = &L->sec[SEC_GRAPHS], *vs = &L->sec[SEC_VALUES];
    uint32_t next_value = 0, *chain, depth = 0;
    L->graphs = af_calloc(L->ngraphs, sizeof *L->graphs);
    L->parent = af_calloc(L->ngraphs, sizeof *L->parent);
    L->claimed = af_calloc(L->ngraphs, sizeof *L->claimed);
    L->values = af_calloc((size_t)L->nvalues + 1, sizeof *L->values);
    L->vgraph = af_calloc((size_t)L->nvalues + 1, sizeof *L->vgraph);
    L->last = af_malloc(((size_t)L->nvalues + 1) * sizeof *L->last);
    chain = af_calloc(MAX_GRAPH_DEPTH + 1, sizeof *chain); /* the current graph's ancestors */
    if (!L->graphs || !L->parent || !L->claimed || !L->values || !L->vgraph || !L->last || !chain) {
        af_free(chain);
        return nomem(L, err);
    }
    memset(L->last, 0xff, ((size_t)L->nvalues + 1) * sizeof *L->last);
    af_status st = AF_OK;
    for (uint32_t gi = 0; gi < L->ngraphs && !st; gi++) {
        const uint8_t *r = gs->p + GRAPH_REC * (size_t)gi;
        uint32_t parent = get32(r + 4), vfirst = get32(r + 8), nv = get32(r + 12);
        if ((gi == 0) != (parent == NONE)) {
            st = BAD(SEC_GRAPHS, "graph %u: parent %u is invalid", gi, parent);
            break;
        }
        while (gi && depth > 0 && chain[depth - 1] != parent) depth--;
        if (gi && depth == 0) {
            st = BAD(SEC_GRAPHS, "graph %u: parent %u is not an open graph (graphs are stored "
                     "parents first, in pre-order)", gi, parent);
            break;
        }
        if (depth > MAX_GRAPH_DEPTH) {
            st = BAD(SEC_GRAPHS, "graph %u: subgraphs nest deeper than %d", gi, MAX_GRAPH_DEPTH);
            break;
        }
        chain[depth++] = gi;
        L->parent[gi] = parent;
        if (vfirst != next_value || !in_range(vfirst, nv, L->nvalues)) {
            st = BAD(SEC_GRAPHS, "graph %u: values %u..+%u do not follow the previous graph's "
                     "(%u of %u)", gi, vfirst, nv, next_value, L->nvalues);
            break;
        }
        next_value += nv;
        af_graph *g = af_graph_new(L->a, L->file, gi ? L->graphs[parent] : NULL);
        if (!g) {
            st = nomem(L, err);
            break;
        }
        if (!gi) {
            g->opsets = opsets; /* subgraphs share them (af_graph_new) */
            g->nopsets = nopsets;
            m->graph = g;
        }
        L->graphs[gi] = g;
        st = get_str(L, SEC_GRAPHS, get32(r), true, "a graph name", &g->name, NULL, err);
        uint32_t serial = get32(r + 40);
        g->node_serial = serial > INT32_MAX / 2 ? INT32_MAX / 2 : (int)serial;
        for (uint32_t k = 0; k < nv && !st; k++) {
            uint32_t vi = vfirst + k;
            const uint8_t *vr = vs->p + VALUE_REC * (size_t)vi;
            char what[48];
            const char *name;
            snprintf(what, sizeof what, "value %u", vi);
            st = get_str(L, SEC_VALUES, get32(vr + V_NAME), false, what, &name, NULL, err);
            if (st) break;
            af_value *v = af_value_new(g, name);
            if (!v) {
                st = nomem(L, err);
                break;
            }
            uint32_t flags = get32(vr + V_FLAGS);
            if (flags & ~(uint32_t)(VF_INPUT | VF_OUTPUT | VF_CONST)) {
                st = BAD(SEC_VALUES, "%s ('%s'): unknown flags 0x%x", what, name, flags);
                break;
            }
            /* is_input and is_output follow the graph's lists (build_nodes). */
            v->is_const = flags & VF_CONST;
            st = read_tensor(L, SEC_VALUES, vr + V_TENSOR, v->is_const, what, &v->type, err);
            for (int d = 0; d < v->type.rank && !st; d++)
                st = get_str(L, SEC_VALUES, get32(vr + V_DIMPARAM + 4 * d), true, what,
                             &v->dim_param[d], NULL, err);
            L->values[vi] = v;
            L->vgraph[vi] = gi;
        }
    }
    af_free(chain);
    if (!st && next_value != L->nvalues)
        st = BAD(SEC_GRAPHS, "%u values belong to no graph", L->nvalues - next_value);
    return st;
}

/* Value `id` read or written in graph gi: NULL for NONE, else a value of gi or of a graph that
 * encloses it. */
static af_status ref_value(const loader *L, int sec, uint32_t id, uint32_t gi, const char *what,
                           af_value **out, af_error *err) {
    *out = NULL;
    if (id == NONE) return AF_OK;
    if (id >= L->nvalues)
        return BAD(sec, "%s refers to value %u (the file has %u)", what, id, L->nvalues);
    uint32_t up = gi;
    while (up != NONE && up != L->vgraph[id]) up = L->parent[up];
    if (up == NONE)
        return BAD(sec, "%s refers to value '%s' of a graph that does not enclose it", what,
                   L->values[id]->name);
    *out = L->values[id];
    return AF_OK;
}

/* Graph gi reads value id of an enclosing graph: every graph from gi up to (not including) the
 * value's own captures it, as af_graph_find would record. Graphs are built in pre-order, so a
 * graph `up` on that path already lists the value exactly when an earlier read came from a graph
 * numbered up or higher (its subtree): L->last makes each addition O(1). */
static af_status note_read(loader *L, uint32_t gi, uint32_t id, af_error *err) {
    if (id == NONE || L->vgraph[id] == gi) return AF_OK;
    for (uint32_t up = gi; up != L->vgraph[id]; up = L->parent[up]) {
        if (L->last[id] != NONE && L->last[id] >= up) break;
        af_graph *t = L->graphs[up];
        if (!af_arena_grow(L->a, (void **)&t->captures, &t->captures_cap, t->ncaptures + 1,
                           sizeof(af_value *)))
            return nomem(L, err);
        t->captures[t->ncaptures++] = L->values[id];
    }
    L->last[id] = gi;
    return AF_OK;
}

/* An attribute tensor record. */
static af_status attr_tensor(const loader *L, uint32_t id, const char *what, af_tensor **out,
                             af_error *err) {
    if (id >= L->ntensors)
        return BAD(SEC_ATTRS, "%s refers to tensor %u (the file has %u)", what, id, L->ntensors);
    if (!(*out = af_arena_alloc(L->a, sizeof **out))) return nomem(L, err);
    return read_tensor(L, SEC_TENSORS, L->sec[SEC_TENSORS].p + TENSOR_REC * (size_t)id, true, what,
                       *out, err);
}

/* Subgraph `id` for an attribute of a node of graph gi: it must be gi's child, held once. */
static af_status attr_graph(loader *L, uint32_t gi, uint32_t id, const char *what, af_graph **out,
                            af_error *err) {
    if (id == 0 || id >= L->ngraphs || L->parent[id] != gi || L->claimed[id])
        return BAD(SEC_ATTRS, "%s: graph %u is not a free subgraph of graph %u", what, id, gi);
    L->claimed[id] = true;
    *out = L->graphs[id];
    return AF_OK;
}

static af_status read_numbers(const loader *L, af_attr *at, uint32_t first, uint32_t count,
                              const char *what, af_error *err) {
    if (!in_range(first, count, L->nnums))
        return BAD(SEC_ATTRS, "%s: numbers %u..+%u outside the %u stored", what, first, count,
                   L->nnums);
    const uint8_t *p = L->sec[SEC_NUMS].p + 8 * (size_t)first;
    at->n = (int)count;
    if (at->type == AF_ATTR_INTS) {
        if (!(at->ints = af_arena_calloc(L->a, (size_t)count + 1, sizeof(int64_t))))
            return nomem(L, err);
        for (uint32_t k = 0; k < count; k++) at->ints[k] = (int64_t)get64(p + 8 * (size_t)k);
    } else {
        if (!(at->floats = af_arena_calloc(L->a, (size_t)count + 1, sizeof(float))))
            return nomem(L, err);
        for (uint32_t k = 0; k < count; k++) {
            uint32_t bits = get32(p + 8 * (size_t)k);
            memcpy(&at->floats[k], &bits, 4);
        }
    }
    return AF_OK;
}

/* STRINGS, TENSORS and GRAPHS: `count` ids in the refs section from `first`. */
static af_status read_list(loader *L, uint32_t gi, af_attr *at, uint32_t first, uint32_t count,
                           const char *what, af_error *err) {
    if (!in_range(first, count, L->nrefs))
        return BAD(SEC_ATTRS, "%s: list %u..+%u outside the %u refs", what, first, count, L->nrefs);
    const uint8_t *ids = L->sec[SEC_REFS].p + 4 * (size_t)first;
    void **items = af_arena_calloc(L->a, (size_t)count + 1, sizeof(void *));
    if (!items) return nomem(L, err);
    at->n = (int)count;
    af_status st = AF_OK;
    for (uint32_t k = 0; k < count && !st; k++) {
        uint32_t id = get32(ids + 4 * (size_t)k);
        if (at->type == AF_ATTR_STRINGS)
            st = get_str(L, SEC_ATTRS, id, false, what, (const char **)&items[k], NULL, err);
        else if (at->type == AF_ATTR_TENSORS)
            st = attr_tensor(L, id, what, (af_tensor **)&items[k], err);
        else
            st = attr_graph(L, gi, id, what, (af_graph **)&items[k], err);
    }
    if (at->type == AF_ATTR_STRINGS) at->strings = (const char **)items;
    else if (at->type == AF_ATTR_TENSORS) at->tensors = (af_tensor **)items;
    else at->graphs = (af_graph **)items;
    return st;
}

/* Attribute record ai of node n (in graph gi). */
static af_status read_attr(loader *L, uint32_t gi, const af_node *n, uint32_t ai, af_attr *at,
                           af_error *err) {
    const uint8_t *r = L->sec[SEC_ATTRS].p + ATTR_REC * (size_t)ai;
    char what[96];
    snprintf(what, sizeof what, "attribute %u of node '%.40s'", ai, n->name);
    af_status st = get_str(L, SEC_ATTRS, get32(r), false, what, &at->name, NULL, err);
    if (st) return st;
    uint32_t type = get32(r + 4), count = get32(r + 8), ref = get32(r + 12);
    at->type = (af_attr_type)type;
    switch (type) {
    case AF_ATTR_FLOAT: {
        uint32_t bits = get32(r + 24);
        memcpy(&at->f, &bits, 4);
        return AF_OK;
    }
    case AF_ATTR_INT:
        at->i = (int64_t)get64(r + 16);
        return AF_OK;
    case AF_ATTR_STRING:
        return get_str(L, SEC_ATTRS, ref, false, what, &at->s, &at->slen, err);
    case AF_ATTR_TENSOR:
        return attr_tensor(L, ref, what, &at->t, err);
    case AF_ATTR_GRAPH:
        return attr_graph(L, gi, ref, what, &at->g, err);
    case AF_ATTR_FLOATS:
    case AF_ATTR_INTS:
        return read_numbers(L, at, ref, count, what, err);
    case AF_ATTR_STRINGS:
    case AF_ATTR_TENSORS:
    case AF_ATTR_GRAPHS:
        return read_list(L, gi, at, ref, count, what, err);
    default:
        return BAD(SEC_ATTRS, "%s ('%s') has unknown type %u", what, at->name, type);
    }
}

/* A run of `n` refs starting at `first`, checked to lie inside the refs section. */
static af_status ref_list(const loader *L, int sec, uint32_t first, uint32_t n, const char *what,
                          const uint8_t **out, af_error *err) {
    if (!in_range(first, n, L->nrefs))
        return BAD(sec, "%s: refs %u..+%u outside the %u stored", what, first, n, L->nrefs);
    *out = L->sec[SEC_REFS].p + 4 * (size_t)first;
    return AF_OK;
}

static af_status build_node(loader *L, uint32_t gi, uint32_t ni, uint32_t *next_attr,
                            af_error *err) {
    af_graph *g = L->graphs[gi];
    const uint8_t *r = L->sec[SEC_NODES].p + NODE_REC * (size_t)ni, *ins = NULL, *outs = NULL;
    char what[64];
    snprintf(what, sizeof what, "node %u", ni);
    const char *name, *op_type, *domain;
    af_status st = get_str(L, SEC_NODES, get32(r), false, what, &name, NULL, err);
    if (!st) st = get_str(L, SEC_NODES, get32(r + 4), false, what, &op_type, NULL, err);
    if (!st) st = get_str(L, SEC_NODES, get32(r + 8), false, what, &domain, NULL, err);
    if (st) return st;
    uint32_t nin = get32(r + 12), nout = get32(r + 20), nattrs = get32(r + 28);
    uint32_t attr_first = get32(r + 32);
    snprintf(what, sizeof what, "node %u ('%.40s')", ni, name);
    st = ref_list(L, SEC_NODES, get32(r + 16), nin, what, &ins, err);
    if (!st) st = ref_list(L, SEC_NODES, get32(r + 24), nout, what, &outs, err);
    if (st) return st;
    if (attr_first != *next_attr || !in_range(attr_first, nattrs, L->nattrs))
        return BAD(SEC_NODES, "%s: attributes %u..+%u do not follow the previous node's (%u of %u)",
                   what, attr_first, nattrs, *next_attr, L->nattrs);
    *next_attr += nattrs;
    if (nattrs > MAX_NODE_ATTRS)
        return BAD(SEC_NODES, "%s has %u attributes (at most %d)", what, nattrs, MAX_NODE_ATTRS);
    af_op op = af_op_lookup(domain, op_type);
    if (op == AF_OP_COUNT)
        return lfail(L, err, AF_ERR_UNSUPPORTED, SEC_NODES,
                     "%s: op '%s' of domain '%s' is not supported by this build", what, op_type,
                     *domain ? domain : "ai.onnx");
    af_node *n = af_node_new(g, op, name, (int)nin, (int)nout);
    if (!n || !(n->attrs = af_arena_calloc(L->a, (size_t)nattrs + 1, sizeof(af_attr))))
        return nomem(L, err);
    n->op_type = op_type;
    n->domain = domain;
    for (uint32_t k = 0; k < nout; k++) {
        af_value *v;
        st = ref_value(L, SEC_NODES, get32(outs + 4 * (size_t)k), gi, what, &v, err);
        if (st) return st;
        if (!v) continue;
        if (v->graph != g || v->producer || v->is_const || v->is_input)
            return BAD(SEC_NODES, "%s: output '%s' is a graph input, a constant, another node's "
                       "output or a value of an enclosing graph", what, v->name);
        af_node_set_output(n, (int)k, v);
    }
    for (uint32_t k = 0; k < nin; k++) {
        af_value *v;
        uint32_t id = get32(ins + 4 * (size_t)k);
        st = ref_value(L, SEC_NODES, id, gi, what, &v, err);
        if (!st) st = note_read(L, gi, id, err);
        if (st) return st;
        if (v) af_node_set_input(n, (int)k, v);
    }
    for (uint32_t a = 0; a < nattrs; a++) {
        st = read_attr(L, gi, n, attr_first + a, &n->attrs[a], err);
        if (st) return st;
        n->nattrs = (int)a + 1;
        for (uint32_t b = 0; b < a; b++)
            if (!strcmp(n->attrs[a].name, n->attrs[b].name))
                return BAD(SEC_ATTRS, "%s: attribute '%s' given twice", what, n->attrs[a].name);
    }
    return AF_OK;
}

/* Graph gi's inputs and outputs. */
static af_status build_io(loader *L, uint32_t gi, af_error *err) {
    const uint8_t *r = L->sec[SEC_GRAPHS].p + GRAPH_REC * (size_t)gi, *ins = NULL, *outs = NULL;
    af_graph *g = L->graphs[gi];
    char what[32];
    snprintf(what, sizeof what, "graph %u", gi);
    uint32_t nin = get32(r + 28), nout = get32(r + 36);
    af_status st = ref_list(L, SEC_GRAPHS, get32(r + 24), nin, what, &ins, err);
    if (!st) st = ref_list(L, SEC_GRAPHS, get32(r + 32), nout, what, &outs, err);
    if (st) return st;
    g->inputs = af_arena_calloc(L->a, (size_t)nin + 1, sizeof(af_value *));
    g->outputs = af_arena_calloc(L->a, (size_t)nout + 1, sizeof(af_value *));
    if (!g->inputs || !g->outputs) return nomem(L, err);
    for (uint32_t k = 0; k < nin; k++) {
        af_value *v;
        st = ref_value(L, SEC_GRAPHS, get32(ins + 4 * (size_t)k), gi, what, &v, err);
        if (st) return st;
        if (!v || v->graph != g || v->is_input)
            return BAD(SEC_GRAPHS, "%s: input %u is missing, listed twice or another graph's",
                       what, k);
        v->is_input = true;
        g->inputs[g->ninputs++] = v;
    }
    for (uint32_t k = 0; k < nout; k++) {
        af_value *v;
        uint32_t id = get32(outs + 4 * (size_t)k);
        st = ref_value(L, SEC_GRAPHS, id, gi, what, &v, err);
        if (!st) st = note_read(L, gi, id, err);
        if (st) return st;
        if (!v) return BAD(SEC_GRAPHS, "%s: output %u is missing", what, k);
        if (v->graph == g) v->is_output = true;
        g->outputs[g->noutputs++] = v;
    }
    return AF_OK;
}

/* Every graph's inputs, outputs and nodes, in graph order (note_read relies on it). */
static af_status build_nodes(loader *L, af_error *err) {
    uint32_t next_node = 0, next_attr = 0;
    for (uint32_t gi = 0; gi < L->ngraphs; gi++) {
        const uint8_t *r = L->sec[SEC_GRAPHS].p + GRAPH_REC * (size_t)gi;
        uint32_t first = get32(r + 16), nn = get32(r + 20);
        af_status st = build_io(L, gi, err);
        if (st) return st;
        if (first != next_node || !in_range(first, nn, L->nnodes))
            return BAD(SEC_GRAPHS, "graph %u: nodes %u..+%u do not follow the previous graph's "
                       "(%u of %u)", gi, first, nn, next_node, L->nnodes);
        next_node += nn;
        for (uint32_t k = 0; k < nn; k++) {
            st = build_node(L, gi, first + k, &next_attr, err);
            if (st) return st;
        }
    }
    if (next_node != L->nnodes)
        return BAD(SEC_GRAPHS, "%u nodes belong to no graph", L->nnodes - next_node);
    if (next_attr != L->nattrs)
        return BAD(SEC_NODES, "%u attributes belong to no node", L->nattrs - next_attr);
    for (uint32_t gi = 1; gi < L->ngraphs; gi++)
        if (!L->claimed[gi]) return BAD(SEC_GRAPHS, "graph %u is not held by any node", gi);
    return AF_OK;
}

/* Every value a node reads or a graph returns exists when it is needed: a graph input, a
 * constant, or a node's output; af_graph_toposort then checks that producers run first. */
static af_status check_reads(const loader *L, af_error *err) {
    for (uint32_t gi = 0; gi < L->ngraphs; gi++) {
        af_graph *g = L->graphs[gi];
        for (int i = 0; i < g->nnodes; i++) {
            const af_node *n = g->nodes[i];
            for (int k = 0; k < n->nin; k++) {
                const af_value *v = n->in[k];
                if (v && !v->is_input && !v->is_const && !v->producer)
                    return BAD(SEC_NODES, "node '%s' reads '%s', which nothing produces", n->name,
                               v->name);
            }
        }
        for (int k = 0; k < g->noutputs; k++) {
            const af_value *v = g->outputs[k];
            if (!v->is_input && !v->is_const && !v->producer)
                return BAD(SEC_GRAPHS, "graph %u: output '%s' is produced by nothing", gi, v->name);
        }
        af_status st = af_graph_toposort(g, err);
        if (st) return st;
    }
    return AF_OK;
}

/* The plan section (empty: no plan) into *out, checked against the loaded main graph. */
static af_status read_plan(const loader *L, af_plan **out, af_error *err) {
    const section *s = &L->sec[SEC_PLAN];
    uint32_t n = 0;
    *out = NULL;
    if (s->size == 0) return AF_OK;
    af_status st = count_records(L, SEC_PLAN, PLAN_FIXED, PLAN_REC, &n, err);
    if (st) return st;
    if (get32(s->p + 8) != n || get32(s->p + 12) != 0)
        return BAD(SEC_PLAN, "%u entries announced (and word %u), %u stored", get32(s->p + 8),
                   get32(s->p + 12), n);
    const af_graph *g = L->graphs[0];
    af_plan *p = af_plan_new(g->nvalues);
    if (!p) return nomem(L, err);
    p->arena_size = get64(s->p);
    for (uint32_t i = 0; i < n && !st; i++) {
        const uint8_t *r = s->p + PLAN_FIXED + PLAN_REC * (size_t)i;
        uint32_t vi = get32(r), src = get32(r + 4), prev = i ? get32(r - PLAN_REC) : 0;
        uint64_t off = get64(r + 8), size = get64(r + 16);
        if (vi >= L->nvalues || L->vgraph[vi] != 0 || (i && vi <= prev))
            st = BAD(SEC_PLAN, "entry %u: value %u is not the next value of the main graph", i,
                     vi);
        else if (src != NONE && (src >= L->nvalues || L->vgraph[src] != 0))
            st = BAD(SEC_PLAN, "entry %u: in place over value %u, not one of the main graph", i,
                     src);
        else if (off > AF_PLAN_MAX_BYTES || size > AF_PLAN_MAX_BYTES)
            st = BAD(SEC_PLAN, "entry %u: bytes %llu..+%llu are beyond any arena", i,
                     (unsigned long long)off, (unsigned long long)size);
        else
            p->slots[L->values[vi]->id] =
                (af_plan_slot){(int64_t)off, size, src == NONE ? -1 : L->values[src]->id};
    }
    if (!st) {
        af_error e;
        st = af_plan_check(g, p, &e);
        if (st) st = lfail(L, err, st, -1, "%s", e.message);
    }
    if (st) af_plan_free(p);
    else *out = p;
    return st;
}

static void loader_free(loader *L) {
    af_free(L->graphs);
    af_free(L->parent);
    af_free(L->claimed);
    af_free(L->values);
    af_free(L->vgraph);
    af_free(L->last);
}

af_status af_afm_load_with_plan(const char *path, af_model **out, af_afm_meta *meta_out,
                                af_plan **plan_out, af_error *err) {
    loader L = {0};
    af_afm_meta meta;
    af_opset *opsets = NULL;
    af_plan *plan = NULL;
    int nopsets = 0;
    *out = NULL;
    if (plan_out) *plan_out = NULL;
    af_model *m = af_calloc(1, sizeof *m);
    if (m) m->arena = af_arena_new();
    if (!m || !m->arena || !(m->path = af_arena_strdup(m->arena, path))) {
        if (m) af_arena_free(m->arena);
        af_free(m);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    }
    L.a = m->arena;
    af_status st = map_file(&L, m->path, err);
    if (!st) {
        m->map = (void *)L.base; /* af_model_free unmaps it */
        m->map_len = L.len;
        m->map_is_mmap = true;
        st = check_header(&L, err);
    }
    if (!st) st = open_sections(&L, err);
    if (!st) st = read_meta(&L, &meta, err);
    if (!st) st = check_plugin_ops(L.file, &meta, err);
    if (!st) st = read_model(&L, m, &opsets, &nopsets, err);
    if (!st) st = build_graphs(&L, m, opsets, nopsets, err);
    if (!st) st = build_nodes(&L, err);
    if (!st) st = check_reads(&L, err);
    if (!st) st = af_graph_name_input_dims(m->graph, err); /* symbols again, by name */
#ifndef NDEBUG
    if (!st) st = af_graph_verify(m->graph, err);
#endif
    if (!st) st = read_plan(&L, &plan, err);
    loader_free(&L);
    if (st) {
        af_model_free(m);
        return st;
    }
    m->producer_name = "autofusion";
    m->domain = m->doc_string = "";
    m->producer_version = meta.version;
    if (meta_out) *meta_out = meta;
    if (plan_out) *plan_out = plan;
    else af_plan_free(plan);
    *out = m;
    return AF_OK;
}

af_status af_afm_load(const char *path, af_model **out, af_afm_meta *meta_out, af_error *err) {
    return af_afm_load_with_plan(path, out, meta_out, NULL, err);
}

/* ---- metadata ------------------------------------------------------------------------------- */

af_status af_afm_read_meta(const char *path, af_afm_info **out, af_error *err) {
    loader L = {0};
    *out = NULL;
    af_afm_info *info = af_calloc(1, sizeof *info);
    if (info) info->arena = af_arena_new();
    if (!info || !info->arena) {
        af_free(info);
        return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    }
    L.a = info->arena;
    const char *file = af_arena_strdup(info->arena, path);
    af_status st =
        file ? map_file(&L, file, err) : af_fail(err, AF_ERR_NOMEM, "%s: out of memory", path);
    if (!st) st = check_header(&L, err);
    if (!st) st = check_strings(&L, err);
    if (!st) st = read_meta(&L, &info->meta, err);
    af_afm_section *secs = st ? NULL : af_arena_calloc(info->arena, NSEC, sizeof *secs);
    if (!st && !secs) st = nomem(&L, err);
    if (!st) {
        for (int s = 0; s < NSEC; s++)
            secs[s] = (af_afm_section){SEC_NAME[s], L.sec_off[s], L.sec[s].size};
        info->sections = secs;
        info->nsections = NSEC;
        info->format_version = L.version;
        info->file_size = L.len;
        /* The strings live in the mapping, which goes away: copy what the caller keeps. */
        af_afm_meta *mt = &info->meta;
        af_afm_kv *kv = (af_afm_kv *)mt->kv;
        mt->version = af_arena_strdup(info->arena, mt->version);
        mt->command_line = af_arena_strdup(info->arena, mt->command_line);
        bool ok = mt->version && mt->command_line;
        for (int i = 0; i < mt->nkv && ok; i++) {
            kv[i].key = af_arena_strdup(info->arena, kv[i].key);
            kv[i].value = af_arena_strdup(info->arena, kv[i].value);
            ok = kv[i].key && kv[i].value;
        }
        if (!ok) st = nomem(&L, err);
    }
    if (L.base) munmap((void *)L.base, L.len);
    if (st) {
        af_afm_info_free(info);
        return st;
    }
    *out = info;
    return AF_OK;
}

void af_afm_info_free(af_afm_info *info) {
    if (!info) return;
    af_arena_free(info->arena);
    af_free(info);
}

/* Totals over a graph and its subgraphs. */
