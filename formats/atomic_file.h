// Crash-safe output files: write to a temporary file in the destination directory, fsync, rename.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace sq {

/// A file being written: bytes go to "<path>.tmp-XXXXXX" (created exclusively in the destination
/// directory) and reach `path` only on commit(), which fsyncs and renames atomically. If the object
/// is destroyed without commit() (an exception, an early return), the temporary is removed, so a
/// partial output never appears under `path`. While it exists the temporary is registered with the
/// interrupt handlers (core/interrupt.h), so SIGINT/SIGTERM remove it too. Errors throw OutputError
/// naming `path`.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `size` bytes.
  void write(const void* data, size_t size);
  /// Current write position (bytes written so far).
  size_t position() const { return position_; }
  /// Writes `size` bytes at absolute `offset` (e.g. patching a preamble), not moving position().
  void write_at(size_t offset, const void* data, size_t size);
  /// Path of the temporary file, for libraries that must open a file by name (HDF5).
  const std::string& temp_path() const { return tmp_; }
  /// fsync, close, rename over `path`, fsync the directory.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  size_t position_ = 0;
  bool committed_ = false;
  int temp_slot_ = -1;  ///< register_temp_file() slot of tmp_
};

/// Replaces `path` with `content` atomically (AtomicFile).
void write_file_atomic(const std::string& path, std::string_view content);

/// For writers that need a file name: `write` receives the temporary file's path, fills it, and on
/// success the temporary is committed over `path`; if `write` throws, it is removed.
void write_file_atomic_with(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);

}  // namespace sq
