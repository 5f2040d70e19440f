#include "formats/utf8.h"

#include <cstring>

#include "formats/text_source.h"

namespace sq {

int64_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Table 3-7: the lead byte fixes the length and the allowed range of the second byte.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return static_cast<int64_t>(i);  // continuation byte, C0/C1 or F5..FF as a lead byte
    }
    if (i + len > n) return static_cast<int64_t>(i);
    if (s[i + 1] < lo || s[i + 1] > hi) return static_cast<int64_t>(i);
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

namespace {
/// The warning for `text` whose first byte is byte `base` of `where`'s text; "" when it is plain UTF-8.
std::string encoding_warning_at(std::string_view text, const std::string& where, int64_t base) {
  const int64_t bad = find_invalid_utf8(text);
  const void* nul = text.empty() ? nullptr : std::memchr(text.data(), 0, text.size());
  if (bad < 0 && nul == nullptr) return "";
  std::string w = where + ": not plain UTF-8 text:";
  if (bad >= 0) w += " invalid UTF-8 at byte " + std::to_string(base + bad);
  if (nul != nullptr)
    w += std::string(bad >= 0 ? ";" : "") + " NUL byte at byte " +
         std::to_string(base + (static_cast<const char*>(nul) - text.data())) + " (a binary file?)";
  return w + "; its bytes are tokenized as they are";
}
}  // namespace

std::string text_encoding_warning(std::string_view text, const std::string& source) {
  return encoding_warning_at(text, source, 0);
}

std::string text_file_encoding_warning(const std::string& path) {
  auto docs = TextDocuments::open(path);
  const bool jsonl = docs->format() == TextDocuments::Format::JsonLines;
  std::string doc;
  int64_t offset = 0, index = 0;
  while (docs->next(doc)) {
    // Plain-text documents concatenate to the file's text and are cut at UTF-8 character
    // boundaries, so a per-document check finds exactly what a whole-file check would.
    const std::string w = jsonl ? encoding_warning_at(doc, path + ": document " + std::to_string(index + 1), 0)
                                : encoding_warning_at(doc, path, offset);
    if (!w.empty()) return w;
    offset += static_cast<int64_t>(doc.size());
    ++index;
  }
  return "";
}

}  // namespace sq
