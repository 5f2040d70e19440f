// W4A16 linear layer: group-wise INT4 weights (quant/int4_quantize.h; GPTQ / AWQ-style groups of
// g ∈ {32, 64, 128} input columns with an FP16 step and optional U4 zero point each), FP32
// activations, FP32 output:
//
//   y[i, o] = Σ_j Δ[o, j] · Σ_{k ∈ group j} x[i, k] · (q[o, k] − z[o, j])
//
// The weights stay packed; they are dequantized inside the kernels and the FP32 weight matrix is
// never materialized:
//   - n == 1 (decode): AVX-512 GEMV. Each 16-byte load of a packed row (32 weights) is widened to
//     16 dwords, split into low (even columns) and high (odd columns) nibbles and turned into
//     float through a 16-entry vpermps table (no mask, no int→float conversion); the activation is
//     permuted once per call into the same even/odd order, so the FMAs accumulate Σ x·q per group
//     in registers, and each group is closed with Δ · Σ x·q (symmetric) or Δ · (Σ x·u − z · Σ x)
//     (asymmetric, u the unsigned code; Σ x per group precomputed per call). Four rows share each
//     activation load.
//   - n > 1: tiled GEMM with AVX-512 FMAs (no sgemm): per block of 64 output rows and per chunk of
//     ≤ 128 input columns (whole groups), the tile is dequantized (gathered from 16 rows at a time,
//     exact: Δ·u − Δ·z in one FMA) into a per-thread transposed FP32 buffer Wt[128][64] (32 KiB,
//     L1-resident), then a 6-token × 64-output register-blocked micro-kernel accumulates into y.
//     Each weight is dequantized once per call, independent of n.
//   - builds without AVX-512: scalar fallback (one dequantized row at a time in a per-thread buffer).
// Threading: OpenMP over output rows (GEMV: 4-row blocks, 8 per dynamic chunk; GEMM: 64-row blocks,
// dynamic — so a thread preempted on a shared machine does not stall the others) when the product
// has at least 4M multiply-adds, otherwise the calling thread. Every output element is computed by the
// same sequence of operations whatever the partition, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "model/linear.h"
#include "quant/int4_quantize.h"

namespace sq {

class W4A16Linear final : public Linear {
 public:
  /// RTN-quantizes an FP32 weight W: [out, in] row-major (nn.Linear layout) with group size
  /// `group` (32, 64 or 128), symmetric or asymmetric (quantize_int4). When g does not divide in
  /// (the last group is ragged), the kernels run on a copy padded with zero columns to whole
  /// groups and the activation is zero-padded per call; the stored format is unchanged.
  /// Throws std::invalid_argument when W is not a non-empty rank-2 tensor, holds NaN/inf, in is odd
  /// or the group size is unsupported (the message names in and g).
  W4A16Linear(const Tensor& weight, int64_t group = 128, bool asym = false);

  /// From already-quantized weights (GPTQ output, a file), with an optional FP32 bias [out] added
  /// after the dequantized GEMM (y = x·Ŵᵀ + b). Throws std::invalid_argument when the container is
  /// inconsistent (validate_int4) or the bias length differs from out.
  explicit W4A16Linear(Int4Weights weights, Tensor bias = {});

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return w_.out; }

  /// x: [n, in] row-major FP32 → y: [n, out] row-major FP32 (overwritten; must not alias x); n ≥ 0.
  /// GEMV for n == 1, tiled GEMM for n > 1 (file comment). Safe to call concurrently.
  void forward(const float* x, int64_t n, float* y) const override;

  /// "w4a16-g<group>-<sym|asym>", e.g. "w4a16-g128-sym".
  std::string format() const override;
  /// packed bytes + 2 · scales + zero-point bytes (int4_storage_bytes).
  int64_t weight_bytes() const override { return int4_storage_bytes(weights()); }

  /// The quantized weights as stored (layouts in quant/int4_quantize.h; ragged groups unpadded).
  const Int4Weights& weights() const { return stored_ ? *stored_ : w_; }
  /// FP32 bias [out], or an empty Tensor.
  const Tensor& bias() const { return bias_; }

 private:
  void gemv(const float* x, float* y) const;
  void gemm(const float* x, int64_t n, float* y) const;
  void forward_scalar(const float* x, int64_t n, float* y) const;

  Int4Weights w_;  ///< the kernels' weights: whole groups (padded copy when g ∤ in)
  int64_t in_;     ///< logical input features
  std::unique_ptr<Int4Weights> stored_;  ///< the unpadded weights, only when padding was needed
  Tensor bias_;    ///< [out] or empty
};

}  // namespace sq
