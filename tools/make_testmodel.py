#!/usr/bin/python3
"""Write the seed article's TestModel as ONNX: three Conv+BN+ReLU blocks and a pooled classifier.

    /usr/bin/python3 tools/make_testmodel.py test_model.onnx [--size 64] [--input-npy x.npy]
        [--output-npy y.npy] [--dynamic-batch]

Invariant: the file is identical for identical arguments (torch.manual_seed(0), random but fixed
BatchNorm statistics so BN is not the identity), and every BatchNorm stays a BatchNormalization node
after its Conv, so the file shows the Conv->BN->ReLU pattern the fusion pass must find (torch 1.13
would otherwise fold BN into Conv on export).
"""

import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import autofusion_export as afx  # noqa: E402


class ConvBNReLU(nn.Module):
    """The seed's standard convolution block: 3x3 conv (no bias), BatchNorm, ReLU."""

    def __init__(self, in_ch, out_ch):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class TestModel(nn.Module):
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            ConvBNReLU(3, 64),
            ConvBNReLU(64, 128),
            ConvBNReLU(128, 256),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(256, 1000),
        )

    def forward(self, x):
        return self.layers(x)


def build_testmodel(seed=0):
    """The seed's TestModel in eval mode with fixed weights and non-trivial BatchNorm stats."""
    torch.manual_seed(seed)
    model = TestModel()
    afx.randomize_init(model, seed)
    return model.eval()


def export_testmodel(path, size=224, dynamic_batch=False, seed=0):
    """Export TestModel for a 1x3xSIZExSIZE input named "input" to `path`.

    Returns (model, example_input, onnx_proto).
    """
    model = build_testmodel(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 3, size, size, generator=gen)
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    proto = afx.export_onnx(model, (x,), path, ["input"], ["output"], dynamic_axes=axes)
    return model, x, proto


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="path of the .onnx file to write")
    ap.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    ap.add_argument("--dynamic-batch", action="store_true",
                    help="export the batch dimension as the symbol 'batch'")
    ap.add_argument("--input-npy", help="also save the example input as this .npy")
    ap.add_argument("--output-npy", help="also save torch's output for that input as this .npy")
    args = ap.parse_args()
    if args.size < 1:
        ap.error("--size must be positive")

    model, x, proto = export_testmodel(args.out, args.size, args.dynamic_batch)
    if args.input_npy:
        afx.save_npy(args.input_npy, x.numpy())
    if args.output_npy:
        with torch.no_grad():
            afx.save_npy(args.output_npy, model(x).numpy())
    print(f"{args.out}: {afx.file_mb(args.out):.1f} MB, ops {afx.op_histogram(proto)}")


if __name__ == "__main__":
    main()
