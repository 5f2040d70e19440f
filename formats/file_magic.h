// Format sniffing: does a file start with a format's magic bytes.
#pragma once

#include <string>
#include <string_view>

namespace sq {

/// True when `path` can be opened for reading and its first magic.size() bytes equal `magic`
/// (false for a missing, unreadable or shorter file, and for a directory). Reads magic.size() bytes.
bool file_starts_with(const std::string& path, std::string_view magic);

}  // namespace sq
