#!/usr/bin/python3
"""Ours / ONNX Runtime per zoo model and thread count, from bench/zoo_bench.py's JSON, as an SVG
written by hand (no matplotlib needed).

    /usr/bin/python3 bench/plot_zoo.py [bench/results/zoo.json] [-o docs/img/zoo_ratio.svg]

One row per model (in the JSON's order, grouped by family), one bar per thread count, on a log
axis with a line at 1.0 (left of it we are faster). Models that failed (compile error, wrong
output, no timing) are listed on their row as such.
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
LABEL_W, PLOT_W, RIGHT = 350, 560, 60
ROW_H, FAM_H, TOP, BOTTOM = 22, 18, 82, 56


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="?", default=os.path.join(HERE, "results", "zoo.json"))
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "img", "zoo_ratio.svg"))
    args = ap.parse_args()
    doc = json.load(open(args.json))
    threads = [str(t) for t in doc["threads"]]
    rows = doc["results"]
    ratios = [c["ratio"] for r in rows for c in r.get("latency", {}).values() if "ratio" in c]
    lo = min([0.5] + [x / 1.2 for x in ratios])
    hi = max([2.0] + [x * 1.2 for x in ratios])
    llo, lhi = math.log10(lo), math.log10(hi)
    X = lambda v: LABEL_W + (math.log10(v) - llo) / (lhi - llo) * PLOT_W  # noqa: E731
    W = LABEL_W + PLOT_W + RIGHT
    ys, y, family = [], TOP, object()
    for r in rows:  # a header line before each family's rows
        if r.get("family") != family:
            family = r.get("family")
            y += FAM_H
        ys.append(y)
        y += ROW_H
    H = y + BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    m = doc.get("machine", {})
    out.append(f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
               'Model zoo: autofusion / ONNX Runtime latency (median), lower is better</text>')
    s = doc.get("summary", {})
    sub = f"{m.get('cpu', '')}, {m.get('nproc', '?')} cores"
    if s.get("geomean_worse_ratio"):
        sub += (f"; geomean of the worse thread count {s['geomean_worse_ratio']:.2f}, "
                f"{s['at_or_under_ort']} of {s['timed_both']} models at or under 1.0")
    out.append(f'<text x="{W / 2}" y="38" text-anchor="middle" fill="#555">{escape(sub)}</text>')
    lx = LABEL_W
    for i, t in enumerate(threads):
        out.append(f'<rect x="{lx}" y="52" width="14" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{lx + 20}" y="61">{t} thread{"s" if t != "1" else ""}</text>')
        lx += 100
    y_end = ys[-1] + ROW_H if ys else TOP
    ticks = [v for e in range(math.floor(llo), math.ceil(lhi) + 1)
             for v in (10 ** e, 2 * 10 ** e, 5 * 10 ** e) if lo <= v <= hi]
    for v in ticks:
        x = X(v)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{y_end}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{y_end + 16}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{LABEL_W + PLOT_W / 2}" y="{y_end + 36}" text-anchor="middle">'
               'ours / ONNX Runtime (log scale; left of 1.0 we are faster)</text>')
    family = object()
    for ri, r in enumerate(rows):
        y0 = ys[ri]
        if r.get("family") != family:
            family = r.get("family")
            out.append(f'<line x1="8" y1="{y0 - FAM_H + 2}" x2="{W - 8}" y2="{y0 - FAM_H + 2}" stroke="#bbb"/>')
            out.append(f'<text x="8" y="{y0 - 3}" fill="#666" font-weight="bold">{escape(family or "")}</text>')
        c = r.get("correctness") or {}
        bad = r.get("error") or (c and not c.get("correct"))
        name = r["name"] + (" (output differs)" if c and not c.get("correct") else "")
        out.append(f'<text x="{LABEL_W - 8}" y="{y0 + 15}" text-anchor="end"'
                   + (' fill="#c00"' if bad else "") + f'>{escape(name)}</text>')
        if r.get("error"):
            out.append(f'<text x="{LABEL_W + 6}" y="{y0 + 15}" fill="#c00">'
                       f'{escape(r["error"][:90])}</text>')
            continue
        bh = (ROW_H - 6) / max(1, len(threads))
        for ti, t in enumerate(threads):
            cell = r.get("latency", {}).get(t, {})
            yb = y0 + 3 + ti * bh
            if "ratio" not in cell:
                out.append(f'<text x="{LABEL_W + 6}" y="{yb + bh - 1:.1f}" font-size="9" fill="#c00">'
                           f'{t}t: no timing</text>')
                continue
            v = cell["ratio"]
            x1, xv = X(lo), X(v)
            tip = (f"{r['name']}, {t} thread(s): ours {cell['ours']['median_ms']:.1f} ms, "
                   f"ORT {cell['ort']['median_ms']:.1f} ms, ratio {v:.2f}")
            out.append(f'<g><title>{escape(tip)}</title><rect x="{x1:.1f}" y="{yb:.1f}" '
                       f'width="{max(xv - x1, 1):.1f}" height="{bh - 1:.1f}" '
                       f'fill="{COLORS[ti % len(COLORS)]}"/></g>')
            out.append(f'<text x="{xv + 4:.1f}" y="{yb + bh - 2:.1f}" font-size="9">{v:.2f}</text>')
    x1 = X(1.0)
    out.append(f'<line x1="{x1:.1f}" y1="{TOP - 8}" x2="{x1:.1f}" y2="{y_end}" stroke="#000" '
               'stroke-width="1.5" stroke-dasharray="5,3"/>')
    out.append(f'<text x="{W - 8}" y="{H - 8}" text-anchor="end" font-size="10" fill="#777">'
               f'{escape(os.path.basename(args.json))}, {escape(doc.get("started", ""))}; '
               'bench/zoo_bench.py, bench/plot_zoo.py</text>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
