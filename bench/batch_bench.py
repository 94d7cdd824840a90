#!/usr/bin/python3
"""Batch benchmark on dynamic exports: our runtime against ONNX Runtime, shape by shape.

    /usr/bin/python3 bench/batch_bench.py [--models resnet50,bert_base] [--threads 1,2]
        [--shapes "resnet50:1,8,32;bert_base:1x128,8x128,1x384,32x32"] [--rounds 4]
        [--iterations 4] [--warmup 1] [--min-time 1.0] [--bin build/autofusion]
        [--dyn-dir /work/dyn] [--static-dir models] [--no-static] [--from-onnx]
        [--work DIR] [--json bench/results/batch.json] [--md table.md] [--merge]
    /usr/bin/python3 bench/batch_bench.py --table bench/results/batch.json   # the table again

For every (model, shape, threads) cell, `rounds` rounds run back to back, each round one process
per runtime in an order that rotates from round to round:
  ours dynamic  `autofusion bench` on the dynamic export compiled once without --input_shape
                (DYN_DIR/MODEL.afm in --work; --from-onnx benches the .onnx itself),
  ours static   `autofusion bench` on a static compile at that shape: the static export
                (STATIC_DIR/MODEL.onnx) when its input shapes are the cell's, otherwise the
                dynamic export compiled with --input_shape fixing every symbolic dim (which gives
                the same graph as a static export: same fused ops, no run-time shape ops),
  ORT           `node bench/ort_bench.js` (onnxruntime-node, --ort-opt, default all) on the
                dynamic export,
all three on the same input tensors (.npy files written in --work: floats uniform in [-1, 1),
an attention_mask all ones, other integers in [1, 100), fixed seed). A dynamic export missing
from --dyn-dir is exported first with `bench/export_models.py --dynamic`. Each process times
`iterations` runs after `warmup` untimed ones; after the first round the count is raised, up to
5x, so that a process times at least --min-time seconds (cheap shapes get more samples).
A shape is "AxB..." giving the model's symbolic dims in order of first appearance in its inputs
(ResNet-50: batch; BERT: batch x sequence); its first dim is the batch, the items counted in
items/s. Statistics are over all timed runs of all rounds; the table's ratios are of those
medians and of the minima (the JSON also has the median of the per-round ratios). Writes every
sample, the per-round medians and the machine to --json after every cell, prints a Markdown
table (also to --md). --merge keeps the cells of an earlier --json that this run does not
measure (to measure a noisy cell again). bench/plot_batch.py draws throughput against batch from the JSON.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SHAPES = "resnet50:1,8,32;bert_base:1x128,8x128,1x384,32x32"
RUNTIMES = ("ours_dynamic", "ours_static", "ort")
LABELS = {"ours_dynamic": "ours (dynamic)", "ours_static": "ours (static)", "ort": "ORT"}


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def model_inputs(path):
    """[(name, numpy dtype, [int dim or symbol str])] of the graph inputs that are not weights."""
    import onnx
    try:
        from onnx.helper import tensor_dtype_to_np_dtype as np_dtype
    except ImportError:  # older onnx
        from onnx.mapping import TENSOR_TYPE_TO_NP_TYPE
        np_dtype = TENSOR_TYPE_TO_NP_TYPE.__getitem__
    m = onnx.load(path, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    out = []
    for i in m.graph.input:
        if i.name in init:
            continue
        tt = i.type.tensor_type
        dims = [d.dim_param if d.HasField("dim_param") or d.dim_value <= 0 else d.dim_value
                for d in tt.shape.dim]
        out.append((i.name, np_dtype(tt.elem_type), dims))
    return out


def symbols(inputs):
    seen = []
    for _, _, dims in inputs:
        for d in dims:
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


def bind(inputs, shape):
    """{input name: concrete dims} for a shape given as symbol values in order of appearance."""
    syms = symbols(inputs)
    if len(shape) != len(syms):
        raise ValueError(f"shape {'x'.join(map(str, shape))} gives {len(shape)} dims, the model "
                         f"has {len(syms)} symbolic ones ({', '.join(syms) or 'none'})")
    val = dict(zip(syms, shape))
    return {n: [val[d] if isinstance(d, str) else d for d in dims] for n, _, dims in inputs}


def write_inputs(inputs, dims, prefix, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    files = {}
    for name, dt, _ in inputs:
        shp = dims[name]
        if np.issubdtype(dt, np.floating):
            x = rng.uniform(-1, 1, shp).astype(dt)
        elif "mask" in name:
            x = np.ones(shp, dt)
        else:
            x = rng.integers(1, 100, shp).astype(dt)
        path = f"{prefix}_{name.replace('/', '_')}.npy"
        if not os.path.exists(path):
            np.save(path, x)
        files[name] = path
    return files


def compile_afm(args, onnx_path, out_stem, input_shape=None):
    if os.path.exists(out_stem + ".afm") and not args.recompile:
        return out_stem + ".afm"
    cmd = [args.bin, "compile", f"--model={onnx_path}", f"--output={out_stem}"]
    if input_shape:
        cmd.append(f"--input_shape={input_shape}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return out_stem + ".afm"


def machine_info():
    info = {"platform": platform.platform(), "nproc": os.cpu_count()}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
        flags = set()
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
        info["isa_flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_vnni",
                                                       "avx512_bf16", "avx512_fp16", "amx_tile",
                                                       "amx_bf16", "amx_int8")}
    except OSError:
        pass
    return info


HEAD = ("| model | shape | threads | ours ms (median / min) | ORT ms (median / min) "
        "| ours / ORT (medians) | ours / ORT (mins) | static ms (median / min) | dynamic / static "
        "| ours items/s | ORT items/s | static items/s |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")


def same_cell(a, b):
    return (a["model"], a["shape"], a["threads"]) == (b["model"], b["shape"], b["threads"])


def summarize(row):
    """Sets the row's ratios (of medians, of minima, median of the per-round ratios) and
    returns its Markdown table line."""
    rt = row["runtimes"]

    def cell(k):
        s = rt.get(k, {})
        return f"{s['median_ms']:.1f} / {s['min_ms']:.1f}" if "median_ms" in s else \
            ("n/a" if k not in rt else "failed")

    def ratio(a, b, key="median_ms"):
        if "median_ms" in rt.get(a, {}) and "median_ms" in rt.get(b, {}):
            return rt[a][key] / rt[b][key]
        return None

    def round_ratio(a, b):
        if "median_ms" in rt.get(a, {}) and "median_ms" in rt.get(b, {}):
            return statistics.median(x / y for x, y in zip(rt[a]["round_medians_ms"],
                                                           rt[b]["round_medians_ms"]))
        return None

    def ips(k):
        s = rt.get(k, {})
        return f"{s['items_per_s']:.1f}" if "items_per_s" in s else "-"

    def f3(v):
        return "-" if v is None else f"{v:.3f}"
    row["ours_over_ort"] = ratio("ours_dynamic", "ort")
    row["ours_over_ort_min"] = ratio("ours_dynamic", "ort", "min_ms")
    row["ours_over_ort_rounds"] = round_ratio("ours_dynamic", "ort")
    row["dynamic_over_static"] = ratio("ours_dynamic", "ours_static")
    row["dynamic_over_static_rounds"] = round_ratio("ours_dynamic", "ours_static")
    return (f"| {row['model']} | {'x'.join(map(str, row['shape']))} | {row['threads']} | "
            f"{cell('ours_dynamic')} | {cell('ort')} | {f3(row['ours_over_ort'])} | "
            f"{f3(row['ours_over_ort_min'])} | {cell('ours_static')} | "
            f"{f3(row['dynamic_over_static'])} | {ips('ours_dynamic')} | {ips('ort')} | "
            f"{ips('ours_static')} |")


def table(doc):
    return HEAD + "\n" + "\n".join(summarize(r) for r in doc["results"]) + "\n"


def stats(v):
    return {"median_ms": statistics.median(v), "min_ms": min(v), "n": len(v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,bert_base")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help="MODEL:SHAPE,SHAPE;... where SHAPE is AxB (symbolic dims in order)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=4, help="timed runs per process (minimum)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="after round 1, raise iterations (up to 5x) to time this many seconds")
    ap.add_argument("--bin", default=os.environ.get("AF_BIN", os.path.join(ROOT, "build", "autofusion")))
    ap.add_argument("--dyn-dir", default="/work/dyn")
    ap.add_argument("--static-dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--no-static", action="store_true", help="skip the static compiles")
    ap.add_argument("--from-onnx", action="store_true",
                    help="bench the .onnx files (compiled in each process) instead of .afm files")
    ap.add_argument("--recompile", action="store_true", help="recompile .afm files in --work")
    ap.add_argument("--ort-opt", default="all", choices=("all", "disabled"))
    ap.add_argument("--work", default="/tmp/af-batch-bench", help="inputs and .afm files")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "batch.json"))
    ap.add_argument("--md", default=None, help="also write the Markdown table here")
    ap.add_argument("--merge", action="store_true",
                    help="keep --json's other cells, replacing those measured again")
    ap.add_argument("--table", metavar="JSON", help="only print the table of an earlier run")
    args = ap.parse_args()
    if args.table:
        print(table(json.load(open(args.table))), end="")
        return 0
    args.bin = os.path.abspath(args.bin)
    os.makedirs(args.work, exist_ok=True)
    node = os.path.join(HERE, "ort_bench.js")
    shapes = {}
    for part in filter(None, args.shapes.split(";")):
        name, lst = part.split(":", 1)
        shapes[name.strip()] = [[int(d) for d in s.split("x")] for s in lst.split(",") if s]
    threads = [int(t) for t in args.threads.split(",")]
    models = [m for m in args.models.split(",") if m]
    version = subprocess.run([args.bin, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", os.path.dirname(args.bin), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    doc = {"command": " ".join([sys.executable] + sys.argv), "bin": args.bin,
           "autofusion": version, "git": rev, "machine": machine_info(),
           "loadavg_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "settings": {k: getattr(args, k) for k in ("rounds", "iterations", "warmup",
                                                      "min_time", "ort_opt", "from_onnx")},
           "results": [], "errors": []}
    if args.merge and os.path.exists(args.json):
        old = json.load(open(args.json))
        doc["results"] = old["results"]
        doc["errors"] = old.get("errors", [])
        doc["merged"] = old.get("merged", []) + [{k: old.get(k) for k in (
            "command", "started", "finished", "loadavg_start", "loadavg_end")}]
    print(HEAD, flush=True)
    for model in models:
        dyn = os.path.join(args.dyn_dir, model + ".onnx")
        if not os.path.exists(dyn):
            os.makedirs(args.dyn_dir, exist_ok=True)
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "export_models.py"), "--out",
                            args.dyn_dir, "--models", model, "--dynamic"], check=True)
        inputs = model_inputs(dyn)
        syms = symbols(inputs)
        static_src = os.path.join(args.static_dir, model + ".onnx")
        static_dims = None
        if not args.no_static and os.path.exists(static_src):
            s_in = model_inputs(static_src)
            if not symbols(s_in):
                static_dims = {n: d for n, _, d in s_in}
        elif not args.no_static:
            print(f"  {static_src} not found: static compiles come from the dynamic export",
                  file=sys.stderr, flush=True)
        dyn_model = dyn if args.from_onnx else compile_afm(args, dyn, os.path.join(args.work, model + "_dyn"))
        for shape in shapes.get(model, []):
            tag = "x".join(map(str, shape))
            cell_err = None
            try:
                dims = bind(inputs, shape)
                files = write_inputs(inputs, dims, os.path.join(args.work, f"{model}_{tag}"))
                static_model, static_how = None, None
                if not args.no_static:
                    if static_dims == dims:
                        static_how = "static export"
                        static_model = static_src if args.from_onnx else compile_afm(
                            args, static_src, os.path.join(args.work, f"{model}_static_{tag}"))
                    else:
                        static_how = "dynamic export compiled with --input_shape"
                        ishape = ";".join(f"{n}:{','.join(map(str, d))}" for n, d in dims.items())
                        static_model = compile_afm(args, dyn, os.path.join(
                            args.work, f"{model}_static_{tag}"), ishape)
            except (RuntimeError, ValueError) as e:
                cell_err = str(e)
            for t in threads:
                if cell_err:
                    doc["errors"].append({"model": model, "shape": shape, "threads": t, "error": cell_err})
                    print(f"| {model} | {tag} | {t} | error: {cell_err} |", flush=True)
                    continue
                af_in = [f"--input={n}={f}" for n, f in files.items()]
                cmds = {"ours_dynamic": [args.bin, "bench", dyn_model, "--json", f"--threads={t}"] + af_in,
                        "ort": ["node", node, dyn, f"--threads={t}", f"--opt={args.ort_opt}",
                                "--samples"] + af_in}
                if static_model:
                    cmds["ours_static"] = [args.bin, "bench", static_model, "--json",
                                           f"--threads={t}"] + af_in
                samples = {k: [] for k in cmds}
                rounds = {k: [] for k in cmds}
                load = {k: [] for k in cmds}
                errors = {}
                iters = args.iterations
                t0 = time.monotonic()
                order = [k for k in RUNTIMES if k in cmds]
                for r in range(args.rounds):
                    for k in order[r % len(order):] + order[:r % len(order)]:
                        if k in errors:
                            continue
                        cmd = cmds[k] + [f"--iterations={iters}", f"--warmup={args.warmup}"]
                        try:
                            o = run_json(cmd)
                        except (RuntimeError, ValueError) as e:
                            errors[k] = str(e)
                            doc["errors"].append({"model": model, "shape": shape, "threads": t,
                                                  "runtime": k, "error": str(e)})
                            print(f"  {model} {tag} t{t} {k}: {e}", file=sys.stderr, flush=True)
                            continue
                        v = o["samples_ms"] if k == "ort" else o["fused"]["samples_ms"]
                        samples[k] += v
                        rounds[k].append(statistics.median(v))
                        if "load_ms" in o:
                            load[k].append(o["load_ms"])
                    if r == 0 and rounds:
                        worst = max((rounds[k][0] for k in rounds if rounds[k]), default=0)
                        if worst > 0:
                            iters = max(args.iterations, min(5 * args.iterations,
                                        math.ceil(args.min_time * 1000 / worst)))
                batch = shape[0]
                row = {"model": model, "shape": shape, "symbols": dict(zip(syms, shape)),
                       "input_shapes": dims, "batch": batch, "threads": t,
                       "static_source": static_how, "seconds": time.monotonic() - t0,
                       "runtimes": {}}
                for k in cmds:
                    if samples[k]:
                        s = stats(samples[k])
                        s["items_per_s"] = batch * 1000 / s["median_ms"]
                        s["round_medians_ms"] = rounds[k]
                        s["samples_ms"] = samples[k]
                        if load[k]:
                            s["load_ms"] = load[k]
                        row["runtimes"][k] = s
                    else:
                        row["runtimes"][k] = {"error": errors.get(k, "no samples")}
                doc["results"].append(row)
                line = summarize(row)
                if args.merge:  # the new row takes the old one's place
                    doc["results"].pop()
                    at = [i for i, r in enumerate(doc["results"]) if same_cell(r, row)]
                    if at:
                        doc["results"][at[0]] = row
                    else:
                        doc["results"].append(row)
                print(line, flush=True)
                doc["loadavg_end"] = os.getloadavg()
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                with open(args.json, "w") as fh:  # after every cell: a partial run keeps its data
                    json.dump(doc, fh, indent=1)
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    doc["loadavg_end"] = os.getloadavg()
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(table(doc))
    if args.merge:
        print("\n" + table(doc))
    slower = [r for r in doc["results"] if r.get("ours_over_ort") and r["ours_over_ort"] > 1]
    if slower:
        print("\nours slower than ORT: " + ", ".join(
            f"{r['model']} {'x'.join(map(str, r['shape']))} t{r['threads']} {r['ours_over_ort']:.3f}"
            for r in slower))
    if doc["errors"]:
        print(f"\n{len(doc['errors'])} error(s); see {args.json}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
