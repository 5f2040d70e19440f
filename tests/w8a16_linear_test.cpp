// W8A16Linear (the --quantize-head LM head of the weight-only schemes): per-channel INT8 weights
// times FP32 activations against an independent double-precision reference, on the GEMV (n = 1)
// and blocked-sgemm (n > 1) paths, independence from the thread count, and bad inputs.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/w8a16_linear.h"

namespace sq {
namespace {

struct Case {
  std::vector<int8_t> q;
  std::vector<float> scales, bias, x;
};

Case make_case(int64_t out, int64_t in, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> step(1e-4f, 2e-2f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Case c;
  c.q.resize(size_t(out * in));
  for (auto& v : c.q) v = int8_t(code(rng));
  c.scales.resize(size_t(out));
  for (auto& s : c.scales) s = step(rng);
  c.scales[0] = 0.0f;  // an all-zero row (absmax 0) has step 0
  c.bias.resize(size_t(out));
  for (auto& b : c.bias) b = g(rng);
  c.x.resize(size_t(n * in));
  for (auto& v : c.x) v = g(rng);
  return c;
}

/// y = Δ[o] · Σ_k x[i, k] · q[o, k] + b[o] in double, and the bound of the FP32 kernel's error:
/// FP32 accumulation of `in` products (each exact in FP32: a 24-bit float times a ≤ 8-bit integer
/// may round once) in any order errs by at most ~in · 2⁻²⁴ · Σ|x·q| relative; twice that (and the
/// final × Δ and + b roundings) covers the reassociation of the vector and sgemm paths.
void reference(const Case& c, int64_t out, int64_t in, int64_t n, bool with_bias, std::vector<double>& y, std::vector<double>& bound) {
  y.assign(size_t(n * out), 0.0);
  bound.assign(size_t(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = double(c.x[size_t(i * in + k)]) * c.q[size_t(o * in + k)];
        s += p;
        a += std::fabs(p);
      }
      const double b = with_bias ? c.bias[size_t(o)] : 0.0;
      y[size_t(i * out + o)] = c.scales[size_t(o)] * s + b;
      bound[size_t(i * out + o)] = 2.0 * double(in) * 0x1p-24 * c.scales[size_t(o)] * a + 0x1p-22 * (std::fabs(y[size_t(i * out + o)]) + std::fabs(b));
    }
}

TEST(W8A16Linear, MatchesTheDoublePrecisionDefinition) {
  // in = 576 (SmolLM2's width: AVX-512 and AVX2 main loops plus no tail), 67 (every tail), 640
  // (Gemma 3); out not a multiple of the 64-row sgemm block; n = 1 (GEMV), 3 and 37 (sgemm blocks).
  for (const int64_t in : {576, 67, 640})
    for (const int64_t n : {1, 3, 37})
      for (const bool with_bias : {false, true}) {
        const int64_t out = 150;
        const Case c = make_case(out, in, n, uint32_t(in * 100 + n));
        const W8A16Linear lin(c.q, c.scales, out, in, with_bias ? Tensor::from_vector({out}, c.bias) : Tensor());
        std::vector<float> y(size_t(n * out), -1.0f);
        lin.forward(c.x.data(), n, y.data());
        std::vector<double> ref, bound;
        reference(c, out, in, n, with_bias, ref, bound);
        for (size_t e = 0; e < y.size(); ++e)
          ASSERT_LE(std::fabs(y[e] - ref[e]), bound[e]) << "in " << in << " n " << n << " bias " << with_bias << " element " << e;
        // The zero-step row gives exactly the bias (or 0).
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[size_t(i * out)], with_bias ? c.bias[0] : 0.0f);
      }
  EXPECT_EQ(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f, 2.0f}, 2, 3).weight_bytes(), 6 + 8);
  EXPECT_EQ(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f, 2.0f}, 2, 3).format(), "w8a16-per-channel");
}

TEST(W8A16Linear, ResultsDoNotDependOnThreadCount) {
  const int64_t out = 1000, in = 576;  // above the 2^16 multiply-adds that go parallel
  const Case c = make_case(out, in, 9, 7);
  const W8A16Linear lin(c.q, c.scales, out, in);
  const int saved = omp_get_max_threads();
  for (const int64_t n : {1, 9}) {
    std::vector<float> y1(size_t(n * out)), y3(size_t(n * out));
    omp_set_num_threads(1);
    lin.forward(c.x.data(), n, y1.data());
    omp_set_num_threads(3);
    lin.forward(c.x.data(), n, y3.data());
    omp_set_num_threads(saved);
    EXPECT_EQ(y1, y3) << "n " << n;
  }
}

TEST(W8A16Linear, BadInputsThrow) {
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(5, 1), {1.0f, 1.0f}, 2, 3), std::invalid_argument);   // 5 codes for 2 x 3
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f}, 2, 3), std::invalid_argument);         // one step for 2 rows
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(6, -128), {1.0f, 1.0f}, 2, 3), std::invalid_argument);  // code −128
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f, -1.0f}, 2, 3), std::invalid_argument);  // negative step
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f, NAN}, 2, 3), std::invalid_argument);
  EXPECT_THROW(W8A16Linear(std::vector<int8_t>(6, 1), {1.0f, 1.0f}, 2, 3, Tensor::from_vector({3}, {0.f, 0.f, 0.f})), std::invalid_argument);
  EXPECT_THROW(W8A16Linear({}, {}, 0, 3), std::invalid_argument);
}

}  // namespace
}  // namespace sq
