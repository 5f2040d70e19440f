// Test helpers: run a command and capture its output and exit status; scratch directories.
#pragma once

#include <string>
#include <vector>

namespace sq::test {

struct ProcessResult {
  int exit_status = -1;  ///< exit code, or 128+signal when killed by a signal
  std::string out;       ///< captured stdout
  std::string err;       ///< captured stderr
};

/// Runs `argv` (argv[0] is the executable path) with stdin from /dev/null, waits, and captures
/// stdout and stderr. Kills the child after `timeout_s` seconds (exit_status then 128+SIGKILL).
/// With `cwd` not empty the child runs in that working directory (exit_status 126 when it cannot
/// change to it).
ProcessResult run_process(const std::vector<std::string>& argv, int timeout_s = 300, const std::string& cwd = "");

/// A fresh empty directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  /// path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Writes `bytes` to `path` (binary), throwing std::runtime_error on failure.
void write_file(const std::string& path, const std::string& bytes);
/// Reads the whole file at `path` (binary).
std::string read_file(const std::string& path);
/// Writes `dir`/ids.txt: `n` token ids drawn uniformly from [0, vocab) with std::mt19937(seed),
/// space-separated (a --token-ids file, formats/token_ids_file.h); returns its path.
std::string write_random_token_ids(const ScratchDir& dir, int vocab, int n, unsigned seed);

}  // namespace sq::test
