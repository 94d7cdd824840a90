#!/usr/bin/python3
"""Run the model zoo (bench/zoo_export.py): correctness against torch eager, then our latency
against ONNX Runtime's at each thread count, interleaved.

    /usr/bin/python3 bench/zoo_bench.py ZOO_DIR [--only a,b] [--threads 1,2] [--rounds 3]
        [--json bench/results/zoo.json] [--bin build/autofusion] [--work DIR] [--resume]
        [--min-time 1.0] [--cell-budget 150] [--profile] [--no-bench]
    /usr/bin/python3 bench/zoo_bench.py --table bench/results/zoo.json     # the table again

For each model of ZOO_DIR/manifest.json:
1. `autofusion compile` the .onnx (dynamic batch kept) into WORK/NAME.afm; an error is the
   model's result ("compile error: ..."), printed and kept in the JSON.
2. `autofusion run` the .afm on the saved inputs; every output is compared with torch eager's:
   err = max |ours - torch| / (max(torch) - min(torch)) (integer outputs: exact), and the model
   is correct when every err <= --tol (1e-4) and the shapes agree. ONNX Runtime's outputs
   (`ort_bench.js --output_dir`) get the same figure, in the JSON and the table, and the table
   adds torch's own float32-vs-float64 figure (from the manifest) to a failed model: where
   those are large too (detection with random weights: tied scores), the check is moot.
3. Latency of the .afm (`autofusion bench --json`) and of the .onnx in ONNX Runtime
   (`node bench/ort_bench.js --samples`, all graph optimizations), both on the saved inputs, at
   each thread count: --rounds rounds, each one process per runtime, the order alternating
   from round to round. The first round's iteration count comes from the `run` time; later
   rounds time at least --min-time seconds per process (2 to 50 runs). A cell whose rounds
   would take longer than --cell-budget seconds gets fewer rounds (at least 1) and fewer runs
   (the 3-D conv models). ratio = median of our samples / median of ORT's; the JSON also has
   the median of the per-round ratios. A model's score is its worse thread count; the summary
   gives the geomean of the scores over the models that ran on both.
4. With --profile, `autofusion bench --profile` at the first thread count, and the time per op
   type (fused ops by their type, e.g. FusedConv) and the 8 slowest nodes in the JSON, the
   time per op type in the printed table. An If, Loop or Scan keeps its own line, but its time
   (which is that of its body's nodes, listed too) is left out of the total and the shares.

The JSON is written after every model. --only reruns the named models and keeps the other
entries of an existing --json; --resume skips models already in it. Failures of any kind are
results, never hidden: the table says what failed and why.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TIMEOUT = 1800


def run_cmd(cmd, timeout=TIMEOUT, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd[:3])}")
    if r.returncode:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise RuntimeError(f"exit {r.returncode}: {msg[-1] if msg else ''}")
    return r.stdout


def run_json(cmd, env=None):
    out = run_cmd(cmd, env=env)
    return json.loads(out.strip().splitlines()[-1])


def machine_info():
    info = {"platform": platform.platform(), "nproc": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("Flags:"):
                flags = set(line.split(":", 1)[1].split())
                info["isa_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return info


def compare(ref, ours):
    """err figure of one output: max |ours - ref| / range(ref); None when shapes differ."""
    if ref.shape != ours.shape:
        return None
    if ref.size == 0:
        return 0.0
    if ref.dtype.kind != "f":
        return 0.0 if np.array_equal(ref, ours) else float("inf")
    r, o = ref.astype(np.float64), ours.astype(np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    span = float(r.max() - r.min())
    if span == 0.0:
        span = max(float(np.abs(r).max()), 1.0)
    return float(np.abs(o - r).max()) / span


def node_env():
    env = dict(os.environ)
    if "ORT_NODE_DIR" not in env and not os.path.isdir(os.path.join(ROOT, "node_modules", "onnxruntime-node")):
        env["ORT_NODE_DIR"] = "/work/main/node_modules/onnxruntime-node"
    return env


def fresh_dir(path, entry):
    os.makedirs(path, exist_ok=True)
    for o in entry["outputs"]:
        p = os.path.join(path, safe(o["name"]) + ".npy")
        if os.path.exists(p):
            os.remove(p)
    return path


def ort_errors(args, entry, zoo, inputs):
    """ONNX Runtime's own error against torch (the same figure), to tell a wrong output of ours
    from a model whose outputs torch itself does not pin down (ties in NMS/TopK)."""
    out_dir = fresh_dir(os.path.join(args.work, entry["name"] + "_ort"), entry)
    ort_in = [f"--input={inputs[i + 1]}" for i in range(0, len(inputs), 2)]
    run_cmd(["node", os.path.join(HERE, "ort_bench.js"), os.path.join(zoo, entry["file"]),
             "--iterations=1", "--warmup=0", f"--threads={max(args.threads)}",
             f"--output_dir={out_dir}"] + ort_in, env=node_env())
    errs = {}
    for o in entry["outputs"]:
        ref = np.load(os.path.join(zoo, o["file"]))
        p = os.path.join(out_dir, safe(o["name"]) + ".npy")
        errs[o["name"]] = compare(ref, np.load(p)) if os.path.exists(p) else None
    return errs


def correctness(args, entry, zoo, afm, inputs):
    out_dir = fresh_dir(os.path.join(args.work, entry["name"] + "_out"), entry)
    t0 = time.monotonic()
    run_cmd([args.bin, "run", afm, "--output_dir", out_dir, f"--threads={max(args.threads)}"] + inputs)
    wall = time.monotonic() - t0
    res = {"outputs": {}, "run_wall_s": round(wall, 3)}
    worst = 0.0
    problems = []
    for o in entry["outputs"]:
        ref = np.load(os.path.join(zoo, o["file"]))
        p = os.path.join(out_dir, safe(o["name"]) + ".npy")
        if not os.path.exists(p):
            problems.append(f"{o['name']}: not written")
            continue
        ours = np.load(p)
        err = compare(ref, ours)
        if err is None:
            problems.append(f"{o['name']}: shape {list(ours.shape)}, torch {list(ref.shape)}")
            res["outputs"][o["name"]] = {"shape": list(ours.shape), "torch_shape": list(ref.shape)}
            continue
        res["outputs"][o["name"]] = {"err": err}
        worst = max(worst, err)
        if not err <= args.tol:
            problems.append(f"{o['name']}: err {err:.2e}")
    res["max_err"] = worst
    res["correct"] = not problems
    try:
        ort = ort_errors(args, entry, zoo, inputs)
        res["ort_outputs"] = ort
        known = [e for e in ort.values() if e is not None]
        res["ort_max_err"] = max(known) if len(known) == len(ort) else None
    except RuntimeError as e:
        res["ort_error"] = str(e)
    if problems:
        res["problems"] = problems
    return res


def safe(name):
    import re
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def stats(v):
    return {"median_ms": statistics.median(v), "min_ms": min(v), "n": len(v)}


def bench_cell(args, afm, onnx_path, inputs, threads, est_s):
    """Interleaved rounds of ours and ORT at one thread count."""
    node = os.path.join(HERE, "ort_bench.js")
    env = node_env()
    ort_in = [f"--input={inputs[i + 1]}" for i in range(0, len(inputs), 2)]
    cmds = {"ours": [args.bin, "bench", afm, "--json", f"--threads={threads}"] + inputs,
            "ort": ["node", node, onnx_path, f"--threads={threads}", "--samples", "--opt=all"] + ort_in}
    est = {"ours": est_s, "ort": est_s}
    # runs per process and rounds within the cell's budget
    warm = 1 if est_s > 0.5 else 2
    iters = {k: max(1, min(10, int(args.min_time / max(est[k], 1e-3)))) for k in cmds}
    per_round = sum((iters[k] + warm) * est[k] for k in cmds) + 2.0
    rounds = max(1, min(args.rounds, int(args.cell_budget / per_round)))
    samples = {k: [] for k in cmds}
    medians = {k: [] for k in cmds}
    errors = {}
    order = ["ours", "ort"]
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            if k in errors:
                continue
            try:
                o = run_json(cmds[k] + [f"--iterations={iters[k]}", f"--warmup={warm}"], env=env)
            except (RuntimeError, ValueError) as e:
                errors[k] = str(e)
                continue
            v = o["samples_ms"] if k == "ort" else o["fused"]["samples_ms"]
            samples[k] += v
            medians[k].append(statistics.median(v))
            est[k] = statistics.median(v) / 1000.0
            iters[k] = max(2, min(50, int(args.min_time / max(est[k], 1e-4))))
            if est[k] * (iters[k] + warm) > args.cell_budget / max(1, 2 * rounds):
                iters[k] = max(1, int(args.cell_budget / max(1, 2 * rounds) / est[k]) - warm)
    cell = {"rounds": rounds}
    for k in cmds:
        if samples[k]:
            cell[k] = stats(samples[k])
            cell[k]["round_medians_ms"] = medians[k]
        if k in errors:
            cell.setdefault("errors", {})[k] = errors[k]
    if "ours" in cell and "ort" in cell:
        cell["ratio"] = cell["ours"]["median_ms"] / cell["ort"]["median_ms"]
        cell["ratio_rounds"] = statistics.median(
            a / b for a, b in zip(cell["ours"]["round_medians_ms"], cell["ort"]["round_medians_ms"]))
    return cell


def profile(args, afm, inputs, threads, est_s, name):
    path = os.path.join(args.work, name + "_profile.json")
    iters = max(1, min(10, int(2.0 / max(est_s, 1e-3))))
    run_cmd([args.bin, "bench", afm, f"--threads={threads}", f"--iterations={iters}", "--warmup=1",
             f"--profile={path}"] + inputs)
    return summarize_trace(path, threads)


# Ops whose event spans the events of the nodes of their bodies (counted once, there).
CONTROL_FLOW = {"If", "Loop", "Scan"}


def summarize_trace(path, threads, top_nodes=8):
    """Time per op type and the slowest nodes of a `bench --profile` trace, per run."""
    trace = json.load(open(path))
    per_op, per_node, total = {}, {}, 0.0
    runs = 0
    for ev in trace:
        if ev.get("cat") == "Session":
            runs += 1
            continue
        if ev.get("cat") != "Node":
            continue
        op = ev.get("args", {}).get("op_name", "?")
        per_op[op] = per_op.get(op, 0.0) + ev["dur"]
        node = (ev["name"].replace("_kernel_time", ""), op)
        per_node[node] = per_node.get(node, 0.0) + ev["dur"]
        if op not in CONTROL_FLOW:  # its time is its body's nodes', which have their own events
            total += ev["dur"]
    runs = max(runs, 1)
    top = sorted(per_op.items(), key=lambda kv: -kv[1])
    nodes = sorted(per_node.items(), key=lambda kv: -kv[1])[:top_nodes]
    return {"threads": threads, "runs": runs, "node_ms_per_run": total / runs / 1000.0,
            "ops": [{"op": op, "ms": us / runs / 1000.0, "share": us / total if total else 0.0}
                    for op, us in top],
            "nodes": [{"node": n, "op": op, "ms": us / runs / 1000.0} for (n, op), us in nodes]}


def fmt_ratio(cell):
    if not cell:
        return "-"
    if "ratio" in cell:
        return f"{cell['ratio']:.2f}"
    return "failed" if cell.get("errors") else "-"


def fmt_ms(cell, k):
    s = (cell or {}).get(k)
    return f"{s['median_ms']:.1f}" if s else "-"


def summarize(doc):
    scores = []
    for r in doc["results"]:
        cells = [r.get("latency", {}).get(str(t)) for t in doc["threads"]]
        if cells and all(c and "ratio" in c for c in cells):
            r["worse_ratio"] = max(c["ratio"] for c in cells)
            scores.append(r["worse_ratio"])
        else:
            r.pop("worse_ratio", None)
    doc["summary"] = {
        "models": len(doc["results"]),
        "correct": sum(1 for r in doc["results"] if r.get("correctness", {}).get("correct")),
        "timed_both": len(scores),
        "at_or_under_ort": sum(1 for s in scores if s <= 1.0),
        "geomean_worse_ratio": math.exp(sum(map(math.log, scores)) / len(scores)) if scores else None,
    }


def table(doc):
    th = doc["threads"]
    head = ("| model | family | correct (max err / range) | "
            + " | ".join(f"ours ms {t}t | ORT ms {t}t | ours/ORT {t}t" for t in th) + " |")
    sep = "|---|---|---|" + "--:|--:|--:|" * len(th)
    lines = [head, sep]
    for r in doc["results"]:
        c = r.get("correctness")
        if r.get("error"):
            corr = r["error"]
        elif c is None:
            corr = "-"
        else:
            ort = c.get("ort_max_err")
            ort = "" if ort is None else (f"; ORT {ort:.1e}" if math.isfinite(ort) else "; ORT labels differ")
            corr = (f"yes ({c['max_err']:.1e}{ort})" if c["correct"]
                    else "**no**: " + "; ".join(c.get("problems", [])) + (f" ({ort[2:]})" if ort else ""))
            f64 = r.get("torch_fp32_vs_fp64")
            if not c["correct"] and f64 is not None and f64 > doc.get("tol", 1e-4):
                corr += f" (torch float32 itself differs from float64 by {f64:.1e})"
        cells = []
        for t in th:
            cell = r.get("latency", {}).get(str(t))
            ratio = fmt_ratio(cell)
            if cell and "ratio" in cell and cell["ratio"] > 1.0:
                ratio = f"**{ratio}**"
            cells.append(f"{fmt_ms(cell, 'ours')} | {fmt_ms(cell, 'ort')} | {ratio}")
        lines.append(f"| {r['name']} | {r.get('family', '')} | {corr} | " + " | ".join(cells) + " |")
    s = doc.get("summary", {})
    if s.get("geomean_worse_ratio"):
        lines.append("")
        lines.append(f"{s['correct']} of {s['models']} models correct; {s['at_or_under_ort']} of "
                     f"{s['timed_both']} timed at or under ONNX Runtime at every thread count; geomean "
                     f"of the worse thread count's ours/ORT: {s['geomean_worse_ratio']:.2f}")
    return "\n".join(lines) + "\n"


def profile_table(doc, top=6):
    lines = []
    for r in doc["results"]:
        p = r.get("profile")
        if not p:
            continue
        ops = ", ".join(f"{o['op']} {o['ms']:.1f} ms ({100 * o['share']:.0f}%)" for o in p["ops"][:top])
        lines.append(f"- {r['name']} ({p['threads']} thread(s), {p['node_ms_per_run']:.1f} ms in nodes): {ops}")
    return "\n".join(lines) + ("\n" if lines else "")


def write(doc, path):
    summarize(doc)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def bench_model(args, zoo, entry):
    name = entry["name"]
    res = {"name": name, "family": entry.get("family", ""), "file": entry["file"],
           "torch_fp32_vs_fp64": entry.get("fp32_vs_fp64")}
    onnx_path = os.path.join(zoo, entry["file"])
    afm_stem = os.path.join(args.work, name)
    inputs = []
    for i in entry["inputs"]:
        inputs += ["--input", f"{i['name']}={os.path.join(zoo, i['file'])}"]
    t0 = time.monotonic()
    try:
        run_cmd([args.bin, "compile", f"--model={onnx_path}", f"--output={afm_stem}",
                 f"--report={afm_stem}_report.json"])
    except RuntimeError as e:
        res["error"] = f"compile error: {e}"
        return res
    res["compile_s"] = round(time.monotonic() - t0, 2)
    afm = afm_stem + ".afm"
    try:
        res["correctness"] = correctness(args, entry, zoo, afm, inputs)
    except RuntimeError as e:
        res["error"] = f"run error: {e}"
        return res
    c = res["correctness"]
    print(f"  {name}: {'correct' if c['correct'] else 'WRONG'}, max err / range {c['max_err']:.2e}"
          + ("" if c["correct"] else f" ({'; '.join(c['problems'])})"), flush=True)
    if args.no_bench:
        return res
    est = max(c["run_wall_s"] - 0.1, 0.001)
    res["latency"] = {}
    for t in args.threads:
        cell = bench_cell(args, afm, onnx_path, inputs, t, est)
        res["latency"][str(t)] = cell
        if "ours" in cell:
            est = cell["ours"]["median_ms"] / 1000.0
        print(f"  {name} {t} thread(s): ours {fmt_ms(cell, 'ours')} ms, ORT {fmt_ms(cell, 'ort')} ms, "
              f"ratio {fmt_ratio(cell)} ({cell['rounds']} rounds)"
              + (f" errors: {cell['errors']}" if cell.get("errors") else ""), flush=True)
    if args.profile:
        try:
            t = args.threads[0]
            res["profile"] = profile(args, afm, inputs, t, est, name)
        except (RuntimeError, ValueError, OSError) as e:
            res["profile_error"] = str(e)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("zoo", nargs="?", default="/work/zoo")
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="seconds each timed process aims at after the first round")
    ap.add_argument("--cell-budget", type=float, default=150.0,
                    help="seconds of running one (model, threads) cell should take at most")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "zoo.json"))
    ap.add_argument("--bin", default=os.environ.get("AF_BIN", os.path.join(ROOT, "build", "autofusion")))
    ap.add_argument("--work", default="/tmp/af-zoo-bench", help="compiled models and outputs")
    ap.add_argument("--resume", action="store_true", help="skip models already in --json")
    ap.add_argument("--profile", action="store_true", help="profile each model (time per op type)")
    ap.add_argument("--no-bench", action="store_true",
                    help="compile and check only, keeping the timings and profiles --json has")
    ap.add_argument("--table", metavar="JSON", help="only print the table of an earlier run")
    args = ap.parse_args()
    if args.table:
        doc = json.load(open(args.table))
        try:  # runs before the figure was stored: take it from the zoo's manifest
            man = {e["name"]: e for e in json.load(open(os.path.join(doc["zoo"], "manifest.json")))["models"]}
            for r in doc["results"]:
                r.setdefault("torch_fp32_vs_fp64", man.get(r["name"], {}).get("fp32_vs_fp64"))
        except (OSError, KeyError, ValueError):
            pass
        summarize(doc)
        print(table(doc) + "\n" + profile_table(doc), end="")
        return 0
    args.bin = os.path.abspath(args.bin)
    args.threads = [int(t) for t in args.threads.split(",") if t]
    os.makedirs(args.work, exist_ok=True)
    manifest = json.load(open(os.path.join(args.zoo, "manifest.json")))
    only = [n for n in args.only.split(",") if n]
    names = [e["name"] for e in manifest["models"]]
    unknown = [n for n in only if n not in names]
    if unknown:
        print(f"zoo_bench: not in the manifest: {', '.join(unknown)}", file=sys.stderr)
        return 2
    version = subprocess.run([args.bin, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    doc = {"results": []}
    if (only or args.resume or args.no_bench) and os.path.exists(args.json):
        doc = json.load(open(args.json))
    old = {r["name"]: r for r in doc["results"]}
    if args.no_bench:
        doc["checked"] = {"command": " ".join([sys.executable] + sys.argv), "git": rev,
                          "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    else:
        doc.update({"command": " ".join([sys.executable] + sys.argv), "bin": args.bin,
                    "autofusion": version, "git": rev, "machine": machine_info(),
                    "threads": args.threads, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "loadavg_start": os.getloadavg()})
    doc.setdefault("threads", args.threads)
    doc.update({"zoo": args.zoo, "torch": manifest.get("torch"), "torchvision": manifest.get("torchvision"),
                "tol": args.tol})
    doc["export_failed"] = manifest.get("failed", [])
    done = {r["name"] for r in doc["results"]}
    for e in manifest.get("failed", []):
        print(f"{e['name']}: not exported: {e['reason']}", flush=True)
    for entry in manifest["models"]:
        name = entry["name"]
        if only and name not in only:
            continue
        if args.resume and not only and name in done:
            continue
        print(f"{name}", flush=True)
        t0 = time.monotonic()
        res = bench_model(args, args.zoo, entry)
        if args.no_bench:  # keep the timings of the last timed run
            for k in ("latency", "profile", "profile_error", "wall_s"):
                if k in old.get(name, {}):
                    res[k] = old[name][k]
        else:
            res["wall_s"] = round(time.monotonic() - t0, 1)
        if res.get("error"):
            print(f"  {name}: {res['error']}", flush=True)
        doc["results"] = [r for r in doc["results"] if r["name"] != name] + [res]
        order = {n: i for i, n in enumerate(names)}
        doc["results"].sort(key=lambda r: order.get(r["name"], len(order)))
        if not args.no_bench:
            doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            doc["loadavg_end"] = os.getloadavg()
        write(doc, args.json)
    print()
    print(table(doc) + "\n" + profile_table(doc), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
