#include "quant/int8_gemm_amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdexcept>
#include <type_traits>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define SQ_INT8_AMX 1
#include "core/immintrin_quiet.h"
#include "quant/int8_gemm_epilogue.h"
#else
#define SQ_INT8_AMX 0
#endif

namespace sq::int8_amx {

namespace {

#if SQ_INT8_AMX
/// LDTILECFG's 64-byte operand (SDM vol. 1 §18.2): palette, then bytes per row and rows per tile.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

/// MT (1 or 2) × NT (1 or 2) blocks of 16 × 16 INT32 accumulated over kchunks steps of kDepth
/// inputs (64: TileShapes::Deep64; 32: TileShapes::Groups32, one activation group), stored to c
/// (row stride ldc int32). Tiles: C 0–3, A 4–5, B 6–7.
template <int MT, int NT, int kDepth = 64>
void accumulate(const uint8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int64_t kchunks, int32_t* c, int64_t ldc) {
  _tile_zero(0);
  if constexpr (NT == 2) _tile_zero(1);
  if constexpr (MT == 2) _tile_zero(2);
  if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  for (int64_t kc = 0; kc < kchunks; ++kc) {
    _tile_loadd(4, a + kc * kDepth, lda);
    if constexpr (MT == 2) _tile_loadd(5, a + 16 * lda + kc * kDepth, lda);
    const int8_t* bk = b + kc * (kDepth / 4) * ldb;
    _tile_loadd(6, bk, ldb);
    if constexpr (NT == 2) _tile_loadd(7, bk + 64, ldb);
    _tile_dpbusd(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbusd(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbusd(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbusd(3, 5, 7);
  }
  const int64_t stride = ldc * int64_t(sizeof(int32_t));
  _tile_stored(0, c, stride);
  if constexpr (NT == 2) _tile_stored(1, c + 16, stride);
  if constexpr (MT == 2) _tile_stored(2, c + 16 * ldc, stride);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c + 16 * ldc + 16, stride);
}

/// block_grouped for MT 16-row tiles × NT 16-column groups.
template <int MT, int NT>
void grouped(const uint8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int64_t G, const int32_t* gcomp, int64_t ldcomp,
             const float* sa, __mmask16 last_mask, float* y, int64_t ldo, int64_t j0, const Int8Dequant& dq) {
  constexpr int R = 16 * MT;
  alignas(64) int32_t acc[R][16 * NT];
  alignas(64) float facc[R][16 * NT] = {};
  for (int64_t g = 0; g < G; ++g) {
    accumulate<MT, NT, 32>(a + 32 * g, lda, b + 8 * g * ldb, ldb, 1, &acc[0][0], 16 * NT);
    __m512i c[NT];
    for (int v = 0; v < NT; ++v) c[v] = _mm512_loadu_si512(gcomp + g * ldcomp + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(sa[r * G + g]);
#pragma GCC unroll 2
      for (int v = 0; v < NT; ++v) {
        const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512(&acc[r][16 * v]), c[v]));
        _mm512_store_ps(&facc[r][16 * v], _mm512_fmadd_ps(f, s, _mm512_load_ps(&facc[r][16 * v])));
      }
    }
  }
  __m512 sb[NT], bias[NT];
  int8_epilogue::column_terms(dq, j0, NT, last_mask, sb, bias);
  for (int r = 0; r < R; ++r) {
    __m512 f[NT];
    for (int v = 0; v < NT; ++v) f[v] = _mm512_load_ps(&facc[r][16 * v]);
    int8_epilogue::store_scaled_row(y + r * ldo + j0, f, sb, bias, dq.bias != nullptr, NT, last_mask);
  }
}

#endif

bool probe() {
#if SQ_INT8_AMX
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_tile = (d >> 24) & 1u, amx_int8 = (d >> 25) & 1u;
  if (!amx_tile || !amx_int8 || !__builtin_cpu_supports("avx512bw")) return false;
  // Linux keeps the 8 KiB tile data state off until a process asks for it (kernel 5.16+).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace

bool available() {
  static const bool ok = probe();
  return ok;
}

TileScope::TileScope(TileShapes shapes) {
#if SQ_INT8_AMX
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  if (shapes == TileShapes::Groups32) {
    cfg.colsb[4] = cfg.colsb[5] = 32;  // A: 16 rows × 32 activation bytes (one group)
    cfg.rows[6] = cfg.rows[7] = 8;     // B: 8 k-quads × 16 columns × 4 bytes
  }
  // GCC 12's _tile_loadconfig builtin does not tell the optimizer that it reads the 64 bytes, which
  // then drops the stores above as dead (LDTILECFG got an all-zero shape and raised #GP).
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
#else
  throw std::logic_error("int8_amx::TileScope: this build has no AMX kernel");
#endif
}

TileScope::~TileScope() {
#if SQ_INT8_AMX
  _tile_release();
#endif
}

template <bool kF32>
void block(const uint8_t* a, int64_t lda, int rows, const int8_t* b, int64_t ldb, int64_t kchunks, int ngroups, const int32_t* comp,
           uint16_t last_mask, void* out, int64_t ldo, int64_t i0, int64_t j0, const Int8Dequant& dq) {
#if SQ_INT8_AMX
  alignas(64) int32_t acc[32][32];
  // The tile products, then the epilogue with its row and vector counts as constants (unrolled,
  // branch-free inner loop): at SmolLM2's k = 576 the epilogue costs a third of the products' time.
  const auto run = [&](auto r, auto g) {
    constexpr int MT = decltype(r)::value, NT = decltype(g)::value;
    accumulate<MT, NT>(a, lda, b, ldb, kchunks, &acc[0][0], 32);
    int8_epilogue::store_tile<kF32>(&acc[0][0], 32, 16 * MT, NT, comp, static_cast<__mmask16>(last_mask), out, ldo, i0, j0, dq);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (rows == 32) {
    if (ngroups == 2) run(Two{}, Two{});
    else run(Two{}, One{});
  } else {
    if (ngroups == 2) run(One{}, Two{});
    else run(One{}, One{});
  }
#else
  (void)a, (void)lda, (void)rows, (void)b, (void)ldb, (void)kchunks, (void)ngroups, (void)comp, (void)last_mask, (void)out,
      (void)ldo, (void)i0, (void)j0, (void)dq;
  throw std::logic_error("int8_amx::block: this build has no AMX kernel");
#endif
}

template void block<true>(const uint8_t*, int64_t, int, const int8_t*, int64_t, int64_t, int, const int32_t*, uint16_t, void*,
                          int64_t, int64_t, int64_t, const Int8Dequant&);
template void block<false>(const uint8_t*, int64_t, int, const int8_t*, int64_t, int64_t, int, const int32_t*, uint16_t, void*,
                           int64_t, int64_t, int64_t, const Int8Dequant&);

void block_grouped(const uint8_t* a, int64_t lda, int rows, const int8_t* b, int64_t ldb, int64_t G, int ngroups, const int32_t* gcomp,
                   int64_t ldcomp, const float* sa, uint16_t last_mask, float* y, int64_t ldo, int64_t i0, int64_t j0,
                   const Int8Dequant& dq) {
#if SQ_INT8_AMX
  float* yb = y + i0 * ldo;
  const auto m = static_cast<__mmask16>(last_mask);
  if (rows == 32) {
    if (ngroups == 2) grouped<2, 2>(a, lda, b, ldb, G, gcomp, ldcomp, sa, m, yb, ldo, j0, dq);
    else grouped<2, 1>(a, lda, b, ldb, G, gcomp, ldcomp, sa, m, yb, ldo, j0, dq);
  } else {
    if (ngroups == 2) grouped<1, 2>(a, lda, b, ldb, G, gcomp, ldcomp, sa, m, yb, ldo, j0, dq);
    else grouped<1, 1>(a, lda, b, ldb, G, gcomp, ldcomp, sa, m, yb, ldo, j0, dq);
  }
#else
  (void)a, (void)lda, (void)rows, (void)b, (void)ldb, (void)G, (void)ngroups, (void)gcomp, (void)ldcomp, (void)sa, (void)last_mask,
      (void)y, (void)ldo, (void)i0, (void)j0, (void)dq;
  throw std::logic_error("int8_amx::block_grouped: this build has no AMX kernel");
#endif
}

}  // namespace sq::int8_amx
