// Wall-clock timing for benchmarks: repeat a body until a minimum time and keep the best run.
#pragma once

#include <functional>

namespace sq::bench {

struct Timing {
  double best_seconds = 0;    ///< fastest repetition
  double median_seconds = 0;  ///< median repetition
  int repetitions = 0;
};

/// Runs `body` once as warm-up, then repeatedly until `min_seconds` of total time and at least
/// `min_reps` repetitions have passed (at most `max_reps`).
Timing time_it(const std::function<void()>& body, double min_seconds = 1.0, int min_reps = 3, int max_reps = 1000);

}  // namespace sq::bench
