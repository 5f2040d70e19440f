// SmoothQuant smoothing (Eq. 3.3-3.4): factor values by hand, and exact function preservation on
// the real model for every foldable site, including --smooth-vo under grouped-query attention.
#include <gtest/gtest.h>

#include <cmath>

#include "calib/smoothquant.h"
#include "calib/stats_collector.h"
#include "core/error.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "model/synthetic.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

TEST(SmoothQuant, FactorsFollowEquation34) {
  // s = a^α / w^(1-α): (4, 1) at α=0.5 → 2; (9, 4) → 3/2; α=1 → a; α=0 → 1/w.
  auto s = smoothing_factors({4.0f, 9.0f}, {1.0f, 4.0f}, 0.5f);
  EXPECT_FLOAT_EQ(s[0], 2.0f);
  EXPECT_FLOAT_EQ(s[1], 1.5f);
  EXPECT_FLOAT_EQ(smoothing_factors({9.0f}, {4.0f}, 1.0f)[0], 9.0f);
  EXPECT_FLOAT_EQ(smoothing_factors({9.0f}, {4.0f}, 0.0f)[0], 0.25f);
  // Zero and denormal maxima are clamped at 1e-5 instead of giving 0, inf or NaN.
  auto z = smoothing_factors({0.0f, 1e-30f}, {0.0f, 2.0f}, 0.5f);
  EXPECT_FLOAT_EQ(z[0], 1.0f);
  EXPECT_NEAR(z[1], std::sqrt(1e-5 / 2.0), 1e-9);
  EXPECT_THROW(smoothing_factors({1.0f}, {1.0f}, 1.5f), UsageError);
  EXPECT_THROW(smoothing_factors({1.0f}, {1.0f}, -0.1f), UsageError);
  EXPECT_THROW(smoothing_factors({1.0f, 2.0f}, {1.0f}, 0.5f), UsageError);
}

std::vector<int32_t> sample_tokens(size_t n) {
  auto tok = load_tokenizer(test::stories_tokenizer());
  auto ids = tok->encode(read_file_to_string(test::tinystories_valid()).substr(0, 3000), true, false);
  return std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(n));
}

std::vector<float> logits_of(const Checkpoint& ck, const std::vector<int32_t>& tokens) {
  const Decoder m = Decoder::from_checkpoint(ck);
  KVCache cache(ck.config, static_cast<int64_t>(tokens.size()));
  Workspace ws;
  std::vector<float> out(tokens.size() * static_cast<size_t>(ck.config.vocab_size));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), cache, ws, out.data(), LogitsFor::AllTokens);
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(SmoothQuant, SmoothingPreservesTheFunctionOfStories260K) {
  const Checkpoint base = load_llama2c_checkpoint(test::stories_model());
  const auto tokens = sample_tokens(128);
  const auto ref = logits_of(base, tokens);
  const std::vector<std::vector<int32_t>> windows = {tokens};
  const auto stats = collect_activation_stats(Decoder::from_checkpoint(base), windows);
  for (float alpha : {0.3f, 0.5f, 0.85f}) {
    Checkpoint ck = base;
    for (int l = 0; l < ck.config.n_layers; ++l)
      for (ActivationSite site : {ActivationSite::AttnInput, ActivationSite::FfnInput, ActivationSite::AttnOutput}) {
        const auto s = compute_group_factors(ck, stats[size_t(l)], l, site, alpha);
        apply_smoothing(ck, l, site, s);
      }
    // Logits are O(10); smoothing rescales by factors within ~[0.05, 20] here, so FP32 rounding of
    // the rescaled weights moves logits by ~1e-6..1e-5.
    EXPECT_LT(max_abs_diff(ref, logits_of(ck, tokens)), 1e-4f) << "alpha " << alpha;
    // The loaded model is untouched (smoothing replaced the tensors by owned copies).
    EXPECT_EQ(base.tensors.at("model.layers.0.input_layernorm.weight").owned(), false);
  }
}

TEST(SmoothQuant, SmoothedAbsmaxIsTheStatisticOfTheSmoothedActivation) {
  // Smoothing divides channel j by s_j, so the smoothed model's calibrated absmax is absmax/s.
  const Checkpoint base = load_llama2c_checkpoint(test::stories_model());
  const std::vector<std::vector<int32_t>> windows = {sample_tokens(128)};
  const auto stats = collect_activation_stats(Decoder::from_checkpoint(base), windows);
  Checkpoint ck = base;
  const auto s_in = compute_group_factors(ck, stats[1], 1, ActivationSite::AttnInput, 0.5f);
  apply_smoothing(ck, 1, ActivationSite::AttnInput, s_in);
  const auto s_vo = compute_group_factors(ck, stats[1], 1, ActivationSite::AttnOutput, 0.5f);
  apply_smoothing(ck, 1, ActivationSite::AttnOutput, s_vo);
  const auto after = collect_activation_stats(Decoder::from_checkpoint(ck), windows);
  for (ActivationSite site : {ActivationSite::AttnInput, ActivationSite::AttnOutput}) {
    const auto& s = site == ActivationSite::AttnInput ? s_in : s_vo;
    const auto predicted = smoothed_absmax(ck.config, site, stats[1].inputs[size_t(site)].absmax, s);
    const auto& measured = after[1].inputs[size_t(site)].absmax;
    for (size_t j = 0; j < predicted.size(); ++j) EXPECT_NEAR(predicted[j], measured[j], 1e-4f * (1 + measured[j])) << j;
  }
}

TEST(SmoothQuant, OutlierVariantPreservesFunctionAndCreatesOutliers) {
  const Checkpoint base = load_llama2c_checkpoint(test::stories_model());
  const Checkpoint variant = make_outlier_variant(base, {3, 17, 29, 50}, 64.0f);
  const auto tokens = sample_tokens(128);
  EXPECT_LT(max_abs_diff(logits_of(base, tokens), logits_of(variant, tokens)), 1e-4f);  // issue #3 acceptance 2
  const std::vector<std::vector<int32_t>> windows = {tokens};
  const auto before = collect_activation_stats(Decoder::from_checkpoint(base), windows);
  const auto after = collect_activation_stats(Decoder::from_checkpoint(variant), windows);
  for (int c : {3, 17, 29, 50})
    EXPECT_FLOAT_EQ(after[0].inputs[0].absmax[size_t(c)] / before[0].inputs[0].absmax[size_t(c)], 64.0f);
}

}  // namespace
}  // namespace sq
