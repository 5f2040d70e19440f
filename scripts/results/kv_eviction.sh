#!/usr/bin/env bash
# Table 6 of docs/results.md (issue #17; H2O vs Q-Hitter on a real model): token-by-token decoding
# (sq-eval --protocol streaming, every token scored) of WikiText-2 test cut into streams of
# $STREAM tokens (default 2,048), the first $STREAMS streams (default 1), under a KV budget of 20% of
# the stream: window:(20% rounded), h2o:20%,recent:10% and qhitter:20%,recent:10%,lambda:0.5,
# with dense as the reference, each with an FP32, int4 (uniform, per token and head) and nuq3
# (KVQuant, Fisher from kvquant.sh's calibration file) KV cache. Columns: PPL per KV format.
# Usage: scripts/results/kv_eviction.sh [--model smollm2|gemma3|PATH] [OUT_DIR]
#   env: STREAM (2048), STREAMS (1), FISHER_SAMPLES (16, as in kvquant.sh)
source "$(dirname "$0")/common.sh"
STREAM=${STREAM:-2048}
STREAMS=${STREAMS:-1}
FISHER_SAMPLES=${FISHER_SAMPLES:-16}
SAMPLES=$FISHER_SAMPLES calibrate fisher --fisher --fisher-tokens $((FISHER_SAMPLES * 512))
convert f32 --scheme f32
convert nuq3 --scheme f32 --calib "$OUT/fisher.h5" --kv nuq3
POLICIES="dense window:$(((STREAM * 2 + 5) / 10)) h2o:20%,recent:10% qhitter:20%,recent:10%,lambda:0.5"
for kv in fp32 int4 nuq3; do
  for p in $POLICIES; do
    j=$OUT/evict_${kv}_$(echo "$p" | tr ':,%' '___').json
    model=$OUT/f32.sqm; args=(--kv "$kv")
    [[ $kv == nuq3 ]] && model=$OUT/nuq3.sqm args=()
    fresh "$j" "$model" && continue
    echo "== sq-eval streaming $kv $p ==" >&2
    $B/sq-eval -m "$model" -f $WIKI --protocol streaming -c "$STREAM" --max-tokens $((STREAM * STREAMS)) \
      --kv-policy "$p" "${args[@]}" -q --json "$j" --force >/dev/null
  done
done
python3 - "$OUT" "$POLICIES" <<'PY'
import json, sys
out, policies = sys.argv[1], sys.argv[2].split()
kvs = ["fp32", "int4", "nuq3"]
J = {(kv, p): json.load(open(f"{out}/evict_{kv}_{p.replace(':', '_').replace(',', '_').replace('%', '_')}.json"))
     for kv in kvs for p in policies}
j0 = J[("fp32", "dense")]
h = J[("fp32", "h2o:20%,recent:10%")]
print(f"\nWikiText-2 test, {j0['protocol']['streams']} stream(s) of {j0['protocol']['stream_length']:,} tokens decoded "
      f"token by token ({j0['tokens_scored']:,} predictions); budget 20% = {h['kv_cache']['peak_tokens']} tokens, 10% recent:\n")
print("| policy | " + " | ".join(f"PPL, {kv} KV" for kv in kvs) + " | tokens/s (fp32 KV) |")
print("|---|" + "---|" * (len(kvs) + 1))
for p in policies:
    print(f"| `{J[('fp32', p)]['protocol']['kv_policy']}` | " + " | ".join("%.4f" % J[(kv, p)]["ppl"] for kv in kvs) +
          " | %.1f |" % J[("fp32", p)]["tokens_per_second"])
print("| peak KV bytes, h2o | " + " | ".join("{:,}".format(J[(kv, 'h2o:20%,recent:10%')]['kv_cache']['peak_bytes']) for kv in kvs) + " | |")
PY
