#!/usr/bin/python3
"""Latency of the one-op models of bench/reduce_models.py: autofusion (this build, and an
optional older build for a before/after) against ONNX Runtime, interleaved, median of each
run, the best of `rounds` runs; prints a Markdown table of milliseconds.

    /usr/bin/python3 bench/reduce_bench.py MODEL_DIR [--threads=1] [--rounds=3]
        [--before=OLD/autofusion] [--bin=build/autofusion]
ORT_NODE_DIR points at onnxruntime-node when it is not in ./node_modules.
"""

import glob
import json
import os
import subprocess
import sys


def opt(name, dflt):
    for a in sys.argv[1:]:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return dflt


def ours(binary, model, threads):
    out = subprocess.run([binary, "bench", model, "--threads=%d" % threads, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])["fused"]["median_ms"]


def ort(model, threads):
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(["node", os.path.join(here, "ort_bench.js"), model, "--threads=%d" % threads],
                         capture_output=True, text=True, check=True).stdout
    s = json.loads(out[out.index("{"):])
    return (s.get("fused") or s)["median_ms"]


def main():
    mdir = sys.argv[1]
    threads = int(opt("threads", "1"))
    rounds = int(opt("rounds", "3"))
    before = opt("before", None)
    binary = opt("bin", "build/autofusion")
    print("| model | %sours | ORT | ours/ORT |" % ("before | " if before else ""))
    print("|---|%s---:|---:|---:|" % ("---:|" if before else ""))
    for m in sorted(glob.glob(os.path.join(mdir, "*.onnx"))):
        b, a, o = [], [], []
        for _ in range(rounds):
            if before:
                b.append(ours(before, m, threads))
            a.append(ours(binary, m, threads))
            o.append(ort(m, threads))
        name = os.path.basename(m)[:-5]
        cells = ["%.3f" % min(b)] if before else []
        cells += ["%.3f" % min(a), "%.3f" % min(o), "%.2f" % (min(a) / min(o))]
        print("| %s | %s |" % (name, " | ".join(cells)), flush=True)


if __name__ == "__main__":
    main()
