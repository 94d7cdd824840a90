#!/usr/bin/env bash
# Latency of a dynamic export against its static export at the static shape, alternating runs:
#   bench/dynamic_vs_static.sh STATIC.onnx DYNAMIC.onnx [ROUNDS=5] [THREADS=1] [ITERATIONS=20]
# Each round runs `autofusion bench` on the static file, then on the dynamic one, both on the same
# inputs of the static file's shape (written as .npy: floats in [-1, 1), integers in [1, 100),
# which suits token ids and masks), and prints both medians and their ratio; the last line is
# the median of the per-round ratios.
set -euo pipefail
static=$1; dynamic=$2; rounds=${3:-5}; threads=${4:-1}; iters=${5:-20}
bin=${AF_BIN:-$(dirname "$0")/../build/autofusion}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
inputs=$(/usr/bin/python3 - "$static" "$dir" <<'PY'
import sys, numpy as np, onnx
from onnx import mapping
m = onnx.load(sys.argv[1], load_external_data=False)
init = {t.name for t in m.graph.initializer}
rng = np.random.default_rng(0)
for i in m.graph.input:
    if i.name in init:
        continue
    shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
    dt = mapping.TENSOR_TYPE_TO_NP_TYPE[i.type.tensor_type.elem_type]
    x = (rng.uniform(-1, 1, shape) if np.issubdtype(dt, np.floating)
         else rng.integers(1, 100, shape)).astype(dt)
    path = f"{sys.argv[2]}/{len(shape)}_{i.name.replace('/', '_')}.npy"
    np.save(path, x)
    print(f"--input={i.name}={path}", end=" ")
PY
)
median() { "$bin" bench "$1" --threads="$threads" --iterations="$iters" "${@:2}" 2>&1 |
           sed -n 's/.*median \([0-9.]*\).*/\1/p' | head -1; }
ratios=()
for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  s=$(median "$static" $inputs); d=$(median "$dynamic" $inputs)
  ratio=$(/usr/bin/python3 -c "print(f'{$d/$s:.4f}')")
  ratios+=("$ratio")
  echo "round $r  static ${s} ms  dynamic ${d} ms  dynamic/static ${ratio}"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print "median dynamic/static", a[int((NR+1)/2)]}'
