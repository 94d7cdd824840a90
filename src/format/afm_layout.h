/* What the writer (afm_write.c), the loader (afm_load.c) and the checksums (afm_checksum.c)
 * share: the file's magic, sections and record layouts (afm.h describes the format), and the
 * little-endian helpers. Internal to src/format.
 *
 * Invariant: the writer and the loader read these constants from here only, so the two cannot
 * disagree on a record's layout. */
#ifndef AF_FORMAT_AFM_LAYOUT_H
#define AF_FORMAT_AFM_LAYOUT_H

#include "format/afm.h"

#include <string.h>
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "constant bytes are stored as the host holds them: little-endian");

/* "AFM1", then CR LF, ^Z and LF: a file that went through a text-mode transfer or a line-ending
 * conversion no longer matches, and `type`/`cat` of the file stops at the ^Z. */
static const uint8_t MAGIC[8] __attribute__((unused)) = {'A', 'F', 'M', '1', '\r', '\n', 0x1a, '\n'};

#define NONE UINT32_MAX /* an absent string, value or parent */
#define WEIGHT_ALIGN 64
#define MAX_GRAPH_DEPTH 100 /* nesting of subgraphs, as the ONNX reader allows */
#define MAX_NODE_ATTRS 1024 /* far above any op's; bounds the duplicate-name check */

/* Sections, in file order. */
enum { SEC_STRINGS, SEC_META, SEC_MODEL, SEC_GRAPHS, SEC_VALUES, SEC_NODES, SEC_ATTRS, SEC_REFS,
       SEC_NUMS, SEC_TENSORS, SEC_PLAN, SEC_WEIGHTS, NSEC };
static const char *const SEC_NAME[NSEC] __attribute__((unused)) = {"strings", "meta",  "model",   "graphs",
                                            "values",  "nodes", "attributes", "refs",
                                            "nums",    "tensors", "plan",    "weights"};

/* Header: magic[8] u32 version, u32 header_size, u64 file_size, u32 nsections, u32 flags, then
 * per section {u32 kind, u32 reserved, u64 offset, u64 size, u64 xxh64}, then u64 xxh64 of all
 * header bytes before it. */
enum { HDR_FIXED = 32, HDR_ENTRY = 32, HDR_SIZE = HDR_FIXED + NSEC * HDR_ENTRY + 8 };

/* Record sizes and field offsets (bytes). */
enum { TENSOR_REC = 88 };  /* i32 dtype, i32 rank, i64 dims[8], u64 data_off, u64 nbytes */
enum { VALUE_REC = 128 };  /* u32 name, u32 flags, u32 dim_param[8], tensor record */
enum { V_NAME = 0, V_FLAGS = 4, V_DIMPARAM = 8, V_TENSOR = 40 };
enum { VF_INPUT = 1, VF_OUTPUT = 2, VF_CONST = 4 };
enum { GRAPH_REC = 48 };   /* u32 name, parent, value_first, nvalues, node_first, nnodes,
                              input_first, ninputs, output_first, noutputs, node_serial, 0 */
enum { NODE_REC = 40 };    /* u32 name, op_type, domain, nin, in_first, nout, out_first, nattrs,
                              attr_first, 0 */
enum { ATTR_REC = 32 };    /* u32 name, type, count, ref; i64 i; u32 f bits; u32 0 */
enum { OPSET_REC = 16 };   /* u32 domain, u32 0, i64 version */
enum { MODEL_FIXED = 16 }; /* i64 ir_version, u32 nopsets, u32 0 */
enum { META_FIXED = 16 };  /* u32 version, u32 command_line, u32 nkv, u32 0; then {key, value} */
enum { PLAN_FIXED = 16 };  /* u64 arena_size, u32 nentries, u32 0; then the entries */
enum { PLAN_REC = 24 };    /* u32 value, u32 in place over (value or NONE), u64 offset, u64 size */

/* ---- little-endian bytes --------------------------------------------------------------------- */

static inline uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void set32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void set64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ================================================================================================
 * Writer
 * ============================================================================================== */

/* Append key to the comma-separated list (once); false when it does not fit. The meta
 * section lists the plugins' ops a file needs this way ("plugin_ops"). */
static inline bool list_add(char *list, size_t cap, const char *key) {
    size_t n = strlen(list), k = strlen(key);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == k && !strncmp(p, key, k)) return true;
        p += l + (p[l] == ',');
    }
    if (n + (n > 0) + k + 1 > cap) return false;
    if (n) list[n++] = ',';
    memcpy(list + n, key, k + 1);
    return true;
}

/* The header's own checksum, and the writer's string hash. */
static inline uint64_t hash_bytes(const void *p, size_t n) { return XXH64(p, n, 0); }

/* Chunks of AF_AFM_HASH_CHUNK bytes in n bytes; one chunk's hash appended (little-endian) to the
 * running checksum s of a section (afm_checksum.c). */
uint64_t af_afm_chunks(uint64_t n);
void af_afm_add_chunk(XXH3_state_t *s, uint64_t h);

#endif
