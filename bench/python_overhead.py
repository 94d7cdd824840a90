#!/usr/bin/python3
"""What a run through the Python package costs over the C API (issue 17's budget: 30 us on a
small model), and a large model's latency through Python against the CLI's.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py MODEL [MODEL...]
        [--rounds 5] [--iterations 2000] [--threads 1] [--bin build/autofusion]

For each model, --rounds rounds alternate two measurements: `autofusion bench MODEL --json`
(the C API's af_session_run in a loop, median of --iterations runs) and the same number of
`InferenceSession.run` calls in this process on the same input shape (median). Prints per model
the median over rounds of each and of their difference. Models with symbolic dims run at 1.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import autofusion

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def feed_of(sess):
    rng = np.random.default_rng(0)
    feed = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in a.shape]
        if a.type == "tensor(float)":
            feed[a.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feed[a.name] = np.ones(shape, np.int64)
    return feed


def python_median(sess, feed, n):
    for _ in range(min(n, 20)):
        sess.run(None, feed)
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        sess.run(None, feed)
        t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e6


def cli_median(binary, model, n, threads):
    r = subprocess.run([binary, "bench", model, f"--iterations={n}", f"--threads={threads}", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["fused"]["median_ms"] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "autofusion"))
    a = ap.parse_args()
    print(f"autofusion {autofusion.__version__}, {a.threads} thread(s), {a.rounds} rounds")
    for model in a.models:
        so = autofusion.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = autofusion.InferenceSession(model, so)
        feed = feed_of(sess)
        c, p = [], []
        for _ in range(a.rounds):
            c.append(cli_median(a.bin, model, a.iterations, a.threads))
            p.append(python_median(sess, feed, a.iterations))
        diff = statistics.median(pi - ci for pi, ci in zip(p, c))
        print(f"{os.path.basename(model)}: C API {statistics.median(c):.1f} us, Python "
              f"{statistics.median(p):.1f} us, Python - C {diff:+.1f} us "
              f"(ratio {statistics.median(p) / statistics.median(c):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
