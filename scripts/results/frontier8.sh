#!/usr/bin/env bash
# The 8-bit frontier of docs/results.md (issue #35): sqkit's W8A8 recipes, all on INT8 GEMMs with
# per-channel weights and per-token dynamic activations, from no smoothing to SmoothQuant and the
# Hadamard rotations (sq-convert --rotate hadamard, calib/recipe_rotation.h) and GPTQ, and the same
# recipes with a step per token and block of 32 inputs (--act per-token-group, the activation side
# of llama.cpp's Q8_0 dot product; quant/int8_gemm_grouped.h); with LLAMA_CPP_BIN
# (a llama.cpp build directory as docs/benchmarks.md says), llama.cpp's Q8_0 of the same weights on
# the same tokens (frontier4.sh measures it too, with the same commands, into the same directory).
# The llamacpp protocol only (-c 512). Calibration: $OUT/calib.h5 (frontier4.sh's and table 2's).
# Usage: [LLAMA_CPP_BIN=DIR] scripts/results/frontier8.sh [--model smollm2|gemma3|PATH] [--chunks N]
#        [--samples N] [--hellaswag N] [OUT_DIR]   (prints Markdown tables; --help for the options)
source "$(dirname "$0")/common.sh"
PROTOCOLS=("llamacpp 512 $CHUNKS")
calibrate calib --hessian
convert f32 --scheme f32
# --no-gptq: round-to-nearest weights (calib.h5 holds Hessians, with which GPTQ is the default)
W8=(--scheme w8a8 --weight per-channel --act per-token --no-gptq)
convert w8-naive "${W8[@]}" --no-smooth --rotate none
convert w8-sq0.5 "${W8[@]}" --calib "$OUT/calib.h5" --alpha 0.5 --rotate none
convert w8-rot-naive "${W8[@]}" --no-smooth --rotate hadamard
convert w8-sq0.5-rot "${W8[@]}" --calib "$OUT/calib.h5" --alpha 0.5 --rotate hadamard
convert w8-sq0.8-rot "${W8[@]}" --calib "$OUT/calib.h5" --alpha 0.8 --rotate hadamard
convert w8-sq0.5-rot-gptq --calib "$OUT/calib.h5"  # the default recipe: SmoothQuant α 0.5, rotations, GPTQ on the file's Hessians
convert w8-sq0.5-rot-head "${W8[@]}" --calib "$OUT/calib.h5" --alpha 0.5 --rotate hadamard --quantize-head
convert w8-sq0.5-rot-head16 "${W8[@]}" --calib "$OUT/calib.h5" --alpha 0.5 --rotate hadamard --quantize-head --head-activations fp32
G8=(--scheme w8a8 --weight per-channel --act per-token-group)
convert w8g-naive "${G8[@]}" --no-gptq --no-smooth --rotate none
convert w8g-sq0.5-rot-gptq "${G8[@]}" --calib "$OUT/calib.h5"
convert w8g-sq0.5-rot-gptq-head "${G8[@]}" --calib "$OUT/calib.h5" --quantize-head
begin_table
row "FP32" "$OUT/f32.sqm"
row "no smoothing" "$OUT/w8-naive.sqm"
row "SmoothQuant α 0.5" "$OUT/w8-sq0.5.sqm"
row "no smoothing, --rotate hadamard" "$OUT/w8-rot-naive.sqm"
row "SmoothQuant α 0.5, --rotate hadamard (the default without Hessians)" "$OUT/w8-sq0.5-rot.sqm"
row "SmoothQuant α 0.8, --rotate hadamard" "$OUT/w8-sq0.8-rot.sqm"
row "SmoothQuant α 0.5, --rotate hadamard, GPTQ (the default: sq-convert --calib, Hessians in the file)" "$OUT/w8-sq0.5-rot-gptq.sqm"
row "SmoothQuant α 0.5, --rotate hadamard, --quantize-head" "$OUT/w8-sq0.5-rot-head.sqm"
row "SmoothQuant α 0.5, --rotate hadamard, --quantize-head --head-activations fp32" "$OUT/w8-sq0.5-rot-head16.sqm"
row "--act per-token-group, no smoothing" "$OUT/w8g-naive.sqm"
row "--act per-token-group, SmoothQuant α 0.5, --rotate hadamard, GPTQ" "$OUT/w8g-sq0.5-rot-gptq.sqm"
row "--act per-token-group, SmoothQuant α 0.5, --rotate hadamard, GPTQ, --quantize-head" "$OUT/w8g-sq0.5-rot-gptq-head.sqm"
print_tables "sqkit W8A8 recipe (per-channel W; per-token A unless named)" "linear bits/w" "file bits/w" "file bytes"

[[ -n ${LLAMA_CPP_BIN:-} ]] || exit 0
llamacpp_base
llamacpp_row Q8_0
