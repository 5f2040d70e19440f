#!/usr/bin/env bash
# Table 4 of docs/results.md (issue #17; KVQuant Table 2 on a real model): KV caches int4/3/2
# (uniform, per token and head, no sink) vs nuq4/3/2 (KVQuant: pre-RoPE per-channel keys,
# Fisher-weighted k-means codebooks, first token in FP16), with 1% dense-and-sparse outliers, Q-Norm
# at 2 bits, and the ablations at 3 bits (post-RoPE keys, per-token keys, no FP16 sink) and at 3 and
# 2 bits (uniform k-means weights instead of Fisher information). Weights stay FP32.
# The Fisher information comes from sq-calibrate --fisher on $FISHER_SAMPLES C4 windows of 512
# tokens (default 16, KVQuant's own calibration size: 16 samples), every token kept.
# Usage: scripts/results/kvquant.sh [--model smollm2|gemma3|PATH] [--chunks N] [--windows-chunks N]
#        [--quick] [OUT_DIR]   (prints Markdown tables; --help for the options)
ROW_COLUMNS="kv"
source "$(dirname "$0")/common.sh"
FISHER_SAMPLES=${FISHER_SAMPLES:-16}
SAMPLES=$FISHER_SAMPLES calibrate fisher --fisher --fisher-tokens $((FISHER_SAMPLES * 512))
convert f32 --scheme f32
F=(--scheme f32 --calib "$OUT/fisher.h5")
for b in 4 3 2; do
  convert nuq$b "${F[@]}" --kv nuq$b
  convert nuq$b-1pc "${F[@]}" --kv nuq$b --kv-outliers 0.01
  convert nuq$b-uniform "${F[@]}" --kv nuq$b --kv-weighting uniform
done
convert nuq2-qnorm "${F[@]}" --kv nuq2 --kv-qnorm
convert nuq2-1pc-qnorm "${F[@]}" --kv nuq2 --kv-outliers 0.01 --kv-qnorm
convert nuq3-post-rope "${F[@]}" --kv nuq3 --kv-keys post-rope
convert nuq3-per-token "${F[@]}" --kv nuq3 --kv-key-axis per-token
convert nuq3-nosink "${F[@]}" --kv nuq3 --kv-sink-fp16 0
begin_table
row "FP32" "$OUT/f32.sqm"
for b in 4 3 2; do
  row "int$b" "$OUT/f32.sqm" --kv int$b
  row "int$b + FP16 sink token" "$OUT/f32.sqm" --kv int$b --kv-sink-fp16 1
  row "nuq$b" "$OUT/nuq$b.sqm"
  row "nuq$b-1%" "$OUT/nuq$b-1pc.sqm"
  row "nuq$b, uniform k-means weights (no Fisher)" "$OUT/nuq$b-uniform.sqm"
done
row "nuq2 + Q-Norm" "$OUT/nuq2-qnorm.sqm"
row "nuq2-1% + Q-Norm" "$OUT/nuq2-1pc-qnorm.sqm"
row "nuq3, post-RoPE keys" "$OUT/nuq3-post-rope.sqm"
row "nuq3, per-token keys" "$OUT/nuq3-per-token.sqm"
row "nuq3, no FP16 sink" "$OUT/nuq3-nosink.sqm"
print_tables "KV cache" "KV bytes/token"
