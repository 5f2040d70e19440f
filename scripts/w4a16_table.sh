#!/usr/bin/env bash
# Produces the W4A16 table of docs/benchmarks.md: stories260K, RTN vs GPTQ (symmetric / asymmetric,
# group sizes 128 and 32), GPTQ calibrated on tinystories-train-2MiB (128 windows x 256 tokens,
# Hessians recorded with --hessian), evaluated with the windows protocol at -c 256 on
# tinystories-valid-1000.
# Usage: scripts/w4a16_table.sh [OUT_DIR]   (prints a Markdown table)
source "$(dirname "$0")/table_common.sh"
calibrate $OUT/calib.h5 --hessian
lbpw() { $B/sq-inspect --json "$1" | python3 -c "import json,sys; j=json.load(sys.stdin); v=j['quantized_linear_bits_per_weight']; print('%.4f' % v if v else '-')"; }
row() {  # name file
  local p; p=$(ppl "$2")
  printf '| %s | %s | %+.2f%% | %d | %s |\n' "$1" "$p" "$(python3 -c "print(($p/$BASE-1)*100)")" "$(stat -c %s "$2")" "$(lbpw "$2")"
}
$B/sq-convert -m $M --tokenizer $T --scheme f32 -o $OUT/f32.sqm --force -q >/dev/null
BASE=$(ppl $OUT/f32.sqm)
echo "| model | PPL | ΔPPL | file bytes | linear bits/weight |"
echo "|---|---|---|---|---|"
row "FP32" $OUT/f32.sqm
for g in 128 32; do
  for sa in sym asym; do
    $B/sq-convert -m $M --tokenizer $T --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head -o $OUT/rtn_${g}_$sa.sqm --force -q >/dev/null
    row "W4A16 g$g $sa RTN" $OUT/rtn_${g}_$sa.sqm
    for h in sequential file; do
      $B/sq-convert -m $M --tokenizer $T --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head --gptq --calib $OUT/calib.h5 --gptq-hessians $h \
        -o $OUT/gptq_${g}_${sa}_$h.sqm --force -q >/dev/null
      row "W4A16 g$g $sa GPTQ ($h H)" $OUT/gptq_${g}_${sa}_$h.sqm
    done
    $B/sq-convert -m $M --tokenizer $T --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head --gptq --act-order --calib $OUT/calib.h5 \
      -o $OUT/gptqao_${g}_$sa.sqm --force -q >/dev/null
    row "W4A16 g$g $sa GPTQ act-order (sequential H)" $OUT/gptqao_${g}_$sa.sqm
  done
done
