#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds the release tree (build/), the ASan+UBSan
# tree (build-asan/), the ThreadSanitizer tree (build-tsan/, test_plan only) and the libFuzzer
# tree (build-fuzz/, clang), then runs every test through one
# ctest invocation in build/ (tests that need the other trees find them there).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DAF_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAF_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAF_TSAN=ON >/dev/null
cmake --build build-tsan -j"$jobs" --target test_plan
CC=clang-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DAF_FUZZ=ON -DAF_WERROR=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_import fuzz_compile
ctest --test-dir build --output-on-failure -j"$jobs"
