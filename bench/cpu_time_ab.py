#!/usr/bin/python3
"""CPU time per run of two builds on the same models, alternating, for a machine too busy for
wall times: each sample is user + sys of `B bench M.afm --iterations=N+5` minus that of
`--iterations=5` (load, warm-up and the bench's own runs cancel), divided by N. Each build
compiles the models with itself first.

    /usr/bin/python3 bench/cpu_time_ab.py A_BIN B_BIN M.onnx [M2.onnx ...] [--rounds 7] [--iterations 40]

Prints one Markdown row per model: medians over rounds and B / A. One thread only (CPU time of
two threads counts spinning too).
"""

import argparse
import os
import statistics
import subprocess
import tempfile


def cpu_seconds(argv):
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execv(argv[0], argv)
    _, status, ru = os.wait4(pid, 0)
    if status:
        raise SystemExit(f"{' '.join(argv)}: exit status {status}")
    return ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=40)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    afm = {}
    for side, binary in (("a", args.a), ("b", args.b)):
        for m in args.models:
            out = os.path.join(tmp, f"{side}_{os.path.basename(m)}.afm")
            subprocess.run([binary, "compile", m, f"--output={out}"], capture_output=True, check=True)
            afm[side, m] = out
    res = {}
    for r in range(args.rounds):
        for m in args.models:
            order = [("a", args.a), ("b", args.b)]
            if r % 2:
                order.reverse()
            for side, binary in order:
                run = [binary, "bench", afm[side, m], "--threads=1", "--json"]
                t = cpu_seconds(run + [f"--iterations={args.iterations + 5}"]) - \
                    cpu_seconds(run + ["--iterations=5"])
                res.setdefault((side, m), []).append(t / args.iterations * 1000)
    print("| model (1 thread) | A CPU ms / run | B CPU ms / run | B / A |")
    print("|---|--:|--:|--:|")
    for m in args.models:
        a, b = statistics.median(res["a", m]), statistics.median(res["b", m])
        print(f"| {os.path.basename(m)} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
