#!/usr/bin/env bash
# Table 2 of docs/results.md (issue #17; GPTQ on a real model): W4A16 round-to-nearest vs GPTQ,
# groups of 128 and 32, symmetric and asymmetric, GPTQ with and without act-order (static groups).
# GPTQ uses the Hessians 2XᵀX recorded by sq-calibrate --hessian on the C4 calibration windows
# (--gptq-hessians file) and the default dampening (1% of the mean diagonal): nothing is tuned on
# WikiText-2. Every recipe uses the GPTQ reference's min/max quantizer (--observer minmax --no-quantize-head, the
# rule before the scale search; section 7 of docs/results.md and scripts/results/frontier4.sh
# measure the search).
# Usage: scripts/results/w4a16.sh [--model smollm2|gemma3|PATH] [--chunks N] [--windows-chunks N]
#        [--samples N] [--quick] [--hellaswag N] [OUT_DIR]   (prints Markdown tables; --help for the options)
# Environment: GROUP_SIZES (default "128 32"): the group sizes of the rows; SYMMETRIES (default
# "sym asym"); ACT_ORDER (default 1; 0 leaves out the act-order rows). Qwen2.5-1.5B's GPTQ
# conversion takes 14 min, so its table was run with GROUP_SIZES=128 SYMMETRIES=sym ACT_ORDER=0.
source "$(dirname "$0")/common.sh"
calibrate calib --hessian
convert f32 --scheme f32
for g in ${GROUP_SIZES:-128 32}; do
  for sa in ${SYMMETRIES:-sym asym}; do
    convert rtn-g$g-$sa --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head
    convert gptq-g$g-$sa --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head --gptq --calib "$OUT/calib.h5" --gptq-hessians file
    [[ ${ACT_ORDER:-1} == 0 ]] || convert gptqao-g$g-$sa --scheme w4a16 --group-size $g --$sa --observer minmax --no-quantize-head --gptq --act-order --calib "$OUT/calib.h5" --gptq-hessians file
  done
done
begin_table
row "FP32" "$OUT/f32.sqm"
for g in ${GROUP_SIZES:-128 32}; do
  for sa in ${SYMMETRIES:-sym asym}; do
    row "RTN g$g $sa" "$OUT/rtn-g$g-$sa.sqm"
    row "GPTQ g$g $sa" "$OUT/gptq-g$g-$sa.sqm"
    [[ ${ACT_ORDER:-1} == 0 ]] || row "GPTQ act-order g$g $sa" "$OUT/gptqao-g$g-$sa.sqm"
  done
done
print_tables "W4A16 recipe" "linear bits/w" "file bits/w" "file bytes"
