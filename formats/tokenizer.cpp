// Tokenizer::decode and format detection for load_tokenizer.
#include "formats/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/bpe_tokenizer.h"
#include "formats/gguf_file.h"
#include "formats/gguf_tokenizer.h"
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

std::vector<int> Tokenizer::encode_special(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<std::pair<std::string, int>> specials = special_token_texts();
  // Longest first, so "<|im_start|>" wins over a shorter token that is its prefix.
  std::stable_sort(specials.begin(), specials.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::vector<std::vector<size_t>> by_first_byte(256);
  for (size_t k = 0; k < specials.size(); ++k)
    if (!specials[k].first.empty()) by_first_byte[static_cast<uint8_t>(specials[k].first[0])].push_back(k);
  std::vector<int> ids = encode("", add_bos, false);  // just BOS, with encode()'s checks
  size_t start = 0;
  auto flush = [&](size_t end) {
    if (end > start) {
      const std::vector<int> piece = encode(text.substr(start, end - start), false, false);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
  };
  for (size_t i = 0; i < text.size();) {
    int match = -1;
    for (size_t k : by_first_byte[static_cast<uint8_t>(text[i])])
      if (text.compare(i, specials[k].first.size(), specials[k].first) == 0) {
        match = static_cast<int>(k);
        break;  // longest first
      }
    if (match < 0) {
      ++i;
      continue;
    }
    flush(i);
    ids.push_back(specials[size_t(match)].second);
    i += specials[size_t(match)].first.size();
    start = i;
  }
  flush(text.size());
  if (add_eos) {
    const std::vector<int> eos = encode("", false, true);
    ids.insert(ids.end(), eos.begin(), eos.end());
  }
  return ids;
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
//  * a GGUF file (model or sq-convert's metadata-only tokenizer GGUF) starts with "GGUF";
//  * a Hugging Face tokenizer.json starts with '{' (after optional whitespace).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const auto dir = std::filesystem::path(path);
    for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
      if (std::filesystem::exists(dir / name, ec)) return load_tokenizer((dir / name).string());
    }
    throw InputError(path + ": directory has neither tokenizer.model nor tokenizer.json");
  }
  auto file = MappedFile::open(path);  // InputError "cannot open PATH: reason"
  if (file->size() >= 4 && std::memcmp(file->data(), "GGUF", 4) == 0) return load_gguf_tokenizer(GgufFile(file));
  return load_tokenizer_from_bytes(file->data(), file->size(), path);
}

std::unique_ptr<Tokenizer> load_tokenizer_from_bytes(const uint8_t* data, size_t size, const std::string& path) {
  if (size == 0) throw InputError(path + ": empty file, expected a tokenizer (tokenizer.model, tokenizer.json, tokenizer.bin or GGUF)");
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) return load_gguf_tokenizer(GgufFile(MappedFile::from_bytes(data, size, path)));
  int32_t lead = 0;
  if (size >= 4) std::memcpy(&lead, data, 4);
  if (!(size >= 4 && lead >= 1 && lead <= kMaxPlausibleTokenLength)) {  // "{\n  \"" etc. read as a huge int32
    size_t i = 0;
    while (i < size && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t')) ++i;
    if (i < size && data[i] == '{') {
      const std::string_view text(reinterpret_cast<const char*>(data), size);
      return std::make_unique<BpeTokenizer>(bpe_vocabulary_from_hf_json(text, path), path);
    }
  }

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
                   ", but a SentencePiece tokenizer.model starts with 0A (protobuf field 1), a llama2.c "
                   "tokenizer.bin with a small positive int32 max_token_length, a GGUF file with \"GGUF\" and a "
                   "tokenizer.json with '{'");
}

}  // namespace sq
