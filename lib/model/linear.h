// Linear layers: the one place where a model's matrix multiplications happen.
//
// Every projection of the decoder (q/k/v/o, gate/up/down, LM head) is a `Linear`, so quantized
// formats (W8A8, W4A16, ...) plug in by implementing this interface; the transformer code does not
// change.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace sq {

/// y = x · Wᵀ + b for a batch of rows.
class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  /// x: [n, in_features] row-major FP32; y: [n, out_features] row-major FP32 (overwritten; must not
  /// alias x). Safe to call concurrently from several threads.
  virtual void forward(const float* x, int64_t n, float* y) const = 0;
  /// Short description of the storage format, e.g. "f32".
  virtual std::string format() const = 0;
  /// Bytes of weight storage (incl. scales/zero points for quantized formats).
  virtual int64_t weight_bytes() const = 0;
};

/// FP32 linear through OpenBLAS: sgemm for n > 1, sgemv for n == 1.
/// W: [out, in] row-major (PyTorch nn.Linear layout); optional bias b: [out].
class DenseLinear final : public Linear {
 public:
  /// Throws std::invalid_argument when W is not rank 2 or b's length differs from W's rows.
  explicit DenseLinear(Tensor weight, Tensor bias = {});
  int64_t in_features() const override { return weight_.dim(1); }
  int64_t out_features() const override { return weight_.dim(0); }
  void forward(const float* x, int64_t n, float* y) const override;
  std::string format() const override { return "f32"; }
  int64_t weight_bytes() const override { return (weight_.numel() + bias_.numel()) * 4; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace sq
