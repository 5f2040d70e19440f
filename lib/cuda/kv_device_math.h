// Element math of the CUDA KV cache (lib/cuda/cuda_kv_cache.h) as inline functions that both nvcc
// (device code, __host__ __device__) and the host compiler (g++, the CPU tests) compile, so the
// exact arithmetic the kernels use is unit-tested on every machine against the CPU codecs
// (quant/kv_codec.h, quant/packed_bits.h, quant/codebook_quantize.h, formats/safetensors.h).
//
// Every function here reproduces one CPU formula operation by operation (same operand order, same
// precision, no fused multiply-adds where the CPU has none), so that a row encoded on the device
// has the same bytes as the CPU codec's encoding of it. Plain C++17: cuda_kv_kernels.cu is compiled
// as C++17. No CUDA headers: device-only intrinsics are used under __CUDA_ARCH__ only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/host_device.h"

namespace sq::kvdev {

/// Marks an element that becomes a sparse outlier in the per-row code buffer of the encoder (codes
/// are < 2^bits ≤ 256 only after outliers are resolved; 0xFF never reaches the packed row).
constexpr uint8_t kOutlierMark = 0xFF;

/// Largest finite FP16 value: non-finite nuq inputs are clamped to ±65504 (KVQuant codec rule).
constexpr float kHalfMax = 65504.0f;

SQ_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

SQ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

SQ_HD bool is_finite(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

/// IEEE binary16 bits → FP32, exact; the same function as sq::half_to_float (formats/safetensors.h).
SQ_HD float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = float(mant) * 0x1p-24f;  // zero or subnormal: exact
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
  return bits_float(bits);
}

/// FP32 → IEEE binary16 bits, round to nearest even, overflow to ±inf, NaN kept quiet; bit-identical
/// to sq::float_to_half (formats/safetensors.h).
SQ_HD uint16_t float_to_half(float value) {
  const uint32_t f = float_bits(value);
  const uint16_t sign = uint16_t((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    if (a == 0x7f800000u) return uint16_t(sign | 0x7c00u);
    return uint16_t(sign | 0x7e00u | ((a & 0x7fffffu) >> 13));
  }
  if (a >= 0x47800000u) return uint16_t(sign | 0x7c00u);
  const uint32_t e = a >> 23;
  if (e < 113) {
    if (e < 102) return sign;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    const uint32_t r = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (r > halfway || (r == halfway && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
  const uint32_t r = a & 0x1fffu;
  if (r > 0x1000u || (r == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

/// FP16 rounding of an FP32 value: half_to_float(float_to_half(x)).
SQ_HD float round_to_half(float x) { return half_to_float(float_to_half(x)); }

/// Little-endian uint16 at p (p need not be aligned), as the CPU codecs' memcpy reads it.
SQ_HD uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
SQ_HD void store_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xffu);
  p[1] = uint8_t(v >> 8);
}

/// Element i of a packed b-bit stream (LSB first, quant/packed_bits.h): the same as sq::packed_get.
SQ_HD unsigned packed_code(const uint8_t* packed, int64_t i, int bits) {
  const int64_t p = i * bits;
  const int64_t byte = p >> 3;
  const int off = int(p & 7);
  unsigned v = unsigned(packed[byte]) >> off;
  if (off + bits > 8) v |= unsigned(packed[byte + 1]) << (8 - off);
  return v & ((1u << bits) - 1u);
}

/// Byte `byte` of the packed stream of codes[0..n) (each < 2^bits, bits ∈ [1, 8]): the OR of the
/// parts of every element whose bits [e·bits, (e+1)·bits) overlap stream bits [8·byte, 8·byte + 8);
/// bits past the last element are 0. Writing every byte this way gives pack_bits' result over a
/// zeroed buffer, with one writer per byte (no read-modify-write races between threads).
SQ_HD uint8_t pack_byte(const uint8_t* codes, int64_t n, int bits, int64_t byte) {
  const int64_t bit0 = byte * 8;
  unsigned out = 0;
  for (int64_t e = bit0 / bits; e < n && e * bits < bit0 + 8; ++e) {
    const int64_t start = e * bits - bit0;  // position of the element's bit 0 in this byte (may be < 0)
    const unsigned v = codes[e];
    out |= start >= 0 ? (v << start) : (v >> (-start));
  }
  return uint8_t(out & 0xffu);
}

// ---- uniform intX (quant/kv_uniform_codec.cpp) ----------------------------------------------------

/// Per-group parameters of the uniform codec from the group's finite min `lo` and max `hi`
/// (lo > hi when the group holds no finite value): z16/d16 are the stored FP16 zero point (= lo)
/// and step Δ = (hi − z)/(2^b − 1), z/delta their FP32 values; delta = 0 (d16 = 0) for a constant
/// or empty group. Same operations as UniformCodec::encode.
struct UniformGroup {
  uint16_t z16, d16;
  float z, delta, lo, hi;
};
SQ_HD UniformGroup uniform_group(float lo, float hi, float qmax) {
  if (!(lo <= hi)) lo = hi = 0.0f;
  UniformGroup g;
  g.lo = lo;
  g.hi = hi;
  g.z16 = float_to_half(lo);
  g.z = half_to_float(g.z16);
  g.d16 = float_to_half((hi - g.z) / qmax);
  g.delta = half_to_float(g.d16);
  if (!(g.delta > 0.0f) || !is_finite(g.delta)) {
    g.delta = 0.0f;
    g.d16 = 0;
  }
  return g;
}

/// Code of x in its group: clamp(round_half_even((x − z)/Δ), 0, qmax), non-finite x replaced by the
/// group's max (+) or min (−); 0 when Δ = 0. rint / nearbyint both round half to even.
SQ_HD unsigned uniform_code(float x, const UniformGroup& g, float qmax) {
  if (!(g.delta > 0.0f)) return 0;
  const float v = is_finite(x) ? x : (x > 0 ? g.hi : g.lo);
  float q = rintf((v - g.z) / g.delta);
  q = q < 0.0f ? 0.0f : q;  // std::clamp(q, 0, qmax); NaN cannot occur (v, z, Δ finite)
  q = q > qmax ? qmax : q;
  return unsigned(q);
}

// ---- KVQuant nuqX (quant/kv_nuq_codec.cpp, quant/codebook_quantize.cpp) ---------------------------

/// Non-finite inputs are clamped to ±65504 before normalization (NuqCodec::encode).
SQ_HD float nuq_input(float x) { return is_finite(x) ? x : (x > 0 ? kHalfMax : -kHalfMax); }

/// Normalized value a = (v − offset)/scale (0 when scale ≤ 0), v = nuq_input(x).
SQ_HD float nuq_normalize(float v, float offset, float scale) { return scale > 0.0f ? (v - offset) / scale : 0.0f; }

/// Nearest-signpost code of a (|a| ≤ 1 after clamping; never NaN) exactly as
/// CodebookQuantizer::encode: branchless binary search counting the midpoints < a (in double) over
/// `mids` [k] (midpoints of the distinct signposts padded with +inf, k = 2^bits), then the first
/// codebook index of that distinct signpost (`first_of` [k]). Ties go to the lower index.
SQ_HD unsigned nearest_signpost(float a, const double* mids, const uint8_t* first_of, int k) {
  const double xd = a;
  int idx = 0;
  for (int step = k >> 1; step > 0; step >>= 1) idx += (mids[idx + step - 1] < xd) ? step : 0;
  return first_of[idx];
}

/// The clamp of NuqCodec::encode: std::clamp(a, −1, 1).
SQ_HD float clamp_unit(float a) { return a < -1.0f ? -1.0f : (a > 1.0f ? 1.0f : a); }

/// Double-precision fma(f, b − a, a) (one explicit fused multiply-add, independent of contraction
/// flags), then rounded to float: the interpolation of kv_percentile.
SQ_HD float lerp_percentile(float a, float b, double f) {
#if defined(__CUDA_ARCH__)
  return float(__fma_rn(f, __dsub_rn(double(b), double(a)), double(a)));
#else
  return static_cast<float>(std::fma(f, static_cast<double>(b) - a, static_cast<double>(a)));
#endif
}

/// Percentile q of n ≥ 1 values sorted ascending (sorted[0..n)), linear interpolation
/// (numpy.percentile's default): the same arithmetic as kv_percentile (quant/kv_codec.h).
SQ_HD float sorted_percentile(const float* sorted, int64_t n, double q) {
#if defined(__CUDA_ARCH__)
  const double pos = __dmul_rn(q, double(n - 1));
#else
  const double pos = q * static_cast<double>(n - 1);
#endif
  const int64_t i = int64_t(floor(pos));
  const double frac = pos - double(i);
  const float a = sorted[i];
  if (frac == 0.0 || i + 1 >= n) return a;
  return lerp_percentile(a, sorted[i + 1], frac);
}

/// Per-token nuq scaling from thresholds lo/hi (kv_token_scaling): offset = (hi + lo)/2 and
/// scale = (hi − lo)/2, each rounded to FP16.
SQ_HD void token_scaling(float lo, float hi, float& offset, float& scale) {
  offset = round_to_half(0.5f * (hi + lo));
  scale = round_to_half(0.5f * (hi - lo));
}

/// One compare-exchange step of an ascending bitonic sort (Batcher 1968) of buf[0..n), n a power of
/// two, for stage size k and distance j: element i (with partner i ^ j > i) is swapped with its
/// partner when out of order for its direction. The pairs of one (k, j) step are disjoint, so the
/// device runs them in parallel and the CPU test serially with the same result.
SQ_HD void bitonic_step(float* buf, int64_t i, int64_t k, int64_t j) {
  const int64_t p = i ^ j;
  if (p <= i) return;
  const float a = buf[i], b = buf[p];
  const bool ascending = (i & k) == 0;
  if (ascending ? (a > b) : (a < b)) {
    buf[i] = b;
    buf[p] = a;
  }
}

// ---- sparse outliers ------------------------------------------------------------------------------

/// A sparse outlier as the device stores it: channel in the low 16 bits, FP16 value in the high 16
/// (the memory image of KVOutlier {channel, value_f16} on a little-endian machine).
SQ_HD uint32_t outlier_entry(unsigned channel, uint16_t value_f16) { return uint32_t(channel) | (uint32_t(value_f16) << 16); }
SQ_HD unsigned outlier_channel(uint32_t e) { return e & 0xffffu; }
SQ_HD uint16_t outlier_value(uint32_t e) { return uint16_t(e >> 16); }

/// Index of the entry for `channel` in entries[0..n) (channel ascending), or −1: binary search.
SQ_HD int find_outlier(const uint32_t* entries, int n, unsigned channel) {
  int lo = 0, hi = n;  // search [lo, hi)
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const unsigned c = outlier_channel(entries[mid]);
    if (c == channel) return mid;
    if (c < channel) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

// ---- RoPE -------------------------------------------------------------------------------------------

/// Channels (a, b) of rotation pair i within a head: (2i, 2i+1) interleaved, (i, i + d/2) half-split.
SQ_HD void rope_pair(bool interleaved, int i, int half, int& a, int& b) {
  a = interleaved ? 2 * i : i;
  b = interleaved ? 2 * i + 1 : i + half;
}

/// Channels (a, b) of pair i (i < half = head_dim/2) of a head under partial rotary embedding over
/// its first 2·rot_half channels (ops::rope's rot_dim overload, rot_dim = 2·rot_half ≤ head_dim):
/// i < rot_half is a rotated pair, (2i, 2i+1) interleaved or (i, i + rot_half) half-split; the
/// other pairs (2i, 2i+1) cover the channels 2·rot_half … head_dim−1, which are not rotated.
/// Returns whether pair i is rotated (by inv_freq[i]). Over i < half the pairs cover every channel
/// of the head exactly once; rot_half = half is rope_pair's full rotation, rot_half = 0 (no RoPE)
/// rotates nothing.
SQ_HD bool rope_channel_pair(bool interleaved, int i, int rot_half, int& a, int& b) {
  if (i < rot_half) {
    rope_pair(interleaved, i, rot_half, a, b);
    return true;
  }
  a = 2 * i;
  b = 2 * i + 1;
  return false;
}

/// The RoPE angle of ops::rope: float(position) · inv_freq (one FP32 multiply).
SQ_HD float rope_angle(int64_t position, float inv_freq) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(float(position), inv_freq);
#else
  return static_cast<float>(position) * inv_freq;
#endif
}

}  // namespace sq::kvdev
