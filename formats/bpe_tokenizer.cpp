#include "formats/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "core/error.h"
#include "formats/json_limits.h"

namespace sq {

namespace {

// GPT-2 (llama.cpp's unicode.cpp / HF tokenizers use the same patterns).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// Code point -> UTF-8.
std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// GPT-2 bytes_to_unicode: code point of each byte.
const std::array<uint32_t, 256>& byte_to_cp() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = keep ? static_cast<uint32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

/// Inverse of byte_to_cp for code points < 324; -1 elsewhere.
int cp_to_byte(uint32_t cp) {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp()[b]] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

/// Length of the UTF-8 sequence starting at s[i] if it is well-formed (1..4), else 0.
size_t utf8_len(std::string_view s, size_t i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    v = (v << 6) | (d & 0x3F);
  }
  *cp = v;
  return n;
}

/// Maps a byte-level token string back to bytes; characters outside the byte-level alphabet are
/// kept as their UTF-8.
std::string byte_level_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_len(s, i, &cp);
    if (n == 0) {
      out += s[i++];
      continue;
    }
    const int b = cp_to_byte(cp);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

uint64_t pair_key(int a, int b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

const std::string& byte_level_char(uint8_t b) {
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> t;
    for (int i = 0; i < 256; ++i) t[i] = utf8_encode(byte_to_cp()[i]);
    return t;
  }();
  return chars[b];
}

std::vector<std::string> bpe_pre_tokenizer_regexes(const std::string& pre, const std::string& source) {
  if (pre == "gpt-2" || pre == "gpt2") return {kGpt2Regex};
  if (pre == "smollm") return {R"(\p{N})", kGpt2Regex};
  if (pre == "llama-bpe" || pre == "llama3") return {kLlama3Regex};
  if (pre == "qwen2") return {kQwen2Regex};
  throw UnsupportedError(source + ": tokenizer.ggml.pre \"" + pre +
                         "\" is not supported (supported byte-level BPE pre-tokenizers: gpt-2, smollm, llama-bpe, qwen2)");
}

/// A compiled PCRE2 pattern (UTF + UCP, invalid UTF-8 in subjects allowed, JIT when available).
struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

BpeTokenizer::BpeTokenizer(BpeVocabulary vocab, const std::string& source) : vocab_(std::move(vocab)), source_(source) {
  const size_t n = vocab_.tokens.size();
  if (n == 0) throw InputError(source_ + ": the vocabulary is empty");
  if (n > (1u << 24)) throw InputError(source_ + ": " + std::to_string(n) + " tokens, more than 16777216");
  if (vocab_.types.size() != n) {
    throw InputError(source_ + ": " + std::to_string(vocab_.types.size()) + " token types for " + std::to_string(n) + " tokens");
  }
  auto check_id = [&](int id, const char* what) {
    if (id < -1 || id >= static_cast<int>(n)) {
      throw InputError(source_ + ": " + what + " " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n) + ")");
    }
  };
  check_id(vocab_.bos, "BOS id");
  check_id(vocab_.eos, "EOS id");
  check_id(vocab_.unk, "unknown-token id");

  text_.resize(n);
  ids_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const TokenType t = vocab_.types[id];
    const std::string& s = vocab_.tokens[id];
    if (t == TokenType::Control || t == TokenType::Unknown) {
      if (t == TokenType::Unknown && !s.empty()) ids_.emplace(s, static_cast<int>(id));
      continue;
    }
    if (t == TokenType::UserDefined) {
      text_[id] = s;
      continue;
    }
    text_[id] = byte_level_decode(s);
    if (s.empty() || t == TokenType::Unused) continue;
    // A duplicated string keeps its first id (as HF tokenizers' vocab map would hold just one).
    ids_.emplace(s, static_cast<int>(id));
  }
  if (ids_.empty()) throw InputError(source_ + ": the vocabulary has no usable token (only control or unused entries)");
  char_id_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(byte_level_char(static_cast<uint8_t>(b)));
    if (it != ids_.end()) char_id_[b] = it->second;
  }
  // Without the byte-level symbol of a byte (and without an unknown token to stand for it) the byte
  // silently vanishes from the ids. Real vocabularies leave out bytes that never occur in UTF-8 text
  // (SmolLM2 lacks 21: a few C0 controls, 0xC0, 0xC1, 0xF1 ... 0xFF), so what is required is every
  // byte of plain text: tab, newline, carriage return and printable ASCII (98 bytes).
  if (vocab_.unk < 0) {
    int missing = 0, first = -1;
    for (int b = 0; b < 256; ++b) {
      const bool plain_text = b == '\t' || b == '\n' || b == '\r' || (b >= 0x20 && b <= 0x7E);
      if (plain_text && char_id_[b] < 0 && ++missing == 1) first = b;
    }
    if (missing > 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", first);
      throw InputError(source_ + ": the vocabulary lacks the byte-level symbols of " + std::to_string(missing) +
                       " of the 98 plain-text bytes (tab, newline, carriage return, printable ASCII; first: " + hex +
                       ") and has no unknown token, so text with them would lose characters");
    }
  }

  merge_.reserve(vocab_.merges.size());
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const auto& [a, b] = vocab_.merges[r];
    auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
    if (ia == ids_.end() || ib == ids_.end() || iab == ids_.end()) {
      const std::string& missing = ia == ids_.end() ? a : ib == ids_.end() ? b : a + b;
      throw InputError(source_ + ": merge " + std::to_string(r) + " (\"" + a + " " + b + "\") names \"" + missing +
                       "\", which is not a token of the vocabulary");
    }
    merge_.emplace(pair_key(ia->second, ib->second), std::make_pair(static_cast<int>(r), iab->second));  // first rank wins
  }

  if (vocab_.pre_regexes.empty()) throw InputError(source_ + ": no pre-tokenizer regex");
  for (const std::string& pattern : vocab_.pre_regexes) {
    int err = 0;
    PCRE2_SIZE off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!re->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InputError(source_ + ": pre-tokenizer regex \"" + pattern + "\" does not compile: " +
                       reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(off));
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    regexes_.push_back(std::move(re));
  }
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::check(int token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("BpeTokenizer: token " + std::to_string(token) + " outside [0, " + std::to_string(vocab_size()) + ")");
  }
}

std::string BpeTokenizer::decode_token(int prev_token, int token) const {
  check(token);
  return text_[token];
}

std::string BpeTokenizer::piece(int token) const {
  check(token);
  return vocab_.tokens[token];
}

std::vector<std::pair<std::string, int>> BpeTokenizer::special_token_texts() const {
  std::vector<std::pair<std::string, int>> out;
  for (size_t id = 0; id < vocab_.tokens.size(); ++id) {
    const TokenType t = vocab_.types[id];
    if ((t == TokenType::Control || t == TokenType::UserDefined) && !vocab_.tokens[id].empty())
      out.emplace_back(vocab_.tokens[id], static_cast<int>(id));
  }
  return out;
}

TokenType BpeTokenizer::type(int token) const {
  check(token);
  return vocab_.types[token];
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<int>& out, std::string& mapped) const {
  if (chunk.empty()) return;
  mapped.clear();
  for (char c : chunk) mapped += byte_level_char(static_cast<uint8_t>(c));
  if (auto it = ids_.find(mapped); it != ids_.end()) {  // whole chunk is one token (most words)
    out.push_back(it->second);
    return;
  }
  struct Sym {
    int id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Sym> syms(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) {
    syms[i] = {char_id_[static_cast<uint8_t>(chunk[i])], static_cast<int>(i) - 1,
               i + 1 < chunk.size() ? static_cast<int>(i) + 1 : -1, true};
  }
  // Byte-level: the initial symbols are single bytes; a multi-byte UTF-8 character is several
  // symbols that merges join (the vocabulary holds the byte-level characters, one per byte).
  struct Cand {
    int rank;
    int left;
    int right;
    int left_id;
    int right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    auto it = merge_.find(pair_key(syms[l].id, syms[r].id));
    if (it != merge_.end()) heap.push({it->second.first, l, r, syms[l].id, syms[r].id});
  };
  for (size_t i = 0; i + 1 < chunk.size(); ++i) push(static_cast<int>(i), static_cast<int>(i) + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[c.left];
    if (!l.alive || l.next != c.right || l.id != c.left_id || syms[c.right].id != c.right_id) continue;
    Sym& r = syms[c.right];
    l.id = merge_.at(pair_key(c.left_id, c.right_id)).second;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out.push_back(syms[i].id);
    } else if (vocab_.unk >= 0) {
      out.push_back(vocab_.unk);
    }
  }
}

std::vector<int> BpeTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int> ids;
  if (add_bos) {
    if (vocab_.bos < 0) throw InputError(source_ + ": BOS requested but the vocabulary defines no BOS token");
    ids.push_back(vocab_.bos);
  }
  std::vector<std::string_view> chunks{text}, next;
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  struct Free {
    pcre2_match_data*& md;
    pcre2_match_context* mctx;
    pcre2_jit_stack* jit;
    ~Free() {
      pcre2_match_data_free(md);
      pcre2_match_context_free(mctx);
      pcre2_jit_stack_free(jit);
    }
  } free_all{md, mctx, jit};
  if (mctx && jit) pcre2_jit_stack_assign(mctx, nullptr, jit);
  for (const auto& re : regexes_) {
    pcre2_match_data_free(md);
    md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    if (!md) throw std::bad_alloc();
    next.clear();
    for (std::string_view chunk : chunks) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(chunk.data());
      size_t pos = 0, emitted = 0;
      while (pos < chunk.size()) {
        const int rc = pcre2_match(re->code, subject, chunk.size(), pos, 0, md, mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw InputError(source_ + ": pre-tokenizer regex failed on the text: " + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (e <= b) {  // empty match: step over one character
          uint32_t cp = 0;
          const size_t n = utf8_len(chunk, std::max(pos, b), &cp);
          pos = std::max(pos, b) + (n ? n : 1);
          continue;
        }
        if (b > emitted) next.push_back(chunk.substr(emitted, b - emitted));
        next.push_back(chunk.substr(b, e - b));
        emitted = pos = e;
      }
      if (emitted < chunk.size()) next.push_back(chunk.substr(emitted));
    }
    chunks.swap(next);
  }
  std::string scratch;
  for (std::string_view chunk : chunks) encode_chunk(chunk, ids, scratch);
  if (add_eos) {
    if (vocab_.eos < 0) throw InputError(source_ + ": EOS requested but the vocabulary defines no EOS token");
    ids.push_back(vocab_.eos);
  }
  return ids;
}

// ---- tokenizer.json --------------------------------------------------------------------------

namespace {

[[noreturn]] void json_fail(const std::string& source, const std::string& field, const std::string& what) {
  throw InputError(source + ": tokenizer.json " + field + ": " + what);
}

/// Appends the regexes of one HF pre-tokenizer object to `out`.
void add_pre_tokenizer(const nlohmann::json& p, const std::string& field, const std::string& source,
                       std::vector<std::string>& out) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) json_fail(source, field, "expected an object with a string \"type\"");
  const std::string type = p["type"].get<std::string>();
  auto flag = [&](const char* key, bool dflt) {
    if (!p.contains(key) || p[key].is_null()) return dflt;
    if (!p[key].is_boolean()) json_fail(source, field + "." + key, "expected true or false");
    return p[key].get<bool>();
  };
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) json_fail(source, field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
      add_pre_tokenizer(p["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]", source, out);
    }
  } else if (type == "ByteLevel") {
    if (flag("add_prefix_space", false)) throw UnsupportedError(source + ": tokenizer.json " + field + ": add_prefix_space true is not supported");
    if (flag("use_regex", true)) out.push_back(kGpt2Regex);
  } else if (type == "Digits") {
    out.push_back(flag("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "Split") {
    if (flag("invert", false)) throw UnsupportedError(source + ": tokenizer.json " + field + ": inverted Split is not supported");
    const std::string behavior = p.contains("behavior") && p["behavior"].is_string() ? p["behavior"].get<std::string>() : "";
    if (behavior != "Isolated") {
      throw UnsupportedError(source + ": tokenizer.json " + field + ": Split behavior \"" + behavior + "\" is not supported (only Isolated)");
    }
    const auto& pat = p.contains("pattern") ? p["pattern"] : nlohmann::json();
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      out.push_back(pat["Regex"].get<std::string>());
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      out.push_back("\\Q" + pat["String"].get<std::string>() + "\\E");
    } else {
      json_fail(source, field + ".pattern", "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    }
  } else {
    throw UnsupportedError(source + ": tokenizer.json " + field + ": pre-tokenizer \"" + type +
                           "\" is not supported (ByteLevel, Split, Digits, Sequence)");
  }
}

}  // namespace

BpeVocabulary bpe_vocabulary_from_hf_json(std::string_view text, const std::string& source) {
  check_json_depth(text, source + ": tokenizer.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InputError(source + ": tokenizer.json: expected a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) json_fail(source, "model", "expected an object");
  const auto& m = j["model"];
  if (m.contains("type") && !(m["type"].is_string() && m["type"].get<std::string>() == "BPE")) {
    throw UnsupportedError(source + ": tokenizer.json model.type " + json_excerpt(m["type"]) + " is not supported (only BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      throw UnsupportedError(source + ": tokenizer.json model." + key + " is not supported");
    }
  }
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>()) {
    throw UnsupportedError(source + ": tokenizer.json model.byte_fallback true is not supported (byte-level BPE only)");
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    throw UnsupportedError(source + ": tokenizer.json normalizer " + json_excerpt(j["normalizer"], 80) + " is not supported (only null)");
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) json_fail(source, "model.vocab", "expected an object of token -> id");
  const auto& vocab = m["vocab"];
  if (vocab.empty()) json_fail(source, "model.vocab", "is empty (a byte-level BPE needs at least its 256 byte symbols)");
  const auto& added = j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : nlohmann::json::array();
  if (!added.is_array()) json_fail(source, "added_tokens", "expected an array");
  const size_t limit = vocab.size() + added.size();
  BpeVocabulary v;
  v.tokens.assign(limit, "");
  v.types.assign(limit, TokenType::Unused);
  std::vector<bool> seen(limit, false);
  size_t max_id = 0;
  auto place = [&](int64_t id, const std::string& s, TokenType t, const std::string& field, bool allow_same) {
    if (id < 0 || static_cast<uint64_t>(id) >= limit) {
      json_fail(source, field, "id " + std::to_string(id) + " is outside [0, " + std::to_string(limit) + ") (ids must be dense)");
    }
    if (seen[id] && !(allow_same && v.tokens[id] == s)) json_fail(source, field, "id " + std::to_string(id) + " is used twice");
    seen[id] = true;
    v.tokens[id] = s;
    v.types[id] = t;
    max_id = std::max(max_id, static_cast<size_t>(id));
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) json_fail(source, "model.vocab[\"" + it.key() + "\"]", "expected an integer id");
    place(it.value().get<int64_t>(), it.key(), TokenType::Normal, "model.vocab[\"" + it.key() + "\"]", false);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string()) {
      json_fail(source, field, "expected {\"id\": integer, \"content\": string, ...}");
    }
    const bool special = a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
    place(a["id"].get<int64_t>(), a["content"].get<std::string>(), special ? TokenType::Control : TokenType::UserDefined, field, true);
  }
  v.tokens.resize(max_id + 1);
  v.types.resize(max_id + 1);

  if (!m.contains("merges") || !m["merges"].is_array()) json_fail(source, "model.merges", "expected an array");
  const auto& merges = m["merges"];
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& e = merges[i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos) {
        json_fail(source, "model.merges[" + std::to_string(i) + "]", "expected \"LEFT RIGHT\" (two tokens and one space), got " + json_excerpt(e, 80));
      }
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      v.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      json_fail(source, "model.merges[" + std::to_string(i) + "]", "expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"], got " + json_excerpt(e, 80));
    }
  }

  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) {
    throw UnsupportedError(source + ": tokenizer.json has no pre_tokenizer (a byte-level BPE needs ByteLevel or Split)");
  }
  add_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer", source, v.pre_regexes);

  auto special_named = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      for (size_t id = 0; id < v.tokens.size(); ++id) {
        if (v.types[id] == TokenType::Control && v.tokens[id] == name) return static_cast<int>(id);
      }
    }
    return -1;
  };
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const auto& pp = j["post_processor"];
    if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && pp["single"].is_array() && !pp["single"].empty()) {
      const auto& first = pp["single"][0];
      if (first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object() &&
          first["SpecialToken"].contains("id") && first["SpecialToken"]["id"].is_string()) {
        const std::string name = first["SpecialToken"]["id"].get<std::string>();
        for (size_t id = 0; id < v.tokens.size(); ++id) {
          if (v.types[id] == TokenType::Control && v.tokens[id] == name) {
            v.bos = static_cast<int>(id);
            v.add_bos = true;
            break;
          }
        }
      }
    }
  }
  if (v.bos < 0) v.bos = special_named({"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>"});
  v.eos = special_named({"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "<|im_end|>"});
  return v;
}

}  // namespace sq
