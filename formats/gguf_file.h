// Reader of GGUF files (llama.cpp / ggml checkpoints), versions 2 and 3, little-endian.
//
// Format (spec: ggml's docs/gguf.md; the `gguf` Python package's GGUFReader reads the same):
//   header      u32 magic 0x46554747 ("GGUF" in file order), u32 version (2 or 3),
//               u64 tensor_count, u64 metadata_kv_count;
//   metadata    metadata_kv_count x { string key, u32 value_type, value };
//   tensor info tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type,
//               u64 offset };
//   padding     to the next multiple of ALIGNMENT (metadata `general.alignment`, a u32, default 32);
//   data        the tensors' bytes; `offset` is relative to the start of this section and is a
//               multiple of ALIGNMENT.
// A string is u64 length + that many bytes (no NUL). Value types: 0 u8, 1 i8, 2 u16, 3 i16,
// 4 u32, 5 i32, 6 f32, 7 bool (one byte, 0 or 1), 8 string, 9 array, 10 u64, 11 i64, 12 f64.
// An array is u32 element type + u64 count + the elements (arrays may nest). All numbers are
// little-endian. dims are in ggml order: dims[0] is the contiguous (fastest-varying) dimension, so
// the row-major shape (numpy, PyTorch) is the reverse; a tensor is dims[1]*dims[2]*dims[3] rows of
// dims[0] elements, each row a whole number of blocks of its ggml type (formats/ggml_types.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/ggml_types.h"
#include "formats/mapped_file.h"

namespace sq {

/// GGUF metadata value types (the u32 stored before each value).
enum class GgufValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

/// "u8", "string", "array", ... ("type <n>" for an unknown id).
std::string gguf_value_type_name(uint32_t type);

/// One metadata value, decoded and validated when the file is opened.
///  * integer scalars (U8..I64): `integer` holds the value widened to 64 bits (sign-extended for the
///    signed types, zero-extended for the unsigned ones; a U64 above INT64_MAX is stored with its
///    bits, read it as uint64_t);
///  * BOOL: `integer` is 0 or 1; F32 / F64: `real` (F32 widened exactly); STRING: `str`;
///  * ARRAY: `elem_type` and `count`. Elements of a fixed-size type stay in the mapping: `elems`
///    points at `count` little-endian elements (read them with the element accessors below);
///    string elements are `strings` (views into the mapping); nested arrays are `items`.
/// Pointers and views into the mapping are valid while the GgufFile (or its mapping()) lives.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  uint64_t integer = 0;
  double real = 0.0;
  std::string str;
  GgufValueType elem_type = GgufValueType::U8;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> items;

  /// True for U8, I8, U16, I16, U32, I32, U64, I64 (not BOOL).
  bool is_integer() const;
  /// Element `i` (< count) of an array of an integer or BOOL element type, widened like `integer`.
  uint64_t integer_element(uint64_t i) const;
  /// Element `i` (< count) of an array of F32 or F64 elements, as double (exact).
  double real_element(uint64_t i) const;
};

/// One tensor info entry, validated against the file.
struct GgufTensorInfo {
  std::string name;            ///< 1..64 bytes, unique in the file
  std::vector<int64_t> dims;   ///< ggml order (dims[0] contiguous), 1..4 entries, each >= 0
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;         ///< byte offset in the data section, a multiple of the alignment
  uint64_t nbytes = 0;         ///< numel / block_size * type_size
  int64_t numel = 0;           ///< product of dims (fits int64)

  /// Elements per row: dims[0].
  int64_t row_length() const { return dims[0]; }
  /// Number of rows: numel / dims[0] (0 when the tensor is empty).
  int64_t rows() const { return dims[0] == 0 ? 0 : numel / dims[0]; }
  /// The row-major (numpy / PyTorch) shape: dims reversed.
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
};

/// A memory-mapped, fully validated GGUF file (v2 or v3). Nothing is copied but the metadata
/// scalars and the tensor infos; tensor bytes are read from the mapping (formats/gguf_dequantize.h
/// turns them into FP32).
///
/// Opening validates everything before it is used; each failure is an InputError whose message
/// names the file and the field / key / tensor at fault and what was expected:
///   * the file ends before a field (truncation), wrong magic, version other than 2 / 3 (a
///     big-endian file shows as a byte-swapped version);
///   * tensor_count / metadata_kv_count larger than the file could hold (each tensor info takes at
///     least 33 bytes, each key/value at least 14);
///   * a string (key, value, tensor name) longer than the bytes left; an empty key or tensor name,
///     a tensor name over 64 bytes; a duplicated key or tensor name;
///   * an unknown value type or array element type; bool bytes other than 0 / 1; an array whose
///     count x element size (for strings and arrays: its minimum encoded size) exceeds the bytes
///     left; arrays nested more than 8 deep, or more than 2^20 arrays inside arrays in the file;
///   * `general.alignment` not an integer, zero, not a power of two or above 2^30;
///   * n_dims outside 1..4; a dim above INT64_MAX; a product of dims overflowing int64; an unknown
///     ggml type id (UnsupportedError, an InputError); a row length (dims[0]) that is not a whole
///     number of blocks of the type; a byte size overflowing;
///   * a tensor offset that is not a multiple of the alignment, data past the end of the file, two
///     tensors whose bytes overlap.
class GgufFile {
 public:
  /// Maps and validates `path`. Throws InputError as described above (or when it cannot be read).
  explicit GgufFile(const std::string& path);
  /// Validates an already mapped file (or MappedFile::from_bytes buffer); messages name
  /// file->path(). Throws like the path constructor.
  explicit GgufFile(std::shared_ptr<const MappedFile> file);

  /// The file's path (or the from_bytes name), as used in every message.
  const std::string& path() const { return path_; }
  /// GGUF version: 2 or 3.
  uint32_t version() const { return version_; }
  /// general.alignment (32 when absent).
  uint64_t alignment() const { return alignment_; }
  /// Byte offset of the data section in the file.
  uint64_t data_offset() const { return data_offset_; }
  /// The underlying mapping (shared ownership); metadata views and tensor bytes point into it.
  const std::shared_ptr<const MappedFile>& mapping() const { return file_; }

  // ---- metadata --------------------------------------------------------------------------------

  /// Every key/value pair in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  /// Whether metadata key `key` is present.
  bool has(const std::string& key) const { return index_.count(key) != 0; }
  /// The value of `key`, or nullptr when absent.
  const GgufValue* find(const std::string& key) const;
  /// The value of `key`; throws InputError naming the file and the key when absent.
  const GgufValue& value(const std::string& key) const;

  /// Integer getters: the value must be a scalar of any integer type (U8..I64, not BOOL) whose
  /// value fits the requested type (as llama.cpp's loader accepts); throws InputError naming the
  /// file and the key when the key is missing, of another type, or out of range.
  uint32_t get_u32(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  /// Float getters: an F32 or F64 scalar (get_f32 rounds an F64 to nearest); throws InputError
  /// naming the key when missing or of another type.
  float get_f32(const std::string& key) const;
  double get_f64(const std::string& key) const;
  /// BOOL scalar; throws InputError naming the key when missing or of another type.
  bool get_bool(const std::string& key) const;
  /// STRING scalar; throws InputError naming the key when missing or of another type.
  std::string get_string(const std::string& key) const;
  /// ARRAY: number of elements; throws InputError naming the key when missing or not an array.
  uint64_t get_array_size(const std::string& key) const;
  /// ARRAY of STRING, copied; throws InputError naming the key when missing or of another type.
  std::vector<std::string> get_string_array(const std::string& key) const;
  /// ARRAY of F32 (or F64, rounded); throws InputError naming the key when missing or of another
  /// type.
  std::vector<float> get_f32_array(const std::string& key) const;
  /// ARRAY of any integer type whose every element fits int32; throws InputError naming the key
  /// when missing, of another type or an element is out of range.
  std::vector<int32_t> get_i32_array(const std::string& key) const;

  // ---- tensors ---------------------------------------------------------------------------------

  /// Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// Whether a tensor named `name` is present.
  bool has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }
  /// The info of tensor `name`; throws InputError naming the file and the tensor when absent.
  const GgufTensorInfo& tensor(const std::string& name) const;
  /// The tensor's raw bytes in the mapping (info.nbytes bytes; nullptr when empty).
  const uint8_t* tensor_data(const GgufTensorInfo& info) const;

 private:
  void parse();
  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const;
  int64_t integer_in(const std::string& key, int64_t lo, uint64_t hi) const;

  std::shared_ptr<const MappedFile> file_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace sq
