// Test helper: expect an exception of a given type whose message contains given parts.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace sq::test {

/// Runs `f`, expecting an exception of type E whose what() contains every string of `parts`.
/// Records a test failure (no exception, another type, a missing part) and returns the message
/// ("" when nothing of type E was thrown).
template <typename E, typename F>
std::string expect_error(F&& f, const std::vector<std::string>& parts = {}) {
  try {
    f();
    ADD_FAILURE() << "expected an exception, none thrown";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  return "";
}

}  // namespace sq::test
