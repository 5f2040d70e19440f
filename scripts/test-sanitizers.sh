#!/usr/bin/env bash
# Sanitizer stage (docs/reliability.md): builds sqkit and its tests with AddressSanitizer +
# UndefinedBehaviorSanitizer (-DSQ_SANITIZE=ON) and runs them with leak detection on; any report
# fails the run (abort_on_error / halt_on_error).
#
#   bash scripts/test-sanitizers.sh [CTEST_ARGS...]   the whole suite (build-asan); extra arguments
#                                                       go to ctest, e.g. -R Reliability
#   bash scripts/test-sanitizers.sh --readers         only the readers of untrusted files
#                                                       (tests/sqkit_reader_tests: fuzz corpora, crash
#                                                       regressions, parser suites; build-asan-readers),
#                                                       which compiles no model code: what CI runs
#
# The CUDA backend is off here (-DSQ_WITH_CUDA=OFF): the CUDA runtime maps memory inside ASan's shadow
# gap (it needs ASAN_OPTIONS=protect_shadow_gap=0), nvcc-compiled code is not instrumented anyway, and
# CI has no GPU; this stage thereby builds and tests the no-CUDA stub (lib/cuda/cuda_stub.cpp) while
# scripts/test.sh builds the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
CONFIGURE=(-G Ninja -DSQ_SANITIZE=ON -DSQ_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSQ_BUILD_TESTS=ON)

if [ "${1:-}" = "--readers" ]; then
  [ $# -eq 1 ] || { echo "usage: bash scripts/test-sanitizers.sh --readers" >&2; exit 2; }
  # -O0 -g1: the parsers' tests take seconds, while an optimized, fully debug-annotated sanitized
  # compile takes minutes per test file (sqm_file_test.cpp: 126 s at -O2 -g, 24 s at -O0 -g1 on 2026-11-29).
  cmake -S . -B build-asan-readers "${CONFIGURE[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" >/dev/null
  cmake --build build-asan-readers -j "$(nproc)" --target sqkit_reader_tests
  # SqInspect.* (in sqm_file_test.cpp) run the sq-inspect tool, which this target does not build.
  build-asan-readers/tests/sqkit_reader_tests --gtest_brief=1 --gtest_filter='-SqInspect.*'
  exit 0
fi

cmake -S . -B build-asan "${CONFIGURE[@]}" >/dev/null
cmake --build build-asan -j "$(nproc)"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" "$@"
