#!/usr/bin/env bash
# Results regression stage (issue #17; CI runs it from .ci/run): a reduced table 1 of docs/results.md
# on SmolLM2-135M (scripts/results/smoothquant.sh --quick: 16 x 512 C4 calibration windows, the
# first 2 WikiText-2 chunks at llamacpp -c 512, every row against the FP32 model with
# --reference-model), then scripts/results/check_quick.py:
#   - the FP32 row against itself: KLD exactly 0 (mean, p99, max), top-1 agreement exactly 1, PPL
#     equal to the reference's;
#   - every quantized row: finite PPL, KLD > 0, top-1 agreement in (0, 1);
#   - every row's PPL and mean KLD equal to scripts/results/quick-expected.json (the figures of this
#     CPU class: AVX-512 or AVX2 only) within the
#     tolerances written there (why: see that file), so a change that moves any recipe shows;
#   - the quality gates: sq-eval --max-kld below / above the measured KLD exits 3 / 0.
# Usage: bash scripts/test-results.sh [--record]   (needs build/bin and scripts/fetch-models.sh
#        smollm2-135m; --record rewrites quick-expected.json from this run instead of checking)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${SQ_BUILD_DIR:-build}/results-quick
rm -rf "$OUT"
bash scripts/results/smoothquant.sh --quick "$OUT" > "$OUT.md" 2>"$OUT.log" || { cat "$OUT.log" >&2; exit 1; }
cat "$OUT.md"
python3 scripts/results/check_quick.py "$OUT" scripts/results/quick-expected.json "$@"
