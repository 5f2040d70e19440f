// Crash-safe output files: write to a temporary file in the destination directory, fsync, rename.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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

/// An exclusively created, interrupt-registered temporary file beside an output (see
/// create_temp_beside()).
struct TempBeside {
  std::string path;  ///< "<output>.tmp-<pid>-<6 random characters>"
  int fd = -1;       ///< open for writing (O_WRONLY | O_CLOEXEC), mode 0644
  int slot = -1;     ///< register_temp_file() slot of `path` (-1 when the registry was full)
};

/// Removes the temporaries that killed writers (SIGKILL, power loss) left beside `output`: regular
/// files, and directories with everything in them (sq-export's temporary output directories), in
/// the output's directory named exactly "<output file name>.tmp-<pid>-<6 letters/digits>"
/// whose process <pid> no longer exists (kill(pid, 0) fails with ESRCH). Temporaries of live
/// processes (including this one) and every other file are left alone; a pid reused by an unrelated
/// live process keeps its stale file (conservative). Returns the paths removed; never throws (an
/// unreadable directory removes nothing).
std::vector<std::string> remove_stale_temporaries(const std::string& output);

/// Creates "<output>.tmp-<pid>-<random>" in the output's directory with O_CREAT | O_EXCL, after
/// removing stale temporaries of dead writers of the same output (remove_stale_temporaries()). The name is
/// registered with the interrupt handlers (core/interrupt.h) *before* the file is created, so there
/// is no moment in which the file exists but a SIGINT/SIGTERM would leave it behind (a handler that
/// runs before creation just fails to unlink a name that does not exist yet). The pid in the name
/// makes a clash with another live process's temporary impossible; a clash with a stale temporary
/// of a dead process is retried with a new name. Throws OutputError naming `output` when no
/// temporary can be created (directory missing or not writable, ...).
TempBeside create_temp_beside(const std::string& output);

/// A temporary directory beside an output directory (see create_temp_dir_beside()).
struct TempDirBeside {
  std::string path;  ///< "<output>.tmp-<pid>-<6 random characters>", mode 0777 & ~umask
  int slot = -1;     ///< register_temp_dir() slot of `path` (-1 when the registry was full)
};

/// Creates the directory "<output>.tmp-<pid>-<random>" beside `output` (mkdir, which fails on an
/// existing name), after removing stale temporaries of dead writers of the same output. As for
/// create_temp_beside(), the name is registered (register_temp_dir()) before the directory exists,
/// so a SIGINT/SIGTERM at any moment removes it and what was written into it. Throws OutputError
/// naming `output` when no directory can be created.
TempDirBeside create_temp_dir_beside(const std::string& output);

/// Moves the finished directory `tmp` to `output`. Without `replace`, renameat2(RENAME_NOREPLACE):
/// an `output` that appeared meanwhile (another writer finished first) is left as it is and
/// OutputError says so; with `replace`, an existing `output` directory is exchanged with `tmp`
/// (RENAME_EXCHANGE) and the old one, now at `tmp`, is removed. Returns normally only when `output`
/// holds `tmp`'s contents.
void commit_temp_dir(const std::string& tmp, const std::string& output, bool replace);

/// Replaces `path` with `content` atomically (AtomicFile).
void write_file_atomic(const std::string& path, std::string_view content);

/// For writers that need a file name: `write` receives the temporary file's path, fills it, and on
/// success the temporary is committed over `path`; if `write` throws, it is removed.
void write_file_atomic_with(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);

}  // namespace sq
