// Next-token sampling: greedy, temperature, top-k, top-p (nucleus).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace sq {

struct SamplerOptions {
  float temperature = 1.0f;  ///< 0 = greedy (argmax); must be >= 0
  int top_k = 0;             ///< keep the k most likely tokens; 0 = all
  float top_p = 1.0f;        ///< keep the smallest set with cumulative probability >= top_p; in (0, 1]
  uint64_t seed = 42;        ///< RNG seed (std::mt19937_64)
};

/// Draws token ids from logits. Deterministic for a given seed and logit sequence.
class Sampler {
 public:
  /// Throws UsageError for temperature < 0, top_k < 0 or top_p outside (0, 1].
  explicit Sampler(const SamplerOptions& options);
  /// Next token from `logits` [vocab]. Greedy picks the lowest index among equal maxima.
  int sample(const float* logits, int vocab);

 private:
  SamplerOptions opt_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> candidates_;
};

}  // namespace sq
