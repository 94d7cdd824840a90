/* Elementwise reference kernels: unary math and activations, broadcasting binary and variadic
 * ops, comparisons and logic, Where, Clip, Cast/CastLike, Identity and Dropout (inference).
 *
 * How it computes: each element is read into one of three compute domains -- double for the
 * float types (float16 and bfloat16 included), int64 for signed integers, uint64 for unsigned
 * integers and bool -- the op's scalar function for that domain runs, and the result is stored
 * converted to the output's dtype (wrapping to narrow integers, as C's integer arithmetic in the
 * narrow type would). The tables below say, per op, which dtypes ONNX defines it for and which
 * scalar functions compute it; one broadcast iterator walks every output in row-major order.
 *
 * Invariant: a kernel reads an input only at offsets the iterator derives from dims that were
 * checked to broadcast to the output, and only from tensors whose byte size was checked against
 * their dims, so a bad shape or size is an error and never an out-of-bounds access. Integer
 * functions are defined for every input (wrapping arithmetic, x / 0 == 0, shifts past the width
 * give 0), and float-to-integer conversion saturates, so no data reaches undefined behaviour.
 */
#include "kernels/ref/ref.h"

/* ---- dtypes and compute domains ----------------------------------------------------------- */

#define EW_SINT(X) X(AF_DTYPE_INT8, int8_t) X(AF_DTYPE_INT16, int16_t) \
    X(AF_DTYPE_INT32, int32_t) X(AF_DTYPE_INT64, int64_t)
#define EW_UINT(X) X(AF_DTYPE_UINT8, uint8_t) X(AF_DTYPE_UINT16, uint16_t) \
    X(AF_DTYPE_UINT32, uint32_t) X(AF_DTYPE_UINT64, uint64_t)

typedef enum ew_dom { EW_DOM_NONE, EW_DOM_F, EW_DOM_I, EW_DOM_U } ew_dom;

/* Dtype classes, or-ed into the set of dtypes an op accepts. */
enum { T_F = 1, T_I = 2, T_U = 4, T_B = 8 };
#define T_NUM (T_F | T_I | T_U)
#define T_ALL (T_NUM | T_B)

static unsigned tclass(af_dtype t) {
    switch (t) {
    case AF_DTYPE_FLOAT: case AF_DTYPE_DOUBLE: case AF_DTYPE_FLOAT16: case AF_DTYPE_BFLOAT16:
        return T_F;
#define X(D, T) case D:
    EW_SINT(X) return T_I;
    EW_UINT(X) return T_U;
#undef X
    case AF_DTYPE_BOOL: return T_B;
    default: return 0;
    }
}

static ew_dom dom_of(af_dtype t) {
    switch (tclass(t)) {
    case T_F: return EW_DOM_F;
    case T_I: return EW_DOM_I;
    case T_U: case T_B: return EW_DOM_U;
    default: return EW_DOM_NONE;
    }
}

/* Float to integer without undefined behaviour: truncate toward zero, NaN gives 0 and values
 * beyond the range saturate (C leaves these cases undefined, numpy gives garbage). */
static int64_t f_to_i(double v) {
    if (isnan(v)) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* Negative values wrap like numpy's float -> int64 -> uint: -1.0 becomes all ones. */
static uint64_t f_to_u(double v) {
    if (isnan(v)) return 0;
    if (v < 0) return (uint64_t)f_to_i(v);
    if (v >= 18446744073709551616.0) return UINT64_MAX;
    return (uint64_t)v;
}

static int64_t get_i(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
#define X(D, T) case D: return (int64_t)((const T *)p)[i];
    EW_SINT(X) EW_UINT(X)
#undef X
    default: return f_to_i(af_tensor_get_double(t, i));
    }
}

static uint64_t get_u(const af_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
#define X(D, T) case D: return (uint64_t)((const T *)p)[i];
    EW_SINT(X) EW_UINT(X)
#undef X
    default: return f_to_u(af_tensor_get_double(t, i));
    }
}

/* Store v at element i of t, converted to t's dtype. */
static void put_f(af_tensor *t, int64_t i, double v) {
    void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)p)[i] = v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)p)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = af_float_to_bf16((float)v); break;
    case AF_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
#define X(D, T) case D: ((T *)p)[i] = (T)f_to_i(v); break;
    EW_SINT(X)
#undef X
#define X(D, T) case D: ((T *)p)[i] = (T)f_to_u(v); break;
    EW_UINT(X)
#undef X
    default: AF_ASSERT(!"dtype checked by the caller");
    }
}

static void put_i(af_tensor *t, int64_t i, int64_t v) {
    void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)p)[i] = (double)v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)p)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = af_float_to_bf16((float)v); break;
    case AF_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
#define X(D, T) case D: ((T *)p)[i] = (T)v; break;
    EW_SINT(X) EW_UINT(X)
#undef X
    default: AF_ASSERT(!"dtype checked by the caller");
    }
}

static void put_u(af_tensor *t, int64_t i, uint64_t v) {
    void *p = t->data;
    switch (t->dtype) {
    case AF_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case AF_DTYPE_DOUBLE: ((double *)p)[i] = (double)v; break;
    case AF_DTYPE_FLOAT16: ((uint16_t *)p)[i] = af_float_to_half((float)v); break;
    case AF_DTYPE_BFLOAT16: ((uint16_t *)p)[i] = af_float_to_bf16((float)v); break;
    /* Integer and bool stores keep v's low bits (or v != 0), the same through int64. */
    default: put_i(t, i, (int64_t)v);
    }
}

/* ---- scalar functions --------------------------------------------------------------------- */

/* Attribute values of the unary ops that have some, read once per node. */
typedef struct ew_params {
    double alpha, beta, gamma;
    int64_t detect_neg, detect_pos;
} ew_params;

static double f_neg(double x) { return -x; }
static double f_reciprocal(double x) { return 1.0 / x; }
static double f_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x; }
static double f_relu(double x) { return x < 0 ? 0.0 : x; }
static double f_softsign(double x) { return x / (1.0 + fabs(x)); }
static double f_isnan(double x) { return isnan(x); }

/* Half to even without relying on the floating-point environment's rounding mode. */
static double f_round(double x) {
    double r = floor(x), frac = x - r;
    if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0)) r += 1.0;
    return r;
}

/* The two branches keep exp() from overflowing for large |x|. */
static double f_sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double f_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double f_mish(double x) { return x * tanh(f_softplus(x)); }

static double clamp01(double v) { return v < 0 ? 0.0 : v > 1 ? 1.0 : v; }
static double f_hard_swish(double x) { return x * clamp01(x / 6.0 + 0.5); }

static double fp_leaky_relu(double x, const ew_params *p) { return x < 0 ? p->alpha * x : x; }
static double fp_elu(double x, const ew_params *p) { return x < 0 ? p->alpha * expm1(x) : x; }
static double fp_selu(double x, const ew_params *p) {
    return x <= 0 ? p->gamma * p->alpha * expm1(x) : p->gamma * x;
}
static double fp_celu(double x, const ew_params *p) {
    return x > 0 ? x : p->alpha * expm1(x / p->alpha);
}
static double fp_hard_sigmoid(double x, const ew_params *p) {
    return clamp01(p->alpha * x + p->beta);
}
static double fp_thresholded_relu(double x, const ew_params *p) { return x > p->alpha ? x : 0.0; }
/* Shrink: alpha is lambd, beta is bias. */
static double fp_shrink(double x, const ew_params *p) {
    return x < -p->alpha ? x + p->beta : x > p->alpha ? x - p->beta : 0.0;
}
static double fp_isinf(double x, const ew_params *p) {
    return isinf(x) && ((x > 0 && p->detect_pos) || (x < 0 && p->detect_neg));
}

/* Signed integers wrap through uint64 so that INT64_MIN and overflow stay defined. */
static int64_t i_abs(int64_t x) { return x < 0 ? (int64_t)(0 - (uint64_t)x) : x; }
static int64_t i_neg(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static int64_t i_sign(int64_t x) { return (x > 0) - (x < 0); }
static int64_t i_relu(int64_t x) { return x < 0 ? 0 : x; }
static int64_t i_bitnot(int64_t x) { return ~x; }
static uint64_t u_ident(uint64_t x) { return x; }
static uint64_t u_sign(uint64_t x) { return x != 0; }
static uint64_t u_not(uint64_t x) { return x == 0; }
static uint64_t u_bitnot(uint64_t x) { return ~x; }

static double f_add(double a, double b) { return a + b; }
static double f_sub(double a, double b) { return a - b; }
static double f_mul(double a, double b) { return a * b; }
static double f_div(double a, double b) { return a / b; }
static double f_prelu(double x, double s) { return x < 0 ? s * x : x; }
static double f_eq(double a, double b) { return a == b; }
static double f_lt(double a, double b) { return a < b; }
static double f_gt(double a, double b) { return a > b; }
static double f_le(double a, double b) { return a <= b; }
static double f_ge(double a, double b) { return a >= b; }
/* Max and Min propagate NaN, as numpy's maximum/minimum (ONNX's reference) do. */
static double f_max(double a, double b) { return isnan(a) ? a : isnan(b) ? b : a > b ? a : b; }
static double f_min(double a, double b) { return isnan(a) ? a : isnan(b) ? b : a < b ? a : b; }

static int64_t i_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t i_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t i_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
/* Integer division truncates as C does; x / 0 is 0 (numpy's answer) rather than a trap. */
static int64_t i_div(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return i_neg(a);
    return a / b;
}
/* Mod with fmod=1: the remainder has the sign of the dividend (C's %). */
static int64_t i_fmod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    return a % b;
}
/* Mod with fmod=0: the remainder has the sign of the divisor (Python's %). */
static int64_t i_mod(int64_t a, int64_t b) {
    int64_t r = i_fmod(a, b);
    return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}
/* Exact power by squaring, wrapping; a negative exponent truncates 1/a^-e toward zero. */
static int64_t i_pow(int64_t a, int64_t e) {
    if (e < 0) return a == 1 ? 1 : a == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, base = (uint64_t)a;
    for (; e > 0; e >>= 1) {
        if (e & 1) r *= base;
        base *= base;
    }
    return (int64_t)r;
}
static int64_t i_prelu(int64_t x, int64_t s) { return x < 0 ? i_mul(s, x) : x; }
static int64_t i_and(int64_t a, int64_t b) { return a & b; }
static int64_t i_or(int64_t a, int64_t b) { return a | b; }
static int64_t i_xor(int64_t a, int64_t b) { return a ^ b; }
static int64_t i_eq(int64_t a, int64_t b) { return a == b; }
static int64_t i_lt(int64_t a, int64_t b) { return a < b; }
static int64_t i_gt(int64_t a, int64_t b) { return a > b; }
static int64_t i_le(int64_t a, int64_t b) { return a <= b; }
static int64_t i_ge(int64_t a, int64_t b) { return a >= b; }
static int64_t i_max(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t i_min(int64_t a, int64_t b) { return a < b ? a : b; }

static uint64_t u_add(uint64_t a, uint64_t b) { return a + b; }
static uint64_t u_sub(uint64_t a, uint64_t b) { return a - b; }
static uint64_t u_mul(uint64_t a, uint64_t b) { return a * b; }
static uint64_t u_div(uint64_t a, uint64_t b) { return b ? a / b : 0; }
static uint64_t u_mod(uint64_t a, uint64_t b) { return b ? a % b : 0; }
static uint64_t u_pow(uint64_t a, uint64_t e) {
    uint64_t r = 1;
    for (; e > 0; e >>= 1) {
        if (e & 1) r *= a;
        a *= a;
    }
    return r;
}
static uint64_t u_first(uint64_t x, uint64_t s) { (void)s; return x; }
/* Shifting a uint64 by 64 or more is undefined in C; every bit is shifted out. */
static uint64_t u_shl(uint64_t a, uint64_t b) { return b < 64 ? a << b : 0; }
static uint64_t u_shr(uint64_t a, uint64_t b) { return b < 64 ? a >> b : 0; }
static uint64_t u_and(uint64_t a, uint64_t b) { return a & b; }
static uint64_t u_or(uint64_t a, uint64_t b) { return a | b; }
static uint64_t u_xor(uint64_t a, uint64_t b) { return a ^ b; }
static uint64_t u_eq(uint64_t a, uint64_t b) { return a == b; }
static uint64_t u_lt(uint64_t a, uint64_t b) { return a < b; }
static uint64_t u_gt(uint64_t a, uint64_t b) { return a > b; }
static uint64_t u_le(uint64_t a, uint64_t b) { return a <= b; }
static uint64_t u_ge(uint64_t a, uint64_t b) { return a >= b; }
static uint64_t u_max(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t u_min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* ---- op tables ---------------------------------------------------------------------------- */

/* A unary op. Integer dtypes it accepts but has no integer function for compute in double. */
typedef struct ew_unop {
    af_op op;
    unsigned types;                            /* dtype classes ONNX defines it for */
    bool to_bool;                              /* output is bool instead of the input dtype */
    double (*f)(double);                       /* float domain, attribute-free ops */
    double (*fp)(double, const ew_params *);   /* float domain, ops with attributes */
    int64_t (*i)(int64_t);
    uint64_t (*u)(uint64_t);
} ew_unop;

static const ew_unop unops[] = {
    {AF_OP_ABS, T_NUM, false, fabs, NULL, i_abs, u_ident},
    {AF_OP_NEG, T_F | T_I, false, f_neg, NULL, i_neg, NULL},
    {AF_OP_EXP, T_F, false, exp, NULL, NULL, NULL},
    {AF_OP_LOG, T_F, false, log, NULL, NULL, NULL},
    {AF_OP_SQRT, T_F, false, sqrt, NULL, NULL, NULL},
    {AF_OP_RECIPROCAL, T_F, false, f_reciprocal, NULL, NULL, NULL},
    {AF_OP_FLOOR, T_F, false, floor, NULL, NULL, NULL},
    {AF_OP_CEIL, T_F, false, ceil, NULL, NULL, NULL},
    {AF_OP_ROUND, T_F, false, f_round, NULL, NULL, NULL},
    {AF_OP_SIGN, T_NUM, false, f_sign, NULL, i_sign, u_sign},
    {AF_OP_SIN, T_F, false, sin, NULL, NULL, NULL},
    {AF_OP_COS, T_F, false, cos, NULL, NULL, NULL},
    {AF_OP_TAN, T_F, false, tan, NULL, NULL, NULL},
    {AF_OP_ASIN, T_F, false, asin, NULL, NULL, NULL},
    {AF_OP_ACOS, T_F, false, acos, NULL, NULL, NULL},
    {AF_OP_ATAN, T_F, false, atan, NULL, NULL, NULL},
    {AF_OP_SINH, T_F, false, sinh, NULL, NULL, NULL},
    {AF_OP_COSH, T_F, false, cosh, NULL, NULL, NULL},
    {AF_OP_ASINH, T_F, false, asinh, NULL, NULL, NULL},
    {AF_OP_ACOSH, T_F, false, acosh, NULL, NULL, NULL},
    {AF_OP_ATANH, T_F, false, atanh, NULL, NULL, NULL},
    {AF_OP_ERF, T_NUM, false, erf, NULL, NULL, NULL},
    {AF_OP_TANH, T_F, false, tanh, NULL, NULL, NULL},
    {AF_OP_RELU, T_F | T_I, false, f_relu, NULL, i_relu, NULL},
    {AF_OP_LEAKY_RELU, T_F, false, NULL, fp_leaky_relu, NULL, NULL},
    {AF_OP_ELU, T_F, false, NULL, fp_elu, NULL, NULL},
    {AF_OP_SELU, T_F, false, NULL, fp_selu, NULL, NULL},
    {AF_OP_CELU, T_F, false, NULL, fp_celu, NULL, NULL},
    {AF_OP_SIGMOID, T_F, false, f_sigmoid, NULL, NULL, NULL},
    {AF_OP_HARD_SIGMOID, T_F, false, NULL, fp_hard_sigmoid, NULL, NULL},
    {AF_OP_HARD_SWISH, T_F, false, f_hard_swish, NULL, NULL, NULL},
    {AF_OP_SOFTPLUS, T_F, false, f_softplus, NULL, NULL, NULL},
    {AF_OP_SOFTSIGN, T_F, false, f_softsign, NULL, NULL, NULL},
    {AF_OP_THRESHOLDED_RELU, T_F, false, NULL, fp_thresholded_relu, NULL, NULL},
    {AF_OP_MISH, T_F, false, f_mish, NULL, NULL, NULL},
    {AF_OP_SHRINK, T_NUM, false, NULL, fp_shrink, NULL, NULL},
    {AF_OP_NOT, T_B, false, NULL, NULL, NULL, u_not},
    {AF_OP_BITWISE_NOT, T_I | T_U, false, NULL, NULL, i_bitnot, u_bitnot},
    {AF_OP_IS_NAN, T_F, true, f_isnan, NULL, NULL, NULL},
    {AF_OP_IS_INF, T_F, true, NULL, fp_isinf, NULL, NULL},
};

/* A broadcasting op of two operands; variadic ops fold it over their inputs. */
typedef struct ew_binop {
    af_op op;
    unsigned types;
    bool to_bool;
    double (*f)(double, double);
    int64_t (*i)(int64_t, int64_t);
    uint64_t (*u)(uint64_t, uint64_t);
} ew_binop;

static const ew_binop binops[] = {
    {AF_OP_ADD, T_NUM, false, f_add, i_add, u_add},
    {AF_OP_SUB, T_NUM, false, f_sub, i_sub, u_sub},
    {AF_OP_MUL, T_NUM, false, f_mul, i_mul, u_mul},
    {AF_OP_DIV, T_NUM, false, f_div, i_div, u_div},
    {AF_OP_POW, T_NUM, false, pow, i_pow, u_pow},
    {AF_OP_MOD, T_NUM, false, fmod, i_mod, u_mod}, /* fmod=1 swaps in i_fmod, see binop_pick */
    {AF_OP_PRELU, T_NUM, false, f_prelu, i_prelu, u_first},
    {AF_OP_BIT_SHIFT, T_U, false, NULL, NULL, u_shl}, /* RIGHT swaps in u_shr */
    {AF_OP_BITWISE_AND, T_I | T_U, false, NULL, i_and, u_and},
    {AF_OP_BITWISE_OR, T_I | T_U, false, NULL, i_or, u_or},
    {AF_OP_BITWISE_XOR, T_I | T_U, false, NULL, i_xor, u_xor},
    {AF_OP_EQUAL, T_ALL, true, f_eq, i_eq, u_eq},
    {AF_OP_LESS, T_NUM, true, f_lt, i_lt, u_lt},
    {AF_OP_GREATER, T_NUM, true, f_gt, i_gt, u_gt},
    {AF_OP_LESS_OR_EQUAL, T_NUM, true, f_le, i_le, u_le},
    {AF_OP_GREATER_OR_EQUAL, T_NUM, true, f_ge, i_ge, u_ge},
    {AF_OP_AND, T_B, true, NULL, NULL, u_and},
    {AF_OP_OR, T_B, true, NULL, NULL, u_or},
    {AF_OP_XOR, T_B, true, NULL, NULL, u_xor},
    {AF_OP_MAX, T_NUM, false, f_max, i_max, u_max},
    {AF_OP_MIN, T_NUM, false, f_min, i_min, u_min},
    {AF_OP_SUM, T_F, false, f_add, NULL, NULL},
    {AF_OP_MEAN, T_F, false, f_add, NULL, NULL}, /* the kernel divides by the input count */
};

static const ew_unop *unop_find(af_op op) {
    for (size_t k = 0; k < AF_COUNT(unops); k++)
        if (unops[k].op == op) return &unops[k];
    return NULL;
}

static const ew_binop *binop_find(af_op op) {
    for (size_t k = 0; k < AF_COUNT(binops); k++)
        if (binops[k].op == op) return &binops[k];
    return NULL;
}

static bool is_variadic(af_op op) {
    return op == AF_OP_MAX || op == AF_OP_MIN || op == AF_OP_SUM || op == AF_OP_MEAN;
}

/* ---- checks shared by shape functions and kernels ----------------------------------------- */

/* UNDEFINED passes: at compile time a dtype may not be known yet. */
static af_status check_dtype(const af_node *n, af_dtype t, unsigned types, af_error *err) {
    if (t == AF_DTYPE_UNDEFINED || (tclass(t) & types)) return AF_OK;
    return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "not defined for dtype %s",
                        af_dtype_name(t));
}

/* t's right-aligned dims each equal `to`'s or are 1 (the kernels' precondition for reading t). */
static bool broadcasts_to(const af_tensor *t, const af_tensor *to) {
    if (t->rank < 0 || t->rank > to->rank) return false;
    for (int d = 0; d < t->rank; d++) {
        int64_t td = t->dims[d], od = to->dims[to->rank - t->rank + d];
        if (td != 1 && td != od) return false;
    }
    return true;
}

/* A run-time input: dims known, a fixed-size dtype, and as many bytes as the dims say. */
static af_status check_data(const af_node *n, const af_tensor *t, af_error *err) {
    int64_t count = af_tensor_numel(t), bytes;
    size_t size = af_dtype_size(t->dtype);
    if (count < 0)
        return af_node_fail(err, n, AF_ERR_RUNTIME, "tensor dims unknown or too large at run time");
    if (size == 0)
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "dtype %s not supported",
                            af_dtype_name(t->dtype));
    if (!af_mul_i64(count, (int64_t)size, &bytes) || (count > 0 && !t->data) ||
        (uint64_t)bytes > (uint64_t)t->nbytes)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "tensor holds fewer bytes than its dims need");
    return AF_OK;
}

/* The output of a kernel: allocated here if the runtime left it without data. */
static af_status prepare_out(const af_node *n, af_tensor *out, af_error *err) {
    if (!out->data && af_tensor_numel(out) > 0) {
        af_status st = af_tensor_alloc(out, err);
        if (st != AF_OK) return st;
    }
    return check_data(n, out, err);
}

/* An input of a kernel that reads it broadcast to `out`. */
static af_status check_input(const af_node *n, const af_tensor *t, const af_tensor *out,
                             af_error *err) {
    af_status st = check_data(n, t, err);
    if (st != AF_OK) return st;
    if (!broadcasts_to(t, out)) {
        char a[128], b[128];
        return af_node_fail(err, n, AF_ERR_RUNTIME, "input %s does not broadcast to output %s",
                            af_dims_str(t, a, sizeof a), af_dims_str(out, b, sizeof b));
    }
    return AF_OK;
}

/* A scalar operand (Clip's bounds, Dropout's ratio and training_mode): exactly one element. */
static af_status check_scalar(const af_node *n, const af_tensor *t, const char *what,
                              af_error *err) {
    af_status st = check_data(n, t, err);
    if (st != AF_OK) return st;
    if (af_tensor_numel(t) != 1)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "%s must have one element", what);
    return AF_OK;
}

/* ---- the broadcast iterator --------------------------------------------------------------- */

#define EW_ITER_MAX 3

/* Walks the output in row-major order and keeps, for each input, the offset of the element
 * that broadcasts to the current output element. Inputs must satisfy broadcasts_to(). */
typedef struct ew_iter {
    int rank, nin;
    int64_t dims[AF_MAX_RANK];
    int64_t idx[AF_MAX_RANK];
    int64_t strides[EW_ITER_MAX][AF_MAX_RANK];
    int64_t off[EW_ITER_MAX];
} ew_iter;

static void iter_init(ew_iter *it, const af_tensor *out, const af_tensor *const *in, int nin) {
    AF_ASSERT(nin >= 1 && nin <= EW_ITER_MAX && out->rank >= 0 && out->rank <= AF_MAX_RANK);
    memset(it, 0, sizeof *it);
    it->rank = out->rank;
    it->nin = nin;
    memcpy(it->dims, out->dims, sizeof(int64_t) * (size_t)out->rank);
    for (int k = 0; k < nin; k++) af_broadcast_strides(in[k], out, it->strides[k]);
}

/* Step to the next output element: an odometer over the dims that carries into outer ones. */
static void iter_next(ew_iter *it) {
    for (int d = it->rank - 1; d >= 0; d--) {
        it->idx[d]++;
        for (int k = 0; k < it->nin; k++) it->off[k] += it->strides[k][d];
        if (it->idx[d] < it->dims[d]) return;
        for (int k = 0; k < it->nin; k++) it->off[k] -= it->strides[k][d] * it->dims[d];
        it->idx[d] = 0;
    }
}

/* ---- shape helpers ------------------------------------------------------------------------ */

/* acc = numpy broadcast of acc and t; rank -1 once either rank is unknown (compile time). */
static af_status broadcast_into(const af_node *n, af_tensor *acc, const af_tensor *t,
                                af_error *err) {
    af_tensor next = {0};
    if (!af_broadcast_dims(acc, t, &next)) {
        char a[128], b[128];
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input shapes %s and %s do not broadcast",
                            af_dims_str(acc, a, sizeof a), af_dims_str(t, b, sizeof b));
    }
    af_tensor_type_copy(acc, &next);
    return AF_OK;
}

/* Operand views for opset < 7 models, which broadcast differently from numpy:
 *  - arithmetic with broadcast=1 and `axis`: B's dims line up with A's from `axis` on, so B is
 *    viewed with trailing 1s appended;
 *  - PRelu with a 1-D slope of A's channel count: the slope is per channel (dim 1).
 * `view` shares the data of in[1]; the caller uses it in place of in[1]. */
static af_status legacy_view(const af_node *n, const af_tensor *a, const af_tensor *b,
                             af_tensor *view, af_error *err) {
    *view = *b;
    view->owns_data = 0;
    if (af_graph_opset(n->graph) >= 7 || a->rank < 0 || b->rank < 0) return AF_OK;
    int trailing = 0;
    if (n->op == AF_OP_PRELU) {
        if (b->rank == 1 && a->rank >= 2 && b->dims[0] == a->dims[1] && b->dims[0] > 1)
            trailing = a->rank - 2;
    } else if (af_attr_int(n, "broadcast", 0) != 0 && af_node_attr(n, "axis")) {
        int axis;
        if (!af_axis(af_attr_int(n, "axis", 0), a->rank, &axis) || axis + b->rank > a->rank)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "broadcast axis does not fit");
        trailing = a->rank - axis - b->rank;
    }
    for (int d = 0; d < trailing; d++) view->dims[view->rank++] = 1;
    return AF_OK;
}

/* Shape of an op whose first output has in[0]'s dims and, unless to_bool, its dtype; in[0]'s
 * dtype must be one of `types`. */
static af_status shape_like_input(const af_node *n, const af_tensor *const *in, unsigned types,
                                  bool to_bool, af_tensor *out, af_error *err) {
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    af_status st = check_dtype(n, in[0]->dtype, types, err);
    if (st != AF_OK) return st;
    af_tensor_set_type(&out[0], to_bool ? AF_DTYPE_BOOL : in[0]->dtype, in[0]->rank,
                       in[0]->dims);
    return AF_OK;
}

/* ---- unary ops ---------------------------------------------------------------------------- */

af_status shape_unary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    const ew_unop *op = unop_find(n->op);
    AF_ASSERT(op);
    return shape_like_input(n, in, op->types, op->to_bool, out, err);
}

static void unary_params(const af_node *n, ew_params *p) {
    memset(p, 0, sizeof *p);
    switch (n->op) {
    case AF_OP_LEAKY_RELU: p->alpha = af_attr_float(n, "alpha", 0.01f); break;
    case AF_OP_ELU: case AF_OP_CELU: p->alpha = af_attr_float(n, "alpha", 1.0f); break;
    case AF_OP_THRESHOLDED_RELU: p->alpha = af_attr_float(n, "alpha", 1.0f); break;
    case AF_OP_SELU:
        p->alpha = af_attr_float(n, "alpha", 1.67326319217681884765625f);
        p->gamma = af_attr_float(n, "gamma", 1.05070102214813232421875f);
        break;
    case AF_OP_HARD_SIGMOID:
        p->alpha = af_attr_float(n, "alpha", 0.2f);
        p->beta = af_attr_float(n, "beta", 0.5f);
        break;
    case AF_OP_SHRINK:
        p->alpha = af_attr_float(n, "lambd", 0.5f);
        p->beta = af_attr_float(n, "bias", 0.0f);
        break;
    case AF_OP_IS_INF:
        p->detect_neg = af_attr_int(n, "detect_negative", 1);
        p->detect_pos = af_attr_int(n, "detect_positive", 1);
        break;
    default: break;
    }
}

af_status ref_unary(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)x;
    const ew_unop *op = unop_find(n->op);
    AF_ASSERT(op);
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    const af_tensor *a = in[0];
    af_status st = check_dtype(n, a->dtype, op->types, err);
    if (st == AF_OK) st = prepare_out(n, &out[0], err);
    if (st == AF_OK) st = check_data(n, a, err);
    if (st != AF_OK) return st;
    int64_t count = af_tensor_numel(a);
    if (af_tensor_numel(&out[0]) != count)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output size differs from the input's");

    ew_params p;
    unary_params(n, &p);
    ew_dom dom = dom_of(a->dtype);
    if ((dom == EW_DOM_I && !op->i) || (dom == EW_DOM_U && !op->u)) dom = EW_DOM_F;
    for (int64_t k = 0; k < count; k++) {
        switch (dom) {
        case EW_DOM_F: {
            double v = af_tensor_get_double(a, k);
            put_f(&out[0], k, op->fp ? op->fp(v, &p) : op->f(v));
            break;
        }
        case EW_DOM_I: put_i(&out[0], k, op->i(get_i(a, k))); break;
        case EW_DOM_U: put_u(&out[0], k, op->u(get_u(a, k))); break;
        default: AF_ASSERT(!"dtype checked above");
        }
    }
    return AF_OK;
}

/* ---- Clip --------------------------------------------------------------------------------- */

af_status shape_clip(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    return shape_like_input(n, in, T_NUM, false, out, err);
}

/* Bounds: attributes before opset 11, optional scalar inputs from 11; an absent bound clips
 * nothing. y = min(max(x, lo), hi): NaN stays NaN and min > max gives max, as numpy's clip. */
af_status ref_clip(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                  af_error *err) {
    (void)x;
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    const af_tensor *a = in[0];
    const af_tensor *lo = n->nin > 1 ? in[1] : NULL, *hi = n->nin > 2 ? in[2] : NULL;
    bool attrs = af_graph_opset(n->graph) < 11;
    af_status st = check_dtype(n, a->dtype, attrs ? T_F : T_NUM, err);
    if (st == AF_OK) st = prepare_out(n, &out[0], err);
    if (st == AF_OK) st = check_data(n, a, err);
    if (st == AF_OK && !attrs && lo) st = check_scalar(n, lo, "min", err);
    if (st == AF_OK && !attrs && hi) st = check_scalar(n, hi, "max", err);
    if (st != AF_OK) return st;
    int64_t count = af_tensor_numel(a);
    if (af_tensor_numel(&out[0]) != count)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output size differs from the input's");

    switch (dom_of(a->dtype)) {
    case EW_DOM_F: {
        double l = -INFINITY, h = INFINITY;
        if (attrs) {
            l = af_attr_float(n, "min", -INFINITY);
            h = af_attr_float(n, "max", INFINITY);
        } else {
            if (lo) l = af_tensor_get_double(lo, 0);
            if (hi) h = af_tensor_get_double(hi, 0);
        }
        for (int64_t k = 0; k < count; k++) {
            double v = af_tensor_get_double(a, k);
            v = v < l ? l : v;
            put_f(&out[0], k, v > h ? h : v);
        }
        break;
    }
    case EW_DOM_I: {
        int64_t l = lo ? get_i(lo, 0) : INT64_MIN, h = hi ? get_i(hi, 0) : INT64_MAX;
        for (int64_t k = 0; k < count; k++) {
            int64_t v = get_i(a, k);
            v = v < l ? l : v;
            put_i(&out[0], k, v > h ? h : v);
        }
        break;
    }
    case EW_DOM_U: {
        uint64_t l = lo ? get_u(lo, 0) : 0, h = hi ? get_u(hi, 0) : UINT64_MAX;
        for (int64_t k = 0; k < count; k++) {
            uint64_t v = get_u(a, k);
            v = v < l ? l : v;
            put_u(&out[0], k, v > h ? h : v);
        }
        break;
    }
    default: AF_ASSERT(!"dtype checked above");
    }
    return AF_OK;
}

/* ---- binary and variadic ops -------------------------------------------------------------- */

/* Inputs all present and, except Pow's exponent, of one dtype the op accepts. */
static af_status check_binary_inputs(const af_node *n, const ew_binop *op,
                                     const af_tensor *const *in, af_error *err) {
    int need = is_variadic(n->op) ? 1 : 2;
    if (n->nin < need || (!is_variadic(n->op) && n->nin != 2))
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "wrong number of inputs (%d)", n->nin);
    for (int k = 0; k < n->nin; k++) {
        if (!in[k]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input %d missing", k);
        af_dtype t = in[k]->dtype, t0 = in[0]->dtype;
        af_status st = check_dtype(n, t, op->types, err);
        if (st != AF_OK) return st;
        if (n->op != AF_OP_POW && t != t0 && t != AF_DTYPE_UNDEFINED && t0 != AF_DTYPE_UNDEFINED)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "inputs differ in dtype (%s, %s)",
                                af_dtype_name(t0), af_dtype_name(t));
    }
    return AF_OK;
}

/* The op's scalar functions as this node's attributes select them. */
static af_status binop_pick(const af_node *n, af_dtype t, ew_binop *op, af_error *err) {
    const ew_binop *row = binop_find(n->op);
    AF_ASSERT(row);
    *op = *row;
    if (n->op == AF_OP_MOD && af_attr_int(n, "fmod", 0) != 0) {
        op->i = i_fmod;
    } else if (n->op == AF_OP_MOD && tclass(t) == T_F) {
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "fmod must be 1 for float inputs");
    } else if (n->op == AF_OP_BIT_SHIFT) {
        const char *dir = af_attr_str(n, "direction", "");
        if (strcmp(dir, "RIGHT") == 0)
            op->u = u_shr;
        else if (strcmp(dir, "LEFT") != 0)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "direction must be LEFT or RIGHT");
    }
    return AF_OK;
}

af_status shape_binary(const af_node *n, const af_tensor *const *in, af_tensor *out,
                          af_error *err) {
    ew_binop op;
    af_status st = binop_pick(n, n->nin > 0 && in[0] ? in[0]->dtype : AF_DTYPE_UNDEFINED, &op,
                              err);
    if (st == AF_OK) st = check_binary_inputs(n, &op, in, err);
    if (st != AF_OK) return st;
    af_tensor acc = {0}, second;
    af_tensor_type_copy(&acc, in[0]);
    if (n->nin >= 2) st = legacy_view(n, in[0], in[1], &second, err);
    if (st == AF_OK && n->nin >= 2) st = broadcast_into(n, &acc, &second, err);
    for (int k = 2; st == AF_OK && k < n->nin; k++) st = broadcast_into(n, &acc, in[k], err);
    if (st != AF_OK) return st;
    /* PRelu broadcasts the slope to x, never the other way. */
    if (n->op == AF_OP_PRELU && acc.rank >= 0 && in[0]->rank >= 0) {
        bool same = acc.rank == in[0]->rank;
        for (int d = 0; same && d < acc.rank; d++)
            same = in[0]->dims[d] < 0 || acc.dims[d] == in[0]->dims[d];
        if (!same)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "slope does not broadcast to x");
        af_tensor_type_copy(&acc, in[0]);
    }
    af_tensor_set_type(&out[0], op.to_bool ? AF_DTYPE_BOOL : in[0]->dtype, acc.rank, acc.dims);
    return AF_OK;
}

/* out = f(a, b) with a and b broadcast to out, computed in domain dom. */
static void apply2(const ew_binop *op, ew_dom dom, const af_tensor *a, const af_tensor *b,
                   af_tensor *out) {
    const af_tensor *ins[2] = {a, b};
    ew_iter it;
    iter_init(&it, out, ins, 2);
    int64_t count = af_tensor_numel(out);
    for (int64_t k = 0; k < count; k++, iter_next(&it)) {
        int64_t ia = it.off[0], ib = it.off[1];
        switch (dom) {
        case EW_DOM_F: put_f(out, k, op->f(af_tensor_get_double(a, ia), af_tensor_get_double(b, ib))); break;
        case EW_DOM_I: put_i(out, k, op->i(get_i(a, ia), get_i(b, ib))); break;
        case EW_DOM_U: put_u(out, k, op->u(get_u(a, ia), get_u(b, ib))); break;
        default: AF_ASSERT(!"dtype checked by the caller");
        }
    }
}

/* out = a broadcast to out's shape (a variadic op of one input). */
static void assign(ew_dom dom, const af_tensor *a, af_tensor *out) {
    ew_iter it;
    iter_init(&it, out, &a, 1);
    int64_t count = af_tensor_numel(out);
    for (int64_t k = 0; k < count; k++, iter_next(&it)) {
        switch (dom) {
        case EW_DOM_F: put_f(out, k, af_tensor_get_double(a, it.off[0])); break;
        case EW_DOM_I: put_i(out, k, get_i(a, it.off[0])); break;
        case EW_DOM_U: put_u(out, k, get_u(a, it.off[0])); break;
        default: AF_ASSERT(!"dtype checked by the caller");
        }
    }
}

/* Binary ops compute f(in0, in1); variadic ops fold f left to right over their inputs into the
 * output, which already has the broadcast shape of them all. */
af_status ref_binary(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                    af_error *err) {
    (void)x;
    ew_binop op;
    af_status st = binop_pick(n, n->nin > 0 && in[0] ? in[0]->dtype : AF_DTYPE_UNDEFINED, &op,
                              err);
    if (st == AF_OK) st = check_binary_inputs(n, &op, in, err);
    if (st == AF_OK) st = prepare_out(n, &out[0], err);
    if (st != AF_OK) return st;

    af_tensor second; /* in[1] as opset < 7 broadcasting reads it */
    if (n->nin >= 2) st = legacy_view(n, in[0], in[1], &second, err);
    for (int k = 0; st == AF_OK && k < n->nin; k++)
        st = check_input(n, k == 1 ? &second : in[k], &out[0], err);
    if (st != AF_OK) return st;

    /* Pow may mix a float with an integer: then it computes in double. */
    ew_dom dom = dom_of(in[0]->dtype);
    if (n->nin == 2 && dom_of(in[1]->dtype) == EW_DOM_F) dom = EW_DOM_F;
    if ((dom == EW_DOM_F && !op.f) || (dom == EW_DOM_I && !op.i) || (dom == EW_DOM_U && !op.u))
        return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "not defined for dtype %s",
                            af_dtype_name(in[0]->dtype));

    if (n->nin == 1) {
        assign(dom, in[0], &out[0]);
    } else {
        apply2(&op, dom, in[0], &second, &out[0]);
        for (int k = 2; k < n->nin; k++) apply2(&op, dom, &out[0], in[k], &out[0]);
    }
    if (n->op == AF_OP_MEAN) {
        int64_t count = af_tensor_numel(&out[0]);
        for (int64_t k = 0; k < count; k++) put_f(&out[0], k, af_tensor_get_double(&out[0], k) / n->nin);
    }
    return AF_OK;
}

/* ---- Where -------------------------------------------------------------------------------- */

static af_status check_where_inputs(const af_node *n, const af_tensor *const *in, af_error *err) {
    if (n->nin != 3 || !in[0] || !in[1] || !in[2])
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "needs condition, x and y");
    af_status st = check_dtype(n, in[0]->dtype, T_B, err);
    if (st == AF_OK) st = check_dtype(n, in[1]->dtype, T_ALL, err);
    if (st != AF_OK) return st;
    if (in[1]->dtype != in[2]->dtype && in[1]->dtype != AF_DTYPE_UNDEFINED &&
        in[2]->dtype != AF_DTYPE_UNDEFINED)
        return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "x and y differ in dtype");
    return AF_OK;
}

af_status shape_where(const af_node *n, const af_tensor *const *in, af_tensor *out,
                         af_error *err) {
    af_status st = check_where_inputs(n, in, err);
    if (st != AF_OK) return st;
    af_tensor acc = {0};
    af_tensor_type_copy(&acc, in[0]);
    st = broadcast_into(n, &acc, in[1], err);
    if (st == AF_OK) st = broadcast_into(n, &acc, in[2], err);
    if (st == AF_OK) af_tensor_set_type(&out[0], in[1]->dtype, acc.rank, acc.dims);
    return st;
}

/* Copies whole elements, so it is exact for every fixed-size dtype. */
af_status ref_where(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                   af_error *err) {
    (void)x;
    af_status st = check_where_inputs(n, in, err);
    if (st == AF_OK) st = prepare_out(n, &out[0], err);
    for (int k = 0; st == AF_OK && k < 3; k++) st = check_input(n, in[k], &out[0], err);
    if (st != AF_OK) return st;
    if (out[0].dtype != in[1]->dtype)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output dtype differs from x's");

    size_t size = af_dtype_size(out[0].dtype);
    const uint8_t *cond = in[0]->data;
    const char *xs = in[1]->data, *ys = in[2]->data;
    char *dst = out[0].data;
    ew_iter it;
    iter_init(&it, &out[0], in, 3);
    int64_t count = af_tensor_numel(&out[0]);
    for (int64_t k = 0; k < count; k++, iter_next(&it)) {
        const char *src = cond[it.off[0]] ? xs + (size_t)it.off[1] * size
                                          : ys + (size_t)it.off[2] * size;
        memcpy(dst + (size_t)k * size, src, size);
    }
    return AF_OK;
}

/* ---- Cast and CastLike -------------------------------------------------------------------- */

/* The target dtype: Cast's `to`, CastLike's second input. */
static af_status cast_target(const af_node *n, const af_tensor *const *in, af_dtype *to,
                             af_error *err) {
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    if (n->op == AF_OP_CAST_LIKE) {
        if (n->nin < 2 || !in[1])
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "target_type input missing");
        *to = in[1]->dtype;
    } else {
        int64_t v = af_attr_int(n, "to", 0);
        if (v <= AF_DTYPE_UNDEFINED || v > AF_DTYPE_BFLOAT16)
            return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "missing or bad 'to' attribute");
        *to = (af_dtype)v;
    }
    af_status st = check_dtype(n, in[0]->dtype, T_ALL, err);
    if (st == AF_OK) st = check_dtype(n, *to, T_ALL, err);
    return st;
}

af_status shape_cast(const af_node *n, const af_tensor *const *in, af_tensor *out,
                        af_error *err) {
    af_dtype to = AF_DTYPE_UNDEFINED;
    af_status st = cast_target(n, in, &to, err);
    if (st != AF_OK) return st;
    af_tensor_set_type(&out[0], to, in[0]->rank, in[0]->dims);
    return AF_OK;
}

/* Reads in the source's domain and stores converted: float to integer truncates toward zero
 * (saturating), to bool tests != 0, to float16/bfloat16 rounds to nearest even. */
af_status ref_cast(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                  af_error *err) {
    (void)x;
    af_dtype to = AF_DTYPE_UNDEFINED;
    af_status st = cast_target(n, in, &to, err);
    if (st == AF_OK) st = prepare_out(n, &out[0], err);
    if (st == AF_OK) st = check_data(n, in[0], err);
    if (st != AF_OK) return st;
    const af_tensor *a = in[0];
    int64_t count = af_tensor_numel(a);
    if (af_tensor_numel(&out[0]) != count || out[0].dtype != to)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output type differs from the cast's");
    if (a->dtype == to) {
        if (count > 0) memcpy(out[0].data, a->data, (size_t)count * af_dtype_size(to));
        return AF_OK;
    }
    ew_dom dom = dom_of(a->dtype);
    for (int64_t k = 0; k < count; k++) {
        switch (dom) {
        case EW_DOM_F: put_f(&out[0], k, af_tensor_get_double(a, k)); break;
        case EW_DOM_I: put_i(&out[0], k, get_i(a, k)); break;
        case EW_DOM_U: put_u(&out[0], k, get_u(a, k)); break;
        default: AF_ASSERT(!"dtype checked above");
        }
    }
    return AF_OK;
}

/* ---- Identity and Dropout ----------------------------------------------------------------- */

af_status shape_identity(const af_node *n, const af_tensor *const *in, af_tensor *out,
                            af_error *err) {
    return shape_like_input(n, in, T_ALL, false, out, err);
}

/* out[0] = in[0], byte for byte. */
static af_status copy_input(const af_node *n, const af_tensor *a, af_tensor *out, af_error *err) {
    af_status st = check_dtype(n, a->dtype, T_ALL, err);
    if (st == AF_OK) st = prepare_out(n, out, err);
    if (st == AF_OK) st = check_data(n, a, err);
    if (st != AF_OK) return st;
    int64_t count = af_tensor_numel(a);
    if (af_tensor_numel(out) != count || out->dtype != a->dtype)
        return af_node_fail(err, n, AF_ERR_INTERNAL, "output type differs from the input's");
    if (count > 0) memcpy(out->data, a->data, (size_t)count * af_dtype_size(a->dtype));
    return AF_OK;
}

af_status ref_identity(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                      af_error *err) {
    (void)x;
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    return copy_input(n, in[0], &out[0], err);
}

/* The mask is bool from opset 10, the data's dtype before. */
af_status shape_dropout(const af_node *n, const af_tensor *const *in, af_tensor *out,
                           af_error *err) {
    af_status st = shape_like_input(n, in, T_F, false, out, err);
    if (st != AF_OK) return st;
    if (n->nout > 1) {
        af_dtype mask = af_graph_opset(n->graph) >= 10 ? AF_DTYPE_BOOL : in[0]->dtype;
        af_tensor_set_type(&out[1], mask, in[0]->rank, in[0]->dims);
    }
    return AF_OK;
}

/* Inference is a copy with an all-true mask. Training mode (opset 12's third input) drops at
 * random, which a reference executor cannot reproduce, except with ratio 0 where it is the
 * same copy. The mask is written only when the runtime allocated it (the output is used). */
af_status ref_dropout(const af_node *n, const af_tensor *const *in, af_tensor *out, af_exec *x,
                     af_error *err) {
    (void)x;
    if (n->nin < 1 || !in[0]) return af_node_fail(err, n, AF_ERR_INVALID_MODEL, "input missing");
    const af_tensor *ratio = n->nin > 1 ? in[1] : NULL, *training = n->nin > 2 ? in[2] : NULL;
    af_status st = AF_OK;
    if (training) {
        st = check_scalar(n, training, "training_mode", err);
        if (st == AF_OK && ratio) st = check_scalar(n, ratio, "ratio", err);
        if (st != AF_OK) return st;
        double r = ratio ? af_tensor_get_double(ratio, 0) : 0.5;
        if (get_u(training, 0) && r != 0)
            return af_node_fail(err, n, AF_ERR_UNSUPPORTED, "training mode with ratio %g", r);
    }
    st = copy_input(n, in[0], &out[0], err);
    if (st != AF_OK || n->nout < 2 || !out[1].data) return st;
    st = check_data(n, &out[1], err);
    if (st != AF_OK) return st;
    int64_t count = af_tensor_numel(&out[1]);
    for (int64_t k = 0; k < count; k++) {
        if (dom_of(out[1].dtype) == EW_DOM_F)
            put_f(&out[1], k, 1.0);
        else
            put_u(&out[1], k, 1);
    }
    return AF_OK;
}
