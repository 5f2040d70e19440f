#include "cuda/cuda_gemm_bench.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

#include "bench/timing.h"
#include "cuda/cuda_fp16_gemm.h"
#include "cuda/cuda_int8_gemm.h"
#include "cuda/cuda_linear.h"
#include "cuda/cuda_runtime.h"
#include "formats/safetensors.h"
#include "model/w4a16_linear.h"
#include "model/w8a8_linear.h"

namespace sq::bench {

namespace {

struct Item {
  std::string name;
  std::function<void()> body;
  std::vector<float> ms;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (double(v[h - 1]) + v[h]);
}

std::vector<uint16_t> to_half(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_half(v[i]);
  return h;
}

}  // namespace

nlohmann::json run_cuda_gemm_bench(const CudaGemmBenchOptions& opt) {
  require_cuda("sq-bench --suite cuda-gemm");
  if (opt.reps < 1 || opt.warmup < 0) throw std::invalid_argument("cuda-gemm bench: reps must be >= 1 and warmup >= 0");
  for (int64_t n : opt.tokens)
    if (n < 1) throw std::invalid_argument("cuda-gemm bench: token counts must be >= 1, got " + std::to_string(n));
  const std::string device = cuda_device_name(0);
  nlohmann::json out;
  out["device"] = device;
  out["reps"] = opt.reps;
  out["warmup"] = opt.warmup;
  std::printf("== CUDA GEMM at LLaMA-7B shapes on %s: median of %d CUDA-event timings after %d warm-up calls ==\n",
              device.c_str(), opt.reps, opt.warmup);
  std::printf("%-22s %6s %11s %11s %11s %11s %9s %9s %9s %9s\n", "shape (m x k)", "n", "fp16 ms", "int8 ms", "w8a8 ms",
              "w4a16 ms", "int8 TOPS", "fp16/int8", "fp16/w8a8", "fp16/w4a16");
  struct Shape {
    int64_t m, k;
    const char* name;
  };
  const Shape shapes[] = {{4096, 4096, "q/k/v/o 4096x4096"}, {11008, 4096, "gate/up 11008x4096"}, {4096, 11008, "down 4096x11008"}};
  CudaStream stream;
  const Stream s = stream.get();
  CudaEventTimer timer;
  double min_large_ratio = 1e30;
  for (const Shape& sh : shapes) {
    const auto wf = normal_vector(sh.m * sh.k, 21, 0.02f);
    const Tensor w = Tensor::from_vector({sh.m, sh.k}, wf);
    const W8A8Linear w8(w, WeightGranularity::PerChannel, ActQuant::PerToken);
    const W4A16Linear w4(w, 128, false);
    auto d8 = cuda::upload_linear(w8, "bench w8a8");
    auto d4 = cuda::upload_linear(w4, "bench w4a16");
    const DeviceArray<uint16_t> w16(to_half(wf));
    const int64_t mp = cuda::int8_gemm_pad(sh.m), kp = cuda::int8_gemm_pad(sh.k);
    const std::vector<int8_t> wq = w8.quantized_weight();
    const DeviceArray<int8_t> wq_pad(cuda::pad_int8_matrix(wq.data(), sh.m, sh.k, mp, kp));
    cuda::CublasLtInt8Gemm gemm(mp, kp);
    DeviceBuffer workspace(cuda::kLtWorkspaceBytes);
    for (int64_t n : opt.tokens) {
      const auto xf = normal_vector(n * sh.k, 22, 1.0f);
      const DeviceArray<float> x(xf);
      const DeviceArray<uint16_t> x16(to_half(xf));
      std::vector<int8_t> xq_host(size_t(n * kp), 0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < sh.k; ++j) xq_host[size_t(i * kp + j)] = int8_t(int(j * 7 + i * 3) % 255 - 127);
      const DeviceArray<int8_t> xq(xq_host);
      DeviceArray<uint16_t> y16(size_t(n * sh.m));
      DeviceArray<int32_t> acc(size_t(n * mp));
      DeviceArray<float> y(size_t(n * sh.m));
      std::vector<Item> items;
      items.push_back({"fp16_gemm", [&] { cuda::gemm_f16(x16.data(), n, sh.k, w16.data(), sh.m, y16.data(), s); }, {}});
      items.push_back({"int8_gemm", [&] { gemm.run(wq_pad.data(), xq.data(), n, acc.data(), workspace.data(), workspace.bytes(), s); }, {}});
      items.push_back({"w8a8_linear", [&] { d8->forward(x.data(), n, y.data(), s); }, {}});
      items.push_back({"w4a16_linear", [&] { d4->forward(x.data(), n, y.data(), s); }, {}});
      for (Item& it : items)
        for (int r = 0; r < opt.warmup; ++r) it.body();
      cuda_synchronize(s, "cuda-gemm bench (warm-up)");
      for (int r = 0; r < opt.reps; ++r)
        for (Item& it : items) {
          timer.start(s);
          it.body();
          timer.stop(s);
          it.ms.push_back(timer.elapsed_ms());
        }
      const double flops = 2.0 * double(sh.m) * double(sh.k) * double(n);
      nlohmann::json row = {{"shape", sh.name}, {"m", sh.m}, {"k", sh.k}, {"n", n}};
      double med[4] = {0, 0, 0, 0};
      for (size_t i = 0; i < items.size(); ++i) {
        med[i] = median(items[i].ms);
        row[items[i].name] = {{"median_ms", med[i]},
                              {"min_ms", double(*std::min_element(items[i].ms.begin(), items[i].ms.end()))},
                              {"tops", flops / (med[i] * 1e-3) / 1e12},
                              {"speedup_vs_fp16", med[0] / med[i]}};
      }
      std::printf("%-22s %6lld %11.4f %11.4f %11.4f %11.4f %9.1f %8.2fx %8.2fx %8.2fx\n", sh.name, static_cast<long long>(n), med[0],
                  med[1], med[2], med[3], flops / (med[1] * 1e-3) / 1e12, med[0] / med[1], med[0] / med[2], med[0] / med[3]);
      if (n >= 512) min_large_ratio = std::min(min_large_ratio, med[0] / med[1]);
      out["rows"].push_back(row);
    }
  }
  if (min_large_ratio < 1e30) {
    const bool pass = min_large_ratio >= 1.5;
    std::printf("INT8 GEMM vs FP16 GEMM at n >= 512 (all three shapes): min %.2fx (target >= 1.5x on H100: %s) on %s\n",
                min_large_ratio, pass ? "PASS" : "FAIL", device.c_str());
    out["acceptance"] = {{"min_int8_vs_fp16_n_ge_512", min_large_ratio}, {"target", 1.5}, {"pass", pass}};
  }
  return out;
}

}  // namespace sq::bench
