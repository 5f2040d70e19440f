#include "runtime/kv_decode_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__AVX512F__)
#include "core/immintrin_quiet.h"
#endif

#include "formats/safetensors.h"  // half_to_float
#include "ops/fast_exp.h"
#include "quant/packed_bits.h"

namespace sq {
namespace {

/// Everything one call needs, resolved once.
struct Plan {
  int n_heads = 0, n_kv = 0, hd = 0, half = 0, group = 0, bits = 0;
  int64_t rows = 0, width = 0, k_code_bytes = 0, v_code_bytes = 0;
  bool per_channel = true;  ///< keys: offline per-channel scaling (else per-token FP16)
  RopeLayout layout = RopeLayout::Interleaved;
  const float* cbk = nullptr;  ///< key codebook [2^bits]
  const float* cbv = nullptr;  ///< value codebook [2^bits]
  const float* ks = nullptr;   ///< per-channel key scale [width]
  const float* ko = nullptr;   ///< per-channel key offset [width]
  const float* cos = nullptr;  ///< [positions, half]
  const float* sin = nullptr;
  KVCache::LayerStorage st{};
  const int32_t* slots = nullptr;
  KVDecodeScratch* sc = nullptr;
  float* scores = nullptr;  ///< [rows, n_heads] (row-major: one row's heads are contiguous)
  bool nibbles = false;     ///< 4-bit interleaved fast path (KVDecodeScratch::query_pairs layout)
};

/// cos/sin(p·inv_freq_i) for p < positions, with the angle computed exactly as ops::rope computes
/// it (float position × float inverse frequency, from the cache's rope_inv_freq(layer)), so rotations
/// match KVCache::read bit for bit.
void ensure_rope_table(KVDecodeScratch& sc, int64_t positions, int hd, const std::vector<float>& inv_freq) {
  if (sc.rope_dim != hd || sc.rope_inv_freq != inv_freq) {
    sc.rope_positions = 0;
    sc.rope_dim = hd;
    sc.rope_inv_freq = inv_freq;
  }
  if (positions <= sc.rope_positions) return;
  const int half = hd / 2;
  const int64_t grow = std::max(positions, 2 * sc.rope_positions);  // amortized growth
  sc.rope_cos.resize(static_cast<size_t>(grow * half));
  sc.rope_sin.resize(static_cast<size_t>(grow * half));
  for (int64_t p = sc.rope_positions; p < grow; ++p)
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      sc.rope_cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
      sc.rope_sin[static_cast<size_t>(p * half + i)] = std::sin(angle);
    }
  sc.rope_positions = grow;
}

/// Channels (a, b) of rotation pair i within a head.
inline void pair_channels(const Plan& P, int i, int& a, int& b) {
  a = P.layout == RopeLayout::Interleaved ? 2 * i : i;
  b = P.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + P.half;
}

/// Rotates one head's key x [hd] by δ positions (ops::rope's formula; δ may be negative).
void rotate_head(const Plan& P, float* x, int32_t delta) {
  if (delta == 0) return;
  const int64_t d = std::abs(static_cast<int64_t>(delta));
  const float sg = delta < 0 ? -1.0f : 1.0f;
  const float* c = P.cos + d * P.half;
  const float* s = P.sin + d * P.half;
  for (int i = 0; i < P.half; ++i) {
    int a, b;
    pair_channels(P, i, a, b);
    const float x0 = x[a], x1 = x[b], si = sg * s[i];
    x[a] = x0 * c[i] - x1 * si;
    x[b] = x0 * si + x1 * c[i];
  }
}

/// x [width] = the FP16 values at src (an attention-sink row).
void decode_f16_row(const uint8_t* src, int64_t width, float* x) {
  for (int64_t c = 0; c < width; ++c) {
    uint16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    x[c] = half_to_float(h);
  }
}

/// Decodes key row j of the layer (all KV heads, before the rotation) into x [width].
void decode_key_row(const Plan& P, int64_t j, float* x) {
  const int32_t slot = P.slots[j];
  if (slot < 0) {
    decode_f16_row(P.st.sink_keys + static_cast<size_t>(-1 - slot) * static_cast<size_t>(2 * P.width), P.width, x);
    return;
  }
  const uint8_t* src = P.sc->key_rows[static_cast<size_t>(j)];
  if (P.per_channel) {
    for (int64_t c = 0; c < P.width; ++c) x[c] = P.cbk[packed_get(src, c, P.bits)] * P.ks[c] + P.ko[c];
  } else {
    const float s = P.sc->key_scale[static_cast<size_t>(j)], o = P.sc->key_offset[static_cast<size_t>(j)];
    for (int64_t c = 0; c < P.width; ++c) x[c] = P.cbk[packed_get(src, c, P.bits)] * s + o;
  }
  if (P.st.key_outliers)
    for (const KVOutlier& e : (*P.st.key_outliers)[static_cast<size_t>(slot)]) x[e.channel] = half_to_float(e.value_f16);
}

/// Decodes value row j into x [width].
void decode_value_row(const Plan& P, int64_t j, float* x) {
  const int32_t slot = P.slots[j];
  if (slot < 0) {
    decode_f16_row(P.st.sink_values + static_cast<size_t>(-1 - slot) * static_cast<size_t>(2 * P.width), P.width, x);
    return;
  }
  const uint8_t* src = P.sc->value_rows[static_cast<size_t>(j)];
  const float s = P.sc->value_scale[static_cast<size_t>(j)], o = P.sc->value_offset[static_cast<size_t>(j)];
  for (int64_t c = 0; c < P.width; ++c) x[c] = P.cbv[packed_get(src, c, P.bits)] * s + o;
  if (P.st.value_outliers)
    for (const KVOutlier& e : (*P.st.value_outliers)[static_cast<size_t>(slot)]) x[e.channel] = half_to_float(e.value_f16);
}

/// Scores of row j for every query head from its decoded (unrotated) key row x [width]; x is
/// rotated in place.
void score_decoded_row(const Plan& P, int64_t j, float* x) {
  const float* q = P.sc->query.data();
  for (int g = 0; g < P.n_kv; ++g) {
    float* k = x + int64_t(g) * P.hd;
    rotate_head(P, k, P.sc->delta[static_cast<size_t>(j)]);
    for (int hh = 0; hh < P.group; ++hh) {
      const int h = g * P.group + hh;
      const float* qh = q + int64_t(h) * P.hd;
      float s = 0.0f;
      for (int c = 0; c < P.hd; ++c) s += qh[c] * k[c];
      P.scores[j * P.n_heads + h] = s;
    }
  }
}

/// out_h += p_hj · v_gj for every query head, from a decoded value row v [width].
void accumulate_decoded_row(const Plan& P, int64_t j, const float* v, float* out) {
  for (int h = 0; h < P.n_heads; ++h) {
    const float p = P.scores[j * P.n_heads + h];
    const float* vg = v + int64_t(h / P.group) * P.hd;
    float* oh = out + int64_t(h) * P.hd;
    for (int c = 0; c < P.hd; ++c) oh[c] += p * vg[c];
  }
}

void scalar_keys(const Plan& P) {
  float* x = P.sc->row.data();
  for (int64_t j = 0; j < P.rows; ++j) {
    decode_key_row(P, j, x);
    score_decoded_row(P, j, x);
  }
}

void scalar_values(const Plan& P, float* out) {
  float* x = P.sc->row.data();
  for (int64_t j = 0; j < P.rows; ++j) {
    decode_value_row(P, j, x);
    accumulate_decoded_row(P, j, x, out);
  }
}

#if defined(__AVX512F__)
constexpr bool kHaveSimd = true;

/// Byte shuffle and per-lane shifts that turn 16 consecutive B-bit codes (2·B bytes, LSB first,
/// quant/packed_bits.h) into 16 32-bit lanes whose low B bits are the codes: lane i takes the
/// 16-bit window starting at byte ⌊B·i/8⌋ and shifts it right by (B·i) mod 8 (the high 128-bit
/// lane of the shuffle holds a copy of the bytes: its indices are lane-relative).
template <int B>
struct Unpack16 {
  __m256i shuffle;
  __m512i shift;
  Unpack16()
      : shuffle(_mm256_setr_epi8((B * 0) / 8, (B * 0) / 8 + 1, (B * 1) / 8, (B * 1) / 8 + 1, (B * 2) / 8, (B * 2) / 8 + 1, (B * 3) / 8, (B * 3) / 8 + 1, (B * 4) / 8, (B * 4) / 8 + 1, (B * 5) / 8, (B * 5) / 8 + 1, (B * 6) / 8, (B * 6) / 8 + 1, (B * 7) / 8, (B * 7) / 8 + 1, (B * 8) / 8, (B * 8) / 8 + 1, (B * 9) / 8, (B * 9) / 8 + 1, (B * 10) / 8, (B * 10) / 8 + 1, (B * 11) / 8, (B * 11) / 8 + 1, (B * 12) / 8, (B * 12) / 8 + 1, (B * 13) / 8, (B * 13) / 8 + 1, (B * 14) / 8, (B * 14) / 8 + 1, (B * 15) / 8, (B * 15) / 8 + 1)),
        shift(_mm512_setr_epi32((B * 0) % 8, (B * 1) % 8, (B * 2) % 8, (B * 3) % 8, (B * 4) % 8, (B * 5) % 8, (B * 6) % 8, (B * 7) % 8, (B * 8) % 8, (B * 9) % 8, (B * 10) % 8, (B * 11) % 8, (B * 12) % 8, (B * 13) % 8, (B * 14) % 8, (B * 15) % 8)) {}
  /// Codes in the low B bits of each lane; higher bits hold neighbouring codes, which the periodic
  /// 16-entry lookup table ignores.
  __m512i operator()(const uint8_t* p) const {
    uint64_t w;
    if constexpr (B == 3) {  // 6 bytes as 4 + 2 (a 6-byte memcpy may become a library call)
      uint32_t lo;
      uint16_t hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + 4, 2);
      w = lo | (uint64_t(hi) << 32);
    } else if constexpr (B == 2) {
      uint32_t lo;
      std::memcpy(&lo, p, 4);
      w = lo;
    } else {
      std::memcpy(&w, p, 8);
    }
    const __m256i y = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_cvtsi64_si128(static_cast<long long>(w))), shuffle);
    return _mm512_srlv_epi32(_mm512_cvtepu16_epi32(y), shift);
  }
};

/// 16-entry table lut[i] = cb[i mod 2^B]: _mm512_permutexvar_ps reads index bits [3:0] only.
template <int B>
__m512 periodic_lut(const float* cb) {
  alignas(64) float t[16];
  for (int i = 0; i < 16; ++i) t[i] = cb[i & ((1 << B) - 1)];
  return _mm512_load_ps(t);
}

/// Scores of the dense rows j ∈ [j0, j1): dequantize 16 channels per lookup, rotate them by δ_j in
/// registers (interleaved: r = C'⊙k + S'⊙swap(k) with C' = (c_i, c_i), S' = (−s_i, s_i) per pair;
/// half-split: r_a = k_a c − k_b s, r_b = k_a s + k_b c), then dot with every query head of the KV
/// head. Sparse outliers are corrected afterwards (outlier_corrections).
template <int B, bool Interleaved, bool PerChannel>
void simd_keys(const Plan& P, int64_t j0, int64_t j1) {
  const Unpack16<B> unpack;
  const __m512 lut = periodic_lut<B>(P.cbk);
  const int hd = P.hd, nv = hd / 16, pairs_per_vec = Interleaved ? 8 : 16;
  const int64_t head_bytes = int64_t(hd) * B / 8;
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const float* q = P.sc->query.data();
  __m512 C[16] = {}, S[16] = {}, r[16] = {};  // nv ≤ 16 (head_dim ≤ 256)
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = P.sc->key_rows[static_cast<size_t>(j)];
    if (!row) continue;  // sink row: scored by the scalar code
    const int32_t delta = P.sc->delta[static_cast<size_t>(j)];
    const int64_t d = std::abs(static_cast<int64_t>(delta));
    const float sg = delta < 0 ? -1.0f : 1.0f;
    const float* cr = P.cos + d * P.half;
    const float* sr = P.sin + d * P.half;
    // Rotation coefficients of this position, shared by all heads.
    const int ncoef = Interleaved ? nv : nv / 2;
    if constexpr (Interleaved) {
      const __m512 sign = _mm512_set_ps(sg, -sg, sg, -sg, sg, -sg, sg, -sg, sg, -sg, sg, -sg, sg, -sg, sg, -sg);
      for (int m = 0; m < ncoef; ++m) {
        C[m] = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cr + pairs_per_vec * m)));
        S[m] = _mm512_mul_ps(sign, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sr + pairs_per_vec * m))));
      }
    } else {
      const __m512 sign = _mm512_set1_ps(sg);
      for (int m = 0; m < ncoef; ++m) {
        C[m] = _mm512_loadu_ps(cr + pairs_per_vec * m);
        S[m] = _mm512_mul_ps(sign, _mm512_loadu_ps(sr + pairs_per_vec * m));
      }
    }
    __m512 tok_s = _mm512_setzero_ps(), tok_o = _mm512_setzero_ps();
    if constexpr (!PerChannel) {
      tok_s = _mm512_set1_ps(P.sc->key_scale[static_cast<size_t>(j)]);
      tok_o = _mm512_set1_ps(P.sc->key_offset[static_cast<size_t>(j)]);
    }
    for (int g = 0; g < P.n_kv; ++g) {
      const uint8_t* codes = row + g * head_bytes;
      const int64_t c0 = int64_t(g) * hd;
      auto dequant = [&](int m) {
        const __m512 w = _mm512_permutexvar_ps(unpack(codes + 2 * B * m), lut);
        if constexpr (PerChannel)
          return _mm512_fmadd_ps(w, _mm512_loadu_ps(P.ks + c0 + 16 * m), _mm512_loadu_ps(P.ko + c0 + 16 * m));
        else
          return _mm512_fmadd_ps(w, tok_s, tok_o);
      };
      if constexpr (Interleaved) {
        for (int m = 0; m < nv; ++m) {
          const __m512 k = dequant(m);
          r[m] = _mm512_fmadd_ps(S[m], _mm512_permute_ps(k, 0xB1), _mm512_mul_ps(C[m], k));
        }
      } else {
        const int nh = nv / 2;
        for (int m = 0; m < nh; ++m) {
          const __m512 ka = dequant(m), kb = dequant(m + nh);
          r[m] = _mm512_fmsub_ps(ka, C[m], _mm512_mul_ps(kb, S[m]));
          r[m + nh] = _mm512_fmadd_ps(ka, S[m], _mm512_mul_ps(kb, C[m]));
        }
      }
      for (int hh = 0; hh < P.group; ++hh) {
        const int h = g * P.group + hh;
        const float* qh = q + int64_t(h) * hd;
        __m512 acc0 = _mm512_mul_ps(_mm512_loadu_ps(qh), r[0]), acc1 = _mm512_setzero_ps();
        int m = 1;
        for (; m + 1 < nv; m += 2) {
          acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * m), r[m], acc1);
          acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * (m + 1)), r[m + 1], acc0);
        }
        if (m < nv) acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * m), r[m], acc1);
        P.scores[j * P.n_heads + h] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
      }
    }
  }
}

/// out_h += Σ_j coef_hj · cb_V[code_gj] (coef = p_hj·s_j) for the query heads of KV heads
/// [g0, g1), over the dense rows in order: each row's codes are read once, sequentially, for all
/// query heads of a KV head, and the accumulators (out, [n_heads, head_dim]) stay in L1.
template <int B>
void simd_values_rows(const Plan& P, int g0, int g1, float* out) {
  const Unpack16<B> unpack;
  const __m512 lut = periodic_lut<B>(P.cbv);
  const int hd = P.hd, nv = hd / 16, group = P.group;
  const int64_t head_bytes = int64_t(hd) * B / 8;
  __m512 cf[16];  // group ≤ 16
  for (int64_t j = 0; j < P.rows; ++j) {
    const uint8_t* row = P.sc->value_rows[static_cast<size_t>(j)];
    if (!row) continue;  // sink row: accumulated by the scalar code
    for (int g = g0; g < g1; ++g) {
      const uint8_t* codes = row + g * head_bytes;
      for (int hh = 0; hh < group; ++hh) cf[hh] = _mm512_set1_ps(P.scores[j * P.n_heads + g * group + hh]);
      float* og = out + int64_t(g) * group * hd;
      for (int m = 0; m < nv; ++m) {
        const __m512 w = _mm512_permutexvar_ps(unpack(codes + 2 * B * m), lut);
        for (int hh = 0; hh < group; ++hh) {
          float* o = og + int64_t(hh) * hd + 16 * m;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(cf[hh], w, _mm512_loadu_ps(o)));
        }
      }
    }
  }
}

/// 4-bit codes with interleaved RoPE: 16 bytes hold channels 32m … 32m+31, the low nibbles the
/// even channels (first elements of RoPE pairs 16m … 16m+15) and the high nibbles the odd ones,
/// so one zero-extension and two lookups give both halves of 16 pairs, rotated lane-wise with the
/// table's cos/sin of those pairs. Query, key scale and offset are in the same pairs layout.
template <bool PerChannel>
void simd_keys_nibbles(const Plan& P, int64_t j0, int64_t j1) {
  const __m512 lut = periodic_lut<4>(P.cbk);
  const int hd = P.hd, nb = hd / 32, nv = hd / 16;
  const int64_t head_bytes = hd / 2;
  const float* q = P.sc->query_pairs.data();
  const float* ks = P.sc->key_scale_pairs.data();
  const float* ko = P.sc->key_offset_pairs.data();
  __m512 r[16] = {};  // nv ≤ 16 (head_dim ≤ 256)
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = P.sc->key_rows[static_cast<size_t>(j)];
    if (!row) continue;  // sink row: scored by the scalar code
    const int32_t delta = P.sc->delta[static_cast<size_t>(j)];
    const int64_t d = std::abs(static_cast<int64_t>(delta));
    const __m512 sg = _mm512_set1_ps(delta < 0 ? -1.0f : 1.0f);
    const float* cr = P.cos + d * P.half;
    const float* sr = P.sin + d * P.half;
    __m512 tok_s = _mm512_setzero_ps(), tok_o = _mm512_setzero_ps();
    if constexpr (!PerChannel) {
      tok_s = _mm512_set1_ps(P.sc->key_scale[static_cast<size_t>(j)]);
      tok_o = _mm512_set1_ps(P.sc->key_offset[static_cast<size_t>(j)]);
    }
    for (int g = 0; g < P.n_kv; ++g) {
      const uint8_t* codes = row + g * head_bytes;
      const int64_t c0 = int64_t(g) * hd;
      for (int m = 0; m < nb; ++m) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * m)));
        const __m512 we = _mm512_permutexvar_ps(b, lut), wo = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
        __m512 ka, kb;
        if constexpr (PerChannel) {
          ka = _mm512_fmadd_ps(we, _mm512_loadu_ps(ks + c0 + 32 * m), _mm512_loadu_ps(ko + c0 + 32 * m));
          kb = _mm512_fmadd_ps(wo, _mm512_loadu_ps(ks + c0 + 32 * m + 16), _mm512_loadu_ps(ko + c0 + 32 * m + 16));
        } else {
          ka = _mm512_fmadd_ps(we, tok_s, tok_o);
          kb = _mm512_fmadd_ps(wo, tok_s, tok_o);
        }
        const __m512 C = _mm512_loadu_ps(cr + 16 * m), S = _mm512_mul_ps(sg, _mm512_loadu_ps(sr + 16 * m));
        r[2 * m] = _mm512_fmsub_ps(ka, C, _mm512_mul_ps(kb, S));
        r[2 * m + 1] = _mm512_fmadd_ps(ka, S, _mm512_mul_ps(kb, C));
      }
      for (int hh = 0; hh < P.group; ++hh) {
        const int h = g * P.group + hh;
        const float* qh = q + int64_t(h) * hd;
        __m512 acc0 = _mm512_mul_ps(_mm512_loadu_ps(qh), r[0]), acc1 = _mm512_mul_ps(_mm512_loadu_ps(qh + 16), r[1]);
        for (int m = 2; m < nv; m += 2) {
          acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * m), r[m], acc0);
          acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * (m + 1)), r[m + 1], acc1);
        }
        P.scores[j * P.n_heads + h] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
      }
    }
  }
}

/// Values with 4-bit codes: acc (pairs layout, [n_heads, head_dim]) += Σ_j coef_hj · cb_V[code]
/// for the query heads of KV heads [g0, g1), 32 channels per 16-byte load.
void simd_values_nibbles(const Plan& P, int g0, int g1, float* acc) {
  const __m512 lut = periodic_lut<4>(P.cbv);
  const int hd = P.hd, nb = hd / 32, group = P.group;
  const int64_t head_bytes = hd / 2;
  __m512 cf[16];  // group ≤ 16
  for (int64_t j = 0; j < P.rows; ++j) {
    const uint8_t* row = P.sc->value_rows[static_cast<size_t>(j)];
    if (!row) continue;
    for (int g = g0; g < g1; ++g) {
      const uint8_t* codes = row + g * head_bytes;
      for (int hh = 0; hh < group; ++hh) cf[hh] = _mm512_set1_ps(P.scores[j * P.n_heads + g * group + hh]);
      float* og = acc + int64_t(g) * group * hd;
      for (int m = 0; m < nb; ++m) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * m)));
        const __m512 we = _mm512_permutexvar_ps(b, lut), wo = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
        for (int hh = 0; hh < group; ++hh) {
          float* o = og + int64_t(hh) * hd + 32 * m;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(cf[hh], we, _mm512_loadu_ps(o)));
          _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(cf[hh], wo, _mm512_loadu_ps(o + 16)));
        }
      }
    }
  }
}

template <int B>
void simd_keys_dispatch(const Plan& P, int64_t j0, int64_t j1) {
  const bool il = P.layout == RopeLayout::Interleaved;
  if (il && P.per_channel) simd_keys<B, true, true>(P, j0, j1);
  else if (il) simd_keys<B, true, false>(P, j0, j1);
  else if (P.per_channel) simd_keys<B, false, true>(P, j0, j1);
  else simd_keys<B, false, false>(P, j0, j1);
}

void simd_keys_range(const Plan& P, int64_t j0, int64_t j1) {
  if (P.nibbles) {
    if (P.per_channel) simd_keys_nibbles<true>(P, j0, j1);
    else simd_keys_nibbles<false>(P, j0, j1);
    return;
  }
  switch (P.bits) {
    case 2: simd_keys_dispatch<2>(P, j0, j1); break;
    case 3: simd_keys_dispatch<3>(P, j0, j1); break;
    default: simd_keys_dispatch<4>(P, j0, j1); break;
  }
}

void simd_values(const Plan& P, int g0, int g1, float* out) {
  if (P.nibbles) {  // accumulates into KVDecodeScratch::value_acc (pairs layout) instead
    simd_values_nibbles(P, g0, g1, P.sc->value_acc.data());
    return;
  }
  switch (P.bits) {
    case 2: simd_values_rows<2>(P, g0, g1, out); break;
    case 3: simd_values_rows<3>(P, g0, g1, out); break;
    default: simd_values_rows<4>(P, g0, g1, out); break;
  }
}
#else
constexpr bool kHaveSimd = false;
void simd_keys_range(const Plan&, int64_t, int64_t) {}
void simd_values(const Plan&, int, int, float*) {}
#endif

bool simd_fits(int bits, int hd, RopeLayout layout, int group) {
  return kHaveSimd && bits >= 2 && bits <= 4 && hd <= 256 && group <= 16 &&
         (layout == RopeLayout::Interleaved ? hd % 16 == 0 : hd % 32 == 0);
}

/// Exact corrections of the SIMD scores for sparse key outliers: the dense code of an outlier
/// channel decodes to x_d; its true value x adds q · R(δ)(x − x_d)e_c to the score.
void key_outlier_corrections(const Plan& P) {
  if (!P.st.key_outliers) return;
  const float* q = P.sc->query.data();
  for (int64_t j = 0; j < P.rows; ++j) {
    const int32_t slot = P.slots[j];
    if (slot < 0) continue;
    const uint8_t* src = P.sc->key_rows[static_cast<size_t>(j)];
    const int32_t delta = P.sc->delta[static_cast<size_t>(j)];
    const int64_t d = std::abs(static_cast<int64_t>(delta));
    const float sg = delta < 0 ? -1.0f : 1.0f;
    for (const KVOutlier& e : (*P.st.key_outliers)[static_cast<size_t>(slot)]) {
      const int64_t c = e.channel;
      const float dense = P.per_channel ? P.cbk[packed_get(src, c, P.bits)] * P.ks[c] + P.ko[c]
                                        : P.cbk[packed_get(src, c, P.bits)] * P.sc->key_scale[static_cast<size_t>(j)] +
                                              P.sc->key_offset[static_cast<size_t>(j)];
      const float diff = half_to_float(e.value_f16) - dense;
      const int g = static_cast<int>(c / P.hd), i = static_cast<int>(c % P.hd);
      const int pi = P.layout == RopeLayout::Interleaved ? i / 2 : i % P.half;
      const bool is_a = P.layout == RopeLayout::Interleaved ? i % 2 == 0 : i < P.half;
      int a, b;
      pair_channels(P, pi, a, b);
      const float cs = P.cos[d * P.half + pi], sn = sg * P.sin[d * P.half + pi];
      // R(δ)·diff·e_a = diff·(c e_a + s e_b);  R(δ)·diff·e_b = diff·(−s e_a + c e_b)
      const float ra = is_a ? diff * cs : -diff * sn, rb = is_a ? diff * sn : diff * cs;
      for (int hh = 0; hh < P.group; ++hh) {
        const int h = g * P.group + hh;
        const float* qh = q + int64_t(h) * P.hd;
        P.scores[j * P.n_heads + h] += qh[a] * ra + qh[b] * rb;
      }
    }
  }
}

/// src [blocks·32] → dst in the pairs layout: per 32 values, the 16 even-indexed then the 16 odd.
void to_pairs(const float* src, int64_t n, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += 32)
    for (int i = 0; i < 16; ++i) {
      dst[static_cast<size_t>(b + i)] = src[b + 2 * i];
      dst[static_cast<size_t>(b + 16 + i)] = src[b + 2 * i + 1];
    }
}

/// Softmax of every column of s [rows, cols] (ops::softmax_row's arithmetic: subtract the max,
/// ops::fast_exp, multiply by 1/Σ), vectorized across the columns.
void softmax_columns(float* s, int64_t rows, int cols) {
  std::vector<float> m(static_cast<size_t>(cols), -INFINITY), sum(static_cast<size_t>(cols), 0.0f);
  float* mp = m.data();
  float* sp = sum.data();
  for (int64_t j = 0; j < rows; ++j) {
    const float* r = s + j * cols;
#pragma omp simd
    for (int h = 0; h < cols; ++h) mp[h] = std::max(mp[h], r[h]);
  }
  for (int64_t j = 0; j < rows; ++j) {
    float* r = s + j * cols;
#pragma omp simd
    for (int h = 0; h < cols; ++h) {
      r[h] = ops::fast_exp(r[h] - mp[h]);
      sp[h] += r[h];
    }
  }
  for (int h = 0; h < cols; ++h) sp[h] = 1.0f / sp[h];
  for (int64_t j = 0; j < rows; ++j) {
    float* r = s + j * cols;
#pragma omp simd
    for (int h = 0; h < cols; ++h) r[h] *= sp[h];
  }
}

}  // namespace

bool nuq_decode_attention_uses_simd(const KVCache& cache, int n_heads) {
  if (cache.spec().kind != KVKind::Nuq || cache.n_kv_heads() <= 0 || n_heads % cache.n_kv_heads() != 0) return false;
  return simd_fits(cache.spec().bits, cache.head_dim(), cache.rope_layout(), n_heads / cache.n_kv_heads());
}

bool nuq_decode_attention(const KVCache& cache, int layer, int64_t rows, const float* q, int n_heads, float* out,
                          KVDecodeScratch& sc, std::vector<double>* attention_mass, KVDecodeIsa isa) {
  if (cache.spec().kind != KVKind::Nuq || n_heads <= 0 || cache.n_kv_heads() <= 0 || n_heads % cache.n_kv_heads() != 0 ||
      !cache.uniform_full_rope())
    return false;
  if (rows < 1 || rows > cache.rows_written())
    throw std::out_of_range("nuq decode attention over " + std::to_string(rows) + " rows; " +
                            std::to_string(cache.rows_written()) + " written");
  Plan P;
  P.st = cache.layer_storage(layer);  // throws std::out_of_range for a bad layer
  const NuqLayerParams& np = *cache.nuq_params(layer);
  P.n_heads = n_heads;
  P.n_kv = cache.n_kv_heads();
  P.hd = cache.head_dim();
  P.half = P.hd / 2;
  P.group = n_heads / P.n_kv;
  P.bits = cache.spec().bits;
  P.rows = rows;
  P.width = cache.kv_width();
  P.k_code_bytes = packed_bytes_for(P.width, P.bits);
  P.v_code_bytes = P.k_code_bytes;
  P.per_channel = cache.spec().key_axis == KVKeyAxis::PerChannel;
  P.layout = cache.rope_layout();
  P.cbk = np.key_codebook.data();
  P.cbv = np.value_codebook.data();
  P.ks = np.key_scale.data();
  P.ko = np.key_offset.data();
  P.slots = cache.row_slots();
  P.sc = &sc;

  // Per-row bookkeeping: row bytes, the rotation still to apply, per-token FP16 scaling.
  const size_t R = static_cast<size_t>(rows);
  sc.key_rows.resize(R);
  sc.value_rows.resize(R);
  sc.delta.resize(R);
  sc.key_scale.resize(R);
  sc.key_offset.resize(R);
  sc.value_scale.resize(R);
  sc.value_offset.resize(R);
  const int32_t* rot = cache.row_rotations();
  int64_t max_delta = 0;
  auto f16 = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return half_to_float(h);
  };
  for (int64_t j = 0; j < rows; ++j) {
    const size_t i = static_cast<size_t>(j);
    const int32_t slot = P.slots[j];
    sc.delta[i] = static_cast<int32_t>(j) - rot[j];
    max_delta = std::max(max_delta, std::abs(static_cast<int64_t>(sc.delta[i])));
    if (slot < 0) {
      sc.key_rows[i] = sc.value_rows[i] = nullptr;
      sc.key_scale[i] = sc.key_offset[i] = sc.value_scale[i] = sc.value_offset[i] = 0.0f;
      continue;
    }
    const uint8_t* kr = P.st.keys + static_cast<size_t>(slot) * static_cast<size_t>(P.st.key_row_bytes);
    const uint8_t* vr = P.st.values + static_cast<size_t>(slot) * static_cast<size_t>(P.st.value_row_bytes);
    sc.key_rows[i] = kr;
    sc.value_rows[i] = vr;
    if (!P.per_channel) {
      sc.key_scale[i] = f16(kr + P.k_code_bytes);
      sc.key_offset[i] = f16(kr + P.k_code_bytes + 2);
    }
    sc.value_scale[i] = f16(vr + P.v_code_bytes);
    sc.value_offset[i] = f16(vr + P.v_code_bytes + 2);
  }
  ensure_rope_table(sc, max_delta + 1, P.hd, cache.rope_inv_freq(layer));
  P.cos = sc.rope_cos.data();
  P.sin = sc.rope_sin.data();

  const int64_t qw = int64_t(n_heads) * P.hd;
  sc.query.resize(static_cast<size_t>(qw));
  const float scale = 1.0f / std::sqrt(static_cast<float>(P.hd));
  for (int64_t i = 0; i < qw; ++i) sc.query[static_cast<size_t>(i)] = q[i] * scale;
  sc.scores.resize(static_cast<size_t>(int64_t(n_heads) * rows));
  P.scores = sc.scores.data();
  sc.row.resize(static_cast<size_t>(P.width));

  const bool simd = isa == KVDecodeIsa::Auto && simd_fits(P.bits, P.hd, P.layout, P.group);
  P.nibbles = simd && P.bits == 4 && P.layout == RopeLayout::Interleaved && P.hd % 32 == 0;
  if (P.nibbles) {
    to_pairs(sc.query.data(), qw, sc.query_pairs);
    if (P.per_channel) {
      to_pairs(P.ks, P.width, sc.key_scale_pairs);
      to_pairs(P.ko, P.width, sc.key_offset_pairs);
    }
    sc.value_acc.assign(static_cast<size_t>(qw), 0.0f);
  }
  // Threads only when there is enough work to pay for waking them (as Decoder's attention).
  const double work = double(rows) * double(P.hd) * n_heads;
  const int threads = (omp_in_parallel() || work < double(1 << 20)) ? 1 : omp_get_max_threads();

  // --- scores ---
  if (simd) {
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (rows + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t b = 0; b < blocks; ++b) simd_keys_range(P, b * kBlock, std::min(rows, (b + 1) * kBlock));
    for (int64_t j = 0; j < rows; ++j)
      if (P.slots[j] < 0) {
        decode_key_row(P, j, sc.row.data());
        score_decoded_row(P, j, sc.row.data());
      }
    key_outlier_corrections(P);
  } else {
    scalar_keys(P);
  }

  // --- softmax over all rows (the query is the last row, so every row is visible) ---
  softmax_columns(P.scores, rows, n_heads);
  if (attention_mass) {
    if (static_cast<int64_t>(attention_mass->size()) < rows) attention_mass->resize(R, 0.0);
    for (int h = 0; h < n_heads; ++h)
      for (int64_t j = 0; j < rows; ++j) (*attention_mass)[static_cast<size_t>(j)] += P.scores[j * n_heads + h];
  }

  // --- values ---
  std::fill(out, out + qw, 0.0f);
  if (!simd) {
    scalar_values(P, out);
    return true;
  }
  // Sink rows (FP16) and sparse value outliers exactly; Σ_j p_hj·o_j per head.
  sc.offset_sum.assign(static_cast<size_t>(n_heads), 0.0f);
  for (int64_t j = 0; j < rows; ++j) {
    const int32_t slot = P.slots[j];
    if (slot < 0) {
      decode_value_row(P, j, sc.row.data());
      accumulate_decoded_row(P, j, sc.row.data(), out);
      continue;
    }
    if (!P.st.value_outliers) continue;
    const uint8_t* src = sc.value_rows[static_cast<size_t>(j)];
    for (const KVOutlier& e : (*P.st.value_outliers)[static_cast<size_t>(slot)]) {
      const int64_t c = e.channel;
      const float dense = P.cbv[packed_get(src, c, P.bits)] * sc.value_scale[static_cast<size_t>(j)] +
                          sc.value_offset[static_cast<size_t>(j)];
      const float diff = half_to_float(e.value_f16) - dense;
      const int g = static_cast<int>(c / P.hd), i = static_cast<int>(c % P.hd);
      for (int hh = 0; hh < P.group; ++hh) {
        const int h = g * P.group + hh;
        out[int64_t(h) * P.hd + i] += P.scores[j * n_heads + h] * diff;
      }
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    float* p = P.scores + j * n_heads;
    const float vo = sc.value_offset[static_cast<size_t>(j)], vs = sc.value_scale[static_cast<size_t>(j)];  // 0 for sinks
    for (int h = 0; h < n_heads; ++h) {
      sc.offset_sum[static_cast<size_t>(h)] += p[h] * vo;
      p[h] *= vs;  // coefficient of cb_V[code]
    }
  }
  // Threads take contiguous ranges of KV heads (their query heads' outputs are disjoint).
  const int parts = std::min(threads, P.n_kv);
#pragma omp parallel for schedule(static) num_threads(parts) if (parts > 1)
  for (int t = 0; t < parts; ++t) simd_values(P, t * P.n_kv / parts, (t + 1) * P.n_kv / parts, out);
  if (P.nibbles)  // back from the pairs layout
    for (int64_t b = 0; b < qw; b += 32)
      for (int i = 0; i < 16; ++i) {
        out[b + 2 * i] += sc.value_acc[static_cast<size_t>(b + i)];
        out[b + 2 * i + 1] += sc.value_acc[static_cast<size_t>(b + 16 + i)];
      }
  for (int h = 0; h < n_heads; ++h) {
    float* oh = out + int64_t(h) * P.hd;
    const float o = sc.offset_sum[static_cast<size_t>(h)];
    for (int c = 0; c < P.hd; ++c) oh[c] += o;
  }
  return true;
}

}  // namespace sq
