// Group-wise INT4 weight quantization (W4A16; the "group size" scheme of GPTQ [Frantar et al. 2022,
// §"Additional details"] and AWQ [Lin et al. 2023]): W [out, in] is split along the input
// (reduction) dimension into groups of `g` consecutive columns, and every (row, group) pair gets its
// own step Δ (and, asymmetric, its own zero point z). Round-to-nearest (RTN) here; GPTQ output can
// be stored in the same `Int4Weights` container.
//
//   symmetric:   Δ = absmax / 7,              q = clamp(round(w / Δ), −8, 7),        w ≈ Δ · q
//   asymmetric:  lo = min(min(w), 0), hi = max(max(w), 0)   (0 is always representable, as GPTQ)
//                Δ = (hi − lo) / 15,  z = clamp(round(−lo / Δ), 0, 15),
//                q = clamp(round(w / Δ) + z, 0, 15),                                 w ≈ Δ · (q − z)
//
// Choice for the symmetric grid: Δ = absmax/7 (not absmax/8) so that ±absmax are both reachable
// (7 and −7); the code −8 exists in the format but RTN only produces it through rounding of values
// ≤ −7.5Δ, i.e. never. `round` is round-half-away-from-zero (std::round). Δ is stored as IEEE FP16
// and q is computed with the FP16-rounded Δ, so dequantization with the stored values reproduces
// exactly what the error bound |w − ŵ| ≤ Δ/2 refers to (up to the clamp at the ends of the grid,
// where the FP16 rounding of Δ can add at most 15 · Δ · 2⁻¹¹).
// A group of zeros gets Δ = 0 (q = 0, z = 0) and dequantizes to exact zeros.
// This function is the min/max reference; sq-convert's default quantizer (calib/gptq.h, the scale
// search) uses the full symmetric range: Δ may then be NEGATIVE, so that a group's signed extreme
// takes the lone end code −8 whatever its sign (as GGML's Q4_0, whose d = max / −8). Symmetric
// containers therefore accept any finite Δ; asymmetric ones require Δ ≥ 0.
//
// Ragged last group: when g does not divide `in` (e.g. stories260K's FFN width 172, or in = 64 < g =
// 128) the row has ⌈in/g⌉ groups and the last one covers the remaining in mod g columns, as in the
// GPTQ reference (a group starts every g columns). `in` must be even (two codes per byte).
//
// Byte layout (all little-endian, rows not padded; same as the .sqm dtypes I4x2 / U4x2):
//
//   packed  [out, in/2] bytes, row-major:            byte (r, c/2) = q[r, c+1] << 4 | q[r, c]
//
//        byte:      0            1            2         ...   in/2 − 1
//              +-----+-----+-----+-----+-----+-----+       +-----+-----+
//     row r    | q1  | q0  | q3  | q2  | q5  | q4  |  ...  |qin-1|qin-2|
//              +-----+-----+-----+-----+-----+-----+       +-----+-----+
//               hi    lo    hi    lo                          bits 7-4 | bits 3-0
//              (low nibble = even column, high nibble = odd column)
//
//     symmetric: nibbles are 4-bit two's complement (I4x2: 0x8..0xF = −8..−1);
//     asymmetric: nibbles are unsigned (U4x2: 0..15).
//
//   scales_f16   [out, ⌈in/g⌉] uint16 (IEEE binary16 bits of Δ), row-major: (r, j) is group j of row r,
//                covering columns [j·g, (j+1)·g).
//   zeros_packed (asymmetric only) [out, ⌈in/g⌉] U4x2, packed FLAT (row-major index f = r·⌈in/g⌉ + j,
//                element f in byte f/2, low nibble when f is even); ceil(out·in/g / 2) bytes, the
//                unused high nibble of an odd-length last byte is 0. Empty when symmetric.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/packed_storage.h"

namespace sq {

/// Group-wise INT4 weights of one linear layer (see the file comment for every layout).
struct Int4Weights {
  int64_t out = 0;    ///< rows of W (output features)
  int64_t in = 0;     ///< columns of W (input features); even; the last group is shorter when g ∤ in
  int64_t group = 0;  ///< group size g ∈ {32, 64, 128}
  bool asym = false;  ///< false: symmetric I4 (no zero points); true: U4 with per-group zero points
  ops::PackedStorage<unsigned char> packed;  ///< [out, in/2] bytes, low nibble = even column; data() 64-byte aligned;
                                             ///< owned, or borrowed from a mapped .sqm (ops/packed_storage.h)
  std::vector<uint16_t> scales_f16;  ///< [out, ⌈in/g⌉] FP16 bits of Δ
  std::vector<uint8_t> zeros_packed; ///< [out, ⌈in/g⌉] U4, flat-packed, asym only (else empty)
  std::vector<uint16_t> mins_f16;    ///< [out, ⌈in/g⌉] FP16 bits of the float minimum m, asym only (then zeros_packed is empty)
  std::vector<uint8_t> superblock_scales;  ///< K-quant: [out, super-blocks, 16] bytes (file comment), else empty

  /// True when the groups have a float minimum (w = Δ·u + m) rather than an integer zero point.
  bool float_min() const { return !mins_f16.empty(); }
  /// True for the two-level K-quant scales (GGML's Q4_K layout).
  bool k_quant() const { return !superblock_scales.empty(); }
};

/// Throws std::invalid_argument unless g ∈ {32, 64, 128}, in > 0, out > 0 and in is even (the
/// message names in and g). g need not divide in (ragged last group, file comment).
void check_int4_shape(int64_t out, int64_t in, int64_t group);

/// Number of groups per row, ⌈in / g⌉.
inline int64_t int4_groups_per_row(const Int4Weights& w) { return w.group > 0 ? (w.in + w.group - 1) / w.group : 0; }

/// Quantizes W: [out, in] row-major FP32 group-wise with RTN (file comment). Uses all OpenMP threads
/// for large matrices (the result does not depend on the thread count).
/// Throws std::invalid_argument for a bad shape / group size (see check_int4_shape), NaN/inf weights,
/// or a group whose Δ overflows FP16 (|w| ≳ 4.5e5).
Int4Weights quantize_int4(const float* w, int64_t out, int64_t in, int64_t group, bool asym);

/// Throws std::invalid_argument when `w`'s vectors do not have the sizes its out/in/group/asym
/// imply (with a float minimum: mins_f16 instead of zeros_packed; with K-quant scales: g = 32 and
/// superblock_scales of [out, ⌈⌈in/32⌉/8⌉, 16] bytes), or its shape is invalid (check_int4_shape),
/// or a scale or minimum is not finite, or (asymmetric only) a scale is negative.
void validate_int4(const Int4Weights& w);

/// Signed integer code of element (r, c): q ∈ [−8, 7] (symmetric) or q ∈ [0, 15] (asymmetric).
int int4_code(const Int4Weights& w, int64_t r, int64_t c);
/// Zero point z ∈ [0, 15] of group j of row r (0 when symmetric or with a float minimum).
int int4_zero(const Int4Weights& w, int64_t r, int64_t j);
/// The additive term of group j of row r: w = Δ · code + offset, i.e. m (float minimum) or −Δ · z
/// (exact: an 11-bit mantissa times an integer ≤ 15).
float int4_offset(const Int4Weights& w, int64_t r, int64_t j);
/// Step Δ of group j of row r (the FP16 value, as float).
float int4_scale(const Int4Weights& w, int64_t r, int64_t j);

/// Row r of W' (as dequantize_int4): dst[c] = Δ · (q − z) (Δ · u + m with a float minimum, one
/// rounding, as GGML's Q4_1/Q4_K dequantization) for c < in, `dst` holding `in` floats.
/// No validation (call validate_int4 once); r must be < out. Used by the INT4 token-embedding lookup.
void dequantize_int4_row(const Int4Weights& w, int64_t r, float* dst);
/// Reference dequantization: W' [out, in] row-major FP32, W'[r, c] = Δ · (q − z) (z = 0 when
/// symmetric). Exact in FP32 (an 11-bit FP16 mantissa times an integer |q − z| ≤ 15). `dst` must hold
/// out·in floats. Test / reference use only: W4A16Linear never materializes this matrix.
void dequantize_int4(const Int4Weights& w, float* dst);

/// Storage cost per weight in bits: 4 + 16·G/in (FP16 scales) + 4·G/in (U4 zeros, asymmetric only),
/// G = ⌈in/g⌉ groups per row; when g divides in that is 4 + 16/g (+ 4/g): e.g. 4.125 for g = 128
/// symmetric, 4.15625 for g = 128 asymmetric. (Flat zero packing can add half a byte per matrix,
/// which this per-weight figure leaves out; int4_storage_bytes counts it.) A float minimum costs
/// 16·G/in instead of 4·G/in (Q4_1: 5.0); K-quant scales 128·S/in beside the codes, S super-blocks
/// per row (Q4_K: 4.5 when 256 divides in).
double bits_per_weight(const Int4Weights& w);
/// The same figure from the layout alone (a row of `in` columns, groups of `group`; `asym` integer
/// zero points, or a float minimum, or K-quant scales), for a matrix not quantized yet.
/// Throws std::invalid_argument when group or in is not positive.
double int4_bits_per_weight(int64_t in, int64_t group, bool asym, bool float_min, bool k_quant);

/// Bytes as stored in a file: packed + 2 · scales + zeros_packed + 2 · mins (float minimum); for
/// K-quant scales packed + superblock_scales (the expanded Δ and m are derived, not stored).
int64_t int4_storage_bytes(const Int4Weights& w);

}  // namespace sq
