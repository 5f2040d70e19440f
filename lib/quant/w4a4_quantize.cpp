#include "quant/w4a4_quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "formats/safetensors.h"
#include "quant/gemm_common.h"
#include "quant/int8_quantize.h"

#ifdef __AVX512F__
#include "core/immintrin_quiet.h"
#endif

namespace sq {

namespace {

constexpr int64_t kParallelMinElements = int64_t(1) << 22;

std::string shape_string(int64_t out, int64_t in, int64_t n_outlier, int64_t group) {
  return "[out = " + std::to_string(out) + ", in = " + std::to_string(in) + "], n_outlier = " + std::to_string(n_outlier) +
         ", g = " + std::to_string(group);
}

void check_clip(const char* what, float clip) {
  if (!(clip > 0.0f && clip <= 1.0f))
    throw std::invalid_argument(std::string(what) + ": clipping ratio " + std::to_string(clip) + " is outside (0, 1]");
}

/// Step of a normal (INT4) activation group: (clip · absmax) / 7, or 1 for an all-zero group.
inline float act_step4(float absmax, float clip) { return absmax > 0.0f ? (clip * absmax) / 7.0f : 1.0f; }

/// q[i] = clamp(round_half_even(x[i] / step), lo, hi) for `count` values; returns Σ q.
int32_t quantize_span(const float* x, int64_t count, float step, float lo, float hi, int8_t* q) {
  int64_t i = 0;
  int32_t sum = 0;
#ifdef __AVX512F__
  const __m512 vstep = _mm512_set1_ps(step), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  __m512i vsum = _mm512_setzero_si512();
  auto convert = [&](__m512 v) {
    v = _mm512_div_ps(v, vstep);
    v = _mm512_min_ps(_mm512_max_ps(v, vlo), vhi);
    return _mm512_cvtps_epi32(v);  // round half to even (MXCSR default); clamping first is equivalent (integer bounds)
  };
  for (; i + 16 <= count; i += 16) {
    const __m512i r = convert(_mm512_loadu_ps(x + i));
    vsum = _mm512_add_epi32(vsum, r);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(r));
  }
  if (i < count) {
    const __mmask16 m = static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512i r = _mm512_maskz_mov_epi32(m, convert(_mm512_maskz_loadu_ps(m, x + i)));
    vsum = _mm512_add_epi32(vsum, r);
    _mm512_mask_cvtepi32_storeu_epi8(q + i, m, r);
  }
  sum = _mm512_reduce_add_epi32(vsum);
#else
  for (; i < count; ++i) {
    float v = x[i] / step;
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    const int r = static_cast<int>(std::nearbyint(v));
    q[i] = static_cast<int8_t>(r);
    sum += r;
  }
#endif
  return sum;
}

/// max |x[src[k]]| over k < count (src[k] = −1 reads 0): the group's absmax read through the map.
float abs_max_mapped(const float* x, const int32_t* src, int64_t count) {
  int64_t k = 0;
  float m = 0.0f;
  bool finite = true;
#ifdef __AVX512F__
  const __m512i minus1 = _mm512_set1_epi32(-1);
  __m512 vm = _mm512_setzero_ps();
  for (; k < count; k += 16) {
    const __mmask16 live = count - k >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (count - k)) - 1);
    const __m512i idx = _mm512_maskz_loadu_epi32(live, src + k);
    const __mmask16 use = _mm512_mask_cmpneq_epi32_mask(live, idx, minus1);
    const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), use, idx, x, 4);
    vm = _mm512_max_ps(vm, _mm512_abs_ps(v));  // NaN: max_ps returns the second operand, caught below
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) finite = false;
  }
  m = _mm512_reduce_max_ps(vm);
#else
  for (; k < count; ++k) {
    const float v = src[k] >= 0 ? x[src[k]] : 0.0f;
    if (std::isnan(v)) finite = false;
    m = std::max(m, std::fabs(v));
  }
#endif
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

/// quantize_span of the values x[src[k]] (0 where src[k] = −1): the reorder fused into quantization.
int32_t quantize_span_mapped(const float* x, const int32_t* src, int64_t count, float step, float lo, float hi, int8_t* q) {
  int64_t k = 0;
  int32_t sum = 0;
#ifdef __AVX512F__
  const __m512i minus1 = _mm512_set1_epi32(-1);
  const __m512 vstep = _mm512_set1_ps(step), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  __m512i vsum = _mm512_setzero_si512();
  for (; k < count; k += 16) {
    const __mmask16 live = count - k >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (count - k)) - 1);
    const __m512i idx = _mm512_maskz_loadu_epi32(live, src + k);
    const __mmask16 use = _mm512_mask_cmpneq_epi32_mask(live, idx, minus1);
    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), use, idx, x, 4);
    v = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v, vstep), vlo), vhi);
    const __m512i r = _mm512_maskz_mov_epi32(live, _mm512_cvtps_epi32(v));
    vsum = _mm512_add_epi32(vsum, r);
    _mm512_mask_cvtepi32_storeu_epi8(q + k, live, r);
  }
  sum = _mm512_reduce_add_epi32(vsum);
#else
  for (; k < count; ++k) {
    float v = (src[k] >= 0 ? x[src[k]] : 0.0f) / step;
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    const int r = static_cast<int>(std::nearbyint(v));
    q[k] = static_cast<int8_t>(r);
    sum += r;
  }
#endif
  return sum;
}

}  // namespace

void check_w4a4_shape(int64_t out, int64_t in, int64_t n_outlier, int64_t group) {
  const std::string s = shape_string(out, in, n_outlier, group);
  const bool whole_row = group > 0 && group % 8 == 0 && group == in - n_outlier;
  if (group != 32 && group != 64 && group != 128 && !whole_row)
    throw std::invalid_argument("W4A4: group size g = " + std::to_string(group) +
                                " is not supported (expected 32, 64, 128, or one group per row: g = in - n_outlier, a multiple of 8); " + s);
  if (out <= 0 || in <= 0) throw std::invalid_argument("W4A4: empty weight " + s);
  if (n_outlier < 0 || n_outlier >= in)
    throw std::invalid_argument("W4A4: n_outlier must lie in [0, in), i.e. at least one INT4 group; " + s);
  if ((in - n_outlier) % group != 0)
    throw std::invalid_argument("W4A4: the group size g = " + std::to_string(group) + " does not divide the " +
                                std::to_string(in - n_outlier) + " normal channels (in = " + std::to_string(in) +
                                " minus n_outlier = " + std::to_string(n_outlier) + ")");
}

void validate_w4a4(const W4A4Weights& w) {
  check_w4a4_shape(w.out, w.in, w.n_outlier, w.group);
  auto fail = [&](const char* what, size_t got, int64_t want) {
    throw std::invalid_argument(std::string("W4A4 weights: ") + what + " holds " + std::to_string(got) + " elements, expected " +
                                std::to_string(want) + " for " + shape_string(w.out, w.in, w.n_outlier, w.group));
  };
  const int64_t inn = w.in_normal(), ng = w.groups();
  if (static_cast<int64_t>(w.packed.size()) != w.out * inn / 2) fail("packed", w.packed.size(), w.out * inn / 2);
  if (static_cast<int64_t>(w.scales_f16.size()) != w.out * ng) fail("scales_f16", w.scales_f16.size(), w.out * ng);
  if (static_cast<int64_t>(w.outlier.size()) != w.out * w.n_outlier) fail("outlier", w.outlier.size(), w.out * w.n_outlier);
  if (static_cast<int64_t>(w.outlier_scales.size()) != w.out) fail("outlier_scales", w.outlier_scales.size(), w.out);
  for (size_t i = 0; i < w.scales_f16.size(); ++i) {
    const float d = half_to_float(w.scales_f16[i]);
    if (!(std::isfinite(d) && d >= 0.0f))
      throw std::invalid_argument("W4A4 weights: scale of row " + std::to_string(int64_t(i) / ng) + " group " +
                                  std::to_string(int64_t(i) % ng) + " is " + std::to_string(d) + " (must be finite and >= 0)");
  }
  for (size_t i = 0; i < w.outlier.size(); ++i)
    if (w.outlier[i] == -128)
      throw std::invalid_argument("W4A4 weights: outlier code -128 at row " + std::to_string(int64_t(i) / w.n_outlier) +
                                  " is outside the symmetric range [-127, 127]");
  for (size_t r = 0; r < w.outlier_scales.size(); ++r)
    if (!(std::isfinite(w.outlier_scales[r]) && w.outlier_scales[r] > 0.0f))
      throw std::invalid_argument("W4A4 weights: outlier scale of row " + std::to_string(r) + " is " +
                                  std::to_string(w.outlier_scales[r]) + " (must be finite and > 0)");
}

W4A4Weights quantize_w4a4_weights(const float* w, int64_t out, int64_t in, int64_t n_outlier, int64_t group, float clip) {
  check_w4a4_shape(out, in, n_outlier, group);
  check_clip("quantize_w4a4_weights", clip);
  W4A4Weights r;
  r.out = out;
  r.in = in;
  r.n_outlier = n_outlier;
  r.group = group;
  const int64_t inn = r.in_normal(), ng = r.groups();
  r.packed.assign(static_cast<size_t>(out * inn / 2), 0);
  r.scales_f16.assign(static_cast<size_t>(out * ng), 0);
  r.outlier.assign(static_cast<size_t>(out * n_outlier), 0);
  r.outlier_scales.assign(static_cast<size_t>(out), 1.0f);
  bool bad_value = false, overflow = false;
#pragma omp parallel for schedule(static) reduction(|| : bad_value, overflow) if (out * in >= kParallelMinElements && out > 1)
  for (int64_t row = 0; row < out; ++row) {
    const float* wr = w + row * in;
    uint8_t* pr = r.packed.data() + row * (inn / 2);
    for (int64_t j = 0; j < ng; ++j) {
      const float* wg = wr + j * group;
      float amax = 0.0f;
      for (int64_t k = 0; k < group; ++k) {
        if (!std::isfinite(wg[k])) bad_value = true;
        amax = std::max(amax, std::fabs(wg[k]));
      }
      const uint16_t h = float_to_half((clip * amax) / 7.0f);
      const float d = half_to_float(h);
      if (!std::isfinite(d)) overflow = true;
      r.scales_f16[static_cast<size_t>(row * ng + j)] = h;
      for (int64_t k = 0; k < group; ++k) {
        int q = 0;
        if (d > 0.0f && std::isfinite(d)) q = static_cast<int>(std::clamp(std::round(wg[k] / d), -8.0f, 7.0f));
        const int64_t c = j * group + k;
        const uint8_t nib = static_cast<uint8_t>(q & 0xF);
        pr[c / 2] |= static_cast<uint8_t>((c & 1) ? nib << 4 : nib);
      }
    }
    if (n_outlier > 0) {
      const float amax = abs_max(wr + inn, n_outlier);
      if (!std::isfinite(amax)) {
        bad_value = true;
        continue;
      }
      const float step = amax > 0.0f ? amax / float(kInt8Max) : 1.0f;
      r.outlier_scales[static_cast<size_t>(row)] = step;
      quantize_int8(wr + inn, n_outlier, step, r.outlier.data() + row * n_outlier);
    }
  }
  if (bad_value) throw std::invalid_argument("quantize_w4a4_weights: the weight holds NaN or inf");
  if (overflow) throw std::invalid_argument("quantize_w4a4_weights: a group's step overflows FP16 (|w| too large)");
  return r;
}

W4A4Weights w4a4_weights_from_codes(int64_t out, int64_t in, int64_t n_outlier, int64_t group, const int8_t* codes4,
                                    const float* scales, const int8_t* outlier_codes, const float* outlier_scales) {
  check_w4a4_shape(out, in, n_outlier, group);
  W4A4Weights r;
  r.out = out;
  r.in = in;
  r.n_outlier = n_outlier;
  r.group = group;
  const int64_t inn = r.in_normal(), ng = r.groups();
  r.packed.assign(static_cast<size_t>(out * inn / 2), 0);
  r.scales_f16.resize(static_cast<size_t>(out * ng));
  for (int64_t row = 0; row < out; ++row)
    for (int64_t c = 0; c < inn; ++c) {
      const int q = codes4[row * inn + c];
      if (q < -8 || q > 7)
        throw std::invalid_argument("w4a4_weights_from_codes: INT4 code " + std::to_string(q) + " at row " + std::to_string(row) +
                                    " column " + std::to_string(c) + " is outside [-8, 7]");
      const uint8_t nib = static_cast<uint8_t>(q & 0xF);
      r.packed[static_cast<size_t>(row * (inn / 2) + c / 2)] |= static_cast<uint8_t>((c & 1) ? nib << 4 : nib);
    }
  for (int64_t i = 0; i < out * ng; ++i) {
    const float s = scales[i];
    const uint16_t h = float_to_half(s);
    if (!(std::isfinite(s) && s >= 0.0f) || half_to_float(h) != s)
      throw std::invalid_argument("w4a4_weights_from_codes: scale " + std::to_string(s) + " of row " + std::to_string(i / ng) +
                                  " group " + std::to_string(i % ng) + " is not a finite, non-negative FP16 value");
    r.scales_f16[static_cast<size_t>(i)] = h;
  }
  if (n_outlier > 0 && outlier_codes) r.outlier.assign(outlier_codes, outlier_codes + out * n_outlier);
  else r.outlier.assign(static_cast<size_t>(out * n_outlier), 0);
  if (outlier_scales) r.outlier_scales.assign(outlier_scales, outlier_scales + out);
  else r.outlier_scales.assign(static_cast<size_t>(out), 1.0f);
  validate_w4a4(r);
  return r;
}

W4A4Weights w4a4_weights_from_int4(const Int4Weights& normal, int64_t n_outlier, const int8_t* outlier_codes,
                                   const float* outlier_scales) {
  if (normal.asym) throw std::invalid_argument("w4a4_weights_from_int4: the INT4 part must be symmetric (Atom §4.3)");
  validate_int4(normal);
  W4A4Weights r;
  r.out = normal.out;
  r.in = normal.in + n_outlier;
  r.n_outlier = n_outlier;
  r.group = normal.group;
  check_w4a4_shape(r.out, r.in, r.n_outlier, r.group);
  r.packed.assign(normal.packed.begin(), normal.packed.end());
  r.scales_f16 = normal.scales_f16;
  if (n_outlier > 0 && outlier_codes) r.outlier.assign(outlier_codes, outlier_codes + r.out * n_outlier);
  else r.outlier.assign(static_cast<size_t>(r.out * n_outlier), 0);
  if (outlier_scales) r.outlier_scales.assign(outlier_scales, outlier_scales + r.out);
  else r.outlier_scales.assign(static_cast<size_t>(r.out), 1.0f);
  validate_w4a4(r);
  return r;
}

int w4a4_code(const W4A4Weights& w, int64_t r, int64_t c) {
  const uint8_t b = w.packed[static_cast<size_t>(r * (w.in_normal() / 2) + c / 2)];
  const int nib = (c & 1) ? b >> 4 : b & 0xF;
  return nib >= 8 ? nib - 16 : nib;
}

float w4a4_scale(const W4A4Weights& w, int64_t r, int64_t j) { return half_to_float(w.scales_f16[static_cast<size_t>(r * w.groups() + j)]); }

void dequantize_w4a4(const W4A4Weights& w, float* dst) {
  const int64_t inn = w.in_normal();
  for (int64_t r = 0; r < w.out; ++r) {
    float* row = dst + r * w.in;
    for (int64_t c = 0; c < inn; ++c) row[c] = w4a4_scale(w, r, c / w.group) * float(w4a4_code(w, r, c));
    for (int64_t c = 0; c < w.n_outlier; ++c)
      row[inn + c] = w.outlier_scales[static_cast<size_t>(r)] * float(w.outlier[static_cast<size_t>(r * w.n_outlier + c)]);
  }
}

int64_t w4a4_storage_bytes(const W4A4Weights& w) {
  return static_cast<int64_t>(w.packed.size() + 2 * w.scales_f16.size() + w.outlier.size() + 4 * w.outlier_scales.size());
}

int64_t w4a4_activation_stride(int64_t in, int64_t n_outlier) {
  return gemm::round_up(in - n_outlier + gemm::round_up(n_outlier, 4), 64);
}

namespace {

/// The per-token quantizer of quantize_w4a4_activations / _mapped. `absmax(i, c0, len)` and
/// `span(i, c0, len, step, lo, hi, q)` read kernel columns [c0, c0 + len) of token i.
template <typename AbsMax, typename Span>
void quantize_rows(int64_t m, int64_t in, int64_t n_outlier, int64_t group, float clip, W4A4Activations& out, AbsMax absmax,
                   Span span) {
  out.m = m;
  out.in = in;
  out.n_outlier = n_outlier;
  out.group = group;
  out.ld = w4a4_activation_stride(in, n_outlier);
  const int64_t inn = out.in_normal(), ng = out.groups(), ns = ng + 1, ld = out.ld;
  out.q.resize(static_cast<size_t>(m * ld));
  out.scales.resize(static_cast<size_t>(m * ns));
  out.sums.resize(static_cast<size_t>(m * ns));
  std::atomic<bool> ok{true};
#pragma omp parallel for schedule(dynamic, 16) if (m * in >= kParallelMinElements && m > 1)
  for (int64_t i = 0; i < m; ++i) {
    int8_t* qr = out.q.data() + i * ld;
    float* sr = out.scales.data() + i * ns;
    int32_t* cr = out.sums.data() + i * ns;
    bool row_ok = true;
    for (int64_t j = 0; j < ng; ++j) {
      const float amax = absmax(i, j * group, group);
      if (!std::isfinite(amax)) row_ok = false;
      const float step = std::isfinite(amax) ? act_step4(amax, clip) : 1.0f;
      sr[j] = step;
      cr[j] = span(i, j * group, group, step, -8.0f, 7.0f, qr + j * group);
    }
    if (n_outlier > 0) {
      const float amax = absmax(i, inn, n_outlier);
      if (!std::isfinite(amax)) row_ok = false;
      const float step = std::isfinite(amax) && amax > 0.0f ? amax / float(kInt8Max) : 1.0f;
      sr[ng] = step;
      cr[ng] = span(i, inn, n_outlier, step, -float(kInt8Max), float(kInt8Max), qr + inn);
    } else {
      sr[ng] = 1.0f;
      cr[ng] = 0;
    }
    std::memset(qr + in, 0, static_cast<size_t>(ld - in));
    if (!row_ok) ok.store(false, std::memory_order_relaxed);
  }
  if (!ok.load()) throw std::invalid_argument("quantize_w4a4_activations: the activations contain NaN or infinity");
}

}  // namespace

void quantize_w4a4_activations(const float* x, int64_t m, int64_t in, int64_t n_outlier, int64_t group, float clip,
                               W4A4Activations& out) {
  if (m < 0) throw std::invalid_argument("quantize_w4a4_activations: negative token count " + std::to_string(m));
  check_w4a4_shape(1, in, n_outlier, group);
  check_clip("quantize_w4a4_activations", clip);
  quantize_rows(
      m, in, n_outlier, group, clip, out, [&](int64_t i, int64_t c0, int64_t len) { return abs_max(x + i * in + c0, len); },
      [&](int64_t i, int64_t c0, int64_t len, float step, float lo, float hi, int8_t* q) {
        return quantize_span(x + i * in + c0, len, step, lo, hi, q);
      });
}

void quantize_w4a4_activations_mapped(const float* x, int64_t m, int64_t x_width, const int32_t* src, int64_t in,
                                      int64_t n_outlier, int64_t group, float clip, W4A4Activations& out) {
  if (m < 0) throw std::invalid_argument("quantize_w4a4_activations_mapped: negative token count " + std::to_string(m));
  check_w4a4_shape(1, in, n_outlier, group);
  check_clip("quantize_w4a4_activations_mapped", clip);
  check_w4a4_source_map(src, in, x_width);
  quantize_rows(
      m, in, n_outlier, group, clip, out,
      [&](int64_t i, int64_t c0, int64_t len) { return abs_max_mapped(x + i * x_width, src + c0, len); },
      [&](int64_t i, int64_t c0, int64_t len, float step, float lo, float hi, int8_t* q) {
        return quantize_span_mapped(x + i * x_width, src + c0, len, step, lo, hi, q);
      });
}

void check_w4a4_source_map(const int32_t* src, int64_t in, int64_t x_width) {
  if (x_width <= 0 || x_width > int64_t(INT32_MAX))
    throw std::invalid_argument("W4A4 source map: input width " + std::to_string(x_width) + " is not in [1, 2^31)");
  for (int64_t k = 0; k < in; ++k)
    if (src[k] < -1 || src[k] >= x_width)
      throw std::invalid_argument("W4A4 source map: column " + std::to_string(k) + " reads input channel " + std::to_string(src[k]) +
                                  ", outside [-1, " + std::to_string(x_width) + ")");
}

}  // namespace sq
