"""Float16 models (issue 18, item 3): a model stored and computing in float16, and a float32
model with a float16 island between Casts (as float16 converters write them with
keep_io_types), both exported from torch and converted here. They compile and run (before:
"Conv on float16"), the float16 graph is computed in float32 inside (passes/widen.c) with its
float16 interface kept, the island's Casts disappear, and the outputs stay within float16's
rounding of the float32 model's (and of ONNX Runtime's, when onnxruntime-node is installed).
"""

import os
import subprocess

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
from ort_node import ort_available, ort_outputs



def to_float16(src, dst, keep_io=False):
    """The model at src with every float32 tensor, type and Cast in float16 (keep_io: the
    inputs and outputs stay float32, with Casts at the edges, as converters do)."""
    m = onnx.load(src)
    g = m.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
    # Resize's scales stay float32 (the operator wants them so; converters leave them)
    scales = {n.input[2] for n in g.node if n.op_type == "Resize" and len(n.input) > 2}
    for n in g.node:
        if n.op_type == "Constant" and n.output[0] in scales:
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(n.attribute[0].t).astype(np.float32), n.attribute[0].t.name))
    for vi in list(g.value_info) + ([] if keep_io else list(g.input) + list(g.output)):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    if keep_io:
        for vi in g.input:
            for n in g.node:
                n.input[:] = [x + "_h" if x == vi.name else x for x in n.input]
            g.node.insert(0, helper.make_node("Cast", [vi.name], [vi.name + "_h"], to=TensorProto.FLOAT16))
        for vi in g.output:
            for n in g.node:
                n.output[:] = [x + "_h" if x == vi.name else x for x in n.output]
            g.node.append(helper.make_node("Cast", [vi.name + "_h"], [vi.name], to=TensorProto.FLOAT))
    onnx.checker.check_model(m)
    onnx.save(m, dst)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fp16"))
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16), torch.nn.Hardswish(),
        torch.nn.Conv2d(16, 32, 1), torch.nn.Upsample(scale_factor=2, mode="bilinear"),
        torch.nn.Conv2d(32, 8, 3, stride=2, padding=1), torch.nn.Sigmoid())
    for mod in net.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    net.eval()
    paths = {"fp32": os.path.join(d, "net.onnx"), "fp16": os.path.join(d, "net16.onnx"),
             "island": os.path.join(d, "island.onnx")}
    torch.onnx.export(net, torch.zeros(1, 3, 24, 24), paths["fp32"], input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, opset_version=13)
    to_float16(paths["fp32"], paths["fp16"])
    to_float16(paths["fp32"], paths["island"], keep_io=True)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 24, 24)).astype(np.float16)
    np.save(os.path.join(d, "x16.npy"), x)
    np.save(os.path.join(d, "x32.npy"), x.astype(np.float32))
    return d, paths


def run(af_bin, model, x, out):
    proc = afc.run(af_bin, model, inputs={"x": x}, output_dir=out)
    assert proc.returncode == 0, proc.stderr
    return np.load(os.path.join(out, "y.npy"))


def test_float16_model_runs_within_half_rounding(af_bin, models, tmp_path):
    d, p = models
    want = run(af_bin, p["fp32"], os.path.join(d, "x32.npy"), str(tmp_path / "a"))
    got = run(af_bin, p["fp16"], os.path.join(d, "x16.npy"), str(tmp_path / "b"))
    assert got.dtype == np.float16 and got.shape == want.shape
    # weights rounded to half, one rounding of the output: a few half ulps of the output
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=4e-3)
    island = run(af_bin, p["island"], os.path.join(d, "x32.npy"), str(tmp_path / "c"))
    assert island.dtype == np.float32
    np.testing.assert_allclose(island, got.astype(np.float32), rtol=0, atol=1e-3)


def test_float16_graph_fuses_and_loses_its_casts(af_bin, models, tmp_path):
    d, p = models
    for name in ("fp16", "island"):
        fused = str(tmp_path / f"{name}_fused.onnx")
        proc = subprocess.run([af_bin, "compile", p[name], "--output", str(tmp_path / name),
                               "--export_onnx", fused], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        g = onnx.load(fused).graph
        ops = [n.op_type for n in g.node]
        assert ops.count("FusedConv") >= 3, ops
        casts = [n for n in g.node if n.op_type == "Cast"]
        # only the interface's: half in and out for the float16 model, none for the island
        assert len(casts) == (2 if name == "fp16" else 0), [(n.input, n.output) for n in casts]
        types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output)}
        want = TensorProto.FLOAT16 if name == "fp16" else TensorProto.FLOAT
        assert types == {"x": want, "y": want}


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_float16_against_onnx_runtime(af_bin, models, tmp_path):
    d, p = models
    got = run(af_bin, p["fp16"], os.path.join(d, "x16.npy"), str(tmp_path / "ours"))
    ref = ort_outputs(p["fp16"], {"x": np.load(os.path.join(d, "x16.npy"))}, str(tmp_path))["y"]
    assert ref.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=0, atol=4e-3)
