// The inner step of sqkit's AVX-512-VNNI INT8 kernels (the per-token kernel of quant/int8_gemm.cpp
// and the per-token-group one of quant/int8_gemm_grouped.cpp): MR rows × NV 16-column vectors of
// INT32 sums advanced over k-quads with vpdpbusd (u8 activations × s8 weights, 4 products per lane).
// Internal to quant/; needs an AVX-512 (F, BW) + VNNI build.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/immintrin_quiet.h"

namespace sq::int8_vnni {

/// acc[r][v] += Σ_{t<4} a[r·lda + 4q + t] · b[q][16v + c][t] for the k-quads q = q0 … q0 + n − 1:
/// a: biased u8 activation rows (stride lda bytes); b: a packed panel [·][NV·16][4] s8 (quant/
/// int8_gemm.cpp). kSteps > 0 fixes n = kSteps at compile time (the loop fully unrolled); 0 reads n.
template <int MR, int NV, int kSteps>
__attribute__((always_inline)) inline void steps(const uint8_t* a, int64_t lda, const int8_t* b, int64_t q0, int64_t n,
                                                 __m512i (&acc)[MR][NV]) {
  auto step = [&](int64_t q) __attribute__((always_inline)) {
    __m512i bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + (q * NV + v) * 64);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t a4;
      std::memcpy(&a4, a + r * lda + 4 * q, 4);
      const __m512i av = _mm512_set1_epi32(a4);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
    }
  };
  if constexpr (kSteps > 0) {
#pragma GCC unroll 16
    for (int t = 0; t < kSteps; ++t) step(q0 + t);
  } else {
    for (int64_t q = q0; q < q0 + n; ++q) step(q);
  }
}

}  // namespace sq::int8_vnni
