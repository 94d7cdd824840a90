"""Sampling ops (RandomUniform, RandomNormal, their *Like forms, Bernoulli, Multinomial): their
outputs cannot equal ONNX Runtime's, so the tests check what can be checked: shapes and dtypes
as ORT gives them, the distributions (moments and frequencies over many draws), reproducible
runs, distinct streams for distinct seeds and nodes, and `verify` (fused vs unfused) passing on
a VITS-like graph where noise feeds a fused conv.
"""

import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs

F = TensorProto.FLOAT


def sampling_model(path):
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32))
    nodes = [
        helper.make_node("RandomNormalLike", ["x"], ["normal_like"]),
        helper.make_node("RandomUniformLike", ["x"], ["uniform_like"], low=-2.0, high=3.0, seed=7.0),
        helper.make_node("RandomNormal", [], ["normal"], shape=[200, 500], mean=1.5, scale=0.5, seed=1.0),
        helper.make_node("RandomNormal", [], ["normal2"], shape=[200, 500], mean=1.5, scale=0.5, seed=2.0),
        helper.make_node("RandomUniform", [], ["uniform64"], shape=[1000], dtype=TensorProto.DOUBLE),
        helper.make_node("Bernoulli", ["p"], ["coin"]),
        helper.make_node("Multinomial", ["logits"], ["draws"], sample_size=20000, dtype=TensorProto.INT64),
    ]
    g = helper.make_graph(
        nodes, "sampling", [helper.make_tensor_value_info("x", F, [100, 1000])],
        [helper.make_tensor_value_info(o, F, None) for o in
         ["normal_like", "uniform_like", "normal", "normal2", "coin"]] +
        [helper.make_tensor_value_info("uniform64", TensorProto.DOUBLE, None),
         helper.make_tensor_value_info("draws", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.full((400, 500), 0.3, np.float32), "p"),
         numpy_helper.from_array(logits, "logits")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path, logits


NAMES = ["normal_like", "uniform_like", "normal", "normal2", "uniform64", "coin", "draws"]


def run_ours(af_bin, path, x, out):
    np.save(str(out) + ".x.npy", x)
    r = afc.run(af_bin, path, inputs={"x": str(out) + ".x.npy"}, output_dir=str(out))
    assert r.returncode == 0, r.stderr
    return afc.load_outputs(str(out), NAMES)


def test_distributions_and_reproducibility(af_bin, tmp_path):
    path, logits = sampling_model(str(tmp_path / "s.onnx"))
    x = np.zeros((100, 1000), np.float32)
    a = run_ours(af_bin, path, x, tmp_path / "a")
    b = run_ours(af_bin, path, x, tmp_path / "b")
    for name in NAMES:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # reproducible runs
    n = a["normal_like"]
    assert n.shape == (100, 1000) and n.dtype == np.float32
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    assert abs(np.mean(n ** 3)) < 0.03 and abs(np.mean(n ** 4) - 3) < 0.1  # skew 0, kurtosis 3
    u = a["uniform_like"]
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.02
    assert abs(u.var() - 25 / 12) < 0.03
    for name in ("normal", "normal2"):
        v = a[name]
        assert v.shape == (200, 500) and abs(v.mean() - 1.5) < 0.01 and abs(v.std() - 0.5) < 0.01
    assert np.corrcoef(a["normal"].ravel(), a["normal2"].ravel())[0, 1] < 0.01  # seeds differ
    assert np.corrcoef(n.ravel()[:100000], a["normal"].ravel()[:100000])[0, 1] < 0.02
    w = a["uniform64"]
    assert w.dtype == np.float64 and w.shape == (1000,) and 0 <= w.min() and w.max() < 1
    assert len(np.unique(w)) == 1000
    c = a["coin"]
    assert set(np.unique(c)) == {0.0, 1.0} and abs(c.mean() - 0.3) < 0.005
    d = a["draws"]
    assert d.shape == (2, 20000) and d.dtype == np.int64
    for row in range(2):
        freq = np.bincount(d[row], minlength=3) / 20000
        np.testing.assert_allclose(freq, np.exp(logits[row]), atol=0.015)


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_shapes_as_ort(af_bin, tmp_path):
    path, _ = sampling_model(str(tmp_path / "s.onnx"))
    x = np.zeros((100, 1000), np.float32)
    ours = run_ours(af_bin, path, x, tmp_path / "a")
    (tmp_path / "ort").mkdir()
    want = ort_outputs(path, {"x": x}, str(tmp_path / "ort"))
    for name, w in want.items():
        assert ours[name].shape == w.shape and ours[name].dtype == w.dtype, name


def test_noise_into_fused_conv_verifies(af_bin, tmp_path):
    # VITS's flow: z = mean + noise * exp(logs) * scale, then convolutions
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("RandomNormalLike", ["m"], ["eps"]),
        helper.make_node("Mul", ["eps", "scale"], ["noise"]),
        helper.make_node("Add", ["m", "noise"], ["z"]),
        helper.make_node("Conv", ["z", "w", "b"], ["c"], pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "vits", [helper.make_tensor_value_info("m", F, [1, 8, 50])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array(0.667, np.float32), "scale"),
         numpy_helper.from_array((rng.standard_normal((8, 8, 3)) * 0.3).astype(np.float32), "w"),
         numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    path = str(tmp_path / "v.onnx")
    with open(path, "wb") as f:
        f.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    r = subprocess.run([af_bin, "verify", path], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within tolerance" in r.stdout, r.stdout
