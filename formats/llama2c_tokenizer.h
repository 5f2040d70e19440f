// llama2.c `tokenizer.bin` reader with llama.cpp-exact SentencePiece-BPE encoding.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/tokenizer.h"

namespace sq {

/// A SentencePiece-BPE vocabulary stored in Karpathy's llama2.c `tokenizer.bin` layout
/// (little-endian, no header besides the first field, vocab size not stored):
///
///     int32 max_token_length
///     repeated until the end of the file, once per token id 0, 1, 2, ...:
///         float32 score; int32 length; `length` bytes of piece (UTF-8, no terminator)
///
/// Pieces store spaces as ' ' (SentencePiece's '▁' already replaced by the exporter). By the
/// llama2.c convention ids 0, 1, 2 are `<unk>`, `<s>` (BOS, stored piece "\n<s>\n") and `</s>`
/// (EOS, "\n</s>\n"); byte-fallback pieces are spelled "<0x00>".."<0xFF>".
///
/// encode() reproduces llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm` in
/// llama-vocab.cpp) so that token counts and perplexities match llama.cpp exactly; see encode().
/// Immutable after construction, so concurrent encode/decode calls are safe.
class Llama2cTokenizer : public Tokenizer {
 public:
  /// Reads `path`. Throws InputError naming the file when it cannot be opened, is empty, has a
  /// max_token_length < 1, a truncated record, a negative length or a piece running past the end
  /// of the file (the message names the token index), or has fewer than 3 tokens.
  explicit Llama2cTokenizer(const std::string& path);

  /// Parses `size` bytes already in memory; `path` only names the source in error messages.
  /// Throws like the path constructor.
  Llama2cTokenizer(const uint8_t* data, size_t size, const std::string& path);

  /// llama.cpp's SentencePiece-BPE (`llm_tokenizer_spm::tokenize`), O(n log n):
  ///  1. non-empty text gets one leading space (SentencePiece's dummy prefix);
  ///  2. the text is split into UTF-8 characters, each a node of a doubly linked list. The length
  ///     of a character comes from its lead byte alone, as llama.cpp's `unicode_len_utf8` does
  ///     (0xxx/10xx -> 1, 110x -> 2, 1110 -> 3, 1111 -> 4 bytes, cut at the end of the text); so
  ///     a stray continuation byte is a symbol of its own and valid UTF-8 splits into code points;
  ///  3. every adjacent pair whose concatenation is a mergeable vocabulary piece (any piece except
  ///     ids 0, 1, 2 and the `<0xXX>` byte pieces) goes into a max-priority queue keyed by that
  ///     piece's score, ties broken by the smaller left position;
  ///  4. popping skips stale pairs (a side already merged away, or the concatenated length no
  ///     longer matches), merges right into left and queues the new pairs (prev,left),(left,next);
  ///  5. each final symbol becomes its piece id, or — for a character not in the vocabulary —
  ///     one `<0xXX>` token per byte (the single-byte piece, then `<unk>`, when the vocabulary has
  ///     no byte pieces). A piece stored twice maps to its last id, like llama.cpp's token_to_id.
  /// Runs of symbols separated by a character that occurs in no mergeable piece (e.g. '\n') are
  /// merged with separate queues; that changes nothing in the result, only the heap size.
  /// BOS (id 1) is prepended when `add_bos`, EOS (id 2) appended when `add_eos`. Empty text gives
  /// only those. Never throws for any byte string.
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const override;

  /// Text of `token` after `prev_token`, as llama2.c's `decode` does: `<0xXX>` pieces give the raw
  /// byte, the leading ' ' of a piece following BOS is dropped, ids 0/1/2 (unk/BOS/EOS) give "".
  /// Throws std::out_of_range for a token outside [0, vocab_size()).
  std::string decode_token(int prev_token, int token) const override;

  /// Number of records in the file.
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  /// Always 1 (llama2.c convention).
  int bos_id() const override { return 1; }
  /// Always 2 (llama2.c convention).
  int eos_id() const override { return 2; }
  /// The stored piece, e.g. " the", "<0x0A>", "\n<s>\n". Throws std::out_of_range.
  std::string piece(int token) const override;
  /// The stored merge score of `token`. Throws std::out_of_range.
  float score(int token) const;
  /// The file's max_token_length field (informational; not enforced on the pieces).
  int max_token_length() const { return max_token_length_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  void parse(const uint8_t* data, size_t size, const std::string& path);
  /// Id of a mergeable piece equal to `text`, or -1.
  int lookup(std::string_view text) const;
  /// Appends the byte-fallback tokens of `bytes` to `out`.
  void append_bytes(std::string_view bytes, std::vector<int>& out) const;

  int max_token_length_ = 0;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int16_t> byte_of_token_;  ///< 0..255 for `<0xXX>` pieces, -1 otherwise
  std::array<int, 256> byte_token_{};   ///< fallback token per byte value
  std::unordered_map<std::string, int, StringHash, std::equal_to<>> piece_to_id_;  ///< mergeable only
  uint32_t max_piece_bytes_ = 0;     ///< longest mergeable piece
  std::array<bool, 256> barrier_{};  ///< bytes that occur in no mergeable piece
};

}  // namespace sq
