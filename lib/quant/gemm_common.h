// Small helpers shared by sqkit's own integer GEMM kernels (quant/int8_gemm.cpp, quant/w4a4_gemm.cpp):
// rounding, 64-byte aligned packed-weight storage and per-thread scratch buffers.
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

namespace sq::gemm {

/// Products below this many multiply-adds run on the calling thread (an OpenMP fork costs more).
inline constexpr int64_t kParallelMinMacs = int64_t(1) << 16;

/// x rounded up to a multiple of `to` (x ≥ 0, to > 0).
constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/// 64-byte aligned byte buffer (packed weights: every panel row is whole cache lines). Zero-filled
/// by `resize`.
struct AlignedBytes {
  std::vector<int8_t> storage;
  int8_t* data = nullptr;
  int64_t size = 0;
  void resize(int64_t bytes) {
    storage.assign(static_cast<size_t>(bytes + 64), 0);
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + ((64 - addr % 64) % 64);
    size = bytes;
  }
};

/// Per-thread scratch buffer of at least `count` T, 64-byte aligned (grown on demand, reused across
/// calls; contents are unspecified). One buffer per (thread, T): a caller that needs two live
/// buffers of the same T must carve them out of one call.
template <typename T>
T* thread_scratch(int64_t count) {
  static thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < count + 64) buf.resize(static_cast<size_t>(count + 64));
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(T);
}

/// The portable path of the integer GEMMs: f(i, j) for every output of an [m, n] product of depth k
/// on its own, the (i, j) pairs split over the OpenMP threads for products of at least
/// kParallelMinMacs multiply-adds (each output is computed whole by one thread: results never depend
/// on the split).
template <typename F>
void for_each_output(int64_t m, int64_t n, int64_t k, F&& f) {
  const bool par = m * n * k >= kParallelMinMacs && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for collapse(2) schedule(static) if (par)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) f(i, j);
}

}  // namespace sq::gemm
