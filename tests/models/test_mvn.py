"""MeanVarianceNormalization, which canonicalize rewrites into ReduceMean, Sub, Mul, ReduceMean,
Sqrt, Add and Div (its definition, every node on a fast kernel): against ONNX Runtime and
against the reference kernel (float64 models, which the rewrite leaves alone), over several
axes sets, ranks and both forms of ReduceMean's axes (attribute before opset 18, input from it).

The data is well conditioned (means not far above the spread): there both runtimes' float32
means are good to a few ulps. ORT's kernel differs from the definition at the edges (no
epsilon: a constant channel gives NaN there, 0 here).
"""

import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs

rng = np.random.default_rng(13)

# (shape, axes or None for the default [0, 2, 3], opset)
CASES = [
    ([2, 3, 5, 6], None, 13),
    ([1, 4, 8, 8], None, 18),
    ([2, 3, 5, 6], [2, 3], 13),
    ([2, 3, 5, 6], [1, 2, 3], 18),
    ([2, 3, 5, 6], [0, 1, 2, 3], 13),
    ([3, 4, 7], [-1], 18),
    ([3, 4, 7], [0], 13),
    ([1, 2, 3, 4, 5], [2, 3, 4], 18),
]


def mvn_model(path, shape, axes, opset, dtype=TensorProto.FLOAT):
    attrs = {} if axes is None else {"axes": axes}
    g = helper.make_graph([helper.make_node("MeanVarianceNormalization", ["x"], ["y"], **attrs)], "mvn",
                          [helper.make_tensor_value_info("x", dtype, shape)],
                          [helper.make_tensor_value_info("y", dtype, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def definition(x, axes):
    """(x - E[x]) / (sqrt(E[(x - E[x])^2]) + 1e-9) in float64, as the reference kernel computes it."""
    ax = tuple(a % x.ndim for a in (axes if axes is not None else [0, 2, 3]))
    d = x - x.mean(axis=ax, keepdims=True)
    return d / (np.sqrt((d * d).mean(axis=ax, keepdims=True)) + 1e-9)


def run_ours(af_bin, path, x, out):
    xf = os.path.join(out, "x.npy")
    np.save(xf, x)
    r = afc.run(af_bin, path, inputs={"x": xf}, output_dir=os.path.join(out, "ours"))
    assert r.returncode == 0, r.stderr
    return afc.load_outputs(os.path.join(out, "ours"), ["y"])["y"]


def on_fast_kernels(af_bin, path, out):
    afm = os.path.join(out, "m")
    subprocess.run([af_bin, "compile", f"--model={path}", f"--output={afm}"], check=True, capture_output=True)
    r = subprocess.run([af_bin, "inspect", afm + ".afm"], check=True, capture_output=True, text=True)
    return "reference kernels: none" in r.stdout and "MeanVarianceNormalization" not in r.stdout


@pytest.mark.parametrize("shape,axes,opset", CASES)
def test_mvn_against_reference(af_bin, tmp_path, shape, axes, opset):
    x = (rng.standard_normal(shape) * 2.0 + 0.5).astype(np.float32)
    ours = run_ours(af_bin, mvn_model(str(tmp_path / "f.onnx"), shape, axes, opset), x, str(tmp_path))
    (tmp_path / "d").mkdir()
    ref = run_ours(af_bin, mvn_model(str(tmp_path / "d.onnx"), shape, axes, opset, TensorProto.DOUBLE),
                   x.astype(np.float64), str(tmp_path / "d"))
    want = definition(x.astype(np.float64), axes)
    np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-12)  # the reference kernel
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
    assert on_fast_kernels(af_bin, str(tmp_path / "f.onnx"), str(tmp_path))


def test_mvn_constant_group(af_bin, tmp_path):
    """A constant group of zeros (a padded channel) stays 0, like the reference, not 0 / 0."""
    x = rng.standard_normal([1, 3, 4, 4]).astype(np.float32)
    x[0, 1] = 0.0
    y = run_ours(af_bin, mvn_model(str(tmp_path / "f.onnx"), [1, 3, 4, 4], None, 13), x, str(tmp_path))
    np.testing.assert_allclose(y, definition(x.astype(np.float64), None), rtol=1e-5, atol=1e-5)
    assert not np.isnan(y).any()


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
@pytest.mark.parametrize("shape,axes,opset", CASES)
def test_mvn_against_ort(af_bin, tmp_path, shape, axes, opset):
    path = mvn_model(str(tmp_path / "m.onnx"), shape, axes, opset)
    x = (rng.standard_normal(shape) * 2.0 + 0.5).astype(np.float32)
    ours = run_ours(af_bin, path, x, str(tmp_path))
    (tmp_path / "ort").mkdir()
    want = ort_outputs(path, {"x": x}, str(tmp_path / "ort"))["y"]
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5)
