/* Tests of the mx_ reference kernels (DFT, STFT, the windows, MelWeightMatrix, TfIdfVectorizer,
 * and the optimizer steps Adagrad, Adam, Momentum), table-driven: each row builds one node (op, attributes,
 * opset), runs its shape function and reference kernel on small tensors, and checks the status
 * and, on success, the output dtype, dims and values. Expected values are worked out by hand
 * (or, for the mel matrix, taken from the ONNX suite). A second group checks compile-time shape
 * inference with unknown values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/ref/ref.h"
#include "kernels/fast/dispatch.h"

#define TENS_MAXV 72
#include "test_util.h"

/* 25/46 and 21/46: ONNX's Hamming coefficients. */
#define HA0 0.54347826086956519
#define HA4 0.086956521739130432

/* The TF example of the ONNX suite: 1-grams [2], [3], [5], [4]; 2-grams [5,6], [7,8], [6,7]. */
#define POOL "pool_int64s=[2,3,5,4,5,6,7,8,6,7] ngram_counts=[0,4] ngram_indexes=[0,1,2,3,4,5,6]"
#define TEXT T1(I32, 12, 1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8)

static const tcase cases[] = {
    /* DFT */
    {"dft real", "DFT", "", 17, 1, {T3(F32, 1, 4, 1, 1, 2, 3, 4)}, AF_OK,
     T3(F32, 1, 4, 2, 10, 0, -2, 2, -2, 0, -2, -2)},
    {"dft onesided", "DFT", "onesided=1", 17, 1, {T3(F32, 1, 4, 1, 1, 2, 3, 4)}, AF_OK,
     T3(F32, 1, 3, 2, 10, 0, -2, 2, -2, 0)},
    {"dft inverse complex", "DFT", "inverse=1", 17, 1,
     {T3(F64, 1, 4, 2, 10, 0, -2, 2, -2, 0, -2, -2)}, AF_OK,
     T3(F64, 1, 4, 2, 1, 0, 2, 0, 3, 0, 4, 0)},
    {"dft length truncates", "DFT", "", 17, 2, {T3(F32, 1, 4, 1, 1, 2, 3, 4), T0(I64, 2)}, AF_OK,
     T3(F32, 1, 2, 2, 3, 0, -1, 0)},
    {"dft length pads", "DFT", "", 17, 2, {T3(F32, 1, 2, 1, 1, 1), T0(I32, 4)}, AF_OK,
     T3(F32, 1, 4, 2, 2, 0, 1, -1, 0, 0, 1, 1)},
    {"dft second signal axis", "DFT", "axis=2", 17, 1, {T4(F32, 1, 2, 2, 1, 1, 2, 3, 4)}, AF_OK,
     T4(F32, 1, 2, 2, 2, 3, 0, -1, 0, 7, 0, -1, 0)},
    {"dft first signal axis", "DFT", "axis=-3", 17, 1, {T4(F32, 1, 2, 2, 1, 1, 2, 3, 4)}, AF_OK,
     T4(F32, 1, 2, 2, 2, 4, 0, 6, 0, -2, 0, -2, 0)},
    {"dft onesided complex", "DFT", "onesided=1", 17, 1, {T3(F32, 1, 2, 2, 1, 0, 1, 0)},
     AF_ERR_INVALID_MODEL, NONE},
    {"dft axis on components", "DFT", "axis=-1", 17, 1, {T3(F32, 1, 2, 1, 1, 0)},
     AF_ERR_INVALID_MODEL, NONE},
    {"dft three components", "DFT", "", 17, 1, {T3(F32, 1, 1, 3, 1, 0, 0)}, AF_ERR_INVALID_MODEL,
     NONE},
    {"dft zero length", "DFT", "", 17, 2, {T3(F32, 1, 2, 1, 1, 0), T0(I64, 0)}, AF_ERR_RUNTIME,
     NONE},
    {"dft on ints", "DFT", "", 17, 1, {T3(I32, 1, 2, 1, 1, 0)}, AF_ERR_UNSUPPORTED, NONE},
    {"dft before opset 17", "DFT", "", 16, 1, {T3(F32, 1, 2, 1, 1, 0)}, AF_ERR_INVALID_MODEL,
     NONE},

    /* STFT: signal, frame_step, window, frame_length */
    {"stft frames", "STFT", "", 17, 4,
     {T3(F32, 1, 6, 1, 1, 2, 3, 4, 5, 6), T0(I64, 2), NONE, T0(I64, 4)}, AF_OK,
     T4(F32, 1, 2, 3, 2, 10, 0, -2, 2, -2, 0, 18, 0, -2, 2, -2, 0)},
    {"stft window", "STFT", "", 17, 3,
     {T3(F32, 1, 6, 1, 1, 2, 3, 4, 5, 6), T0(I32, 2), T1(F32, 4, 0, 1, 1, 0)}, AF_OK,
     T4(F32, 1, 2, 3, 2, 5, 0, -3, -2, 1, 0, 9, 0, -5, -4, 1, 0)},
    {"stft two-sided complex", "STFT", "onesided=0", 17, 4,
     {T3(F64, 1, 2, 2, 1, 1, 2, 0), T0(I64, 1), NONE, T0(I64, 2)}, AF_OK,
     T4(F64, 1, 1, 2, 2, 3, 1, -1, 1)},
    {"stft window and length disagree", "STFT", "", 17, 4,
     {T3(F32, 1, 6, 1, 0), T0(I64, 2), T1(F32, 3, 1, 1, 1), T0(I64, 4)},
     AF_ERR_INVALID_MODEL, NONE},
    {"stft zero step", "STFT", "", 17, 4, {T3(F32, 1, 6, 1, 0), T0(I64, 0), NONE, T0(I64, 4)},
     AF_ERR_RUNTIME, NONE},
    {"stft signal shorter than frame", "STFT", "", 17, 4,
     {T3(F32, 1, 3, 1, 0), T0(I64, 1), NONE, T0(I64, 4)}, AF_ERR_RUNTIME, NONE},
    {"stft onesided complex", "STFT", "", 17, 4,
     {T3(F32, 1, 4, 2, 0), T0(I64, 1), NONE, T0(I64, 2)}, AF_ERR_INVALID_MODEL, NONE},
    {"stft no frame size", "STFT", "", 17, 2, {T3(F32, 1, 4, 1, 0), T0(I64, 1)},
     AF_ERR_INVALID_MODEL, NONE},

    /* windows */
    {"hann periodic", "HannWindow", "", 17, 1, {T0(I64, 4)}, AF_OK, T1(F32, 4, 0, 0.5, 1, 0.5)},
    {"hann symmetric double", "HannWindow", "periodic=0 output_datatype=11", 17, 1, {T0(I32, 5)},
     AF_OK, T1(F64, 5, 0, 0.5, 1, 0.5, 0)},
    {"hamming periodic", "HammingWindow", "", 17, 1, {T0(I64, 4)}, AF_OK,
     T1(F32, 4, HA4, HA0, 1, HA0)},
    {"blackman periodic", "BlackmanWindow", "output_datatype=11", 17, 1, {T0(I64, 4)}, AF_OK,
     T1(F64, 4, 0, 0.34, 1, 0.34)},
    {"one-point symmetric window", "BlackmanWindow", "periodic=0", 17, 1, {T0(I64, 1)}, AF_OK,
     T1(F32, 1, 1)},
    {"window as int64", "HannWindow", "output_datatype=7", 17, 1, {T0(I64, 3)}, AF_OK,
     T1(I64, 3, 0, 1, 1)},
    {"empty window", "HannWindow", "", 17, 1, {T0(I64, 0)}, AF_OK, {F32, 1, {0}, {0}}},
    {"negative window size", "HannWindow", "", 17, 1, {T0(I64, -3)}, AF_ERR_RUNTIME, NONE},
    {"window of strings", "HannWindow", "output_datatype=8", 17, 1, {T0(I64, 3)},
     AF_ERR_INVALID_MODEL, NONE},
    {"float window size", "HammingWindow", "", 17, 1, {T0(F32, 3)}, AF_ERR_INVALID_MODEL, NONE},
    {"window size not scalar", "HannWindow", "", 17, 1, {T1(I64, 2, 3, 3)}, AF_ERR_INVALID_MODEL,
     NONE},

    /* MelWeightMatrix: num_mel_bins, dft_length, sample_rate, lower and upper edge (Hz) */
    {"mel suite example", "MelWeightMatrix", "", 17, 5,
     {T0(I32, 8), T0(I32, 16), T0(I32, 8192), T0(F32, 0), T0(F32, 4096)}, AF_OK,
     T2(F32, 9, 8,
        1, 1, 0, 0, 0, 0, 0, 0,
        0, 0, 1, 1, 0, 0, 0, 0,
        0, 0, 0, 0, 1, 0, 0, 0,
        0, 0, 0, 0, 0, 1, 0, 0,
        0, 0, 0, 0, 0, 0, 1, 0,
        0, 0, 0, 0, 0, 0, 0, 1,
        0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0)},
    /* edges at spectrum bins 0, 1, 3, 5: rising and falling slopes of 1/1 and 1/2 */
    {"mel slopes", "MelWeightMatrix", "output_datatype=11", 17, 5,
     {T0(I64, 2), T0(I64, 16), T0(I64, 2000), T0(F64, 0), T0(F64, 1000)}, AF_OK,
     T2(F64, 9, 2, 0, 0, 1, 0, 0.5, 0.5, 0, 1, 0, 0.5, 0, 0, 0, 0, 0, 0, 0, 0)},
    {"mel zero rate", "MelWeightMatrix", "", 17, 5,
     {T0(I32, 8), T0(I32, 16), T0(I32, 0), T0(F32, 0), T0(F32, 4096)}, AF_ERR_RUNTIME, NONE},
    {"mel edge below -700 Hz", "MelWeightMatrix", "", 17, 5,
     {T0(I32, 2), T0(I32, 16), T0(I32, 8000), T0(F32, -1000), T0(F32, 4000)}, AF_ERR_RUNTIME,
     NONE},
    {"mel negative bins", "MelWeightMatrix", "", 17, 5,
     {T0(I32, -1), T0(I32, 16), T0(I32, 8000), T0(F32, 0), T0(F32, 4000)}, AF_ERR_RUNTIME, NONE},
    {"mel int edges", "MelWeightMatrix", "", 17, 5,
     {T0(I32, 2), T0(I32, 16), T0(I32, 8000), T0(I32, 0), T0(I32, 4000)}, AF_ERR_INVALID_MODEL,
     NONE},

    /* TfIdfVectorizer */
    {"tf uni and bigrams with skips", "TfIdfVectorizer",
     POOL " mode=TF min_gram_length=1 max_gram_length=2 max_skip_count=5", 9, 1, {TEXT}, AF_OK,
     T1(F32, 7, 0, 3, 1, 0, 1, 3, 1)},
    {"tf bigrams no skip", "TfIdfVectorizer",
     POOL " mode=TF min_gram_length=2 max_gram_length=2 max_skip_count=0", 9, 1, {TEXT}, AF_OK,
     T1(F32, 7, 0, 0, 0, 0, 1, 1, 1)},
    {"idf weights", "TfIdfVectorizer",
     POOL " mode=IDF min_gram_length=1 max_gram_length=2 max_skip_count=5"
          " weights=[0.5,0.25,2.0,1.0,4.0,8.0,0.125]",
     9, 1, {TEXT}, AF_OK, T1(F32, 7, 0, 0.25, 2, 0, 4, 8, 0.125)},
    {"tfidf weights", "TfIdfVectorizer",
     POOL " mode=TFIDF min_gram_length=1 max_gram_length=2 max_skip_count=5"
          " weights=[0.5,0.25,2.0,1.0,4.0,8.0,0.125]",
     9, 1, {TEXT}, AF_OK, T1(F32, 7, 0, 0.75, 2, 0, 4, 24, 0.125)},
    {"batch rows do not mix", "TfIdfVectorizer",
     POOL " mode=TF min_gram_length=1 max_gram_length=2 max_skip_count=5", 9, 1,
     {T2(I64, 2, 6, 1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8)}, AF_OK,
     T2(F32, 2, 7, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1)},
    {"trigrams with a skip", "TfIdfVectorizer",
     "pool_int64s=[1,2,3] ngram_counts=[0,0,0] ngram_indexes=[2] mode=TF min_gram_length=3"
     " max_gram_length=3 max_skip_count=1",
     9, 1, {T1(I64, 8, 1, 9, 2, 9, 3, 1, 2, 3)}, AF_OK, T1(F32, 3, 0, 0, 2)},
    {"pool not whole bigrams", "TfIdfVectorizer",
     "pool_int64s=[1,2,3,4] ngram_counts=[0,3] ngram_indexes=[0,1,2] mode=TF"
     " min_gram_length=1 max_gram_length=2 max_skip_count=0",
     9, 1, {T1(I64, 2, 1, 2)}, AF_ERR_INVALID_MODEL, NONE},
    {"indexes count mismatch", "TfIdfVectorizer",
     "pool_int64s=[1,2] ngram_counts=[0] ngram_indexes=[0] mode=TF min_gram_length=1"
     " max_gram_length=1 max_skip_count=0",
     9, 1, {T1(I64, 2, 1, 2)}, AF_ERR_INVALID_MODEL, NONE},
    {"weights count mismatch", "TfIdfVectorizer",
     "pool_int64s=[1,2] ngram_counts=[0] ngram_indexes=[0,1] weights=[1.0] mode=IDF"
     " min_gram_length=1 max_gram_length=1 max_skip_count=0",
     9, 1, {T1(I64, 2, 1, 2)}, AF_ERR_INVALID_MODEL, NONE},
    {"unknown mode", "TfIdfVectorizer",
     "pool_int64s=[1] ngram_counts=[0] ngram_indexes=[0] mode=BM25 min_gram_length=1"
     " max_gram_length=1 max_skip_count=0",
     9, 1, {T1(I64, 2, 1, 2)}, AF_ERR_INVALID_MODEL, NONE},
    {"float text", "TfIdfVectorizer",
     "pool_int64s=[1] ngram_counts=[0] ngram_indexes=[0] mode=TF min_gram_length=1"
     " max_gram_length=1 max_skip_count=0",
     9, 1, {T1(F32, 2, 1, 2)}, AF_ERR_UNSUPPORTED, NONE},
};

/* Optimizer steps (several outputs): R, T, then X's, G's and state tensors. */
typedef struct tstep {
    const char *name;
    const char *op;
    const char *attrs;
    int nin;
    tens in[8];
    af_status expect;
    int nout;
    tens out[4];
} tstep;

static const tstep steps[] = {
    /* g = 0.5*2 + 1 = 2, h = 1 + 4 = 5, r = 0.5 / (1 + 2*0.5) = 0.25 */
    {"adagrad", "Adagrad", "norm_coefficient=0.5 decay_factor=0.5 epsilon=0.0", 5,
     {T0(F32, 0.5), T0(I64, 2), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 1)}, AF_OK, 2,
     {T1(F32, 1, 1.7763932022500211), T1(F32, 1, 5)}},
    /* two tensors at once: X1 = [1], X2 = [0, 3] with g = G (no regularization) */
    {"adagrad two tensors", "Adagrad", "epsilon=0.0", 8,
     {T0(F64, 1), T0(I64, 0), T1(F64, 1, 1), T1(F64, 2, 0, 3), T1(F64, 1, 3), T1(F64, 2, 4, 0),
      T1(F64, 1, 0), T1(F64, 2, 9, 16)},
     AF_OK, 4, {T1(F64, 1, 0), T1(F64, 2, -0.8, 3), T1(F64, 1, 9), T1(F64, 2, 25, 16)}},
    /* T = 0: no bias correction; m = 0.5*1 + 0.5*2 = 1.5, h = 0.75*4 + 0.25*4 = 4 */
    {"adam first step", "Adam", "alpha=0.5 beta=0.75 epsilon=0.0", 6,
     {T0(F32, 1), T0(I64, 0), T1(F32, 1, 3), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 4)}, AF_OK,
     3, {T1(F32, 1, 2.25), T1(F32, 1, 1.5), T1(F32, 1, 4)}},
    /* T = 1: rate = sqrt(1 - 0.75) / (1 - 0.5) = 1; then X scaled by 1 - post */
    {"adam corrected", "Adam", "alpha=0.5 beta=0.75 epsilon=0.0 norm_coefficient_post=0.5", 6,
     {T0(F32, 1), T0(I64, 1), T1(F32, 1, 3), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 4)}, AF_OK,
     3, {T1(F32, 1, 1.125), T1(F32, 1, 1.5), T1(F32, 1, 4)}},
    /* T = 0 takes the whole gradient: v = 0.5*2 + 1*(0.5*2 + 1) = 3 */
    {"momentum standard", "Momentum", "alpha=0.5 beta=0.25 mode=standard norm_coefficient=0.5", 5,
     {T0(F32, 0.5), T0(I64, 0), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 2)}, AF_OK, 2,
     {T1(F32, 1, 0.5), T1(F32, 1, 3)}},
    /* T = 1: v = 0.5*2 + 0.25*2 = 1.5; X - 0.5*(2 + 0.5*1.5) */
    {"momentum nesterov", "Momentum", "alpha=0.5 beta=0.25 mode=nesterov norm_coefficient=0.5",
     5, {T0(F32, 0.5), T0(I64, 1), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 2)}, AF_OK, 2,
     {T1(F32, 1, 0.625), T1(F32, 1, 1.5)}},
    {"momentum needs its attributes", "Momentum", "alpha=0.5 mode=standard", 5,
     {T0(F32, 0.5), T0(I64, 0), T1(F32, 1, 2), T1(F32, 1, 1), T1(F32, 1, 2)},
     AF_ERR_INVALID_MODEL, 2, {NONE, NONE}},
    {"adagrad partial group", "Adagrad", "", 6,
     {T0(F32, 1), T0(I64, 0), T1(F32, 1, 1), T1(F32, 1, 1), T1(F32, 1, 1), T1(F32, 1, 1)},
     AF_ERR_INVALID_MODEL, 2, {NONE, NONE}},
    {"adam state shape differs", "Adam", "", 6,
     {T0(F32, 1), T0(I64, 0), T1(F32, 2, 1, 1), T1(F32, 2, 1, 1), T1(F32, 2, 1, 1),
      T1(F32, 1, 1)},
     AF_ERR_INVALID_MODEL, 3, {NONE, NONE, NONE}},
    {"adagrad int32 count", "Adagrad", "", 5,
     {T0(F32, 1), T0(I32, 0), T1(F32, 1, 1), T1(F32, 1, 1), T1(F32, 1, 1)},
     AF_ERR_INVALID_MODEL, 2, {NONE, NONE}},
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* Parse "[a,b,...]" into an arena list of ints or (when any item has a '.') floats. */
static void parse_list(af_arena *a, af_attr *at, const char *val) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", val + 1);
    char *end = strchr(buf, ']');
    assert_non_null(end);
    *end = '\0';
    bool floats = strchr(buf, '.') != NULL;
    int cnt = *buf ? 1 : 0;
    for (char *p = buf; *p; p++) cnt += *p == ',';
    at->type = floats ? AF_ATTR_FLOATS : AF_ATTR_INTS;
    at->n = cnt;
    at->floats = af_arena_calloc(a, (size_t)cnt + 1, sizeof(float));
    at->ints = af_arena_calloc(a, (size_t)cnt + 1, sizeof(int64_t));
    char *p = buf;
    for (int i = 0; i < cnt; i++) {
        char *next;
        if (floats)
            at->floats[i] = strtof(p, &next);
        else
            at->ints[i] = strtoll(p, &next, 10);
        p = *next == ',' ? next + 1 : next;
    }
}

/* The op table row named `op` (looked up directly: routing by domain is af_op_lookup's
 * business, tested with the importer). */
static af_op op_by_name(const char *op) {
    for (int i = 0; i < AF_OP_COUNT; i++)
        if (!strcmp(af_ops[i].name, op)) return (af_op)i;
    return AF_OP_COUNT;
}

/* An attribute value: "[...]" a list, otherwise a scalar. */
static void parse_value(af_arena *a, af_attr *at, const char *val) {
    if (*val == '[')
        parse_list(a, at, val);
    else
        tu_parse_scalar(a, at, val);
}

/* A one-node graph for `op` of `domain` at `opset` with attributes parsed from `attrs`. */
static af_node *make_node(af_arena *a, const char *domain, const char *op, const char *attrs,
                          int opset, int nin, int nout) {
    af_node *n = tu_node(a, op_by_name(op), opset, nin, nout, 12);
    n->domain = domain;
    tu_attrs(a, n, attrs, 12, parse_value);
    return n;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_cases(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const tcase *tc = &cases[c];
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, "", tc->op, tc->attrs, tc->opset, tc->nin, 1);
        af_tensor *owned[5] = {NULL};
        const af_tensor *in[5] = {NULL};
        for (int k = 0; k < tc->nin; k++)
            if (tc->in[k].t != AF_DTYPE_UNDEFINED) in[k] = owned[k] = tens_make(&tc->in[k]);
        af_tensor out[1];
        memset(out, 0, sizeof out);
        out[0].rank = -1;
        af_error err = {0};
        af_status st = tu_run(n, in, out, 1, &err);
        if (st != tc->expect)
            fail_msg("%s: status %d, expected %d (%s)", tc->name, st, tc->expect, err.message);
        if (st != AF_OK && !strstr(err.message, "'n0'"))
            fail_msg("%s: message does not name the node: %s", tc->name, err.message);
        if (st == AF_OK) tens_expect_close(tc->name, &out[0], &tc->out);
        af_tensor_release(&out[0]);
        for (int k = 0; k < 5; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
}

static void test_steps(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(steps); c++) {
        const tstep *tc = &steps[c];
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, "ai.onnx.preview.training", tc->op, tc->attrs, 17, tc->nin,
                               tc->nout);
        af_tensor *owned[8] = {NULL};
        const af_tensor *in[8] = {NULL};
        for (int k = 0; k < tc->nin; k++) in[k] = owned[k] = tens_make(&tc->in[k]);
        af_tensor out[4];
        memset(out, 0, sizeof out);
        for (int o = 0; o < 4; o++) out[o].rank = -1;
        af_error err = {0};
        af_status st = tu_run(n, in, out, tc->nout, &err);
        if (st != tc->expect)
            fail_msg("%s: status %d, expected %d (%s)", tc->name, st, tc->expect, err.message);
        for (int o = 0; st == AF_OK && o < tc->nout; o++)
            tens_expect_close(tc->name, &out[o], &tc->out[o]);
        for (int o = 0; o < 4; o++) af_tensor_release(&out[o]);
        for (int k = 0; k < 8; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
}

/* Compile time: values unknown (data NULL) and dims -1 give -1 dims, not failures. */
static void test_shapes_unknown(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    af_tensor out[1];
    af_tensor size = {.dtype = AF_DTYPE_INT64, .rank = 0};
    af_tensor sig = {.dtype = AF_DTYPE_FLOAT, .rank = 4, .dims = {-1, 10, -1, 1}};
    af_tensor sig3 = {.dtype = AF_DTYPE_FLOAT, .rank = 3, .dims = {2, 100, 1}};
    af_tensor win = {.dtype = AF_DTYPE_FLOAT, .rank = 1, .dims = {16}};
    af_tensor unk = {.dtype = AF_DTYPE_FLOAT, .rank = -1};
    af_tensor text = {.dtype = AF_DTYPE_INT64, .rank = 2, .dims = {-1, 9}};

    af_node *hann = make_node(a, "", "HannWindow", "output_datatype=11", 17, 1, 1);
    const af_tensor *in1[1] = {&size};
    assert_int_equal(af_kernel_shape(hann, in1, out, &err), AF_OK);
    assert_int_equal(out[0].dtype, AF_DTYPE_DOUBLE);
    assert_int_equal(out[0].rank, 1);
    assert_int_equal(out[0].dims[0], -1);

    af_node *dft = make_node(a, "", "DFT", "axis=1 onesided=1", 17, 2, 1);
    const af_tensor *in2[2] = {&sig, NULL};
    assert_int_equal(af_kernel_shape(dft, in2, out, &err), AF_OK);
    assert_int_equal(out[0].rank, 4);
    assert_int_equal(out[0].dims[0], -1);
    assert_int_equal(out[0].dims[1], 6);
    assert_int_equal(out[0].dims[3], 2);
    const af_tensor *in3[2] = {&sig, &size}; /* dft_length given, value unknown */
    assert_int_equal(af_kernel_shape(dft, in3, out, &err), AF_OK);
    assert_int_equal(out[0].dims[1], -1);
    const af_tensor *in4[2] = {&unk, NULL};
    assert_int_equal(af_kernel_shape(dft, in4, out, &err), AF_OK);
    assert_int_equal(out[0].rank, -1);

    af_node *stft = make_node(a, "", "STFT", "", 17, 3, 1);
    const af_tensor *in5[3] = {&sig3, &size, &win}; /* frame_step unknown */
    assert_int_equal(af_kernel_shape(stft, in5, out, &err), AF_OK);
    assert_int_equal(out[0].rank, 4);
    assert_int_equal(out[0].dims[0], 2);
    assert_int_equal(out[0].dims[1], -1);
    assert_int_equal(out[0].dims[2], 9);

    af_node *tfidf = make_node(a, "", "TfIdfVectorizer",
                               "pool_int64s=[4,5] ngram_counts=[0] ngram_indexes=[3,0] mode=TF"
                               " min_gram_length=1 max_gram_length=1 max_skip_count=0",
                               9, 1, 1);
    const af_tensor *in6[1] = {&text};
    assert_int_equal(af_kernel_shape(tfidf, in6, out, &err), AF_OK);
    assert_int_equal(out[0].dtype, AF_DTYPE_FLOAT);
    assert_int_equal(out[0].dims[0], -1);
    assert_int_equal(out[0].dims[1], 4);
    af_arena_free(a);
}

/* A kernel handed an output buffer that disagrees with its inputs (a runtime bug or a hostile
 * caller) fails instead of writing out of bounds. */
static void test_kernel_rejects_bad_output(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    tens ss = T0(I64, 8);
    af_tensor *size = tens_make(&ss);
    const af_tensor *in[1] = {size};
    af_node *hann = make_node(a, "", "HannWindow", "", 17, 1, 1);
    af_tensor out[1];
    memset(out, 0, sizeof out);
    int64_t dims[1] = {4};
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, 1, dims);
    assert_int_equal(af_tensor_alloc(&out[0], &err), AF_OK);
    assert_int_equal(af_kernel_run(hann, in, out, NULL, &err), AF_ERR_INTERNAL);
    af_tensor_release(&out[0]);
    af_tensor_free(size);
    af_arena_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_shapes_unknown),
        cmocka_unit_test(test_kernel_rejects_bad_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
