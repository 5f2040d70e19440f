// Shared `main` wrapper for the sq-* tools: exceptions become one line on stderr and an exit status.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace sq {

/// Exit statuses of every sq-* tool.
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailure = 1,  ///< output/runtime failure, internal error
  kExitInput = 2,    ///< usage error or bad input file (UsageError, InputError, UnsupportedError)
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
void check_output_is_not_an_input(const std::string& out_path, const std::vector<std::string>& inputs);

}  // namespace sq
