#!/usr/bin/python3
"""A custom op in fusion, side by side: a Mish CNN exported by torch (nn.Mish becomes Softplus,
Tanh, Mul at opset 17) run by

  plugin     autofusion with the example plugin: MishFusionOp makes each Mish one custom op,
             which joins the conv epilogue before it
  no rule    the plugin loaded, MishFusionOp switched off (--disable_fusion)
  builtin    autofusion without the plugin (Softplus, Tanh, Mul as built-in ops, fused as far
             as the built-in rules go)
  unfused    autofusion --no_fusion
  ort        ONNX Runtime 1.30 (onnxruntime-node), all graph optimisations

    /usr/bin/python3 bench/plugin_bench.py [--threads 1,2] [--rounds 5] [--iterations 20]
        [--bin build/autofusion] [--plugin build/libaf_example_plugin.so] [--size 224]

Every round runs one process per variant back to back, so a drifting machine slows them alike;
medians over all rounds' samples. Prints a Markdown table: median ms and the ratio to `plugin`.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def mish_cnn():
    """A CSPDarknet-style stem: conv blocks with BatchNorm and Mish, then a classifier."""
    def block(cin, cout, k, s):
        return [torch.nn.Conv2d(cin, cout, k, s, k // 2, bias=False), torch.nn.BatchNorm2d(cout),
                torch.nn.Mish()]
    layers = (block(3, 32, 3, 1) + block(32, 64, 3, 2) + block(64, 32, 1, 1) + block(32, 64, 3, 1) +
              block(64, 128, 3, 2) + block(128, 64, 1, 1) + block(64, 128, 3, 1) +
              block(128, 256, 3, 2) + [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                       torch.nn.Linear(256, 1000)])
    torch.manual_seed(0)
    m = torch.nn.Sequential(*layers).eval()
    for mod in m.modules():  # non-trivial BatchNorm statistics
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def ours(args, model, threads, *extra):
    r = subprocess.run([args.bin, "bench", model, "--json", f"--threads={threads}",
                        f"--iterations={args.iterations}", "--warmup=3", *extra],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])["fused"]["samples_ms"]


def ort(args, model, threads):
    r = subprocess.run(["node", os.path.join(HERE, "ort_bench.js"), model, f"--threads={threads}",
                        f"--iterations={args.iterations}", "--warmup=3", "--opt=all", "--samples"],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])["samples_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--plugin", default=os.path.join(ROOT, "build", "libaf_example_plugin.so"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "mish_cnn.onnx")
    torch.onnx.export(mish_cnn(), torch.randn(1, 3, args.size, args.size), model,
                      input_names=["x"], output_names=["y"], opset_version=17)
    plugin = f"--plugin={args.plugin}"
    variants = {
        "plugin": lambda t: ours(args, model, t, plugin),
        "no rule": lambda t: ours(args, model, t, plugin, "--disable_fusion=MishFusionOp"),
        "builtin": lambda t: ours(args, model, t),
        "unfused": lambda t: ours(args, model, t, "--no_fusion"),
        "ort": lambda t: ort(args, model, t),
    }
    print(f"Mish CNN {args.size}x{args.size}, {args.rounds} rounds x {args.iterations} runs\n")
    print("| threads | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for t in [int(x) for x in args.threads.split(",")]:
        samples = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, run in variants.items():
                samples[k] += run(t)
        med = {k: statistics.median(v) for k, v in samples.items()}
        cells = [f"{med[k]:.2f} ms ({med[k] / med['plugin']:.2f}x)" for k in variants]
        print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
