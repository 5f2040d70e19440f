// W8A16 linear layer: per-output-channel INT8 weights, FP32 activations (weight-only INT8):
//
//   y[i, o] = Δ[o] · Σ_k x[i, k] · q[o, k]  (+ b[o]),   q ∈ [−127, 127],  Δ[o] = max_k |W[o, k]| / 127
//
// (the per-channel weight quantizer of SmoothQuant Eq. 3.1; the activations are not quantized). It
// runs the LM head and the token embedding of `sq-convert --quantize-head` for the weight-only
// schemes (w4a16, w4a4-atom keep their head in this form): at 8 bits per weight (plus one FP32 step
// per row) the head's rounding costs SmolLM2-135M's W4A16 file about 0.001 KLD, where per-token
// INT8 activations (W8A8Linear) cost 0.008 (docs/results.md section 7).
// The weights stay INT8 in memory (one byte per weight, a quarter of FP32):
//   - n == 1 (decode): a GEMV over rows, each row's INT8 codes widened to FP32 in registers
//     (AVX-512: 16 lanes, AVX2: 8 lanes, else scalar), four accumulators, then × Δ[o] (+ b[o]).
//   - n > 1: blocks of ops::kLinearBlockRows output rows dequantized (exact: Δ·q in FP32) into a
//     per-thread FP32 buffer and multiplied with ops::sgemm on the calling thread, blocks spread over
//     the threads (dynamic). Each weight is dequantized once per call.
// Threading: OpenMP over rows when the product has at least 2^16 multiply-adds. The partition
// depends on the shape alone and every output element is computed by one fixed sequence of
// operations, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/linear.h"
#include "ops/packed_storage.h"

namespace sq {

class W8A16Linear final : public Linear {
 public:
  /// q: [out, in] row-major INT8 codes in [−127, 127]; scales: [out] finite steps Δ ≥ 0; optional
  /// FP32 bias [out]. Throws std::invalid_argument on a size mismatch, a code −128, a non-finite or
  /// negative step, or out/in ≤ 0. Borrowed codes are read, never copied.
  W8A16Linear(ops::Int8Codes q, std::vector<float> scales, int64_t out, int64_t in, Tensor bias = {});

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  /// x: [n, in] row-major FP32 → y: [n, out] row-major FP32 (overwritten; must not alias x); n ≥ 0.
  /// Safe to call concurrently.
  void forward(const float* x, int64_t n, float* y) const override;
  /// "w8a16-per-channel".
  std::string format() const override { return "w8a16-per-channel"; }
  /// out·in code bytes + 4·out step bytes (+ 4·out bias bytes).
  int64_t weight_bytes() const override { return out_ * in_ + 4 * out_ + bias_.numel() * 4; }

  const ops::Int8Codes& codes() const { return q_; }    ///< [out, in] row-major
  const std::vector<float>& scales() const { return scales_; } ///< [out]
  const Tensor& bias() const { return bias_; }                 ///< [out] or empty

 private:
  ops::Int8Codes q_;
  std::vector<float> scales_;
  int64_t out_, in_;
  Tensor bias_;
};

}  // namespace sq
