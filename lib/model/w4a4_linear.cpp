#include "model/w4a4_linear.h"

#include <stdexcept>
#include <utility>

namespace sq {

W4A4Weights W4A4Linear::quantize_tensor(const Tensor& weight, int64_t n_outlier, int64_t group, float weight_clip) {
  if (weight.rank() != 2 || weight.empty())
    throw std::invalid_argument("W4A4Linear: weight must be a non-empty rank-2 tensor, got " + weight.shape_string());
  return quantize_w4a4_weights(weight.data(), weight.dim(0), weight.dim(1), n_outlier, group, weight_clip);
}

W4A4Linear::W4A4Linear(const Tensor& weight, int64_t n_outlier, int64_t group, float weight_clip, float act_clip, Tensor bias,
                       W4A4Backend backend)
    : W4A4Linear(quantize_tensor(weight, n_outlier, group, weight_clip), act_clip, std::move(bias), backend) {}

W4A4Linear::W4A4Linear(const W4A4Weights& weights, float act_clip, Tensor bias, W4A4Backend backend)
    : out_(weights.out),
      in_(weights.in),
      n_outlier_(weights.n_outlier),
      group_(weights.group),
      act_clip_(act_clip),
      storage_bytes_(w4a4_storage_bytes(weights)),
      bias_(std::move(bias)),
      packed_(weights, backend) {  // validates the weights
  if (!(act_clip > 0.0f && act_clip <= 1.0f))
    throw std::invalid_argument("W4A4Linear: activation clipping ratio " + std::to_string(act_clip) + " is outside (0, 1]");
  if (!bias_.empty() && bias_.numel() != out_)
    throw std::invalid_argument("W4A4Linear: bias " + bias_.shape_string() + " does not match " + std::to_string(out_) + " outputs");
}

void W4A4Linear::quantize_input(const float* x, int64_t n, W4A4Activations& out) const {
  quantize_w4a4_activations(x, n, in_, n_outlier_, group_, act_clip_, out);
}

void W4A4Linear::forward_quantized(const W4A4Activations& a, float* y) const {
  packed_.gemm(a, bias_.empty() ? nullptr : bias_.data(), y);
}

void W4A4Linear::forward(const float* x, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W4A4Linear::forward: negative row count " + std::to_string(n));
  if (n == 0) return;
  static thread_local W4A4Activations buf;  // reused across calls; forward is reentrant across threads
  quantize_input(x, n, buf);
  forward_quantized(buf, y);
}

std::string W4A4Linear::format() const { return "w4a4-g" + std::to_string(group_) + "-o" + std::to_string(n_outlier_); }

}  // namespace sq
