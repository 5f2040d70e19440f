#!/usr/bin/env bash
# File-size and memory targets of the W8A8 converter on synthetic 1B-class models (docs/benchmarks.md):
#  * W8A8 .sqm (naive O1 + --quantize-head) vs FP32 .sqm of the 4-layer synthetic model (target <= 27%);
#  * peak RssAnon of sq-convert (SmoothQuant, calibrated) on the 16-layer synthetic model, vs its FP32
#    size (target < 40%).
# Usage: scripts/bench_w8a8_files.sh [WORK_DIR]  (needs ~5 GB of disk there; removed afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/bin
DATA=../shared/data
W=${1:-$(mktemp -d)}
trap 'rm -rf "$W"/syn4 "$W"/syn16 "$W"/*.sqm "$W"/*.h5' EXIT
$B/sq-bench --write-synthetic $W/syn4 --synthetic-layers 4 >/dev/null
$B/sq-convert -m $W/syn4 --scheme f32 -o $W/syn4_f32.sqm -q --force >/dev/null
$B/sq-convert -m $W/syn4 --no-smooth --preset O1 --quantize-head -o $W/syn4_w8a8.sqm -q --force >/dev/null
F=$(stat -c %s $W/syn4_f32.sqm); Q=$(stat -c %s $W/syn4_w8a8.sqm)
echo "synthetic 4-layer: FP32 .sqm $F bytes, W8A8 .sqm $Q bytes = $(python3 -c "print('%.1f%%' % (100*$Q/$F))") (target <= 27%)"
$B/sq-bench --write-synthetic $W/syn16 --synthetic-layers 16 >/dev/null
FP32=$(du -cb $W/syn16/*.safetensors | tail -1 | cut -f1)
$B/sq-calibrate -m $W/syn16 --tokenizer $DATA/llama2-tokenizer/tokenizer.model -f $DATA/tinystories/tinystories-valid-1000.txt \
  --samples 4 --seq-len 128 -o $W/syn16.h5 -q --force >/dev/null
PEAK=$($B/sq-convert -m $W/syn16 --tokenizer $DATA/llama2-tokenizer/tokenizer.model --calib $W/syn16.h5 --alpha 0.5 --preset O3 \
  -o $W/syn16_w8a8.sqm -q --force --report-memory 2>&1 >/dev/null | sed -n 's/.*peak RssAnon \([0-9.]*\) MiB.*/\1/p')
echo "synthetic 16-layer: FP32 weights $FP32 bytes; sq-convert (SmoothQuant O3) peak RssAnon $PEAK MiB = $(python3 -c "print('%.1f%%' % (100*$PEAK*2**20/$FP32))") of the FP32 size (target < 40%)"
