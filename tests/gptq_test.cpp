// GPTQ (Frantar et al. 2023, Algorithm 1) and its Hessians: agreement with a separately written
// OBS/OBQ update on tiny problems, reduction to RTN for diagonal Hessians, block-size invariance,
// error handling, and issue #5 acceptance 2 on every linear of stories260K (held-out output error
// of GPTQ below RTN's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "calib/gptq.h"
#include "calib/hessian.h"
#include "calib/int4_layer_quantizer.h"
#include "calib/window_sampler.h"
#include "core/error.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "ops/hadamard.h"
#include "tests/support/expect_error.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

std::vector<float> random_weights(int64_t out, int64_t in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (float& v : w) v = nd(rng);
  return w;
}

/// (2/N)·XᵀX of N random, correlated rows (x = z·M with a random mixing M), some channels scaled up.
std::vector<double> random_hessian(int64_t in, int64_t N, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> M(static_cast<size_t>(in * in)), X(static_cast<size_t>(N * in), 0.0);
  for (double& v : M) v = nd(rng);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> z(static_cast<size_t>(in));
    for (double& v : z) v = nd(rng);
    for (int64_t j = 0; j < in; ++j) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += z[size_t(k)] * M[size_t(k * in + j)];
      X[size_t(t * in + j)] = s * (j % 3 == 0 ? 3.0 : 1.0);
    }
  }
  std::vector<double> H(static_cast<size_t>(in * in), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < in; ++j) H[size_t(i * in + j)] += 2.0 * X[size_t(t * in + i)] * X[size_t(t * in + j)] / double(N);
  return H;
}

// ---- An independent reference: the OBS update of the GPTQ paper (Eq. 2), written directly ----

/// Inverse of the symmetric positive definite matrix A [n, n] by Gauss-Jordan elimination.
std::vector<double> invert(std::vector<double> A, int64_t n) {
  std::vector<double> I(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) I[size_t(i * n + i)] = 1.0;
  for (int64_t c = 0; c < n; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(A[size_t(r * n + c)]) > std::fabs(A[size_t(piv * n + c)])) piv = r;
    for (int64_t k = 0; k < n; ++k) {
      std::swap(A[size_t(c * n + k)], A[size_t(piv * n + k)]);
      std::swap(I[size_t(c * n + k)], I[size_t(piv * n + k)]);
    }
    const double p = A[size_t(c * n + c)];
    for (int64_t k = 0; k < n; ++k) {
      A[size_t(c * n + k)] /= p;
      I[size_t(c * n + k)] /= p;
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = A[size_t(r * n + c)];
      for (int64_t k = 0; k < n; ++k) {
        A[size_t(r * n + k)] -= f * A[size_t(c * n + k)];
        I[size_t(r * n + k)] -= f * I[size_t(c * n + k)];
      }
    }
  }
  return I;
}

/// The documented quantizer (gptq.h), one group of one row, in double: returns (Δ, z).
std::pair<double, int> ref_params(const std::vector<double>& w, int bits, bool sym) {
  double lo = 0, hi = 0;
  for (double v : w) lo = std::min(lo, v), hi = std::max(hi, v);
  if (sym) {
    const double a = std::max(-lo, hi);
    return {a > 0 ? a / ((1 << (bits - 1)) - 1) : 1.0, 1 << (bits - 1)};
  }
  const double d = hi > lo ? (hi - lo) / ((1 << bits) - 1) : 1.0;
  return {d, static_cast<int>(std::nearbyint(-lo / d))};
}

struct RefOut {
  std::vector<int> codes;      // [out, in], original order
  std::vector<double> deq;     // [out, in]
};

/// OBQ-style GPTQ: every row quantized in the same (possibly act-order) column order; after
/// quantizing column q, the remaining weights F get δ_F = −(w_q − ŵ_q)/[H_F⁻¹]_qq · (H_F⁻¹)_{:,q},
/// with H_F⁻¹ recomputed by a full inversion of H restricted to F (no Cholesky, no blocks).
RefOut reference_gptq(const std::vector<float>& W, int64_t out, int64_t in, std::vector<double> H, int bits, int g,
                      bool sym, double damp, bool act_order) {
  std::vector<double> Wd(W.begin(), W.end());
  for (int64_t i = 0; i < in; ++i)
    if (H[size_t(i * in + i)] == 0) {
      H[size_t(i * in + i)] = 1;
      for (int64_t r = 0; r < out; ++r) Wd[size_t(r * in + i)] = 0;
    }
  std::vector<int64_t> order(static_cast<size_t>(in));
  std::iota(order.begin(), order.end(), 0);
  if (act_order)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return H[size_t(a * in + a)] > H[size_t(b * in + b)]; });
  double md = 0;
  for (int64_t i = 0; i < in; ++i) md += H[size_t(i * in + i)];
  md /= double(in);
  for (int64_t i = 0; i < in; ++i) H[size_t(i * in + i)] += damp * md;
  if (g == 0) g = static_cast<int>(in);
  RefOut res{std::vector<int>(size_t(out * in)), std::vector<double>(size_t(out * in))};
  for (int64_t r = 0; r < out; ++r) {
    std::vector<double> w(Wd.begin() + r * in, Wd.begin() + (r + 1) * in);
    std::pair<double, int> p{1.0, 0};
    for (int64_t k = 0; k < in; ++k) {
      if (k % g == 0) {  // group parameters from the current weights of the next g columns (in order)
        std::vector<double> grp;
        for (int64_t j = k; j < std::min<int64_t>(k + g, in); ++j) grp.push_back(w[size_t(order[size_t(j)])]);
        p = ref_params(grp, bits, sym);
      }
      // F = order[k:], H_F⁻¹.
      const int64_t m = in - k;
      std::vector<double> HF(size_t(m * m));
      for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < m; ++b) HF[size_t(a * m + b)] = H[size_t(order[size_t(k + a)] * in + order[size_t(k + b)])];
      const std::vector<double> Hi = invert(HF, m);
      const int64_t q = order[size_t(k)];
      const int code = std::clamp(static_cast<int>(std::nearbyint(w[size_t(q)] / p.first)) + p.second, 0, (1 << bits) - 1);
      const double wq = p.first * (code - p.second);
      const double f = (w[size_t(q)] - wq) / Hi[0];
      for (int64_t a = 0; a < m; ++a) w[size_t(order[size_t(k + a)])] -= f * Hi[size_t(a * m)];
      res.codes[size_t(r * in + q)] = code;
      res.deq[size_t(r * in + q)] = wq;
    }
  }
  return res;
}

void expect_matches_reference(const std::vector<float>& W, int64_t out, int64_t in, const std::vector<double>& H,
                              const GptqOptions& o) {
  const GptqResult got = gptq_quantize(W.data(), out, in, H, o);
  const RefOut ref = reference_gptq(W, out, in, H, o.bits, o.group_size, o.symmetric, o.damp, o.act_order);
  for (int64_t i = 0; i < out * in; ++i) {
    EXPECT_EQ(int(got.codes[size_t(i)]), ref.codes[size_t(i)]) << "weight " << i;
    EXPECT_NEAR(got.dequantized[size_t(i)], ref.deq[size_t(i)], 1e-5 * (1 + std::fabs(ref.deq[size_t(i)])));
  }
}

TEST(Gptq, TinyProblemMatchesDirectObsUpdate) {
  // out = 1, in = 4, 2 bits: the brute-force-sized case, many random instances.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto W = random_weights(1, 4, seed);
    const auto H = random_hessian(4, 6, seed + 100);
    for (bool sym : {true, false})
      for (bool act : {false, true}) {
        GptqOptions o;
        o.bits = 2, o.group_size = 0, o.symmetric = sym, o.act_order = act, o.block_size = 2;
        expect_matches_reference(W, 1, 4, H, o);
      }
  }
}

TEST(Gptq, SmallGroupedProblemMatchesDirectObsUpdate) {
  // Groups shorter than, longer than, and straddling the blocks; a partial last group (in = 10, g = 4).
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto W = random_weights(3, 10, seed);
    auto H = random_hessian(10, 30, seed + 7);
    if (seed == 3) {  // a dead column
      for (int j = 0; j < 10; ++j) H[size_t(4 * 10 + j)] = H[size_t(j * 10 + 4)] = 0;
    }
    for (int bits : {2, 3})
      for (int g : {0, 4})
        for (int B : {1, 3, 128})
          for (bool sym : {true, false})
            for (bool act : {false, true}) {
              GptqOptions o;
              o.bits = bits, o.group_size = g, o.block_size = B, o.symmetric = sym, o.act_order = act;
              expect_matches_reference(W, 3, 10, H, o);
            }
  }
}

TEST(Gptq, DiagonalHessianReducesToRtn) {
  // With a diagonal H the Cholesky factor of H⁻¹ is diagonal: no error feedback, so GPTQ's codes are
  // exactly RTN's (same quantizer, same groups), also with act_order when the diagonal is constant.
  const int64_t out = 16, in = 72;
  const auto W = random_weights(out, in, 42);
  std::vector<double> I(size_t(in * in), 0.0), D(size_t(in * in), 0.0);
  for (int64_t i = 0; i < in; ++i) I[size_t(i * in + i)] = 1.0, D[size_t(i * in + i)] = 0.5 + double(i % 7);
  for (int bits : {2, 4, 8})
    for (int g : {0, 8, 32})  // 32 leaves a partial last group of 8
      for (bool sym : {true, false}) {
        GptqOptions o;
        o.bits = bits, o.group_size = g, o.symmetric = sym, o.block_size = 16;
        const GptqResult rtn = rtn_quantize(W.data(), out, in, o);
        for (const auto* H : {&I, &D}) {
          const GptqResult q = gptq_quantize(W.data(), out, in, *H, o);
          EXPECT_EQ(q.codes, rtn.codes) << bits << " " << g << " " << sym;
          EXPECT_EQ(q.scales, rtn.scales);
          EXPECT_EQ(q.zeros, rtn.zeros);
          EXPECT_EQ(q.dequantized, rtn.dequantized);
          EXPECT_NEAR(q.hessian_error, hessian_weighted_error(W.data(), rtn.dequantized.data(), out, in, *H), 1e-9);
        }
        o.act_order = true;
        EXPECT_EQ(gptq_quantize(W.data(), out, in, I, o).codes, rtn.codes);
      }
}

TEST(Gptq, RtnQuantizerDefinition) {
  GptqOptions o;
  o.bits = 4, o.group_size = 0;
  const std::vector<float> w = {-1.4f, 0.7f, 0.1f, 0.0f};
  const GptqResult s = rtn_quantize(w.data(), 1, 4, o);  // Δ = 1.4/7 = 0.2, z = 8
  EXPECT_FLOAT_EQ(s.scales[0], 0.2f);
  EXPECT_EQ(s.zeros[0], 8);
  EXPECT_EQ(s.codes, (std::vector<uint8_t>{1, 12, 8, 8}));  // round(0.5) = 0 (half to even)
  o.symmetric = false;                                      // Δ = 2.1/15 = 0.14, z = round(10) = 10
  const GptqResult a = rtn_quantize(w.data(), 1, 4, o);
  EXPECT_FLOAT_EQ(a.scales[0], 2.1f / 15);
  EXPECT_EQ(a.zeros[0], 10);
  EXPECT_EQ(a.codes, (std::vector<uint8_t>{0, 15, 11, 10}));
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(a.dequantized[size_t(j)], a.scales[0] * (a.codes[size_t(j)] - 10));
}

TEST(Gptq, BlockSizeDoesNotChangeTheResult) {
  const int64_t out = 24, in = 96;
  const auto W = random_weights(out, in, 5);
  const auto H = random_hessian(in, 400, 6);
  for (bool act : {false, true}) {
    GptqOptions o;
    o.group_size = 32, o.act_order = act, o.block_size = 96;
    const GptqResult ref = gptq_quantize(W.data(), out, in, H, o);
    for (int B : {1, 20, 32, 128}) {
      o.block_size = B;
      const GptqResult r = gptq_quantize(W.data(), out, in, H, o);
      int64_t differ = 0;
      for (size_t i = 0; i < r.codes.size(); ++i) differ += r.codes[i] != ref.codes[i];
      EXPECT_EQ(differ, 0) << "block size " << B << " act_order " << act;
      EXPECT_NEAR(r.hessian_error, ref.hessian_error, 1e-4 * ref.hessian_error);
    }
  }
}

TEST(Gptq, ActOrderGroupsFollowThePermutedOrder) {
  const int64_t out = 4, in = 12;
  const auto W = random_weights(out, in, 9);
  auto H = random_hessian(in, 50, 10);
  GptqOptions o;
  o.group_size = 4, o.act_order = true;
  const GptqResult r = gptq_quantize(W.data(), out, in, H, o);
  for (int64_t k = 0; k + 1 < in; ++k) EXPECT_GE(H[size_t(r.perm[k] * in + r.perm[k])], H[size_t(r.perm[k + 1] * in + r.perm[k + 1])]);
  for (int64_t k = 0; k < in; ++k) EXPECT_EQ(r.g_idx[size_t(r.perm[size_t(k)])], k / 4);
  for (int64_t row = 0; row < out; ++row)
    for (int64_t j = 0; j < in; ++j) {
      const size_t G = size_t(row * r.n_groups + r.g_idx[size_t(j)]);
      EXPECT_EQ(r.dequantized[size_t(row * in + j)], r.scales[G] * float(int(r.codes[size_t(row * in + j)]) - r.zeros[G]));
    }
}

TEST(Gptq, NonPositiveDefiniteHessianIsAnInputError) {
  // Eigenvalues of [[1, 3], [3, 1]] are 4 and −2.
  const int64_t in = 4;
  std::vector<double> H = {1, 3, 0, 0, 3, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const auto W = random_weights(2, in, 1);
  GptqOptions o;
  o.damp = 0, o.group_size = 0, o.name = "model.layers.3.mlp.down_proj";
  test::expect_error<InputError>([&] { gptq_quantize(W.data(), 2, in, H, o); },
                                 {"model.layers.3.mlp.down_proj", "not positive definite"});
  std::vector<double> N = {1, 0, 0, 0, 0, -50, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};  // large negative eigenvalue
  test::expect_error<InputError>([&] { gptq_quantize(W.data(), 2, in, N, o); }, {"not positive definite"});
  N[5] = NAN;
  test::expect_error<InputError>([&] { gptq_quantize(W.data(), 2, in, N, o); }, {"non-finite"});
  o.bits = 1;
  EXPECT_THROW(gptq_quantize(W.data(), 2, in, H, o), UsageError);
  EXPECT_THROW(rtn_quantize(W.data(), 2, in, o), UsageError);
  o.bits = 4, o.group_size = -1;
  EXPECT_THROW(rtn_quantize(W.data(), 2, in, o), UsageError);
  o.group_size = 0;
  EXPECT_THROW(gptq_quantize(W.data(), 2, in, std::vector<double>(3), o), std::invalid_argument);
}

TEST(Hessian, AccumulatesTwoXtXMeanNormalized) {
  const int64_t d = 5, n = 37;
  const auto X = random_weights(n, d, 3);
  HessianAccumulator a(d), b(d), all(d);
  a.observe(X.data(), 20);
  b.observe(X.data() + 20 * d, n - 20);
  all.observe(X.data(), n);
  a.merge(b);
  EXPECT_EQ(a.tokens(), n);
  const auto H = a.hessian(), Ha = all.hessian();
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      double s = 0, mag = 0;
      for (int64_t t = 0; t < n; ++t) {
        s += double(X[size_t(t * d + i)]) * double(X[size_t(t * d + j)]);
        mag += std::fabs(double(X[size_t(t * d + i)]) * double(X[size_t(t * d + j)]));
      }
      // FP32 block products (≤ 37 terms here) added into FP64: |error| ≤ γ₃₈ = 38·2⁻²⁴ ≈ 2.3e-6 of
      // Σ|x_i x_j| (Higham, Thm 3.1: products and sums each rounded once per term).
      EXPECT_NEAR(H[size_t(i * d + j)], 2.0 * s / double(n), 2.3e-6 * 2.0 * mag / double(n));
      EXPECT_NEAR(Ha[size_t(i * d + j)], 2.0 * s / double(n), 2.3e-6 * 2.0 * mag / double(n));
    }
  EXPECT_THROW(HessianAccumulator(3).hessian(), std::logic_error);
  EXPECT_THROW(a.merge(HessianAccumulator(4)), std::invalid_argument);
}

// transform_hessian (calib/hessian.h): the Hessian of x' = R·(x ⊘ s) computed from the Hessian of x
// equals the one accumulated from the transformed rows themselves (ops::hadamard_rows in FP32).
TEST(Hessian, TransformEqualsTheHessianOfSmoothedRotatedInputs) {
  const int64_t d = 48, n = 300, block = 16;  // 48 = 3 blocks of 16
  const auto X = random_weights(n, d, 11);
  std::vector<float> s(static_cast<size_t>(d));
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> u(0.25f, 4.0f);
  for (float& v : s) v = u(rng);
  std::vector<float> Xt = X;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < d; ++j) Xt[size_t(t * d + j)] /= s[size_t(j)];
  ops::hadamard_rows(Xt.data(), n, d, block);
  HessianAccumulator a(d), b(d);
  a.observe(X.data(), n);
  b.observe(Xt.data(), n);
  std::vector<double> H = a.hessian();
  const std::vector<double> expected = b.hessian();
  transform_hessian(H, d, s, block);
  double err = 0, scale = 0;
  for (size_t k = 0; k < H.size(); ++k) err = std::max(err, std::fabs(H[k] - expected[k])), scale = std::max(scale, std::fabs(expected[k]));
  // The direct side rounds x/s and R·x to FP32 (relative 2^-24 per value, ~log2(16) additions):
  // measured 1.2e-7 relative; 1e-5 leaves room without hiding a wrong block or a missed factor
  // (either changes entries by O(1) relative).
  EXPECT_LT(err / scale, 1e-5) << err << " of " << scale;
  // Smoothing alone and rotation alone are the same formula's two halves.
  std::vector<double> Hs = a.hessian();
  transform_hessian(Hs, d, s, 0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      EXPECT_DOUBLE_EQ(Hs[size_t(i * d + j)], a.hessian()[size_t(i * d + j)] / (double(s[size_t(i)]) * double(s[size_t(j)])));
  EXPECT_THROW(transform_hessian(H, d, std::vector<float>(5, 1.0f), 0), std::invalid_argument);
  EXPECT_THROW(transform_hessian(H, d, {}, 32), std::invalid_argument);  // 32 does not divide 48
  EXPECT_THROW(transform_hessian(H, d + 1, {}, 0), std::invalid_argument);
}

// Issue 35 item 2: GPTQ at 8 bits per channel (W8A8's weights: symmetric, Δ = absmax/127 per row)
// has a lower error on its objective, Σ_r (W−Ŵ)ᵣ·H·(W−Ŵ)ᵣᵀ, than round-to-nearest with the same
// steps, on correlated inputs with outlier channels (random_hessian).
TEST(Gptq, EightBitPerChannelBeatsRtnOnTheCalibrationObjective) {
  const int64_t out = 96, in = 128;
  const auto W = random_weights(out, in, 21);
  const auto H = random_hessian(in, 512, 22);
  GptqOptions g;
  g.bits = 8;
  g.group_size = 0;
  for (bool act_order : {false, true}) {
    g.act_order = act_order;
    const GptqResult q = gptq_quantize(W.data(), out, in, H, g);
    const GptqResult r = rtn_quantize(W.data(), out, in, g);
    const double rtn_error = hessian_weighted_error(W.data(), r.dequantized.data(), out, in, H);
    std::printf("8-bit per-channel, act_order %d: GPTQ %.4g, RTN %.4g (ratio %.3f)\n", act_order, q.hessian_error, rtn_error,
                q.hessian_error / rtn_error);
    EXPECT_LT(q.hessian_error, rtn_error * 0.9);  // measured ratio printed above; 0.9 is far from both 1 and it
    for (int64_t i = 0; i < out; ++i) {  // the steps are RTN's: absmax/127 of each row
      float absmax = 0;
      for (int64_t j = 0; j < in; ++j) absmax = std::max(absmax, std::fabs(W[size_t(i * in + j)]));
      EXPECT_FLOAT_EQ(q.scales[size_t(i)], absmax / 127.0f);
    }
  }
}

// ---- Issue #5 acceptance 2: every linear of stories260K ----

/// Keeps every linear input of the forward passes: [tokens, width] per (layer, site).
class ActivationRecorder final : public ActivationObserver {
 public:
  explicit ActivationRecorder(int n_layers) : x_(size_t(n_layers) * kActivationSites) {}
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    auto& v = at(layer, site);
    v.insert(v.end(), x, x + n * width);
  }
  std::vector<float>& at(int layer, ActivationSite site) { return x_[size_t(layer) * kActivationSites + size_t(site)]; }

 private:
  std::vector<std::vector<float>> x_;
};

/// Gram matrix XᵀX [in, in] (double) of X [N, in], computed directly.
std::vector<double> gram(const std::vector<float>& X, int64_t in) {
  const int64_t N = static_cast<int64_t>(X.size()) / in;
  std::vector<double> G(size_t(in * in), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    const float* x = X.data() + t * in;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = i; j < in; ++j) G[size_t(i * in + j)] += double(x[i]) * double(x[j]);
  }
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < i; ++j) G[size_t(i * in + j)] = G[size_t(j * in + i)];
  return G;
}

/// ‖(W − Ŵ)Xᵀ‖²_F = Σ_r δ_r (XᵀX) δ_rᵀ for W, Ŵ [out, in], δ = W − Ŵ, and G = XᵀX of the held-out X.
double output_error(const float* W, const std::vector<float>& Wq, int64_t out, int64_t in, const std::vector<double>& G) {
  double e = 0;
  std::vector<double> d(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t j = 0; j < in; ++j) d[size_t(j)] = double(W[r * in + j]) - double(Wq[size_t(r * in + j)]);
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j) s += G[size_t(i * in + j)] * d[size_t(j)];
      e += d[size_t(i)] * s;
    }
  }
  return e;
}

TEST(Gptq, BeatsRtnOnHeldOutActivationsForEveryLinearOfStories260K) {
  // Issue #5 acceptance 2. 24 windows of 256 tokens are drawn from tinystories-train-2MiB.txt;
  // windows 0-15 calibrate the Hessians, windows 16-23 are held out. Group sizes must divide `in`
  // (issue): stories260K has in = 64 (q/k/v/o/gate/up, tested with g = 32) and in = 172 (down_proj:
  // 172 = 4·43, so g = 32/64/128 are impossible; it is tested per channel (g = 0) and with g = 43).
  // Every combination of {symmetric, asymmetric} × {act_order off, on} at 4 bits, damp 0.01.
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  const ModelConfig& c = ck.config;
  auto tok = load_tokenizer(test::stories_tokenizer());
  const auto windows = sample_calibration_windows(test::shared_data("tinystories/tinystories-train-2MiB.txt"), *tok, 24, 256, 2024);
  const std::vector<std::vector<int32_t>> calib(windows.begin(), windows.begin() + 16), held(windows.begin() + 16, windows.end());
  const HessianCollector hessians = collect_hessians(model, calib);
  ActivationRecorder rec(c.n_layers);
  for (const auto& w : held) {
    KVCache cache(c, static_cast<int64_t>(w.size()));
    Workspace ws;
    model.forward(w.data(), static_cast<int64_t>(w.size()), cache, ws, nullptr, LogitsFor::None, &rec);
  }
  EXPECT_EQ(hessians.at(0, ActivationSite::AttnInput).tokens(), 16 * 256);

  std::printf("%-34s %4s %-5s %-4s %12s %12s %7s\n", "linear", "g", "quant", "act", "rtn_err", "gptq_err", "ratio");
  int compared = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (int p = 0; p < kProjections; ++p) {
      const Projection proj = static_cast<Projection>(p);
      const ActivationSite site = projection_input_site(proj);
      const std::string name = "model.layers." + std::to_string(l) + (p <= 3 ? ".self_attn." : ".mlp.") + projection_name(proj);
      const Tensor& W = ck.tensors.at(name + ".weight");
      const int64_t out = W.dim(0), in = W.dim(1);
      const std::vector<double> H = hessians.at(l, site).hessian();
      ASSERT_EQ(static_cast<int64_t>(rec.at(l, site).size()), 8 * 256 * in);
      const std::vector<double> X = gram(rec.at(l, site), in);  // held-out XᵀX
      const std::vector<int> groups = in % 32 == 0 ? std::vector<int>{32} : std::vector<int>{0, 43};
      for (int g : groups)
        for (bool sym : {true, false})
          for (bool act : {false, true}) {
            GptqOptions o;
            o.bits = 4, o.group_size = g, o.symmetric = sym, o.act_order = act, o.name = name;
            const GptqResult rtn = rtn_quantize(W.data(), out, in, o);
            const GptqResult gq = gptq_quantize(W.data(), out, in, H, o);
            const double e_rtn = output_error(W.data(), rtn.dequantized, out, in, X);
            const double e_gptq = output_error(W.data(), gq.dequantized, out, in, X);
            std::printf("%-34s %4d %-5s %-4s %12.5g %12.5g %7.4f\n", name.c_str(), g, sym ? "sym" : "asym", act ? "on" : "off",
                        e_rtn, e_gptq, e_gptq / e_rtn);
            EXPECT_LT(e_gptq, e_rtn) << name << " g" << g << (sym ? " sym" : " asym") << (act ? " act_order" : "");
            // On the calibration Hessian itself GPTQ must win as well.
            EXPECT_LT(gq.hessian_error, hessian_weighted_error(W.data(), rtn.dequantized.data(), out, in, H)) << name;
            ++compared;
          }
    }
  EXPECT_EQ(compared, c.n_layers * (6 * 4 + 2 * 4));
}

// ---- the importance-weighted scale search (gptq.h file comment, --observer mse) ---------------

/// Σ a_j (w_j − ŵ_j)² of row r, group G (columns [G·g, G·g + g)) of an RTN result.
double group_error(const std::vector<float>& W, const GptqResult& r, const std::vector<double>& a, int64_t row, int64_t G) {
  double e = 0;
  for (int64_t j = G * r.group_size; j < std::min<int64_t>(r.in, (G + 1) * r.group_size); ++j) {
    const double d = double(W[size_t(row * r.in + j)]) - double(r.dequantized[size_t(row * r.in + j)]);
    e += a[size_t(j)] * d * d;
  }
  return e;
}

/// RTN of W [out, in] at group size g with the min/max rule and with the scale search (importance
/// `a`, or uniform when `uniform`), 4 bits, FP16 steps: {min/max, searched}.
std::pair<GptqResult, GptqResult> minmax_and_searched(const std::vector<float>& W, int64_t out, int64_t in, int64_t g, bool symmetric,
                                                      const std::vector<double>& a, bool uniform) {
  GptqOptions o;
  o.bits = 4;
  o.group_size = int(g);
  o.symmetric = symmetric;
  o.fp16_scales = true;
  GptqResult minmax = rtn_quantize(W.data(), out, in, o);
  o.scale_search = true;
  if (!uniform) o.importance = &a;
  return {std::move(minmax), rtn_quantize(W.data(), out, in, o)};
}

/// An importance vector [in]: all ones, or products of two U(0, 10) draws from `rng`.
std::vector<double> draw_importance(int64_t in, bool uniform, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 10.0);
  std::vector<double> a(static_cast<size_t>(in), 1.0);
  if (!uniform)
    for (double& v : a) v = u(rng) * u(rng);
  return a;
}

TEST(ScaleSearch, NeverWorseThanMinMaxNorThanQ4_0PerGroup) {
  // The candidate set holds the min/max rule's step (absmax/7) and GGML Q4_0's (d = −m/8, m the
  // signed extreme, FP16-rounded): per (row, group) the searched error can be larger than neither,
  // for uniform and for random importance. The Q4_0 error is computed here from its definition.
  const int64_t out = 64, in = 256, g = 32;
  std::vector<float> W = random_weights(out, in, 3);
  for (int64_t j = 0; j < in; j += 7) W[size_t(5 * in + j)] *= 6.0f;  // outliers in row 5
  std::mt19937_64 rng(4);
  for (bool uniform : {true, false}) {
    const std::vector<double> a = draw_importance(in, uniform, rng);
    const auto [minmax, searched] = minmax_and_searched(W, out, in, g, true, a, uniform);
    double sum_minmax = 0, sum_searched = 0, sum_q40 = 0;
    int lowest_code = 0, negative = 0;
    for (int64_t row = 0; row < out; ++row)
      for (int64_t G = 0; G < in / g; ++G) {
        const double em = group_error(W, minmax, a, row, G), es = group_error(W, searched, a, row, G);
        float m = 0;
        for (int64_t j = G * g; j < (G + 1) * g; ++j)
          if (std::fabs(W[size_t(row * in + j)]) > std::fabs(m)) m = W[size_t(row * in + j)];
        const float d = half_to_float(float_to_half(-m / 8.0f));
        double eq = 0;
        for (int64_t j = G * g; j < (G + 1) * g; ++j) {
          const float w = W[size_t(row * in + j)];
          const float q = std::clamp(std::nearbyint(w / d), -8.0f, 7.0f);
          eq += a[size_t(j)] * double(w - d * q) * double(w - d * q);
        }
        // 1e-12 relative: the two sides are the same double sums when the same step wins
        ASSERT_LE(es, em * (1 + 1e-12)) << "row " << row << " group " << G;
        ASSERT_LE(es, eq * (1 + 1e-12)) << "row " << row << " group " << G;
        sum_minmax += em, sum_searched += es, sum_q40 += eq;
        negative += searched.scales[size_t(row * searched.n_groups + G)] < 0;
      }
    for (uint8_t c : searched.codes) lowest_code += c == 0;
    std::printf("%s importance: searched error / min-max %.3f, / Q4_0 %.3f\n", uniform ? "uniform" : "random", sum_searched / sum_minmax,
                sum_searched / sum_q40);
    // Measured here: the search's error is 0.90× Q4_0's and 0.69× min/max's (uniform importance;
    // random: 0.84×, 0.64×); the bounds leave room for other draws and still fail a search that only
    // returns one of the two rules.
    EXPECT_LT(sum_searched, 0.9 * sum_minmax) << "uniform " << uniform;
    EXPECT_LT(sum_searched, sum_q40) << "uniform " << uniform;
    EXPECT_GT(lowest_code, 0) << "the full range (code −8) is used";
    EXPECT_GT(negative, 0) << "a positive extreme takes the code −8 through a negative step";
  }
}

TEST(ScaleSearch, AsymmetricNeverWorseThanMinMaxPerGroup) {
  // Asymmetric codes u ∈ [0, 15] with an integer zero point: the candidates hold the min/max
  // range, so per (row, group) the searched error is never above min/max's, for uniform and random
  // importance; each end of the range is pulled in on its own, which a skewed group needs.
  const int64_t out = 64, in = 256, g = 32;
  std::vector<float> W = random_weights(out, in, 5);
  for (int64_t j = 0; j < in; j += 5) W[size_t(7 * in + j)] = std::fabs(W[size_t(7 * in + j)]) * 5.0f;  // row 7: skewed positive
  std::mt19937_64 rng(6);
  for (bool uniform : {true, false}) {
    const std::vector<double> a = draw_importance(in, uniform, rng);
    const auto [minmax, searched] = minmax_and_searched(W, out, in, g, false, a, uniform);
    double sum_minmax = 0, sum_searched = 0;
    for (int64_t row = 0; row < out; ++row)
      for (int64_t G = 0; G < in / g; ++G) {
        const double em = group_error(W, minmax, a, row, G), es = group_error(W, searched, a, row, G);
        ASSERT_LE(es, em * (1 + 1e-12)) << "row " << row << " group " << G;
        ASSERT_GT(searched.scales[size_t(row * searched.n_groups + G)], 0.0f);
        sum_minmax += em, sum_searched += es;
      }
    std::printf("asymmetric, %s importance: searched error / min-max %.3f\n", uniform ? "uniform" : "random", sum_searched / sum_minmax);
    // Measured here: 0.927 (uniform) and 0.836 (random): asymmetric min/max wastes no code, so the
    // gain is smaller than the symmetric search's; the bound still fails a search that returns min/max.
    EXPECT_LT(sum_searched, 0.97 * sum_minmax) << "uniform " << uniform;
  }
}

TEST(ScaleSearch, RecoversAQ4_0GridExactlyWithEitherSign) {
  // A group that is exactly on a Q4_0 grid, w = d·q for q = −8 … 7 (twice), d = ±0.5: the search
  // finds d (error 0, codes −8 … 7); the min/max rule (absmax/7) cannot represent it.
  for (float d : {0.5f, -0.5f}) {
    std::vector<float> W(32);
    for (int j = 0; j < 32; ++j) W[size_t(j)] = d * float(j % 16 - 8);
    GptqOptions o;
    o.bits = 4;
    o.group_size = 32;
    o.fp16_scales = true;
    o.scale_search = true;
    const GptqResult r = rtn_quantize(W.data(), 1, 32, o);
    EXPECT_EQ(r.scales[0], d);
    EXPECT_EQ(r.dequantized, W);
    o.scale_search = false;
    const GptqResult mm = rtn_quantize(W.data(), 1, 32, o);
    EXPECT_NE(mm.dequantized, W);
  }
}

TEST(ScaleSearch, ImportanceDecidesWhichWeightsAreServed) {
  // A group of 32 whose largest weight (1.0) is an outlier and whose other 31 weights lie in
  // [−0.7, 0.7] on a grid of 0.1. All importance on the outlier: it comes out exact (Δ = −1/8 maps it
  // to code −8 exactly). Importance on the 31 others instead: their error must fall below what the
  // outlier-serving step gives them.
  std::vector<float> W(32);
  for (int j = 0; j < 31; ++j) W[size_t(j)] = 0.1f * float(j % 15 - 7);
  W[31] = 1.0f;
  GptqOptions o;
  o.bits = 4;
  o.group_size = 32;
  o.fp16_scales = true;
  o.scale_search = true;
  const auto error_of_the_31 = [&](const GptqResult& r) {
    double e = 0;
    for (int j = 0; j < 31; ++j) e += double(W[size_t(j)] - r.dequantized[size_t(j)]) * double(W[size_t(j)] - r.dequantized[size_t(j)]);
    return e;
  };
  std::vector<double> a(32, 1e-6);
  a[31] = 1.0;
  o.importance = &a;
  const GptqResult r1 = rtn_quantize(W.data(), 1, 32, o);
  EXPECT_EQ(r1.dequantized[31], 1.0f) << "step " << r1.scales[0];
  std::vector<double> b(32, 1.0);
  b[31] = 0.0;
  o.importance = &b;
  const GptqResult r2 = rtn_quantize(W.data(), 1, 32, o);
  EXPECT_LT(error_of_the_31(r2), error_of_the_31(r1)) << "steps " << r1.scales[0] << " and " << r2.scales[0];
  EXPECT_NE(r2.dequantized[31], 1.0f);
}

TEST(ScaleSearch, BadImportanceIsAUsageError) {
  std::vector<float> W = random_weights(2, 32, 1);
  GptqOptions o;
  o.group_size = 32;
  o.scale_search = true;
  std::vector<double> a(31, 1.0);
  o.importance = &a;
  EXPECT_THROW(rtn_quantize(W.data(), 2, 32, o), UsageError);
  a.assign(32, 1.0);
  a[3] = -1.0;
  EXPECT_THROW(rtn_quantize(W.data(), 2, 32, o), UsageError);
  a[3] = 1.0;
  o.clip = 0.9f;
  EXPECT_THROW(rtn_quantize(W.data(), 2, 32, o), UsageError);
}

TEST(ScaleSearch, GptqWithTheSearchKeepsItsErrorBelowRtn) {
  // GPTQ with the searched scales (importance diag H) against RTN with the same search and the
  // same importance, on the Hessian-weighted objective GPTQ minimizes.
  const int64_t out = 48, in = 128;
  const std::vector<float> W = random_weights(out, in, 9);
  const std::vector<double> H = random_hessian(in, 512, 10);
  GptqOptions o;
  o.bits = 4;
  o.group_size = 32;
  o.fp16_scales = true;
  o.scale_search = true;
  const GptqResult g = gptq_quantize(W.data(), out, in, H, o);
  std::vector<double> diag(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) diag[size_t(i)] = H[size_t(i * in + i)];
  o.importance = &diag;
  const GptqResult r = rtn_quantize(W.data(), out, in, o);
  const double er = hessian_weighted_error(W.data(), r.dequantized.data(), out, in, H);
  EXPECT_LT(g.hessian_error, er);
  o.scale_search = false;
  o.importance = nullptr;
  const GptqResult mm = rtn_quantize(W.data(), out, in, o);
  EXPECT_LT(er, hessian_weighted_error(W.data(), mm.dequantized.data(), out, in, H));
}

TEST(Gptq, ConverterUsesDynamicGroupsWithoutActOrder) {
  // Without act-order, the converter's GPTQ takes each group's scale from the error-updated weights
  // when it reaches the group (the reference's default); static scales from the original weights
  // clip the updated ones (measured on SmolLM2-135M W4A16 g128: WikiText-2 PPL 44.2 static vs 42.9
  // dynamic, 40 chunks). Hessian: XᵀX of random inputs with one outlier channel (x30), so error
  // feedback pushes weights past their original group range and the two differ.
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const int64_t in = ck.config.dim;  // q/k/v input width 64
  std::mt19937 rng(7);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t n = 256;
  std::vector<double> X(static_cast<size_t>(n * in));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < in; ++j) X[size_t(t * in + j)] = nd(rng) * (j == 5 ? 30.0 : 1.0);
  std::vector<double> H(static_cast<size_t>(in * in), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < in; ++j) H[size_t(i * in + j)] += 2.0 * X[size_t(t * in + i)] * X[size_t(t * in + j)] / double(n);
  std::array<const std::vector<double>*, kActivationSites> hs{};
  hs[static_cast<size_t>(ActivationSite::AttnInput)] = &H;
  std::vector<double> H_o(static_cast<size_t>(in * in), 0.0), H_f(static_cast<size_t>(ck.config.hidden_dim * ck.config.hidden_dim), 0.0);
  for (int64_t i = 0; i < in; ++i) H_o[size_t(i * in + i)] = 1.0;
  for (int64_t i = 0; i < ck.config.hidden_dim; ++i) H_f[size_t(i * ck.config.hidden_dim + i)] = 1.0;
  hs[static_cast<size_t>(ActivationSite::AttnOutput)] = &H_o;
  hs[static_cast<size_t>(ActivationSite::FfnInput)] = &H;
  hs[static_cast<size_t>(ActivationSite::FfnHidden)] = &H_f;
  Int4Options o;
  o.group_size = 32;
  o.gptq = true;
  const std::vector<Int4Projection> got = quantize_layer_int4(ck, 0, o, hs);
  ASSERT_EQ(got[0].name, "model.layers.0.self_attn.q_proj");
  const Tensor& W = ck.tensors.at("model.layers.0.self_attn.q_proj.weight");
  GptqOptions g;
  g.bits = 4;
  g.group_size = 32;
  g.fp16_scales = true;
  g.scale_search = true;  // Int4Options' default observer (mse)
  g.static_groups = false;
  const Int4Weights dynamic = to_int4_weights(gptq_quantize(W.data(), W.dim(0), in, H, g), true);
  g.static_groups = true;
  const Int4Weights fixed = to_int4_weights(gptq_quantize(W.data(), W.dim(0), in, H, g), true);
  EXPECT_EQ(got[0].weights.scales_f16, dynamic.scales_f16);
  EXPECT_EQ(got[0].weights.packed, dynamic.packed);
  EXPECT_NE(got[0].weights.scales_f16, fixed.scales_f16);  // the case does tell the two apart
}

}  // namespace
}  // namespace sq
