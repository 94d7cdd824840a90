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


def ort_int8_exact():
    """Does ONNX Runtime compute int8 convolutions and matrix products exactly on this CPU?
    With AVX512_VNNI or AVX-VNNI its U8S8 kernels sum u8 x s8 products in int32 (VPDPBUSD).
    Without them (AVX2 only: AMD Zen 3, older Intel) MLAS sums pairs of products in 16 bits
    with saturation (VPMADDUBSW), and a pair of large activations times large weights of one
    sign clips: seen on an AMD EPYC, 2% of a QDQ conv's outputs off by up to 21 steps.
    There ONNX Runtime's outputs are no reference for an exact int8 result."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags
