"""Dynamic-shape exports (issue 15, item 1): a model exported with a symbolic batch (and, for
BERT, a symbolic sequence) must fuse exactly as its static export does, and run correctly at
shapes other than the one it was exported with.

Each model is exported twice by torch from the same module: static at its example shape, and with
dynamic_axes. `compile --export_onnx` writes both fused graphs; the fused ops (domain
ai.autofusion) are counted by type and must be equal. Every rule is covered: ConvBNRelu (with a
residual Add+Relu, which needs the batch to be a symbol rather than unknown), SqueezeExcite,
ConvPoolFc (Flatten of [batch, C, 1, 1]), MatMulBiasAct, LayerNormMatMul, MultiHeadAttention
(Shape -> Gather -> Concat -> Reshape folded into symbolic Reshapes) and Elementwise.
Then the dynamic file runs at odd shapes (batch 3, sequence 13) against torch eager.

Invariant: fixed seeds; small models (the whole module takes seconds).
"""

import os
import subprocess
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import autofusion_cli as afc
import autofusion_export as afx
import bert

FUSED_DOMAIN = "ai.autofusion"


class SmallCnn(nn.Module):
    """Conv+BN+ReLU, a residual block, a squeeze-excite gate and a pool/flatten/linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.c1 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(),
                                nn.Conv2d(4, 16, 1), nn.Sigmoid())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.c2(self.c1(x)) + x)
        x = x * self.se(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.ReLU())

    def forward(self, x):
        return self.net(x)


def vit():
    from torchvision.models.vision_transformer import VisionTransformer
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                              hidden_dim=64, mlp_dim=128, num_classes=10)
    afx.randomize_init(model, 0)
    return model


def build(name):
    """(module, example inputs, input names, output names, dynamic axes, odd-shape inputs)."""
    torch.manual_seed(0)
    if name == "bert2":
        cfg = bert.BertConfig.small(layers=2, hidden=64, heads=2, intermediate=128, vocab=500)
        model = bert.build_bert(cfg, 0)
        args = bert.example_inputs(cfg, batch=1, seq=16, seed=0)
        odd = bert.example_inputs(cfg, batch=3, seq=13, seed=1, pad=[0, 4, 12])
        axes = {"input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
        return (model, args, ["input_ids", "attention_mask"],
                ["last_hidden_state", "pooler_output"], axes, odd)
    gen = torch.Generator().manual_seed(1)
    if name == "vit2":
        model, shape, odd_shape = vit(), (1, 3, 32, 32), (3, 3, 32, 32)
    elif name == "cnn":
        model, shape, odd_shape = SmallCnn(), (1, 3, 16, 16), (3, 3, 16, 16)
        calib = (torch.randn(4, *shape[1:], generator=gen),)
        afx.randomize_init(model, 0, calibration=calib)
    else:
        model, shape, odd_shape = Mlp(), (1, 32), (3, 32)
        afx.randomize_init(model, 0)
    args = (torch.randn(*shape, generator=gen),)
    odd = (torch.randn(*odd_shape, generator=gen),)
    return model, args, ["x"], ["y"], {"x": {0: "batch"}, "y": {0: "batch"}}, odd


MODELS = ["cnn", "mlp", "bert2", "vit2"]
# At batch 1 the static ViT's [S, 1, E] <-> [1, S, E] transposes are reshapes, which lets the
# attention output projection take the residual Add; with a symbolic batch they move data. So for
# ViT only the attention blocks are compared.
COMPARED = {"vit2": ["FusedAttention"]}


@pytest.fixture(scope="module", params=MODELS)
def exported(request, tmp_path_factory):
    name = request.param
    d = tmp_path_factory.mktemp(name)
    model, args, ins, outs, axes, odd = build(name)
    paths = {}
    for kind in ("static", "dynamic"):
        paths[kind] = str(d / f"{name}_{kind}.onnx")
        afx.export_onnx(model, args, paths[kind], ins, outs,
                        dynamic_axes=axes if kind == "dynamic" else None)
    with torch.no_grad():
        want = model.eval()(*odd)
    want = want if isinstance(want, tuple) else (want,)
    return name, d, paths, ins, outs, odd, [w.numpy() for w in want]


def fused_ops(af_bin, model, out):
    r = subprocess.run([af_bin, "compile", f"--model={model}", f"--output={out}.afm",
                        f"--export_onnx={out}.onnx"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    g = onnx.load(f"{out}.onnx", load_external_data=False).graph
    return Counter(n.op_type for n in g.node if n.domain == FUSED_DOMAIN)


def test_dynamic_fuses_as_static(af_bin, exported):
    name, d, paths, *_ = exported
    static = fused_ops(af_bin, paths["static"], str(d / "s"))
    dynamic = fused_ops(af_bin, paths["dynamic"], str(d / "d"))
    assert static, f"{name}: the static export fused nothing"
    if name in COMPARED:
        static = Counter({k: static[k] for k in COMPARED[name]})
        dynamic = Counter({k: dynamic[k] for k in COMPARED[name]})
    assert dynamic == static, f"{name}: dynamic {dict(dynamic)} vs static {dict(static)}"


@pytest.mark.parametrize("form", ["onnx", "afm"])
def test_dynamic_runs_odd_shapes(af_bin, exported, form):
    name, d, paths, ins, outs, odd, want = exported
    model = paths["dynamic"]
    if form == "afm":
        model = str(d / "compiled.afm")
        r = subprocess.run([af_bin, "compile", f"--model={paths['dynamic']}",
                            f"--output={model}"], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
    inputs = {}
    for n, t in zip(ins, odd):
        inputs[n] = str(d / f"{n}.npy")
        np.save(inputs[n], t.numpy())
    out_dir = d / f"out_{form}"
    r = afc.run(af_bin, model, inputs=inputs, output_dir=out_dir)
    assert r.returncode == 0, r.stderr
    got = afc.load_outputs(out_dir, outs)
    for n, w in zip(outs, want):
        assert got[n].shape == w.shape, f"{name} {n}: {got[n].shape} vs {w.shape}"
        np.testing.assert_allclose(got[n], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} {n}")


def test_symbol_mismatch_is_named(af_bin, exported):
    """Inputs that share a symbol ("batch") must agree on it; the error names both inputs."""
    name, d, paths, ins, outs, odd, _ = exported
    if len(ins) < 2:
        pytest.skip("one input: nothing to disagree")
    a = str(d / "a.npy")
    b = str(d / "b.npy")
    np.save(a, odd[0].numpy()[:1])
    np.save(b, odd[1].numpy())
    r = afc.run(af_bin, paths["dynamic"], inputs={ins[0]: a, ins[1]: b})
    assert r.returncode != 0
    assert f"input '{ins[1]}' dim 0 (batch) is 3, but input '{ins[0]}' dim 0" in r.stderr, r.stderr


def test_shape_range_kept_in_afm(af_bin, exported):
    """--input_shape_range given at compile time travels in the .afm: the odd shape runs when
    the range holds it, and a range that leaves out its batch makes the run an error naming
    the input and the dim."""
    name, d, paths, ins, outs, odd, want = exported
    inputs = {}
    for n, t in zip(ins, odd):
        inputs[n] = str(d / f"r_{n}.npy")
        np.save(inputs[n], t.numpy())
    batch = odd[0].shape[0]
    for lo, ok in ((1, True), (batch + 1, False)):
        spec = ";".join(f"{n}:" + ",".join([f"{lo}~{lo + 8}"] + [str(s) for s in t.shape[1:]])
                        for n, t in zip(ins, odd))
        model = str(d / f"ranged_{lo}.afm")
        r = subprocess.run([af_bin, "compile", f"--model={paths['dynamic']}", f"--output={model}",
                            f"--input_shape_range={spec}"], capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
        r = afc.run(af_bin, model, inputs=inputs, output_dir=d / f"out_r{lo}")
        if ok:
            assert r.returncode == 0, r.stderr
            got = afc.load_outputs(d / f"out_r{lo}", outs)
            np.testing.assert_allclose(got[outs[0]], want[0], rtol=1e-4, atol=1e-4)
        else:
            assert r.returncode != 0
            assert (f"input '{ins[0]}' dim 0 is {batch}, outside the range {lo}~{lo + 8}"
                    in r.stderr), r.stderr
