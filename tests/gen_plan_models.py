#!/usr/bin/python3
"""Real models for tests/test_plan.c (the memory planner), exported by torch as tests/models does.

    /usr/bin/python3 tests/gen_plan_models.py OUT_DIR

Writes OUT_DIR/NAME.onnx and OUT_DIR/NAME.in<i>.npy (one per graph input, in input order) for:
  - resnet18: torchvision's ResNet-18 at 1x3x32x32 (residual adds, a pooled head; the last
    stage is 1x1, small enough for the reference kernels under AddressSanitizer);
  - bert_small: the 2-layer BERT of bench/bert.py (hidden 128, 2 heads), batch 2 x seq 16 with
    an attention mask that pads row 1 (shape arithmetic, masks, LayerNorm, GELU);
  - bert_dynamic: the same BERT with a symbolic batch and sequence (plans per shape);
  - testmodel: the seed's TestModel (tools/make_testmodel.py) at 1x3x32x32, as tests/models.

Invariant: deterministic (fixed seeds); every file passes onnx.checker (export_onnx checks it).
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")
sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, "bench"),
                os.path.join(REPO, "tools")]

import torch  # noqa: E402
import torchvision  # noqa: E402

import autofusion_export as afx  # noqa: E402
import bert  # noqa: E402
import make_testmodel  # noqa: E402

SEED = 0


def image(size, seed=SEED):
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed))


def save(out_dir, name, model, args, in_names, out_names, dynamic_axes=None):
    afx.export_onnx(model, args, os.path.join(out_dir, name + ".onnx"), in_names, out_names,
                    dynamic_axes=dynamic_axes)
    for i, a in enumerate(args):
        np.save(os.path.join(out_dir, f"{name}.in{i}.npy"), a.numpy())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)

    torch.manual_seed(SEED)
    resnet = torchvision.models.resnet18(weights=None)
    afx.randomize_init(resnet, SEED, calibration=(torch.cat([image(32, 1), image(32, 2)]),))
    save(out, "resnet18", resnet, (image(32),), ["input"], ["output"])

    cfg = bert.BertConfig.small(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000)
    model = bert.build_bert(cfg, SEED)
    ids, mask = bert.example_inputs(cfg, batch=2, seq=16, seed=SEED, pad=[0, 5])
    save(out, "bert_small", model, (ids, mask), ["input_ids", "attention_mask"],
         ["last_hidden_state", "pooler_output"])
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    save(out, "bert_dynamic", model, (ids, mask), ["input_ids", "attention_mask"],
         ["last_hidden_state", "pooler_output"], axes)

    save(out, "testmodel", make_testmodel.build_testmodel(SEED), (image(32),), ["input"],
         ["output"])


if __name__ == "__main__":
    main()
