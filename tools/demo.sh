#!/usr/bin/env bash
# The main job on the embedded default: install dependencies, build, generate the seed's TestModel
# (three Conv+BN+ReLU blocks, pooling, Linear) with Debian's PyTorch, compile it (printing the
# fusion report), run the compiled model (printing its outputs) and compare fused with unfused
# latency in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
mkdir -p build/demo
[ -f build/demo/test_model.onnx ] || /usr/bin/python3 tools/make_testmodel.py build/demo/test_model.onnx
build/autofusion compile --model=build/demo/test_model.onnx --output=build/demo/test_model_fused --log=info
build/autofusion run build/demo/test_model_fused.afm --output_dir build/demo/out
build/autofusion bench build/demo/test_model.onnx --compare --iterations=3 --warmup=1
