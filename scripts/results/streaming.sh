#!/usr/bin/env bash
# Table 5 of docs/results.md (issue #17; StreamingLLM on a real model): one stream of $TOKENS tokens
# (default 20,000, more than twice SmolLM2's 8,192-token training context) of each text in $TEXTS,
# streamed (sq-eval --protocol streaming, every prediction scored, FP32 model and KV) in blocks of
# $BATCH tokens (default 256; sq-eval -b: each query sees exactly the rows and positions of
# token-by-token decoding, the same PPL up to FP32 rounding, docs/protocols.md; BATCH=1 decodes
# token by token, 20–30× slower) under dense, window:W, sink:S,window:W−S for S = 1, 2, 4, 8 (W = $WINDOW, default 1,024 tokens
# attended), and the sliding window with re-computation as the quality baseline:
# recompute:W,stride:W/8 and recompute:256,stride:32 (docs/protocols.md: each prediction sees
# W − K + 1 … W tokens; per-token recompute decoding is derived as tokens/s ÷ K).
# Texts: wap = War and Peace, wiki = WikiText-2 test (the concatenated articles).
# Decode speed, side by side (run them alone on the machine): sink:4,window:W−4 token by token (-b 1)
# vs recompute:W,stride:W/8 over the first $SPEED_TOKENS tokens (default 4,096) of the first text,
# each run twice, the faster kept (per-token recompute = its tokens/s ÷ W/8).
# Prints the table (PPL overall and per position band, vs recompute) and the speed line, and draws the PPL by
# stream position (1,024-token bins) into $PNG (default OUT_DIR/streaming_ppl.png) when gnuplot is
# installed. The --chunks, --windows-chunks and --samples options do not apply.
# Usage: scripts/results/streaming.sh [--model smollm2|gemma3|PATH] [OUT_DIR]
#   env: TOKENS (20000; Gemma 3 needs 65536, twice its training context), SPEED_TOKENS (4096; 0 = no
#        speed runs),
#        WINDOW (1024), SEGMENT (256), BATCH (256), TEXTS ("wap wiki"), PNG,
#        POLICIES (the subset of the list above to run and tabulate; it must hold dense and
#        recompute:W,stride:W/8)
source "$(dirname "$0")/common.sh"
TOKENS=${TOKENS:-20000}
WINDOW=${WINDOW:-1024}
SEGMENT=${SEGMENT:-256}
BATCH=${BATCH:-256}
TEXTS=${TEXTS:-"wap wiki"}
SPEED_TOKENS=${SPEED_TOKENS:-4096}
PNG=${PNG:-$OUT/streaming_ppl.png}
ALL="sink:4,window:$((WINDOW - 4)) window:$WINDOW recompute:$WINDOW,stride:$((WINDOW / 8)) recompute:256,stride:32"
ALL="$ALL sink:1,window:$((WINDOW - 1)) sink:2,window:$((WINDOW - 2)) sink:8,window:$((WINDOW - 8)) dense"
POLICIES=${POLICIES:-$ALL}
for p in $POLICIES; do
  [[ " $ALL " == *" $p "* ]] || { echo "streaming.sh: POLICIES: '$p' is not one of: $ALL" >&2; exit 2; }
done
for p in dense recompute:$WINDOW,stride:$((WINDOW / 8)); do
  [[ " $POLICIES " == *" $p "* ]] || { echo "streaming.sh: POLICIES must include $p" >&2; exit 2; }
done
# text_file NAME: the file of a text name
text_file() {
  case $1 in
    wap) echo "$DATA/longtext/war-and-peace.txt" ;;
    wiki) echo "$WIKI" ;;
    *) echo "streaming.sh: unknown text '$1' (expected wap or wiki)" >&2; exit 2 ;;
  esac
}
convert f32 --scheme f32
for text in $TEXTS; do
  f=$(text_file "$text")
  for p in $POLICIES; do
    j=$OUT/stream_$text-${TOKENS}_$(echo "$p" | tr ':,%' '___').json
    fresh "$j" "$OUT/f32.sqm" && continue
    echo "== sq-eval streaming $text $p ($(date +%T)) ==" >&2
    b=$BATCH; [[ $p == recompute* ]] && b=1  # recompute runs its own prefills
    $B/sq-eval -m "$OUT/f32.sqm" -f "$f" --protocol streaming --max-tokens "$TOKENS" --segment "$SEGMENT" \
      --kv-policy "$p" -b "$b" -q --json "$j" --force >/dev/null
  done
done
set -- $TEXTS
SPEED=(sink:4,window:$((WINDOW - 4)) recompute:$WINDOW,stride:$((WINDOW / 8)))
[[ $SPEED_TOKENS == 0 ]] && SPEED=()  # SPEED_TOKENS=0: no speed runs (e.g. while sharing the machine)
for p in "${SPEED[@]}"; do
  for r in 1 2; do
    j=$OUT/stream_speed_$1-${SPEED_TOKENS}_$(echo "$p" | tr ':,%' '___').$r.json
    fresh "$j" "$OUT/f32.sqm" && continue
    echo "== sq-eval streaming speed $1 $p, run $r ==" >&2
    $B/sq-eval -m "$OUT/f32.sqm" -f "$(text_file "$1")" --protocol streaming --max-tokens "$SPEED_TOKENS" \
      --segment "$SPEED_TOKENS" --kv-policy "$p" -q --json "$j" --force >/dev/null
  done
done
TRAIN=$($B/sq-inspect --json "$OUT/f32.sqm" | python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["model_config"]["max_seq_len"])')
python3 - "$OUT" "$TOKENS" "$WINDOW" "$TRAIN" "$POLICIES" "$SPEED_TOKENS" $TEXTS <<'PY'
import json, math, sys
out, tokens, W, train, policies, speed_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), int(sys.argv[6])
texts = sys.argv[7:]
order = [p for p in policies if p == "dense"] + [p for p in policies if p.startswith("window")] + \
        sorted((p for p in policies if p.startswith("sink")), key=lambda p: int(p.split(",")[0][5:])) + \
        [p for p in policies if p.startswith("recompute")]
names = {"wap": "War and Peace", "wiki": "WikiText-2 test (concatenated articles)"}
def load(text, p):
    return json.load(open(f"{out}/stream_{text}-{tokens}_{p.replace(':', '_').replace(',', '_').replace('%', '_')}.json"))
def band(j, lo, hi):  # PPL of the predictions at stream positions [lo, hi) (segment-aligned)
    nll = n = 0
    for s in j["segments"]:
        if lo <= s["first"] < hi:
            nll += math.log(s["ppl"]) * s["tokens"]; n += s["tokens"]
    return math.exp(nll / n) if n else float("nan")
rec = f"recompute:{W},stride:{W // 8}"
for text in texts:
    J = {p: load(text, p) for p in order}
    n = J["dense"]["tokens_scored"] + 1
    edges = [e for e in (0, W, 4096, 8192, 12288, 16384, 32768, 49152) if e < n] + [n]
    print(f"\n**{names[text]}**, the first {n:,} tokens as one stream ({n - 1:,} predictions), FP32 weights and KV; "
          f"training context {train:,} tokens:\n")
    print("| policy | tokens attended | PPL (all) | " + " | ".join(f"[{a:,}, {b:,})" for a, b in zip(edges, edges[1:])) +
          f" | vs `{rec}` (all / last band) |")
    print("|---|---|---|" + "---|" * (len(edges) - 1) + "---|")
    r = J[rec]
    for p in order:
        j = J[p]
        bands = [band(j, a, b) for a, b in zip(edges, edges[1:])]
        k = int(p.split("stride:")[1]) if "stride:" in p else 1
        att = j["kv_cache"]["peak_tokens"]
        att = f"{att - k + 1:,} – {att:,}" if k > 1 else f"{att:,}"
        print(f"| `{p}` | {att} | {j['ppl']:.3f} | " + " | ".join("%.3f" % b for b in bands) +
              f" | {(j['ppl'] / r['ppl'] - 1) * 100:+.1f}% / {(bands[-1] / band(r, edges[-2], edges[-1]) - 1) * 100:+.1f}% |")
    # PPL by position, 1,024-token bins, for the plot
    for p in order:
        j = J[p]
        with open(f"{out}/stream_{text}_{p.replace(':', '_').replace(',', '_')}.dat", "w") as f:
            for lo in range(0, n - 1, 1024):
                f.write(f"{lo + 512} {band(j, lo, lo + 1024)}\n")
# decode speed, side by side
sink, re_ = f"sink:4,window:{W - 4}", f"recompute:{W},stride:{W // 8}"
if speed_tokens == 0:
    print("\nDecode speed: not measured (SPEED_TOKENS=0).")
    sys.exit(0)
def speed_runs(p):
    return [json.load(open(f"{out}/stream_speed_{texts[0]}-{speed_tokens}_{p.replace(':', '_').replace(',', '_')}.{r}.json")) for r in (1, 2)]
s_tps, r_tps = (max(j["tokens_per_second"] for j in speed_runs(p)) for p in (sink, re_))
threads = sorted({j["threads"] for p in (sink, re_) for j in speed_runs(p)})
print(f"\nDecode speed over the first {speed_tokens:,} tokens of {names[texts[0]]} (best of 2 runs each, "
      f"{'/'.join(map(str, threads))} thread(s)): "
      f"`{sink}` {s_tps:.1f} tokens/s; `{re_}` {r_tps:.1f} tokens/s, so per-token `recompute:{W}` ≈ {r_tps / (W // 8):.2f} "
      f"tokens/s: StreamingLLM decodes {s_tps / (r_tps / (W // 8)):.0f}× faster.")
PY
if command -v gnuplot >/dev/null; then
  plots() {  # TEXT: one line per policy
    local s="" sep="" p
    for p in dense window:$WINDOW sink:1,window:$((WINDOW - 1)) sink:4,window:$((WINDOW - 4)) recompute:$WINDOW,stride:$((WINDOW / 8)); do
      [[ " $POLICIES " == *" $p "* ]] || continue
      s="$s$sep'$OUT/stream_${1}_$(echo "$p" | tr ':,' '__').dat' using 1:2 with linespoints pt 7 ps 0.5 lw 1.5 title '$p'"
      sep=", "
    done
    echo "$s"
  }
  set -- $TEXTS
  gnuplot <<GP
set terminal png size 1000,$((380 * $#)) font ',9' noenhanced
set output '$PNG'
set multiplot layout $#,1
set logscale y
set grid
set key top left
set xlabel 'stream position (tokens)'
set ylabel 'PPL of the 1,024-token bin (log scale)'
set xrange [0:$TOKENS]
set arrow 1 from $TRAIN, graph 0 to $TRAIN, graph 1 nohead dashtype 2 lc rgb 'gray'
$(for t in $TEXTS; do echo "set title '$(basename "$M"), $t: one stream, FP32 KV; dashed: training context'"; echo "plot $(plots "$t")"; done)
unset multiplot
GP
  echo "wrote $PNG" >&2
fi
