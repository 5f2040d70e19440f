#!/usr/bin/env bash
# Fuzzing stage (docs/reliability.md, "Fuzzing"): builds the libFuzzer targets of tests/fuzz with
# clang (-DSQ_FUZZ=ON: libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer, leak detection on)
# into ./build-fuzz, writes the seed corpora (generated seeds + links to the real files of
# ../shared/data, used in place), and runs each target in turn, one process each, until it has
# done RUNS executions or run SECONDS seconds, whichever comes first. Prints one summary line per
# target; exits 1 if any target found a crash, leak or sanitizer report (the reproducer is left in
# build-fuzz/fuzz-artifacts/<target>/; copy it to tests/fuzz/regressions/<target>/ with the fix).
#
# usage: scripts/fuzz.sh [-r RUNS] [-t SECONDS] [-j BUILD_JOBS] [TARGET...]
#   defaults: RUNS=1000000, SECONDS=600, all targets (safetensors hf_config safetensors_index
#   llama2c_checkpoint llama2c_tokenizer sqm_file calibration convert_spec gguf bpe_text spm_text
#   tokenizer_json gguf_tokenizer token_ids)
# Needs clang and libclang-rt (Debian: apt-get install clang libclang-rt-14-dev libomp-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1000000
seconds=600
jobs=2
while getopts "r:t:j:" opt; do
  case "$opt" in
    r) runs=$OPTARG ;;
    t) seconds=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) sed -n 2,13p "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors hf_config safetensors_index llama2c_checkpoint llama2c_tokenizer
                                    sqm_file calibration convert_spec gguf bpe_text spm_text tokenizer_json
                                    gguf_tokenizer token_ids)

# Longest input per target: enough for every structure of the format with small tensors, small
# enough to keep executions fast (the real stories260K.bin seed is read truncated to its header).
max_len() {
  case "$1" in
    llama2c_checkpoint) echo 16384 ;;
    llama2c_tokenizer) echo 16384 ;;
    sqm_file) echo 16384 ;;
    calibration) echo 8192 ;;
    convert_spec) echo 256 ;;
    *) echo 8192 ;;
  esac
}

build=build-fuzz
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSQ_WITH_CUDA=OFF \
  -DSQ_FUZZ=ON -DSQ_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz
rm -rf "$build/fuzz-seeds"
"$build/fuzz/sq-fuzz-seeds" "$build/fuzz-seeds" ../shared/data >/dev/null

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
summary=()
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t"
  artifacts="$build/fuzz-artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus" "$build/fuzz-seeds/$t")
  [ -d "tests/fuzz/regressions/$t" ] && dirs+=("tests/fuzz/regressions/$t")
  log="$build/fuzz-artifacts/$t.log"
  rc=0
  "$build/fuzz/${t}_fuzz" -runs="$runs" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' || true)
  secs=${secs:-?}  # no "Done" line: the target stopped early (a finding)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  files=$(find "$corpus" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    result="ok"
  else
    result="FAILED (exit $rc; see $log and $artifacts/)"
    status=1
  fi
  line=$(printf "%-20s execs %9s  seconds %5s  exec/s %7s  cov %5s  corpus %5s  %s" "$t" "$execs" "$secs" \
    "$( [ "$secs" != "?" ] && [ "$secs" -gt 0 ] && echo $((execs / secs)) || echo "?")" "$cov" "$files" "$result")
  echo "$line"
  summary+=("$line")
done
echo "---- fuzz summary (runs=$runs, max_total_time=${seconds}s)"
printf '%s\n' "${summary[@]}"
exit "$status"
