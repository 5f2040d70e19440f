#!/usr/bin/env bash
# Builds sqkit and runs the whole test suite (GoogleTest via CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh -DSQ_BUILD_TESTS=ON
ctest --test-dir build --output-on-failure -j "$(nproc)"
