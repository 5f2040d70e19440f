// CUDA implementation of cuda/cuda_w8a8_linear.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_int8_gemm.h"
#include "cuda/cuda_int8_quantize.h"
#include "cuda/cuda_w8a8_linear.h"

namespace sq::cuda {

namespace {

/// Scratch of the W8A8 forward pass for one (host thread, stream): quantized input, activation
/// steps, INT32 accumulators, cuBLASLt workspace.
struct W8A8Scratch {
  DeviceArray<int8_t> xq;
  DeviceArray<float> steps;
  DeviceArray<int32_t> acc;
  DeviceBuffer workspace;
};

/// Grows `a` to at least `count` elements. The old buffer may still be read by work enqueued on
/// `stream`, so the stream is synchronized before it is freed.
template <typename T>
void grow(DeviceArray<T>& a, size_t count, Stream stream) {
  if (a.size() >= count) return;
  if (a.size()) cuda_synchronize(stream, "cudaStreamSynchronize (before growing W8A8 scratch)");
  a = DeviceArray<T>();
  a = DeviceArray<T>(count);
  a.zero();  // the GEMM reads the padding rows of xq (below): keep them initialized
}

/// Token rows the INT8 GEMM runs on: n rounded up to a multiple of 32. cuBLASLt's INT8 kernels are
/// not known to have an algorithm for every small n (PyTorch's torch._int_mm, also cuBLASLt INT8,
/// refuses n ≤ 16 and pads small n to 32); rows are independent, so the extra rows (stale codes of
/// earlier calls, or zeros) only produce accumulator rows the epilogue never reads.
int64_t gemm_rows(int64_t n) { return (n + 31) / 32 * 32; }

W8A8Scratch& scratch_for(Stream stream, size_t xq_count, size_t step_count, size_t acc_count) {
  thread_local std::unordered_map<void*, W8A8Scratch> per_stream;
  W8A8Scratch& s = per_stream[stream.handle];
  if (s.workspace.bytes() == 0) s.workspace = DeviceBuffer(kLtWorkspaceBytes);
  grow(s.xq, xq_count, stream);
  grow(s.steps, step_count, stream);
  grow(s.acc, acc_count, stream);
  return s;
}

class CudaW8A8Linear final : public DeviceLinear {
 public:
  explicit CudaW8A8Linear(const W8A8HostWeights& w)
      : out_(w.out),
        in_(w.in),
        m_pad_(int8_gemm_pad(w.out)),
        k_pad_(int8_gemm_pad(w.in)),
        per_channel_(w.per_channel),
        act_(w.act),
        static_step_(w.static_step),
        format_(w.format),
        gemm_(m_pad_, k_pad_) {
    wq_ = DeviceArray<int8_t>(pad_int8_matrix(w.q, out_, in_, m_pad_, k_pad_));
    w_scales_ = DeviceArray<float>(w.scales, per_channel_ ? size_t(out_) : 1);
    if (w.bias) bias_ = DeviceArray<float>(w.bias, size_t(out_));
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  std::string format() const override { return format_; }

  void forward(const float* x, int64_t n, float* y, Stream stream) override {
    if (n < 0) throw std::invalid_argument("W8A8 device linear (" + format_ + "): negative row count " + std::to_string(n));
    if (n == 0) return;
    const bool per_token = act_ == ActQuant::PerToken;
    const int64_t rows = gemm_rows(n);
    W8A8Scratch& s = scratch_for(stream, size_t(rows) * size_t(k_pad_), per_token ? size_t(n) : 1, size_t(rows) * size_t(m_pad_));
    quantize_activations_int8(x, n, in_, act_, static_step_, s.xq.data(), k_pad_, s.steps.data(), stream);
    gemm_.run(wq_.data(), s.xq.data(), rows, s.acc.data(), s.workspace.data(), s.workspace.bytes(), stream);
    dequantize_int8_gemm(s.acc.data(), m_pad_, n, out_, s.steps.data(), per_token, w_scales_.data(), per_channel_,
                         bias_.size() ? bias_.data() : nullptr, y, stream);
  }

 private:
  int64_t out_, in_, m_pad_, k_pad_;
  bool per_channel_;
  ActQuant act_;
  float static_step_;
  std::string format_;
  CublasLtInt8Gemm gemm_;
  DeviceArray<int8_t> wq_;  ///< [m_pad, k_pad] INT8, zero padded
  DeviceArray<float> w_scales_, bias_;
};

}  // namespace

std::unique_ptr<DeviceLinear> make_w8a8_device_linear(const W8A8HostWeights& w) {
  if (w.out <= 0 || w.in <= 0 || w.in > 131072 || !w.q || !w.scales)
    throw std::invalid_argument("make_w8a8_device_linear: " + w.format + " weight [" + std::to_string(w.out) + ", " +
                                std::to_string(w.in) + "] must be non-empty with in <= 131072 and have codes and scales");
  if (w.act == ActQuant::PerTensorStatic && !(std::isfinite(w.static_step) && w.static_step > 0.0f))
    throw std::invalid_argument("make_w8a8_device_linear: " + w.format + " needs a finite static step > 0, got " +
                                std::to_string(w.static_step));
  return std::make_unique<CudaW8A8Linear>(w);
}

}  // namespace sq::cuda
