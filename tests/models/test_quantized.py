"""Dynamically quantized models (issue 18): DynamicQuantizeLinear + ConvInteger / MatMulInteger
+ Cast + Mul by the scales, as onnxruntime.quantization.quantize_dynamic writes them. The
integer products become float32 Conv / MatMul (passes/integer.c) and fuse; the result must
match the exact integer computation (numpy, int64) within float32 rounding, and ONNX Runtime's
outputs where onnxruntime-node is installed. A ConvInteger whose int32 result is a graph output
stays as it is and gives the exact integers.
"""

import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs


RNG = np.random.default_rng(5)
W1 = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
W1_ZP = np.int8(3)
W1_SCALE = np.float32(0.02)
B1 = RNG.standard_normal(8).astype(np.float32)
W2 = RNG.integers(0, 256, (8, 5)).astype(np.uint8)
W2_ZP = np.uint8(128)
W2_SCALE = np.float32(0.01)


def dyn_quantize(x):
    """DynamicQuantizeLinear as ONNX defines it (float32 arithmetic)."""
    lo, hi = np.float32(min(0.0, x.min())), np.float32(max(0.0, x.max()))
    scale = np.float32((hi - lo) / np.float32(255))
    zp = np.float32(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return q, scale, np.uint8(zp)


def conv_int(xq, xzp, w, wzp, pad=1):
    """ConvInteger, exact in int64 (stride 1, square pads)."""
    x = np.pad(xq.astype(np.int64) - int(xzp), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.astype(np.int64) - int(wzp)
    n, c, h, wd = x.shape
    m, _, kh, kw = k.shape
    out = np.zeros((n, m, h - kh + 1, wd - kw + 1), np.int64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,mc->nmhw", x[:, :, i:i + out.shape[2], j:j + out.shape[3]], k[:, :, i, j])
    return out


def reference(x):
    q, s, zp = dyn_quantize(x)
    y = conv_int(q, zp, W1, W1_ZP).astype(np.float32) * (s * W1_SCALE) + B1.reshape(1, 8, 1, 1)
    y = np.maximum(y, 0).mean(axis=(2, 3), dtype=np.float32)
    q2, s2, zp2 = dyn_quantize(y)
    z = (q2.astype(np.int64) - int(zp2)) @ (W2.astype(np.int64) - int(W2_ZP))
    return z.astype(np.float32) * (s2 * W2_SCALE)


def make_model(path, int_output=False):
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (W1, "w1"), (np.array(W1_ZP), "w1_zp"), (np.array(W1_SCALE), "w1_scale"), (B1.reshape(1, 8, 1, 1), "b1"),
        (W2, "w2"), (np.array(W2_ZP), "w2_zp"), (np.array(W2_SCALE), "w2_scale"))]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        helper.make_node("ConvInteger", ["xq", "w1", "xzp", "w1_zp"], ["c32"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["c32"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "w1_scale"], ["s1"]),
        helper.make_node("Mul", ["cf", "s1"], ["c1"]),
        helper.make_node("Add", ["c1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("GlobalAveragePool", ["r1"], ["p1"]),
        helper.make_node("Flatten", ["p1"], ["f1"]),
        helper.make_node("DynamicQuantizeLinear", ["f1"], ["fq", "fs", "fzp"]),
        helper.make_node("MatMulInteger", ["fq", "w2", "fzp", "w2_zp"], ["m32"]),
        helper.make_node("Cast", ["m32"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["fs", "w2_scale"], ["s2"]),
        helper.make_node("Mul", ["mf", "s2"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])]
    if int_output:
        outputs.append(helper.make_tensor_value_info("c32", TensorProto.INT32, [1, 8, 12, 12]))
    g = helper.make_graph(nodes, "dynq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    d = tmp_path_factory.mktemp("dynq")
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    np.save(d / "x.npy", x)
    make_model(str(d / "dynq.onnx"))
    make_model(str(d / "dynq_int.onnx"), int_output=True)
    return d, x


def test_dynamic_quantized_model_fuses_and_matches_integers(af_bin, case, tmp_path):
    d, x = case
    want = reference(x)
    proc = afc.run(af_bin, str(d / "dynq.onnx"), inputs={"x": str(d / "x.npy")}, output_dir=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "y.npy")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    fused = str(tmp_path / "fused.onnx")
    proc = subprocess.run([af_bin, "compile", str(d / "dynq.onnx"), "--output", str(tmp_path / "m"),
                           "--export_onnx", fused], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ops = [n.op_type for n in onnx.load(fused).graph.node]
    assert "ConvInteger" not in ops and "MatMulInteger" not in ops, ops
    assert "FusedConv" in ops, ops


def test_integer_result_read_as_int32_stays_exact(af_bin, case, tmp_path):
    d, x = case
    proc = afc.run(af_bin, str(d / "dynq_int.onnx"), inputs={"x": str(d / "x.npy")}, output_dir=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    q, _, zp = dyn_quantize(x)
    assert np.array_equal(np.load(tmp_path / "c32.npy"), conv_int(q, zp, W1, W1_ZP).astype(np.int32))


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_dynamic_quantized_against_onnx_runtime(af_bin, case, tmp_path):
    d, x = case
    proc = afc.run(af_bin, str(d / "dynq.onnx"), inputs={"x": str(d / "x.npy")}, output_dir=str(tmp_path / "ours"))
    assert proc.returncode == 0, proc.stderr
    ref = ort_outputs(str(d / "dynq.onnx"), {"x": x}, str(tmp_path))["y"]
    got = np.load(tmp_path / "ours" / "y.npy")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
