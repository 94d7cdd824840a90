#!/usr/bin/python3
"""3-D depthwise convolutions as video models use them, exported with Debian's torch, for
bench/ort_side_by_side.py (the zoo's video models, R3D-18 and R(2+1)D-18, have dense 3-D convs
only):
  dw3d.onnx        a 32-channel 3x3x3 depthwise conv + BatchNorm + ReLU + 1x1x1 conv to 64,
                   on [1, 32, 8, 28, 28];
  x3d_blocks.onnx  three X3D-style bottlenecks (1x1x1 expand 48 -> 108 + BN + ReLU, 3x3x3
                   depthwise + BN + SiLU, 1x1x1 project + BN, residual + ReLU), [1, 48, 8, 28, 28].

    /usr/bin/python3 bench/video_blocks.py OUT_DIR
"""

import os
import sys

import torch
from torch import nn


class DepthwiseBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv3d(32, 32, 3, padding=1, groups=32)
        self.bn = nn.BatchNorm3d(32)
        self.pw = nn.Conv3d(32, 64, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.bn(self.dw(x))))


class X3DBottleneck(nn.Module):
    def __init__(self, c=48, e=108):
        super().__init__()
        self.a = nn.Sequential(nn.Conv3d(c, e, 1, bias=False), nn.BatchNorm3d(e), nn.ReLU())
        self.b = nn.Sequential(nn.Conv3d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm3d(e),
                               nn.SiLU())
        self.c = nn.Sequential(nn.Conv3d(e, c, 1, bias=False), nn.BatchNorm3d(c))

    def forward(self, x):
        return torch.relu(x + self.c(self.b(self.a(x))))


def export(model, shape, path):
    torch.manual_seed(0)
    for m in model.modules():  # non-trivial normalisation statistics
        if isinstance(m, nn.BatchNorm3d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    torch.onnx.export(model.eval(), torch.randn(*shape), path, opset_version=17)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    export(DepthwiseBlock(), (1, 32, 8, 28, 28), os.path.join(out, "dw3d.onnx"))
    export(nn.Sequential(*(X3DBottleneck() for _ in range(3))), (1, 48, 8, 28, 28),
           os.path.join(out, "x3d_blocks.onnx"))


if __name__ == "__main__":
    main()
