# Sourced by the result-table scripts of docs/results.md (scripts/results/*.sh, issue #17): moves to
# the repository root, parses the shared options, and defines the inputs, the calibration, the
# conversions and the measurement of one table row.
#
# Shared options (before OUT_DIR):
#   --model smollm2|gemma3|PATH  the FP32 original: SmolLM2-135M (default) or Gemma 3 270M from
#                                models/ (scripts/fetch-models.sh), or any model file sqkit opens
#   --chunks N                   llamacpp protocol (-c 512): the first N chunks of WikiText-2 test
#                                (default 20 = 10,240 tokens, 5,120 scored; 0 = the whole file)
#   --windows-chunks N           windows protocol (-c 2048): the first N windows (default 3 = 6,144
#                                tokens, 6,141 scored; 0 = skip this protocol)
#   --samples N                  calibration windows of 512 tokens from the C4 sample (default 128)
#   --quick                      CI size: --chunks 2 --windows-chunks 0 --samples 16, and no separate
#                                speed run (tokens/s then includes the reference model)
#   --hellaswag N                a HellaSwag column: accuracy ± standard error on the first N tasks
#                                of ../shared/data/hellaswag/hellaswag_val_full.txt in file order
#                                (sq-eval --task hellaswag, llama.cpp's scoring; issue 40 asks for
#                                1000); default 0 = no column
# Environment: SPEED_RUNS=N  measure each row's tokens/s N times and keep the fastest (default 1;
#                            0 = no separate speed run: tokens/s of the accuracy run, which includes
#                            the reference model, as with --quick).
#              ONLY_ROWS=RE  measure only the rows whose name matches the extended regex RE (a
#                            reduced table; the others are neither converted nor measured).
#              DISCARD=1     for models whose converted files do not all fit on disk (Qwen2.5's FP32
#                            file is 7.1 GB): each file but f32.sqm is converted when its row is
#                            measured and deleted after it (sq-inspect's answer is kept in
#                            NAME.inspect.json); a rerun reconverts only rows whose results are stale.
# OUT_DIR defaults to build/results/MODEL; everything measured there is reused when newer than its
# model file, so an interrupted run resumes and the tables of one model share one calibration.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
MODEL=smollm2 CHUNKS=20 WCHUNKS=3 SAMPLES=128 QUICK=0 HS_TASKS=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --chunks) CHUNKS=$2; shift 2 ;;
    --windows-chunks) WCHUNKS=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --quick) CHUNKS=2 WCHUNKS=0 SAMPLES=16 QUICK=1; shift ;;
    --hellaswag) HS_TASKS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^[^#]/p' "${BASH_SOURCE[1]}" | grep '^#' | cut -c3-
               sed -n '/^# Shared options/,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | cut -c3-; exit 0 ;;
    -*) echo "$(basename "${BASH_SOURCE[1]}"): unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
MODELS=${SQKIT_MODELS:-models}
case $MODEL in
  smollm2) M=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf FETCH=smollm2-135m ;;
  gemma3)  M=$MODELS/gemma-3-270m-q4_k_m.gguf FETCH=gemma3-270m ;;
  *)       M=$MODEL FETCH="" ;;
esac
[[ -e $M ]] || { echo "$(basename "${BASH_SOURCE[1]}"): $M is missing${FETCH:+; run: bash scripts/fetch-models.sh $FETCH}" >&2; exit 2; }
OUT=${1:-build/results/$(basename "$MODEL" | sed 's/\.[^.]*$//')}
mkdir -p "$OUT"
DATA=../shared/data
C4=$DATA/c4/c4-sample-1480.txt
WIKI=$DATA/wikitext2/wiki.test.raw
HELLASWAG=$DATA/hellaswag/hellaswag_val_full.txt
B=build/bin
# The protocols every row is measured under: "NAME CTX CHUNKS".
PROTOCOLS=("llamacpp 512 $CHUNKS")
[[ $WCHUNKS != 0 ]] && PROTOCOLS+=("windows 2048 $WCHUNKS")

# fresh FILE DEP: true when FILE exists and is newer than DEP (a measurement to reuse).
fresh() { [[ -s $1 && $1 -nt $2 ]]; }

# calibrate NAME [sq-calibrate args...]: $OUT/NAME.h5 from $SAMPLES x 512 tokens of the C4 sample
# (seed 42); made once.
calibrate() {
  local o=$OUT/$1.h5; shift
  fresh "$o" "$M" && return 0
  echo "== sq-calibrate $(basename "$o"): $SAMPLES x 512 C4 tokens $* ==" >&2
  $B/sq-calibrate -m "$M" -f $C4 --samples "$SAMPLES" --seq-len 512 "$@" -o "$o" --force -q
}

# convert NAME [sq-convert args...]: $OUT/NAME.sqm from the original model; made once. With
# DISCARD=1 (and NAME other than f32) only remembered: `row` converts it when it needs the file.
declare -A DEFERRED=()
convert() {
  local o=$OUT/$1.sqm name=$1; shift
  if [[ ${DISCARD:-0} == 1 && $name != f32 ]]; then DEFERRED[$o]=$(printf '%q ' "$@"); return 0; fi
  fresh "$o" "$M" && return 0
  echo "== sq-convert $(basename "$o"): $* ==" >&2
  $B/sq-convert -m "$M" "$@" -o "$o" --force -q >/dev/null
}

# materialize FILE SLUG: converts a deferred FILE (DISCARD=1) unless every result of its row is
# already there; true when the row must be measured from FILE.
materialize() {
  local file=$1 slug=$2 pc proto chunks stale=0
  [[ -n ${DEFERRED[$file]:-} ]] || return 0
  for pc in "${PROTOCOLS[@]}"; do
    read -r proto _ chunks <<<"$pc"
    [[ -s $OUT/$slug.$proto-${chunks/#0/all}.json && -s $OUT/$slug.inspect.json ]] || stale=1
  done
  [[ $HS_TASKS != 0 && ! -s $OUT/$slug.hellaswag-$HS_TASKS.json ]] && stale=1
  ((stale)) || return 0
  [[ -s $file ]] && return 0
  echo "== sq-convert $(basename "$file"): ${DEFERRED[$file]} ==" >&2
  eval "$B/sq-convert -m \"\$M\" ${DEFERRED[$file]} -o \"\$file\" --force -q" >/dev/null
}

# measure NAME FILE PROTOCOL CTX CHUNKS [sq-eval args...]: evaluates FILE on WikiText-2 against the
# original (--reference-model) into $OUT/NAME.PROTOCOL-CHUNKS.json (CHUNKS 0: "all"), and its speed alone (no reference; the
# first 4 llamacpp chunks; the fastest of $SPEED_RUNS runs, default 1) into $OUT/NAME.speed.json (with --quick: a link to
# the first).
measure() {
  local name=$1 file=$2 proto=$3 ctx=$4 chunks=$5; shift 5
  local j=$OUT/$name.$proto-${chunks/#0/all}.json s=$OUT/$name.speed.json
  local c=(); [[ $chunks != 0 ]] && c=(--chunks "$chunks")
  fresh "$j" "$file" || $B/sq-eval -m "$file" -f $WIKI --protocol "$proto" -c "$ctx" "${c[@]}" \
    --reference-model "$M" -q --json "$j" --force "$@" >/dev/null
  [[ $QUICK == 1 || ${SPEED_RUNS:-1} == 0 ]] && { ln -sf "$(basename "$j")" "$s"; return 0; }
  fresh "$s" "$file" && return 0
  # SPEED_RUNS (default 1) runs, the fastest kept: 4 chunks take 2-3 s, so one run is easily
  # disturbed (another process, the kernel writing back a large file).
  local r run=${s%.json}.run.json
  for ((r = 0; r < ${SPEED_RUNS:-1}; r++)); do
    $B/sq-eval -m "$file" -f $WIKI --protocol llamacpp -c 512 --chunks 4 -q --json "$run" --force "$@" >/dev/null
    # the first run replaces any stale $s; a later one only when faster than the kept run
    ((r == 0)) || python3 -c 'import json, sys; t = lambda p: json.load(open(p))["tokens_per_second"]
sys.exit(t(sys.argv[1]) <= t(sys.argv[2]))' "$run" "$s" && mv "$run" "$s"
  done
  rm -f "$run"
}

# task_accuracy NAME FILE [sq-eval args...]: HellaSwag accuracy of FILE on the first $HS_TASKS tasks
# (file order) into $OUT/NAME.hellaswag-$HS_TASKS.json; measured once (no reference model: the column
# is each row's own accuracy).
task_accuracy() {
  local name=$1 file=$2; shift 2
  local j=$OUT/$name.hellaswag-$HS_TASKS.json
  fresh "$j" "$file" && return 0
  $B/sq-eval -m "$file" --task hellaswag "$HELLASWAG" --tasks "$HS_TASKS" --task-order file -q --json "$j" --force "$@" >/dev/null
}

# table_header TITLE EXTRA_COLUMNS...: a Markdown table head with the standard columns.
table_header() {
  local title=$1; shift
  local hs=(); [[ $HS_TASKS != 0 ]] && hs=("HellaSwag acc ($HS_TASKS tasks)")
  local cols=("$title" PPL ΔPPL "KLD (mean ± se)" "KLD p99" "top-1 %" "$@" "${hs[@]}" "tokens/s")
  local IFS='|'; echo "|${cols[*]}|" | sed 's/|/ | /g; s/^ //; s/ $//'
  printf '|'; for _ in "${cols[@]}"; do printf -- '---|'; done; echo
}

# row NAME FILE [sq-eval args...]: measures FILE under every protocol of $PROTOCOLS and appends its
# row to $OUT/rows.PROTOCOL.md (printed by print_tables). Extra columns: $ROW_COLUMNS, a list of
# scripts/results/row.py column names (bpw, lbpw, bytes, kv, dprev).
ROW_COLUMNS=${ROW_COLUMNS:-lbpw bpw bytes}
row() {
  local name=$1 file=$2; shift 2
  local pc proto ctx chunks hs=()
  [[ -z ${ONLY_ROWS:-} || $name =~ $ONLY_ROWS ]] || return 0
  local slug; slug=$(echo "$name" | tr -c 'A-Za-z0-9.\n' '_')
  materialize "$file" "$slug"
  if [[ $HS_TASKS != 0 ]]; then
    task_accuracy "$slug" "$file" "$@"
    hs=(--hellaswag "$OUT/$slug.hellaswag-$HS_TASKS.json")
  fi
  for pc in "${PROTOCOLS[@]}"; do
    read -r proto ctx chunks <<<"$pc"
    measure "$slug" "$file" "$proto" "$ctx" "$chunks" "$@"
    python3 scripts/results/row.py --name "$name" --json "$OUT/$slug.$proto-${chunks/#0/all}.json" --speed "$OUT/$slug.speed.json" \
      --model "$file" --inspect-cache "$OUT/$slug.inspect.json" --columns $ROW_COLUMNS "${hs[@]}" \
      --state "$OUT/rows.$proto.state" | tee -a "$OUT/rows.$proto.md" >&2
  done
  [[ -n ${DEFERRED[$file]:-} ]] && rm -f "$file"
  return 0
}

# begin_table: forgets the rows of the previous table.
begin_table() { local pc; for pc in "${PROTOCOLS[@]}"; do read -r proto _ <<<"$pc"; : > "$OUT/rows.$proto.md"; rm -f "$OUT/rows.$proto.state"; done; }

# llamacpp_base: llama.cpp's side of a frontier table ($LLAMA_CPP_BIN: a build directory with
# llama-quantize, llama-imatrix and llama-perplexity, built by hand as docs/benchmarks.md says):
# $P/F32.gguf re-quantized from the original, its KL-divergence base $P/F32.kld on the first $CHUNKS
# chunks, and the table head. P=$OUT/llamacpp.
llamacpp_base() {
  L=$LLAMA_CPP_BIN P=$OUT/llamacpp
  mkdir -p "$P"
  [[ -s $P/F32.gguf ]] || "$L/llama-quantize" --allow-requantize "$M" "$P/F32.gguf" F32 >"$P/F32.log" 2>&1
  [[ -s $P/F32.kld ]] || "$L/llama-perplexity" -m "$P/F32.gguf" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t 2 \
    --kl-divergence-base "$P/F32.kld" >"$P/F32.ppl.log" 2>&1
  echo
  echo "llama.cpp (\`llama-perplexity -c 512 --chunks $CHUNKS --kl-divergence\`, same tokens), base: F32 of $(basename "$M"):"
  echo
  echo "| llama.cpp file | PPL | KLD (mean ± se) | KLD p99 | top-1 % | file bits/w | file bytes |"
  echo "|---|---|---|---|---|---|---|"
}

# llamacpp_row TYPE [imatrix]: $P/TYPE[-imatrix].gguf quantized from F32.gguf (with $P/imatrix.gguf,
# which the caller makes), its KLD against the base, and its table row (after llamacpp_base).
llamacpp_row() {
  local t=$1 im=${2:-}
  local f=$P/$t${im:+-$im}.gguf
  [[ -s $f ]] || "$L/llama-quantize" ${im:+--imatrix "$P/imatrix.gguf"} "$P/F32.gguf" "$f" "$t" >"${f%.gguf}.q.log" 2>&1
  [[ -s ${f%.gguf}.kld.log ]] || "$L/llama-perplexity" -m "$f" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t 2 \
    --kl-divergence-base "$P/F32.kld" --kl-divergence >"${f%.gguf}.kld.log" 2>&1
  python3 scripts/results/llamacpp_row.py --name "$t${im:+ + imatrix}" --log "${f%.gguf}.kld.log" --model "$f"
}

# print_tables TITLE EXTRA_COLUMN_TITLES...: prints one Markdown table per protocol, from the rows.
print_tables() {
  local pc proto ctx chunks
  for pc in "${PROTOCOLS[@]}"; do
    read -r proto ctx chunks <<<"$pc"
    echo
    echo "WikiText-2 test, \`--protocol $proto -c $ctx\`, $([[ $chunks == 0 ]] && echo "whole file" || echo "first $chunks chunks"); reference: $(basename "$M") (FP32):"
    echo
    table_header "$@"
    cat "$OUT/rows.$proto.md"
  done
}
