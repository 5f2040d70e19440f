// Random calibration windows for tests on models without a tokenizer (or where no text is more
// "real" than random ids, e.g. checkpoints with random weights).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace sq::test {

/// `count` windows of `length` token ids drawn uniformly from [0, vocab) by std::mt19937(seed),
/// window after window.
inline std::vector<std::vector<int32_t>> random_token_windows(int count, int length, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<std::vector<int32_t>> w(static_cast<size_t>(count), std::vector<int32_t>(static_cast<size_t>(length)));
  for (auto& win : w)
    for (auto& t : win) t = tok(rng);
  return w;
}

}  // namespace sq::test
