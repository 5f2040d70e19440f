// Reader and writer for the safetensors format (Hugging Face), plus exact FP16 / BF16 <-> FP32
// conversions.
//
// Format (spec: https://github.com/huggingface/safetensors, README "Format"):
//   * 8 bytes: N, unsigned 64-bit little-endian, the size of the JSON header;
//   * N bytes: a UTF-8 JSON object (may be padded at the end with spaces). Each key is a tensor
//     name mapping to {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}; the
//     optional key "__metadata__" maps to a flat string -> string object;
//   * the data section: the rest of the file. `data_offsets` are byte offsets relative to the start
//     of the data section; values are little-endian, row-major (C order).
// Dtype strings: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/mapped_file.h"

namespace sq {

// ---- scalar conversions ------------------------------------------------------------------------

/// IEEE 754 binary16 bits -> float (exact: zeros, subnormals, normals, +-inf; NaN stays NaN with
/// its sign and payload shifted into the high mantissa bits).
float half_to_float(uint16_t bits);
/// bfloat16 bits (the high 16 bits of an IEEE binary32) -> float (exact).
float bf16_to_float(uint16_t bits);
/// float -> IEEE binary16 bits, rounding to nearest, ties to even (as numpy `astype(float16)`):
/// values >= 65520 in magnitude become inf, tiny values become (signed) subnormals or zero.
/// NaN becomes a quiet NaN with the same sign (0x7E00 for the default NaN).
uint16_t float_to_half(float value);
/// float -> bfloat16 bits, rounding to nearest, ties to even (as PyTorch `.to(torch.bfloat16)`);
/// finite values past the bfloat16 range become inf; NaN becomes a quiet NaN with the same sign.
uint16_t float_to_bf16(float value);

/// Size in bytes of one element of safetensors dtype `dtype` ("F32" -> 4), or 0 when unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// ---- reader ------------------------------------------------------------------------------------

/// One tensor entry of a safetensors header.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;              ///< as written in the file, e.g. "BF16"
  std::vector<int64_t> shape;     ///< may be empty (scalar, one element)
  uint64_t begin = 0;             ///< byte offset in the data section
  uint64_t end = 0;               ///< one past the last byte; end - begin == numel * dtype size
  int64_t numel() const;
};

/// A memory-mapped, fully validated safetensors file. Tensor bytes are never copied unless asked
/// (the file is mapped with MappedFile; pages load lazily).
///
/// Opening validates the whole header; each failure is an InputError whose message names the file
/// (and tensor) and what was expected: file missing or shorter than 8 bytes, header length past the
/// end of the file or above 100 MB (the reference implementation's limit), JSON malformed or not an
/// object, an entry that is not an object or lacks "dtype" (string) / "shape" (array of
/// non-negative integers) / "data_offsets" (two non-negative integers), begin > end, offsets past
/// the data section, end - begin != numel * dtype size (overflow-checked), two tensors whose byte
/// ranges overlap, "__metadata__" that is not a string -> string object. An unknown dtype string
/// throws UnsupportedError (its byte size, hence the layout, cannot be checked). Gaps between
/// tensors are tolerated.
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Throws InputError / UnsupportedError as described above.
  explicit SafetensorsFile(const std::string& path);
  /// Validates an already mapped file (or MappedFile::from_bytes buffer); messages name
  /// file->path(). Throws like the path constructor.
  explicit SafetensorsFile(std::shared_ptr<const MappedFile> file);

  const std::string& path() const { return path_; }
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  /// The entry `name`; throws InputError naming the file and the tensor when absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  const std::string& dtype(const std::string& name) const { return info(name).dtype; }
  const std::vector<int64_t>& shape(const std::string& name) const { return info(name).shape; }
  /// Pointer to the tensor's raw little-endian bytes inside the mapping (info(name).end - begin
  /// bytes; nullptr for an empty tensor). Valid while this object or mapping() is alive.
  const uint8_t* raw_data(const std::string& name) const;
  /// The "__metadata__" object (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The underlying mapping (shared ownership).
  const std::shared_ptr<const MappedFile>& mapping() const { return file_; }
  /// Byte offset of the data section inside the file (8 + header length).
  uint64_t data_start() const { return data_start_; }

  /// The tensor `name` as FP32 with the file's shape.
  ///  * F32: a zero-copy Tensor::view into the mapping when its address is 4-byte aligned,
  ///    otherwise an owned copy;
  ///  * F16 / BF16: widened exactly into an owned Tensor.
  /// Views keep the mapping alive themselves; `keepalive`, when given, is additionally kept alive
  /// by the returned tensor (e.g. an object owning several shards).
  /// Throws InputError when `name` is absent, UnsupportedError naming the dtype, the tensor and
  /// the file for any other dtype (F64, I8, ...).
  Tensor load_f32(const std::string& name, std::shared_ptr<const void> keepalive = nullptr) const;

 private:
  std::string path_;
  std::shared_ptr<const MappedFile> file_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// ---- writer ------------------------------------------------------------------------------------

/// Produces elements [begin, end) of a row-major FP32 tensor into out[0 … end−begin) (a tensor
/// too large to hold, written piece by piece). The writer calls it in order, with `begin` a
/// multiple of kSafetensorsWriteChunk.
using TensorGenerator = std::function<void(int64_t begin, int64_t end, float* out)>;

/// Elements per piece of the writer's conversion buffer (and of a TensorGenerator call): 2^20.
inline constexpr int64_t kSafetensorsWriteChunk = int64_t(1) << 20;

/// One tensor to write: its name, the dtype to store ("F32", "F16" or "BF16") and the FP32 values
/// (shape taken from the tensor); or, when `generate` is set, `raw_shape` and the FP32 values the
/// generator produces piece by piece (memory: one piece, whatever the tensor's size); or, when
/// `raw` is set, `raw_shape` and the little-endian bytes `*raw` stored verbatim as `dtype` (any
/// dtype safetensors_dtype_size knows: I8, I32, I64, ...; the byte count must be
/// numel(raw_shape) × its size).
struct SafetensorsOutput {
  std::string name;
  std::string dtype = "F32";
  Tensor tensor;
  std::vector<int64_t> raw_shape = {};
  std::shared_ptr<const std::string> raw = nullptr;
  TensorGenerator generate = nullptr;
  /// Element count: of raw_shape for raw and generated entries, else of the tensor.
  int64_t numel() const;
};

/// Writes a safetensors file holding `tensors` in the given order (data section contiguous, in that
/// order) and `metadata` as "__metadata__" (omitted when empty). FP32 values (held or generated)
/// are converted with round-to-nearest-even for F16 / BF16; raw entries are copied as they are. The JSON header is padded with spaces so that the data
/// section starts at a multiple of 8 bytes.
/// The file is written to `path + ".tmp-XXXXXX"` and renamed over `path` only when complete, so a
/// failure never leaves a partial `path`. Throws OutputError naming the file on I/O failure,
/// UsageError for an unsupported dtype, an empty / duplicate / "__metadata__" name.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata = {});


}  // namespace sq
