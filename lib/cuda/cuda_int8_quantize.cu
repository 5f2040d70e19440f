// CUDA implementation of cuda/cuda_int8_quantize.h (element math: cuda/quant_element.h).
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/cuda_int8_quantize.h"
#include "cuda/cuda_reduce.cuh"
#include "cuda/quant_element.h"

namespace sq::cuda {

using cuda_detail::block_max;
using cuda_detail::check;
using cuda_detail::check_launch;
using cuda_detail::nan_max;
using cuda_detail::stream_of;

namespace {

constexpr int kRowThreads = 256;   ///< threads per block of the row kernels (multiple of 32)
constexpr int kElemThreads = 256;  ///< threads per block of the element-wise epilogue

unsigned grid_for(int64_t count, int threads) {
  const int64_t b = (count + threads - 1) / threads;
  if (b > int64_t(0x7fffffff)) throw std::invalid_argument("INT8 kernels: too many elements for one launch");
  return static_cast<unsigned>(b);
}

/// Per-tensor dynamic, step 1: *absmax_bits = max over rows of absmax(row) as the bits of a
/// non-negative float. For x ≥ 0 (and positive NaN) the IEEE bit patterns order like the values
/// (NaN above +inf), so an unsigned atomicMax is an exact, order-independent float max.
__global__ void absmax_atomic_kernel(const float* x, int64_t k, unsigned int* absmax_bits) {
  const float* xr = x + int64_t(blockIdx.x) * k;
  float m = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) m = nan_max(m, fabsf(xr[j]));
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(absmax_bits, __float_as_uint(fabsf(m)));
}

/// One block per row. mode 0 = PerToken (step of the row, written to scales[row]); 1 =
/// PerTensorDynamic (scales[0] holds the absmax of the whole block, turned into the step later by
/// finalize_step_kernel); 2 = PerTensorStatic (step = static_step, written to scales[0]).
__global__ void quantize_rows_kernel(const float* x, int64_t k, int64_t ldq, int8_t* q, float* scales, int mode,
                                     float static_step) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * k;
  int8_t* qr = q + row * ldq;
  float step;
  if (mode == 0) {
    float m = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) m = nan_max(m, fabsf(xr[j]));
    step = qe::int8_activation_step(block_max(m));
    if (threadIdx.x == 0) scales[row] = step;
  } else if (mode == 1) {
    step = qe::int8_activation_step(scales[0]);
  } else {
    step = static_step;
    if (row == 0 && threadIdx.x == 0) scales[0] = step;
  }
  for (int64_t j = threadIdx.x; j < ldq; j += blockDim.x) qr[j] = j < k ? qe::quantize_int8_value(xr[j], step) : int8_t(0);
}

/// Per-tensor dynamic, step 3: scales[0] = step of the absmax it holds (after every row has read it).
__global__ void finalize_step_kernel(float* scales) { scales[0] = qe::int8_activation_step(scales[0]); }

__global__ void dequantize_kernel(const int32_t* acc, int64_t ld_acc, int64_t n, int64_t m, const float* a_scales, bool a_per_row,
                                  const float* b_scales, bool b_per_col, const float* bias, float* y) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * m) return;
  const int64_t i = idx / m, j = idx % m;
  const float sa = a_scales[a_per_row ? i : 0], sb = b_scales[b_per_col ? j : 0];
  y[idx] = qe::int8_dequant(acc[i * ld_acc + j], sa, sb, bias != nullptr, bias ? bias[j] : 0.0f);
}

}  // namespace

void quantize_activations_int8(const float* x, int64_t n, int64_t k, ActQuant mode, float static_step, int8_t* q, int64_t ldq,
                               float* scales, Stream stream) {
  if (n < 0 || k < 0) throw std::invalid_argument("cuda::quantize_activations_int8: negative size");
  if (ldq < k)
    throw std::invalid_argument("cuda::quantize_activations_int8: row stride " + std::to_string(ldq) + " < k = " + std::to_string(k));
  if (mode == ActQuant::PerTensorStatic && !(std::isfinite(static_step) && static_step > 0.0f))
    throw std::invalid_argument("cuda::quantize_activations_int8: the static step must be finite and > 0, got " +
                                std::to_string(static_step));
  if (n == 0) return;
  cudaStream_t s = stream_of(stream);
  const unsigned rows = grid_for(n, 1);
  int code = 0;
  switch (mode) {
    case ActQuant::PerToken: code = 0; break;
    case ActQuant::PerTensorDynamic: code = 1; break;
    case ActQuant::PerTensorStatic: code = 2; break;
    case ActQuant::PerTokenGroup:
      throw std::invalid_argument("cuda::quantize_activations_int8: per-token-group steps are not implemented on CUDA");
  }
  if (mode == ActQuant::PerTensorDynamic) {
    check(cudaMemsetAsync(scales, 0, sizeof(float), s), "cudaMemsetAsync(per-tensor absmax)");
    absmax_atomic_kernel<<<rows, kRowThreads, 0, s>>>(x, k, reinterpret_cast<unsigned int*>(scales));
    check_launch("cuda::quantize_activations_int8 (per-tensor absmax)");
  }
  quantize_rows_kernel<<<rows, kRowThreads, 0, s>>>(x, k, ldq, q, scales, code, static_step);
  check_launch("cuda::quantize_activations_int8");
  if (mode == ActQuant::PerTensorDynamic) {
    finalize_step_kernel<<<1, 1, 0, s>>>(scales);
    check_launch("cuda::quantize_activations_int8 (per-tensor step)");
  }
}

void dequantize_int8_gemm(const int32_t* acc, int64_t ld_acc, int64_t n, int64_t m, const float* a_scales, bool a_per_row,
                          const float* b_scales, bool b_per_col, const float* bias, float* y, Stream stream) {
  if (n < 0 || m < 0) throw std::invalid_argument("cuda::dequantize_int8_gemm: negative size");
  if (ld_acc < m)
    throw std::invalid_argument("cuda::dequantize_int8_gemm: ld_acc " + std::to_string(ld_acc) + " < m = " + std::to_string(m));
  if (n == 0 || m == 0) return;
  dequantize_kernel<<<grid_for(n * m, kElemThreads), kElemThreads, 0, stream_of(stream)>>>(acc, ld_acc, n, m, a_scales, a_per_row,
                                                                                          b_scales, b_per_col, bias, y);
  check_launch("cuda::dequantize_int8_gemm");
}

}  // namespace sq::cuda
