#!/usr/bin/env bash
# Fused vs unfused, side by side in one process per model (`autofusion bench --compare`), with
# the cost model's estimate next to the measured ratio. Models: the seed's TestModel at 224 and
# small real models exported with Debian's torch (kept small: the kernels are still the
# reference ones). Prints one Markdown row per model.
#   bench/compare.sh [BUILD_DIR] [ITERATIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/autofusion
iters=${2:-10}
dir=${AF_BENCH_DIR:-build/bench}
mkdir -p "$dir"
[ -f "$dir/test_model.onnx" ] || /usr/bin/python3 tools/make_testmodel.py "$dir/test_model.onnx" >/dev/null
/usr/bin/python3 - "$dir" <<'PY'
import os, sys
sys.path[:0] = ["python", "bench"]
import torch, torchvision
import autofusion_export as afx
from bert import BertConfig, BertModel, example_inputs
out = sys.argv[1]

def export(name, model, args, inputs, outputs, calibration=None):
    path = os.path.join(out, name + ".onnx")
    if not os.path.exists(path):
        torch.manual_seed(0)
        afx.randomize_init(model, 0, calibration=calibration)
        afx.export_onnx(model, args, path, inputs, outputs)

for name in ("resnet18", "mobilenet_v3_small"):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 112, 112)
    export(name + "_112", getattr(torchvision.models, name)(weights=None), (x,), ["input"],
           ["output"], calibration=(torch.randn(2, 3, 112, 112),))
cfg = BertConfig.small(layers=2, hidden=128, heads=2, intermediate=512)
ids, mask = example_inputs(cfg, batch=1, seq=32)
export("bert_2layer_128", BertModel(cfg), (ids, mask), ["input_ids", "attention_mask"],
       ["last_hidden_state"])
PY
echo "| model | unfused median ms | fused median ms | measured speedup | estimated speedup |"
echo "|---|--:|--:|--:|--:|"
for m in test_model resnet18_112 mobilenet_v3_small_112 bert_2layer_128; do
  "$bin" bench "$dir/$m.onnx" --compare --json --iterations="$iters" --warmup=2 |
    /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); print(f\"| $m | {r['unfused']['median_ms']:.1f} | {r['fused']['median_ms']:.1f} | {r['speedup']:.2f}x | {r.get('estimated_speedup', float('nan')):.2f}x |\")"
done
