#include "model/w8a16_linear.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ops/aligned_buffer.h"
#include "ops/sgemm.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include "core/immintrin_quiet.h"
#endif

namespace sq {

namespace {

/// Products below this many multiply-adds run on the calling thread (an OpenMP fork costs more).
constexpr int64_t kParallelMinMacs = int64_t(1) << 16;

/// Σ_k x[k] · q[k] in FP32 (the codes widened in registers): four vector accumulators, summed in
/// a fixed order, then the scalar tail.
float dot_i8_f32(const int8_t* q, const float* x, int64_t in) {
  int64_t k = 0;
  float tail = 0.0f;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  const auto w16 = [&](int64_t at) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + at)))); };
  for (; k + 64 <= in; k += 64) {
    a0 = _mm512_fmadd_ps(w16(k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(w16(k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(w16(k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(w16(k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k + 16 <= in; k += 16) a0 = _mm512_fmadd_ps(w16(k), _mm512_loadu_ps(x + k), a0);
  const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  const auto w8 = [&](int64_t at) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + at)))); };
  for (; k + 32 <= in; k += 32) {
    a0 = _mm256_fmadd_ps(w8(k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(w8(k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(w8(k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(w8(k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= in; k += 8) a0 = _mm256_fmadd_ps(w8(k), _mm256_loadu_ps(x + k), a0);
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  const float s = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
#else
  const float s = 0.0f;
#endif
  for (; k < in; ++k) tail += x[k] * float(q[k]);
  return s + tail;
}

}  // namespace

W8A16Linear::W8A16Linear(ops::Int8Codes q, std::vector<float> scales, int64_t out, int64_t in, Tensor bias)
    : q_(std::move(q)), scales_(std::move(scales)), out_(out), in_(in), bias_(std::move(bias)) {
  if (out <= 0 || in <= 0) throw std::invalid_argument("W8A16Linear: out and in must be > 0, got " + std::to_string(out) + " x " + std::to_string(in));
  if (int64_t(q_.size()) != out * in)
    throw std::invalid_argument("W8A16Linear: " + std::to_string(q_.size()) + " codes for a " + std::to_string(out) + " x " + std::to_string(in) + " weight");
  if (int64_t(scales_.size()) != out)
    throw std::invalid_argument("W8A16Linear: " + std::to_string(scales_.size()) + " steps, expected one per output row (" + std::to_string(out) + ")");
  if (!bias_.empty() && bias_.numel() != out)
    throw std::invalid_argument("W8A16Linear: bias has " + std::to_string(bias_.numel()) + " values, expected " + std::to_string(out));
  for (size_t i = 0; i < q_.size(); ++i)
    if (q_[i] == -128) throw std::invalid_argument("W8A16Linear: code -128 at element " + std::to_string(i) + " (codes are in [-127, 127])");
  for (size_t o = 0; o < scales_.size(); ++o)
    if (!std::isfinite(scales_[o]) || scales_[o] < 0.0f)
      throw std::invalid_argument("W8A16Linear: step of row " + std::to_string(o) + " is " + std::to_string(scales_[o]) + " (must be finite, >= 0)");
}

void W8A16Linear::forward(const float* x, int64_t n, float* y) const {
  const int64_t out = out_, in = in_;
  const float* b = bias_.empty() ? nullptr : bias_.data();
  if (n == 1) {
#pragma omp parallel for schedule(static) if (out * in >= kParallelMinMacs)
    for (int64_t o = 0; o < out; ++o) y[o] = scales_[size_t(o)] * dot_i8_f32(q_.data() + o * in, x, in) + (b ? b[o] : 0.0f);
    return;
  }
  if (n <= 0) return;
  // Blocks of ops::kLinearBlockRows output rows: the partition depends on the shape alone and each
  // block's sgemm runs on one thread.
  const int64_t rows = ops::kLinearBlockRows;
  const int64_t blocks = (out + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) if (n * in * out >= kParallelMinMacs && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    static thread_local std::vector<float> buf;
    const int64_t o0 = blk * rows, m = std::min(rows, out - o0);
    float* W = ops::aligned_buffer(buf, m * in);
    for (int64_t o = 0; o < m; ++o) {
      const float d = scales_[size_t(o0 + o)];
      const int8_t* qr = q_.data() + (o0 + o) * in;
      float* wr = W + o * in;
      for (int64_t k = 0; k < in; ++k) wr[k] = d * float(qr[k]);
    }
    ops::sgemm(false, true, n, m, in, 1.0f, x, in, W, in, 0.0f, y + o0, out);  // y[:, o0 .. o0+m) = x · W_blockᵀ
    if (b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < m; ++o) y[i * out + o0 + o] += b[o0 + o];
  }
}

}  // namespace sq
