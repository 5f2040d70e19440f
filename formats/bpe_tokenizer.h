// Byte-level BPE tokenizer (GPT-2 style): GGUF `tokenizer.ggml.model = gpt2` vocabularies and
// Hugging Face `tokenizer.json` files with a BPE model and a ByteLevel / Split / Digits
// pre-tokenizer (SmolLM, GPT-2, Llama 3, Qwen2 ...).
//
// Algorithm (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"; the same
// as Hugging Face `tokenizers` and llama.cpp's BPE session):
//  1. pre-tokenization: the text is split by a sequence of regular expressions (PCRE2, UTF + UCP
//     mode, so \p{L}, \p{N}, \s are Unicode classes); each regex splits every chunk left by the
//     previous one into its matches and the text between matches ("isolated" splitting);
//  2. each chunk's bytes are mapped to printable characters with GPT-2's byte<->unicode table;
//  3. the chunk starts as one symbol per mapped character; the adjacent pair with the lowest merge
//     rank (leftmost first among equal ranks) is merged until no pair has a merge;
//  4. each final symbol is its vocabulary id.
// Special tokens (control, type 3) and user-defined tokens (type 4) are never produced from plain
// text: encode() does not look for their strings in the text, so "<|im_start|>" in a prompt is
// encoded as ordinary characters (callers add BOS/EOS by id).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/tokenizer.h"

namespace sq {

/// GGUF token types (`tokenizer.ggml.token_type`, llama.cpp's llama_token_type); SentencePiece's
/// ModelProto.SentencePiece.Type uses the same numbers.
enum class TokenType : int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

/// Everything a byte-level BPE tokenizer is built from (read by bpe_vocabulary_from_gguf or
/// bpe_tokenizer_from_hf_json).
struct BpeVocabulary {
  /// Token strings by id. Normal tokens are in GPT-2's byte-level alphabet ("Ġthe"); control and
  /// user-defined tokens are plain text ("<|endoftext|>"). Empty strings mark unassigned ids.
  std::vector<std::string> tokens;
  /// TokenType of each id (same length as `tokens`).
  std::vector<TokenType> types;
  /// Merge rules in rank order (rank 0 merges first): the two token strings to join.
  std::vector<std::pair<std::string, std::string>> merges;
  /// Pre-tokenizer regexes (PCRE2 syntax), applied in sequence.
  std::vector<std::string> pre_regexes;
  int bos = -1;  ///< BOS id, -1 when the vocabulary has none
  int eos = -1;  ///< EOS id, -1 when none
  int unk = -1;  ///< id given to a character that is not in the vocabulary, -1: such a character is dropped
  bool add_bos = false;  ///< whether the model expects BOS before a prompt
  bool add_eos = false;  ///< whether the model expects EOS after the text
};

/// The pre-tokenizer regexes llama.cpp uses for GGUF `tokenizer.ggml.pre` = `pre`: "gpt-2",
/// "smollm" (digits one by one, then GPT-2's), "llama-bpe" / "llama3" (Llama 3), "qwen2".
/// Throws UnsupportedError naming `source`, the key and the value for any other name.
std::vector<std::string> bpe_pre_tokenizer_regexes(const std::string& pre, const std::string& source);

/// GPT-2's byte-level alphabet: the UTF-8 text of the character standing for byte `b`
/// (printable ASCII and Latin-1 bytes stand for themselves; the others are U+0100 onwards).
const std::string& byte_level_char(uint8_t b);

/// Byte-level BPE tokenizer (see the file comment). Immutable after construction; encode/decode
/// are thread-safe.
class BpeTokenizer : public Tokenizer {
 public:
  /// Builds the tokenizer. `source` names the file (and key) in messages. Throws InputError when a
  /// merge names a token that is not in the vocabulary or whose concatenation is not, when two
  /// normal tokens have the same string, when bos/eos/unk are outside the vocabulary, or when a
  /// pre-tokenizer regex does not compile (the PCRE2 message is quoted).
  BpeTokenizer(BpeVocabulary vocab, const std::string& source);
  ~BpeTokenizer() override;

  /// Pre-tokenize, byte-map and merge `text` (any bytes; invalid UTF-8 is kept as single bytes),
  /// with BOS first / EOS last on request (throws InputError if the vocabulary has no BOS/EOS, or
  /// naming the source when a pre-tokenizer regex hits PCRE2's match limit, e.g. a backtracking
  /// pattern from a tokenizer.json).
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  /// The bytes of `token` (byte-level characters mapped back; user-defined tokens as stored;
  /// control and unknown tokens ""). `prev_token` is ignored (no dummy prefix to drop).
  /// Throws std::out_of_range.
  std::string decode_token(int prev_token, int token) const override;
  int vocab_size() const override { return static_cast<int>(vocab_.tokens.size()); }
  int bos_id() const override { return vocab_.bos; }
  int eos_id() const override { return vocab_.eos; }
  bool default_add_bos() const override { return vocab_.add_bos; }
  bool default_add_eos() const override { return vocab_.add_eos; }
  /// The token string as stored ("Ġthe", "<|endoftext|>"). Throws std::out_of_range.
  std::string piece(int token) const override;
  /// The token's type. Throws std::out_of_range.
  TokenType type(int token) const;
  /// Control and user-defined tokens with their stored text ("<|im_start|>", "<|endoftext|>").
  std::vector<std::pair<std::string, int>> special_token_texts() const override;

 private:
  struct Regex;
  void check(int token) const;
  void encode_chunk(std::string_view chunk, std::vector<int>& out, std::string& scratch) const;

  BpeVocabulary vocab_;
  std::string source_;
  std::unordered_map<std::string, int> ids_;              ///< normal/unknown/byte/unused tokens by string
  std::unordered_map<uint64_t, std::pair<int, int>> merge_;  ///< (left id, right id) -> (rank, merged id)
  std::vector<int> char_id_;                             ///< id of byte_level_char(b), -1 if absent
  std::vector<std::string> text_;                        ///< decoded bytes of each id
  std::vector<std::unique_ptr<Regex>> regexes_;
};

/// Parses a Hugging Face `tokenizer.json` (text `json`; `source` names it in messages): model.type
/// "BPE" with `vocab` (string -> id) and `merges` ("a b" strings or ["a", "b"] pairs), added_tokens
/// (special -> control, others -> user-defined), pre_tokenizer ByteLevel (use_regex: GPT-2's
/// regex; add_prefix_space must be false), Split (Regex or String pattern, behavior Isolated,
/// not inverted), Digits (individual_digits) or a Sequence of those; normalizer null. BOS is the
/// first special token of post_processor TemplateProcessing `single` (then add_bos is true), else
/// an added special token named "<s>", "<|begin_of_text|>", "<bos>" or "<|endoftext|>"; EOS an
/// added special token named "</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>" or "<|im_end|>".
/// Throws InputError naming `source` and the JSON field for malformed input, UnsupportedError for a
/// model type, normalizer or pre-tokenizer outside that list.
BpeVocabulary bpe_vocabulary_from_hf_json(std::string_view json, const std::string& source);

}  // namespace sq
