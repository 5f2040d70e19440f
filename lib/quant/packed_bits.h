// Dense packing of b-bit unsigned codes (b = 1..8), e.g. the 2/3/4-bit indices of a KVQuant nuqX KV
// cache (Hooper et al. 2024, §3.3; one index into a 2^b-entry codebook per element).
//
// Bit order: LSB first, no padding between elements. Element i occupies bits [i·b, (i+1)·b) of the
// bit stream; stream bit t is bit (t mod 8) of byte t / 8; bit 0 of an element is its lowest stream
// bit. So an element can straddle two bytes when 8 mod b ≠ 0. For b = 3 (a0 = bit 0 of element a):
//
//        byte 0                     byte 1                     byte 2
//   bit: 7  6  5  4  3  2  1  0     7  6  5  4  3  2  1  0     7  6  5  4  3  2  1  0
//       c1 c0 b2 b1 b0 a2 a1 a0    f0 e2 e1 e0 d2 d1 d0 c2    h2 h1 h0 g2 g1 g0 f2 f1
//       '-c-' '---b---' '---a---'   ^  '---e---' '---d---' ^   '---h---' '---g---' '-f-'
//                                   f                      c (continued)
//
// For b = 4 this is the .sqm U4x2 layout (low nibble = even element, docs/formats.md); for b = 8 it
// is one byte per code. n codes take bytes_for(n, b) = ⌈n·b / 8⌉ bytes; the unused high bits of the
// last byte are written as 0 by pack_bits over a whole buffer and are never read.
#pragma once

#include <cstdint>
#include <vector>

namespace sq {

/// Bytes needed for n codes of `bits` bits: ⌈n·bits/8⌉. Throws std::invalid_argument for bits ∉
/// [1, 8] or n < 0.
int64_t packed_bytes_for(int64_t n, int bits);

/// Writes codes[0..count) as elements [first, first + count) of the packed stream `packed` (which
/// must hold at least packed_bytes_for(first + count, bits) bytes); bits of other elements are left
/// unchanged. Throws std::invalid_argument for bits ∉ [1, 8], first/count < 0, or a code ≥ 2^bits
/// (naming its index; nothing is written before the check passes).
void pack_bits(const uint8_t* codes, int64_t count, int bits, uint8_t* packed, int64_t first = 0);

/// Reads elements [first, first + count) of `packed` into codes[0..count) (values < 2^bits).
/// Throws std::invalid_argument for bits ∉ [1, 8] or first/count < 0.
void unpack_bits(const uint8_t* packed, int64_t first, int64_t count, int bits, uint8_t* codes);

/// Element i of `packed` (random access; reads one or two bytes). bits must be in [1, 8] (unchecked).
inline uint8_t packed_get(const uint8_t* packed, int64_t i, int bits) {
  const int64_t p = i * bits;
  const int64_t byte = p >> 3;
  const int off = static_cast<int>(p & 7);
  unsigned v = packed[byte] >> off;
  if (off + bits > 8) v |= unsigned(packed[byte + 1]) << (8 - off);
  return static_cast<uint8_t>(v & ((1u << bits) - 1u));
}

/// Sets element i of `packed` to `code` (< 2^bits, unchecked), leaving every other bit unchanged.
inline void packed_set(uint8_t* packed, int64_t i, int bits, uint8_t code) {
  const int64_t p = i * bits;
  const int64_t byte = p >> 3;
  const int off = static_cast<int>(p & 7);
  const unsigned mask = ((1u << bits) - 1u) << off;  // up to 15 bits
  const unsigned v = unsigned(code) << off;
  packed[byte] = static_cast<uint8_t>((packed[byte] & ~mask) | (v & mask));
  if (off + bits > 8) packed[byte + 1] = static_cast<uint8_t>((packed[byte + 1] & ~(mask >> 8)) | ((v & mask) >> 8));
}

/// An owning packed array of n b-bit codes (layout in the file comment), zero-initialized.
class PackedBits {
 public:
  /// n ≥ 0 codes of `bits` ∈ [1, 8] bits; throws std::invalid_argument otherwise.
  PackedBits(int bits, int64_t n);

  static int64_t bytes_for(int64_t n, int bits) { return packed_bytes_for(n, bits); }

  int bits() const { return bits_; }
  int64_t size() const { return n_; }
  /// Element i (bounds-checked: std::out_of_range).
  uint8_t get(int64_t i) const;
  /// Sets element i (std::out_of_range for i, std::invalid_argument for code ≥ 2^bits).
  void set(int64_t i, uint8_t code);
  /// pack_bits / unpack_bits on [first, first + count) (std::out_of_range past size()).
  void pack(int64_t first, const uint8_t* codes, int64_t count);
  void unpack(int64_t first, int64_t count, uint8_t* codes) const;
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  void check_range(int64_t first, int64_t count) const;
  int bits_;
  int64_t n_;
  std::vector<uint8_t> bytes_;
};

}  // namespace sq
