"""A typical ONNX Runtime script, written against onnxruntime's API. The only line that
differs from one a user would run with ONNX Runtime is the import, which takes the module's
name from the command line: `ort_style_script.py MODULE MODEL OUT.npz`.
"""

import importlib
import sys

import numpy as np

ort = importlib.import_module(sys.argv[1])  # i.e. `import autofusion as ort`
# i.e. `from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument`
InvalidArgument = importlib.import_module(sys.argv[1] + ".capi.onnxruntime_pybind11_state").InvalidArgument
model, out = sys.argv[2], sys.argv[3]

so = ort.SessionOptions()
so.intra_op_num_threads = 2
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.log_severity_level = 3
sess = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
assert "CPUExecutionProvider" in ort.get_available_providers()
assert sess.get_providers() == ["CPUExecutionProvider"]

inp = sess.get_inputs()[0]
shape = [d if isinstance(d, int) else 3 for d in inp.shape]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
names = [o.name for o in sess.get_outputs()]
results = sess.run(names, {inp.name: x})
first = sess.run([names[0]], {inp.name: x})[0]
assert np.array_equal(first, results[0])

binding = sess.io_binding()
binding.bind_cpu_input(inp.name, x)
binding.bind_output(names[0])
sess.run_with_iobinding(binding)
bound = binding.copy_outputs_to_cpu()[0]
assert np.array_equal(bound, results[0])

try:
    sess.run(None, {"no_such_input": x})
except InvalidArgument:  # what ONNX Runtime raises here
    pass
else:
    raise AssertionError("a wrong input name did not raise")

np.savez(out, x=x, **{n: r for n, r in zip(names, results)})
print("ok")
