#include "quant/int8_gemm_avx2.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>

#include "quant/gemm_common.h"

#if defined(__AVX2__)
#define SQ_INT8_AVX2 1
#include "core/immintrin_quiet.h"
#else
#define SQ_INT8_AVX2 0
#endif

namespace sq::int8_avx2 {

bool available() {
#if SQ_INT8_AVX2
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

#if SQ_INT8_AVX2

namespace {

constexpr int kMR = 3;           // rows of A per micro-kernel call
constexpr int kNR = 4;           // rows of B per micro-kernel call
constexpr int64_t kBlockN = 64;  // rows of B per parallel block

/// Sum of the 8 INT32 lanes.
inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/// 16 activations at p widened to INT16: s8 sign-extended, or biased u8 zero-extended minus 128.
template <bool Biased>
inline __m256i load_a(const void* p) {
  const __m128i v = _mm_loadu_si128(static_cast<const __m128i*>(p));
  if constexpr (Biased) return _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(128));
  else return _mm256_cvtepi8_epi16(v);
}

template <bool Biased>
inline int32_t a_at(const void* A, int64_t idx) {
  if constexpr (Biased) return int32_t(static_cast<const uint8_t*>(A)[idx]) - 128;
  else return static_cast<const int8_t*>(A)[idx];
}

/// acc[r][c] = Σ_t A[r·lda + t] · B[c·k + t] over t < k, for r < MR, c < NR (exact INT32).
template <bool Biased, int MR, int NR>
void tile(const void* A, int64_t lda, const int8_t* B, int64_t k, int32_t (&acc)[kMR][kNR]) {
  const auto* a8 = static_cast<const uint8_t*>(A);  // byte addressing for both element types
  __m256i s[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) s[r][c] = _mm256_setzero_si256();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    __m256i a[MR];
    for (int r = 0; r < MR; ++r) a[r] = load_a<Biased>(a8 + r * lda + t);
    for (int c = 0; c < NR; ++c) {
      const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + c * k + t)));
      for (int r = 0; r < MR; ++r) s[r][c] = _mm256_add_epi32(s[r][c], _mm256_madd_epi16(a[r], b));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) {
      int32_t v = hsum(s[r][c]);
      for (int64_t u = t; u < k; ++u) v += a_at<Biased>(A, r * lda + u) * int32_t(B[c * k + u]);
      acc[r][c] = v;
    }
}

using TileFn = void (*)(const void*, int64_t, const int8_t*, int64_t, int32_t (&)[kMR][kNR]);

template <bool Biased, int MR>
constexpr TileFn tile_for(int nr) {
  switch (nr) {
    case 1: return tile<Biased, MR, 1>;
    case 2: return tile<Biased, MR, 2>;
    case 3: return tile<Biased, MR, 3>;
    default: return tile<Biased, MR, 4>;
  }
}

template <bool Biased>
TileFn tile_fn(int mr, int nr) {
  switch (mr) {
    case 1: return tile_for<Biased, 1>(nr);
    case 2: return tile_for<Biased, 2>(nr);
    default: return tile_for<Biased, 3>(nr);
  }
}

/// Runs every (kMR × kNR) tile of the product and hands each INT32 result to store(i, j, acc).
template <bool Biased, typename Store>
void run(const void* A, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, Store&& store) {
  const int64_t blocks = (n + kBlockN - 1) / kBlockN;
  const bool par = m * n * k >= gemm::kParallelMinMacs && blocks > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
  const auto* a8 = static_cast<const uint8_t*>(A);
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t j0 = bl * kBlockN, j1 = std::min(n, j0 + kBlockN);
    int32_t acc[kMR][kNR];
    for (int64_t i = 0; i < m; i += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, m - i));
      for (int64_t j = j0; j < j1; j += kNR) {
        const int nr = static_cast<int>(std::min<int64_t>(kNR, j1 - j));
        tile_fn<Biased>(mr, nr)(a8 + i * lda, lda, B + j * k, k, acc);
        for (int r = 0; r < mr; ++r)
          for (int c = 0; c < nr; ++c) store(i + r, j + c, acc[r][c]);
      }
    }
  }
}

}  // namespace

void gemm_s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, int32_t* C) {
  run<false>(A, lda, B, m, n, k, [&](int64_t i, int64_t j, int32_t acc) { C[i * n + j] = acc; });
}

void gemm_f32(const int8_t* A, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, const Int8Dequant& dq, float* y) {
  run<false>(A, lda, B, m, n, k, [&](int64_t i, int64_t j, int32_t acc) { y[i * n + j] = int8_dequant_one(acc, i, j, dq); });
}

void gemm_f32_biased(const uint8_t* Au, int64_t lda, const int8_t* B, int64_t m, int64_t n, int64_t k, const Int8Dequant& dq,
                     float* y) {
  run<true>(Au, lda, B, m, n, k, [&](int64_t i, int64_t j, int32_t acc) { y[i * n + j] = int8_dequant_one(acc, i, j, dq); });
}

#else  // no AVX2 in this build

namespace {
[[noreturn]] void unavailable() { throw std::logic_error("int8_avx2: this build has no AVX2 (check int8_avx2::available())"); }
}  // namespace

void gemm_s32(const int8_t*, int64_t, const int8_t*, int64_t, int64_t, int64_t, int32_t*) { unavailable(); }
void gemm_f32(const int8_t*, int64_t, const int8_t*, int64_t, int64_t, int64_t, const Int8Dequant&, float*) { unavailable(); }
void gemm_f32_biased(const uint8_t*, int64_t, const int8_t*, int64_t, int64_t, int64_t, const Int8Dequant&, float*) {
  unavailable();
}

#endif

}  // namespace sq::int8_avx2
