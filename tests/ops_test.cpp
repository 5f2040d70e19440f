// The decoder's elementwise ops (lib/ops/ops.h, lib/ops/fast_exp.h) against their definitions
// computed in FP64 with libm.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "ops/fast_exp.h"
#include "core/rope_frequencies.h"
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

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// softmax_row against exp(x − max) / Σ in FP64, at lengths around the 16-lane maximum's blocks
// and with the maximum in the tail (the vector maximum once missed nothing but the order);
// exp_shifted_row returns the sum and leaves the unnormalized terms.
TEST(Softmax, RowsMatchTheFp64DefinitionAndExpShiftedRowItsSum) {
  for (int count : {1, 2, 15, 16, 31, 32, 33, 47, 64, 100, 513}) {
    std::vector<float> x = normal(size_t(count), uint32_t(count), 4.0f);
    x[size_t(count - 1)] = 30.0f;  // the maximum in the scalar tail
    double m = -1e300, sum = 0;
    for (float v : x) m = std::max(m, double(v));
    for (float v : x) sum += std::exp(double(v) - m);
    std::vector<float> p = x, e = x;
    ops::softmax_row(p.data(), count);
    const float s = ops::exp_shifted_row(e.data(), count);
    // fast_exp ≤ 2e-7 relative per term, FP32 sums of ≤ 513 terms in (0, 1]: 1e-5 relative
    EXPECT_NEAR(s, sum, 1e-5 * sum) << count;
    for (int i = 0; i < count; ++i) {
      const double ref = std::exp(double(x[size_t(i)]) - m);
      // fast_exp's 2e-7 plus the FP32 rounding of the argument x − max (≤ 2^-24·|x − max|),
      // which e^v turns into the same relative error
      const double rel = 2e-7 + std::fabs(double(x[size_t(i)]) - m) * 6e-8;
      ASSERT_NEAR(e[size_t(i)], ref, rel * ref + 1e-30) << count << " " << i;
      ASSERT_NEAR(p[size_t(i)], ref / sum, (rel + 1e-5) * ref / sum + 1e-30) << count << " " << i;
    }
  }
}

// A NaN score is skipped by the maximum as std::max(m, x) skipped it (the row's other terms keep
// their values; the NaN stays NaN).
TEST(Softmax, NanScoresDoNotBecomeTheMaximum) {
  std::vector<float> x(40, 0.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[20] = 2.0f;
  const float s = ops::exp_shifted_row(x.data(), 40);
  EXPECT_FLOAT_EQ(x[20], 1.0f);  // exp(2 − max) with max = 2
  EXPECT_TRUE(std::isnan(x[3]));
  EXPECT_TRUE(std::isnan(s));
}

// rope_table + rope_apply is rope() bit for bit (both layouts, partial rotary), and rope() is the
// rotation of its definition in FP64 (angles from FP32 positions·inv_freq as documented).
TEST(Rope, TableAndApplyEqualRopeAndTheDefinition) {
  const int n_heads = 3, head_dim = 16;
  const int64_t n = 2000;  // ≥ 2^16 elements: the parallel loops
  for (const RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
    for (const int rot : {16, 8}) {
      const int half = rot / 2;
      const std::vector<float> inv = rope_inv_freq<float>(10000.0f, rot, RopeScaling{});
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(7 + 3 * t);
      const std::vector<float> x = normal(size_t(n * n_heads * head_dim), 9);
      std::vector<float> a = x, b = x, c(size_t(n * half)), s(size_t(n * half));
      ops::rope(a.data(), pos.data(), n, n_heads, head_dim, rot, inv.data(), layout);
      ops::rope_table(pos.data(), n, half, inv.data(), c.data(), s.data());
      ops::rope_apply(b.data(), n, n_heads, head_dim, rot, c.data(), s.data(), layout);
      ASSERT_EQ(a, b) << "layout " << int(layout) << " rot " << rot;
      for (int64_t t = 0; t < n; t += 97)
        for (int h = 0; h < n_heads; ++h)
          for (int i = 0; i < half; ++i) {
            const double ang = double(float(pos[size_t(t)]) * inv[size_t(i)]);
            const int ia = layout == RopeLayout::Interleaved ? 2 * i : i, ib = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
            const size_t o = size_t(t * n_heads * head_dim + h * head_dim);
            const double x0 = x[o + size_t(ia)], x1 = x[o + size_t(ib)];
            // cosf/sinf are within 1 ulp; the FP32 products and sums add a few ulps of |x|
            EXPECT_NEAR(a[o + size_t(ia)], x0 * std::cos(ang) - x1 * std::sin(ang), 1e-6 * (std::fabs(x0) + std::fabs(x1)));
            EXPECT_NEAR(a[o + size_t(ib)], x0 * std::sin(ang) + x1 * std::cos(ang), 1e-6 * (std::fabs(x0) + std::fabs(x1)));
          }
      for (int h = 0; h < n_heads; ++h)  // channels past rot_dim pass through
        for (int j = rot; j < head_dim; ++j) EXPECT_EQ(a[size_t(h * head_dim + j)], x[size_t(h * head_dim + j)]);
    }
}

// add_norm is add_inplace followed by norm, bit for bit, for RMSNorm and LayerNorm; rms_inv is the
// factor rms_norm applies (y = x · rms_inv(x) · w).
TEST(Norm, AddNormEqualsAddThenNormAndRmsInvIsTheFactor) {
  const int64_t n = 300;
  const int d = 576;  // ≥ 2^16 elements: the parallel loops
  const std::vector<float> x0 = normal(size_t(n * d), 1), r = normal(size_t(n * d), 2), w = normal(size_t(d), 3), b = normal(size_t(d), 4);
  for (const NormKind kind : {NormKind::RMSNorm, NormKind::LayerNorm}) {
    std::vector<float> x1 = x0, x2 = x0, y1(size_t(n * d)), y2(size_t(n * d));
    const float* bias = kind == NormKind::LayerNorm ? b.data() : nullptr;
    ops::add_inplace(x1.data(), r.data(), n * d);
    ops::norm(kind, x1.data(), w.data(), bias, y1.data(), n, d, 1e-5f);
    ops::add_norm(kind, x2.data(), r.data(), w.data(), bias, y2.data(), n, d, 1e-5f);
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(y1, y2);
  }
  std::vector<float> y(static_cast<size_t>(d));
  ops::rms_norm(x0.data(), w.data(), y.data(), 1, d, 1e-5f);
  const float inv = ops::rms_inv(x0.data(), d, 1e-5f);
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += double(x0[size_t(j)]) * x0[size_t(j)];
  EXPECT_NEAR(inv, 1.0 / std::sqrt(ss / d + 1e-5), 1e-6 / std::sqrt(ss / d));
  for (int j = 0; j < d; ++j) EXPECT_EQ(y[size_t(j)], x0[size_t(j)] * inv * w[size_t(j)]);
}

}  // namespace
}  // namespace sq
