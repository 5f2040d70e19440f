// Crash-safe output files: write to a temporary file in the destination directory, fsync, rename.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace sq {

/// Replaces `path` with `content` atomically: the bytes go to "<path>.tmp-XXXXXX" in the same
/// directory, are fsync'ed, and the temporary is renamed over `path`. On any failure the temporary
/// is removed, `path` is untouched, and OutputError naming `path` is thrown.
void write_file_atomic(const std::string& path, std::string_view content);

/// Same, for writers that stream: `write` receives the temporary file's path and must create it;
/// if it throws, the temporary is removed and the exception propagates.
void write_file_atomic_with(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);

}  // namespace sq
