# Sourced by the table scripts (scripts/*_table.sh): moves to the repository root and defines the
# shared inputs, the output folder ($1 of the script, else a fresh temporary folder), the tools, and
# helpers that print a model's windows-protocol PPL (-c 256, all of tinystories-valid-1000) and
# bits per weight.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/.."
DATA=../shared/data
M=$DATA/stories260K/stories260K.bin
T=$DATA/stories260K/tok512.bin
TRAIN=$DATA/tinystories/tinystories-train-2MiB.txt
VALID=$DATA/tinystories/tinystories-valid-1000.txt
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
B=build/bin
# ppl MODEL [sq-eval args...]: prints the PPL (4 decimals); the JSON is left in MODEL.json.
ppl() { local m=$1; shift; $B/sq-eval -m "$m" -f $VALID -c 256 -q --json "$m.json" --force "$@" >/dev/null
        python3 -c "import json,sys; print('%.4f' % json.load(open(sys.argv[1]))['ppl'])" "$m.json"; }
# bpw MODEL: the whole file's bits per weight (sq-inspect).
bpw() { $B/sq-inspect --json "$1" | python3 -c "import json,sys; print('%.2f' % json.load(sys.stdin)['bits_per_weight'])"; }
# calibrate OUT.h5 [sq-calibrate args...]: 128 windows x 256 tokens of tinystories-train-2MiB.
calibrate() { local o=$1; shift; $B/sq-calibrate -m $M --tokenizer $T -f $TRAIN --samples 128 --seq-len 256 "$@" -o "$o" --force -q >/dev/null; }
