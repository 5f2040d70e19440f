#!/usr/bin/env bash
# Issues #7 and #41 on a lent GPU machine, step 1 of 2 — run HERE, on the development machine.
#
# The GPU machines (docs/cuda.md, "Running on a GPU") have nvcc, CMake and ninja but none of our
# Debian libraries and no package registry, and the device tool sends only the working tree (not
# ../shared/data). So this script builds sqkit for the GPU into build-gpu/ (Release, CUDA for sm_90 =
# H100/H200, host code for AVX-512 + VNNI instead of -march=native, since the GPU host's CPU is not
# this one) and packs into .gpu/bundle.tar.xz (ignored by git): the tools, the test binary, the
# shared libraries they load except glibc's and the CUDA toolkit's (the GPU image has those), and the
# real test data. Then call the device tool with carry [".gpu"] and run scripts/gpu_check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DATA=$(cd "${SQ_DATA:-../shared/data}" && pwd)
ARCH_FLAGS="-march=x86-64-v4 -mavx512vnni"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSQ_BUILD_TESTS=ON -DSQ_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSQ_NATIVE=OFF -DCMAKE_C_FLAGS="$ARCH_FLAGS" -DCMAKE_CXX_FLAGS="$ARCH_FLAGS" >/dev/null
cmake --build build-gpu -j "$(nproc)"

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/build-gpu/bin" "$STAGE/build-gpu/tests" "$STAGE/lib" "$STAGE/data"
cp build-gpu/bin/sq-* "$STAGE/build-gpu/bin/"
cp build-gpu/tests/sqkit_tests "$STAGE/build-gpu/tests/"
# Shared libraries: everything ldd resolves except the C library family and CUDA's own libraries.
for f in "$STAGE"/build-gpu/bin/* "$STAGE/build-gpu/tests/sqkit_tests"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas[^/]*|libcublasLt|libnvidia[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
for d in stories260K tinystories llama2-tokenizer wikitext2 longtext; do cp -r "$DATA/$d" "$STAGE/data/"; done
# The 14 tiny architectures of the CudaArchitecture tests (9 MB); the real GGUF models (94 and 241
# MiB) do not fit the device tool's 64 MiB carry, so real-model perplexity on the GPU is not bundled.
mkdir -p "$STAGE/data/reference" && cp -r "$DATA/reference/hf-tiny" "$STAGE/data/reference/"
# Where the binaries expect things (absolute paths compiled into the tests): recorded for gpu_check.sh.
printf 'ROOT=%s\nDATA=%s\n' "$ROOT" "$DATA" > "$STAGE/paths.env"
mkdir -p .gpu
# Symbols are not needed there; xz packs these binaries into about half of what gzip does (measured
# 2026-11-30 on the equivalent host build: 34.8 MB vs 67.0 MB), which keeps the bundle under the
# device tool's 64 MiB carry with the tiny architectures in it.
strip --strip-unneeded "$STAGE"/build-gpu/bin/* "$STAGE/build-gpu/tests/sqkit_tests"
rm -f .gpu/bundle.tar.gz
tar -C "$STAGE" -cJf .gpu/bundle.tar.xz .
ls -la .gpu/bundle.tar.xz
# The device tool carries at most 64 MiB per call.
[ "$(stat -c %s .gpu/bundle.tar.xz)" -lt $((62 * 1024 * 1024)) ] || { echo "gpu_bundle: bundle over 62 MiB: the device tool will not carry it" >&2; exit 1; }
echo "next: device run with carry [\".gpu\"] and command 'bash scripts/gpu_check.sh STAGE' (STAGE: cuda-tests, then bench; optional: sanitize | suite)"
