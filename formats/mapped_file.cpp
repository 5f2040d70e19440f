#include "formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "core/error.h"

namespace sq {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw InputError("cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError("cannot open " + path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw InputError("cannot map " + path + ": " + std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

std::shared_ptr<const MappedFile> MappedFile::from_bytes(const uint8_t* data, size_t size, const std::string& path) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size;
  f->owned_ = true;
  if (size > 0) {
    // 64-byte alignment, as a page-aligned mapping gives at least that (readers rely on aligned offsets).
    auto* copy = static_cast<uint8_t*>(::operator new(size, std::align_val_t(64)));
    std::memcpy(copy, data, size);
    f->data_ = copy;
  }
  return f;
}

MappedFile::~MappedFile() {
  if (!data_) return;
  if (owned_)
    ::operator delete(const_cast<uint8_t*>(data_), std::align_val_t(64));
  else
    ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::string read_file_to_string(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError("cannot open " + path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError("cannot read " + path);
  return ss.str();
}

void MappedFile::release(size_t offset, size_t size) const {
  if (owned_ || !data_ || offset >= size_) return;
  size = std::min(size, size_ - offset);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page, end = (offset + size) / page * page;  // whole pages only
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);  // advisory: errors ignored
}

}  // namespace sq
