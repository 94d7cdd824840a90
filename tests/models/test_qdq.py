"""Statically quantized models (issue 18): QDQ as Debian's torch 1.13 exports an eager
post-training-quantized model (qnnpack qconfig, opset 13: QuantizeLinear -> Cast ->
DequantizeLinear around float ops, int8 weights and int32 biases read through
DequantizeLinear), and the QOperator form built with onnx.helper (QLinearConv, QLinearMatMul; the com.microsoft ops
QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
QLinearGlobalAveragePool).
Both must become quantized FusedConv / FusedMatMul nodes (the int8 rule, fusion/rules/quant.c;
QLinear* through the QDQ form of passes/qdq.c) and agree with ONNX Runtime, which runs them with
integer kernels: 99.9% of the output elements within one quantization step of the output (the
float path rounds differently from the integer requantization now and then).
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
from ort_node import ort_available, ort_int8_exact, ort_outputs

RNG = np.random.default_rng(18)


class TinyNet(torch.nn.Module):
    """conv+relu, max pool, a residual block (conv+relu, conv, add+relu), average pool, linear:
    the ops of a quantized ResNet at a tiny size."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = torch.nn.ReLU()
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.relu2 = torch.nn.ReLU()
        self.conv3 = torch.nn.Conv2d(8, 8, 1)
        self.add = torch.nn.quantized.FloatFunctional()
        self.gap = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.pool(self.relu1(self.conv1(self.quant(x))))
        y = self.conv3(self.relu2(self.conv2(x)))
        x = self.add.add_relu(x, y)
        return self.dequant(self.fc(torch.flatten(self.gap(x), 1)))


def export_torch_qdq(path):
    torch.manual_seed(0)
    torch.backends.quantized.engine = "qnnpack"
    m = TinyNet().eval()
    torch.ao.quantization.fuse_modules(m, [["conv1", "relu1"], ["conv2", "relu2"]], inplace=True)
    m.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    torch.ao.quantization.prepare(m, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(2, 3, 16, 16))
    torch.ao.quantization.convert(m, inplace=True)
    torch.onnx.export(m, torch.randn(1, 3, 16, 16), path, opset_version=13,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})


def make_qoperator(path):
    """QuantizeLinear -> QLinearConv (per-channel int8 weights, int32 bias) -> QLinearMatMul
    (after a Reshape of the uint8 tensor) -> DequantizeLinear."""
    w1 = RNG.integers(-100, 100, (6, 3, 3, 3)).astype(np.int8)
    w1s = np.linspace(0.004, 0.01, 6).astype(np.float32)
    b1 = RNG.integers(-2000, 2000, 6).astype(np.int32)
    w2 = RNG.integers(10, 250, (6 * 8 * 8, 5)).astype(np.uint8)  # zero point 130: int8 after
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (np.array(0.02, np.float32), "xs"), (np.array(128, np.uint8), "xz"),
        (w1, "w1"), (w1s, "w1s"), (np.zeros(6, np.int8), "w1z"), (b1, "b1"),
        (np.array(0.03, np.float32), "ys"), (np.array(5, np.uint8), "yz"),
        (np.array([2, -1], np.int64), "shape"),
        (w2, "w2"), (np.array(0.002, np.float32), "w2s"), (np.array(130, np.uint8), "w2z"),
        (np.array(0.05, np.float32), "zs"), (np.array(120, np.uint8), "zz"))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "xs", "xz", "w1", "w1s", "w1z", "ys", "yz", "b1"],
                         ["yq"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Reshape", ["yq", "shape"], ["rq"]),
        helper.make_node("QLinearMatMul", ["rq", "ys", "yz", "w2", "w2s", "w2z", "zs", "zz"], ["zq"]),
        helper.make_node("DequantizeLinear", ["zq", "zs", "zz"], ["y"]),
    ]
    g = helper.make_graph(nodes, "qop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)


def make_qoperator_ms(path):
    """The com.microsoft QOperator ops onnxruntime.quantization writes, after a QLinearConv:
    QLinearLeakyRelu, QLinearSigmoid, QLinearAdd and QLinearMul (broadcasting a per-channel
    tensor), QLinearConcat, QLinearGlobalAveragePool; uint8 activations, int8 weights."""
    w = RNG.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8)
    c = RNG.integers(0, 256, (1, 4, 1, 1)).astype(np.uint8)
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (np.array(0.02, np.float32), "xs"), (np.array(128, np.uint8), "xz"),
        (w, "w"), (np.array(0.006, np.float32), "ws"), (np.array(0, np.int8), "wz"),
        (np.array(0.03, np.float32), "ys"), (np.array(120, np.uint8), "yz"),
        (np.array(0.02, np.float32), "ls"), (np.array(100, np.uint8), "lz"),
        (np.array(1.0 / 256, np.float32), "ss"), (np.array(0, np.uint8), "sz"),
        (np.array(0.025, np.float32), "as_"), (np.array(90, np.uint8), "az"),
        (c, "c"), (np.array(0.01, np.float32), "cs"), (np.array(128, np.uint8), "cz"),
        (np.array(0.015, np.float32), "ms"), (np.array(110, np.uint8), "mz"),
        (np.array(0.03, np.float32), "ks"), (np.array(100, np.uint8), "kz"),
        (np.array(0.01, np.float32), "gs"), (np.array(80, np.uint8), "gz"))]
    ms = "com.microsoft"
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("QLinearLeakyRelu", ["yq", "ys", "yz", "ls", "lz"], ["lq"], domain=ms,
                         alpha=0.1),
        helper.make_node("QLinearSigmoid", ["lq", "ls", "lz", "ss", "sz"], ["sq"], domain=ms),
        helper.make_node("QLinearAdd", ["lq", "ls", "lz", "sq", "ss", "sz", "as_", "az"], ["aq"],
                         domain=ms),
        helper.make_node("QLinearMul", ["aq", "as_", "az", "c", "cs", "cz", "ms", "mz"], ["mq"],
                         domain=ms),
        helper.make_node("QLinearConcat", ["ks", "kz", "mq", "ms", "mz", "lq", "ls", "lz"], ["kq"],
                         domain=ms, axis=1),
        helper.make_node("QLinearGlobalAveragePool", ["kq", "ks", "kz", "gs", "gz"], ["gq"],
                         domain=ms, channels_last=0),
        helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["y"]),
    ]
    g = helper.make_graph(nodes, "qop_ms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 1, 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(ms, 1)])
    m.ir_version = 8
    onnx.save(m, path)


def output_step(model_path):
    """The scale of the DequantizeLinear writing the graph output (one quantization step)."""
    m = onnx.load(model_path)
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    out = m.graph.output[0].name
    dq = next(n for n in m.graph.node if out in n.output)
    assert dq.op_type == "DequantizeLinear"
    return float(consts[dq.input[1]])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdq")
    export_torch_qdq(str(d / "torch_qdq.onnx"))
    make_qoperator(str(d / "qoperator.onnx"))
    make_qoperator_ms(str(d / "qoperator_ms.onnx"))
    return d


def report(af_bin, model, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([af_bin, "compile", f"--model={model}", f"--output={tmp_path / 'm'}",
                           f"--report={out}", f"--export_onnx={tmp_path / 'fused.onnx'}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), onnx.load(str(tmp_path / "fused.onnx"))


@pytest.mark.parametrize("name,inp,shape,cores", [
    ("torch_qdq.onnx", "input", (8, 3, 16, 16), 4),  # three convs and the linear layer
    ("qoperator.onnx", "x", (2, 3, 16, 16), 2),
    ("qoperator_ms.onnx", "x", (2, 3, 10, 10), 1),
])
def test_quantized_model_fuses_int8(af_bin, models, tmp_path, name, inp, shape, cores):
    rep, fused = report(af_bin, models / name, tmp_path)
    rule = rep["graph_fusion"]["QuantConvMatMulFusionOp"]
    assert rule["effect_times"] == cores, rule
    ops = [n.op_type for n in fused.graph.node]
    for gone in ("QLinearConv", "QLinearMatMul", "Conv", "MatMul", "Gemm", "QLinearAdd",
                 "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                 "QLinearGlobalAveragePool", "QuantizeLinear", "DequantizeLinear"):
        assert gone not in ops, ops
    quant = [n for n in fused.graph.node if any(a.name == "quant" and a.i == 1 for a in n.attribute)]
    assert len(quant) == cores, ops
    q = rep["quantization"]
    assert q["int8_cores"] + len(q["float_cores"]) == cores, q
    for c in q["float_cores"]:  # only the lowering may keep one in float32, and says why
        assert c["why"], c


@pytest.mark.skipif(ort_int8_exact() and not ort_available(), reason="onnxruntime-node is not installed")
@pytest.mark.parametrize("name,inp,shape", [
    ("torch_qdq.onnx", "input", (8, 3, 16, 16)),
    ("qoperator.onnx", "x", (2, 3, 16, 16)),
    ("qoperator_ms.onnx", "x", (2, 3, 10, 10)),
])
def test_quantized_model_against_onnx_runtime(af_bin, models, tmp_path, monkeypatch, name, inp, shape):
    """Where ONNX Runtime's int8 kernels saturate (no VNNI: ort_int8_exact), our reference
    executor (the plain reference kernels, double accumulation) is the reference instead."""
    x = RNG.standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model = str(models / name)
    if ort_int8_exact():
        (tmp_path / "ort").mkdir()
        ref = next(iter(ort_outputs(model, {inp: x}, str(tmp_path / "ort")).values()))
    else:
        monkeypatch.setenv("AUTOFUSION_ISA", "reference")
        proc = afc.run(af_bin, model, inputs={inp: str(tmp_path / "x.npy")}, output_dir=str(tmp_path / "ref"))
        monkeypatch.delenv("AUTOFUSION_ISA")
        assert proc.returncode == 0, proc.stderr
        ref = np.load(next((tmp_path / "ref").glob("*.npy")))
    for extra in ((), ("--no_fusion",)):
        out = tmp_path / ("ours" + "".join(extra))
        proc = afc.run(af_bin, model, inputs={inp: str(tmp_path / "x.npy")}, output_dir=str(out),
                       extra=extra)
        assert proc.returncode == 0, proc.stderr
        got = np.load(next(out.glob("*.npy")))
        assert got.shape == ref.shape
        step = output_step(model)
        within = np.abs(got - ref) <= step * 1.001
        assert within.mean() >= 0.999, (extra, within.mean(), np.abs(got - ref).max(), step)


def bad_ms_model(path, op, inputs, input_types, **attrs):
    init = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.uint8), "z"),
            numpy_helper.from_array(np.array([0.1, 0.2], np.float32), "s2"),
            numpy_helper.from_array(np.array(3, np.int8), "z8")]
    ins = [helper.make_tensor_value_info(n, t, d) for n, t, d in input_types]
    g = helper.make_graph([helper.make_node(op, inputs, ["y"], name="bad", domain="com.microsoft", **attrs)],
                          "bad", ins, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.save(m, path)


U8 = TensorProto.UINT8


@pytest.mark.parametrize("op,inputs,types,attrs,word", [
    ("QLinearAdd", ["a", "s"], [("a", U8, [2, 3])], {}, "input 3 or its scale is missing"),
    ("QLinearAdd", ["a", "s", "z", "b", "s", "z", "s", "z"], [("a", U8, [2, 3]), ("b", U8, [4, 3])], {},
     "do not broadcast"),
    ("QLinearAdd", ["a", "s", "z8", "a", "s", "z", "s", "z"], [("a", U8, [2, 3])], {}, "zero point of input 0"),
    ("QLinearMul", ["a", "s2", "z", "a", "s", "z", "s", "z"], [("a", U8, [2, 2])], {}, "not one float"),
    ("QLinearGlobalAveragePool", ["a", "s", "z", "s", "z"], [("a", U8, [5])], {}, "rank 1"),
    ("QLinearConcat", ["s", "z", "a", "s"], [("a", U8, [2, 3])], {"axis": 0}, "triples"),
    ("QLinearConcat", ["s", "z", "a", "s", "z", "a", "s", "z"], [("a", U8, [2, 3])], {"axis": 7}, "axis"),
    ("QLinearConcat", ["s", "z", "a", "s", "z", "b", "s", "z"], [("a", U8, [2, 3]), ("b", U8, [2, 4])],
     {"axis": 0}, "differs in dim 1"),
    ("QLinearSigmoid", ["a", "s", "z", "s", "z"], [("a", TensorProto.FLOAT, [2, 3])], {}, "not 8-bit"),
])
def test_malformed_qoperator_ops_fail_cleanly(af_bin, tmp_path, op, inputs, types, attrs, word):
    path = str(tmp_path / "bad.onnx")
    bad_ms_model(path, op, inputs, types, **attrs)
    proc = afc.run(af_bin, path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "node 'bad'" in proc.stderr and word in proc.stderr, proc.stderr


def test_channels_last_gap_keeps_its_kernel(af_bin, tmp_path):
    """A QLinearGlobalAveragePool with channels_last has no QDQ form: its reference kernel runs."""
    path = str(tmp_path / "gap.onnx")
    bad_ms_model(path, "QLinearGlobalAveragePool", ["a", "s", "z", "s", "z"], [("a", U8, [1, 3, 3, 2])],
                 channels_last=1)
    a = RNG.integers(0, 256, (1, 3, 3, 2)).astype(np.uint8)
    np.save(tmp_path / "a.npy", a)
    proc = afc.run(af_bin, path, inputs={"a": str(tmp_path / "a.npy")}, output_dir=str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    mean = ((a.astype(np.float64) - 3) * 0.1).mean(axis=(1, 2), keepdims=True)
    want = np.clip(np.rint(mean / 0.1) + 3, 0, 255).astype(np.uint8)
    assert got.shape == (1, 1, 1, 2) and np.array_equal(got, want)


def make_qdq_conv(path, opset):
    """x -> Q -> DQ -> Conv(DQ(int8 W)) -> Relu -> Q -> DQ at `opset`: opset 10 (per-tensor only, no
    axis attribute), 13 and 17 (weights per output channel, axis 0)."""
    w = RNG.integers(-120, 120, (6, 3, 3, 3)).astype(np.int8)
    per_channel = opset >= 13
    ws = np.linspace(0.003, 0.008, 6).astype(np.float32) if per_channel else np.array(0.005, np.float32)
    wz = np.zeros(6, np.int8) if per_channel else np.array(0, np.int8)
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (np.array(0.02, np.float32), "xs"), (np.array(128, np.uint8), "xz"), (w, "w"), (ws, "ws"),
        (wz, "wz"), (RNG.standard_normal(6).astype(np.float32), "b"),
        (np.array(0.01, np.float32), "ys"), (np.array(0, np.uint8), "yz"))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], **({"axis": 0} if per_channel else {})),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 9, 9])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, path)


@pytest.mark.parametrize("opset", [10, 13, 17])
def test_qdq_conv_opsets(af_bin, tmp_path, opset):
    path = str(tmp_path / "qdq_conv.onnx")
    make_qdq_conv(path, opset)
    rep, fused = report(af_bin, path, tmp_path)
    assert rep["graph_fusion"]["QuantConvMatMulFusionOp"]["effect_times"] == 1
    assert [n.op_type for n in fused.graph.node] == ["FusedConv"]
    x = RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for extra in ((), ("--no_fusion",)):
        out = tmp_path / ("ours" + "".join(extra))
        proc = afc.run(af_bin, path, inputs={"x": str(tmp_path / "x.npy")}, output_dir=str(out), extra=extra)
        assert proc.returncode == 0, proc.stderr
        outs[extra] = np.load(out / "y.npy")
    # the exact result, from the file's own arithmetic in float64
    ref = exact_qdq_conv(path, x)
    for got in outs.values():
        assert (np.abs(got - ref) <= 0.01 * 1.001).mean() >= 0.999
    # ONNX Runtime 1.30 rejects its own QDQ rewrite of an opset-10 model (a Round it inserts
    # needs opset 11), and is exact only with VNNI (ort_int8_exact)
    if opset >= 13 and ort_available() and ort_int8_exact():
        (tmp_path / "ort").mkdir()
        ort = ort_outputs(path, {"x": x}, str(tmp_path / "ort"))["y"]
        assert (np.abs(outs[()] - ort) <= 0.01 * 1.001).mean() >= 0.999


def exact_qdq_conv(path, x):
    """make_qdq_conv's model computed in float64 with torch: Q/DQ of x, the dequantized weights,
    conv, ReLU, Q/DQ of the result (round half to even, as QuantizeLinear)."""
    i = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(path).graph.initializer}
    xd = (np.clip(np.rint(x.astype(np.float64) / i["xs"]) + i["xz"], 0, 255) - i["xz"]) * i["xs"]
    ws = i["ws"].reshape(-1, 1, 1, 1) if i["ws"].ndim else i["ws"]
    c = torch.nn.functional.conv2d(torch.from_numpy(xd), torch.from_numpy(i["w"] * ws),
                                   torch.from_numpy(i["b"]), padding=1).numpy()
    return (np.clip(np.rint(np.maximum(c, 0) / i["ys"]) + i["yz"], 0, 255) - i["yz"]) * i["ys"]


def test_verify_judges_a_quantized_file_by_cosine(af_bin, models):
    """verify on a model quantized in its file compares int8 against the float Q/DQ graph by
    each output's cosine (single elements move by whole steps); --rtol asks for the element
    rule instead."""
    model = models / "torch_qdq.onnx"
    proc = subprocess.run([af_bin, "verify", str(model)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fused, int8 (the model's quantization), against unfused fp32 (cosine >= 0.99)" in proc.stdout
    assert "within tolerance" in proc.stdout
    proc = subprocess.run([af_bin, "verify", str(model), "--rtol=1e-3"], capture_output=True, text=True)
    assert "(rtol 0.001, atol 0.0001)" in proc.stdout, proc.stdout
