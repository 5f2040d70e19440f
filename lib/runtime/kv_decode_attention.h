// Fused decode attention over a KVQuant nuqX cache: one query token attends to every cached row of
// one layer while reading the packed codes directly (KVQuant, Hooper et al. 2024, §3.2 pre-RoPE
// keys with RoPE applied on the fly, §3.3 non-uniform codebooks, §3.4 dense-and-sparse outliers,
// §3.6 FP16 attention sinks, §3.7 per-channel / per-token scaling; the paper's custom decode
// kernels, §4 "Kernel Implementation", compute the same quantities).
//
// For query head h (KV head g = h / (n_heads / n_kv_heads)) and cache rows j = 0 … rows−1:
//   s_hj = q_h · R(δ_j) k̂_gj / √d,   δ_j = j − (position row j's key was rotated at when stored)
//   p_hj = softmax_j(s_hj),           out_h = Σ_j p_hj v̂_gj
// with k̂ = cb_K[code]·scale + offset (per-channel offline scaling, or per-token FP16 scaling) and
// v̂ = cb_V[code]·s_j + o_j (per-token FP16 scaling after the codes), R(δ) the RoPE rotation of the
// model's layout (interleaved pairs (2i, 2i+1) or half-split pairs (i, i+d/2)) at angle δ·θ_i,
// θ_i = the model's inverse frequency of pair i (KVCache::rope_inv_freq: theta^(−2i/d), RoPE
// scaling applied). Outliers replace their dense element; sink rows are FP16.
//
// What is never built: FP32 K or V for the whole cache. The AVX-512 path (compile-time, __AVX512F__)
// turns 16 packed codes into 16 FP32 codebook entries with one 16-entry table lookup
// (_mm512_permutexvar_ps), dequantizes and rotates them in registers with a per-position cos/sin
// table shared by all heads and layers, and visits each row's codes once for all query heads of
// a KV head; values accumulate Σ_j (p_hj·s_j)·cb_V[code] plus Σ_j p_hj·o_j once per head. Sparse
// outliers are added as exact corrections and sink rows are dequantized one at a time. The
// portable scalar path decodes one row of one layer at a time (width floats) instead.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kv_cache.h"

namespace sq {

/// Reusable buffers of nuq_decode_attention (one per thread). Holds the RoPE cos/sin table, its
/// inverse frequencies and head width checked on every call, grown to the largest position
/// distance seen.
struct KVDecodeScratch {
  std::vector<float> scores;  ///< [rows, n_heads] scores, then probabilities
  std::vector<float> rope_cos, rope_sin;  ///< [positions, head_dim/2] cos/sin(p·inv_freq_i) as ops::rope computes them
  int64_t rope_positions = 0;
  std::vector<float> rope_inv_freq;  ///< [head_dim/2] the frequencies the table was built for
  int rope_dim = 0;
  std::vector<float> query;  ///< [n_heads, head_dim] q / √d
  std::vector<const uint8_t*> key_rows, value_rows;  ///< [rows] dense row bytes, null for sink rows
  std::vector<int32_t> delta;  ///< [rows] rotation still to apply to each key
  std::vector<float> key_scale, key_offset, value_scale, value_offset;  ///< [rows] per-token FP16 scaling
  std::vector<float> row;  ///< [kv width] one decoded row
  /// 4-bit interleaved fast path: per 32 channels, the 16 even then the 16 odd channels (the RoPE
  /// pairs' first and second elements, as one byte's low and high nibbles hold them)
  std::vector<float> query_pairs, key_scale_pairs, key_offset_pairs, value_acc;
  std::vector<float> offset_sum;  ///< [n_heads] Σ_j p_hj·o_j
};

/// Which implementation nuq_decode_attention uses.
enum class KVDecodeIsa {
  Auto,    ///< AVX-512 when compiled with it and the shapes fit (head_dim a multiple of 16, or of 32
           ///< for half-split RoPE; ≤ 4 bits; ≤ 16 query heads per KV head), else scalar
  Scalar,  ///< the portable scalar path (tests compare the two)
};

/// Decode attention of one query token over rows [0, rows) of layer `layer` of a nuq `cache`.
/// q [n_heads·head_dim] FP32, head-major, already rotated at its own position (rows − 1 for a
/// decode step); out [n_heads·head_dim] FP32 receives softmax(q·Kᵀ/√d)·V per head (every row is
/// visible: the query is the last row). When `attention_mass` is given, Σ_h p_hj is added to
/// (*attention_mass)[j] (resized to `rows` if shorter), as Decoder's attention does for H2O.
/// Runs on all OpenMP threads when not already inside a parallel region and the work is large.
/// Returns false, touching nothing, when the cache is not a nuq cache, its layers do not all rotate
/// every channel with the same frequencies (uniform_full_rope), or n_heads is not a multiple
/// of its KV heads (the caller then runs the generic KVCache::read + attention path); otherwise
/// computes the result and returns true. Throws std::out_of_range for a bad layer or rows ∉
/// [1, cache.rows_written()].
bool nuq_decode_attention(const KVCache& cache, int layer, int64_t rows, const float* q, int n_heads, float* out,
                          KVDecodeScratch& scratch, std::vector<double>* attention_mass = nullptr,
                          KVDecodeIsa isa = KVDecodeIsa::Auto);

/// Whether nuq_decode_attention with KVDecodeIsa::Auto takes the AVX-512 path for this cache and
/// head count (false when built without AVX-512 or when the shapes do not fit).
bool nuq_decode_attention_uses_simd(const KVCache& cache, int n_heads);

}  // namespace sq
