// Minimal GGUF writer: a metadata-only GGUF v3 file (no tensors), e.g. the `tokenizer.*` keys of a
// model that sq-convert embeds in a .sqm (formats/gguf_tokenizer.h). Layout as formats/gguf_file.h
// documents it: header (magic, version 3, tensor_count 0, kv count), then the key/values.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "formats/gguf_file.h"

namespace sq {

/// Serializes `kvs` (key, value) in order as a GGUF v3 file with no tensors; values are written
/// with their own type (scalars, strings, arrays of any element type, nested arrays). GgufFile
/// reads the result back with equal values. Throws InputError for an empty or duplicated key.
std::string write_gguf_metadata(const std::vector<std::pair<std::string, const GgufValue*>>& kvs);

}  // namespace sq
