#!/usr/bin/python3
"""Export torchvision's quantizable classifiers as QDQ ONNX models, the way a user of Debian's
torch 1.13 gets them: eager post-training static quantization with the qnnpack qconfig (weights
int8 symmetric per tensor, activations uint8 asymmetric), calibrated on random images, then
torch.onnx.export at opset 13, which writes QuantizeLinear/DequantizeLinear around float ops
(with a Cast between each QuantizeLinear and its DequantizeLinear, and int32 biases read
through DequantizeLinear).

    /usr/bin/python3 bench/export_qdq.py OUT_DIR [--only resnet18,mobilenet_v2] [--batches N]

Writes OUT_DIR/<name>_qdq.onnx for each model (random weights with the zoo's random
normalisation statistics, bench/zoo_export.py's randomize(): the figures are about speed and
agreement with ONNX Runtime, not accuracy). The quantizable ShuffleNet-v2 does not export (torch
1.13 fails on its channel split). For benchmarks (BENCHMARKS.md "Quantized models")
and tests.
"""

import argparse
import os

import torch
from torchvision.models import quantization as tq

from zoo_export import randomize

MODELS = {
    "resnet18": lambda: tq.resnet18(weights=None, quantize=False),
    "resnet50": lambda: tq.resnet50(weights=None, quantize=False),
    "mobilenet_v2": lambda: tq.mobilenet_v2(weights=None, quantize=False),
    "googlenet": lambda: tq.googlenet(weights=None, quantize=False, aux_logits=False,
                                      init_weights=True),
}


def export(name, path, batches, size=224):
    torch.manual_seed(0)
    torch.backends.quantized.engine = "qnnpack"
    m = randomize(MODELS[name]())
    m.fuse_model()
    m.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    torch.ao.quantization.prepare(m, inplace=True)
    with torch.no_grad():
        for _ in range(batches):
            m(torch.randn(2, 3, size, size))
    torch.ao.quantization.convert(m, inplace=True)
    x = torch.randn(1, 3, size, size)
    torch.onnx.export(m, x, path, opset_version=13, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--batches", type=int, default=4, help="calibration batches of 2 images")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.only.split(","):
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        path = os.path.join(a.out, f"{name}_qdq.onnx")
        export(name, path, a.batches)
        print(path)


if __name__ == "__main__":
    main()
