#include "formats/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace sq {

namespace {

std::string make_temp_name(const std::string& path) {
  std::string tmpl = path + ".tmp-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = ::mkstemp(buf.data());
  if (fd < 0) throw OutputError("cannot create a temporary file beside " + path + ": " + std::strerror(errno));
  ::close(fd);
  return buf.data();
}

void fsync_path(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomic_with(const std::string& path, const std::function<void(const std::string&)>& write) {
  const std::string tmp = make_temp_name(path);
  try {
    write(tmp);
    fsync_path(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw OutputError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
    const auto dir = std::filesystem::path(path).parent_path();
    fsync_path(dir.empty() ? "." : dir.string());
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void write_file_atomic(const std::string& path, std::string_view content) {
  write_file_atomic_with(path, [&](const std::string& tmp) {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw OutputError("cannot write " + path + ": " + std::strerror(errno));
    const size_t n = std::fwrite(content.data(), 1, content.size(), f);
    const bool ok = n == content.size() && std::fflush(f) == 0;
    const int e = errno;
    std::fclose(f);
    if (!ok) throw OutputError("cannot write " + path + ": " + std::strerror(e));
  });
}

}  // namespace sq
