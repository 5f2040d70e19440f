#include "bench/timing.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
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

void time_interleaved(std::vector<TimedItem>& items, double min_seconds, int min_rounds) {
  for (TimedItem& it : items) it.body();  // warm-up: page faults, thread pools, JIT kernels
  double elapsed_per_item = 0;
  for (int round = 0; (round < min_rounds || elapsed_per_item < min_seconds) && round < 100000; ++round) {
    double round_total = 0;
    for (TimedItem& it : items) {
      const auto t0 = std::chrono::steady_clock::now();
      it.body();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      it.best = std::min(it.best, sec);
      round_total += sec;
    }
    elapsed_per_item += round_total / double(items.size());
  }
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return f ? l : -1.0;
}

std::vector<float> normal_vector(int64_t n, uint32_t seed, float sd) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace sq::bench
