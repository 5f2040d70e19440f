// W4A4 linear layer (Atom [Zhao et al. 2024] §4.1–4.3): INT4 group-quantized weights and activations
// with the last `n_outlier` input channels in INT8, on a real low-bit GEMM (quant/w4a4_gemm.h).
//
//   y[i, o] = Σ_j Δa[i, j] · Δw[o, j] · Σ_{k ∈ group j} qa[i, k] · qw[o, k]
//           + Δa_out[i] · Δo[o] · Σ_{k ∈ outliers} qa[i, k] · qw[o, k]  (+ b[o])
//
// The layer expects input channels in the REORDERED order its weights use (outlier channels last,
// Atom §4.1): the converter permutes the weight's columns and folds the same permutation into the
// operator that produces this layer's input. Activations are quantized dynamically per call
// (per token and group of g channels, INT4 with clipping ratio 0.9; outliers INT8 per token; §4.3),
// in a per-thread buffer, then multiplied on INT4/INT8 values with INT32 accumulation; only the
// per-group INT32 sums are rescaled to FP32.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "model/linear.h"
#include "quant/w4a4_gemm.h"
#include "quant/w4a4_quantize.h"

namespace sq {

class W4A4Linear final : public Linear {
 public:
  /// RTN-quantizes an FP32 weight W: [out, in] row-major (nn.Linear layout, input channels already
  /// reordered so that the last n_outlier are the outliers) with group size `group` (32, 64, 128;
  /// must divide in − n_outlier) and weight clipping ratio `weight_clip` (quantize_w4a4_weights).
  /// `act_clip` ∈ (0, 1] is the activation clipping ratio. Optional FP32 bias [out].
  /// Throws std::invalid_argument when W is not a non-empty rank-2 tensor, holds NaN/inf, the shape /
  /// group size / clipping ratios are invalid (the message names in and g), or the bias length
  /// differs from out; UnsupportedError when `backend` cannot run here.
  W4A4Linear(const Tensor& weight, int64_t n_outlier, int64_t group = 128, float weight_clip = kW4A4WeightClip,
             float act_clip = kW4A4ActClip, Tensor bias = {}, W4A4Backend backend = W4A4Backend::Auto);

  /// From already-quantized weights (GPTQ codes via w4a4_weights_from_codes / _from_int4, a file).
  /// Throws std::invalid_argument when `weights` is inconsistent (validate_w4a4), act_clip is outside
  /// (0, 1] or the bias length differs from out; UnsupportedError when `backend` cannot run here.
  explicit W4A4Linear(const W4A4Weights& weights, float act_clip = kW4A4ActClip, Tensor bias = {},
                      W4A4Backend backend = W4A4Backend::Auto);

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }

  /// x: [n, in] row-major FP32 (reordered channels) → y: [n, out] row-major FP32 (overwritten; must
  /// not alias x); n ≥ 0. Quantizes x (quantize_w4a4_activations) and runs the W4A4 GEMM. Safe to
  /// call concurrently. Throws std::invalid_argument for n < 0 or NaN/inf activations.
  void forward(const float* x, int64_t n, float* y) const override;

  /// Quantizes x [n, in] with this layer's shape and clipping ratio into `out` (for layers that share
  /// an input, e.g. q/k/v, or for timing the GEMM alone).
  void quantize_input(const float* x, int64_t n, W4A4Activations& out) const;
  /// y [a.m, out] from activations produced by quantize_input (of this or an identically shaped
  /// layer with the same act_clip). Throws std::invalid_argument on a shape mismatch.
  void forward_quantized(const W4A4Activations& a, float* y) const;

  /// "w4a4-g<group>-o<n_outlier>", e.g. "w4a4-g128-o128".
  std::string format() const override;
  /// Exact bytes of the quantized weights (w4a4_storage_bytes: INT4 codes, FP16 group scales, INT8
  /// outlier codes, FP32 outlier scales) + 4 · bias length.
  int64_t weight_bytes() const override { return storage_bytes_ + bias_.numel() * 4; }

  int64_t n_outlier() const { return n_outlier_; }
  int64_t group() const { return group_; }
  float act_clip() const { return act_clip_; }
  /// The quantized weights (unpacked from the GEMM layout; O(out·in)).
  W4A4Weights weights() const { return packed_.unpack(); }
  /// FP32 bias [out], or an empty Tensor.
  const Tensor& bias() const { return bias_; }
  /// The GEMM backend in use (never Auto).
  W4A4Backend backend() const { return packed_.backend(); }

 private:
  static W4A4Weights quantize_tensor(const Tensor& weight, int64_t n_outlier, int64_t group, float weight_clip);

  int64_t out_ = 0, in_ = 0, n_outlier_ = 0, group_ = 0;
  float act_clip_ = kW4A4ActClip;
  int64_t storage_bytes_ = 0;
  Tensor bias_;
  PackedW4A4Weights packed_;
};

}  // namespace sq
