// W4A16 (issue #5): group-wise INT4 quantization (layout, error bound, storage cost) and the
// W4A16Linear kernels (GEMV n == 1, tiled GEMM n > 1) against a dequantize-then-FP64 reference.
#include <gtest/gtest.h>

#include "bench/timing.h"
#include <omp.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "formats/safetensors.h"
#include "model/w4a16_linear.h"
#include "quant/int4_quantize.h"
#include "support/expect_error.h"
#include "support/int8_blocks.h"

namespace sq {
namespace {

using bench::normal_vector;  // N(0, sd²) from std::mt19937(seed)

/// y_ref[n, out] in FP64 from the reference dequantization (exact FP32 weights).
std::vector<double> reference(const Int4Weights& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> wd(static_cast<size_t>(w.out * w.in));
  dequantize_int4(w, wd.data());
  std::vector<double> y(static_cast<size_t>(n * w.out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < w.out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < w.in; ++k) acc += double(x[i * w.in + k]) * double(wd[o * w.in + k]);
      y[i * w.out + o] = acc;
    }
  return y;
}

// ---- packing ------------------------------------------------------------------------------------

TEST(Int4Quantize, SymmetricPackingLayoutIsExact) {
  // 2 × 64, g = 32. Row 0: w[c] = c % 15 − 7, row 1: w[c] = 7 − c % 15. Every group holds both −7
  // and 7, so Δ = 7/7 = 1 and q = w exactly.
  const int64_t out = 2, in = 64;
  std::vector<float> w(out * in);
  for (int64_t c = 0; c < in; ++c) {
    w[c] = float(c % 15) - 7.0f;
    w[in + c] = 7.0f - float(c % 15);
  }
  const Int4Weights q = quantize_int4(w.data(), out, in, 32, false);
  ASSERT_EQ(q.packed.size(), 64u);
  ASSERT_EQ(q.scales_f16.size(), 4u);
  EXPECT_TRUE(q.zeros_packed.empty());
  for (uint16_t h : q.scales_f16) EXPECT_EQ(h, 0x3C00);  // FP16 1.0
  // Hand-checked bytes: row 0 byte 0 = cols (0, 1) = (−7, −6) = (0x9, 0xA) → 0xA9 (low nibble = even
  // column); byte 7 = cols (14, 15) = (7, −7) → 0x97; row 1 byte 0 = (7, 6) → 0x67; byte 7 = (−7, 7) → 0x79.
  EXPECT_EQ(q.packed[0], 0xA9);
  EXPECT_EQ(q.packed[7], 0x97);
  EXPECT_EQ(q.packed[32 + 0], 0x67);
  EXPECT_EQ(q.packed[32 + 7], 0x79);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t b = 0; b < in / 2; ++b) {
      const int even = int(w[r * in + 2 * b]), odd = int(w[r * in + 2 * b + 1]);
      EXPECT_EQ(q.packed[r * 32 + b], uint8_t(((odd & 0xF) << 4) | (even & 0xF))) << r << "," << b;
      EXPECT_EQ(int4_code(q, r, 2 * b), even);
      EXPECT_EQ(int4_code(q, r, 2 * b + 1), odd);
    }
}

TEST(Int4Quantize, AsymmetricPackingLayoutAndFlatZeroPoints) {
  // 3 × 64. Row r: w[c] = c % 16 − 5·r  → lo = −5r, hi = 15 − 5r, Δ = 1, z = 5r, q = c % 16.
  const int64_t out = 3, in = 64;
  std::vector<float> w(out * in);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) w[r * in + c] = float(c % 16) - 5.0f * float(r);
  {
    const Int4Weights q = quantize_int4(w.data(), out, in, 64, true);
    for (int64_t r = 0; r < out; ++r) {
      EXPECT_EQ(q.packed[r * 32 + 0], 0x10);  // cols (0, 1)
      EXPECT_EQ(q.packed[r * 32 + 1], 0x32);  // cols (2, 3)
      EXPECT_EQ(q.packed[r * 32 + 7], 0xFE);  // cols (14, 15)
    }
    // zeros [3, 1] flat: 0, 5, 10 → bytes {0x50, 0x0A} (odd count: unused high nibble 0).
    ASSERT_EQ(q.zeros_packed.size(), 2u);
    EXPECT_EQ(q.zeros_packed[0], 0x50);
    EXPECT_EQ(q.zeros_packed[1], 0x0A);
    for (uint16_t h : q.scales_f16) EXPECT_EQ(h, 0x3C00);
  }
  {
    const Int4Weights q = quantize_int4(w.data(), out, in, 32, true);
    // zeros [3, 2] flat: 0, 0, 5, 5, 10, 10 → {0x00, 0x55, 0xAA}.
    ASSERT_EQ(q.zeros_packed.size(), 3u);
    EXPECT_EQ(q.zeros_packed[0], 0x00);
    EXPECT_EQ(q.zeros_packed[1], 0x55);
    EXPECT_EQ(q.zeros_packed[2], 0xAA);
    EXPECT_EQ(int4_zero(q, 2, 1), 10);
  }
}

// ---- error bound, round trip, storage cost --------------------------------------------------------

TEST(Int4Quantize, ErrorAtMostHalfStep) {
  const int64_t out = 16, in = 256;
  const auto w = normal_vector(out * in, 3, 0.02f);
  for (int64_t g : {32, 64, 128})
    for (bool asym : {false, true}) {
      const Int4Weights q = quantize_int4(w.data(), out, in, g, asym);
      std::vector<float> wd(out * in);
      dequantize_int4(q, wd.data());
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c) {
          const float d = int4_scale(q, r, c / g);
          ASSERT_GT(d, 0.0f);
          // Δ/2, plus at the clamped ends of the grid the FP16 rounding of Δ (≤ 15 steps · Δ · 2⁻¹¹).
          EXPECT_LE(std::fabs(w[r * in + c] - wd[r * in + c]), 0.5f * d + 15.0f * d * 0x1p-11f)
              << "g" << g << (asym ? " asym" : " sym") << " (" << r << "," << c << ")";
        }
    }
}

TEST(Int4Quantize, RepresentableValuesRoundTripExactly) {
  const int64_t out = 5, in = 128;
  std::mt19937 rng(7);
  for (int64_t g : {32, 128}) {
    // Symmetric: w = Δ·q with q ∈ [−7, 7], every group containing ±7 (so absmax/7 = Δ exactly).
    std::vector<float> ws(out * in), wa(out * in);
    for (int64_t r = 0; r < out; ++r)
      for (int64_t j = 0; j < in / g; ++j) {
        const float d = std::ldexp(1.0f, -int(r + j % 3) - 3);
        const int z = int(rng() % 16);
        for (int64_t k = 0; k < g; ++k) {
          const int qs = k == 0 ? 7 : k == 1 ? -7 : int(rng() % 15) - 7;
          const int qa = k == 0 ? 0 : k == 1 ? 15 : int(rng() % 16);
          ws[r * in + j * g + k] = d * float(qs);
          wa[r * in + j * g + k] = d * float(qa - z);
        }
      }
    for (bool asym : {false, true}) {
      const auto& w = asym ? wa : ws;
      const Int4Weights q = quantize_int4(w.data(), out, in, g, asym);
      std::vector<float> wd(out * in);
      dequantize_int4(q, wd.data());
      for (int64_t i = 0; i < out * in; ++i) ASSERT_EQ(wd[i], w[i]) << "g" << g << " asym=" << asym << " at " << i;
    }
  }
}

TEST(Int4Quantize, BitsPerWeightAndWeightBytes) {
  const int64_t out = 300, in = 4096;
  const auto w = normal_vector(out * in, 5, 0.02f);
  const Tensor t = Tensor::from_vector({out, in}, w);
  const W4A16Linear sym(t, 128, false), asym(t, 128, true), asym32(t, 32, true);
  EXPECT_EQ(bits_per_weight(sym.weights()), 4.125);
  EXPECT_EQ(bits_per_weight(asym.weights()), 4.15625);
  EXPECT_EQ(bits_per_weight(asym32.weights()), 4.625);
  // packed out·in/2 + FP16 scales 2·out·in/g + U4 zeros ⌈out·in/g / 2⌉.
  EXPECT_EQ(sym.weight_bytes(), 300 * 2048 + 2 * 300 * 32);
  EXPECT_EQ(sym.weight_bytes(), 633600);
  EXPECT_EQ(asym.weight_bytes(), 300 * 2048 + 2 * 300 * 32 + 300 * 32 / 2);
  EXPECT_EQ(asym32.weight_bytes(), 300 * 2048 + 2 * 300 * 128 + 300 * 128 / 2);
  EXPECT_EQ(double(sym.weight_bytes()) * 8 / double(out * in), 4.125);
  EXPECT_EQ(double(asym.weight_bytes()) * 8 / double(out * in), 4.15625);
  EXPECT_EQ(sym.format(), "w4a16-g128-sym");
  EXPECT_EQ(asym32.format(), "w4a16-g32-asym");
  EXPECT_EQ(sym.in_features(), in);
  EXPECT_EQ(sym.out_features(), out);
}

TEST(Int4Quantize, InvalidGroupSizeAndContainerThrow) {
  const Tensor t = Tensor::from_vector({4, 96}, std::vector<float>(4 * 96, 0.5f));
  const Tensor odd = Tensor::from_vector({4, 95}, std::vector<float>(4 * 95, 0.5f));
  test::expect_error<std::invalid_argument>([&] { W4A16Linear l(odd, 64); }, {"in = 95", "even"});
  test::expect_error<std::invalid_argument>([&] { W4A16Linear l(t, 16); }, {"g = 16", "32, 64 or 128"});
  const Tensor bad = Tensor::from_vector({1, 32}, std::vector<float>(32, std::numeric_limits<float>::quiet_NaN()));
  test::expect_error<std::invalid_argument>([&] { W4A16Linear l(bad, 32); }, {"NaN"});
  Int4Weights w = quantize_int4(std::vector<float>(2 * 64, 1.0f).data(), 2, 64, 32, true);
  w.zeros_packed.pop_back();
  test::expect_error<std::invalid_argument>([&] { W4A16Linear l(std::move(w)); }, {"zeros_packed"});
}

// ---- kernels vs reference -------------------------------------------------------------------------

/// Weights with power-of-two steps 2^−2..2^−4 and integer activations in [−8, 8]: every product
/// and every partial sum is a multiple of 2⁻⁴ below 2²⁰ in magnitude, so any summation order is
/// exact in FP32 and the kernels must match the reference bit for bit (catches any indexing slip).
TEST(W4A16Linear, ExactOnDyadicData) {
  std::mt19937 rng(11);
  for (bool asym : {false, true})
    for (int64_t g : {32, 64, 128})
      for (int64_t in : {128, 4096})
        for (int64_t out : {1, 7, 64, 300}) {
          if (in == 4096 && g == 64) continue;
          Int4Weights w;
          w.out = out, w.in = in, w.group = g, w.asym = asym;
          w.packed.resize(out * in / 2);
          for (size_t i = 0; i < w.packed.size(); ++i) w.packed.mutable_data()[i] = uint8_t(rng());  // every code, incl. −8 for symmetric
          w.scales_f16.resize(out * in / g);
          // symmetric steps of either sign (the scale search's full range, int4_quantize.h)
          for (auto& h : w.scales_f16) h = float_to_half((!asym && rng() % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f, -2 - int(rng() % 3)));
          if (asym) {
            w.zeros_packed.resize((out * in / g + 1) / 2);
            for (auto& b : w.zeros_packed) b = uint8_t(rng());
            if ((out * in / g) % 2) w.zeros_packed.back() &= 0x0F;
          }
          const W4A16Linear lin(w);
          for (int64_t n : {1, 3, 17, 64, 257}) {
            if (in == 4096 && out == 300 && n == 257 && g != 128) continue;  // keep the FP64 reference cheap
            std::vector<float> x(n * in);
            for (auto& v : x) v = float(int(rng() % 17) - 8);
            std::vector<float> y(n * out, -1.0f);
            lin.forward(x.data(), n, y.data());
            const auto ref = reference(w, x, n);
            for (int64_t i = 0; i < n * out; ++i)
              ASSERT_EQ(double(y[i]), ref[i]) << "asym=" << asym << " g" << g << " in " << in << " out " << out << " n " << n
                                              << " at " << i;
          }
        }
}

/// Real-valued data (RTN-quantized normal weights, normal activations). The error of any FP32
/// summation of L terms in any order is ≤ γ_L · Σ|terms| with γ_L = L·u/(1 − L·u), u = 2⁻²⁴. The
/// GEMM accumulates each output in k order (L = in); the GEMV sums Σ x·u per lane (u ≤ 15) and then
/// subtracts z·Σx (z ≤ 15) and scales by Δ — so its terms are bounded by Δ·30·|x|, with L ≤ in. The
/// tolerance uses Σ_k Δ_{o,g(k)}·31·|x_k| (covers both, and |q − z| ≤ 15) and L = in + 40 (reductions).
TEST(W4A16Linear, MatchesReferenceWithinFp32Bound) {
  for (bool asym : {false, true})
    for (int64_t in : {128, 4096})
      for (int64_t out : {1, 7, 64, 300}) {
        const int64_t g = in == 128 ? (asym ? 32 : 64) : 128;
        const auto wf = normal_vector(out * in, uint32_t(out + in), 0.02f);
        const W4A16Linear lin(Tensor::from_vector({out, in}, wf), g, asym);
        const Int4Weights& w = lin.weights();
        for (int64_t n : {1, 3, 17, 64, 257}) {
          const auto x = normal_vector(n * in, uint32_t(n));
          std::vector<float> y(n * out);
          lin.forward(x.data(), n, y.data());
          const auto ref = reference(w, x, n);
          const double L = double(in + 40), u = 0x1p-24, gamma = L * u / (1 - L * u);
          const int64_t ng = in / g;
          std::vector<double> xabs(n * ng, 0.0);  // Σ_{k ∈ group j} |x[i, k]|
          for (int64_t i = 0; i < n; ++i)
            for (int64_t k = 0; k < in; ++k) xabs[i * ng + k / g] += std::fabs(double(x[i * in + k]));
          double worst = 0;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t o = 0; o < out; ++o) {
              double s = 0;
              for (int64_t j = 0; j < ng; ++j) s += double(int4_scale(w, o, j)) * 31.0 * xabs[i * ng + j];
              const double err = std::fabs(double(y[i * out + o]) - ref[i * out + o]);
              ASSERT_LE(err, gamma * s) << "asym=" << asym << " in " << in << " out " << out << " n " << n;
              worst = std::max(worst, err / (gamma * s));
            }
          EXPECT_LT(worst, 0.05) << "errors should be far below the worst-case bound";
        }
      }
}

TEST(W4A16Linear, RaggedLastGroupMatchesReference) {
  // stories260K's widths: in = 64 < g = 128 (one 64-column group per row) and in = 172 = 128 + 44
  // (a ragged 44-column last group). The stored layout has ⌈in/g⌉ groups; the kernels run on a
  // zero-padded copy. Same FP32 error bound as above (sums of at most in + 40 terms).
  for (bool asym : {false, true})
    for (int64_t in : {64, 172, 100}) {
      const int64_t out = 37, g = in == 100 ? 32 : 128, ng = (in + g - 1) / g;
      const auto wf = normal_vector(out * in, uint32_t(in), 0.02f);
      const W4A16Linear lin(Tensor::from_vector({out, in}, wf), g, asym);
      const Int4Weights& w = lin.weights();
      EXPECT_EQ(lin.in_features(), in);
      EXPECT_EQ(w.in, in);
      EXPECT_EQ(int64_t(w.scales_f16.size()), out * ng);
      EXPECT_EQ(lin.weight_bytes(), out * in / 2 + 2 * out * ng + (asym ? (out * ng + 1) / 2 : 0));
      EXPECT_DOUBLE_EQ(bits_per_weight(w), 4.0 + (asym ? 20.0 : 16.0) * double(ng) / double(in));
      // Each group's own absmax/range sets its step: the ragged group's weights stay within Δ/2.
      std::vector<float> wd(static_cast<size_t>(out * in));
      dequantize_int4(w, wd.data());
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k)
          ASSERT_LE(std::fabs(wd[o * in + k] - wf[o * in + k]), 0.5f * int4_scale(w, o, k / g) * 1.001f) << o << "," << k;
      for (int64_t n : {1, 5, 40}) {
        const auto x = normal_vector(n * in, uint32_t(n + 7));
        std::vector<float> y(n * out);
        lin.forward(x.data(), n, y.data());
        const auto ref = reference(w, x, n);
        const double L = double(in + 40), u = 0x1p-24, gamma = L * u / (1 - L * u);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t o = 0; o < out; ++o) {
            double s = 0;
            for (int64_t k = 0; k < in; ++k) s += double(int4_scale(w, o, k / g)) * 31.0 * std::fabs(double(x[i * in + k]));
            ASSERT_LE(std::fabs(double(y[i * out + o]) - ref[i * out + o]), gamma * s) << "asym " << asym << " in " << in << " n " << n;
          }
      }
    }
}

TEST(W4A16Linear, ResultsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const int64_t out = 1100, in = 4096;  // above the parallel threshold for n = 1 (GEMV) and n > 1
  const auto wf = normal_vector(out * in, 21, 0.02f);
  for (bool asym : {false, true}) {
    const W4A16Linear lin(Tensor::from_vector({out, in}, wf), 128, asym);
    for (int64_t n : {1, 5, 64}) {
      const auto x = normal_vector(n * in, 22);
      std::vector<float> y1(n * out), y2(n * out), y3(n * out);
      omp_set_num_threads(1);
      lin.forward(x.data(), n, y1.data());
      omp_set_num_threads(2);
      lin.forward(x.data(), n, y2.data());
      omp_set_num_threads(3);
      lin.forward(x.data(), n, y3.data());
      omp_set_num_threads(saved);
      for (int64_t i = 0; i < n * out; ++i) {
        ASSERT_EQ(y1[i], y2[i]) << "n " << n << " at " << i;
        ASSERT_EQ(y1[i], y3[i]) << "n " << n << " at " << i;
      }
    }
  }
  omp_set_num_threads(saved);
}

// ---- INT8 decode activations (W4DecodeActivations::Int8) ------------------------------------------

using test::round_blocks_int8;  // the activation rounding of W4DecodeActivations::Int8, written out independently

TEST(W4A16Linear, Int8DecodeIsTheExactDotOfTheRoundedActivation) {
  // The kernel's integer dot products are exact, so y must equal, up to the FP32 rounding of the
  // per-lane scaling and the final sums, Σ_j Δ_j Σ_b s_b Σ_{k∈b∩j} (u_k − z_j)·x_q,k computed in FP64
  // from an independent rounding of the activation. Bound: γ_L · Σ_j Δ_j Σ_k s_b |u_k − z_j| |x_q,k|
  // with L = in/16 + 40 terms per lane chain (generous: each of the 16 lanes sums in/16 products).
  if (!w4_int8_decode_supported()) GTEST_SKIP() << "no AVX512-VNNI/VBMI";
  for (bool asym : {false, true})
    for (int64_t g : {32, 64, 128})
      for (int64_t in : {64, 192, 576, 1536}) {
        // 192 and 576 end in a 64-column chunk after whole 128-column ones (g ≤ 64), or are ragged
        // for g = 128 (the kernels' copy is zero-padded to whole groups)
        const int64_t out = 37, ng = (in + g - 1) / g;
        const auto wf = normal_vector(out * in, uint32_t(in + g), 0.02f);
        Int4Weights w0 = W4A16Linear(Tensor::from_vector({out, in}, wf), g, asym).weights();
        if (!asym)  // symmetric steps of either sign (the scale search's full range): negate every third
          for (size_t f = 0; f < w0.scales_f16.size(); f += 3) w0.scales_f16[f] ^= 0x8000;
        W4A16Linear lin(w0);
        lin.set_decode_activations(W4DecodeActivations::Int8);
        ASSERT_EQ(lin.decode_activations(), W4DecodeActivations::Int8);
        auto x = normal_vector(in, uint32_t(in + 1));
        x[5] = 9.0f;                 // an outlier in the first block: its other columns round coarsely
        for (int k = 64 - 32; k < 64; ++k) x[k] = 0.0f;  // an all-zero block (s = 0)
        std::vector<double> s;
        std::vector<int> q;
        round_blocks_int8(x, s, q);
        std::vector<float> y(out);
        lin.forward(x.data(), 1, y.data());
        const Int4Weights& w = lin.weights();
        const double L = double(in) / 16 + 40, u = 0x1p-24, gamma = L * u / (1 - L * u);
        for (int64_t o = 0; o < out; ++o) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < in; ++k) {
            const double d = double(int4_scale(w, o, k / g));
            const int qk = int4_code(w, o, k) - int4_zero(w, o, k / g);  // the signed 4-bit value
            ref += d * s[k / 32] * qk * q[k];
            mag += std::fabs(d) * s[k / 32] * (std::abs(qk) + 8) * std::abs(q[k]);
          }
          ASSERT_LE(std::fabs(double(y[o]) - ref), gamma * mag + 1e-30) << "asym " << asym << " g " << g << " in " << in << " row " << o;
        }
        (void)ng;
      }
}

TEST(W4A16Linear, Int8DecodeBackToFp32IsBitIdentical) {
  // in = 576 (mod 128 = 64): Int8 builds the interleaved decode copy; going back to Fp32 must leave
  // the FP32 GEMV exactly as on a layer that never had INT8 activations.
  if (!w4_int8_decode_supported()) GTEST_SKIP() << "no AVX512-VNNI/VBMI";
  const int64_t out = 45, in = 576;
  const auto wf = normal_vector(out * in, 41, 0.02f);
  W4A16Linear a(Tensor::from_vector({out, in}, wf), 64), b(Tensor::from_vector({out, in}, wf), 64);
  const auto x = normal_vector(in, 42);
  std::vector<float> ya(out), yb(out), y8(out);
  b.set_decode_activations(W4DecodeActivations::Int8);
  b.forward(x.data(), 1, y8.data());
  b.set_decode_activations(W4DecodeActivations::Fp32);
  a.forward(x.data(), 1, ya.data());
  b.forward(x.data(), 1, yb.data());
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya, y8) << "the INT8 path must have run (its rounding differs from FP32)";
}

TEST(W4A16Linear, PackedWeightsAre64ByteAligned) {
  // The GEMVs read whole 64-byte lines of packed codes; Int4Weights::packed must start on a line
  // (ops::AlignedAllocator), also for the zero-padded copy of a ragged layer.
  for (int64_t in : {576, 1536}) {
    const auto wf = normal_vector(3 * in, 3, 0.02f);
    const W4A16Linear lin(Tensor::from_vector({3, in}, wf), 128);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(lin.weights().packed.data()) % 64, 0u) << "in " << in;
  }
}

TEST(W4A16Linear, Int8DecodeStaysWithinTheActivationRoundingOfFp32) {
  // Against the FP32-activation result: rounding x to s_b·x_q moves each product by at most
  // |Ŵ[o, k]| · s_b / 2, so |y_int8 − y_fp32| ≤ Σ_k |Ŵ[o, k]| · s_b(k) / 2 (+ FP32 rounding). The
  // typical error is far below that worst case (errors of independent roundings cancel).
  if (!w4_int8_decode_supported()) GTEST_SKIP() << "no AVX512-VNNI/VBMI";
  const int64_t out = 300, in = 1536;
  const auto wf = normal_vector(out * in, 5, 0.02f);
  for (bool asym : {false, true}) {
    W4A16Linear fp(Tensor::from_vector({out, in}, wf), 128, asym), i8(Tensor::from_vector({out, in}, wf), 128, asym);
    i8.set_decode_activations(W4DecodeActivations::Int8);
    const auto x = normal_vector(in, 6);
    std::vector<float> y_fp(out), y_i8(out), wd(static_cast<size_t>(out * in));
    fp.forward(x.data(), 1, y_fp.data());
    i8.forward(x.data(), 1, y_i8.data());
    dequantize_int4(fp.weights(), wd.data());
    std::vector<double> s;
    std::vector<int> q;
    round_blocks_int8(x, s, q);
    double worst = 0;
    for (int64_t o = 0; o < out; ++o) {
      double bound = 0, mag = 0;
      for (int64_t k = 0; k < in; ++k) {
        bound += std::fabs(double(wd[o * in + k])) * s[k / 32] / 2;
        mag += std::fabs(double(wd[o * in + k]) * x[k]);
      }
      const double err = std::fabs(double(y_i8[o]) - double(y_fp[o]));
      ASSERT_LE(err, bound + 1e-5 * mag) << "asym " << asym << " row " << o;
      worst = std::max(worst, err / bound);
    }
    EXPECT_LT(worst, 0.5) << "random rounding errors should cancel far below the worst case";
    EXPECT_GT(worst, 0.0) << "INT8 activations must differ from FP32 somewhere (else the INT8 path did not run)";
  }
}

TEST(W4A16Linear, Int8DecodeKeepsFp32ForPrefillAndNarrowWidths) {
  if (!w4_int8_decode_supported()) GTEST_SKIP() << "no AVX512-VNNI/VBMI";
  const int64_t out = 20;
  // in = 96 with g = 32 is not a multiple of 64: the layer keeps FP32 activations, bit-identical.
  const auto w96 = normal_vector(out * 96, 8, 0.02f);
  W4A16Linear a(Tensor::from_vector({out, 96}, w96), 32), b(Tensor::from_vector({out, 96}, w96), 32);
  b.set_decode_activations(W4DecodeActivations::Int8);
  EXPECT_EQ(b.decode_activations(), W4DecodeActivations::Fp32);
  const auto x96 = normal_vector(96, 9);
  std::vector<float> ya(out), yb(out);
  a.forward(x96.data(), 1, ya.data());
  b.forward(x96.data(), 1, yb.data());
  EXPECT_EQ(ya, yb);
  // n > 1 (prefill) runs the FP32 GEMM whatever the setting.
  const auto w128 = normal_vector(out * 128, 10, 0.02f);
  W4A16Linear c(Tensor::from_vector({out, 128}, w128), 64), d(Tensor::from_vector({out, 128}, w128), 64);
  d.set_decode_activations(W4DecodeActivations::Int8);
  const auto x3 = normal_vector(3 * 128, 11);
  std::vector<float> yc(3 * out), yd(3 * out);
  c.forward(x3.data(), 3, yc.data());
  d.forward(x3.data(), 3, yd.data());
  EXPECT_EQ(yc, yd);
}

TEST(W4A16Linear, Batch1OfSeveralLinearsEqualsEachForward) {
  // q/k/v-like linears sharing x (in = 576, a ragged g128 layer padded to 640; one with a bias;
  // one with INT8 decode activations where supported): one parallel region, same bits as forward.
  const int64_t in = 576;
  const auto wa = normal_vector(576 * in, 31, 0.02f), wb = normal_vector(192 * in, 32, 0.02f), wc = normal_vector(200 * in, 33, 0.02f);
  const W4A16Linear a(Tensor::from_vector({576, in}, wa), 128);
  const W4A16Linear b(W4A16Linear(Tensor::from_vector({192, in}, wb), 64, true).weights(), Tensor::from_vector({192}, normal_vector(192, 34)));
  W4A16Linear c(Tensor::from_vector({200, in}, wc), 32);
  if (w4_int8_decode_supported()) c.set_decode_activations(W4DecodeActivations::Int8);
  const auto x = normal_vector(in, 35);
  std::vector<float> ya(576), yb(192), yc(200), ra(576), rb(192), rc(200);
  W4A16Linear::forward_batch1({{&a, ya.data()}, {&b, yb.data()}, {&c, yc.data()}}, x.data());
  a.forward(x.data(), 1, ra.data());
  b.forward(x.data(), 1, rb.data());
  c.forward(x.data(), 1, rc.data());
  EXPECT_EQ(ya, ra);
  EXPECT_EQ(yb, rb);
  EXPECT_EQ(yc, rc);
  const W4A16Linear d(Tensor::from_vector({4, 64}, std::vector<float>(256, 1.0f)), 32);
  test::expect_error<std::invalid_argument>([&] { W4A16Linear::forward_batch1({{&a, ya.data()}, {&d, yb.data()}}, x.data()); },
                                            {"widths differ"});
}

TEST(W4A16Linear, ZeroRowsIsANoOp) {
  const W4A16Linear lin(Tensor::from_vector({2, 32}, std::vector<float>(64, 1.0f)), 32);
  float y = 42.0f;
  lin.forward(nullptr, 0, &y);
  EXPECT_EQ(y, 42.0f);
}

}  // namespace
}  // namespace sq
