#!/usr/bin/env bash
# Table 3 of docs/results.md (issue #17; Atom Table 3 ablation on a real model): W4A4 RTN → + outlier
# channels kept in FP32 → + outliers in INT8 → + group quantization (g32) → + clipping (0.85 W /
# 0.9 A, Atom's defaults) → + GPTQ (Hessians from sq-calibrate --hessian) → + INT4 KV cache; each
# step adds one technique to the previous one. Column "Δ vs previous" is the step's PPL change.
# Usage: scripts/results/atom.sh [--model smollm2|gemma3|PATH] [--chunks N] [--windows-chunks N]
#        [--samples N] [--quick] [OUT_DIR]   (prints Markdown tables; --help for the options)
ROW_COLUMNS="dprev lbpw bpw bytes"
source "$(dirname "$0")/common.sh"
calibrate calib --hessian
convert f32 --scheme f32
C=(--scheme w4a4-atom --calib "$OUT/calib.h5")
convert atom-rtn --scheme w4a4-atom --outlier-channels 0 --group-size 0 --clip none
convert atom-fp "${C[@]}" --outlier-format fp32 --group-size 0 --clip none
convert atom-int8 "${C[@]}" --group-size 0 --clip none
convert atom-g32 "${C[@]}" --group-size 32 --clip none
convert atom-clip "${C[@]}" --group-size 32
convert atom-gptq "${C[@]}" --group-size 32 --gptq --gptq-hessians file
convert atom-gptq-kv4 "${C[@]}" --group-size 32 --gptq --gptq-hessians file --kv int4
begin_table
row "FP32" "$OUT/f32.sqm"
row "W4A4 RTN (per-channel W, per-token A)" "$OUT/atom-rtn.sqm"
row "+ outlier channels in FP32" "$OUT/atom-fp.sqm"
row "+ outliers in INT8" "$OUT/atom-int8.sqm"
row "+ group quantization (g32)" "$OUT/atom-g32.sqm"
row "+ clipping (0.85 W / 0.9 A)" "$OUT/atom-clip.sqm"
row "+ GPTQ" "$OUT/atom-gptq.sqm"
row "+ INT4 KV cache" "$OUT/atom-gptq-kv4.sqm"
print_tables "Atom step" "Δ vs previous" "linear bits/w" "file bits/w" "file bytes"
