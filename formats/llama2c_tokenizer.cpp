#include "formats/llama2c_tokenizer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <queue>
#include <stdexcept>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace sq {

static_assert(std::endian::native == std::endian::little, "tokenizer.bin is read as little-endian");

namespace {

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/// 0..255 when `piece` is a byte-fallback piece "<0xXX>", else -1.
int byte_piece_value(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

/// Byte length of the UTF-8 character starting with `lead`, from its high nibble only: llama.cpp's
/// `unicode_len_utf8` (continuation bytes count as 1, 0xF8..0xFF as 4).
size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

/// One node of the symbol list: bytes [start, start+n) of the text; n == 0 once merged away.
struct Symbol {
  int prev;
  int next;
  uint32_t start;
  uint32_t n;
};

/// A candidate merge of symbols `left` and `right` into a piece of `size` bytes and `score`.
struct Bigram {
  float score;
  int left;
  int right;
  uint32_t size;
};

/// Max-heap order of llama.cpp's `llm_bigram_spm::comparator`: higher score first, then the
/// smaller left position.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(const std::string& path) {
  auto file = MappedFile::open(path);
  parse(file->data(), file->size(), path);
}

Llama2cTokenizer::Llama2cTokenizer(const uint8_t* data, size_t size, const std::string& path) {
  parse(data, size, path);
}

void Llama2cTokenizer::parse(const uint8_t* data, size_t size, const std::string& path) {
  const std::string what = path + ": ";
  if (size == 0) throw InputError(what + "empty file, expected a llama2.c tokenizer.bin");
  if (size < 4) {
    throw InputError(what + "truncated llama2.c tokenizer.bin: " + std::to_string(size) +
                     " bytes, expected at least the 4-byte max_token_length");
  }
  max_token_length_ = read_i32(data);
  if (max_token_length_ < 1) {
    throw InputError(what + "not a llama2.c tokenizer.bin: max_token_length is " + std::to_string(max_token_length_) +
                     ", expected a positive value");
  }
  size_t off = 4;
  while (off < size) {
    const size_t index = pieces_.size();
    const size_t left = size - off;
    if (left < 8) {
      throw InputError(what + "truncated llama2.c tokenizer.bin: the record of token " + std::to_string(index) +
                       " at offset " + std::to_string(off) + " needs 8 header bytes but only " + std::to_string(left) +
                       " remain");
    }
    const float score = read_f32(data + off);
    const int32_t len = read_i32(data + off + 4);
    if (len < 0) {
      throw InputError(what + "invalid llama2.c tokenizer.bin: token " + std::to_string(index) + " at offset " +
                       std::to_string(off) + " has negative length " + std::to_string(len));
    }
    if (static_cast<size_t>(len) > left - 8) {
      throw InputError(what + "truncated llama2.c tokenizer.bin: the " + std::to_string(len) + "-byte piece of token " +
                       std::to_string(index) + " at offset " + std::to_string(off) + " runs past the end of the file (" +
                       std::to_string(left - 8) + " bytes remain)");
    }
    pieces_.emplace_back(reinterpret_cast<const char*>(data + off + 8), static_cast<size_t>(len));
    scores_.push_back(score);
    off += 8 + static_cast<size_t>(len);
  }
  if (pieces_.size() < 3) {
    throw InputError(what + "invalid llama2.c tokenizer.bin: " + std::to_string(pieces_.size()) +
                     " tokens, expected at least 3 (<unk>, <s>, </s>)");
  }

  // Mergeable pieces: everything but the control tokens 0..2 and the byte pieces; a repeated piece
  // maps to its last id, as llama.cpp's token_to_id does.
  const int n = vocab_size();
  byte_of_token_.assign(n, -1);
  byte_token_.fill(-1);
  piece_to_id_.reserve(n);
  barrier_.fill(true);
  for (int id = 0; id < n; ++id) {
    const int b = byte_piece_value(pieces_[id]);
    if (b >= 0) {
      byte_of_token_[id] = static_cast<int16_t>(b);
      if (byte_token_[b] < 0) byte_token_[b] = id;
      continue;
    }
    if (id <= 2 || pieces_[id].empty()) continue;
    piece_to_id_[pieces_[id]] = id;
    max_piece_bytes_ = std::max<uint32_t>(max_piece_bytes_, static_cast<uint32_t>(pieces_[id].size()));
    for (char c : pieces_[id]) barrier_[static_cast<uint8_t>(c)] = false;
  }
  // A vocabulary without byte pieces falls back to a single-byte piece, then to <unk> (id 0).
  for (int b = 0; b < 256; ++b) {
    if (byte_token_[b] >= 0) continue;
    const int id = lookup(std::string(1, static_cast<char>(b)));
    byte_token_[b] = id >= 0 ? id : 0;
  }
}

int Llama2cTokenizer::lookup(std::string_view text) const {
  auto it = piece_to_id_.find(text);
  return it == piece_to_id_.end() ? -1 : it->second;
}

void Llama2cTokenizer::append_bytes(std::string_view bytes, std::vector<int>& out) const {
  for (char c : bytes) out.push_back(byte_token_[static_cast<uint8_t>(c)]);
}

std::vector<int> Llama2cTokenizer::encode(std::string_view raw, bool add_bos, bool add_eos) const {
  std::vector<int> out;
  if (add_bos) out.push_back(bos_id());
  if (!raw.empty()) {
    std::string text;
    text.reserve(raw.size() + 1);
    text += ' ';  // SentencePiece dummy prefix
    text += raw;
    if (text.size() > UINT32_MAX) throw std::length_error("Llama2cTokenizer::encode: text longer than 4 GiB");

    // 1. One symbol per UTF-8 character.
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
      const size_t len = std::min(utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
      const int index = static_cast<int>(sym.size());
      off += len;
      sym.push_back(Symbol{index - 1, off == text.size() ? -1 : index + 1, static_cast<uint32_t>(off - len),
                           static_cast<uint32_t>(len)});
    }

    // 2.-3. Merge the best pair until none is left. A symbol whose lead byte occurs in no mergeable
    // piece can never be merged, so the runs of symbols between such barriers (typically '\n') are
    // independent: each run is drained with its own, small queue. The merges within a run, and so
    // the result, are exactly those of one queue over the whole text (the order restricted to a run
    // is unchanged), but the heap stays cache-sized.
    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    const std::string_view view(text);
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const uint32_t size = sym[l].n + sym[r].n;
      if (size > max_piece_bytes_) return;
      const int id = lookup(view.substr(sym[l].start, size));
      if (id < 0) return;
      queue.push(Bigram{scores_[id], l, r, size});
    };
    const int n_sym = static_cast<int>(sym.size());
    for (int begin = 0; begin < n_sym;) {
      int end = begin + 1;  // run [begin, end): up to and including the next barrier symbol
      while (end < n_sym && !barrier_[static_cast<uint8_t>(text[sym[end - 1].start])]) ++end;
      for (int i = begin + 1; i < end; ++i) try_add(i - 1, i);
      while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol& l = sym[b.left];
        Symbol& r = sym[b.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
      }
      begin = end;
    }

    // 4. Emit the pieces, byte fallback for characters outside the vocabulary.
    for (int i = 0; i != -1; i = sym[i].next) {
      const std::string_view s = std::string_view(text).substr(sym[i].start, sym[i].n);
      const int id = lookup(s);
      if (id >= 0) {
        out.push_back(id);
      } else {
        append_bytes(s, out);
      }
    }
  }
  if (add_eos) out.push_back(eos_id());
  return out;
}

std::string Llama2cTokenizer::decode_token(int prev_token, int token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("Llama2cTokenizer: token " + std::to_string(token) + " outside [0, " +
                            std::to_string(vocab_size()) + ")");
  }
  if (token <= 2) return "";
  if (byte_of_token_[token] >= 0) return std::string(1, static_cast<char>(byte_of_token_[token]));
  const std::string& p = pieces_[token];
  if (prev_token == bos_id() && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

std::string Llama2cTokenizer::piece(int token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("Llama2cTokenizer: token " + std::to_string(token) + " outside [0, " +
                            std::to_string(vocab_size()) + ")");
  }
  return pieces_[token];
}

float Llama2cTokenizer::score(int token) const {
  if (token < 0 || token >= vocab_size()) {
    throw std::out_of_range("Llama2cTokenizer: token " + std::to_string(token) + " outside [0, " +
                            std::to_string(vocab_size()) + ")");
  }
  return scores_[token];
}

}  // namespace sq
