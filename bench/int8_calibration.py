"""Our int8 calibration on a benchmark model (issue 18, point 4): accuracy and latency.

    /usr/bin/python3 bench/int8_calibration.py resnet50|bert MODEL.onnx WORKDIR
        [--bin=build/autofusion] [--method=percentile] [--rounds=3] [--iterations=10]

Makes synthetic calibration and held-out sets in WORKDIR (ResNet: 16 calibration images in one
stacked [16,3,224,224] .npy and 8 held-out ones, smooth random colour fields with fine noise,
ImageNet-normalised; BERT: 16 and 6 samples of random token ids of random length 16-128 with
their attention masks, one subfolder each), compiles the model in fp32 and in int8 (with
--export_onnx, the QDQ model), then prints:
  - the cosine similarity of the int8 outputs with the fp32 ones on the held-out inputs;
  - ONNX Runtime on the exported QDQ model against ours: the share of output elements within
    one quantization step (the output's range / 255) (needs onnxruntime-node, ORT_NODE_DIR);
  - latency medians at 1 and 2 threads, ours fp32, ours int8 and ONNX Runtime on the QDQ
    model, run interleaved (one `bench` process per model and round, in turn), and the ratios
    per round.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ort_node import ORT_DIR, ort_available, ort_outputs  # noqa: E402


def image_sets(work, rng):
    import torch
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))

    def imgs(n):
        lo = torch.rand(n, 3, 14, 14, generator=g)
        x = torch.nn.functional.interpolate(lo, size=(224, 224), mode="bicubic",
                                            align_corners=False).clamp(0, 1)
        x = (x + 0.05 * torch.randn(n, 3, 224, 224, generator=g)).clamp(0, 1)
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        return ((x - mean) / std).numpy().astype(np.float32)

    os.makedirs(os.path.join(work, "cal"), exist_ok=True)
    np.save(os.path.join(work, "cal", "input.npy"), imgs(16))
    held = imgs(8)
    for i in range(8):
        os.makedirs(os.path.join(work, "held", str(i)), exist_ok=True)
        np.save(os.path.join(work, "held", str(i), "input.npy"), held[i:i + 1])


def token_sets(work, rng):
    def sample(d):
        os.makedirs(d, exist_ok=True)
        n = int(rng.integers(16, 129))
        ids = np.zeros((1, 128), np.int64)
        ids[0, :n] = rng.integers(1000, 30000, n)
        ids[0, 0], ids[0, n - 1] = 101, 102
        mask = np.zeros((1, 128), np.int64)
        mask[0, :n] = 1
        np.save(os.path.join(d, "input_ids.npy"), ids)
        np.save(os.path.join(d, "attention_mask.npy"), mask)

    for i in range(16):
        sample(os.path.join(work, "cal", f"{i:02d}"))
    for i in range(6):
        sample(os.path.join(work, "held", str(i)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["resnet50", "bert"])
    ap.add_argument("model")
    ap.add_argument("work")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "build", "autofusion"))
    ap.add_argument("--method", default="percentile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rng = np.random.default_rng(1)
    if not os.path.isdir(os.path.join(a.work, "cal")):
        (image_sets if a.kind == "resnet50" else token_sets)(a.work, rng)
    w = lambda f: os.path.join(a.work, f)  # noqa: E731
    subprocess.run([a.bin, "compile", f"--model={a.model}", f"--output={w('fp32')}", "--threads=2"],
                   check=True, capture_output=True)
    r = subprocess.run([a.bin, "compile", f"--model={a.model}", f"--output={w('int8')}",
                        "--threads=2", "--precision_mode=int8", f"--calibration_data={w('cal')}",
                        f"--calibration_method={a.method}", f"--export_onnx={w('qdq.onnx')}",
                        f"--report={w('int8.json')}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(w("int8.json")) as f:
        prec = json.load(f)["precision"]
    print(f"{a.kind}: {sum(e['precision'] == 'int8' for e in prec['ops'])} ops int8; {prec['note']}")
    ort = ort_available()

    def run(model, files):
        d = tempfile.mkdtemp()
        args = [a.bin, "run", model, f"--output_dir={d}", "--threads=2"]
        args += [f"--input={n}={f}" for n, f in files.items()]
        subprocess.run(args, check=True, capture_output=True)
        return {f[:-4]: np.load(os.path.join(d, f)) for f in os.listdir(d)}

    def cosine(x, y):
        x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
        return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))

    cos, within = {}, {}
    sets = sorted(glob.glob(w("held") + "/*"))
    for s in sets:
        files = {os.path.basename(f)[:-4]: f for f in glob.glob(s + "/*.npy")}
        want, got = run(a.model, files), run(w("int8.afm"), files)
        ref = ort_outputs(w("qdq.onnx"), {n: np.load(f) for n, f in files.items()},
                          tempfile.mkdtemp()) if ort else {}
        for k in want:
            cos.setdefault(k, []).append(cosine(got[k], want[k]))
            if k in ref:
                step = (ref[k].max() - ref[k].min()) / 255
                within.setdefault(k, []).append(float(np.mean(np.abs(got[k] - ref[k]) <= step)))
    for k in cos:
        line = f"  {k}: cosine int8 vs fp32 min {min(cos[k]):.5f} mean {np.mean(cos[k]):.5f} " \
               f"({len(cos[k])} held-out inputs)"
        if k in within:
            line += f"; ours vs ONNX Runtime on the QDQ model: {100 * min(within[k]):.2f}% of " \
                    "elements within one step (worst input)"
        print(line)
    files = {os.path.basename(f)[:-4]: f for f in glob.glob(sets[0] + "/*.npy")}
    inputs = [f"--input={n}={f}" for n, f in files.items()]

    def ours(model, t):
        r = subprocess.run([a.bin, "bench", model, f"--threads={t}",
                            f"--iterations={a.iterations}", "--warmup=3", "--json"] + inputs,
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])["fused"]["median_ms"]

    def onnxruntime(model, t):
        r = subprocess.run(["node", os.path.join(HERE, "ort_bench.js"), model, f"--threads={t}",
                            f"--iterations={a.iterations}", "--warmup=3"] + inputs,
                           capture_output=True, text=True, check=True,
                           env=dict(os.environ, ORT_NODE_DIR=ORT_DIR))
        return json.loads(r.stdout.strip().splitlines()[-1])["median_ms"]

    for t in (1, 2):
        f32, i8, o = [], [], []
        for _ in range(a.rounds):
            f32.append(ours(w("fp32.afm"), t))
            i8.append(ours(w("int8.afm"), t))
            if ort:
                o.append(onnxruntime(w("qdq.onnx"), t))
        ratio = [y / x for x, y in zip(f32, i8)]
        line = f"  threads {t}: ours fp32 {statistics.median(f32):.1f} ms, ours int8 " \
               f"{statistics.median(i8):.1f} ms"
        if o:
            line += f", ONNX Runtime on the QDQ model {statistics.median(o):.1f} ms"
        line += f"; int8 / fp32 {statistics.median(ratio):.2f}x (rounds " \
                f"{', '.join(f'{x:.2f}' for x in ratio)})"
        if o:
            line += f", ours int8 / ONNX Runtime {statistics.median([y / z for y, z in zip(i8, o)]):.2f}x"
        print(line)


if __name__ == "__main__":
    main()
