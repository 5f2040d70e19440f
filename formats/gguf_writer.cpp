#include "formats/gguf_writer.h"

#include <cstring>
#include <set>

#include <stdexcept>

#include "core/error.h"
#include "formats/atomic_file.h"

namespace sq {

namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // GGUF is little-endian, as every platform sqkit builds for
  out.append(b, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    default: return 0;
  }
}

void put_scalar(std::string& out, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::F32: put<float>(out, static_cast<float>(v.real)); break;
    case GgufValueType::F64: put<double>(out, v.real); break;
    default: {
      const size_t n = scalar_size(v.type);
      const uint64_t x = v.integer;
      char b[8];
      std::memcpy(b, &x, 8);
      out.append(b, n);  // low bytes of the widened value: the original little-endian encoding
    }
  }
}

void put_value(std::string& out, const GgufValue& v) {
  if (v.type == GgufValueType::STRING) {
    put_string(out, v.str);
  } else if (v.type == GgufValueType::ARRAY) {
    put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
    put<uint64_t>(out, v.count);
    if (v.elem_type == GgufValueType::STRING) {
      for (std::string_view s : v.strings) put_string(out, s);
    } else if (v.elem_type == GgufValueType::ARRAY) {
      for (const GgufValue& item : v.items) put_value(out, item);
    } else {
      if (v.count) out.append(reinterpret_cast<const char*>(v.elems), v.count * scalar_size(v.elem_type));
    }
  } else {
    put_scalar(out, v);
  }
}

}  // namespace

namespace {

/// Header and key/values of a GGUF v3 file with `n_tensors` tensors (infos not included).
std::string header_and_kvs(const std::vector<std::pair<std::string, const GgufValue*>>& kvs, uint64_t n_tensors,
                           const GgufValue* alignment) {
  std::string out;
  put<uint32_t>(out, 0x46554747u);  // "GGUF"
  put<uint32_t>(out, 3);
  put<uint64_t>(out, n_tensors);
  put<uint64_t>(out, kvs.size() + (alignment ? 1 : 0));
  std::set<std::string> seen;
  auto one = [&](const std::string& key, const GgufValue* value) {
    if (key.empty()) throw InputError("GGUF writer: empty metadata key");
    if (!seen.insert(key).second) throw InputError("GGUF writer: metadata key \"" + key + "\" given twice");
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(value->type));
    put_value(out, *value);
  };
  if (alignment) one("general.alignment", alignment);
  for (const auto& [key, value] : kvs) one(key, value);
  return out;
}

}  // namespace

std::string write_gguf_metadata(const std::vector<std::pair<std::string, const GgufValue*>>& kvs) {
  return header_and_kvs(kvs, 0, nullptr);
}

uint64_t gguf_tensor_nbytes(const GgufTensorSpec& t) {
  const GgmlTypeTraits* tr = ggml_type_traits(static_cast<uint32_t>(t.type));
  if (!tr) throw InputError("GGUF writer: tensor '" + t.name + "' has unknown ggml type " + std::to_string(uint32_t(t.type)));
  if (t.dims.empty() || t.dims.size() > 4) throw InputError("GGUF writer: tensor '" + t.name + "' must have 1 to 4 dims");
  uint64_t numel = 1;
  for (int64_t d : t.dims) {
    if (d < 0) throw InputError("GGUF writer: tensor '" + t.name + "' has a negative dim");
    numel *= static_cast<uint64_t>(d);
  }
  if (t.dims[0] % tr->block_size != 0)
    throw InputError("GGUF writer: tensor '" + t.name + "' has row length " + std::to_string(t.dims[0]) +
                     ", not a multiple of the " + tr->name + " block size " + std::to_string(tr->block_size));
  return numel / static_cast<uint64_t>(tr->block_size) * static_cast<uint64_t>(tr->type_size);
}

GgufStreamWriter::GgufStreamWriter(const std::string& path, const std::vector<std::pair<std::string, const GgufValue*>>& kvs,
                                   std::vector<GgufTensorSpec> tensors, uint32_t alignment)
    : tensors_(std::move(tensors)), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw InputError("GGUF writer: alignment " + std::to_string(alignment) + " is not a power of two");
  GgufValue align;
  align.type = GgufValueType::U32;
  align.integer = alignment;
  std::string head = header_and_kvs(kvs, tensors_.size(), alignment == 32 ? nullptr : &align);
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensorSpec& t : tensors_) {
    if (t.name.empty() || t.name.size() > 64)
      throw InputError("GGUF writer: tensor name '" + t.name + "' must be 1 to 64 bytes");
    if (!names.insert(t.name).second) throw InputError("GGUF writer: tensor '" + t.name + "' given twice");
    const uint64_t n = gguf_tensor_nbytes(t);
    nbytes_.push_back(n);
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset += (n + alignment_ - 1) / alignment_ * alignment_;
  }
  head.append((alignment_ - head.size() % alignment_) % alignment_, '\0');
  file_ = std::make_unique<AtomicFile>(path);
  file_->write(head.data(), head.size());
}

GgufStreamWriter::~GgufStreamWriter() = default;

const GgufTensorSpec& GgufStreamWriter::next() const {
  if (next_ >= tensors_.size()) throw std::logic_error("GgufStreamWriter: every tensor was written already");
  return tensors_[next_];
}

void GgufStreamWriter::write_next(const void* data, size_t n) {
  const GgufTensorSpec& t = next();
  if (n != nbytes_[next_])
    throw std::logic_error("GgufStreamWriter: tensor '" + t.name + "' got " + std::to_string(n) + " bytes, expected " +
                           std::to_string(nbytes_[next_]));
  if (n) file_->write(data, n);
  static const char zeros[64] = {};
  size_t pad = (alignment_ - n % alignment_) % alignment_;
  while (pad) {
    const size_t k = pad < sizeof(zeros) ? pad : sizeof(zeros);
    file_->write(zeros, k);
    pad -= k;
  }
  ++next_;
}

void GgufStreamWriter::finish() {
  if (next_ != tensors_.size())
    throw std::logic_error("GgufStreamWriter: tensor '" + tensors_[next_].name + "' was not written");
  file_->commit();
}

uint64_t GgufStreamWriter::bytes_written() const { return file_->position(); }

}  // namespace sq
