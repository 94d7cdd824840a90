/* The compiled model file (.afm): an optimized IR graph, its constants and its metadata, written
 * once by `autofusion compile` and mapped (read-only, zero copy) by every run.
 *
 * Layout (all integers little-endian; format version 3: version 2 added the plan section, 3
 * made the section checksums chunked; a file of any other version is refused with a message
 * naming both versions):
 *
 *   header    magic "AFM1\r\n\x1a\n", format version, header size, file size, section count,
 *             a table of sections {kind, offset, size, checksum}, and the header's own xxHash64;
 *             a section's checksum is af_afm_section_hash of its bytes
 *   STRINGS   every name and string attribute, deduplicated, each NUL-terminated
 *   META      writer version, compile command line, key/value pairs
 *   MODEL     ir_version, opset imports, graph count
 *   GRAPHS    one record per graph (main first, then subgraphs in pre-order: a parent comes
 *             before its children): name, parent, ranges of values, nodes, inputs, outputs
 *   VALUES    fixed-size records: name, flags, dtype, rank, dims, dim_params, constant data
 *   NODES     fixed-size records: name, op_type, domain, ranges of inputs, outputs, attributes
 *   ATTRS     fixed-size records: name, type, scalar payload or the range of its list
 *   REFS      u32 indices: node inputs/outputs and graph inputs/outputs (value indices),
 *             string/tensor/graph lists of attributes
 *   NUMS      u64 slots: INTS and FLOATS attribute payloads
 *   TENSORS   type and data location of TENSOR/TENSORS attribute payloads
 *   PLAN      the main graph's memory plan (runtime/plan.h), or nothing: arena size, then one
 *             entry {value, value it is in place over or none, offset, size} per planned value,
 *             in increasing value index
 *   WEIGHTS   64-byte aligned; every constant's bytes start on a 64-byte boundary
 *
 * Loading maps the file, verifies every checksum, then decodes the structured sections into IR
 * structs in the model's arena; constants (and strings) point into the mapping, which lives as
 * long as the af_model. Every count, index, offset and length is checked against what the file
 * holds, even when the checksums match (they protect against damage, not against a forger), so
 * a truncated or altered file is an error "<file>: <section>: <reason>", never a crash. A stored
 * plan is held to af_plan_check against the loaded graph (no two buffers live at once overlap,
 * every buffer inside the arena and of its value's size, in place only where allowed): a forged
 * plan is an error "<file>: memory plan: <reason>".
 */
#ifndef AF_FORMAT_AFM_H
#define AF_FORMAT_AFM_H

#include "onnx/onnx.h"
#include "runtime/plan.h"

#define AF_AFM_FORMAT_VERSION 3

/* A section's checksum: XXH3-64 over the little-endian list of the XXH3-64 hashes of its
 * 8 MiB chunks (the loader hashes the chunks of a large section on several threads: a
 * BERT-Base file's 440 MB of weights took 80-120 ms on one). */
#define AF_AFM_HASH_CHUNK (8u << 20)
uint64_t af_afm_section_hash(const void *p, uint64_t n);

typedef struct af_afm_kv {
    const char *key;
    const char *value;
} af_afm_kv;

/* What a compiled file says about itself. */
typedef struct af_afm_meta {
    const char *version;      /* autofusion version of the writer (NULL on save: AF_VERSION) */
    const char *command_line; /* the compile command line (NULL on save: none) */
    const af_afm_kv *kv;      /* free-form pairs: precision mode, the fusion report JSON... */
    int nkv;
} af_afm_meta;

/* Write the graph g (a main graph: g->parent == NULL, with its subgraphs and constants), its
 * memory plan (af_plan_build's) and meta (may be NULL) to path. Values that nothing produces,
 * reads or returns (constants a pass replaced) are left out; everything else keeps its name,
 * type, order and attributes. The file is written next to path under a temporary name and
 * renamed into place, so a failed save never leaves a partial file behind. */
af_status af_afm_save(const char *path, const af_graph *g, const af_afm_meta *meta,
                      af_error *err);
/* Same with the given plan (checked against g first: AF_ERR_INVALID_ARG when it does not hold),
 * or with none when plan is NULL. */
af_status af_afm_save_with_plan(const char *path, const af_graph *g, const af_afm_meta *meta,
                                const af_plan *plan, af_error *err);

/* Load a compiled model. On success *out is a model whose graph runs like an imported one and
 * is released with af_model_free (it owns the mapping of the file); ir_version and
 * producer_name/producer_version ("autofusion", the writer's version) are filled. When meta_out
 * is not NULL it receives the file's metadata; its strings and array are borrowed from *out.
 * On error *out is NULL and nothing is left allocated. */
af_status af_afm_load(const char *path, af_model **out, af_afm_meta *meta_out, af_error *err);
/* Same, and *plan_out (when not NULL) receives the file's plan for (*out)->graph, checked, or
 * NULL when the file has none; the caller releases it with af_plan_free. */
af_status af_afm_load_with_plan(const char *path, af_model **out, af_afm_meta *meta_out,
                                af_plan **plan_out, af_error *err);

/* One section of the file, as the header describes it. */
typedef struct af_afm_section {
    const char *name; /* "strings", "meta", ..., "weights" */
    uint64_t offset, size;
} af_afm_section;

/* The header and metadata of a file, read without decoding its graph (every checksum is still
 * verified, so the file is known to be intact). Release with af_afm_info_free. */
typedef struct af_afm_info {
    uint32_t format_version;
    uint64_t file_size;
    int nsections;
    const af_afm_section *sections;
    af_afm_meta meta;
    /* private */
    af_arena *arena;
} af_afm_info;

af_status af_afm_read_meta(const char *path, af_afm_info **out, af_error *err);
void af_afm_info_free(af_afm_info *info);


#endif
