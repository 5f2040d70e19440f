// Command-line conventions shared by every sq-* tool: argument parsing with one-line errors,
// `--version`, the uniform `--json [FILE]` option and JSON reports written to a file or stdout.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sq {

/// "TOOL (sqkit) VERSION", the line `--version` prints.
std::string tool_version_line(const char* tool);

/// Adds `--version` to `app` (prints tool_version_line() on stdout, exit status 0).
void add_version_flag(CLI::App& app, const char* tool);

/// Adds the uniform `--json [FILE]` option bound to `target`: after parse_tool_args(), `target` is
/// empty when `--json` was not given, "-" for stdout, or the file name. See normalize_json_args()
/// for how the optional FILE is recognized.
CLI::Option* add_json_option(CLI::App& app, std::string& target, const std::string& what);

/// Adds `--w4a16-act fp32|int8` (default fp32) bound to `target`: the activations of W4A16 linears in
/// decode steps (model/w4a16_linear.h W4DecodeActivations); `where` completes the help text with
/// where the option applies. Apply it with apply_w4a16_act_option (model/quantize_in_memory.h).
CLI::Option* add_w4a16_act_option(CLI::App& app, std::string& target, const std::string& where);

/// Most threads -t accepts per available core (8 on 2 cores → 16): more only slows every
/// synchronisation point, and a typo such as -t 1000 is refused instead of run.
inline constexpr int kMaxThreadsPerCore = 8;

/// Sets the OpenMP thread count from `-t/--threads` and returns it: 0 (the default) → the cores
/// this process may use (available_cores(), core/cpu_cores.h: affinity mask and cgroup CPU quota);
/// N ≤ that → N; N above it (up to kMaxThreadsPerCore × cores) → N with a one-line warning on stderr
/// prefixed by `tool`. Throws UsageError for N < 0 and N above the limit, naming the value and the cores.
int apply_thread_option(int threads, const char* tool);

/// The help text of every tool's -t/--threads option.
inline constexpr const char* kThreadsHelp =
    "Threads at most (default: one per core available to this process: affinity and cgroup CPU quota); fewer while other processes "
    "keep the cores busy (the thread governor; SQ_ADAPTIVE_THREADS=0 runs exactly -t; docs/threading.md)";

/// Rewrites `args` (argv[1..], in order) so that the optional value of `--json` is explicit:
/// `--json=ANY` is kept; `--json` followed by `-` or by a word ending in ".json" (any case) that does
/// not start with '-' becomes `--json=WORD`; any other `--json` becomes `--json=-` (stdout) and the
/// following word is left for the other options and positionals. So `sq-inspect --json model.sqm`
/// prints JSON of model.sqm on stdout, and `sq-eval --json notes.txt` is refused as an unexpected
/// argument instead of writing JSON over notes.txt. Arguments after a lone `--` are not rewritten.
std::vector<std::string> normalize_json_args(const std::vector<std::string>& args);

/// Parses argv with `app` (after normalize_json_args()). Returns -1 when the tool should go on;
/// otherwise the exit status to return at once: 0 after `--help` / `--version` (printed on stdout),
/// 2 after a parse error, printed as the one line "TOOL: error: MESSAGE (see TOOL --help)" on stderr.
int parse_tool_args(CLI::App& app, const char* tool, int argc, char** argv);

/// Writes a JSON report, indented by 2, with "peak_rss_bytes" (the process's peak resident set so
/// far, core/memory_probe.h) added last when `report` is an object: `target` "-" prints it on
/// stdout, anything else replaces the file atomically (write_file_atomic, formats/atomic_file.h).
/// Invalid UTF-8 in strings is written as U+FFFD. Throws OutputError naming the file.
void write_json_report(const std::string& target, nlohmann::json report);
/// The same for a report whose keys keep their insertion order (peak_rss_bytes after them).
void write_json_report(const std::string& target, nlohmann::ordered_json report);

/// While alive, everything written to stdout (file descriptor 1, including C stdio and library code
/// that prints progress tables) goes to stderr instead; the destructor flushes and restores stdout.
/// Tools use it when `--json -` makes stdout the JSON report's alone. Inactive when `active` is false.
class StdoutToStderr {
 public:
  explicit StdoutToStderr(bool active);
  ~StdoutToStderr();
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;
  /// Restores stdout now (idempotent).
  void restore();

 private:
  int saved_fd_ = -1;
};

}  // namespace sq
