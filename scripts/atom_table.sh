#!/usr/bin/env bash
# Produces the Atom W4A4 ablation of docs/benchmarks.md (Atom Table 3 on stories260K): W4A4 RTN →
# + outliers kept in FP32 → + outliers in INT8 → + group quantization → + clipping → + GPTQ, each step
# adding one technique to the previous one, then + INT4 KV cache (--kv int4: Atom §4.4). Calibration:
# tinystories-train-2MiB (128 windows x 256 tokens, with Hessians); evaluation: windows protocol at
# -c 256 on tinystories-valid-1000.
# Usage: scripts/atom_table.sh [OUT_DIR]   (prints Markdown tables)
source "$(dirname "$0")/table_common.sh"
calibrate $OUT/calib.h5 --hessian
lbpw() { $B/sq-inspect --json "$1" | python3 -c "import json,sys; j=json.load(sys.stdin); q=j['quantized_linear_bits_per_weight']; print('%s | %.2f' % ('%.3f' % q if q else '-', j['bits_per_weight']))"; }
PREV=""
row() {  # name file
  local p d; p=$(ppl "$2")
  if [ -n "$PREV" ]; then d=$(python3 -c "print('%+.3f' % ($p-$PREV))"); else d="-"; fi
  printf '| %s | %s | %s | %+.1f%% | %d | %s |\n' "$1" "$p" "$d" "$(python3 -c "print(($p/$BASE-1)*100)")" "$(stat -c %s "$2")" "$(lbpw "$2")"
  PREV=$p
}
atom() { local f=$1; shift; $B/sq-convert -m $M --tokenizer $T --scheme w4a4-atom -o $OUT/$f.sqm --force -q "$@" >/dev/null; }
$B/sq-convert -m $M --tokenizer $T --scheme f32 -o $OUT/f32.sqm --force -q >/dev/null
BASE=$(ppl $OUT/f32.sqm)
C="--calib $OUT/calib.h5"
echo "| step | PPL | Δ vs previous | Δ vs FP32 | file bytes | linear bits/w | file bits/w |"
echo "|---|---|---|---|---|---|---|"
row "FP32" $OUT/f32.sqm
atom rtn --outlier-channels 0 --group-size 0 --clip none;                   row "W4A4 RTN (per-channel W, per-token A)" $OUT/rtn.sqm
atom fp $C --outlier-format fp32 --group-size 0 --clip none;                row "+ outliers kept in FP32 (auto: 4 / 10)" $OUT/fp.sqm
atom int8 $C --group-size 0 --clip none;                                    row "+ outliers in INT8" $OUT/int8.sqm
atom g32 $C --group-size 32 --clip none;                                    row "+ group quantization (g32)" $OUT/g32.sqm
atom clip $C --group-size 32;                                               row "+ clipping (0.85 W / 0.9 A)" $OUT/clip.sqm
atom gptq $C --group-size 32 --gptq;                                        row "+ GPTQ (sequential Hessians)" $OUT/gptq.sqm
atom gptqkv4 $C --group-size 32 --gptq --kv int4;                           row "+ INT4 KV cache (asymmetric, per token and head)" $OUT/gptqkv4.sqm
echo
echo "Variants (each a full recipe; Δ vs previous = vs the row above):"
echo
echo "| recipe | PPL | Δ vs previous | Δ vs FP32 | file bytes | linear bits/w | file bits/w |"
echo "|---|---|---|---|---|---|---|"
PREV=""
atom g128 $C --group-size 128 --clip none;                                  row "INT8 outliers + g128 (no clip, RTN)" $OUT/g128.sqm
atom g128gptq $C --group-size 128 --gptq;                                   row "g128 + clipping + GPTQ" $OUT/g128gptq.sqm
atom g64gptq $C --group-size 64 --gptq;                                     row "g64 + clipping + GPTQ" $OUT/g64gptq.sqm
atom search $C --group-size 32 --clip search;                               row "g32 + --clip search (RTN)" $OUT/search.sqm
atom searchgptq $C --group-size 32 --clip search --gptq;                    row "g32 + --clip search + GPTQ" $OUT/searchgptq.sqm
atom gptqao $C --group-size 32 --gptq --act-order;                          row "g32 + clipping + GPTQ act-order" $OUT/gptqao.sqm
atom gptqfile $C --group-size 32 --gptq --gptq-hessians file;               row "g32 + clipping + GPTQ (file Hessians)" $OUT/gptqfile.sqm
atom o8 $C --group-size 32 --gptq --outlier-channels 8;                     row "g32 + clipping + GPTQ, 8 outliers per input" $OUT/o8.sqm
atom o16 $C --group-size 32 --gptq --outlier-channels 16;                   row "g32 + clipping + GPTQ, 16 outliers per input" $OUT/o16.sqm
