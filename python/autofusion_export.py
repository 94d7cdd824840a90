"""Export PyTorch models to ONNX the way autofusion's tests and benchmarks need them.

Invariant: every file written by export_onnx() is deterministic for a given seed, passes
onnx.checker, and keeps each BatchNormalization as its own node. torch 1.13 folds BatchNorm into
the preceding Conv whenever it exports in EVAL mode (with or without constant folding), which would
hide the Conv+BN+ReLU patterns autofusion exists to fuse; exporting with TrainingMode.PRESERVE from
a module already in eval mode traces the same inference graph without that fold.

Randomly initialised torchvision models have BatchNorm and LayerNorm at identity (weight 1,
bias 0, mean 0, var 1) and zero biases. That hides normalisation and bias bugs, and torch
deduplicates the equal initializers into Identity nodes that no trained model has; randomize_init()
gives each of them its own values.
"""

import json
import os
import warnings

import numpy as np
import onnx
import torch

DEFAULT_OPSET = 13


def randomize_init(model, seed=0, calibration=None):
    """Replace the identity-like parts of a fresh model's initialisation with random values.

    LayerNorm/GroupNorm/BatchNorm get random affine parameters (scales in [0.5, 1.5], shifts
    about 0.1), every other parameter named "bias" (Conv, Linear, attention in_proj_bias) small
    random values, and any other all-zero parameter (ViT's classifier weight and class token)
    small random values, since a zero weight would make the output independent of everything
    before it.

    BatchNorm running statistics: without `calibration` they are random (mean about 0.1, var in
    [0.5, 1.5]), which suits shallow models; deep residual stacks then grow without bound
    (ResNet-101's logits reach ~1e7, past float16's range). With `calibration` (a tuple of
    example inputs, batch >= 2) calibrate_batchnorm() measures them instead. Returns the model
    in eval mode.
    """
    gen = torch.Generator().manual_seed(seed)
    norm_types = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, norm_types):
                if mod.weight is not None:
                    mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) + 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=gen) * 0.1)
                if getattr(mod, "running_mean", None) is not None:
                    c = mod.running_mean.shape
                    mod.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                    mod.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                continue
            for name, p in mod.named_parameters(recurse=False):
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
                elif not p.any():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    if calibration is not None:
        calibrate_batchnorm(model, calibration, seed)
    return model.eval()


def calibrate_batchnorm(model, inputs, seed=0):
    """Give every BatchNorm running statistics measured on `inputs`, made slightly contractive.

    One pass with only the BN modules in training mode (so dropout and stochastic depth stay off)
    measures each channel's mean and variance. Used exactly, they make a random deep network
    chaotic: it normalises every layer to unit scale, and float32 rounding differences then grow
    to ~1e-4 of the output. So each variance is raised to at least a quarter of its layer's
    median (near-constant channels would otherwise amplify rounding noise by up to
    1/sqrt(eps) ~ 300) and multiplied by a random factor in [1, 2]: every BN output then has
    variance in about [0.5, 1], activations stay O(1) through ResNet-101, and two float32
    implementations agree to ~1e-6 of the output's magnitude (measured against float64 torch).
    """
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [bn.momentum for bn in bns]
    model.eval()
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: after one batch, exactly that batch's stats
        bn.train()
    with torch.no_grad():
        model(*inputs)
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for bn, momentum in zip(bns, saved):
            bn.momentum = momentum
            var = bn.running_var
            var.clamp_(min=float(var.median()) * 0.25)
            var.mul_(torch.rand(var.shape, generator=gen) + 1.0)
    return model


def count_batchnorm_modules(model):
    return sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def export_onnx(model, args, path, input_names, output_names, opset=DEFAULT_OPSET,
                dynamic_axes=None):
    """Export `model` (put in eval mode here) to `path` and check the result.

    `args` is a tuple of example inputs. Raises RuntimeError when the file fails onnx.checker or
    when any BatchNorm module of the model did not survive as a BatchNormalization node.
    Returns the loaded onnx.ModelProto.
    """
    model.eval()
    with warnings.catch_warnings():
        # torch's exporter warns about PRESERVE mode and about constant folding; both are expected.
        warnings.simplefilter("ignore")
        # Not under torch.no_grad(): without autograd nn.MultiheadAttention (ViT) takes its fused
        # fast path, aten::_native_multi_head_attention, which has no ONNX export.
        torch.onnx.export(model, args, path, opset_version=opset,
                          input_names=list(input_names), output_names=list(output_names),
                          dynamic_axes=dynamic_axes,
                          training=torch.onnx.TrainingMode.PRESERVE,
                          do_constant_folding=True)
    # Large models go through the path form so the checker needs no 2 GB in-memory proto.
    onnx.checker.check_model(path)
    proto = onnx.load(path)
    want_bn = count_batchnorm_modules(model)
    have_bn = sum(n.op_type == "BatchNormalization" for n in proto.graph.node)
    if have_bn != want_bn:
        raise RuntimeError(f"{path}: {want_bn} BatchNorm modules but {have_bn} "
                           "BatchNormalization nodes (BN was folded or dropped)")
    return proto


def op_types(proto_or_path):
    """The sorted set of op_types used by a model's main graph and any subgraphs."""
    proto = onnx.load(proto_or_path) if isinstance(proto_or_path, str) else proto_or_path
    found = set()

    def walk(graph):
        for node in graph.node:
            found.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(proto.graph)
    return sorted(found)


def op_histogram(proto):
    """op_type -> number of nodes in the main graph."""
    hist = {}
    for node in proto.graph.node:
        hist[node.op_type] = hist.get(node.op_type, 0) + 1
    return dict(sorted(hist.items()))


def graph_io(proto):
    """Describe a model's graph inputs and outputs: name, ONNX dtype name and shape.

    Symbolic dimensions appear as their parameter name (a string), unknown ones as None.
    Initializers listed as inputs (old exporters did that) are left out.
    """
    inits = {t.name for t in proto.graph.initializer}

    def describe(vi):
        tt = vi.type.tensor_type
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return {"name": vi.name,
                "dtype": onnx.TensorProto.DataType.Name(tt.elem_type).lower(),
                "shape": dims}

    return {"inputs": [describe(v) for v in proto.graph.input if v.name not in inits],
            "outputs": [describe(v) for v in proto.graph.output]}


def write_io_json(proto, json_path, extra=None):
    """Write graph_io(proto) (plus `extra` keys) as JSON next to a model."""
    info = graph_io(proto)
    if extra:
        info.update(extra)
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    return info


def save_npy(path, array):
    """Save an array as .npy in C order (what the CLI reads), returning it unchanged."""
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    return array


def file_mb(path):
    return os.path.getsize(path) / 1e6
