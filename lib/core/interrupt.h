// Interrupted tools leave no partial outputs: an async-signal-safe registry of temporary output
// files, and SIGINT/SIGTERM handlers that remove every registered file before exiting.
//
// Writers that stream into "<out>.tmp-PID-XXXXXX" (AtomicFile, SqmWriter, via create_temp_beside() in
// formats/atomic_file.h) register the temporary's name just before creating it and unregister it
// once it is renamed over the output or removed. The handlers
// (installed by run_tool for every sq-* tool) unlink() each registered path, print one line on
// stderr and _exit(128 + signal): 130 for SIGINT, 143 for SIGTERM, as a shell reports a process
// killed by that signal. Destructors do not run on that path; only unlink(), write() and _exit(),
// all async-signal-safe, are used.
//
// Temporary output directories ("<out>.tmp-PID-XXXXXX", written by sq-export) are registered with
// register_temp_dir(): the handlers first unlink the registered files, then empty each registered
// directory (its direct entries, by getdents64/unlinkat, no allocation) and remove it with rmdir().
//
// Limits: at most kMaxTempFiles files and directories registered at once and paths of at most kMaxTempPathBytes - 1
// bytes (a path that does not fit is not registered and is then only removed by its owner's normal
// cleanup). SIGKILL, power loss and crashes are not covered: there,
// the writers' temp-file + rename protocol still guarantees that no partial output appears under
// the output's own name.
#pragma once

#include <cstddef>

namespace sq {

/// Capacity of the temporary-file registry.
inline constexpr int kMaxTempFiles = 64;
/// Longest registrable path, including its terminating NUL.
inline constexpr size_t kMaxTempPathBytes = 4096;

/// Records `path` (a temporary file just created) so that an interrupt removes it. Thread-safe and
/// lock-free. Returns the slot to pass to unregister_temp_file(), or -1 when the registry is full or
/// the path is too long (the file is then not removed on an interrupt).
int register_temp_file(const char* path) noexcept;

/// Records `path` (a temporary directory about to be created, or just created) so that an interrupt
/// empties and removes it: its regular files and symlinks are unlinked (one level: writers put no
/// subdirectories in it), then the directory itself. Same slots, limits and thread safety as
/// register_temp_file(); unregister with unregister_temp_file().
int register_temp_dir(const char* path) noexcept;

/// Forgets the slot returned by register_temp_file() or register_temp_dir() (after the temporary was renamed or removed).
/// A negative slot is ignored. Thread-safe.
void unregister_temp_file(int slot) noexcept;

/// Number of temporary files and directories currently registered (for tests and diagnostics).
int registered_temp_file_count() noexcept;

/// Installs the SIGINT and SIGTERM handlers: remove every registered temporary file, write
/// "TOOL: interrupted by SIGNAME; removed N temporary file(s)" on stderr, and _exit(128 + signal).
/// `tool_name` (copied, truncated to 63 bytes) prefixes the message. Idempotent: calling it again
/// only updates the name. A signal that was ignored when the process started (SIG_IGN, e.g. a
/// background job of a non-interactive shell getting SIGINT) stays ignored.
void install_interrupt_handlers(const char* tool_name) noexcept;

/// RAII registration of one temporary file path (register in the constructor, unregister in the
/// destructor or on release()). Not copyable.
class TempFileRegistration {
 public:
  /// Registers `path` (see register_temp_file()).
  explicit TempFileRegistration(const char* path) noexcept : slot_(register_temp_file(path)) {}
  /// Unregisters, if still registered.
  ~TempFileRegistration() { release(); }
  TempFileRegistration(const TempFileRegistration&) = delete;
  TempFileRegistration& operator=(const TempFileRegistration&) = delete;
  /// Unregisters now (call after the file was renamed or removed); later calls do nothing.
  void release() noexcept {
    unregister_temp_file(slot_);
    slot_ = -1;
  }
  /// Whether the path is registered (false when the registry was full or the path too long).
  bool registered() const noexcept { return slot_ >= 0; }

 private:
  int slot_;
};

}  // namespace sq
