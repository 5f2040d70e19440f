#include "model/w4a16_linear.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "formats/safetensors.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define SQ_W4_AVX512 1
#include "core/immintrin_quiet.h"
#else
#define SQ_W4_AVX512 0
#endif

namespace sq {

namespace {

/// Products below this many multiply-adds run on the calling thread (an OpenMP fork costs more).
constexpr int64_t kParallelMinMacs = int64_t(1) << 16;

/// Per-thread scratch buffer (grown on demand, reused across calls), 64-byte aligned.
template <typename T, int Tag>
T* scratch(int64_t count) {
  static thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < count + 64) buf.resize(static_cast<size_t>(count + 64));
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(T);
}

Int4Weights quantize_tensor(const Tensor& weight, int64_t group, bool asym) {
  if (weight.rank() != 2 || weight.empty())
    throw std::invalid_argument("W4A16Linear: weight must be a non-empty rank-2 tensor, got " + weight.shape_string());
  return quantize_int4(weight.data(), weight.dim(0), weight.dim(1), group, asym);
}

#if SQ_W4_AVX512

inline float scale_at(const Int4Weights& w, int64_t idx) { return _cvtsh_ss(w.scales_f16[static_cast<size_t>(idx)]); }

inline int zero_at(const Int4Weights& w, int64_t f) {
  const uint8_t b = w.zeros_packed[static_cast<size_t>(f / 2)];
  return (f & 1) ? (b >> 4) : (b & 0xF);
}

/// GEMV software-prefetch distance in rows (see gemv_rows).
constexpr int64_t kPrefetchRows = 8;

/// GEMV over R consecutive rows starting at r0. xp: the activation permuted per 32-column chunk
/// into [even columns (16), odd columns (16)]; xsum: [in/g][16] lane-wise Σ of xp over each group.
template <int R, bool Sym>
void gemv_rows(const Int4Weights& w, const float* xp, const float* xsum, int64_t r0, float* y) {
  const int64_t in = w.in, g = w.group, ng = in / g, half_in = in / 2;
  // Nibble → float through a 16-entry table: vpermps reads only bits 0-3 of each index lane, so
  // neither masking nor an int→float conversion is needed. Symmetric: the two's complement value
  // q (zero point 0); asymmetric: the unsigned code u (zero point applied per group below).
  const __m512 lut = Sym ? _mm512_set_ps(-1, -2, -3, -4, -5, -6, -7, -8, 7, 6, 5, 4, 3, 2, 1, 0)
                         : _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 tot[R];
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    tot[r] = _mm512_setzero_ps();
    rows[r] = w.packed.data() + (r0 + r) * half_in;
  }
  const bool prefetch = r0 + kPrefetchRows + R <= w.out;  // the next block exists (no pointer past the end)
  for (int64_t j = 0; j < ng; ++j) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t col = j * g; col < (j + 1) * g; col += 32) {
      // Software prefetch of the same cache line kPrefetchRows rows ahead (rows are contiguous, so
      // this runs ~kPrefetchRows·in/2 bytes ahead of the loads; short per-row streams ramp the
      // hardware prefetchers up too slowly when the weights come from DRAM).
      if (prefetch && (col & 127) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + kPrefetchRows * half_in + col / 2), _MM_HINT_T0);
      const __m512 xl = _mm512_load_ps(xp + col);
      const __m512 xh = _mm512_load_ps(xp + col + 16);
      for (int r = 0; r < R; ++r) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + col / 2)));
        const __m512 lo = _mm512_permutexvar_ps(v, lut);                         // even columns
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);  // odd columns
        acc[r] = _mm512_fmadd_ps(xl, lo, acc[r]);
        acc[r] = _mm512_fmadd_ps(xh, hi, acc[r]);
      }
    }
    if constexpr (Sym) {
      for (int r = 0; r < R; ++r) tot[r] = _mm512_fmadd_ps(_mm512_set1_ps(scale_at(w, (r0 + r) * ng + j)), acc[r], tot[r]);
    } else {
      const __m512 xs = _mm512_load_ps(xsum + j * 16);
      for (int r = 0; r < R; ++r) {
        const int64_t f = (r0 + r) * ng + j;
        const __m512 z = _mm512_set1_ps(static_cast<float>(zero_at(w, f)));
        tot[r] = _mm512_fmadd_ps(_mm512_set1_ps(scale_at(w, f)), _mm512_fnmadd_ps(z, xs, acc[r]), tot[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r0 + r] = _mm512_reduce_add_ps(tot[r]);
}

template <bool Sym>
void gemv_block(const Int4Weights& w, const float* xp, const float* xsum, int64_t r0, float* y) {
  const int64_t rows = std::min<int64_t>(4, w.out - r0);
  switch (rows) {
    case 4: gemv_rows<4, Sym>(w, xp, xsum, r0, y); break;
    case 3: gemv_rows<3, Sym>(w, xp, xsum, r0, y); break;
    case 2: gemv_rows<2, Sym>(w, xp, xsum, r0, y); break;
    default: gemv_rows<1, Sym>(w, xp, xsum, r0, y); break;
  }
}

constexpr int64_t kTileRows = 64;   // output rows per GEMM tile (4 zmm)
constexpr int64_t kTileCols = 128;  // input columns per GEMM tile (whole groups)
constexpr int kMr = 6;              // tokens per micro-kernel call

/// Dequantizes W[ob .. ob+64, k0 .. k0+kc) into Wt[kk][64] (row kk = input column k0+kk; lanes =
/// output rows; rows ≥ out are 0). Exact: Δ·u − Δ·z in one FMA (both products are exact).
template <bool Sym>
void dequant_tile(const Int4Weights& w, int64_t ob, int64_t k0, int64_t kc, float* Wt) {
  const int64_t in = w.in, g = w.group, ng = in / g, half_in = in / 2;
  const __m512i nib = _mm512_set1_epi32(0x0F);
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int>(half_in)));
  alignas(64) float dv[16], dzv[16];
  for (int64_t s = 0; s < kTileRows; s += 16) {
    const int64_t o0 = ob + s;
    const int64_t valid = std::clamp<int64_t>(w.out - o0, 0, 16);
    const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);
    if (valid == 0) {
      for (int64_t kk = 0; kk < kc; ++kk) _mm512_store_ps(Wt + kk * kTileRows + s, _mm512_setzero_ps());
      continue;
    }
    const uint8_t* base = w.packed.data() + o0 * half_in;
    __m512 D = _mm512_setzero_ps(), DZ = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kc; kk += 8) {
      const int64_t k = k0 + kk;
      if (k % g == 0) {
        const int64_t j = k / g;
        for (int l = 0; l < 16; ++l) {
          const float d = l < valid ? scale_at(w, (o0 + l) * ng + j) : 0.0f;
          const float z = l < valid ? (Sym ? 8.0f : static_cast<float>(zero_at(w, (o0 + l) * ng + j))) : 0.0f;
          dv[l] = d;
          dzv[l] = d * z;  // exact (11-bit mantissa × integer ≤ 15)
        }
        D = _mm512_load_ps(dv);
        DZ = _mm512_load_ps(dzv);
      }
      __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base + k / 2, 1);
      if constexpr (Sym) v = _mm512_xor_si512(v, _mm512_set1_epi32(static_cast<int>(0x88888888u)));
      for (int t = 0; t < 8; ++t) {
        const __m512 u = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 4 * t), nib));
        _mm512_store_ps(Wt + (kk + t) * kTileRows + s, _mm512_fmsub_ps(u, D, DZ));
      }
    }
  }
}

/// y[i0 .. i0+MR, ob .. ob+64) (+)= x[i0 .. i0+MR, k0 .. k0+kc) · Wt (first chunk stores).
template <int MR>
void micro_kernel(const float* x, int64_t in, const float* Wt, int64_t kc, int64_t k0, float* y, int64_t out, int64_t ob,
                  bool first, const __mmask16* mk) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q)
      acc[i][q] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[q], y + i * out + ob + q * 16);
  const float* xr = x + k0;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* b = Wt + kk * kTileRows;
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), b2 = _mm512_load_ps(b + 32), b3 = _mm512_load_ps(b + 48);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(xr[i * in + kk]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(a, b2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(a, b3, acc[i][3]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) _mm512_mask_storeu_ps(y + i * out + ob + q * 16, mk[q], acc[i][q]);
}

void micro_dispatch(int mr, const float* x, int64_t in, const float* Wt, int64_t kc, int64_t k0, float* y, int64_t out,
                    int64_t ob, bool first, const __mmask16* mk) {
  switch (mr) {
    case 6: micro_kernel<6>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
    case 5: micro_kernel<5>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
    case 4: micro_kernel<4>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
    case 3: micro_kernel<3>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
    case 2: micro_kernel<2>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
    default: micro_kernel<1>(x, in, Wt, kc, k0, y, out, ob, first, mk); break;
  }
}

#endif  // SQ_W4_AVX512

}  // namespace

namespace {

/// The kernels' copy of ragged weights (g ∤ in): every row zero-padded to ⌈in/g⌉·g columns (code 0;
/// the matching activation columns are zero, so the pad contributes exactly 0 whatever Δ and z).
Int4Weights pad_to_whole_groups(const Int4Weights& w) {
  Int4Weights p = w;
  p.in = int4_groups_per_row(w) * w.group;
  const int64_t src_row = w.in / 2, dst_row = p.in / 2;
  p.packed.assign(static_cast<size_t>(w.out * dst_row), 0);
  for (int64_t r = 0; r < w.out; ++r)
    std::memcpy(p.packed.data() + r * dst_row, w.packed.data() + r * src_row, static_cast<size_t>(src_row));
  return p;
}

}  // namespace

W4A16Linear::W4A16Linear(const Tensor& weight, int64_t group, bool asym) : W4A16Linear(quantize_tensor(weight, group, asym)) {}

W4A16Linear::W4A16Linear(Int4Weights weights, Tensor bias) : w_(std::move(weights)), in_(w_.in), bias_(std::move(bias)) {
  validate_int4(w_);
  if (!bias_.empty() && bias_.numel() != w_.out)
    throw std::invalid_argument("W4A16Linear: bias " + bias_.shape_string() + " does not match " + std::to_string(w_.out) + " outputs");
  if (w_.in % w_.group != 0) {
    stored_ = std::make_unique<Int4Weights>(std::move(w_));
    w_ = pad_to_whole_groups(*stored_);
  }
}

std::string W4A16Linear::format() const {
  return "w4a16-g" + std::to_string(w_.group) + (w_.asym ? "-asym" : "-sym");
}

void W4A16Linear::forward(const float* x, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W4A16Linear::forward: negative row count " + std::to_string(n));
  if (n == 0) return;
  if (in_ != w_.in) {  // ragged groups: zero-pad the activation to the kernels' whole groups
    float* xp = scratch<float, 4>(n * w_.in);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xp + i * w_.in, x + i * in_, static_cast<size_t>(in_) * sizeof(float));
      std::fill(xp + i * w_.in + in_, xp + (i + 1) * w_.in, 0.0f);
    }
    x = xp;
  }
#if SQ_W4_AVX512
  if (n == 1)
    gemv(x, y);
  else
    gemm(x, n, y);
#else
  forward_scalar(x, n, y);
#endif
  if (!bias_.empty()) {
    const float* b = bias_.data();
    const int64_t out = w_.out;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) y[i * out + o] += b[o];
  }
}

void W4A16Linear::forward_scalar(const float* x, int64_t n, float* y) const {
  const int64_t in = w_.in, out = w_.out, ng = in / w_.group;
#pragma omp parallel for schedule(static) if (n * in * out >= kParallelMinMacs && out > 1)
  for (int64_t o = 0; o < out; ++o) {
    float* row = scratch<float, 0>(in);
    for (int64_t j = 0; j < ng; ++j) {
      const float d = int4_scale(w_, o, j);
      const int z = int4_zero(w_, o, j);
      for (int64_t k = j * w_.group; k < (j + 1) * w_.group; ++k) row[k] = d * static_cast<float>(int4_code(w_, o, k) - z);
    }
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * in;
      float acc = 0.0f;
      for (int64_t k = 0; k < in; ++k) acc += xi[k] * row[k];
      y[i * out + o] = acc;
    }
  }
}

#if SQ_W4_AVX512

void W4A16Linear::gemv(const float* x, float* y) const {
  const int64_t in = w_.in, out = w_.out, g = w_.group, ng = in / g;
  // Activation in the kernel's order: per 32-column chunk, even columns then odd columns.
  float* xp = scratch<float, 1>(in);
  float* xsum = scratch<float, 2>(ng * 16);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t j = 0; j < ng; ++j) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t col = j * g; col < (j + 1) * g; col += 32) {
      const __m512 a = _mm512_loadu_ps(x + col), b = _mm512_loadu_ps(x + col + 16);
      const __m512 lo = _mm512_permutex2var_ps(a, even, b), hi = _mm512_permutex2var_ps(a, odd, b);
      _mm512_store_ps(xp + col, lo);
      _mm512_store_ps(xp + col + 16, hi);
      s = _mm512_add_ps(s, _mm512_add_ps(lo, hi));
    }
    _mm512_store_ps(xsum + j * 16, s);
  }
  const int64_t blocks = (out + 3) / 4;
  const bool sym = !w_.asym;
#pragma omp parallel for schedule(dynamic, 8) if (in * out >= kParallelMinMacs && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    if (sym)
      gemv_block<true>(w_, xp, xsum, b * 4, y);
    else
      gemv_block<false>(w_, xp, xsum, b * 4, y);
  }
}

void W4A16Linear::gemm(const float* x, int64_t n, float* y) const {
  const int64_t in = w_.in, out = w_.out, g = w_.group;
  const int64_t kc_max = std::max(g, kTileCols / g * g);
  const int64_t blocks = (out + kTileRows - 1) / kTileRows;
  const bool sym = !w_.asym;
#pragma omp parallel for schedule(dynamic, 1) if (n * in * out >= kParallelMinMacs && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    float* Wt = scratch<float, 3>(kc_max * kTileRows);
    const int64_t ob = b * kTileRows;
    __mmask16 mk[4];
    for (int q = 0; q < 4; ++q) {
      const int64_t valid = std::clamp<int64_t>(out - ob - q * 16, 0, 16);
      mk[q] = static_cast<__mmask16>((1u << valid) - 1u);
    }
    for (int64_t k0 = 0; k0 < in; k0 += kc_max) {
      const int64_t kc = std::min(kc_max, in - k0);
      if (sym)
        dequant_tile<true>(w_, ob, k0, kc, Wt);
      else
        dequant_tile<false>(w_, ob, k0, kc, Wt);
      for (int64_t i0 = 0; i0 < n; i0 += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, n - i0));
        micro_dispatch(mr, x + i0 * in, in, Wt, kc, k0, y + i0 * out, out, ob, k0 == 0, mk);
      }
    }
  }
}

#else

void W4A16Linear::gemv(const float* x, float* y) const { forward_scalar(x, 1, y); }
void W4A16Linear::gemm(const float* x, int64_t n, float* y) const { forward_scalar(x, n, y); }

#endif

}  // namespace sq
