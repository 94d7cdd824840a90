#!/usr/bin/python3
"""Throughput against batch from bench/batch_bench.py's JSON, as an SVG written by hand.

    /usr/bin/python3 bench/plot_batch.py [bench/results/batch.json] [-o docs/img/batch_throughput.svg]

One panel per (model, threads): items/s (median latency) against batch on a log2 axis, one
colour per runtime (ours on the dynamic export, ours on a static compile at that shape, ONNX
Runtime on the dynamic export). Shapes whose other symbolic dims differ (BERT's sequence length)
get their own marker, and lines join only points with the same other dims. No dependency beyond
the standard library.
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SERIES = [("ours_dynamic", "autofusion, dynamic export", "#1f77b4", ""),
          ("ours_static", "autofusion, static compile", "#2ca02c", "5,4"),
          ("ort", "ONNX Runtime 1.30, dynamic export", "#d62728", "")]
MARKERS = ["circle", "square", "triangle", "diamond"]
PW, PH = 360, 250                # panel plot area
ML, MR, MT, MB = 62, 18, 34, 44  # panel margins
NAMES = {"resnet50": "ResNet-50", "bert_base": "BERT-Base", "resnet101": "ResNet-101",
         "vit_b_16": "ViT-B/16", "efficientnet_b4": "EfficientNet-B4"}


def nice_ticks(hi, n=5):
    if hi <= 0:
        return [0, 1]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(hi / step)) + 1)]


def marker(kind, x, y, color, r=4.2):
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{color}"/>'
    if kind == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" fill="{color}"/>'
    if kind == "triangle":
        return (f'<polygon points="{x:.1f},{y - r * 1.2:.1f} {x - r * 1.1:.1f},{y + r * 0.8:.1f} '
                f'{x + r * 1.1:.1f},{y + r * 0.8:.1f}" fill="{color}"/>')
    return (f'<polygon points="{x:.1f},{y - r * 1.3:.1f} {x - r:.1f},{y:.1f} {x:.1f},{y + r * 1.3:.1f} '
            f'{x + r:.1f},{y:.1f}" fill="{color}"/>')


def fmt(v):
    return f"{v:g}" if v < 1000 else f"{v / 1000:g}k"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="?", default=os.path.join(HERE, "results", "batch.json"))
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "img", "batch_throughput.svg"))
    args = ap.parse_args()
    doc = json.load(open(args.json))
    rows = [r for r in doc["results"] if r.get("runtimes")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    threads = sorted({r["threads"] for r in rows})
    # the other symbolic dims of a shape (BERT's sequence): one marker each, per model
    def rest(r):
        return "x".join(map(str, r["shape"][1:]))
    rest_syms = {r["model"]: list(r["symbols"])[1:] for r in rows}
    rests = {m: list(dict.fromkeys(rest(r) for r in rows if r["model"] == m)) for m in models}
    W = max(len(threads) * (ML + PW + MR) + 20, 720)
    nrt = sum(1 for key, label, _, _ in SERIES if any(key in r["runtimes"] for r in rows))
    rt_rows = 1 if sum(40 + 7 * len(l) for _, l, _, _ in SERIES) + 20 <= W else nrt
    legend_h = 30 + 20 * rt_rows + 18 * sum(1 for v in rests.values() if v != [""])
    H = 40 + legend_h + len(models) * (MT + PH + MB) + 16
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    cpu = doc.get("machine", {}).get("cpu", "")
    title = "Throughput against batch on dynamic exports (median latency)"
    sub = f"{cpu}, {doc.get('machine', {}).get('nproc', '?')} cores"
    out.append(f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>')
    out.append(f'<text x="{W / 2}" y="36" text-anchor="middle" fill="#555">{escape(sub)}</text>')
    # legend: runtimes (colour), then markers per model's other dims
    lx, ly = 20, 58
    for key, label, color, dash in SERIES:
        if not any(key in r["runtimes"] and "median_ms" in r["runtimes"][key] for r in rows):
            continue
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 26}" y2="{ly}" stroke="{color}" stroke-width="2.2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out.append(marker("circle", lx + 13, ly, color))
        out.append(f'<text x="{lx + 32}" y="{ly + 4}">{escape(label)}</text>')
        if rt_rows > 1:
            ly += 20
        else:
            lx += 40 + 7 * len(label)
    ly += 20 if rt_rows == 1 else 0
    for m in models:
        if rests[m] == [""]:
            continue
        lx = 20
        name = NAMES.get(m, m)
        syms = "x".join(rest_syms[m])
        out.append(f'<text x="{lx}" y="{ly + 4}">{escape(name)} {escape(syms)}:</text>')
        lx += 20 + 7 * len(f"{name} {syms}:")
        for i, rv in enumerate(rests[m]):
            out.append(marker(MARKERS[i % len(MARKERS)], lx, ly, "#555"))
            out.append(f'<text x="{lx + 9}" y="{ly + 4}">{escape(rv)}</text>')
            lx += 24 + 7 * len(rv)
        ly += 18
    top = 40 + legend_h
    x_left = (W - len(threads) * (ML + PW + MR)) / 2
    for mi, m in enumerate(models):
        for ti, t in enumerate(threads):
            cell = [r for r in rows if r["model"] == m and r["threads"] == t]
            if not cell:
                continue
            x0 = x_left + ti * (ML + PW + MR) + ML
            y0 = top + mi * (MT + PH + MB) + MT
            batches = sorted({r["batch"] for r in cell})
            lo, hi = math.log2(min(batches)), math.log2(max(batches))
            if hi - lo < 1e-9:
                lo, hi = lo - 1, hi + 1
            pad = 0.06 * (hi - lo)
            X = lambda b: x0 + (math.log2(b) - lo + pad) / (hi - lo + 2 * pad) * PW  # noqa: E731
            ymax = max((r["runtimes"][k]["items_per_s"] for r in cell for k in r["runtimes"]
                        if "items_per_s" in r["runtimes"][k]), default=1)
            ticks = nice_ticks(ymax * 1.05)
            Y = lambda v: y0 + PH - v / ticks[-1] * PH  # noqa: E731
            out.append(f'<text x="{x0 + PW / 2}" y="{y0 - 12}" text-anchor="middle" font-weight="bold">'
                       f'{escape(NAMES.get(m, m))}, {t} thread{"s" if t > 1 else ""}</text>')
            out.append(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#999"/>')
            for v in ticks:
                y = Y(v)
                out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PW}" y2="{y:.1f}" stroke="#e4e4e4"/>')
                out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
            for b in batches:
                x = X(b)
                out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + PH}" stroke="#f0f0f0"/>')
                out.append(f'<text x="{x:.1f}" y="{y0 + PH + 16}" text-anchor="middle">{b}</text>')
            out.append(f'<text x="{x0 + PW / 2}" y="{y0 + PH + 34}" text-anchor="middle">batch (log scale)</text>')
            unit = "images/s" if m.startswith(("resnet", "efficientnet", "vit")) else "items/s"
            if m.startswith("bert"):
                unit = "sequences/s"
            out.append(f'<text transform="translate({x0 - 46},{y0 + PH / 2}) rotate(-90)" '
                       f'text-anchor="middle">{unit}</text>')
            for key, label, color, dash in SERIES:
                for i, rv in enumerate(rests[m]):
                    pts = sorted((r["batch"], r["runtimes"][key]["items_per_s"], r) for r in cell
                                 if rest(r) == rv and "items_per_s" in r["runtimes"].get(key, {}))
                    if len(pts) > 1:
                        d = " ".join(f"{X(b):.1f},{Y(v):.1f}" for b, v, _ in pts)
                        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"'
                                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
                    for b, v, r in pts:
                        s = r["runtimes"][key]
                        tip = (f"{label}: {m} {'x'.join(map(str, r['shape']))}, {t} thread(s): "
                               f"{v:.1f}/s, median {s['median_ms']:.1f} ms")
                        out.append(f'<g><title>{escape(tip)}</title>'
                                   f'{marker(MARKERS[i % len(MARKERS)], X(b), Y(v), color)}</g>')
    out.append(f'<text x="{W - 8}" y="{H - 8}" text-anchor="end" font-size="10" fill="#777">'
               f'{escape(os.path.basename(args.json))}, '
               f'{escape((doc.get("merged") or [doc])[0].get("started") or "")}; '
               f'bench/batch_bench.py, bench/plot_batch.py</text>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(main())
