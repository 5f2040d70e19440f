#include "formats/sqm_file.h"

#include "formats/atomic_file.h"
#include "formats/file_magic.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "core/error.h"
#include "core/interrupt.h"
#include "formats/json_limits.h"

static_assert(std::endian::native == std::endian::little, "the .sqm reader/writer assumes a little-endian host");

namespace sq {

namespace {

constexpr char kMagic[8] = {'S', 'Q', 'K', 'I', 'T', 'M', 'D', 'L'};
constexpr const char* kFormatName = "sqkit.sqm";
constexpr int kZstdLevel = 3;
constexpr size_t kMaxRank = 16;
constexpr size_t kMaxNameBytes = 4096;
/// zstd's largest possible expansion: one 4-byte RLE block per 128 KiB of output.
constexpr uint64_t kZstdMaxRatio = 32768;

// Preamble field offsets.
constexpr size_t kOffVersion = 8, kOffFlags = 12, kOffDataOffset = 16, kOffDataSize = 24, kOffHeaderOffset = 32,
                 kOffHeaderSize = 40, kOffTableOffset = 48, kOffTableSize = 56, kOffHeaderHash = 64,
                 kOffTableHash = 72, kOffPreambleHash = 120;

uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t rd64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void wr32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void wr64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct XxhState {
  XXH3_state_t* s = XXH3_createState();
  XxhState() {
    if (!s) throw std::bad_alloc();
    XXH3_64bits_reset(s);
  }
  ~XxhState() { XXH3_freeState(s); }
};

struct DCtx {
  ZSTD_DCtx* c = ZSTD_createDCtx();
  DCtx() {
    if (!c) throw std::bad_alloc();
  }
  ~DCtx() { ZSTD_freeDCtx(c); }
};

}  // namespace

// ---- dtypes ------------------------------------------------------------------------------------

const char* sqm_dtype_name(SqmDType dtype) {
  switch (dtype) {
    case SqmDType::F32: return "F32";
    case SqmDType::F16: return "F16";
    case SqmDType::BF16: return "BF16";
    case SqmDType::I8: return "I8";
    case SqmDType::U8: return "U8";
    case SqmDType::I32: return "I32";
    case SqmDType::I4x2: return "I4x2";
    case SqmDType::U4x2: return "U4x2";
  }
  return "?";
}

std::optional<SqmDType> sqm_dtype_from_name(std::string_view name) {
  for (SqmDType d : kSqmDTypes)
    if (name == sqm_dtype_name(d)) return d;
  return std::nullopt;
}

int sqm_dtype_bits(SqmDType dtype) {
  switch (dtype) {
    case SqmDType::F32:
    case SqmDType::I32: return 32;
    case SqmDType::F16:
    case SqmDType::BF16: return 16;
    case SqmDType::I8:
    case SqmDType::U8: return 8;
    case SqmDType::I4x2:
    case SqmDType::U4x2: return 4;
  }
  return 0;
}

uint64_t sqm_numel(const std::vector<int64_t>& shape) {
  constexpr uint64_t kMax = uint64_t{1} << 60;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
    if (static_cast<uint64_t>(d) > kMax) throw std::invalid_argument("shape " + shape_str(shape) + " is too large");
    empty |= d == 0;
  }
  if (empty) return 0;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (static_cast<uint64_t>(d) > kMax / n)
      throw std::invalid_argument("shape " + shape_str(shape) + " has more than 2^60 elements");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

uint64_t sqm_byte_count(SqmDType dtype, const std::vector<int64_t>& shape) {
  const uint64_t n = sqm_numel(shape);
  const int bits = sqm_dtype_bits(dtype);
  return bits == 4 ? (n + 1) / 2 : n * static_cast<uint64_t>(bits / 8);
}

// ---- writer ------------------------------------------------------------------------------------

SqmWriter::SqmWriter(const std::string& path, SqmWriteOptions options) : path_(path), options_(options) {
  if (path.empty()) throw UsageError("the output path is empty");
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::exists(st)) {
    if (!options_.force) throw UsageError(path + " already exists (use --force to overwrite it)");
    if (std::filesystem::is_directory(st)) throw UsageError(path + " is a directory, not a file");
  }
  TempBeside t = create_temp_beside(path);
  fd_ = t.fd;
  tmp_path_ = std::move(t.path);
  temp_slot_ = t.slot;
  try {
    const uint8_t zeros[kSqmPreambleSize] = {};
    write_all(zeros, sizeof zeros);  // placeholder, patched by finish()
    if (options_.compress) {
      cctx_ = ZSTD_createCCtx();
      if (!cctx_) throw std::bad_alloc();
    }
  } catch (...) {
    discard();
    throw;
  }
}

SqmWriter::~SqmWriter() { discard(); }

void SqmWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!tmp_path_.empty()) {
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }
  unregister_temp_file(temp_slot_);
  temp_slot_ = -1;
  if (cctx_) {
    ZSTD_freeCCtx(cctx_);
    cctx_ = nullptr;
  }
}

void SqmWriter::check_usable(const char* what) const {
  if (finished_) throw std::logic_error(std::string("SqmWriter::") + what + ": " + path_ + " is already finished");
  if (failed_ || fd_ < 0)
    throw std::logic_error(std::string("SqmWriter::") + what + ": writing " + path_ + " failed earlier");
}

void SqmWriter::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      failed_ = true;
      throw OutputError("cannot write " + path_ + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
    pos_ += static_cast<uint64_t>(w);
  }
}

void SqmWriter::add_tensor(const std::string& name, SqmDType dtype, const std::vector<int64_t>& shape,
                           const void* data, size_t nbytes) {
  check_usable("add_tensor");
  if (name.empty()) throw std::invalid_argument("SqmWriter: empty tensor name (writing " + path_ + ")");
  if (name.size() > kMaxNameBytes)
    throw std::invalid_argument("SqmWriter: tensor name longer than 4096 bytes (writing " + path_ + ")");
  try {
    (void)nlohmann::json(name).dump();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument("SqmWriter: tensor name is not valid UTF-8 (writing " + path_ + ")");
  }
  if (index_.count(name)) throw std::invalid_argument("SqmWriter: duplicate tensor '" + name + "' (writing " + path_ + ")");
  uint64_t expected = 0;
  try {
    expected = sqm_byte_count(dtype, shape);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("SqmWriter: tensor '" + name + "': " + e.what());
  }
  if (nbytes != expected)
    throw std::invalid_argument("SqmWriter: tensor '" + name + "': " + std::to_string(nbytes) + " bytes given, but " +
                                sqm_dtype_name(dtype) + " " + shape_str(shape) + " needs " + std::to_string(expected));
  if (nbytes > 0 && data == nullptr) throw std::invalid_argument("SqmWriter: tensor '" + name + "': null data");
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (sqm_dtype_bits(dtype) == 4 && sqm_numel(shape) % 2 == 1 && (bytes[nbytes - 1] & 0xF0) != 0)
    throw std::invalid_argument("SqmWriter: tensor '" + name + "': the unused high nibble of the last byte of an odd-length " +
                                sqm_dtype_name(dtype) + " tensor must be zero");

  static const uint8_t kZeros[kSqmAlignment] = {};
  SqmTensorInfo e;
  try {  // any failure from here on leaves the temporary inconsistent: the writer is unusable
    const uint64_t aligned = round_up(pos_, kSqmAlignment);
    if (aligned > pos_) write_all(kZeros, aligned - pos_);

    e.name = name;
    e.dtype = dtype;
    e.shape = shape;
    e.offset = pos_;
    e.raw_bytes = nbytes;
    e.xxh3 = XXH3_64bits(bytes, nbytes);

    bool stored = false;
    if (cctx_ && nbytes > 0) {
      // Stream the zstd frame into the file; give up (rewind, store raw) as soon as it is not smaller.
      ZSTD_CCtx_reset(cctx_, ZSTD_reset_session_only);
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, kZstdLevel);
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 0);
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
      ZSTD_CCtx_setPledgedSrcSize(cctx_, nbytes);
      std::vector<uint8_t> out(ZSTD_CStreamOutSize());
      XxhState stored_hash;
      ZSTD_inBuffer in{bytes, nbytes, 0};
      uint64_t written = 0;
      bool smaller = true;
      for (;;) {
        ZSTD_outBuffer ob{out.data(), out.size(), 0};
        const size_t rem = ZSTD_compressStream2(cctx_, &ob, &in, ZSTD_e_end);
        if (ZSTD_isError(rem))
          throw std::runtime_error("zstd compression of tensor '" + name + "' failed: " + ZSTD_getErrorName(rem));
        if (written + ob.pos >= nbytes) {
          smaller = false;
          break;
        }
        write_all(out.data(), ob.pos);
        XXH3_64bits_update(stored_hash.s, out.data(), ob.pos);
        written += ob.pos;
        if (rem == 0) break;
      }
      if (smaller) {
        e.stored_bytes = written;
        e.stored_xxh3 = XXH3_64bits_digest(stored_hash.s);
        e.compressed = true;
        stored = true;
      } else if (written > 0) {
        if (::lseek(fd_, static_cast<off_t>(e.offset), SEEK_SET) < 0 || ::ftruncate(fd_, static_cast<off_t>(e.offset)) != 0) {
          failed_ = true;
          throw OutputError("cannot write " + path_ + ": " + std::strerror(errno));
        }
        pos_ = e.offset;
      }
    }
    if (!stored) {
      write_all(bytes, nbytes);
      e.stored_bytes = nbytes;
      e.stored_xxh3 = e.xxh3;
    }
  } catch (...) {
    failed_ = true;
    throw;
  }
  index_[name] = entries_.size();
  entries_.push_back(std::move(e));
}

void SqmWriter::finish(const nlohmann::json& header) {
  check_usable("finish");
  if (!header.is_object())
    throw std::invalid_argument(std::string("SqmWriter::finish: the header must be a JSON object, got ") + header.type_name());
  nlohmann::json h = header;
  h["format"] = {{"name", kFormatName},
                 {"version", kSqmVersion},
                 {"alignment", kSqmAlignment},
                 {"tensor_count", entries_.size()}};
  nlohmann::json table = nlohmann::json::array();
  bool any_compressed = false;
  for (const auto& e : entries_) {
    table.push_back({{"name", e.name},
                     {"dtype", sqm_dtype_name(e.dtype)},
                     {"shape", e.shape},
                     {"offset", e.offset},
                     {"stored_bytes", e.stored_bytes},
                     {"raw_bytes", e.raw_bytes},
                     {"compression", e.compression()},
                     {"xxh3", hex64(e.xxh3)}});
    if (e.compressed) table.back()["stored_xxh3"] = hex64(e.stored_xxh3);
    any_compressed |= e.compressed;
  }
  std::string hs, ts;
  try {
    hs = h.dump();
    ts = table.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw std::invalid_argument(std::string("SqmWriter::finish: the header cannot be serialized: ") + ex.what());
  }

  try {
    const uint64_t header_offset = pos_;
    write_all(hs.data(), hs.size());
    const uint64_t table_offset = pos_;
    write_all(ts.data(), ts.size());

    uint8_t pre[kSqmPreambleSize] = {};
    std::memcpy(pre, kMagic, 8);
    wr32(pre + kOffVersion, kSqmVersion);
    wr32(pre + kOffFlags, any_compressed ? kSqmFlagCompressed : 0u);
    wr64(pre + kOffDataOffset, kSqmPreambleSize);
    wr64(pre + kOffDataSize, header_offset - kSqmPreambleSize);
    wr64(pre + kOffHeaderOffset, header_offset);
    wr64(pre + kOffHeaderSize, hs.size());
    wr64(pre + kOffTableOffset, table_offset);
    wr64(pre + kOffTableSize, ts.size());
    wr64(pre + kOffHeaderHash, XXH3_64bits(hs.data(), hs.size()));
    wr64(pre + kOffTableHash, XXH3_64bits(ts.data(), ts.size()));
    wr64(pre + kOffPreambleHash, XXH3_64bits(pre, kOffPreambleHash));
    size_t done = 0;
    while (done < sizeof pre) {
      const ssize_t w = ::pwrite(fd_, pre + done, sizeof pre - done, static_cast<off_t>(done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw OutputError("cannot write " + path_ + ": " + std::strerror(errno));
      done += static_cast<size_t>(w);
    }
    if (::fsync(fd_) != 0) throw OutputError("cannot write " + path_ + ": fsync failed: " + std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw OutputError("cannot write " + path_ + ": " + std::strerror(errno));

    int rc;
    if (options_.force) {
      rc = ::rename(tmp_path_.c_str(), path_.c_str());
    } else {
      // No-clobber rename; file systems without RENAME_NOREPLACE fall back to check-then-rename.
      rc = ::renameat2(AT_FDCWD, tmp_path_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
        std::error_code ec;
        if (std::filesystem::exists(std::filesystem::symlink_status(path_, ec))) {
          errno = EEXIST;
          rc = -1;
        } else {
          rc = ::rename(tmp_path_.c_str(), path_.c_str());
        }
      }
      if (rc != 0 && errno == EEXIST) throw UsageError(path_ + " already exists (use --force to overwrite it)");
    }
    if (rc != 0) throw OutputError("cannot rename " + tmp_path_ + " to " + path_ + ": " + std::strerror(errno));
    tmp_path_.clear();
    unregister_temp_file(temp_slot_);
    temp_slot_ = -1;
    finished_ = true;

    const auto dir = std::filesystem::path(path_).parent_path();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  } catch (...) {
    failed_ = true;
    discard();
    throw;
  }
  discard();  // frees the compression context
}

// ---- reader ------------------------------------------------------------------------------------

void SqmFile::fail(const std::string& what) const { throw InputError(path_ + ": " + what); }

std::shared_ptr<SqmFile> SqmFile::open(const std::string& path, bool verify_checksums) {
  return open(MappedFile::open(path), verify_checksums);
}

std::shared_ptr<SqmFile> SqmFile::open(std::shared_ptr<const MappedFile> file, bool verify_checksums) {
  std::shared_ptr<SqmFile> f(new SqmFile());
  f->path_ = file->path();
  f->file_ = std::move(file);
  f->parse();
  if (verify_checksums) f->verify_checksums();
  return f;
}

void SqmFile::parse() {
  const uint8_t* p = file_->data();
  const uint64_t size = file_->size();
  const std::string truncated = "truncated .sqm file (" + std::to_string(size) + " bytes";

  if (size < 8) {
    if (size > 0 && std::memcmp(p, kMagic, size) == 0) fail(truncated + "; the preamble alone is 128 bytes)");
    fail("not an sqkit .sqm file");
  }
  if (std::memcmp(p, kMagic, 8) != 0) fail("not an sqkit .sqm file");
  if (size < kOffVersion + 4) fail(truncated + "; the preamble alone is 128 bytes)");
  const uint32_t version = rd32(p + kOffVersion);
  if (version != kSqmVersion)
    throw UnsupportedError(path_ + ": .sqm format version " + std::to_string(version) +
                           " is not supported (this sqkit reads version " + std::to_string(kSqmVersion) + ")");
  if (size < kSqmPreambleSize) fail(truncated + "; the preamble alone is 128 bytes)");
  if (XXH3_64bits(p, kOffPreambleHash) != rd64(p + kOffPreambleHash)) fail("corrupt .sqm preamble (checksum mismatch)");
  flags_ = rd32(p + kOffFlags);
  if (flags_ & ~kSqmFlagCompressed) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", flags_);
    throw UnsupportedError(path_ + ": the file uses .sqm feature flags " + buf + " unknown to this sqkit");
  }
  const uint64_t data_offset = rd64(p + kOffDataOffset), data_size = rd64(p + kOffDataSize);
  const uint64_t header_offset = rd64(p + kOffHeaderOffset), header_size = rd64(p + kOffHeaderSize);
  const uint64_t table_offset = rd64(p + kOffTableOffset), table_size = rd64(p + kOffTableSize);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (data_offset != kSqmPreambleSize)
    fail("corrupt preamble: the data region starts at byte " + std::to_string(data_offset) + ", expected 128");
  if (data_size > kMax - data_offset || data_offset + data_size != header_offset)
    fail("corrupt preamble: the JSON header does not follow the data region");
  if (header_size > kMax - header_offset || header_offset + header_size != table_offset)
    fail("corrupt preamble: the tensor table does not follow the JSON header");
  if (table_size > kMax - table_offset) fail("corrupt preamble: the tensor table size is out of range");
  const uint64_t end = table_offset + table_size;
  if (end > size)
    fail(truncated + ", the preamble says " + std::to_string(end) + ")");
  if (end < size) fail(std::to_string(size - end) + " unexpected bytes after the tensor table (file corrupt)");
  if (XXH3_64bits(p + header_offset, header_size) != rd64(p + kOffHeaderHash))
    fail("checksum mismatch in the JSON header (file corrupt)");
  if (XXH3_64bits(p + table_offset, table_size) != rd64(p + kOffTableHash))
    fail("checksum mismatch in the tensor table (file corrupt)");

  // ---- JSON header
  const auto text = [&](uint64_t offset, uint64_t n) { return std::string_view(reinterpret_cast<const char*>(p + offset), n); };
  check_json_depth(text(header_offset, header_size), path_ + ": the JSON header");
  check_json_depth(text(table_offset, table_size), path_ + ": the tensor table");
  try {
    header_ = nlohmann::json::parse(p + header_offset, p + header_offset + header_size);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("the JSON header is not valid JSON: ") + e.what());
  }
  if (!header_.is_object()) fail("the JSON header is not a JSON object");
  const auto fmt = header_.find("format");
  if (fmt == header_.end() || !fmt->is_object() || fmt->value("name", nlohmann::json()) != kFormatName)
    fail("the JSON header lacks the \"format\" object written by sqkit");

  // ---- tensor table
  nlohmann::json table;
  try {
    table = nlohmann::json::parse(p + table_offset, p + table_offset + table_size);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("the tensor table is not valid JSON: ") + e.what());
  }
  if (!table.is_array()) fail("the tensor table is not a JSON array");
  if (fmt->value("tensor_count", nlohmann::json()) != table.size())
    fail("the JSON header's tensor_count disagrees with the tensor table");

  uint64_t prev_end = data_offset;
  bool any_compressed = false;
  tensors_.reserve(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& j = table[i];
    const std::string where = "tensor table entry " + std::to_string(i);
    if (!j.is_object()) fail(where + " is not a JSON object");
    auto field = [&](const char* key) -> const nlohmann::json& {
      const auto it = j.find(key);
      if (it == j.end()) fail(where + " lacks \"" + key + "\"");
      return *it;
    };
    auto u64 = [&](const char* key) -> uint64_t {
      const auto& v = field(key);
      if (!v.is_number_unsigned()) fail(where + ": \"" + key + "\" is not a non-negative integer");
      return v.get<uint64_t>();
    };
    auto str = [&](const char* key) -> std::string {
      const auto& v = field(key);
      if (!v.is_string()) fail(where + ": \"" + key + "\" is not a string");
      return v.get<std::string>();
    };

    SqmTensorInfo t;
    t.name = str("name");
    if (t.name.empty()) fail(where + " has an empty name");
    const std::string tw = "tensor '" + t.name + "'";
    if (index_.count(t.name)) fail("duplicate " + tw + " in the tensor table");
    const std::string dtype = str("dtype");
    const auto dt = sqm_dtype_from_name(dtype);
    if (!dt)
      throw UnsupportedError(path_ + ": " + tw + " has dtype '" + dtype +
                             "', which this sqkit does not support (F32 F16 BF16 I8 U8 I32 I4x2 U4x2)");
    t.dtype = *dt;
    const auto& shape = field("shape");
    if (!shape.is_array()) fail(tw + ": \"shape\" is not an array");
    if (shape.size() > kMaxRank) fail(tw + ": rank " + std::to_string(shape.size()) + " exceeds the maximum of 16");
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(tw + ": \"shape\" holds something other than non-negative integers");
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    uint64_t expected = 0;
    try {
      expected = sqm_byte_count(t.dtype, t.shape);
    } catch (const std::invalid_argument& e) {
      fail(tw + ": " + e.what());
    }
    t.offset = u64("offset");
    t.stored_bytes = u64("stored_bytes");
    t.raw_bytes = u64("raw_bytes");
    const std::string compression = str("compression");
    if (compression == "zstd") t.compressed = true;
    else if (compression != "none")
      throw UnsupportedError(path_ + ": " + tw + " uses compression '" + compression +
                             "', which this sqkit does not support (none, zstd)");
    const auto hash = parse_hex64(str("xxh3"));
    if (!hash) fail(tw + ": \"xxh3\" is not 16 lowercase hexadecimal digits");
    t.xxh3 = t.stored_xxh3 = *hash;
    if (t.compressed) {
      const auto stored_hash = parse_hex64(str("stored_xxh3"));
      if (!stored_hash) fail(tw + ": \"stored_xxh3\" is not 16 lowercase hexadecimal digits");
      t.stored_xxh3 = *stored_hash;
    }

    if (t.raw_bytes != expected)
      fail(tw + ": raw_bytes is " + std::to_string(t.raw_bytes) + " but " + dtype + " " + shape_str(t.shape) +
           " needs " + std::to_string(expected));
    if (t.offset % kSqmAlignment != 0)
      fail(tw + ": offset " + std::to_string(t.offset) + " is not a multiple of 64");
    if (t.offset < prev_end)
      fail(tw + ": offset " + std::to_string(t.offset) + " overlaps the previous tensor or the preamble (ends at " +
           std::to_string(prev_end) + ")");
    if (t.offset - prev_end >= kSqmAlignment)
      fail(tw + ": " + std::to_string(t.offset - prev_end) + " unaccounted bytes before its data (file corrupt)");
    if (t.offset > header_offset || t.stored_bytes > header_offset - t.offset)
      fail(tw + ": bytes [" + std::to_string(t.offset) + ", +" + std::to_string(t.stored_bytes) +
           ") lie outside the data region (ends at " + std::to_string(header_offset) + ")");
    for (uint64_t b = prev_end; b < t.offset; ++b)
      if (p[b] != 0) fail("nonzero padding byte at offset " + std::to_string(b) + " before " + tw + " (file corrupt)");
    if (!t.compressed) {
      if (t.stored_bytes != t.raw_bytes)
        fail(tw + ": stored_bytes " + std::to_string(t.stored_bytes) + " != raw_bytes " + std::to_string(t.raw_bytes) +
             " for an uncompressed tensor");
    } else {
      any_compressed = true;
      if (t.stored_bytes == 0) fail(tw + ": a compressed tensor with no stored bytes");
      if (t.raw_bytes / kZstdMaxRatio > t.stored_bytes)
        fail(tw + ": raw_bytes " + std::to_string(t.raw_bytes) + " exceeds zstd's maximum expansion of its " +
             std::to_string(t.stored_bytes) + " stored bytes");
      const unsigned long long cs = ZSTD_getFrameContentSize(p + t.offset, t.stored_bytes);
      if (cs != t.raw_bytes) fail(tw + ": the zstd frame does not declare raw_bytes (file corrupt)");
    }
    prev_end = t.offset + t.stored_bytes;
    index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  if (prev_end != header_offset)
    fail(std::to_string(header_offset - prev_end) + " unaccounted bytes at the end of the data region (file corrupt)");
  if (any_compressed != ((flags_ & kSqmFlagCompressed) != 0))
    fail("the preamble's compression flag disagrees with the tensor table (file corrupt)");
}

std::vector<std::string> SqmFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

const SqmTensorInfo& SqmFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail("no tensor '" + name + "'");
  return tensors_[it->second];
}

void SqmFile::verify_checksum(const SqmTensorInfo& t) const {
  const uint8_t* src = file_->data() + t.offset;
  const std::string mismatch = "checksum mismatch in tensor '" + t.name + "' (file corrupt)";
  if (!t.compressed) {
    if (XXH3_64bits(src, t.raw_bytes) != t.xxh3) fail(mismatch);
    return;
  }
  if (XXH3_64bits(src, t.stored_bytes) != t.stored_xxh3) fail(mismatch);
  DCtx dctx;
  XxhState hash;
  std::vector<uint8_t> out(ZSTD_DStreamOutSize());
  ZSTD_inBuffer in{src, t.stored_bytes, 0};
  uint64_t total = 0;
  const auto corrupt = [&](const std::string& why) {
    fail("corrupt zstd data in tensor '" + t.name + "' (" + why + "; file corrupt)");
  };
  for (;;) {
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    const size_t ret = ZSTD_decompressStream(dctx.c, &ob, &in);
    if (ZSTD_isError(ret)) corrupt(ZSTD_getErrorName(ret));
    total += ob.pos;
    if (total > t.raw_bytes) corrupt("decompresses to more than raw_bytes");
    XXH3_64bits_update(hash.s, out.data(), ob.pos);
    if (ret == 0) break;
    if (in.pos == in.size && ob.pos < ob.size) corrupt("the frame is cut short");
  }
  if (in.pos != in.size) corrupt("trailing bytes after the frame");
  if (total != t.raw_bytes) corrupt("decompresses to fewer than raw_bytes");
  if (XXH3_64bits_digest(hash.s) != t.xxh3) fail(mismatch);
}

void SqmFile::verify_checksums() const {
  // Each tensor's pages are released once hashed: verifying a 3.6 GB file does not leave 3.6 GB of
  // it in the resident set while the model is then built (pages are read again when touched).
  for (const auto& t : tensors_) {
    verify_checksum(t);
    file_->release(static_cast<size_t>(t.offset), static_cast<size_t>(t.compressed ? t.stored_bytes : t.raw_bytes));
  }
}

SqmBytes SqmFile::raw(const std::string& name) const {
  const SqmTensorInfo& t = info(name);
  if (t.raw_bytes == 0) return {};
  if (!t.compressed) return {file_->data() + t.offset, static_cast<size_t>(t.raw_bytes)};
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(name);
    if (it != cache_.end()) return {it->second->data(), it->second->size()};
  }
  auto buf = std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(t.raw_bytes));
  const size_t n = ZSTD_decompress(buf->data(), buf->size(), file_->data() + t.offset, t.stored_bytes);
  if (ZSTD_isError(n)) fail("corrupt zstd data in tensor '" + name + "' (" + ZSTD_getErrorName(n) + "; file corrupt)");
  if (n != t.raw_bytes) fail("corrupt zstd data in tensor '" + name + "' (wrong decompressed size; file corrupt)");
  std::lock_guard<std::mutex> lock(cache_mutex_);
  const auto& slot = cache_.emplace(name, std::move(buf)).first->second;  // keeps an earlier racer's buffer
  return {slot->data(), slot->size()};
}

bool looks_like_sqm(const std::string& path) { return file_starts_with(path, std::string_view(kMagic, 8)); }

}  // namespace sq
