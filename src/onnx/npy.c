/* NumPy .npy files: load (format versions 1, 2 and 3) and save (version 1).
 *
 * Invariant: the header is parsed as data, never evaluated: a small parser accepts exactly the
 * dict numpy writes ({'descr': ..., 'fortran_order': ..., 'shape': (...)}), every read is
 * bounds-checked against the header, and the element count and byte size are overflow-checked
 * and must match the bytes that follow the header exactly.
 */
#include "onnx/onnx.h"

#include <errno.h>
#include <string.h>

static const char magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

static const struct {
    const char *code; /* descr without its byte-order character */
    af_dtype dtype;
} npy_types[] = {
    {"f2", AF_DTYPE_FLOAT16}, {"f4", AF_DTYPE_FLOAT},  {"f8", AF_DTYPE_DOUBLE},
    {"i1", AF_DTYPE_INT8},    {"i2", AF_DTYPE_INT16},  {"i4", AF_DTYPE_INT32},
    {"i8", AF_DTYPE_INT64},   {"u1", AF_DTYPE_UINT8},  {"u2", AF_DTYPE_UINT16},
    {"u4", AF_DTYPE_UINT32},  {"u8", AF_DTYPE_UINT64}, {"b1", AF_DTYPE_BOOL},
};

/* ---- header parser ------------------------------------------------------------------------- */

typedef struct hdr {
    const char *p, *end;
} hdr;

static void skip_ws(hdr *h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static bool eat(hdr *h, char c) {
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes; (s, n) point into the header. */
static bool parse_str(hdr *h, const char **s, size_t *n) {
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return false;
    char q = *h->p++;
    const char *start = h->p;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\') return false;
        h->p++;
    }
    if (h->p >= h->end) return false;
    *s = start;
    *n = (size_t)(h->p - start);
    h->p++;
    return true;
}

static bool parse_word(hdr *h, const char *w) {
    size_t n = strlen(w);
    skip_ws(h);
    if ((size_t)(h->end - h->p) < n || memcmp(h->p, w, n) != 0) return false;
    h->p += n;
    return true;
}

/* "(d0, d1, ...)" with an optional trailing comma; Python 2's "3L" is accepted. */
static bool parse_shape(hdr *h, af_tensor *t) {
    if (!eat(h, '(')) return false;
    t->rank = 0;
    for (;;) {
        if (eat(h, ')')) return true;
        skip_ws(h);
        int64_t v = 0;
        const char *start = h->p;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
            if (!af_mul_i64(v, 10, &v) || !af_add_i64(v, *h->p - '0', &v)) return false;
            h->p++;
        }
        if (h->p == start || t->rank == AF_MAX_RANK) return false;
        if (h->p < h->end && *h->p == 'L') h->p++;
        t->dims[t->rank++] = v;
        if (!eat(h, ',')) {
            return eat(h, ')');
        }
    }
}

static bool parse_descr(const char *s, size_t n, af_dtype *out) {
    if (n != 3) return false;
    for (size_t i = 0; i < AF_COUNT(npy_types); i++) {
        if (memcmp(s + 1, npy_types[i].code, 2) != 0) continue;
        bool one_byte = npy_types[i].code[1] == '1';
        if (s[0] == '<' || s[0] == '|' || s[0] == '=' || (one_byte && s[0] == '>')) {
            *out = npy_types[i].dtype;
            return true;
        }
    }
    return false;
}

/* The header dict into t's dtype and dims; NULL on success, else what is wrong. */
static const char *parse_header(hdr *h, af_tensor *t) {
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(h, '{')) return "header is not a dict";
    for (;;) {
        const char *key;
        size_t klen;
        if (eat(h, '}')) break;
        if (!parse_str(h, &key, &klen) || !eat(h, ':')) return "malformed header";
        if (klen == 5 && !memcmp(key, "descr", 5)) {
            const char *d;
            size_t dlen;
            if (!parse_str(h, &d, &dlen)) return "malformed descr";
            if (!parse_descr(d, dlen, &t->dtype))
                return "unsupported descr (little-endian f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1 only)";
            have_descr = true;
        } else if (klen == 13 && !memcmp(key, "fortran_order", 13)) {
            if (parse_word(h, "True")) return "Fortran order is not supported";
            if (!parse_word(h, "False")) return "malformed fortran_order";
            have_order = true;
        } else if (klen == 5 && !memcmp(key, "shape", 5)) {
            if (!parse_shape(h, t)) return "malformed shape (or rank above 8)";
            have_shape = true;
        } else {
            return "unknown key in header";
        }
        if (!eat(h, ',')) {
            if (!eat(h, '}')) return "malformed header";
            break;
        }
    }
    skip_ws(h);
    if (h->p != h->end) return "trailing bytes after the header dict";
    if (!have_descr || !have_order || !have_shape)
        return "header lacks descr, fortran_order or shape";
    return NULL;
}

/* ---- load and save ------------------------------------------------------------------------- */

af_status af_tensor_load_npy(const char *path, af_tensor *out, af_error *err) {
    unsigned char *buf;
    size_t len, start, hlen;
    const char *why = NULL;
    af_status st = AF_ERR_PARSE;
    memset(out, 0, sizeof *out);
    if (af_read_file(path, &buf, &len) != 0)
        return af_fail(err, AF_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    if (len < 10 || memcmp(buf, magic, sizeof magic) != 0) {
        why = "not a .npy file (bad magic)";
        goto fail;
    }
    if (buf[6] == 1) {
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
        start = 10;
    } else if ((buf[6] == 2 || buf[6] == 3) && len >= 12) {
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
        start = 12;
    } else {
        why = "unsupported format version";
        goto fail;
    }
    if (hlen > len - start) {
        why = "header runs past the end of the file";
        goto fail;
    }
    hdr h = {(const char *)buf + start, (const char *)buf + start + hlen};
    why = parse_header(&h, out);
    if (why) goto fail;
    int64_t numel = af_tensor_numel(out), nbytes;
    if (numel < 0 || !af_mul_i64(numel, (int64_t)af_dtype_size(out->dtype), &nbytes)) {
        why = "shape overflows";
        goto fail;
    }
    size_t have = len - start - hlen;
    if ((uint64_t)nbytes != have) {
        af_fail(err, AF_ERR_PARSE, "%s: data has %zu bytes, the header's shape needs %lld", path,
                have, (long long)nbytes);
        goto fail;
    }
    st = af_tensor_alloc(out, err);
    if (st) goto fail;
    if (have) memcpy(out->data, buf + start + hlen, have);
fail:
    if (why) af_fail(err, st, "%s: %s", path, why);
    if (st) memset(out, 0, sizeof *out);
    af_free(buf);
    return st;
}

static const char *npy_code(af_dtype t) {
    for (size_t i = 0; i < AF_COUNT(npy_types); i++)
        if (npy_types[i].dtype == t) return npy_types[i].code;
    return NULL;
}

void af_npy_file_name(char *buf, size_t len, const char *name) {
    size_t o = 0;
    for (const char *p = name; *p && o + 5 < len; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '.' || ch == '-';
        buf[o++] = ok ? ch : '_';
    }
    snprintf(buf + o, len - o, ".npy");
}

af_status af_tensor_save_npy(const char *path, const af_tensor *t, af_error *err) {
    const char *code = npy_code(t->dtype);
    if (!code)
        return af_fail(err, AF_ERR_UNSUPPORTED, "%s: %s tensors have no .npy type", path,
                       af_dtype_name(t->dtype));
    int64_t numel = af_tensor_numel(t), nbytes;
    if (numel < 0 || !af_mul_i64(numel, (int64_t)af_dtype_size(t->dtype), &nbytes) ||
        (size_t)nbytes > t->nbytes || (nbytes && !t->data))
        return af_fail(err, AF_ERR_INVALID_ARG, "%s: the tensor's shape and data disagree", path);

    /* Version 1: magic, 1, 0, header length (u16), header padded with spaces to a multiple of
     * 64 bytes in total and ended by a newline. */
    char header[512];
    int n = snprintf(header, sizeof header, "{'descr': '%c%s', 'fortran_order': False, 'shape': (",
                     code[1] == '1' ? '|' : '<', code);
    for (int i = 0; i < t->rank; i++)
        n += snprintf(header + n, sizeof header - (size_t)n, "%s%lld", i ? ", " : "",
                      (long long)t->dims[i]);
    n += snprintf(header + n, sizeof header - (size_t)n, "%s), }", t->rank == 1 ? "," : "");
    while ((10 + n + 1) % 64 != 0) header[n++] = ' ';
    header[n++] = '\n';

    unsigned char pre[10];
    memcpy(pre, magic, sizeof magic);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(n & 0xff);
    pre[9] = (unsigned char)(n >> 8);
    FILE *f = fopen(path, "wb");
    if (!f) return af_fail(err, AF_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    bool ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
              fwrite(header, 1, (size_t)n, f) == (size_t)n &&
              (nbytes == 0 || fwrite(t->data, 1, (size_t)nbytes, f) == (size_t)nbytes);
    if (fclose(f) != 0) ok = false;
    return ok ? AF_OK : af_fail(err, AF_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}
