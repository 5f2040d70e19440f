#include "quant/int8_gemm_grouped.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/gemm_common.h"
#include "quant/int8_gemm_amx.h"
#include "quant/int8_quantize.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SQ_INT8_GROUPED_VNNI 1
#include "core/immintrin_quiet.h"
#include "quant/int8_gemm_epilogue.h"
#include "quant/int8_vnni_steps.h"
#else
#define SQ_INT8_GROUPED_VNNI 0
#endif

namespace sq::int8_grouped {

namespace {

using gemm::for_each_output;
using gemm::kParallelMinMacs;

constexpr int64_t kGroup = kActGroupSize;
constexpr int64_t kGroupQuads = kGroup / 4;  // k-quads (vpdpbusd steps) per block
constexpr int kMR = 4;                       // rows per register block (see the header)
constexpr int kMaxNV = 3;                    // 16-column vectors per panel (48 columns)
constexpr int64_t kMC = 256;                 // rows of A per outer block

/// The scalar definition of one output (file comment of the header); `block_sum(g)` is the exact
/// INT32 sum of block g.
template <typename BlockSum>
float grouped_one(BlockSum&& block_sum, int64_t G, const float* sa_row, int64_t j, const Int8Dequant& dq) {
  float acc = 0.0f;
  for (int64_t g = 0; g < G; ++g) acc = std::fma(static_cast<float>(block_sum(g)), sa_row[g], acc);
  const float sb = dq.b_scales ? dq.b_scales[dq.b_per_col ? j : 0] : 1.0f;
  return dq.bias ? std::fma(acc, sb, dq.bias[j]) : acc * sb;
}

#if SQ_INT8_GROUPED_VNNI

/// One MR × (NV·16) output block over all G activation blocks, stored to y (row stride ldy; the last
/// vector under last_mask). a: biased u8 rows of the block (stride lda, quads up to kq read); b: the
/// panel [·][NV·16][4]; gcomp: the panel's [G][nr] compensation; sa: the block's first row of steps
/// (stride G); j0: the panel's first column (weight steps, bias). Out of line so that the 2·MR·NV
/// accumulators get registers of their own. Each block's sums start from zero (the compensation is
/// added when they are converted) and whole blocks run a fully unrolled 8-quad loop: with the
/// compensation as initial value, GCC copied every accumulator twice per quad.
template <int MR, int NV>
__attribute__((noinline)) void grouped_block(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, int64_t G,
                                             const int32_t* gcomp, int64_t nr, const float* sa, __mmask16 last_mask, float* y,
                                             int64_t ldy, int64_t j0, const Int8Dequant& dq) {
  __m512 facc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) facc[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
    const int64_t q0 = g * kGroupQuads;
    const int nq = static_cast<int>(std::min<int64_t>(kGroupQuads, kq - q0));
    if (nq == kGroupQuads) int8_vnni::steps<MR, NV, kGroupQuads>(a, lda, b, q0, nq, acc);
    else int8_vnni::steps<MR, NV, 0>(a, lda, b, q0, nq, acc);
    __m512i c[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[v] = _mm512_loadu_si512(gcomp + g * nr + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 s = _mm512_set1_ps(sa[r * G + g]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        facc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc[r][v], c[v])), s, facc[r][v]);
    }
  }
  __m512 sb[NV], bias[NV];
  int8_epilogue::column_terms(dq, j0, NV, last_mask, sb, bias);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) int8_epilogue::store_scaled_row(y + r * ldy + j0, facc[r], sb, bias, dq.bias != nullptr, NV, last_mask);
}

using BlockFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int64_t, const int32_t*, int64_t, const float*, __mmask16,
                         float*, int64_t, int64_t, const Int8Dequant&);

template <int MR>
constexpr std::array<BlockFn, kMaxNV> block_row() {
  return {&grouped_block<MR, 1>, &grouped_block<MR, 2>, &grouped_block<MR, 3>};
}

constexpr std::array<std::array<BlockFn, kMaxNV>, kMR> kBlocks = {block_row<1>(), block_row<2>(), block_row<3>(), block_row<4>()};

#endif  // SQ_INT8_GROUPED_VNNI

}  // namespace

int64_t groups(int64_t k) { return (k + kGroup - 1) / kGroup; }

std::vector<int32_t> group_compensation(const Panels& w) {
  const int64_t G = groups(w.k);
  std::vector<int32_t> comp(static_cast<size_t>(w.panels * G * w.nr), 0);
  for (int64_t p = 0; p < w.panels; ++p) {
    const int64_t width = w.width(p);
    const int8_t* panel = w.panel(p);
    for (int64_t c = 0; c < width && p * w.nr + c < w.n; ++c)
      for (int64_t g = 0; g < G; ++g) {
        int32_t sum = 0;
        for (int64_t t = g * kGroup; t < std::min(w.k, (g + 1) * kGroup); ++t) sum += panel[((t / 4) * width + c) * 4 + t % 4];
        comp[static_cast<size_t>((p * G + g) * w.nr + c)] = -128 * sum;
      }
  }
  return comp;
}

void run_vnni(const Panels& w, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) {
#if SQ_INT8_GROUPED_VNNI
  const int64_t G = groups(w.k), kq = (w.k + 3) / 4;
  const bool par = m * w.n * w.k >= kParallelMinMacs && w.panels > 1 && omp_get_max_threads() > 1;
#pragma omp parallel if (par)
  for (int64_t ic = 0; ic < m; ic += kMC) {
    const int64_t iend = std::min(m, ic + kMC);
    // As the per-token kernel (quant/int8_gemm.cpp, run_vnni): panels handed out dynamically, each
    // computed by one thread in a fixed order.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t p = 0; p < w.panels; ++p) {
      const int nv = static_cast<int>(w.width(p) / 16);
      const __mmask16 mask = w.mask(p);
      const int8_t* bp = w.panel(p);
      const int32_t* gc = w.group_comp + p * G * w.nr;
      for (int64_t i = ic; i < iend; i += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, iend - i));
        kBlocks[static_cast<size_t>(mr - 1)][static_cast<size_t>(nv - 1)](Au + i * lda, lda, bp, kq, G, gc, w.nr, dq.a_scales + i * G,
                                                                          mask, y + i * w.n, w.n, p * w.nr, dq);
      }
    }
  }
#else
  (void)w, (void)Au, (void)lda, (void)m, (void)dq, (void)y;
  throw UnsupportedError("INT8 GEMM: this build has no AVX-512-VNNI kernel for per-token-group activations");
#endif
}

void run_amx(const Panels& w, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) {
  const int64_t G = groups(w.k);
  const int64_t m16 = lda >= w.kpad ? m / 16 * 16 : 0;
  if (m16 > 0) {
    const bool par = m16 * w.n * w.k >= kParallelMinMacs && w.panels > 1 && omp_get_max_threads() > 1;
#pragma omp parallel if (par)
    {
      const int8_amx::TileScope tiles(int8_amx::TileShapes::Groups32);
      for (int64_t ic = 0; ic < m16; ic += kMC) {
        const int64_t iend = std::min(m16, ic + kMC);
        // As run_vnni: panels handed out dynamically, each computed by one thread in a fixed order.
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t p = 0; p < w.panels; ++p) {
          const int64_t width = w.width(p);
          for (int64_t i = ic; i < iend; i += 32)
            int8_amx::block_grouped(Au + i * lda, lda, static_cast<int>(std::min<int64_t>(32, iend - i)), w.panel(p), width * 4, G,
                                    static_cast<int>(width / 16), w.group_comp + p * G * w.nr, w.nr, dq.a_scales + i * G, w.mask(p), y,
                                    w.n, i, p * w.nr, dq);
        }
      }
    }
  }
  if (m16 == m) return;
  Int8Dequant rest = dq;  // rows m16 … m−1: their activation steps and outputs
  rest.a_scales += m16 * G;
  run_vnni(w, Au + m16 * lda, lda, m - m16, rest, y + m16 * w.n);
}

namespace {

/// The scalar definition over plain weights B and activations Au (row stride lda) stored with a
/// bias of kShift (128 for biased u8, 0 for s8).
template <int kShift, typename T>
void plain(const int8_t* B, int64_t n, int64_t k, const T* Au, int64_t lda, int64_t m, const Int8Dequant& dq, float* y) {
  const int64_t G = groups(k);
  for_each_output(m, n, k, [&](int64_t i, int64_t j) {
    const T* a = Au + i * lda;
    const int8_t* b = B + j * k;
    y[i * n + j] = grouped_one(
        [&](int64_t g) {
          int32_t s = 0;
          for (int64_t t = g * kGroup; t < std::min(k, (g + 1) * kGroup); ++t) s += (int32_t(a[t]) - kShift) * int32_t(b[t]);
          return s;
        },
        G, dq.a_scales + i * G, j, dq);
  });
}

}  // namespace

void run_plain_biased(const int8_t* B, int64_t n, int64_t k, const uint8_t* Au, int64_t lda, int64_t m, const Int8Dequant& dq,
                      float* y) {
  plain<128>(B, n, k, Au, lda, m, dq, y);
}

void run_plain(const int8_t* B, int64_t n, int64_t k, const int8_t* A, int64_t m, const Int8Dequant& dq, float* y) {
  plain<0>(B, n, k, A, k, m, dq, y);
}

}  // namespace sq::int8_grouped
