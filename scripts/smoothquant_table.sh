#!/usr/bin/env bash
# Produces the W8A8 table of docs/benchmarks.md: stories260K calibrated on tinystories-train-2MiB
# (128 windows x 256 tokens), evaluated with the windows protocol at -c 256 on tinystories-valid-1000.
# Usage: scripts/smoothquant_table.sh [OUT_DIR]   (prints a Markdown table)
source "$(dirname "$0")/table_common.sh"
calibrate $OUT/calib.h5
row() {  # name file
  local p; p=$(ppl "$2")
  printf '| %s | %s | %+.2f%% | %d | %s |\n' "$1" "$p" "$(python3 -c "print(($p/$BASE-1)*100)")" "$(stat -c %s "$2")" "$(bpw "$2")"
}
$B/sq-convert -m $M --tokenizer $T --scheme f32 -o $OUT/f32.sqm --force -q >/dev/null
BASE=$(ppl $OUT/f32.sqm)
echo "| model | PPL | ΔPPL | file bytes | bits/weight |"
echo "|---|---|---|---|---|"
row "FP32" $OUT/f32.sqm
for p in O1 O2 O3; do
  $B/sq-convert -m $M --tokenizer $T --calib $OUT/calib.h5 --no-smooth --preset $p -o $OUT/naive_$p.sqm --force -q >/dev/null
  row "naive W8A8 $p" $OUT/naive_$p.sqm
done
for a in 0.5 auto; do
  for p in O1 O2 O3; do
    $B/sq-convert -m $M --tokenizer $T --calib $OUT/calib.h5 --alpha $a --preset $p -o $OUT/sq_${a}_$p.sqm --force -q >/dev/null
    row "SmoothQuant α=$a $p" $OUT/sq_${a}_$p.sqm
  done
done
