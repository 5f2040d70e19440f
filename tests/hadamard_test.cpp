// The Walsh–Hadamard rotation (ops/hadamard.h), the linear that applies it online
// (model/hadamard_input_linear.h, with its fused W8A8 path) and the header that records it
// (formats/rotation_header.h), against the definition: (H_b)_ij = (−1)^popcount(i & j) / √b,
// block-diagonal over the row.
#include <gtest/gtest.h>

#include <bit>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "formats/rotation_header.h"
#include "model/hadamard_input_linear.h"
#include "model/linear.h"
#include "model/w8a8_linear.h"
#include "ops/hadamard.h"
#include "ops/library_threads.h"
#include "quant/int8_quantize.h"
#include "tests/support/expect_error.h"
#include "tests/support/random_values.h"

namespace sq {
namespace {

using test::normal_floats;

/// R·x in FP64 from the definition (a dense product per block).
std::vector<double> reference(const std::vector<float>& x, int64_t n, int64_t b) {
  std::vector<double> y(x.size());
  const int64_t rows = int64_t(x.size()) / n;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < n; k += b)
      for (int64_t i = 0; i < b; ++i) {
        double s = 0;
        for (int64_t j = 0; j < b; ++j) s += (std::popcount(uint64_t(i & j)) % 2 ? -1.0 : 1.0) * x[size_t(r * n + k + j)];
        y[size_t(r * n + k + i)] = s / std::sqrt(double(b));
      }
  return y;
}

/// The textbook in-place FWHT in FP32 (one butterfly per element and pass, distances 1, 2, 4, …),
/// then the scale: what the vectorized passes must reproduce bit for bit.
std::vector<float> scalar_fwht(std::vector<float> x, int64_t n, int64_t b) {
  const float scale = float(1.0 / std::sqrt(double(b)));
  for (size_t r = 0; r < x.size() / size_t(n); ++r)
    for (int64_t k = 0; k < n; k += b) {
      float* v = x.data() + r * size_t(n) + size_t(k);
      for (int64_t h = 1; h < b; h *= 2)
        for (int64_t i = 0; i < b; i += 2 * h)
          for (int64_t j = i; j < i + h; ++j) {
            const float a = v[j], c = v[j + h];
            v[j] = a + c;
            v[j + h] = a - c;
          }
      for (int64_t j = 0; j < b; ++j) v[j] *= scale;
    }
  return x;
}

TEST(Hadamard, BlockIsTheLargestPowerOfTwoDividingTheWidth) {
  EXPECT_EQ(ops::hadamard_block(576), 64);    // SmolLM2 residual: 9 × 64
  EXPECT_EQ(ops::hadamard_block(1536), 512);  // SmolLM2 FFN: 3 × 512
  EXPECT_EQ(ops::hadamard_block(640), 128);   // Gemma 3 270M residual: 5 × 128
  EXPECT_EQ(ops::hadamard_block(8960), 256);  // Qwen2.5-1.5B FFN: 35 × 256
  EXPECT_EQ(ops::hadamard_block(4096), 4096);
  EXPECT_EQ(ops::hadamard_block(7), 1);
  EXPECT_EQ(ops::hadamard_block(4096, 256), 256);
  EXPECT_THROW(ops::hadamard_block(0), std::invalid_argument);
  EXPECT_THROW(ops::hadamard_block(64, 48), std::invalid_argument);
}

TEST(Hadamard, RowsEqualTheDefinitionAndTheScalarTransformBitForBit) {
  for (const auto& [n, b] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {24, 8}, {48, 16}, {96, 32}, {192, 64}, {128, 128},
                                                                      {768, 256}, {1536, 512}, {2048, 2048}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " block " + std::to_string(b));
    const int64_t rows = 3;
    const std::vector<float> x = normal_floats(rows * n, uint32_t(n + b));
    std::vector<float> y = x;
    ops::hadamard_rows(y.data(), rows, n, b);
    EXPECT_EQ(y, scalar_fwht(x, n, b));  // vector passes: the same roundings in the same order
    const std::vector<double> ref = reference(x, n, b);
    double max_err = 0;
    for (size_t i = 0; i < y.size(); ++i) max_err = std::max(max_err, std::abs(y[i] - ref[i]));
    // Outputs are N(0,1); pass p adds partial sums of 2^p inputs (|s| ≲ 4·2^(p/2)), each rounded
    // to 2^-24 relative, and the final 1/√b scales those errors down with the sum: |error| ≲
    // 2^-24·4·Σ_p 2^(p/2)/√b·√(log2 b) ≈ 1e-6 for every b here. 1e-5 leaves a factor ≈ 20 over the
    // measured maxima (≤ 5.4e-7, printed) while a wrong sign or lane anywhere gives errors of order 1.
    EXPECT_LT(max_err, 1e-5);
    std::printf("[ n %lld block %lld ] max |error| vs FP64 definition %.2e\n", (long long)n, (long long)b, max_err);
  }
}

TEST(Hadamard, IsOrthogonalAndItsOwnInverse) {
  const int64_t n = 1536, b = 512, rows = 4;
  const std::vector<float> x = normal_floats(rows * n, 5);
  std::vector<float> y = x;
  ops::hadamard_rows(y.data(), rows, n, b);
  for (int64_t r = 0; r < rows; ++r) {
    double nx = 0, ny = 0;
    for (int64_t j = 0; j < n; ++j) {
      nx += double(x[size_t(r * n + j)]) * x[size_t(r * n + j)];
      ny += double(y[size_t(r * n + j)]) * y[size_t(r * n + j)];
    }
    EXPECT_NEAR(ny / nx, 1.0, 1e-6);  // ‖Rx‖ = ‖x‖ up to FP32 rounding of 1,536 squares
  }
  ops::hadamard_rows(y.data(), rows, n, b);  // R·R = I
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(Hadamard, ColumnsRotateEachColumnAndRowsAreThreadCountIndependent) {
  const int64_t rows = 128, cols = 5, b = 64;
  const std::vector<float> w = normal_floats(rows * cols, 9);
  std::vector<float> by_cols = w;
  ops::hadamard_columns(by_cols.data(), rows, cols, b);
  std::vector<float> t(size_t(rows * cols));  // the transpose, rotated as rows
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = w[size_t(r * cols + c)];
  ops::hadamard_rows(t.data(), cols, rows, b);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(by_cols[size_t(r * cols + c)], t[size_t(c * rows + r)]);

  const std::vector<float> x = normal_floats(256 * 576, 11);  // above the parallel threshold
  std::vector<float> one = x;
  {
    ops::ScopedOmpThreads t1(1);
    ops::hadamard_rows(one.data(), 256, 576, 64);
  }
  for (int threads : {1, 2, 3}) {
    ops::ScopedOmpThreads tn(threads);
    std::vector<float> y = x;
    ops::hadamard_rows(y.data(), 256, 576, 64);
    EXPECT_EQ(y, one) << threads << " threads";
    std::vector<float> z(x.size());  // out of place: the same bits, the input untouched
    const std::vector<float> x_copy = x;
    ops::hadamard_rows(x.data(), z.data(), 256, 576, 64);
    EXPECT_EQ(z, one) << threads << " threads, out of place";
    EXPECT_EQ(x, x_copy);
  }
}

TEST(Hadamard, RefusesABlockThatIsNotAPowerOfTwoDividingTheWidth) {
  std::vector<float> x(96);
  EXPECT_THROW(ops::hadamard_rows(x.data(), 1, 96, 64), std::invalid_argument);  // 64 does not divide 96
  EXPECT_THROW(ops::hadamard_rows(x.data(), 1, 96, 12), std::invalid_argument);
  EXPECT_THROW(ops::hadamard_columns(x.data(), 96, 1, 64), std::invalid_argument);
}

TEST(HadamardInputLinear, RotatingTheInputUndoesTheFoldedWeight) {
  const int64_t out = 40, in = 192, b = 64;
  const std::vector<float> w = normal_floats(out * in, 21), x = normal_floats(7 * in, 22);
  std::vector<float> wr = w;  // W·R: every row rotated
  ops::hadamard_rows(wr.data(), out, in, b);
  const DenseLinear plain(Tensor::from_vector({out, in}, w));
  const HadamardInputLinear rotated(std::make_unique<DenseLinear>(Tensor::from_vector({out, in}, wr)), b);
  EXPECT_EQ(rotated.in_features(), in);
  EXPECT_EQ(rotated.out_features(), out);
  EXPECT_EQ(rotated.format(), "f32+hadamard64");
  for (int64_t n : {int64_t(1), int64_t(7)}) {
    std::vector<float> y0(size_t(n * out)), y1(size_t(n * out));
    plain.forward(x.data(), n, y0.data());
    rotated.forward(x.data(), n, y1.data());
    // Dot products of 192 N(0,1)·N(0,1) terms (|y| ≲ 40) after two FP32 rotations: 1e-4 absolute.
    for (size_t i = 0; i < y0.size(); ++i) EXPECT_NEAR(y1[i], y0[i], 1e-4) << "n " << n << " i " << i;
  }
  EXPECT_THROW(HadamardInputLinear(std::make_unique<DenseLinear>(Tensor::from_vector({out, in}, wr)), 128), std::invalid_argument);
  EXPECT_THROW(HadamardInputLinear(nullptr, 64), std::invalid_argument);
}

TEST(HadamardInputLinear, W8A8RotatesWhileQuantizingWithTheSameBits) {
  // The fused path (quantize_activations_u8_hadamard: each row rotated in a per-thread buffer and
  // quantized from there) against the two-step definition: ops::hadamard_rows, then per-token
  // quantize_activations_u8, per token and per token group. Widths with blocks 64 (SmolLM2's 576)
  // and 512 (its 1536), a row with one huge channel (what the rotation exists for), every row count
  // around the thread split.
  for (const ActQuant aq : {ActQuant::PerToken, ActQuant::PerTokenGroup})
  for (const auto& [in, b] : std::vector<std::pair<int64_t, int64_t>>{{576, 64}, {1536, 512}, {96, 32}}) {
    for (int64_t n : {int64_t(1), int64_t(5), int64_t(300)}) {
      SCOPED_TRACE(std::string(to_string(aq)) + " in " + std::to_string(in) + " block " + std::to_string(b) + " rows " + std::to_string(n));
      std::vector<float> x = normal_floats(n * in, uint32_t(in + n));
      x[size_t(in / 3)] = 400.0f;  // row 0: one outlier channel
      const int64_t ld = in + 64;
      std::vector<float> rotated(x.size());
      ops::hadamard_rows(x.data(), rotated.data(), n, in, b);
      std::vector<uint8_t> want(size_t(n * ld)), got(size_t(n * ld), 7);
      std::vector<float> want_s(static_cast<size_t>(act_scale_count(aq, n, in))), got_s(want_s.size());
      quantize_activations_u8(rotated.data(), n, in, aq, 0.0f, want.data(), ld, want_s.data());
      quantize_activations_u8_hadamard(x.data(), n, in, b, aq, got.data(), ld, got_s.data());
      EXPECT_EQ(got, want);
      EXPECT_EQ(got_s, want_s);
      // The rotation spreads the outlier: row 0's (largest) step is far below the unrotated absmax/127.
      const int64_t groups = act_groups_per_row(aq, in);
      EXPECT_LT(*std::max_element(got_s.begin(), got_s.begin() + groups), 0.5f * 400.0f / 127.0f);
      // And the whole layer: a W8A8 linear behind HadamardInputLinear equals the W8A8 linear on R·x.
      const int64_t out = 48;
      const std::vector<float> w = normal_floats(out * in, uint32_t(in));
      auto q = std::make_unique<W8A8Linear>(Tensor::from_vector({out, in}, w), WeightGranularity::PerChannel, aq);
      std::vector<float> y0(size_t(n * out)), y1(size_t(n * out));
      q->forward(rotated.data(), n, y0.data());
      const HadamardInputLinear layer(std::move(q), b);
      layer.forward(x.data(), n, y1.data());
      EXPECT_EQ(y1, y0);
    }
  }
  {
    // Other activation modes rotate first (HadamardInputLinear::rotated_input), the same layer output;
    // W8A8Linear itself rotates while quantizing per token (group) only.
    const int64_t in = 192, out = 16, n = 9, b = 64;
    const std::vector<float> x = normal_floats(n * in, 31), w = normal_floats(out * in, 32);
    std::vector<float> rotated(x.size());
    ops::hadamard_rows(x.data(), rotated.data(), n, in, b);
    auto q = std::make_unique<W8A8Linear>(Tensor::from_vector({out, in}, w), WeightGranularity::PerChannel, ActQuant::PerTensorDynamic);
    std::vector<float> y0(size_t(n * out)), y1(size_t(n * out));
    q->forward(rotated.data(), n, y0.data());
    W8A8Linear::QuantizedInput qx;
    EXPECT_THROW(q->quantize_input_u8(x.data(), n, qx, b), std::invalid_argument);
    const HadamardInputLinear layer(std::move(q), b);
    layer.forward(x.data(), n, y1.data());
    EXPECT_EQ(y1, y0);
  }
  std::vector<float> bad = normal_floats(2 * 64, 5);
  bad[70] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> q(2 * 64);
  std::vector<float> s(2);
  EXPECT_THROW(quantize_activations_u8_hadamard(bad.data(), 2, 64, 64, ActQuant::PerToken, q.data(), 64, s.data()), std::invalid_argument);
  EXPECT_THROW(quantize_activations_u8_hadamard(bad.data(), 2, 64, 48, ActQuant::PerToken, q.data(), 64, s.data()), std::invalid_argument);
  EXPECT_THROW(quantize_activations_u8_hadamard(bad.data(), 2, 64, 64, ActQuant::PerToken, q.data(), 60, s.data()), std::invalid_argument);
  EXPECT_THROW(quantize_activations_u8_hadamard(bad.data(), 2, 64, 64, ActQuant::PerTensorDynamic, q.data(), 64, s.data()),
               std::invalid_argument);
}

TEST(RotationHeader, ReadsTheSitesAndRefusesMalformedOnes) {
  nlohmann::json q = {{"scheme", "w8a8"},
                      {"rotation", {{"method", "hadamard"}, {"online", {{"ffn_hidden", 512}}}, {"offline", {{"attn_output", 64}}}}}};
  const RotationHeader h = rotation_from_quantization(q, "m.sqm");
  EXPECT_EQ(h.method, "hadamard");
  EXPECT_EQ(h.online.at("ffn_hidden"), 512);
  EXPECT_EQ(h.offline.at("attn_output"), 64);
  EXPECT_TRUE(rotation_from_quantization({{"scheme", "w8a8"}}, "m.sqm").method.empty());
  test::expect_error<UnsupportedError>([&] { refuse_online_rotation(q, "m.sqm", "GGUF"); }, {"m.sqm", "ffn_hidden", "no GGUF export"});
  nlohmann::json offline_only = q;
  offline_only["rotation"].erase("online");
  refuse_online_rotation(offline_only, "m.sqm", "GGUF");  // folded into the weights: exportable
  // kv_keys: the per-head query/key rotation, 0 when absent; it cancels in q·k, so exports keep it
  // out of their way too.
  EXPECT_EQ(h.kv_keys, 0);
  offline_only["rotation"]["kv_keys"] = 64;
  EXPECT_EQ(rotation_from_quantization(offline_only, "m.sqm").kv_keys, 64);
  refuse_online_rotation(offline_only, "m.sqm", "GGUF");
  nlohmann::json bad_keys = offline_only;
  bad_keys["rotation"]["kv_keys"] = 48;
  test::expect_error<InputError>([&] { rotation_from_quantization(bad_keys, "m.sqm"); }, {"m.sqm", "kv_keys", "power of two"});

  nlohmann::json bad = q;
  bad["rotation"]["method"] = "givens";
  test::expect_error<InputError>([&] { rotation_from_quantization(bad, "m.sqm"); }, {"m.sqm", "rotation.method", "givens"});
  bad = q;
  bad["rotation"]["online"]["ffn_hidden"] = 48;
  test::expect_error<InputError>([&] { rotation_from_quantization(bad, "m.sqm"); }, {"m.sqm", "online.ffn_hidden", "power of two"});
  bad = q;
  bad["rotation"]["online"] = {{"residual", 64}};
  test::expect_error<InputError>([&] { rotation_from_quantization(bad, "m.sqm"); }, {"m.sqm", "residual"});
  bad = q;
  bad["rotation"]["online"] = 64;
  test::expect_error<InputError>([&] { rotation_from_quantization(bad, "m.sqm"); }, {"m.sqm", "not an object"});
}

}  // namespace
}  // namespace sq
