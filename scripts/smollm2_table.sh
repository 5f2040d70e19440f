#!/usr/bin/env bash
# Produces the SmolLM2-135M tables of docs/benchmarks.md (issue #15): the FP32 model (the dequantized
# GGUF weights) and its SmoothQuant W8A8 (O1/O3, naive and α = 0.5) and W4A16 GPTQ g128 (with and
# without act-order; Hessians from the calibration file) conversions,
# calibrated on the C4 sample (128 windows x 512 tokens, seed 42), evaluated on WikiText-2 (test)
# under the llamacpp protocol (-c 512) and, with --windows, also the windows protocol (-c 2048): the
# whole file, or its first N chunks/windows with --chunks N (the whole file takes 5-10 min per row on
# 2 cores). Each row is printed as soon as it is measured (sequentially, all cores per run); files
# already made (conversions, JSON newer than its model) are reused, so an interrupted run resumes.
# Usage: scripts/smollm2_table.sh [--windows] [--chunks N] [OUT_DIR]   (default OUT_DIR: build/smollm2-table)
# Needs: bash scripts/fetch-models.sh smollm2-135m; the Release tools in build/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOWS=0
CHUNKS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --windows) WINDOWS=1; shift ;;
    --chunks) CHUNKS=(--chunks "$2"); shift 2 ;;
    *) break ;;
  esac
done
OUT=${1:-build/smollm2-table}
DATA=../shared/data
MODELS=${SQKIT_MODELS:-models}
M=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
C4=$DATA/c4/c4-sample-1480.txt
WIKI=$DATA/wikitext2/wiki.test.raw
B=build/bin
[[ -f $M ]] || { echo "smollm2_table.sh: $M is missing; run: bash scripts/fetch-models.sh smollm2-135m" >&2; exit 2; }
mkdir -p "$OUT"

# eval NAME MODEL PROTOCOL CTX: whole-file PPL into $OUT/NAME.PROTOCOL.json; prints a table row.
eval_row() {
  local name=$1 model=$2 proto=$3 ctx=$4 j="$OUT/$1.$3${CHUNKS[1]:+.${CHUNKS[1]}}.json"
  [[ -f $j && $j -nt $model ]] ||  # measured already (the script resumes)
    $B/sq-eval -m "$model" -f $WIKI --protocol "$proto" -c "$ctx" "${CHUNKS[@]}" -q --json "$j" --force >/dev/null
  python3 - "$j" "$name" "$model" "$OUT/fp32.$proto${CHUNKS[1]:+.${CHUNKS[1]}}.json" <<'PY'
import json, os, sys
j, name, model, base = sys.argv[1:5]
d = json.load(open(j))
b = json.load(open(base))['ppl'] if os.path.exists(base) else d['ppl']
p = d['protocol']
print(f"| {name} | {p['name']} -c {p['ctx']}, {p['chunks']} chunks | {d['ppl']:.4f} ± {d['ppl_stderr']:.4f} | {100 * (d['ppl'] / b - 1):+.2f}% "
      f"| {d['tokens_scored']} | {d['tokens_per_second']:.0f} | {os.path.getsize(model)} |", flush=True)
PY
}

echo "== sq-calibrate: C4 sample, 128 x 512 tokens ==" >&2
[[ -f $OUT/c4-calib.h5 ]] || $B/sq-calibrate -m $M -f $C4 --samples 128 --seq-len 512 --hessian -o "$OUT/c4-calib.h5" -q
echo "== sq-convert ==" >&2
conv() { local o=$OUT/$1.sqm; shift; [[ -f $o ]] || $B/sq-convert -m $M --calib "$OUT/c4-calib.h5" "$@" -o "$o" -q >/dev/null; }
conv w8a8-naive-O1 --no-smooth --preset O1
conv w8a8-naive-O3 --no-smooth --preset O3
conv w8a8-sq0.5-O1 --alpha 0.5 --preset O1
conv w8a8-sq0.5-O3 --alpha 0.5 --preset O3
conv w4a16-gptq-g128 --scheme w4a16 --observer minmax --no-quantize-head --gptq --gptq-hessians file --group-size 128
conv w4a16-gptq-g128-actorder --scheme w4a16 --observer minmax --no-quantize-head --gptq --gptq-hessians file --act-order --group-size 128

echo "| model | protocol | PPL | ΔPPL | tokens scored | tokens/s | file bytes |"
echo "|---|---|---|---|---|---|---|"
protos=("llamacpp 512")
[[ $WINDOWS == 1 ]] && protos+=("windows 2048")
for pc in "${protos[@]}"; do
  read -r proto ctx <<<"$pc"
  eval_row fp32 $M "$proto" "$ctx"
  for n in w8a8-naive-O1 w8a8-sq0.5-O1 w8a8-naive-O3 w8a8-sq0.5-O3 w4a16-gptq-g128 w4a16-gptq-g128-actorder; do
    eval_row "$n" "$OUT/$n.sqm" "$proto" "$ctx"
  done
done
