/* The one place that decides which kernel runs a node (dispatch.h).
 *
 * Every op has a reference kernel (kernels/ref, the op table's column). Some have a fast one,
 * listed below, and a few exist in forms only the lowering makes: weights packed into GEMM
 * panels, tensors in channels-last layout. A node runs on its fast kernel when the ISA in force
 * is above the reference (AUTOFUSION_ISA=reference keeps everything on the oracle) or when it is
 * in such a lowered form, which only the fast kernels read; a fast kernel may still decline a
 * case (another dtype, a broadcast its vector code cannot read), and then the reference kernel
 * runs it. Lowered forms also have their own shape functions here; the reference shape
 * functions refuse them.
 *
 * A fast kernel that parses much (FusedConv, FusedMatMul) can be prepared once per node
 * (af_kernel_prepare): what it reads of its attributes and derives from its input types is kept
 * by the executor and handed back on every run whose inputs have those types, so that the run
 * only binds its data.
 *
 * No silent slow path: af_kernel_choice tells without running which kind of kernel a node gets
 * (inspect lists the nodes left on a reference kernel), af_kernel_run_kind which kind actually
 * ran (the profile names it per node event, bench warns with the share of the time). Ops whose
 * reference kernel is all they need (views, metadata, control flow) are marked .direct in the
 * op table and never count as slow.
 *
 * Invariant: the choice depends on the node and the ISA only, never on the data, so a node
 * computes the same bits on every run, prepared or not. */
#include "kernels/fast/dispatch.h"
#include "kernels/fast/fast.h"
#include "kernels/ref/ref.h"
#include "ir/epilogue.h"
#include "kernels/simd/cpu.h"

typedef struct fast_row {
    af_kernel_fn kernel;
    af_shape_fn shape;   /* of the lowered form; NULL: the reference shape function serves */
    const char *lowered; /* the attribute that marks the lowered form (NULL: none) */
    bool only_lowered;   /* the fast kernel takes the lowered form only */
    af_prepare_fn prepare; /* what the kernel can do once per node (NULL: nothing) */
    uint32_t in_types;     /* bits (1 << af_dtype) of the first input types it takes; 0: float32;
                              ANY_DTYPE: every dtype (kernels that move elements by size) */
    bool (*pair)(af_dtype in, af_dtype out); /* NULL, or which (input 0, output 0) dtype pairs
                                                it takes: a conversion's */
} fast_row;

#define ANY_DTYPE UINT32_MAX

/* A kernel that takes only the channels-last form the layout pass makes. */
#define CHANNELS_LAST(k, s) {.kernel = k, .shape = s, .lowered = "channels_last", .only_lowered = true}

/* A kernel that takes the channels-last form and the plain one (it looks at the attribute). */
#define EITHER_LAYOUT(k, s) {.kernel = k, .shape = s, .lowered = "channels_last"}

/* Ops whose rows of the op table have a unary epilogue step or a vector function run on
 * fast_unary without a row here (fast_of). */
static const fast_row rows[AF_OP_COUNT] = {
    [AF_OP_CLIP] = {.kernel = fast_clip},
    [AF_OP_ADD] = {.kernel = fast_binary},
    [AF_OP_PRELU] = {.kernel = fast_binary},
    [AF_OP_SUB] = {.kernel = fast_binary},
    [AF_OP_MUL] = {.kernel = fast_binary},
    [AF_OP_DIV] = {.kernel = fast_binary},
    [AF_OP_POW] = {.kernel = fast_binary},
    [AF_OP_MOD] = {.kernel = fast_binary},
    [AF_OP_MAX] = {.kernel = fast_variadic},
    [AF_OP_MIN] = {.kernel = fast_variadic},
    [AF_OP_SUM] = {.kernel = fast_variadic},
    [AF_OP_MEAN] = {.kernel = fast_variadic},
    [AF_OP_EQUAL] = {.kernel = fast_compare},
    [AF_OP_LESS] = {.kernel = fast_compare},
    [AF_OP_GREATER] = {.kernel = fast_compare},
    [AF_OP_LESS_OR_EQUAL] = {.kernel = fast_compare},
    [AF_OP_GREATER_OR_EQUAL] = {.kernel = fast_compare},
    [AF_OP_AND] = {.kernel = fast_logical},
    [AF_OP_OR] = {.kernel = fast_logical},
    [AF_OP_XOR] = {.kernel = fast_logical},
    [AF_OP_NOT] = {.kernel = fast_not},
    [AF_OP_WHERE] = {.kernel = fast_where},
    [AF_OP_RESIZE] = {.kernel = fast_resize},
    [AF_OP_UPSAMPLE] = {.kernel = fast_resize},
    [AF_OP_GRID_SAMPLE] = {.kernel = fast_grid_sample},
    [AF_OP_PAD] = {.kernel = fast_pad},
    [AF_OP_SLICE] = {.kernel = fast_slice},
    [AF_OP_EXPAND] = {.kernel = fast_expand},
    [AF_OP_TILE] = {.kernel = fast_tile},
    [AF_OP_TRILU] = {.kernel = fast_trilu, .in_types = ANY_DTYPE},
    [AF_OP_DEPTH_TO_SPACE] = {.kernel = fast_depth_space, .in_types = ANY_DTYPE},
    [AF_OP_SPACE_TO_DEPTH] = {.kernel = fast_depth_space, .in_types = ANY_DTYPE},
    [AF_OP_CONCAT] = {.kernel = fast_concat},
    [AF_OP_SPLIT] = {.kernel = fast_split},
    [AF_OP_GATHER] = {.kernel = fast_gather},
    [AF_OP_CONSTANT_OF_SHAPE] = {.kernel = fast_constant_of_shape, .in_types = ANY_DTYPE},
    [AF_OP_CAST] = {.kernel = fast_cast, .in_types = ANY_DTYPE, .pair = fast_cast_takes},
    [AF_OP_CAST_LIKE] = {.kernel = fast_cast, .in_types = ANY_DTYPE, .pair = fast_cast_takes},
    [AF_OP_SCATTER_ELEMENTS] = {.kernel = fast_scatter_elements, .in_types = ANY_DTYPE},
    [AF_OP_GATHER_ELEMENTS] = {.kernel = fast_gather_elements, .in_types = ANY_DTYPE},
    [AF_OP_SCATTER] = {.kernel = fast_scatter_elements, .in_types = ANY_DTYPE},
    [AF_OP_GATHER_ND] = {.kernel = fast_gather_nd, .in_types = ANY_DTYPE},
    [AF_OP_NON_ZERO] = {.kernel = fast_non_zero, .in_types = ANY_DTYPE},
    [AF_OP_LAYER_NORMALIZATION] = {.kernel = fast_layernorm},
    [AF_OP_RMS_NORMALIZATION] = {.kernel = fast_rmsnorm},
    [AF_OP_SOFTMAX] = {.kernel = fast_softmax},
    [AF_OP_LOG_SOFTMAX] = {.kernel = fast_log_softmax},
    [AF_OP_REDUCE_SUM] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_MEAN] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_MAX] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_MIN] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_PROD] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_L1] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_L2] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_LOG_SUM] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_LOG_SUM_EXP] = {.kernel = fast_reduce},
    [AF_OP_REDUCE_SUM_SQUARE] = {.kernel = fast_reduce},
    [AF_OP_ARGMAX] = {.kernel = fast_arg},
    [AF_OP_ARGMIN] = {.kernel = fast_arg},
    [AF_OP_INSTANCE_NORMALIZATION] = {.kernel = fast_instancenorm},
    [AF_OP_NON_MAX_SUPPRESSION] = {.kernel = fast_nms},
    [AF_OP_ROI_ALIGN] = {.kernel = fast_roi_align},
    [AF_OP_GROUP_NORM] = {.kernel = fast_group_norm, .shape = fast_shape_group_norm,
                          .lowered = "channels_last"},
    [AF_OP_TOPK] = {.kernel = fast_topk},
    [AF_OP_RNN] = {.kernel = fast_rnn},
    [AF_OP_GRU] = {.kernel = fast_rnn},
    [AF_OP_LSTM] = {.kernel = fast_rnn},
    [AF_OP_CUMSUM] = {.kernel = fast_cumsum},
    [AF_OP_QUANTIZE_LINEAR] = {.kernel = fast_quantize},
    [AF_OP_DEQUANTIZE_LINEAR] = {.kernel = fast_dequantize,
                                 .in_types = 1u << AF_DTYPE_UINT8 | 1u << AF_DTYPE_INT8},
    [AF_OP_DYNAMIC_QUANTIZE_LINEAR] = {.kernel = fast_dyn_quantize},
    [AF_OP_TRANSPOSE] = {.kernel = fast_transpose},
    [AF_OP_MAX_POOL] = EITHER_LAYOUT(fast_maxpool_any, fast_shape_maxpool),
    [AF_OP_AVERAGE_POOL] = EITHER_LAYOUT(fast_avgpool_any, fast_shape_avgpool),
    [AF_OP_GLOBAL_MAX_POOL] = EITHER_LAYOUT(fast_global_maxpool_any, fast_shape_global_maxpool),
    [AF_OP_GLOBAL_AVERAGE_POOL] = EITHER_LAYOUT(fast_global_avgpool_any, fast_shape_global_avgpool),
    [AF_OP_LP_POOL] = {.kernel = fast_lppool},
    [AF_OP_GLOBAL_LP_POOL] = {.kernel = fast_global_lppool},
    [AF_OP_FUSED_CONV] = {.kernel = fast_fused_conv, .shape = fast_shape_fused_conv,
                          .lowered = "channels_last", .only_lowered = true,
                          .prepare = fast_prepare_fused_conv, /* UINT8: codes (int8 convs) */
                          .in_types = 1u << AF_DTYPE_FLOAT | 1u << AF_DTYPE_UINT8},
    [AF_OP_CONV_POOL_FC] = CHANNELS_LAST(fast_conv_pool_fc, fast_shape_conv_pool_fc),
    [AF_OP_FUSED_MATMUL] = {.kernel = fast_fused_matmul, .shape = fast_shape_fused_matmul,
                            .lowered = "b_packed", .prepare = fast_prepare_fused_matmul},
    [AF_OP_FUSED_ELEMENTWISE] = {.kernel = fast_fused_elementwise},
    [AF_OP_SQUEEZE_EXCITE] = {.kernel = fast_squeeze_excite, .lowered = "channels_last"},
    [AF_OP_FUSED_ATTENTION] = {.kernel = fast_attention},
};

static const fast_row unary_row = {.kernel = fast_unary};

static const fast_row *fast_of(af_op op) {
    if (op >= AF_OP_COUNT) return NULL;
    if (rows[op].kernel) return &rows[op];
    return af_ops[op].vec_unary || (af_ep_is_unary(af_ops[op].ep) && op != AF_OP_CLIP) ? &unary_row
                                                                                        : NULL;
}

static bool lowered(const af_node *n, const fast_row *r) {
    return r && r->lowered && af_attr_int(n, r->lowered, 0) != 0;
}

af_status af_kernel_shape(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    const fast_row *r = fast_of(n->op);
    if (r && r->shape && lowered(n, r)) return r->shape(n, in, out, err);
    return af_ref_ops[n->op].shape(n, in, out, err);
}

/* Whether node n runs on its fast kernel r (r may be NULL). */
static bool runs_fast(const af_node *n, const fast_row *r) {
    return r && ((!r->only_lowered && af_isa_get() != AF_ISA_REFERENCE) || lowered(n, r));
}

/* The reference kernel's kind for n: slow unless the op needs no other. */
static af_kernel_kind ref_kind(const af_node *n) {
    return n->op < AF_OP_COUNT && af_ops[n->op].direct ? AF_KERNEL_DIRECT : AF_KERNEL_REFERENCE;
}

const char *af_kernel_kind_name(af_kernel_kind k) {
    return k == AF_KERNEL_FAST ? "fast" : k == AF_KERNEL_DIRECT ? "direct" : "reference";
}

/* The fast kernels compute float32 data: a node whose input 0 is known to hold another dtype
 * (int64 shape arithmetic, a quantized tensor) is declined, unless its row names the dtypes
 * its kernel takes. */
static bool takes_types(const af_node *n, const fast_row *r, const af_tensor *const *types) {
    const af_tensor *t = types ? types[0] : n->in[0] ? &n->in[0]->type : NULL;
    uint32_t ok = r->in_types ? r->in_types : 1u << AF_DTYPE_FLOAT;
    if (!t || t->dtype == AF_DTYPE_UNDEFINED) return true;
    if (r->pair && n->nout >= 1 && n->out[0] && n->out[0]->type.dtype != AF_DTYPE_UNDEFINED)
        return r->pair(t->dtype, n->out[0]->type.dtype);
    return t->dtype < 32 && (ok >> t->dtype & 1);
}

af_kernel_kind af_kernel_choice(const af_node *n, const af_tensor *const *types) {
    const fast_row *r = fast_of(n->op);
    /* the int8 form runs fast only on its packed int8 weights (the lowering's); else the
     * fast FusedMatMul declines it */
    if (af_attr_int(n, "quant", 0) && !lowered(n, r)) return ref_kind(n);
    if (runs_fast(n, r) && (n->nin < 1 || takes_types(n, r, types))) return AF_KERNEL_FAST;
    return ref_kind(n);
}

af_status af_kernel_run_kind(const af_node *n, const af_tensor *const *in, af_tensor *out,
                             af_exec *x, af_kernel_kind *ran, af_error *err) {
    const fast_row *r = fast_of(n->op);
    if (runs_fast(n, r)) {
        af_status st = r->kernel(n, in, out, x, err);
        if (ran) *ran = AF_KERNEL_FAST;
        if (st != AF_DECLINED) return st;
    }
    if (ran) *ran = ref_kind(n);
    return af_ref_ops[n->op].kernel(n, in, out, x, err);
}

af_status af_kernel_run(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                        af_error *err) {
    return af_kernel_run_kind(n, in, out, x, NULL, err);
}

void *af_kernel_prepare(const af_node *n, const af_tensor *const *types) {
    const fast_row *r = fast_of(n->op);
    if (!runs_fast(n, r) || !r->prepare) return NULL;
    for (int i = 0; i < n->nin; i++)
        if (types[i] && !af_tensor_known(types[i])) return NULL;
    return r->prepare(n, types);
}

void af_kernel_release(void *state) { af_free(state); }
