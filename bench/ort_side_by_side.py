#!/usr/bin/python3
"""Any ONNX models, ours against ONNX Runtime, side by side: for each model and thread count,
`rounds` rounds alternate one `autofusion bench` process (the compiled .afm, random inputs of
the declared shapes) and one `ort_bench.js` process (all graph optimizations) in a varying order;
medians over rounds, and the ratio ours / ONNX Runtime.

    ORT_NODE_DIR=node_modules/onnxruntime-node /usr/bin/python3 bench/ort_side_by_side.py \
        A.onnx [B.onnx ...] [--threads 1,2] [--rounds 3] [--iterations 10] [--bin build/autofusion]
        [--input_shape "x:1,3,48,320"] [--input NAME=FILE.npy ...]

--input_shape is compiled into the .afm (and gives ONNX Runtime's random inputs those dims);
--input feeds both runtimes the same tensor (Silero VAD's sample rate must be 16000, which
random inputs are not). Both apply to every model of the invocation.

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


def ours(binary, afm, threads, iterations, inputs=()):
    feeds = [x for i in inputs for x in ("--input", i)]
    r = subprocess.run([binary, "bench", afm, f"--threads={threads}", f"--iterations={iterations}", "--json"] + feeds,
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["fused"]["median_ms"]


def ort(model, threads, iterations, inputs=(), shapes=()):
    r = subprocess.run(["node", os.path.join(ROOT, "bench", "ort_bench.js"), model, f"--threads={threads}",
                        f"--iterations={iterations}"] + [f"--input={i}" for i in inputs] +
                       [f"--shape={s}" for s in shapes], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["median_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--input_shape", default="")
    ap.add_argument("--input", action="append", default=[])
    a = ap.parse_args()
    fed = {i.split("=", 1)[0] for i in a.input}
    # "x:1,3,48,320;y:..." as ort_bench.js's --shape=x:1x3x48x320, for the inputs not fed
    shapes = [s.split(":")[0] + ":" + s.split(":")[1].replace(",", "x")
              for s in a.input_shape.split(";") if s and s.split(":")[0] not in fed]
    print("| model | threads | ours ms | ONNX Runtime ms | ours / ORT |\n|---|--:|--:|--:|--:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            afm = os.path.join(tmp, os.path.basename(model) + ".afm")
            shape = [f"--input_shape={a.input_shape}"] if a.input_shape else []
            subprocess.run([a.bin, "compile", model, "--output", afm] + shape, capture_output=True, check=True)
            for t in (int(x) for x in a.threads.split(",")):
                o, r = [], []
                for k in range(a.rounds):
                    if k % 2:
                        r.append(ort(model, t, a.iterations, a.input, shapes))
                        o.append(ours(a.bin, afm, t, a.iterations, a.input))
                    else:
                        o.append(ours(a.bin, afm, t, a.iterations, a.input))
                        r.append(ort(model, t, a.iterations, a.input, shapes))
                mo, mr = statistics.median(o), statistics.median(r)
                print(f"| {os.path.basename(model)} | {t} | {mo:.3g} | {mr:.3g} | {mo / mr:.2f} |", flush=True)


if __name__ == "__main__":
    main()
