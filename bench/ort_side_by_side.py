#!/usr/bin/python3
"""Any ONNX models, ours against ONNX Runtime, side by side: for each model and thread count,
`rounds` rounds alternate one `autofusion bench` process (the compiled .afm, random inputs of
the declared shapes) and one `ort_bench.js` process (all graph optimizations) in a varying order;
medians over rounds, and the ratio ours / ONNX Runtime.

    ORT_NODE_DIR=node_modules/onnxruntime-node /usr/bin/python3 bench/ort_side_by_side.py \
        A.onnx [B.onnx ...] [--threads 1,2] [--rounds 3] [--iterations 10] [--bin build/autofusion]

For the model formats without a zoo of their own (float16 files, dynamically quantized ones:
bench/quantize_dynamic.py writes those). Prints one Markdown row per model and thread count.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(binary, afm, threads, iterations):
    r = subprocess.run([binary, "bench", afm, f"--threads={threads}", f"--iterations={iterations}", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["fused"]["median_ms"]


def ort(model, threads, iterations):
    r = subprocess.run(["node", os.path.join(ROOT, "bench", "ort_bench.js"), model, f"--threads={threads}",
                        f"--iterations={iterations}"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["median_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    a = ap.parse_args()
    print("| model | threads | ours ms | ONNX Runtime ms | ours / ORT |\n|---|--:|--:|--:|--:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            afm = os.path.join(tmp, os.path.basename(model) + ".afm")
            subprocess.run([a.bin, "compile", model, "--output", afm], capture_output=True, check=True)
            for t in (int(x) for x in a.threads.split(",")):
                o, r = [], []
                for k in range(a.rounds):
                    if k % 2:
                        r.append(ort(model, t, a.iterations))
                        o.append(ours(a.bin, afm, t, a.iterations))
                    else:
                        o.append(ours(a.bin, afm, t, a.iterations))
                        r.append(ort(model, t, a.iterations))
                mo, mr = statistics.median(o), statistics.median(r)
                print(f"| {os.path.basename(model)} | {t} | {mo:.1f} | {mr:.1f} | {mo / mr:.2f} |", flush=True)


if __name__ == "__main__":
    main()
