"""End-to-end tests: real PyTorch models exported to ONNX, run by `autofusion run`, compared with
torch eager; plus the `run` command-line contract (docs/cli.md).

Invariant: every model is exported once per module (module-scoped fixtures) at a small input size,
and every random tensor comes from a fixed seed, so a failure reproduces exactly. Run with
    AF_BIN=build/autofusion /usr/bin/python3 -m pytest tests/models
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
import torch
import torchvision

import autofusion_cli as afc
import autofusion_export as afx
import bert
import make_testmodel

SEED = 0

# Tolerances for float32 outputs against torch's float32 eager outputs. Both sides round in
# float32 but sum in different orders; measured against a float64 torch run, torch's own float32
# error on these models is at most 2e-6 absolute (resnet50, outputs up to ~2), inside these.
# That holds because the models' BatchNorm statistics are calibrated (outputs are O(1) and well
# conditioned); with random statistics ResNet-50's logits reach ~400, where one float32 ulp is
# already 3e-5, and no float32 implementation can meet atol=1e-5.
RTOL = 1e-4
ATOL = 1e-5

# torchvision models and the square input size they are tested at: big enough that every stage
# keeps a spatial extent >= 2, small enough for a plain-C reference executor.
IMAGE_MODELS = {"resnet18": 64, "resnet50": 64, "mobilenet_v3_small": 64, "efficientnet_b0": 64}


@dataclass
class Exported:
    """An exported model with its saved inputs and torch's outputs for them."""
    path: str
    dir: str
    input_files: dict = field(default_factory=dict)   # input name -> .npy path
    expected: dict = field(default_factory=dict)      # output name -> np.ndarray from torch


def export_with_inputs(out_dir, stem, model, args, in_names, out_names, dynamic_axes=None):
    """Export `model`, save `args` as STEM_<input>.npy and record torch's outputs for them."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem + ".onnx")
    afx.export_onnx(model, args, path, in_names, out_names, dynamic_axes=dynamic_axes)
    ex = Exported(path=path, dir=out_dir)
    for name, arg in zip(in_names, args):
        ex.input_files[name] = os.path.join(out_dir, f"{stem}_{name}.npy")
        afx.save_npy(ex.input_files[name], arg.numpy())
    with torch.no_grad():
        ys = model(*args)
    ys = ys if isinstance(ys, tuple) else (ys,)
    ex.expected = {name: y.numpy() for name, y in zip(out_names, ys)}
    return ex


def image_input(size, batch=1, seed=SEED):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def run_ok(af_bin, model, out_dir, inputs=None, input_shape=None):
    """Run the CLI, require success, return (stdout lines, process)."""
    proc = afc.run(af_bin, model, inputs=inputs, output_dir=out_dir, input_shape=input_shape)
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return [ln for ln in proc.stdout.splitlines() if ln.strip()], proc


def run_fails(af_bin, model, out_dir, inputs=None, input_shape=None):
    """Run the CLI, require a clean failure (an exit code, not a signal) with a one-line message.

    Returns the message.
    """
    proc = afc.run(af_bin, model, inputs=inputs, output_dir=out_dir, input_shape=input_shape)
    assert proc.returncode > 0, (f"expected an error exit, got {proc.returncode} "
                                 f"(negative: killed by signal)\nstderr: {proc.stderr}")
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected a one-line message, got:\n{proc.stdout}{proc.stderr}"
    return lines[0]


def check_summary(lines, arrays):
    """One stdout line per output, naming it, whose last number is the sum of its values.

    The contract fixes the line's content (name, shape, dtype, sum), not its punctuation, so this
    looks for the name as a whole word and reads the sum as the line's last number.
    """
    assert len(lines) == len(arrays), f"want one line per output {list(arrays)}, got {lines}"
    for name, arr in arrays.items():
        pat = re.compile(r"(^|[\s,:=])" + re.escape(name) + r"($|[\s,:=])")
        mine = [ln for ln in lines if pat.search(ln)]
        assert len(mine) == 1, f"want one summary line naming {name!r}, got {lines}"
        printed = float(mine[0].replace(",", " ").split()[-1])
        want = float(np.sum(arr, dtype=np.float64))
        # %.6g-style printing keeps 6 significant digits.
        assert abs(printed - want) <= 1e-5 * abs(want) + 1e-12, \
            f"{name}: summary sum {printed}, file sum {want}: {mine[0]}"


def assert_outputs_match(ex, out_dir, rtol=RTOL, atol=ATOL):
    got = afc.load_outputs(out_dir, ex.expected)
    for name, want in ex.expected.items():
        have = got[name]
        assert have.dtype == want.dtype, f"{name}: dtype {have.dtype}, torch {want.dtype}"
        assert have.shape == want.shape, f"{name}: shape {have.shape}, torch {want.shape}"
        np.testing.assert_allclose(have, want, rtol=rtol, atol=atol, err_msg=name)


# ---- model fixtures: each exported once per module ----

@pytest.fixture(scope="module", params=list(IMAGE_MODELS))
def image_model(request, tmp_path_factory):
    name = request.param
    size = IMAGE_MODELS[name]
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, name)(weights=None)
    # Calibrated BN statistics keep deep models well conditioned (see calibrate_batchnorm).
    afx.randomize_init(model, SEED, calibration=(image_input(size, batch=2, seed=SEED + 1),))
    out_dir = str(tmp_path_factory.mktemp(name))
    return export_with_inputs(out_dir, name, model, (image_input(size),), ["input"], ["output"])


@pytest.fixture(scope="module")
def vit_tiny(tmp_path_factory):
    """torchvision's VisionTransformer (ViT-B/16's code) at 2 layers, hidden 64, 32x32 input: the
    same graph shape as vit_b_16's export (class-token Expand, attention in_proj Slices driven by
    Shape arithmetic, 3-D batched MatMuls), small enough to run in a second."""
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(SEED)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                              hidden_dim=64, mlp_dim=128, num_classes=10)
    afx.randomize_init(model, SEED)
    out_dir = str(tmp_path_factory.mktemp("vit_tiny"))
    return export_with_inputs(out_dir, "vit_tiny", model, (image_input(32),), ["input"], ["output"])


@pytest.fixture(scope="module")
def testmodel(tmp_path_factory):
    """The seed's TestModel at 32x32, exported by tools/make_testmodel.py's own function."""
    out_dir = str(tmp_path_factory.mktemp("testmodel"))
    model = make_testmodel.build_testmodel(SEED)
    return export_with_inputs(out_dir, "testmodel", model, (image_input(32),),
                              ["input"], ["output"])


@pytest.fixture(scope="module")
def testmodel_dynamic(tmp_path_factory):
    """TestModel with a symbolic batch dimension; example input has batch 2."""
    out_dir = str(tmp_path_factory.mktemp("testmodel_dyn"))
    model = make_testmodel.build_testmodel(SEED)
    axes = {"input": {0: "batch"}, "output": {0: "batch"}}
    return export_with_inputs(out_dir, "testmodel_dyn", model, (image_input(16, batch=2),),
                              ["input"], ["output"], dynamic_axes=axes)


@pytest.fixture(scope="module")
def bert_small(tmp_path_factory):
    """2-layer BERT (hidden 128, 2 heads), batch 2 x seq 16; row 1 has 5 padded positions."""
    cfg = bert.BertConfig.small(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000)
    model = bert.build_bert(cfg, SEED)
    ids, mask = bert.example_inputs(cfg, batch=2, seq=16, seed=SEED, pad=[0, 5])
    out_dir = str(tmp_path_factory.mktemp("bert"))
    return export_with_inputs(out_dir, "bert_small", model, (ids, mask),
                              ["input_ids", "attention_mask"],
                              ["last_hidden_state", "pooler_output"])


class TwoHeads(torch.nn.Module):
    """A conv trunk with two outputs, exported under names the CLI must sanitise."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3))), torch.sigmoid(h)


ODD_NAMES = ["logits/main:0", "aux out"]


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    torch.manual_seed(SEED)
    model = afx.randomize_init(TwoHeads(), SEED)
    out_dir = str(tmp_path_factory.mktemp("two_heads"))
    return export_with_inputs(out_dir, "two_heads", model, (image_input(8),), ["input"], ODD_NAMES)


# ---- numerics against torch ----

def test_image_model_matches_torch(af_bin, image_model, tmp_path):
    lines, _ = run_ok(af_bin, image_model.path, tmp_path, inputs=image_model.input_files)
    check_summary(lines, afc.load_outputs(tmp_path, image_model.expected))
    assert_outputs_match(image_model, tmp_path)


def test_vit_matches_torch(af_bin, vit_tiny, tmp_path):
    run_ok(af_bin, vit_tiny.path, tmp_path, inputs=vit_tiny.input_files)
    assert_outputs_match(vit_tiny, tmp_path)


def test_testmodel_matches_torch(af_bin, testmodel, tmp_path):
    run_ok(af_bin, testmodel.path, tmp_path, inputs=testmodel.input_files)
    assert_outputs_match(testmodel, tmp_path)


def test_bert_matches_torch(af_bin, bert_small, tmp_path):
    assert (np.load(bert_small.input_files["attention_mask"]) == 0).any(), "mask must pad"
    lines, _ = run_ok(af_bin, bert_small.path, tmp_path, inputs=bert_small.input_files)
    check_summary(lines, afc.load_outputs(tmp_path, bert_small.expected))
    assert_outputs_match(bert_small, tmp_path)


def test_symbolic_batch_with_input_file_matches_torch(af_bin, testmodel_dynamic, tmp_path):
    run_ok(af_bin, testmodel_dynamic.path, tmp_path, inputs=testmodel_dynamic.input_files,
           input_shape="input:2,3,16,16")
    assert_outputs_match(testmodel_dynamic, tmp_path)


def test_output_names_sanitised(af_bin, two_heads, tmp_path):
    lines, _ = run_ok(af_bin, two_heads.path, tmp_path, inputs=two_heads.input_files)
    assert sorted(os.listdir(tmp_path)) == ["aux_out.npy", "logits_main_0.npy"]
    check_summary(lines, afc.load_outputs(tmp_path, ODD_NAMES))
    assert_outputs_match(two_heads, tmp_path)


# ---- the run command's contract ----

def test_random_inputs_when_none_given(af_bin, two_heads, tmp_path):
    lines, _ = run_ok(af_bin, two_heads.path, tmp_path)
    got = afc.load_outputs(tmp_path, ODD_NAMES)
    check_summary(lines, got)
    for name in ODD_NAMES:
        assert got[name].shape == two_heads.expected[name].shape
        assert got[name].dtype == np.float32
        assert np.isfinite(got[name]).all()


def test_input_shape_binds_symbolic_batch(af_bin, testmodel_dynamic, tmp_path):
    lines, _ = run_ok(af_bin, testmodel_dynamic.path, tmp_path, input_shape="input:3,3,16,16")
    out = afc.load_outputs(tmp_path, ["output"])["output"]
    check_summary(lines, {"output": out})
    assert out.shape == (3, 1000)
    assert np.isfinite(out).all()


def test_input_shape_cannot_change_fixed_dims(af_bin, testmodel_dynamic, tmp_path):
    """Only symbolic dims are free; the model fixes height and width to 16."""
    msg = run_fails(af_bin, testmodel_dynamic.path, tmp_path, input_shape="input:3,3,8,8")
    assert "input" in msg


def test_missing_model_file(af_bin, tmp_path):
    missing = tmp_path / "no_such_model.onnx"
    msg = run_fails(af_bin, missing, tmp_path / "out")
    assert "no_such_model.onnx" in msg


def test_truncated_model_file(af_bin, testmodel, tmp_path):
    with open(testmodel.path, "rb") as f:
        data = f.read()
    cut = tmp_path / "truncated.onnx"
    cut.write_bytes(data[: len(data) // 2])
    run_fails(af_bin, cut, tmp_path / "out", inputs=testmodel.input_files)


def test_missing_input_file(af_bin, testmodel, tmp_path):
    msg = run_fails(af_bin, testmodel.path, tmp_path / "out",
                    inputs={"input": str(tmp_path / "absent.npy")})
    assert "absent.npy" in msg


def test_unknown_input_name(af_bin, testmodel, tmp_path):
    msg = run_fails(af_bin, testmodel.path, tmp_path / "out",
                    inputs={"bogus_input": testmodel.input_files["input"]})
    assert "bogus_input" in msg


def test_wrong_input_shape(af_bin, testmodel, tmp_path):
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 3, 16, 16), np.float32))  # model declares 1x3x32x32
    msg = run_fails(af_bin, testmodel.path, tmp_path / "out", inputs={"input": str(wrong)})
    assert "input" in msg


# ---- bench's traces ----

def trace_nodes(path):
    """The node events and the model_run count of a Chrome trace written by --profile."""
    with open(path) as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("ph") == "X"]
    runs = sum(1 for e in events if e.get("name") == "model_run")
    return nodes, runs


def test_bench_compare_profile_traces_both_graphs(af_bin, testmodel, tmp_path):
    """bench --compare --profile=F.json traces the fused runs into F.json and the unfused ones,
    interleaved with them, into F.unfused.json: every timed run, node by node."""
    trace = tmp_path / "t.json"
    subprocess.run([af_bin, "bench", testmodel.path, "--compare", "--iterations=3", "--warmup=1",
                    "--threads=1", f"--profile={trace}"], check=True, capture_output=True)
    fused, fruns = trace_nodes(trace)
    unfused, uruns = trace_nodes(tmp_path / "t.unfused.json")
    assert fruns == 3 and uruns == 3
    fops = {e["args"]["op_name"] for e in fused}
    uops = {e["args"]["op_name"] for e in unfused}
    # the seed's Conv -> BatchNorm -> Relu chains: fused into FusedConv ops, BatchNorm and Relu
    # left as nodes of their own in the unfused graph
    assert any(e["args"].get("fused_nodes") for e in fused)
    assert "Relu" not in fops and "Relu" in uops
    assert not any(e["args"].get("fused_nodes") for e in unfused)
    assert len(unfused) > len(fused)
    assert all(e["dur"] >= 0 for e in fused + unfused)


# ---- the export tools themselves ----

def test_make_testmodel_cli_is_deterministic_and_keeps_bn(testmodel, tmp_path):
    """tools/make_testmodel.py in a fresh process writes the same bytes as the in-process export,
    with the three Conv -> BatchNormalization -> Relu chains the fusion pass must see."""
    out = tmp_path / "tm.onnx"
    script = os.path.join(os.path.dirname(make_testmodel.__file__), "make_testmodel.py")
    subprocess.run([sys.executable, script, str(out), "--size", "32"], check=True,
                   capture_output=True)
    with open(testmodel.path, "rb") as f:
        assert out.read_bytes() == f.read()
    nodes = onnx.load(str(out)).graph.node
    bns = [n for n in nodes if n.op_type == "BatchNormalization"]
    assert len(bns) == 3
    producer = {o: n for n in nodes for o in n.output}
    for bn in bns:
        assert producer[bn.input[0]].op_type == "Conv"
        consumers = [n.op_type for n in nodes if bn.output[0] in n.input]
        assert consumers == ["Relu"]
