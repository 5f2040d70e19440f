// The packed model file `.sqm`: sqkit's single output file, holding a (possibly quantized) model,
// its tokenizer and the full recipe that produced it. Written by SqmWriter (streaming, one tensor
// in memory at a time), read by SqmFile (memory-mapped, tensors used in place).
//
// Layout, format version 1 (also in docs/formats.md, "Packed model file (.sqm)"). All integers are
// little-endian; offsets are absolute byte offsets from the start of the file.
//
//   offset size  field
//   0      8     magic "SQKITMDL"
//   8      4     u32 format version = 1
//   12     4     u32 flags: bit 0 = at least one tensor is zstd-compressed; other bits are 0
//                (a reader rejects unknown bits as an unsupported feature)
//   16     8     u64 data_offset  = 128 (start of the tensor data region)
//   24     8     u64 data_size    (data_offset + data_size = header_offset)
//   32     8     u64 header_offset
//   40     8     u64 header_size  (bytes of the JSON header)
//   48     8     u64 table_offset = header_offset + header_size
//   56     8     u64 table_size   (table_offset + table_size = file size: the table ends the file)
//   64     8     u64 header_xxh3  = XXH3_64bits(JSON header bytes)
//   72     8     u64 table_xxh3   = XXH3_64bits(tensor table bytes)
//   80     40    reserved, written as zeros (ignored by version-1 readers)
//   120    8     u64 preamble_xxh3 = XXH3_64bits(bytes [0, 120))
//   128    ...   data region: the tensors, in table order, each starting at a multiple of 64
//                bytes, separated by 0-63 zero bytes of padding (none after the last tensor)
//   header_offset  the JSON header: one UTF-8 JSON object (compact, keys sorted)
//   table_offset   the tensor table: one UTF-8 JSON array (compact), one object per tensor:
//                  {"name": "model.layers.0.mlp.up_proj.weight", "dtype": "I8", "shape": [172, 64],
//                   "offset": 128, "stored_bytes": 11008, "raw_bytes": 11008,
//                   "compression": "none" | "zstd", "xxh3": "<16 lowercase hex digits>"}
//                  plus, for "zstd" only, "stored_xxh3": "<16 hex digits>"
//
// The 128-byte preamble is written last (the writer streams tensor data first, then the header and
// the table), so a file cut short while being written never carries a valid preamble.
//
// Tensors: bytes are little-endian, row-major (C order). "raw_bytes" is the tensor's size in
// memory (determined by dtype and shape, see sqm_byte_count); "stored_bytes" its size in the file:
// equal to raw_bytes for "none", the size of one zstd frame (level 3) for "zstd", which the writer
// keeps only when it is smaller than the raw bytes. "xxh3" is XXH3_64bits (seed 0) of the raw,
// uncompressed bytes; "stored_xxh3" that of the zstd frame (a zstd frame has bits a decoder
// ignores, so only a checksum of the stored bytes catches every flipped bit). An uncompressed
// tensor is 64-byte aligned inside the file, so a mapping of the file gives aligned, zero-copy
// tensors.
//
// Every byte of a file is covered by a check: the preamble by preamble_xxh3, the header and table
// by their checksums, the tensors by xxh3 / stored_xxh3, the padding by being zero.
//
// JSON header: the caller's object, unchanged except for the key "format", which the writer sets
// to {"name": "sqkit.sqm", "version": 1, "alignment": 64, "tensor_count": N} (replacing any
// "format" the caller passed). No timestamps or paths are added: the same tensors and header give
// a byte-identical file. Conventional keys (what sqkit writes and sq-inspect displays):
//   "producer"      string, e.g. "sqkit 0.1.0 sq-convert"
//   "model_config"  object: the model's hyper-parameters (ModelConfig fields)
//   "tokenizer"     object: {"format": "sentencepiece" | "llama2c" | "hf-json" | "gguf",
//                   "tensor": TENSOR_NAME, ...}
//   "quantization"  object: the full quantization recipe
//   "calibration"   object: calibration provenance (data set, samples, sequence length, hashes)
// The tokenizer file is stored verbatim as a 1-D U8 tensor whose name starts with "tokenizer"
// (sqkit uses "tokenizer.model" for SentencePiece, "tokenizer.bin" for llama2.c, "tokenizer.json"
// for a Hugging Face tokenizer.json, "tokenizer.gguf" for a metadata-only GGUF holding a GGUF
// model's tokenizer.* keys, formats/gguf_tokenizer.h), so it is
// checksummed and optionally compressed like any tensor; header "tokenizer"."tensor" names it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/mapped_file.h"

typedef struct ZSTD_CCtx_s ZSTD_CCtx;

namespace sq {

/// The .sqm format version this sqkit writes and reads.
inline constexpr uint32_t kSqmVersion = 1;
/// Size in bytes of the fixed preamble at the start of every .sqm file (= start of the data region).
inline constexpr uint64_t kSqmPreambleSize = 128;
/// Alignment in bytes of every tensor's data inside a .sqm file.
inline constexpr uint64_t kSqmAlignment = 64;
/// Preamble flag bit: at least one tensor is zstd-compressed.
inline constexpr uint32_t kSqmFlagCompressed = 1u;

/// Element types of .sqm tensors. File names are the enumerator names ("F32", "I4x2", ...).
///  * F32 / F16 / BF16: IEEE binary32, binary16, bfloat16 (4, 2, 2 bytes per element);
///  * I8 / U8: signed / unsigned 8-bit integers (1 byte); I32: signed 32-bit (4 bytes);
///  * I4x2 / U4x2: packed 4-bit integers, two per byte, the element with the lower flat index in
///    the low nibble (bits 0-3); I4x2 is two's complement (-8..7), U4x2 unsigned (0..15). The
///    shape is the logical element shape; the byte count is ceil(numel / 2) over the whole tensor
///    (flat, row-major; rows are not padded); the unused high nibble of an odd-length tensor's last
///    byte must be zero (SqmWriter rejects anything else).
enum class SqmDType : uint8_t { F32, F16, BF16, I8, U8, I32, I4x2, U4x2 };

/// Every SqmDType, in enumerator order.
inline constexpr SqmDType kSqmDTypes[] = {SqmDType::F32, SqmDType::F16, SqmDType::BF16, SqmDType::I8,
                                          SqmDType::U8,  SqmDType::I32, SqmDType::I4x2, SqmDType::U4x2};

/// The name of `dtype` as written in the tensor table ("F32", "I4x2", ...).
const char* sqm_dtype_name(SqmDType dtype);
/// The dtype called `name` (exact, case-sensitive), or nullopt when there is none.
std::optional<SqmDType> sqm_dtype_from_name(std::string_view name);
/// Bits per logical element: 32 (F32, I32), 16 (F16, BF16), 8 (I8, U8), 4 (I4x2, U4x2).
int sqm_dtype_bits(SqmDType dtype);
/// Number of logical elements of `shape` (1 for an empty shape, i.e. a scalar).
/// Throws std::invalid_argument for a negative dimension or a count above 2^60.
uint64_t sqm_numel(const std::vector<int64_t>& shape);
/// Bytes of a tensor of `dtype` and `shape`: numel * bits / 8, rounded up for the 4-bit types
/// (ceil(numel / 2)). Throws std::invalid_argument as sqm_numel does.
uint64_t sqm_byte_count(SqmDType dtype, const std::vector<int64_t>& shape);

/// One entry of the tensor table.
struct SqmTensorInfo {
  std::string name;
  SqmDType dtype = SqmDType::F32;
  std::vector<int64_t> shape;  ///< logical element shape (empty = scalar)
  uint64_t offset = 0;         ///< absolute file offset of the stored bytes (multiple of 64)
  uint64_t stored_bytes = 0;   ///< bytes in the file
  uint64_t raw_bytes = 0;      ///< bytes once decompressed (= sqm_byte_count(dtype, shape))
  bool compressed = false;     ///< true: the stored bytes are one zstd frame
  uint64_t xxh3 = 0;           ///< XXH3_64bits of the raw bytes
  uint64_t stored_xxh3 = 0;    ///< XXH3_64bits of the stored bytes (the zstd frame); == xxh3 when uncompressed
  /// Logical element count (sqm_numel(shape)).
  uint64_t numel() const { return sqm_numel(shape); }
  /// "zstd" or "none".
  const char* compression() const { return compressed ? "zstd" : "none"; }
};

/// Options of SqmWriter.
struct SqmWriteOptions {
  /// Compress each tensor with zstd (level 3); a tensor's compressed form is kept only when it is
  /// smaller than its raw bytes.
  bool compress = false;
  /// Replace an existing output file (otherwise the constructor refuses it).
  bool force = false;
};

/// Streaming writer of a .sqm file (layout at the top of this header).
///
/// Tensor data goes to "<path>.tmp-XXXXXX" (same directory) as each tensor is added, so memory
/// never holds more than one tensor (plus its compressed copy); finish() appends the JSON header
/// and the tensor table, patches the preamble, fsyncs and renames the temporary over `path`.
/// If the writer is destroyed without a successful finish() (an exception, an early return), the
/// temporary is removed: there is never a partial `path`. While it exists the temporary is
/// registered with the interrupt handlers (core/interrupt.h), so SIGINT/SIGTERM remove it too.
/// Not copyable or movable; not thread-safe.
class SqmWriter {
 public:
  /// Creates the temporary output beside `path`.
  /// Throws UsageError "PATH already exists (use --force to overwrite it)" when `path` exists and
  /// !options.force; OutputError naming `path` when the temporary cannot be created (missing
  /// directory, permission denied).
  explicit SqmWriter(const std::string& path, SqmWriteOptions options = {});
  /// Removes the temporary file unless finish() succeeded.
  ~SqmWriter();
  SqmWriter(const SqmWriter&) = delete;
  SqmWriter& operator=(const SqmWriter&) = delete;

  /// Appends one tensor: `nbytes` bytes at `data` (little-endian, row-major; for I4x2 / U4x2 the
  /// packed bytes), of element type `dtype` and logical shape `shape`.
  /// Throws std::invalid_argument when `name` is empty, longer than 4096 bytes, not valid UTF-8 or
  /// already added; when a dimension is negative; when `nbytes` != sqm_byte_count(dtype, shape) (the
  /// message names the tensor and both counts); when `data` is null and nbytes > 0; when an
  /// odd-length I4x2 / U4x2 tensor's unused last nibble is not zero.
  /// Throws std::logic_error after finish() or after an earlier write failure; OutputError naming
  /// the path when writing fails (disk full, ...).
  void add_tensor(const std::string& name, SqmDType dtype, const std::vector<int64_t>& shape, const void* data,
                  size_t nbytes);

  /// Writes the JSON header (`header` plus the "format" bookkeeping key) and the tensor table,
  /// patches the preamble, fsyncs and atomically renames the temporary to the output path.
  /// Throws std::invalid_argument when `header` is not a JSON object or holds invalid UTF-8 (the
  /// writer stays usable); UsageError when !force and the output path appeared meanwhile;
  /// OutputError naming the path on a write / fsync / rename failure; std::logic_error when called
  /// twice or after a failure.
  void finish(const nlohmann::json& header);

  /// The output path.
  const std::string& path() const { return path_; }
  /// The temporary file being written (empty after finish()).
  const std::string& temp_path() const { return tmp_path_; }
  /// Tensors added so far.
  size_t tensor_count() const { return entries_.size(); }
  /// Bytes written to the file so far (preamble placeholder, tensors and padding).
  uint64_t bytes_written() const { return pos_; }

 private:
  void write_all(const void* data, size_t n);
  void check_usable(const char* what) const;
  void discard() noexcept;

  std::string path_;
  std::string tmp_path_;
  SqmWriteOptions options_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool finished_ = false;
  bool failed_ = false;
  std::vector<SqmTensorInfo> entries_;
  std::map<std::string, size_t> index_;
  ZSTD_CCtx* cctx_ = nullptr;
  int temp_slot_ = -1;  ///< register_temp_file() slot of tmp_path_
};

/// A tensor's raw (uncompressed) bytes: a view valid while the SqmFile is alive.
struct SqmBytes {
  const uint8_t* data = nullptr;  ///< nullptr for an empty tensor
  size_t size = 0;
};

/// True when `path` starts with the .sqm magic "SQKITMDL" (a cheap sniff; SqmFile::open validates).
bool looks_like_sqm(const std::string& path);

/// A memory-mapped, validated .sqm file.
///
/// open() checks, each failure an InputError whose message starts with the path:
///  * the magic ("PATH: not an sqkit .sqm file"; also for files shorter than 8 bytes);
///  * the version (UnsupportedError "PATH: .sqm format version 7 is not supported (this sqkit reads
///    version 1)");
///  * the size (a file shorter than its preamble or than the preamble's offsets say is "truncated"),
///    the preamble checksum, unknown flag bits (UnsupportedError), the offset chain
///    data -> header -> table -> end of file (trailing bytes are rejected);
///  * the header and table checksums ("checksum mismatch in the JSON header (file corrupt)"), the
///    header being a JSON object, the table a JSON array of well-formed entries;
///  * each entry: unique non-empty name, known dtype (else UnsupportedError) and compression,
///    non-negative shape of rank <= 16, raw_bytes == dtype x shape (overflow-checked, so no
///    allocation is ever sized from an unchecked number), stored_bytes == raw_bytes when
///    uncompressed, a zstd frame whose declared content size is raw_bytes and within zstd's maximum
///    expansion (32768x) when compressed, offsets 64-aligned, inside the data region, in table order
///    with no overlap and 0-63 zero padding bytes in between;
///  * with verify_checksums, every tensor's XXH3 ("PATH: checksum mismatch in tensor 'NAME' (file
///    corrupt)"); a compressed tensor's stored_xxh3 is checked first, then its raw XXH3 by
///    streaming decompression (bounded memory).
class SqmFile {
 public:
  /// Maps and validates `path` as described above. Throws InputError / UnsupportedError.
  static std::shared_ptr<SqmFile> open(const std::string& path, bool verify_checksums = true);
  /// Validates an already mapped file (or a MappedFile::from_bytes buffer) as open() does;
  /// messages name file->path().
  static std::shared_ptr<SqmFile> open(std::shared_ptr<const MappedFile> file, bool verify_checksums = true);

  SqmFile(const SqmFile&) = delete;
  SqmFile& operator=(const SqmFile&) = delete;

  /// The path the file was opened from.
  const std::string& path() const { return path_; }
  /// Size of the file in bytes.
  uint64_t file_size() const { return file_->size(); }
  /// Format version of the file (always kSqmVersion once open() succeeded).
  uint32_t version() const { return kSqmVersion; }
  /// Preamble flags (kSqmFlagCompressed).
  uint32_t flags() const { return flags_; }
  /// The whole JSON header, including the "format" key the writer added.
  const nlohmann::json& header() const { return header_; }
  /// Tensor entries in table (= file) order.
  const std::vector<SqmTensorInfo>& tensors() const { return tensors_; }
  /// Tensor names in table order.
  std::vector<std::string> names() const;
  /// Whether the file holds a tensor called `name`.
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  /// The entry `name`; throws InputError "PATH: no tensor 'NAME'" when absent.
  const SqmTensorInfo& info(const std::string& name) const;

  /// The raw bytes of tensor `name`: zero-copy into the mapping (64-byte aligned) when stored
  /// uncompressed; decompressed once into an owned buffer (then cached) when zstd-compressed.
  /// Valid while this object is alive. Thread-safe. Throws InputError naming the file and the
  /// tensor when absent or when the zstd data does not decompress to exactly raw_bytes bytes.
  SqmBytes raw(const std::string& name) const;

  /// Recomputes every tensor's XXH3 (for a compressed tensor: the stored bytes' XXH3, then the raw
  /// bytes' by streaming decompression). Throws
  /// InputError "PATH: checksum mismatch in tensor 'NAME' (file corrupt)" on the first mismatch.
  void verify_checksums() const;
  /// Recomputes the XXH3 of one tensor; throws as verify_checksums().
  void verify_checksum(const SqmTensorInfo& info) const;

  /// The underlying mapping.
  const std::shared_ptr<const MappedFile>& mapping() const { return file_; }

 private:
  SqmFile() = default;
  void parse();
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  std::shared_ptr<const MappedFile> file_;
  uint32_t flags_ = 0;
  nlohmann::json header_;
  std::vector<SqmTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::string, std::unique_ptr<std::vector<uint8_t>>> cache_;
};

}  // namespace sq
