// W8A8: symmetric INT8 quantization (SmoothQuant Eq. 3.1), the INT8 GEMM backends against a
// scalar integer reference, and W8A8Linear against the FP32 DenseLinear with error bounds derived
// from the uniform quantization-noise model.
#include <gtest/gtest.h>

#include "bench/timing.h"
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "model/linear.h"
#include "model/w8a8_linear.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"

namespace sq {
namespace {

using bench::normal_vector;  // N(0, sd²) from std::mt19937(seed)

std::vector<int8_t> random_int8(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int8_t>(d(rng));
  return v;
}

int64_t round_up_64(int64_t k) { return (k + 63) / 64 * 64; }

/// Independent scalar Eq. 3.1 quantizer for one value.
int scalar_q(float x, float step) {
  const double v = std::nearbyint(static_cast<double>(x / step));
  return static_cast<int>(std::clamp(v, -127.0, 127.0));
}

/// Restores the OpenMP thread count on scope exit.
struct ThreadCount {
  int saved = omp_get_max_threads();
  ~ThreadCount() { omp_set_num_threads(saved); }
};

std::vector<Int8Backend> backends() {
  std::vector<Int8Backend> b = {Int8Backend::Reference};
  if (int8_backend_available(Int8Backend::OneDnn)) b.push_back(Int8Backend::OneDnn);  // exact only with INT8 dot products
  if (int8_backend_available(Int8Backend::Vnni)) b.push_back(Int8Backend::Vnni);
  if (int8_backend_available(Int8Backend::Amx)) b.push_back(Int8Backend::Amx);  // AMX tiles + VNNI row tails
  if (int8_backend_available(Int8Backend::Avx2)) b.push_back(Int8Backend::Avx2);
  return b;
}

// ------------------------------------------------------------------------------------------------
// Quantization
// ------------------------------------------------------------------------------------------------

TEST(Int8Quantize, StepFromAbsMax) {
  EXPECT_EQ(int8_step(127.0f), 1.0f);
  EXPECT_FLOAT_EQ(int8_step(1.27f), 0.01f);
  EXPECT_EQ(int8_step(0.0f), 1.0f);  // zero maxima guarded
  EXPECT_THROW(int8_step(std::numeric_limits<float>::quiet_NaN()), std::invalid_argument);
  EXPECT_THROW(int8_step(std::numeric_limits<float>::infinity()), std::invalid_argument);
  EXPECT_THROW(int8_step(-1.0f), std::invalid_argument);
}

TEST(Int8Quantize, HandMadeValuesRoundHalfToEven) {
  // absmax 127 → Δ = 1 exactly, so q is round-half-even of x itself.
  const std::vector<float> x = {0.0f, 0.5f, 1.5f, 2.5f, -2.5f, -0.49f, 3.51f, 126.6f, -127.0f, 127.0f, 64.0f, -0.5f};
  const std::vector<int8_t> want = {0, 0, 2, 2, -2, 0, 4, 127, -127, 127, 64, 0};
  std::vector<int8_t> q(x.size());
  float scale = 0;
  quantize_activations(x.data(), 1, static_cast<int64_t>(x.size()), ActQuant::PerToken, 0.0f, q.data(), &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(q, want);
}

TEST(Int8Quantize, ZeroRowAndOutlierRow) {
  // Row 0: all zeros → Δ = 1, q = 0. Row 1: one outlier (1000) dominates absmax, so Δ = 1000/127
  // ≈ 7.87 and the ordinary values 1, 2, 3 collapse to 0 (the "effective bits" loss of §3.2);
  // the outlier itself maps to exactly 127 and −4·Δ to −4.
  const int64_t k = 6;
  const float d = 1000.0f / 127.0f;
  const std::vector<float> x = {0, 0, 0, 0, 0, 0,  //
                                1.0f, 2.0f, 3.0f, 1000.0f, -4.0f * d, -3.0f};
  std::vector<int8_t> q(12);
  std::vector<float> s(2);
  quantize_activations(x.data(), 2, k, ActQuant::PerToken, 0.0f, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_FLOAT_EQ(s[1], d);
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 6), std::vector<int8_t>(6, 0));
  EXPECT_EQ(std::vector<int8_t>(q.begin() + 6, q.end()), (std::vector<int8_t>{0, 0, 0, 127, -4, 0}));

  // Per-tensor dynamic over both rows: one Δ = 1000/127 for everything.
  float st = 0;
  quantize_activations(x.data(), 2, k, ActQuant::PerTensorDynamic, 0.0f, q.data(), &st);
  EXPECT_FLOAT_EQ(st, d);
  EXPECT_EQ(q[9], 127);
  // Per-channel weights: the zero row gets Δ = 1 as well.
  std::vector<float> ws(2);
  quantize_weight_per_channel(x.data(), 2, k, q.data(), ws.data());
  EXPECT_EQ(ws[0], 1.0f);
  EXPECT_FLOAT_EQ(ws[1], d);
  // All-zero tensor per-tensor: guarded too.
  const std::vector<float> z(10, 0.0f);
  std::vector<int8_t> qz(10, 5);
  quantize_weight_per_tensor(z.data(), 2, 5, qz.data(), &st);
  EXPECT_EQ(st, 1.0f);
  EXPECT_EQ(qz, std::vector<int8_t>(10, 0));
}

TEST(Int8Quantize, VectorPathMatchesScalarOnEveryTailLength) {
  // Lengths 1..70 exercise the 16-wide main loop and every masked tail.
  for (int64_t count = 1; count <= 70; ++count) {
    auto x = normal_vector(count, static_cast<uint32_t>(count), 3.0f);
    const float step = int8_step(abs_max(x.data(), count));
    float ref_max = 0;
    for (float v : x) ref_max = std::max(ref_max, std::fabs(v));
    ASSERT_EQ(abs_max(x.data(), count), ref_max);
    std::vector<int8_t> q(static_cast<size_t>(count));
    std::vector<uint8_t> u(static_cast<size_t>(count));
    quantize_int8(x.data(), count, step, q.data());
    quantize_uint8_biased(x.data(), count, step, u.data());
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(q[i], scalar_q(x[i], step)) << "count " << count << " i " << i;
      ASSERT_EQ(int(u[i]), int(q[i]) + 128);
    }
  }
}

TEST(Int8Quantize, ErrorAtMostHalfStepPerElement) {
  // |x − Δ·q| ≤ Δ/2 for every element inside the range. The division x/Δ and the product Δ·q are
  // each rounded once in FP32 (relative 2⁻²⁴ of values up to 127Δ), hence the 2e-5·Δ slack.
  const int64_t n = 37, k = 301;
  auto x = normal_vector(n * k, 5);
  x[3 * k + 7] = 40.0f;  // an outlier row
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  std::vector<float> s(static_cast<size_t>(n)), back(static_cast<size_t>(k));
  for (ActQuant mode : {ActQuant::PerToken, ActQuant::PerTensorDynamic}) {
    quantize_activations(x.data(), n, k, mode, 0.0f, q.data(), s.data());
    for (int64_t i = 0; i < n; ++i) {
      const float step = s[mode == ActQuant::PerToken ? i : 0];
      dequantize_int8(q.data() + i * k, k, step, back.data());
      int maxq = 0;
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_LE(std::fabs(x[i * k + j] - back[j]), step * (0.5f + 2e-5f)) << to_string(mode) << " " << i << "," << j;
        maxq = std::max(maxq, std::abs(int(q[i * k + j])));
      }
      if (mode == ActQuant::PerToken) {
        EXPECT_EQ(maxq, 127) << "row absmax must map to ±127";
      }
    }
  }
  // Weights per channel: same bound per output row.
  std::vector<float> ws(static_cast<size_t>(n));
  quantize_weight_per_channel(x.data(), n, k, q.data(), ws.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) ASSERT_LE(std::fabs(x[i * k + j] - ws[i] * q[i * k + j]), ws[i] * (0.5f + 2e-5f));
}

TEST(Int8Quantize, StaticModeClampsBeyondRange) {
  // Δ = 0.01: the representable range is ±1.27; beyond it values saturate at ±127.
  const std::vector<float> x = {0.0f, 0.5f, 1.27f, 1.3f, 50.0f, -1.3f, -1e30f, 0.015f, std::numeric_limits<float>::infinity()};
  const std::vector<int8_t> want = {0, 50, 127, 127, 127, -127, -127, 2, 127};
  std::vector<int8_t> q(x.size());
  float s = 0;
  quantize_activations(x.data(), 1, static_cast<int64_t>(x.size()), ActQuant::PerTensorStatic, 0.01f, q.data(), &s);
  EXPECT_EQ(s, 0.01f);
  EXPECT_EQ(q, want);
  EXPECT_THROW(quantize_activations(x.data(), 1, 3, ActQuant::PerTensorStatic, 0.0f, q.data(), &s), std::invalid_argument);
  EXPECT_THROW(quantize_activations(x.data(), 1, 3, ActQuant::PerTensorStatic, -1.0f, q.data(), &s), std::invalid_argument);
}

TEST(Int8Quantize, DynamicModesRejectNonFinite) {
  std::vector<float> x(64, 1.0f);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int8_t> q(64);
  std::vector<float> s(4);
  EXPECT_THROW(quantize_activations(x.data(), 4, 16, ActQuant::PerToken, 0, q.data(), s.data()), std::invalid_argument);
  EXPECT_THROW(quantize_activations(x.data(), 4, 16, ActQuant::PerTensorDynamic, 0, q.data(), s.data()), std::invalid_argument);
  EXPECT_THROW(quantize_weight_per_channel(x.data(), 4, 16, q.data(), s.data()), std::invalid_argument);
  x[40] = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_weight_per_tensor(x.data(), 4, 16, q.data(), s.data()), std::invalid_argument);
}

TEST(Int8Quantize, BiasedU8LayoutPadsWithQuantizedZero) {
  const int64_t n = 3, k = 5, ld = 8;
  const auto x = normal_vector(n * k, 9);
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  std::vector<uint8_t> u(static_cast<size_t>(n * ld), 0);
  std::vector<float> s1(3), s2(3);
  quantize_activations(x.data(), n, k, ActQuant::PerToken, 0, q.data(), s1.data());
  quantize_activations_u8(x.data(), n, k, ActQuant::PerToken, 0, u.data(), ld, s2.data());
  EXPECT_EQ(s1, s2);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(int(u[i * ld + j]), int(q[i * k + j]) + 128);
    for (int64_t j = k; j < ld; ++j) EXPECT_EQ(u[i * ld + j], 128);
  }
  EXPECT_THROW(quantize_activations_u8(x.data(), n, k, ActQuant::PerToken, 0, u.data(), k - 1, s2.data()), std::invalid_argument);
}

TEST(Int8Quantize, PerTokenGroupHasOneStepPerBlockOf32) {
  // Row 0: an outlier (50) in block 1 of 3 (k = 70: blocks of 32, 32 and 6 channels); row 1 all
  // zeros. Each block's step is its own absmax / 127, so the outlier costs block 1 alone its
  // resolution, and every element is within half its block's step (Eq. 3.1 per block).
  const int64_t n = 2, k = 70, G = 3;
  EXPECT_EQ(act_groups_per_row(ActQuant::PerTokenGroup, k), G);
  EXPECT_EQ(act_scale_count(ActQuant::PerTokenGroup, n, k), n * G);
  EXPECT_EQ(act_scale_count(ActQuant::PerToken, n, k), n);
  std::vector<float> x = normal_vector(n * k, 5, 0.5f);
  x[40] = 50.0f;
  std::fill(x.begin() + k, x.end(), 0.0f);
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  std::vector<float> s(static_cast<size_t>(n * G));
  quantize_activations(x.data(), n, k, ActQuant::PerTokenGroup, 0.0f, q.data(), s.data());
  for (int64_t g = 0; g < G; ++g) {
    float m = 0.0f;
    for (int64_t t = 32 * g; t < std::min(k, 32 * g + 32); ++t) m = std::max(m, std::fabs(x[size_t(t)]));
    EXPECT_EQ(s[size_t(g)], m / 127.0f) << g;
    for (int64_t t = 32 * g; t < std::min(k, 32 * g + 32); ++t) {
      EXPECT_EQ(int(q[size_t(t)]), scalar_q(x[size_t(t)], s[size_t(g)])) << t;
      EXPECT_LE(std::fabs(x[size_t(t)] - s[size_t(g)] * q[size_t(t)]), 0.5f * s[size_t(g)] * (1 + 1e-6f)) << t;
    }
  }
  EXPECT_EQ(s[1], 50.0f / 127.0f);
  EXPECT_LT(s[0], 0.05f * s[1]);  // block 0 keeps a fine step (absmax ≈ 3σ = 1.5)
  for (int64_t g = 0; g < G; ++g) EXPECT_EQ(s[size_t(G + g)], 1.0f);  // all-zero blocks: step 1
  // The biased layout: the same codes + 128, padded with quantized zero.
  std::vector<uint8_t> u(static_cast<size_t>(n * 128), 0);
  std::vector<float> s2(s.size());
  quantize_activations_u8(x.data(), n, k, ActQuant::PerTokenGroup, 0.0f, u.data(), 128, s2.data());
  EXPECT_EQ(s2, s);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(int(u[size_t(i * 128 + j)]), int(q[size_t(i * k + j)]) + 128);
    for (int64_t j = k; j < 128; ++j) EXPECT_EQ(u[size_t(i * 128 + j)], 128);
  }
  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_activations(x.data(), n, k, ActQuant::PerTokenGroup, 0.0f, q.data(), s.data()), std::invalid_argument);
}

TEST(Int8Quantize, ThreadCountIndependent) {
  ThreadCount restore;
  const int64_t n = 1100, k = 4000;  // above the parallel threshold (4M elements)
  const auto x = normal_vector(n * k, 21);
  for (ActQuant mode : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic, ActQuant::PerTokenGroup}) {
    std::vector<int8_t> q1(static_cast<size_t>(n * k)), q2(q1.size());
    std::vector<float> s1(static_cast<size_t>(act_scale_count(mode, n, k))), s2(s1.size());
    omp_set_num_threads(1);
    quantize_activations(x.data(), n, k, mode, 0.02f, q1.data(), s1.data());
    omp_set_num_threads(2);
    quantize_activations(x.data(), n, k, mode, 0.02f, q2.data(), s2.data());
    EXPECT_EQ(q1, q2) << to_string(mode);
    EXPECT_EQ(s1, s2) << to_string(mode);
  }
}

// ------------------------------------------------------------------------------------------------
// INT8 GEMM
// ------------------------------------------------------------------------------------------------

TEST(Int8Gemm, ReferenceOnHandMadeMatrices) {
  // A = [[1, 2, 3], [−127, 127, 0]], B = [[1, 0, −1], [127, 127, 127]] (rows = output channels).
  const std::vector<int8_t> A = {1, 2, 3, -127, 127, 0}, B = {1, 0, -1, 127, 127, 127};
  std::vector<int32_t> C(4);
  int8_gemm_reference(A.data(), B.data(), C.data(), 2, 2, 3);
  EXPECT_EQ(C, (std::vector<int32_t>{-2, 6 * 127, -127, 0}));
  for (Int8Backend b : backends()) {
    std::vector<int32_t> C2(4, 99);
    int8_gemm(A.data(), B.data(), C2.data(), 2, 2, 3, b);
    EXPECT_EQ(C2, C) << to_string(b);
  }
}

TEST(Int8Gemm, EveryBackendMatchesScalarReferenceExactly) {
  const int64_t sizes[] = {1, 3, 17, 65, 257};
  for (Int8Backend b : backends()) {
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t k : sizes) {
          const auto A = random_int8(m * k, static_cast<uint32_t>(m * 7 + n * 13 + k));
          const auto B = random_int8(n * k, static_cast<uint32_t>(m + n * 3 + k * 5));
          std::vector<int32_t> want(static_cast<size_t>(m * n)), got(want.size(), -1);
          int8_gemm_reference(A.data(), B.data(), want.data(), m, n, k);
          int8_gemm(A.data(), B.data(), got.data(), m, n, k, b);
          ASSERT_EQ(got, want) << to_string(b) << " m=" << m << " n=" << n << " k=" << k;
        }
  }
}

TEST(Int8Gemm, LlamaWidthsAndPanelTails) {
  // Shapes around the VNNI kernel's 8-row × 48-column blocking, k not a multiple of 4, and a
  // decode step (m = 1) at a LLaMA width.
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 4096, 512},  {8, 48, 64},  {9, 49, 4},  {16, 96, 130},
                                                           {33, 113, 511}, {7, 4112, 7}, {130, 64, 1000}};
  for (Int8Backend b : backends())
    for (auto [m, n, k] : shapes) {
      const auto A = random_int8(m * k, 3), B = random_int8(n * k, 4);
      std::vector<int32_t> want(static_cast<size_t>(m * n)), got(want.size());
      int8_gemm_reference(A.data(), B.data(), want.data(), m, n, k);
      PackedInt8Weights w(B.data(), n, k, b);
      w.gemm_s32(A.data(), m, got.data());
      ASSERT_EQ(got, want) << to_string(b) << " m=" << m << " n=" << n << " k=" << k;
      std::vector<int8_t> back(B.size());
      w.unpack(back.data());
      ASSERT_EQ(back, B) << to_string(b);
    }
}

TEST(Int8Gemm, AmxTileBlocksAndVnniRowTailsEqualTheReference) {
  // Int8Backend::Amx: 32- and 16-row tile blocks, 32- and 16-column panel tails, a masked last
  // column group, k not a multiple of the 64-deep tile chunk (zero-padded quads), and the m mod 16
  // rows the VNNI kernel takes; through gemm_s32 and the fused dequantization.
  if (!int8_backend_available(Int8Backend::Amx)) GTEST_SKIP() << "no AMX-INT8 here (CPU, build or OS permission)";
  EXPECT_EQ(resolve_int8_backend(Int8Backend::Auto), Int8Backend::Amx);
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{16, 16, 64},  {32, 32, 128},  {48, 48, 576},  {31, 80, 100},
                                                           {17, 33, 1536}, {512, 96, 64}, {513, 576, 576}, {64, 1, 200}};
  for (auto [m, n, k] : shapes) {
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k));
    const auto A = random_int8(m * k, uint32_t(m + k)), B = random_int8(n * k, uint32_t(n + 2 * k));
    std::vector<int32_t> want(static_cast<size_t>(m * n)), got(want.size(), -1);
    int8_gemm_reference(A.data(), B.data(), want.data(), m, n, k);
    const PackedInt8Weights w(B.data(), n, k, Int8Backend::Amx);
    EXPECT_EQ(w.backend(), Int8Backend::Amx);
    w.gemm_s32(A.data(), m, got.data());
    ASSERT_EQ(got, want);
    const auto sa = normal_vector(m, 41), sb = normal_vector(n, 42);
    Int8Dequant dq;
    dq.a_scales = sa.data();
    dq.a_per_row = true;
    dq.b_scales = sb.data();
    dq.b_per_col = true;
    std::vector<float> yr(want.size()), ya(want.size(), -1.0f);
    int8_gemm_dequant_reference(A.data(), B.data(), dq, yr.data(), m, n, k);
    w.gemm_f32(A.data(), m, dq, ya.data());
    ASSERT_EQ(std::memcmp(ya.data(), yr.data(), yr.size() * 4), 0);
  }
}

TEST(Int8Gemm, ExtremeValuesDoNotOverflow) {
  // k = 11008 (LLaMA-7B down_proj) with every product ±127·127: |acc| = 177,549,952. The VNNI
  // path's u8 shift makes the intermediate sums larger still; they must come out exact.
  const int64_t m = 3, n = 20, k = 11008;
  std::vector<int8_t> A(static_cast<size_t>(m * k), -127), B(static_cast<size_t>(n * k), 127);
  for (int64_t t = 0; t < k; ++t) A[static_cast<size_t>(k + t)] = 127;  // row 1 positive
  for (Int8Backend b : backends()) {
    std::vector<int32_t> C(static_cast<size_t>(m * n));
    int8_gemm(A.data(), B.data(), C.data(), m, n, k, b);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(C[j], -127 * 127 * k) << to_string(b);
      ASSERT_EQ(C[n + j], 127 * 127 * k) << to_string(b);
    }
  }
  EXPECT_THROW(PackedInt8Weights(B.data(), 1, kInt8GemmMaxK + 1), std::invalid_argument);
}

TEST(Int8Gemm, FusedDequantIsBitIdenticalAcrossBackends) {
  const int64_t m = 19, n = 67, k = 200;
  const auto A = random_int8(m * k, 31), B = random_int8(n * k, 32);
  const auto sa = normal_vector(m, 33), sb = normal_vector(n, 34), bias = normal_vector(n, 35);
  std::vector<float> sa_pos(sa.size()), sb_pos(sb.size());
  for (size_t i = 0; i < sa.size(); ++i) sa_pos[i] = 0.01f + std::fabs(sa[i]);
  for (size_t i = 0; i < sb.size(); ++i) sb_pos[i] = 0.01f + std::fabs(sb[i]);
  for (bool per_row : {true, false})
    for (bool per_col : {true, false})
      for (bool with_bias : {true, false}) {
        Int8Dequant dq;
        dq.a_scales = sa_pos.data();
        dq.a_per_row = per_row;
        dq.b_scales = sb_pos.data();
        dq.b_per_col = per_col;
        dq.bias = with_bias ? bias.data() : nullptr;
        std::vector<float> want(static_cast<size_t>(m * n));
        int8_gemm_dequant_reference(A.data(), B.data(), dq, want.data(), m, n, k);
        // Spot-check the reference against the formula from exact integers.
        std::vector<int32_t> C(static_cast<size_t>(m * n));
        int8_gemm_reference(A.data(), B.data(), C.data(), m, n, k);
        const float s = sa_pos[per_row ? 5 : 0] * sb_pos[per_col ? 9 : 0];
        const float expect = with_bias ? std::fma(float(C[5 * n + 9]), s, bias[9]) : float(C[5 * n + 9]) * s;
        ASSERT_EQ(want[static_cast<size_t>(5 * n + 9)], expect);
        for (Int8Backend b : backends()) {
          std::vector<float> got(want.size());
          int8_gemm_dequant(A.data(), B.data(), dq, got.data(), m, n, k, b);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << to_string(b) << per_row << per_col << with_bias;
          // The biased-u8 entry point, with a row stride that is not a multiple of 4 and one that is.
          for (int64_t lda : {k + 3, k + 56}) {
            std::vector<uint8_t> Au(static_cast<size_t>(m * lda), 7);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t t = 0; t < k; ++t) Au[i * lda + t] = static_cast<uint8_t>(A[i * k + t] + 128);
            PackedInt8Weights w(B.data(), n, k, b);
            std::fill(got.begin(), got.end(), 0.0f);
            w.gemm_f32_biased(Au.data(), lda, m, dq, got.data());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << to_string(b) << " lda " << lda;
          }
        }
      }
}

/// The per-token-group product from its definition (quant/int8_gemm_grouped.h): exact INT32 sums
/// of each block of 32 inputs, then float fmas over the blocks in order, then the weight step and
/// bias. Independent of the library's code (plain loops).
std::vector<float> grouped_definition(const std::vector<int8_t>& A, const std::vector<int8_t>& B, const std::vector<float>& sa,
                                      const std::vector<float>& sb, const float* bias, int64_t m, int64_t n, int64_t k) {
  const int64_t G = (k + 31) / 32;
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        int64_t s = 0;
        for (int64_t t = 32 * g; t < std::min(k, 32 * g + 32); ++t) s += int64_t(A[i * k + t]) * B[j * k + t];
        acc = std::fma(static_cast<float>(s), sa[i * G + g], acc);
      }
      y[i * n + j] = bias ? std::fma(acc, sb[j], bias[j]) : acc * sb[j];
    }
  return y;
}

TEST(Int8Gemm, PerTokenGroupEqualsItsDefinitionOnEveryBackend) {
  // Row counts around the 4-row register block, column counts around the 48/32-column panels and
  // 16-column vectors, k with a partial last block (200 = 6·32 + 8; 31: one short block) or whole
  // ones; the s8 and both biased-u8 entry points (row stride not a multiple of 4: copied first).
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 67, 200}, {3, 48, 64}, {4, 16, 31}, {5, 100, 576}, {19, 67, 200}, {37, 33, 1000}}) {
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k));
    const int64_t G = (k + 31) / 32;
    const auto A = random_int8(m * k, uint32_t(m + k)), B = random_int8(n * k, uint32_t(n + k));
    std::vector<float> sa = normal_vector(m * G, 51), sb = normal_vector(n, 52);
    for (auto& v : sa) v = 0.001f + std::fabs(v);
    for (auto& v : sb) v = 0.001f + std::fabs(v);
    const auto bias = normal_vector(n, 53);
    for (bool with_bias : {true, false}) {
      const auto want = grouped_definition(A, B, sa, sb, with_bias ? bias.data() : nullptr, m, n, k);
      Int8Dequant dq;
      dq.a_scales = sa.data();
      dq.a_group = kActGroupSize;
      dq.b_scales = sb.data();
      dq.b_per_col = true;
      dq.bias = with_bias ? bias.data() : nullptr;
      std::vector<float> got(want.size());
      int8_gemm_dequant_reference(A.data(), B.data(), dq, got.data(), m, n, k);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "reference";
      for (Int8Backend b : backends()) {
        const PackedInt8Weights w(B.data(), n, k, b);
        std::fill(got.begin(), got.end(), 0.0f);
        w.gemm_f32(A.data(), m, dq, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << to_string(b);
        for (int64_t lda : {k + 3, round_up_64(k)}) {
          std::vector<uint8_t> Au(static_cast<size_t>(m * lda), 7);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t t = 0; t < k; ++t) Au[i * lda + t] = static_cast<uint8_t>(A[i * k + t] + 128);
          std::fill(got.begin(), got.end(), 0.0f);
          w.gemm_f32_biased(Au.data(), lda, m, dq, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << to_string(b) << " lda " << lda;
        }
      }
    }
    // One step per row repeated over its blocks: the same product as per-token steps, up to the
    // float rounding of the block-wise sum (each block sum is exact; ≤ G roundings of about 2^-24
    // relative to the running sum, bound 1e-5 of the row's largest magnitude).
    std::vector<float> sa_rows(static_cast<size_t>(m)), sa_rep(static_cast<size_t>(m * G));
    for (int64_t i = 0; i < m; ++i) {
      sa_rows[size_t(i)] = sa[size_t(i * G)];
      for (int64_t g = 0; g < G; ++g) sa_rep[size_t(i * G + g)] = sa_rows[size_t(i)];
    }
    Int8Dequant per_token{sa_rows.data(), true, sb.data(), true, nullptr}, per_group = per_token;
    per_group.a_scales = sa_rep.data();
    per_group.a_group = kActGroupSize;
    std::vector<float> yt(size_t(m * n)), yg(yt.size());
    int8_gemm_dequant(A.data(), B.data(), per_token, yt.data(), m, n, k);
    int8_gemm_dequant(A.data(), B.data(), per_group, yg.data(), m, n, k);
    for (int64_t i = 0; i < m; ++i) {
      float row_max = 0.0f;
      for (int64_t j = 0; j < n; ++j) row_max = std::max(row_max, std::fabs(yt[size_t(i * n + j)]));
      for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(yg[size_t(i * n + j)], yt[size_t(i * n + j)], 1e-5f * row_max) << i << " " << j;
    }
  }
  Int8Dequant bad;
  std::vector<float> y(4);
  const auto A = random_int8(64, 1), B = random_int8(64, 2);
  bad.a_group = 16;
  std::vector<float> s(2, 1.0f);
  bad.a_scales = s.data();
  EXPECT_THROW(int8_gemm_dequant(A.data(), B.data(), bad, y.data(), 1, 1, 64), std::invalid_argument);
  bad.a_group = 32;
  bad.a_scales = nullptr;
  EXPECT_THROW(int8_gemm_dequant(A.data(), B.data(), bad, y.data(), 1, 1, 64), std::invalid_argument);
}

TEST(Int8Gemm, ThreadCountIndependent) {
  ThreadCount restore;
  const int64_t m = 70, n = 1000, k = 1030;  // 72M multiply-adds: runs in parallel with 2 threads
  const auto A = random_int8(m * k, 41), B = random_int8(n * k, 42);
  const auto sb = normal_vector(n, 43);
  std::vector<float> sa(static_cast<size_t>(m), 0.5f);
  Int8Dequant dq{sa.data(), true, sb.data(), true, nullptr};
  for (Int8Backend b : backends()) {
    if (b == Int8Backend::Reference) continue;
    PackedInt8Weights w(B.data(), n, k, b);
    std::vector<int32_t> c1(static_cast<size_t>(m * n)), c2(c1.size());
    std::vector<float> y1(c1.size()), y2(c1.size());
    omp_set_num_threads(1);
    w.gemm_s32(A.data(), m, c1.data());
    w.gemm_f32(A.data(), m, dq, y1.data());
    omp_set_num_threads(2);
    w.gemm_s32(A.data(), m, c2.data());
    w.gemm_f32(A.data(), m, dq, y2.data());
    EXPECT_EQ(c1, c2) << to_string(b);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << to_string(b);
    // Per-token-group steps: the same independence.
    std::vector<float> sg(static_cast<size_t>(m * ((k + 31) / 32)), 0.25f);
    Int8Dequant dqg = dq;
    dqg.a_scales = sg.data();
    dqg.a_group = kActGroupSize;
    omp_set_num_threads(1);
    w.gemm_f32(A.data(), m, dqg, y1.data());
    omp_set_num_threads(2);
    w.gemm_f32(A.data(), m, dqg, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << to_string(b) << " per-token-group";
  }
}

// ------------------------------------------------------------------------------------------------
// W8A8Linear
// ------------------------------------------------------------------------------------------------

/// ‖a − b‖_F / ‖b‖_F
double rel_frobenius(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

/// Expected relative Frobenius error of y = x·Wᵀ under W8A8 quantization, from the uniform noise
/// model: rounding to a grid of step Δ adds an error uniform in [−Δ/2, Δ/2] (variance Δ²/12),
/// independent of the data and of the other operand's error. For y_j = Σ_k x_k w_jk,
///   E[(Δy_j)²] ≈ Σ_k (Δx²/12 · w_jk² + x_k² · Δw_j²/12)   (the Δx·Δw cross term is second order)
/// and E[y_j²] = Σ_k x_k² w_jk² for zero-mean independent data, so
///   rel² ≈ mean(Δx²)/12 / mean(x²) + mean(Δw²)/12 / mean(w²).
/// With Gaussian data absmax ≈ 3–4σ, so Δ ≈ 0.025–0.03σ and each term ≈ 0.7–0.9 %.
double expected_rel_error(const std::vector<float>& x, const std::vector<float>& x_steps, int64_t n, const std::vector<float>& w,
                          const std::vector<float>& w_steps, int64_t out, int64_t in) {
  auto mean_sq = [](const std::vector<float>& v) {
    double s = 0;
    for (float a : v) s += double(a) * a;
    return s / double(v.size());
  };
  double dx2 = 0, dw2 = 0;
  for (int64_t i = 0; i < n; ++i) dx2 += std::pow(double(x_steps[x_steps.size() == 1 ? 0 : i]), 2) / double(n);
  for (int64_t j = 0; j < out; ++j) dw2 += std::pow(double(w_steps[w_steps.size() == 1 ? 0 : j]), 2) / double(out);
  (void)in;
  return std::sqrt(dx2 / 12 / mean_sq(x) + dw2 / 12 / mean_sq(w));
}

TEST(W8A8Linear, MatchesDenseLinearWithinQuantizationNoise) {
  const int64_t n = 64, in = 512, out = 300;
  const auto x = normal_vector(n * in, 51, 2.0f);
  const auto wv = normal_vector(out * in, 52, 0.05f);
  const auto bv = normal_vector(out, 53);
  const Tensor W = Tensor::from_vector({out, in}, wv), b = Tensor::from_vector({out}, bv);
  const DenseLinear dense(W, b);
  std::vector<float> y_ref(static_cast<size_t>(n * out)), y(y_ref.size()), y_nobias_ref(y_ref.size());
  dense.forward(x.data(), n, y_ref.data());
  DenseLinear(W).forward(x.data(), n, y_nobias_ref.data());
  // Static Δ calibrated on this very input (as an offline calibration on representative data would).
  const float static_step = int8_step(abs_max(x.data(), n * in));

  for (WeightGranularity wg : {WeightGranularity::PerChannel, WeightGranularity::PerTensor})
    for (ActQuant aq : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic}) {
      const W8A8Linear lin(W, wg, aq, static_step, b);
      lin.forward(x.data(), n, y.data());
      // The bias is exact FP32 and adds no error, so measure on the bias-free product.
      std::vector<float> y_nb(y.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < out; ++j) y_nb[i * out + j] = y[i * out + j] - bv[j];
      std::vector<int8_t> xq(static_cast<size_t>(n * in));
      std::vector<float> xs(static_cast<size_t>(act_scale_count(aq, n, in)));
      lin.quantize_input(x.data(), n, xq.data(), xs.data());
      const double expected = expected_rel_error(x, xs, n, wv, lin.weight_scales(), out, in);
      const double err = rel_frobenius(y_nb, y_nobias_ref);
      SCOPED_TRACE(lin.format());
      std::printf("  %-36s rel. Frobenius error %.3f%% (noise model %.3f%%)\n", lin.format().c_str(), 100 * err, 100 * expected);
      EXPECT_GT(expected, 0.005);  // sanity of the model: ~1 % for this data
      EXPECT_LT(expected, 0.02);
      // The noise model is an expectation; the measurement averages n·out = 19200 squared errors
      // (each a sum of in = 512 independent rounding terms), so its statistical spread is ~1 %,
      // and the model's approximations (dropped Δx·Δw term, noise not exactly uniform near the
      // clamped absmax) are a few per cent. Measured here: within 3 % of the model. ±20 % keeps a
      // wide margin while still proving the product ran on INT8 values with the stated steps (a
      // FP32 product would give ~1e-7; a wrong scale or an off-by-one step would leave the band).
      EXPECT_LT(err, 1.2 * expected);
      EXPECT_GT(err, 0.8 * expected);
      EXPECT_LT(rel_frobenius(y, y_ref), 1.2 * expected);
    }
}

TEST(W8A8Linear, StaticModeClampsActivationsBeyondCalibratedRange) {
  // Calibrated range ±1.0 (Δ = 1/127), inputs σ = 1: about a third of the values exceed the range
  // and saturate. The layer must then equal the FP32 product of the *clipped* input (within
  // quantization noise), and differ clearly from the unclipped one.
  const int64_t n = 16, in = 256, out = 64;
  const auto x = normal_vector(n * in, 61);
  const auto wv = normal_vector(out * in, 62);
  const Tensor W = Tensor::from_vector({out, in}, wv);
  const float step = 1.0f / 127.0f;
  const W8A8Linear lin(W, WeightGranularity::PerChannel, ActQuant::PerTensorStatic, step);
  std::vector<float> y(static_cast<size_t>(n * out)), y_clip(y.size()), y_full(y.size());
  lin.forward(x.data(), n, y.data());
  std::vector<float> xc(x);
  for (float& v : xc) v = std::clamp(v, -1.0f, 1.0f);
  DenseLinear(W).forward(xc.data(), n, y_clip.data());
  DenseLinear(W).forward(x.data(), n, y_full.data());
  EXPECT_LT(rel_frobenius(y, y_clip), 0.02);
  EXPECT_GT(rel_frobenius(y, y_full), 0.1);
}

TEST(W8A8Linear, PerTokenGroupStepsConfineAnOutlierChannelToItsBlock) {
  // Activations with one outlier channel (×60, as the massive activations of LLMs' residual
  // stream): per-token steps are set by the outlier, so every other channel of the token is
  // rounded coarsely; per-token-group steps only coarsen the outlier's block of 32. By the noise
  // model of expected_rel_error, the input error variance falls by about the fraction of blocks
  // the outlier does not touch, so the output error must be well under half of per-token's; and it
  // must stay within 1.5× the model's estimate computed from the group steps themselves.
  const int64_t n = 16, in = 512, out = 64;
  auto x = normal_vector(n * in, 91);
  for (int64_t i = 0; i < n; ++i) x[size_t(i * in + 100)] *= 60.0f;
  const auto wv = normal_vector(out * in, 92, 0.05f);
  const Tensor W = Tensor::from_vector({out, in}, wv);
  std::vector<float> y_ref(static_cast<size_t>(n * out));
  DenseLinear(W).forward(x.data(), n, y_ref.data());
  double err[2];
  int idx = 0;
  for (ActQuant aq : {ActQuant::PerToken, ActQuant::PerTokenGroup}) {
    const W8A8Linear lin(W, WeightGranularity::PerChannel, aq);
    EXPECT_EQ(lin.format(), std::string("w8a8-per-channel-") + to_string(aq));
    std::vector<float> y(y_ref.size());
    lin.forward(x.data(), n, y.data());
    err[idx++] = rel_frobenius(y, y_ref);
    if (aq == ActQuant::PerTokenGroup) {
      std::vector<int8_t> xq(static_cast<size_t>(n * in));
      std::vector<float> xs(static_cast<size_t>(act_scale_count(aq, n, in)));
      lin.quantize_input(x.data(), n, xq.data(), xs.data());
      // Noise model per element: each input's error variance is its own block's Δ²/12.
      double num = 0, den = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < in; ++t) {
          const double d = xs[size_t(i * (in / 32) + t / 32)];
          num += d * d / 12.0;
          den += double(x[size_t(i * in + t)]) * x[size_t(i * in + t)];
        }
      double dw2 = 0, w2 = 0;
      for (float s : lin.weight_scales()) dw2 += double(s) * s / double(out);
      for (float v : wv) w2 += double(v) * v / double(wv.size());
      const double expected = std::sqrt(num / den + dw2 / 12 / w2);
      EXPECT_LT(err[1], 1.5 * expected);
    }
  }
  EXPECT_LT(err[1], 0.5 * err[0]) << "per-token " << err[0] << ", per-token-group " << err[1];
}

TEST(W8A8Linear, BackendsAndEntryPointsAgreeBitForBit) {
  const int64_t n = 23, in = 130, out = 77;
  const auto x = normal_vector(n * in, 71);
  const Tensor W = Tensor::from_vector({out, in}, normal_vector(out * in, 72, 0.1f));
  const Tensor b = Tensor::from_vector({out}, normal_vector(out, 73));
  for (ActQuant aq : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic, ActQuant::PerTokenGroup}) {
    std::vector<std::vector<float>> results;
    for (Int8Backend be : backends()) {
      const W8A8Linear lin(W, WeightGranularity::PerChannel, aq, 0.02f, b, be);
      EXPECT_EQ(lin.backend(), be);
      std::vector<float> y(static_cast<size_t>(n * out)), yq(y.size());
      lin.forward(x.data(), n, y.data());
      std::vector<int8_t> xq(static_cast<size_t>(n * in));
      std::vector<float> xs(static_cast<size_t>(act_scale_count(aq, n, in)));
      lin.quantize_input(x.data(), n, xq.data(), xs.data());
      lin.forward_quantized(xq.data(), xs.data(), n, yq.data());
      EXPECT_EQ(std::memcmp(y.data(), yq.data(), y.size() * 4), 0) << to_string(be);
      results.push_back(y);
    }
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(std::memcmp(results[i].data(), results[0].data(), results[0].size() * 4), 0) << to_string(aq);
  }
}

TEST(W8A8Linear, SingleTokenMatchesBatchRow) {
  // Per-token quantization makes each row independent: row 5 of a batch equals a lone m = 1 call.
  const int64_t n = 12, in = 4096, out = 200;
  const auto x = normal_vector(n * in, 81);
  const W8A8Linear lin(Tensor::from_vector({out, in}, normal_vector(out * in, 82)), WeightGranularity::PerChannel, ActQuant::PerToken);
  std::vector<float> y(static_cast<size_t>(n * out)), y1(static_cast<size_t>(out));
  lin.forward(x.data(), n, y.data());
  lin.forward(x.data() + 5 * in, 1, y1.data());
  EXPECT_EQ(std::memcmp(y1.data(), y.data() + 5 * out, y1.size() * 4), 0);
}

TEST(W8A8Linear, QuantizedConstructorAccessorsAndFormat) {
  const int64_t out = 5, in = 9;
  auto q = random_int8(out * in, 91);
  std::vector<float> s = {0.5f, 0.25f, 1.0f, 2.0f, 0.125f};
  const W8A8Linear lin(q, s, out, in, WeightGranularity::PerChannel, ActQuant::PerToken, 0.0f);
  EXPECT_EQ(lin.quantized_weight(), q);
  EXPECT_EQ(lin.weight_scales(), s);
  EXPECT_EQ(lin.in_features(), in);
  EXPECT_EQ(lin.out_features(), out);
  EXPECT_EQ(lin.format(), "w8a8-per-channel-per-token");
  EXPECT_EQ(lin.weight_bytes(), out * in + out * 4);
  const W8A8Linear lin2(q, {0.5f}, out, in, WeightGranularity::PerTensor, ActQuant::PerTensorStatic, 0.1f,
                        Tensor::from_vector({out}, std::vector<float>(5, 1.0f)));
  EXPECT_EQ(lin2.format(), "w8a8-per-tensor-per-tensor-static");
  EXPECT_EQ(lin2.weight_bytes(), out * in + 4 + out * 4);
  EXPECT_EQ(lin2.static_step(), 0.1f);
  EXPECT_EQ(W8A8Linear(q, {0.5f}, out, in, WeightGranularity::PerTensor, ActQuant::PerTensorDynamic, 0).format(),
            "w8a8-per-tensor-per-tensor-dynamic");

  // y = Δx·Δw·(xq·Wqᵀ) + b by hand for one element (static Δx = 0.1: xq ∈ {±20, ±10, 0}).
  std::vector<float> x(static_cast<size_t>(in));
  for (int64_t t = 0; t < in; ++t) x[t] = float(t % 5) - 2.0f;
  std::vector<float> y(static_cast<size_t>(out));
  lin2.forward(x.data(), 1, y.data());
  int32_t acc = 0;
  for (int64_t t = 0; t < in; ++t) acc += scalar_q(x[t], 0.1f) * q[2 * in + t];
  EXPECT_EQ(y[2], std::fma(float(acc), 0.1f * 0.5f, 1.0f));

  // Invalid inputs.
  EXPECT_THROW(W8A8Linear(q, s, out, in + 1, WeightGranularity::PerChannel, ActQuant::PerToken, 0), std::invalid_argument);
  EXPECT_THROW(W8A8Linear(q, {0.5f}, out, in, WeightGranularity::PerChannel, ActQuant::PerToken, 0), std::invalid_argument);
  EXPECT_THROW(W8A8Linear(q, s, out, in, WeightGranularity::PerChannel, ActQuant::PerTensorStatic, 0), std::invalid_argument);
  std::vector<float> bad = s;
  bad[1] = 0.0f;
  EXPECT_THROW(W8A8Linear(q, bad, out, in, WeightGranularity::PerChannel, ActQuant::PerToken, 0), std::invalid_argument);
  auto q128 = q;
  q128[3] = -128;
  EXPECT_THROW(W8A8Linear(q128, s, out, in, WeightGranularity::PerChannel, ActQuant::PerToken, 0), std::invalid_argument);
  EXPECT_THROW(W8A8Linear(q, s, out, in, WeightGranularity::PerChannel, ActQuant::PerToken, 0, Tensor::from_vector({2}, {1, 2})),
               std::invalid_argument);
  EXPECT_THROW(W8A8Linear(Tensor::from_vector({9}, std::vector<float>(9)), WeightGranularity::PerChannel, ActQuant::PerToken),
               std::invalid_argument);
}

TEST(W8A8Linear, QuantizesTheFp32WeightOnce) {
  // The FP32 constructor stores exactly quantize_weight's output.
  const int64_t out = 33, in = 70;
  const auto wv = normal_vector(out * in, 95);
  std::vector<int8_t> q(wv.size());
  std::vector<float> s(static_cast<size_t>(out));
  quantize_weight_per_channel(wv.data(), out, in, q.data(), s.data());
  const W8A8Linear lin(Tensor::from_vector({out, in}, wv), WeightGranularity::PerChannel, ActQuant::PerToken);
  EXPECT_EQ(lin.quantized_weight(), q);
  EXPECT_EQ(lin.weight_scales(), s);
}

TEST(W8A8Linear, ThreadCountIndependent) {
  ThreadCount restore;
  const int64_t n = 96, in = 1024, out = 1100;
  const auto x = normal_vector(n * in, 101);
  const Tensor W = Tensor::from_vector({out, in}, normal_vector(out * in, 102));
  for (ActQuant aq : {ActQuant::PerToken, ActQuant::PerTensorDynamic, ActQuant::PerTensorStatic}) {
    const W8A8Linear lin(W, WeightGranularity::PerChannel, aq, 0.03f);
    std::vector<float> y1(static_cast<size_t>(n * out)), y2(y1.size());
    omp_set_num_threads(1);
    lin.forward(x.data(), n, y1.data());
    omp_set_num_threads(2);
    lin.forward(x.data(), n, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << to_string(aq);
  }
}

}  // namespace
}  // namespace sq
