// Read-only memory mapping of a whole file (POSIX mmap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sq {

/// A read-only, private memory mapping of an entire file. Pages are loaded lazily by the OS, so a
/// multi-GiB checkpoint costs address space, not resident memory, until touched.
/// Not copyable; share it through std::shared_ptr (Tensor views keep it alive that way).
class MappedFile {
 public:
  /// Maps `path`. Throws InputError ("cannot open FILE: reason") when the file is missing,
  /// unreadable or a directory. An empty file maps to size()==0, data()==nullptr.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  /// An in-memory stand-in for a mapped file: a 64-byte aligned copy of `size` bytes at `data`,
  /// reported under the name `path` (used in error messages only). Lets every reader that works on
  /// a MappedFile parse a byte buffer (tests, fuzz targets) through the same code as a real file.
  /// An empty buffer gives size()==0, data()==nullptr, like an empty file.
  static std::shared_ptr<const MappedFile> from_bytes(const uint8_t* data, size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  /// Drops this process's resident pages of bytes [offset, offset + size) (the whole pages inside
  /// the range; madvise MADV_DONTNEED): after a reader copied them out (e.g. widened BF16 to
  /// FP32), so that reading a file larger than memory piece by piece keeps the resident set small.
  /// The bytes stay readable (they are read again from the file when touched). No-op for a
  /// from_bytes() buffer or an empty range; ranges past the end are clipped.
  void release(size_t offset, size_t size) const;
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  bool owned_ = false;  ///< data_ is a from_bytes() copy (freed, not unmapped)
};

/// Reads a whole (small) file into a string. Throws InputError naming the file on failure.
std::string read_file_to_string(const std::string& path);

}  // namespace sq
