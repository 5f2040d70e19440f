// The store of an INT32 output tile of the AVX-512 INT8 GEMM kernels (Int8Backend::Vnni and
// Int8Backend::Amx of quant/int8_gemm.h): the u8-shift compensation added, then either the INT32
// result or the fused dequantization (Int8Dequant, evaluated exactly as int8_dequant_one) written
// to the output. Internal to quant/; needs an AVX-512 (F, BW) build.
#pragma once

#include <cstdint>

#include "core/immintrin_quiet.h"
#include "quant/int8_gemm.h"

namespace sq::int8_epilogue {

/// The per-column terms of the dequantization for nv 16-column vectors from column j0 (the last one
/// under last_mask: columns beyond n are not read): weight steps sb[v] (dq.b_scales per column or
/// per tensor, 1 without) and bias[v] (zero without bias).
__attribute__((always_inline)) inline void column_terms(const Int8Dequant& dq, int64_t j0, int nv, __mmask16 last_mask, __m512* sb,
                                                        __m512* bias) {
  for (int v = 0; v < nv; ++v) {
    const __mmask16 mk = v == nv - 1 ? last_mask : __mmask16(0xFFFF);
    sb[v] = !dq.b_scales ? _mm512_set1_ps(1.0f)
            : dq.b_per_col ? _mm512_maskz_loadu_ps(mk, dq.b_scales + j0 + 16 * v)
                           : _mm512_set1_ps(dq.b_scales[0]);
    bias[v] = dq.bias ? _mm512_maskz_loadu_ps(mk, dq.bias + j0 + 16 * v) : _mm512_setzero_ps();
  }
}

/// Stores one output row of the per-token-group product (quant/int8_gemm_grouped.h):
/// dst[16v + c] = fma(f[v], sb[v], bias[v]) with bias, f[v]·sb[v] without, for v < nv, the last
/// vector under last_mask.
__attribute__((always_inline)) inline void store_scaled_row(float* dst, const __m512* f, const __m512* sb, const __m512* bias,
                                                            bool with_bias, int nv, __mmask16 last_mask) {
  for (int v = 0; v < nv; ++v) {
    const __m512 res = with_bias ? _mm512_fmadd_ps(f[v], sb[v], bias[v]) : _mm512_mul_ps(f[v], sb[v]);
    if (v == nv - 1) _mm512_mask_storeu_ps(dst + 16 * v, last_mask, res);
    else _mm512_storeu_ps(dst + 16 * v, res);
  }
}

/// Writes rows × (16·nv) outputs from the INT32 tile `acc` (row stride ldt int32) to `out`
/// (row-major, row stride ldo; the block's first output is (i0, j0)):
///   kF32:  y[i0 + r, j0 + c] = dq(acc[r, c] + comp[c])   (float, bit-identical to int8_dequant_one)
///   !kF32: C[i0 + r, j0 + c] = acc[r, c] + comp[c]       (int32)
/// comp: [16·nv] int32 (−128·Σ_k B[j, k]) or null for none. The last 16-column vector is stored
/// under last_mask (columns beyond n are neither read from dq nor written). nv ∈ [1, 3], rows ≥ 0.
template <bool kF32>
__attribute__((always_inline)) inline void store_tile(const int32_t* acc, int64_t ldt, int rows, int nv, const int32_t* comp,
                                                      __mmask16 last_mask, void* out, int64_t ldo, int64_t i0, int64_t j0,
                                                      const Int8Dequant& dq) {
  __m512i cv[3];
  for (int v = 0; v < nv; ++v) cv[v] = comp ? _mm512_loadu_si512(comp + 16 * v) : _mm512_setzero_si512();
  if constexpr (!kF32) {
    int32_t* C = static_cast<int32_t*>(out) + i0 * ldo + j0;
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < nv; ++v) {
        const __m512i x = _mm512_add_epi32(_mm512_loadu_si512(acc + r * ldt + 16 * v), cv[v]);
        if (v == nv - 1) _mm512_mask_storeu_epi32(C + r * ldo + 16 * v, last_mask, x);
        else _mm512_storeu_si512(C + r * ldo + 16 * v, x);
      }
  } else {
    float* y = static_cast<float*>(out) + i0 * ldo + j0;
    __m512 sb[3], bias[3];
    column_terms(dq, j0, nv, last_mask, sb, bias);
    for (int r = 0; r < rows; ++r) {
      const __m512 vsa = _mm512_set1_ps(dq.a_scales ? dq.a_scales[dq.a_per_row ? i0 + r : 0] : 1.0f);
      for (int v = 0; v < nv; ++v) {
        const __m512 s = _mm512_mul_ps(vsa, sb[v]);
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_loadu_si512(acc + r * ldt + 16 * v), cv[v]));
        const __m512 res = dq.bias ? _mm512_fmadd_ps(f, s, bias[v]) : _mm512_mul_ps(f, s);
        if (v == nv - 1) _mm512_mask_storeu_ps(y + r * ldo + 16 * v, last_mask, res);
        else _mm512_storeu_ps(y + r * ldo + 16 * v, res);
      }
    }
  }
}

}  // namespace sq::int8_epilogue
