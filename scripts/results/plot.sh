#!/usr/bin/env bash
# Draws the PPL vs bits/weight frontier of docs/results.md (issue #17) from the JSON files that the
# table scripts (scripts/results/{smoothquant,w4a16,atom}.sh) left in OUT_DIR: one point per
# recipe, x = bits per weight of the quantized linears (FP32 = 32; sq-inspect), y = WikiText-2 PPL
# under the llamacpp protocol, one colour per family (naive W8A8, SmoothQuant W8A8, W4A16 RTN,
# W4A16 GPTQ, Atom W4A4), the FP32 PPL as a line. Needs gnuplot (apt-get install gnuplot-nox).
# Points above $YMAX (default 120) are off the scale (the docs name them). $CHUNKS (default 20):
# which llamacpp runs to plot (the tables' --chunks).
# Usage: scripts/results/plot.sh OUT_DIR PNG [TITLE]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: scripts/results/plot.sh OUT_DIR PNG [TITLE]}
PNG=${2:?usage: scripts/results/plot.sh OUT_DIR PNG [TITLE]}
TITLE=${3:-$(basename "$OUT")}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 2; }
python3 - "$OUT" "${CHUNKS:-20}" <<'PY'
import glob, json, os, subprocess, sys
out, chunks = sys.argv[1], sys.argv[2]
families = [("naive", "naive W8A8"), ("sq", "SmoothQuant W8A8"), ("rtn", "W4A16 RTN"),
            ("gptq", "W4A16 GPTQ"), ("atom", "Atom W4A4")]
rows = {f: [] for f, _ in families}
fp32 = None
for j in sorted(glob.glob(os.path.join(out, f"*.llamacpp-{chunks}.json"))):
    d = json.load(open(j)); model = d["model"]["path"]; name = os.path.basename(model)[:-len(".sqm")]
    if not model.endswith(".sqm") or "kv_cache" in d and d["kv_cache"]["format"] != "fp32":
        continue
    info = json.loads(subprocess.run(["build/bin/sq-inspect", "--json", model], check=True,
                                     capture_output=True, text=True).stdout)
    bits = info.get("quantized_linear_bits_per_weight") or 32.0
    if bits == 32.0:
        fp32 = d["ppl"]; continue
    fam = next((f for f, _ in families if name.lower().startswith(f)), None)
    if fam:
        rows[fam].append((bits, d["ppl"], name))
for f, _ in families:
    with open(os.path.join(out, f"frontier_{f}.dat"), "w") as o:
        for b, p, n in sorted(rows[f]):
            o.write(f"{b:.4f} {p:.4f} {n}\n")
open(os.path.join(out, "frontier_fp32.txt"), "w").write("%.4f\n" % (fp32 or 0))
PY
FP32=$(cat "$OUT/frontier_fp32.txt")
plots=()
for fl in "naive:naive W8A8" "sq:SmoothQuant W8A8" "rtn:W4A16 RTN" "gptq:W4A16 GPTQ" "atom:Atom W4A4"; do
  f=${fl%%:*}
  [[ -s $OUT/frontier_$f.dat ]] && plots+=("'$OUT/frontier_$f.dat' using 1:2 with points pointsize 1.5 title '${fl#*:}'")
done
plots+=("$FP32 with lines dashtype 2 lc rgb 'black' title 'FP32 ($FP32)'")
gnuplot <<GP
set terminal pngcairo size 900,600 font ",11"
set output '$PNG'
set title "$TITLE: WikiText-2 PPL (llamacpp -c 512) vs bits per weight of the quantized linears"
set xlabel "bits per weight (quantized linears)"
set ylabel "PPL"
set yrange [$(python3 -c "print($FP32 * 0.9)"):${YMAX:-120}]
set xrange [3.5:9.5]
set key top right
set grid
plot $(IFS=,; echo "${plots[*]}")
GP
echo "plot.sh: wrote $PNG" >&2
