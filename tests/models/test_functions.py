"""Model-local functions (ModelProto.functions: torch's dynamo exporter and onnxscript write them)
are inlined at import, and the result compared with ONNX Runtime: attributes given by the call
(ref_attr_name, also inside a Constant), a default from the function's attribute_proto, one
neither gives (the op's own default applies), a function calling another, two outputs of which
the caller keeps one, and the inlined body fused like any graph (Conv + Relu). Refused by name:
a subgraph inside a function, and a function that calls itself.
"""

import subprocess

import numpy as np
import pytest
from onnx import AttributeProto, FunctionProto, TensorProto, helper, numpy_helper

import autofusion_cli as afc
from against_ort import ours_and_ort
from ort_node import ort_available

F = TensorProto.FLOAT
DOM = "custom.fn"
rng = np.random.default_rng(5)


def ref_attr(name, ref, kind):
    a = AttributeProto()
    a.name, a.ref_attr_name, a.type = name, ref, kind
    return a


def node(op, ins, outs, refs=(), domain="", **attrs):
    n = helper.make_node(op, ins, outs, domain=domain, **attrs)
    n.attribute.extend(refs)
    return n


def function(name, ins, outs, nodes, attrs, defaults=()):
    f = helper.make_function(DOM, name, ins, outs, nodes,
                             [helper.make_opsetid("", 17), helper.make_opsetid(DOM, 1)], attrs)
    # attribute_proto (field 11, defaults) is newer than Debian's onnx 1.12: append it raw
    raw = f.SerializeToString()
    for d in defaults:
        b = d.SerializeToString()
        raw += b"\x5a" + varint(len(b)) + b
    g = FunctionProto()
    g.ParseFromString(raw)
    return g


def varint(v):
    out = b""
    while True:
        out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
        v >>= 7
        if not v:
            return out


def save(path, nodes, inputs, outputs, inits, functions):
    g = helper.make_graph(nodes, "fns", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOM, 1)],
                          functions=functions)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def scale_shift():
    # Y = LeakyRelu(X * alpha + S) + eps, with LeakyRelu's alpha from `slope` when given; Z = X - S
    return function("ScaleShift", ["X", "S"], ["Y", "Z"], [
        node("Constant", [], ["a"], [ref_attr("value_float", "alpha", AttributeProto.FLOAT)]),
        node("Mul", ["X", "a"], ["t"]),
        node("Add", ["t", "S"], ["u"]),
        node("LeakyRelu", ["u"], ["l"], [ref_attr("alpha", "slope", AttributeProto.FLOAT)]),
        node("Constant", [], ["e"], [ref_attr("value_float", "eps", AttributeProto.FLOAT)]),
        node("Add", ["l", "e"], ["Y"]),
        node("Sub", ["X", "S"], ["Z"]),
    ], ["alpha", "slope", "eps"], [helper.make_attribute("eps", 0.5)])


def conv_block():
    # calls ScaleShift (keeping one output), then a conv the fuser takes with its Relu
    return function("ConvBlock", ["X", "W"], ["Y"], [
        node("ScaleShift", ["X", "X"], ["s", ""], [ref_attr("alpha", "gain", AttributeProto.FLOAT)],
             domain=DOM, slope=0.2),
        node("Conv", ["s", "W"], ["c"], pads=[1, 1, 1, 1]),
        node("Relu", ["c"], ["Y"]),
    ], ["gain"])


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_functions_against_ort(af_bin, tmp_path):
    nodes = [
        node("ScaleShift", ["x", "s"], ["y1", "z1"], domain=DOM, alpha=2.0),
        node("ScaleShift", ["x", "s"], ["y2", "z2"], domain=DOM, alpha=-1.5, slope=0.3, eps=1.0),
        node("ConvBlock", ["x", "w"], ["y3"], domain=DOM, gain=0.7),
    ]
    path = save(str(tmp_path / "f.onnx"), nodes,
                [helper.make_tensor_value_info("x", F, [1, 4, 6, 6]), helper.make_tensor_value_info("s", F, [1, 4, 6, 6])],
                [helper.make_tensor_value_info(o, F, None) for o in ["y1", "z1", "y2", "z2", "y3"]],
                [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")],
                [scale_shift(), conv_block()])
    feeds = {"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32),
             "s": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}
    got, want = ours_and_ort(af_bin, path, feeds, tmp_path)
    assert len(want) == 5
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=name)
    rep = subprocess.run([af_bin, "report", path], capture_output=True, text=True, check=False)
    assert rep.returncode == 0 and "ConvBNReluFusionOp" in rep.stdout, rep.stdout + rep.stderr


def refused(af_bin, tmp_path, fn, message):
    path = save(str(tmp_path / "r.onnx"), [node(fn.name, ["x"], ["y"], domain=DOM)],
                [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, None)],
                [], [fn])
    np.save(str(tmp_path / "x.npy"), np.ones(2, np.float32))
    r = afc.run(af_bin, path, inputs={"x": str(tmp_path / "x.npy")})
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_recursion_refused(af_bin, tmp_path):
    fn = function("Again", ["X"], ["Y"], [node("Again", ["X"], ["Y"], domain=DOM)], [])
    refused(af_bin, tmp_path, fn, "calls to function 'Again' nest deeper than 32")


def test_subgraph_in_function_refused(af_bin, tmp_path):
    branch = helper.make_graph([helper.make_node("Identity", ["X"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", F, None)])
    fn = function("Branchy", ["X", "C"], ["Y"], [
        node("If", ["C"], ["Y"], then_branch=branch, else_branch=branch)], [])
    fn.input.pop()  # the condition comes from a constant inside instead
    fn.node.insert(0, helper.make_node("Constant", [], ["C"], value=numpy_helper.from_array(np.array(True), "c")))
    refused(af_bin, tmp_path, fn, "inside function 'Branchy' is not supported")


def test_exponential_inlining_refused(af_bin, tmp_path):
    # F0 calls F1 twice, F1 calls F2 twice...: 2^24 nodes if inlined, refused at 2^18
    fns = [function("F%d" % i, ["X"], ["Y"], [node("F%d" % (i + 1), ["X"], ["t"], domain=DOM),
                                              node("F%d" % (i + 1), ["t"], ["Y"], domain=DOM)], [])
           for i in range(24)]
    fns.append(function("F24", ["X"], ["Y"], [node("Relu", ["X"], ["Y"])], []))
    path = save(str(tmp_path / "e.onnx"), [node("F0", ["x"], ["y"], domain=DOM)],
                [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, None)],
                [], fns)
    np.save(str(tmp_path / "x.npy"), np.ones(2, np.float32))
    r = afc.run(af_bin, path, inputs={"x": str(tmp_path / "x.npy")})
    assert r.returncode != 0 and "inlined functions give more than 262144 nodes" in r.stderr, r.stderr
