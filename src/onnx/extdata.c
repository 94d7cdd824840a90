/* External tensor data (TensorProto.data_location = EXTERNAL), read with the security checklist
 * of docs/design.md section 9.
 *
 * Invariant: a byte range is handed out only if it lies inside a regular file that (1) was named
 * by a relative path without "..", (2) resolves (realpath) inside the model's folder, (3) is not
 * a symlink and has no other hard link, and (4) is the very file that was checked (the opened
 * descriptor's device and inode match). Each file is mapped once per model and stays mapped,
 * read-only, until af_model_free.
 */
#include "onnx/onnx.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TENSOR_EXTERNAL_DATA = 13, ENTRY_KEY = 1, ENTRY_VALUE = 2 };

struct af_extfile {
    af_extfile *next;
    const char *real; /* resolved path: the cache key */
    void *map;        /* NULL for an empty file */
    size_t len;
};

typedef struct ext_ref {
    const char *location;
    int64_t offset, length; /* length -1: not given */
} ext_ref;

static af_status ext_fail(const af_model *m, const char *tname, const char *loc, af_error *err,
                          af_status code, const char *reason, const char *detail) {
    return af_fail(err, code, "%s: tensor '%s': external data '%s': %s%s%s", m->path, tname,
                   loc ? loc : "", reason, detail ? ": " : "", detail ? detail : "");
}

/* A non-negative decimal integer, digits only. */
static bool parse_count(const char *s, int64_t *out) {
    int64_t v = 0;
    if (!*s) return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || !af_mul_i64(v, 10, &v) || !af_add_i64(v, *s - '0', &v))
            return false;
    }
    *out = v;
    return true;
}

static af_status read_entry(const af_model *m, const af_pb *msg, const char **key,
                            const char **value, af_error *err) {
    af_pb r = *msg;
    af_pb_field f;
    af_status st = AF_OK;
    *key = *value = "";
    while (st == AF_OK && (st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num == ENTRY_KEY)
            st = af_pb_str(&r, &f, "key", m->arena, key, err);
        else if (f.num == ENTRY_VALUE)
            st = af_pb_str(&r, &f, "value", m->arena, value, err);
    }
    return st;
}

/* The external_data entries; "checksum" and unknown keys are ignored. */
static af_status read_ref(const af_model *m, const af_pb *msg, const char *tname, ext_ref *ref,
                          af_error *err) {
    af_pb r = *msg, sub;
    af_pb_field f;
    af_status st;
    ref->location = NULL;
    ref->offset = 0;
    ref->length = -1;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != TENSOR_EXTERNAL_DATA) continue;
        const char *key, *value;
        st = af_pb_sub(&r, &f, "StringStringEntryProto", &sub, err);
        if (st == AF_OK) st = read_entry(m, &sub, &key, &value, err);
        if (st) return st;
        if (!strcmp(key, "location"))
            ref->location = value;
        else if ((!strcmp(key, "offset") && !parse_count(value, &ref->offset)) ||
                 (!strcmp(key, "length") && !parse_count(value, &ref->length)))
            return ext_fail(m, tname, ref->location, err, AF_ERR_INVALID_MODEL, key,
                            "not a decimal integer in 0 .. 2^63-1");
    }
    if (st) return st;
    if (!ref->location)
        return ext_fail(m, tname, NULL, err, AF_ERR_INVALID_MODEL, "no location given", NULL);
    return AF_OK;
}

/* Relative, non-empty, and no ".." component. */
static const char *bad_location(const char *loc) {
    if (!*loc) return "empty location";
    if (loc[0] == '/') return "absolute paths are not allowed";
    for (const char *p = loc; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') return "'..' is not allowed";
        p += n;
        if (*p == '/') p++;
    }
    return NULL;
}

static bool inside(const char *dir, const char *real) {
    size_t n = strlen(dir);
    if (strncmp(dir, real, n) != 0) return false;
    return (n > 0 && dir[n - 1] == '/') || real[n] == '/';
}

/* Open, check and map the file at `full` (resolved to `real`), or find it in the cache. *out is
 * NULL unless it succeeds. */
static af_status open_file(af_model *m, const char *tname, const char *loc, const char *full,
                           const char *real, af_extfile **out, af_error *err) {
    *out = NULL;
    for (af_extfile *e = m->ext; e; e = e->next) {
        if (!strcmp(e->real, real)) {
            *out = e;
            return AF_OK;
        }
    }
    struct stat ls, fs;
    if (lstat(full, &ls) != 0)
        return ext_fail(m, tname, loc, err, AF_ERR_IO, "cannot stat", strerror(errno));
    if (S_ISLNK(ls.st_mode))
        return ext_fail(m, tname, loc, err, AF_ERR_INVALID_MODEL, "symlinks are not allowed", NULL);
    if (!S_ISREG(ls.st_mode))
        return ext_fail(m, tname, loc, err, AF_ERR_INVALID_MODEL, "not a regular file", NULL);
    if (ls.st_nlink > 1)
        return ext_fail(m, tname, loc, err, AF_ERR_INVALID_MODEL,
                        "files with several hard links are not allowed", NULL);
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ext_fail(m, tname, loc, err, AF_ERR_IO, "cannot open", strerror(errno));
    af_status st = AF_OK;
    void *map = NULL;
    if (fstat(fd, &fs) != 0 || fs.st_dev != ls.st_dev || fs.st_ino != ls.st_ino ||
        fs.st_nlink > 1) {
        st = ext_fail(m, tname, loc, err, AF_ERR_IO, "the file changed while it was checked", NULL);
        goto fail;
    }
    if (fs.st_size > 0) {
        map = mmap(NULL, (size_t)fs.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            st = ext_fail(m, tname, loc, err, AF_ERR_IO, "cannot map", strerror(errno));
            goto fail;
        }
    }
    af_extfile *e = af_arena_alloc(m->arena, sizeof *e);
    if (!e || !(e->real = af_arena_strdup(m->arena, real))) {
        st = af_fail(err, AF_ERR_NOMEM, "%s: out of memory", m->path);
        goto fail;
    }
    e->map = map;
    e->len = (size_t)fs.st_size;
    e->next = m->ext;
    m->ext = e;
    map = NULL; /* owned by the cache now */
    *out = e;
fail:
    if (map) munmap(map, (size_t)fs.st_size);
    close(fd);
    return st;
}

af_status af_onnx_extdata(af_model *m, const af_pb *msg, const char *tname, size_t nbytes,
                          const uint8_t **data, af_error *err) {
    /* Where an empty tensor points: valid, aligned for every type, never written. */
    static const uint8_t empty[16] __attribute__((aligned(16)));
    ext_ref ref;
    af_status st = read_ref(m, msg, tname, &ref, err);
    if (st) return st;
    const char *why = bad_location(ref.location);
    if (why) return ext_fail(m, tname, ref.location, err, AF_ERR_INVALID_MODEL, why, NULL);
    if (ref.length >= 0 && (uint64_t)ref.length != nbytes) {
        char detail[64];
        snprintf(detail, sizeof detail, "%lld bytes given, %zu needed", (long long)ref.length,
                 nbytes);
        return ext_fail(m, tname, ref.location, err, AF_ERR_INVALID_MODEL,
                        "length does not match the tensor", detail);
    }

    size_t n = strlen(m->dir) + 1 + strlen(ref.location) + 1;
    char *full = af_malloc(n), *real = NULL;
    af_extfile *e;
    if (!full) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", m->path);
    snprintf(full, n, "%s/%s", m->dir, ref.location);
    real = realpath(full, NULL);
    if (!real) {
        st = ext_fail(m, tname, ref.location, err, AF_ERR_IO, "cannot resolve", strerror(errno));
        goto fail;
    }
    if (!inside(m->dir, real)) {
        st = ext_fail(m, tname, ref.location, err, AF_ERR_INVALID_MODEL,
                      "resolves outside the model's folder", real);
        goto fail;
    }
    st = open_file(m, tname, ref.location, full, real, &e, err);
    if (st) goto fail;
    int64_t end;
    if (!af_add_i64(ref.offset, (int64_t)nbytes, &end) || (uint64_t)end > e->len) {
        char detail[96];
        snprintf(detail, sizeof detail, "offset %lld + %zu bytes, file has %zu",
                 (long long)ref.offset, nbytes, e->len);
        st = ext_fail(m, tname, ref.location, err, AF_ERR_INVALID_MODEL,
                      "range past the end of the file", detail);
        goto fail;
    }
    *data = nbytes ? (const uint8_t *)e->map + ref.offset : empty;
fail:
    af_free(full);
    af_free(real);
    return st;
}

void af_onnx_extdata_close(af_model *m) {
    for (af_extfile *e = m->ext; e; e = e->next)
        if (e->map) munmap(e->map, e->len);
    m->ext = NULL;
}
