"""--precision_mode, --keep_fp32 and `autofusion verify` end to end.

  - real models exported from torch (BERT, ViT and ResNet shapes at test size) run in bf16,
    mixed and fp16 against torch's float32 outputs, held to cosine >= 0.999 and the type's
    rounding (the issue's accuracy bar);
  - a compiled .afm keeps its precision mode and per-op precisions, and runs like the model
    prepared directly;
  - `verify` on models built to break: a LayerNorm over activations beyond half precision's
    range (fp16 overflows there, mixed keeps the LayerNorm in fp32), and a Conv+BN checked with
    zero tolerance (the fusion itself changes the rounding); verify must name the fused op or
    the rule, print the line that fixes it, and that line must fix it;
  - bad arguments: unknown modes and --keep_fp32 names are one-line errors.
"""

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import autofusion_cli as afc
import autofusion_export as afx
import bert
from test_models import SEED, export_with_inputs, image_input

MODES = ["bf16", "mixed", "fp16"]


def cli(af_bin, *args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([af_bin, *args], capture_output=True, text=True, timeout=timeout, env=e)


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module", autouse=True)
def bf16_pays(af_bin, tmp_path_factory):
    """These tests check the bf16 paths end to end. --precision_mode=bf16 follows the calibrated
    rates, and a CPU whose bf16 GEMM is not clearly faster than its fp32 one (AVX512_BF16
    without AMX) keeps every op fp32 (test_lower's test_precision_rates checks that rule), so
    here the binary reads a machine file that says bf16 runs at 4x fp32, as on AMX: this
    machine's calibration with that one figure changed."""
    d = tmp_path_factory.mktemp("machine")
    path = str(d / "machine.json")
    model = str(d / "relu.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), model)
    proc = cli(af_bin, "report", model, env={"AUTOFUSION_MACHINE_FILE": path})  # calibrates
    assert proc.returncode == 0, proc.stderr
    with open(path) as f:
        machine = json.load(f)
    for rec in machine.values():
        if isinstance(rec, dict) and rec.get("gemm_bf16_gflops", 0) > 0:
            rec["gemm_bf16_gflops"] = 4 * rec["gemm_gflops"]
    with open(path, "w") as f:
        json.dump(machine, f)
    old = os.environ.get("AUTOFUSION_MACHINE_FILE")
    os.environ["AUTOFUSION_MACHINE_FILE"] = path
    yield
    if old is None:
        del os.environ["AUTOFUSION_MACHINE_FILE"]
    else:
        os.environ["AUTOFUSION_MACHINE_FILE"] = old


@pytest.fixture(scope="module")
def bert_small(tmp_path_factory):
    cfg = bert.BertConfig.small(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000)
    model = bert.build_bert(cfg, SEED)
    ids, mask = bert.example_inputs(cfg, batch=2, seq=16, seed=SEED, pad=[0, 5])
    return export_with_inputs(str(tmp_path_factory.mktemp("bert")), "bert_small", model,
                              (ids, mask), ["input_ids", "attention_mask"],
                              ["last_hidden_state", "pooler_output"])


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    import torchvision
    torch.manual_seed(SEED)
    model = torchvision.models.resnet18(weights=None)
    afx.randomize_init(model, SEED, calibration=(image_input(64, batch=2, seed=SEED + 1),))
    return export_with_inputs(str(tmp_path_factory.mktemp("resnet18")), "resnet18", model,
                              (image_input(64),), ["input"], ["output"])


@pytest.fixture(scope="module")
def vit_tiny(tmp_path_factory):
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(SEED)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                              hidden_dim=64, mlp_dim=128, num_classes=10)
    afx.randomize_init(model, SEED)
    return export_with_inputs(str(tmp_path_factory.mktemp("vit")), "vit_tiny", model,
                              (image_input(32),), ["input"], ["output"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["bert_small", "resnet18", "vit_tiny"])
def test_low_precision_matches_torch(af_bin, which, mode, request, tmp_path):
    ex = request.getfixturevalue(which)
    proc = afc.run(af_bin, ex.path, inputs=ex.input_files, output_dir=tmp_path,
                   extra=(f"--precision_mode={mode}",))
    assert proc.returncode == 0, proc.stderr
    got = afc.load_outputs(tmp_path, ex.expected)
    # bfloat16 keeps 8 significant bits of every GEMM input, half 11; sums stay float32.
    tol = 1e-2 if mode == "fp16" else 6e-2
    for name, want in ex.expected.items():
        have = got[name]
        assert cosine(have, want) >= 0.999, f"{which} {mode} {name}: cosine {cosine(have, want)}"
        err = np.abs(have - want).max() / max(np.abs(want).max(), 1e-6)
        assert err <= tol, f"{which} {mode} {name}: max error {err:.3g} of the largest output"


NO_BF16 = "this CPU has neither AMX-BF16 nor AVX512_BF16: bfloat16 falls back to fp32"


def falls_back(prec):
    """On a CPU without bfloat16 arithmetic (AVX2 only) the report says so once and every op
    stays fp32 with that reason (or --keep_fp32's); the tests of bf16 placement then check that
    instead."""
    if prec.get("note") != NO_BF16:
        return False
    cores = [o for o in prec["ops"] if o["op"] in ("FusedMatMul", "FusedConv")]
    assert cores and all(o["precision"] == "fp32" and o["why"] in (NO_BF16, "--keep_fp32")
                         for o in cores), cores
    return True


def test_report_lists_precision_of_every_op(af_bin, bert_small):
    proc = cli(af_bin, "report", bert_small.path, "--precision_mode=allow_mix_precision", "--json")
    assert proc.returncode == 0, proc.stderr
    prec = json.loads(proc.stdout)["precision"]
    assert prec["mode"] == "mixed"
    if falls_back(prec):
        text = cli(af_bin, "report", bert_small.path, "--precision_mode=bf16").stdout
        assert "[AF] Precision: bf16, 0 of" in text and NO_BF16 in text, text
        return
    ops = {o["node"]: o for o in prec["ops"]}
    low = [o for o in ops.values() if o["precision"] == "bf16"]
    assert low, "no op in bf16"
    assert all(o["op"] in ("FusedMatMul", "FusedConv") for o in low)
    attn = [o for o in ops.values() if o["op"] == "FusedAttention"]
    assert attn and all(o["precision"] == "fp32" and o["why"] for o in attn)
    # mixed keeps the LayerNorm prologue of LayerNormMatMul in fp32
    lnmm = [o for o in low if "LayerNormMatMulFusionOp" in o["rules"]]
    assert lnmm and all(o["prologue_fp32"] for o in lnmm)
    text = cli(af_bin, "report", bert_small.path, "--precision_mode=bf16").stdout
    assert "[AF] Precision: bf16" in text


def test_keep_fp32_by_rule_and_by_node(af_bin, bert_small):
    proc = cli(af_bin, "report", bert_small.path, "--precision_mode=bf16", "--json",
               "--keep_fp32=LayerNormMatMulFusionOp")
    prec = json.loads(proc.stdout)["precision"]
    if falls_back(prec):
        return
    ops = prec["ops"]
    for o in ops:
        if "LayerNormMatMulFusionOp" in o["rules"]:
            assert o["precision"] == "fp32" and o["why"] == "--keep_fp32"
    assert any(o["precision"] == "bf16" for o in ops)
    one = next(o["node"] for o in ops if o["precision"] == "bf16")
    ops = json.loads(cli(af_bin, "report", bert_small.path, "--precision_mode=bf16", "--json",
                         f"--keep_fp32={one}").stdout)["precision"]["ops"]
    assert [o["precision"] for o in ops if o["node"] == one] == ["fp32"]


def test_compiled_model_keeps_its_precision(af_bin, resnet18, tmp_path):
    out = str(tmp_path / "r18")
    proc = cli(af_bin, "compile", f"--model={resnet18.path}", f"--output={out}",
               "--precision_mode=bf16")
    assert proc.returncode == 0, proc.stderr
    info = cli(af_bin, "inspect", out + ".afm").stdout
    assert "meta precision_mode: bf16" in info
    direct, compiled = tmp_path / "direct", tmp_path / "compiled"
    for model, d in ((resnet18.path, direct), (out + ".afm", compiled)):
        proc = afc.run(af_bin, model, inputs=resnet18.input_files, output_dir=d,
                       extra=("--precision_mode=bf16",) if model.endswith(".onnx") else ())
        assert proc.returncode == 0, proc.stderr
    a = afc.load_outputs(direct, resnet18.expected)["output"]
    b = afc.load_outputs(compiled, resnet18.expected)["output"]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bad_precision_arguments(af_bin, resnet18, tmp_path):
    proc = afc.run(af_bin, resnet18.path, extra=("--precision_mode=int3",))
    assert proc.returncode == 1 and "unknown precision mode 'int3'" in proc.stderr
    proc = afc.run(af_bin, resnet18.path, extra=("--precision_mode=bf16", "--keep_fp32=NoSuchOp"))
    assert proc.returncode == 1 and "'NoSuchOp' names no fusion rule" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- verify ----

def save_model(path, nodes, inits, x_shape, y_name, y_shape):
    g = helper.make_graph(nodes, os.path.basename(path), [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def ln_overflow(tmp_path_factory):
    """x * 2e5 -> LayerNorm -> MatMul + bias -> MatMul: the LayerNorm's input is beyond half
    precision's largest value (65504), so an fp16 LayerNorm-MatMul overflows to inf/NaN."""
    rng = np.random.default_rng(SEED)
    e = 64
    nodes = [helper.make_node("Mul", ["x", "big"], ["xb"], name="scale_up"),
             helper.make_node("LayerNormalization", ["xb", "g", "b"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "w"], ["mm"], name="proj"),
             helper.make_node("Add", ["mm", "bias"], ["h"], name="proj_bias"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="head")]
    inits = {"big": np.array(2e5), "g": rng.uniform(0.5, 1.5, e), "b": rng.uniform(-.1, .1, e),
             "w": rng.normal(0, 0.1, (e, e)), "bias": rng.normal(0, 0.1, e),
             "w2": rng.normal(0, 0.1, (e, 32))}
    return save_model(str(tmp_path_factory.mktemp("verify") / "ln_overflow.onnx"), nodes, inits,
                      [1, 16, e], "y", [1, 16, 32])


@pytest.fixture(scope="module")
def conv_bn(tmp_path_factory):
    rng = np.random.default_rng(SEED)
    c = 16
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["y"], name="relu")]
    inits = {"w": rng.normal(0, 0.2, (c, 8, 3, 3)), "s": rng.uniform(.5, 2, c),
             "bb": rng.normal(0, .1, c), "m": rng.normal(0, .1, c), "v": rng.uniform(.5, 2, c)}
    return save_model(str(tmp_path_factory.mktemp("verify") / "conv_bn.onnx"), nodes, inits,
                      [1, 8, 12, 12], "y", [1, c, 12, 12])


def test_verify_names_the_overflowing_layernorm_fusion(af_bin, ln_overflow):
    proc = cli(af_bin, "verify", ln_overflow, "--precision_mode=fp16")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "OVER" in out and "max abs inf" in out
    culprit = [ln for ln in out.splitlines() if ln.strip().startswith("proj ")]
    assert culprit and "LayerNormMatMulFusionOp" in culprit[0] and "fp16" in culprit[0], out
    assert "--keep_fp32=proj" in out and "within tolerance with:" in out
    # the printed line fixes it; mixed keeps the LayerNorm in fp32 on its own
    fixed = cli(af_bin, "verify", ln_overflow, "--precision_mode=fp16", "--keep_fp32=proj")
    assert fixed.returncode == 0 and "within tolerance" in fixed.stdout, fixed.stdout
    mixed = cli(af_bin, "verify", ln_overflow, "--precision_mode=mixed")
    assert mixed.returncode == 0, mixed.stdout


def test_verify_names_the_fusion_rule(af_bin, conv_bn):
    proc = cli(af_bin, "verify", conv_bn, "--rtol=0", "--atol=0")
    assert proc.returncode == 1
    assert "AUTOFUSION_DISABLE_LIST=ConvBNReluFusionOp" in proc.stdout, proc.stdout
    fixed = cli(af_bin, "verify", conv_bn, "--rtol=0", "--atol=0",
                env={"AUTOFUSION_DISABLE_LIST": "ConvBNReluFusionOp"})
    assert fixed.returncode == 0, fixed.stdout


def test_verify_passes_within_tolerance(af_bin, bert_small):
    inputs = [f"--input={k}={v}" for k, v in bert_small.input_files.items()]
    proc = cli(af_bin, "verify", bert_small.path, "--precision_mode=bf16", *inputs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cosine" in proc.stdout and "within tolerance" in proc.stdout


def test_verify_bad_tolerance(af_bin, conv_bn):
    proc = cli(af_bin, "verify", conv_bn, "--rtol=abc")
    assert proc.returncode == 2 and "--rtol" in proc.stderr
