// AWQ (calib/awq.h; issue 36 item 1): the factors are the definition (RMS^α centred on 1, reduced
// over a GQA group by max), the scaling alone leaves every architecture's FP32 function unchanged
// (the smoothing mappings carry it, as SmoothQuant's: tests/smoothing_mappings_test.cpp), and
// `sq-convert --awq` records its search and refuses what it cannot do.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "calib/awq.h"
#include "calib/smoothing_mappings.h"
#include "calib/stats_collector.h"
#include "core/error.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "tests/support/cli.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "tests/support/scheme_cli_fixture.h"
#include "tests/support/test_data.h"
#include "tests/support/token_windows.h"

namespace sq::test {
namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

TEST(AwqFactors, AreTheChannelRmsToTheAlphaCentredOnOne) {
  // llama-gqa: 4 query heads over 2 KV heads, so v → o reduces two o_proj columns per V channel.
  const LoadedModel m = load_model(hf_tiny("llama-gqa"));
  const auto stats = collect_activation_stats(*m.model, random_token_windows(4, 32, m.model->config().vocab_size, 7));
  for (const SmoothingMapping& mp : layer_smoothing_mappings(m.checkpoint.config, 0, {true, true})) {
    SCOPED_TRACE(describe_mapping(mp));
    const ChannelStats& cs = stats[0].inputs.at(size_t(mp.site));
    const size_t C = size_t(mapping_channels(m.checkpoint, mp));
    // The definition, in double: RMS per balance column, max over the columns of a smooth channel.
    std::vector<double> rms(C, 0.0);
    for (size_t j = 0; j < cs.sum_sq.size(); ++j) {
      const size_t c = mp.balance_channel.empty() ? j : size_t(mp.balance_channel[j]);
      rms[c] = std::max(rms[c], std::sqrt(cs.sum_sq[j] / double(cs.tokens)));
    }
    for (const float alpha : {0.0f, 0.35f, 0.95f}) {
      const std::vector<float> s = awq_mapping_factors(m.checkpoint, mp, stats[0], alpha);
      ASSERT_EQ(s.size(), C);
      double lo = INFINITY, hi = 0;
      for (double r : rms) {
        lo = std::min(lo, std::pow(std::max(r, 1e-4), double(alpha)));
        hi = std::max(hi, std::pow(std::max(r, 1e-4), double(alpha)));
      }
      for (size_t c = 0; c < C; ++c) {
        const double want = std::pow(std::max(rms[c], 1e-4), double(alpha)) / std::sqrt(lo * hi);
        // One FP32 rounding of a value computed in double.
        EXPECT_NEAR(s[c], want, want * 1e-6) << "alpha " << alpha << " channel " << c;
      }
      // Centred on 1: the largest and smallest factors are reciprocal (α = 0: all exactly 1).
      const auto [mn, mx] = std::minmax_element(s.begin(), s.end());
      EXPECT_NEAR(double(*mn) * double(*mx), 1.0, 1e-5) << "alpha " << alpha;
      if (alpha == 0.0f) {
        for (float v : s) EXPECT_EQ(v, 1.0f);
      } else {
        EXPECT_GT(*mx / *mn, 1.05f) << "alpha " << alpha;  // the statistics are not flat: the factors move
      }
    }
  }
  EXPECT_THROW(awq_mapping_factors(m.checkpoint, smoothing_mapping_at(m.checkpoint.config, 0, ActivationSite::AttnInput), stats[0], 1.5f),
               UsageError);
  const std::vector<float> grid = awq_alpha_grid();
  ASSERT_EQ(grid.size(), 20u);
  EXPECT_EQ(grid.front(), 0.0f);
  EXPECT_NEAR(grid.back(), 0.95f, 1e-6);
}

// The AWQ scaling alone (α = 0.5 on every mapping, no quantization) leaves the logits unchanged
// within FP32 rounding on every architecture. Tolerances as tests/smoothing_mappings_test.cpp (the
// same transform with other factors): 5e-5 for the two-layer checkpoints, 5e-4 for Gemma 3, which
// amplifies FP32 rounding ~300×. The factors span well over 1.5×, and a scaling folded into the
// smooth tensors without its balance linears moves the logits by orders of magnitude more
// (that failure mode is smoothing_mappings_test's; here the factors are AWQ's).
class AwqScaling : public ::testing::TestWithParam<std::string> {};

TEST_P(AwqScaling, AlonePreservesLogits) {
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const ModelConfig& c = m.checkpoint.config;
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  const std::vector<float> ref = decoder_logits(*m.model, ids);
  const auto stats = collect_activation_stats(*m.model, random_token_windows(8, 48, c.vocab_size, 20240616));
  SmoothingOptions o;
  o.alpha = 0.5f;
  o.select = {true, true};
  o.factors = awq_mapping_factors;
  Checkpoint ck = m.checkpoint;
  const auto groups = smooth_checkpoint(ck, stats, o);
  ASSERT_FALSE(groups.empty());
  float spread = 1.0f;
  for (const auto& g : groups) {
    const auto [lo, hi] = std::minmax_element(g.factors.begin(), g.factors.end());
    spread = std::max(spread, *hi / *lo);
  }
  EXPECT_GT(spread, 1.5f) << name;
  const double d = max_abs_diff(ref, decoder_logits(Decoder::from_checkpoint(ck), ids));
  const double tol = name == "gemma3-text" ? 5e-4 : 5e-5;
  std::printf("[ measured ] %-24s %zu AWQ groups, largest factor spread %.3g, max |dlogit| %.3g (tolerance %.0e)\n", name.c_str(),
              groups.size(), spread, d, tol);
  EXPECT_LT(d, tol) << name;
}

std::vector<std::string> all_checkpoints() {
  const std::set<std::string> on_disk = hf_tiny_folders_on_disk();
  return std::vector<std::string>(on_disk.begin(), on_disk.end());
}

INSTANTIATE_TEST_SUITE_P(All, AwqScaling, ::testing::ValuesIn(all_checkpoints()), HfTinyParamName());

constexpr char kW4A16Scheme[] = "w4a16";
using AwqCli = SchemeCliTest<kW4A16Scheme>;

TEST_F(AwqCli, RecordsItsSearchAndRefusesWhatItCannotDo) {
  // stories260K (5 layers; LLaMA: input norms, v → o, up → down): one α per mapping, on the grid.
  const std::string f = dir_->file("awq.sqm");
  const auto r = convert({"--group-size", "32", "--awq", "--calib", calib()}, f);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("AWQ alpha per layer"), std::string::npos) << r.out;
  const auto inspect = run_process({tool("sq-inspect"), f, "--json"});
  ASSERT_EQ(inspect.exit_status, 0) << inspect.err;
  const auto q = nlohmann::json::parse(inspect.out).at("header").at("quantization");
  ASSERT_TRUE(q.contains("awq")) << q;
  const auto& groups = q.at("awq").at("groups");
  EXPECT_EQ(groups.size(), 5u * 4u) << q;
  for (const auto& g : groups) {
    const double a = g.at("alpha").get<double>();
    EXPECT_TRUE(a >= 0.0 && a <= 0.95 + 1e-6) << g;
    EXPECT_NEAR(a * 20.0, std::round(a * 20.0), 1e-4) << g;  // a grid point
  }
  // The file runs: finite perplexity within the 4-bit range of the RTN tests (a factor folded the
  // wrong way round, s instead of 1/s, gives PPL in the hundreds).
  const double fp32 = ppl(stories_model()), p = ppl(f);
  std::printf("stories260K W4A16 g32 AWQ: PPL %.4f (FP32 %.4f)\n", p, fp32);
  EXPECT_LT(p, fp32 * 1.4);
  // GPTQ on top runs on the calibration file's Hessians, transformed by the scaling.
  const std::string g = dir_->file("awq-gptq.sqm");
  const auto rg = convert({"--group-size", "32", "--awq", "--gptq", "--gptq-hessians", "file", "--calib", calib()}, g);
  ASSERT_EQ(rg.exit_status, 0) << rg.err;
  EXPECT_LT(ppl(g), fp32 * 1.4);

  const std::string bad = dir_->file("bad-awq.sqm");
  expect_error(convert({"--awq"}, bad), "--awq needs --calib", bad);
  expect_error(convert({"--awq", "--gptq", "--gptq-hessians", "sequential", "--calib", calib()}, bad),
               "--awq with --gptq needs --gptq-hessians file", bad);
  expect_error(convert({"--awq", "--calib", calib(), "--bits-per-weight", "6"}, bad), "--awq does not combine", bad);
  expect_error(run_process({tool("sq-convert"), "-m", stories_model(), "--awq", "-o", bad, "-q"}), "--awq applies to --scheme w4a16 only",
               bad);
}

}  // namespace
}  // namespace sq::test
