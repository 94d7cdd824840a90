"""ONNX Runtime's outputs from Python, through onnxruntime-node (bench/ort_bench.js): the
reference the tests compare with where it is installed ($ORT_NODE_DIR, else
<repo>/node_modules/onnxruntime-node; tools/install-deps.sh installs it)."""

import os
import subprocess

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT_DIR = os.environ.get("ORT_NODE_DIR") or os.path.join(REPO, "node_modules", "onnxruntime-node")


def ort_available():
    try:
        node = subprocess.run(["node", "--version"], capture_output=True).returncode == 0
    except OSError:
        node = False
    return node and os.path.isdir(ORT_DIR)


def ort_outputs(model, inputs, out_dir):
    """{output name: array} of one ONNX Runtime run of `model` on inputs {name: array}
    (written as .npy files into out_dir, beside the outputs)."""
    args = ["node", os.path.join(REPO, "bench", "ort_bench.js"), str(model), "--threads=1",
            "--iterations=1", "--warmup=0", f"--output_dir={out_dir}"]
    for name, arr in inputs.items():
        f = os.path.join(out_dir, f"in_{name}.npy")
        np.save(f, arr)
        args.append(f"--input={name}={f}")
    r = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, ORT_NODE_DIR=ORT_DIR))
    assert r.returncode == 0, r.stderr
    return {f[:-4]: np.load(os.path.join(out_dir, f)) for f in os.listdir(out_dir)
            if f.endswith(".npy") and not f.startswith("in_")}
