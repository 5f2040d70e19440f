#include "core/tool_main.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

#include "core/error.h"
#include "core/interrupt.h"

namespace sq {

int run_tool(const char* tool_name, const std::function<int()>& body) {
  install_interrupt_handlers(tool_name);
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool_name, e.what());
    return kExitInput;
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool_name, e.what());
    return kExitInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory\n", tool_name);
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool_name, e.what());
    return kExitFailure;
  }
}

void check_output_is_not_an_input(const std::string& out_path, const std::vector<std::string>& inputs,
                                  const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    bool same = fs::equivalent(in, out_path, ec);
    if (!same && fs::is_directory(in, ec) && fs::exists(out_path, ec))
      same = fs::equivalent(fs::absolute(out_path, ec).parent_path(), in, ec);
    if (same) throw UsageError(option + " " + out_path + " is one of the inputs; refusing to overwrite it");
  }
}

void check_parent_directory(const std::string& option, const std::string& path, const std::filesystem::path& parent) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status pst = fs::status(parent, ec);
  if (!fs::exists(pst)) {
    // Name the first component that is a file ("-o in.sqm/sub": in.sqm is a file, not a missing directory).
    for (fs::path p = parent; !p.empty() && p != p.root_path(); p = p.parent_path()) {
      const fs::file_status s = fs::status(p, ec);
      if (fs::exists(s) && !fs::is_directory(s))
        throw UsageError(option + " " + path + ": " + p.string() + " is a file, not a directory");
      if (!p.has_parent_path()) break;
    }
    throw UsageError(option + " " + path + ": directory " + parent.string() + " does not exist");
  }
  if (!fs::is_directory(pst)) throw UsageError(option + " " + path + ": " + parent.string() + " is a file, not a directory");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw UsageError(option + " " + path + ": directory " + parent.string() + " is not writable");
}

void check_output_path(const std::string& option, const std::string& path, bool force,
                       const std::vector<std::string>& inputs, bool allow_stdout) {
  namespace fs = std::filesystem;
  if (path == "-" && allow_stdout) return;
  if (path.empty()) throw UsageError(option + ": empty file name");
  check_output_is_not_an_input(path, inputs, option);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) throw UsageError(option + " " + path + " is a directory; expected a file name");
  if (fs::exists(st) && !force) throw UsageError(option + " " + path + " exists; use --force to replace it");
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  check_parent_directory(option, path, parent);
}

void check_output_directory(const std::string& option, const std::string& path, bool force,
                            const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  if (path.empty()) throw UsageError(option + ": empty directory name");
  std::error_code ec;
  for (const std::string& in : inputs)
    if (!in.empty() && fs::equivalent(in, path, ec))
      throw UsageError(option + " " + path + " is one of the inputs; refusing to overwrite it");
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_directory(st)) throw UsageError(option + " " + path + " exists and is not a directory");
  if (fs::is_directory(st)) {
    if (!force && !fs::is_empty(path, ec)) throw UsageError(option + " " + path + " is not empty; use --force to write into it");
    return;
  }
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  check_parent_directory(option, path, parent);
}

}  // namespace sq
