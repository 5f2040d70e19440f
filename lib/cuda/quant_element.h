// Element-wise quantization math shared by the CUDA kernels and the host: the INT8 activation
// quantizer and dequantization epilogue of W8A8 (SmoothQuant Eq. 3.1), and the INT4 decoding of
// W4A16 (quant/int4_quantize.h layouts; GPTQ-style groups). Every function is `__host__ __device__`
// under nvcc and a plain inline function under the host compiler, so the exact expressions the
// kernels evaluate are unit-tested on the CPU against the CPU codecs (tests/cuda_quant_element_test.cpp)
// on every machine, GPU or not.
//
// Rounding discipline: the functions use explicit fused multiply-adds (`sq_fma`) and IEEE division
// only, and never rely on the compiler contracting a·b + c (nvcc does by default, and so does g++ 12
// in C++ mode with an FMA target, -ffp-contract=fast: see cuda/decoder_element.h), so host and device
// evaluate bit-identical results for identical inputs.
//
// This header is C++17 (nvcc compiles the .cu files as C++17) and depends on nothing but <cstdint>,
// <cstring> and <cmath>.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SQ_HD __host__ __device__
#else
#define SQ_HD
#endif

namespace sq::qe {

/// Largest quantized INT8 magnitude, 2^(8−1) − 1 (SmoothQuant Eq. 3.1; quant/int8_quantize.h kInt8Max).
constexpr float kInt8MaxF = 127.0f;
/// Largest finite float; |v| ≤ kFloatMax is false exactly for NaN and ±inf.
constexpr float kFloatMax = 3.40282347e+38f;

/// Correctly rounded fused multiply-add a·b + c (one rounding), on both sides.
SQ_HD inline float sq_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// Reinterprets IEEE binary32 bits as a float.
SQ_HD inline float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

/// Round half to even to the nearest integer (the default FP rounding mode of the host; rn on the device).
SQ_HD inline int round_half_even(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

// ---------------------------------------------------------------------------------------------
// INT8 (W8A8, SmoothQuant Eq. 3.1)
// ---------------------------------------------------------------------------------------------

/// Activation step Δ = absmax / 127 of Eq. 3.1 for a dynamic mode (per token or per tensor), as
/// quantize_activations computes it: 1.0 for absmax == 0 (all-zero data), and NaN when absmax is
/// NaN or infinite (the CPU throws there; a kernel cannot, so the NaN propagates to the output).
/// absmax ≥ 0 or NaN (a max of |x|).
SQ_HD inline float int8_activation_step(float absmax) {
  if (!(absmax <= kFloatMax)) return bits_to_float(0x7FC00000u);  // quiet NaN for NaN and +inf
  return absmax > 0.0f ? absmax / kInt8MaxF : 1.0f;
}

/// q = clamp(round_half_even(x / step), −127, 127) (Eq. 3.1), as quantize_int8 on the CPU: IEEE
/// division, values beyond ±127·step saturate, NaN maps to −127.
SQ_HD inline int8_t quantize_int8_value(float x, float step) {
  float v = x / step;
  v = v > -kInt8MaxF ? v : -kInt8MaxF;  // also maps NaN to −127
  v = v < kInt8MaxF ? v : kInt8MaxF;
  return static_cast<int8_t>(round_half_even(v));
}

/// Dequantization epilogue of the INT8 GEMM (quant/int8_gemm.h Int8Dequant, "dequant_one"):
/// s = sa·sb rounded once, then fma(float(acc), s, bias) with a bias, float(acc)·s without.
/// `acc` is the exact INT32 Σ_k Xq[i, k]·Wq[j, k]; sa the activation step of token i (or of the
/// tensor), sb the weight step of output channel j (or of the tensor).
SQ_HD inline float int8_dequant(int32_t acc, float sa, float sb, bool has_bias, float bias) {
  const float s = sa * sb;
  return has_bias ? sq_fma(static_cast<float>(acc), s, bias) : static_cast<float>(acc) * s;
}

// ---------------------------------------------------------------------------------------------
// INT4 (W4A16; layouts of quant/int4_quantize.h)
// ---------------------------------------------------------------------------------------------

/// IEEE binary16 bits → float (exact: every half is a float). Subnormals, ±0, ±inf and NaN included.
SQ_HD inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    // ±0 and subnormals: mant · 2^−24, exact (mant < 2^10).
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7F800000u | (mant << 13));  // ±inf, NaN (payload kept)
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));       // rebias 15 → 127
}

/// 4-bit field of element `c` of a nibble-packed array (element c in byte c/2, low nibble when c is
/// even): the packed weight row layout (low nibble = even column) and the flat zero-point layout.
SQ_HD inline unsigned nibble_at(const uint8_t* packed, int64_t c) {
  const unsigned b = packed[c >> 1];
  return (c & 1) ? (b >> 4) : (b & 0xFu);
}

/// Integer code of a nibble: two's complement −8…7 when symmetric (I4x2), unsigned 0…15 when
/// asymmetric (U4x2); int4_code() on the CPU.
SQ_HD inline int int4_value(unsigned nib, bool asym) {
  return asym ? static_cast<int>(nib) : static_cast<int>(nib ^ 8u) - 8;
}

/// Dequantized weight Δ · (q − z) (z = 0 when symmetric); exact in FP32 (an 11-bit FP16 mantissa
/// times an integer of magnitude ≤ 15), so it equals dequantize_int4 on the CPU bit for bit.
SQ_HD inline float int4_dequant(int code, int zero, float step) { return step * static_cast<float>(code - zero); }

/// A float-minimum weight Δ · u + m (Q4_1 / Q4_K layouts, u unsigned 0…15): the product is exact in
/// FP32, so the one rounding of the sum (fused or not) equals dequantize_int4's on the CPU bit for bit.
SQ_HD inline float int4_dequant_min(int code, float step, float min) { return step * static_cast<float>(code) + min; }

/// The dequantized weight W'[r, c] of a W4A16 matrix in the stored layouts: `packed` [out, in/2]
/// bytes, `scales_f16` [out, G] FP16 bits, `zeros_packed` [out·G] flat U4 (integer zero points,
/// asymmetric only; ignored when symmetric or when `mins_f16` is given), `mins_f16` [out, G] FP16
/// bits of the float minimum (Q4_1 / Q4_K layouts, Int4Weights::mins_f16; nullptr otherwise),
/// G = ⌈in/g⌉ groups per row, group j = c / g.
SQ_HD inline float int4_weight_at(const uint8_t* packed, const uint16_t* scales_f16, const uint8_t* zeros_packed,
                                  const uint16_t* mins_f16, int64_t in, int64_t group, int64_t groups_per_row, bool asym,
                                  int64_t r, int64_t c) {
  const int64_t j = c / group, f = r * groups_per_row + j;
  const int code = int4_value(nibble_at(packed + r * (in / 2), c), asym);
  if (mins_f16) return int4_dequant_min(code, half_bits_to_float(scales_f16[f]), half_bits_to_float(mins_f16[f]));
  const int zero = asym ? static_cast<int>(nibble_at(zeros_packed, f)) : 0;
  return int4_dequant(code, zero, half_bits_to_float(scales_f16[f]));
}

/// One lane's share of the W4A16 GEMV dot product of row r with x: Σ over the bytes b = first,
/// first + stride, … < in/2 of row r, in that order, of
///   acc = fma(x[2b], W'[r, 2b], acc); acc = fma(x[2b+1], W'[r, 2b+1], acc)
/// (both columns of a byte lie in one group because g is even; W' as int4_weight_at, same
/// arguments). The GEMV kernel runs it with first = lane, stride = 32 and adds the 32 partial sums
/// with a butterfly (xor-shuffle) reduction; tests replay both steps on the CPU.
SQ_HD inline float int4_row_partial_dot(const uint8_t* packed, const uint16_t* scales_f16, const uint8_t* zeros_packed,
                                        const uint16_t* mins_f16, int64_t in, int64_t group, int64_t groups_per_row, bool asym,
                                        int64_t r, const float* x, int64_t first, int64_t stride) {
  const uint8_t* prow = packed + r * (in / 2);
  float acc = 0.0f;
  for (int64_t b = first; b < in / 2; b += stride) {
    const int64_t c = 2 * b, f = r * groups_per_row + c / group;
    const float step = half_bits_to_float(scales_f16[f]);
    const unsigned byte = prow[b];
    const int lo = int4_value(byte & 0xFu, asym), hi = int4_value(byte >> 4, asym);
    if (mins_f16) {
      const float m = half_bits_to_float(mins_f16[f]);
      acc = sq_fma(x[c], int4_dequant_min(lo, step, m), acc);
      acc = sq_fma(x[c + 1], int4_dequant_min(hi, step, m), acc);
      continue;
    }
    const int zero = asym ? static_cast<int>(nibble_at(zeros_packed, f)) : 0;
    acc = sq_fma(x[c], int4_dequant(lo, zero, step), acc);
    acc = sq_fma(x[c + 1], int4_dequant(hi, zero, step), acc);
  }
  return acc;
}

}  // namespace sq::qe
