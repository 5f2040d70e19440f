#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sq {

Sampler::Sampler(const SamplerOptions& options) : opt_(options), rng_(options.seed) {
  if (!(opt_.temperature >= 0.0f)) throw UsageError("--temp must be >= 0, got " + std::to_string(opt_.temperature));
  if (opt_.top_k < 0) throw UsageError("--top-k must be >= 0, got " + std::to_string(opt_.top_k));
  if (!(opt_.top_p > 0.0f && opt_.top_p <= 1.0f)) throw UsageError("--top-p must be in (0, 1], got " + std::to_string(opt_.top_p));
}

int Sampler::sample(const float* logits, int vocab) {
  if (opt_.temperature == 0.0f) return static_cast<int>(std::max_element(logits, logits + vocab) - logits);
  // Probabilities at temperature T, sorted descending.
  candidates_.resize(static_cast<size_t>(vocab));
  const float m = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const float p = std::exp((logits[i] - m) / opt_.temperature);
    candidates_[static_cast<size_t>(i)] = {p, i};
    sum += p;
  }
  // Descending probability, ties by token id: a strict total order, so sorting only a prefix
  // (partial_sort, widened until top-k / top-p are decided) orders it exactly as a full sort would.
  const auto before = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (opt_.top_k > 0) keep = std::min(keep, static_cast<size_t>(opt_.top_k));
  if (keep == candidates_.size() && opt_.top_p >= 1.0f) {
    std::sort(candidates_.begin(), candidates_.end(), before);
  } else {
    size_t sorted = 0, want = std::min<size_t>(keep, 256);
    double cum = 0.0;
    for (bool decided = false; !decided;) {
      std::partial_sort(candidates_.begin() + static_cast<ptrdiff_t>(sorted), candidates_.begin() + static_cast<ptrdiff_t>(want),
                        candidates_.end(), before);
      for (size_t i = sorted; i < want && !decided; ++i) {
        cum += candidates_[i].first / sum;
        if (opt_.top_p < 1.0f && cum >= opt_.top_p) {
          keep = i + 1;
          decided = true;
        }
      }
      sorted = want;
      if (sorted == keep) decided = true;
      want = std::min(keep, want * 4);
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += candidates_[i].first;
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng_), acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += candidates_[i].first;
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace sq
