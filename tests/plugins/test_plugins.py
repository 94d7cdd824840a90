"""Plugins end to end: custom ops and fusion rules from shared libraries (--plugin, AUTOFUSION_PLUGINS).

  - the example plugin (examples/plugin/): a custom activation and a custom broadcast op fuse
    into conv epilogues, its MishFusionOp rule turns torch's exported Mish (Softplus, Tanh, Mul)
    into one op that then fuses too; outputs against torch / numpy and against the unfused graph;
    the rule in the report, --list-fusions and the switches like a built-in one;
  - a compiled .afm records the custom ops it needs and refuses to load without them;
  - an OPAQUE custom op runs as its own node between fused convs;
  - broken plugins (tests/plugins/test_plugin.c variants) are one-line errors, and rules that
    refuse everything or return a broken match are near misses, never crashes.

$AF_BIN is the binary under test, $AF_EXAMPLE_PLUGIN the example plugin and $AF_PLUGIN_DIR the
test plugins (ctest sets them; the defaults are the release tree).
"""

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
AF_BIN = os.environ.get("AF_BIN", os.path.join(REPO, "build", "autofusion"))
EXAMPLE = os.environ.get("AF_EXAMPLE_PLUGIN", os.path.join(REPO, "build", "libaf_example_plugin.so"))
PLUGIN_DIR = os.environ.get("AF_PLUGIN_DIR", os.path.join(REPO, "build", "tests", "plugins"))
RNG = np.random.default_rng(7)


def plugin_path(name):
    return os.path.join(PLUGIN_DIR, f"plugin_{name}.so")


def af(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOFUSION_PLUGINS", "AUTOFUSION_DISABLE"))}
    e.update(env or {})
    r = subprocess.run([AF_BIN, *args], capture_output=True, text=True, timeout=300, env=e)
    assert r.returncode >= 0, f"autofusion died with signal {-r.returncode}: {r.stderr}"
    assert "Sanitizer" not in r.stderr, r.stderr
    return r


def save_model(path, nodes, inputs, outputs, weights, domains=("ai.example",)):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in weights.items()])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    onnx.save(helper.make_model(g, opset_imports=opsets), path)
    return path


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def conv(x, w, b=None, pad=0):
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                   None if b is None else torch.from_numpy(b), padding=pad)
    return y.numpy().astype(np.float64)


def run(model, tmp, x, *args, env=None):
    """Run model on x (input 'x'); returns output 'y' or fails with autofusion's message."""
    xin, out = os.path.join(tmp, "x.npy"), os.path.join(tmp, "out")
    np.save(xin, x)
    r = af("run", model, f"--input=x={xin}", f"--output_dir={out}", *args, env=env)
    assert r.returncode == 0, r.stderr
    return np.load(os.path.join(out, "y.npy"))


@pytest.fixture(scope="module")
def custom_model(tmp_path_factory):
    """Conv -> ScaledTanh -> Conv1x1 -> Softplus -> Tanh -> Mul -> SquaredDiff(b): every custom
    op of the example plugin, and the Mish pattern its rule fuses."""
    d = tmp_path_factory.mktemp("custom")
    w = {"w1": f32(8, 3, 3, 3, scale=0.3), "b1": f32(8, scale=0.1), "w2": f32(8, 8, 1, 1, scale=0.3),
         "b": f32(8, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("ScaledTanh", ["c1"], ["t1"], name="stanh", domain="ai.example", alpha=1.5, beta=0.5),
        helper.make_node("Conv", ["t1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Softplus", ["c2"], ["sp"], name="softplus"),
        helper.make_node("Tanh", ["sp"], ["th"], name="tanh"),
        helper.make_node("Mul", ["c2", "th"], ["mi"], name="mul"),
        helper.make_node("SquaredDiff", ["mi", "b"], ["y"], name="sqdiff", domain="ai.example"),
    ]
    path = save_model(str(d / "custom.onnx"), nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 20])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 20, 20])], w)

    def reference(x):
        t1 = 1.5 * np.tanh(0.5 * conv(x, w["w1"], w["b1"], pad=1))
        c2 = conv(t1.astype(np.float32), w["w2"])
        return (c2 * np.tanh(np.log1p(np.exp(c2))) - w["b"]) ** 2

    return path, reference, str(d)


@pytest.fixture(scope="module")
def mish_model(tmp_path_factory):
    """A CNN with torch.nn.Mish, exported by torch (Softplus, Tanh, Mul at opset 17)."""
    d = tmp_path_factory.mktemp("mish")
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Mish(),
                            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                            torch.nn.Mish(), torch.nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(1, 3, 24, 24)
    path = str(d / "mish.onnx")
    torch.onnx.export(m, x, path, input_names=["x"], output_names=["y"], opset_version=17)
    with torch.no_grad():
        ref = m(x).numpy()
    return path, x.numpy(), ref, str(d)


def close(got, want, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def report_json(model, tmp, *args, env=None):
    path = os.path.join(tmp, "report.json")
    r = af("compile", f"--model={model}", f"--output={os.path.join(tmp, 'c')}", f"--report={path}",
           *args, env=env)
    assert r.returncode == 0, r.stderr
    with open(path) as f:
        return json.load(f)


def test_custom_ops_fuse_into_conv_epilogues(custom_model):
    path, reference, tmp = custom_model
    x = f32(1, 3, 20, 20)
    y = run(path, tmp, x, f"--plugin={EXAMPLE}")
    close(y, reference(x))
    rep = report_json(path, tmp, f"--plugin={EXAMPLE}")
    gf = rep["graph_fusion"]
    assert gf["MishFusionOp"]["effect_times"] == 1
    assert gf["ElementwiseFusionOp"]["effect_times"] == 2
    assert rep["ops_before"] == 7 and rep["ops_after"] == 2  # two FusedConvs
    # Each conv took its custom ops into its epilogue.
    r = af("inspect", os.path.join(tmp, "c.afm"), f"--plugin={EXAMPLE}")
    assert r.returncode == 0, r.stderr
    assert "from 2 nodes: conv1 stanh" in r.stdout
    assert "by MishFusionOp,ElementwiseFusionOp, from 5 nodes: conv2 softplus tanh mul sqdiff" in r.stdout


def test_custom_ops_in_every_kernel(tmp_path):
    """The custom steps in the epilogues of a Winograd-sized 3x3 conv, a depthwise conv and a
    Gemm, and in a FusedElementwise chain, on every ISA."""
    w = {"w1": f32(32, 32, 3, 3, scale=0.1), "wd": f32(32, 1, 3, 3, scale=0.3), "bd": f32(32, scale=0.1),
         "wf": f32(10, 32 * 20 * 20, scale=0.01), "bf": f32(10, scale=0.1), "b": f32(1, 10),
         "s": f32(1, 32, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1]),
        helper.make_node("ScaledTanh", ["c1"], ["t1"], name="stanh1", domain="ai.example", alpha=2.0),
        helper.make_node("Conv", ["t1", "wd", "bd"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=32),
        helper.make_node("Softplus", ["c2"], ["sp"], name="softplus"),
        helper.make_node("Tanh", ["sp"], ["th"], name="tanh"),
        helper.make_node("Mul", ["th", "c2"], ["mi"], name="mul"),
        helper.make_node("Flatten", ["mi"], ["fl"], name="flatten"),
        helper.make_node("Gemm", ["fl", "wf", "bf"], ["g"], name="fc", transB=1),
        helper.make_node("ScaledTanh", ["g"], ["t2"], name="stanh2", domain="ai.example", beta=0.3),
        helper.make_node("SquaredDiff", ["b", "t2"], ["y1"], name="sqdiff", domain="ai.example"),
        # A chain with no conv before it: one FusedElementwise over the input.
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("SquaredDiff", ["r", "s"], ["q"], name="sqdiff2", domain="ai.example"),
        helper.make_node("ScaledTanh", ["q"], ["y2"], name="stanh3", domain="ai.example", alpha=0.5),
    ]
    path = save_model(str(tmp_path / "paths.onnx"), nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 20, 20])],
                      [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 10]),
                       helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 32, 20, 20])], w)
    x = f32(1, 32, 20, 20)
    t1 = 2.0 * np.tanh(conv(x, w["w1"], pad=1)).astype(np.float32)
    c2 = torch.nn.functional.conv2d(torch.from_numpy(t1), torch.from_numpy(w["wd"]),
                                    torch.from_numpy(w["bd"]), padding=1, groups=32).numpy().astype(np.float64)
    mi = c2 * np.tanh(np.log1p(np.exp(c2)))
    g = mi.reshape(1, -1) @ w["wf"].T.astype(np.float64) + w["bf"]
    y1 = (w["b"] - np.tanh(0.3 * g)) ** 2
    y2 = 0.5 * np.tanh((np.maximum(x, 0) - w["s"]) ** 2)
    rep = report_json(path, str(tmp_path), f"--plugin={EXAMPLE}")
    assert rep["graph_fusion"]["MishFusionOp"]["effect_times"] == 1
    assert rep["ops_after"] == 5, rep  # 3x3 conv, depthwise conv, Flatten, Gemm, FusedElementwise
    inp, out = str(tmp_path / "x.npy"), str(tmp_path / "out")
    np.save(inp, x)
    for isa in ("avx512", "avx2", "generic", "reference"):
        for threads in ("1", "2"):
            r = af("run", path, f"--input=x={inp}", f"--output_dir={out}", f"--plugin={EXAMPLE}",
                   f"--threads={threads}", env={"AUTOFUSION_ISA": isa})
            assert r.returncode == 0, r.stderr
            close(np.load(os.path.join(out, "y1.npy")), y1, rtol=2e-4, atol=2e-4)
            close(np.load(os.path.join(out, "y2.npy")), y2)


def test_fused_matches_unfused_and_switches(custom_model):
    path, reference, tmp = custom_model
    x = f32(1, 3, 20, 20)
    fused = run(path, tmp, x, f"--plugin={EXAMPLE}")
    close(run(path, tmp, x, f"--plugin={EXAMPLE}", "--no_fusion"), fused)
    # The plugin's rule switches off like a built-in one, from the CLI and the environment.
    r = af("report", path, f"--plugin={EXAMPLE}", "--disable_fusion=MishFusionOp")
    assert r.returncode == 0, r.stderr
    assert "Disabled: MishFusionOp (--disable_fusion)" in r.stdout
    assert "Pattern: Mish " not in r.stdout
    r = af("report", path, f"--plugin={EXAMPLE}", env={"AUTOFUSION_DISABLE_LIST": "MishFusionOp"})
    assert "Disabled: MishFusionOp (AUTOFUSION_DISABLE_LIST)" in r.stdout
    close(run(path, tmp, x, f"--plugin={EXAMPLE}", "--disable_fusion=MishFusionOp"), fused)
    close(run(path, tmp, x, f"--plugin={EXAMPLE}", "--disable_fusion=ALL"), fused)
    # verify checks the fused graph against the unfused one with the plugin loaded.
    r = af("verify", path, f"--plugin={EXAMPLE}")
    assert r.returncode == 0, r.stdout + r.stderr


def test_torch_mish_model(mish_model):
    path, x, ref, tmp = mish_model
    close(run(path, tmp, x, f"--plugin={EXAMPLE}"), ref, rtol=1e-4, atol=1e-4)
    with_plugin = report_json(path, tmp, f"--plugin={EXAMPLE}")
    without = report_json(path, tmp)
    assert with_plugin["graph_fusion"]["MishFusionOp"]["effect_times"] == 2
    assert with_plugin["ops_after"] < without["ops_after"]
    # The graph with the rule's Mish ops left as nodes exports as valid ONNX (their domain
    # imported), and that file runs like the model.
    exported = os.path.join(tmp, "mish_ops.onnx")
    r = af("compile", f"--model={path}", f"--output={os.path.join(tmp, 'e')}", f"--plugin={EXAMPLE}",
           "--disable_fusion=ElementwiseFusionOp", f"--export_onnx={exported}")
    assert r.returncode == 0, r.stderr
    m = onnx.load(exported)
    onnx.checker.check_model(m)
    assert [n.op_type for n in m.graph.node if n.domain == "ai.example"] == ["Mish", "Mish"]
    assert "ai.example" in [o.domain for o in m.opset_import]
    close(run(exported, tmp, x, f"--plugin={EXAMPLE}"), ref, rtol=1e-4, atol=1e-4)


def test_list_fusions():
    r = af("--list-fusions", f"--plugin={EXAMPLE}")
    assert r.returncode == 0, r.stderr
    assert "MishFusionOp\n  pattern:    Softplus+Tanh+Mul" in r.stdout
    assert "plugin:     autofusion example plugin (fuses into ai.example:Mish)" in r.stdout
    assert "MishFusionOp" not in af("--list-fusions").stdout
    r = af("--list-fusions", env={"AUTOFUSION_PLUGINS": EXAMPLE})
    assert "MishFusionOp" in r.stdout


def test_model_without_its_plugin(custom_model):
    path, _, tmp = custom_model
    r = af("run", path)
    assert r.returncode != 0
    assert "'ScaledTanh' of domain 'ai.example' is not supported" in r.stderr
    assert "--plugin" in r.stderr and r.stderr.count("\n") == 1


def test_afm_records_its_custom_ops(custom_model):
    path, reference, tmp = custom_model
    afm = os.path.join(tmp, "needs")
    assert af("compile", f"--model={path}", f"--output={afm}", f"--plugin={EXAMPLE}").returncode == 0
    r = af("run", afm + ".afm")
    assert r.returncode != 0
    for op in ("ai.example:ScaledTanh", "ai.example:Mish", "ai.example:SquaredDiff"):
        assert op in r.stderr
    assert r.stderr.count("\n") == 1
    x = f32(1, 3, 20, 20)
    close(run(afm + ".afm", tmp, x, env={"AUTOFUSION_PLUGINS": EXAMPLE}), reference(x))


def test_opaque_custom_op_between_convs(tmp_path):
    w = {"w1": f32(8, 4, 3, 3, scale=0.3), "w2": f32(6, 8, 3, 3, scale=0.3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Reverse", ["r1"], ["v"], name="reverse", domain="ai.test"),
        helper.make_node("Conv", ["v", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    path = save_model(str(tmp_path / "opaque.onnx"), nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 11])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 9, 11])], w,
                      domains=("ai.test",))
    x = f32(1, 4, 9, 11)
    r1 = np.maximum(conv(x, w["w1"], pad=1), 0)[..., ::-1].astype(np.float32)
    want = np.maximum(conv(np.ascontiguousarray(r1), w["w2"], pad=1), 0)
    y = run(path, str(tmp_path), x, f"--plugin={plugin_path('good')}")
    close(y, want)
    # Its rules refused every Conv or returned broken matches: near misses, nothing fused by them.
    r = af("report", path, f"--plugin={plugin_path('good')}")
    assert r.returncode == 0, r.stderr
    assert "Conv conv1: this rule refuses every Conv" in r.stdout
    assert "the plugin's match names an input that does not exist" in r.stdout
    assert "the plugin's match names a node outside the graph" in r.stdout
    assert "ConvBNRelu         Matched: 2" in r.stdout  # the built-in rules still ran


@pytest.mark.parametrize("plugins, message", [
    (["/nonexistent/libnothing.so"], "cannot load plugin '/nonexistent/libnothing.so': no such file"),
    ([__file__], "cannot load plugin"),
    (["no_entry"], "exports no af_plugin_describe (not an autofusion plugin?)"),
    (["null_desc"], "af_plugin_describe returned NULL"),
    (["bad_abi"], "was built for plugin ABI version 2; this autofusion has version 1"),
    ([EXAMPLE, "dup_op"], "op 'ai.example:ScaledTanh' is already defined (by '"),
    (["dup_rule"], "rule 'ConvBNReluFusionOp' is already defined"),
    (["bad_rule"], "rule 'NowhereFusionOp' fuses into 'ai.test:Nowhere', which no plugin defines"),
    (["ours"], "op 'Reverse' is in domain 'ai.onnx': custom ops need a domain of their own"),
])
def test_bad_plugins(custom_model, plugins, message):
    path = custom_model[0]
    paths = [p if os.sep in p else plugin_path(p) for p in plugins]
    r = af("report", path, *[f"--plugin={p}" for p in paths])
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    # The same through the environment, when a session opens the model.
    r = af("report", path, env={"AUTOFUSION_PLUGINS": ":".join(paths)})
    assert r.returncode == 1 and message in r.stderr and "AUTOFUSION_PLUGINS" in r.stderr, r.stderr
