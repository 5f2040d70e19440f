// Internal to the CUDA implementation (*.cu): turns cudaError_t / cublasStatus_t into CudaError;
// the per-thread cuBLAS handle.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/cuda_runtime.h"

namespace sq::cuda_detail {

/// Throws CudaError "CALL: cudaErrorName: description" unless err == cudaSuccess.
inline void check(cudaError_t err, const std::string& call) {
  if (err != cudaSuccess)
    throw CudaError(call + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

/// Throws CudaError "CALL: cuBLAS status NAME" unless status == CUBLAS_STATUS_SUCCESS.
inline void check(cublasStatus_t status, const std::string& call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw CudaError(call + ": cuBLAS status " + cublasGetStatusName(status) + ": " + cublasGetStatusString(status));
}

/// Checks the launch of the kernel just enqueued (cudaGetLastError), naming the op.
inline void check_launch(const char* op) { check(cudaGetLastError(), std::string(op) + " (kernel launch)"); }

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s.handle); }

/// The cuBLAS handle of the calling host thread (cuBLAS handles are not thread-safe), created on
/// first use and destroyed at thread exit, shared by every cuBLAS call of the CUDA backend (FP32
/// linears, the FP16 benchmark GEMM). Math mode CUBLAS_DEFAULT_MATH: no TF32, so FP32 GEMMs stay
/// FP32; FP16 GEMMs use tensor cores in this mode as well.
inline cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    ~Handle() {
      if (h) cublasDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) {
    check(cublasCreate(&handle.h), "cublasCreate");
    check(cublasSetMathMode(handle.h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode(CUBLAS_DEFAULT_MATH)");
  }
  return handle.h;
}

}  // namespace sq::cuda_detail
