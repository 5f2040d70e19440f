// Vectorizable single-precision exp for the runner's softmax / SiLU / log-sum-exp loops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace sq::ops {

/// e^x in FP32 without a libm call, so that loops over it auto-vectorize (AVX-512: 16 lanes).
/// Method (Cephes `expf`): x = n·ln2 + r with n = round(x·log2 e) and |r| ≤ ln2/2 (ln2 split in two
/// parts for an exact reduction), e^r by a degree-6 minimax polynomial, 2^n by building the
/// exponent bits. Inputs are clamped to [−87.3, 88.0] so 2^n stays a normal float (n ≤ 127; at the
/// former upper clamp 88.7, n = 128 gave inf): the result saturates at ~1.2e−38 below and e^88 ≈
/// 1.65e38 above instead of 0/inf. Relative error ≤ 2e−7 over the clamped range (tests/ops_test.cpp
/// bounds it against std::exp).
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 = 0.693359375 − 2.12194440e−4
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

}  // namespace sq::ops
