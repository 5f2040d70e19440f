#!/usr/bin/env bash
# The main job on the shipped example (../shared/data): installs dependencies, builds, and runs
# stories260K end to end: perplexity on TinyStories and a greedy generation.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=../shared/data
bash scripts/install-deps.sh
bash scripts/build.sh
echo "== sq-eval: stories260K on tinystories-valid-1000.txt (windows protocol, ctx 256) =="
build/bin/sq-eval -m $DATA/stories260K/stories260K.bin --tokenizer $DATA/stories260K/tok512.bin \
  -f $DATA/tinystories/tinystories-valid-1000.txt -c 256 --protocol windows
echo "== sq-run: greedy generation =="
build/bin/sq-run -m $DATA/stories260K/stories260K.bin --tokenizer $DATA/stories260K/tok512.bin \
  -p "Once upon a time" -n 40 --temp 0
