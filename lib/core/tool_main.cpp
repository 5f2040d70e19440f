#include "core/tool_main.h"

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

void check_output_is_not_an_input(const std::string& out_path, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    bool same = fs::equivalent(in, out_path, ec);
    if (!same && fs::is_directory(in, ec) && fs::exists(out_path, ec))
      same = fs::equivalent(fs::absolute(out_path, ec).parent_path(), in, ec);
    if (same) throw UsageError("-o " + out_path + " is one of the inputs; refusing to overwrite it");
  }
}

}  // namespace sq
