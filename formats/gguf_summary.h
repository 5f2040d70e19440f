// A GGUF file's summary for sq-inspect: header, metadata, tokenizer, bytes by ggml type and bits per
// weight, as JSON (the reader is formats/gguf_file.h; the format: ggml's docs/gguf.md).
#pragma once

#include <nlohmann/json.hpp>

#include "formats/gguf_file.h"

namespace sq {

/// Summarizes an opened (hence validated) GGUF file. The object has:
///  * "format": "gguf", "gguf_version", "alignment", "file_bytes", "architecture" (general.architecture
///    or null), "name" (general.name or null);
///  * "metadata": every key except tokenizer.ggml.* arrays' contents: scalars as JSON numbers, booleans
///    or strings; an array as the string "[<element type> x <count>]" (the 49,152 vocabulary strings
///    are not repeated);
///  * "tokenizer": {"model", "pre", "vocab_size", "merges", "add_bos_token", "bos_token_id",
///    "eos_token_id"} for what the file holds (absent keys omitted), or null without tokenizer.ggml.model;
///  * "tensor_count", "bytes_by_type": {ggml type name: {"tensors", "bytes", "elements"}},
///    "tensor_bytes" (sum of all tensors' data bytes), "weight_elements" (elements of the tensors
///    whose name ends in ".weight"), "bits_per_weight" = 8 x tensor_bytes / weight_elements (null
///    when no tensor is named *.weight) — the same definition as sq-inspect's for .sqm files, so
///    the figures compare;
///  * with `with_tensors`, "tensors": [{"name", "type", "shape" (row-major, dims reversed), "offset"
///    (in the data section), "bytes"}] in file order.
/// Throws nothing beyond std::bad_alloc (the file was validated when opened).
nlohmann::json gguf_summary(const GgufFile& file, bool with_tensors);

}  // namespace sq
