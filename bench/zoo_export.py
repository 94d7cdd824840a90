#!/usr/bin/python3
"""The model zoo (issue 16): torch/torchvision models exported as a user exports them.

    /usr/bin/python3 bench/zoo_export.py OUT_DIR [--only name,name] [--list]

Writes, for each model NAME, OUT_DIR/NAME.onnx, one input set OUT_DIR/NAME/in_<input>.npy, torch
eager's outputs on it OUT_DIR/NAME/out_<output>.npy, and OUT_DIR/manifest.json (one entry per
model: name, family, file, opset, inputs and outputs with their shapes, dtypes and files, and
the float32 error of torch itself against float64 torch, which says how well-conditioned the
model is). A model already in the manifest whose files exist is kept unless it is named with
--only (then it is exported again); a model whose export fails is recorded in the manifest's
"failed" list with the reason (and printed), and left out.

How the models are made, the same for every one of them:
- torch.manual_seed(0) before the model is built (torchvision's own initialisation), then
  randomize(): every BatchNorm (FrozenBatchNorm2d too) gets running_mean ~ N(0, 0.1), running_var
  ~ U(0.5, 2), weight ~ U(0.5, 1.5), bias ~ N(0, 0.1); LayerNorm/GroupNorm/RMSNorm the same affine
  parameters; every other bias ~ N(0, 0.01); any other all-zero parameter ~ N(0, 0.02). A fresh
  torchvision model has its normalisations at identity, which hides bugs in them and lets torch
  share equal initializers through Identity nodes that no trained model has.
- eval mode, torch.onnx.export with its defaults (TrainingMode.EVAL: BatchNorm folded into the
  conv before it, constant folding on), a dynamic batch axis (dynamic_axes; the GPT-style
  decoder also a dynamic sequence and past length), the opset given in MODELS (13 to 17).
  Detection models take a list of images: their batch is 1 and their export is static. Faster
  R-CNN keeps every box (box_score_thresh 0): with random weights its class scores are about
  1/91, under the default threshold, and it would return no box at all.
- Inputs: images/video/audio ~ N(0, 1) (seed 1), token ids uniform in the vocabulary; batch 1.
- The exports are deterministic: the same torch gives the same bytes.

The custom models at the end (wav2vec2-style feature extractor, Whisper-style encoder, GPT-2-
and T5-style transformers) are written the way the public implementations (fairseq/transformers,
openai/whisper) lay them out; their sizes are parameters, so tests/models/test_zoo.py builds
tiny ones with the same code.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

SEED = 0


# ---------------------------------------------------------------------------------------------
# Random weights with non-trivial normalisation statistics

def randomize(model, seed=SEED):
    """Give a freshly built model random normalisation statistics and biases (see the module
    docstring). Returns the model in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            stats = getattr(mod, "running_mean", None) is not None
            norm = stats or isinstance(mod, (nn.LayerNorm, nn.GroupNorm, RMSNorm))
            if norm:
                w, b = getattr(mod, "weight", None), getattr(mod, "bias", None)
                if w is not None:
                    w.copy_(torch.rand(w.shape, generator=gen) + 0.5)
                if b is not None:
                    b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
                if stats:
                    c = mod.running_mean.shape
                    mod.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                    mod.running_var.copy_(torch.rand(c, generator=gen) * 1.5 + 0.5)
                continue
            for name, p in mod.named_parameters(recurse=False):
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
                elif not p.any():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Audio: wav2vec2's convolutional feature extractor (fairseq ConvFeatureExtractionModel with
# extractor_mode "default", as transformers' Wav2Vec2FeatureEncoder + FeatureProjection)

class Wav2Vec2FeatureExtractor(nn.Module):
    """conv1d(1->C, k10, s5) + GroupNorm(C groups) + GELU, then convs (C->C, k3 s2) x4 and
    (k2 s2) x2 each + GELU, no conv bias; then the feature projection: LayerNorm + Linear."""

    def __init__(self, channels=512, layers=((10, 5),) + ((3, 2),) * 4 + ((2, 2),) * 2, hidden=768):
        super().__init__()
        convs = []
        cin = 1
        for i, (k, s) in enumerate(layers):
            block = [nn.Conv1d(cin, channels, k, stride=s, bias=False)]
            if i == 0:
                block.append(nn.GroupNorm(channels, channels, affine=True))
            block.append(nn.GELU())
            convs.append(nn.Sequential(*block))
            cin = channels
        self.conv_layers = nn.ModuleList(convs)
        self.layer_norm = nn.LayerNorm(channels, eps=1e-5)
        self.projection = nn.Linear(channels, hidden)

    def forward(self, input_values):
        x = input_values[:, None]
        for conv in self.conv_layers:
            x = conv(x)
        x = x.transpose(1, 2)
        return self.projection(self.layer_norm(x))


# ---------------------------------------------------------------------------------------------
# Audio: Whisper's encoder (openai/whisper model.py: AudioEncoder, ResidualAttentionBlock)

def sinusoids(length, channels, max_timescale=10000):
    """Whisper's positional embedding."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class WhisperAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        n, t, d = q.shape
        scale = (d // self.heads) ** -0.25
        q = q.view(n, t, self.heads, -1).permute(0, 2, 1, 3) * scale
        k = k.view(n, t, self.heads, -1).permute(0, 2, 3, 1) * scale
        v = v.view(n, t, self.heads, -1).permute(0, 2, 1, 3)
        w = F.softmax((q @ k).float(), dim=-1).to(q.dtype)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


class WhisperBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.attn = WhisperAttention(d, heads)
        self.attn_ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.mlp_ln = nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class WhisperEncoder(nn.Module):
    """conv1d stem (n_mels->d, k3 p1) + GELU, conv1d (d->d, k3 s2 p1) + GELU, sinusoidal
    positions, pre-LN transformer blocks, a final LayerNorm (whisper-tiny: d 384, 6 heads, 4
    layers)."""

    def __init__(self, n_mels=80, n_ctx=500, d=384, heads=6, layers=4):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, d))
        self.blocks = nn.ModuleList(WhisperBlock(d, heads) for _ in range(layers))
        self.ln_post = nn.LayerNorm(d)

    def forward(self, mel):
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        x = x + self.positional_embedding
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


# ---------------------------------------------------------------------------------------------
# Transformers: GPT-2 (transformers' GPT2Model/GPT2LMHeadModel layout: Conv1D projections, a
# causal-mask buffer sliced to the key length, past key/values, tied embeddings)

class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out], y = x @ W + b (addmm on the flattened rows)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, d, heads, max_pos):
        super().__init__()
        self.heads = heads
        self.head_dim = d // heads
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool))
                             .view(1, 1, max_pos, max_pos))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)

    def split_heads(self, x):
        return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, x, past_key, past_value):
        q, k, v = self.c_attn(x).split(self.heads * self.head_dim, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        k = torch.cat((past_key, k), dim=-2)
        v = torch.cat((past_value, v), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        q_len, k_len = q.size(-2), k.size(-2)
        causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
        w = torch.where(causal, w, torch.finfo(w.dtype).min * torch.ones([], dtype=w.dtype))
        w = nn.functional.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.heads * self.head_dim,))
        return self.c_proj(a), k, v


class GPT2Block(nn.Module):
    def __init__(self, d, heads, max_pos):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = GPT2Attention(d, heads, max_pos)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = Conv1D(4 * d, d)
        self.c_proj = Conv1D(d, 4 * d)

    def forward(self, x, past_key, past_value):
        a, k, v = self.attn(self.ln_1(x), past_key, past_value)
        x = x + a
        h = self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + h, k, v


class GPT2(nn.Module):
    """A GPT-2 LM head model on input_ids [B, T] with position_ids from the past length and
    past_key_i/past_value_i [B, H, P, D] per layer; returns logits (tied to wte) and the presents."""

    def __init__(self, vocab=8192, d=512, heads=8, layers=6, max_pos=512):
        super().__init__()
        self.layers = layers
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, max_pos) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, input_ids, *past):
        past_len = past[0].size(-2)
        pos = torch.arange(past_len, input_ids.size(-1) + past_len, dtype=torch.long)
        x = self.wte(input_ids) + self.wpe(pos.unsqueeze(0))
        presents = []
        for i, block in enumerate(self.h):
            x, k, v = block(x, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # tied: lm_head.weight is wte.weight
        return (logits, *presents)


# ---------------------------------------------------------------------------------------------
# Transformers: T5 (transformers' T5Model layout: RMSNorm "T5LayerNorm", no attention scaling,
# relative position bias buckets computed in the first layer and shared, ReLU FFN, tied head
# scaled by d_model ** -0.5)

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def relative_position_bucket(rel, bidirectional, num_buckets=32, max_distance=128):
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).to(torch.long) * num_buckets
        rel = torch.abs(rel)
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, rel, large)


class T5Attention(nn.Module):
    def __init__(self, d, heads, d_kv, has_bias, bidirectional, num_buckets=32):
        super().__init__()
        self.heads, self.d_kv, self.bidirectional = heads, d_kv, bidirectional
        inner = heads * d_kv
        self.q = nn.Linear(d, inner, bias=False)
        self.k = nn.Linear(d, inner, bias=False)
        self.v = nn.Linear(d, inner, bias=False)
        self.o = nn.Linear(inner, d, bias=False)
        self.relative_attention_bias = nn.Embedding(num_buckets, heads) if has_bias else None

    def compute_bias(self, q_len, k_len):
        ctx = torch.arange(q_len, dtype=torch.long)[:, None]
        mem = torch.arange(k_len, dtype=torch.long)[None, :]
        bucket = relative_position_bucket(mem - ctx, self.bidirectional)
        return self.relative_attention_bias(bucket).permute([2, 0, 1]).unsqueeze(0)

    def forward(self, x, kv=None, bias=None, mask=None):
        b = x.size(0)
        kv = x if kv is None else kv
        shape = lambda t: t.view(b, -1, self.heads, self.d_kv).transpose(1, 2)  # noqa: E731
        q, k, v = shape(self.q(x)), shape(self.k(kv)), shape(self.v(kv))
        scores = torch.matmul(q, k.transpose(3, 2))
        if bias is None:
            bias = self.compute_bias(x.size(1), kv.size(1))
            if mask is not None:
                bias = bias + mask
        w = F.softmax(scores.float() + bias, dim=-1).type_as(scores)
        a = torch.matmul(w, v).transpose(1, 2).contiguous().view(b, -1, self.heads * self.d_kv)
        return self.o(a), bias


class T5Layer(nn.Module):
    def __init__(self, d, heads, d_kv, d_ff, has_bias, decoder):
        super().__init__()
        self.ln_sa = RMSNorm(d)
        self.sa = T5Attention(d, heads, d_kv, has_bias, bidirectional=not decoder)
        self.decoder = decoder
        if decoder:
            self.ln_ca = RMSNorm(d)
            self.ca = T5Attention(d, heads, d_kv, False, bidirectional=True)
        self.ln_ff = RMSNorm(d)
        self.wi = nn.Linear(d, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d, bias=False)

    def forward(self, x, bias, mask=None, enc=None, enc_bias=None):
        a, bias = self.sa(self.ln_sa(x), bias=bias, mask=mask)
        x = x + a
        if self.decoder:
            a, enc_bias = self.ca(self.ln_ca(x), kv=enc, bias=enc_bias)
            x = x + a
        x = x + self.wo(F.relu(self.wi(self.ln_ff(x))))
        return x, bias, enc_bias


class T5(nn.Module):
    """Encoder-decoder on input_ids [B, S] and decoder_input_ids [B, T]; returns the LM logits."""

    def __init__(self, vocab=8192, d=256, heads=4, d_kv=64, d_ff=1024, layers=4):
        super().__init__()
        self.d = d
        self.shared = nn.Embedding(vocab, d)
        self.encoder = nn.ModuleList(T5Layer(d, heads, d_kv, d_ff, i == 0, False) for i in range(layers))
        self.enc_ln = RMSNorm(d)
        self.decoder = nn.ModuleList(T5Layer(d, heads, d_kv, d_ff, i == 0, True) for i in range(layers))
        self.dec_ln = RMSNorm(d)
        nn.init.normal_(self.shared.weight, std=1.0)

    def forward(self, input_ids, decoder_input_ids):
        x = self.shared(input_ids)
        bias = None
        for layer in self.encoder:
            x, bias, _ = layer(x, bias)
        enc = self.enc_ln(x)
        y = self.shared(decoder_input_ids)
        t = decoder_input_ids.size(1)
        causal = torch.tril(torch.ones(t, t))[None, None]
        mask = (1.0 - causal) * torch.finfo(torch.float32).min
        bias, enc_bias = None, torch.zeros(1, 1, 1, 1)
        for layer in self.decoder:
            y, bias, enc_bias = layer(y, bias, mask, enc, enc_bias)
        y = self.dec_ln(y) * (self.d ** -0.5)
        return F.linear(y, self.shared.weight)


# ---------------------------------------------------------------------------------------------
# Wrappers for torchvision models whose outputs are not one tensor

class OutOnly(nn.Module):
    """Segmentation models return {"out": ...}."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


class Detect(nn.Module):
    """Detection models take a list of images and return a list of dicts; one image here."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, image):
        r = self.model([image[0]])[0]
        return r["boxes"], r["scores"], r["labels"]


class UNet(nn.Module):
    """A U-Net (Ronneberger et al.) as its public implementations lay it out: double 3x3 conv +
    BatchNorm + ReLU blocks, max pooling down, nn.ConvTranspose2d(2, stride 2) up, the skip
    concatenated, a 1x1 classifier."""

    def __init__(self, c_in=3, classes=2, widths=(32, 64, 128, 256)):
        super().__init__()

        def block(a, b):
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(),
                                 nn.Conv2d(b, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU())
        self.down = nn.ModuleList()
        c = c_in
        for w in widths:
            self.down.append(block(c, w))
            c = w
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(c, w, 2, stride=2))
            self.dec.append(block(2 * w, w))
            c = w
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        skips = []
        for i, d in enumerate(self.down):
            x = d(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips[:-1])):
            x = dec(torch.cat([up(x), skip], 1))
        return self.head(x)


class Vocoder(nn.Module):
    """A HiFi-GAN-style generator (Kong et al., V1 layout at reduced width): a 7-tap conv of the
    mel frames, then per stage LeakyReLU and nn.ConvTranspose1d(k = 2 s, stride s, padding s / 2)
    followed by a residual block of dilated convs (dilation 1, 3, 5), a 7-tap conv to one channel
    and tanh."""

    def __init__(self, n_mels=80, width=256, rates=(8, 8, 2, 2)):
        super().__init__()
        self.pre = nn.Conv1d(n_mels, width, 7, padding=3)
        self.ups = nn.ModuleList()
        self.res = nn.ModuleList()
        c = width
        for r in rates:
            self.ups.append(nn.ConvTranspose1d(c, c // 2, 2 * r, stride=r, padding=r // 2))
            c //= 2
            self.res.append(nn.ModuleList(nn.Conv1d(c, c, 3, dilation=d, padding=d) for d in (1, 3, 5)))
        self.post = nn.Conv1d(c, 1, 7, padding=3)

    def forward(self, mel):
        x = self.pre(mel)
        for up, res in zip(self.ups, self.res):
            x = up(F.leaky_relu(x, 0.1))
            for conv in res:
                x = x + conv(F.leaky_relu(x, 0.1))
        return torch.tanh(self.post(F.leaky_relu(x)))


class Decoder3d(nn.Module):
    """A volumetric segmentation decoder (3-D U-Net / V-Net style): nn.ConvTranspose3d 2x2x2
    stride 2 up with BatchNorm and ReLU, a 3x3x3 conv block, an in-plane ConvTranspose3d
    (1, 4, 4) stride (1, 2, 2), a 1x1x1 classifier."""

    def __init__(self, c=64, classes=3):
        super().__init__()
        self.up1 = nn.Sequential(nn.ConvTranspose3d(c, c // 2, 2, stride=2, bias=False),
                                 nn.BatchNorm3d(c // 2), nn.ReLU())
        self.conv = nn.Sequential(nn.Conv3d(c // 2, c // 2, 3, padding=1, bias=False),
                                  nn.BatchNorm3d(c // 2), nn.ReLU())
        self.up2 = nn.Sequential(nn.ConvTranspose3d(c // 2, c // 4, (1, 4, 4), stride=(1, 2, 2),
                                                    padding=(0, 1, 1), bias=False),
                                 nn.BatchNorm3d(c // 4), nn.ReLU())
        self.head = nn.Conv3d(c // 4, classes, 1)

    def forward(self, x):
        return self.head(self.up2(self.conv(self.up1(x))))


# ---------------------------------------------------------------------------------------------
# The zoo: name -> (family, opset, builder). A builder returns (module, inputs, input names,
# output names, dynamic axes).

def image(n=1, size=224, seed=1, c=3):
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(seed))


def vision(ctor, size=224, **kw):
    def build():
        import torchvision.models as tvm
        model = getattr(tvm, ctor)(weights=None, **kw)
        return model, (image(1, size),), ["input"], ["output"], \
            {"input": {0: "batch"}, "output": {0: "batch"}}
    return build


def segmentation(ctor, size=224):
    def build():
        import torchvision.models.segmentation as seg
        model = OutOnly(getattr(seg, ctor)(weights=None, weights_backbone=None, aux_loss=False))
        return model, (image(1, size),), ["input"], ["output"], \
            {"input": {0: "batch"}, "output": {0: "batch"}}
    return build


def video(ctor, frames=8, size=112):
    def build():
        import torchvision.models.video as vid
        model = getattr(vid, ctor)(weights=None)
        x = torch.randn(1, 3, frames, size, size, generator=torch.Generator().manual_seed(1))
        return model, (x,), ["input"], ["output"], {"input": {0: "batch"}, "output": {0: "batch"}}
    return build


def detection(ctor, size, **kw):
    def build():
        import torchvision.models.detection as det
        model = Detect(getattr(det, ctor)(weights=None, weights_backbone=None, **kw))
        return model, (image(1, size),), ["input"], ["boxes", "scores", "labels"], None
    return build


def unet(batch=1, size=256, **kw):
    return UNet(**kw), (image(batch, size),), ["input"], ["output"], \
        {"input": {0: "batch"}, "output": {0: "batch"}}


def vocoder(batch=1, frames=64, n_mels=80, **kw):
    mel = torch.randn(batch, n_mels, frames, generator=torch.Generator().manual_seed(1))
    return Vocoder(n_mels=n_mels, **kw), (mel,), ["mel"], ["audio"], \
        {"mel": {0: "batch"}, "audio": {0: "batch"}}


def decoder3d(batch=1, c=64, frames=4, size=14, **kw):
    x = torch.randn(batch, c, frames, size, size, generator=torch.Generator().manual_seed(1))
    return Decoder3d(c=c, **kw), (x,), ["features"], ["output"], \
        {"features": {0: "batch"}, "output": {0: "batch"}}


def wav2vec2_fe(batch=1, samples=16000, **kw):
    model = Wav2Vec2FeatureExtractor(**kw)
    x = torch.randn(batch, samples, generator=torch.Generator().manual_seed(1))
    return model, (x,), ["input_values"], ["features"], \
        {"input_values": {0: "batch"}, "features": {0: "batch"}}


def whisper_encoder(batch=1, frames=1000, n_mels=80, **kw):
    model = WhisperEncoder(n_mels=n_mels, n_ctx=frames // 2, **kw)
    x = torch.randn(batch, n_mels, frames, generator=torch.Generator().manual_seed(1))
    return model, (x,), ["mel"], ["hidden"], {"mel": {0: "batch"}, "hidden": {0: "batch"}}


def gpt2(batch=1, seq=64, past=64, vocab=8192, d=512, heads=8, layers=6, max_pos=512):
    model = GPT2(vocab, d, heads, layers, max_pos)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    pasts = [torch.randn(batch, heads, past, d // heads, generator=gen) for _ in range(2 * layers)]
    pnames = [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    onames = ["logits"] + [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    for n in pnames:
        axes[n] = {0: "batch", 2: "past_sequence"}
    for n in onames[1:]:
        axes[n] = {0: "batch", 2: "total_sequence"}
    return model, (ids, *pasts), ["input_ids"] + pnames, onames, axes


def t5(batch=1, seq=128, dec_seq=32, vocab=8192, **kw):
    model = T5(vocab, **kw)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    dec = torch.randint(0, vocab, (batch, dec_seq), generator=gen)
    return model, (ids, dec), ["input_ids", "decoder_input_ids"], ["logits"], \
        {"input_ids": {0: "batch"}, "decoder_input_ids": {0: "batch"}, "logits": {0: "batch"}}


MODELS = {
    # classification (torchvision), 224x224 unless said
    "resnet18": ("classification", 13, vision("resnet18")),
    "resnet34": ("classification", 17, vision("resnet34")),
    "resnext50_32x4d": ("classification", 17, vision("resnext50_32x4d")),
    "wide_resnet50_2": ("classification", 17, vision("wide_resnet50_2")),
    "densenet121": ("classification", 17, vision("densenet121")),
    "inception_v3": ("classification", 17, vision("inception_v3", 299, aux_logits=False, init_weights=True)),
    "googlenet": ("classification", 17, vision("googlenet", aux_logits=False, init_weights=True)),
    "squeezenet1_1": ("classification", 13, vision("squeezenet1_1")),
    "shufflenet_v2_x1_0": ("classification", 17, vision("shufflenet_v2_x1_0")),
    "mobilenet_v2": ("classification", 14, vision("mobilenet_v2")),
    "mobilenet_v3_large": ("classification", 17, vision("mobilenet_v3_large")),
    "mobilenet_v3_small": ("classification", 15, vision("mobilenet_v3_small")),
    "mnasnet1_0": ("classification", 17, vision("mnasnet1_0")),
    "efficientnet_b0": ("classification", 17, vision("efficientnet_b0")),
    "efficientnet_v2_s": ("classification", 17, vision("efficientnet_v2_s")),
    "regnet_y_400mf": ("classification", 16, vision("regnet_y_400mf")),
    "convnext_tiny": ("classification", 17, vision("convnext_tiny")),
    "swin_t": ("classification", 17, vision("swin_t")),
    "vit_b_32": ("classification", 17, vision("vit_b_32")),
    "alexnet": ("classification", 13, vision("alexnet")),
    # segmentation (Resize heads), 224x224
    "fcn_resnet50": ("segmentation", 17, segmentation("fcn_resnet50")),
    "deeplabv3_mobilenet_v3_large": ("segmentation", 17, segmentation("deeplabv3_mobilenet_v3_large")),
    "lraspp_mobilenet_v3_large": ("segmentation", 17, segmentation("lraspp_mobilenet_v3_large")),
    # decoders (ConvTranspose of rank 1, 2, 3)
    "unet": ("decoder", 17, unet),
    "hifigan_vocoder": ("decoder", 17, vocoder),
    "decoder3d": ("decoder", 17, decoder3d),
    # video (3-D convolutions), 1x3x8x112x112
    "r3d_18": ("video", 17, video("r3d_18")),
    "r2plus1d_18": ("video", 17, video("r2plus1d_18")),
    # audio
    "wav2vec2_feature_extractor": ("audio", 17, wav2vec2_fe),
    "whisper_tiny_encoder": ("audio", 17, whisper_encoder),
    # transformers
    "gpt2_decoder_past": ("transformer", 17, gpt2),
    "t5_encoder_decoder": ("transformer", 17, t5),
    # detection (batch 1, static)
    "ssdlite320_mobilenet_v3_large": ("detection", 17, detection("ssdlite320_mobilenet_v3_large", 320)),
    "retinanet_resnet50_fpn": ("detection", 17, detection("retinanet_resnet50_fpn", 320,
                                                         min_size=320, max_size=320)),
    "fasterrcnn_mobilenet_v3_large_320_fpn": ("detection", 17,
                                              detection("fasterrcnn_mobilenet_v3_large_320_fpn", 320,
                                                        box_score_thresh=0.0)),
}


# ---------------------------------------------------------------------------------------------
# Export

def np_dtype_name(a):
    return {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64",
            np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool"}.get(a.dtype, str(a.dtype))


def flat_outputs(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out]


def safe(name):
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)


def conditioning(model, args, ref):
    """max |float32 torch - float64 torch| / range per output, the worst: how far two correct
    float32 implementations may differ. None when the model does not run in float64."""
    try:
        m64 = __import__("copy").deepcopy(model).double()
        a64 = tuple(a.double() if a.is_floating_point() else a for a in args)
        with torch.no_grad():
            out64 = flat_outputs(m64(*a64))
        worst = 0.0
        for r, o in zip(ref, out64):
            r, o = r.detach().numpy(), o.detach().numpy()
            if r.dtype.kind != "f" or r.size == 0 or r.shape != o.shape:
                continue
            span = float(o.max() - o.min()) or 1.0
            worst = max(worst, float(np.abs(r.astype(np.float64) - o).max()) / span)
        return worst
    except Exception:  # noqa: BLE001 - a model without a float64 path is fine
        return None


def build(builder, **kw):
    """builder(**kw) with the zoo's seed and randomize(): (model, inputs, input names, output
    names, dynamic axes)."""
    torch.manual_seed(SEED)
    model, args, in_names, out_names, axes = builder(**kw)
    randomize(model, SEED)
    return model, args, in_names, out_names, axes


def export(model, args, path, in_names, out_names, axes, opset):
    """torch.onnx.export with its defaults (eval mode: BatchNorm folded, constant folding)."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Not under torch.no_grad(): without autograd nn.MultiheadAttention (ViT) takes its fused
        # fast path, which has no ONNX export.
        torch.onnx.export(model, args, path, opset_version=opset, input_names=in_names,
                          output_names=out_names, dynamic_axes=axes, do_constant_folding=True)


def export_model(name, builder, opset, out_dir, family="", check64=True, log=print):
    """Build, randomize, export NAME to OUT_DIR/NAME.onnx with its input and output files.
    Returns its manifest entry. Raises on failure."""
    t0 = time.time()
    model, args, in_names, out_names, axes = build(builder)
    path = os.path.join(out_dir, name + ".onnx")
    export(model, args, path, in_names, out_names, axes, opset)
    with torch.no_grad():
        ref = flat_outputs(model(*args))
    if len(ref) != len(out_names):
        raise RuntimeError(f"{name}: {len(ref)} outputs, {len(out_names)} names")
    import onnx
    onnx.checker.check_model(path)
    proto = onnx.load(path, load_external_data=False)
    graph_in = [i.name for i in proto.graph.input
                if i.name not in {t.name for t in proto.graph.initializer}]
    if graph_in != in_names:
        raise RuntimeError(f"{name}: graph inputs {graph_in}, expected {in_names}")
    data = os.path.join(out_dir, name)
    os.makedirs(data, exist_ok=True)
    entry = {"name": name, "family": family, "file": name + ".onnx", "opset": opset,
             "dynamic_axes": axes, "inputs": [], "outputs": [], "ops": {}}
    for n, a in zip(in_names, args):
        arr = np.ascontiguousarray(a.detach().numpy())
        f = os.path.join(name, f"in_{safe(n)}.npy")
        np.save(os.path.join(out_dir, f), arr, allow_pickle=False)
        entry["inputs"].append({"name": n, "shape": list(arr.shape), "dtype": np_dtype_name(arr), "file": f})
    for n, r in zip(out_names, ref):
        arr = np.ascontiguousarray(r.detach().numpy())
        f = os.path.join(name, f"out_{safe(n)}.npy")
        np.save(os.path.join(out_dir, f), arr, allow_pickle=False)
        entry["outputs"].append({"name": n, "shape": list(arr.shape), "dtype": np_dtype_name(arr), "file": f})
    for node in proto.graph.node:
        entry["ops"][node.op_type] = entry["ops"].get(node.op_type, 0) + 1
    entry["nodes"] = len(proto.graph.node)
    entry["mb"] = round(os.path.getsize(path) / 1e6, 2)
    if check64:
        entry["fp32_vs_fp64"] = conditioning(model, args, ref)
    entry["export_s"] = round(time.time() - t0, 1)
    log(f"  {name}: {entry['nodes']} nodes, {entry['mb']} MB, opset {opset}, "
        f"fp32 vs fp64 {entry.get('fp32_vs_fp64')}, {entry['export_s']} s")
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default="/work/zoo")
    ap.add_argument("--only", default="", help="comma-separated model names (exported again)")
    ap.add_argument("--list", action="store_true", help="print the model names and families")
    ap.add_argument("--no-fp64", action="store_true", help="skip the float64 conditioning check")
    args = ap.parse_args()
    if args.list:
        for n, (fam, opset, _) in MODELS.items():
            print(f"{n}\t{fam}\topset {opset}")
        return 0
    torch.set_num_threads(min(2, torch.get_num_threads()))
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in MODELS]
    if unknown:
        print(f"zoo_export: unknown model(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    mpath = os.path.join(args.out_dir, "manifest.json")
    manifest = {"models": [], "failed": []}
    if os.path.exists(mpath):
        manifest = json.load(open(mpath))
    have = {e["name"]: e for e in manifest["models"]}
    failed = {e["name"]: e for e in manifest.get("failed", [])}
    manifest["torch"] = torch.__version__
    import torchvision
    manifest["torchvision"] = torchvision.__version__
    for name, (family, opset, builder) in MODELS.items():
        if only and name not in only:
            continue
        old = have.get(name)
        if not only and old and all(os.path.exists(os.path.join(args.out_dir, x["file"]))
                                    for x in old["inputs"] + old["outputs"]) \
                and os.path.exists(os.path.join(args.out_dir, old["file"])):
            continue
        print(f"exporting {name}", flush=True)
        try:
            entry = export_model(name, builder, opset, args.out_dir, family, not args.no_fp64)
            have[name] = entry
            failed.pop(name, None)
        except Exception as e:  # noqa: BLE001 - any failure is reported, the zoo goes on
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"  {name}: export failed: {reason}", flush=True)
            traceback.print_exc(limit=3)
            have.pop(name, None)
            failed[name] = {"name": name, "family": family, "reason": reason}
        manifest["models"] = [have[n] for n in MODELS if n in have]
        manifest["failed"] = [failed[n] for n in MODELS if n in failed]
        with open(mpath, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.write("\n")
    print(f"{len(manifest['models'])} models in {mpath}, {len(manifest['failed'])} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
