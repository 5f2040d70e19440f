// GGUF v3 writers. Layout as formats/gguf_file.h documents it: header (magic, version 3,
// tensor_count, kv count), the key/values, the tensor infos, padding to the alignment, the data.
//  * write_gguf_metadata: a metadata-only file (no tensors), e.g. the `tokenizer.*` keys of a
//    model that sq-convert embeds in a .sqm (formats/gguf_tokenizer.h);
//  * GgufStreamWriter: a complete model file whose tensors are streamed one at a time into a
//    temporary beside the output and renamed over it at the end (formats/gguf_export.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/gguf_file.h"

namespace sq {

/// Serializes `kvs` (key, value) in order as a GGUF v3 file with no tensors; values are written
/// with their own type (scalars, strings, arrays of any element type, nested arrays). GgufFile
/// reads the result back with equal values. Throws InputError for an empty or duplicated key.
std::string write_gguf_metadata(const std::vector<std::pair<std::string, const GgufValue*>>& kvs);

/// One tensor of a GGUF file to be written.
struct GgufTensorSpec {
  std::string name;           ///< 1..64 bytes, unique
  std::vector<int64_t> dims;  ///< ggml order: dims[0] is the contiguous row length (row-major shape reversed), 1..4 dims
  GgmlType type = GgmlType::F32;
};

/// Bytes of `t`'s data: numel / block_size * type_size. Throws InputError naming the tensor when
/// dims[0] is not a whole number of blocks of its type, a dim is negative, or the type is unknown.
uint64_t gguf_tensor_nbytes(const GgufTensorSpec& t);

class AtomicFile;

/// Streaming writer of a GGUF v3 model file: the constructor writes the header, the key/values
/// (`kvs`, in order, as write_gguf_metadata does) and the tensor infos (offsets laid out in
/// `tensors` order, each a multiple of `alignment`, which is written as `general.alignment` only
/// when it is not the default 32) to "<path>.tmp-..." beside `path` (formats/atomic_file.h); then
/// write_next() appends each tensor's bytes in the same order, and finish() fsyncs and renames the
/// temporary over `path`. Destroyed without finish() (an exception), the temporary is removed:
/// there is never a partial `path`. The caller decides whether `path` may be replaced.
/// Throws InputError for an empty / duplicated key or tensor name, a name over 64 bytes, a bad
/// shape (gguf_tensor_nbytes); OutputError naming `path` when writing fails.
class GgufStreamWriter {
 public:
  GgufStreamWriter(const std::string& path, const std::vector<std::pair<std::string, const GgufValue*>>& kvs,
                   std::vector<GgufTensorSpec> tensors, uint32_t alignment = 32);
  ~GgufStreamWriter();
  GgufStreamWriter(const GgufStreamWriter&) = delete;
  GgufStreamWriter& operator=(const GgufStreamWriter&) = delete;

  /// Appends the data of the next tensor (exactly gguf_tensor_nbytes of it, little-endian ggml
  /// layout) and the zero padding after it. Throws std::logic_error when `n` is not that size or
  /// every tensor was written already.
  void write_next(const void* data, size_t n);
  /// Spec of the tensor write_next() expects next (std::logic_error when all were written).
  const GgufTensorSpec& next() const;
  /// Renames the finished file over the output. Throws std::logic_error when a tensor is missing.
  void finish();
  /// Bytes written so far (the file size after finish()).
  uint64_t bytes_written() const;

 private:
  std::unique_ptr<AtomicFile> file_;
  std::vector<GgufTensorSpec> tensors_;
  std::vector<uint64_t> nbytes_;
  uint64_t alignment_ = 32;
  size_t next_ = 0;
};

}  // namespace sq
