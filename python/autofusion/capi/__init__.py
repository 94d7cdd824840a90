"""onnxruntime.capi's place, for scripts that import ONNX Runtime's exception classes from
onnxruntime.capi.onnxruntime_pybind11_state: autofusion.capi.onnxruntime_pybind11_state has
the same names."""
