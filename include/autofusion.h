/* autofusion: an operator-fusion compiler and runtime for ONNX models on CPUs.
 *
 * Usage:
 *
 *     af_session *s = NULL;
 *     af_error err;
 *     if (af_session_new("model.onnx", NULL, &s, &err) != AF_OK) {
 *         fprintf(stderr, "%s\n", err.message);
 *         return 1;
 *     }
 *     int64_t dims[4] = {1, 3, 224, 224};
 *     af_tensor *x = af_tensor_new(AF_DTYPE_FLOAT, 4, dims);   // zero-filled, owned by you
 *     const char *names[1] = {af_session_input_name(s, 0)};
 *     const af_tensor *inputs[1] = {x};
 *     af_tensor *outputs[1] = {NULL};                          // one slot per model output
 *     if (af_session_run(s, names, inputs, 1, outputs, &err) != AF_OK) ...
 *     float *y = (float *)outputs[0]->data;
 *     af_tensor_free(outputs[0]);
 *     af_tensor_free(x);
 *     af_session_free(s);
 *
 * Ownership: every _new has one _free. Strings and tensors returned by getters are borrowed from
 * the session and live as long as it does. Tensors returned by af_session_run belong to the
 * caller. Every function that can fail returns an af_status and, when `err` is not NULL, fills it
 * with a one-line message naming the file, the node and the reason.
 */
#ifndef AUTOFUSION_H
#define AUTOFUSION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AF_VERSION "0.1.0"
#define AF_MAX_RANK 8

typedef enum af_status {
    AF_OK = 0,
    AF_ERR_IO,            /* a file could not be opened, mapped or read */
    AF_ERR_PARSE,         /* malformed protobuf / npy bytes */
    AF_ERR_INVALID_MODEL, /* well-formed bytes that do not make a valid graph */
    AF_ERR_UNSUPPORTED,   /* valid ONNX we do not implement (op, opset, dtype) */
    AF_ERR_INVALID_ARG,   /* caller passed something wrong (name, shape, dtype) */
    AF_ERR_NOMEM,
    AF_ERR_RUNTIME,       /* data-dependent failure while running (bad index, shape) */
    AF_ERR_INTERNAL       /* our own bug */
} af_status;

/* Element types, numbered as ONNX's TensorProto.DataType. */
typedef enum af_dtype {
    AF_DTYPE_UNDEFINED = 0,
    AF_DTYPE_FLOAT = 1,
    AF_DTYPE_UINT8 = 2,
    AF_DTYPE_INT8 = 3,
    AF_DTYPE_UINT16 = 4,
    AF_DTYPE_INT16 = 5,
    AF_DTYPE_INT32 = 6,
    AF_DTYPE_INT64 = 7,
    AF_DTYPE_STRING = 8,
    AF_DTYPE_BOOL = 9,
    AF_DTYPE_FLOAT16 = 10,
    AF_DTYPE_DOUBLE = 11,
    AF_DTYPE_UINT32 = 12,
    AF_DTYPE_UINT64 = 13,
    AF_DTYPE_COMPLEX64 = 14,
    AF_DTYPE_COMPLEX128 = 15,
    AF_DTYPE_BFLOAT16 = 16
} af_dtype;

/* A dense row-major tensor. `dims[i] < 0` means unknown (only in type descriptions). */
typedef struct af_tensor {
    af_dtype dtype;
    int rank;
    int64_t dims[AF_MAX_RANK];
    void *data;    /* NULL when the tensor only describes a type */
    size_t nbytes; /* bytes at data */
    int owns_data; /* data was allocated with the tensor and is freed with it */
} af_tensor;

typedef struct af_error {
    af_status code;
    char message[1024];
} af_error;

/* Strings are borrowed for the duration of af_session_new only. */
typedef struct af_options {
    int threads;             /* 0: all cores */
    const char *input_shape; /* "name:1,3,224,224;name2:..." fixes symbolic dims */
    int log_level;           /* 0 error .. 4 debug */
    int no_fusion;           /* 1: run the graph unfused: the same simplification (constant
                                folding, Identity and dead-node removal) and the same kernels,
                                without the fusion passes (canonicalize, the fusion rules) */
    const char *disable_fusion;     /* "A,B": fusion rules to switch off ("ALL" for every one) */
    const char *fusion_switch_file; /* ATC switch file: lines "Name:off", or JSON
                                       {"Switch":{"GraphFusion":{"ALL":"off","X":"on"}}} */
    int no_lower; /* 1: keep the graph as fusion left it (what the report describes, for an ONNX
                     export) instead of lowering it for the fast kernels (layout, packing) */
    const char *precision_mode; /* NULL or "fp32"; "bf16": GEMMs and convolutions in bfloat16
                                   (AMX or AVX512_BF16) with float32 accumulation; "fp16":
                                   their weights and inputs in half precision, float32
                                   arithmetic; "mixed": bf16 with the precision-sensitive parts
                                   of fused ops in float32; "int8": quantized with our
                                   calibration (calibration_data below). ATC's names are accepted too
                                   (force_fp32, must_keep_origin_dtype, force_fp16,
                                   allow_fp32_to_fp16, allow_mix_precision) */
    const char *keep_fp32;      /* "A,B": fusion rules, node names or op types kept in float32 */
    /* "name:1,1~32,512;name2:...": the dims each input may take (a dim lo~hi or a single
     * value), as TensorRT's optimization profiles: runs outside are refused with an error
     * naming the input and the dim, and the smallest and largest shapes are planned when the
     * session is made. Saved in a .afm, which then keeps it (unless given again). */
    const char *input_shape_range;
    /* precision_mode "int8": our post-training quantization. The float32 model is run over the
     * calibration samples in this folder (subfolders of <input name>.npy or input_N.pb files,
     * one sample each, or such files in the folder itself: one sample, or a batch split along
     * dim 0 when the model's dim 0 is 1), then rewritten in QDQ form before fusion: the
     * activation input of each Conv/MatMul/Gemm uint8 per tensor, its weights int8 per output
     * channel; the sensitive ops stay float32 (listed in the report). */
    const char *calibration_data;
    /* "minmax", "percentile" (default; 99.99, or "percentile:99.9"), "entropy" (TensorRT's
     * KL-divergence calibrator over a 2048-bin histogram of |x|) */
    const char *calibration_method;
} af_options;

/* Defaults: all cores, fusion on, errors only. The environment also switches fusions off
 * (AUTOFUSION_DISABLE_LIST, alias GE_FUSION_DISABLE_LIST) and prints the fusion report on
 * stderr when a model is optimised (AUTOFUSION_FUSION_LOG=1, alias GE_GRAPH_FUSION_LOG=1). */
void af_options_init(af_options *opt);

/* AF_VERSION of the library that is running (the Python package's __version__). */
const char *af_version(void);

/* Element size in bytes (0 for strings and undefined). */
size_t af_dtype_size(af_dtype t);
/* ONNX's name of the type ("float", "int64", ...). */
const char *af_dtype_name(af_dtype t);
/* Element count of a tensor with known dims, or -1 if a dim is unknown or the count overflows. */
int64_t af_tensor_numel(const af_tensor *t);

/* A zero-filled tensor that owns its data; NULL on bad dims or out of memory. */
af_tensor *af_tensor_new(af_dtype dtype, int rank, const int64_t *dims);
void af_tensor_free(af_tensor *t);

typedef struct af_session af_session;

/* Load, check and prepare a model: an .onnx file is imported and optimised (fused) unless
 * opt->no_fusion; an .afm file (written by `autofusion compile`) is loaded as compiled. */
af_status af_session_new(const char *path, const af_options *opt, af_session **out, af_error *err);
/* Same from bytes in memory; `name` is used in messages. The bytes are copied. */
af_status af_session_new_from_bytes(const void *bytes, size_t len, const char *name,
                                    const af_options *opt, af_session **out, af_error *err);
void af_session_free(af_session *s);

/* The inputs a run must give (graph inputs without an initializer), as ONNX Runtime's
 * get_inputs() lists them: indices 0 to af_session_input_count() - 1, in graph order. Inputs
 * that have a default value (an initializer of the same name, as models of IR version below 4
 * write every weight) follow them, at indices af_session_input_count() up to
 * af_session_input_count() + af_session_default_input_count() - 1: a run may give them by name
 * to override the default. */
int af_session_input_count(const af_session *s);
int af_session_default_input_count(const af_session *s);
int af_session_output_count(const af_session *s);
/* Borrowed names, valid while the session lives. */
const char *af_session_input_name(const af_session *s, int i);
const char *af_session_output_name(const af_session *s, int i);
/* Declared type and shape (dims as fixed by --input_shape; -1 where still unknown or symbolic). */
af_status af_session_input_type(const af_session *s, int i, af_tensor *type_out);
/* 1 when input i has a default value (i >= af_session_input_count()): a run that does not give
 * it uses the default. 0 otherwise. */
int af_session_input_has_default(const af_session *s, int i);
af_status af_session_output_type(const af_session *s, int i, af_tensor *type_out);

/* The name of dim d of input i (output i when `output`), as the model declares it when the dim
 * is symbolic ("batch", or a product such as "batch*seq" that shape inference derived), written
 * into buf; NULL when the dim is a number, unknown without a name, or out of range. Inputs are
 * indexed as by af_session_input_name. */
const char *af_session_dim_name(const af_session *s, int output, int i, int d, char *buf,
                                size_t len);

/* The model's metadata: key "producer_name", "producer_version", "domain", "description" (the
 * model's doc_string), "graph_name" or "version" (model_version, in decimal) gives a borrowed
 * string ("" when the model has none; a .afm gives autofusion's name and version), any other
 * key the value of that metadata_props entry, or NULL when there is none. */
const char *af_session_metadata(const af_session *s, const char *key);
/* The number of metadata_props entries; entry i's key and value into *key and *value (borrowed)
 * when 0 <= i < that number. */
int af_session_custom_metadata(const af_session *s, int i, const char **key, const char **value);

/* Write the prepared session as a compiled model (.afm: what `autofusion compile` writes), with
 * its memory plan, precision mode, fusion report and `command_line` (may be NULL). */
af_status af_session_save(af_session *s, const char *path, const char *command_line,
                          af_error *err);
/* Write the session's graph as ONNX (fused ops in the domain ai.autofusion), for Netron. A
 * session made with opt->no_lower gives the graph the fusion report describes. */
af_status af_session_export_onnx(const af_session *s, const char *path, af_error *err);

/* Every fusion rule, built in and from loaded plugins, as a JSON array of objects (name,
 * pattern, conditions, precision, plugin, fused_op, alias), malloc'd: free it with
 * af_string_free. NULL when out of memory. */
char *af_fusion_rules_json(void);
void af_string_free(char *s);

/* The fusion report of the optimisation that prepared the session (text in the seed's shape
 * when json == 0, JSON otherwise); NULL when nothing was optimised (no_fusion, .afm). Borrowed:
 * valid while the session lives. */
const char *af_session_report(af_session *s, int json);

/* Run the model. `inputs[i]` is bound to the graph input called `names[i]`; every graph input
 * without an initializer must be given. Safe to call from several threads at once: one run at a
 * time uses the session's threads and preallocated memory, and a run that overlaps it runs on
 * its caller's thread alone with memory of its own (same results). `outputs` has af_session_output_count() slots that
 * receive new tensors owned by the caller. */
af_status af_session_run(af_session *s, const char *const *names, const af_tensor *const *inputs,
                         size_t ninputs, af_tensor **outputs, af_error *err);

/* Threads the session runs on, and the kernels' instruction set ("avx512", "avx2", "generic",
 * or "reference"; static string). */
int af_session_threads(const af_session *s);
const char *af_session_isa(const af_session *s);
/* The precision mode the session was prepared with ("fp32", "bf16", "fp16", "mixed", "int8"; static):
 * a compiled model's own, or --precision_mode's canonical name. */
const char *af_session_precision(const af_session *s);

/* Per-node profiling, written as a Chrome trace (the JSON that ONNX Runtime's profiler writes;
 * open it in Perfetto or chrome://tracing): after af_session_profile_start every run records
 * each node (op, the kind of kernel that ran it in args.kernel: "fast", "reference" or
 * "direct", the original nodes a fused op replaced, its time) and the whole run;
 * af_session_profile_end writes what was recorded to `path` (NULL: writes nothing) and stops. */
af_status af_session_profile_start(af_session *s, af_error *err);
af_status af_session_profile_end(af_session *s, const char *path, af_error *err);

/* The slow paths of the runs recorded since af_session_profile_start: nodes that ran on a
 * reference kernel because the op, its dtype or its case has no fast kernel. Ops whose reference
 * kernel is all they need (Reshape, Shape, Identity, If, Loop... : "direct") do not count. */
typedef struct af_reference_stats {
    int nodes;           /* distinct nodes that ran on a reference kernel at least once */
    double reference_ms; /* their time, summed over the recorded runs */
    double run_ms;       /* the recorded runs' time */
    char ops[256];       /* their op types by count, most first: "Resize x3, Pad x3" ("..." when
                            cut) */
} af_reference_stats;
/* Fill *out from the profile being recorded (error when profiling was not started). */
af_status af_session_reference_stats(af_session *s, af_reference_stats *out, af_error *err);

#ifdef __cplusplus
}
#endif
#endif
