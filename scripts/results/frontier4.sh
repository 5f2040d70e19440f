#!/usr/bin/env bash
# The 4-bit frontier of docs/results.md (issue #36): sqkit's W4A16 recipes at ≤ 4.5 bits per weight
# of the quantized linears, from the min/max rule (the rule before --observer) to the importance-
# weighted full-range scale search with the calibration's Σx² and GPTQ act-order on top; and, when
# LLAMA_CPP_BIN names a llama.cpp build directory (llama-quantize, llama-imatrix, llama-perplexity;
# built by hand as docs/benchmarks.md says), llama.cpp's Q4_0, Q4_K_M and Q8_0 of the same weights,
# each with and without an imatrix from the same C4 windows, measured on the same tokens.
# The llamacpp protocol only (-c 512). Calibration: the table-2 file ($OUT/calib.h5, with Hessians).
# Usage: [LLAMA_CPP_BIN=DIR] scripts/results/frontier4.sh [--model smollm2|gemma3|PATH] [--chunks N]
#        [--samples N] [--hellaswag N] [OUT_DIR]   (prints Markdown tables; --help for the options)
# Environment: MIXED=0 leaves out the mixed-precision rows (--bits-per-weight, --max-kld), whose
# sensitivity pass is the longest step (about 19 minutes on SmolLM2 on 2 cores).
source "$(dirname "$0")/common.sh"
PROTOCOLS=("llamacpp 512 $CHUNKS")
calibrate calib --hessian
convert f32 --scheme f32
# The rows compare the linears' recipes with the embedding / LM head in FP32 (--no-quantize-head);
# the "+ INT8 head" rows are whole files as sq-convert writes them by default (INT8 embedding rows,
# W8A16 head), the size llama.cpp's files are compared at.
G32=(--scheme w4a16 --group-size 32 --no-quantize-head)
G128=(--scheme w4a16 --group-size 128 --no-quantize-head)
convert rtn-g32-minmax "${G32[@]}" --observer minmax
convert rtn-g32-mse "${G32[@]}"
convert rtn-g32-mse-calib "${G32[@]}" --calib "$OUT/calib.h5"
convert gptqao-g32-mse "${G32[@]}" --gptq --act-order --calib "$OUT/calib.h5" --gptq-hessians file
convert rtn-g128-mse-calib "${G128[@]}" --calib "$OUT/calib.h5"
convert gptqao-g128-mse "${G128[@]}" --gptq --act-order --calib "$OUT/calib.h5" --gptq-hessians file
convert rtn-g32-mse-calib-head --scheme w4a16 --group-size 32 --calib "$OUT/calib.h5"
convert gptqao-g32-mse-head --scheme w4a16 --group-size 32 --gptq --act-order --calib "$OUT/calib.h5" --gptq-hessians file
convert rtn-g128-mse-calib-head --scheme w4a16 --group-size 128 --calib "$OUT/calib.h5"
# Mixed precision (docs/quantization.md): the sensitivities are measured once (the 5.5-bit file) and
# reused by the other budgets; the 5.63-bit file is llama.cpp Q4_K_M + imatrix's size on SmolLM2.
A32=(--scheme w4a16 --group-size 32 --asym --calib "$OUT/calib.h5")
convert rtn-g32a-mse-calib-head "${A32[@]}"
convert gptqao-g32a-mse-head "${A32[@]}" --gptq --act-order --gptq-hessians file
# GGML's Q4_K layout (two-level 6-bit scales and minimums, 4.5 bits/weight where 256 | in). Caveat
# (docs/results.md): the sources are Q4_1 (SmolLM2) and Q4_K_M files, whose grids a float minimum
# per 32 weights comes close to re-quantizing.
convert q4k-mse-calib-head --scheme w4a16 --calib "$OUT/calib.h5"   # the default layout: --k-quant
convert q4k-awq --scheme w4a16 --k-quant --awq --calib "$OUT/calib.h5"
convert q4k-gptqao --scheme w4a16 --k-quant --gptq --act-order --calib "$OUT/calib.h5" --gptq-hessians file
MIXED=${MIXED:-1}
[[ $MIXED == 0 ]] || {
convert rtn-g32a-mixed5.5 "${A32[@]}" --bits-per-weight 5.5
convert gptqao-g32a-mixed5.63-seq "${A32[@]}" --gptq --act-order --gptq-hessians sequential --bits-per-weight 5.63 \
  --sensitivity-from "$OUT/rtn-g32a-mixed5.5.sqm"
convert rtn-g32a-kld0.01 "${A32[@]}" --max-kld 0.01 --sensitivity-from "$OUT/rtn-g32a-mixed5.5.sqm"
# The same budgets with the default Q4_K linears as the 4-bit format
convert q4k-mixed5.5 --scheme w4a16 --calib "$OUT/calib.h5" --bits-per-weight 5.5
convert q4k-mixed5.63 --scheme w4a16 --calib "$OUT/calib.h5" --bits-per-weight 5.63 --sensitivity-from "$OUT/q4k-mixed5.5.sqm"
convert q4k-kld0.01 --scheme w4a16 --calib "$OUT/calib.h5" --max-kld 0.01 --sensitivity-from "$OUT/q4k-mixed5.5.sqm"
}
begin_table
row "FP32" "$OUT/f32.sqm"
row "RTN g32 sym, minmax (absmax/7)" "$OUT/rtn-g32-minmax.sqm"
row "RTN g32 sym, mse (uniform)" "$OUT/rtn-g32-mse.sqm"
row "RTN g32 sym, mse (calibration Σx²)" "$OUT/rtn-g32-mse-calib.sqm"
row "GPTQ act-order g32 sym, mse (diag H)" "$OUT/gptqao-g32-mse.sqm"
row "RTN g128 sym, mse (calibration Σx²)" "$OUT/rtn-g128-mse-calib.sqm"
row "GPTQ act-order g128 sym, mse (diag H)" "$OUT/gptqao-g128-mse.sqm"
row "RTN g32 sym, mse (calibration Σx²) + INT8 head" "$OUT/rtn-g32-mse-calib-head.sqm"
row "GPTQ act-order g32 sym, mse (diag H) + INT8 head" "$OUT/gptqao-g32-mse-head.sqm"
row "RTN g128 sym, mse (calibration Σx²) + INT8 head (the --scheme w4a16 --calib default until 2026-12-02)" "$OUT/rtn-g128-mse-calib-head.sqm"
row "RTN g32 asym, mse (calibration Σx²) + INT8 head" "$OUT/rtn-g32a-mse-calib-head.sqm"
row "GPTQ act-order g32 asym, mse (diag H) + INT8 head" "$OUT/gptqao-g32a-mse-head.sqm"
row "RTN Q4_K (--k-quant), mse (calibration Σx²) + INT8 head (the --scheme w4a16 --calib default)" "$OUT/q4k-mse-calib-head.sqm"
row "Q4_K after AWQ scaling (--k-quant --awq) + INT8 head" "$OUT/q4k-awq.sqm"
row "GPTQ act-order on the Q4_K grid (--k-quant --gptq --act-order) + INT8 head" "$OUT/q4k-gptqao.sqm"
[[ $MIXED == 0 ]] || {
row "RTN g32 asym + INT8 head, --bits-per-weight 5.5" "$OUT/rtn-g32a-mixed5.5.sqm"
row "GPTQ act-order g32 asym (sequential H) + INT8 head, --bits-per-weight 5.63" "$OUT/gptqao-g32a-mixed5.63-seq.sqm"
row "RTN g32 asym + INT8 head, --max-kld 0.01" "$OUT/rtn-g32a-kld0.01.sqm"
row "RTN Q4_K + INT8 head, --bits-per-weight 5.5" "$OUT/q4k-mixed5.5.sqm"
row "RTN Q4_K + INT8 head, --bits-per-weight 5.63" "$OUT/q4k-mixed5.63.sqm"
row "RTN Q4_K + INT8 head, --max-kld 0.01" "$OUT/q4k-kld0.01.sqm"
}
print_tables "sqkit W4A16 recipe" "linear bits/w" "file bits/w" "file bytes"

[[ -n ${LLAMA_CPP_BIN:-} ]] || exit 0
# llama.cpp on the same weights: F32 re-quantized from the original file, an imatrix from the first
# $SAMPLES 512-token chunks of the C4 sample, KLD against the F32 logits on the same chunks.
llamacpp_base
[[ -s $P/imatrix.gguf ]] || "$L/llama-imatrix" -m "$P/F32.gguf" -f "$C4" -c 512 --chunks "$SAMPLES" -t 2 -o "$P/imatrix.gguf" >"$P/imatrix.log" 2>&1
for t in Q4_0 Q4_K_M Q8_0; do
  llamacpp_row $t
  llamacpp_row $t imatrix
done
