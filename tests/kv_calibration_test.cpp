// KVQuant parameter fitting (calib/kv_calibration.h): thresholds, normalization, Eq. 2 weights,
// Q-Norm (Eq. 3), sink exclusion; and the sq-convert --kv nuqX path end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "calib/kv_calibration.h"
#include "calib/weighted_kmeans.h"
#include "core/error.h"
#include "quant/codebook_quantize.h"
#include "support/expect_error.h"
#include "support/process.h"
#include "support/small_config.h"
#include "support/test_data.h"

namespace sq {
namespace {

ModelConfig one_head() { return test::small_config(8, 1, 1, 1, 4, 128); }

KVFisherSamples samples(uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t(3.0f);
  std::exponential_distribution<float> e(1.0f);
  KVFisherSamples s;
  s.tokens = 400;
  s.width = 8;
  for (int64_t r = 0; r < s.tokens; ++r) {
    s.positions.push_back(static_cast<int32_t>(r % 100));
    s.windows.push_back(static_cast<int32_t>(r / 100));
    for (int c = 0; c < 8; ++c) {
      s.keys.push_back(float(c) + (1.0f + c) * t(rng));  // per-channel offsets and scales differ
      s.values.push_back(t(rng));
      s.keys_fisher.push_back(e(rng));
      s.values_fisher.push_back(e(rng));
    }
  }
  return s;
}

/// numpy.percentile with linear interpolation, written independently of kv_percentile.
double percentile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t i = size_t(pos);
  return i + 1 < v.size() ? v[i] + (pos - double(i)) * (double(v[i + 1]) - v[i]) : v[i];
}

TEST(KVCalibration, PerChannelKeyScalingFollowsTheThresholdDefinition) {
  const KVFisherSamples s = samples(1);
  for (double p : {0.0, 0.1}) {
    KVSpec spec = parse_kv_spec("nuq3");
    spec.outlier_fraction = p;
    NuqFitReport rep;
    const NuqLayerParams prm = fit_nuq_layer(spec, s, one_head(), 0, &rep);
    ASSERT_EQ(prm.key_codebook.size(), 8u);
    ASSERT_EQ(prm.value_codebook.size(), 8u);
    for (int c = 0; c < 8; ++c) {
      std::vector<float> col;  // rows at window position >= 1 (the FP16 sink token is excluded)
      for (int64_t r = 0; r < s.tokens; ++r)
        if (s.positions[size_t(r)] >= 1) col.push_back(s.keys[size_t(r * 8 + c)]);
      const double lo = p > 0 ? percentile(col, p / 2) : *std::min_element(col.begin(), col.end());
      const double hi = p > 0 ? percentile(col, 1 - p / 2) : *std::max_element(col.begin(), col.end());
      // FP32 arithmetic on values of magnitude ≤ ~100: 1e-4 relative.
      EXPECT_NEAR(prm.key_offset[size_t(c)], (hi + lo) / 2, 1e-4 * (std::fabs(hi) + std::fabs(lo)));
      EXPECT_NEAR(prm.key_scale[size_t(c)], (hi - lo) / 2, 1e-4 * (hi - lo));
    }
    if (p == 0) {
      EXPECT_EQ(rep.key_outliers, 0);
    }
    // p = 0.1: ~10% of the 396×8 key values lie beyond their channel's 5/95 percentiles.
    if (p > 0) {
      EXPECT_NEAR(double(rep.key_outliers) / double(396 * 8), 0.1, 0.01);
    }
    EXPECT_EQ(rep.key_values + rep.key_outliers, 396 * 8);
  }
}

TEST(KVCalibration, CodebookMinimizesEq2WithFisherTimesScaleSquared) {
  const KVFisherSamples s = samples(2);
  const KVSpec spec = parse_kv_spec("nuq2");
  const NuqLayerParams prm = fit_nuq_layer(spec, s, one_head(), 0);
  // Rebuild the key problem independently: a = (k − o_c)/s_c, weight F·s_c².
  std::vector<float> a, w;
  for (int64_t r = 0; r < s.tokens; ++r) {
    if (s.positions[size_t(r)] < 1) continue;
    for (int c = 0; c < 8; ++c) {
      const float sc = prm.key_scale[size_t(c)];
      a.push_back((s.keys[size_t(r * 8 + c)] - prm.key_offset[size_t(c)]) / sc);
      w.push_back(s.keys_fisher[size_t(r * 8 + c)] * sc * sc);
    }
  }
  for (float& x : a) x = std::clamp(x, -1.0f, 1.0f);  // FP32 rounding at the extremes
  const KMeans1DResult exact = weighted_kmeans_1d_exact(a, w, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(prm.key_codebook[size_t(i)], exact.centroids[size_t(i)], 1e-6);
  // Fisher weights matter: the uniform fit differs.
  const NuqLayerParams uni = fit_nuq_layer(spec, s, one_head(), 0, nullptr, /*fisher_weighted=*/false);
  EXPECT_NE(uni.key_codebook, prm.key_codebook);
}

TEST(KVCalibration, QNormMatchesTheCalibrationMeanAndStd) {
  const KVFisherSamples s = samples(3);
  KVSpec spec = parse_kv_spec("nuq2");
  const NuqLayerParams plain = fit_nuq_layer(spec, s, one_head(), 0);
  spec.qnorm = true;
  const NuqLayerParams qn = fit_nuq_layer(spec, s, one_head(), 0);
  // Eq. 3 on values: the per-token normalized values quantized with the plain codebook, then mapped
  // to the Q-Norm centroids, have the mean and std of the normalized values themselves.
  std::vector<double> a, qa;
  const CodebookQuantizer q(plain.value_codebook, 2);
  for (int64_t r = 0; r < s.tokens; ++r) {
    if (s.positions[size_t(r)] < 1) continue;
    float o, sc;
    kv_token_scaling(s.values.data() + r * 8, 8, 0.0, o, sc);
    for (int c = 0; c < 8; ++c) {
      const float x = std::clamp((s.values[size_t(r * 8 + c)] - o) / sc, -1.0f, 1.0f);
      a.push_back(x);
      qa.push_back(qn.value_codebook[q.encode(x)]);
    }
  }
  auto mean_sd = [](const std::vector<double>& v) {
    double m = 0, m2 = 0;
    for (double x : v) m += x, m2 += x * x;
    m /= double(v.size());
    return std::pair<double, double>(m, std::sqrt(m2 / double(v.size()) - m * m));
  };
  const auto [m1, s1] = mean_sd(a);
  const auto [m2, s2] = mean_sd(qa);
  EXPECT_NEAR(m2, m1, 1e-5);  // exact up to FP32 centroids
  EXPECT_NEAR(s2, s1, 1e-5);
  EXPECT_TRUE(std::is_sorted(qn.value_codebook.begin(), qn.value_codebook.end()));
}

TEST(KVCalibration, SinkRowsDoNotInfluenceTheFit) {
  KVFisherSamples s = samples(4);
  const KVSpec spec = parse_kv_spec("nuq3");  // sink_fp16 = 1: position-0 rows are skipped
  const NuqLayerParams a = fit_nuq_layer(spec, s, one_head(), 0);
  for (int64_t r = 0; r < s.tokens; ++r)
    if (s.positions[size_t(r)] == 0)
      for (int c = 0; c < 8; ++c) s.keys[size_t(r * 8 + c)] = s.values[size_t(r * 8 + c)] = 1000.0f;
  const NuqLayerParams b = fit_nuq_layer(spec, s, one_head(), 0);
  EXPECT_EQ(a.key_codebook, b.key_codebook);
  EXPECT_EQ(a.key_scale, b.key_scale);
  EXPECT_EQ(a.value_codebook, b.value_codebook);
  KVSpec all_sinks = spec;
  all_sinks.sink_fp16 = 100;
  test::expect_error<InputError>([&] { fit_nuq_layer(all_sinks, s, one_head(), 0); }, {"layer 0", "no rows"});
}

TEST(KVCli, NuqConversionRunsAndNeedsFisherData) {
  test::ScratchDir dir;
  const std::string m = test::stories_model(), tok = test::stories_tokenizer();
  const std::string train = test::shared_data("tinystories/tinystories-train-2MiB.txt");
  for (const char* fisher : {"--fisher", ""}) {
    std::vector<std::string> a = {test::tool("sq-calibrate"), "-m", m, "--tokenizer", tok, "-f", train, "--samples", "8",
                                  "--seq-len", "128", "-q", "-o", dir.file(std::string(*fisher ? "f" : "nf") + ".h5")};
    if (*fisher) a.push_back(fisher);
    const auto r = test::run_process(a);
    ASSERT_EQ(r.exit_status, 0) << r.err;
  }
  const std::vector<std::string> conv = {test::tool("sq-convert"), "-m", m, "--tokenizer", tok, "--scheme", "f32", "-q"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  const auto bad = test::run_process(with(conv, {"--kv", "nuq3", "--calib", dir.file("nf.h5"), "-o", dir.file("x.sqm")}));
  EXPECT_EQ(bad.exit_status, 2) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_NE(bad.err.find("no Fisher information"), std::string::npos) << bad.err;
  const auto bw = test::run_process(with(conv, {"--kv", "int4", "--kv-weighting", "uniform", "-o", dir.file("x.sqm")}));
  EXPECT_EQ(bw.exit_status, 2) << bw.err;
  const auto ok = test::run_process(
      with(conv, {"--kv", "nuq3", "--kv-outliers", "0.01", "--calib", dir.file("f.h5"), "-o", dir.file("nuq3.sqm")}));
  ASSERT_EQ(ok.exit_status, 0) << ok.err;
  const auto ev = test::run_process({test::tool("sq-eval"), "-m", dir.file("nuq3.sqm"), "-f", test::tinystories_valid(), "-c", "256",
                                     "--chunks", "20", "-q", "--json", dir.file("e.json")});
  ASSERT_EQ(ev.exit_status, 0) << ev.err;
  const auto j = nlohmann::json::parse(test::read_file(dir.file("e.json")));
  EXPECT_EQ(j["kv_cache"]["format"], "nuq3-1%,sink16:1");
  // FP32 PPL of these 20 windows is ≈ 6.6; nuq3-1% measured ≈ +10% with the full calibration
  // (docs/benchmarks.md). With 8 calibration windows allow +30%; a broken codebook or scaling
  // gives PPL in the tens (int3 per head: 26).
  EXPECT_LT(j["ppl"].get<double>(), 1.3 * 6.68);
  EXPECT_GT(j["kv_cache"]["outlier_bytes_per_token"].get<double>(), 0.0);
}

}  // namespace
}  // namespace sq
