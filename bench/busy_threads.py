#!/usr/bin/python3
"""The thread policy under load: latency at 2 threads against 1 thread, on an idle machine and
with another process keeping one core busy (a spinning Python loop), interleaved.

    /usr/bin/python3 bench/busy_threads.py MODEL.onnx|.afm ... [--rounds 5]
        [--iterations N] [--bin build/autofusion] [--json out.json]

Each model is compiled once to a .afm (so that a round times runs, not compiles). A round runs,
back to back, `autofusion bench` at 1 and at 2 threads, first idle, then with the busy loop
running; the statistic is the median over rounds of each round's median latency, and the ratio
2 threads / 1 thread per condition (the policy's target: at most 1.05, busy or not). Iterations
default to about a second of runs per process (from a first timed run).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def bench(af_bin, model, threads, iterations):
    r = subprocess.run([af_bin, "bench", model, f"--threads={threads}",
                        f"--iterations={iterations}", "--warmup=3", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["fused"]["median_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=0, help="0: about one second per process")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="af_busy_")
    results = []
    for path in a.models:
        name = os.path.splitext(os.path.basename(path))[0]
        model = path
        if path.endswith(".onnx"):
            model = os.path.join(tmp, name)
            subprocess.run([a.bin, "compile", f"--model={path}", f"--output={model}"],
                           capture_output=True, check=True)
            model += ".afm"
        iters = a.iterations or max(5, min(5000, int(1000 / max(bench(a.bin, model, 1, 3), 1e-3))))
        t = {("idle", 1): [], ("idle", 2): [], ("busy", 1): [], ("busy", 2): []}
        for _ in range(a.rounds):
            for cond in ("idle", "busy"):
                spin = (subprocess.Popen(["/usr/bin/python3", "-c", "while True: pass"])
                        if cond == "busy" else None)
                try:
                    for threads in (1, 2):
                        t[(cond, threads)].append(bench(a.bin, model, threads, iters))
                finally:
                    if spin:
                        spin.kill()
                        spin.wait()
        row = {"model": name, "iterations": iters}
        for (cond, threads), v in t.items():
            row[f"{cond}_t{threads}_ms"] = statistics.median(v)
        for cond in ("idle", "busy"):
            ratios = [b / s for s, b in zip(t[(cond, 1)], t[(cond, 2)])]
            row[f"{cond}_ratio"] = statistics.median(ratios)
        results.append(row)
        print(json.dumps(row), file=sys.stderr)
    print("| model | idle 1 thread ms | idle 2 threads ms | 2/1 | busy 1 thread ms | busy 2 threads ms | 2/1 |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in results:
        print(f"| {r['model']} | {r['idle_t1_ms']:.4g} | {r['idle_t2_ms']:.4g} | {r['idle_ratio']:.2f} "
              f"| {r['busy_t1_ms']:.4g} | {r['busy_t2_ms']:.4g} | {r['busy_ratio']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
