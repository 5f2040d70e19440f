// GGML's Q4_K layout (quant/q4k_layout.h) and sqkit's Q4_K quantizer (calib/q4k_quantize.h):
//  * the 6-bit scale packing round-trips, and a block written by q4k_gguf_block dequantizes with the
//    GGUF reader's own Q4_K code (formats/gguf_dequantize.cpp, written from ggml-common.h for
//    reading llama.cpp's files) to exactly the weights sqkit's reference dequantization gives;
//  * every expanded Δ and m is an exact FP16 value equal to d·sc and −dmin·mi;
//  * the search is never worse than the plain min/max Q4_K rule, implemented here on its own;
//  * W4A16Linear runs K-quant weights (float minimum) in every kernel path within FP32 rounding of
//    a dequantize-then-FP64 reference.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "calib/int4_layer_quantizer.h"
#include "calib/q4k_quantize.h"
#include "core/tensor.h"
#include "formats/ggml_types.h"
#include "formats/gguf_dequantize.h"
#include "formats/safetensors.h"
#include "model/w4a16_linear.h"
#include "quant/q4k_layout.h"
#include "tests/support/cli.h"
#include "tests/support/int8_blocks.h"
#include "tests/support/linear_inputs.h"
#include "tests/support/process.h"
#include "tests/support/scheme_cli_fixture.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

using bench::normal_vector;

/// Weights like an LLM linear's: N(0, 0.02²) with a few columns 8× larger (outlier channels).
std::vector<float> weights(int64_t out, int64_t in, uint32_t seed) {
  std::vector<float> w = normal_vector(out * in, seed, 0.02f);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 3; c < in; c += 97) w[size_t(r * in + c)] *= 8.0f;
  return w;
}

TEST(Q4kLayout, ScalePackingRoundTrips) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t sc[8], mi[8], packed[12];
    for (int j = 0; j < 8; ++j) {
      sc[j] = uint8_t(rng() % 64);
      mi[j] = uint8_t(rng() % 64);
    }
    pack_q4k_scales(sc, mi, packed);
    for (int j = 0; j < 8; ++j) {
      int s, m;
      k_quant_unpack_scale_min(packed, j, s, m);
      ASSERT_EQ(s, sc[j]);
      ASSERT_EQ(m, mi[j]);
    }
  }
  uint8_t sc[8] = {64}, mi[8] = {}, packed[12];
  EXPECT_THROW(pack_q4k_scales(sc, mi, packed), std::invalid_argument);
}

TEST(Q4kLayout, GgufBlocksDequantizeExactlyAsSqkit) {
  const int64_t out = 5, in = 768;
  const auto w = weights(out, in, 11);
  const Int4Weights q = quantize_q4k(w.data(), out, in, nullptr, "test");
  ASSERT_TRUE(q.k_quant());
  std::vector<float> ours(size_t(out * in)), theirs(256);
  dequantize_int4(q, ours.data());
  std::vector<uint8_t> block(kQ4kBlockBytes);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t b = 0; b < in / 256; ++b) {
      q4k_gguf_block(q.superblock_scales.data() + (r * 3 + b) * 16, q.packed.data() + r * (in / 2) + b * 128, block.data());
      dequantize_row(GgmlType::Q4_K, block.data(), theirs.data(), 256);
      for (int k = 0; k < 256; ++k) ASSERT_EQ(theirs[size_t(k)], ours[size_t(r * in + b * 256 + k)]) << "row " << r << " column " << b * 256 + k;
    }
}

TEST(Q4kQuantize, StepsAndMinimumsAreExactFp16Products) {
  const int64_t out = 16, in = 576;  // two whole super-blocks and one of 2 groups
  const auto w = weights(out, in, 3);
  const Int4Weights q = quantize_q4k(w.data(), out, in, nullptr, "test");
  const int64_t ng = in / 32, nsb = 3;
  ASSERT_EQ(int64_t(q.superblock_scales.size()), out * nsb * 16);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t j = 0; j < ng; ++j) {
      const uint8_t* h = q.superblock_scales.data() + (r * nsb + j / 8) * 16;
      uint16_t d16, m16;
      std::memcpy(&d16, h, 2);
      std::memcpy(&m16, h + 2, 2);
      int sc, mi;
      k_quant_unpack_scale_min(h + 4, int(j % 8), sc, mi);
      ASSERT_EQ(int4_scale(q, r, j), half_to_float(d16) * float(sc));
      ASSERT_EQ(int4_offset(q, r, j), -half_to_float(m16) * float(mi));
      ASSERT_LE(int4_offset(q, r, j), 0.0f);
    }
  // the unused pairs of the short last super-block are zero
  for (int64_t r = 0; r < out; ++r)
    for (int j = 2; j < 8; ++j) {
      int sc, mi;
      k_quant_unpack_scale_min(q.superblock_scales.data() + (r * nsb + 2) * 16 + 4, j, sc, mi);
      EXPECT_EQ(sc, 0);
      EXPECT_EQ(mi, 0);
    }
  EXPECT_DOUBLE_EQ(bits_per_weight(q), 4.0 + 128.0 * 3 / 576);
  EXPECT_EQ(int4_storage_bytes(q), out * in / 2 + out * nsb * 16);
}

/// The plain min/max Q4_K rule, independently: per group lo = min(min w, 0), Δ = (max w − lo)/15,
/// m = lo; d = max Δ / 63, dmin = max(−m) / 63 kept to 5 significant bits (FP16), sc = round(Δ/d),
/// mi = round(−m/dmin); codes round((w − m_q)/Δ_q) clamped to [0, 15]. Returns the weighted error.
double minmax_q4k_error(const std::vector<float>& W, int64_t out, int64_t in, const std::vector<double>& a) {
  const auto five_bits = [](float x) {
    if (!(x > 0)) return 0.0f;
    int e;
    const float f = std::frexp(x, &e);
    return half_to_float(float_to_half(std::ldexp(std::nearbyint(std::ldexp(f, 5)), e - 5)));
  };
  double err = 0;
  for (int64_t r = 0; r < out; ++r)
    for (int64_t b0 = 0; b0 < in; b0 += 256) {
      const int64_t b1 = std::min(in, b0 + 256);
      std::vector<float> delta, lo;
      for (int64_t g0 = b0; g0 < b1; g0 += 32) {
        float l = 0, h = 0;
        for (int64_t k = g0; k < std::min(b1, g0 + 32); ++k) {
          l = std::min(l, W[size_t(r * in + k)]);
          h = std::max(h, W[size_t(r * in + k)]);
        }
        delta.push_back((h - l) / 15);
        lo.push_back(l);
      }
      const float d = five_bits(*std::max_element(delta.begin(), delta.end()) / 63);
      float mmax = 0;
      for (float l : lo) mmax = std::max(mmax, -l);
      const float dmin = five_bits(mmax / 63);
      for (size_t j = 0; j < delta.size(); ++j) {
        const float sc = d > 0 ? std::clamp(std::nearbyint(delta[j] / d), 0.0f, 63.0f) : 0;
        const float mi = dmin > 0 ? std::clamp(std::nearbyint(-lo[j] / dmin), 0.0f, 63.0f) : 0;
        const float dq = d * sc, mq = -dmin * mi;
        for (int64_t k = b0 + int64_t(j) * 32; k < std::min(b1, b0 + int64_t(j + 1) * 32); ++k) {
          const float x = W[size_t(r * in + k)];
          const float u = dq > 0 ? std::clamp(std::nearbyint((x - mq) / dq), 0.0f, 15.0f) : 0.0f;
          const double e = double(x) - double(std::fma(dq, u, mq));
          err += a[size_t(k)] * e * e;
        }
      }
    }
  return err;
}

TEST(Q4kQuantize, NeverWorseThanTheMinMaxRuleAndImportanceHelps) {
  const int64_t out = 64, in = 512;
  const auto W = weights(out, in, 21);
  std::vector<double> uniform(size_t(in), 1.0), imp(static_cast<size_t>(in));
  std::mt19937 rng(5);
  std::lognormal_distribution<double> ln(0.0, 1.5);  // activation energies spread over decades, as Σx² is
  for (auto& v : imp) v = ln(rng);
  const Int4Weights qu = quantize_q4k(W.data(), out, in, nullptr, "test");
  const Int4Weights qi = quantize_q4k(W.data(), out, in, imp.data(), "test");
  const double ref_u = minmax_q4k_error(W, out, in, uniform), ref_i = minmax_q4k_error(W, out, in, imp);
  const double eu = weighted_squared_error(W.data(), qu, nullptr), ei = weighted_squared_error(W.data(), qi, imp.data());
  const double eu_i = weighted_squared_error(W.data(), qu, imp.data());
  std::printf("Q4_K error / min-max rule: uniform %.3f, importance-weighted %.3f (uniform search under the weights %.3f)\n", eu / ref_u,
              ei / ref_i, eu_i / ref_i);
  EXPECT_LE(eu, ref_u);
  EXPECT_LE(ei, ref_i);
  // Measured 0.81 / 0.55 / 0.89: the search lowers the uniform error by 19 %, and weighting it by
  // the importance lowers the weighted error to 0.55 where the uniform search reaches 0.89. The
  // bounds leave margin for other seeds while a search that does nothing (ratio 1) or ignores the
  // importance (ei/ref_i = eu_i/ref_i) fails.
  EXPECT_LT(eu / ref_u, 0.9);
  EXPECT_LT(ei / ref_i, 0.97 * eu_i / ref_i);
}

TEST(Q4kQuantize, ZeroRowsRaggedGroupsAndBadInput) {
  const int64_t out = 3, in = 100;  // groups 32, 32, 32, 4
  auto W = weights(out, in, 2);
  for (int64_t k = 0; k < in; ++k) W[size_t(in + k)] = 0.0f;  // row 1 all zero
  const Int4Weights q = quantize_q4k(W.data(), out, in, nullptr, "test");
  std::vector<float> d(size_t(out * in));
  dequantize_int4(q, d.data());
  for (int64_t k = 0; k < in; ++k) EXPECT_EQ(d[size_t(in + k)], 0.0f);
  for (int64_t k = 0; k < in; ++k) EXPECT_NEAR(d[size_t(k)], W[size_t(k)], 0.2f * std::fabs(W[size_t(k)]) + 0.02f);
  W[7] = NAN;
  EXPECT_THROW(quantize_q4k(W.data(), out, in, nullptr, "test"), std::invalid_argument);
  W[7] = 0.0f;
  EXPECT_THROW(quantize_q4k(W.data(), out, 99, nullptr, "test"), std::invalid_argument);  // odd width
  std::vector<double> neg(size_t(in), 1.0);
  neg[3] = -1.0;
  EXPECT_THROW(quantize_q4k(W.data(), out, in, neg.data(), "test"), std::invalid_argument);
}

using test::round_blocks_int8;

// Every path closes a group as Δ·Σx·u + m·Σx: against the FP64 product of the reference
// dequantization the error is FP32 rounding, at most γ_L · Σ_k |x_k| (15|Δ| + |m|) · 2 with
// L = in + 40 (a long sequential sum, generous for the lane-split ones).
TEST(W4A16LinearKQuant, EveryPathMatchesTheReference) {
  for (int64_t in : {256, 576, 1536, 100})
    for (int64_t n : {1, 5, 64}) {
      const int64_t out = 37;
      const auto W = weights(out, in, uint32_t(in));
      const W4A16Linear lin(quantize_q4k(W.data(), out, in, nullptr, "test"));
      EXPECT_EQ(lin.format(), "w4a16-q4_k");
      const Int4Weights& q = lin.weights();
      std::vector<float> wd(size_t(out * in));
      dequantize_int4(q, wd.data());
      const auto x = normal_vector(n * in, uint32_t(n + in));
      std::vector<float> y(size_t(n * out));
      lin.forward(x.data(), n, y.data());
      const double L = double(in + 40), u = 0x1p-24, gamma = L * u / (1 - L * u);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < in; ++k) {
            ref += double(x[size_t(i * in + k)]) * double(wd[size_t(o * in + k)]);
            mag += std::fabs(x[size_t(i * in + k)]) * (15 * std::fabs(int4_scale(q, o, k / 32)) + std::fabs(int4_offset(q, o, k / 32))) * 2;
          }
          const double err = std::fabs(double(y[size_t(i * out + o)]) - ref);
          ASSERT_LE(err, gamma * mag) << "in " << in << " n " << n << " row " << o;
          worst = std::max(worst, err / (gamma * mag));
        }
      EXPECT_LT(worst, 0.05) << "in " << in << " n " << n;
    }
  // INT8 activations: Σ_k (Δ u_k + m) s_b q_k of an independent rounding, exact integer dots in
  // the kernel, so only the FP32 scaling and sums differ (L = in/16 + 40 per lane chain).
  if (!w4_int8_decode_supported()) GTEST_SKIP() << "no AVX512-VNNI/VBMI";
  for (int64_t in : {256, 576, 1536}) {
    const int64_t out = 37;
    const auto W = weights(out, in, uint32_t(in + 1));
    W4A16Linear lin(quantize_q4k(W.data(), out, in, nullptr, "test"));
    lin.set_decode_activations(W4DecodeActivations::Int8);
    ASSERT_EQ(lin.decode_activations(), W4DecodeActivations::Int8);
    const Int4Weights& q = lin.weights();
    auto x = normal_vector(in, uint32_t(in + 2));
    x[5] = 9.0f;
    std::vector<double> s;
    std::vector<int> qx;
    round_blocks_int8(x, s, qx);
    std::vector<float> y(static_cast<size_t>(out));
    lin.forward(x.data(), 1, y.data());
    const double L = double(in) / 16 + 40, u = 0x1p-24, gamma = L * u / (1 - L * u);
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double d = int4_scale(q, o, k / 32), m = int4_offset(q, o, k / 32), c = int4_code(q, o, k);
        ref += (d * c + m) * s[size_t(k / 32)] * qx[size_t(k)];
        mag += (std::fabs(d) * c + std::fabs(m)) * s[size_t(k / 32)] * std::abs(qx[size_t(k)]) * 2;
      }
      ASSERT_LE(std::fabs(double(y[size_t(o)]) - ref), gamma * mag + 1e-30) << "in " << in << " row " << o;
    }
  }
}

// GPTQ on the Q4_K grid (calib/int4_layer_quantizer.cpp): the two-level scales and minimums are the RTN
// search's (importance diag(H)), GPTQ only re-chooses the codes, so on the calibration objective
// tr((W − Ŵ) H (W − Ŵ)ᵀ) it must not lose to RTN on the same grid (GPTQ's claim; real stories260K weights and
// activations, H = (2/N)·XᵀX); the packed codes must reproduce GPTQ's own error.
TEST(Q4kQuantize, GptqOnTheGridLowersTheHessianError) {
  const auto li = test::stories_linear_inputs(256);
  for (const test::WeightAndInput& c : {test::WeightAndInput{&li.wgate, &li.x64}, test::WeightAndInput{&li.wdown, &li.x172}}) {
    const int64_t in = c.w->dim(1), n = int64_t(c.x->size()) / in;
    std::vector<double> H(size_t(in * in), 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t j = 0; j < in; ++j) H[size_t(i * in + j)] += 2.0 * (*c.x)[size_t(t * in + i)] * (*c.x)[size_t(t * in + j)] / double(n);
    Int4Options o;
    o.group_size = 32;
    o.asym = true;
    o.k_quant = true;
    const Int4Projection rtn = quantize_linear_int4(*c.w, "rtn", o, &H, nullptr);
    o.gptq = true;
    const Int4Projection gp = quantize_linear_int4(*c.w, "gptq", o, &H, nullptr);
    o.act_order = true;
    const Int4Projection ao = quantize_linear_int4(*c.w, "gptq-ao", o, &H, nullptr);
    for (const Int4Projection* p : {&gp, &ao}) {
      EXPECT_EQ(p->weights.superblock_scales, rtn.weights.superblock_scales) << p->name << ": the grid is RTN's";
      // GPTQ's greedy column order has no guarantee per matrix, but on these real weights it wins clearly
      // (measured 0.08–0.55× RTN's error); ≤ RTN is the claim checked.
      EXPECT_LE(p->hessian_error, rtn.hessian_error) << p->name << " in " << in;
      std::vector<float> deq(size_t(c.w->dim(0) * in));
      dequantize_int4(p->weights, deq.data());
      const double again = hessian_weighted_error(c.w->data(), deq.data(), c.w->dim(0), in, H);
      // the same sum over the same FP32 weights: equal up to the double summation order
      EXPECT_NEAR(again, p->hessian_error, 1e-9 * p->hessian_error) << p->name;
      std::printf("in %lld %s: Hessian error %.6g (RTN on the grid %.6g)\n", (long long)in, p->name.c_str(), p->hessian_error,
                  rtn.hessian_error);
    }
  }
}

constexpr char kW4A16Scheme[] = "w4a16";
using KQuantCli = test::SchemeCliTest<kW4A16Scheme>;

// stories260K (dim 64, FFN 172: every row a single short super-block, the FFN's last group of 12):
// sq-convert --k-quant writes the super-block heads, records the layout, runs near the g32
// asymmetric file's perplexity, and refuses what it cannot do with one line and exit 2.
TEST_F(KQuantCli, ConvertsRecordsRunsAndRefuses) {
  using test::run_process;
  using test::tool;
  const std::string f = dir_->file("q4k.sqm"), a = dir_->file("g32a.sqm");
  const auto r = convert({"--k-quant", "--calib", calib()}, f);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  ASSERT_EQ(convert({"--group-size", "32", "--asym", "--calib", calib()}, a).exit_status, 0);
  const auto inspect = run_process({tool("sq-inspect"), f, "--json"});
  ASSERT_EQ(inspect.exit_status, 0) << inspect.err;
  const auto j = nlohmann::json::parse(inspect.out);
  const auto q = j.at("header").at("quantization");
  EXPECT_EQ(q.at("layout"), "q4_k") << q;
  EXPECT_EQ(q.at("group_size"), 32) << q;
  EXPECT_EQ(q.at("symmetric"), false) << q;
  const auto tensors = run_process({tool("sq-inspect"), f, "--tensors"});
  EXPECT_NE(tensors.out.find("model.layers.0.mlp.down_proj.weight_superblock_scale"), std::string::npos) << tensors.out;
  EXPECT_EQ(tensors.out.find("model.layers.0.mlp.down_proj.weight_zero"), std::string::npos) << tensors.out;
  const double fp32 = ppl(test::stories_model()), pk = ppl(f), pa = ppl(a);
  std::printf("stories260K W4A16 --k-quant: PPL %.4f (g32 asym %.4f, FP32 %.4f)\n", pk, pa, fp32);
  // 6-bit sub-scales cost little against FP16 steps, and the float minimum and search gain: within 5% of g32 asymmetric;
  // a wrong minimum sign or nibble order gives PPL in the hundreds. Measured 7.04 against 7.45.
  EXPECT_LT(pk, pa * 1.05);
  // AWQ's scaling before Q4_K (its search's proxy is g32 asymmetric min/max, recipe_smoothing.cpp): recorded, and
  // within the same 5% of the g32 asymmetric file (measured below the plain Q4_K file's PPL)
  const std::string aw = dir_->file("q4k-awq.sqm");
  const auto ra = convert({"--k-quant", "--awq", "--calib", calib()}, aw);
  ASSERT_EQ(ra.exit_status, 0) << ra.err;
  const auto qa = nlohmann::json::parse(run_process({tool("sq-inspect"), aw, "--json"}).out).at("header").at("quantization");
  EXPECT_EQ(qa.at("layout"), "q4_k") << qa;
  EXPECT_FALSE(qa.at("awq").at("groups").empty()) << qa;
  const double pw = ppl(aw);
  std::printf("stories260K W4A16 --k-quant --awq: PPL %.4f\n", pw);
  EXPECT_LT(pw, pa * 1.05);
  const std::string bad = dir_->file("bad-q4k.sqm");
  expect_error(convert({"--k-quant", "--sym"}, bad), "--k-quant is GGML's Q4_K layout", bad);
  expect_error(convert({"--k-quant", "--group-size", "64"}, bad), "--k-quant is GGML's Q4_K layout", bad);
  // GPTQ on the Q4_K grid converts, records its method and runs near the RTN file (within 5% of g32 asymmetric)
  const std::string kg = dir_->file("q4k-gptq.sqm");
  const auto rg = convert({"--k-quant", "--gptq", "--act-order", "--calib", calib()}, kg);
  ASSERT_EQ(rg.exit_status, 0) << rg.err;
  const auto qg = nlohmann::json::parse(run_process({tool("sq-inspect"), kg, "--json"}).out).at("header").at("quantization");
  EXPECT_EQ(qg.at("layout"), "q4_k") << qg;
  EXPECT_EQ(qg.at("method"), "gptq") << qg;
  const double pg = ppl(kg);
  std::printf("stories260K W4A16 --k-quant --gptq --act-order: PPL %.4f\n", pg);
  EXPECT_LT(pg, pa * 1.05);
  expect_error(run_process({tool("sq-convert"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "--k-quant", "-o", bad, "-q"}),
               "--k-quant applies to --scheme w4a16 only", bad);
  // compressed-tensors has integer zero points only: refused, naming the route that exists
  const std::string ct = dir_->file("q4k-ct");
  const auto e = run_process({tool("sq-export"), f, "--format", "compressed-tensors", "-o", ct});
  EXPECT_EQ(e.exit_status, 2) << e.err;
  EXPECT_NE(e.err.find("--format gguf"), std::string::npos) << e.err;
  EXPECT_FALSE(std::filesystem::exists(ct));
}

// --k-quant with mixed precision (--bits-per-weight): the low format is Q4_K (4 + 128·S/in bits: 6.0 for
// stories' 64-wide rows, 4.74 for its 172-wide down_proj), the high one INT8 rows; the budget is kept,
// the file holds both kinds of linears, and it runs at least as well as the all-Q4_K file.
TEST_F(KQuantCli, MixesPrecisionWithInt8Rows) {
  using test::run_process;
  using test::tool;
  const std::string f = dir_->file("q4k-mixed.sqm"), k = dir_->file("q4k-only.sqm");
  const auto r = convert({"--k-quant", "--calib", calib(), "--bits-per-weight", "7", "--mixed-windows", "2"}, f);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  ASSERT_EQ(convert({"--k-quant", "--calib", calib()}, k).exit_status, 0);
  const auto inspect = run_process({tool("sq-inspect"), f, "--json"});
  ASSERT_EQ(inspect.exit_status, 0) << inspect.err;
  const auto q = nlohmann::json::parse(inspect.out).at("header").at("quantization");
  EXPECT_EQ(q.at("layout"), "q4_k") << q;
  const auto& m = q.at("mixed_precision");
  EXPECT_LE(m.at("bits_per_weight").get<double>(), 7.0) << m;
  int int8 = 0, int4 = 0;
  for (const auto& l : m.at("linears")) {
    const bool high = l.at("format") == "int8";
    (high ? int8 : int4)++;
    const double in = l.at("name").get<std::string>().find("down_proj") != std::string::npos ? 172.0 : 64.0;
    // the recorded storage: Q4_K's one 16-byte head per super-block of this row, or INT8 with an FP32 row step
    const double want = high ? 8.0 + 32.0 / in : 4.0 + 128.0 / in;
    EXPECT_NEAR(l.at("bits").get<double>(), want, 1e-9) << l;
  }
  EXPECT_GT(int8, 0) << m;
  EXPECT_GT(int4, 0) << m;
  EXPECT_EQ(m.at("int8_linears").get<int>(), int8);
  const auto tensors = run_process({tool("sq-inspect"), f, "--tensors"});
  EXPECT_NE(tensors.out.find("weight_superblock_scale"), std::string::npos) << tensors.out;
  // More bits where they cost most KLD: not worse than the uniform Q4_K file (1% for the evaluation's 2 windows of noise
  // in the other direction; measured lower).
  const double pm = ppl(f), pk = ppl(k);
  std::printf("stories260K --k-quant --bits-per-weight 7: PPL %.4f (all Q4_K %.4f)\n", pm, pk);
  EXPECT_LT(pm, pk * 1.01);
  // sensitivities recorded for Q4_K are not reused for another 4-bit format
  const std::string bad = dir_->file("bad-mixed.sqm");
  expect_error(convert({"--group-size", "32", "--asym", "--calib", calib(), "--bits-per-weight", "7", "--sensitivity-from", f}, bad),
               "not this conversion's 4-bit format", bad);
}

}  // namespace
}  // namespace sq
