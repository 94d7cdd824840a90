/* Elementwise kernel tests, table-driven: each row builds one node (op, attributes, opset), runs
 * its shape function and reference kernel on small tensors, and checks the status and, on
 * success, the output dtype, dims and values (NaN must match NaN). A second group checks shape
 * inference with unknown dims, as at compile time. A third runs the fast broadcast kernels
 * (kernels/fast/broadcast.c) against the reference bit for bit, on every ISA, at 1 and 2 threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/fast/fast.h"
#include "kernels/ref/ref.h"
#include "kernels/simd/cpu.h"
#include "runtime/exec.h"

#define TENS_MAXV 24
#include "test_util.h"

#define F16 AF_DTYPE_FLOAT16
#define BF16 AF_DTYPE_BFLOAT16
#define I8 AF_DTYPE_INT8
#define I16 AF_DTYPE_INT16
#define U8 AF_DTYPE_UINT8
#define U16 AF_DTYPE_UINT16
#define U32 AF_DTYPE_UINT32
#define U64 AF_DTYPE_UINT64
#define INF INFINITY

static const tcase cases[] = {
    /* unary math on floats */
    {"relu keeps nan", "Relu", "", 14, 1, {T1(F32, 4, -1, 0, 2, NAN)}, AF_OK,
     T1(F32, 4, 0, 0, 2, NAN)},
    {"round half to even", "Round", "", 11, 1,
     {T1(F32, 8, 0.5, 1.5, 2.5, -0.5, -1.5, 2.6, -2.6, INF)}, AF_OK,
     T1(F32, 8, 0, 2, 2, 0, -2, 3, -3, INF)},
    {"sign float", "Sign", "", 13, 1, {T1(F32, 4, -3, 0, 2, NAN)}, AF_OK,
     T1(F32, 4, -1, 0, 1, NAN)},
    {"leaky relu alpha", "LeakyRelu", "alpha=0.1", 16, 1, {T1(F32, 2, -2, 3)}, AF_OK,
     T1(F32, 2, -0.2, 3)},
    {"elu default", "Elu", "", 13, 1, {T1(F32, 2, -1, 1)}, AF_OK,
     T1(F32, 2, -0.6321205588285577, 1)},
    {"selu default", "Selu", "", 13, 1, {T1(F32, 2, -1, 2)}, AF_OK,
     T1(F32, 2, -1.1113307378125625, 2.1014019747)},
    {"hard sigmoid", "HardSigmoid", "alpha=0.5 beta=0.6", 13, 1, {T1(F32, 3, -3, 0, 1)}, AF_OK,
     T1(F32, 3, 0, 0.6, 1)},
    {"hard swish", "HardSwish", "", 14, 1, {T1(F32, 4, -4, 0, 1, 4)}, AF_OK,
     T1(F32, 4, 0, 0, 0.6666666666666666, 4)},
    {"softplus stable", "Softplus", "", 13, 1, {T1(F32, 3, -1000, 0, 1000)}, AF_OK,
     T1(F32, 3, 0, 0.6931471805599453, 1000)},
    {"sigmoid stable", "Sigmoid", "", 13, 1, {T1(F32, 3, -1000, 0, 1000)}, AF_OK,
     T1(F32, 3, 0, 0.5, 1)},
    {"thresholded relu", "ThresholdedRelu", "alpha=2.0", 10, 1, {T1(F32, 3, 1, 2, 3)}, AF_OK,
     T1(F32, 3, 0, 0, 3)},
    {"shrink", "Shrink", "lambd=1.5 bias=1.5", 9, 1, {T1(F32, 5, -2, -1, 0, 1, 2)}, AF_OK,
     T1(F32, 5, -0.5, 0, 0, 0, 0.5)},
    {"shrink int8 computes in double", "Shrink", "lambd=1.0 bias=1.0", 9, 1,
     {T1(I8, 3, -5, 1, 5)}, AF_OK, T1(I8, 3, -4, 0, 4)},
    {"celu alpha", "Celu", "alpha=2.0", 12, 1, {T1(F32, 2, -2, 3)}, AF_OK,
     T1(F32, 2, -1.2642411176571153, 3)},
    {"mish", "Mish", "", 17, 1, {T1(F32, 2, 0, 1)}, AF_OK, T1(F32, 2, 0, 0.8650983882673103)},
    {"erf", "Erf", "", 13, 1, {T1(F32, 2, 0, 1)}, AF_OK, T1(F32, 2, 0, 0.8427007929497149)},
    {"exp double", "Exp", "", 13, 1, {T1(F64, 2, 0, 1)}, AF_OK,
     T1(F64, 2, 1, 2.718281828459045)},
    {"abs float16", "Abs", "", 13, 1, {T1(F16, 2, -1.5, 2)}, AF_OK, T1(F16, 2, 1.5, 2)},
    {"isnan", "IsNaN", "", 13, 1, {T1(F32, 3, 1, NAN, INF)}, AF_OK, T1(BOOL, 3, 0, 1, 0)},
    {"isinf positive only", "IsInf", "detect_negative=0", 10, 1, {T1(F32, 4, -INF, INF, NAN, 1)},
     AF_OK, T1(BOOL, 4, 0, 1, 0, 0)},

    /* unary ops on integers and bool */
    {"abs int8 wraps at min", "Abs", "", 13, 1, {T1(I8, 3, -128, -5, 7)}, AF_OK,
     T1(I8, 3, -128, 5, 7)},
    {"abs int64 min", "Abs", "", 13, 1, {T1(I64, 1, I64MIN)}, AF_OK, T1(I64, 1, I64MIN)},
    {"neg int32", "Neg", "", 13, 1, {T1(I32, 3, 5, -7, 0)}, AF_OK, T1(I32, 3, -5, 7, 0)},
    {"sign int64", "Sign", "", 13, 1, {T1(I64, 3, -9, 0, 9)}, AF_OK, T1(I64, 3, -1, 0, 1)},
    {"sign uint8", "Sign", "", 13, 1, {T1(U8, 2, 0, 200)}, AF_OK, T1(U8, 2, 0, 1)},
    {"relu int32", "Relu", "", 14, 1, {T1(I32, 2, -3, 4)}, AF_OK, T1(I32, 2, 0, 4)},
    {"not", "Not", "", 13, 1, {T1(BOOL, 2, 1, 0)}, AF_OK, T1(BOOL, 2, 0, 1)},
    {"bitwise not uint8", "BitwiseNot", "", 18, 1, {T1(U8, 2, 0, 240)}, AF_OK,
     T1(U8, 2, 255, 15)},
    {"neg uint8 undefined", "Neg", "", 13, 1, {T1(U8, 1, 1)}, AF_ERR_UNSUPPORTED, NONE},
    {"exp int32 undefined", "Exp", "", 13, 1, {T1(I32, 1, 1)}, AF_ERR_UNSUPPORTED, NONE},
    {"not on float", "Not", "", 13, 1, {T1(F32, 1, 1)}, AF_ERR_UNSUPPORTED, NONE},

    /* Clip: inputs from opset 11, attributes before */
    {"clip inputs", "Clip", "", 13, 3, {T1(F32, 4, -2, 0.5, 2, NAN), T0(F32, -1), T0(F32, 1)},
     AF_OK, T1(F32, 4, -1, 0.5, 1, NAN)},
    {"clip int8 min only", "Clip", "", 13, 2, {T1(I8, 3, -100, 5, 100), T0(I8, 0)}, AF_OK,
     T1(I8, 3, 0, 5, 100)},
    {"clip uint16 max only", "Clip", "", 13, 3, {T1(U16, 2, 3, 300), NONE, T0(U16, 10)}, AF_OK,
     T1(U16, 2, 3, 10)},
    {"clip min above max gives max", "Clip", "", 13, 3, {T1(F32, 2, 0, 5), T0(F32, 2),
     T0(F32, 1)}, AF_OK, T1(F32, 2, 1, 1)},
    {"clip attributes", "Clip", "min=-0.5 max=0.5", 10, 1, {T1(F32, 3, -1, 0.25, 1)}, AF_OK,
     T1(F32, 3, -0.5, 0.25, 0.5)},
    {"clip bound not scalar", "Clip", "", 13, 2, {T1(F32, 2, 1, 2), T1(F32, 2, 0, 0)},
     AF_ERR_INVALID_MODEL, NONE},

    /* broadcasting arithmetic */
    {"add row", "Add", "", 14, 2, {T2(F32, 2, 3, 1, 2, 3, 4, 5, 6), T1(F32, 3, 10, 20, 30)},
     AF_OK, T2(F32, 2, 3, 11, 22, 33, 14, 25, 36)},
    {"add both sides", "Add", "", 14, 2, {T2(F32, 2, 1, 1, 2), T2(F32, 1, 3, 10, 20, 30)},
     AF_OK, T2(F32, 2, 3, 11, 21, 31, 12, 22, 32)},
    {"add scalar", "Add", "", 14, 2, {T0(F32, 1), T1(F32, 2, 2, 3)}, AF_OK,
     T1(F32, 2, 3, 4)},
    {"add int8 wraps", "Add", "", 14, 2, {T1(I8, 2, 127, -128), T1(I8, 2, 1, -1)}, AF_OK,
     T1(I8, 2, -128, 127)},
    {"add uint8 wraps", "Add", "", 14, 2, {T1(U8, 1, 250), T1(U8, 1, 10)}, AF_OK,
     T1(U8, 1, 4)},
    {"sub uint32 wraps", "Sub", "", 14, 2, {T1(U32, 1, 0), T1(U32, 1, 1)}, AF_OK,
     T1(U32, 1, 4294967295.0)},
    {"mul int64", "Mul", "", 14, 2, {T1(I64, 2, -3, 4), T0(I64, 5)}, AF_OK,
     T1(I64, 2, -15, 20)},
    {"div int32 truncates, x/0 is 0", "Div", "", 14, 2, {T1(I32, 4, -7, 7, 7, 5),
     T1(I32, 4, 2, -2, 0, 5)}, AF_OK, T1(I32, 4, -3, -3, 0, 1)},
    {"div int64 min by -1 wraps", "Div", "", 14, 2, {T1(I64, 1, I64MIN), T1(I64, 1, -1)}, AF_OK,
     T1(I64, 1, I64MIN)},
    {"div uint8", "Div", "", 14, 2, {T1(U8, 2, 16, 6), T1(U8, 2, 11, 0)}, AF_OK,
     T1(U8, 2, 1, 0)},
    {"div float by zero", "Div", "", 14, 2, {T1(F32, 3, 1, -1, 0), T0(F32, 0)}, AF_OK,
     T1(F32, 3, INF, -INF, NAN)},
    {"mod int8 sign of divisor", "Mod", "", 13, 2, {T1(I8, 6, -4, 7, 5, 4, -7, 8),
     T1(I8, 6, 2, -3, 8, -2, 3, 5)}, AF_OK, T1(I8, 6, 0, -2, 5, 0, 2, 3)},
    {"mod int64 fmod", "Mod", "fmod=1", 13, 2, {T1(I64, 6, -4, 7, 5, 4, -7, 8),
     T1(I64, 6, 2, -3, 8, -2, 3, 5)}, AF_OK, T1(I64, 6, 0, 1, 5, 0, -1, 3)},
    {"mod float fmod", "Mod", "fmod=1", 13, 2, {T1(F32, 2, -4.5, 7.5), T1(F32, 2, 2, -3)}, AF_OK,
     T1(F32, 2, -0.5, 1.5)},
    {"mod uint16 by zero", "Mod", "", 13, 2, {T1(U16, 2, 7, 7), T1(U16, 2, 4, 0)}, AF_OK,
     T1(U16, 2, 3, 0)},
    {"mod float needs fmod", "Mod", "", 13, 2, {T1(F32, 1, 1), T1(F32, 1, 2)},
     AF_ERR_INVALID_MODEL, NONE},
    {"pow float by int64", "Pow", "", 15, 2, {T1(F32, 2, 2, 4), T1(I64, 2, 3, -1)}, AF_OK,
     T1(F32, 2, 8, 0.25)},
    {"pow int32 by float truncates", "Pow", "", 15, 2, {T1(I32, 2, 2, 4), T1(F32, 2, 0.5, 2)},
     AF_OK, T1(I32, 2, 1, 16)},
    {"pow int64 exact", "Pow", "", 15, 2, {T1(I64, 4, 2, -3, 5, 2), T1(I64, 4, 62, 3, 0, -1)},
     AF_OK, T1(I64, 4, 4611686018427387904.0, -27, 1, 0)},
    {"prelu per channel", "PRelu", "", 16, 2, {T3(F32, 1, 2, 2, -1, 2, -3, 4),
     T2(F32, 2, 1, 0.5, 0.25)}, AF_OK, T3(F32, 1, 2, 2, -0.5, 2, -0.75, 4)},
    {"prelu int32", "PRelu", "", 16, 2, {T1(I32, 2, -4, 4), T0(I32, 3)}, AF_OK,
     T1(I32, 2, -12, 4)},
    {"prelu slope larger than x", "PRelu", "", 16, 2, {T1(F32, 2, 1, 2), T2(F32, 2, 2, 1, 1, 1, 1)},
     AF_ERR_INVALID_MODEL, NONE},
    {"shapes that do not broadcast", "Add", "", 14, 2, {T2(F32, 2, 3, 0), T1(F32, 4, 0)},
     AF_ERR_INVALID_MODEL, NONE},
    {"mixed dtypes", "Add", "", 14, 2, {T1(I32, 1, 1), T1(F32, 1, 1)}, AF_ERR_INVALID_MODEL,
     NONE},

    /* bit operations */
    {"shift left uint8", "BitShift", "direction=LEFT", 11, 2, {T1(U8, 3, 1, 255, 1),
     T1(U8, 3, 3, 1, 8)}, AF_OK, T1(U8, 3, 8, 254, 0)},
    {"shift right uint64 past width", "BitShift", "direction=RIGHT", 11, 2,
     {T1(U64, 3, 16, 4, 1), T1(U64, 3, 1, 2, 70)}, AF_OK, T1(U64, 3, 8, 1, 0)},
    {"shift direction", "BitShift", "direction=UP", 11, 2, {T1(U8, 1, 1), T1(U8, 1, 1)},
     AF_ERR_INVALID_MODEL, NONE},
    {"shift signed", "BitShift", "direction=LEFT", 11, 2, {T1(I32, 1, 1), T1(I32, 1, 1)},
     AF_ERR_UNSUPPORTED, NONE},
    {"bitwise and int32", "BitwiseAnd", "", 18, 2, {T1(I32, 2, 12, -1), T1(I32, 2, 10, 5)},
     AF_OK, T1(I32, 2, 8, 5)},
    {"bitwise xor uint8", "BitwiseXor", "", 18, 2, {T1(U8, 1, 255), T1(U8, 1, 15)}, AF_OK,
     T1(U8, 1, 240)},

    /* comparisons and logic */
    {"equal float nan", "Equal", "", 13, 2, {T1(F32, 3, 1, NAN, 2), T1(F32, 3, 1, NAN, 3)},
     AF_OK, T1(BOOL, 3, 1, 0, 0)},
    {"equal bool broadcast", "Equal", "", 13, 2, {T2(BOOL, 2, 2, 1, 0, 0, 1), T1(BOOL, 2, 1, 0)},
     AF_OK, T2(BOOL, 2, 2, 1, 1, 0, 0)},
    {"less int64 broadcast", "Less", "", 13, 2, {T2(I64, 2, 1, -5, 5), T1(I64, 2, 0, 10)},
     AF_OK, T2(BOOL, 2, 2, 1, 1, 0, 1)},
    {"greater or equal uint64", "GreaterOrEqual", "", 16, 2, {T1(U64, 2, 3, 2), T0(U64, 3)},
     AF_OK, T1(BOOL, 2, 1, 0)},
    {"and broadcast", "And", "", 7, 2, {T2(BOOL, 2, 2, 1, 1, 0, 1), T1(BOOL, 2, 1, 0)}, AF_OK,
     T2(BOOL, 2, 2, 1, 0, 0, 0)},
    {"xor", "Xor", "", 7, 2, {T1(BOOL, 4, 0, 0, 1, 1), T1(BOOL, 4, 0, 1, 0, 1)}, AF_OK,
     T1(BOOL, 4, 0, 1, 1, 0)},
    {"or on int", "Or", "", 7, 2, {T1(I32, 1, 1), T1(I32, 1, 1)}, AF_ERR_UNSUPPORTED, NONE},

    /* variadic */
    {"max nan propagates", "Max", "", 13, 2, {T1(F32, 3, 1, NAN, 3), T1(F32, 3, 2, 0, NAN)},
     AF_OK, T1(F32, 3, 2, NAN, NAN)},
    {"min int16", "Min", "", 13, 2, {T1(I16, 2, -300, 7), T1(I16, 2, 5, -2)}, AF_OK,
     T1(I16, 2, -300, -2)},
    {"max three broadcast", "Max", "", 13, 3, {T1(F32, 3, 1, 5, 3), T2(F32, 2, 1, 2, 4),
     T0(F32, 3)}, AF_OK, T2(F32, 2, 3, 3, 5, 3, 4, 5, 4)},
    {"max one input", "Max", "", 13, 1, {T1(U8, 2, 7, 9)}, AF_OK, T1(U8, 2, 7, 9)},
    {"max float16", "Max", "", 13, 2, {T1(F16, 2, 0.5, -2), T1(F16, 2, 0.25, 8)}, AF_OK,
     T1(F16, 2, 0.5, 8)},
    {"sum three", "Sum", "", 13, 3, {T1(F32, 2, 1, 2), T0(F32, 10), T2(F32, 2, 1, 100, 200)},
     AF_OK, T2(F32, 2, 2, 111, 112, 211, 212)},
    {"mean three", "Mean", "", 13, 3, {T1(F32, 3, 3, 0, 2), T1(F32, 3, 1, 3, 4),
     T1(F32, 3, 2, 6, 6)}, AF_OK, T1(F32, 3, 2, 3, 4)},
    {"mean int32", "Mean", "", 13, 2, {T1(I32, 1, 1), T1(I32, 1, 1)}, AF_ERR_UNSUPPORTED,
     NONE},

    /* Where */
    {"where broadcast", "Where", "", 16, 3, {T2(BOOL, 2, 1, 1, 0), T2(I64, 1, 3, 1, 2, 3),
     T0(I64, -1)}, AF_OK, T2(I64, 2, 3, 1, 2, 3, -1, -1, -1)},
    {"where float16", "Where", "", 16, 3, {T1(BOOL, 2, 0, 1), T1(F16, 2, 1, 2),
     T1(F16, 2, 3, 4)}, AF_OK, T1(F16, 2, 3, 2)},
    {"where float condition", "Where", "", 16, 3, {T1(F32, 1, 1), T1(F32, 1, 1), T1(F32, 1, 1)},
     AF_ERR_UNSUPPORTED, NONE},
    {"where x and y differ", "Where", "", 16, 3, {T1(BOOL, 1, 1), T1(F32, 1, 1), T1(I32, 1, 1)},
     AF_ERR_INVALID_MODEL, NONE},

    /* Cast and CastLike */
    {"cast float to int32 truncates", "Cast", "to=6", 13, 1, {T1(F32, 4, -1.7, 2.9, NAN, -0.5)},
     AF_OK, T1(I32, 4, -1, 2, 0, 0)},
    {"cast float to int64 saturates", "Cast", "to=7", 13, 1, {T1(F32, 2, 1e20, -1e20)}, AF_OK,
     T1(I64, 2, 9223372036854775807.0, I64MIN)},
    {"cast float to uint8 wraps", "Cast", "to=2", 13, 1, {T1(F32, 2, 300, -1)}, AF_OK,
     T1(U8, 2, 44, 255)},
    {"cast float to bool", "Cast", "to=9", 13, 1, {T1(F32, 4, 0, -0.0, 2, NAN)}, AF_OK,
     T1(BOOL, 4, 0, 0, 1, 1)},
    {"cast bool to float", "Cast", "to=1", 13, 1, {T1(BOOL, 2, 1, 0)}, AF_OK,
     T1(F32, 2, 1, 0)},
    {"cast int64 to float rounds once", "Cast", "to=1", 13, 1, {T1(I64, 1, 16777217)}, AF_OK,
     T1(F32, 1, 16777216)},
    {"cast float to float16", "Cast", "to=10", 13, 1, {T1(F32, 3, 0.333333333, 65504, 1e6)},
     AF_OK, T1(F16, 3, 0.333251953125, 65504, INF)},
    {"cast float to bfloat16 ties to even", "Cast", "to=16", 13, 1,
     {T1(F32, 2, 1.00390625, 1.01171875)}, AF_OK, T1(BF16, 2, 1, 1.015625)},
    {"cast uint64 to double", "Cast", "to=11", 13, 1, {T1(U64, 1, 9007199254740992.0)}, AF_OK,
     T1(F64, 1, 9007199254740992.0)},
    {"cast to string", "Cast", "to=8", 13, 1, {T1(F32, 1, 1)}, AF_ERR_UNSUPPORTED, NONE},
    {"cast without to", "Cast", "", 13, 1, {T1(F32, 1, 1)}, AF_ERR_INVALID_MODEL, NONE},
    {"castlike", "CastLike", "", 15, 2, {T1(F64, 2, -2.5, 7.9), T1(I16, 1, 0)}, AF_OK,
     T1(I16, 2, -2, 7)},

    /* Identity and Dropout */
    {"identity int64", "Identity", "", 16, 1, {T2(I64, 1, 2, -4, 9)}, AF_OK,
     T2(I64, 1, 2, -4, 9)},
    {"dropout inference mask", "Dropout", "ratio=0.3", 11, 1, {T1(F32, 2, 1, -2)}, AF_OK,
     T1(F32, 2, 1, -2), T1(BOOL, 2, 1, 1)},
    {"dropout opset 9 mask is T", "Dropout", "", 9, 1, {T1(F64, 2, 1, -2)}, AF_OK,
     T1(F64, 2, 1, -2), T1(F64, 2, 1, 1)},
    {"dropout training ratio 0", "Dropout", "", 13, 3, {T1(F32, 2, 1, -2), T0(F32, 0),
     T0(BOOL, 1)}, AF_OK, T1(F32, 2, 1, -2), T1(BOOL, 2, 1, 1)},
    {"dropout not training", "Dropout", "", 13, 3, {T1(F32, 2, 1, -2), T0(F32, 0.5),
     T0(BOOL, 0)}, AF_OK, T1(F32, 2, 1, -2)},
    {"dropout training", "Dropout", "", 13, 3, {T1(F32, 1, 1), T0(F32, 0.5), T0(BOOL, 1)},
     AF_ERR_UNSUPPORTED, NONE},
    {"dropout training default ratio", "Dropout", "", 13, 3, {T1(F32, 1, 1), NONE, T0(BOOL, 1)},
     AF_ERR_UNSUPPORTED, NONE},
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* A one-node graph for `op` at `opset` with attributes parsed from `attrs`. */
static af_node *make_node(af_arena *a, const char *op, const char *attrs, int opset, int nin,
                          int nout) {
    af_node *n = tu_node(a, af_op_lookup("", op), opset, nin, nout, 8);
    tu_attrs(a, n, attrs, 8, tu_parse_scalar);
    return n;
}

static void expect_tensor(const char *name, const af_tensor *got, const tens *want) {
    if (got->dtype != want->t) fail_msg("%s: dtype %d, expected %d", name, got->dtype, want->t);
    if (got->rank != want->rank) fail_msg("%s: rank %d, expected %d", name, got->rank, want->rank);
    for (int d = 0; d < want->rank; d++)
        if (got->dims[d] != want->dims[d]) fail_msg("%s: dim %d differs", name, d);
    for (int64_t i = 0; i < tens_numel(want); i++) {
        double g = tens_get(got, i), w = want->v[i];
        bool ok = isnan(w) ? isnan(g) : (g == w || fabs(g - w) <= 1e-6 * fmax(1.0, fabs(w)));
        if (!ok) fail_msg("%s: element %lld is %.17g, expected %.17g", name, (long long)i, g, w);
    }
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_cases(void **state) {
    (void)state;
    for (size_t c = 0; c < AF_COUNT(cases); c++) {
        const tcase *tc = &cases[c];
        int nout = tc->out2.t != AF_DTYPE_UNDEFINED ? 2 : 1;
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, tc->op, tc->attrs, tc->opset, tc->nin, nout);
        af_tensor *owned[3] = {NULL, NULL, NULL};
        const af_tensor *in[3] = {NULL, NULL, NULL};
        for (int k = 0; k < tc->nin; k++)
            if (tc->in[k].t != AF_DTYPE_UNDEFINED) in[k] = owned[k] = tens_make(&tc->in[k]);
        af_tensor out[2];
        memset(out, 0, sizeof out);
        out[0].rank = out[1].rank = -1;
        af_error err = {0};
        af_status st = tu_run(n, in, out, nout, &err);
        if (st != tc->expect)
            fail_msg("%s: status %d, expected %d (%s)", tc->name, st, tc->expect, err.message);
        if (st != AF_OK && !strstr(err.message, "'n0'"))
            fail_msg("%s: message does not name the node: %s", tc->name, err.message);
        for (int o = 0; st == AF_OK && o < nout; o++)
            expect_tensor(tc->name, &out[o], o ? &tc->out2 : &tc->out);
        for (int o = 0; o < 2; o++) af_tensor_release(&out[o]);
        for (int k = 0; k < 3; k++) af_tensor_free(owned[k]);
        af_arena_free(a);
    }
}

/* Compile time: dims may be -1 and ranks unknown; shape functions propagate, never fail. */
static void test_shapes_unknown(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    af_tensor x = {.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {-1, 3}};
    af_tensor row = {.dtype = AF_DTYPE_FLOAT, .rank = 1, .dims = {3}};
    af_tensor col = {.dtype = AF_DTYPE_FLOAT, .rank = 2, .dims = {4, 1}};
    af_tensor unk = {.dtype = AF_DTYPE_FLOAT, .rank = -1};
    af_tensor out[2];

    af_node *add = make_node(a, "Add", "", 14, 2, 1);
    const af_tensor *in1[2] = {&x, &row};
    assert_int_equal(shape_binary(add, in1, out, &err), AF_OK);
    assert_int_equal(out[0].rank, 2);
    assert_int_equal(out[0].dims[0], -1);
    assert_int_equal(out[0].dims[1], 3);

    const af_tensor *in2[2] = {&x, &col};
    assert_int_equal(shape_binary(add, in2, out, &err), AF_OK);
    assert_int_equal(out[0].dims[0], 4);
    assert_int_equal(out[0].dims[1], 3);

    const af_tensor *in3[2] = {&row, &unk};
    assert_int_equal(shape_binary(add, in3, out, &err), AF_OK);
    assert_int_equal(out[0].rank, -1);

    af_node *less = make_node(a, "Less", "", 13, 2, 1);
    assert_int_equal(shape_binary(less, in1, out, &err), AF_OK);
    assert_int_equal(out[0].dtype, AF_DTYPE_BOOL);

    af_node *cast = make_node(a, "Cast", "to=7", 13, 1, 1);
    const af_tensor *in4[1] = {&x};
    assert_int_equal(shape_cast(cast, in4, out, &err), AF_OK);
    assert_int_equal(out[0].dtype, AF_DTYPE_INT64);
    assert_int_equal(out[0].dims[0], -1);

    af_node *drop = make_node(a, "Dropout", "", 13, 1, 2);
    assert_int_equal(shape_dropout(drop, in4, out, &err), AF_OK);
    assert_int_equal(out[1].dtype, AF_DTYPE_BOOL);
    assert_int_equal(out[1].dims[1], 3);

    /* A Clip bound whose value is unknown at compile time does not stop inference. */
    af_tensor lo = {.dtype = AF_DTYPE_FLOAT, .rank = 0};
    af_node *clip = make_node(a, "Clip", "", 13, 2, 1);
    const af_tensor *in5[2] = {&x, &lo};
    assert_int_equal(shape_clip(clip, in5, out, &err), AF_OK);
    assert_int_equal(out[0].dims[1], 3);
    af_arena_free(a);
}

/* Opset < 7 broadcasting: B aligned at `axis`, PRelu slopes per channel. */
static void test_legacy_broadcast(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    tens xs = T3(F32, 2, 3, 1, 1, 2, 3, 4, 5, 6), bs = T1(F32, 3, 10, 20, 30);
    af_tensor *x = tens_make(&xs), *b = tens_make(&bs);
    const af_tensor *in[2] = {x, b};
    af_tensor out[1];

    af_node *add = make_node(a, "Add", "broadcast=1 axis=1", 6, 2, 1);
    memset(out, 0, sizeof out);
    assert_int_equal(shape_binary(add, in, out, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(&out[0], &err), AF_OK);
    assert_int_equal(ref_binary(add, in, out, NULL, &err), AF_OK);
    tens want = T3(F32, 2, 3, 1, 11, 22, 33, 14, 25, 36);
    expect_tensor("legacy add", &out[0], &want);
    af_tensor_release(&out[0]);

    af_node *prelu = make_node(a, "PRelu", "", 6, 2, 1);
    tens ns = T3(F32, 1, 3, 1, -1, -1, -1);
    af_tensor *neg = tens_make(&ns);
    const af_tensor *pin[2] = {neg, b};
    memset(out, 0, sizeof out);
    assert_int_equal(shape_binary(prelu, pin, out, &err), AF_OK);
    assert_int_equal(af_tensor_alloc(&out[0], &err), AF_OK);
    assert_int_equal(ref_binary(prelu, pin, out, NULL, &err), AF_OK);
    tens pwant = T3(F32, 1, 3, 1, -10, -20, -30);
    expect_tensor("legacy prelu", &out[0], &pwant);
    af_tensor_release(&out[0]);

    af_tensor_free(neg);
    af_tensor_free(x);
    af_tensor_free(b);
    af_arena_free(a);
}

/* A kernel handed tensors that disagree with its output (a runtime bug or a hostile caller)
 * fails instead of reading out of bounds. */
static void test_kernel_rejects_bad_buffers(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    tens xs = T1(F32, 4, 1, 2, 3, 4), ys = T1(F32, 3, 1, 2, 3);
    af_tensor *x = tens_make(&xs), *y = tens_make(&ys);
    af_node *add = make_node(a, "Add", "", 14, 2, 1);
    const af_tensor *in[2] = {x, y};
    af_tensor out[1];
    memset(out, 0, sizeof out);
    int64_t dims[1] = {4};
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, 1, dims);
    assert_int_equal(af_tensor_alloc(&out[0], &err), AF_OK);
    assert_int_equal(ref_binary(add, in, out, NULL, &err), AF_ERR_RUNTIME);

    x->nbytes = 8; /* claims 4 floats, holds 2 */
    in[1] = x;
    assert_int_equal(ref_binary(add, in, out, NULL, &err), AF_ERR_INTERNAL);
    x->nbytes = 16;
    af_tensor_release(&out[0]);
    af_tensor_free(x);
    af_tensor_free(y);
    af_arena_free(a);
}

/* ---- the fast broadcast kernels against the reference ------------------------------------- */

typedef struct bc_shape {
    af_dtype t;
    int rank;
    int64_t dims[4];
} bc_shape;

typedef struct bc_case {
    const char *op, *attrs;
    int nin;
    bc_shape in[3];
    af_kernel_fn fast; /* must take the case (not AF_DECLINED) */
} bc_case;

/* Random values with repeats (so comparisons see equal operands), NaN, and -0; bools 0, 1, 2. */
static void bc_fill(af_tensor *t, bool positive) {
    for (int64_t i = 0; i < af_tensor_numel(t); i++) {
        double r = tu_rnd();
        if (t->dtype == AF_DTYPE_BOOL) {
            ((uint8_t *)t->data)[i] = (uint8_t)((r + 1.0) * 1.5);
            continue;
        }
        double v = i % 5 == 1 ? (double)(int)(r * 3.0) : r * 4.0;
        if (i % 23 == 7) v = NAN;
        if (i % 29 == 3) v = -0.0;
        if (positive && v < 0) v = -v;
        tens_set(t, i, v);
    }
}

/* Run node n on the fast kernel (directly, one thread: it must take the case) and through the
 * dispatcher on 1 and 2 threads, on every ISA; each output must equal the reference's bytes. */
static void bc_check(const bc_case *c, af_runtime *rt) {
    af_arena *a = af_arena_new();
    af_node *n = make_node(a, c->op, c->attrs, 17, c->nin, 1);
    af_tensor *x[3] = {NULL, NULL, NULL};
    const af_tensor *in[3];
    for (int k = 0; k < c->nin; k++) {
        in[k] = x[k] = af_tensor_new(c->in[k].t, c->in[k].rank, c->in[k].dims);
        assert_non_null(x[k]);
        bc_fill(x[k], strcmp(c->op, "Pow") == 0 && k == 0);
    }
    af_error err = {0};
    af_tensor want, got;
    memset(&want, 0, sizeof want);
    af_isa best = af_isa_best();
    af_isa_set(AF_ISA_REFERENCE);
    if (tu_run(n, in, &want, 1, &err) != AF_OK) fail_msg("%s: reference: %s", c->op, err.message);
    size_t bytes = (size_t)af_tensor_numel(&want) * af_dtype_size(want.dtype);
    for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++)
        for (int way = 0; way < 3; way++) {
            af_isa_set((af_isa)isa);
            memset(&got, 0, sizeof got);
            af_status st = af_kernel_shape(n, in, &got, &err);
            if (st == AF_OK) st = af_tensor_alloc(&got, &err);
            if (st == AF_OK && way == 0) {
                af_exec ex;
                af_exec_init(&ex, NULL, NULL);
                st = c->fast(n, in, &got, &ex, &err);
                af_exec_release(&ex);
            } else if (st == AF_OK) {
                st = af_runtime_kernel(way == 2 ? rt : NULL, n, in, &got, &err);
            }
            if (st != AF_OK) fail_msg("%s (%s) on %s: status %d", c->op, c->attrs,
                                      af_isa_name(af_isa_get()), st);
            assert_int_equal(got.dtype, want.dtype);
            assert_int_equal(got.rank, want.rank);
            if (memcmp(got.data, want.data, bytes)) {
                for (size_t b = 0; b < bytes; b++)
                    if (((uint8_t *)got.data)[b] != ((uint8_t *)want.data)[b]) {
                        print_error("element %zu: %g, expected %g\n", b / af_dtype_size(want.dtype),
                                    tens_get(&got, (int64_t)(b / af_dtype_size(want.dtype))),
                                    tens_get(&want, (int64_t)(b / af_dtype_size(want.dtype))));
                        break;
                    }
                fail_msg("%s (%s) on %s, %s: differs from the reference", c->op, c->attrs,
                         af_isa_name(af_isa_get()), way == 0 ? "fast kernel" : way == 1 ? "1 thread" : "2 threads");
            }
            af_tensor_release(&got);
        }
    af_isa_set(best);
    af_tensor_release(&want);
    for (int k = 0; k < c->nin; k++) af_tensor_free(x[k]);
    af_arena_free(a);
}

#define S0(t) {t, 0, {0}}
#define S1(t, a) {t, 1, {a}}
#define S2(t, a, b) {t, 2, {a, b}}
#define S3(t, a, b, c) {t, 3, {a, b, c}}
#define S4(t, a, b, c, d) {t, 4, {a, b, c, d}}

static void test_broadcast_fast(void **state) {
    (void)state;
    static const bc_case cases[] = {
        /* the audio CNN's Max(x, constant), threaded */
        {"Max", "", 2, {S4(F32, 1, 32, 40, 100), S0(F32)}, fast_variadic},
        {"Max", "", 2, {S0(F32), S4(F32, 2, 3, 5, 7)}, fast_variadic},       /* scalar first */
        {"Min", "", 2, {S4(F32, 2, 3, 5, 7), S3(F32, 3, 1, 1)}, fast_variadic}, /* per channel */
        {"Max", "", 2, {S3(F32, 5, 1, 7), S2(F32, 3, 1)}, fast_variadic},    /* both broadcast */
        {"Min", "", 2, {S2(F32, 6, 1), S2(F32, 1, 13)}, fast_variadic},      /* outer product */
        {"Max", "", 3, {S3(F32, 2, 3, 9), S1(F32, 9), S3(F32, 2, 1, 1)}, fast_variadic},
        {"Min", "", 1, {S2(F32, 3, 17)}, fast_variadic},
        {"Sum", "", 3, {S2(F32, 4, 33), S2(F32, 4, 1), S0(F32)}, fast_variadic},
        {"Mean", "", 3, {S2(F32, 4, 33), S1(F32, 33), S2(F32, 4, 33)}, fast_variadic},
        {"Mean", "", 2, {S1(F32, 70000), S1(F32, 70000)}, fast_variadic}, /* rows cut in pieces */
        {"Max", "", 2, {S3(F32, 3, 1, 40000), S3(F32, 1, 2, 1)}, fast_variadic},
        /* broadcasts the vector epilogue cannot read, Pow, Mod */
        {"Add", "", 2, {S3(F32, 4, 1, 9), S2(F32, 6, 1)}, fast_binary},
        {"Sub", "", 2, {S2(F32, 7, 1), S3(F32, 2, 1, 33)}, fast_binary},
        {"Div", "", 2, {S3(F32, 3, 1, 5), S3(F32, 3, 4, 5)}, fast_binary},
        {"Mul", "", 2, {S4(F32, 2, 1, 3, 1), S4(F32, 1, 5, 1, 6)}, fast_binary},
        {"Pow", "", 2, {S2(F32, 3, 17), S1(F32, 17)}, fast_binary},
        {"Pow", "", 2, {S2(F32, 3, 17), S0(F32)}, fast_binary},
        {"Mod", "fmod=1", 2, {S2(F32, 5, 11), S2(F32, 5, 1)}, fast_binary},
        /* PRelu: a slope per channel of NCHW (rows walked), a full one, a scalar, per column
         * (the vector epilogue's) */
        {"PRelu", "", 2, {S4(F32, 2, 5, 7, 9), S3(F32, 5, 1, 1)}, fast_binary},
        {"PRelu", "", 2, {S3(F32, 3, 4, 21), S3(F32, 3, 4, 21)}, fast_binary},
        {"PRelu", "", 2, {S3(F32, 3, 4, 21), S0(F32)}, fast_binary},
        {"PRelu", "", 2, {S2(F32, 6, 19), S1(F32, 19)}, fast_binary},
        /* comparisons into bool */
        {"Equal", "", 2, {S3(F32, 2, 3, 19), S1(F32, 19)}, fast_compare},
        {"Less", "", 2, {S3(F32, 2, 3, 19), S0(F32)}, fast_compare},
        {"Greater", "", 2, {S2(F32, 3, 1), S2(F32, 1, 21)}, fast_compare},
        {"LessOrEqual", "", 2, {S2(F32, 4, 37), S2(F32, 4, 37)}, fast_compare},
        {"GreaterOrEqual", "", 2, {S0(F32), S3(F32, 3, 2, 11)}, fast_compare},
        /* bool ops: operands 0, 1, 2 (true when nonzero) */
        {"And", "", 2, {S2(BOOL, 5, 13), S1(BOOL, 13)}, fast_logical},
        {"Or", "", 2, {S2(BOOL, 5, 1), S2(BOOL, 1, 13)}, fast_logical},
        {"Xor", "", 2, {S3(BOOL, 2, 5, 13), S0(BOOL)}, fast_logical},
        {"Not", "", 1, {S3(BOOL, 2, 5, 13)}, fast_not},
        /* Where of 4-, 8-, 1- and 2-byte elements */
        {"Where", "", 3, {S3(BOOL, 2, 1, 9), S2(F32, 3, 9), S0(F32)}, fast_where},
        {"Where", "", 3, {S2(BOOL, 4, 1), S2(I64, 1, 7), S2(I64, 4, 7)}, fast_where},
        {"Where", "", 3, {S1(BOOL, 31), S1(BOOL, 31), S1(BOOL, 1)}, fast_where},
        {"Where", "", 3, {S2(BOOL, 3, 5), S2(F16, 3, 5), S1(F16, 5)}, fast_where},
        /* Cast: float32 to and from half (threaded, and a vector tail), to float32 from
         * bfloat16, double, integers and bool; the same dtype */
        {"Cast", "to=10", 1, {S2(F32, 3, 70001)}, fast_cast},
        {"Cast", "to=1", 1, {S2(F16, 5, 37)}, fast_cast},
        {"Cast", "to=1", 1, {S1(F16, 70001)}, fast_cast},
        {"Cast", "to=1", 1, {S2(BF16, 3, 33)}, fast_cast},
        {"Cast", "to=1", 1, {S2(F64, 3, 33)}, fast_cast},
        {"Cast", "to=1", 1, {S2(I64, 3, 33)}, fast_cast},
        {"Cast", "to=1", 1, {S2(I32, 3, 33)}, fast_cast},
        {"Cast", "to=1", 1, {S2(U8, 3, 33)}, fast_cast},
        {"Cast", "to=1", 1, {S2(BOOL, 3, 33)}, fast_cast},
        {"Cast", "to=7", 1, {S2(I64, 3, 33)}, fast_cast},
    };
    af_runtime *rt = NULL;
    af_error err;
    assert_int_equal(af_runtime_new(2, &rt, &err), AF_OK);
    tu_rng = 16;
    for (size_t c = 0; c < AF_COUNT(cases); c++) bc_check(&cases[c], rt);
    af_runtime_free(rt);
}

/* Cast to half at the edges of its range, bit for bit with the reference on every ISA: overflow
 * to infinity, the largest half, ties to even, half denormals, underflow to zero, NaN; and the
 * pairs it leaves to the reference (float to integer saturates, to bfloat16). */
static void test_cast_half_edges(void **state) {
    (void)state;
    static const float v[] = {65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 1.00048828125f,
                              1.000732421875f, 5.96e-8f, 2.98e-8f, 1e-10f, -0.0f, 6.1e-5f,
                              (float)NAN, (float)INFINITY, 3.14159f, -2.71828f, 0.333333f};
    af_arena *a = af_arena_new();
    af_node *n = make_node(a, "Cast", "to=10", 17, 1, 1);
    int64_t len = 16 * 3 + 1; /* vectors and a tail */
    af_tensor *x = af_tensor_new(F32, 1, &len);
    for (int64_t i = 0; i < len; i++) ((float *)x->data)[i] = v[i % AF_COUNT(v)];
    const af_tensor *in[1] = {x};
    af_error err;
    af_tensor want, got;
    memset(&want, 0, sizeof want);
    af_isa best = af_isa_best();
    af_isa_set(AF_ISA_REFERENCE);
    assert_int_equal(tu_run(n, in, &want, 1, &err), AF_OK);
    for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
        af_isa_set((af_isa)isa);
        memset(&got, 0, sizeof got);
        assert_int_equal(tu_run(n, in, &got, 1, &err), AF_OK);
        for (int64_t i = 0; i < len; i++)
            if (((uint16_t *)got.data)[i] != ((uint16_t *)want.data)[i])
                fail_msg("%s: %g to half gives 0x%04x, the reference 0x%04x", af_isa_name((af_isa)isa),
                         (double)v[i % AF_COUNT(v)], ((uint16_t *)got.data)[i], ((uint16_t *)want.data)[i]);
        af_tensor_release(&got);
    }
    af_isa_set(best);
    assert_true(fast_cast_takes(F32, F16) && fast_cast_takes(I64, F32) && fast_cast_takes(U8, U8));
    assert_false(fast_cast_takes(F32, I64) || fast_cast_takes(F32, BF16) || fast_cast_takes(I64, I32));
    af_tensor_release(&want);
    af_tensor_free(x);
    af_arena_free(a);
}

/* The unary ops with a vector function (fast_unary) against the reference, on every ISA:
 * halves and their neighbours (Round's ties to even, Floor and Ceil at integers), zeros of both
 * signs, NaN, infinities, values from 2^22 to 2^24 (where floats stop having fractions), floats
 * near multiples of pi/2 and a random sweep. Rounding ops exactly (a zero's sign aside); the
 * others within 2e-6 relative, but sin and cos only in [-1, 1] beyond 2^25. */
static void test_unary_fast(void **state) {
    (void)state;
    static const struct {
        const char *op, *attrs;
        bool exact;
        float accurate_to; /* beyond it (if not 0) only |y| <= 1 is asked for: sin and cos */
    } ops[] = {{"Floor", "", true}, {"Ceil", "", true}, {"Round", "", true}, {"Sign", "", true},
               {"Abs", "", true}, {"Neg", "", true}, {"Softsign", "", false}, {"Mish", "", false},
               {"Softplus", "", false}, {"Exp", "", false}, {"Erf", "", false}, {"Log", "", false},
               {"Selu", "", false}, {"Selu", "alpha=1.5 gamma=0.75", false}, {"Celu", "", false},
               {"Celu", "alpha=2.5", false}, {"Sin", "", false, 0x1p25f}, {"Cos", "", false, 0x1p25f}};
    enum { N = 4096 };
    int64_t dims[1] = {N};
    af_tensor *x = af_tensor_new(F32, 1, dims);
    assert_non_null(x);
    float *v = x->data;
    static const float special[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, NAN, INF, -INF,
                                    4194304.5f, -4194304.5f, 8388607.5f, -8388607.5f, 8388608.0f,
                                    16777215.0f, 1e30f, -1e30f, 0.49999997f, -0.49999997f, 1e-30f,
                                    1e-40f, 0x1p-149f, 1.00000012f, 0.99999994f, 252.898209f,
                                    -105032.867f, 33554430.0f, 33554432.0f, 1.5707964f};
    for (int i = 0; i < N; i++) {
        if (i < (int)AF_COUNT(special)) v[i] = special[i];
        else if (i < 1024) v[i] = (float)(i - 512) * 0.25f + (i % 3 - 1) * 1e-6f; /* halves, near */
        else v[i] = (float)(tu_rnd() * 40.0);
    }
    const af_tensor *in[1] = {x};
    af_isa best = af_isa_best();
    for (size_t o = 0; o < AF_COUNT(ops); o++) {
        af_arena *a = af_arena_new();
        af_node *n = make_node(a, ops[o].op, ops[o].attrs, 18, 1, 1);
        af_error err = {0};
        af_tensor want, got;
        memset(&want, 0, sizeof want);
        af_isa_set(AF_ISA_REFERENCE);
        if (tu_run(n, in, &want, 1, &err) != AF_OK) fail_msg("%s: reference: %s", ops[o].op, err.message);
        for (int isa = AF_ISA_GENERIC; isa <= (int)best; isa++) {
            af_isa_set((af_isa)isa);
            memset(&got, 0, sizeof got);
            assert_int_equal(af_kernel_shape(n, in, &got, &err), AF_OK);
            assert_int_equal(af_tensor_alloc(&got, &err), AF_OK);
            af_exec ex;
            af_exec_init(&ex, NULL, NULL);
            if (fast_unary(n, in, &got, &ex, &err) != AF_OK) fail_msg("%s: the fast kernel declined", ops[o].op);
            af_exec_release(&ex);
            const float *g = got.data, *w = want.data;
            for (int i = 0; i < N; i++) {
                bool ok = g[i] == w[i] || (isnan(g[i]) && isnan(w[i])) ||
                          (!ops[o].exact && fabs((double)g[i] - w[i]) <= 2e-6 * fabs((double)w[i]) + 1e-30) ||
                          (ops[o].accurate_to && fabsf(v[i]) > ops[o].accurate_to && fabsf(g[i]) <= 1.0f);
                if (!ok)
                    fail_msg("%s on %s: %s(%.9g) = %.9g, the reference %.9g", ops[o].op,
                             af_isa_name((af_isa)isa), ops[o].op, (double)v[i], (double)g[i], (double)w[i]);
            }
            af_tensor_release(&got);
        }
        af_isa_set(best);
        af_tensor_release(&want);
        af_arena_free(a);
    }
    af_tensor_free(x);
}

/* What the fast broadcast kernels do not take they leave to the reference, which reports it:
 * shapes that do not broadcast, a short buffer, legacy broadcasting, an int Max. */
static void test_broadcast_fast_declines(void **state) {
    (void)state;
    af_arena *a = af_arena_new();
    af_error err;
    tens xs = T1(F32, 4, 1, 2, 3, 4), ys = T1(F32, 3, 1, 2, 3), is = T1(I64, 2, 1, 2);
    af_tensor *x = tens_make(&xs), *y = tens_make(&ys), *iv = tens_make(&is);
    af_tensor out[1];
    memset(out, 0, sizeof out);
    int64_t dims[1] = {4};
    af_tensor_set_type(&out[0], AF_DTYPE_FLOAT, 1, dims);
    assert_int_equal(af_tensor_alloc(&out[0], &err), AF_OK);
    af_exec ex;
    af_exec_init(&ex, NULL, NULL);
    af_node *mx = make_node(a, "Max", "", 13, 2, 1);
    const af_tensor *in[2] = {x, y};
    assert_int_equal(fast_variadic(mx, in, out, &ex, &err), AF_DECLINED);
    assert_int_equal(af_runtime_kernel(NULL, mx, in, out, &err), AF_ERR_RUNTIME);
    af_node *pw = make_node(a, "Pow", "", 13, 2, 1);
    assert_int_equal(fast_binary(pw, in, out, &ex, &err), AF_DECLINED);
    x->nbytes = 8; /* claims 4 floats, holds 2 */
    const af_tensor *in2[2] = {x, x};
    assert_int_equal(fast_variadic(mx, in2, out, &ex, &err), AF_DECLINED);
    assert_int_equal(fast_binary(pw, in2, out, &ex, &err), AF_DECLINED);
    x->nbytes = 16;
    af_node *old = make_node(a, "Max", "", 6, 2, 1);
    assert_int_equal(fast_variadic(old, in2, out, &ex, &err), AF_DECLINED);
    const af_tensor *in3[2] = {iv, iv};
    assert_int_equal(fast_variadic(mx, in3, out, &ex, &err), AF_DECLINED);
    af_node *eq = make_node(a, "Equal", "", 13, 2, 1);
    assert_int_equal(fast_compare(eq, in2, out, &ex, &err), AF_DECLINED); /* output not bool */
    af_exec_release(&ex);
    af_tensor_release(&out[0]);
    af_tensor_free(x);
    af_tensor_free(y);
    af_tensor_free(iv);
    af_arena_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_shapes_unknown),
        cmocka_unit_test(test_legacy_broadcast),
        cmocka_unit_test(test_kernel_rejects_bad_buffers),
        cmocka_unit_test(test_broadcast_fast),
        cmocka_unit_test(test_broadcast_fast_declines),
        cmocka_unit_test(test_cast_half_edges),
        cmocka_unit_test(test_unary_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
