#include "quant/int8_quantize.h"

#include "ops/hadamard.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __AVX512F__
#include "core/immintrin_quiet.h"
#endif

namespace sq {

namespace {

/// Inputs below this many elements are quantized on the calling thread, as the other elementwise
/// ops (ops/ops.cpp) do. (It was 2²², for fear of waiting on a descheduled thread on a loaded
/// machine; the thread governor (runtime/thread_governor.h) now sizes the team to the free cores.
/// Serial quantization of SmolLM2's [512 × 576] and [512 × 1536] prompt activations left the second
/// core idle for about a tenth of a 2-thread W8A8 prefill once the GEMMs ran on AMX.)
constexpr int64_t kParallelMinElements = int64_t(1) << 16;

void check_sizes(const char* what, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string(what) + ": negative size [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

/// Quantizes count values with step Δ into q (int8_t, or uint8_t holding q + 128 when kBiased).
template <bool kBiased, typename Out>
void quantize_span(const float* x, int64_t count, float step, Out* q) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 vstep = _mm512_set1_ps(step);
  const __m512 lo = _mm512_set1_ps(-float(kInt8Max)), hi = _mm512_set1_ps(float(kInt8Max));
  const __m512i bias = _mm512_set1_epi32(kBiased ? 128 : 0);
  auto convert = [&](__m512 v) {
    v = _mm512_div_ps(v, vstep);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);                 // max_ps(NaN, lo) = lo: NaN → −127
    return _mm512_add_epi32(_mm512_cvtps_epi32(v), bias);        // round half to even (MXCSR default)
  };
  for (; i + 16 <= count; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(convert(_mm512_loadu_ps(x + i))));
  if (i < count) {
    const __mmask16 m = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi8(q + i, m, convert(_mm512_maskz_loadu_ps(m, x + i)));
  }
#else
  for (; i < count; ++i) {
    float v = x[i] / step;
    v = v > -float(kInt8Max) ? v : -float(kInt8Max);  // also maps NaN to −127, as the AVX-512 path
    v = v < float(kInt8Max) ? v : float(kInt8Max);
    const int r = static_cast<int>(std::nearbyint(v));
    q[i] = static_cast<Out>(kBiased ? r + 128 : r);
  }
#endif
}

/// Quantizes rows [n, k] of x with per-row steps (steps[i], or steps[0] when !per_row) into q with
/// row stride ldq, padding bytes [k, ldq) with quantized zero.
template <bool kBiased, typename Out>
void quantize_rows(const float* x, int64_t n, int64_t k, const float* steps, bool per_row, Out* q, int64_t ldq) {
  const Out zero = static_cast<Out>(kBiased ? 128 : 0);
#pragma omp parallel for schedule(static) if (n * k >= kParallelMinElements && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    Out* row = q + i * ldq;
    quantize_span<kBiased>(x + i * k, k, steps[per_row ? i : 0], row);
    for (int64_t j = k; j < ldq; ++j) row[j] = zero;
  }
}

/// Row absmaxes → steps (one per row). Returns false when some row holds NaN/inf.
bool row_steps(const float* x, int64_t n, int64_t k, float* steps) {
  std::atomic<bool> ok{true};
#pragma omp parallel for schedule(static) if (n * k >= kParallelMinElements && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const float m = abs_max(x + i * k, k);
    if (!std::isfinite(m)) {
      ok.store(false, std::memory_order_relaxed);
      steps[i] = 1.0f;
    } else {
      steps[i] = m > 0.0f ? m / float(kInt8Max) : 1.0f;
    }
  }
  return ok.load();
}

/// absmax of the whole [n, k] block (NaN if any element is NaN).
float block_abs_max(const float* x, int64_t n, int64_t k) {
  float m = 0.0f;
  bool nan = false;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(|| : nan) if (n * k >= kParallelMinElements && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const float r = abs_max(x + i * k, k);
    if (std::isnan(r)) nan = true;
    else if (r > m) m = r;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

void check_static_step(float step) {
  if (!(std::isfinite(step) && step > 0.0f))
    throw std::invalid_argument("INT8 activation quantization: the static scale (step Δ) must be finite and > 0, got " +
                                std::to_string(step));
}

/// Per-token (group = k) or per-token-group (group = kActGroupSize) quantization of the n rows
/// row(i) (a pointer to k floats, valid until the next call on the same thread) into q (row stride
/// ldq, padding bytes set to quantized zero) and scales[n, ceil(k / group)]: one pass per row
/// (absmax of each group, then its quantization while it is in L1), one parallel region. Throws
/// std::invalid_argument when a row holds NaN or infinity.
template <bool kBiased, typename Out, typename RowFn>
void quantize_per_token(RowFn&& row_of, int64_t n, int64_t k, int64_t group, Out* q, int64_t ldq, float* scales) {
  std::atomic<bool> ok{true};
  const Out zero = static_cast<Out>(kBiased ? 128 : 0);
  const int64_t groups = k == 0 ? 0 : (k + group - 1) / group;
#pragma omp parallel for schedule(dynamic, 16) if (n * k >= kParallelMinElements && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = row_of(i);
    Out* row = q + i * ldq;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group, len = std::min(group, k - c0);
      const float m = abs_max(x + c0, len);
      if (!std::isfinite(m)) ok.store(false, std::memory_order_relaxed);
      const float step = std::isfinite(m) && m > 0.0f ? m / float(kInt8Max) : 1.0f;
      scales[i * groups + g] = step;
      quantize_span<kBiased>(x + c0, len, step, row + c0);
    }
    if (groups == 0 && group == 0) scales[i] = 1.0f;  // per-token with k == 0: one (unused) step
    for (int64_t j = k; j < ldq; ++j) row[j] = zero;
  }
  if (!ok.load())
    throw std::invalid_argument(std::string("quantize_activations (") + (group == k ? "per-token" : "per-token-group") +
                                "): the activations contain NaN or infinity");
}

template <bool kBiased, typename Out>
void quantize_activations_impl(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, Out* q, int64_t ldq,
                               float* scales) {
  check_sizes("quantize_activations", n, k);
  if (ldq < k) throw std::invalid_argument("quantize_activations: row stride " + std::to_string(ldq) + " < k = " + std::to_string(k));
  switch (mode) {
    case ActQuant::PerToken:
      quantize_per_token<kBiased>([&](int64_t i) { return x + i * k; }, n, k, k, q, ldq, scales);
      return;
    case ActQuant::PerTokenGroup:
      quantize_per_token<kBiased>([&](int64_t i) { return x + i * k; }, n, k, kActGroupSize, q, ldq, scales);
      return;
    case ActQuant::PerTensorDynamic:
      scales[0] = int8_step(block_abs_max(x, n, k));
      quantize_rows<kBiased>(x, n, k, scales, false, q, ldq);
      return;
    case ActQuant::PerTensorStatic:
      check_static_step(static_step);
      scales[0] = static_step;
      quantize_rows<kBiased>(x, n, k, scales, false, q, ldq);
      return;
  }
  throw std::invalid_argument("quantize_activations: unknown ActQuant mode");
}

}  // namespace

const char* to_string(WeightGranularity g) { return g == WeightGranularity::PerChannel ? "per-channel" : "per-tensor"; }

const char* to_string(ActQuant a) {
  switch (a) {
    case ActQuant::PerToken: return "per-token";
    case ActQuant::PerTensorDynamic: return "per-tensor-dynamic";
    case ActQuant::PerTensorStatic: return "per-tensor-static";
    case ActQuant::PerTokenGroup: return "per-token-group";
  }
  return "unknown";
}

float int8_step(float absmax) {
  if (!std::isfinite(absmax) || absmax < 0.0f)
    throw std::invalid_argument("INT8 quantization: the data contain NaN or infinity (absmax = " + std::to_string(absmax) + ")");
  return absmax > 0.0f ? absmax / float(kInt8Max) : 1.0f;
}

float abs_max(const float* x, int64_t count) {
  int64_t i = 0;
  float m = 0.0f;
  bool nan = false;
#ifdef __AVX512F__
  __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
  __mmask16 unord = 0;
  for (; i + 32 <= count; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    unord |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, _mm512_abs_ps(a));
    m1 = _mm512_max_ps(m1, _mm512_abs_ps(b));
  }
  for (; i < count; i += 16) {
    const __mmask16 k = count - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(k, x + i);
    unord |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, _mm512_abs_ps(a));
  }
  m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  nan = unord != 0;
#else
  for (; i < count; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) nan = true;
    m = a > m ? a : m;
  }
#endif
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

void quantize_int8(const float* x, int64_t count, float step, int8_t* q) { quantize_span<false>(x, count, step, q); }

void quantize_uint8_biased(const float* x, int64_t count, float step, uint8_t* q) { quantize_span<true>(x, count, step, q); }

void dequantize_int8(const int8_t* q, int64_t count, float step, float* x) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) x[i] = step * static_cast<float>(q[i]);
}

void quantize_weight_per_channel(const float* W, int64_t out, int64_t in, int8_t* q, float* scales) {
  check_sizes("quantize_weight_per_channel", out, in);
  if (!row_steps(W, out, in, scales))
    throw std::invalid_argument("quantize_weight_per_channel: the weight contains NaN or infinity");
  quantize_rows<false>(W, out, in, scales, true, q, in);
}

void quantize_weight_per_tensor(const float* W, int64_t out, int64_t in, int8_t* q, float* scales) {
  check_sizes("quantize_weight_per_tensor", out, in);
  scales[0] = int8_step(block_abs_max(W, out, in));
  quantize_rows<false>(W, out, in, scales, false, q, in);
}

void quantize_weight(const float* W, int64_t out, int64_t in, WeightGranularity g, int8_t* q, float* scales) {
  if (g == WeightGranularity::PerChannel) quantize_weight_per_channel(W, out, in, q, scales);
  else quantize_weight_per_tensor(W, out, in, q, scales);
}

void quantize_activations(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, int8_t* q, float* scales) {
  quantize_activations_impl<false>(x, n, k, mode, static_step, q, k, scales);
}

void quantize_activations_u8(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, uint8_t* q, int64_t ldq,
                             float* scales) {
  quantize_activations_impl<true>(x, n, k, mode, static_step, q, ldq, scales);
}

void quantize_activations_u8_hadamard(const float* x, int64_t n, int64_t k, int64_t block, ActQuant mode, uint8_t* q, int64_t ldq,
                                      float* scales) {
  check_sizes("quantize_activations_u8_hadamard", n, k);
  if (mode != ActQuant::PerToken && mode != ActQuant::PerTokenGroup)
    throw std::invalid_argument(std::string("quantize_activations_u8_hadamard: rotated rows are quantized per token or per token "
                                            "group, not ") + to_string(mode));
  ops::check_hadamard_block(k, block, "quantize_activations_u8_hadamard");
  if (ldq < k)
    throw std::invalid_argument("quantize_activations_u8_hadamard: row stride " + std::to_string(ldq) + " < k = " + std::to_string(k));
  // Each thread rotates one row at a time into its own buffer (k floats, cache-resident) and
  // quantizes it from there: the rotated activations never make a round trip through memory.
  quantize_per_token<true>(
      [&](int64_t i) {
        thread_local std::vector<float> rotated;
        if (static_cast<int64_t>(rotated.size()) < k) rotated.resize(static_cast<size_t>(k));
        ops::hadamard_row(x + i * k, rotated.data(), k, block);
        return static_cast<const float*>(rotated.data());
      },
      n, k, mode == ActQuant::PerTokenGroup ? kActGroupSize : k, q, ldq, scales);
}

}  // namespace sq
