#include "formats/gguf_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace sq {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF" read as a little-endian u32
constexpr size_t kHeaderBytes = 24;
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;              // key length, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, one dim, type, offset
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxNestedArrays = uint64_t(1) << 20;  // arrays inside arrays, whole file
constexpr size_t kMaxTensorName = 64;    // GGUF spec: tensor names are at most 64 bytes
constexpr size_t kMaxKey = 65535;        // GGUF spec: keys are at most 2^16 - 1 bytes
constexpr uint64_t kMaxAlignment = uint64_t(1) << 30;

std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 80)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (s.size() > 80) out += "...";
  return out + "'";
}

/// Size in bytes of a fixed-size value type, 0 for STRING / ARRAY / unknown types.
size_t fixed_size(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::U16:
    case GgufValueType::I16:
      return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32:
      return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64:
      return 8;
    default:
      return 0;
  }
}

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::F64); }

/// Decodes one little-endian fixed-size value of type `t` at `p` into (integer, real).
void decode_fixed(GgufValueType t, const uint8_t* p, uint64_t& integer, double& real) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::BOOL:
      integer = p[0];
      return;
    case GgufValueType::I8:
      integer = static_cast<uint64_t>(int64_t(static_cast<int8_t>(p[0])));
      return;
    case GgufValueType::U16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      integer = v;
      return;
    }
    case GgufValueType::I16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      integer = static_cast<uint64_t>(int64_t(v));
      return;
    }
    case GgufValueType::U32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      integer = v;
      return;
    }
    case GgufValueType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      integer = static_cast<uint64_t>(int64_t(v));
      return;
    }
    case GgufValueType::U64:
    case GgufValueType::I64:
      std::memcpy(&integer, p, 8);
      return;
    case GgufValueType::F32: {
      float v;
      std::memcpy(&v, p, 4);
      real = v;
      return;
    }
    case GgufValueType::F64:
      std::memcpy(&real, p, 8);
      return;
    default:
      return;
  }
}

bool is_signed(GgufValueType t) {
  return t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32 || t == GgufValueType::I64;
}

/// Bounds-checked little-endian reader over the mapping; every failure names the file, the field
/// and the offset.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }

  [[noreturn]] void fail(const std::string& what) const { throw InputError(path_ + ": " + what); }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail(what + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) + " but the file has " +
           std::to_string(size_) + " bytes (truncated?)");
  }
  const uint8_t* take(uint64_t n, const std::string& what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint32_t u32(const std::string& what) {
    uint32_t v;
    std::memcpy(&v, take(4, what), 4);
    return v;
  }
  uint64_t u64(const std::string& what) {
    uint64_t v;
    std::memcpy(&v, take(8, what), 8);
    return v;
  }
  std::string_view str(const std::string& what) {
    return str_labelled([&] { return what; });
  }
  /// As str(), with the field's name built only on failure (string array elements).
  template <typename Label>
  std::string_view str_labelled(Label&& label) {
    if (left() < 8) need(8, label() + " (string length)");
    uint64_t n;
    std::memcpy(&n, data_ + pos_, 8);
    pos_ += 8;
    if (n > left())
      fail(label() + ": string length " + std::to_string(n) + " at offset " + std::to_string(pos_ - 8) +
           " runs past the end of the file (" + std::to_string(left()) + " bytes left)");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return n == 0 ? std::string_view() : std::string_view(reinterpret_cast<const char*>(p), n);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

/// Reads one value of type `t` (already read) at the cursor; `what` names the key for messages.
/// `nested` counts the arrays met inside arrays so far (each becomes a GgufValue of ~150 bytes from
/// 12 bytes of file: bounded separately).
GgufValue read_value(Cursor& in, uint32_t t, const std::string& what, int depth, uint64_t& nested) {
  if (!known_type(t)) in.fail(what + ": unknown value type " + std::to_string(t) + " (expected 0..12)");
  GgufValue v;
  v.type = static_cast<GgufValueType>(t);
  if (const size_t n = fixed_size(t)) {
    const uint8_t* p = in.take(n, what + " (" + gguf_value_type_name(t) + " value)");
    decode_fixed(v.type, p, v.integer, v.real);
    if (v.type == GgufValueType::BOOL && v.integer > 1)
      in.fail(what + ": bool value " + std::to_string(v.integer) + " at offset " + std::to_string(in.pos() - 1) +
              " (expected 0 or 1)");
    return v;
  }
  if (v.type == GgufValueType::STRING) {
    v.str = std::string(in.str(what));
    return v;
  }
  // ARRAY
  if (depth >= kMaxArrayDepth)
    in.fail(what + ": arrays nested more than " + std::to_string(kMaxArrayDepth) + " deep");
  const uint32_t et = in.u32(what + " (array element type)");
  if (!known_type(et)) in.fail(what + ": unknown array element type " + std::to_string(et) + " (expected 0..12)");
  v.elem_type = static_cast<GgufValueType>(et);
  v.count = in.u64(what + " (array count)");
  const size_t es = fixed_size(et);
  // Minimum encoded size of one element: its size, a string's length field, a nested array's
  // type + count. The count is checked against the bytes left before anything is allocated.
  const uint64_t min_elem = es ? es : (v.elem_type == GgufValueType::STRING ? 8 : 12);
  if (v.count > in.left() / min_elem)
    in.fail(what + ": array of " + std::to_string(v.count) + " " + gguf_value_type_name(et) + " elements at offset " +
            std::to_string(in.pos() - 8) + " needs at least " + std::to_string(min_elem) +
            " bytes each but only " + std::to_string(in.left()) + " bytes are left");
  if (es) {
    v.elems = in.take(v.count * es, what + " (array elements)");
    if (v.elem_type == GgufValueType::BOOL)
      for (uint64_t i = 0; i < v.count; ++i)
        if (v.elems[i] > 1)
          in.fail(what + ": bool array element " + std::to_string(i) + " is " + std::to_string(v.elems[i]) +
                  " (expected 0 or 1)");
  } else if (v.elem_type == GgufValueType::STRING) {
    v.strings.reserve(static_cast<size_t>(v.count));
    for (uint64_t i = 0; i < v.count; ++i)
      v.strings.push_back(in.str_labelled([&] { return what + "[" + std::to_string(i) + "]"; }));
  } else {
    if (v.count > kMaxNestedArrays - nested)
      in.fail(what + ": more than " + std::to_string(kMaxNestedArrays) + " arrays nested in arrays in the file");
    nested += v.count;
    v.items.reserve(static_cast<size_t>(v.count));
    for (uint64_t i = 0; i < v.count; ++i) {
      const std::string w = what + "[" + std::to_string(i) + "]";
      v.items.push_back(read_value(in, static_cast<uint32_t>(GgufValueType::ARRAY), w, depth + 1, nested));
    }
  }
  return v;
}

}  // namespace

std::string gguf_value_type_name(uint32_t type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return known_type(type) ? kNames[type] : "type " + std::to_string(type);
}

bool GgufValue::is_integer() const {
  return fixed_size(static_cast<uint32_t>(type)) != 0 && type != GgufValueType::BOOL && type != GgufValueType::F32 &&
         type != GgufValueType::F64;
}

uint64_t GgufValue::integer_element(uint64_t i) const {
  if (type != GgufValueType::ARRAY || i >= count || !elems || elem_type == GgufValueType::F32 ||
      elem_type == GgufValueType::F64)
    throw std::out_of_range("GgufValue::integer_element: not an integer array or index out of range");
  uint64_t v = 0;
  double r = 0;
  decode_fixed(elem_type, elems + i * fixed_size(static_cast<uint32_t>(elem_type)), v, r);
  return v;
}

double GgufValue::real_element(uint64_t i) const {
  if (type != GgufValueType::ARRAY || i >= count ||
      (elem_type != GgufValueType::F32 && elem_type != GgufValueType::F64))
    throw std::out_of_range("GgufValue::real_element: not a float array or index out of range");
  uint64_t v = 0;
  double r = 0;
  decode_fixed(elem_type, elems + i * fixed_size(static_cast<uint32_t>(elem_type)), v, r);
  return r;
}

GgufFile::GgufFile(const std::string& path) : GgufFile(MappedFile::open(path)) {}

GgufFile::GgufFile(std::shared_ptr<const MappedFile> file) : file_(std::move(file)), path_(file_->path()) { parse(); }

void GgufFile::parse() {
  const uint64_t size = file_->size();
  Cursor in(file_->data(), size, path_);
  if (size < kHeaderBytes)
    in.fail("file of " + std::to_string(size) + " bytes is too short for a GGUF header (24 bytes)");
  const uint32_t magic = in.u32("magic");
  if (magic != kMagic) in.fail("not a GGUF file (magic bytes are not \"GGUF\")");
  version_ = in.u32("version");
  if (version_ == 1)
    in.fail("GGUF version 1 (llama.cpp's format before August 2023, with 32-bit counts) is not supported; convert the "
            "model again with a current llama.cpp (versions 2 and 3 are read)");
  if (version_ != 2 && version_ != 3) {
    const std::string hint = (version_ & 0xffffu) == 0 ? " (a big-endian file? only little-endian GGUF is supported)" : "";
    in.fail("GGUF version " + std::to_string(version_) + " is not supported (expected 2 or 3)" + hint);
  }
  const uint64_t n_tensors = in.u64("tensor_count");
  const uint64_t n_kv = in.u64("metadata_kv_count");
  if (n_kv > in.left() / kMinKvBytes)
    in.fail("metadata_kv_count " + std::to_string(n_kv) + " is impossible for a file of " + std::to_string(size) +
            " bytes (each key/value takes at least " + std::to_string(kMinKvBytes) + " bytes)");
  if (n_tensors > in.left() / kMinTensorInfoBytes)
    in.fail("tensor_count " + std::to_string(n_tensors) + " is impossible for a file of " + std::to_string(size) +
            " bytes (each tensor info takes at least " + std::to_string(kMinTensorInfoBytes) + " bytes)");

  kv_.reserve(static_cast<size_t>(n_kv));
  uint64_t nested = 0;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string label = "metadata key/value #" + std::to_string(k);
    const std::string_view key = in.str(label + " key");
    if (key.empty()) in.fail(label + ": empty key");
    if (key.size() > kMaxKey)
      in.fail(label + ": key of " + std::to_string(key.size()) + " bytes (at most " + std::to_string(kMaxKey) + ")");
    const std::string what = "metadata key " + quote(key);
    const uint32_t t = in.u32(what + " (value type)");
    GgufValue v = read_value(in, t, what, 0, nested);
    if (!index_.emplace(std::string(key), kv_.size()).second) in.fail(what + " is duplicated");
    kv_.emplace_back(std::string(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer()) fail_key("general.alignment", "has type " + gguf_value_type_name(uint32_t(a->type)) + ", expected u32");
    const uint64_t al = a->integer;
    if (is_signed(a->type) && static_cast<int64_t>(al) < 0)
      fail_key("general.alignment", "is " + std::to_string(static_cast<int64_t>(al)) + ", expected a power of two");
    if (al == 0 || (al & (al - 1)) != 0 || al > kMaxAlignment)
      fail_key("general.alignment", "is " + std::to_string(al) + ", expected a power of two from 1 to 2^30");
    alignment_ = al;
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const std::string label = "tensor info #" + std::to_string(k);
    const std::string_view name = in.str(label + " name");
    if (name.empty()) in.fail(label + ": empty tensor name");
    if (name.size() > kMaxTensorName)
      in.fail(label + ": tensor name " + quote(name) + " has " + std::to_string(name.size()) + " bytes (at most " +
              std::to_string(kMaxTensorName) + ")");
    const std::string what = "tensor " + quote(name);
    GgufTensorInfo t;
    t.name = std::string(name);
    const uint32_t n_dims = in.u32(what + " n_dims");
    if (n_dims < 1 || n_dims > 4) in.fail(what + ": n_dims is " + std::to_string(n_dims) + " (expected 1 to 4)");
    int64_t numel = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = in.u64(what + " dims[" + std::to_string(d) + "]");
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()))
        in.fail(what + ": dims[" + std::to_string(d) + "] = " + std::to_string(dim) + " exceeds INT64_MAX");
      t.dims.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) overflow = true;
    }
    if (overflow) {
      std::string dims;
      for (int64_t d : t.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
      in.fail(what + ": element count " + dims + " overflows int64");
    }
    t.numel = numel;
    const uint32_t type_id = in.u32(what + " type");
    const GgmlTypeTraits* traits = ggml_type_traits(type_id);
    if (!traits)
      throw UnsupportedError(path_ + ": " + what + " has unknown ggml type id " + std::to_string(type_id));
    t.type = static_cast<GgmlType>(type_id);
    if (t.dims[0] % traits->block_size != 0)
      in.fail(what + ": row length dims[0] = " + std::to_string(t.dims[0]) + " is not a whole number of " +
              traits->name + " blocks (" + std::to_string(traits->block_size) + " elements each)");
    // numel / block_size blocks; each block of type_size <= 292 bytes: no overflow unless huge.
    const uint64_t blocks = static_cast<uint64_t>(numel / traits->block_size);
    if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(traits->type_size), &t.nbytes))
      in.fail(what + ": byte size of " + std::to_string(numel) + " " + traits->name + " elements overflows");
    t.offset = in.u64(what + " offset");
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) in.fail(what + " is duplicated");
    tensors_.push_back(std::move(t));
  }

  // Data section: the next multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = in.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;  // alignment <= 2^30: no overflow
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_) {
    const std::string what = "tensor " + quote(t.name);
    if (t.offset % alignment_ != 0)
      in.fail(what + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
              std::to_string(alignment_));
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end) ||
        end > size)
      in.fail(what + ": data (" + std::to_string(t.nbytes) + " bytes at data offset " + std::to_string(t.offset) +
              ", file offset " + std::to_string(data_offset_) + " + " + std::to_string(t.offset) +
              ") lies outside the file (" + std::to_string(size) + " bytes)");
    if (t.nbytes) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset)
      in.fail("tensors " + quote(by_offset[i - 1]->name) + " and " + quote(by_offset[i]->name) +
              " overlap in the data section");
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &kv_[it->second].second;
}

void GgufFile::fail_key(const std::string& key, const std::string& what) const {
  throw InputError(path_ + ": metadata key " + quote(key) + " " + what);
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail_key(key, "is missing");
  return *v;
}

int64_t GgufFile::integer_in(const std::string& key, int64_t lo, uint64_t hi) const {
  const GgufValue& v = value(key);
  if (!v.is_integer())
    fail_key(key, "has type " + gguf_value_type_name(uint32_t(v.type)) + ", expected an integer");
  if (is_signed(v.type)) {
    const int64_t x = static_cast<int64_t>(v.integer);
    if (x < lo || (x >= 0 && static_cast<uint64_t>(x) > hi))
      fail_key(key, "= " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  if (v.integer > hi)
    fail_key(key, "= " + std::to_string(v.integer) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int64_t>(v.integer);  // callers asking for u64 reinterpret
}

uint32_t GgufFile::get_u32(const std::string& key) const {
  return static_cast<uint32_t>(integer_in(key, 0, std::numeric_limits<uint32_t>::max()));
}
int32_t GgufFile::get_i32(const std::string& key) const {
  return static_cast<int32_t>(
      integer_in(key, std::numeric_limits<int32_t>::min(), uint64_t(std::numeric_limits<int32_t>::max())));
}
uint64_t GgufFile::get_u64(const std::string& key) const {
  return static_cast<uint64_t>(integer_in(key, 0, std::numeric_limits<uint64_t>::max()));
}
int64_t GgufFile::get_i64(const std::string& key) const {
  return integer_in(key, std::numeric_limits<int64_t>::min(), uint64_t(std::numeric_limits<int64_t>::max()));
}

double GgufFile::get_f64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::F32 && v.type != GgufValueType::F64)
    fail_key(key, "has type " + gguf_value_type_name(uint32_t(v.type)) + ", expected f32 or f64");
  return v.real;
}
float GgufFile::get_f32(const std::string& key) const { return static_cast<float>(get_f64(key)); }

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::BOOL) fail_key(key, "has type " + gguf_value_type_name(uint32_t(v.type)) + ", expected bool");
  return v.integer != 0;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::STRING)
    fail_key(key, "has type " + gguf_value_type_name(uint32_t(v.type)) + ", expected string");
  return v.str;
}

uint64_t GgufFile::get_array_size(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY) fail_key(key, "has type " + gguf_value_type_name(uint32_t(v.type)) + ", expected array");
  return v.count;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING)
    fail_key(key, "is not an array of strings");
  return {v.strings.begin(), v.strings.end()};
}

std::vector<float> GgufFile::get_f32_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || (v.elem_type != GgufValueType::F32 && v.elem_type != GgufValueType::F64))
    fail_key(key, "is not an array of f32");
  std::vector<float> out(static_cast<size_t>(v.count));
  for (uint64_t i = 0; i < v.count; ++i) out[i] = static_cast<float>(v.real_element(i));
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(const std::string& key) const {
  const GgufValue& v = value(key);
  const bool integer_elems = v.type == GgufValueType::ARRAY && v.elems && v.elem_type != GgufValueType::BOOL &&
                             v.elem_type != GgufValueType::F32 && v.elem_type != GgufValueType::F64;
  if (!integer_elems) fail_key(key, "is not an array of integers");
  std::vector<int32_t> out(static_cast<size_t>(v.count));
  for (uint64_t i = 0; i < v.count; ++i) {
    const uint64_t raw = v.integer_element(i);
    const bool fits = is_signed(v.elem_type)
                          ? (static_cast<int64_t>(raw) >= std::numeric_limits<int32_t>::min() &&
                             static_cast<int64_t>(raw) <= std::numeric_limits<int32_t>::max())
                          : raw <= uint64_t(std::numeric_limits<int32_t>::max());
    if (!fits) fail_key(key, "element " + std::to_string(i) + " does not fit i32");
    out[i] = static_cast<int32_t>(static_cast<int64_t>(raw));
  }
  return out;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) throw InputError(path_ + ": no tensor " + quote(name));
  return tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& info) const {
  return info.nbytes == 0 ? nullptr : file_->data() + data_offset_ + info.offset;
}

}  // namespace sq
