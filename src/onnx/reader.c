/* The protobuf wire-format reader (see reader.h).
 *
 * Invariant: base <= p <= end always, and every pointer handed out (field data, sub-message
 * bounds) lies inside [p, end) of the reader it came from, so no read ever leaves the buffer.
 */
#include "onnx/reader.h"

#include <limits.h>
#include <stdarg.h>
#include <string.h>

af_status af_pb_fail(const af_pb *r, af_error *err, size_t off, af_status code, const char *fmt,
                     ...) {
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return af_fail(err, code, "%s: %s at byte %zu: %s", r->file, r->what, off, reason);
}

void af_pb_init(af_pb *r, const void *data, size_t len, const char *file, const char *what) {
    r->base = data;
    r->p = data;
    r->end = r->p + len;
    r->file = file;
    r->what = what;
    r->depth = 0;
}

static size_t offset(const af_pb *r, const uint8_t *p) {
    return (size_t)(p - r->base);
}

/* A varint is at most 10 bytes, and the 10th may only carry the 64th bit. */
static af_status read_varint(af_pb *r, uint64_t *out, af_error *err) {
    const uint8_t *start = r->p;
    uint64_t v = 0;
    for (int i = 0;; i++) {
        if (r->p == r->end)
            return af_pb_fail(r, err, offset(r, start), AF_ERR_PARSE, "varint runs past the end");
        uint8_t b = *r->p++;
        if (i == 9 && b > 1) /* more bits, or an 11th byte */
            return af_pb_fail(r, err, offset(r, start), AF_ERR_PARSE,
                              "varint longer than 10 bytes or beyond 64 bits");
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return AF_OK;
        }
    }
}

static af_status read_fixed(af_pb *r, int nbytes, uint64_t *out, af_error *err) {
    if (r->end - r->p < nbytes)
        return af_pb_fail(r, err, offset(r, r->p), AF_ERR_PARSE,
                          "%d-byte fixed value runs past the end", nbytes);
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += nbytes;
    *out = v;
    return AF_OK;
}

af_status af_pb_next(af_pb *r, af_pb_field *f, af_error *err) {
    memset(f, 0, sizeof *f);
    if (r->p == r->end) return AF_OK;
    f->off = offset(r, r->p);
    uint64_t tag;
    af_status st = read_varint(r, &tag, err);
    if (st != AF_OK) return st;
    uint64_t num = tag >> 3;
    int wire = (int)(tag & 7);
    if (num == 0) return af_pb_fail(r, err, f->off, AF_ERR_PARSE, "field number 0");
    if (num > 0x1fffffff)
        return af_pb_fail(r, err, f->off, AF_ERR_PARSE, "field number %llu too large",
                          (unsigned long long)num);
    switch (wire) {
    case AF_PB_VARINT:
        st = read_varint(r, &f->v, err);
        break;
    case AF_PB_FIXED64:
        st = read_fixed(r, 8, &f->v, err);
        break;
    case AF_PB_FIXED32:
        st = read_fixed(r, 4, &f->v, err);
        break;
    case AF_PB_LEN: {
        uint64_t len;
        st = read_varint(r, &len, err);
        if (st != AF_OK) break;
        if (len > (uint64_t)(r->end - r->p))
            return af_pb_fail(r, err, f->off, AF_ERR_PARSE,
                              "field %llu has length %llu but only %zu bytes remain",
                              (unsigned long long)num, (unsigned long long)len,
                              (size_t)(r->end - r->p));
        f->data = r->p;
        f->len = (size_t)len;
        r->p += len;
        break;
    }
    case 3:
    case 4:
        return af_pb_fail(r, err, f->off, AF_ERR_PARSE,
                          "field %llu uses the group wire type %d, which ONNX never uses",
                          (unsigned long long)num, wire);
    default:
        return af_pb_fail(r, err, f->off, AF_ERR_PARSE, "field %llu has invalid wire type %d",
                          (unsigned long long)num, wire);
    }
    if (st != AF_OK) return st;
    f->num = (uint32_t)num;
    f->wire = wire;
    return AF_OK;
}

static const char *wire_name(int wire) {
    switch (wire) {
    case AF_PB_VARINT:
        return "varint";
    case AF_PB_FIXED64:
        return "fixed64";
    case AF_PB_LEN:
        return "length-delimited";
    case AF_PB_FIXED32:
        return "fixed32";
    default:
        return "invalid";
    }
}

af_status af_pb_want(const af_pb *r, const af_pb_field *f, int wire, const char *name,
                     af_error *err) {
    if (f->wire == wire) return AF_OK;
    return af_pb_fail(r, err, f->off, AF_ERR_PARSE, "field '%s' (%u) has wire type %s, expected %s",
                      name, f->num, wire_name(f->wire), wire_name(wire));
}

af_status af_pb_sub(const af_pb *r, const af_pb_field *f, const char *what, af_pb *sub,
                    af_error *err) {
    af_status st = af_pb_want(r, f, AF_PB_LEN, what, err);
    if (st != AF_OK) return st;
    if (r->depth >= AF_PB_MAX_DEPTH)
        return af_pb_fail(r, err, f->off, AF_ERR_UNSUPPORTED,
                          "%s nested deeper than %d messages (too many levels of subgraphs)", what,
                          AF_PB_MAX_DEPTH);
    *sub = *r;
    sub->p = f->data;
    sub->end = f->data + f->len;
    sub->what = what;
    sub->depth = r->depth + 1;
    return AF_OK;
}

af_status af_pb_int64(const af_pb *r, const af_pb_field *f, const char *name, int64_t *out,
                      af_error *err) {
    af_status st = af_pb_want(r, f, AF_PB_VARINT, name, err);
    if (st == AF_OK)
        *out = (int64_t)f->v; /* two's complement, as protobuf encodes negative int64 */
    return st;
}

af_status af_pb_float(const af_pb *r, const af_pb_field *f, const char *name, float *out,
                      af_error *err) {
    af_status st = af_pb_want(r, f, AF_PB_FIXED32, name, err);
    if (st == AF_OK) {
        uint32_t bits = (uint32_t)f->v;
        memcpy(out, &bits, sizeof *out);
    }
    return st;
}

af_status af_pb_str(const af_pb *r, const af_pb_field *f, const char *name, af_arena *a,
                    const char **out, af_error *err) {
    af_status st = af_pb_want(r, f, AF_PB_LEN, name, err);
    if (st != AF_OK) return st;
    if (memchr(f->data, 0, f->len))
        return af_pb_fail(r, err, f->off, AF_ERR_PARSE, "string '%s' contains a NUL byte", name);
    char *s = af_arena_strndup(a, (const char *)f->data, f->len);
    if (!s) return af_fail(err, AF_ERR_NOMEM, "%s: out of memory", r->file);
    *out = s;
    return AF_OK;
}

af_status af_pb_count(const af_pb *msg, uint32_t num, int *count, af_error *err) {
    af_pb r = *msg;
    af_pb_field f;
    af_status st;
    int n = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != num) continue;
        if (n == INT_MAX)
            return af_pb_fail(&r, err, f.off, AF_ERR_UNSUPPORTED, "field %u repeated too often",
                              num);
        n++;
    }
    *count = n;
    return st;
}

/* One element of a packed run: same encoding as an unpacked field's value. */
static af_status read_scalar(af_pb *r, int wire, uint64_t *v, af_error *err) {
    if (wire == AF_PB_VARINT) return read_varint(r, v, err);
    return read_fixed(r, wire == AF_PB_FIXED64 ? 8 : 4, v, err);
}

af_status af_pb_repeated(const af_pb *msg, uint32_t num, int wire, const char *name, af_pb_put put,
                         void *ctx, size_t cap, size_t *count, af_error *err) {
    af_pb r = *msg;
    af_pb_field f;
    af_status st;
    size_t n = 0;
    while ((st = af_pb_next(&r, &f, err)) == AF_OK && f.num) {
        if (f.num != num) continue;
        if (f.wire == wire) {
            if (put && n >= cap)
                return af_pb_fail(&r, err, f.off, AF_ERR_INTERNAL, "'%s' grew while read", name);
            if (put) put(ctx, n, f.v);
            n++;
            continue;
        }
        if (f.wire != AF_PB_LEN) return af_pb_want(&r, &f, wire, name, err);
        /* A packed run: the elements back to back, with the outer reader's bounds. */
        af_pb packed = r;
        packed.p = f.data;
        packed.end = f.data + f.len;
        while (packed.p < packed.end) {
            uint64_t v;
            st = read_scalar(&packed, wire, &v, err);
            if (st != AF_OK) return st;
            if (put && n >= cap)
                return af_pb_fail(&r, err, f.off, AF_ERR_INTERNAL, "'%s' grew while read", name);
            if (put) put(ctx, n, v);
            n++;
        }
    }
    *count = n;
    return st;
}
