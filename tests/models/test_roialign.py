"""RoiAlign against ONNX Runtime at the opsets torchvision exports with. Opset 16 added
coordinate_transformation_mode, default half_pixel; RoiAlign-10 has no half-pixel shift, which
opset 16 names output_half_pixel. A model at opset 10 to 15 without the attribute must take
the old behaviour: torchvision's Faster / Mask / Keypoint R-CNN (aligned=False, exported at
opsets 11 to 13) pool every box half a feature pixel off otherwise, and their detections
differ from torch's and ONNX Runtime's.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from against_ort import ours, ours_and_ort
from ort_node import ort_available

rng = np.random.default_rng(16)


def roialign_model(path, opset, mode=None, sampling_ratio=2):
    attrs = {"output_height": 5, "output_width": 4, "sampling_ratio": sampling_ratio,
             "spatial_scale": 0.25}
    if mode is not None:
        attrs["coordinate_transformation_mode"] = mode
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], **attrs)
    g = helper.make_graph([node], "roialign",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 10]),
                           helper.make_tensor_value_info("rois", TensorProto.FLOAT, [6, 4]),
                           helper.make_tensor_value_info("bi", TensorProto.INT64, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 3, 5, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def feeds():
    x = rng.standard_normal([2, 3, 12, 10]).astype(np.float32)
    lo = rng.uniform(0, 24, [6, 2])
    rois = np.concatenate([lo, lo + rng.uniform(2, 20, [6, 2])], axis=1).astype(np.float32)
    return {"x": x, "rois": rois, "bi": np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)}


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
@pytest.mark.parametrize("opset,mode", [(10, None), (13, None), (16, None), (16, "half_pixel"),
                                       (16, "output_half_pixel")])
def test_roialign_against_ort(af_bin, tmp_path, opset, mode):
    path = roialign_model(str(tmp_path / "m.onnx"), opset, mode)
    got, want = ours_and_ort(af_bin, path, feeds(), tmp_path)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


def test_roialign_default_follows_opset(af_bin, tmp_path):
    """Without ONNX Runtime too: opset 13's default is opset 16's output_half_pixel, and
    opset 16's default is half_pixel; the two differ on these boxes."""
    f = feeds()
    got = {}
    for name, opset, mode in [("old", 13, None), ("new_out", 16, "output_half_pixel"),
                              ("new", 16, None)]:
        d = tmp_path / name
        d.mkdir()
        path = roialign_model(str(d / "m.onnx"), opset, mode)
        got[name] = ours(af_bin, path, f, d, ["y"])["y"]
    np.testing.assert_array_equal(got["old"], got["new_out"])
    assert np.abs(got["old"] - got["new"]).max() > 1e-3

