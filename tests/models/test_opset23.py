"""Opsets 19 to 23 (and opset 18's Resize axes), built with onnx.helper (Debian's onnx 1.12
knows opset 17, so they are written unchecked) and compared with ONNX Runtime. Each model
holds what its opset changed:
  - 19: AveragePool's dilations, Resize's half_pixel_symmetric, Pad's wrap mode;
  - 18: Resize's axes and keep_aspect_ratio_policy (not_larger, not_smaller);
  - 20: Gelu as an ONNX op (both forms; it becomes our Gelu and fuses after MatMul + bias), DFT's
    axis as an input, AffineGrid (2-D and 3-D, align_corners);
  - 21: GroupNormalization with scale and bias per channel (constant: canonicalized to our
    GroupNorm; an input: the reference kernel), QuantizeLinear's output_dtype.
Opset 22 (bfloat16 added to some ops' types) runs a float model as 21 does; opset 23's
RMSNormalization runs, its Attention is refused by name. Refused by name: blocked quantization
(block_size), and opset 24.
"""

import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
from against_ort import ours_and_ort
from ort_node import ort_available

F = TensorProto.FLOAT
rng = np.random.default_rng(21)


def save(path, nodes, inputs, outputs, inits, opset):
    g = helper.make_graph(nodes, "opset%d" % opset, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def const(name, values, dtype=np.float32):
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def outs(names):
    return [helper.make_tensor_value_info(o, F, None) for o in names]


def compare(af_bin, tmp_path, path, feeds, count, tol=1e-5):
    got, want = ours_and_ort(af_bin, path, feeds, tmp_path)
    assert len(want) == count
    for name, w in want.items():
        assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol, err_msg=name)


needs_ort = pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")


@needs_ort
def test_opset19_against_ort(af_bin, tmp_path):
    nodes = [
        helper.make_node("AveragePool", ["x"], ["ap"], kernel_shape=[3, 2], dilations=[2, 3],
                         pads=[1, 0, 2, 1], strides=[1, 2]),
        helper.make_node("AveragePool", ["x"], ["apc"], kernel_shape=[2, 3], dilations=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=1, strides=[2, 2]),
        helper.make_node("Resize", ["x", "", "sc"], ["rs_lin"], mode="linear",
                         coordinate_transformation_mode="half_pixel_symmetric"),
        helper.make_node("Resize", ["x", "", "sc2"], ["rs_cub"], mode="cubic",
                         coordinate_transformation_mode="half_pixel_symmetric"),
        helper.make_node("Resize", ["x", "", "", "sz"], ["rs_near"], mode="nearest",
                         coordinate_transformation_mode="half_pixel_symmetric"),
        helper.make_node("Pad", ["x", "pads"], ["wrap"], mode="wrap"),
    ]
    inits = [const("sc", [1, 1, 1.7, 0.6]), const("sc2", [1, 1, 2.3, 1.45]),
             const("sz", [2, 3, 11, 5], np.int64), const("pads", [0, 0, 2, 1, 0, 0, 1, 3], np.int64)]
    path = save(str(tmp_path / "m19.onnx"), nodes, [helper.make_tensor_value_info("x", F, [2, 3, 9, 7])],
                outs(["ap", "apc", "rs_lin", "rs_cub", "rs_near", "wrap"]), inits, 19)
    compare(af_bin, tmp_path, path, {"x": rng.standard_normal((2, 3, 9, 7)).astype(np.float32)}, 6)


@needs_ort
def test_resize_axes_against_ort(af_bin, tmp_path):
    nodes = [
        helper.make_node("Resize", ["x", "", "sc"], ["ax_sc"], mode="linear", axes=[3, 2]),
        helper.make_node("Resize", ["x", "", "", "sz"], ["ax_sz"], mode="nearest", axes=[-1]),
        helper.make_node("Resize", ["x", "", "", "sz2"], ["keep_small"], mode="linear", axes=[2, 3],
                         keep_aspect_ratio_policy="not_larger"),
        helper.make_node("Resize", ["x", "", "", "sz2"], ["keep_large"], mode="cubic", axes=[2, 3],
                         keep_aspect_ratio_policy="not_smaller"),
    ]
    inits = [const("sc", [0.5, 2.0]), const("sz", [10], np.int64), const("sz2", [16, 20], np.int64)]
    path = save(str(tmp_path / "ax.onnx"), nodes, [helper.make_tensor_value_info("x", F, [1, 2, 6, 8])],
                outs(["ax_sc", "ax_sz", "keep_small", "keep_large"]), inits, 18)
    compare(af_bin, tmp_path, path, {"x": rng.standard_normal((1, 2, 6, 8)).astype(np.float32)}, 4)


def test_resize_axes_roi(af_bin, tmp_path):
    # tf_crop_and_resize with axes: roi holds (start, end) of the named axes only. ONNX Runtime
    # 1.30 ignores such a roi (its output is the input), so the spec's numbers are the judge:
    # output row o samples input row (0.2 + o * 0.9 / 5) * 5 = 1 + 0.9 o, past row 5 -1.
    nodes = [helper.make_node("Resize", ["x", "roi", "", "sz"], ["crop"], mode="linear", axes=[2],
                              coordinate_transformation_mode="tf_crop_and_resize",
                              extrapolation_value=-1.0)]
    path = save(str(tmp_path / "roi.onnx"), nodes, [helper.make_tensor_value_info("x", F, [1, 2, 6, 8])],
                outs(["crop"]), [const("sz", [6], np.int64), const("roi", [0.2, 1.1])], 18)
    x = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    np.save(str(tmp_path / "x.npy"), x)
    r = afc.run(af_bin, path, inputs={"x": str(tmp_path / "x.npy")}, output_dir=str(tmp_path / "ours"))
    assert r.returncode == 0, r.stderr
    want = np.full_like(x, -1.0)
    for o in range(5):
        src = 1 + 0.9 * o
        lo = int(np.floor(src))
        hi = min(lo + 1, 5)
        want[:, :, o] = x[:, :, lo] * (1 - (src - lo)) + x[:, :, hi] * (src - lo)
    got = afc.load_outputs(str(tmp_path / "ours"), ["crop"])["crop"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@needs_ort
def test_opset20_against_ort(af_bin, tmp_path):
    w = const("w", rng.standard_normal((16, 24)) * 0.3)
    nodes = [
        helper.make_node("Gelu", ["x"], ["gelu"]),
        helper.make_node("Gelu", ["x"], ["gelu_tanh"], approximate="tanh"),
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["mmb"]),
        helper.make_node("Gelu", ["mmb"], ["mm_gelu"]),
        helper.make_node("Unsqueeze", ["x", "last"], ["sig"]),
        helper.make_node("DFT", ["sig", "", "one"], ["dft1"]),
        helper.make_node("DFT", ["sig", "", "m2"], ["dft_m2"], onesided=1),
        helper.make_node("DFT", ["sig", "len"], ["dft_default"]),
        helper.make_node("AffineGrid", ["theta2", "size2"], ["grid2"]),
        helper.make_node("AffineGrid", ["theta2", "size2"], ["grid2_ac"], align_corners=1),
        helper.make_node("AffineGrid", ["theta3", "size3"], ["grid3"]),
        helper.make_node("AffineGrid", ["theta3", "size3"], ["grid3_ac"], align_corners=1),
    ]
    inits = [w, const("b", rng.standard_normal(24) * 0.1), const("last", [-1], np.int64), const("one", 1, np.int64), const("m2", -2, np.int64),
             const("len", 20, np.int64), const("size2", [2, 3, 5, 7], np.int64),
             const("size3", [2, 1, 3, 4, 6], np.int64)]
    inputs = [helper.make_tensor_value_info("x", F, [4, 16]), helper.make_tensor_value_info("theta2", F, [2, 2, 3]),
              helper.make_tensor_value_info("theta3", F, [2, 3, 4])]
    path = save(str(tmp_path / "m20.onnx"), nodes, inputs,
                outs(["gelu", "gelu_tanh", "mm_gelu", "dft1", "dft_m2", "dft_default", "grid2", "grid2_ac",
                      "grid3", "grid3_ac"]), inits, 20)
    feeds = {"x": rng.standard_normal((4, 16)).astype(np.float32),
             "theta2": rng.standard_normal((2, 2, 3)).astype(np.float32),
             "theta3": rng.standard_normal((2, 3, 4)).astype(np.float32)}
    compare(af_bin, tmp_path, path, feeds, 10, tol=1e-4)
    r = subprocess.run([af_bin, "report", path], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "MatMulBiasActFusionOp" in r.stdout, r.stdout


@needs_ort
def test_opset21_against_ort(af_bin, tmp_path):
    wc = const("w", rng.standard_normal((6, 3, 3, 3)) * 0.3)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GroupNormalization", ["c", "gs", "gb"], ["gn"], num_groups=3, epsilon=1e-4),
        helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["gn_in"], num_groups=3),
        helper.make_node("QuantizeLinear", ["x", "qs"], ["q"], output_dtype=TensorProto.INT8),
        helper.make_node("DequantizeLinear", ["q", "qs"], ["dq"]),
    ]
    inits = [wc, const("gs", rng.uniform(0.5, 1.5, 6)), const("gb", rng.standard_normal(6) * 0.1),
             const("qs", 0.05)]
    inputs = [helper.make_tensor_value_info("x", F, [2, 3, 5, 6]), helper.make_tensor_value_info("scale", F, [3]),
              helper.make_tensor_value_info("bias", F, [3])]
    path = save(str(tmp_path / "m21.onnx"), nodes, inputs, outs(["gn", "gn_in", "dq"]), inits, 21)
    feeds = {"x": rng.standard_normal((2, 3, 5, 6)).astype(np.float32),
             "scale": np.array([0.5, 2.0, -1.0], np.float32), "bias": np.array([0.1, 0.0, -0.3], np.float32)}
    compare(af_bin, tmp_path, path, feeds, 3, tol=1e-4)


def refused(af_bin, tmp_path, path, message):
    x = str(tmp_path / "x.npy")
    np.save(x, np.ones((2, 4), np.float32))
    r = afc.run(af_bin, path, inputs={"x": x}, output_dir=str(tmp_path / "ours"))
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_blocked_quantization_refused(af_bin, tmp_path):
    path = save(str(tmp_path / "b.onnx"),
                [helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=2)],
                [helper.make_tensor_value_info("x", F, [2, 4])], outs(["y"]),
                [const("q", np.ones((2, 4)), np.int8), const("s", np.ones((2, 2)))], 21)
    refused(af_bin, tmp_path, path, "blocked quantization (block_size, opset 21) is not supported")


@needs_ort
def test_opset22_against_ort(af_bin, tmp_path):
    # opset 22 only added bfloat16 to some ops' types: a float model runs as at 21
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
             helper.make_node("Mish", ["c"], ["y"])]
    path = save(str(tmp_path / "o22.onnx"), nodes, [helper.make_tensor_value_info("x", F, [1, 2, 9])],
                outs(["y"]), [const("w", rng.standard_normal((4, 2, 3)))], 22)
    compare(af_bin, tmp_path, path, {"x": rng.standard_normal((1, 2, 9)).astype(np.float32)}, 1)


@needs_ort
def test_opset23_against_ort(af_bin, tmp_path):
    # opset 23 added RMSNormalization (ours already), Attention and RotaryEmbedding (refused by
    # name below) and float4 types
    nodes = [helper.make_node("RMSNormalization", ["x", "s"], ["last"], epsilon=1e-3),
             helper.make_node("RMSNormalization", ["x", "s2"], ["from1"], axis=1),
             helper.make_node("Gelu", ["x"], ["gelu"])]
    inits = [const("s", rng.standard_normal(8)), const("s2", rng.standard_normal((5, 8)))]
    path = save(str(tmp_path / "o23.onnx"), nodes, [helper.make_tensor_value_info("x", F, [2, 5, 8])],
                outs(["last", "from1", "gelu"]), inits, 23)
    compare(af_bin, tmp_path, path, {"x": rng.standard_normal((2, 5, 8)).astype(np.float32)}, 3)


def test_attention_op_refused(af_bin, tmp_path):
    nodes = [helper.make_node("Attention", ["x", "x", "x"], ["y"], q_num_heads=2, kv_num_heads=2)]
    path = save(str(tmp_path / "att.onnx"), nodes, [helper.make_tensor_value_info("x", F, [2, 4])],
                outs(["y"]), [], 23)
    refused(af_bin, tmp_path, path, "op 'Attention' of domain 'ai.onnx' is not supported")


def test_opset24_refused(af_bin, tmp_path):
    path = save(str(tmp_path / "o24.onnx"), [helper.make_node("Relu", ["x"], ["y"])],
                [helper.make_tensor_value_info("x", F, [2, 4])], outs(["y"]), [], 24)
    refused(af_bin, tmp_path, path, "opset 24 is not supported (supported: 1 to 23)")
