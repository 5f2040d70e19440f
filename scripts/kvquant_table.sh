#!/usr/bin/env bash
# Produces the KVQuant table of docs/benchmarks.md (issue #4, in the shape of KVQuant Table 2):
# stories260K, KV-cache formats calibrated on tinystories-train-2MiB (128 windows x 256 tokens,
# Fisher information of 16,384 tokens per layer from sq-calibrate --fisher), evaluated with the
# windows protocol at -c 256 on all of tinystories-valid-1000. Columns: PPL, KV bytes per token
# measured by sq-eval (all 5 layers, K and V: codes + scales + FP16 sink rows + sparse outliers +
# codebooks amortized over the 256-token window) and the layout's theoretical size.
# Usage: scripts/kvquant_table.sh [OUT_DIR]   (prints a Markdown table)
source "$(dirname "$0")/table_common.sh"
calibrate $OUT/calib.h5 --fisher --fisher-tokens 16384
$B/sq-convert -m $M --tokenizer $T --scheme f32 -o $OUT/f32.sqm --force -q >/dev/null
row() {  # name model-file [sq-eval args...]
  local name=$1 file=$2 j=$OUT/$(echo "$1" | tr -c 'A-Za-z0-9' '_').json
  shift 2
  $B/sq-eval -m "$file" -f $VALID -c 256 -q --json "$j" --force "$@" >/dev/null
  python3 - "$j" "$name" "${BASE:-0}" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1])); name = sys.argv[2]; base = float(sys.argv[3])
kv = j["kv_cache"]; s = kv["spec"]; ctx = j["protocol"]["ctx"]
L, width, hd = 5, 32, 8          # stories260K: 5 layers, 4 KV heads x head_dim 8
fmt = s["format"]; b = s["bits"]; p = s["outlier_fraction"]; sinks = s["sink_fp16"]
if fmt == "fp32":
    row = 4 * width; krow = vrow = row; tables = 0
elif fmt.startswith("int"):
    g = s["group"] or hd
    krow = vrow = math.ceil(width * b / 8) + 4 * (width // g); tables = 0
else:
    per_channel = s["key_axis"] == "per-channel"
    krow = math.ceil(width * b / 8) + (0 if per_channel else 4); vrow = math.ceil(width * b / 8) + 4
    tables = L * 4 * (2 * 2 ** b + (2 * width if per_channel else 0))
dense_rows = ctx - min(sinks, ctx)
theory = (dense_rows * L * (krow + vrow) + min(sinks, ctx) * L * 2 * 2 * width + tables) / ctx
if p > 0:  # expected outliers: keys p·width (calibrated per-channel thresholds), values 2·ceil(p/2·(width−1)) per row
    per_tok = lambda: 2 * math.ceil(p / 2 * (width - 1))
    k_out = p * width if s["key_axis"] == "per-channel" else per_tok()
    theory += dense_rows * L * ((k_out + per_tok()) * 4 + 2 * 4) / ctx
ppl = j["ppl"]; meas = kv["bytes_per_token"]
d = "" if base == 0 else "%+.2f%%" % ((ppl / base - 1) * 100)
print("| %s | %.4f | %s | %.2f | %.2f | %+.2f%% | %.1f%% |" % (name, ppl, d, meas, theory, (meas / theory - 1) * 100,
                                                               meas / (L * 2 * 4 * width) * 100))
PY
}
BASE=$(ppl $OUT/f32.sqm)
nuq() {  # name outfile sq-convert kv args...
  local name=$1 out=$OUT/$2.sqm
  shift 2
  $B/sq-convert -m $M --tokenizer $T --scheme f32 --calib $OUT/calib.h5 "$@" -o $out --force -q >/dev/null
  row "$name" $out
}
echo "| KV format | PPL | ΔPPL | KV bytes/token (measured) | theoretical | measured/theory | of FP32 |"
echo "|---|---|---|---|---|---|---|"
row "FP32" $OUT/f32.sqm
for b in 4 3 2; do row "int$b (per token, per head)" $OUT/f32.sqm --kv int$b; done
for b in 4 3 2; do
  nuq "nuq$b" nuq$b --kv nuq$b
  nuq "nuq$b-1%" nuq${b}_1 --kv nuq$b --kv-outliers 0.01
done
nuq "nuq2 + Q-Norm" nuq2_qn --kv nuq2 --kv-qnorm
nuq "nuq2-1% + Q-Norm" nuq2_1_qn --kv nuq2 --kv-outliers 0.01 --kv-qnorm
echo
echo "Ablations (3 bits unless named):"
echo
echo "| KV format | PPL | ΔPPL | KV bytes/token (measured) | theoretical | measured/theory | of FP32 |"
echo "|---|---|---|---|---|---|---|"
for b in 4 3 2; do row "int$b per token over the whole K/V vector (--kv-group 32)" $OUT/f32.sqm --kv int$b --kv-group 32; done
nuq "nuq3, post-RoPE per-token keys" nuq3_post_tok --kv nuq3 --kv-keys post-rope --kv-key-axis per-token
nuq "nuq3, pre-RoPE per-token keys" nuq3_pre_tok --kv nuq3 --kv-key-axis per-token
nuq "nuq3, post-RoPE per-channel keys" nuq3_post_ch --kv nuq3 --kv-keys post-rope
nuq "nuq3, no FP16 sink" nuq3_nosink --kv nuq3 --kv-sink-fp16 0
for b in 4 3 2; do nuq "nuq$b, uniform k-means weights (no Fisher)" nuq${b}_uniform --kv nuq$b --kv-weighting uniform; done
nuq "nuq2-1%, uniform k-means weights (no Fisher)" nuq2_1_uniform --kv nuq2 --kv-outliers 0.01 --kv-weighting uniform
