// GPU-side timing with CUDA events, for the CUDA benchmarks (cuda_gemm_bench.h). Plain C++.
#pragma once

#include "cuda/cuda_runtime.h"

namespace sq::cuda {

/// A pair of CUDA events (cudaEventCreate / cudaEventDestroy) measuring the device time of the work
/// enqueued on one stream between start() and stop_ms(). Non-copyable RAII.
class CudaEventTimer {
 public:
  /// Throws UnsupportedError without CUDA or device, CudaError when event creation fails.
  CudaEventTimer();
  ~CudaEventTimer();
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  /// Records the start event on `stream`.
  void start(Stream stream = {});
  /// Records the stop event on `stream`, waits for it and returns the elapsed device time in
  /// milliseconds (cudaEventElapsedTime, resolution about 0.5 µs). Throws CudaError, e.g. for an
  /// asynchronous kernel failure in the timed work.
  float stop_ms(Stream stream = {});

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace sq::cuda
