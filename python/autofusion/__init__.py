"""autofusion: an operator-fusion compiler and runtime for ONNX models on CPUs.

ONNX Runtime's inference API, so that `import autofusion as ort` is the only change a typical
onnxruntime script needs:

    import autofusion as ort
    sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})

and autofusion's own tools: compile, report, verify, fusion_rules, load_plugin. docs/python.md
has the whole surface and what maps to what.
"""

from . import errors
from ._capi import lib as _lib
from .errors import (AutofusionError, EngineError, EPFail, Fail, InvalidArgument,
                     InvalidGraph, InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile,
                     NotImplemented, RuntimeException)
from .session import (ExecutionMode, GraphOptimizationLevel, InferenceSession, IOBinding,
                      ModelMetadata, NodeArg, OrtValue, RunOptions, SessionOptions,
                      get_all_providers, get_available_providers, get_device)
from .tools import compile, fusion_rules, load_plugin, report, verify

__version__ = _lib.af_version().decode()

__all__ = [
    "AutofusionError", "EngineError", "EPFail", "Fail", "InvalidArgument", "InvalidGraph",
    "InvalidProtobuf", "ModelLoaded", "NoModel", "NoSuchFile", "NotImplemented",
    "RuntimeException", "ExecutionMode", "GraphOptimizationLevel", "InferenceSession",
    "IOBinding", "ModelMetadata", "NodeArg", "OrtValue", "RunOptions", "SessionOptions",
    "get_all_providers", "get_available_providers", "get_device", "compile", "fusion_rules",
    "load_plugin", "report", "verify", "errors", "__version__",
]
