"""The exception classes under the module path ONNX Runtime gives them
(onnxruntime.capi.onnxruntime_pybind11_state), so that
`from autofusion.capi.onnxruntime_pybind11_state import InvalidArgument` works."""

from ..errors import (AutofusionError, EngineError, EPFail, Fail, InvalidArgument,  # noqa: F401
                      InvalidGraph, InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile,
                      NotImplemented, RuntimeException)
