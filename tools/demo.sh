#!/usr/bin/env bash
# The main job on the embedded default: install dependencies, build, generate the seed's TestModel
# (three Conv+BN+ReLU blocks, pooling, Linear) with Debian's PyTorch, and run it, printing its
# outputs. Extra arguments go to `autofusion run`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
mkdir -p build/demo
[ -f build/demo/test_model.onnx ] || /usr/bin/python3 tools/make_testmodel.py build/demo/test_model.onnx
build/autofusion run build/demo/test_model.onnx --output_dir build/demo/out "$@"
