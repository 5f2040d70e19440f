// GGUF reader (formats/gguf_file.h): every metadata value type, typed getters, tensor infos, and
// the validation of hostile files (each rejected with an InputError naming the file and the field).
// Files are built in memory with tests/support/gguf_writer.h and opened through
// MappedFile::from_bytes, the path a real file takes after mmap.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf_file.h"
#include "formats/mapped_file.h"
#include "tests/support/expect_error.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/support/gguf_writer.h"

namespace {

using sq::GgufFile;
using sq::GgufValueType;
using sq::InputError;
using sq::test::expect_error;
using W = sq::test::GgufWriter;

constexpr const char* kName = "test-input.gguf";

GgufFile open_bytes(const std::string& b) {
  return GgufFile(sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(b.data()), b.size(), kName));
}

/// Expects opening `b` to throw an InputError whose message names the file and contains `parts`.
void expect_bad(const std::string& b, std::vector<std::string> parts) {
  parts.insert(parts.begin(), kName);
  expect_error<InputError>([&] { open_bytes(b); }, parts);
}

/// A GGUF v3 header alone (no padding after it).
std::string header(uint64_t n_tensors, uint64_t n_kv) {
  return W::u32(0x46554747u) + W::u32(3) + W::u64(n_tensors) + W::u64(n_kv);
}

/// A small valid file: two F32 tensors (2x3 and 4), a few keys.
W small_file() {
  W w;
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 2);
  std::string a, b;
  for (int i = 0; i < 6; ++i) a += W::f32(float(i) + 0.5f);
  for (int i = 0; i < 4; ++i) b += W::f32(-float(i));
  w.tensor("a.weight", {3, 2}, 0, a).tensor("b.weight", {4}, 0, b);
  return w;
}

TEST(GgufFile, ReadsEveryValueType) {
  W w;
  w.version = 2;
  w.kv("k.u8", W::U8, W::u8(200))
      .kv("k.i8", W::I8, W::i8(-100))
      .kv("k.u16", W::U16, W::u16(60000))
      .kv("k.i16", W::I16, W::i16(-30000))
      .kv("k.u32", W::U32, W::u32(4000000000u))
      .kv("k.i32", W::I32, W::i32(-2000000000))
      .kv("k.f32", W::F32, W::f32(0.25f))
      .kv("k.bool", W::BOOL, W::u8(1))
      .kv("k.string", W::STRING, W::str("héllo"))
      .kv("k.u64", W::U64, W::u64(0xfedcba9876543210ull))
      .kv("k.i64", W::I64, W::i64(-(int64_t(1) << 40)))
      .kv("k.f64", W::F64, W::f64(-1.0 / 3.0))
      .kv("k.arr_i16", W::ARRAY, W::array(W::I16, 3, W::i16(-1) + W::i16(2) + W::i16(-32768)))
      .kv("k.arr_f32", W::ARRAY, W::array(W::F32, 2, W::f32(1.5f) + W::f32(-2.0f)))
      .kv("k.arr_bool", W::ARRAY, W::array(W::BOOL, 2, W::u8(0) + W::u8(1)))
      .kv_strings("k.arr_str", {"a", "", "ccc"})
      .kv("k.nested", W::ARRAY,
          W::array(W::ARRAY, 2, W::array(W::U8, 2, W::u8(7) + W::u8(8)) + W::array(W::STRING, 1, W::str("x"))));
  const GgufFile f = open_bytes(w.bytes());
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.metadata().size(), 17u);
  EXPECT_EQ(f.metadata()[0].first, "k.u8");  // file order kept
  EXPECT_EQ(f.get_u32("k.u8"), 200u);
  EXPECT_EQ(f.get_i32("k.i8"), -100);
  EXPECT_EQ(f.get_u32("k.u16"), 60000u);
  EXPECT_EQ(f.get_i32("k.i16"), -30000);
  EXPECT_EQ(f.get_u32("k.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("k.u32"), 4000000000ll);
  EXPECT_EQ(f.get_i32("k.i32"), -2000000000);
  EXPECT_EQ(f.get_f32("k.f32"), 0.25f);
  EXPECT_TRUE(f.get_bool("k.bool"));
  EXPECT_EQ(f.get_string("k.string"), "héllo");
  EXPECT_EQ(f.get_u64("k.u64"), 0xfedcba9876543210ull);
  EXPECT_EQ(f.get_i64("k.i64"), -(int64_t(1) << 40));
  EXPECT_EQ(f.get_f64("k.f64"), -1.0 / 3.0);
  EXPECT_EQ(f.get_f32("k.f64"), static_cast<float>(-1.0 / 3.0));
  EXPECT_EQ(f.get_i32_array("k.arr_i16"), (std::vector<int32_t>{-1, 2, -32768}));
  EXPECT_EQ(f.get_f32_array("k.arr_f32"), (std::vector<float>{1.5f, -2.0f}));
  const sq::GgufValue& bools = f.value("k.arr_bool");
  EXPECT_EQ(bools.elem_type, GgufValueType::BOOL);
  EXPECT_EQ(bools.integer_element(0), 0u);
  EXPECT_EQ(bools.integer_element(1), 1u);
  EXPECT_EQ(f.get_string_array("k.arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_array_size("k.arr_str"), 3u);
  const sq::GgufValue& nested = f.value("k.nested");
  ASSERT_EQ(nested.elem_type, GgufValueType::ARRAY);
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0].elem_type, GgufValueType::U8);
  EXPECT_EQ(nested.items[0].integer_element(1), 8u);
  ASSERT_EQ(nested.items[1].strings.size(), 1u);
  EXPECT_EQ(nested.items[1].strings[0], "x");
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufFile, TypedGettersNameTheKeyOnMissingWrongTypeOrRange) {
  W w;
  w.kv_string("s", "text").kv("neg", W::I32, W::i32(-1)).kv_u64("big", uint64_t(1) << 40).kv_f32("f", 1.0f);
  w.kv("u8", W::U8, W::u8(5)).kv_bool("b", true);
  const GgufFile f = open_bytes(w.bytes());
  EXPECT_EQ(f.get_u32("u8"), 5u);  // any integer type that fits
  EXPECT_EQ(f.get_i64("big"), int64_t(1) << 40);
  expect_error<InputError>([&] { f.get_u32("llama.block_count"); }, {kName, "'llama.block_count'", "missing"});
  expect_error<InputError>([&] { f.get_u32("s"); }, {kName, "'s'", "string", "expected an integer"});
  expect_error<InputError>([&] { f.get_u32("neg"); }, {kName, "'neg'", "-1", "out of range"});
  expect_error<InputError>([&] { f.get_u32("big"); }, {kName, "'big'", "1099511627776", "out of range"});
  expect_error<InputError>([&] { f.get_i32("big"); }, {kName, "'big'", "out of range"});
  expect_error<InputError>([&] { f.get_u32("f"); }, {kName, "'f'", "f32"});
  expect_error<InputError>([&] { f.get_u32("b"); }, {kName, "'b'", "bool"});
  expect_error<InputError>([&] { f.get_f32("u8"); }, {kName, "'u8'", "expected f32"});
  expect_error<InputError>([&] { f.get_string("u8"); }, {kName, "'u8'", "expected string"});
  expect_error<InputError>([&] { f.get_bool("s"); }, {kName, "'s'", "expected bool"});
  expect_error<InputError>([&] { f.get_string_array("s"); }, {kName, "'s'", "array of strings"});
  expect_error<InputError>([&] { f.get_array_size("f"); }, {kName, "'f'", "expected array"});
  expect_error<InputError>([&] { f.tensor("nope"); }, {kName, "'nope'"});
}

TEST(GgufFile, TensorInfosOffsetsAndAlignment) {
  W w = small_file();
  const std::string b = w.bytes();
  const GgufFile f = open_bytes(b);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  ASSERT_EQ(f.tensors().size(), 2u);
  const sq::GgufTensorInfo& a = f.tensor("a.weight");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.numel, 6);
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(a.nbytes, 24u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(f.tensor("b.weight").offset, 32u);  // 24 bytes padded to 32
  float v;
  std::memcpy(&v, f.tensor_data(a) + 4 * 5, 4);
  EXPECT_EQ(v, 5.5f);
  std::memcpy(&v, f.tensor_data(f.tensor("b.weight")) + 4 * 3, 4);
  EXPECT_EQ(v, -3.0f);

  // general.alignment = 64 moves the data section and the second offset.
  W w64;
  w64.alignment = 64;
  w64.kv_u32("general.alignment", 64).tensor("a", {3, 2}, 0, std::string(24, '\0')).tensor("b", {4}, 0, std::string(16, '\0'));
  const GgufFile f64 = open_bytes(w64.bytes());
  EXPECT_EQ(f64.alignment(), 64u);
  EXPECT_EQ(f64.data_offset() % 64, 0u);
  EXPECT_EQ(f64.tensor("b").offset, 64u);
}

TEST(GgufFile, RejectsEveryTruncation) {
  const std::string b = small_file().bytes();
  open_bytes(b);  // the whole file is valid; the writer ends it right after b.weight's data
  for (size_t n = 0; n < b.size(); ++n) {
    try {
      open_bytes(b.substr(0, n));
      ADD_FAILURE() << "accepted a file cut to " << n << " of " << b.size() << " bytes";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(kName), std::string::npos) << e.what();
    }
  }
  expect_bad(b.substr(0, 10), {"too short", "24 bytes"});
  // Cut inside the first tensor name's length (the header and 2 key/values take 102 bytes) and
  // inside the name itself.
  expect_bad(b.substr(0, 106), {"tensor info #0 name", "needs 8 bytes at offset 102", "truncated"});
  expect_bad(b.substr(0, 112), {"tensor info #0 name", "string length 8 at offset 102", "past the end"});
}

TEST(GgufFile, RejectsWrongMagicAndVersion) {
  W w = small_file();
  w.magic = 0x46554746u;
  expect_bad(w.bytes(), {"not a GGUF file"});
  w = small_file();
  w.version = 1;
  expect_bad(w.bytes(), {"version 1 (llama.cpp's format before August 2023", "versions 2 and 3 are read"});
  w.version = 4;
  expect_bad(w.bytes(), {"version 4", "expected 2 or 3"});
  w.version = 0x03000000u;  // a big-endian v3 file
  expect_bad(w.bytes(), {"big-endian"});
}

TEST(GgufFile, RejectsCountsAndLengthsBeyondTheFile) {
  W w = small_file();
  w.tensor_count_override = uint64_t(1) << 60;
  expect_bad(w.bytes(), {"tensor_count 1152921504606846976", "impossible"});
  w = small_file();
  w.kv_count_override = 0xffffffffffffffffull;
  expect_bad(w.bytes(), {"metadata_kv_count", "impossible"});
  w = small_file();
  w.tensor_count_override = 3;  // plausible count, but the third info runs into the data
  expect_bad(w.bytes(), {"tensor"});
  // A string value whose length runs past the end of the file.
  W s;
  s.kv("general.name", W::STRING, W::u64(1000) + "abc");
  expect_bad(s.bytes(), {"'general.name'", "string length 1000", "past the end"});
  // A key whose length runs past the end.
  std::string kb = header(0, 1) + W::u64(uint64_t(1) << 62) + "key" + std::string(20, 'x');
  expect_bad(kb, {"key", "string length 4611686018427387904"});
  // Array count x element size beyond the remaining bytes (checked before allocating).
  W a;
  a.kv("arr", W::ARRAY, W::array(W::U32, uint64_t(1) << 61, W::u32(1)));
  expect_bad(a.bytes(), {"'arr'", "array of 2305843009213693952 u32", "bytes are left"});
  W as;
  as.kv("arr", W::ARRAY, W::array(W::STRING, 1000000, W::str("x")));
  expect_bad(as.bytes(), {"'arr'", "1000000 string"});
  // A tensor name longer than the file.
  std::string tb = header(1, 0) + W::u64(999) + std::string(40, 'n');
  expect_bad(tb, {"tensor info #0 name", "string length 999"});
}

TEST(GgufFile, RejectsBadValuesAndKeys) {
  W w;
  w.kv("x", 13, W::u8(0));
  expect_bad(w.bytes(), {"'x'", "unknown value type 13"});
  w = W();
  w.kv("x", W::ARRAY, W::array(99, 0, ""));
  expect_bad(w.bytes(), {"'x'", "unknown array element type 99"});
  w = W();
  w.kv("x", W::BOOL, W::u8(2));
  expect_bad(w.bytes(), {"'x'", "bool value 2"});
  w = W();
  w.kv("x", W::ARRAY, W::array(W::BOOL, 3, W::u8(1) + W::u8(0) + W::u8(7)));
  expect_bad(w.bytes(), {"'x'", "bool array element 2"});
  w = W();
  w.kv_u32("dup", 1).kv_u32("dup", 2);
  expect_bad(w.bytes(), {"'dup'", "duplicated"});
  w = W();
  w.kv_u32("", 1);
  expect_bad(w.bytes(), {"empty key"});
  // Arrays nested 9 deep (the limit is 8).
  std::string nested = W::array(W::U8, 0, "");
  for (int i = 0; i < 9; ++i) nested = W::array(W::ARRAY, 1, nested);
  w = W();
  w.kv("deep", W::ARRAY, nested);
  expect_bad(w.bytes(), {"'deep'", "nested more than 8"});
  // More than 2^20 arrays inside arrays (12 bytes of file each, a GgufValue each in memory).
  const uint64_t many = (uint64_t(1) << 20) + 1;
  std::string empties;
  for (uint64_t i = 0; i < many; ++i) empties += W::array(W::U8, 0, "");
  w = W();
  w.kv("many", W::ARRAY, W::array(W::ARRAY, many, empties));
  expect_bad(w.bytes(), {"'many'", "more than 1048576 arrays nested in arrays"});
  // general.alignment: not a power of two, zero, wrong type.
  for (uint32_t al : {0u, 3u, 48u}) {
    w = small_file();
    w.kv_u32("general.alignment", al);
    expect_bad(w.bytes(), {"'general.alignment'", "power of two"});
  }
  w = small_file();
  w.kv_string("general.alignment", "32");
  expect_bad(w.bytes(), {"'general.alignment'", "string"});
}

TEST(GgufFile, RejectsBadTensorInfos) {
  // Element count overflowing int64: 2^32 x 2^32.
  W w;
  w.tensor("huge", {uint64_t(1) << 32, uint64_t(1) << 32}, 0, "");
  expect_bad(w.bytes(), {"'huge'", "overflows int64"});
  w = W();
  w.tensor("neg", {uint64_t(1) << 63}, 0, "");
  expect_bad(w.bytes(), {"'neg'", "exceeds INT64_MAX"});
  w = W();
  w.tensor("t", {32}, 77, std::string(64, '\0'));
  EXPECT_NE(expect_error<sq::UnsupportedError>([&] { open_bytes(w.bytes()); }, {kName, "'t'", "unknown ggml type id 77"}), "");
  w = W();
  w.tensor("t", {32}, 4, std::string(64, '\0'));  // Q4_2: removed from ggml
  expect_bad(w.bytes(), {"'t'", "unknown ggml type id 4"});
  w = W();
  w.tensor("t", {33}, 8, std::string(68, '\0'));  // Q8_0 rows must be multiples of 32
  expect_bad(w.bytes(), {"'t'", "not a whole number of Q8_0 blocks"});
  w = W();
  w.tensor("t", {}, 0, "");
  expect_bad(w.bytes(), {"'t'", "n_dims is 0"});
  w = W();
  w.tensor("t", {1, 1, 1, 1, 1}, 0, "1234");
  expect_bad(w.bytes(), {"'t'", "n_dims is 5"});
  w = W();
  w.tensor(std::string(65, 'n'), {1}, 0, "1234");
  expect_bad(w.bytes(), {"65 bytes", "at most 64"});
  w = W();
  w.tensor("same", {1}, 0, "1234").tensor("same", {1}, 0, "5678");
  expect_bad(w.bytes(), {"'same'", "duplicated"});
}

TEST(GgufFile, RejectsTensorDataOutsideTheFileMisalignedOrOverlapping) {
  W w = small_file();
  w.tensor("c", {4}, 0, "", uint64_t(1) << 20);  // offset far past the end
  expect_bad(w.bytes(), {"'c'", "lies outside the file"});
  w = W();
  w.tensor("c", {4}, 0, "", 0xffffffffffffffe0ull);  // offset + size overflows u64
  expect_bad(w.bytes(), {"'c'", "lies outside the file"});
  w = W();
  w.tensor("c", {4}, 0, std::string(16, '\0'), 8);  // not a multiple of 32
  expect_bad(w.bytes(), {"'c'", "offset 8", "multiple of the alignment 32"});
  w = W();
  w.tensor("c", {16}, 0, std::string(64, '\0')).tensor("d", {4}, 0, std::string(16, '\0'), 32);
  expect_bad(w.bytes(), {"'c'", "'d'", "overlap"});
  // The last tensor's data cut short by one byte.
  std::string b = small_file().bytes();
  b.resize(b.size() - 1);
  expect_bad(b, {"'b.weight'", "lies outside the file"});
}

}  // namespace

namespace {

TEST(GgufFile, FuzzSeedsAreValidFiles) {
  // The gguf fuzz target's generated seeds (tests/fuzz/fuzz_targets.cpp) must be accepted, so that
  // fuzzing starts from files that reach the tensor and dequantization code.
  const sq::fuzz::FuzzTarget* target = nullptr;
  for (const auto& t : sq::fuzz::fuzz_targets())
    if (std::string(t.name) == "gguf") target = &t;
  ASSERT_NE(target, nullptr);
  const auto seeds = target->generated_seeds();
  ASSERT_EQ(seeds.size(), 4u);
  const size_t tensors[4] = {3, 11, 1, 0};
  for (size_t i = 0; i < seeds.size(); ++i) EXPECT_EQ(open_bytes(seeds[i]).tensors().size(), tensors[i]) << "seed " << i;
  EXPECT_EQ(open_bytes(seeds[1]).alignment(), 64u);
  EXPECT_EQ(open_bytes(seeds[2]).version(), 2u);
}

}  // namespace
