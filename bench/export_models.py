#!/usr/bin/python3
"""Export the five benchmark models of the seed's table to ONNX, offline.

    /usr/bin/python3 bench/export_models.py --out DIR [--models resnet50,resnet101,...] [--opset N]

Models: resnet50, resnet101 (224x224), efficientnet_b4 (380x380), vit_b_16 (224x224) from
torchvision, and bert_base (sequence 128) from bench/bert.py. Batch 1 everywhere; with
--dynamic the batch axis is symbolic ("batch"), and for bert_base the sequence axis too
("sequence"), as Hugging Face exports mark them.

Invariant: no network access (torchvision weights=None, random weights from a fixed seed; biases
and norm parameters are randomized too and BatchNorm statistics calibrated on random images, so
activations stay O(1) as in a trained model), so two runs write the same files; every BatchNorm
stays a BatchNormalization node; every file passes onnx.checker and has no Identity nodes (the
exporter's mark of deduplicated equal weights, which trained models do not have). Next to each
DIR/NAME.onnx goes DIR/NAME.json with input/output names, dtypes and shapes, the opset, and the
op_type histogram. Latency numbers do not depend on weight values, so random weights serve
benchmarking as well as trained ones.
"""

import argparse
import os
import sys
import time

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import autofusion_export as afx  # noqa: E402
import bert  # noqa: E402

SEED = 0

# name -> (torchvision constructor or None for BERT, image size)
MODELS = {
    "resnet50": (torchvision.models.resnet50, 224),
    "resnet101": (torchvision.models.resnet101, 224),
    "efficientnet_b4": (torchvision.models.efficientnet_b4, 380),
    "vit_b_16": (torchvision.models.vit_b_16, 224),
    "bert_base": (None, 128),
}


def build(name):
    """(model, example args tuple, input names, output names) for one benchmark model."""
    ctor, size = MODELS[name]
    torch.manual_seed(SEED)
    if ctor is None:
        cfg = bert.BertConfig.base()
        model = bert.build_bert(cfg, SEED)
        ids, mask = bert.example_inputs(cfg, 1, size, SEED)
        return model, (ids, mask), ["input_ids", "attention_mask"], \
            ["last_hidden_state", "pooler_output"]
    model = ctor(weights=None)
    calib = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(SEED + 1))
    afx.randomize_init(model, SEED, calibration=(calib,))
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(SEED))
    return model, (x,), ["input"], ["output"]


def dynamic_axes(name, in_names, out_names):
    """The symbolic axes of a dynamic export: batch everywhere, and BERT's sequence."""
    axes = {0: "batch", 1: "sequence"} if name == "bert_base" else {0: "batch"}
    out = {n: dict(axes) for n in in_names}
    for n in out_names:
        out[n] = {0: "batch"} if n == "pooler_output" or name != "bert_base" else dict(axes)
    return out


def export_one(name, out_dir, opset, dynamic=False):
    t0 = time.monotonic()
    model, args, in_names, out_names = build(name)
    path = os.path.join(out_dir, name + ".onnx")
    axes = dynamic_axes(name, in_names, out_names) if dynamic else None
    proto = afx.export_onnx(model, args, path, in_names, out_names, opset=opset,
                            dynamic_axes=axes)
    seconds = time.monotonic() - t0
    hist = afx.op_histogram(proto)
    if "Identity" in hist:
        raise RuntimeError(f"{path}: {hist['Identity']} Identity nodes: some weights are equal")
    afx.write_io_json(proto, os.path.join(out_dir, name + ".json"),
                      {"model": name, "opset": opset, "seed": SEED, "ops": hist})
    print(f"{name}: {afx.file_mb(path):.1f} MB, {len(proto.graph.node)} nodes, "
          f"{seconds:.1f} s", flush=True)
    print(f"  ops: {' '.join(f'{k}x{v}' for k, v in hist.items())}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write NAME.onnx and NAME.json into")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated subset of: " + ",".join(MODELS))
    ap.add_argument("--opset", type=int, default=afx.DEFAULT_OPSET,
                    help=f"ONNX opset to export with (default {afx.DEFAULT_OPSET})")
    ap.add_argument("--dynamic", action="store_true",
                    help="symbolic batch axis (and sequence axis for bert_base)")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {','.join(unknown)}; valid: {','.join(MODELS)}")
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        export_one(name, args.out, args.opset, args.dynamic)


if __name__ == "__main__":
    main()
