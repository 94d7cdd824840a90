"""The model zoo's correctness in small (issue 16): a few tiny models of different kinds, built
and exported with bench/zoo_export.py's code (random normalisation statistics, dynamic batch,
torch.onnx.export's defaults), compiled to an .afm and run at batch 1 and batch 3 against torch
eager: max |ours - torch| / (max(torch) - min(torch)) <= 1e-4 for every output.

The kinds: a torchvision CNN with Concat (SqueezeNet at 64x64), grouped convolutions (a
one-block-per-stage ResNeXt, RegNetY-400MF, at 64x64), a wav2vec2-style 1-D conv
extractor with GroupNorm and GELU, a 3-D conv block (R3D and R(2+1)D convs, BatchNorm3d, pooling),
a GPT-2-style decoder with a causal mask and past key/values (dynamic sequence and past length
too), a T5-style encoder-decoder (RMSNorm, relative position bias), a segmentation head with
Resize back to the input size, and decoders with ConvTranspose of every rank: a U-Net
(ConvTranspose2d 2x2 stride 2, skip Concat), a HiFi-GAN-style vocoder (ConvTranspose1d with
kernel 2 x stride, LeakyReLU, dilated residual convs) and a 3-D decoder (ConvTranspose3d with
BatchNorm3d and ReLU, an in-plane (1, 4, 4) stride (1, 2, 2) one).

Invariant: fixed seeds; every model is tiny (the module takes well under 2 minutes on 2 cores).
"""

import os
import subprocess

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import autofusion_cli as afc
import zoo_bench
import zoo_export as zx

TOL = 1e-4


class Video3d(nn.Module):
    """R3D and R(2+1)D pieces: a 3x3x3 conv stem, a (1x3x3, 3x1x1) factorised conv pair, a
    residual add, max pooling over time and space, average pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False),
                                  nn.BatchNorm3d(8), nn.ReLU())
        self.spatial = nn.Sequential(nn.Conv3d(8, 12, (1, 3, 3), padding=(0, 1, 1), bias=False),
                                     nn.BatchNorm3d(12), nn.ReLU())
        self.temporal = nn.Sequential(nn.Conv3d(12, 8, (3, 1, 1), padding=(1, 0, 0), bias=False),
                                      nn.BatchNorm3d(8))
        self.pool = nn.MaxPool3d(2)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(self.temporal(self.spatial(x)) + x)
        x = nn.functional.adaptive_avg_pool3d(self.pool(x), 1).flatten(1)
        return self.head(x)


class SegHead(nn.Module):
    """An LRASPP-style head: a strided backbone, a sigmoid-gated branch, a 1x1 classifier and a
    bilinear Resize back to the input's size (computed from its shape)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
                                      nn.Hardswish(), nn.Conv2d(16, 24, 3, stride=2, padding=1),
                                      nn.BatchNorm2d(24), nn.ReLU())
        self.cbr = nn.Sequential(nn.Conv2d(24, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.scale = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 16, 1), nn.Sigmoid())
        self.classifier = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        f = self.backbone(x)
        y = self.classifier(self.cbr(f) * self.scale(f))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


def squeezenet(batch=1):
    import torchvision
    model = torchvision.models.squeezenet1_1(weights=None, num_classes=10)
    return model, (zx.image(batch, 64),), ["input"], ["output"], \
        {"input": {0: "batch"}, "output": {0: "batch"}}


def resnext(batch=1):
    """ResNeXt bottlenecks, one per stage, 8 groups: 4, 8, 16 and 32 channels a group (the
    grouped row kernel and the per-group GEMMs)."""
    from torchvision.models.resnet import Bottleneck, ResNet
    model = ResNet(Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4, num_classes=10)
    return model, (zx.image(batch, 64),), ["input"], ["output"], \
        {"input": {0: "batch"}, "output": {0: "batch"}}


def regnet(batch=1):
    """RegNetY-400MF: groups of 8 channels over widths that leave half a block of 16 (104,
    440), squeeze-excite."""
    import torchvision
    model = torchvision.models.regnet_y_400mf(weights=None, num_classes=10)
    return model, (zx.image(batch, 64),), ["input"], ["output"], \
        {"input": {0: "batch"}, "output": {0: "batch"}}


def wav2vec2(batch=1):
    return zx.wav2vec2_fe(batch=batch, samples=1600, channels=32,
                          layers=((10, 5), (3, 2), (3, 2), (2, 2)), hidden=48)


def video3d(batch=1):
    x = torch.randn(batch, 3, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    return Video3d(), (x,), ["input"], ["output"], {"input": {0: "batch"}, "output": {0: "batch"}}


def gpt(batch=1):
    return zx.gpt2(batch=batch, seq=5, past=7, vocab=100, d=32, heads=2, layers=2, max_pos=64)


def t5(batch=1):
    return zx.t5(batch=batch, seq=12, dec_seq=6, vocab=100, d=32, heads=2, d_kv=16, d_ff=64, layers=2)


def seg_head(batch=1):
    return SegHead(), (zx.image(batch, 40),), ["input"], ["output"], \
        {"input": {0: "batch"}, "output": {0: "batch"}}


def unet(batch=1):
    return zx.unet(batch=batch, size=32, widths=(8, 16, 24))


def vocoder(batch=1):
    return zx.vocoder(batch=batch, frames=9, n_mels=16, width=32, rates=(4, 2))


def decoder3d(batch=1):
    return zx.decoder3d(batch=batch, c=16, frames=3, size=5)


MODELS = {"unet": (unet, 17), "vocoder_1d": (vocoder, 17), "decoder_3d": (decoder3d, 17),
          "squeezenet": (squeezenet, 13), "resnext": (resnext, 13), "regnet": (regnet, 13), "wav2vec2_fe": (wav2vec2, 17), "video3d": (video3d, 17),
          "gpt_past": (gpt, 17), "t5": (t5, 17), "seg_resize": (seg_head, 16)}


def run_ours(af_bin, model, names, arrays, tmp, tag):
    files = {}
    for n, a in zip(names, arrays):
        files[n] = str(tmp / f"{tag}_{zx.safe(n)}.npy")
        np.save(files[n], np.ascontiguousarray(a), allow_pickle=False)
    out = tmp / f"{tag}_out"
    r = afc.run(af_bin, model, files, output_dir=str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model(af_bin, tmp_path, name):
    builder, opset = MODELS[name]
    model, args, in_names, out_names, axes = zx.build(builder)
    onnx_path = str(tmp_path / f"{name}.onnx")
    zx.export(model, args, onnx_path, in_names, out_names, axes, opset)
    afm = str(tmp_path / name)
    r = subprocess.run([af_bin, "compile", f"--model={onnx_path}", f"--output={afm}"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    for batch in (1, 3):
        # the same weights (the model built above), inputs of this batch from the same builder
        inputs = args if batch == 1 else zx.build(builder, batch=batch)[1]
        with torch.no_grad():
            ref = zx.flat_outputs(model(*inputs))
        out = run_ours(af_bin, afm + ".afm", in_names, [a.numpy() for a in inputs], tmp_path, f"b{batch}")
        ours = afc.load_outputs(str(out), out_names)
        for n, t in zip(out_names, ref):
            t = t.numpy()
            assert ours[n].shape == t.shape, f"{name} batch {batch} output {n}"
            assert t.shape[0] == batch, f"{name}: {n} {t.shape}"
            err = zoo_bench.compare(t, ours[n])
            assert err <= TOL, f"{name} batch {batch} output {n}: max err / range {err:.2e}"
