#include "bench/kmeans_bench.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "calib/weighted_kmeans.h"

namespace sq::bench {

nlohmann::json run_kmeans_bench(int64_t n, double min_seconds) {
  nlohmann::json out;
  out["n"] = n;
  out["load_average_before"] = load_average();
  out["threads"] = omp_get_max_threads();
  std::printf("== KVQuant codebook fitting: %lld weighted values (Student t nu=3 / max|x|, w = g^2), %d threads (exact DP), load average %.2f ==\n",
              static_cast<long long>(n), omp_get_max_threads(), load_average());
  std::mt19937_64 rng(4);
  std::student_t_distribution<double> t3(3.0);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(n));
  double max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = t3(rng);
    x[i] = static_cast<float>(v);
    max_abs = std::max(max_abs, std::fabs(v));
    const double gi = g(rng);
    w[i] = static_cast<float>(gi * gi);
  }
  for (float& v : x) v = std::clamp(static_cast<float>(v / max_abs), -1.0f, 1.0f);

  std::printf("%-4s %-10s %10s %10s %14s %12s %10s\n", "k", "solver", "seconds", "atoms", "cost", "cost/exact", "iters");
  bool pass = true;
  for (int k : {4, 8, 16}) {
    KMeans1DResult exact, hist, lloyd;
    std::vector<TimedItem> items;
    items.push_back({"exact", [&] { exact = weighted_kmeans_1d_exact(x, w, k); }});
    items.push_back({"histogram", [&] { hist = weighted_kmeans_1d_histogram(x, w, k); }});
    items.push_back({"lloyd", [&] { lloyd = weighted_kmeans_1d_lloyd(x, w, k, 0); }});
    time_interleaved(items, min_seconds, 3);
    const KMeans1DResult* res[] = {&exact, &hist, &lloyd};
    nlohmann::json jk;
    for (size_t i = 0; i < items.size(); ++i) {
      const KMeans1DResult& r = *res[i];
      std::printf("%-4d %-10s %10.4f %10lld %14.8g %12.8f %10d\n", k, items[i].name.c_str(), items[i].best,
                  static_cast<long long>(r.n_atoms), r.cost, r.cost / exact.cost, r.iterations);
      jk[items[i].name] = {{"seconds", items[i].best}, {"cost", r.cost}, {"atoms", r.n_atoms}, {"iterations", r.iterations},
                           {"centroids", r.centroids}};
    }
    std::printf("     histogram: cost - exact = %.3g, a priori bound %.3g (%.2e of the exact cost)\n", hist.cost - exact.cost,
                hist.cost_bound, hist.cost_bound / exact.cost);
    jk["histogram"]["cost_bound"] = hist.cost_bound;
    std::string key = "k";  // (not "k" + to_string: GCC 12 -Wrestrict false positive)
    key += std::to_string(k);
    out[key] = jk;
    if (k == 16) pass = items[0].best < 1.0;
  }
  std::printf("exact fit, k = 16, %lld values: < 1 s: %s; load average after: %.2f\n", static_cast<long long>(n),
              pass ? "PASS" : "FAIL", load_average());
  out["target_met"] = pass;
  out["load_average_after"] = load_average();
  return out;
}

}  // namespace sq::bench
