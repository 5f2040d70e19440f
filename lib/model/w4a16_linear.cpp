#include "model/w4a16_linear.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "ops/aligned_buffer.h"
#include "ops/sgemm.h"
#include "formats/safetensors.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define SQ_W4_AVX512 1
#include "core/immintrin_quiet.h"
#else
#define SQ_W4_AVX512 0
#endif
// AVX2 builds without AVX-512 (e.g. AMD Zen 2/3): an 8-lane FP32 GEMV for decode.
#if !SQ_W4_AVX512 && defined(__AVX2__) && defined(__FMA__)
#define SQ_W4_AVX2 1
#include "core/immintrin_quiet.h"
#else
#define SQ_W4_AVX2 0
#endif
#if SQ_W4_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define SQ_W4_VNNI 1
#else
#define SQ_W4_VNNI 0
#endif

namespace sq {

namespace {

/// Products below this many multiply-adds run on the calling thread (an OpenMP fork costs more).
constexpr int64_t kParallelMinMacs = int64_t(1) << 16;

using ops::aligned_buffer;

/// Per-thread scratch buffer (grown on demand, reused across calls), 64-byte aligned.
template <typename T, int Tag>
T* scratch(int64_t count) {
  static thread_local std::vector<T> buf;
  return aligned_buffer(buf, count);
}

Int4Weights quantize_tensor(const Tensor& weight, int64_t group, bool asym) {
  if (weight.rank() != 2 || weight.empty())
    throw std::invalid_argument("W4A16Linear: weight must be a non-empty rank-2 tensor, got " + weight.shape_string());
  return quantize_int4(weight.data(), weight.dim(0), weight.dim(1), group, asym);
}

/// Zero point of flat group index f (r · ⌈in/g⌉ + j) of asymmetric weights with integer zero points.
inline int zero_at(const Int4Weights& w, int64_t f) {
  const uint8_t b = w.zeros_packed[static_cast<size_t>(f / 2)];
  return (f & 1) ? (b >> 4) : (b & 0xF);
}

/// Float minimum m of flat group index f (weights with w.float_min(): ŵ = Δ · u + m), converted inline
/// (F16C) where the build has it: an out-of-line conversion per group and row halves the decode GEMV.
inline float min_at(const Int4Weights& w, int64_t f) {
#if (SQ_W4_AVX512 || SQ_W4_AVX2) && defined(__F16C__)
  return _cvtsh_ss(w.mins_f16[static_cast<size_t>(f)]);
#else
  return half_to_float(w.mins_f16[static_cast<size_t>(f)]);
#endif
}

/// Row o of the dequantized weight matrix into row[w.in]: Δ[o, j] · (q[o, k] − z[o, j]), exact (an
/// FP16 step times an integer of at most 4 bits); with a float minimum Δ · u + m in one rounding.
/// Whole groups (the kernels' copy); symmetric codes are read as u = q + 8 (nibble XOR 8) with
/// z = 8, the same products.
void dequant_row(const Int4Weights& w, int64_t o, float* row) {
  const int64_t ng = w.in / w.group;
  const uint8_t* p = w.packed.data() + o * (w.in / 2);
  const uint8_t flip = w.asym ? 0 : 0x88;
  for (int64_t j = 0; j < ng; ++j) {
    const int64_t f = o * ng + j;
    const float d = half_to_float(w.scales_f16[static_cast<size_t>(f)]);
    if (w.float_min()) {  // Δ · u + m, one rounding (as GGML's Q4_1 / Q4_K dequantization)
      const float m = min_at(w, f);
      for (int64_t k = j * w.group; k < (j + 1) * w.group; k += 2) {
        row[k] = std::fma(d, static_cast<float>(p[k / 2] & 0xF), m);
        row[k + 1] = std::fma(d, static_cast<float>(p[k / 2] >> 4), m);
      }
      continue;
    }
    const int z = w.asym ? zero_at(w, f) : 8;
    for (int64_t k = j * w.group; k < (j + 1) * w.group; k += 2) {
      const uint8_t b = p[k / 2] ^ flip;
      row[k] = d * static_cast<float>(int(b & 0xF) - z);
      row[k + 1] = d * static_cast<float>(int(b >> 4) - z);
    }
  }
}

#if SQ_W4_AVX512

inline float scale_at(const Int4Weights& w, int64_t idx) { return _cvtsh_ss(w.scales_f16[static_cast<size_t>(idx)]); }

/// GEMV software-prefetch distance in bytes of the packed weights (see gemv_rows). Chosen on
/// SmolLM2-135M W4A16 decode (2 threads, AMD EPYC Zen 5; tg128 tok/s, FP32 / INT8 activations):
/// 1 KiB 245 / –, 2 KiB 315 / –, 4 KiB 360 / 400, 8 KiB 370 / 427, 16 KiB 302 / –, 32 KiB 331 / –
/// (before: 8 rows ahead, ~2.5 KiB at this width, with dynamic scheduling: 236).
constexpr int64_t kPrefetchBytes = 8192;

/// Software prefetch of the cache line kPrefetchBytes ahead of byte `at` of each of the R rows (rows
/// are contiguous, so this reaches rows further down the matrix; short per-row streams ramp the
/// hardware prefetchers up too slowly when the weights come from DRAM). The GEMVs call it once per
/// 128 columns (one 64-byte line of packed weights). Never past `end`, the end of the weights.
template <int R>
inline void prefetch_ahead(const uint8_t* const (&rows)[R], int64_t at, const uint8_t* end) {
  for (int r = 0; r < R; ++r)
    if (rows[r] + at + kPrefetchBytes < end) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + at + kPrefetchBytes), _MM_HINT_T0);
}

/// Prefetches the packed weights [row r0, row r0 + kPrefetchBytes) of w (clipped to its end): the
/// part a GEMV starting at r0 reads before its own prefetch_ahead stream covers it. One burst of
/// independent prefetches instead of a sequence of demand misses at the start of each range.
inline void prime_rows(const Int4Weights& w, int64_t r0) {
  const int64_t begin = r0 * (w.in / 2), end = std::min<int64_t>(begin + kPrefetchBytes, static_cast<int64_t>(w.packed.size()));
  for (int64_t at = begin; at < end; at += 64) _mm_prefetch(reinterpret_cast<const char*>(w.packed.data() + at), _MM_HINT_T0);
}

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
  const uint8_t* const end = w.packed.data() + w.packed.size();
  for (int64_t j = 0; j < ng; ++j) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t col = j * g; col < (j + 1) * g; col += 32) {
      if ((col & 127) == 0) prefetch_ahead<R>(rows, col / 2, end);
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
      if (w.float_min()) {  // Δ · Σ x·u + m · Σ x
        for (int r = 0; r < R; ++r) {
          const int64_t f = (r0 + r) * ng + j;
          tot[r] = _mm512_fmadd_ps(_mm512_set1_ps(scale_at(w, f)), acc[r], _mm512_fmadd_ps(_mm512_set1_ps(min_at(w, f)), xs, tot[r]));
        }
        continue;
      }
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

#if SQ_W4_VNNI

/// One activation row rounded to INT8 for the VNNI GEMV (W4DecodeActivations::Int8). The row is cut
/// into chunks: 128 columns each, then one 64-column chunk when in mod 128 = 64. Chunk c of width
/// C ∈ {128, 64} starting at column k0: q[k0 .. k0 + C) = x_q of the chunk's even columns then its
/// odd columns (matching the low and high nibbles of the chunk's C/2 packed weight bytes);
/// scale[16c ..] and corr[16c ..] are lane vectors matching vpdpbusd's 16 dword lanes: scale = s_b of
/// the 32-column block b the lane's columns come from, corr = zz · s_b · Σ_{k∈b} x_q,k / (lanes of
/// b), zz = 8 for symmetric weights, 1 for asymmetric (the kernel multiplies by the group's zero
/// point). 128-wide chunk: lane l holds columns 8l .. 8l + 8 (4 lanes per block, block l / 4);
/// 64-wide: lanes 0–3 and 8–11 block 0, lanes 4–7 and 12–15 block 1 (8 lanes per block).
struct Int8Activation {
  int8_t* q;
  float* scale;
  float* corr;
};

/// Chunks of an in-wide row (in a multiple of 64): ⌈in / 128⌉.
inline int64_t int8_chunks(int64_t in) { return (in + 127) / 128; }

/// Rounds x[in] (in a multiple of 64) into a (see Int8Activation).
void quantize_activation_int8(const float* x, int64_t in, bool sym, Int8Activation a) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  // 64 natural columns (as bytes) → [even 32 | odd 32]
  alignas(64) uint8_t perm[64];
  for (int i = 0; i < 32; ++i) {
    perm[i] = static_cast<uint8_t>(2 * i);
    perm[32 + i] = static_cast<uint8_t>(2 * i + 1);
  }
  const __m512i idx = _mm512_load_si512(perm);
  const float zz = sym ? 8.0f : 1.0f;
  for (int64_t k0 = 0, c = 0; k0 < in; k0 += 128, ++c) {
    const int nb = in - k0 >= 128 ? 4 : 2;  // 32-column blocks in this chunk
    __m128i q8[8];
    float s[4], sum[4];
    for (int b = 0; b < nb; ++b) {
      const __m512 v0 = _mm512_loadu_ps(x + k0 + 32 * b), v1 = _mm512_loadu_ps(x + k0 + 32 * b + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
      s[b] = amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      // round to nearest even (the default MXCSR mode); |x · 127 / amax| ≤ 127 up to one rounding,
      // and the saturating pack below keeps it in [−127, 127]
      const __m512i i0 = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), _mm512_set1_epi32(-127));
      const __m512i i1 = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)), _mm512_set1_epi32(-127));
      sum[b] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)));
      q8[2 * b] = _mm512_cvtsepi32_epi8(i0);
      q8[2 * b + 1] = _mm512_cvtsepi32_epi8(i1);
    }
    // [even 32 | odd 32] of each 64-column half
    __m512i h[2];
    for (int p = 0; p < nb / 2; ++p) {
      __m512i nat = _mm512_castsi128_si512(q8[4 * p]);
      nat = _mm512_inserti32x4(nat, q8[4 * p + 1], 1);
      nat = _mm512_inserti32x4(nat, q8[4 * p + 2], 2);
      nat = _mm512_inserti32x4(nat, q8[4 * p + 3], 3);
      h[p] = _mm512_permutexvar_epi8(idx, nat);
    }
    __m512 sv, cv;
    if (nb == 4) {
      // [even 64 | odd 64] from the halves' [even 32 | odd 32]
      const __m512i ev = _mm512_inserti64x4(h[0], _mm512_castsi512_si256(h[1]), 1);
      const __m512i od = _mm512_inserti64x4(h[1], _mm512_extracti64x4_epi64(h[0], 1), 0);
      _mm512_store_si512(a.q + k0, ev);
      _mm512_store_si512(a.q + k0 + 64, od);
      alignas(64) float sl[16], cl[16];
      for (int l = 0; l < 16; ++l) {
        sl[l] = s[l / 4];
        cl[l] = zz * s[l / 4] * sum[l / 4] / 4.0f;
      }
      sv = _mm512_load_ps(sl);
      cv = _mm512_load_ps(cl);
    } else {
      _mm512_store_si512(a.q + k0, h[0]);
      const __mmask16 second = 0xF0F0;  // lanes 4–7 and 12–15
      sv = _mm512_mask_blend_ps(second, _mm512_set1_ps(s[0]), _mm512_set1_ps(s[1]));
      cv = _mm512_mask_blend_ps(second, _mm512_set1_ps(zz * s[0] * sum[0] / 8.0f), _mm512_set1_ps(zz * s[1] * sum[1] / 8.0f));
    }
    _mm512_store_ps(a.scale + c * 16, sv);
    _mm512_store_ps(a.corr + c * 16, cv);
  }
}

/// Lane vector of the per-group values v(j) for a chunk of C ∈ {128, 64} columns whose first group
/// is j0 (lane maps of Int8Activation). C = 128: G = 128 every lane v(j0); G = 64 lanes 0–7 v(j0),
/// 8–15 v(j0 + 1); G = 32 lane l v(j0 + l / 4). C = 64 (lanes 0–3 and 8–11: block 0, 4–7 and 12–15:
/// block 1): G ≥ 64 every lane v(j0); G = 32 block b v(j0 + b).
template <int G, int C, typename F>
inline __m512 group_lanes(int64_t j0, const F& v) {
  if constexpr (G >= C) return _mm512_set1_ps(v(j0));
  else if constexpr (C == 64) return _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(v(j0)), _mm512_set1_ps(v(j0 + 1)));
  else if constexpr (G == 64) return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(v(j0)), _mm512_set1_ps(v(j0 + 1)));
  else return _mm512_set_ps(v(j0 + 3), v(j0 + 3), v(j0 + 3), v(j0 + 3), v(j0 + 2), v(j0 + 2), v(j0 + 2), v(j0 + 2),
                            v(j0 + 1), v(j0 + 1), v(j0 + 1), v(j0 + 1), v(j0), v(j0), v(j0), v(j0));
}

/// The group scales as a lane vector (group_lanes) from one row's FP16 scales p = row + j0. A
/// 128-column chunk with G < 128 converts its 2 or 4 scales in one instruction (exactly those: the
/// last row's may end the array).
template <int G, int C>
inline __m512 scale_lanes(const uint16_t* p) {
  if constexpr (C == 128 && G < 128) {
    const __m128i h = G == 64 ? _mm_loadu_si32(p) : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m512 v = _mm512_castps128_ps512(_mm_cvtph_ps(h));
    const __m512i idx = G == 64 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                                : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, v);
  } else {
    return group_lanes<G, C>(0, [&](int64_t j) { return _cvtsh_ss(p[j]); });
  }
}

/// tot + Δ · Σ s_b·(u − z)·x_q for one chunk of C columns and one row: d = the chunk's vpdpbusd sums
/// Σ u·x_q (as float), sx/cz its activation lanes (Int8Activation), p = the row's FP16 scales from
/// the chunk's first group, f the flat index (r · ⌈in/G⌉ + j0) of that group's zero point
/// (asymmetric; symmetric codes have z = 8 folded into cz).
template <bool Sym, int G, int C>
inline __m512 add_chunk(__m512 tot, __m512 d, __m512 sx, __m512 cz, const uint16_t* p, const Int4Weights& w, int64_t f) {
  __m512 t;
  if constexpr (Sym) {
    t = _mm512_fmsub_ps(d, sx, cz);
  } else if (w.float_min()) {  // Δ · Σ s_b·u·x_q + m · Σ s_b·x_q (cz: s_b·Σ x_q spread over the block's lanes)
    const __m512 m = scale_lanes<G, C>(w.mins_f16.data() + f);
    return _mm512_fmadd_ps(_mm512_mul_ps(d, sx), scale_lanes<G, C>(p), _mm512_fmadd_ps(m, cz, tot));
  } else {
    const __m512 z = group_lanes<G, C>(f, [&](int64_t k) { return static_cast<float>(zero_at(w, k)); });
    t = _mm512_fnmadd_ps(z, cz, _mm512_mul_ps(d, sx));
  }
  return _mm512_fmadd_ps(t, scale_lanes<G, C>(p), tot);
}

/// GEMV over R consecutive rows from r0 with INT8 activations (Int8Activation; header comment). w.in
/// is a multiple of 64; ng = ⌈in/G⌉ also covers a ragged last group. Rows are row-major
/// (Interleaved false) or in the block-interleaved layout of interleave_for_int8_decode.
template <int R, bool Sym, int G, bool Interleaved>
void gemv_rows_int8(const Int4Weights& w, const Int8Activation& a, int64_t r0, float* y) {
  const int64_t in = w.in, ng = (in + G - 1) / G, half_in = in / 2, full = in / 128;
  const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(Sym ? 0x08 : 0x00);
  const uint8_t* const end = w.packed.data() + w.packed.size();
  const uint8_t* const base = w.packed.data() + r0 * half_in;  // the block's bytes, in either layout
  const int64_t step = Interleaved ? 64 * R : 64;               // bytes from a row's chunk c to c + 1
  const uint16_t* scales[R];
  const uint8_t* rows[R];  // chunk 0 of each row
  __m512 tot[R];
  for (int r = 0; r < R; ++r) {
    tot[r] = _mm512_setzero_ps();
    rows[r] = Interleaved ? base + 64 * r : base + r * half_in;
    scales[r] = w.scales_f16.data() + (r0 + r) * ng;
  }
  for (int64_t c = 0; c < full; ++c) {
    const int64_t col = c * 128, j0 = col / G;
    prefetch_ahead<R>(rows, c * step, end);
    const __m512i xe = _mm512_load_si512(a.q + col), xo = _mm512_load_si512(a.q + col + 64);
    const __m512 sx = _mm512_load_ps(a.scale + c * 16);
    const __m512 cz = _mm512_load_ps(a.corr + c * 16);
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_loadu_si512(rows[r] + c * step);
      // unsigned codes u = (byte ^ flip) & 0x0F (vpternlogd truth table 0x28): symmetric codes are
      // 4-bit two's complement q, and u = q + 8 is the nibble with its top bit flipped
      const __m512i lo = _mm512_ternarylogic_epi32(b, flip, nib, 0x28);
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, 4), flip, nib, 0x28);
      const __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe), hi, xo));
      tot[r] = add_chunk<Sym, G, 128>(tot[r], d, sx, cz, scales[r] + j0, w, (r0 + r) * ng + j0);
    }
  }
  if (in % 128 != 0) {  // one 64-column chunk
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);  // upper half: >> 4
    const int64_t col = full * 128, j0 = col / G;
    const __m512i xv = _mm512_load_si512(a.q + col);
    const __m512 sx = _mm512_load_ps(a.scale + full * 16);
    const __m512 cz = _mm512_load_ps(a.corr + full * 16);
    for (int r = 0; r < R; ++r) {
      const uint8_t* tail = Interleaved ? base + full * step + 32 * r : rows[r] + col / 2;
      const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tail)));
      const __m512i u = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(b, shift), flip, nib, 0x28);
      const __m512 d = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv));
      tot[r] = add_chunk<Sym, G, 64>(tot[r], d, sx, cz, scales[r] + j0, w, (r0 + r) * ng + j0);
    }
  }
  for (int r = 0; r < R; ++r) y[r0 + r] = _mm512_reduce_add_ps(tot[r]);
}

template <bool Sym, int G, bool Interleaved>
void gemv_block_int8(const Int4Weights& w, const Int8Activation& a, int64_t r0, float* y) {
  switch (std::min<int64_t>(4, w.out - r0)) {
    case 4: gemv_rows_int8<4, Sym, G, Interleaved>(w, a, r0, y); break;
    case 3: gemv_rows_int8<3, Sym, G, Interleaved>(w, a, r0, y); break;
    case 2: gemv_rows_int8<2, Sym, G, Interleaved>(w, a, r0, y); break;
    default: gemv_rows_int8<1, Sym, G, Interleaved>(w, a, r0, y); break;
  }
}

/// gemv_block_int8 for either layout of w (interleaved: decode_, interleave_for_int8_decode).
template <bool Sym, int G>
void gemv_block_int8_layout(const Int4Weights& w, const Int8Activation& a, int64_t r0, float* y, bool interleaved) {
  if (interleaved) gemv_block_int8<Sym, G, true>(w, a, r0, y);
  else gemv_block_int8<Sym, G, false>(w, a, r0, y);
}

#endif  // SQ_W4_VNNI

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
          dv[l] = d;
          if (!Sym && w.float_min()) {
            dzv[l] = l < valid ? -min_at(w, (o0 + l) * ng + j) : 0.0f;  // Δ·u − (−m): GGML's one rounding
            continue;
          }
          const float z = l < valid ? (Sym ? 8.0f : static_cast<float>(zero_at(w, (o0 + l) * ng + j))) : 0.0f;
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
    std::memcpy(p.packed.mutable_data() + r * dst_row, w.packed.data() + r * src_row, static_cast<size_t>(src_row));
  return p;
}

/// The INT8 decode GEMV's copy of w (w.in a multiple of 64): the same bytes, permuted within each
/// block of R = min(4, rows left) rows, which still occupies bytes [r0 · in/2, (r0 + R) · in/2):
///
///   block base + (c · R + r) · 64       the 64 bytes of 128-column chunk c of row r0 + r
///   block base + full · R · 64 + r · 32  the last 64 columns of row r0 + r when in mod 128 = 64
///
/// (full = ⌊in/128⌋). With in mod 128 = 64 a row-major row is a whole number of 64-byte lines only
/// every other row; here every chunk load is one aligned line (a block is R · in/2 bytes, a multiple
/// of 128), and a block is read front to back. Scales and zero points are unchanged.
Int4Weights interleave_for_int8_decode(const Int4Weights& w) {
  Int4Weights d = w;
  const int64_t half_in = w.in / 2, full = w.in / 128;
  for (int64_t r0 = 0; r0 < w.out; r0 += 4) {
    const int64_t R = std::min<int64_t>(4, w.out - r0);
    uint8_t* base = d.packed.mutable_data() + r0 * half_in;
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* src = w.packed.data() + (r0 + r) * half_in;
      for (int64_t c = 0; c < full; ++c) std::memcpy(base + (c * R + r) * 64, src + c * 64, 64);
      if (w.in % 128 != 0) std::memcpy(base + full * R * 64 + r * 32, src + full * 64, 32);
    }
  }
  return d;
}

}  // namespace

namespace {

/// x [n, in] copied into dst [n, in_padded] with the extra columns zero; returns dst.
float* padded_input(const float* x, int64_t n, int64_t in, int64_t in_padded, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * in_padded, x + i * in, static_cast<size_t>(in) * sizeof(float));
    std::fill(dst + i * in_padded + in, dst + (i + 1) * in_padded, 0.0f);
  }
  return dst;
}

/// y[n, out] += bias[out] per row (nothing when bias is empty).
void add_bias(const Tensor& bias, int64_t n, int64_t out, float* y) {
  if (bias.empty()) return;
  const float* b = bias.data();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) y[i * out + o] += b[o];
}

#if SQ_W4_AVX512
/// The FP32 GEMV's activation order: per 32-column chunk, even columns then odd columns (xp [in]);
/// xsum [in/g][16]: lane-wise Σ of xp over each group.
void permute_activation(const float* x, int64_t in, int64_t g, float* xp, float* xsum) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t j = 0; j < in / g; ++j) {
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
}
#endif


#if SQ_W4_AVX2
/// The AVX2 GEMV's activation order: per 16-column chunk, even columns then odd columns (xp [in],
/// matching the low and high nibbles of the chunk's 8 packed bytes); xsum [in/g][8]: lane-wise Σ of
/// xp over each group.
void permute_activation_avx2(const float* x, int64_t in, int64_t g, float* xp, float* xsum) {
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // per 8 columns: evens | odds
  for (int64_t j = 0; j < in / g; ++j) {
    __m256 s = _mm256_setzero_ps();
    for (int64_t col = j * g; col < (j + 1) * g; col += 16) {
      const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + col), even);      // a0 a2 a4 a6 | a1 a3 a5 a7
      const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + col + 8), even);  // b0 b2 b4 b6 | b1 b3 b5 b7
      const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20), hi = _mm256_permute2f128_ps(a, b, 0x31);
      _mm256_store_ps(xp + col, lo);
      _mm256_store_ps(xp + col + 8, hi);
      s = _mm256_add_ps(s, _mm256_add_ps(lo, hi));
    }
    _mm256_store_ps(xsum + j * 8, s);
  }
}

inline float hsum256(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/// AVX2 GEMV over R consecutive rows starting at r0 (xp, xsum from permute_activation_avx2). Each
/// 8-byte load of a packed row (16 weights) is widened to 8 dwords; the low nibbles (even columns)
/// and high nibbles (odd columns) become floats by an int→float conversion of the unsigned code u
/// (symmetric codes are stored two's complement: u = q + 8 = nibble ^ 8, one XOR per load), so the
/// FMAs accumulate Σ x·u per group and each group is closed as Δ · (Σ x·u − z · Σ x) with z = 8
/// (symmetric) or the group's zero point. Four rows share each activation load.
template <int R>
void gemv_rows_avx2(const Int4Weights& w, const float* xp, const float* xsum, int64_t r0, float* y) {
  const int64_t in = w.in, g = w.group, ng = in / g, half_in = in / 2;
  const __m256i nib = _mm256_set1_epi32(0xF);
  const __m128i flip = _mm_set1_epi8(w.asym ? 0 : static_cast<char>(0x88));
  __m256 tot[R];
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    tot[r] = _mm256_setzero_ps();
    rows[r] = w.packed.data() + (r0 + r) * half_in;
  }
  for (int64_t j = 0; j < ng; ++j) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t col = j * g; col < (j + 1) * g; col += 16) {
      const __m256 xl = _mm256_load_ps(xp + col), xh = _mm256_load_ps(xp + col + 8);
      for (int r = 0; r < R; ++r) {
        const __m128i b = _mm_xor_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[r] + col / 2)), flip);
        const __m256i v = _mm256_cvtepu8_epi32(b);
        acc[r] = _mm256_fmadd_ps(xl, _mm256_cvtepi32_ps(_mm256_and_si256(v, nib)), acc[r]);
        acc[r] = _mm256_fmadd_ps(xh, _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), acc[r]);
      }
    }
    const __m256 xs = _mm256_load_ps(xsum + j * 8);
    for (int r = 0; r < R; ++r) {
      // Δ and z inline (F16C's exact FP16 → FP32; the out-of-line int4_scale / int4_zero calls took
      // 13% of SmolLM2's g32 decode).
      const int64_t f = (r0 + r) * ng + j;
#if defined(__F16C__)
      const float d = _cvtsh_ss(w.scales_f16[static_cast<size_t>(f)]);
#else
      const float d = half_to_float(w.scales_f16[static_cast<size_t>(f)]);
#endif
      if (w.float_min()) {  // Δ · Σ x·u + m · Σ x
        tot[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), acc[r], _mm256_fmadd_ps(_mm256_set1_ps(min_at(w, f)), xs, tot[r]));
        continue;
      }
      const __m256 z = _mm256_set1_ps(static_cast<float>(w.asym ? zero_at(w, f) : 8));
      tot[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_fnmadd_ps(z, xs, acc[r]), tot[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r0 + r] = hsum256(tot[r]);
}

void gemv_block_avx2(const Int4Weights& w, const float* xp, const float* xsum, int64_t r0, float* y) {
  switch (std::min<int64_t>(4, w.out - r0)) {
    case 4: gemv_rows_avx2<4>(w, xp, xsum, r0, y); break;
    case 3: gemv_rows_avx2<3>(w, xp, xsum, r0, y); break;
    case 2: gemv_rows_avx2<2>(w, xp, xsum, r0, y); break;
    default: gemv_rows_avx2<1>(w, xp, xsum, r0, y); break;
  }
}
#endif

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

bool w4_int8_decode_supported() {
#if SQ_W4_VNNI
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         __builtin_cpu_supports("avx512vbmi");
  return ok;
#else
  return false;
#endif
}

void W4A16Linear::set_decode_activations(W4DecodeActivations a) {
  if (a == W4DecodeActivations::Int8 && !w4_int8_decode_supported())
    throw std::invalid_argument("W4A16 INT8 decode activations need AVX512-VNNI and AVX512-VBMI (not in this build or CPU)");
  decode_act_ = (a == W4DecodeActivations::Int8 && w_.in % 64 != 0) ? W4DecodeActivations::Fp32 : a;
  // Rows of in mod 128 = 64 columns: the decode GEMV reads a block-interleaved copy of the stored
  // (unpadded) codes instead of w_ (no zero columns streamed, every load one aligned line).
  if (decode_act_ == W4DecodeActivations::Int8 && in_ % 128 == 64) decode_ = interleave_for_int8_decode(weights());
  else decode_ = Int4Weights{};
}

std::string W4A16Linear::format() const {
  if (w_.k_quant()) return "w4a16-q4_k";
  return "w4a16-g" + std::to_string(w_.group) + (w_.asym ? (w_.float_min() ? "-asym-fmin" : "-asym") : "-sym");
}

void W4A16Linear::forward(const float* x, int64_t n, float* y) const {
  if (n < 0) throw std::invalid_argument("W4A16Linear::forward: negative row count " + std::to_string(n));
  if (n == 0) return;
  if (n == 1) {
    forward_batch1({{this, y}}, x);
    return;
  }
  if (in_ != w_.in) x = padded_input(x, n, in_, w_.in, scratch<float, 4>(n * w_.in));
  gemm(x, n, y);
  add_bias(bias_, n, w_.out, y);
}

void W4A16Linear::forward_batch1(std::span<const std::pair<const W4A16Linear*, float*>> linears, const float* x) {
  constexpr size_t kMax = 4;
  if (linears.size() == 0) return;
  if (linears.size() > kMax) throw std::invalid_argument("W4A16Linear::forward_batch1: at most 4 linears, got " + std::to_string(linears.size()));
  const int64_t in = linears.begin()->first->in_;
  for (const auto& [lin, y] : linears)
    if (lin->in_ != in)
      throw std::invalid_argument("W4A16Linear::forward_batch1: input widths differ (" + std::to_string(in) + " vs " + std::to_string(lin->in_) + ")");
#if SQ_W4_AVX512
  // Each linear's activation in its kernel's layout, in per-slot buffers of the calling thread (the
  // other threads of the region below read them).
  struct Slot {
    const W4A16Linear* lin;
    float* y;
    int64_t first_block;  // global index of this linear's first 4-row block
    bool int8;
    const Int4Weights* w;   // the weights the kernel reads: w_, or decode_ (interleave_for_int8_decode)
    const float* xp;      // FP32 kernel: permuted activation and per-group lane sums
    const float* xsum;
#if SQ_W4_VNNI
    Int8Activation a;
#endif
  };
  static thread_local std::vector<float> fbuf[kMax][3];
  static thread_local std::vector<int8_t> qbuf[kMax];
  Slot slots[kMax]{};
  int64_t blocks = 0, macs = 0;
  size_t ns = 0;
  for (const auto& [lin, y] : linears) {
    Slot& s = slots[ns];
    s.lin = lin;
    s.y = y;
    s.first_block = blocks;
    s.int8 = lin->decode_act_ == W4DecodeActivations::Int8;
    s.w = s.int8 && !lin->decode_.packed.empty() ? &lin->decode_ : &lin->w_;
    const Int4Weights& w = *s.w;
    // Linears of the same layout (q/k/v, gate/up) share one prepared activation.
    const Slot* same = nullptr;
    for (size_t k = 0; k < ns && !same; ++k) {
      const Int4Weights& wk = *slots[k].w;
      if (slots[k].int8 == s.int8 && wk.in == w.in && wk.asym == w.asym && (s.int8 || wk.group == w.group)) same = &slots[k];
    }
    const float* xk = same || lin->in_ == w.in ? x : padded_input(x, 1, lin->in_, w.in, aligned_buffer(fbuf[ns][0], w.in));
    if (same) {
#if SQ_W4_VNNI
      s.a = same->a;
#endif
      s.xp = same->xp;
      s.xsum = same->xsum;
    } else if (s.int8) {
#if SQ_W4_VNNI
      const int64_t chunks = int8_chunks(w.in);
      s.a = Int8Activation{aligned_buffer(qbuf[ns], w.in), aligned_buffer(fbuf[ns][1], chunks * 16), aligned_buffer(fbuf[ns][2], chunks * 16)};
      quantize_activation_int8(xk, w.in, !w.asym, s.a);
#endif
    } else {
      float* xp = aligned_buffer(fbuf[ns][1], w.in);
      float* xsum = aligned_buffer(fbuf[ns][2], w.in / w.group * 16);
      permute_activation(xk, w.in, w.group, xp, xsum);
      s.xp = xp;
      s.xsum = xsum;
    }
    blocks += (w.out + 3) / 4;
    macs += w.in * w.out;
    ++ns;
  }
  // One 4-row block of slot s's linear, from row r0.
  const auto run_block = [](const Slot& s, const Int4Weights& w, int64_t r0) {
    const bool sym = !w.asym;
#if SQ_W4_VNNI
    if (s.int8) {
      const bool interleaved = s.w == &s.lin->decode_;
      switch (w.group) {
        case 32: (sym ? gemv_block_int8_layout<true, 32> : gemv_block_int8_layout<false, 32>)(w, s.a, r0, s.y, interleaved); break;
        case 64: (sym ? gemv_block_int8_layout<true, 64> : gemv_block_int8_layout<false, 64>)(w, s.a, r0, s.y, interleaved); break;
        default: (sym ? gemv_block_int8_layout<true, 128> : gemv_block_int8_layout<false, 128>)(w, s.a, r0, s.y, interleaved); break;
      }
      return;
    }
#endif
    if (sym)
      gemv_block<true>(w, s.xp, s.xsum, r0, s.y);
    else
      gemv_block<false>(w, s.xp, s.xsum, r0, s.y);
  };
  // Each thread takes one contiguous range of blocks (as schedule(static) would) and first primes
  // the start of every linear's rows it reads (prime_rows): the GEMVs prefetch kPrefetchBytes
  // ahead of the rows they read, so without it the first kPrefetchBytes of each range would arrive
  // by demand misses, once per linear, thread and token.
#pragma omp parallel if (macs >= kParallelMinMacs && blocks > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b_begin = blocks * t / nt, b_end = blocks * (t + 1) / nt;
    size_t i = 0;
    for (int64_t b = b_begin; b < b_end; ++b) {
      while (i + 1 < ns && b >= slots[i + 1].first_block) ++i;
      const Slot& s = slots[i];
      const Int4Weights& w = *s.w;
      const int64_t r0 = (b - s.first_block) * 4;
      if (b == b_begin || b == s.first_block) prime_rows(w, r0);
      run_block(s, w, r0);
    }
  }
#elif SQ_W4_AVX2
  // As the AVX-512 path: the linears' 4-row blocks in one region, one contiguous range per thread.
  static thread_local std::vector<float> fbuf[kMax][3];
  const float* xps[kMax];
  const float* xsums[kMax];
  int64_t first_block[kMax + 1] = {0};
  int64_t macs = 0;
  for (size_t i = 0; i < linears.size(); ++i) {
    const W4A16Linear* lin = linears[i].first;
    const Int4Weights& w = lin->w_;
    const float* xk = lin->in_ == w.in ? x : padded_input(x, 1, lin->in_, w.in, aligned_buffer(fbuf[i][0], w.in));
    float* xp = aligned_buffer(fbuf[i][1], w.in);
    float* xsum = aligned_buffer(fbuf[i][2], w.in / w.group * 8);
    permute_activation_avx2(xk, w.in, w.group, xp, xsum);
    xps[i] = xp;
    xsums[i] = xsum;
    first_block[i + 1] = first_block[i] + (w.out + 3) / 4;
    macs += w.in * w.out;
  }
  const size_t ns = linears.size();
  const int64_t blocks = first_block[ns];
#pragma omp parallel if (macs >= kParallelMinMacs && blocks > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    size_t i = 0;
    for (int64_t b = blocks * t / nt; b < blocks * (t + 1) / nt; ++b) {
      while (i + 1 < ns && b >= first_block[i + 1]) ++i;
      gemv_block_avx2(linears[i].first->w_, xps[i], xsums[i], (b - first_block[i]) * 4, linears[i].second);
    }
  }
#else
  for (const auto& [lin, y] : linears) {
    const float* xk = lin->in_ != lin->w_.in ? padded_input(x, 1, lin->in_, lin->w_.in, scratch<float, 4>(lin->w_.in)) : x;
    lin->forward_scalar(xk, 1, y);
  }
#endif
  for (const auto& [lin, y] : linears) add_bias(lin->bias_, 1, lin->w_.out, y);
}

void W4A16Linear::forward_scalar(const float* x, int64_t n, float* y) const {
  const int64_t in = w_.in, out = w_.out;
#pragma omp parallel for schedule(static) if (n * in * out >= kParallelMinMacs && out > 1)
  for (int64_t o = 0; o < out; ++o) {
    float* row = scratch<float, 0>(in);
    dequant_row(w_, o, row);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * in;
      float acc = 0.0f;
      for (int64_t k = 0; k < in; ++k) acc += xi[k] * row[k];
      y[i * out + o] = acc;
    }
  }
}

#if SQ_W4_AVX512

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

void W4A16Linear::gemm(const float* x, int64_t n, float* y) const {
  const int64_t in = w_.in, out = w_.out;
  if (n * in * out < kParallelMinMacs) {
    forward_scalar(x, n, y);
    return;
  }
  // Blocks of ops::kLinearBlockRows output rows, as ops::linear_sgemm: the partition depends on the
  // shape alone and each block's sgemm runs on one thread, so results do not depend on the thread
  // count.
  const int64_t rows = ops::kLinearBlockRows;
  const int64_t blocks = (out + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o0 = b * rows, m = std::min(rows, out - o0);
    float* W = scratch<float, 3>(m * in);
    for (int64_t o = 0; o < m; ++o) dequant_row(w_, o0 + o, W + o * in);
    ops::sgemm(false, true, n, m, in, 1.0f, x, in, W, in, 0.0f, y + o0, out);  // y[:, o0 .. o0+m) = x · W_blockᵀ
  }
}

#endif

}  // namespace sq
