// Tokenizer interface shared by the llama2.c `tokenizer.bin` reader, the SentencePiece
// `tokenizer.model` wrapper (also used for GGUF "llama" vocabularies) and the byte-level BPE
// tokenizer (GGUF "gpt2" vocabularies, Hugging Face tokenizer.json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sq {

/// Text <-> token ids for LLaMA-family vocabularies. SentencePiece-style implementations follow
/// SentencePiece/llama.cpp conventions (a dummy-prefix space before the text when the model asks
/// for it, byte fallback (`<0xXX>` pieces) for characters not in the vocabulary); the byte-level
/// BPE one follows GPT-2 (formats/bpe_tokenizer.h). encode() never parses special-token strings in
/// the text into special ids; encode_special() does (the tools' --special).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text` (UTF-8), optionally with BOS first and EOS last. Empty text gives just
  /// the requested BOS/EOS.
  virtual std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const = 0;

  /// As encode(), but every occurrence in `text` of a special token's text (special_token_texts(),
  /// longest match first, scanning left to right) becomes that token's id, and the text between
  /// them is encoded with encode(piece, false, false) — llama.cpp's parse_special partition
  /// (llama-vocab.cpp tokenizer_st_partition), so a SentencePiece model with a dummy prefix gets it
  /// before each text fragment, as there. E.g. SmolLM2's "<|im_start|>user\nhi<|im_end|>" gives
  /// [1, encode("user\nhi"), 2]. Same exceptions as encode().
  std::vector<int> encode_special(std::string_view text, bool add_bos, bool add_eos) const;
  /// The tokens encode_special() parses, as (text, id): byte-level BPE: control (special added
  /// tokens) and user-defined tokens; SentencePiece: control pieces ("<start_of_turn>", "<bos>");
  /// llama2.c: none. Empty texts are left out.
  virtual std::vector<std::pair<std::string, int>> special_token_texts() const { return {}; }
  /// Text of `token` when it follows `prev_token` in a stream: byte pieces become their raw byte,
  /// the leading space of the first piece after BOS is dropped, BOS/EOS/unk give "".
  virtual std::string decode_token(int prev_token, int token) const = 0;

  /// Concatenated decode_token over `tokens` (the first one treated as following BOS if it is BOS).
  std::string decode(const std::vector<int>& tokens) const;

  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  /// Whether the model expects BOS before a prompt (GGUF `tokenizer.ggml.add_bos_token`; true for
  /// llama2.c and SentencePiece tokenizer.model files, false e.g. for SmolLM2).
  virtual bool default_add_bos() const { return true; }
  /// Whether the model expects EOS after the text (GGUF `tokenizer.ggml.add_eos_token`; false by default).
  virtual bool default_add_eos() const { return false; }
  /// The vocabulary piece of `token` as its format stores it (llama2.c: " the"; SentencePiece:
  /// "▁the"; byte pieces "<0x0A>"; byte-level BPE: "Ġthe"); throws std::out_of_range.
  virtual std::string piece(int token) const = 0;
};

/// Loads a tokenizer by file content: SentencePiece `tokenizer.model` (protobuf), llama2.c
/// `tokenizer.bin`, a GGUF file (its tokenizer.* metadata only, formats/gguf_tokenizer.h) or a
/// Hugging Face `tokenizer.json` (byte-level BPE, formats/bpe_tokenizer.h). A directory is looked
/// into for tokenizer.model, then tokenizer.json. Throws InputError naming `path` when it is none
/// of these or is malformed, UnsupportedError for a recognized but unsupported tokenizer.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

/// Same, from the tokenizer file's bytes (e.g. embedded in a .sqm); `path` names the source in
/// error messages.
std::unique_ptr<Tokenizer> load_tokenizer_from_bytes(const uint8_t* data, size_t size, const std::string& path);

}  // namespace sq
