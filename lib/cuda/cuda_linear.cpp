// upload_linear (cuda/cuda_linear.h): dispatch on the host layer's type, and the FP32 device linear.
// Device-neutral C++: the W8A8 and W4A16 implementations live in .cu files (stubs without CUDA).
#include "cuda/cuda_linear.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_w4a16_linear.h"
#include "cuda/cuda_w8a8_linear.h"
#include "model/linear.h"
#include "model/w4a16_linear.h"
#include "model/w8a16_linear.h"
#include "model/w8a8_linear.h"

namespace sq::cuda {

namespace {

/// FP32 linear: W [out, in] and the optional bias uploaded as FP32; y = x · Wᵀ + b through cuBLAS
/// sgemm with TF32 off (cuda_ops.h linear_f32).
class DenseDeviceLinear final : public DeviceLinear {
 public:
  explicit DenseDeviceLinear(const DenseLinear& d)
      : out_(d.out_features()),
        in_(d.in_features()),
        w_(d.weight().data(), size_t(d.weight().numel())) {
    if (!d.bias().empty()) b_ = DeviceArray<float>(d.bias().data(), size_t(d.bias().numel()));
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  std::string format() const override { return "f32"; }
  void forward(const float* x, int64_t n, float* y, Stream stream) override {
    if (n < 0) throw std::invalid_argument("f32 device linear: negative row count " + std::to_string(n));
    linear_f32(x, n, in_, w_.data(), out_, b_.size() ? b_.data() : nullptr, y, stream);
  }

 private:
  int64_t out_, in_;
  DeviceArray<float> w_, b_;  ///< w [out, in]; b [out] or empty
};

}  // namespace

void check_device_linear_format(const sq::Linear& linear, const std::string& name) {
  if (!dynamic_cast<const DenseLinear*>(&linear) && !dynamic_cast<const W8A8Linear*>(&linear) &&
      !dynamic_cast<const W4A16Linear*>(&linear) && !dynamic_cast<const W8A16Linear*>(&linear))
    throw UnsupportedError("CUDA backend: " + name + " is a '" + linear.format() +
                           "' linear; the CUDA backend runs f32, w8a8-*, w4a16-* and w8a16-* linears only (" +
                           (linear.format().find("+hadamard") != std::string::npos
                                ? "online Hadamard rotations run on the CPU only so far: convert with sq-convert --rotate none"
                                : "Atom W4A4 and other formats are not implemented on CUDA") +
                           ")");
}

std::unique_ptr<DeviceLinear> upload_linear(const sq::Linear& linear, const std::string& name) {
  const auto* dense = dynamic_cast<const DenseLinear*>(&linear);
  const auto* w8 = dynamic_cast<const W8A8Linear*>(&linear);
  const auto* w4 = dynamic_cast<const W4A16Linear*>(&linear);
  const auto* w8a16 = dynamic_cast<const W8A16Linear*>(&linear);
  // The format is checked before the device, so a refusal names the layer on every machine.
  check_device_linear_format(linear, name);
  require_cuda("CUDA backend (uploading " + name + ")");
  if (dense) return std::make_unique<DenseDeviceLinear>(*dense);
  if (w8a16) {
    // The INT8 head of a weight-only file: dequantized on the host (Δ·q, exact in FP32) and run as
    // an f32 device linear (FP32 activations, as on the CPU; four bytes a weight on the device).
    const int64_t out = w8a16->out_features(), in = w8a16->in_features();
    std::vector<float> W(size_t(out * in));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) W[size_t(o * in + k)] = w8a16->scales()[size_t(o)] * float(w8a16->codes()[size_t(o * in + k)]);
    return std::make_unique<DenseDeviceLinear>(DenseLinear(Tensor::from_vector({out, in}, std::move(W)), w8a16->bias()));
  }
  if (w4) return make_w4a16_device_linear(w4->weights(), w4->format());
  if (w8->act_quant() == ActQuant::PerTokenGroup)
    throw UnsupportedError("the CUDA runner has no INT8 GEMM with per-token-group activation steps (" + w8->format() +
                           "); run this model on the CPU, or convert it with --act per-token");
  const std::vector<int8_t> q = w8->quantized_weight();
  W8A8HostWeights h;
  h.q = q.data();
  h.scales = w8->weight_scales().data();
  h.per_channel = w8->weight_granularity() == WeightGranularity::PerChannel;
  h.act = w8->act_quant();
  h.static_step = w8->static_step();
  h.bias = w8->bias().empty() ? nullptr : w8->bias().data();
  h.out = w8->out_features();
  h.in = w8->in_features();
  h.format = w8->format();
  return make_w8a8_device_linear(h);
}

}  // namespace sq::cuda
