"""No silent slow path (issue 16, item 3): nodes that run on a reference kernel are named.

Models built here with onnx.helper:
  - slow: Conv + Relu (fast kernels), two Hardmax (an op without a fast kernel) and an Abs of
    float64 data (an op with a fast kernel for float32 only), a Reshape (a view: "direct");
  - fast: Conv + Relu + Reshape + MatMul, every node on a fast kernel or a direct one;
  - bn_identity: Conv + BatchNorm + Relu blocks whose BN parameters come through Identity nodes,
    as torch writes a freshly initialised torchvision model.

Checked: `inspect` lists the slow nodes (name, op) or says there are none; the profile names the
kernel kind of every node event (args.kernel); `bench` prints one warning line per graph with
reference nodes, their ops and their share of the run time (and the same in --json), and none
for a model without; the unfused baseline (--no_fusion, bench --compare) of bn_identity folds
the Identity nodes like the fused graph, so nothing warns and both give the same outputs.
"""

import json
import os
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(16)


def const(inits, name, shape, positive=False):
    v = rng.standard_normal(shape).astype(np.float32) * 0.5
    if positive:
        v = np.abs(v) + 0.5
    inits.append(numpy_helper.from_array(v, name))
    return name


def save(path, nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, os.path.basename(path), inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def slow_model(path):
    inits = []
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", const(inits, "w", [4, 4, 3, 3])], ["c"], name="conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Hardmax", ["r"], ["h1"], name="hardmax1", axis=-1),
        helper.make_node("Hardmax", ["h1"], ["h2"], name="hardmax2", axis=1),
        helper.make_node("Reshape", ["h2", "shape"], ["y"], name="flat"),
        helper.make_node("Abs", ["d"], ["z"], name="abs_f64"),
    ]
    return save(path, nodes,
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6]),
                 helper.make_tensor_value_info("d", TensorProto.DOUBLE, [3, 5])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 144]),
                 helper.make_tensor_value_info("z", TensorProto.DOUBLE, [3, 5])],
                inits + [shape])


def fast_model(path):
    inits = []
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", const(inits, "w", [4, 3, 3, 3])], ["c"], name="conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", const(inits, "m", [144, 10])], ["y"], name="fc"),
    ]
    return save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits + [shape])


def bn_identity_model(path):
    """Three Conv + BN + Relu blocks sharing BN parameters through Identity nodes."""
    inits, nodes = [], []
    shared = []
    for p in ("gamma", "beta", "mean", "var"):
        nodes.append(helper.make_node("Identity", [const(inits, p, [4], p in ("gamma", "var"))],
                                      [p + "_shared"], name=p + "_id"))
        shared.append(p + "_shared")
    x = "x"
    for b in range(3):
        nodes.append(helper.make_node("Conv", [x, const(inits, f"w{b}", [4, 4, 3, 3])], [f"c{b}"],
                                      name=f"conv{b}", pads=[1, 1, 1, 1]))
        params = []
        for p in shared:
            nodes.append(helper.make_node("Identity", [p], [f"{p}{b}"], name=f"{p}_id{b}"))
            params.append(f"{p}{b}")
        nodes.append(helper.make_node("BatchNormalization", [f"c{b}"] + params, [f"bn{b}"],
                                      name=f"bn{b}"))
        nodes.append(helper.make_node("Relu", [f"bn{b}"], [f"r{b}"], name=f"relu{b}"))
        x = f"r{b}"
    return save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                [helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1, 4, 7, 7])], inits)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("slowpath")
    return {"slow": slow_model(str(d / "slow.onnx")), "fast": fast_model(str(d / "fast.onnx")),
            "bn_identity": bn_identity_model(str(d / "bn_identity.onnx")), "dir": d}


def af(af_bin, *args):
    p = subprocess.run([af_bin, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def bench(af_bin, model, *args):
    return af(af_bin, "bench", model, "--iterations=3", "--warmup=1", "--threads=2", *args)


SLOW_WARNING = re.compile(r"^warning: 3 nodes ran on reference kernels \(Hardmax x2, Abs x1\): "
                          r"\d+% of the run time$")


def test_inspect_lists_reference_nodes(af_bin, models):
    out = str(models["dir"] / "slow")
    af(af_bin, "compile", f"--model={models['slow']}", f"--output={out}")
    text = af(af_bin, "inspect", out + ".afm").stdout
    lines = text.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("reference kernels: ")]
    assert len(head) == 1, text
    assert lines[head[0]].startswith("reference kernels: 3 nodes, a slow path"), text
    assert sorted(lines[head[0] + 1:head[0] + 4]) == [
        "    abs_f64 (Abs)", "    hardmax1 (Hardmax)", "    hardmax2 (Hardmax)"], text
    assert not lines[head[0] + 4].startswith("    "), text

    out = str(models["dir"] / "fast")
    af(af_bin, "compile", f"--model={models['fast']}", f"--output={out}")
    text = af(af_bin, "inspect", out + ".afm").stdout
    assert "reference kernels: none (every node runs on a fast kernel or needs none)" in text


def test_profile_names_kernel_kind(af_bin, models):
    trace = str(models["dir"] / "slow_trace.json")
    bench(af_bin, models["slow"], f"--profile={trace}")
    with open(trace) as f:
        events = [e for e in json.load(f) if e["cat"] == "Node"]
    kinds = {}
    for e in events:
        kinds.setdefault(e["name"][:-len("_kernel_time")], set()).add(e["args"]["kernel"])
    assert kinds.pop("hardmax1") == {"reference"}
    assert kinds.pop("hardmax2") == {"reference"}
    assert kinds.pop("abs_f64") == {"reference"}
    assert kinds.pop("flat") == {"direct"}  # a Reshape: a view, no slow path
    assert kinds and all(k == {"fast"} for k in kinds.values()), kinds  # conv (+relu), reorders


def test_bench_warns_once_with_share(af_bin, models):
    p = bench(af_bin, models["slow"])
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning")]
    assert len(warnings) == 1 and SLOW_WARNING.match(warnings[0]), p.stderr
    share = int(re.search(r"(\d+)% of", warnings[0]).group(1))
    assert 0 <= share <= 100

    p = bench(af_bin, models["slow"], "--json")
    r = json.loads(p.stdout)["fused"]
    assert r["reference_nodes"] == 3 and r["reference_ops"] == "Hardmax x2, Abs x1"
    assert 0 < r["reference_share"] <= 1

    # with --compare: one line for each graph that has reference nodes
    p = bench(af_bin, models["slow"], "--compare")
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning")]
    assert len(warnings) == 2 and SLOW_WARNING.match(warnings[0]), p.stderr
    assert warnings[1].startswith("warning: unfused graph: 3 nodes ran on reference kernels ("), p.stderr


@pytest.mark.parametrize("args", [(), ("--no_fusion",), ("--compare",), ("--compare", "--json")])
def test_bench_no_warning_without_reference_nodes(af_bin, models, args):
    for name in ("fast", "bn_identity"):
        p = bench(af_bin, models[name], *args)
        assert "warning" not in p.stderr, (name, p.stderr)
        if "--json" in args:
            r = json.loads(p.stdout)
            assert r["fused"]["reference_nodes"] == 0 and r["unfused"]["reference_nodes"] == 0


def test_unfused_baseline_simplified(af_bin, models):
    """bn_identity unfused: the Identity nodes fold, the BatchNorms run on fast kernels (no
    reference node in the trace), and the outputs are the fused graph's."""
    trace = str(models["dir"] / "bn_unfused.json")
    bench(af_bin, models["bn_identity"], "--no_fusion", f"--profile={trace}")
    with open(trace) as f:
        events = [e for e in json.load(f) if e["cat"] == "Node"]
    ops = {e["args"]["op_name"] for e in events}
    assert "Identity" not in ops and "BatchNormalization" not in ops, ops
    assert "FusedElementwise" in ops and "Relu" in ops  # BN as scale-and-shift, nothing fused
    assert all(e["args"]["kernel"] != "reference" for e in events)
    x = rng.standard_normal([1, 4, 7, 7]).astype(np.float32)
    np.save(models["dir"] / "x.npy", x)
    outs = {}
    for mode in ("fused", "unfused"):
        d = models["dir"] / mode
        af(af_bin, "run", models["bn_identity"], f"--input=x={models['dir'] / 'x.npy'}",
           f"--output_dir={d}", *(["--no_fusion"] if mode == "unfused" else []))
        outs[mode] = np.load(d / "r2.npy")
    np.testing.assert_allclose(outs["unfused"], outs["fused"], rtol=1e-4, atol=1e-5)


def test_warning_lists_many_ops_cut(af_bin, models):
    """27 float64 unary nodes of 26 ops (Identity is direct): the op list ends with "..." where
    the C API's 256-byte field ends, the count stays exact."""
    ops = ["Abs", "Neg", "Exp", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Atan", "Sinh",
           "Cosh", "Asinh", "Tanh", "Relu", "Sigmoid", "Softplus", "Softsign", "Erf", "Celu",
           "Elu", "Selu", "HardSigmoid", "Identity", "Abs", "ThresholdedRelu", "LeakyRelu",
           "Shrink"]
    nodes, x = [], "x"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [x], [f"t{i}"], name=f"n{i}"))
        x = f"t{i}"
    path = save(str(models["dir"] / "many.onnx"), nodes,
                [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
                [helper.make_tensor_value_info(x, TensorProto.DOUBLE, [4])], [])
    p = bench(af_bin, path, "--json")
    r = json.loads(p.stdout)["fused"]
    assert r["reference_nodes"] == 27
    assert r["reference_ops"].startswith("Abs x2, Asinh x1, ") and r["reference_ops"].endswith("...")
    assert len(r["reference_ops"]) <= 255
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 27 nodes ran on reference "
                                                         "kernels (Abs x2, "), p.stderr
