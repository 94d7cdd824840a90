#!/usr/bin/python3
"""--precision_mode side by side: fp32, bf16, mixed and fp16 on the five seed models, speed and
accuracy, in one script.

    /usr/bin/python3 bench/precision_bench.py [--models resnet50,...] [--threads 1,2]
        [--rounds 4] [--iterations 5] [--bin build/autofusion] [--dir models] [--json out.json]

Speed: every (model, threads) pair runs `rounds` rounds; a round runs one `autofusion bench`
process per mode back to back (the fused graph, `iterations` timed runs after a warm-up), so a
drifting machine slows every mode alike; medians over all rounds. Accuracy: one `autofusion run`
per mode on the same seeded random inputs (token ids for BERT), each output against the fp32
run's: the largest absolute error divided by the largest fp32 output ("max rel"), and the
cosine similarity. Prints a Markdown table with the latency ratio to fp32 next to them.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]
MODES = ["fp32", "bf16", "mixed", "fp16"]


def bench(args, path, mode, threads):
    r = subprocess.run([args.bin, "bench", path, "--json", f"--precision_mode={mode}",
                        f"--threads={threads}", f"--iterations={args.iterations}",
                        f"--warmup={args.warmup}"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])["fused"]["samples_ms"]


def outputs(args, path, mode, tmp):
    d = os.path.join(tmp, mode)
    r = subprocess.run([args.bin, "run", path, f"--precision_mode={mode}", f"--output_dir={d}"],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return {os.path.basename(f): np.load(f).astype(np.float64) for f in glob.glob(d + "/*.npy")}


def accuracy(ref, got):
    worst_rel, worst_cos = 0.0, 1.0
    for k, a in ref.items():
        b = got[k]
        rel = np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)
        cos = float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))
        worst_rel, worst_cos = max(worst_rel, rel), min(worst_cos, cos)
    return worst_rel, worst_cos


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print("| model | threads | " + " | ".join(f"{m} ms" for m in MODES) +
          " | bf16 / fp32 | mixed / fp32 | fp16 / fp32 | bf16 max rel, cosine | "
          "mixed max rel, cosine | fp16 max rel, cosine |")
    print("|---|--:|" + "--:|" * (len(MODES) + 6))
    for name in args.models.split(","):
        path = os.path.join(args.dir, name + ".onnx")
        with tempfile.TemporaryDirectory() as tmp:
            outs = {m: outputs(args, path, m, tmp) for m in MODES}
        acc = {m: accuracy(outs["fp32"], outs[m]) for m in MODES[1:]}
        for t in [int(x) for x in args.threads.split(",")]:
            samples = {m: [] for m in MODES}
            for _ in range(args.rounds):
                for m in MODES:
                    samples[m] += bench(args, path, m, t)
            med = {m: statistics.median(v) for m, v in samples.items()}
            rows.append({"model": name, "threads": t, "samples_ms": samples,
                         "accuracy": {m: {"max_rel": a[0], "cosine": a[1]} for m, a in acc.items()}})
            print(f"| {name} | {t} | " + " | ".join(f"{med[m]:.1f}" for m in MODES) + " | " +
                  " | ".join(f"{med[m] / med['fp32']:.2f}x" for m in MODES[1:]) + " | " +
                  " | ".join(f"{acc[m][0]:.1e}, {acc[m][1]:.6f}" for m in MODES[1:]) + " |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
