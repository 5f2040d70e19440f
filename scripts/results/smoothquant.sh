#!/usr/bin/env bash
# Table 1 of docs/results.md (issue #17; SmoothQuant thesis Tables 3.2/3.6 on a real model): FP32,
# naive W8A8 and SmoothQuant (α = 0.5 and α auto, chosen per group on the calibration data) at the
# O1/O2/O3 presets (per-tensor weights), and per-channel weights with per-token activations.
# Calibration: C4 sample (scripts/results/common.sh); evaluation: WikiText-2 against the FP32 model.
# --quick (CI) leaves out the α auto rows (their grid search is most of the conversion time).
# Usage: scripts/results/smoothquant.sh [--model smollm2|gemma3|PATH] [--chunks N] [--windows-chunks N]
#        [--samples N] [--quick] [--hellaswag N] [OUT_DIR]   (prints Markdown tables; --help for the options)
source "$(dirname "$0")/common.sh"
calibrate calib --hessian
convert f32 --scheme f32
for p in O1 O2 O3; do
  convert naive-$p --calib "$OUT/calib.h5" --no-smooth --preset "$p"
  convert sq0.5-$p --calib "$OUT/calib.h5" --alpha 0.5 --preset "$p"
  [[ $QUICK == 1 ]] || convert sqauto-$p --calib "$OUT/calib.h5" --alpha auto --preset "$p"
done
# SmoothQuant's own recipes: no Hadamard rotations, round-to-nearest weights (the default w8a8
# recipe adds both; docs/results.md section 8)
convert naive-pc --calib "$OUT/calib.h5" --no-smooth --weight per-channel --act per-token --rotate none --no-gptq
convert sq0.5-pc --calib "$OUT/calib.h5" --alpha 0.5 --weight per-channel --act per-token --rotate none --no-gptq
begin_table
row "FP32" "$OUT/f32.sqm"
for p in O1 O2 O3; do
  row "naive W8A8 $p" "$OUT/naive-$p.sqm"
  row "SmoothQuant α=0.5 $p" "$OUT/sq0.5-$p.sqm"
  [[ $QUICK == 1 ]] || row "SmoothQuant α=auto $p" "$OUT/sqauto-$p.sqm"
done
row "naive W8A8, per-channel W, per-token A" "$OUT/naive-pc.sqm"
row "SmoothQuant α=0.5, per-channel W, per-token A" "$OUT/sq0.5-pc.sqm"
print_tables "W8A8 recipe" "linear bits/w" "file bits/w" "file bytes"
