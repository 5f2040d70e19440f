// Atom W4A4 mixed-precision GEMM (Atom §4.1–4.2, Figure 7's fused group dequantization, on CPU):
//
//   y[i, o] = Σ_{j < G} Δa[i, j] · Δw[o, j] · Σ_{k ∈ group j} qa[i, k] · qw[o, k]           (INT4 × INT4)
//           + Δa_out[i] · Δo[o] · Σ_{k ∈ outliers} qa[i, k] · qw[o, k]                     (INT8 × INT8)
//           (+ bias[o])
//
// Inputs: weights prepared once from a W4A4Weights (quant/w4a4_quantize.h), activations quantized
// per call (W4A4Activations). The integer sums are exact; only the per-group INT32 partial sums are
// turned into FP32, each rescaled and accumulated in the fixed order below — never a dequantized
// FP32 matrix and a float GEMM.
//
// Epilogue, evaluated identically by every backend (so their outputs are bit-identical):
//   y = 0
//   for j = 0 .. G−1:   y = fma(float(acc_j), Δa[i, j] · Δw[o, j], y)        (Δw: FP16 value as float)
//   if n_outlier > 0:   y = fma(float(acc_out), Δa_out[i] · Δo[o], y)
//   if bias:            y = y + bias[o]
// (each product of two scales rounded once to FP32, then one fused multiply-add.)
//
// Backends:
//   - Vnni (AVX-512 VNNI): vpdpbusd multiplies u8 × s8, so here the WEIGHTS are the unsigned
//     operand: INT4 codes are stored offset by +8 (u = q + 8 ∈ [0, 15]) and INT8 outlier codes by
//     +128 (u ∈ [1, 255]); activations stay signed (s8). Σ u·qa = Σ q·qa + off·Σ qa, and the
//     activation quantizer already produced Σ qa per (token, group) (W4A4Activations::sums), so the
//     kernel subtracts off·Σqa from each group's INT32 sum before the FP32 epilogue.
//     Weights are packed once into 48-column panels (the register blocking of quant/int8_gemm.cpp):
//
//       INT4 panel   [in_normal/8][48][4] bytes: byte (P, c, t) = u[c, 8P + t] | u[c, 8P + 4 + t] << 4
//                    → one 64-byte load holds 16 columns × 8 k: its low nibbles (vpandd 0x0F) are
//                    the vpdpbusd operand for k = 8P..8P+3, its high nibbles (vpsrlw 4, vpandd) for
//                    k = 8P+4..8P+7 (unpacked on the fly, INT4 → 8-bit: 3 ALU ops per 2 vectors);
//       INT8 panel   [ceil(n_outlier/4)][48][4] bytes: u = q + 128 (padding k: 128, i.e. zero);
//       scales       [G][48] FP32 Δw and [48] FP32 Δo per panel (padding columns 0).
//
//     The micro-kernel keeps an 8-token × 48-column INT32 tile in 24 registers for one group
//     (g/4 vpdpbusd steps), hands it to an FP32 tile on the stack (the epilogue above, one group at
//     a time), and finally writes y. Panels are split dynamically over OpenMP threads; each output
//     element is computed by one thread in a fixed order, so results do not depend on the thread
//     count. Products under ~4M multiply-adds run on the calling thread.
//   - Reference: scalar loops over the W4A4Weights container (tests; the fallback of builds or CPUs
//     without AVX-512 VNNI).
// `Auto` resolves to Vnni when available, else Reference.
#pragma once

#include <cstdint>
#include <memory>

#include "quant/w4a4_quantize.h"

namespace sq {

/// Which W4A4 GEMM implementation runs (see file comment).
enum class W4A4Backend { Auto, Vnni, Reference };

/// "auto" / "vnni" / "reference".
const char* to_string(W4A4Backend b);
/// True when `b` can run here (Vnni needs an AVX-512-VNNI build and CPU).
bool w4a4_backend_available(W4A4Backend b);
/// What `Auto` resolves to here: Vnni if available, else Reference. Others are returned unchanged.
W4A4Backend resolve_w4a4_backend(W4A4Backend b);

/// Largest n_outlier the INT32 outlier sums support exactly (255 · 127 · n < 2³¹).
inline constexpr int64_t kW4A4MaxOutliers = 65536;

/// Scalar reference (Atom §4.2, Figure 7's group dequantization): y [a.m, w.out] row-major FP32 =
/// the file comment's formula, integer sums in 64-bit, epilogue in the documented order. `bias` [w.out] or null. Throws std::invalid_argument
/// when a's shape (in, n_outlier, group) differs from w's or n_outlier > kW4A4MaxOutliers.
void w4a4_gemm_reference(const W4A4Activations& a, const W4A4Weights& w, const float* bias, float* y);

/// W4A4 weights prepared once for repeated products (Atom §4.1–4.2: INT4 groups + INT8 outlier
/// channels, fused per-group rescaling). Immutable after construction; all methods are const and
/// safe to call concurrently.
class PackedW4A4Weights {
 public:
  /// Packs `w` (validated with validate_w4a4) for `backend` (Auto resolves now). Throws
  /// std::invalid_argument for invalid weights or n_outlier > kW4A4MaxOutliers, UnsupportedError
  /// (core/error.h) when the backend cannot run here.
  explicit PackedW4A4Weights(const W4A4Weights& w, W4A4Backend backend = W4A4Backend::Auto);
  ~PackedW4A4Weights();
  PackedW4A4Weights(PackedW4A4Weights&&) noexcept;
  PackedW4A4Weights& operator=(PackedW4A4Weights&&) noexcept;

  int64_t out() const;        ///< output features
  int64_t in() const;         ///< input features (normal + outlier)
  int64_t n_outlier() const;  ///< INT8 outlier channels (the last ones)
  int64_t group() const;      ///< INT4 group size g
  W4A4Backend backend() const;  ///< the resolved backend (never Auto)
  /// Bytes held by the packed representation (panels incl. padding, FP32 scales).
  int64_t packed_bytes() const;
  /// The weights back as a W4A4Weights (inverse of the packing; exact).
  W4A4Weights unpack() const;

  /// y [a.m, out] (FP32, row-major, overwritten) = the file comment's formula for activations `a`
  /// (quantize_w4a4_activations with this layer's in / n_outlier / group); `bias` [out] or null.
  /// Throws std::invalid_argument when a's shape does not match.
  void gemm(const W4A4Activations& a, const float* bias, float* y) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sq
