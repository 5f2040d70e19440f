#include "formats/token_ids_file.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace sq {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// The text of a bad token for a message: at most 24 characters, control bytes shown as '?'.
std::string quoted(std::string_view t) {
  std::string s;
  for (size_t i = 0; i < t.size() && i < 24; ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    s += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  }
  if (t.size() > 24) s += "...";
  return "'" + s + "'";
}

std::string vocab_message(const std::string& source, std::string_view literal, size_t position, int64_t vocab) {
  return source + ": token id " + std::string(literal) + " at position " + std::to_string(position) +
         " is outside the model's vocabulary of " + std::to_string(vocab) + " ids (0.." + std::to_string(vocab - 1) + ")";
}

/// Appends the id written as `tok` (at byte `offset`, the `ids.size()`-th id) to `ids`, or throws.
void add_id(std::string_view tok, size_t offset, const std::string& source, int64_t vocab, std::vector<int32_t>& ids) {
  const size_t position = ids.size();
  const bool negative = tok.size() > 1 && tok[0] == '-';
  const std::string_view digits = negative ? tok.substr(1) : tok;
  bool all_digits = !digits.empty();
  for (char c : digits) all_digits = all_digits && is_digit(c);
  if (!all_digits)
    throw InputError(source + ": the token id at position " + std::to_string(position) + " (byte offset " +
                     std::to_string(offset) + ") is not a non-negative integer: " + quoted(tok));
  if (negative)
    throw InputError(source + ": token id " + std::string(tok.substr(0, 24)) + (tok.size() > 24 ? "..." : "") + " at position " +
                     std::to_string(position) + " is negative");
  // Saturating accumulation: anything above INT32_MAX is out of range whatever the vocabulary.
  int64_t v = 0;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (char c : digits) v = std::min<int64_t>(v * 10 + (c - '0'), kMax + 1);
  const std::string_view shown = digits.size() > 24 ? digits.substr(0, 24) : digits;
  if (vocab > 0 && v >= vocab) throw InputError(vocab_message(source, std::string(shown) + (digits.size() > 24 ? "..." : ""), position, vocab));
  if (v > kMax)
    throw InputError(source + ": token id " + std::string(shown) + (digits.size() > 24 ? "..." : "") + " at position " +
                     std::to_string(position) + " is larger than " + std::to_string(kMax));
  ids.push_back(static_cast<int32_t>(v));
}

std::vector<int32_t> parse_whitespace(std::string_view text, const std::string& source, int64_t vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    while (i < n && is_space(text[i])) ++i;
    if (i == n) break;
    const size_t start = i;
    while (i < n && !is_space(text[i])) ++i;
    add_id(text.substr(start, i - start), start, source, vocab, ids);
  }
  if (ids.empty()) throw InputError(source + ": no token ids (the file " + (n == 0 ? "is empty)" : "holds only whitespace)"));
  return ids;
}

std::vector<int32_t> parse_json_array(std::string_view text, size_t open, const std::string& source, int64_t vocab) {
  const std::string bad = source + ": not a JSON array of integers: ";
  std::vector<int32_t> ids;
  const size_t n = text.size();
  size_t i = open + 1;
  auto skip = [&]() {
    while (i < n && is_space(text[i])) ++i;
  };
  skip();
  if (i < n && text[i] == ']') {
    ++i;
    skip();
    if (i < n) throw InputError(bad + "text after the closing ']' at byte offset " + std::to_string(i));
    throw InputError(source + ": no token ids (the JSON array is empty)");
  }
  while (true) {
    skip();
    if (i == n) throw InputError(bad + "no closing ']'");
    const size_t start = i;
    while (i < n && !is_space(text[i]) && text[i] != ',' && text[i] != ']') ++i;
    if (i == start) throw InputError(bad + "expected a token id at byte offset " + std::to_string(start));
    add_id(text.substr(start, i - start), start, source, vocab, ids);
    skip();
    if (i == n) throw InputError(bad + "no closing ']'");
    if (text[i] == ']') break;
    if (text[i] != ',')
      throw InputError(bad + "expected ',' or ']' after position " + std::to_string(ids.size() - 1) + " at byte offset " +
                       std::to_string(i));
    ++i;
  }
  ++i;  // the ']'
  skip();
  if (i < n) throw InputError(bad + "text after the closing ']' at byte offset " + std::to_string(i));
  return ids;
}

}  // namespace

std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& source, int64_t vocab_size) {
  size_t first = 0;
  while (first < text.size() && is_space(text[first])) ++first;
  if (first < text.size() && text[first] == '[') return parse_json_array(text, first, source, vocab_size);
  return parse_whitespace(text, source, vocab_size);
}

std::vector<int32_t> read_token_ids_file(const std::string& path, int64_t vocab_size) {
  const std::string text = read_file_to_string(path);  // InputError "cannot open PATH: ..."
  return parse_token_ids(text, path, vocab_size);
}

void check_token_ids_in_vocabulary(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& source) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size) throw InputError(vocab_message(source, std::to_string(ids[i]), i, vocab_size));
}

}  // namespace sq
