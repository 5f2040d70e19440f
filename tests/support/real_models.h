// Paths of the real models fetched by scripts/fetch-models.sh, for the tests that need them.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace sq::test {

/// A fetched model file, e.g. "SmolLM2-135M-Instruct.Q4_1.gguf": $SQKIT_MODELS/name when
/// SQKIT_MODELS is set, else <source root>/models/name; "" when absent (tests then GTEST_SKIP,
/// naming the fetch script).
inline std::string model_path(const std::string& name) {
  namespace fs = std::filesystem;
  const char* env = std::getenv("SQKIT_MODELS");
  const fs::path p = env && *env ? fs::path(env) / name : fs::path(SQ_SOURCE_DIR) / "models" / name;
  return fs::is_regular_file(p) ? p.string() : "";
}

}  // namespace sq::test
