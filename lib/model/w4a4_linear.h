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
//
// Converted models (sq-convert --scheme w4a4-atom, docs/quantization.md) use the W4A4LinearData
// constructor, which adds what a real checkpoint needs on top of the kernel's layout:
//   * a source map: the layer takes x in the PRODUCER's channel order and the activation quantizer
//     reads it through the reorder (quantize_w4a4_activations_mapped: the gather is fused into the
//     quantization step, no reordered copy of x is made) — where the converter could not fold the
//     reorder into the producing operator;
//   * zero padding of the INT4 part to whole kernel groups (a ragged last group, or one group per
//     row whose width is not a multiple of 8): padded weight codes and activations are 0, so every
//     sum is exactly that of the ragged group;
//   * FP32 outliers (Atom Table 3's "outliers kept in FP" step): the INT4 GEMM covers the normal
//     channels and an FP32 sgemm over the outlier channels is added to its result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/linear.h"
#include "quant/w4a4_gemm.h"
#include "quant/w4a4_quantize.h"

namespace sq {

/// Precision of the outlier channels (Atom §4.1, Table 3: "outliers kept in FP" vs "in INT8").
enum class W4A4OutlierFormat { Int8, Fp32 };
/// "int8" / "fp32".
const char* to_string(W4A4OutlierFormat f);

/// One Atom W4A4 linear as converted and stored in a .sqm (docs/formats.md, `--scheme w4a4-atom`),
/// in logical (unpadded) form. With in_normal = in − n_outlier and G = ⌈in_normal / g⌉ (G = 1 when
/// group = 0 or group ≥ in_normal):
struct W4A4LinearData {
  int64_t out = 0, in = 0;   ///< logical shape [out, in] of nn.Linear (in = the producer's channels)
  int64_t n_outlier = 0;     ///< outlier channels: the last n_outlier reordered positions, 0 ≤ n_outlier < in
  int64_t group = 0;         ///< INT4 group size 32, 64 or 128 (last group ragged), or 0 = one group per row
  /// [in] reordered position p reads input channel order[p] (a permutation of 0 … in−1), or empty:
  /// the input already arrives reordered (the reorder was folded into the producer).
  std::vector<int32_t> order;
  std::vector<int8_t> codes;          ///< [out, in_normal] INT4 codes in [−8, 7], one per byte, reordered columns
  std::vector<uint16_t> scales_f16;   ///< [out, G] FP16 bits of Δw (finite, ≥ 0)
  W4A4OutlierFormat outlier_format = W4A4OutlierFormat::Int8;
  std::vector<int8_t> outlier_codes;  ///< Int8: [out, n_outlier] in [−127, 127]
  std::vector<float> outlier_scales;  ///< Int8: [out] Δo, finite and > 0
  std::vector<float> outlier_weights; ///< Fp32: [out, n_outlier] FP32 weights of the outlier channels
  float act_clip = kW4A4ActClip;      ///< activation clipping ratio of the INT4 groups, (0, 1]
  Tensor bias;                        ///< FP32 [out] added after the GEMM, or empty (no bias)
};

/// Kernel group size for a stored group (W4A4LinearData::group) over in_normal INT4 channels: the
/// group itself when it is smaller than in_normal, else one group per row of round_up(in_normal, 8)
/// channels (zero-padded). Throws std::invalid_argument for a group other than 0, 32, 64, 128.
int64_t w4a4_kernel_group(int64_t in_normal, int64_t group);
/// Stored groups per row: ⌈in_normal / group⌉, or 1 for group 0 / group ≥ in_normal.
int64_t w4a4_stored_groups(int64_t in_normal, int64_t group);

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

  /// A converted Atom linear (file comment: source map, zero padding, FP32 outliers). The INT4 part
  /// is padded with code-0 columns to whole kernel groups (w4a4_kernel_group); forward(x) takes x
  /// [n, data.in] in the producer's channel order. Throws std::invalid_argument naming the field when
  /// `data` is inconsistent (sizes, order not a permutation, codes / scales out of range, act_clip
  /// outside (0, 1]); UnsupportedError when `backend` cannot run here.
  explicit W4A4Linear(const W4A4LinearData& data, W4A4Backend backend = W4A4Backend::Auto);

  int64_t in_features() const override { return x_in_; }
  int64_t out_features() const override { return out_; }

  /// x: [n, in_features()] row-major FP32 (reordered channels, or the producer's order for a layer
  /// with a source map) → y: [n, out] row-major FP32 (overwritten; must not alias x); n ≥ 0.
  /// Quantizes x (quantize_w4a4_activations or _mapped) and runs the W4A4 GEMM (+ the FP32 outlier
  /// sgemm). Safe to call concurrently. Throws std::invalid_argument for n < 0 or NaN/inf activations.
  void forward(const float* x, int64_t n, float* y) const override;

  /// Quantizes x [n, in_features()] with this layer's shape, source map and clipping ratio into `out`
  /// (for layers that share an input, e.g. q/k/v, or for timing the GEMM alone).
  void quantize_input(const float* x, int64_t n, W4A4Activations& out) const;
  /// y [a.m, out] from activations produced by quantize_input (of this or an identically shaped
  /// layer with the same act_clip). Not for layers with FP32 outliers (their outlier part needs x:
  /// std::logic_error). Throws std::invalid_argument on a shape mismatch.
  void forward_quantized(const W4A4Activations& a, float* y) const;

  /// "w4a4-g<group>-o<n_outlier>", e.g. "w4a4-g128-o128" (kernel group; "-fp32" appended for FP32 outliers).
  std::string format() const override;
  /// Exact bytes of the quantized weights as held (w4a4_storage_bytes of the kernel layout: INT4
  /// codes incl. zero padding, FP16 group scales, INT8 outlier codes, FP32 outlier scales) + 4 ·
  /// (bias length + FP32 outlier weights + source map entries).
  int64_t weight_bytes() const override {
    return storage_bytes_ + (bias_.numel() + fp_outlier_w_.numel() + int64_t(source_.size() + fp_outlier_src_.size())) * 4;
  }

  /// Outlier channels of the kernel (INT8); for FP32 outliers see fp32_outliers().
  int64_t n_outlier() const { return n_outlier_; }
  /// FP32 outlier channels (W4A4OutlierFormat::Fp32), else 0.
  int64_t fp32_outliers() const { return fp_outlier_w_.empty() ? 0 : fp_outlier_w_.dim(1); }
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

  /// Validates `d` and builds the padded kernel weights (INT8 outliers included, FP32 ones not).
  static W4A4Weights kernel_weights(const W4A4LinearData& d);

  int64_t out_ = 0, in_ = 0, n_outlier_ = 0, group_ = 0;  // the kernel's shape (in_: padded, reordered columns)
  int64_t x_in_ = 0;                                       // logical input width (in_features)
  std::vector<int32_t> source_;         // [in_] input channel of each kernel column (−1 = zero pad); empty = identity
  std::vector<int32_t> fp_outlier_src_; // [n_fp] input channels of the FP32 outliers
  Tensor fp_outlier_w_;                 // [out, n_fp] FP32 outlier weights, or empty
  float act_clip_ = kW4A4ActClip;
  int64_t storage_bytes_ = 0;
  Tensor bias_;
  PackedW4A4Weights packed_;
};

}  // namespace sq
