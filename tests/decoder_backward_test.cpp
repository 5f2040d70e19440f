// Reverse-mode K/V gradients (lib/model/decoder_backward.h): the module's own forward equals
// Decoder::forward (logits) and an ActivationObserver's K/V; the backward agrees with central
// finite differences of the loss in double precision on sampled K and V elements of every layer
// of stories260K (interleaved RoPE, tied head) and of a small synthetic model with half-split RoPE,
// q/k/v biases and an untied head; the FP32 backward agrees with the FP64 one. The same checks on
// every architecture of the DecoderSpec (the 14 tiny Hugging Face checkpoints): tests/hf_tiny_backward_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/error.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/tokenizer.h"
#include "model/decoder_backward.h"
#include "model/decoder.h"
#include "model/quantize_in_memory.h"
#include "model/synthetic.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

/// The first `n` tokens (BOS first) of tinystories-valid-1000.txt.
std::vector<int32_t> story_tokens(int64_t n) {
  auto tok = load_tokenizer(test::stories_tokenizer());
  const std::string text = test::read_file(test::tinystories_valid()).substr(0, 8 * static_cast<size_t>(n));
  const std::vector<int> ids = tok->encode(text, true, false);
  if (static_cast<int64_t>(ids.size()) < n) throw std::runtime_error("too little text");
  return std::vector<int32_t>(ids.begin(), ids.begin() + n);
}

/// Records the pre-RoPE keys and values Decoder::forward shows an observer: [layer] → [n, kvw].
class KVRecorder final : public ActivationObserver {
 public:
  explicit KVRecorder(int layers) : k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers)) {}
  void on_kv(int layer, const float* kp, const float* vp, int64_t n, int64_t width) override {
    k[static_cast<size_t>(layer)].assign(kp, kp + n * width);
    v[static_cast<size_t>(layer)].assign(vp, vp + n * width);
  }
  std::vector<std::vector<float>> k, v;
};

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

struct FdResult {
  int checked = 0;
  int below_floor = 0;     // elements with |g| < floor (compared against the floor)
  double worst_rel = 0.0;  // max over sampled elements of |fd − g| / max(|g|, floor)
};

/// Central finite differences (L(a+h) − L(a−h)) / 2h of the double-precision loss for `per_tensor`
/// random elements (token < n−1) of K and of V in every layer, plus one element of the last token
/// (whose gradient is exactly 0, see decoder_backward.h), compared with the double backward.
///
/// Step h = 1e-4 (activations are O(0.1 … 10) here): the truncation error h²/6·L''' is ~1e−9
/// relative to a gradient of the same curvature scale, and the rounding error of the quotient,
/// ~1e−16·|L|·(a few hundred accumulated roundings)/h ≈ 1e−12 absolute, is far below the
/// tolerance. Relative errors use the floor max(|g|, 1e−3·max|g| of that layer's tensor): an
/// element a thousand times smaller than the largest one is compared in absolute terms against
/// that scale (the gradient of the last token is exactly 0 and has no relative error).
FdResult finite_difference_check(const Decoder& model, const std::vector<int32_t>& tokens, int per_tensor,
                                 uint32_t seed) {
  const DecoderKVBackward<double> bw(model);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const BasicKVGradients<double> g = bw.gradients(tokens.data(), n);
  EXPECT_NEAR(g.loss, bw.loss(tokens.data(), n), 1e-15 * g.loss);  // the same forward
  const double h = 1e-4;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tok(0, n - 2), ch(0, g.width - 1);
  FdResult r;
  for (int l = 0; l < model.config().n_layers; ++l)
    for (KVTensor which : {KVTensor::Key, KVTensor::Value}) {
      const std::vector<double>& grad = which == KVTensor::Key ? g.layers[size_t(l)].d_keys : g.layers[size_t(l)].d_values;
      double scale = 0;
      for (double x : grad) scale = std::max(scale, std::fabs(x));
      EXPECT_GT(scale, 0.0) << "layer " << l;
      for (int s = 0; s <= per_tensor; ++s) {
        const int64_t t = s < per_tensor ? tok(rng) : n - 1, c = ch(rng);
        KVPerturbation p{l, which, t, c, +h};
        const double up = bw.loss(tokens.data(), n, &p);
        p.delta = -h;
        const double down = bw.loss(tokens.data(), n, &p);
        const double fd = (up - down) / (2 * h), an = grad[size_t(t * g.width + c)];
        if (t == n - 1) {
          EXPECT_EQ(an, 0.0) << "the last token's K/V do not reach the loss";
        }
        const double rel = std::fabs(fd - an) / std::max(std::fabs(an), 1e-3 * scale);
        EXPECT_LT(rel, 1e-4) << "layer " << l << (which == KVTensor::Key ? " K" : " V") << " token " << t << " channel " << c
                             << ": backward " << an << ", finite difference " << fd;
        r.worst_rel = std::max(r.worst_rel, rel);
        if (std::fabs(an) < 1e-3 * scale) ++r.below_floor;
        ++r.checked;
      }
    }
  return r;
}

TEST(DecoderBackward, ForwardMatchesDecoderAndObserver) {
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  const ModelConfig& c = model.config();
  const std::vector<int32_t> tokens = story_tokens(200);
  const int64_t n = static_cast<int64_t>(tokens.size());

  KVCache cache(c, n);
  Workspace ws;
  std::vector<float> ref(static_cast<size_t>(n * c.vocab_size));
  KVRecorder rec(c.n_layers);
  model.forward(tokens.data(), n, cache, ws, ref.data(), LogitsFor::AllTokens, &rec);

  const DecoderKVBackward<float> bw(model);
  std::vector<float> logits;
  bw.loss(tokens.data(), n, nullptr, &logits);
  const KVGradients g = bw.gradients(tokens.data(), n);
  std::vector<double> logits64;
  const double loss64 = DecoderKVBackward<double>(model).loss(tokens.data(), n, nullptr, &logits64);

  // Both forwards are FP32 with the same operation order except the exponentials (Decoder uses
  // ops::fast_exp, ≤ 2e−7 relative; this module std::exp) and BLAS blocking. Through 5 layers that
  // is ~1.6e−6 of max|logit| (measured 3.7e−5 absolute at max|logit| 23.6; Decoder's own FP32
  // error against the FP64 forward is 2.7e−5): bound 2e−5·max|logit|, 12× the measured.
  const double scale = max_abs(ref);
  const double diff = max_abs_diff(logits, ref);
  double diff64 = 0;
  for (size_t i = 0; i < ref.size(); ++i) diff64 = std::max(diff64, std::fabs(logits64[i] - double(ref[i])));
  std::printf("logits: max|ref| %.3f, max|fp32 − ref| %.3g, max|fp64 − ref| %.3g; loss fp32 %.9f fp64 %.12f\n", scale, diff,
              diff64, g.loss, loss64);
  EXPECT_LT(diff, 2e-5 * scale);
  EXPECT_LT(diff64, 2e-5 * scale);
  // The mean NLL in FP32 vs FP64: relative 1e−5 (FP32 logits carry ~1e−6 relative error).
  EXPECT_NEAR(g.loss, loss64, 1e-5 * loss64);
  // Perplexity sanity: stories260K on its own domain has a mean NLL well below log(512) = 6.24.
  EXPECT_GT(g.loss, 0.5);
  EXPECT_LT(g.loss, 3.0);

  // K (pre-RoPE) and V: layer 0 comes from the same sgemm on the same RMSNorm output, so it is
  // identical; later layers inherit the exp differences (bound 1e−5·max|K|, ~100 ulps).
  ASSERT_EQ(g.layers.size(), size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = g.layers[size_t(l)];
    ASSERT_EQ(L.keys.size(), size_t(n * g.width));
    const double tol = l == 0 ? 0.0 : 1e-5;
    EXPECT_LE(max_abs_diff(L.keys, rec.k[size_t(l)]), tol * max_abs(rec.k[size_t(l)])) << "layer " << l;
    EXPECT_LE(max_abs_diff(L.values, rec.v[size_t(l)]), tol * max_abs(rec.v[size_t(l)])) << "layer " << l;
  }
}

TEST(DecoderBackward, GradientsMatchFiniteDifferencesOnStories260K) {
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  // 5 layers × {K, V} × (4 random + 1 last-token) = 50 elements.
  const FdResult r = finite_difference_check(model, story_tokens(64), 4, 2024);
  EXPECT_EQ(r.checked, 50);
  std::printf("stories260K: %d elements (%d below the floor), worst relative error %.3g\n", r.checked, r.below_floor,
              r.worst_rel);
  // Most sampled elements must be tested in relative terms, not against the floor: measured 12 of
  // 50 below it, 10 of them the last token's exact zeros.
  EXPECT_LE(r.below_floor, 20);
}

TEST(DecoderBackward, GradientsMatchFiniteDifferencesWithHalfSplitRopeBiasesAndUntiedHead) {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.max_seq_len = 64;
  c.rope_layout = RopeLayout::HalfSplit;
  c.tied_embeddings = false;
  c.qkv_bias = true;
  Checkpoint ck = make_synthetic_checkpoint(c, 99);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (int l = 0; l < c.n_layers; ++l)
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
      const int64_t out = std::string(p) == "q_proj" ? c.n_heads * c.head_dim : c.n_kv_heads * c.head_dim;
      std::vector<float> b(static_cast<size_t>(out));
      for (float& x : b) x = nd(rng);
      ck.tensors[names::layer(l) + "self_attn." + p + ".bias"] = Tensor::from_vector({out}, b);
    }
  const Decoder model = Decoder::from_checkpoint(ck);
  std::vector<int32_t> tokens(40);
  std::uniform_int_distribution<int32_t> id(0, c.vocab_size - 1);
  for (int32_t& t : tokens) t = id(rng);

  // The forward still equals Decoder's (biases, half-split RoPE, untied head); 2 layers, so the
  // stories260K bound (2e−5·max|logit|) holds with more room.
  KVCache cache(c, 40);
  Workspace ws;
  std::vector<float> ref(size_t(40 * c.vocab_size)), logits;
  model.forward(tokens.data(), 40, cache, ws, ref.data(), LogitsFor::AllTokens);
  DecoderKVBackward<float>(model).loss(tokens.data(), 40, nullptr, &logits);
  EXPECT_LT(max_abs_diff(logits, ref), 2e-5 * max_abs(ref));

  // 2 layers × {K, V} × (10 random + 1 last-token) = 44 elements.
  const FdResult r = finite_difference_check(model, tokens, 10, 77);
  EXPECT_EQ(r.checked, 44);
  std::printf("synthetic half-split: %d elements (%d below the floor), worst relative error %.3g\n", r.checked,
              r.below_floor, r.worst_rel);
  EXPECT_LE(r.below_floor, 16);  // measured 5 of 44 (4 last-token zeros)
}

TEST(DecoderBackward, Fp32GradientsAgreeWithFp64) {
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  const std::vector<int32_t> tokens = story_tokens(256);
  const KVGradients g32 = kv_gradients(model, tokens.data(), 256);
  const BasicKVGradients<double> g64 = DecoderKVBackward<double>(model).gradients(tokens.data(), 256);
  // FP32 rounding (ε = 6e−8) amplified through 5 layers, two softmaxes and the residual stream:
  // measured worst 1.7e−5 of each tensor's largest gradient; bound 2e−4, 12× that (the FP32 Fisher
  // weights g² are then within 0.04% of the tensor's largest weight of the FP64 ones).
  double worst = 0;
  for (int l = 0; l < model.config().n_layers; ++l)
    for (int which = 0; which < 2; ++which) {
      const auto& a = which == 0 ? g32.layers[size_t(l)].d_keys : g32.layers[size_t(l)].d_values;
      const auto& b = which == 0 ? g64.layers[size_t(l)].d_keys : g64.layers[size_t(l)].d_values;
      double scale = 0, diff = 0;
      for (size_t i = 0; i < b.size(); ++i) {
        scale = std::max(scale, std::fabs(b[i]));
        diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
      }
      EXPECT_LT(diff, 2e-4 * scale) << "layer " << l << (which == 0 ? " K" : " V");
      worst = std::max(worst, diff / scale);
      // The last token's row is exactly zero in both precisions.
      for (int64_t c = 0; c < g32.width; ++c) EXPECT_EQ(a[size_t(255 * g32.width + c)], 0.0f);
    }
  std::printf("fp32 vs fp64 gradients: worst max|Δ|/max|g| = %.3g\n", worst);
}

TEST(DecoderBackward, RejectsQuantizedModelsAndBadArguments) {
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  Decoder model = Decoder::from_checkpoint(ck);
  const DecoderKVBackward<float> bw(model);
  const std::vector<int32_t> tokens = story_tokens(8);
  EXPECT_THROW(bw.loss(tokens.data(), 1), std::invalid_argument);
  EXPECT_THROW(bw.loss(tokens.data(), 513), std::invalid_argument);  // above max_seq_len 512
  const KVPerturbation bad{5, KVTensor::Key, 0, 0, 1.0};            // layer 5 of 5
  EXPECT_THROW(bw.loss(tokens.data(), 8, &bad), std::invalid_argument);
  const int32_t oov[2] = {1, 512};
  EXPECT_THROW(bw.loss(oov, 2), std::out_of_range);
  quantize_linears_w8a8(model, WeightGranularity::PerChannel, ActQuant::PerToken, false);
  try {
    DecoderKVBackward<float> q(model);
    ADD_FAILURE() << "no exception for a W8A8 model";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 q_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sq
