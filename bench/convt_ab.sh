#!/bin/bash
# ConvTranspose decoders: main's binary (before), this tree's (after) and ONNX Runtime, in turn,
# 3 rounds; prints "model threads round before MS after MS ort MS" (medians of each run).
# BEFORE=path/to/old/autofusion ZOO=dir of the exported decoders (bench/zoo_export.py --only ...)
cd "$(dirname "$0")/.." || exit 1
BEFORE=${BEFORE:-/work/main/build/autofusion}
ZOO=${ZOO:-/tmp/h13zoo}
ORT_NODE_DIR=${ORT_NODE_DIR:-/work/main/node_modules/onnxruntime-node}
export ORT_NODE_DIR
median() { /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['fused']['median_ms'])"; }
for m in unet hifigan_vocoder decoder3d; do for t in 1 2; do
  for r in 1 2 3; do
    b=$($BEFORE bench "$ZOO/$m.onnx" --threads=$t --iterations=3 --warmup=1 --json 2>/dev/null | median)
    a=$(build/autofusion bench "$ZOO/$m.onnx" --threads=$t --json 2>/dev/null | median)
    o=$(node bench/ort_bench.js "$ZOO/$m.onnx" --threads=$t 2>/dev/null |
        /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['median_ms'])")
    echo "$m $t $r before $b after $a ort $o"
  done
done; done
