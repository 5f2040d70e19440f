// Issue 16 acceptance (a): for every architecture, smoothing alone — SmoothQuant factors (α = 0.5,
// from real calibration statistics of the FP32 model) folded through the architecture's mappings
// (calib/smoothing_mappings.h), no quantization — leaves the logits unchanged within FP32 rounding.
// That is the test that the mappings are right: a smooth tensor whose output reaches a linear
// that is not balanced, or a balance linear fed through a non-homogeneous operation, moves the
// logits by orders of magnitude more. Every one of the 14 tiny checkpoints of
// ../shared/data/reference/hf-tiny is listed explicitly (a missing one fails, never skips), with
// the mappings its layer 0 must get.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "calib/smoothing_mappings.h"
#include "calib/stats_collector.h"
#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "runtime/kv_cache.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/test_data.h"
#include "tests/support/token_windows.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

const std::string kQKV = "self_attn.q_proj, self_attn.k_proj, self_attn.v_proj";
const std::string kInLlama = "attn_input: input_layernorm.weight -> " + kQKV;
const std::string kInLN = "attn_input: input_layernorm.weight, input_layernorm.bias -> " + kQKV;
const std::string kFfnGated = "ffn_input: post_attention_layernorm.weight -> mlp.gate_proj, mlp.up_proj";
const std::string kFfnLN = "ffn_input: post_attention_layernorm.weight, post_attention_layernorm.bias -> mlp.up_proj";
const std::string kVoGrouped = "attn_output: self_attn.v_proj.weight -> self_attn.o_proj (grouped)";
const std::string kVoBias = "attn_output: self_attn.v_proj.weight, self_attn.v_proj.bias -> self_attn.o_proj";
const std::string kUpDown = "ffn_hidden: mlp.up_proj.weight -> mlp.down_proj";
const std::vector<std::string> kLlama = {kInLlama, kFfnGated, kVoGrouped, kUpDown};

/// The 14 reference checkpoints with the mappings of their layer 0 (describe_mapping), in order.
/// Omitted on purpose: fc1 → fc2 under GELU (GPT-NeoX, Falcon, GPT-2, BLOOM, MPT: GELU is not
/// positively homogeneous), up → down of Mixtral's experts (no per-expert statistics), and Falcon's
/// ffn_input (its MLP reads the shared input norm, smoothed once together with q, k, v).
const std::map<std::string, std::vector<std::string>>& expected_mappings() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"llama-gqa", kLlama},
      {"llama3-rope-scaled", kLlama},
      {"llama-linear-rope", kLlama},
      {"mistral-sliding-window", kLlama},
      {"qwen2", {kInLlama, kFfnGated, "attn_output: self_attn.v_proj.weight, self_attn.v_proj.bias -> self_attn.o_proj (grouped)", kUpDown}},
      {"mixtral-moe",
       {kInLlama,
        "ffn_input: post_attention_layernorm.weight -> mlp.router, mlp.experts.0.gate_proj, mlp.experts.0.up_proj, "
        "mlp.experts.1.gate_proj, mlp.experts.1.up_proj, mlp.experts.2.gate_proj, mlp.experts.2.up_proj, "
        "mlp.experts.3.gate_proj, mlp.experts.3.up_proj",
        kVoGrouped}},
      // OPT's FFN is ReLU: fc1 → fc2 is exact with positive factors.
      {"opt", {kInLN, kFfnLN, kVoBias, "ffn_hidden: mlp.up_proj.weight, mlp.up_proj.bias -> mlp.down_proj"}},
      {"gpt-neox", {kInLN, kFfnLN, kVoBias}},
      {"falcon", {"attn_input: input_layernorm.weight, input_layernorm.bias -> " + kQKV + ", mlp.up_proj",
                  "attn_output: self_attn.v_proj.weight -> self_attn.o_proj (grouped)"}},
      {"phi3", kLlama},
      {"gemma3-text", {kInLlama, kFfnGated, kVoGrouped, kUpDown}},
      {"gpt2", {kInLN, kFfnLN, kVoBias}},
      {"bloom-alibi", {kInLN, kFfnLN, kVoBias}},
      {"mpt-alibi", {kInLlama, "ffn_input: post_attention_layernorm.weight -> mlp.up_proj", "attn_output: self_attn.v_proj.weight -> self_attn.o_proj"}},
  };
  return m;
}

// Tolerances. The smoothed and the unsmoothed model run the same FP32 kernels; they differ only in
// the rounding of the rescaled weights: every product the smoothed model forms is
// (g/s)·(w·s) = g·w·(1 + ε₁)(1 + ε₂) with |ε| ≤ 2⁻²⁴ ≈ 6e-8 (and LayerNorm biases b/s, V rows v/s,
// up rows u/s likewise), i.e. a relative perturbation of each weight of about one FP32 ulp, plus
// the different rounding of dot products over the rescaled terms. With O(1) logits (|logit| < ~5
// for these N(0, 0.08²) weights) and 2 layers that is ~1e-6: measured 0.95e-6 .. 3.5e-6 over the 13
// two-layer checkpoints (the test prints each); 5e-5 leaves a factor of 14. Gemma 3 amplifies FP32
// rounding ~300x (6 layers, (1 + w) norms in [1.5, 2.5], QK-norm before sharp softmaxes, embedding
// × 8; tests/hf_tiny_architectures_test.cpp: rounding its folded norm weights alone moves its logits
// by 3.4e-5): measured 5.4e-5, tolerance 5e-4 (the same as for its transformers reference). A wrong
// mapping leaves a channel of some linear's input rescaled by its factor (here ~0.6 .. 10) without
// compensation: the test checks for every mapping of layer 0 that leaving out one balance linear
// moves the logits by more than kWrongFactor × the tolerance (measured: 0.34 .. 4.1).
constexpr double kTol = 5e-5;
constexpr double kGemmaTol = 5e-4;
constexpr double kWrongFactor = 100.0;
double tolerance(const std::string& name) { return name == "gemma3-text" ? kGemmaTol : kTol; }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

/// Calibration windows: 8 windows of 48 token ids drawn uniformly from the vocabulary (the
/// checkpoints have no tokenizer; their weights are random, so no text is more "real" than this),
/// with a fixed seed, run through the FP32 model by the calibration code (collect_activation_stats).
std::vector<std::vector<int32_t>> calibration_windows(int vocab) { return random_token_windows(8, 48, vocab, 20240616); }

class SmoothingMappings : public ::testing::TestWithParam<std::string> {};

TEST_P(SmoothingMappings, SmoothingAlonePreservesLogits) {
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const Checkpoint& base = m.checkpoint;
  const ModelConfig& c = base.config;
  ASSERT_FALSE(base.tensors.empty());

  // The mappings are the expected ones (every layer has its layer-0 pattern).
  const auto maps = smoothing_mappings(c);
  const auto& want = expected_mappings().at(name);
  std::vector<std::string> got0;
  for (const auto& mp : maps)
    if (mp.layer == 0) got0.push_back(describe_mapping(mp));
  EXPECT_EQ(got0, want) << name;
  EXPECT_EQ(maps.size(), want.size() * size_t(c.n_layers)) << name;

  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  const std::vector<float> ref = decoder_logits(*m.model, ids);
  const auto stats = collect_activation_stats(*m.model, calibration_windows(c.vocab_size));

  // Every mapping, v → o and up → down included, at α = 0.5.
  SmoothingOptions all;
  all.alpha = 0.5f;
  all.select = {true, true};
  Checkpoint ck = base;
  const auto groups = smooth_checkpoint(ck, stats, all);
  ASSERT_EQ(groups.size(), maps.size());
  // The factors are far from 1, so the test can fail: the smallest and largest of every mapping.
  float s_min = INFINITY, s_max = 0;
  for (const auto& g : groups) {
    const auto [lo, hi] = std::minmax_element(g.factors.begin(), g.factors.end());
    EXPECT_GT(std::max(*hi, 1.0f / *lo), 1.5f) << name << " layer " << g.layer << " " << activation_site_name(g.site);
    s_min = std::min(s_min, *lo);
    s_max = std::max(s_max, *hi);
  }
  const double d = max_abs_diff(ref, decoder_logits(Decoder::from_checkpoint(ck), ids));
  std::printf("[ measured ] %-24s %zu mappings, factors in [%.3g, %.3g], max |dlogit| after smoothing = %.3g (tolerance %.0e)\n",
              name.c_str(), maps.size(), s_min, s_max, d, tolerance(name));
  EXPECT_LT(d, tolerance(name)) << name;
  // The loaded checkpoint and its Decoder, which share storage with `ck`'s tensors before smoothing
  // (Tensor copies are shallow; split, transposed or folded tensors are owned), are untouched.
  EXPECT_EQ(max_abs_diff(ref, decoder_logits(*m.model, ids)), 0.0) << name;
  EXPECT_EQ(max_abs_diff(ref, decoder_logits(Decoder::from_checkpoint(base), ids)), 0.0) << name;

  // A deliberately wrong mapping changes the logits by far more than the tolerance: each mapping
  // of layer 0 applied with its last balance linear left out (the smooth tensors still divided).
  for (size_t k = 0; k < groups.size() && groups[k].layer == 0; ++k) {
    SmoothingMapping wrong = maps[k];
    ASSERT_EQ(wrong.site, groups[k].site);
    wrong.balance.pop_back();
    Checkpoint bad = base;
    apply_mapping(bad, wrong, groups[k].factors);
    const double e = max_abs_diff(ref, decoder_logits(Decoder::from_checkpoint(bad), ids));
    std::printf("[ measured ] %-24s without %s: max |dlogit| = %.3g\n", name.c_str(), maps[k].balance.back().c_str(), e);
    EXPECT_GT(e, kWrongFactor * tolerance(name)) << name << ": " << describe_mapping(maps[k]);
  }
}

std::vector<std::string> checkpoint_names() {
  std::vector<std::string> v;
  for (const auto& [name, _] : expected_mappings()) v.push_back(name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, SmoothingMappings, ::testing::ValuesIn(checkpoint_names()),
                         HfTinyParamName());

// No architecture may go untested: the 14 listed are exactly the folders on disk.
TEST(SmoothingMappingsCoverage, EveryReferenceCheckpointIsListed) {
  std::set<std::string> listed;
  for (const auto& [name, _] : expected_mappings()) listed.insert(name);
  expect_hf_tiny_listed(listed, /*files=*/false);
}

// An architecture can replace the derived mappings (calib/smoothing_mappings.h registry).
std::vector<SmoothingMapping> only_input_norms(const ModelConfig& c) {
  std::vector<SmoothingMapping> out;
  for (auto& m : default_smoothing_mappings(c))
    if (m.site == ActivationSite::AttnInput) out.push_back(std::move(m));
  return out;
}

TEST(SmoothingMappingsRegistry, AnArchitectureOverridesTheDerivedMappings) {
  ModelConfig c;
  c.architecture = "test-override";
  c.n_layers = 2;
  c.dim = 8;
  c.n_heads = c.n_kv_heads = 2;
  c.head_dim = 4;
  EXPECT_EQ(smoothing_mappings(c).size(), 8u);  // attn_input, ffn_input, attn_output, ffn_hidden per layer
  register_smoothing_mappings("test-override", &only_input_norms);
  EXPECT_EQ(smoothing_mappings(c).size(), 2u);
  EXPECT_THROW(smoothing_mapping_at(c, 0, ActivationSite::FfnInput), std::invalid_argument);
  register_smoothing_mappings("test-override", nullptr);
  EXPECT_EQ(smoothing_mappings(c).size(), 8u);
}

}  // namespace
}  // namespace sq::test
