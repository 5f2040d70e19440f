#include "formats/json_limits.h"

#include "core/error.h"

namespace sq {

namespace {

constexpr int kExcerptDepth = 4;

/// Appends `v` to `out`, stopping once `out` is longer than `limit`.
void append_excerpt(const nlohmann::json& v, int depth, size_t limit, std::string& out) {
  if (out.size() > limit) return;
  if (!v.is_structured()) {
    out += v.dump();
    return;
  }
  const bool array = v.is_array();
  if (depth >= kExcerptDepth && !v.empty()) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  bool first = true;
  for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
    if (!first) out += ',';
    first = false;
    if (!array) out += nlohmann::json(it.key()).dump() + ":";
    append_excerpt(it.value(), depth + 1, limit, out);
  }
  out += array ? ']' : '}';
}

}  // namespace

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_depth(std::string_view text, const std::string& what) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw InputError(what + " nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string out;
  append_excerpt(value, 0, max_chars, out);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

}  // namespace sq
