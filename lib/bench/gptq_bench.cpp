#include "bench/gptq_bench.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "bench/timing.h"
#include "calib/gptq.h"
#include "calib/hessian.h"
#include "ops/lapack.h"
#include "ops/library_threads.h"

namespace sq::bench {
namespace {

/// The reference's factorization (GPTQ's gptq.py: cholesky, cholesky_inverse, cholesky(upper)) as
/// sqkit ran it before: U in H's row-major upper triangle. Returns false when H is not positive definite.
bool reference_factor(std::vector<double>& H, int n) {
  int info = 0;
  dpotrf_("U", &n, H.data(), &n, &info, 1);
  if (info != 0) return false;
  dpotri_("U", &n, H.data(), &n, &info, 1);
  if (info != 0) return false;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) H[size_t(i * n + j)] = H[size_t(j * n + i)];
  dpotrf_("L", &n, H.data(), &n, &info, 1);
  return info == 0;
}

}  // namespace

nlohmann::json run_gptq_bench(const std::vector<int64_t>& orders, double min_seconds) {
  nlohmann::json out;
  out["load_average_before"] = load_average();
  std::printf("== GPTQ factorization U = chol(H^-1) upper, one thread (as gptq_quantize), load average %.2f ==\n", load_average());
  std::printf("%-6s %-34s %10s %10s %10s\n", "n", "method", "seconds", "GFLOP/s", "x dgemm");
  const ops::OneLibraryThread one;
  for (const int64_t n : orders) {
    const int ni = static_cast<int>(n);
    const int64_t t = n + 256;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(t * n));
    for (float& v : x) v = g(rng);
    HessianAccumulator acc(n);
    acc.observe(x.data(), t);
    std::vector<double> H = acc.hessian();
    double mean_diag = 0;
    for (int64_t i = 0; i < n; ++i) mean_diag += H[size_t(i * n + i)] / double(n);
    for (int64_t i = 0; i < n; ++i) H[size_t(i * n + i)] += 0.01 * mean_diag;  // GPTQ's default dampening
    std::vector<double> a, b, c(size_t(n * n), 0.0);
    bool ok_new = true, ok_ref = true;
    std::vector<TimedItem> items;
    items.push_back({"sqkit: dpotrf(reversed H), dtrtri", [&] { a = H; ok_new = gptq_inverse_cholesky(a, n).empty(); }});
    items.push_back({"reference: dpotrf, dpotri, dpotrf", [&] { b = H; ok_ref = reference_factor(b, ni); }});
    items.push_back({"dgemm n x n x n", [&] {
                       cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, H.data(), ni, H.data(), ni, 0.0,
                                   c.data(), ni);
                     }});
    time_interleaved(items, min_seconds, 2);
    const double nd = static_cast<double>(n), flops[] = {2 * nd * nd * nd / 3, 4 * nd * nd * nd / 3, 2 * nd * nd * nd};
    double max_u = 0, max_d = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i; j < n; ++j) {
        max_u = std::max(max_u, std::fabs(b[size_t(i * n + j)]));
        max_d = std::max(max_d, std::fabs(a[size_t(i * n + j)] - b[size_t(i * n + j)]));
      }
    nlohmann::json jn;
    for (size_t i = 0; i < items.size(); ++i) {
      std::printf("%-6lld %-34s %10.3f %10.1f %10.2f\n", static_cast<long long>(n), items[i].name.c_str(), items[i].best,
                  flops[i] / items[i].best / 1e9, items[i].best / items[2].best);
      jn[items[i].name] = {{"seconds", items[i].best}, {"gflops", flops[i] / items[i].best / 1e9}, {"x_dgemm", items[i].best / items[2].best}};
    }
    std::printf("       factors agree: max |U_sqkit - U_reference| / max |U| = %.2e%s\n", max_d / max_u,
                ok_new && ok_ref ? "" : " (a factorization failed)");
    jn["max_relative_difference"] = max_d / max_u;
    jn["speedup_over_reference"] = items[1].best / items[0].best;
    out["n" + std::to_string(n)] = jn;
  }
  out["load_average_after"] = load_average();
  return out;
}

}  // namespace sq::bench
