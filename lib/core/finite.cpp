#include "core/finite.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace sq {

namespace {

/// Elements per block: the inner loop over a block has no early exit (vectorizable); the block
/// loop stops at the first block holding a non-finite value, then the index is located in it.
constexpr int64_t kBlock = 1024;

template <typename Bits, Bits kExpMask>
int64_t first_nonfinite_bits(const Bits* x, int64_t n) {
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    Bits any = 0;
    for (int64_t i = b; i < e; ++i) any |= static_cast<Bits>((x[i] & kExpMask) == kExpMask);
    if (any)
      for (int64_t i = b; i < e; ++i)
        if ((x[i] & kExpMask) == kExpMask) return i;
  }
  return -1;
}

}  // namespace

int64_t first_nonfinite_f32(const float* x, int64_t n) {
  static_assert(sizeof(float) == sizeof(uint32_t));
  // Reading float storage through uint32_t: the bytes are the same object representation; a
  // memcpy per element would be the strictly conforming way and compiles to the same code.
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    uint32_t any = 0;
    for (int64_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, x + i, sizeof u);
      any |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
    if (any)
      for (int64_t i = b; i < e; ++i)
        if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

int64_t first_nonfinite_f16(const uint16_t* x, int64_t n) { return first_nonfinite_bits<uint16_t, 0x7C00>(x, n); }

int64_t first_nonfinite_bf16(const uint16_t* x, int64_t n) { return first_nonfinite_bits<uint16_t, 0x7F80>(x, n); }

std::string nonfinite_name(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return "finite";
}

std::string element_position(int64_t index, const std::vector<int64_t>& shape) {
  std::string s = "index " + std::to_string(index);
  if (shape.size() < 2) return s;
  std::vector<int64_t> coord(shape.size());
  int64_t rest = index;
  for (size_t k = shape.size(); k-- > 0;) {
    const int64_t d = shape[k] > 0 ? shape[k] : 1;
    coord[k] = rest % d;
    rest /= d;
  }
  s += " (element [";
  for (size_t k = 0; k < coord.size(); ++k) s += (k ? ", " : "") + std::to_string(coord[k]);
  return s + "] of shape " + shape_to_string(shape) + ")";
}

void check_checkpoint_finite(const Checkpoint& ck) {
  for (const auto& [name, t] : ck.tensors) {
    const int64_t i = first_nonfinite_f32(t.data(), t.numel());
    if (i >= 0)
      throw NonFiniteError(ck.source + ": tensor '" + name + "' holds a non-finite value (" + nonfinite_name(t.data()[i]) +
                           ") at " + element_position(i, t.shape()));
  }
}

}  // namespace sq
