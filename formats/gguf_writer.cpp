#include "formats/gguf_writer.h"

#include <cstring>
#include <set>

#include "core/error.h"

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

std::string write_gguf_metadata(const std::vector<std::pair<std::string, const GgufValue*>>& kvs) {
  std::string out;
  put<uint32_t>(out, 0x46554747u);  // "GGUF"
  put<uint32_t>(out, 3);
  put<uint64_t>(out, 0);
  put<uint64_t>(out, kvs.size());
  std::set<std::string> seen;
  for (const auto& [key, value] : kvs) {
    if (key.empty()) throw InputError("GGUF writer: empty metadata key");
    if (!seen.insert(key).second) throw InputError("GGUF writer: metadata key \"" + key + "\" given twice");
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(value->type));
    put_value(out, *value);
  }
  return out;
}

}  // namespace sq
