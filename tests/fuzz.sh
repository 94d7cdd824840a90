#!/usr/bin/env bash
# Run a libFuzzer target for a bounded time over a seed corpus of small real models.
#   tests/fuzz.sh FUZZER SECONDS SEED_DIR...
# Seeds: every .onnx file under the given folders that is smaller than 64 KiB. Exits non-zero
# when the fuzzer finds a crash, a leak or undefined behaviour.
set -euo pipefail
fuzzer=$(realpath "$1"); seconds=$2; shift 2
[ -x "$fuzzer" ] || { echo "fuzz: $fuzzer not built (tests/run.sh builds build-fuzz/)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
i=0
for dir in "$@"; do
  [ -d "$dir" ] || continue
  while IFS= read -r f; do
    cp "$f" "$work/corpus/seed_$i.onnx"; i=$((i + 1))
  done < <(find "$dir" -name "*.onnx" -size -64k | sort)
done
echo "fuzz: $(basename "$fuzzer") for ${seconds}s over $i seeds"
cd "$work"
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 corpus 2>&1 | tail -15
