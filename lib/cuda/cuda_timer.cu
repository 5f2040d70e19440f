// CUDA implementation of cuda/cuda_timer.h.
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"
#include "cuda/cuda_timer.h"

namespace sq::cuda {

using cuda_detail::check;
using cuda_detail::stream_of;

CudaEventTimer::CudaEventTimer() {
  require_cuda("CudaEventTimer");
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  const cudaError_t err = cudaEventCreate(&b);
  if (err != cudaSuccess) cudaEventDestroy(a);
  check(err, "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

CudaEventTimer::~CudaEventTimer() {
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void CudaEventTimer::start(Stream stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(start_), stream_of(stream)), "cudaEventRecord(start)");
}

float CudaEventTimer::stop_ms(Stream stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), stream_of(stream)), "cudaEventRecord(stop)");
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize (timed work)");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)), "cudaEventElapsedTime");
  return ms;
}

}  // namespace sq::cuda
