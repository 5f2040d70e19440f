// Weighted 1-D k-means for KVQuant nuqX codebooks (calib/weighted_kmeans.h; KVQuant §3.3, Eq. 2):
// the exact DP against brute force (every assignment of n ≤ 10 points to k ≤ 3 clusters) and
// against a separately written O(k·n²) DP without the monotone-split optimization; never worse than
// Lloyd from k-means++ seeds; a constructed local optimum Lloyd stays in; Fisher weights moving the
// solution; the histogram path within its a priori bound; input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "calib/weighted_kmeans.h"
#include "core/checkpoint.h"
#include "formats/llama2c_checkpoint.h"
#include "tests/support/expect_error.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

/// Σ w (x − mean)² over the points whose label is c, in double, directly from the definition.
double brute_force_cost(const std::vector<float>& x, const std::vector<float>& w, int k) {
  const size_t n = x.size();
  std::vector<int> label(n, 0);
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    double cost = 0;
    for (int c = 0; c < k; ++c) {
      double sw = 0, swx = 0;
      for (size_t i = 0; i < n; ++i)
        if (label[i] == c) {
          sw += w[i];
          swx += double(w[i]) * x[i];
        }
      if (sw == 0) continue;
      const double mean = swx / sw;
      for (size_t i = 0; i < n; ++i)
        if (label[i] == c) cost += double(w[i]) * (x[i] - mean) * (x[i] - mean);
    }
    best = std::min(best, cost);
    size_t i = 0;  // next assignment in base k
    while (i < n && ++label[i] == k) label[i++] = 0;
    if (i == n) break;
  }
  return best;
}

/// Plain O(k·n²) DP over the sorted points (no merging, no monotone splits), segment costs summed
/// directly from the definition with a running mean (Welford), independent of the library's prefix sums.
double naive_dp_cost(const std::vector<float>& x, const std::vector<float>& w, int k) {
  std::vector<std::pair<float, float>> p;
  for (size_t i = 0; i < x.size(); ++i) p.push_back({x[i], w[i]});
  std::sort(p.begin(), p.end());
  const size_t n = p.size();
  // seg[a][b]: cost of points a..b−1.
  std::vector<std::vector<double>> seg(n + 1, std::vector<double>(n + 1, 0.0));
  for (size_t a = 0; a < n; ++a) {
    double sw = 0, mean = 0, m2 = 0;
    for (size_t b = a; b < n; ++b) {
      const double wi = p[b].second, xi = p[b].first;
      if (wi > 0) {
        sw += wi;
        const double d = xi - mean;
        mean += d * wi / sw;
        m2 += wi * d * (xi - mean);
      }
      seg[a][b + 1] = m2;
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prev(n + 1, inf), cur(n + 1, inf);
  for (size_t i = 0; i <= n; ++i) prev[i] = seg[0][i];
  for (int j = 2; j <= k; ++j) {
    for (size_t i = 0; i <= n; ++i) {
      cur[i] = prev[i];  // allow an empty segment (k > points)
      for (size_t m = 0; m < i; ++m) cur[i] = std::min(cur[i], prev[m] + seg[m][i]);
    }
    std::swap(prev, cur);
  }
  return prev[n];
}

/// Checks the invariants every result must satisfy and that `cost` is Σ w (x − c)² of its partition.
void expect_consistent(const KMeans1DResult& r, const std::vector<float>& x, const std::vector<float>& w, int k) {
  ASSERT_EQ(r.centroids.size(), size_t(k));
  ASSERT_EQ(r.cluster_lo.size(), size_t(k));
  for (int j = 1; j < k; ++j) {
    EXPECT_LE(r.centroids[j - 1], r.centroids[j]);
    if (r.cluster_weight[j] > 0 && r.cluster_weight[j - 1] > 0) {
      EXPECT_LT(r.cluster_hi[j - 1], r.cluster_lo[j]);
    }
  }
  double cost = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double wi = w.empty() ? 1.0 : w[i];
    if (wi == 0) continue;
    int c = -1;
    for (int j = 0; j < k; ++j)
      if (r.cluster_weight[j] > 0 && x[i] >= r.cluster_lo[j] && x[i] <= r.cluster_hi[j]) c = j;
    ASSERT_GE(c, 0) << "point " << x[i] << " in no cluster";
    cost += wi * (x[i] - r.centroids[c]) * (x[i] - r.centroids[c]);
  }
  // Same sum in another order: relative rounding ≤ n·ε ≈ 1e-12 for the sizes used here.
  EXPECT_NEAR(r.cost, cost, 1e-10 * std::max(cost, 1e-300));
}

TEST(WeightedKMeans, ExactDpEqualsBruteForceOnSmallInputs) {
  // 600 random cases: n ≤ 10 points (sometimes on a coarse grid, so values repeat), random weights
  // with some zeros, k ≤ 3. Tolerance 1e-9 relative (the issue's): both sides are double sums of
  // ≤ 10 terms from FP32 inputs, so they agree to ~1e-15 unless the optimum is ~0.
  int compared = 0;
  for (uint64_t seed = 0; seed < 600; ++seed) {
    std::mt19937_64 rng(seed);
    const int n = 1 + int(rng() % 10), k = 1 + int(rng() % 3);
    const bool grid = rng() % 3 == 0;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), uw(0.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      x[size_t(i)] = grid ? float(int(rng() % 5)) * 0.25f : u(rng);
      w[size_t(i)] = rng() % 5 == 0 ? 0.0f : uw(rng);
    }
    if (std::all_of(w.begin(), w.end(), [](float v) { return v == 0; })) w[0] = 1.0f;
    const KMeans1DResult r = weighted_kmeans_1d_exact(x, w, k);
    const double bf = brute_force_cost(x, w, k);
    EXPECT_NEAR(r.cost, bf, 1e-9 * bf + 1e-15) << "seed " << seed << " n " << n << " k " << k;
    expect_consistent(r, x, w, k);
    ++compared;
  }
  EXPECT_EQ(compared, 600);
}

TEST(WeightedKMeans, ExactDpEqualsPlainDpOnLargerInputs) {
  // The monotone-split divide and conquer must give the same optimum as the plain O(k·n²) DP
  // (n = 400, k up to 16, heavy-tailed values with repeats and zero weights). 1e-9 relative: both
  // are double DPs over the same segment costs computed two different ways (prefix differences vs
  // Welford sums), which agree to ~1e-13 relative for |x| ≤ 1 and n = 400.
  for (uint64_t seed = 0; seed < 6; ++seed) {
    std::mt19937_64 rng(100 + seed);
    std::student_t_distribution<float> t(2.0f);
    std::uniform_real_distribution<float> uw(0.0f, 1.0f);
    std::vector<float> x(400), w(400);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::clamp(t(rng) / 20.0f, -1.0f, 1.0f);
      if (i % 7 == 0) x[i] = x[i / 2];  // repeats
      w[i] = i % 11 == 0 ? 0.0f : uw(rng) * uw(rng);
    }
    for (int k : {2, 3, 5, 8, 16}) {
      const KMeans1DResult r = weighted_kmeans_1d_exact(x, w, k);
      const double ref = naive_dp_cost(x, w, k);
      EXPECT_NEAR(r.cost, ref, 1e-9 * ref) << "seed " << seed << " k " << k;
      expect_consistent(r, x, w, k);
    }
  }
}

/// Test distributions of n values in [−1, 1] with χ²₁ (Fisher-like, w = g²) weights.
struct Dataset {
  std::string name;
  std::vector<float> x, w;
};

std::vector<Dataset> distributions(size_t n) {
  std::vector<Dataset> d;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto fisher = [&](size_t m) {
    std::vector<float> w(m);
    for (float& v : w) {
      const float gi = g(rng);
      v = gi * gi;
    }
    return w;
  };
  auto normalize = [](std::vector<float> v) {
    float m = 0;
    for (float a : v) m = std::max(m, std::fabs(a));
    for (float& a : v) a = std::clamp(a / m, -1.0f, 1.0f);
    return v;
  };
  {  // heavy-tailed: Student t, ν = 2
    std::student_t_distribution<float> t(2.0f);
    std::vector<float> x(n);
    for (float& v : x) v = t(rng);
    d.push_back({"student-t2", normalize(x), fisher(n)});
  }
  {  // multimodal: 5 well separated narrow modes of unequal mass
    const float centers[] = {-0.8f, -0.3f, 0.05f, 0.4f, 0.9f}, mass[] = {0.1f, 0.3f, 0.35f, 0.15f, 0.1f};
    std::discrete_distribution<int> pick(mass, mass + 5);
    std::vector<float> x(n);
    for (float& v : x) v = centers[pick(rng)] + 0.03f * g(rng);
    d.push_back({"5-modes", normalize(x), fisher(n)});
  }
  {  // real: stories260K layer-0 and layer-3 k_proj weights, normalized to [−1, 1]
    const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
    std::vector<float> x;
    for (int l : {0, 3}) {
      const Tensor& t = ck.tensors.at(names::layer(l) + "self_attn.k_proj.weight");
      x.insert(x.end(), t.data(), t.data() + t.numel());
    }
    if (x.size() > n) x.resize(n);
    const size_t m = x.size();
    d.push_back({"stories260K-k_proj", normalize(x), fisher(m)});
  }
  return d;
}

TEST(WeightedKMeans, ExactNeverWorseThanLloydFromKMeansPlusPlus) {
  // 3 distributions × k ∈ {4, 8, 16} × 20 k-means++ seeds. The exact cost must be ≤ every Lloyd
  // cost up to 1e-12 relative (both are direct double sums of the same kind of terms).
  int strictly_better = 0, runs = 0;
  for (const Dataset& ds : distributions(4096)) {
    for (int k : {4, 8, 16}) {
      const KMeans1DResult ex = weighted_kmeans_1d_exact(ds.x, ds.w, k);
      expect_consistent(ex, ds.x, ds.w, k);
      double worst = 0;
      for (uint64_t seed = 0; seed < 20; ++seed) {
        const KMeans1DResult ll = weighted_kmeans_1d_lloyd(ds.x, ds.w, k, seed);
        EXPECT_LE(ex.cost, ll.cost * (1 + 1e-12)) << ds.name << " k " << k << " seed " << seed;
        strictly_better += ll.cost > ex.cost * (1 + 1e-9);
        worst = std::max(worst, ll.cost / ex.cost);
        ++runs;
      }
      std::printf("[ %s n=%zu k=%d ] exact cost %.6g, worst Lloyd/k-means++ of 20 seeds %.4fx\n", ds.name.c_str(), ds.x.size(),
                  k, ex.cost, worst);
    }
  }
  std::printf("exact strictly better (> 1e-9 relative) in %d of %d Lloyd runs\n", strictly_better, runs);
  EXPECT_EQ(runs, 3 * 3 * 20);
  EXPECT_GT(strictly_better, 0);
}

TEST(WeightedKMeans, LloydStaysInALocalOptimumTheDpAvoids) {
  // Points {0, 1, 10, 11, 12}, k = 3, Lloyd started at {0, 1, 11}: clusters {0}, {1}, {10, 11, 12}
  // (midpoints 0.5 and 6) reproduce their centroids, so Lloyd stops at cost 2 (= 1 + 0 + 1). The
  // optimum {0, 1}, {10, 11}, {12} (or {10}, {11, 12}) costs 0.5 + 0.5 = 1. Exact by hand.
  const std::vector<float> x = {0, 1, 10, 11, 12};
  const KMeans1DResult ll = weighted_lloyd_1d(x, {}, {0.0, 1.0, 11.0});
  EXPECT_EQ(ll.cost, 2.0);
  EXPECT_EQ(ll.centroids, (std::vector<double>{0.0, 1.0, 11.0}));
  const KMeans1DResult ex = weighted_kmeans_1d_exact(x, {}, 3);
  EXPECT_EQ(ex.cost, 1.0);
  EXPECT_EQ(ex.centroids[0], 0.5);
  EXPECT_LT(ex.cost, ll.cost);
}

TEST(WeightedKMeans, FisherWeightsChangeTheSolution) {
  // Points {0, 1, 3}, k = 2. Unweighted: {0, 1}, {3} (cost 0.5) beats {0}, {1, 3} (cost 2).
  // Weights {1, 1, 1/8} (the point at 3 barely matters, as a low-Fisher activation): merging 1 and 3
  // costs w₁w₃/(w₁+w₃)·2² = (1/8)/(9/8)·4 = 4/9 < merging 0 and 1 (1/2·1 = 1/2), so the optimum
  // becomes {0}, {1, 3} with centroids 0 and (1 + 3/8)/(9/8) = 11/9. All values by hand.
  const std::vector<float> x = {0, 1, 3};
  const KMeans1DResult plain = weighted_kmeans_1d_exact(x, {}, 2);
  EXPECT_EQ(plain.centroids, (std::vector<double>{0.5, 3.0}));
  EXPECT_EQ(plain.cost, 0.5);
  const std::vector<float> fisher = {1.0f, 1.0f, 0.125f};
  const KMeans1DResult weighted = weighted_kmeans_1d_exact(x, fisher, 2);
  EXPECT_EQ(weighted.centroids[0], 0.0);
  EXPECT_NEAR(weighted.centroids[1], 11.0 / 9.0, 1e-15);  // one rounding of 1.375 / 1.125
  EXPECT_NEAR(weighted.cost, 4.0 / 9.0, 1e-15);
  EXPECT_EQ(weighted.cluster_weight, (std::vector<double>{1.0, 1.125}));
  EXPECT_DOUBLE_EQ(brute_force_cost(x, fisher, 2), weighted.cost);  // same sums, within 4 ulps
}

TEST(WeightedKMeans, HistogramPathWithinItsBound) {
  // Optimal among bin-respecting clusterings, so exact ≤ histogram ≤ exact + cost_bound, with
  // cost_bound = 2·(max − min)·max_b W_b·e_b (e_b: extent of bin b; proof in calib/weighted_kmeans.h). Slack 1e-9 relative
  // for the two direct double sums. Coarse bins make the gap visible; 2^16 bins make it tiny.
  for (const Dataset& ds : distributions(50000)) {
    for (int bins : {256, 4096, 1 << 16}) {
      for (int k : {4, 16}) {
        const KMeans1DResult ex = weighted_kmeans_1d_exact(ds.x, ds.w, k);
        const KMeans1DResult h = weighted_kmeans_1d_histogram(ds.x, ds.w, k, bins);
        expect_consistent(h, ds.x, ds.w, k);
        EXPECT_GE(h.cost, ex.cost * (1 - 1e-9)) << ds.name;
        EXPECT_LE(h.cost, ex.cost * (1 + 1e-9) + h.cost_bound) << ds.name << " bins " << bins << " k " << k;
        EXPECT_LE(h.n_atoms, bins);
        if (bins == (1 << 16))
          std::printf("[ %s k=%d 2^16 bins ] (hist - exact)/exact = %.3g, bound/exact = %.3g\n", ds.name.c_str(), k,
                      (h.cost - ex.cost) / ex.cost, h.cost_bound / ex.cost);
      }
    }
  }
}

TEST(WeightedKMeans, FewerDistinctValuesThanClusters) {
  // 3 distinct values, k = 5: one cluster per value (cost 0), clusters 3 and 4 empty and padded with
  // the largest value (documented), cluster_begin over the 3 atoms.
  const std::vector<float> x = {3, 1, 3, 2}, w = {1, 1, 2, 1};
  for (const KMeans1DResult& r : {weighted_kmeans_1d_exact(x, w, 5), weighted_kmeans_1d_histogram(x, w, 5, 1024)}) {
    EXPECT_EQ(r.centroids, (std::vector<double>{1, 2, 3, 3, 3}));
    EXPECT_EQ(r.cluster_weight, (std::vector<double>{1, 1, 3, 0, 0}));
    EXPECT_EQ(r.cost, 0.0);
    EXPECT_EQ(r.n_atoms, 3);
    EXPECT_EQ(r.cluster_begin, (std::vector<int64_t>{0, 1, 2, 3, 3, 3}));
  }
  // All values equal: one atom.
  const KMeans1DResult same = weighted_kmeans_1d_exact(std::vector<float>{0.5f, 0.5f}, {}, 2);
  EXPECT_EQ(same.centroids, (std::vector<double>{0.5, 0.5}));
  // nuq codebook of it: 4 signposts, duplicates at the top.
  const std::vector<float> two = {0.25f, -0.5f};
  EXPECT_EQ(fit_nuq_codebook(two, {}, 2), (std::vector<float>{-0.5f, 0.25f, 0.25f, 0.25f}));
}

TEST(WeightedKMeans, ZeroWeightPointsAreIgnored) {
  // The point at 5 has weight 0: it does not enter Eq. 2, so k = 2 puts the centroids at 0 and 10.
  const std::vector<float> x = {0, 5, 10}, w = {1, 0, 1};
  const KMeans1DResult r = weighted_kmeans_1d_exact(x, w, 2);
  EXPECT_EQ(r.centroids, (std::vector<double>{0, 10}));
  EXPECT_EQ(r.cost, 0.0);
  EXPECT_EQ(r.n_atoms, 2);
  EXPECT_EQ(weighted_kmeans_1d_lloyd(x, w, 2, 1).cost, 0.0);
}

TEST(WeightedKMeans, KMeansPlusPlusIsDeterministicAndPicksDataPoints) {
  const std::vector<float> x = {-0.9f, -0.5f, 0.0f, 0.1f, 0.7f, 0.75f, 1.0f};
  const auto a = kmeanspp_seeds(x, {}, 4, 42), b = kmeanspp_seeds(x, {}, 4, 42);
  EXPECT_EQ(a, b);
  for (double s : a) EXPECT_NE(std::find(x.begin(), x.end(), float(s)), x.end()) << s;
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  // Zero-weight points are never drawn.
  const std::vector<float> w = {0, 1, 0, 1, 0, 1, 0};
  for (uint64_t seed = 0; seed < 20; ++seed)
    for (double s : kmeanspp_seeds(x, w, 3, seed)) EXPECT_TRUE(s == x[1] || s == x[3] || s == x[5]) << s;
}

TEST(WeightedKMeans, FitNuqCodebookMatchesTheExactCentroids) {
  const Dataset ds = distributions(20000)[0];
  const KMeans1DResult ex = weighted_kmeans_1d_exact(ds.x, ds.w, 8);
  const std::vector<float> cb = fit_nuq_codebook(ds.x, ds.w, 3);
  ASSERT_EQ(cb.size(), 8u);
  for (size_t j = 0; j < cb.size(); ++j) EXPECT_EQ(cb[j], float(ex.centroids[j]));
  // Above exact_max_points the histogram path is used: same codebook size, sorted.
  const std::vector<float> hb = fit_nuq_codebook(ds.x, ds.w, 3, /*exact_max_points=*/100);
  ASSERT_EQ(hb.size(), 8u);
  EXPECT_TRUE(std::is_sorted(hb.begin(), hb.end()));
}

TEST(WeightedKMeans, RejectsBadInput) {
  const std::vector<float> x = {0.1f, 0.2f, 0.3f};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(x, {}, 0); }, {"k = 0"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(std::vector<float>{0.1f, nan}, {}, 2); },
                                            {"values[1]", "not finite"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_histogram(std::vector<float>{inf, 0.0f}, {}, 2); },
                                            {"values[0]", "not finite"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(x, std::vector<float>{1, 1, -1}, 2); },
                                            {"weights[2]", "negative"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_lloyd(x, std::vector<float>{1, nan, 1}, 2, 0); },
                                            {"weights[1]", "not finite"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(x, std::vector<float>{0, 0, 0}, 2); },
                                            {"all 3 weights are zero"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(x, std::vector<float>{1, 1}, 2); },
                                            {"weights has 2 entries, values has 3"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_exact(std::vector<float>{}, {}, 2); }, {"values is empty"});
  test::expect_error<std::invalid_argument>([&] { weighted_kmeans_1d_histogram(x, {}, 2, 0); }, {"bins = 0"});
  test::expect_error<std::invalid_argument>([&] { weighted_lloyd_1d(x, {}, {0.0, nan}); }, {"initial[1]"});
  test::expect_error<std::invalid_argument>([&] { fit_nuq_codebook(x, {}, 9); }, {"bits = 9"});
  test::expect_error<std::invalid_argument>([&] { fit_nuq_codebook(std::vector<float>{0.5f, 1.5f}, {}, 2); },
                                            {"values[1] = 1.5", "outside [-1, 1]"});
}

}  // namespace
}  // namespace sq
