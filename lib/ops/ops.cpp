#include "ops/ops.h"

#include "core/rope_frequencies.h"
#include "ops/fast_exp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sq::ops {

float rms_inv(const float* x, int64_t d, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
  return 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
}

namespace {
/// One row of rms_norm: y = x · rms_inv(x) · w.
inline void rms_norm_row(const float* xr, const float* w, float* yr, int d, float eps) {
  const float inv = rms_inv(xr, d, eps);
  for (int j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
}

/// One row of layer_norm. Two passes (mean, then the mean squared deviation) in double: exact
/// enough that the result is the FP32 rounding of the true normalization, whatever the row's offset.
inline void layer_norm_row(const float* xr, const float* w, const float* b, float* yr, int d, float eps) {
  double mean = 0.0;
  for (int j = 0; j < d; ++j) mean += xr[j];
  mean /= d;
  double var = 0.0;
  for (int j = 0; j < d; ++j) {
    const double c = xr[j] - mean;
    var += c * c;
  }
  var /= d;
  const float m = static_cast<float>(mean);
  const float inv = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  for (int j = 0; j < d; ++j) yr[j] = (xr[j] - m) * inv * w[j] + (b ? b[j] : 0.0f);
}
}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps) {
#pragma omp parallel for schedule(static) if (n * d >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) rms_norm_row(x + t * d, w, y + t * d, d, eps);
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout) {
  const std::vector<float> inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{});
  rope(x, positions, n, n_heads, head_dim, inv_freq.data(), layout);
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps) {
#pragma omp parallel for schedule(static) if (n * d >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) layer_norm_row(x + t * d, w, b, y + t * d, d, eps);
}

void norm(NormKind kind, const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps) {
  if (kind == NormKind::LayerNorm)
    layer_norm(x, w, b, y, n, d, eps);
  else
    rms_norm(x, w, y, n, d, eps);
}

void add_norm(NormKind kind, float* x, const float* r, const float* w, const float* b, float* y, int64_t n, int d, float eps) {
  const bool layer = kind == NormKind::LayerNorm;
#pragma omp parallel for schedule(static) if (n * d >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) {
    float* xr = x + t * d;
    const float* rr = r + t * d;
#pragma omp simd
    for (int j = 0; j < d; ++j) xr[j] += rr[j];
    if (layer)
      layer_norm_row(xr, w, b, y + t * d, d, eps);
    else
      rms_norm_row(xr, w, y + t * d, d, eps);
  }
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout) {
  rope(x, positions, n, n_heads, head_dim, head_dim, inv_freq, layout);
}

void rope_table(const int32_t* positions, int64_t n, int half, const float* inv_freq, float* cos_out, float* sin_out) {
#pragma omp parallel for schedule(static) if (n * half >= (1 << 14))
  for (int64_t t = 0; t < n; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_out[t * half + i] = std::cos(angle);
      sin_out[t * half + i] = std::sin(angle);
    }
  }
}

namespace {
/// Rotates one row [n_heads · head_dim] by the angles c[i], s[i] of pairs i < half (see rope()).
inline void rope_row(float* row, int n_heads, int head_dim, int half, const float* c, const float* s, RopeLayout layout) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = row + int64_t(h) * head_dim;
    if (layout == RopeLayout::Interleaved) {
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    } else {
      float* u = v + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = u[i];
        v[i] = x0 * c[i] - x1 * s[i];
        u[i] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}
}  // namespace

void rope_apply(float* x, int64_t n, int n_heads, int head_dim, int rot_dim, const float* cos_t, const float* sin_t,
                RopeLayout layout) {
  const int half = rot_dim / 2;
  const int64_t width = int64_t(n_heads) * head_dim;
#pragma omp parallel for schedule(static) if (n * width >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) rope_row(x + t * width, n_heads, head_dim, half, cos_t + t * half, sin_t + t * half, layout);
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, int rot_dim, const float* inv_freq,
          RopeLayout layout) {
  const int half = rot_dim / 2;
  const int64_t width = int64_t(n_heads) * head_dim;
#pragma omp parallel for schedule(static) if (n * width >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) {
    thread_local std::vector<float> cs;  // this row's cos | sin (no allocation per call once grown)
    if (static_cast<int>(cs.size()) < 2 * half) cs.resize(static_cast<size_t>(2 * half));
    rope_table(positions + t, 1, half, inv_freq, cs.data(), cs.data() + half);
    rope_row(x + t * width, n_heads, head_dim, half, cs.data(), cs.data() + half, layout);
  }
}

void swiglu(float* gate, const float* up, int64_t count) {
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + fast_exp(-g)) * up[i];
  }
}

namespace {
/// GELU with the tanh approximation through the identity 0.5·(1 + tanh(v)) = σ(2v):
/// 0.5·x·(1 + tanh(v)) = x / (1 + e^(−2v)), v = √(2/π)·(x + 0.044715·x³). The same function with
/// no tanh (a libm call that keeps the loop scalar) and no cancellation in 1 + tanh(v) for v ≪ 0.
inline float gelu_tanh(float x) {
  constexpr float k2 = 2.0f * 0.7978845608028654f;  // 2·sqrt(2/π)
  return x / (1.0f + fast_exp(-k2 * (x + 0.044715f * x * x * x)));
}
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }
inline float silu(float x) { return x / (1.0f + fast_exp(-x)); }
inline float relu(float x) { return x > 0.0f ? x : 0.0f; }

/// x[i] = f(x[i]) (· up[i] when `up` is set), parallel from 2^16 elements; f is inlined, so the loop
/// vectorizes when f does.
template <typename F>
void map_inplace(float* x, const float* up, int64_t count, F f) {
  if (up) {
#pragma omp parallel for simd schedule(static) if (count >= (1 << 16))
    for (int64_t i = 0; i < count; ++i) x[i] = f(x[i]) * up[i];
  } else {
#pragma omp parallel for simd schedule(static) if (count >= (1 << 16))
    for (int64_t i = 0; i < count; ++i) x[i] = f(x[i]);
  }
}

void apply(Activation act, float* x, const float* up, int64_t count) {
  switch (act) {
    // lambdas, not function pointers: each instantiation inlines its f
    case Activation::GeluTanh: return map_inplace(x, up, count, [](float v) { return gelu_tanh(v); });
    case Activation::Gelu: return map_inplace(x, up, count, [](float v) { return gelu_erf(v); });
    case Activation::ReLU: return map_inplace(x, up, count, [](float v) { return relu(v); });
    case Activation::SiLU: return map_inplace(x, up, count, [](float v) { return silu(v); });
  }
}
}  // namespace

void activation(Activation act, float* x, int64_t count) { apply(act, x, nullptr, count); }

void gated_activation(Activation act, float* gate, const float* up, int64_t count) {
  if (act == Activation::SiLU) return swiglu(gate, up, count);
  apply(act, gate, up, count);
}

void add_inplace(float* out, const float* x, int64_t count) {
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) out[i] += x[i];
}

/// Largest element of x[0..count), count >= 1; a NaN element is skipped (as std::max(m, x) skips
/// it). Sixteen running maxima in one GCC vector (vmaxps on AVX-512; split into narrower vectors
/// elsewhere): a single running maximum, even under `omp simd reduction(max)`, compiled to a chain
/// of scalar vmaxss, half of softmax_row's time in a SmolLM2 prefill profile.
float max_element(const float* x, int count) {
  using V = float __attribute__((vector_size(64)));
  constexpr int L = 16;
  float m = x[0];
  int i = 1;
  if (count >= 2 * L) {
    V acc;
    std::memcpy(&acc, x, sizeof(V));
    for (i = L; i + L <= count; i += L) {
      V v;
      std::memcpy(&v, x + i, sizeof(V));
      acc = v > acc ? v : acc;
    }
    for (int l = 0; l < L; ++l) m = acc[l] > m ? acc[l] : m;
  }
  for (; i < count; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float exp_shifted_row(float* x, int count) { return exp_shifted_row(x, count, max_element(x, count)); }

float exp_shifted_row(float* x, int count, float m) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < count; ++i) {
    x[i] = fast_exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

void softmax_row(float* x, int count) {
  const float inv = 1.0f / exp_shifted_row(x, count);
#pragma omp simd
  for (int i = 0; i < count; ++i) x[i] *= inv;
}

double log_sum_exp(const float* x, int count) {
  const float m = max_element(x, count);
  // Terms are in (0, 1]; blocks of 64 are summed in FP32 (relative error ~1e-7·sqrt(64)) and the
  // block sums in double, so a 32,000-entry vocabulary keeps ~1e-7 relative accuracy.
  double sum = 0.0;
  for (int b = 0; b < count; b += 64) {
    const int end = b + 64 < count ? b + 64 : count;
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (int i = b; i < end; ++i) block += fast_exp(x[i] - m);
    sum += block;
  }
  return static_cast<double>(m) + std::log(sum);
}

}  // namespace sq::ops
