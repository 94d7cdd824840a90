#!/usr/bin/python3
"""A wake-word-like model whose classifier sits inside an If branch (issue 15, item 4).

    /usr/bin/python3 bench/wakeword_model.py OUT.onnx

features [1, 40] -> elementwise preprocessing (log compression, mean and variance
normalisation, clipping, per-frame normalisation) -> Gemm 40x128 + Relu in the main graph -> If(ReduceMax(h) > 0):
  then: Gemm 128x64 + Relu, Gemm 64x2, Softmax, a little post-processing (Pow, Clip);
  else: Gemm 128x2, Softmax, the same post-processing;
the Gemms as torch exports Linear (transB=1, weights [out, in]);
every weight a main-graph initializer captured by the branches, as exporters of scripted
models write them. About 30 nodes in all. Deterministic (fixed seed).
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(15)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def weights():
    return [
        init("mean", rng.standard_normal(40) * 0.1),
        init("inv_std", np.abs(rng.standard_normal(40)) * 0.5 + 0.5),
        init("gain", 2.0), init("one", 1.0), init("eps", 1e-6), init("lo", -4.0), init("hi", 4.0), init("zero", 0.0),
        init("W1", rng.standard_normal((128, 40)) * 0.2), init("B1", rng.standard_normal(128) * 0.1),
        init("W2", rng.standard_normal((64, 128)) * 0.1), init("B2", rng.standard_normal(64) * 0.1),
        init("W3", rng.standard_normal((2, 64)) * 0.2), init("B3", rng.standard_normal(2) * 0.1),
        init("W4", rng.standard_normal((2, 128)) * 0.1), init("B4", rng.standard_normal(2) * 0.1),
        init("temp", 0.8), init("pmin", 1e-4), init("pmax", 1.0),
    ]


def post(prefix, logits):
    """Softmax of the logits, then smoothed and clipped; returns (nodes, output name)."""
    out = f"{prefix}_probs"
    return [
        helper.make_node("Softmax", [logits], [f"{prefix}_soft"], axis=-1),
        helper.make_node("Pow", [f"{prefix}_soft", "temp"], [f"{prefix}_sharp"]),
        helper.make_node("Clip", [f"{prefix}_sharp", "pmin", "pmax"], [f"{prefix}_clipped"]),
        helper.make_node("Identity", [f"{prefix}_clipped"], [out]),
    ], out


def branch_then():
    nodes = [
        helper.make_node("Gemm", ["h", "W2", "B2"], ["t_g1"], transB=1),
        helper.make_node("Relu", ["t_g1"], ["t_r1"]),
        helper.make_node("Gemm", ["t_r1", "W3", "B3"], ["t_logits"], transB=1),
    ]
    more, out = post("t", "t_logits")
    return helper.make_graph(nodes + more, "then_branch", [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 2])])


def branch_else():
    nodes = [helper.make_node("Gemm", ["h", "W4", "B4"], ["e_logits"], transB=1)]
    more, out = post("e", "e_logits")
    return helper.make_graph(nodes + more, "else_branch", [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 2])])


def model():
    nodes = [
        helper.make_node("Mul", ["features", "gain"], ["fg"]),
        helper.make_node("Abs", ["fg"], ["a"]),
        helper.make_node("Add", ["a", "one"], ["a1"]),
        helper.make_node("Log", ["a1"], ["logf"]),
        helper.make_node("Sub", ["logf", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "inv_std"], ["normed"]),
        helper.make_node("Clip", ["normed", "lo", "hi"], ["clipped0"]),
        helper.make_node("ReduceMean", ["clipped0"], ["frame_mean"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["clipped0", "frame_mean"], ["clipped1"]),
        helper.make_node("Mul", ["clipped1", "clipped1"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["frame_var"], axes=[1], keepdims=1),
        helper.make_node("Add", ["frame_var", "eps"], ["var_e"]),
        helper.make_node("Sqrt", ["var_e"], ["frame_std"]),
        helper.make_node("Div", ["clipped1", "frame_std"], ["clipped"]),
        helper.make_node("Gemm", ["clipped", "W1", "B1"], ["g1"], transB=1),
        helper.make_node("Relu", ["g1"], ["h"]),
        helper.make_node("ReduceMax", ["h"], ["hmax"], keepdims=0),
        helper.make_node("Add", ["hmax", "eps"], ["hmax_e"]),
        helper.make_node("Greater", ["hmax_e", "zero"], ["active"]),
        helper.make_node("If", ["active"], ["probs"], then_branch=branch_then(),
                         else_branch=branch_else()),
    ]
    g = helper.make_graph(nodes, "wakeword",
                          [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 40])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 2])],
                          weights())
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="wakeword")
    onnx.checker.check_model(m)
    return m


if __name__ == "__main__":
    onnx.save(model(), sys.argv[1] if len(sys.argv) > 1 else "wakeword.onnx")
