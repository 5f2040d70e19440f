#!/usr/bin/env bash
# Produces the "Streaming and KV eviction (issue #6)" tables of docs/benchmarks.md on stories260K
# (trained on 512-token sequences), with sq-eval --protocol streaming (docs/protocols.md):
#   1. StreamingLLM Table 4.1/4.2 setting: one stream over the first $LONG_TOKENS tokens of
#      tinystories-valid-1000 (the concatenated stories) and of war-and-peace, decoded under dense,
#      window:256, sink:S,window:256-S (S = 1, 2, 4, 8) and recompute:256; PPL per position band
#      and per $SEGMENT-token segment (the segments are what scripts/streaming_plot.sh draws).
#   2. The small-window check: the first 3,000 tokens of tinystories-valid, window 128.
#   3. Q-Hitter vs H2O at a 20% budget (10% recent) with int4 / int3 (uniform, per token) and nuq3
#      (KVQuant, calibrated on tinystories-train-2MiB with Fisher weights) KV caches, on streams of
#      -c 256 over the first $QH_TOKENS tokens of tinystories-valid, with dense and window:51 references.
# Builds nothing (needs build/bin). Results (JSON) stay in OUT_DIR.
# Usage: scripts/streaming_table.sh [OUT_DIR]   (prints Markdown tables)
#   env: LONG_TOKENS (20000), SEGMENT (128), QH_TOKENS (50000), LAMBDAS ("0 0.25 0.5 0.75 1")
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=../shared/data
M=$DATA/stories260K/stories260K.bin
T=$DATA/stories260K/tok512.bin
VALID=$DATA/tinystories/tinystories-valid-1000.txt
WAP=$DATA/longtext/war-and-peace.txt
OUT=${1:-$(mktemp -d)}
LONG_TOKENS=${LONG_TOKENS:-20000}
SEGMENT=${SEGMENT:-128}
QH_TOKENS=${QH_TOKENS:-50000}
LAMBDAS=${LAMBDAS:-"0 0.25 0.5 0.75 1"}
mkdir -p "$OUT"
B=build/bin
# run JSON MODEL TEXT ARGS...: one sq-eval streaming run (skipped when JSON exists, so an
# interrupted run can be resumed with the same OUT_DIR).
run() {
  local json=$1 model=$2 text=$3; shift 3
  [ -s "$json" ] && return 0
  $B/sq-eval -m "$model" --tokenizer $T -f "$text" --protocol streaming -q --json "$json" --force "$@" >/dev/null
}
fname() { echo "$1" | tr ':,%' '___'; }

# ---- 1. long streams ------------------------------------------------------------------------------
LONG_POLICIES="dense window:256 sink:1,window:255 sink:2,window:254 sink:4,window:252 sink:8,window:248 recompute:256"
for text in valid wap; do
  f=$VALID; [ $text = wap ] && f=$WAP
  for p in $LONG_POLICIES; do
    run "$OUT/long_${text}_$(fname $p).json" $M "$f" --kv-policy "$p" --max-tokens "$LONG_TOKENS" --segment "$SEGMENT"
  done
done
python3 - "$OUT" "$LONG_POLICIES" "$SEGMENT" <<'PY'
import json, math, sys
out, policies, seg = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def load(text, p):
    return json.load(open(f"{out}/long_{text}_{p.replace(':', '_').replace(',', '_').replace('%', '_')}.json"))
def band(j, lo, hi):  # PPL over predictions at stream positions [lo, hi) (segment-aligned)
    nll = n = 0
    for s in j["segments"]:
        if lo <= s["first"] < hi:
            nll += math.log(s["ppl"]) * s["tokens"]; n += s["tokens"]
    return math.exp(nll / n) if n else float("nan")
for text, name in (("valid", "tinystories-valid-1000 (concatenated stories)"), ("wap", "war-and-peace")):
    j0 = load(text, "dense")
    n = j0["tokens_scored"] + 1
    edges = [0, 512, 1024, 4096, n]
    print(f"\n**{name}**, first {n:,} tokens as one stream, FP32 KV, {seg}-token segments\n")
    print("| policy | PPL (all) | " + " | ".join(f"[{a}, {b})" for a, b in zip(edges, edges[1:])) +
          " | last segment | peak KV bytes (tokens) | KV bytes at segment ends from position 255 on: min / max | vs recompute (all) |")
    print("|---|---|" + "---|" * (len(edges) - 1) + "---|---|---|---|")
    rec = load(text, "recompute:256")["ppl"]
    for p in policies:
        j = load(text, p)
        bands = " | ".join("%.3f" % band(j, a, b) for a, b in zip(edges, edges[1:]))
        segs = j["segments"]
        kv = j["kv_cache"]
        late = [s["kv_bytes"] for s in segs if s["first"] + s["tokens"] >= 256]  # segments ending at position >= 255
        print(f"| `{p}` | {j['ppl']:.3f} | {bands} | {segs[-1]['ppl']:.3f} | {kv['peak_bytes']:,} ({kv['peak_tokens']:,}) | "
              f"{min(late):,} / {max(late):,} | {(j['ppl'] / rec - 1) * 100:+.1f}% |")
PY

# ---- 2. the 3,000-token check (window 128) ----------------------------------------------------------
SHORT_POLICIES="dense window:128 sink:4,window:124 recompute:128"
for p in $SHORT_POLICIES; do
  run "$OUT/short_valid_$(fname $p).json" $M $VALID --kv-policy "$p" --max-tokens 3000 --segment 500
done
python3 - "$OUT" "$SHORT_POLICIES" <<'PY'
import json, sys
out, policies = sys.argv[1], sys.argv[2].split()
print("\n**First 3,000 tokens of tinystories-valid-1000**, one stream, FP32 KV, window 128\n")
print("| policy | PPL (all) | PPL per 500-token segment | peak KV tokens |")
print("|---|---|---|---|")
for p in policies:
    j = json.load(open(f"{out}/short_valid_{p.replace(':', '_').replace(',', '_')}.json"))
    print(f"| `{p}` | {j['ppl']:.3f} | " + " / ".join("%.2f" % s["ppl"] for s in j["segments"]) +
          f" | {j['kv_cache']['peak_tokens']} |")
PY

# ---- 3. Q-Hitter vs H2O ---------------------------------------------------------------------------
[ -s $OUT/calib.h5 ] || $B/sq-calibrate -m $M --tokenizer $T -f $DATA/tinystories/tinystories-train-2MiB.txt --samples 128 --seq-len 256 --fisher \
  --fisher-tokens 16384 -o $OUT/calib.h5 --force -q >/dev/null
[ -s $OUT/f32_nuq3.sqm ] || $B/sq-convert -m $M --tokenizer $T --scheme f32 --kv nuq3 --calib $OUT/calib.h5 -o $OUT/f32_nuq3.sqm --force -q >/dev/null
QH_POLICIES="dense window:51 h2o:20%,recent:10%"
for l in $LAMBDAS; do QH_POLICIES="$QH_POLICIES qhitter:20%,recent:10%,lambda:$l"; done
for kv in fp32 int4 int3 nuq3; do
  for p in $QH_POLICIES; do
    if [ $kv = nuq3 ]; then
      run "$OUT/qh_${kv}_$(fname $p).json" $OUT/f32_nuq3.sqm $VALID --kv-policy "$p" -c 256 --max-tokens "$QH_TOKENS"
    else
      run "$OUT/qh_${kv}_$(fname $p).json" $M $VALID --kv-policy "$p" -c 256 --max-tokens "$QH_TOKENS" --kv $kv
    fi
  done
done
python3 - "$OUT" "$QH_POLICIES" <<'PY'
import json, sys
out, policies = sys.argv[1], sys.argv[2].split()
kvs = ["fp32", "int4", "int3", "nuq3"]
J = {(kv, p): json.load(open(f"{out}/qh_{kv}_{p.replace(':', '_').replace(',', '_').replace('%', '_')}.json")) for kv in kvs for p in policies}
j0 = J[("fp32", "dense")]
print(f"\n**Q-Hitter vs H2O**, tinystories-valid-1000 cut into {j0['protocol']['streams']} streams of "
      f"{j0['protocol']['stream_length']} tokens ({j0['tokens_scored']:,} predictions); budget 20% = "
      f"{J[('fp32', 'h2o:20%,recent:10%')]['kv_cache']['peak_tokens']} tokens, 10% recent\n")
print("| policy | " + " | ".join(f"{kv} KV" for kv in kvs) + " |")
print("|---|" + "---|" * len(kvs))
for p in policies:
    print(f"| `{J[('fp32', p)]['protocol']['kv_policy']}` | " + " | ".join("%.4f" % J[(kv, p)]["ppl"] for kv in kvs) + " |")
print("| peak KV bytes, h2o (tokens) | " + " | ".join("{:,} ({})".format(J[(kv, 'h2o:20%,recent:10%')]['kv_cache']['peak_bytes'],
      J[(kv, 'h2o:20%,recent:10%')]['kv_cache']['peak_tokens']) for kv in kvs) + " |")
print("| KV format (sq-eval) | " + " | ".join("`%s`" % J[(kv, 'dense')]['kv_cache']['format'] for kv in kvs) + " |")
PY
