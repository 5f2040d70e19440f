// Shared `main` wrapper for the sq-* tools: exceptions become one line on stderr and an exit status.
#pragma once

#include <functional>

namespace sq {

/// Exit statuses of every sq-* tool.
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailure = 1,  ///< output/runtime failure, internal error
  kExitInput = 2,    ///< usage error or bad input file (UsageError, InputError, UnsupportedError)
};

/// Runs `body` and maps exceptions to exit statuses, printing "TOOL: error: MESSAGE" on stderr:
/// UsageError/InputError → 2, OutputError and other std::exception → 1, std::bad_alloc → 1
/// ("out of memory"). Returns body()'s result otherwise.
int run_tool(const char* tool_name, const std::function<int()>& body);

}  // namespace sq
