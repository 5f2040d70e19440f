#!/usr/bin/env bash
# Issues #7 and #41 on a lent GPU machine, step 2 of 2 — run THERE (device tool, carry [".gpu"]),
# after scripts/gpu_bundle.sh here. Two device calls cover the acceptance checks (issue 41: at most
# three calls and 12 minutes in all, start-up included, leaving one call to rerun after a fix); each
# stage bounds its steps with `timeout` and writes its logs to $OUT (the device tool returns that
# folder), default .gpu/out:
#   cuda-tests  machine facts; every Cuda* test (ops, linears, KV cache, stories260K models, the 14
#               tiny architectures through the generic CudaDecoder, eval/tools); compute-sanitizer
#               memcheck and racecheck on the short device cases                    (~5 min budget)
#   bench       sq-bench cuda-gemm and cuda-kv-decode; sq-eval CPU vs CUDA PPL (FP32, W8A8, W4A16,
#               nuq4 KV) on stories260K                                             (~5 min budget)
# Optional, beyond the budget: sanitize (synccheck, initcheck), suite (the whole suite in 16 shards).
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD
OUT=${OUT:-$HERE/.gpu/out}
mkdir -p "$OUT"
X=$HERE/.gpu/x   # the unpacked bundle: build-gpu/, lib/, data/, paths.env
if [ ! -x "$X/build-gpu/tests/sqkit_tests" ]; then
  # tar -J needs the xz program; Python's lzma module unpacks it where xz is missing.
  mkdir -p "$X" && { tar -C "$X" -xJf .gpu/bundle.tar.xz 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu/bundle.tar.xz "$X"; }
fi
[ -e build-gpu ] || ln -s "$X/build-gpu" build-gpu
# shellcheck disable=SC1091
. "$X/paths.env"   # ROOT, DATA: the development machine's paths compiled into the tests
mkdir -p "$(dirname "$ROOT")" "$(dirname "$DATA")"
[ -e "$ROOT" ] || ln -s "$HERE" "$ROOT"   # the repository (tests read tests/fuzz/regressions there)
[ -e "$DATA" ] || ln -s "$X/data" "$DATA"
CUDA_LIBS=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$X/lib:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
B=$ROOT/build-gpu/bin
T=$ROOT/build-gpu/tests/sqkit_tests
M=$DATA/stories260K/stories260K.bin
TOK=$DATA/stories260K/tok512.bin
VALID=$DATA/tinystories/tinystories-valid-1000.txt

case "${1:-cuda-tests}" in
  cuda-tests)
    { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep -E 'Model name|Flags' | cut -c1-400;
      grep PRETTY /etc/os-release; ldd --version | head -1; echo "CUDA libs: $CUDA_LIBS"; ldd "$T" | grep -i 'not found'; } \
      > "$OUT/machine.txt" 2>&1
    cat "$OUT/machine.txt"
    timeout 240 "$T" --gtest_filter='*Cuda*' 2>&1 | tee "$OUT/cuda_tests.txt" | grep -E '^\[  (FAILED|PASSED|SKIPPED) |measured|Failure' | tail -80
    # Short device cases: every op, linear and KV-cache kernel and the architectures' decoder flow.
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$T" \
      --gtest_filter='*CudaOps*:*CudaDecoderOps*:*CudaLinear*:*CudaKVCache*:*CudaArchitecture.*' > "$OUT/cuda_memcheck.txt" 2>&1
    echo "compute-sanitizer memcheck exit $?"; tail -25 "$OUT/cuda_memcheck.txt"
    # Shared-memory races in the kernels that use shared memory (reductions, attention, KV encode/decode).
    timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$T" --gtest_filter='*CudaOps*:*CudaDecoderOps*:*CudaKVCache*' \
      > "$OUT/cuda_racecheck.txt" 2>&1
    echo "compute-sanitizer racecheck exit $?"; tail -8 "$OUT/cuda_racecheck.txt"
    ;;
  sanitize)
    # Shared-memory races and barrier misuse in the kernels (racecheck, synccheck) and reads of
    # uninitialized device memory (initcheck), on the device tests.
    for tool in synccheck initcheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 "$T" --gtest_filter='CudaOps*:CudaLinear*:CudaKVCache*' \
        > "$OUT/cuda_$tool.txt" 2>&1
      echo "compute-sanitizer $tool exit $?"; tail -8 "$OUT/cuda_$tool.txt"
    done
    ;;
  suite)
    N=16
    for i in $(seq 0 $((N - 1))); do
      GTEST_TOTAL_SHARDS=$N GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=1 "$T" > "$OUT/suite_shard_$i.txt" 2>&1 &
    done
    wait
    cat "$OUT"/suite_shard_*.txt > "$OUT/suite.txt"; rm -f "$OUT"/suite_shard_*.txt
    grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/suite.txt" | sort | uniq -c | sort -rn | head -60
    grep -c '^\[       OK \]' "$OUT/suite.txt"
    ;;
  bench)
    "$B/sq-bench" --suite cuda-gemm --json "$OUT/bench_cuda_gemm.json" --force 2>&1 | tee "$OUT/bench_cuda_gemm.txt" | tail -40
    "$B/sq-bench" --suite cuda-kv-decode --json "$OUT/bench_cuda_kv.json" --force 2>&1 | tee "$OUT/bench_cuda_kv.txt" | tail -30
    W=$OUT/w8a8; mkdir -p "$W"
    "$B/sq-calibrate" -m "$M" --tokenizer "$TOK" -f "$DATA/tinystories/tinystories-train-2MiB.txt" --samples 128 --seq-len 256 \
      --fisher -o "$W/calib.h5" --force -q > "$W/log.txt" 2>&1
    "$B/sq-convert" -m "$M" --tokenizer "$TOK" --calib "$W/calib.h5" --alpha 0.5 --preset O1 -o "$W/w8a8.sqm" --force -q >> "$W/log.txt" 2>&1
    "$B/sq-convert" -m "$M" --tokenizer "$TOK" --calib "$W/calib.h5" --scheme w4a16 --group-size 32 -o "$W/w4a16.sqm" --force -q >> "$W/log.txt" 2>&1
    "$B/sq-convert" -m "$M" --tokenizer "$TOK" --calib "$W/calib.h5" --scheme f32 --kv nuq4 -o "$W/nuq4.sqm" --force -q >> "$W/log.txt" 2>&1
    tail -5 "$W/log.txt"
    for model in "$M" "$W/w8a8.sqm" "$W/w4a16.sqm" "$W/nuq4.sqm"; do
      for dev in cpu cuda; do
        name=$(basename "$model" | sed 's/\..*//')_$dev
        "$B/sq-eval" -m "$model" --tokenizer "$TOK" -f "$VALID" -c 256 --protocol windows -q --device $dev \
          --json "$OUT/ppl_$name.json" --force > "$OUT/ppl_$name.txt" 2>&1 || echo "sq-eval $name failed: $(tail -1 "$OUT/ppl_$name.txt")"
      done
    done
    python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
for cpu in sorted(glob.glob(os.path.join(out, "ppl_*_cpu.json"))):
    gpu = cpu.replace("_cpu.json", "_cuda.json")
    if not os.path.exists(gpu):
        print(f"{os.path.basename(cpu)}: no CUDA result"); continue
    a, b = json.load(open(cpu)), json.load(open(gpu))
    print(f"{os.path.basename(cpu)[4:-9]:>12}: CPU {a['ppl']:.4f} ({a['tokens_per_second']:.0f} tok/s)  "
          f"CUDA {b['ppl']:.4f} ({b['tokens_per_second']:.0f} tok/s)  rel diff {abs(b['ppl'] / a['ppl'] - 1):.2e}  {b.get('device', '')}")
PY
    ;;
  *) echo "usage: scripts/gpu_check.sh cuda-tests|sanitize|suite|bench" >&2; exit 2 ;;
esac
