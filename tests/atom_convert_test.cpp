// Atom W4A4 conversion (issue #5, `sq-convert --scheme w4a4-atom`): the outlier reorder is exact
// (folded into gate/up rows, gathered elsewhere), the fused gather / zero padding / FP32 outliers of
// W4A4Linear reproduce the plain kernel, every Table 3 ablation step converts and runs through
// sq-eval on stories260K, sq-inspect's bits per weight is the layout arithmetic of docs/formats.md,
// and bad inputs are one line on stderr with exit 2 and no output file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "bench/timing.h"
#include "calib/atom_layer_quantizer.h"
#include "calib/channel_reorder.h"
#include "calib/gptq.h"
#include "formats/calibration_h5.h"
#include "formats/safetensors.h"
#include "model/model_loader.h"
#include "model/w4a4_linear.h"
#include "runtime/kv_cache.h"
#include "tests/support/cli.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "tests/support/scheme_cli_fixture.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

/// FP32 linear that reads its input through an order (x'[p] = x[order[p]]) — an independent
/// implementation of the run-time gather, for the exactness test.
class GatherLinear final : public Linear {
 public:
  GatherLinear(Tensor w, std::vector<int32_t> order) : dense_(std::move(w)), order_(std::move(order)) {}
  int64_t in_features() const override { return dense_.in_features(); }
  int64_t out_features() const override { return dense_.out_features(); }
  void forward(const float* x, int64_t n, float* y) const override {
    const int64_t in = in_features();
    std::vector<float> xr(static_cast<size_t>(n * in));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < in; ++p) xr[size_t(i * in + p)] = x[i * in + order_[size_t(p)]];
    dense_.forward(xr.data(), n, y);
  }
  std::string format() const override { return "gather-f32"; }
  int64_t weight_bytes() const override { return dense_.weight_bytes(); }

 private:
  DenseLinear dense_;
  std::vector<int32_t> order_;
};

std::vector<int32_t> random_order(int64_t in, int64_t n_outlier, uint32_t seed) {
  std::vector<double> energy(static_cast<size_t>(in));
  std::mt19937 rng(seed);
  for (auto& e : energy) e = std::uniform_real_distribution<double>(0, 1)(rng);
  return outlier_channel_order(energy, n_outlier);
}

TEST(AtomReorder, FoldAndGatherLeaveFp32LogitsUnchanged) {
  // stories260K with every layer's four input reorders applied the way the converter does: the
  // ffn_hidden order folded into gate/up rows and down columns (fold_ffn_hidden_order), the others
  // as permuted weight columns read through a run-time gather. Orders with 4 / 10 outliers (the
  // automatic counts on this model) from random "energies", different per layer and site.
  const LoadedModel src = load_model(stories_model());
  const ModelConfig& c = src.model->config();
  Checkpoint ck = src.checkpoint;
  std::vector<std::array<std::vector<int32_t>, 4>> orders(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    auto& o = orders[size_t(l)];
    o[0] = random_order(c.dim, atom_outlier_count(c.dim, -1), 100 + l);
    o[1] = random_order(int64_t(c.n_heads) * c.head_dim, atom_outlier_count(int64_t(c.n_heads) * c.head_dim, -1), 200 + l);
    o[2] = random_order(c.dim, atom_outlier_count(c.dim, -1), 300 + l);
    o[3] = random_order(c.hidden_dim, atom_outlier_count(c.hidden_dim, -1), 400 + l);
    ASSERT_EQ(atom_outlier_count(c.hidden_dim, -1), 10);
    fold_ffn_hidden_order(ck, l, o[3]);
  }
  Decoder reordered = Decoder::from_checkpoint(ck);
  for (int l = 0; l < c.n_layers; ++l) {
    DecoderLayer& L = reordered.mutable_layers()[size_t(l)];
    const auto& o = orders[size_t(l)];
    const std::string p = names::layer(l);
    auto gathered = [&](const std::string& name, const std::vector<int32_t>& ord) {
      return std::make_unique<GatherLinear>(permute_columns(ck.tensors.at(p + name + ".weight"), ord), ord);
    };
    L.q_proj = gathered("self_attn.q_proj", o[0]);
    L.k_proj = gathered("self_attn.k_proj", o[0]);
    L.v_proj = gathered("self_attn.v_proj", o[0]);
    L.o_proj = gathered("self_attn.o_proj", o[1]);
    L.gate_proj = gathered("mlp.gate_proj", o[2]);
    L.up_proj = gathered("mlp.up_proj", o[2]);
    // down_proj stays the DenseLinear of the folded checkpoint: its input arrives reordered.
  }
  std::vector<int32_t> tokens(96);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 1) % c.vocab_size);
  const auto a = decoder_logits(*src.model, tokens), b = decoder_logits(reordered, tokens);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
    max_abs = std::max(max_abs, double(std::fabs(a[i])));
  }
  std::printf("  reordered vs original logits: max |diff| %.3g (max |logit| %.3g)\n", max_diff, max_abs);
  // The same products summed in another order: FP32 rounding only (logits are O(10), a few ulps
  // of 1e-6 each through 5 layers); a wrong fold or permutation changes logits by O(1).
  EXPECT_LT(max_diff, 1e-4);
  // The fold really moved rows: up_proj's first outlier slot p holds the original row order[p] ≠ p.
  const int64_t slot = c.hidden_dim - 10, src_row = orders[0][3][size_t(slot)];
  ASSERT_NE(src_row, slot);
  const float* moved = ck.tensors.at("model.layers.0.mlp.up_proj.weight").data() + slot * c.dim;
  const float* orig = src.checkpoint.tensors.at("model.layers.0.mlp.up_proj.weight").data() + src_row * c.dim;
  EXPECT_TRUE(std::equal(moved, moved + c.dim, orig));
}

/// A W4A4LinearData with random codes/scales/outliers and a random order.
W4A4LinearData random_data(int64_t out, int64_t in, int64_t n, int64_t group, W4A4OutlierFormat fmt, uint32_t seed) {
  std::mt19937 rng(seed);
  W4A4LinearData d;
  d.out = out;
  d.in = in;
  d.n_outlier = n;
  d.group = group;
  d.order = random_order(in, n, seed + 1);
  d.outlier_format = fmt;
  const int64_t inn = in - n, G = w4a4_stored_groups(inn, group);
  d.codes.resize(static_cast<size_t>(out * inn));
  for (auto& q : d.codes) q = static_cast<int8_t>(std::uniform_int_distribution<int>(-8, 7)(rng));
  d.scales_f16.resize(static_cast<size_t>(out * G));
  for (auto& s : d.scales_f16) s = float_to_half(std::uniform_real_distribution<float>(0.001f, 0.01f)(rng));
  if (fmt == W4A4OutlierFormat::Int8) {
    d.outlier_codes.resize(static_cast<size_t>(out * n));
    for (auto& q : d.outlier_codes) q = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
    d.outlier_scales.resize(static_cast<size_t>(out));
    for (auto& s : d.outlier_scales) s = std::uniform_real_distribution<float>(0.001f, 0.002f)(rng);
  } else {
    d.outlier_weights = bench::normal_vector(out * n, seed + 2, 0.1f);
  }
  return d;
}

TEST(AtomLinear, SourceMapAndPaddingEqualThePrepermutedKernelBitForBit) {
  // 172 inputs with 10 outliers: 162 INT4 channels, g = 32 → 5 groups + a ragged group of 2
  // (padded to 192); g = 0 → one per-token group of 162 (padded to 168). The layer with the order
  // must give exactly the kernel's result on the input permuted and zero-padded by hand.
  const int64_t out = 40, in = 172, n = 10, m = 11;
  auto x = bench::normal_vector(m * in, 5);
  for (int64_t i = 0; i < m; ++i) x[size_t(i * in + 3)] *= 30.0f;  // an outlier-like channel
  for (int64_t group : {int64_t(32), int64_t(0), int64_t(128)}) {
    const W4A4LinearData d = random_data(out, in, n, group, W4A4OutlierFormat::Int8, 17);
    const W4A4Linear layer(d);
    const int64_t inn = in - n, gk = w4a4_kernel_group(inn, group), padded = (inn + gk - 1) / gk * gk, G = w4a4_stored_groups(inn, group);
    std::vector<int8_t> codes(static_cast<size_t>(out * padded), 0);
    std::vector<float> scales(static_cast<size_t>(out * G));
    for (int64_t r = 0; r < out; ++r) {
      std::copy_n(d.codes.data() + r * inn, inn, codes.data() + r * padded);
      for (int64_t j = 0; j < G; ++j) scales[size_t(r * G + j)] = half_to_float(d.scales_f16[size_t(r * G + j)]);
    }
    const W4A4Linear kernel(w4a4_weights_from_codes(out, padded + n, n, gk, codes.data(), scales.data(), d.outlier_codes.data(),
                                                    d.outlier_scales.data()),
                            d.act_clip);
    std::vector<float> xp(static_cast<size_t>(m * (padded + n)), 0.0f);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < inn; ++p) xp[size_t(i * (padded + n) + p)] = x[size_t(i * in + d.order[size_t(p)])];
      for (int64_t j = 0; j < n; ++j) xp[size_t(i * (padded + n) + padded + j)] = x[size_t(i * in + d.order[size_t(inn + j)])];
    }
    std::vector<float> y(static_cast<size_t>(m * out)), yk(y.size());
    layer.forward(x.data(), m, y.data());
    kernel.forward(xp.data(), m, yk.data());
    EXPECT_EQ(layer.in_features(), in);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], yk[i]) << "group " << group << " element " << i;
  }
}

TEST(AtomLinear, Fp32OutliersAreAnFp32ProductAddedToTheInt4Part) {
  // FP32 outliers: y = INT4 part (the same layer with the outlier columns' weights zero in INT8, i.e.
  // contributing 0) + x[:, outliers] · W_outᵀ, the latter checked in double.
  const int64_t out = 24, in = 64, n = 4, m = 7;
  const auto x = bench::normal_vector(m * in, 9);
  const W4A4LinearData d = random_data(out, in, n, 32, W4A4OutlierFormat::Fp32, 23);
  W4A4LinearData int4_only = d;
  int4_only.outlier_format = W4A4OutlierFormat::Int8;
  int4_only.outlier_codes.assign(static_cast<size_t>(out * n), 0);
  int4_only.outlier_scales.assign(static_cast<size_t>(out), 1.0f);
  std::vector<float> y(static_cast<size_t>(m * out)), y4(y.size());
  W4A4Linear(d).forward(x.data(), m, y.data());
  W4A4Linear(int4_only).forward(x.data(), m, y4.data());
  double max_err = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double fp = 0;
      for (int64_t j = 0; j < n; ++j) fp += double(x[size_t(i * in + d.order[size_t(in - n + j)])]) * d.outlier_weights[size_t(o * n + j)];
      max_err = std::max(max_err, std::fabs(double(y[size_t(i * out + o)]) - (double(y4[size_t(i * out + o)]) + fp)));
    }
  // Two FP32 roundings of O(1) values (the sgemm's sum of 4 products and the add): < 1e-5.
  EXPECT_LT(max_err, 1e-5);
  EXPECT_EQ(W4A4Linear(d).format(), "w4a4-g32-o4-fp32");
}

TEST(AtomGptq, TailColumnsAreKeptCompensatedAndClipScalesTheStep) {
  // W [16, 72] with the last 8 columns kept (Atom's outliers); H = (2/N)·XᵀX of correlated inputs.
  const int64_t out = 16, in = 72, t = 8, N = 400;
  const auto W = bench::normal_vector(out * in, 41, 0.1f);
  auto X = bench::normal_vector(N * in, 42);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 1; c < in; ++c) X[size_t(i * in + c)] += 0.5f * X[size_t(i * in + c - 1)];
  std::vector<double> H(static_cast<size_t>(in * in), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t a = 0; a < in; ++a)
      for (int64_t b = 0; b < in; ++b) H[size_t(a * in + b)] += 2.0 * X[size_t(i * in + a)] * X[size_t(i * in + b)] / N;
  GptqOptions o;
  o.group_size = 32;
  o.fp16_scales = true;
  o.static_groups = true;
  o.tail_columns = t;
  o.clip = 0.85f;
  const GptqResult rtn = rtn_quantize(W.data(), out, in, o);
  const GptqResult g = gptq_quantize(W.data(), out, in, H, o);
  EXPECT_EQ(g.n_groups, 2);  // 64 quantized columns in groups of 32
  bool tail_moved = false;
  for (int64_t r = 0; r < out; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(W[size_t(r * in + c)]));
    // Static groups: Δ = fp16((0.85 · absmax) / 7) from the original weights.
    EXPECT_EQ(g.scales[size_t(r * 2)], half_to_float(float_to_half((0.85f * amax) / 7.0f)));
    for (int64_t c = in - t; c < in; ++c) {
      EXPECT_EQ(g.g_idx[size_t(c)], -1);
      EXPECT_EQ(rtn.dequantized[size_t(r * in + c)], W[size_t(r * in + c)]);  // RTN: the tail as given
      tail_moved |= g.dequantized[size_t(r * in + c)] != W[size_t(r * in + c)];  // GPTQ: error-compensated
    }
  }
  EXPECT_TRUE(tail_moved);
  // GPTQ's compensation (into later INT4 columns and the FP tail) beats RTN on the layer objective
  // (measured 0.190 vs 0.278, i.e. 0.68×; the bound leaves room for BLAS rounding differences).
  const double e_rtn = hessian_weighted_error(W.data(), rtn.dequantized.data(), out, in, H);
  std::printf("  Hessian-weighted error with an 8-column FP tail: RTN %.4g, GPTQ %.4g\n", e_rtn, g.hessian_error);
  EXPECT_LT(g.hessian_error, 0.8 * e_rtn);
}

// ---- CLI on stories260K -------------------------------------------------------------------------

constexpr char kAtomScheme[] = "w4a4-atom";
using AtomCli = SchemeCliTest<kAtomScheme>;

TEST_F(AtomCli, EveryAblationStepConvertsAndRuns) {
  const double fp32 = ppl(stories_model());
  struct Step {
    const char* name;
    std::vector<std::string> flags;
  };
  const std::vector<Step> steps = {
      {"rtn", {"--outlier-channels", "0", "--group-size", "0", "--clip", "none"}},
      {"fp-outliers", {"--calib", calib(), "--outlier-format", "fp32", "--group-size", "0", "--clip", "none"}},
      {"int8-outliers", {"--calib", calib(), "--group-size", "0", "--clip", "none"}},
      {"group", {"--calib", calib(), "--group-size", "32", "--clip", "none"}},
      {"clip", {"--calib", calib(), "--group-size", "32"}},
      {"gptq", {"--calib", calib(), "--group-size", "32", "--gptq"}},
  };
  std::vector<double> p;
  for (const auto& s : steps) {
    const std::string out = dir_->file(std::string("step-") + s.name + ".sqm");
    const auto r = convert(s.flags, out);
    ASSERT_EQ(r.exit_status, 0) << s.name << ": " << r.err;
    p.push_back(ppl(out));
    std::printf("  %-14s PPL %.3f (FP32 %.3f)\n", s.name, p.back(), fp32);
    EXPECT_TRUE(std::isfinite(p.back())) << s.name;
    EXPECT_GT(p.back(), fp32) << s.name;  // 4-bit activations always cost something
  }
  // Measured here (32 calibration windows, 40 evaluation windows; deterministic for any thread
  // count): FP32 6.599, RTN 12.545, FP outliers 11.124, INT8 outliers 11.199, g32 8.920, clip 8.459,
  // GPTQ 8.270. The orderings Atom's Table 3 reports must hold, each with its measured margin:
  EXPECT_LT(p[2], p[0] * 0.95);                    // outliers help (measured −11%)
  EXPECT_LT(std::fabs(p[1] / p[2] - 1.0), 0.03);   // INT8 outliers ≈ FP outliers (measured 0.7%)
  EXPECT_LT(p[3], p[2] * 0.9);                     // groups help most (measured −20%)
  EXPECT_LT(p[4], p[3]);                           // clipping helps (measured −5.2%)
  EXPECT_LT(p[5], p[4]);                           // GPTQ helps (measured −2.2%)
  EXPECT_LT(p[5], fp32 * 1.4);                     // final Atom model: measured +25%
  const auto i = run_process({tool("sq-inspect"), "--json", dir_->file("step-gptq.sqm")});
  const auto q = nlohmann::json::parse(i.out).at("header").at("quantization");
  EXPECT_EQ(q.at("scheme"), "w4a4-atom");
  EXPECT_EQ(q.at("method"), "gptq");
  EXPECT_EQ(q.at("gptq").at("hessians"), "sequential");
  EXPECT_EQ(q.at("outliers_per_site").at("ffn_hidden"), 10);
  EXPECT_EQ(q.at("clip").at("weight"), 0.85f);
}

/// Records every input row of one layer's linears.
struct LayerRows final : ActivationObserver {
  explicit LayerRows(int l) : layer(l) {}
  void on_linear_input(int l, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    if (l != layer) return;
    rows[size_t(site)].width = width;
    rows[size_t(site)].data.insert(rows[size_t(site)].data.end(), x, x + n * width);
  }
  int layer;
  std::array<SiteRows, kActivationSites> rows;
};

TEST_F(AtomCli, ClipSearchNeverLosesToTheDefaultRatiosAndIsRecorded) {
  // Library: layer 1 of stories260K on 256 tokens of FP32 activations. Atom's defaults (0.85, 0.9)
  // lie on the grid, so the chosen pair's output error can only be lower or equal.
  const LoadedModel m = load_model(stories_model());
  const CalibrationData cd = read_calibration_h5(calib());
  LayerRows cap(1);
  std::vector<int32_t> tokens(256);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 7) % m.model->config().vocab_size);
  KVCache cache(m.model->config(), 256);
  Workspace ws;
  m.model->forward(tokens.data(), 256, cache, ws, nullptr, LogitsFor::None, &cap);
  AtomOptions o;
  o.group_size = 32;
  o.clip = "search";
  const AtomLayer al = quantize_layer_atom(m.checkpoint, 1, o, &cd.layers[1], {},
                                           {&cap.rows[0], &cap.rows[1], &cap.rows[2], &cap.rows[3]});
  int non_default = 0;
  for (const auto& c : al.clips) {
    EXPECT_LE(c.error, c.error_default);
    EXPECT_GT(c.error, 0.0);
    non_default += c.weight != kW4A4WeightClip || c.act != kW4A4ActClip;
  }
  std::printf("  clip search, layer 1: %d of 7 linears chose other ratios than (0.85, 0.9)\n", non_default);
  // CLI: per-linear ratios in the header, and the model runs.
  const std::string out = dir_->file("search.sqm");
  const auto r = convert({"--calib", calib(), "--group-size", "32", "--clip", "search"}, out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto i = run_process({tool("sq-inspect"), "--json", out});
  const auto clip = nlohmann::json::parse(i.out).at("header").at("quantization").at("clip");
  EXPECT_EQ(clip.at("mode"), "search");
  EXPECT_EQ(clip.at("linears").size(), size_t(7 * m.model->config().n_layers));
  EXPECT_LT(ppl(out), ppl(stories_model()) * 1.4);  // measured +29% (full file, 128 calibration windows)
}

TEST_F(AtomCli, InspectBitsPerWeightIsTheLayoutArithmetic) {
  // docs/formats.md, per linear [out, in] with n outliers and G = ⌈(in − n)/g⌉ groups:
  // ⌈out·(in − n)/2⌉ INT4 bytes + 2·out·G scale bytes + out·n INT8 outlier bytes + 4·out outlier
  // scale bytes (n > 0) + 4 bytes act_clip; elements out·in. The whole-file figure adds the F32
  // embedding and norms and the I32 reorders (4·width per gathered site with outliers).
  const LoadedModel m = load_model(stories_model());
  const ModelConfig& c = m.model->config();
  const int64_t d = c.dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim, h = c.hidden_dim;
  const int64_t shapes[7][2] = {{q, d}, {kv, d}, {kv, d}, {d, q}, {h, d}, {h, d}, {d, h}};  // [out, in]
  for (const char* fmt : {"int8", "fp32"})
    for (int64_t g : {32, 0}) {
      int64_t bytes = 0, weights = 0;
      for (const auto& s : shapes) {
        const int64_t out = s[0], in = s[1], n = atom_outlier_count(in, -1), inn = in - n;
        const int64_t G = g == 0 || g >= inn ? 1 : (inn + g - 1) / g;
        bytes += (out * inn + 1) / 2 + 2 * out * G + 4;
        if (n > 0) bytes += std::string(fmt) == "int8" ? out * n + 4 * out : 4 * out * n;
        weights += out * in;
      }
      bytes *= c.n_layers;
      weights *= c.n_layers;
      const int64_t orders = c.n_layers * 4 * (d + q + d);  // attn_input, attn_output, ffn_input
      const int64_t floats = 4 * (int64_t(c.vocab_size) * d + (2 * c.n_layers + 1) * d);
      const int64_t float_elems = int64_t(c.vocab_size) * d + (2 * c.n_layers + 1) * d;
      const std::string out = dir_->file(std::string("bpw-") + fmt + std::to_string(g) + ".sqm");
      ASSERT_EQ(convert({"--calib", calib(), "--group-size", std::to_string(g), "--outlier-format", fmt}, out).exit_status, 0);
      const auto r = run_process({tool("sq-inspect"), "--json", out});
      ASSERT_EQ(r.exit_status, 0) << r.err;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j.at("quantized_linear_bytes").get<int64_t>(), bytes) << fmt << g;
      EXPECT_EQ(j.at("quantized_linear_elements").get<int64_t>(), weights);
      EXPECT_DOUBLE_EQ(j.at("quantized_linear_bits_per_weight").get<double>(), 8.0 * double(bytes) / double(weights));
      EXPECT_EQ(j.at("weight_bytes").get<int64_t>(), bytes + orders + floats);
      EXPECT_EQ(j.at("weight_elements").get<int64_t>(), weights + float_elems);
      EXPECT_DOUBLE_EQ(j.at("bits_per_weight").get<double>(), 8.0 * double(bytes + orders + floats) / double(weights + float_elems));
      if (std::string(fmt) == "int8" && g == 32)
        std::printf("  g32 INT8 outliers: linear bits/w %.4f, file bits/w %.4f, %lld bytes\n",
                    j.at("quantized_linear_bits_per_weight").get<double>(), j.at("bits_per_weight").get<double>(),
                    static_cast<long long>(j.at("file_bytes").get<int64_t>()));
    }
}

TEST_F(AtomCli, BadInputsAreOneLineExitTwo) {
  const std::string out = dir_->file("bad.sqm");
  expect_error(convert({"--calib", calib(), "--outlier-channels", "64"}, out), "--outlier-channels 64 is not below the linear input width 64",
               out);
  expect_error(convert({"--calib", calib(), "--outlier-channels", "x"}, out), "--outlier-channels must be a count", out);
  expect_error(convert({"--calib", calib(), "--group-size", "48"}, out), "--group-size must be 0 (per channel / per token), 32, 64 or 128",
               out);
  expect_error(convert({"--calib", calib(), "--weight-clip", "1.5"}, out), "--weight-clip must be in (0, 1], got 1.5", out);
  expect_error(convert({"--calib", calib(), "--act-clip", "0"}, out), "--act-clip must be in (0, 1], got 0", out);
  expect_error(convert({"--calib", calib(), "--clip", "max"}, out), "--clip must be none, default or search", out);
  expect_error(convert({"--calib", calib(), "--outlier-format", "fp16"}, out), "--outlier-format must be int8 or fp32", out);
  expect_error(convert({"--gptq", "--outlier-channels", "0"}, out), "--gptq needs --calib", out);
  expect_error(convert({}, out), "give --calib (or --outlier-channels 0)", out);
  expect_error(convert({"--calib", calib(), "--asym"}, out), "symmetric only", out);
  expect_error(run_process({tool("sq-convert"), "-m", stories_model(), "--scheme", "w4a16", "--outlier-channels", "8", "-o", out, "-q"}),
               "apply to --scheme w4a4-atom only", out);
  // GPTQ Hessians from a calibration file that has none.
  const std::string plain = dir_->file("plain.h5");
  auto r = run_process({tool("sq-calibrate"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "-f", tinystories_valid(),
                        "--samples", "2", "--seq-len", "64", "-o", plain, "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  expect_error(convert({"--gptq", "--calib", plain, "--gptq-hessians", "file"}, out), "no GPTQ Hessians for layer 0", out);
}

}  // namespace
}  // namespace sq::test
