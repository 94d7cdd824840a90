#!/usr/bin/python3
"""Print the fused-op counts of the benchmark models as a Markdown table for the README.

    /usr/bin/python3 bench/count_fusions.py [--dir DIR] [--bin AUTOFUSION] [--models a,b,...]

For each model (default: the five of bench/export_models.py) runs `autofusion report MODEL --json`
and prints one row: nodes before and after fusion, how many times each rule applied
(effect_times, the "Matched" column of the text report), and the overall estimated speedup.
Models missing from DIR are exported first with bench/export_models.py (1-3 minutes for all five
on 2 cores). DIR defaults to $AF_MODEL_CACHE, else $XDG_CACHE_HOME/autofusion/models (or
~/.cache/autofusion/models); the binary to $AF_BIN, else build/autofusion.

Invariant: every number comes from the report of this binary on this machine (the speedups from
its calibrated roofline model), nothing is typed in; tests/models/test_fusion_counts.py checks
that these report counts match the fused graph that `compile --export_onnx` writes.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
MODELS = ["resnet50", "resnet101", "efficientnet_b4", "vit_b_16", "bert_base"]
TITLES = {"resnet50": "ResNet-50", "resnet101": "ResNet-101", "efficientnet_b4": "EfficientNet-B4",
          "vit_b_16": "ViT-B/16", "bert_base": "BERT-Base"}
# Table columns: the rules in the report's names, without "FusionOp".
RULES = ["ConvBNRelu", "ConvPoolFc", "SqueezeExcite", "MultiHeadAttention", "MatMulBiasAct",
         "LayerNormMatMul", "Elementwise"]


def default_dir():
    if os.environ.get("AF_MODEL_CACHE"):
        return os.environ["AF_MODEL_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autofusion", "models")


def default_bin():
    return os.environ.get("AF_BIN") or os.path.join(REPO, "build", "autofusion")


def ensure_exported(model_dir, names):
    """Export the models whose NAME.json (written after NAME.onnx) is missing."""
    missing = [n for n in names if not os.path.isfile(os.path.join(model_dir, n + ".json"))]
    if missing:
        print(f"exporting {', '.join(missing)} into {model_dir} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "export_models.py"), "--out",
                        model_dir, "--models", ",".join(missing)], check=True,
                       stdout=sys.stderr)


def report(binary, path):
    proc = subprocess.run([binary, "report", path, "--json"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"{binary} report {path}: exit {proc.returncode}\n{proc.stderr}")
    return json.loads(proc.stdout)


def rule_counts(rep):
    """effect_times per column. A rule may report some matches under another name
    (MatMulBiasActFusionOp as MatMulBiasReluFusionOp when the activation is Relu); such an entry
    shares its rule's pattern, which is how it is added to the rule's column."""
    gf = rep["graph_fusion"]
    pattern_of = {r: gf.get(r + "FusionOp", {}).get("pattern") for r in RULES}
    counts = dict.fromkeys(RULES, 0)
    for name, e in gf.items():
        col = name[:-len("FusionOp")] if name.endswith("FusionOp") else name
        if col not in counts:
            col = next((r for r in RULES if pattern_of[r] == e.get("pattern")), None)
        if col is None:
            sys.exit(f"report names an unknown pattern {name}: add a column for it")
        counts[col] += e["effect_times"]
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=default_dir(),
                    help="where NAME.onnx live (default %(default)s)")
    ap.add_argument("--bin", default=default_bin(), help="autofusion binary (default %(default)s)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {','.join(unknown)}; valid: {','.join(MODELS)}")
    os.makedirs(args.dir, exist_ok=True)
    ensure_exported(args.dir, names)

    header = ["Model", "Nodes before", "Nodes after"] + RULES + ["Est. speedup"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
    machine = None
    for name in names:
        rep = report(args.bin, os.path.join(args.dir, name + ".onnx"))
        machine = rep.get("machine", machine)
        counts = rule_counts(rep)
        row = [TITLES[name], str(rep["ops_before"]), str(rep["ops_after"])]
        row += [str(counts[r]) if counts[r] else "-" for r in RULES]
        row.append(f"{rep['overall_estimated_speedup']:.2f}x")
        print("| " + " | ".join(row) + " |", flush=True)
    print()
    print("Counts are rule applications (the report's effect_times): LayerNormMatMul counts "
          "LayerNorms, each fused as a prologue into every MatMul reading it. Nodes are counted "
          "as imported (ONNX Constant nodes become constants).", end="")
    if machine:
        print(f" Speedups are the roofline estimates for this machine "
              f"({machine['peak_gflops']:.1f} GFLOP/s peak, {machine['bandwidth_gbs']:.1f} GB/s, "
              "one core).")
    else:
        print()


if __name__ == "__main__":
    main()
