// CUDA implementation of cuda/cuda_ops.h. Kernels favour being obviously correct over being fast:
// one thread block per row for reductions (norms, softmax, quantization), one block per (query,
// head) for attention, one thread per element for the elementwise ops, cuBLAS for the matrix
// products. The element math of norm / activation / attention scores / MoE accumulation is
// cuda/decoder_element.h (shared with the host and tested on the CPU).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rope_frequencies.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "cuda/decoder_element.h"

namespace sq::cuda {

using cuda_detail::check;
using cuda_detail::check_launch;
using cuda_detail::stream_of;
namespace de = sq::de;

namespace {

constexpr int kRowThreads = 256;   ///< threads per block of the row-wise kernels (multiple of 32)
constexpr int kElemThreads = 256;  ///< threads per block of the elementwise kernels
constexpr int kMaxHeadDim = 1024;  ///< attention: one thread per channel of a head

void check_nonneg(const char* op, int64_t a, int64_t b = 0, int64_t c = 0) {
  if (a < 0 || b < 0 || c < 0) throw std::invalid_argument(std::string("cuda::") + op + ": negative size");
}

unsigned blocks_for(int64_t count, int threads) {
  const int64_t b = (count + threads - 1) / threads;
  if (b > int64_t(0x7fffffff)) throw std::invalid_argument("CUDA op: too many elements for one launch");
  return static_cast<unsigned>(b);
}

/// Max that propagates NaN (fmaxf would drop it), so a NaN in a row is visible in its result.
__device__ inline float nan_max(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }

/// Block-wide reduction of one value per thread (blockDim.x a multiple of 32, ≤ 1024). kMax: max
/// (NaN-propagating), else sum. Every thread gets the result. Uses 32 floats of shared memory.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float result;
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? nan_max(v, o) : v + o;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, w, off);
      w = kMax ? nan_max(w, o) : w + o;
    }
    if (lane == 0) result = w;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // `partial`/`result` may be reused by a following reduction
  return r;
}

/// Block-wide sum in double of one value per thread, in block_reduce's order (warp butterflies,
/// then warp 0 over the warps' sums). Every thread gets the result; may be called repeatedly.
__device__ double block_sum_double(double v) {
  __shared__ double partial[32];
  __shared__ double result;
  for (int off = 16; off > 0; off >>= 1) v = de::addd(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? partial[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) w = de::addd(w, __shfl_xor_sync(0xffffffffu, w, off));
    if (lane == 0) result = w;
  }
  __syncthreads();
  const double r = result;
  __syncthreads();
  return r;
}

/// One block per row of x [n, d]. RMSNorm: thread t sums x² over channels t, t + blockDim, … with
/// fused multiply-adds, block_reduce combines. LayerNorm: the two passes of ops::layer_norm in
/// double (sum → mean; Σ (x − mean)² → inverse std), each a per-thread sequential sum and a
/// block_sum_double. Every thread reads its channels before any is written (y may alias x).
template <bool kLayer>
__global__ void norm_kernel(const float* x, const float* w, const float* b, float* y, int d, float eps) {
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* yr = y + int64_t(blockIdx.x) * d;
  if (kLayer) {
    double s = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s = de::addd(s, double(xr[j]));
    const double mean = de::ln_mean(block_sum_double(s), d);
    double sq = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) sq = de::ln_var_step(sq, xr[j], mean);
    const float inv = de::ln_inv_std(block_sum_double(sq), d, eps);
    const float m = static_cast<float>(mean);
    for (int j = threadIdx.x; j < d; j += blockDim.x) yr[j] = de::layer_norm_elem(xr[j], m, inv, w[j], b ? b[j] : 0.0f);
  } else {
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ss = de::rms_sum_step(ss, xr[j]);
    const float inv = de::rms_inv_from_sum(block_reduce<false>(ss), d, eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) yr[j] = de::rms_norm_elem(xr[j], inv, w[j]);
  }
}

/// Inverse frequencies θ^(−2i/d) for i < d/2, passed by value (2 KiB of kernel parameters).
struct InvFreq {
  float v[kMaxHeadDim / 2];
};

/// Thread per (row, head, pair i < half = rot_dim/2); pair i is (2i, 2i+1) or (i, i + half) of the
/// head's first rot_dim channels.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, int half, InvFreq f,
                            bool interleaved) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over n · n_heads · half pairs
  if (idx >= n * n_heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // t · n_heads + h
  const int64_t t = th / n_heads;
  const float angle = static_cast<float>(positions[t]) * f.v[i];
  const float c = cosf(angle), s = sinf(angle);
  float* v = x + th * head_dim;
  const int a = interleaved ? 2 * i : i;
  const int b = interleaved ? 2 * i + 1 : i + half;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

template <Activation A>
__device__ __forceinline__ float activate(float v) {
  if constexpr (A == Activation::SiLU) return de::silu(v);
  else if constexpr (A == Activation::GeluTanh) return de::gelu_tanh(v);
  else if constexpr (A == Activation::Gelu) return de::gelu_erf(v);
  else return de::relu(v);
}

/// x[i] = act(x[i]), or act(x[i]) · up[i] when `up` is set.
template <Activation A>
__global__ void activation_kernel(float* x, const float* up, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float a = activate<A>(x[i]);
  x[i] = up ? de::gated(a, up[i]) : a;
}

__global__ void add_kernel(float* out, const float* x, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] += x[i];
}

__global__ void softmax_rows_kernel(float* x, int64_t cols, int64_t visible0) {
  const int64_t row = blockIdx.x;
  float* r = x + row * cols;
  const int64_t v = visible0 + row < cols ? visible0 + row : cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = nan_max(m, r[j]);
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(r[j] - m);
  sum = block_reduce<false>(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) r[j] = j < v ? expf(r[j] - m) * inv : 0.0f;
}

__global__ void embedding_kernel(const float* table, int64_t vocab, int dim, const int32_t* tokens, int64_t n, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * dim) return;
  const int64_t t = idx / dim, j = idx % dim;
  const int32_t tok = tokens[t];
  out[idx] = (tok >= 0 && tok < vocab) ? table[int64_t(tok) * dim + j] : NAN;
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t m) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n * m) y[idx] += bias[idx % m];
}

/// One block per (query i, head h), head_dim threads; thread d owns output channel d. The visible
/// keys lo … p (p = p0 + i, lo = de::first_visible_key(p, window)) are scored in tiles of head_dim
/// (one key per thread: a sequential fused dot over the channels, then de::attention_score with the
/// head's ALiBi slope or 0), then every thread folds the tile into its running (max m, denominator
/// l, accumulator acc) — the online softmax of Milakov & Gimelshein (2018) as used by
/// FlashAttention (Dao et al. 2022, Alg. 1). tests/cuda_decoder_ops_test.cpp replays this order on
/// the host.
__global__ void attention_kernel(const float* q, const float* keys, const float* values, int64_t p0, int n_heads, int group,
                                 int hd, float scale, int window, const float* slopes, float* out) {
  extern __shared__ float sh[];
  float* qs = sh;       // [hd] this query head
  float* s = sh + hd;   // [hd] scores of the current key tile
  const int64_t i = blockIdx.x / n_heads;
  const int h = static_cast<int>(blockIdx.x % n_heads);
  const int g = h / group;
  const int d = threadIdx.x;
  const int64_t qw = int64_t(n_heads) * hd, kvw = int64_t(n_heads / group) * hd;
  qs[d] = q[i * qw + int64_t(h) * hd + d];
  __syncthreads();
  const int64_t pos = p0 + i;
  const int64_t visible = pos + 1;  // causal mask: keys lo … p0 + i
  const int64_t lo = de::first_visible_key(pos, window);
  const float slope = slopes ? slopes[h] : 0.0f;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int64_t t0 = lo; t0 < visible; t0 += hd) {
    const int64_t j = t0 + d;
    float score = -INFINITY;
    if (j < visible) {
      const float* k = keys + j * kvw + int64_t(g) * hd;
      float dot = 0.0f;
      for (int e = 0; e < hd; ++e) dot = de::dot_step(dot, qs[e], k[e]);
      score = de::attention_score(dot, scale, slope, pos - j);
    }
    s[d] = score;
    __syncthreads();
    const int cnt = static_cast<int>(visible - t0 < hd ? visible - t0 : hd);
    float tmax = -INFINITY;
    for (int jj = 0; jj < cnt; ++jj) tmax = fmaxf(tmax, s[jj]);
    const float m_new = fmaxf(m, tmax);
    const float corr = de::softmax_rescale(m, m_new);  // 0 on the first tile (m = −inf)
    acc = de::mul(acc, corr);
    l = de::mul(l, corr);
    const float* vcol = values + t0 * kvw + int64_t(g) * hd + d;
    for (int jj = 0; jj < cnt; ++jj) {
      const float p = de::softmax_weight(s[jj], m_new);
      l = de::add(l, p);
      acc = de::sq_fma(p, vcol[int64_t(jj) * kvw], acc);
    }
    m = m_new;
    __syncthreads();  // s is overwritten by the next tile
  }
  out[i * qw + int64_t(h) * hd + d] = de::div(acc, l);
}

__global__ void quantize_per_token_kernel(const float* x, int64_t k, int8_t* q, float* scales) {
  const float* xr = x + int64_t(blockIdx.x) * k;
  int8_t* qr = q + int64_t(blockIdx.x) * k;
  float m = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) m = nan_max(m, fabsf(xr[j]));
  m = block_reduce<true>(m);
  // Δ = absmax / 127 (1 for an all-zero row); NaN for a row holding NaN/inf (the CPU throws there).
  const float step = isfinite(m) ? (m > 0.0f ? m / 127.0f : 1.0f) : NAN;
  if (threadIdx.x == 0) scales[blockIdx.x] = step;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    float v = xr[j] / step;
    v = v > -127.0f ? v : -127.0f;  // NaN → −127, as the CPU
    v = v < 127.0f ? v : 127.0f;
    qr[j] = static_cast<int8_t>(__float2int_rn(v));  // round half to even
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t m, int d, float* out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * d) return;
  const int64_t i = idx / d, j = idx % d;
  out[idx] = x[int64_t(rows[i]) * d + j];
}

__global__ void scatter_add_rows_kernel(float* y, const float* src, const int32_t* rows, const float* weights, int64_t m, int d) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * d) return;
  const int64_t i = idx / d, j = idx % d;
  float* yj = y + int64_t(rows[i]) * d + j;
  *yj = de::weighted_add(*yj, src[idx], weights[i]);
}

__global__ void fill_kernel(float* x, int64_t count, float value) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = value;
}

template <Activation A>
void launch_activation(float* x, const float* up, int64_t count, cudaStream_t s) {
  activation_kernel<A><<<blocks_for(count, kElemThreads), kElemThreads, 0, s>>>(x, up, count);
}

void run_activation(const char* op, Activation act, float* x, const float* up, int64_t count, Stream stream) {
  check_nonneg(op, count);
  if (count == 0) return;
  const cudaStream_t s = stream_of(stream);
  switch (act) {
    case Activation::SiLU: launch_activation<Activation::SiLU>(x, up, count, s); break;
    case Activation::GeluTanh: launch_activation<Activation::GeluTanh>(x, up, count, s); break;
    case Activation::Gelu: launch_activation<Activation::Gelu>(x, up, count, s); break;
    case Activation::ReLU: launch_activation<Activation::ReLU>(x, up, count, s); break;
    default:
      throw std::invalid_argument(std::string("cuda::") + op + ": unknown activation " + std::to_string(static_cast<int>(act)));
  }
  check_launch((std::string("cuda::") + op).c_str());
}

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n, int d, float eps, Stream stream) {
  check_nonneg("rms_norm", n, d);
  if (n == 0 || d == 0) return;
  norm_kernel<false><<<blocks_for(n, 1), kRowThreads, 0, stream_of(stream)>>>(x, w, nullptr, y, d, eps);
  check_launch("cuda::rms_norm");
}

void norm(NormKind kind, const float* x, const float* w, const float* b, float* y, int64_t n, int d, float eps, Stream stream) {
  check_nonneg("norm", n, d);
  if (n == 0 || d == 0) return;
  if (kind == NormKind::LayerNorm)
    norm_kernel<true><<<blocks_for(n, 1), kRowThreads, 0, stream_of(stream)>>>(x, w, b, y, d, eps);
  else
    norm_kernel<false><<<blocks_for(n, 1), kRowThreads, 0, stream_of(stream)>>>(x, w, nullptr, y, d, eps);
  check_launch("cuda::norm");
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, int rot_dim, const float* inv_freq,
          RopeLayout layout, Stream stream) {
  check_nonneg("rope", n, n_heads, head_dim);
  if (head_dim % 2 != 0 || head_dim > kMaxHeadDim)
    throw std::invalid_argument("cuda::rope: head_dim must be even and at most " + std::to_string(kMaxHeadDim) + ", got " +
                                std::to_string(head_dim));
  if (rot_dim < 0 || rot_dim % 2 != 0 || rot_dim > head_dim)
    throw std::invalid_argument("cuda::rope: rot_dim must be even and in [0, head_dim = " + std::to_string(head_dim) + "], got " +
                                std::to_string(rot_dim));
  const int half = rot_dim / 2;
  if (n == 0 || n_heads == 0 || half == 0) return;
  InvFreq f{};
  for (int i = 0; i < half; ++i) f.v[i] = inv_freq[i];  // the CPU's frequencies, so the angles pos · inv_freq are bit-identical
  const int64_t pairs = n * n_heads * half;
  rope_kernel<<<blocks_for(pairs, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(x, positions, n, n_heads, head_dim, half,
                                                                                      f, layout == RopeLayout::Interleaved);
  check_launch("cuda::rope");
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, const float* inv_freq, RopeLayout layout,
          Stream stream) {
  rope(x, positions, n, n_heads, head_dim, head_dim, inv_freq, layout, stream);
}

void rope(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim, float theta, RopeLayout layout,
          Stream stream) {
  const std::vector<float> inv_freq = rope_inv_freq<float>(theta, head_dim, RopeScaling{});
  rope(x, positions, n, n_heads, head_dim, inv_freq.data(), layout, stream);
}

void swiglu(float* gate, const float* up, int64_t count, Stream stream) {
  run_activation("swiglu", Activation::SiLU, gate, up, count, stream);
}

void activation(Activation act, float* x, int64_t count, Stream stream) { run_activation("activation", act, x, nullptr, count, stream); }

void gated_activation(Activation act, float* gate, const float* up, int64_t count, Stream stream) {
  run_activation("gated_activation", act, gate, up, count, stream);
}

void add_inplace(float* out, const float* x, int64_t count, Stream stream) {
  check_nonneg("add_inplace", count);
  if (count == 0) return;
  add_kernel<<<blocks_for(count, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(out, x, count);
  check_launch("cuda::add_inplace");
}

void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t visible0, Stream stream) {
  check_nonneg("softmax_rows", rows, cols);
  if (visible0 < 1) throw std::invalid_argument("cuda::softmax_rows: visible0 must be >= 1, got " + std::to_string(visible0));
  if (rows == 0 || cols == 0) return;
  softmax_rows_kernel<<<blocks_for(rows, 1), kRowThreads, 0, stream_of(stream)>>>(x, cols, visible0);
  check_launch("cuda::softmax_rows");
}

void embedding(const float* table, int64_t vocab, int dim, const int32_t* tokens, int64_t n, float* out, Stream stream) {
  check_nonneg("embedding", vocab, dim, n);
  if (n == 0 || dim == 0) return;
  embedding_kernel<<<blocks_for(n * dim, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(table, vocab, dim, tokens, n, out);
  check_launch("cuda::embedding");
}

void linear_f32(const float* x, int64_t n, int64_t k, const float* W, int64_t m, const float* bias, float* y, Stream stream) {
  check_nonneg("linear_f32", n, k, m);
  if (n == 0 || m == 0) return;
  if (n > INT32_MAX || k > INT32_MAX || m > INT32_MAX) throw std::invalid_argument("cuda::linear_f32: a size exceeds INT32_MAX");
  cublasHandle_t h = cuda_detail::cublas_handle();
  check(cublasSetStream(h, stream_of(stream)), "cublasSetStream");
  // Row-major Y[n, m] is column-major Yᵀ [m, n] = W · Xᵀ, with row-major W[m, k] read as the
  // column-major [k, m] matrix Wᵀ (so op = T) and row-major X[n, k] as column-major Xᵀ [k, n].
  const float alpha = 1.0f, beta = 0.0f;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &alpha, W, K, x, K, &beta, y, M),
        "cublasSgemm(linear_f32 [" + std::to_string(n) + " x " + std::to_string(k) + "] x [" + std::to_string(m) + " x " +
            std::to_string(k) + "]^T)");
  if (bias) {
    add_bias_kernel<<<blocks_for(n * m, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(y, bias, n, m);
    check_launch("cuda::linear_f32 (bias)");
  }
}

void attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, int n_heads, int n_kv_heads,
               int head_dim, float* out, Stream stream) {
  attention(q, keys, values, n, p0, n_heads, n_kv_heads, head_dim, out, AttentionOptions{}, stream);
}

void attention(const float* q, const float* keys, const float* values, int64_t n, int64_t p0, int n_heads, int n_kv_heads,
               int head_dim, float* out, const AttentionOptions& opt, Stream stream) {
  check_nonneg("attention", n, p0);
  if (opt.window < 0) throw std::invalid_argument("cuda::attention: window must be >= 0, got " + std::to_string(opt.window));
  if (head_dim <= 0 || head_dim > kMaxHeadDim || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument("cuda::attention: need 0 < head_dim <= " + std::to_string(kMaxHeadDim) +
                                " and n_heads a multiple of n_kv_heads, got head_dim " + std::to_string(head_dim) + ", heads " +
                                std::to_string(n_heads) + "/" + std::to_string(n_kv_heads));
  if (n == 0) return;
  // Decoder::attention's scale: the option when set, else 1/√d (FP32 sqrt and division).
  const float scale = opt.scale > 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t shared = 2 * size_t(head_dim) * sizeof(float);
  attention_kernel<<<blocks_for(n * n_heads, 1), head_dim, shared, stream_of(stream)>>>(
      q, keys, values, p0, n_heads, n_heads / n_kv_heads, head_dim, scale, opt.window, opt.alibi_slopes, out);
  check_launch("cuda::attention");
}

void quantize_per_token_int8(const float* x, int64_t n, int64_t k, int8_t* q, float* scales, Stream stream) {
  check_nonneg("quantize_per_token_int8", n, k);
  if (n == 0) return;
  quantize_per_token_kernel<<<blocks_for(n, 1), kRowThreads, 0, stream_of(stream)>>>(x, k, q, scales);
  check_launch("cuda::quantize_per_token_int8");
}

void gather_rows(const float* x, const int32_t* rows, int64_t m, int d, float* out, Stream stream) {
  check_nonneg("gather_rows", m, d);
  if (m == 0 || d == 0) return;
  gather_rows_kernel<<<blocks_for(m * d, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(x, rows, m, d, out);
  check_launch("cuda::gather_rows");
}

void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* weights, int64_t m, int d, Stream stream) {
  check_nonneg("scatter_add_rows", m, d);
  if (m == 0 || d == 0) return;
  scatter_add_rows_kernel<<<blocks_for(m * d, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(y, src, rows, weights, m, d);
  check_launch("cuda::scatter_add_rows");
}

void fill(float* x, int64_t count, float value, Stream stream) {
  check_nonneg("fill", count);
  if (count == 0) return;
  fill_kernel<<<blocks_for(count, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(x, count, value);
  check_launch("cuda::fill");
}

}  // namespace sq::cuda
