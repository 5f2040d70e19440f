// SentencePiece `tokenizer.model` (protobuf) tokenizer, wrapping libsentencepiece.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace sq {

/// Overrides for a SentencePiece model built from GGUF metadata (formats/gguf_tokenizer.h), whose
/// BOS/EOS ids and dummy-prefix rule come from GGUF keys rather than from the model proto.
struct SentencePieceOptions {
  int bos = -1;  ///< BOS id (-1: the model's, else 1)
  int eos = -1;  ///< EOS id (-1: the model's, else 2)
  bool add_bos = true;   ///< default_add_bos()
  bool add_eos = false;  ///< default_add_eos()
  /// decode_token drops the leading ' ' of a piece after BOS (true when the model adds a dummy
  /// prefix, as Llama-2's does; false for Gemma 3).
  bool strip_space_after_bos = true;
  /// encode() runs SentencePiece on the segments of the text split between '\n' and other
  /// characters (each newline run a segment of its own) instead of on the whole text. The ids are
  /// the same when "\n" is a user-defined piece, every user-defined piece holding '\n' holds
  /// nothing else and there is no dummy prefix (SentencePiece never merges a user-defined symbol
  /// with its neighbours); load_gguf_tokenizer turns it on only then (Gemma 3). Its BPE over one
  /// long sequence is slow, so this makes long texts several times faster.
  bool split_at_newlines = false;
};

/// A SentencePiece model file (`tokenizer.model`, a serialized `sentencepiece.ModelProto`, as
/// shipped with LLaMA / Llama-2) used through `sentencepiece::SentencePieceProcessor`. Encoding is
/// SentencePiece's own (normalization, dummy prefix and byte fallback as the model specifies).
/// Immutable after construction; the processor's const methods are thread-safe.
class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Loads `path`. Throws InputError "cannot open PATH: reason" when the file cannot be read, and
  /// InputError naming the file plus SentencePiece's status message when it is not a valid model.
  explicit SentencePieceTokenizer(const std::string& path);
  /// From the serialized model proto `bytes`; `path` only names the source in error messages.
  SentencePieceTokenizer(const std::string& bytes, const std::string& path);
  /// Same, with `options` overriding BOS/EOS and the after-BOS space rule. Throws InputError when
  /// an id in `options` is outside the vocabulary.
  SentencePieceTokenizer(const std::string& bytes, const std::string& path, const SentencePieceOptions& options);
  ~SentencePieceTokenizer() override;

  /// SentencePiece `Encode` of `text`, with bos_id() first when `add_bos` and eos_id() last when
  /// `add_eos`. Empty text gives only those. Throws Error if SentencePiece reports a failure.
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const override;

  /// Text of `token` after `prev_token`: '▁' (U+2581) becomes ' ', `<0xXX>` byte pieces give the
  /// raw byte, control and unknown pieces (`<s>`, `</s>`, `<unk>`) give "", and the leading ' ' of
  /// a piece following BOS is dropped (as SentencePiece drops the dummy prefix when decoding).
  /// Throws std::out_of_range for a token outside [0, vocab_size()).
  std::string decode_token(int prev_token, int token) const override;

  /// Number of pieces in the model (32000 for Llama-2).
  int vocab_size() const override;
  /// The model's BOS id, or 1 when the model defines none.
  int bos_id() const override { return bos_; }
  /// The model's EOS id, or 2 when the model defines none.
  int eos_id() const override { return eos_; }
  bool default_add_bos() const override { return opt_.add_bos; }
  bool default_add_eos() const override { return opt_.add_eos; }
  /// The piece exactly as stored in the model, with '▁' for spaces (e.g. "▁the", "<0x0A>", "<s>").
  /// Throws std::out_of_range.
  std::string piece(int token) const override;
  /// Control pieces with their text ("<bos>", "<start_of_turn>"); user-defined pieces are left to
  /// SentencePiece, which already never splits them.
  std::vector<std::pair<std::string, int>> special_token_texts() const override;
  /// The model's score of `token` (merge priority for BPE models). Throws std::out_of_range.
  float score(int token) const;

 private:
  void check(int token) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int bos_ = 1;
  int eos_ = 2;
  SentencePieceOptions opt_;
  std::vector<std::string> text_;  ///< decoded text of each id (without the after-BOS rule)
};

}  // namespace sq
