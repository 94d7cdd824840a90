"""GridSample against ONNX Runtime: opset 16's mode names (bilinear, nearest, bicubic) and opset
20's (linear, nearest, cubic) with every padding_mode and align_corners, on 2-D inputs and, at
opset 20, volumetric ones (5-D X, [N, D, H, W, 3] grid; ONNX Runtime has no 3-D cubic, so ours
is checked on a volume that does not vary along depth, where it must equal 2-D cubic). Grid
values reach outside [-1, 1] so that every padding mode is exercised. Each opset's names only,
as ONNX Runtime: opset 20 refuses bilinear. Models are written with onnx.helper, unchecked
(Debian's onnx 1.12 knows opset 17).
"""

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs

F = TensorProto.FLOAT
rng = np.random.default_rng(20)
PADS = ("zeros", "border", "reflection")


def save(path, nodes, inputs, outputs, opset):
    g = helper.make_graph(nodes, "gridsample", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def model(path, opset, modes, xshape, gshape):
    """One GridSample node per (mode, padding_mode, align_corners), all on inputs x and g."""
    nodes, names = [], []
    for mode, pad, align in itertools.product(modes, PADS, (0, 1)):
        names.append("%s_%s_%d" % (mode, pad, align))
        nodes.append(helper.make_node("GridSample", ["x", "g"], [names[-1]], mode=mode,
                                      padding_mode=pad, align_corners=align))
    save(path, nodes, [helper.make_tensor_value_info("x", F, xshape),
                       helper.make_tensor_value_info("g", F, gshape)],
         [helper.make_tensor_value_info(o, F, None) for o in names], opset)
    return names


def run_ours(af_bin, path, feeds, out):
    files = {}
    for name, v in feeds.items():
        files[name] = str(out / (name + ".npy"))
        np.save(files[name], v)
    return afc.run(af_bin, path, inputs=files, output_dir=str(out / "ours"))


def compare(af_bin, tmp_path, path, feeds, names):
    r = run_ours(af_bin, path, feeds, tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "ort").mkdir()
    want = ort_outputs(path, feeds, str(tmp_path / "ort"))
    got = afc.load_outputs(str(tmp_path / "ours"), names)
    for name in names:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    return got


def feeds(xshape, gshape):
    return {"x": rng.standard_normal(xshape).astype(np.float32),
            "g": rng.uniform(-1.3, 1.3, gshape).astype(np.float32)}


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
@pytest.mark.parametrize("opset, modes, xs, gs", [
    (16, ("bilinear", "nearest", "bicubic"), [2, 11, 5, 7], [2, 4, 6, 2]),
    (20, ("linear", "nearest", "cubic"), [1, 3, 6, 5], [1, 7, 3, 2]),
    (20, ("linear", "nearest"), [2, 3, 4, 5, 6], [2, 3, 2, 5, 3]),  # volumetric
], ids=["opset16", "opset20", "opset20_3d"])
def test_against_ort(af_bin, tmp_path, opset, modes, xs, gs):
    path = str(tmp_path / "g.onnx")
    names = model(path, opset, modes, xs, gs)
    compare(af_bin, tmp_path, path, feeds(xs, gs), names)


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_opset20_cubic_3d_is_2d_cubic_along_a_constant_depth(af_bin, tmp_path):
    x2 = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    g2 = rng.uniform(-1.3, 1.3, (1, 3, 4, 2)).astype(np.float32)
    x3 = np.repeat(x2[:, :, None], 4, axis=2)
    g3 = np.concatenate([np.repeat(g2[:, None], 2, axis=1),
                         rng.uniform(-1.3, 1.3, (1, 2, 3, 4, 1)).astype(np.float32)], axis=-1)
    nodes, names = [], []
    for pad, align in itertools.product(("border", "reflection"), (0, 1)):  # every depth tap inside
        for rank, suffix in ((2, ""), (3, "_3d")):
            names.append("cubic_%s_%d%s" % (pad, align, suffix))
            nodes.append(helper.make_node("GridSample", ["x" + suffix, "g" + suffix], [names[-1]],
                                          mode="cubic", padding_mode=pad, align_corners=align))
    path = save(str(tmp_path / "c3.onnx"), nodes,
                [helper.make_tensor_value_info("x", F, x2.shape), helper.make_tensor_value_info("g", F, g2.shape),
                 helper.make_tensor_value_info("x_3d", F, x3.shape),
                 helper.make_tensor_value_info("g_3d", F, g3.shape)],
                [helper.make_tensor_value_info(o, F, None) for o in names], 20)
    r = run_ours(af_bin, path, {"x": x2, "g": g2, "x_3d": x3, "g_3d": g3}, tmp_path)
    assert r.returncode == 0, r.stderr
    got = afc.load_outputs(str(tmp_path / "ours"), names)
    for name in names[::2]:
        for d in range(2):
            np.testing.assert_allclose(got[name + "_3d"][:, :, d], got[name], rtol=1e-5, atol=1e-5,
                                       err_msg=name)


def test_opset20_refuses_opset16_names(af_bin, tmp_path):
    path = save(str(tmp_path / "b.onnx"), [helper.make_node("GridSample", ["x", "g"], ["y"], mode="bilinear")],
                [helper.make_tensor_value_info("x", F, [1, 1, 2, 2]),
                 helper.make_tensor_value_info("g", F, [1, 1, 1, 2])],
                [helper.make_tensor_value_info("y", F, None)], 20)
    r = run_ours(af_bin, path, feeds([1, 1, 2, 2], [1, 1, 1, 2]), tmp_path)
    assert r.returncode != 0 and "mode 'bilinear' (opset 20: linear, nearest or cubic)" in r.stderr, r.stderr
