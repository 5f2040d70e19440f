// Atom W4A4 (issue #5): the weight container and RTN (layout, clipping), the dynamic activation
// quantizer, and the W4A4 GEMM — VNNI kernel == scalar reference bit for bit, and the scalar
// reference == the formula evaluated in double from the dequantized codes.
#include <algorithm>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "bench/timing.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "quant/int4_quantize.h"
#include "quant/w4a4_gemm.h"
#include "quant/w4a4_quantize.h"
#include "support/expect_error.h"

namespace sq {
namespace {

using bench::normal_vector;

/// Activations [m, in] ~ N(0, 1) whose last n_outlier channels are `outlier_scale` times larger.
std::vector<float> activations_with_outliers(int64_t m, int64_t in, int64_t n_outlier, float outlier_scale, uint32_t seed) {
  std::vector<float> x = normal_vector(m * in, seed);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = in - n_outlier; c < in; ++c) x[static_cast<size_t>(i * in + c)] *= outlier_scale;
  return x;
}

// ---- weights ------------------------------------------------------------------------------------

TEST(W4A4Quantize, RtnLayoutAndClippingAreExact) {
  // 2 × (64 + 3), g = 32, n_outlier = 3. Normal row 0: w[c] = c % 15 − 7, row 1: 7 − c % 15; every
  // group holds both −7 and 7, so with clip 1: Δ = 1 and q = w.
  const int64_t out = 2, inn = 64, no = 3, in = inn + no;
  std::vector<float> w(out * in);
  for (int64_t c = 0; c < inn; ++c) {
    w[c] = float(c % 15) - 7.0f;
    w[in + c] = 7.0f - float(c % 15);
  }
  const float outl[2][3] = {{100.0f, -40.0f, 0.5f}, {0.0f, 0.0f, 0.0f}};
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < no; ++c) w[r * in + inn + c] = outl[r][c];
  const W4A4Weights q = quantize_w4a4_weights(w.data(), out, in, no, 32, 1.0f);
  validate_w4a4(q);
  ASSERT_EQ(q.packed.size(), 64u);
  ASSERT_EQ(q.scales_f16.size(), 4u);
  for (uint16_t h : q.scales_f16) EXPECT_EQ(h, 0x3C00);  // FP16 1.0
  // Same bytes as the Int4Weights layout (int4_quantize.h): (−7, −6) → 0xA9, (7, −7) → 0x97.
  EXPECT_EQ(q.packed[0], 0xA9);
  EXPECT_EQ(q.packed[7], 0x97);
  EXPECT_EQ(q.packed[32 + 0], 0x67);
  EXPECT_EQ(q.packed[32 + 7], 0x79);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < inn; ++c) EXPECT_EQ(w4a4_code(q, r, c), int(w[r * in + c]));
  // Outliers: Δ = 100/127; −40/Δ = −50.8 → −51, 0.5/Δ = 0.635 → 1. All-zero row: Δ 1.
  EXPECT_FLOAT_EQ(q.outlier_scales[0], 100.0f / 127.0f);
  EXPECT_EQ(q.outlier[0], 127);
  EXPECT_EQ(q.outlier[1], -51);
  EXPECT_EQ(q.outlier[2], 1);
  EXPECT_EQ(q.outlier_scales[1], 1.0f);
  EXPECT_EQ(q.outlier[3], 0);

  // Clip 0.85 (Atom's default): Δ = fp16(0.85 · 7 / 7); 7/Δ ≈ 8.24 → clamped to 7, −7/Δ → −8,
  // 6/Δ = 7.06 → 7, 3/Δ = 3.53 → 4 (std::round).
  const W4A4Weights c = quantize_w4a4_weights(w.data(), out, in, no, 32);
  const float d = half_to_float(float_to_half(0.85f * 7.0f / 7.0f));
  EXPECT_EQ(w4a4_scale(c, 0, 0), d);
  EXPECT_EQ(w4a4_code(c, 0, 14), 7);   // w = 7
  EXPECT_EQ(w4a4_code(c, 0, 0), -8);   // w = −7
  EXPECT_EQ(w4a4_code(c, 0, 13), 7);   // w = 6
  EXPECT_EQ(w4a4_code(c, 0, 10), 4);   // w = 3
  EXPECT_EQ(w4a4_storage_bytes(c), 2 * (32 + 2 * 2 + 3 + 4));
}

TEST(W4A4Quantize, ClipOneMatchesInt4RtnAndErrorBound) {
  const int64_t out = 24, inn = 256, no = 16, in = inn + no;
  const auto w = normal_vector(out * in, 5, 0.02f);
  const W4A4Weights q = quantize_w4a4_weights(w.data(), out, in, no, 64, 1.0f);
  std::vector<float> normal(out * inn);
  for (int64_t r = 0; r < out; ++r) std::memcpy(&normal[r * inn], &w[r * in], sizeof(float) * inn);
  const Int4Weights ref = quantize_int4(normal.data(), out, inn, 64, false);
  EXPECT_TRUE(std::equal(q.packed.begin(), q.packed.end(), ref.packed.begin(), ref.packed.end()));
  EXPECT_EQ(q.scales_f16, ref.scales_f16);
  // |w − ŵ| ≤ Δ/2 (+ the FP16 rounding of Δ at the clamped ends) for INT4, Δo/2 for INT8.
  std::vector<float> deq(out * in);
  dequantize_w4a4(q, deq.data());
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < inn; ++c) {
      const float d = w4a4_scale(q, r, c / 64);
      EXPECT_LE(std::fabs(w[r * in + c] - deq[r * in + c]), d * (0.5f + 8 * 1e-3f)) << r << "," << c;
    }
    for (int64_t c = inn; c < in; ++c) EXPECT_LE(std::fabs(w[r * in + c] - deq[r * in + c]), q.outlier_scales[r] * 0.5001f);
  }
}

TEST(W4A4Quantize, FromCodesAndFromInt4AndPackedRoundTrip) {
  const int64_t out = 37, inn = 192, no = 7, in = inn + no, g = 64, ng = inn / g;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> c4(-8, 7), c8(-127, 127);
  std::vector<int8_t> codes(out * inn), oc(out * no);
  for (auto& v : codes) v = static_cast<int8_t>(c4(rng));
  for (auto& v : oc) v = static_cast<int8_t>(c8(rng));
  std::vector<float> scales(out * ng), os(out);
  for (int64_t i = 0; i < out * ng; ++i) scales[i] = half_to_float(float_to_half(0.001f * float(1 + i % 13)));
  for (int64_t r = 0; r < out; ++r) os[r] = 0.01f * float(r + 1);
  const W4A4Weights w = w4a4_weights_from_codes(out, in, no, g, codes.data(), scales.data(), oc.data(), os.data());
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < inn; ++c) ASSERT_EQ(w4a4_code(w, r, c), codes[r * inn + c]);
    for (int64_t j = 0; j < ng; ++j) ASSERT_EQ(w4a4_scale(w, r, j), scales[r * ng + j]);
  }
  EXPECT_EQ(w.outlier, oc);
  EXPECT_EQ(w.outlier_scales, os);

  Int4Weights normal;
  normal.out = out;
  normal.in = inn;
  normal.group = g;
  normal.packed.assign(w.packed.begin(), w.packed.end());
  normal.scales_f16 = w.scales_f16;
  const W4A4Weights w2 = w4a4_weights_from_int4(normal, no, oc.data(), os.data());
  EXPECT_EQ(w2.packed, w.packed);
  EXPECT_EQ(w2.scales_f16, w.scales_f16);

  for (W4A4Backend b : {W4A4Backend::Vnni, W4A4Backend::Reference}) {
    if (!w4a4_backend_available(b)) continue;
    const PackedW4A4Weights p(w, b);
    const W4A4Weights u = p.unpack();
    EXPECT_EQ(u.packed, w.packed) << to_string(b);
    EXPECT_EQ(u.scales_f16, w.scales_f16) << to_string(b);
    EXPECT_EQ(u.outlier, w.outlier) << to_string(b);
    EXPECT_EQ(u.outlier_scales, w.outlier_scales) << to_string(b);
    EXPECT_GT(p.packed_bytes(), 0);
  }
}

// ---- activations --------------------------------------------------------------------------------

TEST(W4A4Quantize, ActivationsFollowTheNaiveFormula) {
  const int64_t m = 5, no = 9, g = 64, inn = 192, in = inn + no;
  auto x = activations_with_outliers(m, in, no, 30.0f, 21);
  for (int64_t c = 64; c < 128; ++c) x[static_cast<size_t>(2 * in + c)] = 0.0f;  // an all-zero group
  const float clip = 0.9f;
  W4A4Activations a;
  quantize_w4a4_activations(x.data(), m, in, no, g, clip, a);
  ASSERT_EQ(a.ld % 64, 0);
  ASSERT_GE(a.ld, inn + no);
  const int64_t ns = inn / g + 1;
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = &x[i * in];
    for (int64_t j = 0; j <= inn / g; ++j) {
      const bool outl = j == inn / g;
      const int64_t c0 = outl ? inn : j * g, len = outl ? no : g;
      float amax = 0.0f;
      for (int64_t c = c0; c < c0 + len; ++c) amax = std::max(amax, std::fabs(xr[c]));
      const float step = amax == 0.0f ? 1.0f : outl ? amax / 127.0f : (clip * amax) / 7.0f;
      ASSERT_EQ(a.scales[i * ns + j], step) << i << "," << j;
      int32_t sum = 0;
      for (int64_t c = c0; c < c0 + len; ++c) {
        const double lim = outl ? 127 : 7, lo = outl ? -127 : -8;
        const double t = std::nearbyint(double(xr[c] / step));
        const int want = static_cast<int>(std::min(lim, std::max(lo, t)));
        ASSERT_EQ(a.q[i * a.ld + c], want) << i << "," << c;
        sum += want;
        // Inside the clipping range the rounding error is at most half a step.
        if (std::fabs(xr[c]) <= 7.0f * step) {
          EXPECT_LE(std::fabs(xr[c] - step * want), 0.5f * step * (1 + 1e-6f));
        }
      }
      EXPECT_EQ(a.sums[i * ns + j], sum);
    }
    for (int64_t c = in; c < a.ld; ++c) EXPECT_EQ(a.q[i * a.ld + c], 0);
  }
  EXPECT_EQ(a.scales[2 * ns + 1], 1.0f);  // the all-zero group
}

// ---- GEMM ---------------------------------------------------------------------------------------

struct Case {
  int64_t m, out, in, n_outlier, group;
  bool bias;
};

/// Random W4A4 weights (RTN of N(0, 0.02²), outlier columns 20× larger) for a case.
W4A4Weights random_weights(const Case& c, uint32_t seed) {
  auto w = normal_vector(c.out * c.in, seed, 0.02f);
  for (int64_t r = 0; r < c.out; ++r)
    for (int64_t k = c.in - c.n_outlier; k < c.in; ++k) w[static_cast<size_t>(r * c.in + k)] *= 20.0f;
  return quantize_w4a4_weights(w.data(), c.out, c.in, c.n_outlier, c.group);
}

const Case kCases[] = {
    {1, 16, 128, 0, 128, false},     // in_normal = g, n_outlier = 0, one token
    {7, 33, 101, 5, 32, true},       // odd m, out not a multiple of 16, odd n_outlier
    {13, 50, 209, 17, 64, false},    // out = 48 + 2: a 16-wide tail panel
    {67, 100, 384, 128, 128, true},  // Atom's n_outlier = 128
    {9, 48, 128, 0, 128, true},      // exactly one panel
    {17, 97, 161, 1, 32, false},     // single outlier channel
    {64, 200, 544, 32, 128, true},   // ≥ 4M multiply-adds: the OpenMP path
};

TEST(W4A4Gemm, VnniKernelEqualsScalarReferenceBitForBit) {
  if (!w4a4_backend_available(W4A4Backend::Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here";
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "m=" << c.m << " out=" << c.out << " in=" << c.in << " n_outlier=" << c.n_outlier
                                    << " g=" << c.group);
    const W4A4Weights w = random_weights(c, 7);
    const auto x = activations_with_outliers(c.m, c.in, c.n_outlier, 50.0f, 8);
    const auto b = normal_vector(c.out, 9);
    W4A4Activations a;
    quantize_w4a4_activations(x.data(), c.m, c.in, c.n_outlier, c.group, kW4A4ActClip, a);
    std::vector<float> ref(c.m * c.out), got(c.m * c.out, -1.0f);
    w4a4_gemm_reference(a, w, c.bias ? b.data() : nullptr, ref.data());
    const PackedW4A4Weights p(w, W4A4Backend::Vnni);
    p.gemm(a, c.bias ? b.data() : nullptr, got.data());
    int64_t mismatches = 0;
    for (size_t i = 0; i < ref.size(); ++i) mismatches += std::memcmp(&ref[i], &got[i], sizeof(float)) != 0;
    EXPECT_EQ(mismatches, 0);
    if (mismatches) {
      for (size_t i = 0; i < ref.size(); ++i)
        if (ref[i] != got[i]) {
          ADD_FAILURE() << "first mismatch at " << i << ": " << ref[i] << " vs " << got[i];
          break;
        }
    }
  }
}

TEST(W4A4Gemm, ResultsDoNotDependOnThreadCount) {
  if (!w4a4_backend_available(W4A4Backend::Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here";
  const Case c{64, 200, 544, 32, 128, true};  // 7M multiply-adds: parallel
  const W4A4Weights w = random_weights(c, 17);
  const auto x = activations_with_outliers(c.m, c.in, c.n_outlier, 50.0f, 18);
  W4A4Activations a;
  quantize_w4a4_activations(x.data(), c.m, c.in, c.n_outlier, c.group, kW4A4ActClip, a);
  const PackedW4A4Weights p(w, W4A4Backend::Vnni);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> ys;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    ys.emplace_back(c.m * c.out);
    p.gemm(a, nullptr, ys.back().data());
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * 4), 0);
  EXPECT_EQ(std::memcmp(ys[0].data(), ys[2].data(), ys[0].size() * 4), 0);
}

TEST(W4A4Gemm, ReferenceEqualsTheFormulaInDoubleFromDequantizedCodes) {
  // The reference evaluates, in FP32, y = Σ_t fma(acc_t, s_t, y) over the G + 1 terms (t = groups,
  // then outliers) with s_t = fl(Δa·Δw). acc_t is an exact integer (|acc| < 2²⁴, so float(acc) is
  // exact); fl(Δa·Δw) has relative error ≤ u = 2⁻²⁴; each fma rounds once, with error ≤ u·|partial
  // sum| ≤ u·Σ|terms|. Hence |y − y_exact| ≤ (G + 2)·u·Σ_t |Δa·Δw·acc_t| (+ u·|b| for the bias add),
  // where y_exact is computed here in double from the codes and steps (products of two FP32 values
  // and an integer are exact in double up to 2⁻⁵³, negligible).
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "m=" << c.m << " out=" << c.out << " in=" << c.in << " n_outlier=" << c.n_outlier);
    const W4A4Weights w = random_weights(c, 27);
    const auto x = activations_with_outliers(c.m, c.in, c.n_outlier, 50.0f, 28);
    const auto b = normal_vector(c.out, 29);
    W4A4Activations a;
    quantize_w4a4_activations(x.data(), c.m, c.in, c.n_outlier, c.group, kW4A4ActClip, a);
    std::vector<float> y(c.m * c.out);
    w4a4_gemm_reference(a, w, c.bias ? b.data() : nullptr, y.data());
    const int64_t inn = c.in - c.n_outlier, ng = inn / c.group, ns = ng + 1;
    // ŵ[o, k] = Δ · q in double, exact (the FP32 dequantize_w4a4 rounds Δo · q for INT8 codes).
    auto w_hat = [&](int64_t o, int64_t k) {
      return k < inn ? double(w4a4_scale(w, o, k / c.group)) * double(w4a4_code(w, o, k))
                     : double(w.outlier_scales[o]) * double(w.outlier[o * c.n_outlier + (k - inn)]);
    };
    const double u = std::ldexp(1.0, -24);
    double worst = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t o = 0; o < c.out; ++o) {
        double exact = 0, mag = 0;
        for (int64_t t = 0; t < ns; ++t) {  // exact = Σ_t s_t·acc_t, mag = Σ_t |s_t·acc_t|
          double part = 0;
          for (int64_t k = t < ng ? t * c.group : inn; k < (t < ng ? (t + 1) * c.group : c.in); ++k)
            part += double(a.q[i * a.ld + k]) * w_hat(o, k);
          exact += double(a.scales[i * ns + t]) * part;
          mag += std::fabs(double(a.scales[i * ns + t]) * part);
        }
        const double bias = c.bias ? b[o] : 0.0;
        const double bound = double(ng + 2) * u * mag + u * (std::fabs(exact) + std::fabs(bias)) + 1e-30;
        const double err = std::fabs(double(y[i * c.out + o]) - (exact + bias));
        ASSERT_LE(err, bound) << "i=" << i << " o=" << o;
        worst = std::max(worst, err / bound);
      }
    RecordProperty("worst_fraction_of_bound", std::to_string(worst));
  }
}

TEST(W4A4Gemm, EmptyBatchAndMismatchedActivations) {
  const Case c{3, 20, 160, 32, 128, false};
  const W4A4Weights w = random_weights(c, 1);
  const PackedW4A4Weights p(w);
  W4A4Activations a;
  quantize_w4a4_activations(nullptr, 0, c.in, c.n_outlier, c.group, kW4A4ActClip, a);
  p.gemm(a, nullptr, nullptr);  // m = 0: nothing to do
  const auto x = normal_vector(3 * 160, 2);
  quantize_w4a4_activations(x.data(), 3, 160, 0, 32, kW4A4ActClip, a);  // other n_outlier / g
  std::vector<float> y(3 * 20);
  test::expect_error<std::invalid_argument>([&] { p.gemm(a, nullptr, y.data()); }, {"n_outlier = 0", "n_outlier = 32"});
  test::expect_error<std::invalid_argument>([&] { w4a4_gemm_reference(a, w, nullptr, y.data()); }, {"g = 32"});
}

// ---- bad inputs ---------------------------------------------------------------------------------

TEST(W4A4Quantize, BadInputsThrow) {
  const auto w = normal_vector(4 * 256, 1);
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, 0, 48); }, {"g = 48", "in = 256"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, 10, 128); },
                                            {"g = 128", "246", "in = 256", "n_outlier = 10"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, 256, 128); }, {"n_outlier"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, -1, 128); }, {"n_outlier"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 0, 256, 0, 128); }, {"empty"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, 0, 128, 0.0f); }, {"clipping"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(w.data(), 4, 256, 0, 128, 1.5f); }, {"clipping"});
  auto bad = w;
  bad[300] = std::nanf("");
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(bad.data(), 4, 256, 0, 128); }, {"NaN"});
  bad = w;
  bad[255] = INFINITY;  // in the outlier columns
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(bad.data(), 4, 256, 128, 128); }, {"NaN or inf"});
  bad = w;
  bad[5] = 1e9f;  // Δ overflows FP16
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_weights(bad.data(), 4, 256, 0, 128); }, {"FP16"});

  // From codes.
  std::vector<int8_t> codes(2 * 64, 0), oc(2 * 4, 0);
  std::vector<float> sc(2 * 2, 0.5f), os(2, 1.0f);
  codes[70] = 8;
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()); },
                                            {"row 1", "column 6", "[-8, 7]"});
  codes[70] = -9;
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()); },
                                            {"[-8, 7]"});
  codes[70] = 0;
  sc[3] = 0.1f;  // not an FP16 value
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()); },
                                            {"row 1 group 1", "FP16"});
  sc[3] = 0.5f;
  oc[5] = -128;
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()); },
                                            {"-128", "row 1"});
  oc[5] = 0;
  os[0] = 0.0f;
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()); },
                                            {"outlier scale of row 0"});
  os[0] = 1.0f;
  EXPECT_NO_THROW(w4a4_weights_from_codes(2, 68, 4, 32, codes.data(), sc.data(), oc.data(), os.data()));

  // Inconsistent containers.
  W4A4Weights good = quantize_w4a4_weights(w.data(), 4, 256, 128, 128);
  W4A4Weights broken = good;
  broken.packed.pop_back();
  test::expect_error<std::invalid_argument>([&] { validate_w4a4(broken); }, {"packed"});
  test::expect_error<std::invalid_argument>([&] { PackedW4A4Weights p(broken); }, {"packed"});
  broken = good;
  broken.outlier_scales.push_back(1.0f);
  test::expect_error<std::invalid_argument>([&] { validate_w4a4(broken); }, {"outlier_scales"});
  broken = good;
  broken.scales_f16[0] = 0xFC00;  // −inf
  test::expect_error<std::invalid_argument>([&] { validate_w4a4(broken); }, {"row 0 group 0"});
  Int4Weights asym = quantize_int4(w.data(), 4, 128, 128, true);
  test::expect_error<std::invalid_argument>([&] { w4a4_weights_from_int4(asym, 0, nullptr, nullptr); }, {"symmetric"});

  // Activations.
  W4A4Activations a;
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_activations(w.data(), -1, 256, 0, 128, 0.9f, a); }, {"negative"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_activations(w.data(), 2, 256, 0, 100, 0.9f, a); }, {"g = 100"});
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_activations(w.data(), 2, 256, 0, 128, 0.0f, a); }, {"clipping"});
  bad = w;
  bad[400] = std::nanf("");
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_activations(bad.data(), 4, 256, 128, 128, 0.9f, a); }, {"NaN"});
  bad = w;
  bad[511] = -INFINITY;  // an outlier channel of token 1
  test::expect_error<std::invalid_argument>([&] { quantize_w4a4_activations(bad.data(), 4, 256, 128, 128, 0.9f, a); }, {"NaN"});
}

}  // namespace
}  // namespace sq
