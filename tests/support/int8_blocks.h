// The per-block INT8 rounding of an activation row that W4A16Linear's INT8 decode GEMV applies
// (model/w4a16_linear.h, W4DecodeActivations::Int8), computed independently for the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace sq::test {

/// Rounds x (a multiple of 32 long) per block b of 32 to x ≈ s[b] · q: s[b] = max|x| / 127 (as FP32,
/// widened), q = round-to-nearest-even(x · 127 / max|x|) clamped below at −127; an all-zero block
/// gets s = 0 and q = 0.
inline void round_blocks_int8(const std::vector<float>& x, std::vector<double>& s, std::vector<int>& q) {
  const size_t blocks = x.size() / 32;
  s.assign(blocks, 0.0);
  q.assign(x.size(), 0);
  for (size_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (size_t k = 32 * b; k < 32 * b + 32; ++k) amax = std::max(amax, std::fabs(x[k]));
    s[b] = double(amax / 127.0f);
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (size_t k = 32 * b; k < 32 * b + 32; ++k) q[k] = std::max(-127, static_cast<int>(std::nearbyint(x[k] * inv)));
  }
}

}  // namespace sq::test
