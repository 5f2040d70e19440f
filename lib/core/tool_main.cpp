#include "core/tool_main.h"

#include <cstdio>
#include <exception>
#include <new>

#include "core/error.h"

namespace sq {

int run_tool(const char* tool_name, const std::function<int()>& body) {
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

}  // namespace sq
