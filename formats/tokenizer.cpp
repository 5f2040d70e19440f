// Tokenizer::decode and format detection for load_tokenizer.
#include "formats/tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "formats/llama2c_tokenizer.h"
#include "formats/mapped_file.h"
#include "formats/sentencepiece_tokenizer.h"

namespace sq {

std::string Tokenizer::decode(const std::vector<int>& tokens) const {
  std::string out;
  int prev = bos_id();  // so the dummy-prefix space of the first piece is dropped
  for (int t : tokens) {
    out += decode_token(prev, t);
    prev = t;
  }
  return out;
}

namespace {

/// Largest max_token_length we take as evidence of a llama2.c file (real ones are 7..~50).
constexpr int32_t kMaxPlausibleTokenLength = 1 << 16;

std::string hex_prefix(const uint8_t* data, size_t size) {
  std::string s;
  for (size_t i = 0; i < size && i < 8; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%s%02X", i ? " " : "", data[i]);
    s += buf;
  }
  return s;
}

}  // namespace

// Detection:
//  * a llama2.c tokenizer.bin starts with int32 max_token_length, a small positive number;
//  * a SentencePiece ModelProto starts with field 1 (`pieces`), tag byte 0x0A, then the varint
//    length of the first piece message, whose own first byte is again a non-zero tag. Its first
//    four bytes read as an int32 are therefore never a small positive number, except for
//    degenerate messages.
// The two overlap only when max_token_length is 10 (first byte 0x0A); then both parsers are tried,
// llama2.c first (it checks the exact end of the file, so a protobuf practically never passes).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  auto file = MappedFile::open(path);  // InputError "cannot open PATH: reason"
  return load_tokenizer_from_bytes(file->data(), file->size(), path);
}

std::unique_ptr<Tokenizer> load_tokenizer_from_bytes(const uint8_t* data, size_t size, const std::string& path) {
  if (size == 0) throw InputError(path + ": empty file, expected a tokenizer (tokenizer.model or tokenizer.bin)");

  int32_t first = 0;
  if (size >= 4) std::memcpy(&first, data, 4);
  const bool maybe_llama2c = size >= 4 && first >= 1 && first <= kMaxPlausibleTokenLength;
  const bool maybe_sentencepiece = data[0] == 0x0A;

  if (maybe_llama2c && !maybe_sentencepiece) return std::make_unique<Llama2cTokenizer>(data, size, path);
  if (maybe_sentencepiece && !maybe_llama2c) return std::make_unique<SentencePieceTokenizer>(std::string(reinterpret_cast<const char*>(data), size), path);
  if (maybe_llama2c && maybe_sentencepiece) {
    std::string llama2c_error;
    try {
      return std::make_unique<Llama2cTokenizer>(data, size, path);
    } catch (const InputError& e) {
      llama2c_error = e.what();
    }
    try {
      return std::make_unique<SentencePieceTokenizer>(std::string(reinterpret_cast<const char*>(data), size), path);
    } catch (const InputError& e) {
      throw InputError(path + ": not a tokenizer: parsing as a llama2.c tokenizer.bin failed (" + llama2c_error +
                       ") and as a SentencePiece tokenizer.model failed (" + e.what() + ")");
    }
  }
  throw InputError(path + ": not a tokenizer: it starts with bytes " + hex_prefix(data, size) +
                   ", but a SentencePiece tokenizer.model starts with 0A (protobuf field 1) and a llama2.c "
                   "tokenizer.bin with a small positive int32 max_token_length");
}

}  // namespace sq
