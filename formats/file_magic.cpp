// Format sniffing (formats/file_magic.h).
#include "formats/file_magic.h"

#include <cstdio>
#include <string>

namespace sq {

bool file_starts_with(const std::string& path, std::string_view magic) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  std::string head(magic.size(), '\0');
  const size_t n = std::fread(head.data(), 1, head.size(), f);
  std::fclose(f);
  return n == magic.size() && head == magic;
}

}  // namespace sq
