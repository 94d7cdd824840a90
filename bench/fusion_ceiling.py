#!/usr/bin/python3
"""How far fusion can go on each model: the ceiling of the fused-vs-unfused speedup.

    /usr/bin/python3 bench/fusion_ceiling.py [--models resnet50,...] [--threads 1]
        [--iterations 20] [--bin build/autofusion] [--dir models] [--out /tmp/af-ceiling]

Fusion removes the work between the compute kernels (BatchNorm, activations, bias and residual
adds, transposes, softmax, ...) and nothing else: the fused graph runs the same Conv, MatMul
and Gemm kernels. So even if every removed op became free, the fused model could not run faster
than the unfused model's compute kernels alone: unfused time / unfused compute time is the
ceiling of the speedup. One `autofusion bench --compare --profile` per model times both graphs
run by run interleaved (a drifting machine slows both alike) and traces every node of both;
from the traces this prints, per model, the unfused time split into compute and the rest, the
fused time, the measured speedup, the ceiling and the share of the rest that fusion removed,
and the geomeans of speedup and ceiling.
"""

import argparse
import json
import math
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]
# The compute kernels of the unfused graph (what fusion keeps and cannot remove); the lower pass
# runs its Conv and MatMul nodes as FusedConv and FusedMatMul with nothing fused into them.
COMPUTE = {"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul"}


def node_ms(path):
    """Total node time per op type, per run (ms), of a Chrome trace written by --profile."""
    with open(path) as f:
        events = json.load(f)
    runs = sum(1 for e in events if e.get("name") == "model_run") or 1
    per = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "Node":
            op = e["args"]["op_name"]
            per[op] = per.get(op, 0.0) + e["dur"] / 1000.0 / runs
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--out", default="/tmp/af-ceiling")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"| model | unfused ms | of it compute | of it the rest | fused ms | speedup | ceiling "
          f"| rest removed | top of the rest (unfused ms) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|")
    speedups, ceilings = [], []
    for name in args.models.split(","):
        trace = os.path.join(args.out, name + ".json")
        subprocess.run([args.bin, "bench", os.path.join(args.dir, name + ".onnx"), "--compare",
                        f"--threads={args.threads}", f"--iterations={args.iterations}",
                        f"--profile={trace}"], check=True, stdout=subprocess.DEVNULL)
        fused, unfused = node_ms(trace), node_ms(trace[:-5] + ".unfused.json")
        ft, ut = sum(fused.values()), sum(unfused.values())
        uc = sum(v for k, v in unfused.items() if k in COMPUTE)
        rest = sorted(((v, k) for k, v in unfused.items() if k not in COMPUTE), reverse=True)
        speedups.append(ut / ft)
        ceilings.append(ut / uc)
        removed = (ut - ft) / (ut - uc) if ut > uc else 0.0
        top = ", ".join(f"{k} {v:.1f}" for v, k in rest[:4])
        print(f"| {name} | {ut:.1f} | {uc:.1f} | {ut - uc:.1f} | {ft:.1f} | {ut / ft:.3f}x "
              f"| {ut / uc:.3f}x | {100 * removed:.0f}% | {top} |")

    def geo(v):
        return math.exp(sum(math.log(x) for x in v) / len(v))
    print(f"\nGeomean over {len(speedups)} models: speedup {geo(speedups):.3f}x, "
          f"ceiling {geo(ceilings):.3f}x (node times, {args.threads} thread(s), "
          f"{args.iterations} interleaved runs each)")


if __name__ == "__main__":
    main()
