// W8A8 linear layer (SmoothQuant §3.1/§3.3): INT8 weights × INT8 activations on a real INT8 GEMM.
//
//   y[i, j] = Δx[i or 0] · Δw[j or 0] · Σ_k Xq[i, k] · Wq[j, k]  (+ b[j])
//
// Weights are quantized once (Eq. 3.1, per output channel or per tensor) and never dequantized:
// the multiplication runs on INT8 values with INT32 accumulation (quant/int8_gemm.h) and only the
// INT32 result is rescaled to FP32. Activations are quantized on the fly per `ActQuant` (per-token
// dynamic = SmoothQuant-O1, per-tensor dynamic = O2, per-tensor static = O3; Table 3.2), or per
// token and block of 32 inputs (PerTokenGroup, as llama.cpp's Q8_0 dot product), whose GEMM
// rescales each block's INT32 partial sum (quant/int8_gemm_grouped.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/linear.h"
#include "quant/int8_gemm.h"
#include "quant/int8_quantize.h"

namespace sq {

class W8A8Linear final : public Linear {
 public:
  /// Quantizes an FP32 weight W: [out, in] row-major (nn.Linear layout) with `wg` granularity
  /// (Eq. 3.1). `static_step` is the calibrated activation step Δ (= calibrated absmax / 127) used
  /// by ActQuant::PerTensorStatic and ignored otherwise. Optional FP32 bias [out].
  /// Throws std::invalid_argument when W is not rank 2 / empty, holds NaN/inf, the bias length
  /// differs from `out`, or (static mode) static_step is not finite and > 0; UnsupportedError when
  /// `backend` cannot run here.
  W8A8Linear(const Tensor& weight, WeightGranularity wg, ActQuant aq, float static_step = 0.0f, Tensor bias = {},
             Int8Backend backend = Int8Backend::Auto);

  /// From already-quantized data (e.g. read from a file): q: [out, in] row-major INT8 in
  /// [−127, 127]; scales: the weight steps Δ, [out] (PerChannel) or [1] (PerTensor), finite and > 0.
  /// Throws std::invalid_argument on any size mismatch, a value −128, or an invalid scale/static
  /// step; UnsupportedError when `backend` cannot run here.
  W8A8Linear(std::vector<int8_t> q, std::vector<float> scales, int64_t out, int64_t in, WeightGranularity wg, ActQuant aq,
             float static_step, Tensor bias = {}, Int8Backend backend = Int8Backend::Auto);

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }

  /// x: [n, in] row-major FP32 → y: [n, out] row-major FP32 (overwritten; must not alias x).
  /// Quantizes x per act_quant() (to the biased-u8 form the VNNI kernel reads, in a per-thread
  /// buffer), runs the INT8 GEMM and dequantizes in its epilogue. Safe to call concurrently.
  /// Throws std::invalid_argument when a dynamic mode meets NaN/inf activations.
  void forward(const float* x, int64_t n, float* y) const override;

  /// Quantizes x: [n, in] FP32 with this layer's activation mode: xq [n, in] INT8 and
  /// x_scales [act_scale_count(act_quant(), n, in)] (n for PerToken, n·ceil(in/32) for
  /// PerTokenGroup, else 1). Layers that share an
  /// input and an ActQuant mode (q/k/v, gate/up) can quantize it once and call `forward_quantized`.
  void quantize_input(const float* x, int64_t n, int8_t* xq, float* x_scales) const;

  /// y[n, out] FP32 from an already-quantized input xq: [n, in] INT8 (values in [−127, 127]) with
  /// steps x_scales as quantize_input writes them.
  void forward_quantized(const int8_t* xq, const float* x_scales, int64_t n, float* y) const;

  /// An input quantized once, in the layout the VNNI kernel reads (biased u8 rows of `ld` bytes),
  /// for several linears that read the same activation (q/k/v; gate/up).
  struct QuantizedInput {
    std::vector<uint8_t> q;      ///< [n, ld] biased u8 (q + 128)
    std::vector<float> scales;   ///< [act_scale_count(act_quant(), n, in)]
    int64_t n = 0, ld = 0;
  };
  /// True when `other` quantizes its input exactly like this layer (same width, padded width,
  /// activation mode and static step), so one QuantizedInput serves both.
  bool shares_input_quantization(const W8A8Linear& other) const;
  /// Quantizes x [n, in] FP32 into `out` (buffers reused across calls). With hadamard_block > 0 the
  /// input quantized is R·x (ops/hadamard.h rotation with that block; the online transform of a
  /// HadamardInputLinear around this layer), each row rotated and quantized while in cache
  /// (quantize_activations_u8_hadamard): layers whose steps are per row (per token or per token
  /// group) only. Throws std::invalid_argument for a block that is not a power of two dividing in,
  /// or a block with a per-tensor activation mode (whose callers rotate x first,
  /// HadamardInputLinear::rotated_input).
  void quantize_input_u8(const float* x, int64_t n, QuantizedInput& out, int64_t hadamard_block = 0) const;
  /// y [n, out] from an input produced by quantize_input_u8 of a layer that shares_input_quantization.
  void forward_prequantized(const QuantizedInput& in, float* y) const;

  /// "w8a8-<weight granularity>-<activation mode>", e.g. "w8a8-per-channel-per-token".
  std::string format() const override;
  /// INT8 weight bytes + FP32 scales + FP32 bias (if any).
  int64_t weight_bytes() const override;

  WeightGranularity weight_granularity() const { return wg_; }
  ActQuant act_quant() const { return aq_; }
  /// Whether each token's activation steps depend on that token alone (PerToken, PerTokenGroup), so
  /// that rows can be rotated and quantized one at a time.
  bool quantizes_rows_independently() const { return aq_ == ActQuant::PerToken || aq_ == ActQuant::PerTokenGroup; }
  /// Calibrated activation step Δ for PerTensorStatic (0 when unused).
  float static_step() const { return static_step_; }
  /// The quantized weight Wq: [out, in] row-major INT8 (unpacked from the GEMM layout; O(out·in)).
  std::vector<int8_t> quantized_weight() const;
  /// Weight steps Δw: [out] (PerChannel) or [1] (PerTensor).
  const std::vector<float>& weight_scales() const { return scales_; }
  /// FP32 bias [out], or an empty Tensor.
  const Tensor& bias() const { return bias_; }
  /// The INT8 GEMM backend in use (never Auto).
  Int8Backend backend() const { return packed_.backend(); }

 private:
  struct QuantizedWeight {
    std::vector<int8_t> q;
    std::vector<float> scales;
    int64_t out = 0, in = 0;
  };
  static QuantizedWeight quantize_tensor(const Tensor& weight, WeightGranularity wg);
  W8A8Linear(QuantizedWeight&& qw, WeightGranularity wg, ActQuant aq, float static_step, Tensor bias, Int8Backend backend);
  /// Validates the constructor arguments (members already set) and returns q's data.
  const int8_t* validated(const std::vector<int8_t>& q) const;
  Int8Dequant dequant(const float* x_scales) const;

  int64_t out_ = 0, in_ = 0;
  WeightGranularity wg_;
  ActQuant aq_;
  float static_step_ = 0.0f;
  std::vector<float> scales_;
  Tensor bias_;
  PackedInt8Weights packed_;
};

}  // namespace sq
