#!/usr/bin/env bash
# Installs sqkit's build and test dependencies from Debian packages.
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev        # BLAS sgemm (OpenMP build: nests cleanly inside our own OpenMP regions)
  libcli11-dev nlohmann-json3-dev
  libzstd-dev libhdf5-dev libxxhash-dev libssl-dev   # libssl-dev: SHA-256 (libcrypto) for provenance hashes
  libsentencepiece-dev          # tokenizer.model
  libpcre2-dev                  # Unicode regexes of the byte-level BPE pre-tokenizers (GGUF gpt2 / tokenizer.json)
  libdnnl-dev                   # oneDNN INT8 matmul (AMX/VNNI)
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
