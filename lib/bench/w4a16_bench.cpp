#include "bench/w4a16_bench.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/timing.h"

#include "model/w4a16_linear.h"

namespace sq::bench {


nlohmann::json run_w4a16_bench(double min_seconds) {
  const int threads = omp_get_max_threads();
  nlohmann::json out;
  out["threads"] = threads;
  out["load_average_before"] = load_average();
  std::printf("== W4A16 (INT4 g128 weights, FP32 activations) vs OpenBLAS FP32, %d threads, load average %.2f ==\n", threads,
              load_average());
  struct Shape { int k, n; const char* name; };
  const Shape shapes[] = {{4096, 4096, "q/o 4096->4096"}, {4096, 11008, "gate/up 4096->11008"}};

  std::printf("-- batch-1 GEMV (decode) --\n");
  std::printf("%-20s %-14s %10s %10s %14s %9s\n", "shape", "format", "time us", "GB/s", "FP32-equiv GB/s", "x sgemv");
  double min_ratio = 1e30;
  for (const Shape& s : shapes) {
    const auto wf = normal_vector(int64_t(s.n) * s.k, 12, 0.02f);
    const auto x = normal_vector(s.k, 11, 1.0f);
    std::vector<float> y(static_cast<size_t>(s.n));
    const Tensor w = Tensor::from_vector({s.n, s.k}, wf);
    const W4A16Linear sym(w, 128, false), asym(w, 128, true);
    std::vector<TimedItem> items;
    items.push_back({"f32_sgemv", [&] {
                       cblas_sgemv(CblasRowMajor, CblasNoTrans, s.n, s.k, 1.0f, wf.data(), s.k, x.data(), 1, 0.0f, y.data(), 1);
                     }});
    items.push_back({"w4a16_g128_sym", [&] { sym.forward(x.data(), 1, y.data()); }});
    items.push_back({"w4a16_g128_asym", [&] { asym.forward(x.data(), 1, y.data()); }});
    time_interleaved(items, min_seconds, 5);
    const double f32_bytes = 4.0 * s.n * s.k;
    const double bytes[] = {f32_bytes, double(sym.weight_bytes()), double(asym.weight_bytes())};
    nlohmann::json row = {{"k", s.k}, {"n", s.n}};
    for (size_t i = 0; i < items.size(); ++i) {
      const double t = items[i].best, ratio = items[0].best / t;
      std::printf("%-20s %-14s %10.1f %10.1f %14.1f %8.2fx\n", i == 0 ? s.name : "", items[i].name.c_str(), t * 1e6,
                  bytes[i] / t / 1e9, f32_bytes / t / 1e9, ratio);
      row[items[i].name] = {{"seconds", t}, {"gb_per_s", bytes[i] / t / 1e9}, {"fp32_equiv_gb_per_s", f32_bytes / t / 1e9},
                            {"ratio_vs_sgemv", ratio}};
      if (i > 0) min_ratio = std::min(min_ratio, ratio);
    }
    out["gemv"].push_back(row);
  }
  const bool pass = min_ratio >= 3.0;
  std::printf("W4A16 GEMV vs FP32 sgemv (both shapes, sym and asym): min %.2fx (target >= 3x: %s)\n", min_ratio,
              pass ? "PASS" : "FAIL");
  out["gemv_min_ratio"] = min_ratio;
  out["target_3x_met"] = pass;

  const int m = 512;
  std::printf("-- %d-token GEMM (prefill, information only) --\n", m);
  std::printf("%-20s %10s %16s %9s\n", "shape", "sgemm", "W4A16 g128 sym", "x sgemm");
  for (const Shape& s : shapes) {
    const auto wf = normal_vector(int64_t(s.n) * s.k, 12, 0.02f);
    const auto x = normal_vector(int64_t(m) * s.k, 11, 1.0f);
    std::vector<float> y(static_cast<size_t>(m) * s.n);
    const W4A16Linear sym(Tensor::from_vector({s.n, s.k}, wf), 128, false);
    std::vector<TimedItem> items;
    items.push_back({"f32_sgemm", [&] {
                       cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s.n, s.k, 1.0f, x.data(), s.k, wf.data(), s.k, 0.0f,
                                   y.data(), s.n);
                     }});
    items.push_back({"w4a16_g128_sym", [&] { sym.forward(x.data(), m, y.data()); }});
    time_interleaved(items, min_seconds, 3);
    const double ops = 2.0 * m * s.k * s.n;
    const double sg = ops / items[0].best / 1e9, w4 = ops / items[1].best / 1e9;
    std::printf("%-20s %10.1f %16.1f %8.2fx   (GFLOP/s)\n", s.name, sg, w4, w4 / sg);
    out["gemm"].push_back({{"m", m}, {"k", s.k}, {"n", s.n}, {"sgemm_gflops", sg}, {"w4a16_g128_sym_gflops", w4}, {"ratio", w4 / sg}});
  }
  out["load_average_after"] = load_average();
  std::printf("load average after: %.2f\n", load_average());
  return out;
}

}  // namespace sq::bench
