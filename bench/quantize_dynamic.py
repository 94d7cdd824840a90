#!/usr/bin/python3
"""Write a dynamically quantized copy of a float32 model, in the form
onnxruntime.quantization.quantize_dynamic gives it (that package is not installable here):
every Conv and every MatMul/Gemm with a constant float32 weight becomes

    DynamicQuantizeLinear(x) -> ConvInteger | MatMulInteger (int8 weights, per tensor,
    symmetric: zero point 0) -> Cast(float) -> Mul(x_scale * w_scale) [-> Add(bias)]

    /usr/bin/python3 bench/quantize_dynamic.py IN.onnx OUT.onnx

For benchmarks (BENCHMARKS.md "Quantized models") and tests; Gemm is taken only without
transposes, alpha or beta other than 1.
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def quantize(src, dst):
    m = onnx.load(src)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    nodes, new_inits, k = [], [], 0

    def const(a, name):
        new_inits.append(numpy_helper.from_array(a, name))
        return name

    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        w = inits.get(n.input[1]) if len(n.input) > 1 else None
        ok = w is not None and w.data_type == TensorProto.FLOAT and (
            n.op_type == "Conv" or (n.op_type == "MatMul" and len(w.dims) == 2) or
            (n.op_type == "Gemm" and len(w.dims) == 2 and not attrs.get("transA", 0) and
             attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0))
        if not ok:
            nodes.append(n)
            continue
        k += 1
        p = f"dq{k}"
        wf = numpy_helper.to_array(w)
        if n.op_type == "Gemm" and attrs.get("transB", 0):
            wf = wf.T
        scale = np.float32(max(np.abs(wf).max(), 1e-8) / 127.0)
        wq = np.clip(np.rint(wf / scale), -127, 127).astype(np.int8)
        nodes.append(helper.make_node("DynamicQuantizeLinear", [n.input[0]], [p + "_xq", p + "_xs", p + "_xzp"]))
        op = "ConvInteger" if n.op_type == "Conv" else "MatMulInteger"
        extra = {a: v for a, v in attrs.items() if a in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")} if op == "ConvInteger" else {}
        nodes.append(helper.make_node(op, [p + "_xq", const(wq, p + "_w"), p + "_xzp", const(np.int8(0), p + "_wzp")], [p + "_i32"], **extra))
        nodes.append(helper.make_node("Cast", [p + "_i32"], [p + "_f"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [p + "_xs", const(scale, p + "_ws")], [p + "_s"]))
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        out = n.output[0]
        nodes.append(helper.make_node("Mul", [p + "_f", p + "_s"], [p + "_m" if bias else out]))
        if bias:
            b = numpy_helper.to_array(inits[bias])
            if n.op_type == "Conv":
                b = b.reshape(1, -1, *([1] * (len(w.dims) - 2)))
            nodes.append(helper.make_node("Add", [p + "_m", const(b.astype(np.float32), p + "_b")], [out]))
    used = {i for n in nodes for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    print(f"{dst}: {k} Conv/MatMul/Gemm quantized dynamically")


if __name__ == "__main__":
    quantize(sys.argv[1], sys.argv[2])
