#include "bench/w4a4_bench.h"

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "model/w4a4_linear.h"
#include "model/w8a8_linear.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"

namespace sq::bench {

nlohmann::json run_w4a4_bench(int tokens, double min_seconds) {
  const int threads = omp_get_max_threads();
  const int m = tokens, k = 4096, n = 4096, n_outlier = 128, group = 128;
  nlohmann::json out;
  out["threads"] = threads;
  out["tokens"] = m;
  out["shape"] = {{"k", k}, {"n", n}, {"n_outlier", n_outlier}, {"group", group}};
  out["load_average_before"] = load_average();
  std::printf("== W4A4 (Atom, g%d + %d INT8 outliers) vs W8A8 vs OpenBLAS FP32, %d tokens x %d -> %d, %d threads, load average %.2f ==\n",
              group, n_outlier, m, k, n, threads, load_average());

  // One input for every item: N(0, 1) whose last 128 (reordered) channels are 20x larger.
  auto x = normal_vector(int64_t(m) * k, 11);
  for (int i = 0; i < m; ++i)
    for (int c = k - n_outlier; c < k; ++c) x[static_cast<size_t>(i) * k + c] *= 20.0f;
  const auto wf = normal_vector(int64_t(n) * k, 12, 0.02f);
  const Tensor w = Tensor::from_vector({n, k}, wf);
  std::vector<float> y(static_cast<size_t>(m) * n);

  const W8A8Linear w8(w, WeightGranularity::PerChannel, ActQuant::PerToken);
  const W4A4Linear w4(w, n_outlier, group);
  // Pre-quantized inputs for the GEMM-only rows.
  const std::vector<int8_t> wq8 = w8.quantized_weight();
  const PackedInt8Weights packed8(wq8.data(), n, k, Int8Backend::Auto);
  const int64_t ld8 = packed8.padded_k();
  std::vector<uint8_t> xq8(static_cast<size_t>(m) * ld8);
  std::vector<float> xs8(static_cast<size_t>(m));
  quantize_activations_u8(x.data(), m, k, ActQuant::PerToken, 0.0f, xq8.data(), ld8, xs8.data());
  Int8Dequant dq;
  dq.a_scales = xs8.data();
  dq.a_per_row = true;
  dq.b_scales = w8.weight_scales().data();
  dq.b_per_col = true;
  W4A4Activations a4;
  w4.quantize_input(x.data(), m, a4);
  W4A4Activations a4_scratch;

  std::vector<TimedItem> items;
  items.push_back({"f32_sgemm", [&] {
                     cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k, wf.data(), k, 0.0f, y.data(), n);
                   }});
  items.push_back({"w8a8_linear", [&] { w8.forward(x.data(), m, y.data()); }});
  items.push_back({"w4a4_linear", [&] { w4.forward(x.data(), m, y.data()); }});
  items.push_back({"w8a8_gemm_only", [&] { packed8.gemm_f32_biased(xq8.data(), ld8, m, dq, y.data()); }});
  items.push_back({"w4a4_gemm_only", [&] { w4.forward_quantized(a4, y.data()); }});
  items.push_back({"w8a8_act_quant", [&] {
                     quantize_activations_u8(x.data(), m, k, ActQuant::PerToken, 0.0f, xq8.data(), ld8, xs8.data());
                   }});
  items.push_back({"w4a4_act_quant", [&] { w4.quantize_input(x.data(), m, a4_scratch); }});
  time_interleaved(items, min_seconds, 5);

  const double ops = 2.0 * m * k * n;
  auto rate = [&](size_t i) { return ops / items[i].best / 1e9; };
  const double sg = rate(0);
  std::printf("%-16s %10s %12s %9s %9s\n", "item", "time ms", "GOP/s", "x sgemm", "x W8A8");
  for (size_t i = 0; i < items.size(); ++i) {
    const bool quant_only = items[i].name.find("act_quant") != std::string::npos;
    const double ref8 = items[i].name.rfind("w4a4_gemm", 0) == 0 ? items[3].best : items[1].best;
    if (quant_only) {
      std::printf("%-16s %10.3f %12s %9s %9s\n", items[i].name.c_str(), items[i].best * 1e3, "-", "-", "-");
    } else {
      std::printf("%-16s %10.3f %12.1f %8.2fx %8.2fx\n", items[i].name.c_str(), items[i].best * 1e3, rate(i), rate(i) / sg,
                  ref8 / items[i].best);
    }
    out["items"][items[i].name] = {{"seconds", items[i].best}, {"gops", quant_only ? 0.0 : rate(i)}};
  }
  const double vs_w8 = items[1].best / items[2].best, vs_sg = items[0].best / items[2].best;
  const double gemm_vs_w8 = items[3].best / items[4].best;
  const bool pass = vs_w8 >= 0.8 && vs_sg >= 3.0;
  std::printf("W4A4Linear vs W8A8Linear (both incl. activation quantization): %.2fx (target >= 0.8x); vs sgemm: %.2fx (target >= 3x): %s\n",
              vs_w8, vs_sg, pass ? "PASS" : "FAIL");
  std::printf("W4A4 GEMM alone vs W8A8 GEMM alone: %.2fx; load average after: %.2f\n", gemm_vs_w8, load_average());
  out["w4a4_vs_w8a8_linear"] = vs_w8;
  out["w4a4_vs_sgemm"] = vs_sg;
  out["w4a4_vs_w8a8_gemm_only"] = gemm_vs_w8;
  out["target_met"] = pass;
  out["load_average_after"] = load_average();
  return out;
}

}  // namespace sq::bench
