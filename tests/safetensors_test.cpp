// Tests for formats/safetensors.h: FP16/BF16 conversions, reader validation, writer layout.
#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/process.h"

namespace {

using sq::test::ScratchDir;
using sq::test::expect_error;


/// A safetensors file from a raw header string and raw data bytes.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Reference encodings. F16: numpy 2.x, `np.array(VALUES, dtype=np.float32).astype(np.float16).view(np.uint16)`
// (numpy's npy_floatbits_to_halfbits rounds to nearest even). BF16: a hand-written Python
// reference that, for the float32 x, takes the two neighbouring bfloat16 values (bits >> 16 and
// (bits >> 16) + 1), compares the exact distances with fractions.Fraction and breaks ties to the
// even one (NaN -> quiet NaN (bits >> 16) | 0x40). Script: see the comment in the test.
const float kF16Values[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.1f, 3.14159265f, 65504.0f, 65519.0f,
                            65520.0f,                       // halfway 65504 / 2^16: ties to even = inf
                            1e-8f,                          // below half of the smallest subnormal -> 0
                            0x1p-24f,                       // smallest subnormal
                            0x1p-25f,                       // tie between 0 and 2^-24 -> 0 (even)
                            0x3p-25f,                       // tie between 1 and 2 units -> 2 (even)
                            0x1p-14f,                       // smallest normal
                            0x1p-14f - 0x1p-25f,            // tie 0x03FF / 0x0400 -> 0x0400 (even)
                            5.0e-6f,                        // a subnormal
                            1.0f + 0x1p-11f,                // tie -> 1.0
                            1.0f + 0x3p-11f,                // tie -> 1 + 2^-9
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
const uint16_t kF16Bits[] = {0x0000, 0x8000, 0x3C00, 0xC100, 0x2E66, 0x4248, 0x7BFF, 0x7BFF, 0x7C00, 0x0000, 0x0001,
                             0x0000, 0x0002, 0x0400, 0x0400, 0x0054, 0x3C00, 0x3C02, 0x7C00, 0xFC00, 0x7E00};
// numpy: .astype(np.float16).astype(np.float32) of the above.
const float kF16Decoded[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.0999755859375f, 3.140625f, 65504.0f, 65504.0f,
                             std::numeric_limits<float>::infinity(), 0.0f, 5.960464477539063e-08f, 0.0f,
                             1.1920928955078125e-07f, 6.103515625e-05f, 6.103515625e-05f, 5.0067901611328125e-06f,
                             1.0f, 1.001953125f, std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};

// float32 bit patterns: 0, -0, 1, -2.5, 0.1, pi, 1+2^-8 (tie -> 1), 1+3*2^-8 (tie -> 1+2^-6),
// 1+2^-8+2^-20 (just above the tie), FLT_MAX (rounds past the bf16 max to inf), bf16 max exactly,
// the float subnormal 1e-40, inf, -inf, NaN.
const uint32_t kBf16Inputs[] = {0x00000000, 0x80000000, 0x3F800000, 0xC0200000, 0x3DCCCCCD,
                                0x40490FDB, 0x3F808000, 0x3F818000, 0x3F808008, 0x7F7FFFFF,
                                0x7F7F0000, 0x000116C2, 0x7F800000, 0xFF800000, 0x7FC00000};
const uint16_t kBf16Bits[] = {0x0000, 0x8000, 0x3F80, 0xC020, 0x3DCD, 0x4049, 0x3F80, 0x3F82,
                              0x3F81, 0x7F80, 0x7F7F, 0x0001, 0x7F80, 0xFF80, 0x7FC0};

TEST(SafetensorsConvert, HalfEncodingMatchesNumpy) {
  static_assert(std::size(kF16Values) == std::size(kF16Bits) && std::size(kF16Values) == std::size(kF16Decoded));
  for (size_t i = 0; i < std::size(kF16Values); ++i) {
    EXPECT_EQ(sq::float_to_half(kF16Values[i]), kF16Bits[i]) << "value " << kF16Values[i] << " (index " << i << ")";
    const float back = sq::half_to_float(kF16Bits[i]);
    if (std::isnan(kF16Decoded[i]))
      EXPECT_TRUE(std::isnan(back));
    else
      EXPECT_EQ(bits_of(back), bits_of(kF16Decoded[i])) << "bits 0x" << std::hex << kF16Bits[i];
  }
  // Negative values mirror positive ones.
  EXPECT_EQ(sq::float_to_half(-0x1p-24f), 0x8001);
  EXPECT_EQ(sq::float_to_half(-65520.0f), 0xFC00);
  EXPECT_EQ(sq::half_to_float(0x03FF), 0x3FFp-24f);  // largest subnormal
  EXPECT_EQ(sq::half_to_float(0x7BFF), 65504.0f);
}

TEST(SafetensorsConvert, Bf16EncodingMatchesReference) {
  static_assert(std::size(kBf16Inputs) == std::size(kBf16Bits));
  for (size_t i = 0; i < std::size(kBf16Inputs); ++i)
    EXPECT_EQ(sq::float_to_bf16(from_bits(kBf16Inputs[i])), kBf16Bits[i]) << "input 0x" << std::hex << kBf16Inputs[i];
  EXPECT_EQ(sq::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(sq::bf16_to_float(0x0001), from_bits(0x00010000));  // float subnormal
  EXPECT_TRUE(std::isinf(sq::bf16_to_float(0xFF80)) && sq::bf16_to_float(0xFF80) < 0);
  EXPECT_TRUE(std::isnan(sq::bf16_to_float(0x7FC0)));
  EXPECT_EQ(sq::float_to_bf16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000, 0x8000);  // sign kept
}

TEST(SafetensorsConvert, EveryHalfAndBf16PatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t h = uint16_t(b);
    const float f = sq::half_to_float(h);
    const bool half_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    if (half_nan) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(sq::half_to_float(sq::float_to_half(f))));
    } else {
      ASSERT_EQ(sq::float_to_half(f), h) << "half 0x" << std::hex << b;
    }
    const float g = sq::bf16_to_float(h);
    if (std::isnan(g))
      EXPECT_TRUE(std::isnan(sq::bf16_to_float(sq::float_to_bf16(g))));
    else
      ASSERT_EQ(sq::float_to_bf16(g), h) << "bf16 0x" << std::hex << b;
  }
  // Every half subnormal decodes to k * 2^-24 exactly.
  for (uint16_t k = 0; k < 0x400; ++k) ASSERT_EQ(sq::half_to_float(k), float(k) * 0x1p-24f);
}

TEST(SafetensorsRoundTrip, F32F16Bf16KnownValues) {
  ScratchDir dir;
  const std::string path = dir.file("t.safetensors");
  const std::vector<float> f16_values(std::begin(kF16Values), std::end(kF16Values));
  std::vector<float> bf16_values;
  for (uint32_t b : kBf16Inputs) bf16_values.push_back(from_bits(b));
  std::vector<float> f32_values = {1.5f, -0.0f, 1e-40f, 3.4028235e38f, std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN()};
  sq::write_safetensors(path,
                        {{"a.f32", "F32", sq::Tensor::from_vector({2, 3}, f32_values)},
                         {"b.f16", "F16", sq::Tensor::from_vector({int64_t(f16_values.size())}, f16_values)},
                         {"c.bf16", "BF16", sq::Tensor::from_vector({3, 5}, bf16_values)}},
                        {{"format", "pt"}, {"note", "sqkit test"}});
  // Written atomically: no temporary left beside it.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1);

  sq::SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.f32", "b.f16", "c.bf16"}));
  EXPECT_EQ(f.dtype("b.f16"), "F16");
  EXPECT_EQ(f.shape("c.bf16"), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "sqkit test");
  EXPECT_EQ(f.data_start() % 8, 0u);

  sq::Tensor a = f.load_f32("a.f32");
  EXPECT_FALSE(a.owned()) << "aligned F32 must be a zero-copy view";
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
  for (size_t i = 0; i < f32_values.size(); ++i) EXPECT_EQ(bits_of(a.data()[i]), bits_of(f32_values[i]));

  sq::Tensor b = f.load_f32("b.f16");
  EXPECT_TRUE(b.owned());
  for (size_t i = 0; i < f16_values.size(); ++i) {
    if (std::isnan(kF16Decoded[i]))
      EXPECT_TRUE(std::isnan(b.data()[i]));
    else
      EXPECT_EQ(bits_of(b.data()[i]), bits_of(kF16Decoded[i])) << i;
  }
  sq::Tensor c = f.load_f32("c.bf16");
  for (size_t i = 0; i < bf16_values.size(); ++i) {
    if (std::isnan(bf16_values[i]))
      EXPECT_TRUE(std::isnan(c.data()[i]));
    else
      EXPECT_EQ(bits_of(c.data()[i]), uint32_t(kBf16Bits[i]) << 16) << i;
  }
  // The view outlives the SafetensorsFile object (keepalive holds the mapping).
  sq::Tensor survivor;
  {
    sq::SafetensorsFile g(path);
    survivor = g.load_f32("a.f32");
  }
  EXPECT_EQ(survivor.data()[0], 1.5f);
}

TEST(SafetensorsRoundTrip, LargeTensorsUseTheThreadedPathAndChunkedWriter) {
  // > 2^20 elements: the writer converts in several chunks and the reader widens on two threads.
  ScratchDir dir;
  const int64_t n = (int64_t(1) << 21) + 3;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i % 4089) * 0.125f - 255.0f;  // k/8 in [-255, 256]: exact in F16
  const sq::Tensor t = sq::Tensor::from_vector({n}, v);
  sq::write_safetensors(dir.file("big.safetensors"), {{"h", "F16", t}, {"b", "BF16", t}});
  sq::SafetensorsFile f(dir.file("big.safetensors"));
  auto keep = std::make_shared<int>(7);
  const sq::Tensor h = f.load_f32("h", keep), b = f.load_f32("b");
  ASSERT_EQ(h.numel(), n);
  EXPECT_EQ(b.data()[1], -255.0f);  // -254.875 = 0xC37EE000 rounds (up in magnitude) to BF16 0xC37F = -255
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h.data()[i], v[size_t(i)]) << i;
    ASSERT_EQ(b.data()[i], sq::bf16_to_float(sq::float_to_bf16(v[size_t(i)]))) << i;
  }
}

TEST(SafetensorsRoundTrip, WriterByteLayout) {
  ScratchDir dir;
  const std::string path = dir.file("layout.safetensors");
  sq::write_safetensors(path, {{"h", "F16", sq::Tensor::from_vector({2}, {1.0f, -2.5f})},
                               {"b", "BF16", sq::Tensor::from_vector({1}, {3.14159265f})},
                               {"f", "F32", sq::Tensor::from_vector({1}, {0.5f})}});
  const std::string bytes = sq::test::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ((8 + n) % 8, 0u) << "header must be space-padded to a multiple of 8";
  ASSERT_EQ(bytes.size(), 8 + n + 4 + 2 + 4);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << "padding must be spaces after the JSON";
  auto j = nlohmann::json::parse(header);
  EXPECT_FALSE(j.contains("__metadata__"));
  EXPECT_EQ(j["h"]["data_offsets"], nlohmann::json::array({0, 4}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({4, 6}));
  EXPECT_EQ(j["f"]["data_offsets"], nlohmann::json::array({6, 10}));
  EXPECT_EQ(j["f"]["dtype"], "F32");
  // Data section, little-endian: F16 1.0 = 0x3C00, -2.5 = 0xC100 (numpy); BF16 pi = 0x4049; F32 0.5.
  const std::string data = bytes.substr(8 + n);
  const std::string expected("\x00\x3C\x00\xC1\x49\x40\x00\x00\x00\x3F", 10);
  EXPECT_EQ(data, expected);
}

TEST(SafetensorsReader, UnalignedF32IsCopiedAndScalarsWork) {
  ScratchDir dir;
  // Header padded to 117 bytes: the data section starts at offset 125, not 4-byte aligned, so F32
  // must be copied.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})";
  ASSERT_LT(header.size(), 117u);
  header += std::string(117 - header.size(), ' ');
  sq::test::write_file(dir.file("u.safetensors"), st_bytes(header, f32_bytes({1.25f, -7.0f, 42.0f})));
  sq::SafetensorsFile f(dir.file("u.safetensors"));
  sq::Tensor x = f.load_f32("x");
  EXPECT_TRUE(x.owned());
  EXPECT_EQ(x.data()[0], 1.25f);
  EXPECT_EQ(x.data()[1], -7.0f);
  sq::Tensor s = f.load_f32("s");
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.data()[0], 42.0f);
  EXPECT_TRUE(f.metadata().empty());
}

// ---- bad input -----------------------------------------------------------------------------------

class SafetensorsBadInput : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    const std::string p = dir_.file("bad.safetensors");
    sq::test::write_file(p, bytes);
    return p;
  }
  ScratchDir dir_;
};

TEST_F(SafetensorsBadInput, MissingFile) {
  const std::string p = dir_.file("nope.safetensors");
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "cannot open"});
}

TEST_F(SafetensorsBadInput, ShorterThanEightBytes) {
  const std::string p = write("abc");
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "3 bytes", "8-byte header length"});
}

TEST_F(SafetensorsBadInput, HeaderLengthPastEndOfFile) {
  std::string bytes = st_bytes("{}", "");
  const uint64_t n = 1000;
  std::memcpy(bytes.data(), &n, 8);
  const std::string p = write(bytes);
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "header length 1000", "past the end of the file"});
}

TEST_F(SafetensorsBadInput, AbsurdHeaderLength) {
  std::string bytes = st_bytes("{}", "");
  const uint64_t n = ~uint64_t(0);
  std::memcpy(bytes.data(), &n, 8);
  const std::string p = write(bytes);
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "header length", "past the end"});
}

TEST_F(SafetensorsBadInput, MalformedJson) {
  const std::string p = write(st_bytes(R"({"x":{"dtype":"F32",)", ""));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "not valid JSON"});
}

TEST_F(SafetensorsBadInput, JsonNotAnObject) {
  const std::string p = write(st_bytes("[1, 2]", ""));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "must be a JSON object", "array"});
}

TEST_F(SafetensorsBadInput, EntryMissingFields) {
  std::string p = write(st_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "\"dtype\""});
  p = write(st_bytes(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "\"shape\""});
  p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "\"data_offsets\""});
  p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "\"data_offsets\""});
  p = write(st_bytes(R"({"w":7})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "JSON object"});
}

TEST_F(SafetensorsBadInput, NegativeDimension) {
  const std::string p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})", f32_bytes({1, 2, 3, 4})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "non-negative integers", "[-1,4]"});
}

TEST_F(SafetensorsBadInput, TruncatedData) {
  // Header promises 4 floats, the file holds 2.
  const std::string p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32_bytes({1, 2})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); },
                               {p, "'w'", "[0, 16]", "past the end of the data section (8 bytes"});
}

TEST_F(SafetensorsBadInput, OffsetsOutOfRangeAndReversed) {
  std::string p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "past the end of the data section"});
  p = write(st_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", f32_bytes({1})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "begin > end"});
}

TEST_F(SafetensorsBadInput, OverlappingTensors) {
  const std::string p = write(st_bytes(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      f32_bytes({1, 2, 3})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsBadInput, ByteCountMismatch) {
  // 3 F16 values need 6 bytes, the offsets give 8.
  const std::string p = write(st_bytes(R"({"w":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", f32_bytes({1, 2})));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "span 8 bytes, expected 6", "F16 [3]"});
}

TEST_F(SafetensorsBadInput, ElementCountOverflow) {
  const std::string p = write(st_bytes(
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})", ""));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "overflowing"});
}

TEST_F(SafetensorsBadInput, MetadataMustBeStrings) {
  const std::string p = write(st_bytes(R"({"__metadata__":{"format":1}})", ""));
  expect_error<sq::InputError>([&] { sq::SafetensorsFile f(p); }, {p, "__metadata__", "'format'", "string"});
}

TEST_F(SafetensorsBadInput, UnknownDtypeIsUnsupported) {
  const std::string p = write(st_bytes(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", "x"));
  expect_error<sq::UnsupportedError>([&] { sq::SafetensorsFile f(p); }, {p, "'w'", "unknown dtype 'Q4'"});
}

TEST_F(SafetensorsBadInput, LoadingIntegerOrF64IsUnsupported) {
  const std::string data = f32_bytes({1, 2, 3, 4, 5, 6});
  const std::string p = write(st_bytes(
      R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"d":{"dtype":"F64","shape":[1],"data_offsets":[16,24]}})",
      data));
  sq::SafetensorsFile f(p);  // listing them is fine
  EXPECT_EQ(f.dtype("ids"), "I64");
  ASSERT_NE(f.raw_data("ids"), nullptr);
  expect_error<sq::UnsupportedError>([&] { f.load_f32("ids"); }, {p, "'ids'", "I64", "F32, F16, BF16"});
  expect_error<sq::UnsupportedError>([&] { f.load_f32("d"); }, {p, "'d'", "F64"});
  expect_error<sq::InputError>([&] { f.load_f32("nope"); }, {p, "'nope'"});
}

TEST(SafetensorsWriter, FailuresLeaveNoFile) {
  ScratchDir dir;
  const std::string bad_dir = dir.file("missing/sub/x.safetensors");
  expect_error<sq::OutputError>(
      [&] { sq::write_safetensors(bad_dir, {{"w", "F32", sq::Tensor::from_vector({1}, {1})}}); }, {bad_dir});
  const std::string p = dir.file("x.safetensors");
  expect_error<sq::UsageError>([&] { sq::write_safetensors(p, {{"w", "I8", sq::Tensor::from_vector({1}, {1})}}); },
                               {p, "'w'", "I8"});
  expect_error<sq::UsageError>([&] {
    sq::write_safetensors(p, {{"w", "F32", sq::Tensor::from_vector({1}, {1})}, {"w", "F16", sq::Tensor::from_vector({1}, {1})}});
  }, {p, "'w'"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
