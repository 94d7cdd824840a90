"""Einsum (passes/einsum.c): two-operand equations that are batched matrix products become
Transpose / Reshape -> MatMul -> Reshape / Transpose and run on the GEMM core (the reference
Einsum took 323 ms for 'bchw,cd->bdhw' over 64 x 64 x 64, ONNX Runtime 3.6). Checked against
ONNX Runtime: equations with batch letters, several contracted letters, kept letters in any
order, a constant operand, both operands the same value, a matrix-vector and a dot product;
`inspect` then lists no node on a reference kernel. Equations the rewrite leaves to the Einsum
kernel (a letter summed in one operand, a diagonal, an implicit output, "...") still agree.
"""

import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from against_ort import ours_and_ort
from ort_node import ort_available

F = TensorProto.FLOAT
rng = np.random.default_rng(31)

# (equation, shape of A, shape of B or a constant's, B constant?)
REWRITTEN = [
    ("bchw,cd->bdhw", (2, 6, 5, 4), (6, 7), True),
    ("bhqd,bhkd->bhqk", (2, 3, 5, 8), (2, 3, 6, 8), False),
    ("bhqk,bhkd->bhqd", (2, 3, 5, 6), (2, 3, 6, 8), False),
    ("ij,jk->ik", (5, 7), (7, 3), False),
    ("ij,kj->ki", (5, 7), (3, 7), True),
    ("abc,cd->abd", (2, 3, 4), (4, 5), True),
    ("bkc,bcd->bdk", (3, 4, 5), (3, 5, 2), False),
    ("pqrs,qsr->pq", (2, 3, 4, 5), (3, 5, 4), False),
    ("ij,j->i", (6, 9), (9,), False),
    ("i,i->", (9,), (9,), False),
    ("xbi,bij->bxj", (4, 1, 3), (1, 3, 5), False),
]
LEFT = [
    ("ijk,jl->il", (3, 4, 5), (4, 2), False),  # k summed in A alone
    ("ii,ij->j", (4, 4), (4, 3), False),  # a diagonal
    ("ij,jk", (3, 4), (4, 2), False),  # implicit output
    ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5), False),
]


def build(path, cases, same=False):
    nodes, inputs, outputs, inits = [], [], [], []
    for k, (eq, sa, sb, const) in enumerate(cases):
        inputs.append(helper.make_tensor_value_info(f"a{k}", F, list(sa)))
        if const:
            inits.append(numpy_helper.from_array(rng.standard_normal(sb).astype(np.float32), f"b{k}"))
        else:
            inputs.append(helper.make_tensor_value_info(f"b{k}", F, list(sb)))
        nodes.append(helper.make_node("Einsum", [f"a{k}", f"b{k}"], [f"y{k}"], equation=eq))
        outputs.append(helper.make_tensor_value_info(f"y{k}", F, None))
    g = helper.make_graph(nodes, "einsum", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    feeds = {}
    for i in inputs:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return path, feeds


def compare(af_bin, tmp_path, cases):
    path, feeds = build(str(tmp_path / "m.onnx"), cases)
    got, want = ours_and_ort(af_bin, path, feeds, tmp_path)
    for k, (eq, *_rest) in enumerate(cases):
        w, g = want[f"y{k}"], got[f"y{k}"]
        assert g.shape == w.shape, (eq, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=eq)
    return path


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_rewritten(af_bin, tmp_path):
    path = compare(af_bin, tmp_path, REWRITTEN)
    afm = str(tmp_path / "m.afm")
    assert subprocess.run([af_bin, "compile", path, "--output", afm], capture_output=True).returncode == 0
    r = subprocess.run([af_bin, "inspect", afm], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "reference kernels: none" in r.stdout, r.stdout


@pytest.mark.skipif(not ort_available(), reason="onnxruntime-node is not installed")
def test_left_to_the_kernel(af_bin, tmp_path):
    compare(af_bin, tmp_path, LEFT)
