/* A zero-copy reader of the protobuf wire format, for the subset of ONNX we import.
 *
 * A reader is a cursor over one message's bytes. It never copies: a length-delimited field is a
 * (pointer, length) pair inside the buffer, checked against the bytes that remain. Every error
 * names the file, the message being read and the byte offset from the start of the buffer, so a
 * hostile or damaged file is diagnosed, never trusted. Nested messages count their depth and
 * stop at AF_PB_MAX_DEPTH, which bounds the recursion of subgraph import (If/Loop bodies).
 *
 * Invariant: no field is read past the end of the message that holds it. */
#ifndef AF_ONNX_READER_H
#define AF_ONNX_READER_H

#include "ir/ir.h"

#include <stdint.h>

/* Deepest nesting of messages accepted (ModelProto is depth 0). */
#define AF_PB_MAX_DEPTH 100

/* Wire types. Groups (3, 4) are deprecated and rejected, as are 6 and 7. */
enum { AF_PB_VARINT = 0, AF_PB_FIXED64 = 1, AF_PB_LEN = 2, AF_PB_FIXED32 = 5 };

typedef struct af_pb {
    const uint8_t *p, *end; /* the unread part of this message */
    const uint8_t *base;    /* start of the whole buffer: offsets in messages count from here */
    const char *file;       /* for messages */
    const char *what;       /* message type being read, e.g. "TensorProto" */
    int depth;
} af_pb;

typedef struct af_pb_field {
    uint32_t num;        /* field number; 0 when the message has no more fields */
    int wire;            /* AF_PB_VARINT, AF_PB_FIXED64, AF_PB_LEN or AF_PB_FIXED32 */
    uint64_t v;          /* value of a varint, fixed32 or fixed64 field */
    const uint8_t *data; /* bytes of a length-delimited field (inside the buffer) */
    size_t len;
    size_t off; /* offset of the field's tag from the start of the buffer */
} af_pb_field;

/* A reader over the whole buffer, at depth 0. */
void af_pb_init(af_pb *r, const void *data, size_t len, const char *file, const char *what);
/* Read the next field into f; at the end of the message f->num is 0. AF_ERR_PARSE for an
 * overlong varint, field number 0, a group or invalid wire type, a length past the end. */
af_status af_pb_next(af_pb *r, af_pb_field *f, af_error *err);
/* A reader over the sub-message in field f (wire type checked, depth + 1, limit checked). */
af_status af_pb_sub(const af_pb *r, const af_pb_field *f, const char *what, af_pb *sub,
                    af_error *err);
/* AF_ERR_PARSE unless f has wire type `wire`; `name` is the field's name for the message. */
af_status af_pb_want(const af_pb *r, const af_pb_field *f, int wire, const char *name,
                     af_error *err);

/* Typed accessors for singular fields: check the wire type, convert, report with `name`. */
af_status af_pb_int64(const af_pb *r, const af_pb_field *f, const char *name, int64_t *out,
                      af_error *err);
af_status af_pb_float(const af_pb *r, const af_pb_field *f, const char *name, float *out,
                      af_error *err);
/* A NUL-terminated copy in the arena; a NUL byte inside the string is an error (names). */
af_status af_pb_str(const af_pb *r, const af_pb_field *f, const char *name, af_arena *a,
                    const char **out, af_error *err);

/* Number of occurrences of field `num` in the message (any wire type), at most INT_MAX. */
af_status af_pb_count(const af_pb *msg, uint32_t num, int *count, af_error *err);

/* Repeated scalar field `num` whose elements have wire type `wire` (AF_PB_VARINT,
 * AF_PB_FIXED32 or AF_PB_FIXED64), packed or not, in any mix. The element count goes to
 * *count; when `put` is not NULL each element is also passed to put(ctx, index, raw value) in
 * order, for at most `cap` elements (a larger count is an error: callers count first). */
typedef void (*af_pb_put)(void *ctx, size_t i, uint64_t v);
af_status af_pb_repeated(const af_pb *msg, uint32_t num, int wire, const char *name, af_pb_put put,
                         void *ctx, size_t cap, size_t *count, af_error *err);

/* Fail with "<file>: <what> at byte <off>: <reason>". */
af_status af_pb_fail(const af_pb *r, af_error *err, size_t off, af_status code, const char *fmt,
                     ...) __attribute__((format(printf, 5, 6)));

#endif
