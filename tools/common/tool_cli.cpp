#include "tool_cli.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/cpu_cores.h"
#include "core/error.h"
#include "core/memory_probe.h"
#include "core/tool_main.h"
#include "formats/atomic_file.h"
#include "runtime/thread_governor.h"

namespace sq {

int apply_thread_option(int threads, const char* tool) {
  const int cores = available_cores();
  if (threads < 0) throw UsageError("-t/--threads must be >= 0 (0: the " + std::to_string(cores) + " cores available), got " + std::to_string(threads));
  const int limit = kMaxThreadsPerCore * cores;
  if (threads > limit)
    throw UsageError("-t " + std::to_string(threads) + ": this process may use " + std::to_string(cores) + " core(s); at most " +
                     std::to_string(limit) + " threads are accepted (omit -t for one per core)");
  if (threads > cores)
    std::fprintf(stderr, "%s: warning: -t %d runs more threads than the %d core(s) available to this process; expect it to be slower\n",
                 tool, threads, cores);
  const int n = threads > 0 ? threads : cores;
  threads::govern(n);  // fewer while other processes keep the cores busy (SQ_ADAPTIVE_THREADS=0: exactly n)
  return n;
}

std::string tool_version_line(const char* tool) { return std::string(tool) + " (sqkit) " + SQ_VERSION; }

void add_version_flag(CLI::App& app, const char* tool) {
  app.set_version_flag("--version", tool_version_line(tool), "Print the version and exit");
}

CLI::Option* add_json_option(CLI::App& app, std::string& target, const std::string& what) {
  return app.add_option("--json", target,
                        what + " as JSON: '--json' or '--json -' on stdout, '--json FILE.json' (or '--json=FILE') into a "
                               "file (never an input; an existing file only with --force)");
}

CLI::Option* add_w4a16_act_option(CLI::App& app, std::string& target, const std::string& where) {
  target = "fp32";
  return app.add_option("--w4a16-act", target,
                        "Activations of W4A16 linears in decode steps: fp32 (exact W4A16) | int8 (rounded per block of 32 to "
                        "INT8, integer dot products, as llama.cpp's Q4_0 x Q8_0; needs AVX512-VNNI); " + where)
      ->check(CLI::IsMember({"fp32", "int8"}))
      ->capture_default_str();
}

namespace {
bool ends_with_json(const std::string& s) {
  if (s.size() < 5) return false;
  std::string tail = s.substr(s.size() - 5);
  std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return tail == ".json";
}
}  // namespace

std::vector<std::string> normalize_json_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (args[i] != "--json") {
      out.push_back(args[i]);
      continue;
    }
    const bool has_next = i + 1 < args.size();
    const std::string& next = has_next ? args[i + 1] : std::string();
    if (has_next && (next == "-" || (!next.empty() && next[0] != '-' && ends_with_json(next)))) {
      out.push_back("--json=" + next);
      ++i;
    } else {
      out.push_back("--json=-");
    }
  }
  return out;
}

int parse_tool_args(CLI::App& app, const char* tool, int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  const std::vector<std::string> normalized = normalize_json_args(args);
  // Words that followed a bare --json but were not taken as its FILE (for the hint below).
  std::vector<std::string> after_json;
  for (size_t i = 0; i + 1 < normalized.size(); ++i)
    if (normalized[i] == "--json=-" && normalized[i + 1].rfind('-', 0) != 0) after_json.push_back(normalized[i + 1]);
  args = normalized;
  std::reverse(args.begin(), args.end());  // CLI11 consumes the vector from the back
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    for (const std::string& w : after_json)
      if (msg.find(w) != std::string::npos) {
        msg += " (--json takes '-', a file name ending in .json, or --json=FILE)";
        break;
      }
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", tool, msg.c_str(), tool);
    return kExitInput;
  }
  return -1;
}

void write_json_report(const std::string& target, nlohmann::json report) {
  write_json_report(target, nlohmann::ordered_json(std::move(report)));  // keys stay sorted, peak_rss_bytes after them
}

void write_json_report(const std::string& target, nlohmann::ordered_json report) {
  if (report.is_object()) report["peak_rss_bytes"] = peak_rss_bytes();
  const std::string text = report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  if (target == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (std::ferror(stdout)) throw OutputError("cannot write the JSON report to stdout");
    return;
  }
  write_file_atomic(target, text);
}

StdoutToStderr::StdoutToStderr(bool active) {
  if (!active) return;
  std::fflush(stdout);
  saved_fd_ = ::dup(STDOUT_FILENO);
  if (saved_fd_ >= 0 && ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    ::close(saved_fd_);
    saved_fd_ = -1;
  }
}

StdoutToStderr::~StdoutToStderr() { restore(); }

void StdoutToStderr::restore() {
  if (saved_fd_ < 0) return;
  std::fflush(stdout);
  ::dup2(saved_fd_, STDOUT_FILENO);
  ::close(saved_fd_);
  saved_fd_ = -1;
}

}  // namespace sq
