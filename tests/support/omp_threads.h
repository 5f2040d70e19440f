// Test helper: run a block with a fixed OpenMP thread count.
#pragma once

#include <omp.h>

namespace sq::test {

/// Sets omp_set_num_threads(n) for its lifetime and restores the previous count.
///
/// For tests that compare two computations bit for bit when one of them runs BLAS calls inside a
/// parallel region (one thread per call) and the other outside it (all threads per call): some
/// OpenBLAS kernels give results that depend on the number of threads a call runs with (seen with
/// OPENBLAS_CORETYPE=Haswell on an AMD EPYC with AVX-512, where the environment sets it), so such
/// a comparison is exact only at one thread.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

}  // namespace sq::test
