#!/usr/bin/python3
"""One-product ONNX files, to hold our GEMM side by side with ONNX Runtime's (MLAS) on the
shapes the transformers spend their time in: X[M, K] x W[K, N] + b, W and b initializers
(what a torch Linear exports, and what we fuse into one FusedMatMul).

    /usr/bin/python3 bench/gemm_models.py OUT_DIR [--shapes 197x768x2304,...]   (M x K x N)
    ORT_NODE_DIR=node_modules/onnxruntime-node /usr/bin/python3 bench/ort_side_by_side.py \
        OUT_DIR/*.onnx --threads 1 --rounds 5 --iterations 50
"""

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ViT-B/16 (197 tokens): QKV, projection, MLP up and down; BERT-Base (128 tokens): MLP up and down
SHAPES = "197x768x2304,197x768x768,197x768x3072,197x3072x768,128x768x3072,128x3072x768"


def write(path, m, k, n):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    g = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for s in a.shapes.split(","):
        m, k, n = (int(v) for v in s.split("x"))
        write(os.path.join(a.out, f"gemm_{m}x{k}x{n}.onnx"), m, k, n)


if __name__ == "__main__":
    main()
