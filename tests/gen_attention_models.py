#!/usr/bin/python3
"""Models for tests/test_attention.c (MultiHeadAttentionFusionOp and the FusedAttention kernel).

    /usr/bin/python3 tests/gen_attention_models.py OUT_DIR

Writes OUT_DIR/NAME.onnx and, for each graph input i that needs a value, OUT_DIR/NAME.in<i>.npy:
  - attention blocks built node by node (onnx.helper), in the forms the rule must fuse: BERT's
    4-D heads with a [B,1,1,S] mask, scale by Mul or Div on either side of an Add written either
    way round, reshape shapes with 0 / -1; torchvision MultiheadAttention's 3-D heads merged with
    the batch, read from a packed [S, B, 3E] QKV through constant Slices, q scaled before QK^T,
    output [S*B, E]; cross attention with more keys than one kernel block;
  - near misses the rule must refuse: scores with a second reader, scores as a graph output, a
    reshape shape that is an overridable input, a wrong perm, a mask that grows the scores, a mask
    added before the scale, float64, a Where before the scale, a Where whose fill is an input,
    a Where condition that grows the scores;
  - GPT-2 with past key/values (k, v Concat'ed after the past: Sk != Sq, read head-major) and a
    causal Where (a finite and a -inf fill; with a T5-style gathered bias; more keys than one
    kernel block); T5's unscaled attention with a gathered relative position bias; Swin's
    window attention, q, k, v Gathered from one packed [3, B, H, N, D] tensor, with its
    relative position bias, and two near misses (heads split outside q/k/v; the packed tensor
    a graph output);
  - the 2-layer BERT of bench/bert.py and a 2-layer torchvision ViT, as torch exports them.

Invariant: deterministic (fixed seeds); every file passes onnx.checker.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, mapping, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")
OPSET = 13


class Block:
    """One attention block under construction: nodes, initializers, inputs and outputs."""

    def __init__(self, dtype=np.float32):
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.feeds = {}
        self.dtype = dtype
        self.n = 0

    def name(self, hint):
        self.n += 1
        return f"{hint}_{self.n}"

    def const(self, array, hint="c"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, inputs, **attrs):
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out

    def input(self, name, value):
        value = np.asarray(value)
        elem = mapping.NP_TYPE_TO_TENSOR_TYPE[value.dtype]
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
        self.feeds[name] = value
        return name

    def output(self, name, dtype=None):
        elem = mapping.NP_TYPE_TO_TENSOR_TYPE[np.dtype(dtype or self.dtype)]
        self.outputs.append(helper.make_tensor_value_info(name, elem, None))  # typed in save()

    def save(self, out_dir, model_name):
        graph = helper.make_graph(self.nodes, model_name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        # Outputs get their shapes from ONNX's own inference.
        model = onnx.shape_inference.infer_shapes(model)
        del model.graph.value_info[:]
        onnx.checker.check_model(model)
        onnx.save(model, os.path.join(out_dir, model_name + ".onnx"))
        for i, vi in enumerate(self.inputs):
            if vi.name in self.feeds:
                np.save(os.path.join(out_dir, f"{model_name}.in{i}.npy"), self.feeds[vi.name])


def rnd(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def bert_block(out_dir, model_name, *, scale="div", swap=False, zero_shape=False,
               k_perm=(0, 2, 3, 1), scores_out=False, scores_reader=False, shape_input=False,
               mask_shape=None, mask_first=False, B=2, S=5, H=2, D=4, dtype=np.float32):
    """x -> q/k/v Linear -> Reshape [B,S,H,D] -> Transpose -> QK^T -> scale -> + mask -> Softmax
    -> x V -> Transpose -> Reshape [B,S,E], as BERT exports it (with knobs for the variants)."""
    rng = np.random.default_rng(len(model_name))
    E = H * D
    b = Block(dtype)
    x = b.input("x", rnd(rng, (B, S, E), dtype))
    mask_shape = mask_shape or (B, 1, 1, S)
    mval = np.zeros(mask_shape, dtype)
    mval.reshape(-1)[:: 3] = -10000.0  # some positions masked
    mask = b.input("mask", mval)
    head_shape = [0, 0, H, D] if zero_shape else [B, S, H, D]
    if shape_input:
        # An initializer that is also a graph input: a default the caller may override.
        b.inits.append(numpy_helper.from_array(np.array(head_shape, np.int64), "head_shape"))
        b.inputs.append(helper.make_tensor_value_info("head_shape", TensorProto.INT64, [4]))
        shape_q = "head_shape"
    else:
        shape_q = b.const(np.array(head_shape, np.int64), "shape")
    heads = {}
    for role in "qkv":
        w = b.const(rnd(rng, (E, E), dtype) * 0.3, "W" + role)
        bias = b.const(rnd(rng, (E,), dtype) * 0.1, "b" + role)
        y = b.op("Add", [bias, b.op("MatMul", [x, w])])
        shape = shape_q if role == "q" else b.const(np.array(head_shape, np.int64), "shape")
        r = b.op("Reshape", [y, shape])
        heads[role] = b.op("Transpose", [r], perm=list(k_perm if role == "k" else (0, 2, 1, 3)))
    s = b.op("MatMul", [heads["q"], heads["k"]])
    if mask_first:
        s = b.op("Add", [s, mask])
    if scale == "div":
        s = b.op("Div", [s, b.const(np.array(np.sqrt(D), dtype), "sqrt_d")])
    else:
        c = b.const(np.array(1.0 / np.sqrt(D), dtype), "inv_sqrt_d")
        s = b.op("Mul", [c, s] if swap else [s, c])
    scores = s
    if not mask_first:
        s = b.op("Add", [mask, s] if swap else [s, mask])
    p = b.op("Softmax", [s], axis=-1)
    o = b.op("MatMul", [p, heads["v"]])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    out_shape = [0, 0, -1] if zero_shape else [B, S, E]
    y = b.op("Reshape", [o, b.const(np.array(out_shape, np.int64), "shape")])
    b.output(y)
    if scores_out:
        b.output(scores)
    if scores_reader:
        b.output(b.op("ReduceMax", [scores], axes=[-1]))
    b.save(out_dir, model_name)


def vit_block(out_dir, model_name, *, S=7, B=2, H=2, D=4, mask=False):
    """torch.nn.MultiheadAttention as torchvision's ViT exports it: packed qkv [S, B, 3E] ->
    Slice x3 -> Reshape [S, B*H, D] -> Transpose (1,0,2) / (1,2,0) -> q / sqrt(D) -> QK^T ->
    [+ mask [B*H, 1, S]] -> Softmax -> x V -> Transpose (1,0,2) -> Reshape [S*B, E]."""
    rng = np.random.default_rng(len(model_name))
    E = H * D
    b = Block()
    qkv = b.input("qkv", rnd(rng, (S, B, 3 * E)))
    last = b.const(np.array([-1], np.int64), "axes")
    heads = {}
    for i, role in enumerate("qkv"):
        sl = b.op("Slice", [qkv, b.const(np.array([i * E], np.int64), "start"),
                            b.const(np.array([(i + 1) * E], np.int64), "end"), last])
        r = b.op("Reshape", [sl, b.const(np.array([S, B * H, D], np.int64), "shape")])
        heads[role] = b.op("Transpose", [r], perm=[1, 2, 0] if role == "k" else [1, 0, 2])
    q = b.op("Div", [heads["q"], b.const(np.array(np.sqrt(D), np.float32), "sqrt_d")])
    s = b.op("MatMul", [q, heads["k"]])
    if mask:
        mval = np.zeros((B * H, 1, S), np.float32)
        mval[1, 0, 2:4] = -np.inf
        mval[2, 0, 0] = -5.0
        s = b.op("Add", [s, b.input("mask", mval)])
    p = b.op("Softmax", [s], axis=-1)
    o = b.op("Transpose", [b.op("MatMul", [p, heads["v"]])], perm=[1, 0, 2])
    b.output(b.op("Reshape", [o, b.const(np.array([S * B, E], np.int64), "shape")]))
    b.save(out_dir, model_name)


def cross_block(out_dir, model_name, *, B=2, Sq=3, Sk=70, H=3, D=5):
    """Cross attention, more keys than one kernel block; k scaled after its transpose."""
    rng = np.random.default_rng(len(model_name))
    E = H * D
    b = Block()
    q = b.input("q", rnd(rng, (B, Sq, E)))
    kv = b.input("kv", rnd(rng, (B, Sk, E)))
    heads = {}
    for role, src, seq in (("q", q, Sq), ("k", kv, Sk), ("v", kv, Sk)):
        r = b.op("Reshape", [src, b.const(np.array([B, seq, H, D], np.int64), "shape")])
        heads[role] = b.op("Transpose", [r], perm=[0, 2, 3, 1] if role == "k" else [0, 2, 1, 3])
    k = b.op("Mul", [heads["k"], b.const(np.array(0.5, np.float32), "half")])
    s = b.op("MatMul", [heads["q"], k])
    s = b.op("Div", [s, b.const(np.array(0.9, np.float32), "c")])
    o = b.op("MatMul", [b.op("Softmax", [s], axis=-1), heads["v"]])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    b.output(b.op("Reshape", [o, b.const(np.array([B * Sq, E], np.int64), "shape")]))
    b.save(out_dir, model_name)


def gpt2_block(out_dir, model_name, *, B=2, S=5, P=3, H=2, D=4, fill=None, where_first=False,
               fill_input=False, keep_shape=None, bias=False, scale=True):
    """GPT-2 with past key/values, as bench/zoo_export.py writes it: q/k/v Linear -> Reshape
    [B,S,H,D] -> Transpose; k and v Concat'ed after past_k/past_v [B,H,P,D] (the Concats are
    graph outputs, "present") -> QK^T / sqrt(D) -> [+ bias [1,H,S,P+S] gathered from a table, as
    T5's relative position bias] -> Where(causal [1,1,S,P+S] bool, scores, fill) -> Softmax -> x V
    -> Transpose -> Reshape [B,S,E]. Sq = S, Sk = P + S."""
    rng = np.random.default_rng(len(model_name))
    E, K = H * D, P + S
    b = Block()
    x = b.input("x", rnd(rng, (B, S, E)))
    past = {r: b.input("past_" + r, rnd(rng, (B, H, P, D))) for r in "kv"}
    heads = {}
    for role in "qkv":
        w = b.const(rnd(rng, (E, E)) * 0.3, "W" + role)
        y = b.op("Add", [b.const(rnd(rng, (E,)) * 0.1, "b" + role), b.op("MatMul", [x, w])])
        r = b.op("Reshape", [y, b.const(np.array([B, S, H, D], np.int64), "shape")])
        heads[role] = b.op("Transpose", [r], perm=[0, 2, 1, 3])
        if role != "q":
            heads[role] = b.op("Concat", [past[role], heads[role]], axis=2)
            b.output(heads[role])
    s = b.op("MatMul", [heads["q"], b.op("Transpose", [heads["k"]], perm=[0, 1, 3, 2])])
    keep = np.tril(np.ones((S, K), bool), k=P)  # key j visible to query i when j <= i + P
    keep = np.broadcast_to(keep, keep_shape or (1, 1, S, K)).copy()
    cond = b.const(keep, "causal")
    fval = np.array(np.finfo(np.float32).min if fill is None else fill, np.float32)
    fill_name = b.input("fill", fval) if fill_input else b.const(fval, "fill")
    if where_first:
        s = b.op("Where", [cond, s, fill_name])
    if scale:
        s = b.op("Div", [s, b.const(np.array(np.sqrt(D), np.float32), "sqrt_d")])
    if bias:
        table = b.const(rnd(rng, (8, H)), "rel_bias")
        buckets = b.const(rng.integers(0, 8, (S, K)).astype(np.int64), "buckets")
        g = b.op("Transpose", [b.op("Gather", [table, buckets])], perm=[2, 0, 1])
        s = b.op("Add", [s, b.op("Unsqueeze", [g, b.const(np.array([0], np.int64), "axes")])])
    if not where_first:
        s = b.op("Where", [cond, s, fill_name])
    o = b.op("MatMul", [b.op("Softmax", [s], axis=-1), heads["v"]])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    b.output(b.op("Reshape", [o, b.const(np.array([-1, S, E], np.int64), "shape")]))
    b.save(out_dir, model_name)


def t5_block(out_dir, model_name, *, B=2, S=6, H=3, D=4):
    """T5's self-attention: no 1/sqrt(d) scale, relative position bias [1,H,S,S] (a Gather of an
    embedding table by bucket ids that are a graph input, so that it stays an operand)."""
    rng = np.random.default_rng(len(model_name))
    E = H * D
    b = Block()
    x = b.input("x", rnd(rng, (B, S, E)))
    buckets = b.input("buckets", rng.integers(0, 16, (S, S)).astype(np.int64))
    heads = {}
    for role in "qkv":
        y = b.op("MatMul", [x, b.const(rnd(rng, (E, E)) * 0.3, "W" + role)])
        r = b.op("Reshape", [y, b.const(np.array([B, -1, H, D], np.int64), "shape")])
        heads[role] = b.op("Transpose", [r], perm=[0, 2, 1, 3])
    s = b.op("MatMul", [heads["q"], b.op("Transpose", [heads["k"]], perm=[0, 1, 3, 2])])
    g = b.op("Transpose", [b.op("Gather", [b.const(rnd(rng, (16, H)), "rel_bias"), buckets])],
             perm=[2, 0, 1])
    s = b.op("Add", [s, b.op("Unsqueeze", [g, b.const(np.array([0], np.int64), "axes")])])
    o = b.op("MatMul", [b.op("Softmax", [s], axis=-1), heads["v"]])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    b.output(b.op("Reshape", [o, b.const(np.array([B, -1, E], np.int64), "shape")]))
    b.save(out_dir, model_name)


def swin_block(out_dir, model_name, *, B=3, N=6, H=2, D=4, which_inner=False, packed_out=False):
    """torchvision's Swin window attention: qkv Linear [B, N, 3E] -> Reshape [B, N, 3, H, D] ->
    Transpose (2, 0, 3, 1, 4) -> Gather 0, 1, 2 (q, k, v) -> q * D^-0.5 -> QK^T + relative
    position bias [1, H, N, N] (a constant) -> Softmax -> x V -> Transpose -> Reshape [B, N, E].
    which_inner splits [H, 3, D] instead (the heads outside q/k/v: not columns of one input);
    packed_out makes the [3, B, H, N, D] tensor a graph output too."""
    rng = np.random.default_rng(len(model_name))
    E = H * D
    b = Block()
    x = b.input("x", rnd(rng, (B, N, E)))
    y = b.op("Add", [b.op("MatMul", [x, b.const(rnd(rng, (E, 3 * E)) * 0.3, "Wqkv")]),
                     b.const(rnd(rng, (3 * E,)) * 0.1, "bqkv")])
    split = [B, N, H, 3, D] if which_inner else [B, N, 3, H, D]
    r = b.op("Reshape", [y, b.const(np.array(split, np.int64), "shape")])
    packed = b.op("Transpose", [r], perm=[3, 0, 2, 1, 4] if which_inner else [2, 0, 3, 1, 4])
    if packed_out:
        b.output(packed)
    q, k, v = (b.op("Gather", [packed, b.const(np.array(i, np.int64), "idx")], axis=0)
               for i in range(3))
    q = b.op("Mul", [q, b.const(np.array(D ** -0.5, np.float32), "scale")])
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    s = b.op("Add", [s, b.const(rnd(rng, (1, H, N, N)), "rel_bias")])
    o = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    b.output(b.op("Reshape", [o, b.const(np.array([B, N, E], np.int64), "shape")]))
    b.save(out_dir, model_name)


def torch_models(out_dir):
    """The 2-layer BERT of bench/bert.py and a 2-layer torchvision ViT, exported by torch."""
    import torch
    sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, "bench")]
    import autofusion_export as afx
    import bert
    from torchvision.models.vision_transformer import VisionTransformer

    torch.set_num_threads(1)
    cfg = bert.BertConfig.small(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000)
    model = bert.build_bert(cfg, 0)
    ids, mask = bert.example_inputs(cfg, batch=2, seq=16, seed=0, pad=[0, 5])
    afx.export_onnx(model, (ids, mask), os.path.join(out_dir, "bert2.onnx"),
                    ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"])
    np.save(os.path.join(out_dir, "bert2.in0.npy"), ids.numpy())
    np.save(os.path.join(out_dir, "bert2.in1.npy"), mask.numpy())

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                            hidden_dim=64, mlp_dim=128, num_classes=10)
    afx.randomize_init(vit, 0)
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    afx.export_onnx(vit, (image,), os.path.join(out_dir, "vit2.onnx"), ["input"], ["output"])
    np.save(os.path.join(out_dir, "vit2.in0.npy"), image.numpy())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    bert_block(out, "bert_block")
    bert_block(out, "bert_mul_swapped", scale="mul", swap=True, zero_shape=True,
               mask_shape=(1, 1, 5, 5))
    vit_block(out, "vit_block")
    vit_block(out, "vit_mask", mask=True)
    cross_block(out, "cross")
    bert_block(out, "nm_scores_output", scores_out=True)
    bert_block(out, "nm_scores_reader", scores_reader=True)
    bert_block(out, "nm_shape_input", shape_input=True)
    bert_block(out, "nm_perm", k_perm=(0, 2, 1, 3), S=4, D=4)
    bert_block(out, "nm_mask_grows", B=1, mask_shape=(3, 1, 1, 5), zero_shape=True)
    bert_block(out, "nm_double", dtype=np.float64)
    bert_block(out, "nm_mask_scaled", mask_first=True)
    gpt2_block(out, "gpt2_causal_past")
    gpt2_block(out, "gpt2_causal_bias", fill=-np.inf, bias=True, P=0, S=7)
    gpt2_block(out, "gpt2_long_past", B=1, S=3, P=1030, H=2, D=8)
    # a decode step: the head Transposes of [1, 1, H, D] move only dims of 1 (canonicalize makes
    # them Reshapes: Reshape -> Reshape on the way in and out)
    gpt2_block(out, "gpt2_one_token", B=1, S=1, P=9, H=2, D=4)
    t5_block(out, "t5_bias")
    gpt2_block(out, "nm_where_scaled", where_first=True)
    gpt2_block(out, "nm_where_fill", fill_input=True)
    gpt2_block(out, "nm_where_grows", B=1, keep_shape=(2, 1, 5, 8))
    swin_block(out, "swin_window")
    swin_block(out, "nm_swin_heads_outer", which_inner=True)
    swin_block(out, "nm_swin_packed_out", packed_out=True)
    torch_models(out)


if __name__ == "__main__":
    main()
