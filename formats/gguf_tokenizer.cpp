#include "formats/gguf_tokenizer.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/gguf_writer.h"
#include "formats/llama2c_tokenizer.h"
#include "formats/mapped_file.h"
#include "formats/sentencepiece_tokenizer.h"

namespace sq {

namespace {

constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kTypes = "tokenizer.ggml.token_type";
constexpr const char* kScores = "tokenizer.ggml.scores";
constexpr const char* kMerges = "tokenizer.ggml.merges";

/// Token types of `file` (all Normal when the key is absent); 0 (llama.cpp's "undefined") reads as
/// Normal. Throws InputError naming the key for a length mismatch or a value outside 0..6.
std::vector<TokenType> read_types(const GgufFile& file, size_t n) {
  std::vector<TokenType> types(n, TokenType::Normal);
  if (!file.has(kTypes)) return types;
  const std::vector<int32_t> raw = file.get_i32_array(kTypes);
  if (raw.size() != n) {
    throw InputError(file.path() + ": " + kTypes + " has " + std::to_string(raw.size()) + " entries but " + kTokens + " has " +
                     std::to_string(n));
  }
  for (size_t i = 0; i < n; ++i) {
    if (raw[i] < 0 || raw[i] > 6) {
      throw InputError(file.path() + ": " + kTypes + "[" + std::to_string(i) + "] = " + std::to_string(raw[i]) +
                       ", expected a token type 0..6");
    }
    if (raw[i] != 0) types[i] = static_cast<TokenType>(raw[i]);
  }
  return types;
}

/// Optional id key: `dflt` when absent; InputError naming the key when outside [0, n) (or -1 when
/// `allow_none`).
int read_id(const GgufFile& file, const std::string& key, int dflt, size_t n) {
  if (!file.has(key)) return dflt;
  const int64_t id = file.get_i64(key);
  if (id < 0 || static_cast<uint64_t>(id) >= n) {
    throw InputError(file.path() + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(n) + ")");
  }
  return static_cast<int>(id);
}

bool read_bool(const GgufFile& file, const std::string& key, bool dflt) { return file.has(key) ? file.get_bool(key) : dflt; }

std::vector<std::string> read_tokens(const GgufFile& file) {
  std::vector<std::string> tokens = file.get_string_array(kTokens);  // InputError naming the key
  if (tokens.empty()) throw InputError(file.path() + ": " + kTokens + " is empty");
  if (tokens.size() > (1u << 24)) {
    throw InputError(file.path() + ": " + kTokens + " has " + std::to_string(tokens.size()) + " entries, more than 16777216");
  }
  return tokens;
}

// ---- protobuf wire format (https://protobuf.dev/programming-guides/encoding/) ----
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void field_varint(std::string& out, int field, uint64_t v) {
  varint(out, static_cast<uint64_t>(field) << 3);
  varint(out, v);
}
void field_bytes(std::string& out, int field, std::string_view v) {
  varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  varint(out, v.size());
  out.append(v);
}
void field_float(std::string& out, int field, float v) {
  varint(out, (static_cast<uint64_t>(field) << 3) | 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

std::string replace_spaces(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ') {
      out += "\xE2\x96\x81";
    } else {
      out += c;
    }
  }
  return out;
}

bool is_gguf(const uint8_t* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

}  // namespace

BpeVocabulary bpe_vocabulary_from_gguf(const GgufFile& file) {
  BpeVocabulary v;
  v.tokens = read_tokens(file);
  const size_t n = v.tokens.size();
  v.types = read_types(file, n);
  const std::vector<std::string> merges = file.get_string_array(kMerges);  // InputError naming the key when missing
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      throw InputError(file.path() + ": " + kMerges + "[" + std::to_string(i) + "] is not \"LEFT RIGHT\" (two tokens and a space)");
    }
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  const std::string pre = file.has("tokenizer.ggml.pre") ? file.get_string("tokenizer.ggml.pre") : "gpt-2";
  v.pre_regexes = bpe_pre_tokenizer_regexes(pre, file.path());
  v.bos = read_id(file, "tokenizer.ggml.bos_token_id", -1, n);
  v.eos = read_id(file, "tokenizer.ggml.eos_token_id", -1, n);
  v.unk = read_id(file, "tokenizer.ggml.unknown_token_id", -1, n);
  v.add_bos = read_bool(file, "tokenizer.ggml.add_bos_token", false) && v.bos >= 0;
  v.add_eos = read_bool(file, "tokenizer.ggml.add_eos_token", false) && v.eos >= 0;
  return v;
}

std::string sentencepiece_proto_from_gguf(const GgufFile& file, bool* newline_split_ok) {
  const std::vector<std::string> tokens = read_tokens(file);
  const size_t n = tokens.size();
  std::vector<TokenType> types = read_types(file, n);
  std::vector<float> scores(n, 0.0f);
  if (file.has(kScores)) {
    scores = file.get_f32_array(kScores);
    if (scores.size() != n) {
      throw InputError(file.path() + ": " + kScores + " has " + std::to_string(scores.size()) + " entries but " + kTokens +
                       " has " + std::to_string(n));
    }
  }
  int unk = read_id(file, "tokenizer.ggml.unknown_token_id", -1, n);
  if (unk < 0) {
    for (size_t i = 0; i < n && unk < 0; ++i) {
      if (types[i] == TokenType::Unknown) unk = static_cast<int>(i);
    }
    for (size_t i = 0; i < n && unk < 0; ++i) {
      if (tokens[i] == "<unk>") unk = static_cast<int>(i);
    }
  }
  if (unk < 0) throw InputError(file.path() + ": the vocabulary has no unknown token (tokenizer.ggml.unknown_token_id absent, no token of type 2)");
  types[unk] = TokenType::Unknown;
  if (newline_split_ok) {
    bool newline_piece = false, only_newlines = true;
    for (size_t i = 0; i < n; ++i) {
      if (types[i] != TokenType::UserDefined || tokens[i].find('\n') == std::string::npos) continue;
      if (tokens[i] == "\n") newline_piece = true;
      if (tokens[i].find_first_not_of('\n') != std::string::npos) only_newlines = false;
    }
    *newline_split_ok = newline_piece && only_newlines && !read_bool(file, "tokenizer.ggml.add_space_prefix", true);
  }
  bool has_bytes = false;
  std::string proto;
  proto.reserve(n * 24);
  std::string piece;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] == TokenType::Unknown && static_cast<int>(i) != unk) types[i] = TokenType::Control;  // one unknown only
    has_bytes |= types[i] == TokenType::Byte;
    piece.clear();
    field_bytes(piece, 1, types[i] == TokenType::UserDefined ? replace_spaces(tokens[i]) : tokens[i]);
    field_float(piece, 2, scores[i]);
    field_varint(piece, 3, static_cast<uint64_t>(types[i]));
    field_bytes(proto, 1, piece);
  }
  std::string trainer;
  field_varint(trainer, 3, 2);  // model_type = BPE
  field_varint(trainer, 4, n);  // vocab_size
  field_varint(trainer, 35, has_bytes ? 1 : 0);  // byte_fallback
  field_varint(trainer, 40, static_cast<uint64_t>(unk));  // unk_id
  field_bytes(trainer, 45, tokens[unk]);  // unk_piece
  field_bytes(proto, 2, trainer);
  std::string normalizer;
  field_bytes(normalizer, 1, "identity");
  field_varint(normalizer, 3, read_bool(file, "tokenizer.ggml.add_space_prefix", true) ? 1 : 0);  // add_dummy_prefix
  field_varint(normalizer, 4, 0);  // remove_extra_whitespaces
  field_varint(normalizer, 5, 1);  // escape_whitespaces
  field_bytes(proto, 3, normalizer);
  return proto;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& file) {
  const std::string model = file.get_string("tokenizer.ggml.model");  // InputError naming the key
  if (model == "gpt2") return std::make_unique<BpeTokenizer>(bpe_vocabulary_from_gguf(file), file.path());
  if (model == "llama") {
    bool split_ok = false;
    const std::string proto = sentencepiece_proto_from_gguf(file, &split_ok);
    const size_t n = file.get_array_size(kTokens);
    SentencePieceOptions o;
    o.split_at_newlines = split_ok;
    o.bos = read_id(file, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
    o.eos = read_id(file, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
    o.add_bos = read_bool(file, "tokenizer.ggml.add_bos_token", true);
    o.add_eos = read_bool(file, "tokenizer.ggml.add_eos_token", false);
    o.strip_space_after_bos = read_bool(file, "tokenizer.ggml.add_space_prefix", true);
    return std::make_unique<SentencePieceTokenizer>(proto, file.path() + " (tokenizer.ggml.* as a SentencePiece model)", o);
  }
  throw UnsupportedError(file.path() + ": tokenizer.ggml.model \"" + model +
                         "\" is not supported (supported: gpt2 = byte-level BPE, llama = SentencePiece)");
}

std::string gguf_tokenizer_bytes(const GgufFile& file) {
  std::vector<std::pair<std::string, const GgufValue*>> kvs;
  for (const auto& [key, value] : file.metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) kvs.emplace_back(key, &value);
  }
  if (kvs.empty()) throw InputError(file.path() + ": no tokenizer.* metadata (expected tokenizer.ggml.model, tokenizer.ggml.tokens, ...)");
  return write_gguf_metadata(kvs);
}

std::string tokenizer_bytes_for_embedding(const std::string& path, std::string* format) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const auto dir = std::filesystem::path(path);
    if (std::filesystem::exists(dir / "tokenizer.model", ec)) {
      file = (dir / "tokenizer.model").string();
    } else if (std::filesystem::exists(dir / "tokenizer.json", ec)) {
      file = (dir / "tokenizer.json").string();
    } else {
      throw InputError(path + ": directory has neither tokenizer.model nor tokenizer.json");
    }
  }
  auto mapped = MappedFile::open(file);  // InputError "cannot open PATH: reason"
  const uint8_t* d = mapped->data();
  const size_t size = mapped->size();
  std::string fmt;
  std::string bytes;
  if (is_gguf(d, size)) {
    fmt = "gguf";
    bytes = gguf_tokenizer_bytes(GgufFile(mapped));
  } else {
    bytes.assign(reinterpret_cast<const char*>(d), size);
    size_t i = 0;
    while (i < size && (d[i] == ' ' || d[i] == '\n' || d[i] == '\r' || d[i] == '\t')) ++i;
    fmt = i < size && d[i] == '{' ? "hf-json" : "";
  }
  auto tok = load_tokenizer_from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), file);  // validates
  if (fmt.empty()) fmt = dynamic_cast<const Llama2cTokenizer*>(tok.get()) ? "llama2c" : "sentencepiece";
  if (format) *format = fmt;
  return bytes;
}

}  // namespace sq
