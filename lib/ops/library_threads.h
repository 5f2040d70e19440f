// How many threads the BLAS/LAPACK libraries plan for when sqkit calls them (issue 38).
//
// OpenBLAS (Debian's OpenMP build) and oneDNN's dnnl_sgemm size their own threading from the
// calling task's OpenMP thread count (omp_get_max_threads()) whenever the caller is not inside an
// active parallel region: at the top level, and inside an inactive region (an `if (false)` or
// one-thread region, which still counts in omp_get_level()). Their results depend on that count.
// Measured with OpenBLAS 0.3.21 (its SkylakeX and, with OPENBLAS_CORETYPE=Haswell, its AVX2
// kernels alike; 2026-11-30, a scratch program comparing 1, 2, 3 and 4 threads bit for bit):
//   - dpotrf (GPTQ's Cholesky factors): different bits at 2 threads already, at every size tried
//     (n = 64, 576, 1536, 2048);
//   - dsyrk (Hessians 2XᵀX): different at n = 64;
//   - sgemv (the FP32 decode step's linears): different at 3 threads for 640-wide rows (Gemma 3);
//   - dgemm: different at 3 threads (256 × 64 × 64, 256 × 2048 × 2048).
// The thread governor (runtime/thread_governor.h) changes the count with the load, and users pick
// -t, so a library call that plans for the current count makes results depend on both. sqkit
// therefore never lets a library plan for more than one thread: its products are cut into blocks
// whose partition depends on the shape alone (ops/sgemm.h), each block one single-threaded call,
// and LAPACK runs on one thread (GPTQ's factorizations: n = 4096 takes 1.19 s on one thread
// against 0.97 s on two, a small part of a GPTQ linear's time).
#pragma once

#include <omp.h>

namespace sq::ops {

/// Sets this task's OpenMP thread count (omp_set_num_threads(n)) for its lifetime and restores the
/// previous count on destruction. Cheap (two ICV writes); safe inside parallel regions, where it
/// touches only the calling task's value. Tests use it to run a computation at a fixed count.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

/// While alive, the BLAS/LAPACK calls made by this thread plan for one thread.
class OneLibraryThread : ScopedOmpThreads {
 public:
  OneLibraryThread() : ScopedOmpThreads(1) {}
};

}  // namespace sq::ops
