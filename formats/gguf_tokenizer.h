// Tokenizers from GGUF metadata (the `tokenizer.*` keys llama.cpp's convert_hf_to_gguf.py writes),
// and the bytes sq-convert embeds in a .sqm for any tokenizer source.
//
// Keys read:
//   tokenizer.ggml.model        "gpt2" (byte-level BPE, formats/bpe_tokenizer.h) or "llama"
//                               (SentencePiece, built as a ModelProto and run by libsentencepiece)
//   tokenizer.ggml.tokens       string array, the vocabulary by id
//   tokenizer.ggml.token_type   i32 array (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//                               6 byte); optional (all normal)
//   tokenizer.ggml.scores       f32 array (SentencePiece merge priority); optional for "llama" (0)
//   tokenizer.ggml.merges       string array "LEFT RIGHT" in rank order (required for "gpt2")
//   tokenizer.ggml.pre          pre-tokenizer name for "gpt2" (bpe_pre_tokenizer_regexes; absent:
//                               "gpt-2")
//   tokenizer.ggml.bos_token_id / eos_token_id / unknown_token_id   ids (range-checked)
//   tokenizer.ggml.add_bos_token / add_eos_token   booleans (defaults: llama true/false, gpt2
//                               false/false as llama.cpp)
//   tokenizer.ggml.add_space_prefix  SentencePiece dummy prefix (default true; Gemma 3: false)
#pragma once

#include <memory>
#include <string>

#include "formats/bpe_tokenizer.h"
#include "formats/gguf_file.h"
#include "formats/tokenizer.h"

namespace sq {

/// The tokenizer described by `file`'s metadata ("gpt2" or "llama"). No tensor is read. Throws
/// InputError naming the file and the key for missing / mistyped / inconsistent keys (e.g.
/// "tokenizer.ggml.scores has 3 entries but tokenizer.ggml.tokens has 4"), UnsupportedError for
/// another tokenizer.ggml.model or an unknown tokenizer.ggml.pre.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& file);

/// The byte-level BPE vocabulary of a "gpt2" GGUF file (see the keys above). Throws like
/// load_gguf_tokenizer.
BpeVocabulary bpe_vocabulary_from_gguf(const GgufFile& file);

/// A serialized sentencepiece.ModelProto (protobuf wire format) equivalent to a "llama" GGUF
/// vocabulary: model_type BPE, the pieces with their scores and types (the unknown_token_id piece
/// typed UNKNOWN; spaces of user-defined pieces written as U+2581 so that SentencePiece matches
/// them in its whitespace-escaped text), byte_fallback when there are byte pieces, normalizer
/// "identity" without a charsmap, add_dummy_prefix = add_space_prefix, no extra-whitespace
/// removal. `newline_split_ok`, when given, is set to whether SentencePieceOptions::
/// split_at_newlines gives the same ids for this vocabulary. Throws like load_gguf_tokenizer.
std::string sentencepiece_proto_from_gguf(const GgufFile& file, bool* newline_split_ok = nullptr);

/// A metadata-only GGUF file (formats/gguf_writer.h) holding `file`'s `tokenizer.*` keys: what
/// sq-convert embeds in a .sqm; load_tokenizer_from_bytes recognizes it by its "GGUF" magic.
std::string gguf_tokenizer_bytes(const GgufFile& file);

/// The bytes to embed for the tokenizer at `path` and their format name: a .gguf model gives
/// gguf_tokenizer_bytes ("gguf"); a directory its tokenizer.json ("hf-json") or tokenizer.model;
/// a file is taken verbatim ("gguf", "hf-json", "sentencepiece" or "llama2c" by content). The
/// result loads with load_tokenizer_from_bytes. Throws InputError when `path` cannot be read or
/// holds no tokenizer.
std::string tokenizer_bytes_for_embedding(const std::string& path, std::string* format);

}  // namespace sq
