#!/usr/bin/env bash
# Install what autofusion needs on Debian 12 (build, tests, benchmarks). Idempotent and quick
# when everything is already there.
set -euo pipefail
pkgs=(cmake gcc clang-14 make
      libcpuinfo-dev libfp16-dev libsleef-dev libjansson-dev libxxhash-dev
      libcmocka-dev libonnx-testdata python3-onnx python3-numpy python3-pytest
      python3-torch python3-torchvision libfuzzer-14-dev libclang-rt-14-dev libopenblas-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
