// The fuzz entry points of every sqkit reader, as plain functions.
//
// Each libFuzzer target tests/fuzz/<name>_fuzz.cpp is one line calling the function below of the
// same name; the GoogleTest tests/fuzz/fuzz_corpus_test.cpp calls the same functions over the seed
// corpora and tests/fuzz/regressions/<name>/ (so CI re-checks them with gcc, without clang).
//
// Contract of every entry point: it feeds `size` bytes at `data` to one reader through the reader's
// own byte-buffer entry point (MappedFile::from_bytes, parse_*_text, ...), exercises the result,
// and returns normally for every input the reader accepts or rejects properly. A proper rejection
// is a typed sqkit exception (sq::InputError for files, sq::UsageError for option specs) whose
// message names the input (kFuzzSource...). Anything else — another exception type, a message that
// does not name the input, a property of an accepted input that does not hold — escapes as an
// exception (FuzzFinding or the original one), which libFuzzer reports as a crash; memory errors,
// leaks and undefined behaviour are reported by the sanitizers of the fuzz build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sq::fuzz {

/// Thrown by an entry point when an input breaks the contract above (a finding).
class FuzzFinding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// safetensors file (8-byte length, JSON header, data): SafetensorsFile, then load_f32 of every
/// F32/F16/BF16 tensor.
void safetensors(const uint8_t* data, size_t size);
/// HF config.json text: parse_hf_config_text; an accepted config must survive
/// make_hf_config_json -> parse_hf_config unchanged.
void hf_config(const uint8_t* data, size_t size);
/// model.safetensors.index.json text: parse_safetensors_index.
void safetensors_index(const uint8_t* data, size_t size);
/// llama2.c checkpoint (legacy or version 1): load_llama2c_checkpoint, then every tensor is read.
void llama2c_checkpoint(const uint8_t* data, size_t size);
/// llama2.c tokenizer.bin: Llama2cTokenizer, then encode / decode a fixed text and the input's tail.
void llama2c_tokenizer(const uint8_t* data, size_t size);
/// .sqm packed model: SqmFile::open (no checksum pass), then raw() and verify_checksum() of every
/// tensor. When reserved preamble byte 80 is zero (as the writer leaves it), the entry point first
/// recomputes the header, table and preamble checksums the input's preamble points at, so that
/// mutations reach the JSON header and tensor table instead of stopping at a checksum; a non-zero
/// byte 80 feeds the bytes unchanged (checksum paths).
void sqm_file(const uint8_t* data, size_t size);
/// The calibration file's validation layer (calibration_layer_count,
/// check_calibration_channel_stats, check_calibration_layer), on statistics decoded from the
/// bytes by decode_calibration below — not libhdf5's parsing of HDF5 bytes.
void calibration(const uint8_t* data, size_t size);
/// sq-convert's --scheme/--alpha/--no-smooth/--preset/--weight/--act spec: parse_convert_flags.
/// Byte 0: bit 0 = --alpha given, bit 1 = --no-smooth; the rest: the fields scheme, alpha,
/// preset, weight, act separated by '\n'.
void convert_spec(const uint8_t* data, size_t size);
/// GGUF file (v2 / v3): GgufFile (MappedFile::from_bytes), then every metadata value is walked and
/// every typed getter called on every key (each returns or throws an InputError naming the input
/// and the key, quoted with control bytes replaced); every tensor info must be consistent with the
/// file, and every tensor of a dequantizable type is dequantized whole and its second half of rows
/// alone, which must agree bit for bit.
void gguf(const uint8_t* data, size_t size);

/// Byte-level BPE encode: byte 0 picks the pre-tokenizer (gpt-2, smollm, llama-bpe, qwen2) of a
/// small fixed vocabulary read from GGUF metadata (all 256 byte-level characters, a few merges, a
/// control (id 264) and a user-defined token (id 265)); the rest is the text (any bytes, invalid UTF-8 included).
/// Every id must be in range and neither the control nor the user-defined one, and
/// decode(encode(text)) must equal the text.
void bpe_text(const uint8_t* data, size_t size);
/// SentencePiece-from-GGUF encode: a small fixed "llama" vocabulary (byte pieces, scored pieces, a
/// user-defined and a control piece; add_space_prefix from bit 0 of byte 0); the rest is the text.
/// Every id must be in range and not the control piece; for valid UTF-8 text without NUL bytes,
/// decode(encode(text)) must equal the text.
void spm_text(const uint8_t* data, size_t size);
/// Hugging Face tokenizer.json bytes: load_tokenizer_from_bytes (bpe_vocabulary_from_hf_json +
/// BpeTokenizer), then encode / decode of a fixed text and of the input's tail.
void tokenizer_json(const uint8_t* data, size_t size);
/// GGUF tokenizer metadata: load_tokenizer_from_bytes of the bytes as a GGUF file (gpt2 or llama
/// vocabularies built from tokenizer.ggml.*), then encode / decode of a fixed text.
void gguf_tokenizer(const uint8_t* data, size_t size);
/// Token ids file (`--token-ids`): parse_token_ids of bytes 1.. with the vocabulary 4·byte 0 (0 =
/// none). Accepted ids must be non-empty, in range, and round-trip through both formats (whitespace
/// and JSON array) unchanged.
void token_ids(const uint8_t* data, size_t size);

/// One fuzz target: its name (= tests/fuzz/<name>_fuzz.cpp, tests/fuzz/regressions/<name>/), entry
/// point, generated seeds and real seed files (paths relative to the shared data directory).
struct FuzzTarget {
  const char* name;
  void (*run)(const uint8_t* data, size_t size);
  std::vector<std::string> (*generated_seeds)();
  std::vector<std::string> shared_seed_files;
};

/// Every fuzz target, in a fixed order.
const std::vector<FuzzTarget>& fuzz_targets();

/// Runs `target` on the bytes of `input` (convenience for tests).
void run_on(const FuzzTarget& target, const std::string& input);

}  // namespace sq::fuzz
