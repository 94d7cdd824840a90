#!/usr/bin/python3
"""Peak resident memory of one run at each benchmark shape: ours on the .onnx, ours on the
compiled .afm, and ONNX Runtime 1.30 (onnxruntime-node), side by side.

    /usr/bin/python3 bench/memory.py [--dir models] [--dyn-dir models-dyn] [--bin build/autofusion]
        [--afm-dir /tmp/af-memory] [--threads 2] [--iterations 2] [--warmup 1]
        [--repeat 1] [--cases resnet50,bert_base_dyn_8x128,...] [--json memory.json]

Shapes: the five static exports (--dir) at their static shape; the dynamic exports (--dyn-dir)
of ResNet-50 at batch 1, 8, 32 and of BERT-Base at (batch, sequence) (1,128), (8,128), (1,384),
(32,32). Each .onnx is compiled once (`autofusion compile`, into --afm-dir, reused when newer
than its model). Every measurement is its own process:

- ours: `autofusion bench MODEL --warmup W --iterations N --threads T [--input_shape ...]`
  on the .onnx (import, optimise, fuse, lower, pack, run) and on the .afm (map, run);
- ONNX Runtime: node loads onnxruntime-node, creates an InferenceSession as bench/ort_bench.js
  does (all graph optimizations, CPU arena and memory pattern on: its defaults), makes inputs of
  the same shape and runs W + N times.

"Peak" is the kernel's maximum resident set size of the process (ru_maxrss from wait4, the
number `/usr/bin/time -v` prints), which counts file pages mapped and touched (our .afm
weights) as well as anonymous memory. While the process runs its /proc/PID/status is sampled
every few milliseconds for the largest RssAnon and RssFile seen (approximate: a short peak can
fall between samples). Node itself and the onnxruntime addon cost memory before any session
exists: the node script reports its own VmHWM after `require` and before the session ("base"),
and the table shows ONNX Runtime both as the whole process and net of that base.
With --repeat R every measurement is made R times (in turn) and the table shows the range
when the peaks differ (ONNX Runtime's BERT peak moves by ~130 MB from process to process; ours
by under 5 MB); the last column divides our largest peak by ONNX Runtime's smallest. Prints a Markdown table; --json writes every figure.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STATIC = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]
RESNET_BATCHES = [1, 8, 32]
BERT_SHAPES = [(1, 128), (8, 128), (1, 384), (32, 32)]

# ONNX Runtime's side: one session, inputs of the given shapes (symbolic dims not given are 1),
# warm-up + timed runs, then one JSON line with VmHWM / VmRSS / RssAnon / RssFile (kB) taken
# after `require`, after the session is made and after the runs.
ORT_JS = r"""
'use strict';
const fs = require('fs');
function status() {
  const s = fs.readFileSync('/proc/self/status', 'utf8'), o = {};
  for (const k of ['VmHWM', 'VmRSS', 'RssAnon', 'RssFile']) {
    const m = s.match(new RegExp('^' + k + ':\\s+(\\d+) kB', 'm'));
    o[k] = m ? parseInt(m[1], 10) : null;
  }
  return o;
}
const a = JSON.parse(process.env.AF_MEM_ARGS);
const ort = require(a.ort_dir);
const out = { base: status() };
async function main() {
  if (!a.model) { console.log(JSON.stringify(out)); return; }
  const sess = await ort.InferenceSession.create(a.model, {
    executionProviders: ['cpu'], graphOptimizationLevel: 'all',
    intraOpNumThreads: a.threads, interOpNumThreads: 1, executionMode: 'sequential',
  });
  out.session = status();
  let s = 1;
  const rand = () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s / 4294967296; };
  const feeds = {};
  for (const name of sess.inputNames) {
    const meta = sess.inputMetadata.find((m) => m.name === name);
    const dims = (a.shapes[name] || meta.shape.map((d) => (typeof d === 'number' && d > 0 ? d : 1)));
    const n = dims.reduce((x, y) => x * y, 1);
    if (meta.type === 'float32') {
      const t = new Float32Array(n);
      for (let i = 0; i < n; i++) t[i] = rand() * 2 - 1;
      feeds[name] = new ort.Tensor('float32', t, dims);
    } else if (meta.type === 'int64') {
      const t = new BigInt64Array(n);
      for (let i = 0; i < n; i++) t[i] = BigInt(name.includes('mask') ? 1 : Math.floor(rand() * 10));
      feeds[name] = new ort.Tensor('int64', t, dims);
    } else {
      throw new Error(`input '${name}' has type ${meta.type}`);
    }
  }
  for (let i = 0; i < a.warmup + a.iterations; i++) await sess.run(feeds);
  out.run = status();
  console.log(JSON.stringify(out));
}
main().catch((e) => { console.error(`memory.py (node): ${e.message}`); process.exit(1); });
"""

STATUS_RE = re.compile(r"^(VmHWM|VmRSS|RssAnon|RssFile):\s+(\d+) kB", re.M)


def measure(cmd, env=None, interval=0.003):
    """Run cmd; return (stdout, stderr, peak RSS kB from wait4, largest sampled RssAnon and
    RssFile kB)."""
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se, env=env)
        anon = filek = 0
        while True:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    st = dict((k, int(v)) for k, v in STATUS_RE.findall(f.read()))
                anon = max(anon, st.get("RssAnon", 0))
                filek = max(filek, st.get("RssFile", 0))
            except (OSError, ValueError):
                pass
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(interval)
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        out, err = so.read().decode(), se.read().decode()
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return out, err, ru.ru_maxrss, anon, filek


def cases(args):
    """(case id, label, shape text, .onnx, {input: dims} or None)."""
    out = []
    for m in STATIC:
        out.append((m, m, "static", os.path.join(args.dir, m + ".onnx"), None))
    for b in RESNET_BATCHES:
        out.append((f"resnet50_dyn_b{b}", "resnet50 (dynamic)", f"{b}x3x224x224",
                    os.path.join(args.dyn_dir, "resnet50.onnx"), {"input": [b, 3, 224, 224]}))
    for b, s in BERT_SHAPES:
        out.append((f"bert_base_dyn_{b}x{s}", "bert_base (dynamic)", f"({b},{s})",
                    os.path.join(args.dyn_dir, "bert_base.onnx"),
                    {"input_ids": [b, s], "attention_mask": [b, s]}))
    if args.cases:
        keep = args.cases.split(",")
        out = [c for c in out if c[0] in keep]
    return out


def input_shape_opt(shapes):
    if not shapes:
        return []
    return ["--input_shape=" + ";".join(f"{k}:{','.join(map(str, v))}" for k, v in shapes.items())]


def compiled(args, onnx_path):
    """The .afm of onnx_path in --afm-dir, compiled now unless a newer one is there."""
    tag = os.path.basename(os.path.dirname(os.path.abspath(onnx_path)))
    stem = os.path.splitext(os.path.basename(onnx_path))[0]
    base = os.path.join(args.afm_dir, f"{tag}_{stem}")
    afm = base + ".afm"
    if not (os.path.exists(afm) and os.path.getmtime(afm) > os.path.getmtime(onnx_path)):
        subprocess.run([args.bin, "compile", f"--model={onnx_path}", f"--output={base}",
                        "--log=error"], check=True, stdout=subprocess.DEVNULL)
    return afm


def afm_weight_bytes(args, afm):
    r = subprocess.run([args.bin, "inspect", afm], capture_output=True, text=True, check=True)
    m = re.search(r"^weights: (\d+) bytes", r.stdout, re.M)
    return int(m.group(1)) if m else None


def ours(args, model, shapes):
    cmd = [args.bin, "bench", model, f"--threads={args.threads}", f"--warmup={args.warmup}",
           f"--iterations={args.iterations}"] + input_shape_opt(shapes)
    _, _, peak, anon, filek = measure(cmd)
    return {"peak_kb": peak, "sampled_max_anon_kb": anon, "sampled_max_file_kb": filek}


def ort(args, model, shapes):
    env = dict(os.environ)
    env["AF_MEM_ARGS"] = json.dumps({"ort_dir": args.ort_dir, "model": model, "shapes": shapes or {},
                                     "threads": args.threads, "warmup": args.warmup,
                                     "iterations": args.iterations})
    out, _, peak, anon, filek = measure([args.node, "-e", ORT_JS], env=env)
    st = json.loads(out.strip().splitlines()[-1])
    return {"peak_kb": peak, "sampled_max_anon_kb": anon, "sampled_max_file_kb": filek,
            "base_hwm_kb": st["base"]["VmHWM"], "net_kb": peak - st["base"]["VmHWM"],
            "status": st}


def repeat(args, fn):
    """fn() --repeat times: the run with the largest peak, with every run's peak in peaks_kb."""
    runs = [fn() for _ in range(args.repeat)]
    best = dict(max(runs, key=lambda r: r["peak_kb"]))
    best["peaks_kb"] = [r["peak_kb"] for r in runs]
    if "net_kb" in best:
        best["nets_kb"] = [r["net_kb"] for r in runs]
    return best


def mb(kb):
    return f"{kb / 1024:.0f}"


def peak(r, key="peaks_kb"):
    """The peak in MB; "min-max" when repeated runs differ by 2 MB or more."""
    lo, hi = min(r[key]), max(r[key])
    return mb(hi) if hi - lo < 2048 else f"{mb(lo)}-{mb(hi)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "models"), help="static exports")
    ap.add_argument("--dyn-dir", default=os.path.join(ROOT, "models-dyn"), help="dynamic exports")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    ap.add_argument("--afm-dir", default="/tmp/af-memory")
    ap.add_argument("--node", default="node")
    ap.add_argument("--ort-dir", default=os.environ.get(
        "ORT_NODE_DIR", os.path.join(ROOT, "node_modules", "onnxruntime-node")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="processes per measurement; the table shows min-max when they differ")
    ap.add_argument("--cases", default=None, help="comma-separated case ids (default: all)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.makedirs(args.afm_dir, exist_ok=True)

    node_alone = measure([args.node, "-e", ""])[2]
    env = dict(os.environ, AF_MEM_ARGS=json.dumps({"ort_dir": args.ort_dir, "model": None}))
    node_ort = measure([args.node, "-e", ORT_JS], env=env)[2]
    results = {"threads": args.threads, "warmup": args.warmup, "iterations": args.iterations,
               "node_alone_peak_kb": node_alone, "node_with_ort_addon_peak_kb": node_ort,
               "cases": []}
    print(f"node alone: {mb(node_alone)} MB peak; node + onnxruntime-node loaded, no session: "
          f"{mb(node_ort)} MB", file=sys.stderr)
    for cid, label, shape, onnx_path, shapes in cases(args):
        afm = compiled(args, onnx_path)
        r = {"case": cid, "model": label, "shape": shape, "onnx": onnx_path, "afm": afm,
             "onnx_bytes": os.path.getsize(onnx_path), "afm_bytes": os.path.getsize(afm),
             "afm_weight_bytes": afm_weight_bytes(args, afm), "input_shapes": shapes}
        r["ours_onnx"] = repeat(args, lambda: ours(args, onnx_path, shapes))
        r["ours_afm"] = repeat(args, lambda: ours(args, afm, shapes))
        r["ort"] = repeat(args, lambda: ort(args, onnx_path, shapes))
        results["cases"].append(r)
        print(f"{cid}: onnx {mb(r['ours_onnx']['peak_kb'])} MB, afm {mb(r['ours_afm']['peak_kb'])}"
              f" MB, ORT {mb(r['ort']['peak_kb'])} MB", file=sys.stderr)

    print(f"\nPeak resident memory (MB = MiB), {args.threads} threads, {args.warmup} warm-up + "
          f"{args.iterations} runs. ORT net = ORT peak minus node+addon with no session "
          f"(measured per process; node alone {mb(node_alone)} MB, with the addon "
          f"{mb(node_ort)} MB). anon/file: largest RssAnon/RssFile sampled.\n")
    print("| Model | Shape | .onnx MB | .afm weights MB | ours .onnx peak | ours .afm peak "
          "(anon / file) | ORT peak (anon / file) | ORT net | .afm / ORT net |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in results["cases"]:
        o, a, t = r["ours_onnx"], r["ours_afm"], r["ort"]
        print(f"| {r['model']} | {r['shape']} | {r['onnx_bytes'] / 2**20:.0f} | "
              f"{(r['afm_weight_bytes'] or 0) / 2**20:.0f} | {peak(o)} | "
              f"{peak(a)} ({mb(a['sampled_max_anon_kb'])} / "
              f"{mb(a['sampled_max_file_kb'])}) | {peak(t)} "
              f"({mb(t['sampled_max_anon_kb'])} / {mb(t['sampled_max_file_kb'])}) | "
              f"{peak(t, 'nets_kb')} | {a['peak_kb'] / min(t['nets_kb']):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
