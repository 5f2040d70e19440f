#include "formats/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>
#include <utility>

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
    if (it->is_symlink(ec)) continue;
    const bool file = it->is_regular_file(ec), directory = !file && it->is_directory(ec);
    if (!file && !directory) continue;
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means it exists (another user's).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (file ? ::unlink(it->path().c_str()) == 0 : fs::remove_all(it->path(), rm) > 0 && !rm) removed.push_back(it->path().string());
  }
  return removed;
}

namespace {
/// "<output>.tmp-<pid>-" followed by kSuffixLength random alphabet characters; a new suffix per call.
class TempNames {
 public:
  explicit TempNames(const std::string& output)
      : rng_(seed()), prefix_(output + ".tmp-" + std::to_string(::getpid()) + "-") {}
  std::string next() {
    std::string name = prefix_;
    for (size_t k = 0; k < kSuffixLength; ++k) name += kAlphabet[rng_() % (sizeof(kAlphabet) - 1)];
    return name;
  }

 private:
  static uint64_t seed() {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid());
  }
  std::mt19937_64 rng_;
  std::string prefix_;
};

/// Removes stale temporaries of `output`, then tries fresh names "<output>.tmp-<pid>-<random>":
/// each is registered with `reg` (register_temp_file / register_temp_dir) *before* `create(path)`
/// makes it (returning false with errno set on failure), so it never exists unregistered. Returns the
/// name and its slot; throws OutputError naming `what` and `output` when no name can be created.
template <typename Register, typename Create>
std::pair<std::string, int> create_registered(const std::string& output, Register reg, Create create, const char* what) {
  remove_stale_temporaries(output);
  TempNames names(output);
  std::string path;
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    path = names.next();
    const int slot = reg(path.c_str());
    if (create(path)) return {path, slot};
    err = errno;
    unregister_temp_file(slot);
    if (err != EEXIST) break;
  }
  throw OutputError(std::string("cannot create ") + what + path + " (to write " + output + "): " + std::strerror(err));
}
}  // namespace

TempBeside create_temp_beside(const std::string& output) {
  TempBeside t;
  std::tie(t.path, t.slot) = create_registered(
      output, register_temp_file,
      [&](const std::string& path) { return (t.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666)) >= 0; }, "");
  return t;
}

TempDirBeside create_temp_dir_beside(const std::string& output) {
  std::string out = std::filesystem::path(output).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  TempDirBeside t;
  std::tie(t.path, t.slot) = create_registered(
      out, register_temp_dir, [](const std::string& path) { return ::mkdir(path.c_str(), 0777) == 0; }, "the directory ");
  return t;
}

void commit_temp_dir(const std::string& tmp, const std::string& output, bool replace) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, output.c_str(), RENAME_NOREPLACE) == 0) return;
  const int err = errno;
  if (err != EEXIST && err != ENOTEMPTY) throw OutputError("cannot rename " + tmp + " to " + output + ": " + std::strerror(err));
  if (!replace)
    throw OutputError(output + " was created by another writer while this one ran; it is left as it is "
                      "(use --force to replace it)");
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, output.c_str(), RENAME_EXCHANGE) != 0)
    throw OutputError("cannot replace " + output + ": " + std::strerror(errno));
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);  // the old output, now at tmp
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
