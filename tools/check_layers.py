#!/usr/bin/python3
"""Check that the folders of src/ form layers: a file may use (include, or call or read a symbol
of) its own folder and the folders below it in LAYERS, never one above. A strict order has no
cycles, so this is also the check that no dependency cycle runs between folders.

    /usr/bin/python3 tools/check_layers.py [--src src] [--objects build/CMakeFiles/afcore.dir]

Includes are read from the sources; symbols from the object files of the afcore library (nm),
when --objects is given. Prints each folder's dependencies and every violation (the files and
symbols involved); exits 1 when there is one. docs/design.md explains the layers.
"""

import argparse
import collections
import os
import re
import subprocess
import sys

# Bottom to top. A folder not listed here is an error (a new folder must say where it stands).
LAYERS = [
    "util",          # memory, checked arithmetic, half floats, files
    "ir",            # the graph, tensors, the op table, the epilogue encoding, plugin registry
    "onnx",          # ONNX wire format: import, export, .npy/.pb tensors
    "kernels",       # the kernel interface: af_exec (threads, scratch), function types
    "kernels/ref",   # reference kernels and shape functions: the oracle
    "kernels/simd",  # CPU dispatch, per-ISA vector tables, vector math
    "kernels/fast",  # fast kernels and the dispatcher
    "passes",        # shapes, simplify, fold, canonicalize
    "fusion",        # the rule table, engine, rules, report, cost model
    "lower",         # lowering for the fast kernels: cores, layout, precision, packing
    "runtime",       # executor, memory plan, profile, machine calibration
    "format",        # the .afm file
    "driver",        # the compile driver and the session API
]
# Folders that belong to their parent's layer.
MERGED = {"fusion/rules": "fusion"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def unit_of(rel):
    """The layer of a path relative to src/ (a file or a folder), or None."""
    folder = os.path.dirname(rel)
    return MERGED.get(folder, folder)


def sources(src):
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith((".c", ".h", ".def")):
                yield os.path.relpath(os.path.join(root, f), src)


def include_edges(src):
    for rel in sources(src):
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            for inc in INCLUDE.findall(f.read()):
                if os.path.exists(os.path.join(src, inc)):
                    yield rel, inc, "#include"


def symbol_edges(src, objects):
    defs, uses = {}, collections.defaultdict(set)
    for rel in sources(src):
        obj = os.path.join(objects, "src", rel + ".o")
        if not rel.endswith(".c") or not os.path.exists(obj):
            continue
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRVWC":
                defs[parts[2]] = rel
            elif len(parts) == 2 and parts[0] == "U":
                uses[rel].add(parts[1])
    for rel, names in uses.items():
        for name in sorted(names):
            if name in defs and defs[name] != rel:
                yield rel, defs[name], name


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(here, "..", "src"))
    ap.add_argument("--objects", help="the afcore target's object folder (CMakeFiles/afcore.dir)")
    args = ap.parse_args()
    rank = {u: i for i, u in enumerate(LAYERS)}
    edges = list(include_edges(args.src))
    if args.objects:
        edges += list(symbol_edges(args.src, args.objects))
    deps = collections.defaultdict(lambda: collections.defaultdict(list))
    unknown = sorted({unit_of(r) for r in sources(args.src)} - set(rank))
    for a, b, what in edges:
        ua, ub = unit_of(a), unit_of(b)
        if ua != ub:
            deps[ua][ub].append((a, b, what))
    bad = 0
    for ua in LAYERS:
        if ua not in deps:
            continue
        print(f"{ua} -> {', '.join(u for u in LAYERS if u in deps[ua])}")
        for ub, why in deps[ua].items():
            if rank.get(ub, -1) > rank.get(ua, -1):
                bad += 1
                print(f"  VIOLATION: {ua} uses {ub}, a layer above it:")
                for a, b, what in why[:8]:
                    print(f"    {a} -> {b} ({what})")
    for u in unknown:
        bad += 1
        print(f"VIOLATION: folder src/{u} is not in LAYERS (tools/check_layers.py)")
    print(f"{len(edges)} dependencies checked, {bad} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
