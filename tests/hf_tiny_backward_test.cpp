// Issue 16 acceptance (b) for every architecture: the K/V backward pass (lib/model/decoder_backward.h)
// runs through the DecoderSpec. For each of the 14 tiny Hugging Face checkpoints of
// ../shared/data/reference/hf-tiny, on the reference input_ids (64 tokens; 160 for the RoPE-scaled
// ones):
//   1. the backward module's own forward reproduces Decoder::forward: logits, and the K (before
//      RoPE, after QK-norm) and V an ActivationObserver's on_kv sees;
//   2. ∂L/∂K and ∂L/∂V agree with central finite differences of the FP64 loss at random cache
//      entries of every layer;
//   3. sq-calibrate --token-ids F --hessian --fisher writes finite Hessians and K/V Fisher data for
//      every layer.
// Every architecture is listed explicitly; a missing folder or file fails (never skips), and a
// folder on disk that is not listed fails too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "formats/calibration_h5.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/decoder_backward.h"
#include "model/model_loader.h"
#include "runtime/kv_cache.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

/// The K/V an observer sees per layer, and (mixture of experts) each layer's FfnInput rows.
class Recorder final : public ActivationObserver {
 public:
  explicit Recorder(int layers) : k(size_t(layers)), v(size_t(layers)), ffn_in(size_t(layers)) {}
  void on_kv(int layer, const float* kp, const float* vp, int64_t n, int64_t width) override {
    k[size_t(layer)].assign(kp, kp + n * width);
    v[size_t(layer)].assign(vp, vp + n * width);
  }
  void on_linear_input(int layer, ActivationSite site, const float* x, int64_t n, int64_t width) override {
    if (site == ActivationSite::FfnInput) ffn_in[size_t(layer)].assign(x, x + n * width);
  }
  std::vector<std::vector<float>> k, v, ffn_in;
};

template <typename A, typename B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}
template <typename A>
double max_abs(const std::vector<A>& a) {
  double m = 0;
  for (A x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

class HfTinyBackward : public ::testing::TestWithParam<const char*> {};

// (1) The module's forward is Decoder's. FP32 vs FP32: the two differ in exp (Decoder's
// ops::fast_exp, ≤ 2e−7 relative, against std::exp) and in BLAS blocking of differently shaped
// gemms (experts, per-head scores), i.e. by a few ulps per operation through 2 layers (6 for
// Gemma 3); logits are O(1) here. Bound 1e−5 · max(1, max|logit|) — below the 1e−4 this suite
// allows between sqkit and transformers, so the backward sees the model the forward tests pin.
// The FP64 instance differs from FP32 Decoder by Decoder's own rounding error (tests/
// hf_tiny_architectures_test.cpp: 1e−6 … 6e−5 for Gemma 3), bound 2e−4 · max(1, max|logit|).
// K and V as the cache receives them: layer 0 is computed by the same ops on the same input
// (up to the gemm shape), later layers inherit the logits' kind of differences: bound 1e−5 · max|K|.
TEST_P(HfTinyBackward, ForwardMatchesDecoderAndObserver) {
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const Decoder& model = *m.model;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  const int64_t n = static_cast<int64_t>(ids.size());

  KVCache cache(c, n);
  Workspace ws;
  std::vector<float> ref(static_cast<size_t>(n * c.vocab_size));
  Recorder rec(c.n_layers);
  model.forward(ids.data(), n, cache, ws, ref.data(), LogitsFor::AllTokens, &rec);

  const DecoderKVBackward<float> bw(model);
  std::vector<float> logits32;
  const double loss32 = bw.loss(ids.data(), n, nullptr, &logits32);
  const KVGradients g = bw.gradients(ids.data(), n);
  std::vector<double> logits64;
  const double loss64 = DecoderKVBackward<double>(model).loss(ids.data(), n, nullptr, &logits64);

  const double scale = std::max(1.0, max_abs(ref)), d32 = max_abs_diff(logits32, ref), d64 = max_abs_diff(logits64, ref);
  double worst_kv = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = g.layers[size_t(l)];
    const double dk = max_abs_diff(L.keys, rec.k[size_t(l)]) / max_abs(rec.k[size_t(l)]);
    const double dv = max_abs_diff(L.values, rec.v[size_t(l)]) / max_abs(rec.v[size_t(l)]);
    EXPECT_LE(dk, 1e-5) << name << " layer " << l << " K";
    EXPECT_LE(dv, 1e-5) << name << " layer " << l << " V";
    worst_kv = std::max({worst_kv, dk, dv});
  }
  std::printf("[ measured ] %-24s max|logit| %.3f  max|fp32 − Decoder| %.3g  max|fp64 − Decoder| %.3g  K/V rel %.3g  "
              "loss %.6f\n",
              name.c_str(), max_abs(ref), d32, d64, worst_kv, loss64);
  EXPECT_LT(d32, 1e-5 * scale) << name;
  EXPECT_LT(d64, 2e-4 * scale) << name;
  EXPECT_EQ(g.loss, loss32);
  EXPECT_NEAR(loss32, loss64, 1e-5 * loss64) << name;
  // Random weights: the mean NLL is near log(320) = 5.77.
  EXPECT_GT(loss64, 4.0) << name;
  EXPECT_LT(loss64, 8.0) << name;
}

/// Smallest gap p_(K) − p_(K+1) between the K-th and (K+1)-th router probabilities over every token
/// and expert layer (∞ without experts): how far a perturbation must move a router before a
/// token's top-K set can change.
double min_routing_margin(const Decoder& model, const Recorder& rec, int64_t n) {
  const ModelConfig& c = model.config();
  const int E = c.spec.n_experts, K = c.spec.experts_per_token;
  double margin = INFINITY;
  if (E == 0) return margin;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<float> p(size_t(n * E));
    model.layers()[size_t(l)].router->forward(rec.ffn_in[size_t(l)].data(), n, p.data());
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> row(p.begin() + t * E, p.begin() + (t + 1) * E);
      const double mx = *std::max_element(row.begin(), row.end());
      double sum = 0;
      for (double& x : row) sum += (x = std::exp(x - mx));
      for (double& x : row) x /= sum;
      std::sort(row.begin(), row.end(), std::greater<>());
      margin = std::min(margin, row[size_t(K - 1)] - row[size_t(K)]);
    }
  }
  return margin;
}

// (2) Central finite differences (L(a+h) − L(a−h)) / 2h of the FP64 loss at 4 random (token < n−1,
// channel) entries of K and of V in every layer, plus one entry of the last token (gradient exactly
// 0, see decoder_backward.h), against the FP64 backward.
//
// Step h = 1e−4 on activations of size O(0.1 … 3): the truncation error h²/6·|∂³L/∂a³| is ~1e−9
// relative for curvature on the scale of the activations, the rounding error of the quotient
// ~1e−16·|L|·(a few hundred roundings)/h ≈ 1e−11 absolute. Bound: relative error 1e−4 with the
// floor max(|g|, 1e−3·max|g| of that layer's tensor), as for stories260K
// (tests/decoder_backward_test.cpp): elements a thousand times smaller than the largest are
// compared in absolute terms at that scale.
// Kinks: ReLU (OPT) and top-K routing (Mixtral) are piecewise. A ±h perturbation crosses a ReLU kink
// only where a pre-activation lies within ~h·|∂pre/∂a| ≲ 1e−5 of 0; routing changes only where two
// router probabilities are closer than the perturbation moves them (≲ 1e−6 here: one K/V element
// by 1e−4, damped by a softmax and two projections with weights ~0.08 — an estimate, not
// measured). The test asserts the smallest top-K margin of the unperturbed run is ≥ 1e−4
// (measured 1.9e−4 on mixtral-moe's reference ids). Either event would make the quotient jump by
// O(jump/2h) and the check fail, never pass spuriously.
TEST_P(HfTinyBackward, KVGradientsMatchFiniteDifferences) {
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const Decoder& model = *m.model;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  const int64_t n = static_cast<int64_t>(ids.size());

  KVCache cache(c, n);
  Workspace ws;
  Recorder rec(c.n_layers);
  model.forward(ids.data(), n, cache, ws, nullptr, LogitsFor::None, &rec);
  const double margin = min_routing_margin(model, rec, n);
  if (c.spec.n_experts > 0) {
    EXPECT_GE(margin, 1e-4) << name << ": a router margin too small for the step";
  }

  const DecoderKVBackward<double> bw(model);
  const BasicKVGradients<double> g = bw.gradients(ids.data(), n);
  EXPECT_EQ(g.loss, bw.loss(ids.data(), n));  // the same forward
  const double h = 1e-4;
  struct Sample {
    int layer;
    KVTensor which;
    int64_t token, channel;
    double fd = 0;
  };
  std::vector<Sample> samples;  // per layer and tensor: 4 random entries (token < n−1), 1 of the last token
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int64_t> tok(0, n - 2), ch(0, g.width - 1);
  for (int l = 0; l < c.n_layers; ++l)
    for (KVTensor which : {KVTensor::Key, KVTensor::Value})
      for (int s = 0; s <= 4; ++s) {
        const int64_t t = s < 4 ? tok(rng) : n - 1;
        samples.push_back({l, which, t, ch(rng)});
      }
  // The 2·|samples| losses are independent: one per thread (BLAS then runs serially inside), which
  // on a small shared machine is far faster than threading each tiny gemm.
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < samples.size(); ++i) {
    Sample& s = samples[i];
    KVPerturbation p{s.layer, s.which, s.token, s.channel, +h};
    const double up = bw.loss(ids.data(), n, &p);
    p.delta = -h;
    const double down = bw.loss(ids.data(), n, &p);
    s.fd = (up - down) / (2 * h);
  }
  int checked = 0, below_floor = 0;
  double worst = 0;
  for (const Sample& s : samples) {
    const auto& L = g.layers[size_t(s.layer)];
    const std::vector<double>& grad = s.which == KVTensor::Key ? L.d_keys : L.d_values;
    const double scale = max_abs(grad);
    EXPECT_GT(scale, 0.0) << name << " layer " << s.layer;
    const double an = grad[size_t(s.token * g.width + s.channel)];
    if (s.token == n - 1) {
      EXPECT_EQ(an, 0.0) << name << ": the last token's K/V do not reach the loss";
    }
    const double rel = std::fabs(s.fd - an) / std::max(std::fabs(an), 1e-3 * scale);
    EXPECT_LT(rel, 1e-4) << name << " layer " << s.layer << (s.which == KVTensor::Key ? " K" : " V") << " token " << s.token
                         << " channel " << s.channel << ": backward " << an << ", finite difference " << s.fd;
    worst = std::max(worst, rel);
    below_floor += std::fabs(an) < 1e-3 * scale;
    ++checked;
  }
  std::printf("[ measured ] %-24s %d K/V elements, %d below the floor, worst relative error %.3g%s\n", name.c_str(), checked,
              below_floor, worst,
              c.spec.n_experts > 0 ? (", min top-K router margin " + std::to_string(margin)).c_str() : "");
  EXPECT_EQ(checked, c.n_layers * 2 * 5);
  // Most sampled elements must be tested in relative terms, not against the floor (the last-token
  // zeros always are below it: 2 per layer).
  EXPECT_LE(below_floor, checked / 2) << name;
}

// (3) The tool end to end: 3 windows of 16 tokens cut from the reference ids.
TEST_P(HfTinyBackward, SqCalibrateRecordsHessiansAndFisher) {
  const std::string name = GetParam();
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  ScratchDir dir;
  std::string text;
  for (int32_t id : ids) text += std::to_string(id) + " ";
  write_file(dir.file("ids.txt"), text);
  const std::string out = dir.file("calib.h5");
  const auto r = run_process({tool("sq-calibrate"), "-m", hf_tiny(name), "--token-ids", dir.file("ids.txt"), "--samples", "3",
                              "--seq-len", "16", "--hessian", "--fisher", "-o", out, "-q"});
  ASSERT_EQ(r.exit_status, 0) << name << ": " << r.err;
  const CalibrationData d = read_calibration_h5(out);
  const LoadedModel m = load_model(hf_tiny(name));
  const ModelConfig& c = m.model->config();
  ASSERT_TRUE(d.has_fisher()) << name;
  ASSERT_EQ(d.layers.size(), size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerStats& L = d.layers[size_t(l)];
    const KVFisherSamples& f = L.kv_fisher;
    EXPECT_EQ(f.tokens, 3 * 15) << name;  // every (window, position ≤ 14): below --fisher-tokens
    EXPECT_EQ(f.width, int64_t(c.n_kv_heads) * c.head_dim) << name;
    for (const std::vector<float>* a : {&f.keys, &f.values, &f.keys_fisher, &f.values_fisher}) {
      EXPECT_TRUE(std::all_of(a->begin(), a->end(), [](float x) { return std::isfinite(x); })) << name << " layer " << l;
      EXPECT_GT(max_abs(*a), 0.0) << name << " layer " << l;
    }
    ASSERT_EQ(L.hessians.size(), size_t(kActivationSites)) << name;
    for (int s = 0; s < kActivationSites; ++s) {
      const std::vector<double>& H = L.hessians[size_t(s)];
      EXPECT_FALSE(H.empty()) << name;
      EXPECT_TRUE(std::all_of(H.begin(), H.end(), [](double x) { return std::isfinite(x); })) << name;
      EXPECT_GT(max_abs(H), 0.0) << name << " layer " << l << " site " << s;
    }
  }
  std::printf("[ measured ] %-24s sq-calibrate: %lld Fisher tokens x %lld channels per layer, mean NLL %.4f\n", name.c_str(),
              static_cast<long long>(d.layers[0].kv_fisher.tokens), static_cast<long long>(d.layers[0].kv_fisher.width),
              d.fisher_mean_loss);
}

INSTANTIATE_TEST_SUITE_P(All, HfTinyBackward, ::testing::ValuesIn(kHfTinyCheckpoints),
                         HfTinyParamName());

// No architecture may go untested: every listed folder exists, and every folder on disk is listed.
TEST(HfTinyBackward, EveryReferenceCheckpointIsListed) {
  expect_hf_tiny_listed({std::begin(kHfTinyCheckpoints), std::end(kHfTinyCheckpoints)}, /*files=*/true);
}

}  // namespace
}  // namespace sq::test
