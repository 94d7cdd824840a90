"""Opset 18 models (what torch 2's exporter writes by default), built here with onnx.helper
(Debian's onnx 1.12 knows opset 17, so they are written unchecked) and compared with ONNX
Runtime, which implements 18:
  - Pad with its axes input (negative and unordered axes), constant and reflect modes;
  - Split by num_outputs, even and uneven (the last part what is left);
  - ReduceMean / ReduceMax / ReduceL2 with axes as an input, keepdims and noop_with_empty_axes;
  - the Mish op, Round (ties to even), Floor, Ceil, Sign, Softsign on their vector kernels;
  - a conv block with PRelu, so the fused path runs at this opset too;
  - GroupNormalization (scale and bias per group), after a conv and on the input.
Resize's opset-18 axes and keep_aspect_ratio_policy are in test_opset23.py.
"""

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs

F = TensorProto.FLOAT
rng = np.random.default_rng(18)


def save(path, nodes, inputs, outputs, inits, opset=18):
    g = helper.make_graph(nodes, "opset18", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def model(path):
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")
    slope = numpy_helper.from_array(np.full((8, 1, 1), 0.2, np.float32), "slope")
    nodes = [
        helper.make_node("Pad", ["x", "pads", "", "axes"], ["p"], mode="constant"),
        helper.make_node("Pad", ["x", "pads2", "", "axes2"], ["p2"], mode="reflect"),
        helper.make_node("Split", ["x"], ["s0", "s1", "s2"], axis=3, num_outputs=3),
        helper.make_node("Split", ["x"], ["e0", "e1"], axis=1, num_outputs=2),
        helper.make_node("ReduceMean", ["x", "rax"], ["rm"], keepdims=1),
        helper.make_node("ReduceMax", ["x", "rax"], ["rx"], keepdims=0),
        helper.make_node("ReduceL2", ["x"], ["rl"], keepdims=0),
        helper.make_node("Mish", ["x"], ["mish"]),
        helper.make_node("Mul", ["x", "four"], ["x4"]),
        helper.make_node("Round", ["x4"], ["round"]),
        helper.make_node("Floor", ["x4"], ["floor"]),
        helper.make_node("Ceil", ["x4"], ["ceil"]),
        helper.make_node("Sign", ["x"], ["sign"]),
        helper.make_node("Softsign", ["x"], ["softsign"]),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("PRelu", ["c", "slope"], ["conv"]),
        helper.make_node("GroupNormalization", ["c", "gn_scale", "gn_bias"], ["gn"], num_groups=4,
                         epsilon=1e-4),
        helper.make_node("GroupNormalization", ["x", "gx_scale", "gx_bias"], ["gx"], num_groups=2),
    ]
    inits = [i64("pads", [1, 2, 0, 3]), i64("axes", [-1, 2]), i64("pads2", [2, 1]), i64("axes2", [3]),
             i64("rax", [1, -1]), numpy_helper.from_array(np.array(4.0, np.float32), "four"), w, slope,
             numpy_helper.from_array(np.array([0.5, 1.5, -1.0, 2.0], np.float32), "gn_scale"),
             numpy_helper.from_array(np.array([0.1, -0.2, 0.3, 0.0], np.float32), "gn_bias"),
             numpy_helper.from_array(np.array([1.2, 0.7], np.float32), "gx_scale"),
             numpy_helper.from_array(np.array([-0.5, 0.25], np.float32), "gx_bias")]
    outs = ["p", "p2", "s0", "s1", "s2", "e0", "e1", "rm", "rx", "rl", "mish", "round", "floor",
            "ceil", "sign", "softsign", "conv", "gn", "gx"]
    return save(path, nodes, [helper.make_tensor_value_info("x", F, [2, 4, 6, 7])],
                [helper.make_tensor_value_info(o, F, None) for o in outs], inits)


def run_ours(af_bin, onnx_path, x, out):
    xf = os.path.join(out, "x.npy")
    np.save(xf, x)
    return afc.run(af_bin, onnx_path, inputs={"x": xf}, output_dir=os.path.join(out, "ours"))


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_opset18_against_ort(af_bin, tmp_path):
    path = model(str(tmp_path / "m.onnx"))
    # quarters: x * 4 has exact halves for Round's ties
    x = (np.round(rng.standard_normal((2, 4, 6, 7)) * 8) / 8).astype(np.float32)
    r = run_ours(af_bin, path, x, str(tmp_path))
    assert r.returncode == 0, r.stderr
    (tmp_path / "ort").mkdir()
    want = ort_outputs(path, {"x": x}, str(tmp_path / "ort"))
    got = afc.load_outputs(str(tmp_path / "ours"), list(want))
    assert len(want) == 19
    for name, w in want.items():
        assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=name)

