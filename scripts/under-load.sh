#!/usr/bin/env bash
# Issue 38's measurement: SmolLM2-135M with BUSY competing busy loops (python3 "while True: pass"),
# -t 1 against the default -t (the cores available; the thread governor on), ROUNDS rounds
# interleaved (-t 1, then -t default, per workload), and llama.cpp's llama-bench on the same files'
# types under the same load when LLAMA_CPP_BIN names its build directory (bin/ with llama-bench and
# llama-quantize; built by hand as docs/benchmarks.md says). Prints a Markdown table: the mean of the
# rounds for each workload and thread count, and their ratio. docs/benchmarks.md, "Under load".
# Usage: [LLAMA_CPP_BIN=DIR] [SQKIT_MODELS=DIR] scripts/under-load.sh [--busy N] [--rounds R] [OUT_DIR]
#   --busy N     competing busy processes (default 1; 0 = quiet)
#   --rounds R   rounds (default 2)
#   --extra      the other tools' long steps instead: streaming evaluation (sq-eval --protocol
#                streaming --max-tokens 256 --kv-policy sink:4,window:252), sq-calibrate --fisher (4 × 512),
#                sq-convert --alpha auto (W8A8), --clip search (W4A4) and the nuq4 k-means (--kv nuq4)
# Environment: SQ_ADAPTIVE_THREADS=0 measures without the thread governor.
# Workloads: sq-run decode (FP32; W8A8 per-channel SmoothQuant α 0.5 with the LM head FP32 and INT8;
# W4A16 g32 with the calibration's importance and the INT8 head, the whole file as Q4_0 + Q8_0
# head), 96 greedy tokens after "Once upon a time"; FP32 prefill (sq-eval --protocol llamacpp -c 512
# --chunks 4); sq-calibrate --hessian (8 × 512 C4 tokens); sequential GPTQ (sq-convert --gptq
# --gptq-hessians sequential, g128, with that calibration); HellaSwag (sq-eval --task hellaswag,
# 40 tasks, FP32). Everything it makes goes to OUT_DIR (default build/under-load).
set -euo pipefail
cd "$(dirname "$0")/.."
BUSY=1 ROUNDS=2 EXTRA=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --extra) EXTRA=1; shift ;;
    --busy) BUSY=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | cut -c3-; exit 0 ;;
    -*) echo "under-load.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
OUT=${1:-build/under-load}
mkdir -p "$OUT"
B=build/bin
M=${SQKIT_MODELS:-models}/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -e $M ]] || { echo "under-load.sh: $M is missing; run: bash scripts/fetch-models.sh smollm2-135m" >&2; exit 2; }
DATA=../shared/data
C4=$DATA/c4/c4-sample-1480.txt WIKI=$DATA/wikitext2/wiki.test.raw HS=$DATA/hellaswag/hellaswag_val_full.txt

# The files, made once (quiet, before any load starts).
[[ -s $OUT/cal8.h5 ]] || $B/sq-calibrate -m "$M" -f $C4 --samples 8 --seq-len 512 --hessian -o "$OUT/cal8.h5" -q --force >/dev/null
W8=(--scheme w8a8 --calib "$OUT/cal8.h5" --alpha 0.5 --weight per-channel --act per-token --rotate none --no-gptq)
[[ -s $OUT/w8a8.sqm ]] || $B/sq-convert -m "$M" "${W8[@]}" --no-quantize-head -o "$OUT/w8a8.sqm" -q --force >/dev/null
[[ -s $OUT/w8a8h.sqm ]] || $B/sq-convert -m "$M" "${W8[@]}" --quantize-head -o "$OUT/w8a8h.sqm" -q --force >/dev/null
[[ -s $OUT/w4a16.sqm ]] || $B/sq-convert -m "$M" --scheme w4a16 --group-size 32 --calib "$OUT/cal8.h5" -o "$OUT/w4a16.sqm" -q --force >/dev/null
[[ $EXTRA == 0 || -s $OUT/calF.h5 ]] ||
  $B/sq-calibrate -m "$M" -f $C4 --samples 4 --seq-len 512 --fisher -o "$OUT/calF.h5" -q --force >/dev/null
L=${LLAMA_CPP_BIN:-}
if [[ -n $L ]]; then
  [[ -s $OUT/F32.gguf ]] || "$L/llama-quantize" --allow-requantize "$M" "$OUT/F32.gguf" F32 >"$OUT/F32.q.log" 2>&1
  for q in Q8_0 Q4_0; do [[ -s $OUT/$q.gguf ]] || "$L/llama-quantize" "$OUT/F32.gguf" "$OUT/$q.gguf" $q >"$OUT/$q.q.log" 2>&1; done
fi

PIDS=()
stop_load() { ((${#PIDS[@]})) && kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap stop_load EXIT
for ((i = 0; i < BUSY; i++)); do timeout 3600 python3 -c "while True: pass" & PIDS+=($!); done
sleep 2

now() { date +%s.%N; }
# Each measure prints one number: tokens/s (higher is better) or seconds (lower is better).
decode() {  # FILE THREADS
  $B/sq-run -m "$1" -p "Once upon a time" -n 96 --temp 0 --ignore-eos ${2:+-t $2} 2>&1 >/dev/null |
    sed -n 's/.*generated [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p'
}
prefill() {  # THREADS
  $B/sq-eval -m "$M" -f $WIKI --protocol llamacpp -c 512 --chunks 4 ${1:+-t $1} -q --json "$OUT/pf.json" --force >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$OUT/pf.json"
}
calibrate() {  # THREADS
  local t0; t0=$(now)
  $B/sq-calibrate -m "$M" -f $C4 --samples 8 --seq-len 512 --hessian -o "$OUT/cal-run.h5" -q --force ${1:+-t $1} >/dev/null
  echo "$(now) - $t0" | bc
}
gptq() {  # THREADS
  local t0; t0=$(now)
  $B/sq-convert -m "$M" --scheme w4a16 --gptq --gptq-hessians sequential --calib "$OUT/cal8.h5" -o "$OUT/gptq-run.sqm" -q --force ${1:+-t $1} >/dev/null
  echo "$(now) - $t0" | bc
}
hellaswag() {  # THREADS
  $B/sq-eval -m "$M" --task hellaswag $HS --tasks 40 --task-order file ${1:+-t $1} -q --json "$OUT/hs.json" --force >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$OUT/hs.json"
}
seconds() {  # COMMAND...: its wall time in seconds (its output discarded)
  local t0; t0=$(now)
  "$@" >/dev/null
  echo "$(now) - $t0" | bc
}
streaming() {  # THREADS
  $B/sq-eval -m "$M" -f $WIKI --protocol streaming --max-tokens 256 --kv-policy sink:4,window:252 ${1:+-t $1} -q --json "$OUT/st.json" --force >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$OUT/st.json"
}
fisher() { seconds $B/sq-calibrate -m "$M" -f $C4 --samples 4 --seq-len 512 --fisher -o "$OUT/calF-run.h5" -q --force ${1:+-t $1}; }
alpha_auto() { seconds $B/sq-convert -m "$M" --scheme w8a8 --calib "$OUT/cal8.h5" --alpha auto --rotate none --no-gptq -o "$OUT/auto-run.sqm" -q --force ${1:+-t $1}; }
clip_search() { seconds $B/sq-convert -m "$M" --scheme w4a4-atom --calib "$OUT/cal8.h5" --clip search -o "$OUT/clip-run.sqm" -q --force ${1:+-t $1}; }
kmeans() { seconds $B/sq-convert -m "$M" --scheme f32 --calib "$OUT/calF.h5" --kv nuq4 -o "$OUT/nuq-run.sqm" -q --force ${1:+-t $1}; }
llama() {  # FILE
  "$L/llama-bench" -m "$1" -p 0 -n 64 -r 2 -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

declare -A SUM
ROWS=("FP32 decode|tok/s|decode $M" "W8A8 decode, LM head FP32|tok/s|decode $OUT/w8a8.sqm"
      "W8A8 decode, LM head INT8|tok/s|decode $OUT/w8a8h.sqm" "W4A16 g32 decode, INT8 head|tok/s|decode $OUT/w4a16.sqm"
      "FP32 prefill, sq-eval -c 512|tok/s|prefill" "HellaSwag, 40 tasks|tok/s|hellaswag"
      "sq-calibrate --hessian, 8 × 512|s|calibrate" "sequential GPTQ, sq-convert --gptq|s|gptq")
[[ $EXTRA == 1 ]] && ROWS=("streaming, sink:4,window:252, 256 tokens|tok/s|streaming" "sq-calibrate --fisher, 4 × 512|s|fisher"
      "sq-convert --alpha auto (W8A8)|s|alpha_auto" "sq-convert --clip search (W4A4)|s|clip_search" "sq-convert --kv nuq4 (k-means)|s|kmeans")
for ((r = 0; r < ROUNDS; r++)); do
  for row in "${ROWS[@]}"; do
    IFS='|' read -r name unit cmd <<<"$row"
    for t in 1 default; do
      arg=$([[ $t == 1 ]] && echo 1 || echo "")
      v=$($cmd $arg)
      [[ -n $v ]] || { echo "under-load.sh: no figure from '$cmd' (-t $t)" >&2; exit 1; }
      SUM[$name|$t]=$(echo "${SUM[$name|$t]:-0} + $v" | bc -l)
      echo "round $((r + 1)) $name -t $t: $v $unit" >&2
    done
  done
  if [[ -n $L && $EXTRA == 0 ]]; then
    for q in F32 Q8_0 Q4_0; do
      v=$(llama "$OUT/$q.gguf"); SUM[llama|$q]=$(echo "${SUM[llama|$q]:-0} + $v" | bc -l)
      echo "round $((r + 1)) llama-bench $q: $v tok/s" >&2
    done
  fi
done
stop_load

mean() { printf '%.3g' "$(echo "${SUM[$1]} / $ROUNDS" | bc -l)"; }
echo "SmolLM2-135M, $BUSY busy process(es), $(nproc) cores, $ROUNDS round(s), mean; governor ${SQ_ADAPTIVE_THREADS:-on}:"
echo
echo "| workload | -t 1 | -t default | default / 1 (speed) |"
echo "|---|---|---|---|"
for row in "${ROWS[@]}"; do
  IFS='|' read -r name unit _ <<<"$row"
  a=$(mean "$name|1") b=$(mean "$name|default")
  ratio=$(if [[ $unit == s ]]; then echo "$a / $b"; else echo "$b / $a"; fi | bc -l)
  printf '| %s | %s %s | %s %s | %.2f |\n' "$name" "$a" "$unit" "$b" "$unit" "$ratio"
done
if [[ -n $L && $EXTRA == 0 ]]; then
  echo
  echo "llama.cpp llama-bench -p 0 -n 64 -r 2, default threads: F32 $(mean 'llama|F32'), Q8_0 $(mean 'llama|Q8_0'), Q4_0 $(mean 'llama|Q4_0') tok/s"
fi
