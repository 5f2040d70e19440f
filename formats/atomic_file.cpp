#include "formats/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/interrupt.h"

namespace sq {

namespace {
[[noreturn]] void fail(const char* what, const std::string& target) {
  const int err = errno;
  throw OutputError(std::string(what) + " " + target + ": " + std::strerror(err));
}
}  // namespace

namespace {
constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
constexpr size_t kSuffixLength = 6;

/// The pid in "<base>.tmp-<pid>-<6 alphabet characters>" when `name` has exactly that form, else -1.
long temp_owner_pid(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  long pid = 0;
  const size_t digits_start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - digits_start < 10) pid = pid * 10 + (name[i++] - '0');
  if (i == digits_start || i >= name.size() || name[i] != '-' || pid <= 0) return -1;
  const std::string suffix = name.substr(i + 1);
  if (suffix.size() != kSuffixLength) return -1;
  for (char c : suffix)
    if (std::strchr(kAlphabet, c) == nullptr || c == '\0') return -1;
  return pid;
}
}  // namespace

std::vector<std::string> remove_stale_temporaries(const std::string& output) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  const fs::path out(output);
  const std::string base = out.filename().string();
  if (base.empty()) return removed;
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long pid = temp_owner_pid(name, base);
    if (pid < 0 || pid == static_cast<long>(::getpid())) continue;
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means it exists (another user's).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::unlink(it->path().c_str()) == 0) removed.push_back(it->path().string());
  }
  return removed;
}

TempBeside create_temp_beside(const std::string& output) {
  remove_stale_temporaries(output);
  std::random_device rd;
  std::mt19937_64 rng((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid()));
  const std::string prefix = output + ".tmp-" + std::to_string(::getpid()) + "-";
  TempBeside t;
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix;
    for (size_t k = 0; k < kSuffixLength; ++k) suffix += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    t.path = prefix + suffix;
    t.slot = register_temp_file(t.path.c_str());  // before the file exists: see the header
    t.fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (t.fd >= 0) return t;
    err = errno;
    unregister_temp_file(t.slot);
    t.slot = -1;
    if (err != EEXIST) break;
  }
  throw OutputError("cannot create " + t.path + " (to write " + output + "): " + std::strerror(err));
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  TempBeside t = create_temp_beside(path);
  tmp_ = std::move(t.path);
  fd_ = t.fd;
  temp_slot_ = t.slot;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
  unregister_temp_file(temp_slot_);
}

void AtomicFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t w = ::pwrite(fd_, p, std::min<size_t>(size, size_t(1) << 30), static_cast<off_t>(position_));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_);
    }
    p += w;
    size -= size_t(w);
    position_ += size_t(w);
  }
}

void AtomicFile::write_at(size_t offset, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t w = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_);
    }
    p += w;
    size -= size_t(w);
    offset += size_t(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("cannot write", path_);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot write", path_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    throw OutputError("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(err));
  }
  committed_ = true;
  unregister_temp_file(temp_slot_);
  temp_slot_ = -1;
  const auto dir = std::filesystem::path(path_).parent_path();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

void write_file_atomic_with(const std::string& path, const std::function<void(const std::string&)>& write) {
  AtomicFile f(path);
  write(f.temp_path());
  f.commit();
}

}  // namespace sq
