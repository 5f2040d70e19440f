// Symmetric INT8 quantization of weights and activations (SmoothQuant, Eq. 3.1).
//
//   q = clamp(round(x / Δ), −127, 127),   Δ = max(|X|) / (2^(N−1) − 1) = max(|X|) / 127   (N = 8)
//
// `round` is round-half-to-even (what torch.round, used by SmoothQuant's reference fake
// quantizer, does; it is also what the AVX-512 float→int conversion does in the default rounding
// mode). The range is symmetric, [−127, 127]: −128 is never produced, so negation is exact and the
// INT8 GEMM's compensation terms stay small. Every "scale" in this API is the step Δ itself, i.e.
// x ≈ Δ · q (dequantization).
//
// Zero maxima: a row (or tensor) of all zeros has absmax 0; its Δ is defined as 1.0 (any Δ would
// do: every q is 0 and dequantizes to exactly 0) so that no division by zero ever happens.
//
// Granularities (Table 3.2 and Figure 3.1 of the SmoothQuant thesis): weights are quantized per
// output channel (one Δ per row of W[out, in]) or per tensor; activations per token (one Δ per row of
// X[n, in]) or per tensor, with Δ computed at run time from the activation itself (dynamic) or
// calibrated offline (static). Those scales only ever index the outer dimensions (token, output
// channel), never the reduction dimension `in`, so the INT8 GEMM can apply them to its INT32
// result. The one exception is `PerTokenGroup` (one Δ per token and block of 32 input channels, as
// the activation side of llama.cpp's Q8_0 dot product): its GEMM rescales each block's INT32 partial
// sum before adding it (quant/int8_gemm.h, Int8Dequant::a_group).
#pragma once

#include <cstdint>

namespace sq {

/// How weights are scaled (Table 3.2, "Weight" column).
enum class WeightGranularity {
  PerChannel,  ///< one Δ per output channel (row of W[out, in]); scales[out]
  PerTensor,   ///< one Δ for the whole matrix; scales[1]
};

/// How activations (the input X[n, in] of a linear layer) are quantized (Table 3.2, "Activation"
/// column). SmoothQuant's efficiency levels pair per-tensor weights with:
///   - `PerToken`          — SmoothQuant-O1 (also ZeroQuant, LLM.int8()): dynamic, one Δ per token (row),
///                           computed at run time; the most accurate, scales[n].
///   - `PerTensorDynamic`  — SmoothQuant-O2 (also naive W8A8): dynamic, one Δ for the whole [n, in]
///                           block, computed at run time; scales[1].
///   - `PerTensorStatic`   — SmoothQuant-O3 (also Outlier Suppression): one Δ calibrated offline
///                           (Δ = calibrated absmax / 127); values beyond ±127·Δ are clamped; the
///                           cheapest (no run-time reduction); scales[1].
/// and, finer than any SmoothQuant level:
///   - `PerTokenGroup`     — dynamic, one Δ per token and per group of kActGroupSize = 32 consecutive
///                           input channels (the last group of a row may be shorter), computed at run
///                           time: the activation quantization of llama.cpp's Q8_0 × Q8_0 dot product
///                           (ggml's block_q8_0) and of "per-token-group" FP8 schemes;
///                           scales[n, ceil(in / 32)] row-major. An outlier then costs its own block
///                           of 32 channels their resolution, not the whole token.
enum class ActQuant { PerToken, PerTensorDynamic, PerTensorStatic, PerTokenGroup };

/// Input channels per activation step of ActQuant::PerTokenGroup (ggml's QK8_0).
inline constexpr int64_t kActGroupSize = 32;

/// "per-channel" / "per-tensor".
const char* to_string(WeightGranularity g);
/// "per-token" / "per-tensor-dynamic" / "per-tensor-static" / "per-token-group".
const char* to_string(ActQuant a);

/// Largest quantized magnitude, 2^(8−1) − 1 (Eq. 3.1).
inline constexpr int kInt8Max = 127;

/// Step Δ = absmax / 127 of Eq. 3.1; 1.0 when absmax == 0 (all-zero data, see file comment).
/// Throws std::invalid_argument when absmax is negative, NaN or infinite (the data held a NaN/inf).
float int8_step(float absmax);

/// max |x[i]| over `count` FP32 values (0 for count == 0). Returns NaN if any value is NaN
/// (so that `int8_step` rejects it). Vectorized (AVX-512 when compiled for it).
float abs_max(const float* x, int64_t count);

/// q[i] = clamp(round_half_even(x[i] / step), −127, 127) for `count` values (Eq. 3.1); values
/// beyond ±127·step saturate; NaN maps to −127. `step` must be > 0 (not checked: hot loop).
void quantize_int8(const float* x, int64_t count, float step, int8_t* q);

/// As `quantize_int8` but stores the biased unsigned value q + 128 ∈ [1, 255] — the u8 operand
/// AVX-512-VNNI's vpdpbusd (u8 × s8) consumes (see int8_gemm.h).
void quantize_uint8_biased(const float* x, int64_t count, float step, uint8_t* q);

/// x[i] = step · q[i] for `count` values.
void dequantize_int8(const int8_t* q, int64_t count, float step, float* x);

/// Per-output-channel weight quantization (Eq. 3.1 per row). W: [out, in] row-major FP32
/// (nn.Linear layout); q: [out, in] row-major INT8; scales: [out], Δ of each row.
/// Throws std::invalid_argument for negative sizes or a row containing NaN/inf.
void quantize_weight_per_channel(const float* W, int64_t out, int64_t in, int8_t* q, float* scales);

/// Per-tensor weight quantization (Eq. 3.1 over the whole matrix). W: [out, in] FP32; q: [out, in]
/// INT8; scales: [1]. Throws std::invalid_argument as `quantize_weight_per_channel`.
void quantize_weight_per_tensor(const float* W, int64_t out, int64_t in, int8_t* q, float* scales);

/// Dispatches to the per-channel (scales[out]) or per-tensor (scales[1]) variant.
void quantize_weight(const float* W, int64_t out, int64_t in, WeightGranularity g, int8_t* q, float* scales);

/// Activation groups per row of k input channels: ceil(k / 32) for PerTokenGroup, else 1.
inline int64_t act_groups_per_row(ActQuant mode, int64_t k) {
  return mode == ActQuant::PerTokenGroup ? (k + kActGroupSize - 1) / kActGroupSize : 1;
}

/// Number of activation scales `mode` produces for n tokens of k channels: n for PerToken,
/// n · ceil(k / 32) for PerTokenGroup, else 1.
inline int64_t act_scale_count(ActQuant mode, int64_t n, int64_t k) {
  return mode == ActQuant::PerToken ? n : mode == ActQuant::PerTokenGroup ? n * act_groups_per_row(mode, k) : 1;
}

/// Quantizes activations X[n, k] (row-major FP32) into q[n, k] (row-major INT8) per `mode`:
///   PerToken: scales[n], Δ_i = absmax(row i)/127; PerTensorDynamic: scales[1] = absmax(X)/127;
///   PerTensorStatic: scales[1] = static_step (the calibrated Δ), values beyond ±127·Δ clamp;
///   PerTokenGroup: scales[n, G] (G = ceil(k / 32)), Δ_ig = absmax(X[i, 32g : 32g + 32]) / 127.
/// Uses both OpenMP threads for large inputs; results do not depend on the thread count.
/// Throws std::invalid_argument for negative sizes, a NaN/inf in a dynamic mode, or (static mode)
/// a static_step that is not finite and > 0.
void quantize_activations(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, int8_t* q, float* scales);

/// As `quantize_activations`, but writes the biased u8 form (q + 128) with row stride `ldq` ≥ k:
/// q[i·ldq + j]; bytes j ∈ [k, ldq) of each row are set to 128 (quantized zero). This is the
/// input the VNNI GEMM consumes directly (`PackedInt8Weights::gemm_f32_biased`, ldq = padded_k()).
/// Throws like `quantize_activations`, and std::invalid_argument when ldq < k.
void quantize_activations_u8(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, uint8_t* q,
                             int64_t ldq, float* scales);

/// Per-token or per-token-group quantization (biased u8, as quantize_activations_u8 with `mode`
/// PerToken or PerTokenGroup) of the rotated rows R·x[i] (R: the block-diagonal Walsh–Hadamard
/// rotation of ops/hadamard.h, blocks of `block` channels, QuaRot's online transform), fused: each
/// row is rotated in a per-thread buffer and quantized while it is in cache. The same bits as
/// ops::hadamard_rows followed by quantize_activations_u8. Throws like quantize_activations_u8, and
/// std::invalid_argument when block is not a power of two dividing k or `mode` is a per-tensor one.
void quantize_activations_u8_hadamard(const float* x, int64_t n, int64_t k, int64_t block, ActQuant mode, uint8_t* q, int64_t ldq,
                                      float* scales);

}  // namespace sq
