/* The epilogue program of fused ops: a short list of elementwise steps applied to each output
 * tile right after the core of a fused kernel (conv, matmul...) computes it.
 *
 * A fused node carries it in two attributes:
 *   "epilogue"        INTS   3 per step: {op (af_ep_op), operand, flags}
 *   "epilogue_params" FLOATS 2 per step: {p0, p1} (may be omitted when no step has parameters)
 * `operand` is the index of the fused node's input that holds the operand of a binary step (-1
 * for unary steps); the operand broadcasts (numpy, unidirectionally) to the output shape.
 * flags & AF_EP_REVERSED makes a binary step y = operand (op) y instead of y = y (op) operand.
 *
 * Invariant: af_epilogue_parse accepts only programs whose every step is known, whose operands
 * are present float32 tensors broadcastable to the output, so af_epilogue_apply reads only
 * inside each operand and never fails. Steps keep the value as float between steps, like the
 * unfused chain of ops they replace. */
#ifndef AF_IR_EPILOGUE_H
#define AF_IR_EPILOGUE_H

#include "ir/ir.h"

typedef enum af_ep_op {
    AF_EP_ADD = 1,
    AF_EP_SUB = 2,
    AF_EP_MUL = 3,
    AF_EP_DIV = 4,
    AF_EP_RELU = 5,
    AF_EP_CLIP = 6,         /* p0 min, p1 max */
    AF_EP_LEAKY_RELU = 7,   /* p0 alpha */
    AF_EP_SIGMOID = 8,
    AF_EP_HARD_SIGMOID = 9, /* p0 alpha, p1 beta */
    AF_EP_HARD_SWISH = 10,
    AF_EP_SILU = 11,
    AF_EP_GELU = 12,        /* p0: 0 erf form, 1 tanh form */
    AF_EP_TANH = 13,
    AF_EP_ELU = 14,         /* p0 alpha */
    AF_EP_CUSTOM_UNARY = 15, /* a plugin's ELEMWISE op: its map(p, y) */
    AF_EP_CUSTOM_BINARY = 16, /* a plugin's BROADCAST op: its map2(p, y, operand) */
    /* p0 scale s (> 0, finite), p1 zero point z (an integer in [0, 255], the uint8 domain: an
     * int8 zero point z8 is z8 + 128): a QuantizeLinear -> DequantizeLinear pair,
     * fq(y) = (clamp(round_half_even(y / s) + z, 0, 255) - z) * s, the division in float32 as
     * ONNX's QuantizeLinear divides. */
    AF_EP_FAKE_QUANT = 17,
    /* PRelu: y < 0 ? y * operand : y (the operand its slope; reversed, the operand is the x). */
    AF_EP_PRELU = 18
} af_ep_op;

/* flags bit of a binary step: y = operand (op) y. */
#define AF_EP_REVERSED 1
/* Custom steps: flags >> AF_EP_CUSTOM_SHIFT is the index of the op's "domain:name" in the fused
 * node's "custom_ops" STRINGS attribute; p0, p1 are the op's parameters (its params()). */
#define AF_EP_CUSTOM_SHIFT 1

/* Longest program a fused node may carry (the fusion engine must not build longer ones). */
#define AF_EP_MAX_STEPS 32

typedef struct af_ep_step {
    af_ep_op op;
    bool reversed;
    float p0, p1;
    int input;                     /* binary steps: the node's input holding the operand */
    const float *operand;          /* binary steps: the operand's data; NULL for unary steps */
    const struct af_custom_op *custom; /* custom steps: the plugin's op */
    int64_t strides[AF_MAX_RANK];  /* broadcast strides of the operand over the output shape */
} af_ep_step;

typedef struct af_epilogue {
    int nsteps;
    int rank; /* of the output the operands broadcast to */
    int64_t dims[AF_MAX_RANK];
    af_ep_step steps[AF_EP_MAX_STEPS];
} af_epilogue;

/* The node's program as stored: its steps (3 ints each) into e and their parameters into q
 * (zeros where "epilogue_params" is omitted or empty); the number of steps, 0 without a
 * program, -1 when the attributes are malformed. For passes that edit a program in place. */
int af_epilogue_steps(const af_node *n, int64_t e[3 * AF_EP_MAX_STEPS], float q[2 * AF_EP_MAX_STEPS]);
/* Store nsteps steps of e and q as the node's program (0: no program); false when out of
 * memory. */
bool af_epilogue_set_steps(af_node *n, const int64_t *e, const float *q, int nsteps);

/* True for ADD..DIV, PRELU and CUSTOM_BINARY (steps with an operand); true for RELU..ELU, CUSTOM_UNARY
 * and FAKE_QUANT. */
bool af_ep_is_binary(int64_t op);
bool af_ep_is_unary(int64_t op);

/* Check one unary op and its parameters (e.g. GELU's form); NULL when fine, else a reason. */
const char *af_ep_unary_check(int64_t op, float p0, float p1);

/* Check the node's epilogue attributes against its inputs and the output type `y` (dims may be
 * -1 and input data absent: what is unknown is not checked). For shape functions. */
af_status af_epilogue_validate(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                               af_error *err);

/* Parse and validate the node's epilogue for output type `y` (all dims known, operand data
 * present) into ep. No epilogue attribute means an empty program. */
af_status af_epilogue_parse(const af_node *n, const af_tensor *const *in, const af_tensor *y,
                            af_epilogue *ep, af_error *err);
/* The same for the program in attributes `attr` and `attr`_params (a merged prologue's). */
af_status af_epilogue_parse_attr(const af_node *n, const af_tensor *const *in,
                                 const af_tensor *y, const char *attr, af_epilogue *ep,
                                 af_error *err);
/* af_epilogue_parse_attr in two halves, for kernels prepared once per node: decode the program
 * from the input types alone (every dim known; no data needed: the steps keep their operands'
 * input indices and strides), then, on every run, point the steps at the operands among that
 * run's inputs (which have the types the program was decoded for). */
af_status af_epilogue_prepare_attr(const af_node *n, const af_tensor *const *in,
                                   const af_tensor *y, const char *attr, af_epilogue *ep,
                                   af_error *err);
af_status af_epilogue_bind(const af_node *n, af_epilogue *ep, const af_tensor *const *in,
                           af_error *err);

/* Unary ops of the standalone fast elementwise kernels (beyond the epilogue's activations). */
typedef enum af_vun_op {
    AF_VUN_EXP = 100,
    AF_VUN_ERF,
    AF_VUN_SQRT,
    AF_VUN_RECIPROCAL,
    AF_VUN_NEG,
    AF_VUN_ABS,
    AF_VUN_SQUARE,
    AF_VUN_SOFTPLUS,
    AF_VUN_FLOOR,
    AF_VUN_CEIL,
    AF_VUN_ROUND, /* half to even */
    AF_VUN_SIGN,
    AF_VUN_SOFTSIGN,
    AF_VUN_MISH,
    AF_VUN_LOG,
    AF_VUN_SELU, /* p0 alpha, p1 gamma */
    AF_VUN_CELU, /* p0 alpha */
    AF_VUN_SIN,
    AF_VUN_COS
} af_vun_op;

/* The epilogue step of a unary activation node (its row's .ep, parameters from its attributes
 * or their defaults, Gelu's form from "approximate"); false for anything else, Clip included
 * (its bounds may be inputs: callers read them). */
bool af_op_ep_step(const af_node *n, int *op, float *p0, float *p1);

#endif
