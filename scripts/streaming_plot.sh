#!/usr/bin/env bash
# Draws docs/streaming_ppl.png (StreamingLLM Figure 3 / thesis Figure 4.1 on stories260K): PPL per
# segment vs stream position for dense, window:256, sink:S,window:256-S and recompute:256, one panel
# per text (top) and the cumulative PPL relative to recompute:256 (bottom; dense leaves the
# scale), from the JSON files scripts/streaming_table.sh left in OUT_DIR. Needs gnuplot
# (apt-get install gnuplot-nox); builds and runs nothing else.
# Usage: scripts/streaming_plot.sh OUT_DIR [PNG]   (default PNG: docs/streaming_ppl.png)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/streaming_plot.sh OUT_DIR [PNG]}
PNG=${2:-docs/streaming_ppl.png}
POLICIES="dense window:256 sink:1,window:255 sink:4,window:252 recompute:256"
fname() { echo "$1" | tr ':,%' '___'; }
for text in valid wap; do
  for p in $POLICIES; do
    python3 - "$OUT/long_${text}_$(fname $p).json" "$OUT/long_${text}_recompute_256.json" \
      > "$OUT/plot_${text}_$(fname $p).dat" <<'PY'
import json, math, sys
j, r = (json.load(open(f)) for f in sys.argv[1:3])
nll = nll_r = n = 0
# columns: segment midpoint, segment PPL, cumulative PPL up to the segment's end relative to recompute (%)
for s, sr in zip(j["segments"], r["segments"]):
    nll += math.log(s["ppl"]) * s["tokens"]; nll_r += math.log(sr["ppl"]) * sr["tokens"]; n += s["tokens"]
    print(s["first"] + s["tokens"] / j["protocol"]["streams"] / 2, s["ppl"], (math.exp((nll - nll_r) / n) - 1) * 100)
PY
  done
done
plots() {  # text column
  local sep="" s=""
  for p in $POLICIES; do
    s="$s$sep'$OUT/plot_${1}_$(fname $p).dat' using 1:$2 with lines lw 1.5 title '$p'"
    sep=", "
  done
  echo "$s"
}
gnuplot <<GP
set terminal png size 1000,720 font ',9'
set output '$PNG'
set multiplot layout 2,2
set logscale x
set xrange [64:20000]
set xlabel 'stream position (tokens, log scale)'
set grid
set key top left
set arrow 1 from 512, graph 0 to 512, graph 1 nohead dashtype 2 lc rgb 'gray'
set logscale y
set ylabel 'PPL of the 128-token segment (log scale)'
set title 'stories260K, tinystories-valid-1000 (concatenated), one stream'
set yrange [2:5000]
plot $(plots valid 2)
set title 'stories260K, war-and-peace, one stream'
set yrange [10:5000]
plot $(plots wap 2)
unset logscale y
set ylabel 'cumulative PPL vs recompute:256 (%)'
set title 'same runs: PPL of positions 0..t relative to recompute:256'
set yrange [-3:4]
set key top left
plot $(plots valid 3)
plot $(plots wap 3)
unset multiplot
GP
echo "wrote $PNG ($(stat -c %s "$PNG") bytes)"
