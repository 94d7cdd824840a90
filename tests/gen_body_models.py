#!/usr/bin/python3
"""Models for tests/test_bodies.c: the bodies of If, Loop and Scan through the compile pipeline.

    /usr/bin/python3 tests/gen_body_models.py OUT_DIR

Writes OUT_DIR/NAME.onnx, small graphs built with onnx.helper whose control-flow bodies read
weights of the main graph (captures), as exporters of scripted models write them:
  - if_gemm: If(c) with Gemm+Relu / Gemm(transB)+Sigmoid branches;
  - loop_matmul: a Loop carrying [2, 8] through MatMul+Add+Tanh, with a scan output;
  - loop_unknown: the same with the body's carried input of unknown shape;
  - scan_rnn: a Scan computing an RNN cell (two MatMuls, Add, Tanh) per step;
  - loop_if: an If inside a Loop body, its branches reading weights two graphs up;
  - const_if: If over a Constant(true) node;
  - shape_if: If over Equal(Shape(x)[0], 4), decided by the input's known shape;
  - loop_const_if: an If inside a Loop body over a main-graph constant flag;
  - if_dead_branch: If(c) whose else branch cannot run with x's shape (an LSTM given a 2-D X),
    as Silero VAD's 8 kHz branch given 16 kHz frames.

Invariant: deterministic (fixed seed); every weight a main-graph initializer; float32.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(4242)
F = TensorProto.FLOAT


def w(name, shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def gemm_branch(name, x, weight, bias, act, out, shape, trans_b=0):
    """A branch computing act(Gemm(x, weight, bias)) into `out`."""
    nodes = [helper.make_node("Gemm", [x, weight, bias], [f"{name}_g"], transB=trans_b),
             helper.make_node(act, [f"{name}_g"], [out])]
    return helper.make_graph(nodes, name, [], [vi(out, F, shape)])


def model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "bodies", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="gen")
    onnx.checker.check_model(m, full_check=True)
    return m


def if_node(cond, out, x, shape):
    return helper.make_node(
        "If", [cond], [out],
        then_branch=gemm_branch("then", x, "W1", "B1", "Relu", "t_y", shape),
        else_branch=gemm_branch("else", x, "W2", "B2", "Sigmoid", "e_y", shape, trans_b=1))


def if_weights():
    return [w("W1", (16, 8)), w("B1", (8,)), w("W2", (8, 16)), w("B2", (8,))]


def if_gemm():
    return model([if_node("c", "y", "x", [4, 8])],
                 [vi("x", F, [4, 16]), vi("c", TensorProto.BOOL, [])], [vi("y", F, [4, 8])],
                 if_weights())


def loop_body(s_shape):
    nodes = [helper.make_node("Identity", ["cond"], ["cond_out"]),
             helper.make_node("MatMul", ["s", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "B"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["s1"]),
             helper.make_node("Identity", ["s1"], ["s_scan"])]
    return helper.make_graph(
        nodes, "body",
        [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []), vi("s", F, s_shape)],
        [vi("cond_out", TensorProto.BOOL, []), vi("s1", F, s_shape), vi("s_scan", F, s_shape)])


def loop_model(s_shape):
    node = helper.make_node("Loop", ["trip", "", "s0"], ["s_final", "s_all"],
                            body=loop_body(s_shape))
    return model([node], [vi("s0", F, [2, 8]), vi("trip", TensorProto.INT64, [])],
                 [vi("s_final", F, [2, 8]), vi("s_all", F, [None, 2, 8])],
                 [w("W", (8, 8)), w("B", (8,))])


def scan_rnn():
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "Wx"], ["a"]),
         helper.make_node("MatMul", ["h", "Wh"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["ab", "Bh"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h1"]),
         helper.make_node("Identity", ["h1"], ["h_out"])],
        "cell", [vi("h", F, [1, 8]), vi("x_t", F, [1, 4])],
        [vi("h1", F, [1, 8]), vi("h_out", F, [1, 8])])
    node = helper.make_node("Scan", ["h0", "xs"], ["h_final", "hs"], body=body,
                            num_scan_inputs=1)
    return model([node], [vi("h0", F, [1, 8]), vi("xs", F, [5, 1, 4])],
                 [vi("h_final", F, [1, 8]), vi("hs", F, [5, 1, 8])],
                 [w("Wx", (4, 8)), w("Wh", (8, 8)), w("Bh", (8,))])


def loop_with_if(cond_nodes, weights):
    """A Loop of 4 iterations whose body runs an If over the carried [2, 16] state."""
    body = helper.make_graph(
        cond_nodes + [
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            if_node("pick", "y", "s", [2, 8]),
            helper.make_node("Concat", ["y", "y"], ["s1"], axis=1)],
        "body",
        [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []), vi("s", F, [2, 16])],
        [vi("cond_out", TensorProto.BOOL, []), vi("s1", F, [2, 16])])
    node = helper.make_node("Loop", ["trip", "", "s0"], ["s_final"], body=body)
    trip = numpy_helper.from_array(np.array(4, dtype=np.int64), "trip")
    return model([node], [vi("s0", F, [2, 16])], [vi("s_final", F, [2, 16])],
                 if_weights() + [trip] + weights)


def loop_if():
    two = numpy_helper.from_array(np.array(2, dtype=np.int64), "two")
    return loop_with_if([helper.make_node("Less", ["i", "two"], ["pick"])], [two])


def loop_const_if():
    flag = numpy_helper.from_array(np.array(False), "flag")
    return loop_with_if([helper.make_node("Identity", ["flag"], ["pick"])], [flag])


def const_if():
    c = helper.make_node("Constant", [], ["c"],
                         value=helper.make_tensor("cv", TensorProto.BOOL, [], [True]))
    return model([c, if_node("c", "y", "x", [4, 8])], [vi("x", F, [4, 16])],
                 [vi("y", F, [4, 8])], if_weights())


def shape_if():
    four = numpy_helper.from_array(np.array(4, dtype=np.int64), "four")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "zero"], ["rows"], axis=0),
             helper.make_node("Equal", ["rows", "four"], ["c"]),
             if_node("c", "y", "x", [4, 8])]
    return model(nodes, [vi("x", F, [4, 16])], [vi("y", F, [4, 8])],
                 if_weights() + [four, zero])


def if_dead_branch():
    lstm = helper.make_graph(
        [helper.make_node("LSTM", ["x", "LW", "LR"], ["", "e_h"], hidden_size=8),
         helper.make_node("Reshape", ["e_h", "shape48"], ["e_y"])],
        "else", [], [vi("e_y", F, [4, 8])])
    node = helper.make_node("If", ["c"], ["y"],
                            then_branch=gemm_branch("then", "x", "W1", "B1", "Relu", "t_y", [4, 8]),
                            else_branch=lstm)
    shape48 = numpy_helper.from_array(np.array([4, 8], dtype=np.int64), "shape48")
    return model([node], [vi("x", F, [4, 16]), vi("c", TensorProto.BOOL, [])],
                 [vi("y", F, [4, 8])],
                 if_weights() + [w("LW", (1, 32, 16)), w("LR", (1, 32, 8)), shape48])


MODELS = {
    "if_gemm": if_gemm,
    "loop_matmul": lambda: loop_model([2, 8]),
    "loop_unknown": lambda: loop_model(None),
    "scan_rnn": scan_rnn,
    "loop_if": loop_if,
    "const_if": const_if,
    "shape_if": shape_if,
    "loop_const_if": loop_const_if,
    "if_dead_branch": if_dead_branch,
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, make in MODELS.items():
        onnx.save(make(), os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
