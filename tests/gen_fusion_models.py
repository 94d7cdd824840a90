#!/usr/bin/python3
"""Models for tests/test_fusion.c (the fusion engine and its built-in rules).

    /usr/bin/python3 tests/gen_fusion_models.py OUT_DIR

Writes OUT_DIR/NAME.onnx, small graphs built node by node with onnx.helper in the canonical
forms the fusion stage sees (LayerNormalization, and Gelu/Silu of the ai.autofusion domain):
  - per rule a positive case (ConvBNRelu with residual, depthwise/dilated, every activation;
    MatMul/Gemm + bias + act, 2-D and batched; LayerNorm feeding two MatMuls and a residual;
    ConvPoolFc over Flatten/Gemm and Reshape/MatMul; SqueezeExcite; elementwise chains);
  - near misses: an intermediate with a second consumer, an intermediate that is a graph output,
    weights that are graph inputs, an operand whose broadcast does not fit, float64;
  - quantized (QDQ) graphs for the int8 rule, q_*: QuantizeLinear -> DequantizeLinear around
    the input of a Conv/MatMul/Gemm whose weights are DequantizeLinear of int8/uint8 constants
    (per tensor and per channel), through MaxPool and Concat; and its near misses nm_q_*
    (weights a graph input, per-channel zero points, shifted weights out of int8 range, Q/DQ
    parameters that differ). These go through the whole optimizer (canonicalize makes the
    fake quantizations), not af_fuse alone;
  - bn_identity: Conv + BatchNorm + Relu blocks whose BN parameters (and one conv weight) come
    through Identity nodes, as torch writes initializers it deduplicated (a freshly initialised
    torchvision model): the unfused graph (--no_fusion) must fold them and run on fast kernels.

Invariant: deterministic (fixed seed); shapes fully known; only float32 except the dtype case.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
OURS = "ai.autofusion"
rng = np.random.default_rng(1234)


class G:
    """A graph under construction."""

    def __init__(self, dtype=np.float32):
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.n = 0
        self.dtype = dtype
        self.elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT

    def name(self, hint):
        self.n += 1
        return f"{hint}{self.n}"

    def const(self, shape, hint="w", scale=0.5, positive=False, value=None):
        if value is None:
            value = rng.standard_normal(shape) * scale
            if positive:
                value = np.abs(value) + 0.5
        arr = np.asarray(value, dtype=self.dtype)
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, values, hint="shape"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, self.elem, shape))
        return name

    def output(self, name):
        self.outputs.append(helper.make_tensor_value_info(name, self.elem, None))

    def op(self, op_type, inputs, name=None, domain="", **attrs):
        out = self.name(op_type.lower() + "_out")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name or self.name(op_type),
                                           domain=domain, **attrs))
        return out

    def bn(self, x, c):
        return self.op("BatchNormalization", [x, self.const([c], "gamma", positive=True),
                                              self.const([c], "beta"), self.const([c], "mean"),
                                              self.const([c], "var", positive=True)],
                       epsilon=1e-3)

    def save(self, path):
        graph = helper.make_graph(self.nodes, os.path.basename(path), self.inputs, self.outputs,
                                  self.inits)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(OURS, 1),
                  helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="gen_fusion_models")
        onnx.save(model, path)


def act(g, kind, x):
    """One activation node of the given kind."""
    if kind == "Clip":
        return g.op("Clip", [x, g.const([], "lo", value=0.0), g.const([], "hi", value=6.0)])
    if kind == "LeakyRelu":
        return g.op("LeakyRelu", [x], alpha=0.1)
    if kind == "HardSigmoid":
        return g.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
    if kind == "Elu":
        return g.op("Elu", [x], alpha=0.7)
    if kind in ("Gelu", "Silu"):
        return g.op(kind, [x], domain=OURS)
    if kind == "GeluTanh":
        return g.op("Gelu", [x], domain=OURS, approximate="tanh")
    return g.op(kind, [x])


def conv(g, x, cin, cout, k=3, bias=True, **attrs):
    w = g.const([cout, cin // attrs.get("group", 1), k, k])
    ins = [x, w] + ([g.const([cout], "b")] if bias else [])
    attrs.setdefault("pads", [k // 2] * 4)
    return g.op("Conv", ins, **attrs)


def models():
    m = {}

    g = G()  # Conv + BN + Relu
    y = g.op("Relu", [g.bn(conv(g, g.input("x", [1, 3, 8, 8]), 3, 4, name="conv0"), 4)])
    g.output(y)
    m["conv_bn_relu"] = g

    g = G()  # the residual block: Conv + BN + Add(x) + Relu
    x = g.input("x", [2, 4, 6, 6])
    y = g.op("Relu", [g.op("Add", [g.bn(conv(g, x, 4, 4, bias=False), 4), x])])
    g.output(y)
    m["conv_bn_add_relu"] = g

    g = G()  # Conv + BN + PRelu with a per-channel slope (face models), then a residual block
    x = g.input("x", [1, 3, 8, 8])
    y = g.op("PRelu", [g.bn(conv(g, x, 3, 6, name="conv0"), 6), g.const([6, 1, 1], "slope")])
    y = g.op("PRelu", [g.op("Add", [conv(g, y, 6, 6, bias=False), y]), g.const([1], "slope1")])
    g.output(y)
    m["conv_bn_prelu"] = g

    g = G()  # depthwise, dilated, strided, with BN and Relu6
    x = g.input("x", [1, 4, 9, 9])
    y = act(g, "Clip", g.bn(conv(g, x, 4, 4, group=4, dilations=[2, 2], strides=[2, 2],
                                 pads=[2, 2, 2, 2]), 4))
    g.output(y)
    m["conv_dw_dilated"] = g

    g = G()  # ConvTranspose (2 groups, stride 2, output_padding) + BN + Relu: W [C, M/group, k, k]
    x = g.input("x", [1, 4, 5, 6])
    c = g.op("ConvTranspose", [x, g.const([4, 3, 3, 3]), g.const([6], "b")], name="convt0",
             group=2, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 0])
    g.output(g.op("Relu", [g.bn(c, 6)]))
    m["convt_bn_relu"] = g

    g = G()  # 1-D ConvTranspose (a vocoder's upsampling) + BN + residual Add + LeakyRelu
    x = g.input("x", [2, 4, 7])
    c = g.op("ConvTranspose", [x, g.const([4, 5, 4])], name="convt1d", strides=[2],
             pads=[1, 1])
    y = g.op("LeakyRelu", [g.op("Add", [g.bn(c, 5), g.input("r", [2, 5, 14])])], alpha=0.1)
    g.output(y)
    m["convt_bn_add_act_1d"] = g

    g = G()  # every activation after a conv (no BN)
    kinds = ["LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Silu", "Gelu",
             "GeluTanh", "Relu", "Clip"]
    y = g.input("x", [1, 3, 5, 5])
    cin = 3
    for kind in kinds:
        y = act(g, kind, conv(g, y, cin, 4))
        cin = 4
    g.output(y)
    m["conv_acts"] = g

    g = G()  # MatMul + bias + Relu, 2-D
    y = g.op("Relu", [g.op("Add", [g.op("MatMul", [g.input("x", [4, 16]), g.const([16, 8])]),
                                   g.const([8], "b")])])
    g.output(y)
    m["matmul_bias_relu"] = g

    g = G()  # batched A (torch's Linear on 3-D input) + bias written first + Gelu
    y = act(g, "Gelu", g.op("Add", [g.const([32], "b"),
                                    g.op("MatMul", [g.input("x", [2, 5, 16]), g.const([16, 32])])]))
    g.output(y)
    m["matmul_bias_gelu_3d"] = g

    g = G()  # Gemm with transB, alpha, beta, C, then Sigmoid
    y = g.op("Sigmoid", [g.op("Gemm", [g.input("a", [4, 16]), g.const([8, 16]), g.const([8], "c")],
                              transB=1, alpha=0.5, beta=2.0)])
    g.output(y)
    m["gemm_sigmoid"] = g

    g = G()  # MatMul + a [M, N] addend (epilogue Add, not the bias input)
    y = g.op("Add", [g.op("MatMul", [g.input("x", [3, 8]), g.input("w", [8, 5])]),
                     g.input("r", [3, 5])])
    g.output(y)
    m["matmul_add_residual"] = g

    g = G()  # LayerNorm feeding two MatMuls (one with bias + Relu) and a residual Add
    x = g.input("x", [2, 5, 16])
    ln = g.op("LayerNormalization", [x, g.const([16], "s", positive=True), g.const([16], "lb")],
              axis=-1, epsilon=1e-5)
    y1 = g.op("Relu", [g.op("Add", [g.op("MatMul", [ln, g.const([16, 24])]), g.const([24], "b")])])
    y2 = g.op("MatMul", [ln, g.const([16, 16])])
    y3 = g.op("Add", [ln, x])
    for y in (y1, y2, y3):
        g.output(y)
    m["layernorm_matmul"] = g

    g = G()  # LayerNorm read by one Gemm only: the LayerNorm disappears
    ln = g.op("LayerNormalization", [g.input("x", [6, 16]), g.const([16], "s", positive=True)],
              epsilon=1e-5)
    g.output(g.op("Gemm", [ln, g.const([16, 4]), g.const([4], "c")]))
    m["layernorm_gemm"] = g

    g = G()  # RMSNorm feeding a MatMul + Relu (no bias: T5), a plain MatMul and a residual Add
    x = g.input("x", [2, 5, 16])
    rms = g.op("RMSNormalization", [x, g.const([16], "s", positive=True)], axis=-1, epsilon=1e-6)
    y1 = g.op("Relu", [g.op("MatMul", [rms, g.const([16, 24])])])
    y2 = g.op("MatMul", [rms, g.const([16, 16])])
    y3 = g.op("Add", [rms, x])
    for y in (y1, y2, y3):
        g.output(y)
    m["rmsnorm_matmul"] = g

    g = G()  # RMSNorm read by one Gemm, through a Transpose that keeps the last axis
    rms = g.op("RMSNormalization", [g.input("x", [3, 6, 16]), g.const([16], "s", positive=True)])
    t = g.op("Transpose", [rms], perm=[1, 0, 2])
    g.output(g.op("MatMul", [t, g.const([16, 4])]))
    m["rmsnorm_transpose_matmul"] = g

    g = G()  # classification head: Conv+BN+Relu, GAP, Flatten, Gemm(transB)
    x = g.input("x", [2, 3, 8, 8])
    f = g.op("Relu", [g.bn(conv(g, x, 3, 6), 6)])
    y = g.op("Gemm", [g.op("Flatten", [g.op("GlobalAveragePool", [f])]), g.const([10, 6]),
                      g.const([10], "c")], transB=1)
    g.output(y)
    m["conv_pool_fc"] = g

    g = G()  # head with a plain Conv, Reshape and MatMul
    x = g.input("x", [1, 3, 6, 6])
    shape = g.ints([1, 5])
    p = g.op("GlobalAveragePool", [conv(g, x, 3, 5)])
    y = g.op("MatMul", [g.op("Reshape", [p, shape]), g.const([5, 7])])
    g.output(y)
    m["conv_pool_matmul"] = g

    for name, a, gate in (("squeeze_excite", "Relu", "Sigmoid"),
                          ("squeeze_excite_hard", "Silu", "HardSigmoid")):
        g = G()
        x = g.input("x", [2, 8, 5, 5])
        s = g.op("GlobalAveragePool", [x])
        s = conv(g, s, 8, 2, k=1, pads=[0, 0, 0, 0])
        s = conv(g, act(g, a, s), 2, 8, k=1, pads=[0, 0, 0, 0])
        s = act(g, gate, s)
        g.output(g.op("Mul", [s, x]))
        m[name] = g

    g = G()  # a chain with no producer to join: one FusedElementwise
    x = g.input("x", [2, 3, 4])
    y = g.op("Add", [x, g.const([4], "c")])
    y = g.op("Mul", [y, g.const([3, 1], "d")])
    y = g.op("Sigmoid", [y])
    y = g.op("Sub", [g.const([], "e", value=1.5), y])
    y = g.op("Div", [y, g.const([1, 1, 4], "f", positive=True)])
    g.output(y)
    m["ew_chain"] = g

    g = G()  # Conv + Max(y, 0) + Min(y, 6): torch.maximum / minimum by constants, a Relu6
    y = g.op("Max", [conv(g, g.input("x", [1, 3, 7, 7]), 3, 4), g.const([], "lo", value=0.0)])
    y = g.op("Min", [y, g.const([1], "hi", value=[6.0])])
    g.output(y)
    m["conv_max_min"] = g

    g = G()  # MatMul + Mul(scalar) + Tanh: the elementwise rule lifts the MatMul
    y = g.op("Tanh", [g.op("Mul", [g.op("MatMul", [g.input("a", [3, 8]), g.const([8, 5])]),
                                   g.const([], "s", value=0.25)])])
    g.output(y)
    m["ew_matmul"] = g

    g = G()  # FusedConv (Conv+Relu) extended by a per-channel Mul and a Sigmoid
    x = g.input("x", [1, 3, 6, 6])
    y = g.op("Relu", [conv(g, x, 3, 4)])
    y = g.op("Sigmoid", [g.op("Mul", [y, g.const([4, 1, 1], "scale")])])
    g.output(y)
    m["ew_extend_conv"] = g

    g = G()  # rules reach into If branches
    x = g.input("x", [1, 3, 5, 5])
    cond = "cond"
    g.inputs.append(helper.make_tensor_value_info(cond, TensorProto.BOOL, []))
    w = g.const([3, 3, 3, 3])
    then_nodes = [helper.make_node("Conv", [x, w], ["t_conv"], name="then_conv", pads=[1] * 4),
                  helper.make_node("Relu", ["t_conv"], ["t_out"], name="then_relu")]
    else_nodes = [helper.make_node("Sigmoid", [x], ["e_out"], name="else_sigmoid")]
    out_info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 5, 5])
    then_g = helper.make_graph(then_nodes, "then", [], [out_info("t_out")])
    else_g = helper.make_graph(else_nodes, "else", [], [out_info("e_out")])
    g.nodes.append(helper.make_node("If", [cond], ["y"], name="if", then_branch=then_g,
                                    else_branch=else_g))
    g.output("y")
    m["if_subgraph"] = g

    g = G()  # count_include_pad average pooling as torch writes it: Pad + AveragePool
    x = g.input("x", [1, 3, 8, 8])
    pd = g.op("Pad", [x, g.ints([0, 0, 1, 1, 0, 0, 1, 1], "pads"), g.const([], "zero", value=0.0)])
    g.output(g.op("AveragePool", [pd], name="avg_padded", kernel_shape=[3, 3]))
    m["pad_avgpool"] = g

    g = G()  # an asymmetric "SAME" 1-D conv: Pad + Conv + Relu
    x = g.input("x", [2, 3, 10])
    pd = g.op("Pad", [x, g.ints([0, 0, 2, 0, 0, 1], "pads")])
    c = g.op("Conv", [pd, g.const([4, 3, 4]), g.const([4], "b")], name="conv_padded")
    g.output(g.op("Relu", [c]))
    m["pad_conv_1d"] = g

    g = G()  # a 3-D max pooling padded with -inf
    x = g.input("x", [1, 2, 4, 6, 6])
    pd = g.op("Pad", [x, g.ints([0, 0, 0, 1, 1, 0, 0, 0, 1, 1], "pads"),
                      g.const([], "ninf", value=-np.inf)])
    g.output(g.op("MaxPool", [pd], name="max_padded", kernel_shape=[2, 3, 3], strides=[2, 2, 2]))
    m["pad_maxpool_3d"] = g

    g = G()  # a BatchNorm that no conv produces, then Relu (DenseNet's pre-activation)
    x = g.input("x", [2, 4, 5, 5])
    g.output(g.op("Relu", [g.op("BatchNormalization", [x, g.const([4], "gamma", positive=True),
                                                       g.const([4], "beta"), g.const([4], "mean"),
                                                       g.const([4], "var", positive=True)],
                                name="bn_alone", epsilon=1e-3)]))
    m["bn_relu"] = g

    # ---- near misses ----
    g = G()  # a reflect Pad is not a window op's padding
    x = g.input("x", [1, 3, 8, 8])
    pd = g.op("Pad", [x, g.ints([0, 0, 1, 1, 0, 0, 1, 1], "pads")], name="pad_reflect",
              mode="reflect")
    g.output(g.op("AveragePool", [pd], kernel_shape=[3, 3]))
    m["nm_pad_reflect"] = g

    g = G()  # a Pad of the channels
    x = g.input("x", [1, 3, 8, 8])
    pd = g.op("Pad", [x, g.ints([0, 1, 1, 1, 0, 0, 1, 1], "pads")], name="pad_channels")
    g.output(conv(g, pd, 4, 2, pads=[0, 0, 0, 0]))
    m["nm_pad_channels"] = g

    g = G()  # the conv output has a second consumer
    c = conv(g, g.input("x", [1, 3, 6, 6]), 3, 4, name="conv_shared")
    g.output(g.op("Relu", [g.bn(c, 4)]))
    g.output(g.op("Neg", [c]))
    m["nm_two_consumers"] = g

    g = G()  # the conv output is a graph output
    c = conv(g, g.input("x", [1, 3, 6, 6]), 3, 4, name="conv_out")
    g.output(g.op("Relu", [g.bn(c, 4)]))
    g.output(c)
    m["nm_graph_output"] = g

    g = G()  # the conv weights are a graph input: BN cannot be folded
    w = g.input("w", [4, 3, 3, 3])
    c = g.op("Conv", [g.input("x", [1, 3, 6, 6]), w], name="conv_w_input", pads=[1, 1, 1, 1])
    g.output(g.op("Relu", [g.bn(c, 4)]))
    m["nm_nonconst_weights"] = g

    g = G()  # a ConvTranspose's weights come from an input: BN is not folded
    w = g.input("w", [3, 4, 2, 2])
    c = g.op("ConvTranspose", [g.input("x", [1, 3, 5, 5]), w], name="convt_w_input",
             strides=[2, 2])
    g.output(g.op("Relu", [g.bn(c, 4)]))
    m["nm_convt_nonconst_weights"] = g

    g = G()  # the addend grows the conv output
    c = conv(g, g.input("x", [1, 3, 4, 4]), 3, 2, name="conv_bcast")
    g.output(g.op("Add", [c, g.input("r", [3, 1, 2, 4, 4])]))
    m["nm_broadcast"] = g

    g = G()  # the same for a MatMul's bias
    y = g.op("Add", [g.op("MatMul", [g.input("x", [4, 16]), g.const([16, 8])], name="mm_bcast"),
                     g.const([4, 1, 8], "t")])
    g.output(y)
    m["nm_broadcast_matmul"] = g

    g = G(np.float64)  # float64 conv + Relu
    c = conv(g, g.input("x", [1, 3, 6, 6]), 3, 4, name="conv_f64")
    g.output(g.op("Relu", [c]))
    m["nm_dtype"] = g

    g = G()  # the MatMul output also feeds something else
    mm = g.op("MatMul", [g.input("x", [4, 16]), g.const([16, 8])], name="mm_shared")
    g.output(g.op("Add", [mm, g.const([8], "b")]))
    g.output(g.op("Neg", [mm]))
    m["nm_matmul_two_consumers"] = g

    g = G(np.float64)  # float64 MatMul + bias
    mm = g.op("MatMul", [g.input("x", [4, 16]), g.const([16, 8])], name="mm_f64")
    g.output(g.op("Add", [mm, g.const([8], "b")]))
    m["nm_matmul_dtype"] = g

    g = G()  # the pooled features are also a graph output
    p = g.op("GlobalAveragePool", [conv(g, g.input("x", [1, 3, 6, 6]), 3, 5)], name="gap_out")
    g.output(g.op("Gemm", [g.op("Flatten", [p]), g.const([5, 7])]))
    g.output(p)
    m["nm_cpf_graph_output"] = g

    g = G()  # a Mul after a MatMul whose operand grows the output
    mm = g.op("MatMul", [g.input("x", [3, 5]), g.const([5, 5])])
    g.output(g.op("Mul", [mm, g.const([2, 3, 5], "t")], name="mul_bcast"))
    m["nm_ew_broadcast"] = g

    g = G()  # SE whose gate has a second reader
    x = g.input("x", [1, 8, 4, 4])
    s = conv(g, g.op("GlobalAveragePool", [x], name="gap_se"), 8, 2, k=1, pads=[0, 0, 0, 0])
    s = g.op("Sigmoid", [conv(g, g.op("Relu", [s]), 2, 8, k=1, pads=[0, 0, 0, 0])])
    g.output(g.op("Mul", [x, s]))
    g.output(s)
    m["nm_se_gate_output"] = g

    g = G()  # BN parameters shared through Identity nodes, as torch deduplicates equal ones
    x = g.input("x", [1, 4, 7, 7])
    shared = [g.op("Identity", [g.const([4], hint, positive=hint in ("gamma", "var"))])
              for hint in ("gamma", "beta", "mean", "var")]
    w = g.op("Identity", [g.const([4, 4, 3, 3])])
    for block in range(3):
        c = g.op("Conv", [x, w if block == 1 else g.const([4, 4, 3, 3])], pads=[1, 1, 1, 1])
        bn = g.op("BatchNormalization", [c] + [g.op("Identity", [s]) for s in shared],
                  name=f"bn_identity{block}", epsilon=1e-5)
        x = g.op("Relu", [bn])
    g.output(x)
    m["bn_identity"] = g

    g = G()  # LayerNorm over a middle axis
    ln = g.op("LayerNormalization", [g.input("x", [2, 4, 16]),
                                     g.const([4, 16], "s", positive=True)], name="ln_axis", axis=1)
    g.output(g.op("MatMul", [ln, g.const([16, 3])]))
    m["nm_ln_axis"] = g

    g = G()  # RMSNorm over a middle axis
    rms = g.op("RMSNormalization", [g.input("x", [2, 4, 16]),
                                    g.const([4, 16], "s", positive=True)], name="rms_axis", axis=1)
    g.output(g.op("MatMul", [rms, g.const([16, 3])]))
    m["nm_rms_axis"] = g

    g = G()  # RMSNorm read by a MatMul as B: no prologue there
    rms = g.op("RMSNormalization", [g.input("x", [16, 8]), g.const([8], "s", positive=True)],
               name="rms_as_b")
    g.output(g.op("MatMul", [g.input("a", [3, 16]), rms]))
    m["nm_rms_as_b"] = g
    m.update(quant_models())
    return m


def qdq(g, x, scale, zp, dtype=np.uint8, dq_scale=None):
    """x -> QuantizeLinear -> DequantizeLinear (per tensor); the DequantizeLinear's scale may
    differ (a near miss)."""
    s = g.const([], "qs", value=scale)
    z = g.name("qz")
    g.inits.append(numpy_helper.from_array(np.array(zp, dtype=dtype), z))
    q = g.op("QuantizeLinear", [x, s, z])
    ds = s if dq_scale is None else g.const([], "dqs", value=dq_scale)
    return g.op("DequantizeLinear", [q, ds, z])


def qweights(g, w, scale, zp=None, axis=None):
    """DequantizeLinear of the constant 8-bit w (scale and zp scalars or per channel)."""
    wn, sn = g.name("wq"), g.name("ws")
    g.inits.append(numpy_helper.from_array(w, wn))
    g.inits.append(numpy_helper.from_array(np.asarray(scale, np.float32), sn))
    ins = [wn, sn]
    if zp is not None:
        zn = g.name("wz")
        g.inits.append(numpy_helper.from_array(np.asarray(zp, w.dtype), zn))
        ins.append(zn)
    return g.op("DequantizeLinear", ins, **({} if axis is None else {"axis": axis}))


def int8(shape, lo=-127, hi=128):
    return rng.integers(lo, hi, shape).astype(np.int8)


def quant_models():
    m = {}
    g = G()  # fq -> Conv (per-channel int8 weights, float bias) -> Relu -> fq
    x = qdq(g, g.input("x", [1, 3, 8, 8]), 0.02, 120)
    w = qweights(g, int8([4, 3, 3, 3]), [0.01, 0.02, 0.015, 0.03], [0, 0, 0, 0], axis=0)
    y = g.op("Relu", [g.op("Conv", [x, w, g.const([4], "b")], name="qconv", pads=[1, 1, 1, 1])])
    g.output(qdq(g, y, 0.01, 0))
    m["q_conv_relu"] = g

    g = G()  # int8 activations (zp -5) into a Gemm (transB, per-row weights) and uint8 weights
    x = qdq(g, g.input("x", [3, 16]), 0.05, -5, np.int8)  # (zp 128) into a MatMul + bias
    w = qweights(g, int8([8, 16]), np.linspace(0.01, 0.02, 8), axis=0)
    g.output(g.op("Gemm", [x, w, g.const([8], "c")], name="qgemm", transB=1))
    x2 = qdq(g, g.input("x2", [2, 3, 16]), 0.04, 100)
    w2 = qweights(g, rng.integers(0, 256, [16, 6]).astype(np.uint8), 0.01, 128)
    g.output(g.op("Add", [g.op("MatMul", [x2, w2], name="qmatmul"), g.const([6], "b")]))
    m["q_gemm_matmul"] = g

    g = G()  # fq -> MaxPool -> fq and fq, fq -> Concat -> fq: the inner ones go
    x = qdq(g, g.input("x", [1, 4, 8, 8]), 0.03, 128)
    p = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    y = g.op("Conv", [qdq(g, p, 0.03, 128), qweights(g, int8([4, 4, 1, 1]), 0.02)], name="qpool")
    g.output(y)
    a = qdq(g, g.input("a", [1, 2, 4, 4]), 0.025, 10)
    b = qdq(g, g.input("b", [1, 2, 4, 4]), 0.025, 10)
    c = g.op("Concat", [a, b], axis=1)
    g.output(g.op("Conv", [qdq(g, c, 0.025, 10), qweights(g, int8([3, 4, 3, 3]), 0.01)],
                  name="qcat", pads=[1, 1, 1, 1]))
    m["q_pool_concat"] = g

    g = G()  # fq -> nearest Resize -> fq (the first goes); fq -> Transpose -> MatMul (fq moves)
    x = qdq(g, g.input("x", [1, 4, 4, 4]), 0.02, 128)
    r = g.op("Resize", [x, "", g.const([4], "scales", value=[1, 1, 2, 2])], mode="nearest")
    g.output(g.op("Conv", [qdq(g, r, 0.02, 128), qweights(g, int8([3, 4, 1, 1]), 0.01)],
                  name="qresize"))
    t = g.op("Transpose", [qdq(g, g.input("a", [1, 8, 4]), 0.03, 100)], perm=[0, 2, 1])
    g.output(g.op("MatMul", [t, qweights(g, int8([8, 3]), 0.02)], name="qtranspose"))
    m["q_resize_transpose"] = g

    def residual(name, conv_scale):
        """A ResNet identity block as torch exports it: h -> fq(h) read by the block's first
        conv and by its residual Add; the conv reads fq(h) with conv_scale (0.01: the same
        parameters as the Add's, FakeQuantShare applies; else a near miss)."""
        g = G()
        x = qdq(g, g.input("x", [1, 4, 6, 6]), 0.02, 128)
        h = g.op("Relu", [g.op("Conv", [x, qweights(g, int8([8, 4, 1, 1]), 0.01),
                                        g.const([8], "b")], name="qstem")])
        hq = qdq(g, h, 0.01, 0)
        hc = hq if conv_scale == 0.01 else qdq(g, h, conv_scale, 0)
        c1 = g.op("Relu", [g.op("Conv", [hc, qweights(g, int8([6, 8, 3, 3]), 0.005)],
                                name="qconv1", pads=[1, 1, 1, 1])])
        c2 = g.op("Conv", [qdq(g, c1, 0.01, 0), qweights(g, int8([8, 6, 1, 1]), 0.01),
                           g.const([8], "b")], name="qconv2")
        y = g.op("Relu", [g.op("Add", [qdq(g, c2, 0.015, 110), hq])])
        g.output(y)
        m[name] = g

    residual("q_residual", 0.01)
    residual("nm_q_share_differ", 0.012)

    def near(name, node, w=None, x_dq_scale=None):
        g = G()
        x = qdq(g, g.input("x", [1, 3, 6, 6]), 0.02, 128, dq_scale=x_dq_scale)
        g.output(g.op("Conv", [x, w(g) if w else qweights(g, int8([4, 3, 3, 3]), 0.01)],
                      name=node))
        m[name] = g

    def weight_input(g):
        g.inputs.append(helper.make_tensor_value_info("wq", TensorProto.INT8, [4, 3, 3, 3]))
        return g.op("DequantizeLinear", ["wq", g.const([], "ws", value=0.01)])

    g = G()  # the com.microsoft QOperator ops: reference kernels vs their QDQ form
    ms = "com.microsoft"

    def qparam(scale, zp):
        z = g.name("z")
        g.inits.append(numpy_helper.from_array(np.array(zp, np.uint8), z))
        return [g.const([], "s", value=scale), z]

    p0, p1, p2, p3, p4, p5, p6 = (qparam(0.02, 128), qparam(0.015, 100), qparam(1 / 256, 0),
                                  qparam(0.02, 90), qparam(0.01, 120), qparam(0.03, 110),
                                  qparam(0.01, 80))
    xq = g.op("QuantizeLinear", [g.input("x", [1, 4, 5, 5])] + p0)
    lq = g.op("QLinearLeakyRelu", [xq] + p0 + p1, domain=ms, alpha=0.2)
    sq = g.op("QLinearSigmoid", [lq] + p1 + p2, domain=ms)
    cn = g.name("c")
    g.inits.append(numpy_helper.from_array(rng.integers(0, 256, (4, 1, 1)).astype(np.uint8), cn))
    aq = g.op("QLinearAdd", [sq] + p2 + [cn] + p4 + p3, domain=ms)
    mq = g.op("QLinearMul", [aq] + p3 + [lq] + p1 + p4, domain=ms)
    kq = g.op("QLinearConcat", p5 + [mq] + p4 + [lq] + p1, domain=ms, axis=1)
    gq = g.op("QLinearGlobalAveragePool", [kq] + p5 + p6, domain=ms)
    g.output(g.op("DequantizeLinear", [gq] + p6))
    nq = g.op("QLinearGlobalAveragePool", [lq] + p1 + p6, domain=ms, channels_last=1)
    g.output(g.op("DequantizeLinear", [nq] + p6))
    m["q_ms_ops"] = g

    near("nm_q_weight_input", "qconv_w_input", weight_input)
    near("nm_q_zp_channels", "qconv_zp",
         lambda g: qweights(g, int8([4, 3, 3, 3], -100, 100), [0.01] * 4, [1, 2, 3, 4], axis=0))
    near("nm_q_shift", "qconv_shift",
         lambda g: qweights(g, rng.integers(0, 256, [4, 3, 3, 3]).astype(np.uint8), 0.01, 0))
    near("nm_q_params_differ", "qconv_differ", x_dq_scale=0.03)
    return m


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, g in models().items():
        g.save(os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
