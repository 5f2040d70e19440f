// CUDA ops (lib/cuda/cuda_ops.h) against the CPU reference (lib/ops, lib/quant, and a
// double-precision attention written from its definition). Every test skips without a device.
// Tolerances: u = 2^-24 ≈ 6e-8 is the FP32 unit roundoff; each bound is justified where it is used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/cuda_runtime.h"
#include "ops/ops.h"
#include "quant/int8_quantize.h"

namespace sq {
namespace {

#define SQ_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

constexpr double kU = 5.96e-8;  // FP32 unit roundoff 2^-24

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CudaOps, RmsNormMatchesCpu) {
  SQ_REQUIRE_CUDA();
  const int64_t n = 37;
  const int d = 288;  // not a multiple of the block size
  const auto x = uniform(size_t(n * d), -3, 3, 1), w = uniform(size_t(d), 0.5f, 1.5f, 2);
  std::vector<float> ref(x.size());
  ops::rms_norm(x.data(), w.data(), ref.data(), n, d, 1e-5f);
  DeviceArray<float> dx(x), dw(w), dy(x.size());
  cuda::rms_norm(dx.data(), dw.data(), dy.data(), n, d, 1e-5f);
  const auto got = dy.to_host();
  // The sum of d squares differs only in order: relative error ≤ γ_d ≈ d·u = 1.7e-5 per sum (worst
  // case; both sides), halved by the square root, plus 3 roundings per output: 2e-5 relative.
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-5 * std::fabs(ref[i]) + 1e-30) << i;
  // In place (y aliases x), as the CPU op allows.
  cuda::rms_norm(dx.data(), dw.data(), dx.data(), n, d, 1e-5f);
  const auto inplace = dx.to_host();
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(inplace[i], got[i]) << i;
}

TEST(CudaOps, RopeMatchesCpuBothLayoutsAndUndoesWithNegativePositions) {
  SQ_REQUIRE_CUDA();
  const int64_t n = 20;
  const int heads = 3, hd = 64;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t * 97 % 600) - 50;  // includes negatives, up to ~550
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) {
    const auto x = uniform(size_t(n * heads * hd), -1, 1, 3);
    std::vector<float> ref = x;
    ops::rope(ref.data(), pos.data(), n, heads, hd, 10000.0f, layout);
    DeviceArray<float> dx(x);
    DeviceArray<int32_t> dp(pos);
    cuda::rope(dx.data(), dp.data(), n, heads, hd, 10000.0f, layout);
    const auto got = dx.to_host();
    // Same FP32 angles on both sides (inverse frequencies computed on the host as ops::rope does);
    // CUDA cosf/sinf are within 2 ulp, glibc's within 1: each output x0·c − x1·s is off by at most
    // ~(|x0| + |x1|)·4u + 2u ≤ 2·4u + 2u = 6e-7 for |x| ≤ 1; 2e-6 leaves room for range reduction.
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-6) << rope_layout_name(layout) << " " << i;
    // Rotating by −pos undoes the rotation by pos (how pre-RoPE keys are re-rotated by a delta):
    // the angles are exact negatives, so only cos² + sin² rounding remains, ~4u per rotation.
    std::vector<int32_t> neg(pos.size());
    for (size_t t = 0; t < pos.size(); ++t) neg[t] = -pos[t];
    DeviceArray<int32_t> dn(neg);
    cuda::rope(dx.data(), dn.data(), n, heads, hd, 10000.0f, layout);
    const auto back = dx.to_host();
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(back[i], x[i], 4e-6) << i;
  }
}

TEST(CudaOps, RopeRotatesPreRopeCachedKeysOnTheFly) {
  SQ_REQUIRE_CUDA();
  // Keys cached pre-RoPE are rotated at read time with their cache positions 0 … L−1; the result
  // must equal rotating them at write time (the CPU rope at the same positions).
  const int64_t L = 300;
  const int kv_heads = 2, hd = 16;
  const auto k = uniform(size_t(L * kv_heads * hd), -2, 2, 4);
  std::vector<int32_t> pos(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) pos[size_t(t)] = int32_t(t);
  std::vector<float> ref = k;
  ops::rope(ref.data(), pos.data(), L, kv_heads, hd, 500000.0f, RopeLayout::HalfSplit);
  DeviceArray<float> dk(k);
  DeviceArray<int32_t> dp(pos);
  cuda::rope(dk.data(), dp.data(), L, kv_heads, hd, 500000.0f, RopeLayout::HalfSplit);
  const auto got = dk.to_host();
  // As above, with |x| ≤ 2: (2 + 2)·4u + 2u ≈ 1.1e-6; 4e-6 allows range reduction.
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 4e-6) << i;
}

TEST(CudaOps, SwigluAndAddMatchCpu) {
  SQ_REQUIRE_CUDA();
  const int64_t count = 10007;
  const auto g = uniform(size_t(count), -8, 8, 5), u = uniform(size_t(count), -2, 2, 6);
  std::vector<float> ref = g;
  ops::swiglu(ref.data(), u.data(), count);
  DeviceArray<float> dg(g), du(u);
  cuda::swiglu(dg.data(), du.data(), count);
  const auto got = dg.to_host();
  // exp: CPU fast_exp relative error ≤ 2e-7, CUDA expf ≤ 2 ulp (1.2e-7); the division and product
  // add 2u: ≤ 5e-7 relative in total; 1e-6 relative bound.
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-6 * std::fabs(ref[i]) + 1e-30) << i;
  // add_inplace is one IEEE addition per element on both sides: bit-identical.
  std::vector<float> sum = g;
  ops::add_inplace(sum.data(), u.data(), count);
  DeviceArray<float> ds(g);
  cuda::add_inplace(ds.data(), du.data(), count);
  EXPECT_EQ(ds.to_host(), sum);
}

TEST(CudaOps, SoftmaxRowsMatchesCpuWithCausalPrefix) {
  SQ_REQUIRE_CUDA();
  const int64_t rows = 9, cols = 700;
  const auto x = uniform(size_t(rows * cols), -10, 10, 7);
  for (int64_t visible0 : {cols, int64_t(650)}) {
    std::vector<float> ref = x;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t v = std::min(cols, visible0 + i);
      ops::softmax_row(ref.data() + i * cols, int(v));
      std::fill(ref.data() + i * cols + v, ref.data() + (i + 1) * cols, 0.0f);
    }
    DeviceArray<float> dx(x);
    cuda::softmax_rows(dx.data(), rows, cols, visible0);
    const auto got = dx.to_host();
    // Each probability is exp(s − max)/Σ: the exps differ by ≤ 3.2e-7 relative (fast_exp vs expf),
    // the sums of ≤ 700 terms by order only (≤ γ_700 ≈ 4.2e-5 worst case, ~√700·u ≈ 1.6e-6 typical).
    // 5e-5 relative is the worst-case bound; masked entries are exactly 0 on both sides.
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 5e-5 * ref[i] + 1e-30) << i;
  }
}

TEST(CudaOps, EmbeddingGatherIsExact) {
  SQ_REQUIRE_CUDA();
  const int64_t vocab = 50;
  const int dim = 24;
  const auto table = uniform(size_t(vocab * dim), -1, 1, 8);
  const std::vector<int32_t> tokens = {0, 49, 7, 7, 13, -1, 50};
  DeviceArray<float> dt(table), out(tokens.size() * dim);
  DeviceArray<int32_t> dtok(tokens);
  cuda::embedding(dt.data(), vocab, dim, dtok.data(), int64_t(tokens.size()), out.data());
  const auto got = out.to_host();
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int j = 0; j < dim; ++j) {
      const float g = got[t * dim + size_t(j)];
      if (tokens[t] < 0 || tokens[t] >= vocab) EXPECT_TRUE(std::isnan(g)) << t;  // documented: NaN row
      else EXPECT_EQ(g, table[size_t(tokens[t]) * dim + size_t(j)]) << t;
    }
}

TEST(CudaOps, LinearF32MatchesCpuWithinTheSummationBound) {
  SQ_REQUIRE_CUDA();
  const int64_t n = 33, k = 300, m = 65;
  const auto x = uniform(size_t(n * k), -1, 1, 9), W = uniform(size_t(m * k), -0.5f, 0.5f, 10), b = uniform(size_t(m), -1, 1, 11);
  for (bool bias : {false, true}) {
    DeviceArray<float> dx(x), dW(W), db(b), dy(size_t(n * m));
    cuda::linear_f32(dx.data(), n, k, dW.data(), m, bias ? db.data() : nullptr, dy.data());
    const auto got = dy.to_host();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double exact = bias ? b[size_t(j)] : 0.0, mag = bias ? std::fabs(b[size_t(j)]) : 0.0;
        for (int64_t l = 0; l < k; ++l) {
          exact += double(x[size_t(i * k + l)]) * W[size_t(j * k + l)];
          mag += std::fabs(double(x[size_t(i * k + l)]) * W[size_t(j * k + l)]);
        }
        // Any FP32 summation order is within γ_{k+1}·Σ|x·w| ≈ (k+1)·u·Σ|x·w| of the exact dot product
        // (Higham, Accuracy and Stability, Eq. 3.5), whatever blocking cuBLAS uses.
        ASSERT_NEAR(got[size_t(i * m + j)], exact, double(k + 1) * kU * mag + 1e-30) << i << "," << j;
      }
  }
}

/// Double-precision causal GQA attention from its definition (Decoder::attention's contract).
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V,
                                        int64_t n, int64_t p0, int heads, int kv_heads, int hd) {
  const int64_t qw = int64_t(heads) * hd, kvw = int64_t(kv_heads) * hd;
  std::vector<double> out(size_t(n * qw));
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      const int64_t vis = p0 + i + 1;
      std::vector<double> s(static_cast<size_t>(vis));
      double mx = -1e300;
      for (int64_t j = 0; j < vis; ++j) {
        double dot = 0;
        for (int e = 0; e < hd; ++e) dot += double(q[size_t(i * qw + h * hd + e)]) * K[size_t(j * kvw + g * hd + e)];
        s[size_t(j)] = dot / std::sqrt(double(hd));
        mx = std::max(mx, s[size_t(j)]);
      }
      double z = 0;
      for (auto& v : s) z += (v = std::exp(v - mx));
      for (int e = 0; e < hd; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < vis; ++j) acc += s[size_t(j)] * V[size_t(j * kvw + g * hd + e)];
        out[size_t(i * qw + h * hd + e)] = acc / z;
      }
    }
  return out;
}

TEST(CudaOps, AttentionPrefillAndDecodeMatchReference) {
  SQ_REQUIRE_CUDA();
  const int heads = 8, kv_heads = 2, hd = 32;
  // Prefill of 70 queries after 40 cached rows (several key tiles of 32), then a decode step.
  for (auto [n, p0] : {std::pair<int64_t, int64_t>{70, 40}, {1, 109}, {5, 0}}) {
    const int64_t L = p0 + n;
    const auto q = uniform(size_t(n * heads * hd), -1, 1, 12), K = uniform(size_t(L * kv_heads * hd), -1, 1, 13),
               V = uniform(size_t(L * kv_heads * hd), -1, 1, 14);
    DeviceArray<float> dq(q), dK(K), dV(V), dout(q.size());
    cuda::attention(dq.data(), dK.data(), dV.data(), n, p0, heads, kv_heads, hd, dout.data());
    const auto got = dout.to_host();
    const auto ref = attention_reference(q, K, V, n, p0, heads, kv_heads, hd);
    // Scores: FP32 dots of hd = 32 terms ≤ 1 each, error ≤ γ_32·32/√32 ≈ 1.1e-5 absolute, so each
    // exp(s − max) is off by ≤ 1.1e-5 + 2u relative; the online rescaling adds a few u per tile and
    // the weighted sum of |V| ≤ 1 keeps it an absolute error of the output: ≤ 3e-5.
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 3e-5) << "n " << n << " p0 " << p0 << " at " << i;
  }
}

TEST(CudaOps, PerTokenInt8QuantizationIsBitIdenticalToCpu) {
  SQ_REQUIRE_CUDA();
  const int64_t n = 17, k = 1000;
  auto x = uniform(size_t(n * k), -4, 4, 15);
  for (int64_t j = 0; j < k; ++j) x[size_t(3 * k + j)] = 0.0f;  // an all-zero row: Δ = 1
  x[size_t(5 * k + 7)] = 100.0f;                                 // an outlier token
  x[size_t(6 * k)] = 127.0f * 0.5f;                               // ties at .5 steps happen when absmax = 63.5
  x[size_t(6 * k + 1)] = 0.25f;
  std::vector<int8_t> qref(x.size());
  std::vector<float> sref(static_cast<size_t>(n));
  quantize_activations(x.data(), n, k, ActQuant::PerToken, 0.0f, qref.data(), sref.data());
  DeviceArray<float> dx(x), ds(static_cast<size_t>(n));
  DeviceArray<int8_t> dq(x.size());
  cuda::quantize_per_token_int8(dx.data(), n, k, dq.data(), ds.data());
  // absmax is exact, Δ = absmax/127 and x/Δ are single IEEE divisions, rint is round-half-even on
  // both sides: the results must be identical.
  EXPECT_EQ(ds.to_host(), sref);
  EXPECT_EQ(dq.to_host(), qref);
}

}  // namespace
}  // namespace sq
