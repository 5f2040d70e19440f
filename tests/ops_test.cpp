// The decoder's elementwise ops (lib/ops/ops.h, lib/ops/fast_exp.h) against their definitions
// computed in FP64 with libm.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <vector>

#include "ops/fast_exp.h"
#include "ops/ops.h"

namespace sq {
namespace {

/// Points over [lo, hi] (uniform steps) plus the awkward ones: 0, ±tiny, ±1.
std::vector<float> points(float lo, float hi, int n) {
  std::vector<float> x = {0.0f, 1e-30f, -1e-30f, 1e-6f, -1e-6f, 1.0f, -1.0f};
  for (int i = 0; i < n; ++i) x.push_back(lo + (hi - lo) * float(i) / float(n - 1));
  return x;
}

TEST(FastExp, RelativeErrorAtMost2e7OverTheClampedRange) {
  for (float x : points(-87.0f, 88.0f, 200001)) {
    const double ref = std::exp(double(x));
    ASSERT_LE(std::fabs(double(ops::fast_exp(x)) - ref), 2e-7 * ref) << x;
  }
  // saturates at normal floats, never 0 or inf (88.5 gave inf before the upper clamp moved to 88.0)
  EXPECT_GT(ops::fast_exp(-200.0f), 0.0f);
  for (float x : {88.3f, 88.5f, 88.7f, 200.0f}) EXPECT_EQ(ops::fast_exp(x), ops::fast_exp(88.0f)) << x;
  EXPECT_TRUE(std::isfinite(ops::fast_exp(88.0f)));
}

/// f(x) = x·g(x) against its FP64 definition: |f − ref| ≤ rel·|ref| + abs·|x|. rel covers fast_exp's
/// 2e-7 times the exponent's magnitude (the argument's own rounding, ≤ 3 ulp of |v| ≤ 100, is
/// amplified by e^v's derivative: 100 · 1.8e-7 ≈ 2e-5); abs covers results that are ~0 next to x.
void expect_activation(Activation act, double (*ref)(double), float lo, float hi) {
  std::vector<float> x = points(lo, hi, 100001), y = x;
  ops::activation(act, y.data(), int64_t(y.size()));  // ≥ 2^16 elements: the parallel loop
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = ref(double(x[i]));
    ASSERT_LE(std::fabs(double(y[i]) - r), 2e-5 * std::fabs(r) + 1e-6 * std::fabs(double(x[i]))) << "x = " << x[i];
  }
  // gated: act(gate) · up
  std::vector<float> g = x, up(x.size());
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0.5f + float(i % 7);
  ops::gated_activation(act, g.data(), up.data(), int64_t(g.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(g[i], y[i] * up[i]) << "x = " << x[i];
}

TEST(Activation, GeluTanhIsTheTanhFormula) {
  // transformers' gelu_pytorch_tanh: 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))); sqkit computes it as
  // x·σ(2v), the same function (ops.cpp).
  expect_activation(Activation::GeluTanh, [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }, -12.0f, 12.0f);
}

TEST(Activation, SiluGeluErfAndReluAreTheirDefinitions) {
  expect_activation(Activation::SiLU, [](double x) { return x / (1.0 + std::exp(-x)); }, -80.0f, 80.0f);
  expect_activation(Activation::Gelu, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, -12.0f, 12.0f);
  expect_activation(Activation::ReLU, [](double x) { return x > 0 ? x : 0.0; }, -5.0f, 5.0f);
}

}  // namespace
}  // namespace sq
