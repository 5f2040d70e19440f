// Atom W4A4 mixed-precision quantization (Atom [Zhao et al. 2024] §4.1–4.3, §5.1): the weight
// container of one linear layer and the dynamic per-token activation quantizer. The GEMM that
// consumes both is quant/w4a4_gemm.h.
//
// Channel reordering (§4.1) is done by the converter: the weight W [out, in] given here already has
// its input channels permuted so that the LAST `n_outlier` columns are the outlier channels (and the
// activations fed to the layer are permuted the same way, folded into the previous operator). With
// in_normal = in − n_outlier:
//
//   normal columns  [0, in_normal):   INT4 symmetric, groups of g ∈ {32, 64, 128} consecutive columns
//                                      (§4.2), or one group per row (g = in_normal, a multiple of 8:
//                                      per-channel weights / per-token activations, Atom Table 3's
//                                      plain W4A4 RTN), one step Δw[o, j] per (row o, group j), stored FP16;
//   outlier columns [in_normal, in):   INT8 symmetric per output channel (§4.1), one FP32 step Δo[o].
//
//   weights, RTN (§4.3, §5.1 "clipping"):
//     normal:   Δ = fp16(clip_w · absmax(group) / 7),  q = clamp(round(w / Δ), −8, 7)   (clip_w = 0.85)
//     outlier:  Δ = absmax(row's outlier columns) / 127,  q = clamp(round_half_even(w / Δ), −127, 127)
//   activations, dynamic per token (§4.3), x [m, in] FP32 (already reordered):
//     normal:   per (token i, group j):  Δa = clip_a · absmax / 7  (clip_a = 0.9),
//               q = clamp(round_half_even(x / Δa), −8, 7)
//     outlier:  per token:  Δa = absmax / 127,  q = clamp(round_half_even(x / Δa), −127, 127)
//   A group / row whose absmax is 0 gets Δ = 1 for activations (every q is 0) and Δ = 0 (q = 0)
//   for weights, as quant/int4_quantize.h. `round` for weights is std::round (half away from zero,
//   as quant/int4_quantize.h, so clip_w = 1 reproduces quantize_int4 exactly); activations round
//   half to even (what the AVX-512 float→int conversion does; the scalar path uses nearbyint).
//   Δ is computed as (clip · absmax) / 7 in FP32, in that order, everywhere.
//
// Weight byte layout (little-endian; rows not padded). The normal part is exactly the symmetric
// Int4Weights layout of quant/int4_quantize.h (I4x2, FP16 scales), so GPTQ output converts directly:
//
//                          in_normal = in − n_outlier columns            n_outlier columns
//                 +-------------------------------------------------+----------------------+
//   W (reordered) | group 0 | group 1 |   ...   | group G−1 (g each) |  outliers (INT8)     |
//                 +-------------------------------------------------+----------------------+
//
//   packed          [out, in_normal/2] bytes:  byte (r, c/2) = q[r, c+1] << 4 | q[r, c] & 0xF
//                    (low nibble = even column, 4-bit two's complement: 0x8..0xF = −8..−1)
//
//        byte:      0            1            2         ...   in_normal/2 − 1
//              +-----+-----+-----+-----+-----+-----+       +-----+-----+
//     row r    | q1  | q0  | q3  | q2  | q5  | q4  |  ...  |  …  |  …  |
//              +-----+-----+-----+-----+-----+-----+       +-----+-----+
//               hi    lo    hi    lo                          bits 7-4 | bits 3-0
//
//   scales_f16      [out, G] uint16 (IEEE binary16 bits of Δw), G = in_normal / g; (r, j) covers
//                   normal columns [j·g, (j+1)·g) of row r
//   outlier         [out, n_outlier] int8, row-major, values in [−127, 127] (−128 is rejected)
//   outlier_scales  [out] float (FP32 Δo), finite and > 0
//
// Storage: in_normal/2 + 2·G + n_outlier + 4 bytes per row; e.g. in = 4096, n_outlier = 128,
// g = 128: 1984 + 62 + 128 + 4 = 2178 bytes per row = 4.25 bits per weight.
//
// Quantized activations (`W4A4Activations`, produced per call by quantize_w4a4_activations): one
// signed byte per element, row stride `ld` (a multiple of 64):
//
//   q row i:   [ normal codes, in_normal bytes in [−8, 7] | outlier codes, n_outlier bytes in
//              [−127, 127] | zeros up to ld ]
//   scales     [m, G + 1] float: Δa of each normal group, then the outlier step
//   sums       [m, G + 1] int32: Σ q over each normal group, then over the outliers (the GEMM's
//              unsigned-operand compensation, see quant/w4a4_gemm.h)
#pragma once

#include <cstdint>
#include <vector>

#include "quant/int4_quantize.h"

namespace sq {

/// Default weight clipping ratio (Atom §5.1: grid-searched clip factor for weights).
inline constexpr float kW4A4WeightClip = 0.85f;
/// Default activation clipping ratio (Atom §5.1: clip factor for activations).
inline constexpr float kW4A4ActClip = 0.9f;

/// W4A4 mixed-precision weights of one linear layer (see the file comment for every layout).
struct W4A4Weights {
  int64_t out = 0;        ///< rows (output features)
  int64_t in = 0;         ///< columns (input features), normal + outlier
  int64_t n_outlier = 0;  ///< trailing INT8 outlier columns, 0 ≤ n_outlier < in
  int64_t group = 0;      ///< group size g ∈ {32, 64, 128} dividing in − n_outlier, or g = in − n_outlier (a multiple of 8)
  std::vector<uint8_t> packed;         ///< [out, in_normal/2] I4x2, low nibble = even column
  std::vector<uint16_t> scales_f16;    ///< [out, in_normal/g] FP16 bits of Δw
  std::vector<int8_t> outlier;         ///< [out, n_outlier] INT8 codes in [−127, 127]
  std::vector<float> outlier_scales;   ///< [out] FP32 Δo

  int64_t in_normal() const { return in - n_outlier; }           ///< INT4 columns
  int64_t groups() const { return group > 0 ? in_normal() / group : 0; }  ///< G = in_normal / g
};

/// Throws std::invalid_argument unless out > 0, in > 0, 0 ≤ n_outlier < in, and either g ∈ {32, 64,
/// 128} divides in_normal = in − n_outlier or g = in_normal is a multiple of 8 (one group per row;
/// the kernel consumes 8 columns per step). The message names in, n_outlier and g.
void check_w4a4_shape(int64_t out, int64_t in, int64_t n_outlier, int64_t group);

/// Throws std::invalid_argument when the vectors' sizes do not match out/in/n_outlier/group, the
/// shape is invalid (check_w4a4_shape), an FP16 scale is negative / not finite, an outlier code is
/// −128, or an outlier scale is not finite and > 0.
void validate_w4a4(const W4A4Weights& w);

/// RTN construction (file comment; Atom §4.1–4.2, clipping §5.1): W [out, in] row-major FP32, input channels already reordered
/// (outliers last). `clip` ∈ (0, 1] scales the INT4 groups' absmax (Atom §5.1 default 0.85); the INT8
/// outlier columns are not clipped. Uses all OpenMP threads for large matrices (result independent
/// of the thread count). Throws std::invalid_argument for a bad shape (check_w4a4_shape), clip
/// outside (0, 1], NaN/inf weights, or a Δ that overflows FP16.
W4A4Weights quantize_w4a4_weights(const float* w, int64_t out, int64_t in, int64_t n_outlier, int64_t group = 128,
                                  float clip = kW4A4WeightClip);

/// Construction from given integer codes (e.g. GPTQ, Atom §4.3, done by the converter):
///   codes4          [out, in_normal] int8, one INT4 code per element, values in [−8, 7]
///   scales          [out, in_normal/g] FP32 Δw; each must be exactly representable in FP16
///                   (GptqOptions::fp16_scales), finite and ≥ 0
///   outlier_codes   [out, n_outlier] int8 in [−127, 127] (may be null when n_outlier == 0)
///   outlier_scales  [out] FP32 Δo, finite and > 0 (may be null when n_outlier == 0: all 1)
/// Throws std::invalid_argument for a bad shape, a code out of range or a scale that violates the
/// above (the message names the offending row / group).
W4A4Weights w4a4_weights_from_codes(int64_t out, int64_t in, int64_t n_outlier, int64_t group, const int8_t* codes4,
                                    const float* scales, const int8_t* outlier_codes, const float* outlier_scales);

/// Construction from a symmetric Int4Weights holding the normal columns (e.g. to_int4_weights of a
/// GPTQ result on W[:, :in_normal]) plus the INT8 outlier part (outlier_codes [out, n_outlier],
/// outlier_scales [out], as in w4a4_weights_from_codes). Throws std::invalid_argument when `normal`
/// is asymmetric or invalid (validate_int4), or as validate_w4a4.
W4A4Weights w4a4_weights_from_int4(const Int4Weights& normal, int64_t n_outlier, const int8_t* outlier_codes,
                                   const float* outlier_scales);

/// INT4 code of normal element (r, c), c < in_normal: q ∈ [−8, 7].
int w4a4_code(const W4A4Weights& w, int64_t r, int64_t c);
/// Δw of group j of row r (the stored FP16 value, as float).
float w4a4_scale(const W4A4Weights& w, int64_t r, int64_t j);

/// Reference dequantization: W' [out, in] row-major FP32 (reordered column order), W'[r, c] = Δw·q
/// for normal columns and Δo·q for outliers. Test / reference use only (the GEMM never forms it).
void dequantize_w4a4(const W4A4Weights& w, float* dst);

/// Bytes held: packed + 2·scales_f16 + outlier + 4·outlier_scales (exactly the vectors' sizes).
int64_t w4a4_storage_bytes(const W4A4Weights& w);

/// Dynamically quantized activations of m tokens (layout in the file comment).
struct W4A4Activations {
  int64_t m = 0, in = 0, n_outlier = 0, group = 0;
  int64_t ld = 0;                ///< row stride of q: round_up(in_normal + round_up(n_outlier, 4), 64)
  std::vector<int8_t> q;         ///< [m, ld] codes (normal INT4 codes one per byte, then INT8 outliers, then 0)
  std::vector<float> scales;     ///< [m, G + 1] Δa per normal group, then the outlier step
  std::vector<int32_t> sums;     ///< [m, G + 1] Σ q per normal group, then over the outliers

  int64_t in_normal() const { return in - n_outlier; }
  int64_t groups() const { return group > 0 ? in_normal() / group : 0; }
};

/// Row stride W4A4Activations::ld for this shape.
int64_t w4a4_activation_stride(int64_t in, int64_t n_outlier);

/// Quantizes x [m, in] row-major FP32 (reordered: outliers last) per token (file comment; Atom §4.3)
/// into `out` (its vectors are resized; buffers are reused across calls). `clip` ∈ (0, 1] is the
/// activation clipping ratio of the INT4 groups (default 0.9). Vectorized with AVX-512 when built for
/// it (identical results to the scalar path); OpenMP over tokens for large inputs.
/// Throws std::invalid_argument for m < 0, a bad shape (check_w4a4_shape with out = 1), clip outside
/// (0, 1], or NaN/inf activations.
void quantize_w4a4_activations(const float* x, int64_t m, int64_t in, int64_t n_outlier, int64_t group, float clip,
                               W4A4Activations& out);

/// quantize_w4a4_activations with Atom §4.1's activation reorder fused into the quantization step:
/// the kernel row of token i is read through a source map instead of being materialized first,
///   row[k] = x[i · x_width + src[k]]   (src[k] ≥ 0),   row[k] = 0   (src[k] = −1: zero padding),
/// for k < in; x is [m, x_width] row-major FP32 in the producer's channel order, src [in] int32.
/// Each group's absmax and codes are computed from gathered loads (AVX-512 vgatherdps when built for
/// it; identical results to the scalar path and to quantize_w4a4_activations on the gathered row).
/// Zero-padded columns add 0 to every sum, which is how a ragged last group runs exactly on whole-
/// group kernels. Throws std::invalid_argument as quantize_w4a4_activations, or when src holds a
/// value outside [−1, x_width) (check_w4a4_source_map).
void quantize_w4a4_activations_mapped(const float* x, int64_t m, int64_t x_width, const int32_t* src, int64_t in,
                                      int64_t n_outlier, int64_t group, float clip, W4A4Activations& out);

/// Throws std::invalid_argument unless 0 < x_width < 2³¹ and every src[k], k < in, lies in [−1, x_width).
void check_w4a4_source_map(const int32_t* src, int64_t in, int64_t x_width);

}  // namespace sq
