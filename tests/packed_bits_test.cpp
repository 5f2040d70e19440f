// Dense b-bit code packing (quant/packed_bits.h): round trips for every width b = 1..8 and odd
// lengths, ranges that start and end inside bytes, random access, the documented bit order pinned
// by hand-computed bytes, and errors.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "quant/packed_bits.h"
#include "tests/support/expect_error.h"

namespace sq {
namespace {

std::vector<uint8_t> random_codes(size_t n, int bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> c(n);
  for (auto& v : c) v = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
  return c;
}

TEST(PackedBits, BytesFor) {
  EXPECT_EQ(packed_bytes_for(0, 3), 0);
  EXPECT_EQ(packed_bytes_for(1, 3), 1);
  EXPECT_EQ(packed_bytes_for(8, 3), 3);
  EXPECT_EQ(packed_bytes_for(9, 3), 4);  // 27 bits
  EXPECT_EQ(packed_bytes_for(7, 1), 1);
  EXPECT_EQ(packed_bytes_for(5, 8), 5);
  EXPECT_EQ(packed_bytes_for(3, 4), 2);
  EXPECT_EQ(PackedBits::bytes_for(1000, 2), 250);
}

TEST(PackedBits, RoundTripEveryWidthAndOddLength) {
  for (int bits = 1; bits <= 8; ++bits) {
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5), size_t(7), size_t(8), size_t(9), size_t(13),
                     size_t(31), size_t(33), size_t(127), size_t(1001)}) {
      const auto codes = random_codes(n, bits, 1000 * bits + n);
      const int64_t nb = packed_bytes_for(int64_t(n), bits);
      std::vector<uint8_t> packed(size_t(nb) + 1, 0xEE);  // one guard byte past the end
      pack_bits(codes.data(), int64_t(n), bits, packed.data());
      EXPECT_EQ(packed.back(), 0xEE) << "wrote past bytes_for, bits " << bits << " n " << n;
      std::vector<uint8_t> back(n, 0xFF);
      unpack_bits(packed.data(), 0, int64_t(n), bits, back.data());
      EXPECT_EQ(back, codes) << "bits " << bits << " n " << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(packed_get(packed.data(), int64_t(i), bits), codes[i]) << bits << " " << i;
      // The packed stream is exactly Σ code_i · 2^(i·bits) (little-endian bit stream).
      for (int64_t t = 0; t < int64_t(n) * bits; ++t) {
        const int expect = (codes[size_t(t / bits)] >> (t % bits)) & 1;
        ASSERT_EQ((packed[size_t(t / 8)] >> (t % 8)) & 1, expect) << "stream bit " << t << ", bits " << bits;
      }
    }
  }
}

TEST(PackedBits, RangesInsideBytesLeaveNeighboursAlone) {
  for (int bits = 1; bits <= 8; ++bits) {
    const int64_t n = 61;
    const auto base = random_codes(size_t(n), bits, 7 + bits);
    std::mt19937_64 rng(bits);
    for (int trial = 0; trial < 50; ++trial) {
      const int64_t first = int64_t(rng() % n), count = int64_t(rng() % (n - first + 1));
      PackedBits p(bits, n);
      p.pack(0, base.data(), n);
      const auto patch = random_codes(size_t(count), bits, 100 * bits + trial);
      p.pack(first, patch.data(), count);
      std::vector<uint8_t> expect = base;
      std::copy(patch.begin(), patch.end(), expect.begin() + first);
      std::vector<uint8_t> all(static_cast<size_t>(n));
      p.unpack(0, n, all.data());
      ASSERT_EQ(all, expect) << "bits " << bits << " first " << first << " count " << count;
      std::vector<uint8_t> part(static_cast<size_t>(count));
      p.unpack(first, count, part.data());
      ASSERT_EQ(part, patch);
      // set() on one element only changes that element.
      const int64_t i = int64_t(rng() % n);
      const uint8_t v = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
      p.set(i, v);
      expect[size_t(i)] = v;
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(p.get(j), expect[size_t(j)]);
    }
  }
}

TEST(PackedBits, ThreeBitOrderMatchesTheDiagram) {
  // Codes a..h = 1..7, 0: Σ code_i · 8^i = 0x1F58D1, so bytes D1 58 1F (the file comment's diagram:
  // byte 0 = c1 c0 b2 b1 b0 a2 a1 a0 = 1 1 0 1 0 0 0 1).
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 6, 7, 0};
  std::vector<uint8_t> packed(3, 0);
  pack_bits(codes.data(), 8, 3, packed.data());
  EXPECT_EQ(packed, (std::vector<uint8_t>{0xD1, 0x58, 0x1F}));
  // 4 bits: the .sqm U4x2 layout, low nibble = even element.
  const std::vector<uint8_t> nib = {0x3, 0xA, 0xF};
  std::vector<uint8_t> p4(2, 0);
  pack_bits(nib.data(), 3, 4, p4.data());
  EXPECT_EQ(p4, (std::vector<uint8_t>{0xA3, 0x0F}));
  // 2 bits: element i in bits 2i..2i+1.
  const std::vector<uint8_t> two = {1, 2, 3, 0, 2};
  std::vector<uint8_t> p2(2, 0);
  pack_bits(two.data(), 5, 2, p2.data());
  EXPECT_EQ(p2, (std::vector<uint8_t>{0x39, 0x02}));  // 00 11 10 01, then 10
}

TEST(PackedBits, RejectsBadArguments) {
  std::vector<uint8_t> buf(4, 0);
  const std::vector<uint8_t> codes = {1, 8, 2};
  test::expect_error<std::invalid_argument>([&] { pack_bits(codes.data(), 3, 3, buf.data()); }, {"codes[1] = 8", "3 bits"});
  EXPECT_EQ(buf, std::vector<uint8_t>(4, 0));  // nothing written
  test::expect_error<std::invalid_argument>([&] { packed_bytes_for(4, 0); }, {"bits = 0"});
  test::expect_error<std::invalid_argument>([&] { unpack_bits(buf.data(), 0, 1, 9, buf.data()); }, {"bits = 9"});
  test::expect_error<std::invalid_argument>([&] { PackedBits(2, -1); }, {"n = -1"});
  PackedBits p(3, 10);
  test::expect_error<std::out_of_range>([&] { p.get(10); }, {"[10, 11)", "[0, 10)"});
  test::expect_error<std::out_of_range>([&] { p.pack(8, codes.data(), 3); }, {"[8, 11)"});
  test::expect_error<std::invalid_argument>([&] { p.set(0, 8); }, {"code 8"});
}

}  // namespace
}  // namespace sq
