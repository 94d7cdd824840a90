#!/usr/bin/python3
"""One grouped 3x3 convolution (+ bias, ReLU) per ONNX file, exported with torch: the grouped
convs of ResNeXt-50 32x4d (groups of 4, 8, 16, 32 channels) and RegNetY-400MF (groups of 8, 104
channels), for `bench/ort_side_by_side.py` (issue 16: grouped convs against ONNX Runtime).

    /usr/bin/python3 bench/grouped_convs.py OUT_DIR [--only NAME,...]
"""
import argparse
import os

import torch

# name: (channels, group width, input side, stride)
CONVS = {
    "rx_g4_56": (128, 4, 56, 1),
    "rx_g8_28": (256, 8, 28, 1),
    "rx_g8_s2": (256, 8, 56, 2),
    "rx_g16_14": (512, 16, 14, 1),
    "rx_g32_7": (1024, 32, 7, 1),
    "regnet_g8_28": (104, 8, 28, 1),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    for name, (c, gw, side, stride) in CONVS.items():
        if a.only and name not in a.only.split(","):
            continue
        m = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, stride, 1, groups=c // gw), torch.nn.ReLU()).eval()
        x = torch.randn(1, c, side, side)
        path = os.path.join(a.out, name + ".onnx")
        torch.onnx.export(m, x, path, input_names=["x"], output_names=["y"], opset_version=13)
        print(path)


if __name__ == "__main__":
    main()
