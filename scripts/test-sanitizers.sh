#!/usr/bin/env bash
# Sanitizer stage (docs/reliability.md): builds sqkit and its tests with AddressSanitizer +
# UndefinedBehaviorSanitizer (-DSQ_SANITIZE=ON) into ./build-asan and runs the whole suite with leak
# detection on; any report fails the run (abort_on_error / halt_on_error). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DSQ_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSQ_BUILD_TESTS=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" "$@"
