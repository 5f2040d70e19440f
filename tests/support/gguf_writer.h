// A tiny GGUF writer for tests and fuzz seeds (header-only, no sqkit dependencies).
//
// Writes the layout formats/gguf_file.h documents: header, metadata key/values, tensor infos,
// padding to the alignment, data. Values are given as already-encoded payloads through the typed
// helpers; the `*_override` fields and raw() let bad-input tests produce broken files on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace sq::test {

class GgufWriter {
 public:
  // ---- little-endian encoders (also used to build array payloads) ----
  static std::string u8(uint8_t v) { return std::string(1, static_cast<char>(v)); }
  static std::string u16(uint16_t v) { return le(v); }
  static std::string u32(uint32_t v) { return le(v); }
  static std::string u64(uint64_t v) { return le(v); }
  static std::string i8(int8_t v) { return le(v); }
  static std::string i16(int16_t v) { return le(v); }
  static std::string i32(int32_t v) { return le(v); }
  static std::string i64(int64_t v) { return le(v); }
  static std::string f32(float v) { return le(v); }
  static std::string f64(double v) { return le(v); }
  static std::string str(const std::string& s) { return u64(s.size()) + s; }

  // GGUF value type ids.
  enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

  /// Adds key `key` with value type `type` and encoded value `payload` (for ARRAY: element type,
  /// count and elements).
  GgufWriter& kv(const std::string& key, uint32_t type, const std::string& payload) {
    kvs_ += str(key) + u32(type) + payload;
    ++n_kv_;
    return *this;
  }
  GgufWriter& kv_u32(const std::string& k, uint32_t v) { return kv(k, U32, u32(v)); }
  GgufWriter& kv_i32(const std::string& k, int32_t v) { return kv(k, I32, i32(v)); }
  GgufWriter& kv_u64(const std::string& k, uint64_t v) { return kv(k, U64, u64(v)); }
  GgufWriter& kv_f32(const std::string& k, float v) { return kv(k, F32, f32(v)); }
  GgufWriter& kv_bool(const std::string& k, bool v) { return kv(k, BOOL, u8(v ? 1 : 0)); }
  GgufWriter& kv_string(const std::string& k, const std::string& v) { return kv(k, STRING, str(v)); }
  /// An array payload: element type, count, then the already-encoded elements.
  static std::string array(uint32_t elem_type, uint64_t count, const std::string& elems) {
    return u32(elem_type) + u64(count) + elems;
  }
  GgufWriter& kv_strings(const std::string& k, const std::vector<std::string>& v) {
    std::string e;
    for (const auto& s : v) e += str(s);
    return kv(k, ARRAY, array(STRING, v.size(), e));
  }

  /// Adds a tensor: ggml dims (dims[0] contiguous), ggml type id, its bytes. The offset is the
  /// next aligned position of the data section unless `offset` is given.
  GgufWriter& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, std::string data,
                     std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(dims), type, std::move(data), offset});
    return *this;
  }

  uint32_t magic = 0x46554747u;
  uint32_t version = 3;
  uint64_t alignment = 32;  ///< used for padding; write general.alignment yourself to change it in the file
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  /// The whole file.
  std::string bytes() const {
    std::string out = u32(magic) + u32(version) + u64(tensor_count_override.value_or(tensors_.size())) +
                      u64(kv_count_override.value_or(n_kv_)) + kvs_;
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = align(off + t.data.size());
      out += str(t.name) + u32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out += u64(d);
      out += u32(t.type) + u64(off);
    }
    out.resize(align(out.size()), '\0');
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const size_t at = data_start + offsets[i];
      if (out.size() < at + tensors_[i].data.size()) out.resize(at + tensors_[i].data.size(), '\0');
      std::memcpy(out.data() + at, tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out;
  }

 private:
  template <typename T>
  static std::string le(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));  // the test machines are little-endian, like GGUF
    return s;
  }
  uint64_t align(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
    std::optional<uint64_t> offset;
  };
  std::string kvs_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace sq::test
