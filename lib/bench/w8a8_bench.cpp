#include "bench/w8a8_bench.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"

#include "model/w8a8_linear.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"

namespace sq::bench {


nlohmann::json run_w8a8_linear_bench(int tokens, double min_seconds) {
  const int threads = omp_get_max_threads();
  const bool have_onednn = int8_backend_available(Int8Backend::OneDnn);
  // The VNNI kernel side by side when Auto picks another one (AMX).
  const bool vnni_column = resolve_int8_backend(Int8Backend::Auto) != Int8Backend::Vnni && int8_backend_available(Int8Backend::Vnni);
  nlohmann::json out;
  out["threads"] = threads;
  out["tokens"] = tokens;
  out["default_backend"] = to_string(resolve_int8_backend(Int8Backend::Auto));
  out["load_average_before"] = load_average();
  std::printf("== W8A8 linear (INT8 GEMM, default backend %s) vs OpenBLAS FP32 sgemm, %d tokens, %d threads, load average %.2f ==\n",
              to_string(resolve_int8_backend(Int8Backend::Auto)), tokens, threads, load_average());
  std::printf("%-22s %9s | %-22s | %-22s | %-22s | %-22s | %-22s%s\n", "shape", "sgemm", "W8A8Linear per-token", "per-token-group",
              "int8 GEMM only", "oneDNN W8A8Linear", "oneDNN int8 GEMM", vnni_column ? " | VNNI W8A8Linear       | VNNI int8 GEMM" : "");
  std::printf("%-22s %9s | %-22s | %-22s | %-22s | %-22s | %-22s%s\n", "", "GFLOP/s", "GOP/s   x sgemm", "GOP/s   x sgemm",
              "GOP/s   x sgemm", "GOP/s   x sgemm", "GOP/s   x sgemm", vnni_column ? " | GOP/s   x sgemm        | GOP/s   x sgemm" : "");

  struct Shape { int k, n; const char* name; };
  // LLaMA-7B's linears (the 4x target), then SmolLM2-135M's (the real model of docs/benchmarks.md).
  const Shape shapes[] = {{4096, 4096, "q/o 4096->4096"}, {4096, 11008, "gate/up 4096->11008"}, {11008, 4096, "down 11008->4096"},
                          {576, 576, "q/o 576->576"},     {576, 1536, "gate/up 576->1536"},     {1536, 576, "down 1536->576"}};
  double min_target_ratio = 1e30;
  for (const Shape& s : shapes) {
    const int m = tokens;
    const auto x = normal_vector(int64_t(m) * s.k, 11);
    const auto wf = normal_vector(int64_t(s.n) * s.k, 12);
    std::vector<float> y(static_cast<size_t>(m) * s.n);

    const Tensor w = Tensor::from_vector({s.n, s.k}, wf);
    const W8A8Linear lin(w, WeightGranularity::PerChannel, ActQuant::PerToken);
    // The same weights with a step per token and block of 32 inputs (quant/int8_gemm_grouped.h).
    const W8A8Linear lin_group(w, WeightGranularity::PerChannel, ActQuant::PerTokenGroup);
    // Pre-quantized activations and weights for the GEMM-only rows.
    std::vector<int8_t> xq(static_cast<size_t>(m) * s.k);
    std::vector<float> xs(static_cast<size_t>(m));
    quantize_activations(x.data(), m, s.k, ActQuant::PerToken, 0.0f, xq.data(), xs.data());
    const std::vector<int8_t> wq = lin.quantized_weight();
    const PackedInt8Weights packed(wq.data(), s.n, s.k, Int8Backend::Auto);
    std::vector<int32_t> c(static_cast<size_t>(m) * s.n);

    std::vector<TimedItem> items;
    items.push_back({"sgemm", [&] {
                       cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s.n, s.k, 1.0f, x.data(), s.k, wf.data(), s.k, 0.0f,
                                   y.data(), s.n);
                     }});
    items.push_back({"w8a8_linear", [&] { lin.forward(x.data(), m, y.data()); }});
    items.push_back({"w8a8_linear_per_token_group", [&] { lin_group.forward(x.data(), m, y.data()); }});
    items.push_back({"int8_gemm", [&] { packed.gemm_s32(xq.data(), m, c.data()); }});
    // The same two items through another backend: oneDNN's matmul, and the VNNI kernel on AMX machines.
    std::vector<std::unique_ptr<W8A8Linear>> other_lin;
    std::vector<std::unique_ptr<PackedInt8Weights>> other_packed;
    auto add_backend = [&](Int8Backend b, const std::string& prefix) {
      other_lin.push_back(std::make_unique<W8A8Linear>(wq, lin.weight_scales(), s.n, s.k, WeightGranularity::PerChannel,
                                                       ActQuant::PerToken, 0.0f, Tensor{}, b));
      other_packed.push_back(std::make_unique<PackedInt8Weights>(wq.data(), s.n, s.k, b));
      const W8A8Linear* l = other_lin.back().get();
      const PackedInt8Weights* p = other_packed.back().get();
      items.push_back({prefix + "_w8a8_linear", [&, l] { l->forward(x.data(), m, y.data()); }});
      items.push_back({prefix + "_int8_gemm", [&, p] { p->gemm_s32(xq.data(), m, c.data()); }});
    };
    if (have_onednn) add_backend(Int8Backend::OneDnn, "onednn");
    if (vnni_column) add_backend(Int8Backend::Vnni, "vnni");
    time_interleaved(items, min_seconds, 5);  // each keeps its fastest call

    const double ops = 2.0 * m * s.k * s.n;
    auto rate = [&](const TimedItem& it) { return ops / it.best / 1e9; };
    const double sg = rate(items[0]);
    nlohmann::json row = {{"m", m}, {"k", s.k}, {"n", s.n}, {"sgemm_gflops", sg}};
    std::printf("%-22s %9.1f", s.name, sg);
    for (size_t i = 1; i < items.size(); ++i) {
      const double r = rate(items[i]);
      std::printf(" | %8.1f  %5.2fx      ", r, r / sg);
      row[items[i].name + "_gops"] = r;
      row[items[i].name + "_ratio"] = r / sg;
    }
    std::printf("\n");
    if (s.k == 4096) min_target_ratio = std::min(min_target_ratio, rate(items[1]) / sg);
    out["shapes"].push_back(row);
  }
  const bool pass = min_target_ratio >= 4.0;
  std::printf("W8A8Linear (incl. per-token quantize + dequantize) vs sgemm at 4096->4096 and 4096->11008: min %.2fx (target >= 4x: %s)\n",
              min_target_ratio, pass ? "PASS" : "FAIL");
  out["w8a8_linear_min_ratio_4096"] = min_target_ratio;
  out["load_average_after"] = load_average();
  out["target_4x_met"] = pass;
  return out;
}

}  // namespace sq::bench
