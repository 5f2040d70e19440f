// CPU replays of the CUDA W4A16 kernels' exact floating-point order (lib/cuda/cuda_w4a16_linear.h),
// built from the same __host__ __device__ functions (lib/cuda/quant_element.h), and the error
// magnitude used to bound their difference from the CPU layer. Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/quant_element.h"
#include "quant/int4_quantize.h"

namespace sq::test {

/// GEMV (n == 1) as the kernel computes it: 32 lanes, lane l over bytes l, l+32, …, then the
/// xor-shuffle butterfly (v[l] ← v[l] + v[l ^ off] for off = 16, 8, 4, 2, 1); y [out].
inline std::vector<float> replay_w4a16_gemv(const Int4Weights& w, const float* x) {
  const int64_t G = int4_groups_per_row(w);
  const uint8_t* zeros = w.asym && !w.float_min() ? w.zeros_packed.data() : nullptr;
  const uint16_t* mins = w.float_min() ? w.mins_f16.data() : nullptr;
  std::vector<float> y(static_cast<size_t>(w.out));
  for (int64_t r = 0; r < w.out; ++r) {
    float v[32], t[32];
    for (int l = 0; l < 32; ++l)
      v[l] = qe::int4_row_partial_dot(w.packed.data(), w.scales_f16.data(), zeros, mins, w.in, w.group, G, w.asym, r, x, l, 32);
    for (int off = 16; off > 0; off >>= 1) {
      for (int l = 0; l < 32; ++l) t[l] = v[l] + v[l ^ off];
      for (int l = 0; l < 32; ++l) v[l] = t[l];
    }
    y[size_t(r)] = v[0];
  }
  return y;
}

/// GEMM (n > 1) as the kernel computes it: per output, the sequential fma dot product over the
/// columns in order; y [n, out].
inline std::vector<float> replay_w4a16_gemm(const Int4Weights& w, const float* x, int64_t n) {
  const int64_t G = int4_groups_per_row(w);
  const uint8_t* zeros = w.asym && !w.float_min() ? w.zeros_packed.data() : nullptr;
  const uint16_t* mins = w.float_min() ? w.mins_f16.data() : nullptr;
  std::vector<float> y(static_cast<size_t>(n * w.out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < w.out; ++r)
      y[size_t(i * w.out + r)] =
          qe::int4_row_partial_dot(w.packed.data(), w.scales_f16.data(), zeros, mins, w.in, w.group, G, w.asym, r, x + i * w.in, 0, 1);
  return y;
}

/// What the device linear computes for x [n, in]: the GEMV replay for n == 1, the GEMM replay else.
inline std::vector<float> replay_w4a16(const Int4Weights& w, const float* x, int64_t n) {
  return n == 1 ? replay_w4a16_gemv(w, x) : replay_w4a16_gemm(w, x, n);
}

/// Per output (i, r): the exact Σ_c x·W' in double, and the magnitude M = Σ_c |x[i, c]|·Δ·(|q| + z)
/// that bounds the rounding error of every FP32 evaluation order used here: the fma chains of the
/// device (≤ γ_in·Σ|x||W'| ≤ γ_in·M) and the CPU layer's, which for asymmetric weights evaluates
/// Δ·(Σ x·u − z·Σ x) per group (≤ γ·Σ|x|·Δ·(u + z) = γ·M; with a float minimum m, Δ·Σ x·u + m·Σ x
/// against the device's once-rounded Δ·u + m, both ≤ γ·Σ|x|·(Δ·|u| + |m|) = γ·M), γ_k = k·u/(1 − k·u), u = 2^−24.
struct W4A16Exact {
  std::vector<double> value, magnitude;  ///< [n, out] each
};

inline W4A16Exact w4a16_exact(const Int4Weights& w, const float* x, int64_t n) {
  const int64_t G = int4_groups_per_row(w);
  W4A16Exact e;
  e.value.assign(static_cast<size_t>(n * w.out), 0.0);
  e.magnitude.assign(e.value.size(), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < w.out; ++r) {
      double v = 0, m = 0;
      for (int64_t c = 0; c < w.in; ++c) {
        const int64_t j = c / w.group;
        const double step = qe::half_bits_to_float(w.scales_f16[size_t(r * G + j)]);
        const int code = int4_code(w, r, c), zero = int4_zero(w, r, j);
        const double xc = x[i * w.in + c];
        if (w.float_min()) {  // Δ·u + m: the device rounds it once per weight, the CPU closes the group as Δ·Σx·u + m·Σx
          const double mn = int4_offset(w, r, j);
          v += xc * (step * code + mn);
          m += std::fabs(xc) * (step * std::abs(code) + std::fabs(mn));
          continue;
        }
        v += xc * step * (code - zero);
        m += std::fabs(xc) * step * (std::abs(code) + zero);
      }
      e.value[size_t(i * w.out + r)] = v;
      e.magnitude[size_t(i * w.out + r)] = m;
    }
  return e;
}

}  // namespace sq::test
