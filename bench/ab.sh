#!/usr/bin/env bash
# A/B of two checkouts in one process per model (bench/ab_bench.c): builds each checkout's
# library as a shared object (position-independent, -Bsymbolic), then runs every model at the
# given thread counts, A and B alternating run by run.
#   bench/ab.sh A_CHECKOUT B_CHECKOUT MODELS_DIR [THREADS="1 2"] [ITERATIONS=20] [ROUNDS=3]
# A checkout is any tree of this project (a git worktree of the previous main, say).
set -euo pipefail
a=$(realpath "$1"); b=$(realpath "$2"); dir=$(realpath "$3")
threads=${4:-"1 2"}; iters=${5:-20}; rounds=${6:-3}
out=${AF_AB_DIR:-/tmp/af-ab}
mkdir -p "$out"
for side in a b; do
  src=$([ $side = a ] && echo "$a" || echo "$b")
  cmake -S "$src" -B "$out/build-$side" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null
  cmake --build "$out/build-$side" -j"$(nproc)" --target afcore >/dev/null
  gcc -shared -o "$out/lib$side.so" -Wl,-Bsymbolic -Wl,--whole-archive \
      "$out/build-$side/libafcore.a" -Wl,--no-whole-archive \
      -lm -lpthread -lxxhash -ljansson -lcpuinfo -ldl \
      $(ldconfig -p | grep libpthreadpool.so >/dev/null && echo -lpthreadpool) # older checkouts
done
here=$(cd "$(dirname "$0")/.." && pwd)
gcc -O2 -std=c11 -D_GNU_SOURCE -I"$here/include" -o "$out/ab_bench" "$here/bench/ab_bench.c" -ldl
for r in $(seq "$rounds"); do
  for m in "$dir"/*.onnx; do
    for t in $threads; do
      "$out/ab_bench" "$out/liba.so" "$out/libb.so" "$m" --threads="$t" --iterations="$iters"
    done
  done
done
