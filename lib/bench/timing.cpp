#include "bench/timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace sq::bench {

Timing time_it(const std::function<void()>& body, double min_seconds, int min_reps, int max_reps) {
  using clock = std::chrono::steady_clock;
  body();  // warm-up: page faults, thread pool start, caches
  std::vector<double> runs;
  double total = 0;
  while ((total < min_seconds || static_cast<int>(runs.size()) < min_reps) && static_cast<int>(runs.size()) < max_reps) {
    const auto t0 = clock::now();
    body();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    runs.push_back(s);
    total += s;
  }
  std::sort(runs.begin(), runs.end());
  return {runs.front(), runs[runs.size() / 2], static_cast<int>(runs.size())};
}

}  // namespace sq::bench
