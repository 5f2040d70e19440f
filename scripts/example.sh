#!/usr/bin/env bash
# The main job on the shipped example (../shared/data): installs dependencies, builds, then
# calibrates stories260K on TinyStories, converts it to SmoothQuant W8A8 (.sqm), and prints the
# FP32 vs W8A8 perplexities on TinyStories-valid (windows protocol, ctx 256) and a generation.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=../shared/data
M=$DATA/stories260K/stories260K.bin
T=$DATA/stories260K/tok512.bin
VALID=$DATA/tinystories/tinystories-valid-1000.txt
OUT=${SQ_EXAMPLE_OUT:-build/example}
bash scripts/install-deps.sh
bash scripts/build.sh -DSQ_BUILD_TESTS=OFF   # the main job needs only the tools
mkdir -p "$OUT"
B=build/bin
echo "== sq-calibrate: 128 windows x 256 tokens of tinystories-train-2MiB.txt =="
$B/sq-calibrate -m $M --tokenizer $T -f $DATA/tinystories/tinystories-train-2MiB.txt --samples 128 --seq-len 256 \
  -o "$OUT/calib.h5" --force
echo "== sq-convert: SmoothQuant W8A8 (alpha 0.5, O1: per-tensor weights, per-token activations) =="
$B/sq-convert -m $M --tokenizer $T --calib "$OUT/calib.h5" --alpha 0.5 --preset O1 -o "$OUT/stories260K-w8a8.sqm" --force
$B/sq-inspect "$OUT/stories260K-w8a8.sqm" | grep -E "format|bits/weight"
echo "== sq-eval: FP32 =="
$B/sq-eval -m $M --tokenizer $T -f $VALID -c 256 --protocol windows --json "$OUT/fp32.json" --force
echo "== sq-eval: W8A8 (INT8 GEMMs) =="
$B/sq-eval -m "$OUT/stories260K-w8a8.sqm" -f $VALID -c 256 --protocol windows --json "$OUT/w8a8.json" --force
python3 - "$OUT/fp32.json" "$OUT/w8a8.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"FP32 PPL {a['ppl']:.4f}   W8A8 PPL {b['ppl']:.4f}   delta {100 * (b['ppl'] / a['ppl'] - 1):+.2f}%")
PY
echo "== sq-run: greedy generation with the W8A8 model =="
$B/sq-run -m "$OUT/stories260K-w8a8.sqm" -p "Once upon a time" -n 40 --temp 0
