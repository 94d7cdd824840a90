#!/usr/bin/python3
"""Quantized models, ours against ONNX Runtime on the same inputs: the share of output elements
within one quantization step of ONNX Runtime's (issue 18's target: 99.9%), the largest
difference in steps, and the cosine similarity. The step of an output is the scale of the
DequantizeLinear that makes it (per tensor); an output made otherwise is compared in units of
its range / 255.

    PYTHONPATH=build/python /usr/bin/python3 bench/qdq_agreement.py A.onnx [B.onnx ...] \
        [--inputs 3] [--threads 1]

Inputs are random normal images of the declared shapes (batch 1 for a symbolic batch).
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_node import ort_outputs  # noqa: E402

import autofusion  # noqa: E402

NP = {1: np.float32, 2: np.uint8, 3: np.int8, 6: np.int32, 7: np.int64, 10: np.float16}


def output_steps(model):
    """{output name: its DequantizeLinear's per-tensor scale} where there is one."""
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    prod = {o: n for n in g.node for o in n.output}
    steps = {}
    for o in g.output:
        n = prod.get(o.name)
        while n is not None and n.op_type in ("Identity", "Flatten", "Reshape"):
            n = prod.get(n.input[0])
        if n is not None and n.op_type == "DequantizeLinear" and n.input[1] in consts:
            s = consts[n.input[1]]
            if s.size == 1:
                steps[o.name] = float(s.reshape(()))
    return steps


def random_inputs(model, rng):
    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(NP[t.elem_type])
    return feeds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--inputs", type=int, default=3, help="random input sets per model")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    print("| model | outputs compared | within one step | largest diff (steps) | cosine |")
    print("|---|--:|--:|--:|--:|")
    for path in a.models:
        model = onnx.load(path, load_external_data=False)
        steps = output_steps(model)
        opts = autofusion.SessionOptions()
        opts.intra_op_num_threads = a.threads
        sess = autofusion.InferenceSession(path, opts)
        rng = np.random.default_rng(0)
        n = within = 0
        worst, dots, na, nb = 0.0, 0.0, 0.0, 0.0
        for _ in range(a.inputs):
            feeds = random_inputs(model, rng)
            ours = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            with tempfile.TemporaryDirectory() as tmp:
                ref = ort_outputs(path, feeds, tmp)
            for name, r in ref.items():
                o = ours[name].astype(np.float64).ravel()
                r = r.astype(np.float64).ravel()
                step = steps.get(name) or (float(r.max() - r.min()) / 255 or 1.0)
                d = np.abs(o - r) / step
                n += d.size
                within += int((d <= 1 + 1e-3).sum())
                worst = max(worst, float(d.max()))
                dots += float(o @ r)
                na += float(o @ o)
                nb += float(r @ r)
        cos = dots / max(np.sqrt(na * nb), 1e-30)
        print(f"| {os.path.basename(path)} | {n} | {100.0 * within / max(n, 1):.2f}% | {worst:.2f} | {cos:.5f} |")


if __name__ == "__main__":
    main()
