// Wall-clock timing for benchmarks: repeat a body until a minimum time and keep the best run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sq::bench {

struct Timing {
  double best_seconds = 0;    ///< fastest repetition
  double median_seconds = 0;  ///< median repetition
  int repetitions = 0;
};

/// Runs `body` once as warm-up, then repeatedly until `min_seconds` of total time and at least
/// `min_reps` repetitions have passed (at most `max_reps`).
Timing time_it(const std::function<void()>& body, double min_seconds = 1.0, int min_reps = 3, int max_reps = 1000);

/// One contender of an interleaved measurement; `best` is its fastest call in seconds.
struct TimedItem {
  std::string name;
  std::function<void()> body;
  double best = 1e30;
};

/// Interleaved best-of timing: one warm-up call each, then rounds that call every item once (so a
/// burst of load from other processes hits all items alike), at least `min_rounds` rounds and
/// `min_seconds` of measuring per item (at most 100,000 rounds). Fills each item's `best`.
void time_interleaved(std::vector<TimedItem>& items, double min_seconds, int min_rounds);

/// 1-minute load average from /proc/loadavg (−1 when unavailable), recorded with results because
/// other processes compete for the cores.
double load_average();

/// `n` values ~ N(0, sd²) from std::mt19937(seed) (deterministic benchmark inputs).
std::vector<float> normal_vector(int64_t n, uint32_t seed, float sd = 1.0f);

}  // namespace sq::bench
