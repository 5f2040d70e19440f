// Element math of the generic decoder's CUDA ops (cuda/cuda_ops.h: norm, activation,
// gated_activation, attention with AttentionOptions, scatter_add_rows) as inline functions that both
// nvcc (device code, __host__ __device__) and the host compiler (g++, the CPU tests) compile, so the
// exact arithmetic of the kernels is unit-tested on every machine against lib/ops and a
// double-precision attention (tests/cuda_decoder_ops_test.cpp).
//
// Rounding discipline (as cuda/quant_element.h and cuda/kv_device_math.h): every operation is a
// single correctly rounded operation that no compiler may fuse: on the device the round-to-nearest
// intrinsics (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn, __dadd_rn, …), which nvcc never
// contracts; on the host plain operators, with every product passed through an empty asm barrier
// (host_barrier) so that g++ cannot contract it into a following addition either. A fused
// multiply-add is spelled sq_fma exactly where one is meant. So host and device give identical bits
// for identical inputs, except where a device libm function is used (expf, erff: documented at each
// function), and the CPU tests of this header test what the kernels compute.
//
// Why the fused multiply-adds: the CPU code these functions mirror is compiled by g++ (12) in
// C++ mode, which contracts a·b + c into an FMA by default (-ffp-contract=fast, also under
// -std=c++20) whenever the target has one (-march=native on x86-64 with FMA/AVX2, the default
// build). So "the CPU's expression" is the contracted one, and the functions below place sq_fma
// where g++ fuses in lib/ops and model/decoder.cpp (tests/cuda_decoder_ops_test.cpp checks every
// modelled expression bit for bit against the compiled CPU code). A CPU build without FMA
// (SQ_NATIVE=OFF on baseline x86-64) rounds those products separately and differs by ≤ 1 ulp per
// fused operation from the device (and from these functions).
//
// Relation to lib/ops/ops.cpp (CPU):
//   - silu, gelu_tanh: ops uses ops::fast_exp (a Cephes-style polynomial, no libm); fast_exp here is
//     the same function with g++'s fusions (and 1 + fast_exp(v) fused as ops's inlined code is),
//     so silu / gelu_tanh / relu and the gated forms are bit-identical to ops::activation /
//     ops::gated_activation / ops::swiglu on every input.
//   - gelu_erf: the CPU's expression with std::erf on the host and erff on the device (CUDA: ≤ 2
//     ulp, glibc: ≤ 1 ulp), so the device differs by ≤ 0.5·|x|·3 ulp(1) absolute plus one rounding.
//   - norms: the per-element expressions of ops::rms_norm / ops::layer_norm given the row's factors;
//     the factors come from the kernel's block reduction (summation order differs from the CPU's).
//   - attention: the score s·(q·k) − slope·(p − j) of Decoder::attention and its window rule;
//     softmax exponentials are expf on the device (CPU: fast_exp; both ≤ 2e−7 relative).
//
// Plain C++17 (cuda_ops.cu is compiled as C++17); no CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/host_device.h"

namespace sq::de {

// ---- correctly rounded single operations (never contracted) -----------------------------------------

#if !defined(__CUDA_ARCH__)
/// Host only: makes `v` opaque to the optimizer (an empty asm that may change it), so a product
/// passed through it is never contracted with a following addition (g++ -ffp-contract=fast).
template <class T>  // float or double
inline void host_barrier(T& v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile T t = v;
  v = t;
#endif
}
#endif

/// a + b, a − b, a·b, a / b (and the double forms addd, subd, muld): each one IEEE operation rounded
/// to nearest, never fused with another (device: the __f*_rn / __d*_rn intrinsics; host: plain
/// operators, products behind host_barrier).
SQ_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SQ_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SQ_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float p = a * b;
  host_barrier(p);
  return p;
#endif
}
SQ_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// Correctly rounded fused multiply-add a·b + c (one rounding), on both sides.
SQ_HD float sq_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
SQ_HD double addd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
SQ_HD double subd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
SQ_HD double muld(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double p = a * b;
  host_barrier(p);
  return p;
#endif
}
/// Correctly rounded fused multiply-add in double.
SQ_HD double sq_fmad(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---- exponentials ----------------------------------------------------------------------------------

/// ops::fast_exp (lib/ops/fast_exp.h) as compiled: e^x = er · 2^n, split so callers can fuse the
/// last product as the CPU's inlined code does. Clamp to [−87.3, 88]; n = ⌊fma(x, log2 e, ½)⌋;
/// r = fma(n, ln2_lo, fma(−n, ln2_hi, x)) (two-part ln2); the degree-6 polynomial by fused steps
/// p = fma(p, r, c); er = fma(p·r, r, r) + 1; 2^n from the exponent bits (g++'s contractions of
/// fast_exp's source, see the file comment).
struct ExpParts {
  float er;     ///< e^r, r = x − n·ln2
  float two_n;  ///< 2^n
};
SQ_HD ExpParts fast_exp_parts(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
#if defined(__CUDA_ARCH__)
  const float n = floorf(sq_fma(x, 1.44269504088896341f, 0.5f));
#else
  const float n = std::floor(sq_fma(x, 1.44269504088896341f, 0.5f));
#endif
  const float r = sq_fma(n, 2.12194440e-4f, sq_fma(-n, 0.693359375f, x));  // ln2 = 0.693359375 − 2.12194440e−4
  float p = 1.9875691500e-4f;
  p = sq_fma(p, r, 1.3981999507e-3f);
  p = sq_fma(p, r, 8.3334519073e-3f);
  p = sq_fma(p, r, 4.1665795894e-2f);
  p = sq_fma(p, r, 1.6666665459e-1f);
  p = sq_fma(p, r, 5.0000001201e-1f);
  ExpParts e;
  e.er = add(sq_fma(mul(p, r), r, r), 1.0f);
  // n ∈ [−126, 127] after the clamp (NaN: any bits, the result is NaN anyway).
  const int32_t ni = n == n ? static_cast<int32_t>(n) : 0;
  const uint32_t bits = uint32_t(ni + 127) << 23;
#if defined(__CUDA_ARCH__)
  e.two_n = __uint_as_float(bits);
#else
  std::memcpy(&e.two_n, &bits, sizeof e.two_n);
#endif
  return e;
}

/// ops::fast_exp: e^x with relative error ≤ 2e−7 (er · 2^n, one rounded product). Bit-identical to
/// the CPU's fast_exp where its result is used on its own (softmax rows, log-sum-exp).
SQ_HD float fast_exp(float x) {
  const ExpParts e = fast_exp_parts(x);
  return mul(e.er, e.two_n);
}

/// 1 + fast_exp(x) as the CPU's SiLU / GELU code computes it once fast_exp is inlined:
/// fma(er, 2^n, 1) (one rounding).
SQ_HD float one_plus_fast_exp(float x) {
  const ExpParts e = fast_exp_parts(x);
  return sq_fma(e.er, e.two_n, 1.0f);
}

/// e^x for the attention softmax: expf on the device (≤ 2 ulp), std::exp(float) on the host
/// (glibc ≤ 1 ulp). exp(−inf) = 0 on both (the online softmax's first rescale relies on it).
SQ_HD float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// ---- activations (ops::activation, ops::gated_activation) --------------------------------------------

/// SiLU x·σ(x) = x / (1 + fast_exp(−x)), ops.cpp's silu (and swiglu's gate): bit-identical.
SQ_HD float silu(float x) { return div(x, one_plus_fast_exp(-x)); }

/// GELU, tanh form, as ops.cpp computes it through 0.5·(1 + tanh v) = σ(2v):
/// x / (1 + fast_exp(−2·√(2/π)·(x + 0.044715·x³))), with ops.cpp's operation order and g++'s fusion
/// x + (0.044715·x·x)·x = fma(0.044715·x·x, x, x). Bit-identical.
SQ_HD float gelu_tanh(float x) {
  constexpr float k2 = 2.0f * 0.7978845608028654f;  // 2·sqrt(2/π), the constant of ops.cpp
  const float inner = sq_fma(mul(mul(0.044715f, x), x), x, x);
  return div(x, one_plus_fast_exp(mul(-k2, inner)));
}

/// GELU, erf form: 0.5·x·(1 + erf(x/√2)), ops.cpp's expression. The host evaluates std::erf (the
/// CPU's call: bit-identical there); the device erff (≤ 2 ulp, CUDA Programming Guide), so device
/// results differ from the CPU by ≤ 0.5·|x|·3·2^−23 absolute + 2 ulp of the result.
SQ_HD float gelu_erf(float x) {
#if defined(__CUDA_ARCH__)
  const float e = erff(mul(x, 0.7071067811865476f));
#else
  const float e = std::erf(mul(x, 0.7071067811865476f));
#endif
  return mul(mul(0.5f, x), add(1.0f, e));
}

/// ReLU max(x, 0) as ops.cpp (x > 0 ? x : 0: NaN and −0 give +0).
SQ_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

/// Gated form act(g)·u (ops::map_inplace with `up`: f(x[i]) * up[i]); SiLU is ops::swiglu's
/// g / (1 + fast_exp(−g)) * up, the same value.
SQ_HD float gated(float act_g, float u) { return mul(act_g, u); }

// ---- normalization (ops::rms_norm, ops::layer_norm) --------------------------------------------------

/// One step of RMSNorm's sum of squares: acc + x² with one fused multiply-add (the kernel's
/// per-thread accumulation; the CPU sums in its own vectorized order, so the sums differ by rounding).
SQ_HD float rms_sum_step(float acc, float x) { return sq_fma(x, x, acc); }

/// RMSNorm's factor from the row's sum of squares: 1 / sqrt(ss / d + eps) (ops::rms_inv's
/// expression: IEEE division and square root).
SQ_HD float rms_inv_from_sum(float ss, int d, float eps) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(d)), eps)));
#else
  return 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
#endif
}

/// RMSNorm output element: x · inv · w (ops.cpp rms_norm_row: (x·inv)·w).
SQ_HD float rms_norm_elem(float x, float inv, float w) { return mul(mul(x, inv), w); }

/// LayerNorm's mean in double from the row's double sum: sum / d (ops.cpp layer_norm_row).
SQ_HD double ln_mean(double sum, int d) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(sum, double(d));
#else
  return sum / d;
#endif
}

/// One step of LayerNorm's second pass: acc + (x − mean)² in double, fused as the CPU's
/// var += c·c (c = x − mean) compiles.
SQ_HD double ln_var_step(double acc, float x, double mean) {
  const double c = subd(double(x), mean);
  return sq_fmad(c, c, acc);
}

/// LayerNorm's factor from the sum of squared deviations (population variance, as ops.cpp):
/// float(1 / sqrt(sq / d + eps)) in double.
SQ_HD float ln_inv_std(double sq, int d, float eps) {
#if defined(__CUDA_ARCH__)
  return float(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(sq, double(d)), double(eps)))));
#else
  return static_cast<float>(1.0 / std::sqrt(sq / d + static_cast<double>(eps)));
#endif
}

/// LayerNorm output element given the row's FP32 mean m = float(mean) and factor inv:
/// (x − m)·inv·w + b = fma((x − m)·inv, w, b) (ops.cpp layer_norm_row as compiled; b = 0 without a
/// bias, which the CPU adds too).
SQ_HD float layer_norm_elem(float x, float m, float inv, float w, float b) { return sq_fma(mul(sub(x, m), inv), w, b); }

// ---- attention (Decoder::attention) --------------------------------------------------------------------

/// One step of a query·key dot product: acc + q·k with one fused multiply-add (the kernel's order:
/// channels 0, 1, …, head_dim−1).
SQ_HD float dot_step(float acc, float q, float k) { return sq_fma(q, k, acc); }

/// The score of key j for a query at cache position p: scale·dot − slope·float(p − j)
/// (Decoder::attention: S = scale·(q·k), then S −= slope_h·float(pos − j) on ALiBi models, which
/// compiles to one fused fma(−slope, float(p − j), S)). Without ALiBi pass slope = 0: adding −0
/// changes no value (signed zeros and NaN included).
SQ_HD float attention_score(float dot, float scale, float slope, int64_t distance) {
  return sq_fma(-slope, float(distance), mul(scale, dot));
}

/// First key a query at position p sees: p − window + 1 (≥ 0) on a sliding-window layer
/// (keys j with p − window < j ≤ p), 0 when window == 0 (Decoder::attention's first_key without
/// block eviction).
SQ_HD int64_t first_visible_key(int64_t p, int window) {
  if (window <= 0) return 0;
  const int64_t lo = p - window + 1;
  return lo > 0 ? lo : 0;
}

/// Online softmax (Milakov & Gimelshein 2018) over tiles of scores: the factor that rescales the
/// running denominator and accumulator when the running max grows from m_old to m_new
/// (0 when m_old = −inf, i.e. before the first tile).
SQ_HD float softmax_rescale(float m_old, float m_new) { return softmax_exp(sub(m_old, m_new)); }

/// The unnormalized weight e^(s − m) of a score under the running max m.
SQ_HD float softmax_weight(float s, float m) { return softmax_exp(sub(s, m)); }

// ---- mixture of experts ------------------------------------------------------------------------------

/// y + s·w: Decoder's MoE accumulation y[t·d + j] += moe_out[i·d + j] * w, which compiles to one
/// fused fma(s, w, y).
SQ_HD float weighted_add(float y, float s, float w) { return sq_fma(s, w, y); }

}  // namespace sq::de
