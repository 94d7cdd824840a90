#!/usr/bin/python3
"""Data-movement and broadcast ops on real shapes (issue 16): one-node ONNX models timed with
autofusion (one or more binaries, e.g. before and after a change) and ONNX Runtime, interleaved
round by round so that a drifting machine affects every column alike.

    /usr/bin/python3 bench/move_kernels.py [--bin=build/autofusion ...] [--threads=1,2]
        [--rounds=3] [--iterations=30] [--out=build/move_models] [--only=NAME,...]

Prints a Markdown table of medians (ms): each binary, ONNX Runtime, and the ratio of the last
binary to ONNX Runtime. The shapes are those the profiles of issue 16 showed slow: the line
detector's 2x bilinear Resize and reflect Pad, the audio CNN's Max(x, constant)."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model(name, node, inputs, out_shape, out_type=TensorProto.FLOAT, inits=(), opset=17):
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", out_type, out_shape)],
        initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


F = TensorProto.FLOAT


def models():
    x4 = [1, 64, 120, 160]
    yield "resize_linear_2x", model(
        "resize_linear_2x",
        helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"),
        [("x", F, x4)], [1, 64, 240, 320], inits=[const("s", np.float32([1, 1, 2, 2]))])
    yield "resize_nearest_2x", model(
        "resize_nearest_2x",
        helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest"),
        [("x", F, x4)], [1, 64, 240, 320], inits=[const("s", np.float32([1, 1, 2, 2]))])
    yield "resize_cubic_2x", model(
        "resize_cubic_2x",
        helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic"),
        [("x", F, [1, 16, 120, 160])], [1, 16, 240, 320],
        inits=[const("s", np.float32([1, 1, 2, 2]))])
    yield "pad_reflect_1", model(
        "pad_reflect_1",
        helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect"),
        [("x", F, [1, 64, 240, 320])], [1, 64, 242, 322],
        inits=[const("p", np.int64([0, 0, 1, 1, 0, 0, 1, 1]))])
    yield "pad_constant_1", model(
        "pad_constant_1",
        helper.make_node("Pad", ["x", "p"], ["y"], mode="constant"),
        [("x", F, [1, 64, 240, 320])], [1, 64, 242, 322],
        inits=[const("p", np.int64([0, 0, 1, 1, 0, 0, 1, 1]))])
    yield "max_scalar", model(
        "max_scalar",
        helper.make_node("Max", ["x", "c"], ["y"]),
        [("x", F, [1, 32, 40, 100])], [1, 32, 40, 100], inits=[const("c", np.float32(0))])
    yield "min_channel", model(
        "min_channel",
        helper.make_node("Min", ["x", "c"], ["y"]),
        [("x", F, [1, 64, 120, 160])], [1, 64, 120, 160],
        inits=[const("c", np.random.RandomState(0).rand(64, 1, 1).astype(np.float32))])
    yield "where_mask", model(
        "where_mask",
        helper.make_node("Where", ["m", "x", "c"], ["y"]),
        [("x", F, [1, 12, 128, 128])], [1, 12, 128, 128],
        inits=[const("c", np.float32(-1e9)),
               const("m", np.tril(np.ones((1, 1, 128, 128), dtype=bool)))])
    yield "less_scalar", model(
        "less_scalar",
        helper.make_node("Less", ["x", "c"], ["y"]),
        [("x", F, [1, 64, 120, 160])], [1, 64, 120, 160], out_type=TensorProto.BOOL,
        inits=[const("c", np.float32(0.25))])
    yield "slice_half", model(
        "slice_half",
        helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"]),
        [("x", F, [1, 128, 120, 160])], [1, 64, 120, 160],
        inits=[const("st", np.int64([64])), const("en", np.int64([128])),
               const("ax", np.int64([1]))])
    yield "concat_channels", model(
        "concat_channels",
        helper.make_node("Concat", ["x", "z"], ["y"], axis=1),
        [("x", F, [1, 64, 120, 160]), ("z", F, [1, 64, 120, 160])], [1, 128, 120, 160])
    yield "gather_rows", model(
        "gather_rows",
        helper.make_node("Gather", ["x", "i"], ["y"], axis=0),
        [("x", F, [30000, 256])], [4096, 256],
        inits=[const("i", np.random.RandomState(1).randint(-30000, 30000, 4096).astype(np.int64))])


def ours(binary, path, threads, iterations):
    out = subprocess.run([binary, "bench", path, f"--threads={threads}",
                          f"--iterations={iterations}", "--warmup=3", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["fused"]["median_ms"]


def ort(path, threads, iterations):
    env = dict(os.environ)
    env.setdefault("ORT_NODE_DIR", "/work/main/node_modules/onnxruntime-node")
    out = subprocess.run(["node", os.path.join(HERE, "ort_bench.js"), path,
                          f"--threads={threads}", f"--iterations={iterations}", "--warmup=3"],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)["median_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "move_models"))
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    bins = a.bin or [os.path.join(ROOT, "build", "autofusion")]
    only = set(filter(None, a.only.split(",")))
    os.makedirs(a.out, exist_ok=True)
    paths = []
    for name, m in models():
        if only and name not in only:
            continue
        p = os.path.join(a.out, name + ".onnx")
        onnx.save(m, p)
        paths.append((name, p))
    heads = [f"{os.path.relpath(b, ROOT)} ms" for b in bins] + ["ORT ms", "last / ORT"]
    print("| model | threads | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(heads))
    for name, p in paths:
        for t in [int(s) for s in a.threads.split(",")]:
            runs = [[] for _ in range(len(bins) + 1)]
            for _ in range(a.rounds):  # interleaved: one of each per round
                for k, b in enumerate(bins):
                    runs[k].append(ours(b, p, t, a.iterations))
                runs[-1].append(ort(p, t, a.iterations))
            med = [float(np.median(r)) for r in runs]
            cells = [f"{v:.3f}" for v in med] + [f"{med[-2] / med[-1]:.2f}"]
            print(f"| {name} | {t} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
