// Limits on JSON read from files: bounded nesting before parsing, bounded excerpts in messages.
//
// nlohmann::json parses iteratively, but copying, comparing and dump()ing a value recurse once per
// nesting level, so a hostile file (a value nested 100,000 levels deep, a few hundred KB) would
// overflow the stack wherever the parsed document is used. Readers therefore refuse documents
// nested deeper than kMaxJsonDepth before parsing them (check_json_depth), and quote values in
// error messages with json_excerpt.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sq {

/// Deepest nesting of arrays/objects accepted in a JSON file. sqkit's own files nest at most 4
/// levels; Hugging Face config.json / index files and safetensors headers at most 3.
inline constexpr size_t kMaxJsonDepth = 64;

/// Depth of the deepest '[' / '{' nesting of `text`, outside string literals (escapes honoured).
/// Meant for text about to be parsed; it does not validate JSON.
size_t json_nesting_depth(std::string_view text);

/// Throws InputError "`what` nests arrays/objects deeper than 64 levels" when
/// json_nesting_depth(text) > kMaxJsonDepth. `what` names the file and the document, e.g.
/// "model.safetensors: safetensors header".
void check_json_depth(std::string_view text, const std::string& what);

/// A short, single-line JSON rendering of `value` for an error message: compact JSON text (as
/// dump() gives) of at most `max_chars` characters, longer text cut and ending in "..."; arrays and
/// objects nested more than 4 levels deep are shown as [...] / {...}.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 200);

}  // namespace sq
