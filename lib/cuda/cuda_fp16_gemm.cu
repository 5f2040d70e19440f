// CUDA implementation of cuda/cuda_fp16_gemm.h.
#include <cublas_v2.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/cuda_fp16_gemm.h"

namespace sq::cuda {

using cuda_detail::check;
using cuda_detail::stream_of;

void gemm_f16(const uint16_t* x, int64_t n, int64_t k, const uint16_t* W, int64_t m, uint16_t* y, Stream stream) {
  if (n < 0 || k < 0 || m < 0 || n > INT32_MAX || k > INT32_MAX || m > INT32_MAX)
    throw std::invalid_argument("cuda::gemm_f16: bad size n=" + std::to_string(n) + " k=" + std::to_string(k) + " m=" + std::to_string(m));
  if (n == 0 || m == 0) return;
  cublasHandle_t h = cuda_detail::cublas_handle();
  check(cublasSetStream(h, stream_of(stream)), "cublasSetStream");
  // Column-major view as in linear_f32: yᵀ [m, n] = op(W)·xᵀ with W read as column-major [k, m] (op = T).
  const float alpha = 1.0f, beta = 0.0f;
  const int M = int(m), N = int(n), K = int(k);
  check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &alpha, W, CUDA_R_16F, K, x, CUDA_R_16F, K, &beta, y, CUDA_R_16F, M,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx(FP16 [" + std::to_string(n) + " x " + std::to_string(k) + "] x [" + std::to_string(m) + " x " +
            std::to_string(k) + "]^T)");
}

}  // namespace sq::cuda
