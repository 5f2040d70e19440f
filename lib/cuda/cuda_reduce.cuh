// Internal to the CUDA implementation (*.cu): block-wide reductions used by the quantization kernels.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace sq::cuda_detail {

/// max that propagates NaN (fmaxf would drop it), so a NaN in the data is visible in the result.
__device__ inline float nan_max(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }

/// Block-wide NaN-propagating max of one value per thread (blockDim.x a multiple of 32, ≤ 1024);
/// every thread gets the result. Uses 33 floats of shared memory; may be called repeatedly.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float result;
  for (int off = 16; off > 0; off >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? partial[lane] : -INFINITY;
    for (int off = 16; off > 0; off >>= 1) w = nan_max(w, __shfl_xor_sync(0xffffffffu, w, off));
    if (lane == 0) result = w;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // `partial` / `result` may be reused by a following call
  return r;
}

/// Sum of one value per lane over a full warp with the butterfly (xor-shuffle) pattern: after the
/// steps 16, 8, 4, 2, 1 every lane holds the same sum, in the order tests replay on the CPU
/// (v[l] + v[l ^ off] at each step).
__device__ inline float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace sq::cuda_detail
