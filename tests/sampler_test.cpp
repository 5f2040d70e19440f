// Sampler: top-k / top-p draw exactly the tokens the definition gives (full descending sort, ties
// by id, then the smallest prefix reaching top_p, then one uniform draw over the kept mass), with
// the same RNG stream; the sampler itself sorts only the prefix it needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace sq {
namespace {

/// The definition, written out with a full sort (independent of the sampler's partial sorts).
int reference_sample(const std::vector<float>& logits, const SamplerOptions& o, std::mt19937_64& rng) {
  const float m = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<float, int>> c;
  double sum = 0.0;
  for (int i = 0; i < static_cast<int>(logits.size()); ++i) {
    const float p = std::exp((logits[static_cast<size_t>(i)] - m) / o.temperature);
    c.push_back({p, i});
    sum += p;
  }
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  size_t keep = c.size();
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  double cum = 0.0;
  for (size_t i = 0; i < keep && o.top_p < 1.0f; ++i) {
    cum += c[i].first / sum;
    if (cum >= o.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += c[i].first;
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng), acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += c[i].first;
    if (r < acc) return c[i].second;
  }
  return c[keep - 1].second;
}

TEST(Sampler, TopKAndTopPDrawTheTokensOfTheFullSortDefinition) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  // Settings where the kept prefix is short, long (top_p 0.999 at a flat temperature needs most of
  // the 5,000 tokens, so the prefix is widened several times) and cut by top-k before top-p.
  const SamplerOptions settings[] = {{1.0f, 0, 0.9f, 1},    {2.5f, 0, 0.999f, 2}, {0.7f, 40, 1.0f, 3},
                                     {1.0f, 300, 0.95f, 4}, {5.0f, 2000, 0.99f, 5}, {1.0f, 0, 1.0f, 6}};
  for (const SamplerOptions& o : settings) {
    Sampler s(o);
    std::mt19937_64 rng(o.seed);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> logits(5000);
      for (float& x : logits) x = normal(gen);
      logits[static_cast<size_t>(step * 37 % 5000)] = logits[static_cast<size_t>(step * 53 % 5000)];  // a tie
      EXPECT_EQ(s.sample(logits.data(), static_cast<int>(logits.size())), reference_sample(logits, o, rng))
          << "temperature " << o.temperature << ", top_k " << o.top_k << ", top_p " << o.top_p << ", step " << step;
    }
  }
}

}  // namespace
}  // namespace sq
