#include "quant/packed_bits.h"

#include <stdexcept>
#include <string>

namespace sq {
namespace {

void check_bits(const char* fn, int bits) {
  if (bits < 1 || bits > 8) throw std::invalid_argument(std::string(fn) + ": bits = " + std::to_string(bits) + " must be in [1, 8]");
}

void check_nonneg(const char* fn, const char* what, int64_t v) {
  if (v < 0) throw std::invalid_argument(std::string(fn) + ": " + what + " = " + std::to_string(v) + " must be >= 0");
}

}  // namespace

int64_t packed_bytes_for(int64_t n, int bits) {
  check_bits("packed_bytes_for", bits);
  check_nonneg("packed_bytes_for", "n", n);
  return (n * bits + 7) / 8;
}

void pack_bits(const uint8_t* codes, int64_t count, int bits, uint8_t* packed, int64_t first) {
  check_bits("pack_bits", bits);
  check_nonneg("pack_bits", "first", first);
  check_nonneg("pack_bits", "count", count);
  const unsigned limit = 1u << bits;
  for (int64_t i = 0; i < count; ++i)
    if (codes[i] >= limit)
      throw std::invalid_argument("pack_bits: codes[" + std::to_string(i) + "] = " + std::to_string(codes[i]) +
                                  " does not fit in " + std::to_string(bits) + " bits");
  if (count == 0) return;
  if (bits == 8) {
    for (int64_t i = 0; i < count; ++i) packed[first + i] = codes[i];
    return;
  }
  const int64_t start = first * bits;
  uint8_t* out = packed + (start >> 3);
  int nacc = static_cast<int>(start & 7);
  uint64_t acc = *out & ((1u << nacc) - 1u);  // keep the bits of earlier elements in the first byte
  int64_t i = 0;
  // The accumulator holds < 8 pending bits before each code is added; whole bytes are flushed.
  for (; i < count; ++i) {
    acc |= uint64_t(codes[i]) << nacc;
    nacc += bits;
    while (nacc >= 8) {
      *out++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      nacc -= 8;
    }
  }
  if (nacc > 0) {
    const unsigned keep = ~((1u << nacc) - 1u) & 0xFFu;  // bits of later elements in the last byte
    *out = static_cast<uint8_t>((*out & keep) | (acc & ~keep));
  }
}

void unpack_bits(const uint8_t* packed, int64_t first, int64_t count, int bits, uint8_t* codes) {
  check_bits("unpack_bits", bits);
  check_nonneg("unpack_bits", "first", first);
  check_nonneg("unpack_bits", "count", count);
  if (bits == 8) {
    for (int64_t i = 0; i < count; ++i) codes[i] = packed[first + i];
    return;
  }
  const int64_t start = first * bits;
  const uint8_t* in = packed + (start >> 3);
  const unsigned mask = (1u << bits) - 1u;
  int skip = static_cast<int>(start & 7);
  uint64_t acc = 0;
  int nacc = 0;
  for (int64_t i = 0; i < count; ++i) {
    while (nacc < bits + skip) {  // read a byte only when its bits are needed: never past the end
      acc |= uint64_t(*in++) << nacc;
      nacc += 8;
    }
    if (skip) {
      acc >>= skip;
      nacc -= skip;
      skip = 0;
    }
    codes[i] = static_cast<uint8_t>(acc & mask);
    acc >>= bits;
    nacc -= bits;
  }
}

PackedBits::PackedBits(int bits, int64_t n) : bits_(bits), n_(n) {
  check_bits("PackedBits", bits);
  check_nonneg("PackedBits", "n", n);
  bytes_.assign(static_cast<size_t>(packed_bytes_for(n, bits)), 0);
}

void PackedBits::check_range(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first > n_ || count > n_ - first)
    throw std::out_of_range("PackedBits: elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") outside [0, " + std::to_string(n_) + ")");
}

uint8_t PackedBits::get(int64_t i) const {
  check_range(i, 1);
  return packed_get(bytes_.data(), i, bits_);
}

void PackedBits::set(int64_t i, uint8_t code) {
  check_range(i, 1);
  if (code >> bits_)
    throw std::invalid_argument("PackedBits::set: code " + std::to_string(code) + " does not fit in " + std::to_string(bits_) + " bits");
  packed_set(bytes_.data(), i, bits_, code);
}

void PackedBits::pack(int64_t first, const uint8_t* codes, int64_t count) {
  check_range(first, count);
  pack_bits(codes, count, bits_, bytes_.data(), first);
}

void PackedBits::unpack(int64_t first, int64_t count, uint8_t* codes) const {
  check_range(first, count);
  unpack_bits(bytes_.data(), first, count, bits_, codes);
}

}  // namespace sq
