// Test helper: reproducible random values.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace sq::test {

/// n values drawn from N(0, 1) (FP32) by std::mt19937 seeded with `seed`: the same values on every run.
inline std::vector<float> normal_floats(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

}  // namespace sq::test
