#include "formats/safetensors.h"

#include "formats/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "formats/json_limits.h"

namespace sq {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// ---- scalar conversions ------------------------------------------------------------------------

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float (mant < 2^10).
    float v = float(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  uint32_t bits;
  if (exp == 0x1f)
    bits = sign | 0x7f800000u | (mant << 13);  // inf (mant 0) or NaN (payload kept)
  else
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // rebias 15 -> 127
  return std::bit_cast<float>(bits);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

uint16_t float_to_half(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint16_t sign = uint16_t((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    if (a == 0x7f800000u) return sign | 0x7c00u;                 // inf
    return uint16_t(sign | 0x7e00u | ((a & 0x7fffffu) >> 13));   // quiet NaN, payload high bits
  }
  if (a >= 0x47800000u) return sign | 0x7c00u;  // >= 65536: overflow to inf
  const uint32_t e = a >> 23;                    // biased float exponent
  if (e < 113) {
    // Result is a half subnormal (or zero): value = m * 2^(e-150) = (m >> (126 - e)) units of 2^-24.
    if (e < 102) return sign;  // < 2^-25 even with a full mantissa: rounds to zero
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // e >= 102 so the input is a float normal
    const uint32_t shift = 126 - e;                   // 14..24
    uint32_t q = m >> shift;
    const uint32_t r = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (r > halfway || (r == halfway && (q & 1u))) ++q;  // may carry into the smallest normal
    return uint16_t(sign | q);
  }
  // Normal: rebias 127 -> 15, keep 10 mantissa bits, round the 13 dropped bits to nearest even.
  // A carry out of the mantissa correctly increments the exponent (up to inf for >= 65520).
  uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
  const uint32_t r = a & 0x1fffu;
  if (r > 0x1000u || (r == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

uint16_t float_to_bf16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return uint16_t((f >> 16) | 0x40u);  // quiet NaN, sign kept
  const uint32_t rounding_bias = 0x7fffu + ((f >> 16) & 1u);
  return uint16_t((f + rounding_bias) >> 16);  // carries into the exponent (up to inf) as needed
}

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// ---- reader ------------------------------------------------------------------------------------

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // same limit as the reference Rust implementation

std::string quote_name(const std::string& s) { return "'" + s + "'"; }

/// Reads a non-negative JSON integer; false when `v` is not one.
bool get_u64(const nlohmann::json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    out = uint64_t(s);
    return true;
  }
  return false;
}

/// Runs fn(begin, end) over [0, n) on two threads when n is large.
template <typename Fn>
void parallel_range(int64_t n, Fn fn) {
  constexpr int64_t kMinParallel = 1 << 20;
  if (n < kMinParallel) {
    fn(int64_t(0), n);
    return;
  }
  const int64_t mid = n / 2;
  std::thread t([&] { fn(int64_t(0), mid); });
  fn(mid, n);
  t.join();
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : SafetensorsFile(MappedFile::open(path)) {}  // InputError "cannot open PATH: ..." when missing

SafetensorsFile::SafetensorsFile(std::shared_ptr<const MappedFile> file) : path_(file->path()), file_(std::move(file)) {
  const std::string& path = path_;
  const uint64_t size = file_->size();
  if (size < 8)
    throw InputError(path + ": not a safetensors file: " + std::to_string(size) +
                     " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, file_->data(), 8);  // little-endian host (static_assert above)
  if (n > size - 8)
    throw InputError(path + ": safetensors header length " + std::to_string(n) + " runs past the end of the file (" +
                     std::to_string(size) + " bytes; expected at most " + std::to_string(size - 8) + ")");
  if (n > kMaxHeaderSize)
    throw InputError(path + ": safetensors header length " + std::to_string(n) + " is larger than the " +
                     std::to_string(kMaxHeaderSize) + "-byte limit");
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;

  const char* hdr = reinterpret_cast<const char*>(file_->data() + 8);
  check_json_depth(std::string_view(hdr, n), path + ": safetensors header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(hdr, hdr + n);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw InputError(path + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!j.is_object())
    throw InputError(path + ": safetensors header must be a JSON object, got " + std::string(j.type_name()));

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw InputError(path + ": safetensors \"__metadata__\" must be a JSON object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw InputError(path + ": safetensors \"__metadata__\" value for key " + quote_name(m.key()) +
                           " must be a string, got " + m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + quote_name(name);
    if (!v.is_object()) throw InputError(where + ": header entry must be a JSON object, got " + v.type_name());
    SafetensorsTensorInfo info;
    info.name = name;

    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) throw InputError(where + ": missing string field \"dtype\"");
    info.dtype = dt->get<std::string>();
    const size_t esize = safetensors_dtype_size(info.dtype);
    if (esize == 0)
      throw UnsupportedError(where + ": unknown dtype " + quote_name(info.dtype) +
                             " (expected F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U64, U32, U16, U8 or BOOL)");

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) throw InputError(where + ": missing array field \"shape\"");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      uint64_t dim = 0;
      if (!get_u64(d, dim) || dim > uint64_t(INT64_MAX))
        throw InputError(where + ": \"shape\" must hold non-negative integers, got " + json_excerpt(*sh));
      info.shape.push_back(int64_t(dim));
      overflow |= __builtin_mul_overflow(numel, dim, &numel);
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !get_u64((*off)[0], info.begin) ||
        !get_u64((*off)[1], info.end))
      throw InputError(where + ": \"data_offsets\" must be an array of two non-negative integers [begin, end]");
    if (info.begin > info.end)
      throw InputError(where + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                       "] has begin > end");
    if (info.end > data_size)
      throw InputError(where + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                       "] run past the end of the data section (" + std::to_string(data_size) +
                       " bytes; file truncated?)");
    uint64_t expected = 0;
    overflow |= __builtin_mul_overflow(numel, uint64_t(esize), &expected);
    if (overflow || expected != info.end - info.begin)
      throw InputError(where + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                       "] span " + std::to_string(info.end - info.begin) + " bytes, expected " +
                       (overflow ? std::string("an overflowing count") : std::to_string(expected)) + " for " +
                       info.dtype + " " + shape_to_string(info.shape));
    tensors_.emplace(name, std::move(info));
  }

  // No two byte ranges may overlap (empty ranges occupy no bytes).
  std::vector<const SafetensorsTensorInfo*> order;
  for (const auto& [name, info] : tensors_)
    if (info.end > info.begin) order.push_back(&info);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      throw InputError(path + ": tensors " + quote_name(order[i - 1]->name) + " [" + std::to_string(order[i - 1]->begin) +
                       ", " + std::to_string(order[i - 1]->end) + ") and " + quote_name(order[i]->name) + " [" +
                       std::to_string(order[i]->begin) + ", " + std::to_string(order[i]->end) +
                       ") overlap in the data section");
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InputError(path_ + ": no tensor " + quote_name(name) + " in this safetensors file");
  return it->second;
}

const uint8_t* SafetensorsFile::raw_data(const std::string& name) const {
  const auto& i = info(name);
  if (i.end == i.begin) return nullptr;
  return file_->data() + data_start_ + i.begin;
}

Tensor SafetensorsFile::load_f32(const std::string& name, std::shared_ptr<const void> keepalive) const {
  const SafetensorsTensorInfo& i = info(name);
  const int64_t n = i.numel();
  const uint8_t* src = raw_data(name);
  if (i.dtype == "F32") {
    if (n == 0) return Tensor::zeros(i.shape);
    if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      std::shared_ptr<const void> hold = file_;
      if (keepalive)
        hold = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(file_, keepalive);
      return Tensor::view(i.shape, reinterpret_cast<const float*>(src), std::move(hold));
    }
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), src, size_t(n) * sizeof(float));
    file_->release(size_t(data_start_ + i.begin), size_t(i.end - i.begin));
    return Tensor::from_vector(i.shape, std::move(v));
  }
  if (i.dtype == "F16" || i.dtype == "BF16") {
    const bool bf16 = i.dtype == "BF16";
    std::vector<float> v(static_cast<size_t>(n));
    float* dst = v.data();
    parallel_range(n, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * k, 2);  // possibly unaligned
        dst[k] = bf16 ? bf16_to_float(bits) : half_to_float(bits);
      }
    });
    file_->release(size_t(data_start_ + i.begin), size_t(i.end - i.begin));  // the copy is all that is needed now
    return Tensor::from_vector(i.shape, std::move(v));
  }
  throw UnsupportedError(path_ + ": tensor " + quote_name(name) + " has dtype " + i.dtype +
                         ", which cannot be loaded as FP32 (supported: F32, F16, BF16)");
}

// ---- writer ------------------------------------------------------------------------------------

namespace {

/// A temporary file next to `path` that becomes `path` on commit() and is removed otherwise.

}  // namespace

int64_t SafetensorsOutput::numel() const {
  if (!raw && !generate) return tensor.numel();
  int64_t n = 1;
  for (int64_t d : raw_shape) n *= d;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.raw) {
      int64_t numel = 1;
      for (int64_t d : t.raw_shape) numel *= d;
      const size_t esize = safetensors_dtype_size(t.dtype);
      if (esize == 0 || t.raw->size() != uint64_t(numel) * esize)
        throw UsageError("cannot write " + path + ": raw tensor '" + t.name + "' has " + std::to_string(t.raw->size()) +
                         " bytes for dtype '" + t.dtype + "' and shape " + shape_to_string(t.raw_shape));
      if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
        throw UsageError("cannot write " + path + ": tensor name '" + t.name + "' is empty, reserved or duplicated");
      nlohmann::ordered_json e;
      e["dtype"] = t.dtype;
      e["shape"] = t.raw_shape;
      e["data_offsets"] = {offset, offset + t.raw->size()};
      header[t.name] = std::move(e);
      offset += t.raw->size();
      continue;
    }
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
      throw UsageError("cannot write tensor '" + t.name + "' to " + path + " as dtype '" + t.dtype +
                       "' (expected F32, F16 or BF16)");
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      throw UsageError("cannot write " + path + ": tensor name '" + t.name + "' is empty, reserved or duplicated");
    const std::vector<int64_t>& shape = t.generate ? t.raw_shape : t.tensor.shape();
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) throw UsageError("cannot write " + path + ": tensor '" + t.name + "' has a negative dimension");
      numel *= d;
    }
    if (!t.generate && numel != t.tensor.numel())
      throw UsageError("cannot write " + path + ": tensor '" + t.name + "' has no data for shape " +
                       t.tensor.shape_string());
    const uint64_t bytes = uint64_t(numel) * safetensors_dtype_size(t.dtype);
    nlohmann::ordered_json e;
    e["dtype"] = t.dtype;
    e["shape"] = shape;
    e["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(e);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data section starts at a multiple of 8
  const uint64_t n = text.size();

  AtomicFile f(path);
  f.write(&n, 8);
  f.write(text.data(), text.size());
  constexpr int64_t kChunk = kSafetensorsWriteChunk;
  std::vector<uint16_t> buf;
  std::vector<float> generated;
  for (const auto& t : tensors) {
    if (t.raw) {
      if (!t.raw->empty()) f.write(t.raw->data(), t.raw->size());
      continue;
    }
    const int64_t count = t.numel();
    if (t.dtype == "F32" && !t.generate) {
      if (count) f.write(t.tensor.data(), size_t(count) * sizeof(float));
      continue;
    }
    const bool bf16 = t.dtype == "BF16";
    for (int64_t b = 0; b < count; b += kChunk) {
      const int64_t e = std::min(count, b + kChunk);
      const float* src = nullptr;
      if (!t.generate) {
        src = t.tensor.data() + b;
      } else {
        generated.resize(size_t(e - b));
        t.generate(b, e, generated.data());
        src = generated.data();
      }
      if (t.dtype == "F32") {
        f.write(src, size_t(e - b) * sizeof(float));
        continue;
      }
      buf.resize(size_t(e - b));
      for (int64_t k = 0; k < e - b; ++k) buf[size_t(k)] = bf16 ? float_to_bf16(src[k]) : float_to_half(src[k]);
      f.write(buf.data(), buf.size() * sizeof(uint16_t));
    }
  }
  f.commit();
}

}  // namespace sq
