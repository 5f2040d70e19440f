// FP16 GEMM through cuBLAS (cublasGemmEx: FP16 inputs and output, FP32 compute, tensor cores): the
// baseline the INT8 and INT4 linears are measured against (cuda_gemm_bench.h). Plain C++: FP16
// values are passed as their IEEE binary16 bits (uint16_t), e.g. from float_to_half
// (formats/safetensors.h).
#pragma once

#include <cstdint>

#include "cuda/cuda_runtime.h"

namespace sq::cuda {

/// y [n, m] = x [n, k] · W [m, k]ᵀ, all row-major FP16 (device), accumulated in FP32
/// (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT: tensor cores on sm_80/sm_90), the same TN product as
/// linear_f32. Enqueued on `stream`. Throws std::invalid_argument for negative sizes or sizes above
/// INT32_MAX, CudaError when cuBLAS fails.
void gemm_f16(const uint16_t* x, int64_t n, int64_t k, const uint16_t* W, int64_t m, uint16_t* y, Stream stream = {});

}  // namespace sq::cuda
