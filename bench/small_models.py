#!/usr/bin/python3
"""The two small models of the thread benchmarks (bench/busy_threads.py), exported with
Debian's torch: a 3-layer MLP (64-256-256-10, batch 1) and a small audio CNN (three 3x3 convs
with Max(x, 0) activations, max pooling, a mean and a linear head, on 1x1x40x100), where a
parallel loop's hand-off is a large part of every layer.

    /usr/bin/python3 bench/small_models.py OUT_DIR     # writes OUT_DIR/mlp.onnx, audio_cnn.onnx
"""

import os
import sys

import torch


class AudioCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.c3 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc = torch.nn.Linear(64, 12)

    def forward(self, x):
        zero = torch.zeros(())
        x = torch.nn.functional.max_pool2d(torch.max(self.c1(x), zero), 2)
        x = torch.nn.functional.max_pool2d(torch.max(self.c2(x), zero), 2)
        x = torch.max(self.c3(x), zero).mean((2, 3))
        return self.fc(x)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()
    torch.onnx.export(mlp, torch.randn(1, 64), os.path.join(out, "mlp.onnx"), input_names=["x"],
                      output_names=["y"], opset_version=13)
    torch.onnx.export(AudioCNN().eval(), torch.randn(1, 1, 40, 100), os.path.join(out, "audio_cnn.onnx"),
                      input_names=["x"], output_names=["y"], opset_version=13)


if __name__ == "__main__":
    main()
