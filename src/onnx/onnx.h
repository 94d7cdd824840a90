/* ONNX import: a model file (or bytes) becomes an IR graph; tensor files (.pb, .npy) become
 * tensors.
 *
 * Ownership: an af_model owns its arena (the whole IR), the mapping of the model file and the
 * mappings of its external data files; af_model_free releases all of them. Constants may point
 * straight into those mappings (zero copy), which are READ-ONLY memory: code that changes a
 * constant (folding, weight rewriting) must give the value new data, never write through
 * value->type.data.
 *
 * Invariant: a loaded model's graph satisfies af_graph_verify. */
#ifndef AF_ONNX_H
#define AF_ONNX_H

#include "ir/ir.h"
#include "onnx/reader.h"

typedef struct af_extfile af_extfile;

typedef struct af_model {
    af_arena *arena;  /* all IR memory */
    af_graph *graph;  /* the main graph */
    const char *path; /* file name used in messages */
    int64_t ir_version;
    const char *producer_name;    /* "" when absent */
    const char *producer_version; /* "" when absent */
    const char *domain, *doc_string; /* "" when absent */
    int64_t model_version;
    const char **meta; /* metadata_props: nmeta (key, value) pairs, key at 2i */
    int nmeta;
    /* private */
    void *map; /* the mapped model file, or the copy of the bytes */
    size_t map_len;
    bool map_is_mmap; /* munmap (file) rather than free (bytes) */
    const char *dir;  /* the model's folder (realpath), for external data; NULL for bytes */
    af_extfile *ext;  /* external data files opened so far (each once) */
} af_model;

/* Load a model file: mapped read-only, checked, imported (types as the file declares them: the
 * shapes stage, passes/passes.h, infers the rest). On error *out is
 * NULL and nothing is left allocated. */
af_status af_model_load(const char *path, af_model **out, af_error *err);
/* Same from bytes (copied; `name` is used in messages). External data is an error: there is no
 * model folder to resolve it against. */
af_status af_model_load_bytes(const void *bytes, size_t len, const char *name, af_model **out,
                              af_error *err);
void af_model_free(af_model *m);

/* Parse a serialized TensorProto (conformance input_N.pb / output_N.pb, `run --input x=f.pb`)
 * into *out, which owns its data (release with af_tensor_release). float16/bfloat16 stay as they
 * are. *name_out (when not NULL) receives the tensor's name, malloc'd, or NULL if it has none. */
af_status af_tensor_load_pb(const char *path, af_tensor *out, char **name_out, af_error *err);

/* NumPy .npy files (format versions 1-3), little-endian and C order only, dtypes f2 f4 f8 i1 i2
 * i4 i8 u1 u2 u4 u8 b1. The loaded tensor owns its data (af_tensor_release). */
af_status af_tensor_load_npy(const char *path, af_tensor *out, af_error *err);
af_status af_tensor_save_npy(const char *path, const af_tensor *t, af_error *err);
/* The .npy file name of a tensor named `name`: "<name>.npy" with every character outside
 * [A-Za-z0-9_.-] replaced by '_' (tensor names hold '/' and ':'), cut to fit `len`. One rule for
 * the files `run --output_dir` writes and the ones `--calibration_data` reads. */
void af_npy_file_name(char *buf, size_t len, const char *name);

/* Internal to src/onnx: external data of the TensorProto read by `msg` (extdata.c). Checks the
 * external_data entries against the security rules and returns in *data a pointer to `nbytes`
 * bytes inside a read-only mapping that lives as long as m. `tname` names the tensor in messages.
 */
af_status af_onnx_extdata(af_model *m, const af_pb *msg, const char *tname, size_t nbytes,
                          const uint8_t **data, af_error *err);
/* Unmap every external data file of m. */
void af_onnx_extdata_close(af_model *m);

#endif
