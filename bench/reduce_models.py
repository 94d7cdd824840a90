#!/usr/bin/python3
"""One-op models for the reduction, normalisation, pooling and index kernels
(src/kernels/fast/reduce.c, pool_nchw.c, index.c), on shapes from real models, for
`autofusion bench` against `node bench/ort_bench.js`:

    gn_wav2vec2     torch.nn.GroupNorm(512, 512) on 1x512x3199 (wav2vec2's first conv layer's
                    norm, as torch 1.13 exports it: Reshape, InstanceNormalization, Reshape, Mul,
                    Add), followed by GELU
    gn32            torch.nn.GroupNorm(32, 256) on 1x256x56x56 (a segmentation decoder's)
    reducemean23    ReduceMean over axes (2, 3) of 1x256x56x56, keepdims
    reducemax1      ReduceMax over axis 1 of 1x256x56x56 (the columns form)
    reducel2        ReduceL2 over the last axis of 64x768
    argmax          ArgMax over the last axis of 1x1000x512
    maxpool3d       MaxPool 3x3x3 stride 2 pad 1 on 1x64x8x56x56 (a video stem's)
    avgpool1d       AveragePool 3 stride 2 pad 1 on 1x512x3199, count_include_pad 0
    maxpool2d       MaxPool 3x3 stride 2 pad 1 on 1x64x112x112 (NCHW: no conv before it)
    gap3d           GlobalAveragePool of 1x512x8x7x7
    topk            TopK k = 100 of 1x20000 (a detector's score selection)
    cumsum          CumSum along the last axis of 8x4096
    softmax1        Softmax over the channels (axis 1) of 1x21x128x128 (a segmentation head's)
    reduceall       ReduceMean of every element of 1x256x56x56 (one output)

    /usr/bin/python3 bench/reduce_models.py OUT_DIR
"""

import os
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper


def one_op(path, op, x_shape, y_shape, attrs=None, extra=None, outputs=None, opset=13):
    inits = []
    inputs = ["x"]
    for name, arr in (extra or []):
        inits.append(numpy_helper.from_array(arr, name))
        inputs.append(name)
    outs = outputs or [("y", TensorProto.FLOAT, y_shape)]
    node = helper.make_node(op, inputs, [o[0] for o in outs], **(attrs or {}))
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, path)


class GN(torch.nn.Module):
    def __init__(self, groups, ch, act):
        super().__init__()
        self.gn = torch.nn.GroupNorm(groups, ch)
        self.act = act
        with torch.no_grad():  # non-trivial affine parameters
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = self.gn(x)
        return torch.nn.functional.gelu(y) if self.act else y


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    p = lambda n: os.path.join(out, n + ".onnx")
    torch.onnx.export(GN(512, 512, True).eval(), torch.randn(1, 512, 3199), p("gn_wav2vec2"),
                      input_names=["x"], output_names=["y"], opset_version=13)
    torch.onnx.export(GN(32, 256, False).eval(), torch.randn(1, 256, 56, 56), p("gn32"),
                      input_names=["x"], output_names=["y"], opset_version=13)
    one_op(p("reducemean23"), "ReduceMean", [1, 256, 56, 56], [1, 256, 1, 1], {"axes": [2, 3]})
    one_op(p("reducemax1"), "ReduceMax", [1, 256, 56, 56], [1, 1, 56, 56], {"axes": [1]})
    one_op(p("reducel2"), "ReduceL2", [64, 768], [64, 1], {"axes": [-1]})
    one_op(p("argmax"), "ArgMax", [1, 1000, 512], [1, 1000, 1], {"axis": -1},
           outputs=[("y", TensorProto.INT64, [1, 1000, 1])])
    one_op(p("maxpool3d"), "MaxPool", [1, 64, 8, 56, 56], [1, 64, 4, 28, 28],
           {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]})
    one_op(p("avgpool1d"), "AveragePool", [1, 512, 3199], [1, 512, 1600],
           {"kernel_shape": [3], "strides": [2], "pads": [1, 1]})
    one_op(p("maxpool2d"), "MaxPool", [1, 64, 112, 112], [1, 64, 56, 56],
           {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    one_op(p("gap3d"), "GlobalAveragePool", [1, 512, 8, 7, 7], [1, 512, 1, 1, 1])
    one_op(p("topk"), "TopK", [1, 20000], [1, 100], extra=[("k", np.array([100], np.int64))],
           outputs=[("y", TensorProto.FLOAT, [1, 100]), ("i", TensorProto.INT64, [1, 100])])
    one_op(p("cumsum"), "CumSum", [8, 4096], [8, 4096], extra=[("axis", np.array(1, np.int64))])
    one_op(p("softmax1"), "Softmax", [1, 21, 128, 128], [1, 21, 128, 128], {"axis": 1})
    one_op(p("reduceall"), "ReduceMean", [1, 256, 56, 56], [], {"keepdims": 0})


if __name__ == "__main__":
    main()
