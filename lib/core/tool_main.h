// Shared `main` wrapper for the sq-* tools: exceptions become one line on stderr and an exit status.
#pragma once

#include <functional>
#include <filesystem>
#include <string>
#include <vector>

namespace sq {

/// Exit statuses of every sq-* tool.
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailure = 1,  ///< output/runtime failure, internal error
  kExitInput = 2,    ///< usage error or bad input file (UsageError, InputError, UnsupportedError)
  kExitGate = 3,     ///< sq-eval: every figure was reported, but a quality gate (--max-kld, ...) is broken
};

/// Runs `body` and maps exceptions to exit statuses, printing "TOOL: error: MESSAGE" on stderr:
/// UsageError/InputError → 2, OutputError and other std::exception → 1, std::bad_alloc → 1
/// ("out of memory"). Returns body()'s result otherwise. Before running `body`, installs the
/// SIGINT/SIGTERM handlers of core/interrupt.h (registered temporary outputs are removed, exit
/// status 128 + signal).
int run_tool(const char* tool_name, const std::function<int()>& body);

/// Refuses to write `out_path` over one of `inputs`: throws UsageError "-o OUT is one of the
/// inputs; refusing to overwrite it" when `out_path` names the same file as an input (hard links and
/// symbolic links included) or, for an input that is a directory (a Hugging Face checkpoint), an
/// existing file directly inside it (its config, weights or tokenizer). Empty inputs are skipped.
void check_output_is_not_an_input(const std::string& out_path, const std::vector<std::string>& inputs,
                                  const std::string& option = "-o");

/// Refuses (UsageError naming `option` and `path`) a `parent` directory of output `path` that does
/// not exist (naming the first component of it that is a file, if any: "-o in.sqm/sub"), is not a
/// directory, or is not writable.
void check_parent_directory(const std::string& option, const std::string& path, const std::filesystem::path& parent);

/// Checks, before any work starts, that the output `path` given with `option` (e.g. "-o", "--json")
/// can be written: "-" passes when `allow_stdout` (a JSON report on stdout); otherwise it must not be one of `inputs`
/// (check_output_is_not_an_input, refused even with `force`), not a directory, not an existing file
/// unless `force`, and its directory must exist, be a directory and be writable. Throws UsageError
/// "OPTION PATH: ..." naming what is wrong. Outputs are then written via a temporary and a rename
/// (formats/atomic_file.h), so nothing partial ever appears under `path`.
void check_output_path(const std::string& option, const std::string& path, bool force,
                       const std::vector<std::string>& inputs, bool allow_stdout = false);

/// check_output_path() for an output directory (e.g. a checkpoint directory a tool writes): not one
/// of `inputs`, not an existing file, not an existing non-empty directory unless `force`, and its
/// parent directory exists and is writable. Throws UsageError "OPTION PATH: ...".
void check_output_directory(const std::string& option, const std::string& path, bool force,
                            const std::vector<std::string>& inputs);

}  // namespace sq
