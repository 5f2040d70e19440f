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
//     (asymmetric, u the unsigned code; Σ x per group precomputed per call), or Δ · Σ x·u + m · Σ x
//     with a float minimum m (Q4_1 / Q4_K; every path below closes groups the same way). Four rows
//     share each activation load.
//   - n == 1 with W4DecodeActivations::Int8: the activation is rounded to INT8 per block of 32 columns
//     and permuted per 128-column chunk into [64 even columns, 64 odd columns]. One aligned 64-byte
//     load of a packed row (128 weights) gives the even columns' codes in its low nibbles and the
//     odd columns' in its high nibbles (one vpternlogd each: mask, and for symmetric weights flip
//     the top bit, u = q + 8; one shift for the high ones), and two vpdpbusd form 16 exact partial
//     dot products (lane l: columns 8l .. 8l + 8, 32-column block l / 4). Per chunk and row:
//     int→float, ×s_b − the zero point's share (z · s_b · Σ x_q over the block, spread over its 4
//     lanes), × Δ of the lanes' group. A row that ends in 64 columns (in mod 128 = 64) closes with
//     one 32-byte load broadcast to both halves of a zmm, its upper half shifted right by 4 (lanes
//     0–3 and 8–11: the chunk's first block, 4–7 and 12–15: its second).
//   - n > 1: tiled GEMM with AVX-512 FMAs (no sgemm): per block of 64 output rows and per chunk of
//     ≤ 128 input columns (whole groups), the tile is dequantized (gathered from 16 rows at a time,
//     exact: Δ·u − Δ·z in one FMA; Δ·u + m with a float minimum, GGML's rounding) into a per-thread transposed FP32 buffer Wt[128][64] (32 KiB,
//     L1-resident), then a 6-token × 64-output register-blocked micro-kernel accumulates into y.
//     Each weight is dequantized once per call, independent of n.
//   - n == 1 on builds with AVX2 and FMA but no AVX-512: the same GEMV with 8 lanes. Per 16-column
//     chunk the activation is permuted to [8 even, 8 odd]; each 8-byte load of a packed row is
//     widened to 8 dwords, masked (low nibbles) and shifted (high nibbles) and converted to float as
//     the unsigned code u (symmetric codes, stored two's complement, are XORed with 8 first: u = q + 8),
//     and each group is closed with Δ · (Σ x·u − z · Σ x), z = 8 when symmetric. On a 2-core AVX2-only
//     AMD EPYC (2026-11-29) this took SmolLM2-135M W4A16 g128 decode (sq-run, 2 threads) from 1.5
//     to 39 tokens/s; reading Δ and z inline (F16C) instead of per-group calls, with the default INT8
//     head, took g32 from 34 to 60 tokens/s (docs/benchmarks.md, 2026-11-30).
//   - builds without AVX-512: products below 2^16 multiply-adds (and n == 1 without AVX2) run a
//     scalar loop (one dequantized row at a time in a per-thread buffer); larger products dequantize blocks of
//     ops::kLinearBlockRows output rows (exact) into a per-thread FP32 buffer and multiply each
//     with ops::sgemm on the calling thread, blocks spread over the threads. Each weight is dequantized
//     once per call. On a 2-core AVX2-only AMD EPYC (2026-11-29) this took SmolLM2-135M W4A16 g128
//     HellaSwag from about 8 to 310 tokens/s (docs/benchmarks.md, "HellaSwag against llama.cpp").
// Threading: OpenMP over output rows when the product has at least 2^16 multiply-adds, otherwise the
// calling thread. GEMV: 4-row blocks, static (each thread streams one contiguous slice of the
// weights, which the hardware prefetchers follow; software prefetch runs kPrefetchBytes ahead);
// GEMM: 64-row blocks, dynamic (so a thread preempted on a shared machine does not stall the
// others). Every output element is computed by the same sequence of operations whatever the
// partition, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "model/linear.h"
#include "quant/int4_quantize.h"

namespace sq {

/// The activations of W4A16Linear's batch-1 (decode) GEMV.
enum class W4DecodeActivations {
  Fp32,  ///< exact W4A16: FP32 activations times the dequantized weights (the default)
  /// W4A8 decode, as llama.cpp's Q4_0 × Q8_0 dot product: the activation is rounded to INT8 per block
  /// of 32 columns, x ≈ s_b · x_q with s_b = max_b |x| / 127 and x_q = round-to-nearest-even(x / s_b)
  /// (|x_q| ≤ 127), and each weight group is closed as Δ · Σ_b s_b · Σ_{k∈b} (u_k − z) · x_q,k with
  /// exact integer dot products (AVX512-VNNI vpdpbusd, u the unsigned 4-bit code, z = 8 symmetric).
  /// Error per output: at most Σ_k |Ŵ[o, k]| · s_b(k) / 2 beyond FP32 rounding. Prefill (n > 1) keeps
  /// FP32 activations.
  Int8,
};

/// True when this build and CPU run W4DecodeActivations::Int8 (AVX-512 F/BW/VL, VNNI and VBMI,
/// compiled in and reported by CPUID).
bool w4_int8_decode_supported();

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

  /// One decode step of several linears that read the same x [in] (q/k/v, gate/up): y_i = x·Ŵ_iᵀ
  /// (+ b_i) for each pair, in one OpenMP parallel region over all their rows instead of one per
  /// linear. Each y_i equals linears[i].first->forward(x, 1, y_i) bit for bit. Every linear must have
  /// the same in_features (std::invalid_argument otherwise); at most 4 linears.
  static void forward_batch1(std::span<const std::pair<const W4A16Linear*, float*>> linears, const float* x);
  static void forward_batch1(std::initializer_list<std::pair<const W4A16Linear*, float*>> linears, const float* x) {
    forward_batch1(std::span(linears.begin(), linears.size()), x);
  }

  /// "w4a16-g<group>-<sym|asym>", e.g. "w4a16-g128-sym"; "w4a16-g<group>-asym-fmin" with a float
  /// minimum, "w4a16-q4_k" with K-quant scales (quant/q4k_layout.h).
  std::string format() const override;
  /// packed bytes + 2 · scales + zero-point bytes (int4_storage_bytes).
  int64_t weight_bytes() const override { return int4_storage_bytes(weights()); }

  /// Chooses the decode GEMV's activations (W4DecodeActivations). Int8 applies when the kernels'
  /// input width (in, padded to whole groups) is a multiple of 64; other layers keep FP32 (see
  /// decode_activations()). Int8 on a layer with in mod 128 = 64 (SmolLM2's 576) also builds the
  /// INT8 GEMV's own block-interleaved copy of the stored codes (one more packed-weight copy, in/2
  /// bytes per row; it reads no zero padding and only whole aligned lines); Fp32 frees it.
  /// Not thread-safe against concurrent forward(): set before running.
  /// Throws std::invalid_argument for Int8 when !w4_int8_decode_supported().
  void set_decode_activations(W4DecodeActivations a);
  /// The activations the decode GEMV actually uses (Fp32 when Int8 was asked on a width it cannot run).
  W4DecodeActivations decode_activations() const { return decode_act_; }

  /// The quantized weights as stored (layouts in quant/int4_quantize.h; ragged groups unpadded).
  const Int4Weights& weights() const { return stored_ ? *stored_ : w_; }
  /// FP32 bias [out], or an empty Tensor.
  const Tensor& bias() const { return bias_; }

 private:
  void gemm(const float* x, int64_t n, float* y) const;
  void forward_scalar(const float* x, int64_t n, float* y) const;

  Int4Weights w_;  ///< the kernels' weights: whole groups (padded copy when g ∤ in)
  int64_t in_;     ///< logical input features
  std::unique_ptr<Int4Weights> stored_;  ///< the unpadded weights, only when padding was needed
  Tensor bias_;    ///< [out] or empty
  W4DecodeActivations decode_act_ = W4DecodeActivations::Fp32;
  Int4Weights decode_;  ///< the INT8 decode GEMV's block-interleaved codes (set_decode_activations), or empty
};

}  // namespace sq
