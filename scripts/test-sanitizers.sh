#!/usr/bin/env bash
# Sanitizer stage (docs/reliability.md): builds sqkit and its tests with AddressSanitizer +
# UndefinedBehaviorSanitizer (-DSQ_SANITIZE=ON) into ./build-asan and runs the whole suite with leak
# detection on; any report fails the run (abort_on_error / halt_on_error). Extra arguments go to ctest.
# The CUDA backend is off here (-DSQ_WITH_CUDA=OFF): the CUDA runtime maps memory inside ASan's shadow
# gap (it needs ASAN_OPTIONS=protect_shadow_gap=0), nvcc-compiled code is not instrumented anyway, and
# CI has no GPU; this stage thereby builds and tests the no-CUDA stub (lib/cuda/cuda_stub.cpp) while
# scripts/test.sh builds the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DSQ_SANITIZE=ON -DSQ_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSQ_BUILD_TESTS=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" "$@"
