// Paths of the shared real test data (../shared/data beside the repository) and the built tools.
#pragma once

#include <string>

namespace sq::test {

/// Absolute path of `relative` under the shared data folder, e.g. "stories260K/stories260K.bin".
inline std::string shared_data(const std::string& relative) { return std::string(SQ_SHARED_DATA_DIR) + "/" + relative; }

/// Absolute path of a built tool, e.g. tool("sq-eval").
inline std::string tool(const std::string& name) { return std::string(SQ_TOOLS_DIR) + "/" + name; }

inline std::string stories_model() { return shared_data("stories260K/stories260K.bin"); }
inline std::string stories_tokenizer() { return shared_data("stories260K/tok512.bin"); }
inline std::string llama2_tokenizer() { return shared_data("llama2-tokenizer/tokenizer.model"); }
inline std::string tinystories_valid() { return shared_data("tinystories/tinystories-valid-1000.txt"); }

}  // namespace sq::test
