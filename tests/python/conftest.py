"""pytest setup for the Python package's tests: the package under test comes from PYTHONPATH
(ctest sets <build>/python); the models are made here, small and on disk.

Invariant: every model is built from a fixed seed, so reruns compare the same numbers.
"""

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
from ort_node import ort_available, ort_outputs  # noqa: E402,F401 (the tests import them from here)


def mlp_weights():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((8, 16), (16,), (16, 4), (4,))]


def mlp_reference(x):
    w1, b1, w2, b2 = mlp_weights()
    h = np.maximum(x @ w1 + b1, 0)
    return h @ w2 + b2, h


def make_mlp(path):
    """x [batch, 8] -> h = Relu(x W1 + b1) [batch, 16], y = h W2 + b2 [batch, 4]; with every
    kind of metadata ONNX Runtime's get_modelmeta() shows."""
    w1, b1, w2, b2 = mlp_weights()
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                           helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="autofusion-tests",
                          producer_version="1.2", domain="test.autofusion", model_version=7,
                          doc_string="a tiny MLP")
    m.ir_version = 8
    helper.set_model_props(m, {"author": "tests", "license": "MIT"})
    onnx.save(m, path)


def make_embedding(path):
    """ids [batch, seq] int64 -> Gather of a [10, 4] table -> e [batch, seq, 4]."""
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"])], "emb",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["batch", "seq", 4])],
                          [numpy_helper.from_array(table, "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


def make_cnn(path):
    """A small torch CNN (Conv+BN+ReLU twice, pooling, Linear) exported with a dynamic batch."""
    import torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    net.eval()
    torch.onnx.export(net, torch.zeros(1, 3, 16, 16), path, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=13)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = {"mlp": str(d / "mlp.onnx"), "emb": str(d / "emb.onnx"), "cnn": str(d / "cnn.onnx")}
    make_mlp(paths["mlp"])
    make_embedding(paths["emb"])
    make_cnn(paths["cnn"])
    return paths
