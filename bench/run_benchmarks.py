#!/usr/bin/python3
"""The side-by-side benchmark of the five seed models: our unfused and fused graphs and ONNX
Runtime 1.30 (onnxruntime-node, graph optimizations all and disabled), for 1 and 2 threads.

    /usr/bin/python3 bench/run_benchmarks.py [--models resnet50,...] [--threads 1,2]
        [--rounds 4] [--iterations 5] [--bin build/autofusion] [--dir models] [--json out.json]

Every (model, threads) pair runs `rounds` rounds; a round runs, back to back, one
`autofusion bench --compare` process (fused and unfused interleaved run by run) and one
onnxruntime-node process per optimization level, `iterations` timed runs each after a warm-up.
Rounds interleave the runtimes so that a machine whose speed drifts (this one is shared) slows
them alike; statistics are over all timed runs of all rounds (rounds x iterations >= 20).
Prints a Markdown table: median and min latency, the ratios the issue sets targets for, GFLOP/s
and percent of the machine's measured peak (the cost model's FMA-loop calibration, per core),
and the cost model's estimated fusion speedup next to the measured one. Models missing from
--dir are exported first with bench/export_models.py.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]


def model_flops(path):
    """2 x multiply-accumulates of every Conv, ConvTranspose, MatMul and Gemm (shapes inferred)."""
    import onnx
    from onnx import shape_inference
    m = shape_inference.infer_shapes(onnx.load(path, load_external_data=False))
    g = m.graph
    shape = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        shape[vi.name] = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
    for t in g.initializer:
        shape[t.name] = list(t.dims)
    total = 0
    for n in g.node:
        if n.op_type == "Conv" and n.output[0] in shape and n.input[1] in shape:
            y, w = shape[n.output[0]], shape[n.input[1]]
            spatial = 1
            for d in y[2:]:
                spatial *= d
            per = 1
            for d in w[1:]:
                per *= d
            total += 2 * y[0] * y[1] * spatial * per
        elif n.op_type in ("MatMul", "Gemm") and n.output[0] in shape and n.input[0] in shape:
            y, a = shape[n.output[0]], shape[n.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            k = a[-2] if trans_a else a[-1]
            out = 1
            for d in y:
                out *= d
            total += 2 * out * k
    return total


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ensure_models(names, d):
    missing = [n for n in names if not os.path.exists(os.path.join(d, n + ".onnx"))]
    if missing:
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "export_models.py"), "--out", d,
                        "--models", ",".join(missing)], check=True)


def bench_pair(args, name, threads):
    path = os.path.join(args.dir, name + ".onnx")
    ours = {"fused": [], "unfused": []}
    ort = {"all": [], "disabled": []}
    est, load, isa = None, [], None
    node = os.path.join(HERE, "ort_bench.js")
    for _ in range(args.rounds):
        r = run_json([args.bin, "bench", path, "--compare", "--json", f"--threads={threads}",
                      f"--iterations={args.iterations}", f"--warmup={args.warmup}"])
        ours["fused"] += r["fused"]["samples_ms"]
        ours["unfused"] += r["unfused"]["samples_ms"]
        est, isa = r.get("estimated_speedup"), r.get("isa")
        load.append(r["load_ms"])
        for opt in ("all", "disabled"):
            o = run_json(["node", node, path, f"--threads={threads}", f"--opt={opt}",
                          f"--iterations={args.iterations}", f"--warmup={args.warmup}",
                          "--samples"])
            ort[opt] += o["samples_ms"]
    return ours, ort, est, min(load), isa


def machine_peak(machine, isa="avx512"):
    """The FMA peak (GFLOP/s per core) of the machine file: one record per ISA (version 3)."""
    rec = machine.get(isa) or next((v for v in machine.values() if isinstance(v, dict)), {})
    return rec.get("peak_gflops", machine.get("peak_gflops", 0.0))


def med(v):
    return statistics.median(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--json", default=None, help="also write every sample here")
    args = ap.parse_args()
    names = args.models.split(",")
    os.makedirs(args.dir, exist_ok=True)
    ensure_models(names, args.dir)
    machine = json.load(open(os.path.expanduser("~/.cache/autofusion/machine.json")))
    peak = machine_peak(machine)
    results = []
    print("| model | threads | unfused ms (median / min) | fused ms | ORT all ms | ORT disabled ms "
          "| fused / ORT all | fused vs unfused | estimated | fused GFLOP/s | % of peak |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name in names:
        flops = model_flops(os.path.join(args.dir, name + ".onnx"))
        for t in [int(x) for x in args.threads.split(",")]:
            t0 = time.monotonic()
            ours, ort, est, load, isa = bench_pair(args, name, t)
            f, u, oa, od = (med(ours["fused"]), med(ours["unfused"]), med(ort["all"]),
                            med(ort["disabled"]))
            gf = flops / (f * 1e-3) / 1e9
            row = {"model": name, "threads": t, "isa": isa, "gflop": flops / 1e9,
                   "fused": ours["fused"], "unfused": ours["unfused"], "ort_all": ort["all"],
                   "ort_disabled": ort["disabled"], "estimated_speedup": est,
                   "prepare_ms": load, "seconds": time.monotonic() - t0}
            results.append(row)
            print(f"| {name} | {t} | {u:.1f} / {min(ours['unfused']):.1f} | {f:.1f} / "
                  f"{min(ours['fused']):.1f} | {oa:.1f} / {min(ort['all']):.1f} | {od:.1f} / "
                  f"{min(ort['disabled']):.1f} | {f / oa:.3f} | {u / f:.3f}x | "
                  f"{est if est is None else f'{est:.3f}x'} | {gf:.1f} | "
                  f"{100 * gf / (peak * t):.0f}% |", flush=True)
    geo = 1.0
    ones = [r for r in results if r["threads"] == 1]
    for r in ones:
        geo *= med(r["unfused"]) / med(r["fused"])
    if ones:
        print(f"\ngeomean fused vs unfused speedup (1 thread): {geo ** (1 / len(ones)):.3f}x; "
              f"peak {peak:.1f} GFLOP/s per core ({results[-1]['isa']}), "
              f"{sum(len(r['fused']) for r in results) // max(1, len(results))} runs per cell")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "results": results}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
