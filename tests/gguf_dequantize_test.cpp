// FP32 dequantization of ggml blocks (formats/gguf_dequantize.h), each type against a block built
// byte by byte here and values computed here from the layout's definition (ggml-common.h /
// ggml-quants.c, as summarised in the header). All scales are powers of two and all quants small
// integers, so every expected value is exact in FP32: the comparisons are exact (EXPECT_EQ).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf_dequantize.h"
#include "formats/mapped_file.h"
#include <nlohmann/json.hpp>
#include "tests/support/expect_error.h"
#include "tests/support/gguf_writer.h"

namespace {

using sq::GgmlType;
using Bytes = std::vector<uint8_t>;

// binary16 bit patterns of exact values
constexpr uint16_t kH1 = 0x3C00, kH2 = 0x4000, kHalf = 0x3800, kQuarter = 0x3400, kEighth = 0x3000, kHm1 = 0xBC00;

void put16(Bytes& b, size_t at, uint16_t v) {
  b[at] = uint8_t(v & 0xff);
  b[at + 1] = uint8_t(v >> 8);
}

std::vector<float> deq(GgmlType t, const Bytes& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  sq::dequantize_row(t, b.data(), y.data(), n);
  return y;
}

void expect_all(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

TEST(GgufDequantize, PlainTypes) {
  // F32: copied.
  const float f[3] = {1.5f, -0.0f, 3e38f};
  Bytes b(12);
  std::memcpy(b.data(), f, 12);
  expect_all(deq(GgmlType::F32, b, 3), {1.5f, -0.0f, 3e38f});
  // F16: 1, -2, smallest subnormal 2^-24, largest finite 65504, +inf.
  Bytes h(10);
  const uint16_t hv[5] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00};
  for (int i = 0; i < 5; ++i) put16(h, 2 * i, hv[i]);
  expect_all(deq(GgmlType::F16, h, 5), {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, std::numeric_limits<float>::infinity()});
  // BF16: the high half of an f32: 1, -5, 2^-133 (f32 subnormal), -inf.
  Bytes bf(8);
  const uint16_t bv[4] = {0x3F80, 0xC0A0, 0x0001, 0xFF80};
  for (int i = 0; i < 4; ++i) put16(bf, 2 * i, bv[i]);
  expect_all(deq(GgmlType::BF16, bf, 4), {1.0f, -5.0f, std::ldexp(1.0f, -133), -std::numeric_limits<float>::infinity()});
}

TEST(GgufDequantize, Q8_0) {
  // 34 bytes: f16 d, i8 qs[32]; y[i] = qs[i] * d. d = 0.5, qs[i] = 8i - 128 -> y[i] = 4i - 64.
  Bytes b(34);
  put16(b, 0, kHalf);
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(8 * i - 128));
  std::vector<float> want(32);
  for (int i = 0; i < 32; ++i) want[i] = float(4 * i - 64);
  const auto y = deq(GgmlType::Q8_0, b, 32);
  expect_all(y, want);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[31], 60.0f);
}

/// qs[i] = i | (15 - i) << 4: element i has low nibble i, element 16 + i has 15 - i.
void fill_nibbles(Bytes& b, size_t at) {
  for (int i = 0; i < 16; ++i) b[at + i] = uint8_t(i | ((15 - i) << 4));
}

TEST(GgufDequantize, Q4_0) {
  // 18 bytes: f16 d, u8 qs[16]; y = d * (q - 8). d = 2.
  Bytes b(18);
  put16(b, 0, kH2);
  fill_nibbles(b, 2);
  std::vector<float> want(32);
  for (int i = 0; i < 16; ++i) {
    want[i] = 2.0f * float(i - 8);
    want[16 + i] = 2.0f * float(15 - i - 8);
  }
  const auto y = deq(GgmlType::Q4_0, b, 32);
  expect_all(y, want);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[16], 14.0f);
}

TEST(GgufDequantize, Q4_1) {
  // 20 bytes: f16 d, f16 m, u8 qs[16]; y = d * q + m. d = 0.25, m = -1.
  Bytes b(20);
  put16(b, 0, kQuarter);
  put16(b, 2, kHm1);
  fill_nibbles(b, 4);
  std::vector<float> want(32);
  for (int i = 0; i < 16; ++i) {
    want[i] = 0.25f * float(i) - 1.0f;
    want[16 + i] = 0.25f * float(15 - i) - 1.0f;
  }
  const auto y = deq(GgmlType::Q4_1, b, 32);
  expect_all(y, want);
  EXPECT_EQ(y[15], 2.75f);
}

constexpr uint32_t kQh = 0xA5A5F00Fu;  // bit i = high bit of element i

TEST(GgufDequantize, Q5_0) {
  // 22 bytes: f16 d, u8 qh[4] (u32 LE), u8 qs[16]; y = d * ((nibble | bit_i(qh) << 4) - 16). d = 1.
  Bytes b(22);
  put16(b, 0, kH1);
  for (int k = 0; k < 4; ++k) b[2 + k] = uint8_t(kQh >> (8 * k));
  fill_nibbles(b, 6);
  std::vector<float> want(32);
  for (int i = 0; i < 16; ++i) {
    want[i] = float((i | int((kQh >> i) & 1) << 4) - 16);
    want[16 + i] = float(((15 - i) | int((kQh >> (16 + i)) & 1) << 4) - 16);
  }
  const auto y = deq(GgmlType::Q5_0, b, 32);
  expect_all(y, want);
  EXPECT_EQ(y[0], 0.0f);     // nibble 0, high bit 1: 16 - 16
  EXPECT_EQ(y[4], -12.0f);   // nibble 4, high bit 0
  EXPECT_EQ(y[16], 15.0f);   // nibble 15, bit 16 set: 31 - 16
}

TEST(GgufDequantize, Q5_1) {
  // 24 bytes: f16 d, f16 m, u8 qh[4], u8 qs[16]; y = d * q + m. d = 0.5, m = 0.25.
  Bytes b(24);
  put16(b, 0, kHalf);
  put16(b, 2, kQuarter);
  for (int k = 0; k < 4; ++k) b[4 + k] = uint8_t(kQh >> (8 * k));
  fill_nibbles(b, 8);
  std::vector<float> want(32);
  for (int i = 0; i < 16; ++i) {
    want[i] = 0.5f * float(i | int((kQh >> i) & 1) << 4) + 0.25f;
    want[16 + i] = 0.5f * float((15 - i) | int((kQh >> (16 + i)) & 1) << 4) + 0.25f;
  }
  const auto y = deq(GgmlType::Q5_1, b, 32);
  expect_all(y, want);
  EXPECT_EQ(y[16], 15.75f);  // q = 31
}

/// A byte pattern covering all bit combinations.
uint8_t pat(int i, int mul, int add) { return uint8_t((i * mul + add) & 0xff); }

TEST(GgufDequantize, Q2_K) {
  // 84 bytes: u8 scales[16] (low nibble scale, high nibble min), u8 qs[64], f16 d, f16 dmin.
  // Element e: h = e/128, j = (e%128)/32, l = e%32: q = (qs[32h + l] >> 2j) & 3, k = e/16:
  // y = (d * sc_k) * q - dmin * m_k. Here sc_k = k, m_k = 15 - k, d = 0.5, dmin = 0.25.
  Bytes b(84);
  for (int k = 0; k < 16; ++k) b[k] = uint8_t(k | ((15 - k) << 4));
  for (int i = 0; i < 64; ++i) b[16 + i] = pat(i, 37, 0);
  put16(b, 80, kHalf);
  put16(b, 82, kQuarter);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32, k = e / 16;
    const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
    want[e] = 0.5f * float(k) * float(q) - 0.25f * float(15 - k);
  }
  const auto y = deq(GgmlType::Q2_K, b, 256);
  expect_all(y, want);
  EXPECT_EQ(y[0], -3.75f);  // q 0, min 15 * 0.25
  EXPECT_EQ(y[17], -3.0f);  // qs[17] = 117 = 0b01110101: q 1; 0.5 * 1 * 1 - 0.25 * 14
}

TEST(GgufDequantize, Q3_K) {
  // 110 bytes: u8 hmask[32], u8 qs[64], u8 scales[12], f16 d. Element e (h, j, l as Q2_K):
  // q = ((qs[32h + l] >> 2j) & 3) - (bit 4h + j of hmask[l] ? 0 : 4), y = (d * (S[e/16] - 32)) * q,
  // with the 6-bit scales S packed: low nibbles in scales[0..7] (k < 8 low, k >= 8 high nibble of
  // scales[k - 8]), high 2 bits in scales[8 + k%4] at bit 2 * (k/4). d = 0.25.
  int S[16];
  for (int k = 0; k < 16; ++k) S[k] = (k * 7 + 3) % 64;  // 3, 10, ..., 59, 2, ..., 44: both signs after -32
  Bytes b(110);
  for (int l = 0; l < 32; ++l) b[l] = pat(l, 53, 7);
  for (int i = 0; i < 64; ++i) b[32 + i] = pat(i, 37, 0);
  for (int k = 0; k < 16; ++k) {
    if (k < 8) b[96 + k] |= uint8_t(S[k] & 15);
    else b[96 + k - 8] |= uint8_t((S[k] & 15) << 4);
    b[96 + 8 + k % 4] |= uint8_t((S[k] >> 4) << (2 * (k / 4)));
  }
  put16(b, 108, kQuarter);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int hbit = (b[l] >> (4 * h + j)) & 1;
    const int q = ((b[32 + 32 * h + l] >> (2 * j)) & 3) - (hbit ? 0 : 4);
    want[e] = 0.25f * float(S[e / 16] - 32) * float(q);
  }
  const auto y = deq(GgmlType::Q3_K, b, 256);
  expect_all(y, want);
  // e = 0: hmask[0] = 7 (bit 0 set), qs[0] = 0: q = 0 -> 0; e = 32: j = 1, bit 1 of 7 set, q = 0.
  // e = 16 (k = 1, S = 10): qs[16] = 80 = 0b01010000, q = 0, hmask[16] = 79 = 0b1001111 bit 0 set -> 0.
  // e = 96 (k = 6, S = 45, h 0 j 3 l 0): qs[0] >> 6 = 0, hmask[0] bit 3 clear -> q = -4: 0.25*13*-4.
  EXPECT_EQ(y[96], -13.0f);
}

/// Packs the 8 6-bit scales and mins of a Q4_K / Q5_K super-block into 12 bytes at `at`.
void pack_k4(Bytes& b, size_t at, const int* sc, const int* m) {
  for (int s = 0; s < 4; ++s) {
    b[at + s] = uint8_t(sc[s] | ((sc[s + 4] >> 4) << 6));
    b[at + s + 4] = uint8_t(m[s] | ((m[s + 4] >> 4) << 6));
    b[at + s + 8] = uint8_t((sc[s + 4] & 15) | ((m[s + 4] & 15) << 4));
  }
}

TEST(GgufDequantize, Q4_K) {
  // 144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128]. Sub-block s = e/32 (8 of them),
  // c = e/64, l = e%32: q = even s ? qs[32c + l] & 15 : qs[32c + l] >> 4,
  // y = (d * SC[s]) * q - dmin * M[s]. d = 0.5, dmin = 0.125.
  const int SC[8] = {5, 14, 23, 32, 41, 50, 59, 63}, M[8] = {60, 9, 22, 35, 48, 61, 17, 30};
  Bytes b(144);
  put16(b, 0, kHalf);
  put16(b, 2, kEighth);
  pack_k4(b, 4, SC, M);
  for (int i = 0; i < 128; ++i) b[16 + i] = pat(i, 37, 11);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, c = e / 64, l = e % 32;
    const uint8_t byte = b[16 + 32 * c + l];
    const int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
    want[e] = 0.5f * float(SC[s]) * float(q) - 0.125f * float(M[s]);
  }
  const auto y = deq(GgmlType::Q4_K, b, 256);
  expect_all(y, want);
  EXPECT_EQ(y[0], 0.5f * 5 * 11 - 0.125f * 60);  // qs[0] = 11: low nibble 11
  EXPECT_EQ(y[255], 0.5f * 63 * float(pat(127, 37, 11) >> 4) - 0.125f * 30);
}

TEST(GgufDequantize, Q5_K) {
  // 176 bytes: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]. As Q4_K with
  // q += 16 * bit s of qh[l]. d = 0.5, dmin = 0.125.
  const int SC[8] = {63, 1, 17, 33, 49, 2, 18, 34}, M[8] = {0, 63, 31, 47, 15, 16, 32, 48};
  Bytes b(176);
  put16(b, 0, kHalf);
  put16(b, 2, kEighth);
  pack_k4(b, 4, SC, M);
  for (int l = 0; l < 32; ++l) b[16 + l] = pat(l, 53, 7);
  for (int i = 0; i < 128; ++i) b[48 + i] = pat(i, 37, 11);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, c = e / 64, l = e % 32;
    const uint8_t byte = b[48 + 32 * c + l];
    const int q = (s % 2 == 0 ? (byte & 15) : (byte >> 4)) + 16 * ((b[16 + l] >> s) & 1);
    want[e] = 0.5f * float(SC[s]) * float(q) - 0.125f * float(M[s]);
  }
  const auto y = deq(GgmlType::Q5_K, b, 256);
  expect_all(y, want);
  EXPECT_EQ(y[0], 0.5f * 63 * (11 + 16));  // qh[0] = 7: bit 0 set; min 0
}

TEST(GgufDequantize, Q6_K) {
  // 210 bytes: u8 ql[128], u8 qh[64], i8 scales[16], f16 d. Element e (h, j, l as Q2_K):
  // q = ((ql[64h + 32(j & 1) + l] >> 4(j >> 1)) & 15 | ((qh[32h + l] >> 2j) & 3) << 4) - 32,
  // y = (d * scales[e/16]) * q. d = 0.125.
  Bytes b(210);
  for (int i = 0; i < 128; ++i) b[i] = pat(i, 37, 0);
  for (int i = 0; i < 64; ++i) b[128 + i] = pat(i, 53, 7);
  for (int k = 0; k < 16; ++k) b[192 + k] = uint8_t(int8_t(k * 11 - 80));
  put16(b, 208, kEighth);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int lo = (b[64 * h + 32 * (j & 1) + l] >> (4 * (j >> 1))) & 15;
    const int hi = (b[128 + 32 * h + l] >> (2 * j)) & 3;
    want[e] = 0.125f * float(int8_t(b[192 + e / 16])) * float((lo | (hi << 4)) - 32);
  }
  const auto y = deq(GgmlType::Q6_K, b, 256);
  expect_all(y, want);
  // e = 0: ql[0] = 0, qh[0] = 7 -> hi 3: q = 48 - 32 = 16; scale -80: 0.125 * -80 * 16 = -160.
  EXPECT_EQ(y[0], -160.0f);
}

TEST(GgufDequantize, MultipleBlocksAndUnsupportedTypes) {
  // Two Q8_0 blocks with different scales land in consecutive outputs.
  Bytes b(68);
  put16(b, 0, kH1);
  put16(b, 34, kH2);
  for (int i = 0; i < 32; ++i) {
    b[2 + i] = uint8_t(i);
    b[36 + i] = uint8_t(i);
  }
  const auto y = deq(GgmlType::Q8_0, b, 64);
  EXPECT_EQ(y[31], 31.0f);
  EXPECT_EQ(y[63], 62.0f);
  EXPECT_THROW(deq(GgmlType::Q8_0, b, 33), std::invalid_argument);
  sq::test::expect_error<sq::UnsupportedError>([&] { deq(GgmlType::IQ4_NL, b, 32); }, {"IQ4_NL", "not supported"});
  EXPECT_FALSE(sq::ggml_can_dequantize(GgmlType::Q8_1));
  EXPECT_TRUE(sq::ggml_can_dequantize(GgmlType::Q6_K));
}

TEST(GgufDequantize, TensorRowsFromAFile) {
  // A 3-row Q8_0 tensor of 64-element rows (2 blocks a row); block k has d = 1 and qs[i] = k + i.
  using W = sq::test::GgufWriter;
  std::string data;
  for (int k = 0; k < 6; ++k) {
    data += W::u16(kH1);
    for (int i = 0; i < 32; ++i) data += char(k + i);
  }
  W w;
  w.tensor("q", {64, 3}, 8, data).tensor("iq", {32}, 20, std::string(18, '\0'));
  const std::string bytes = w.bytes();
  const sq::GgufFile f(sq::MappedFile::from_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "rows.gguf"));
  const sq::GgufTensorInfo& q = f.tensor("q");
  std::vector<float> rows(64 * 2);
  sq::dequantize_tensor_rows(f, q, 1, 3, rows.data());
  EXPECT_EQ(rows[0], 2.0f);          // row 1 starts with block 2: qs[0] = 2
  EXPECT_EQ(rows[64 + 63], 5.0f + 31.0f);  // row 2, last element of block 5
  const sq::Tensor all = sq::dequantize_tensor(f, "q");
  EXPECT_EQ(all.shape(), (std::vector<int64_t>{3, 64}));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(all.data()[64 + i], rows[i]) << i;
  EXPECT_THROW(sq::dequantize_tensor_rows(f, q, 2, 4, rows.data()), std::out_of_range);
  sq::test::expect_error<sq::UnsupportedError>([&] { sq::dequantize_tensor(f, "iq"); }, {"rows.gguf", "'iq'", "IQ4_NL"});
}

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

TEST(GgufDequantize, MatchesGgufPyOnRandomBlocks) {
  // Random blocks of every supported type (most of which the real models do not contain) and their
  // dequantization by gguf.quants (tests/data/gguf_reference_blocks.json, scripts/gguf_reference.py
  // --blocks). Same per-element FP32 operations in the same order, no FMA: equal bit for bit.
  const auto doc = nlohmann::json::parse(sq::read_file_to_string(std::string(SQ_SOURCE_DIR) + "/tests/data/gguf_reference_blocks.json"));
  const std::map<std::string, GgmlType> types = {
      {"F16", GgmlType::F16},   {"BF16", GgmlType::BF16}, {"Q8_0", GgmlType::Q8_0}, {"Q4_0", GgmlType::Q4_0},
      {"Q4_1", GgmlType::Q4_1}, {"Q5_0", GgmlType::Q5_0}, {"Q5_1", GgmlType::Q5_1}, {"Q2_K", GgmlType::Q2_K},
      {"Q3_K", GgmlType::Q3_K}, {"Q4_K", GgmlType::Q4_K}, {"Q5_K", GgmlType::Q5_K}, {"Q6_K", GgmlType::Q6_K}};
  ASSERT_EQ(doc["types"].size(), types.size());
  for (const auto& [name, type] : types) {
    const auto bytes = from_hex(doc["types"][name]["bytes"].get<std::string>());
    const auto want_bytes = from_hex(doc["types"][name]["values"].get<std::string>());
    std::vector<float> want(want_bytes.size() / 4);
    std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
    const auto got = deq(type, bytes, static_cast<int64_t>(want.size()));
    double max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << name << " element " << i;
      max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    }
    std::printf("  %-5s %4zu values, max |sqkit - gguf.quants| = %g\n", name.c_str(), want.size(), max_diff);
  }
}

}  // namespace
