// INT8 × INT8 → INT32 tensor-core GEMM through cuBLASLt (the GEMM of W8A8 linears, SmoothQuant
// §3.1 / Figure 3.1: the integer product is exact and the scales are applied afterwards by the
// dequantization epilogue, cuda_int8_quantize.h).
//
//   acc[i, j] = Σ_k Xq[i, k] · Wq[j, k]        (exact in INT32 for k ≤ 131072, values in [−127, 127])
//
// Layouts (row-major, padded): Wq [m_pad, k_pad] INT8 (the nn.Linear [out, in] layout), Xq [n, k_pad]
// INT8, acc [n, m_pad] INT32. In cuBLASLt's column-major terms this is the "TN" product
// accᵀ[m_pad, n] = op(A)·B with A = Wq read as the column-major [k_pad, m_pad] matrix (opA = T,
// lda = k_pad) and B = Xq read as column-major [k_pad, n] (opB = N, ldb = k_pad), C = D = accᵀ
// (ldc = m_pad): CUBLAS_COMPUTE_32I, A/B CUDA_R_8I, C/D CUDA_R_32I, scale type CUDA_R_32I
// (α = 1, β = 0). cuBLASLt's IMMA kernels with the regular (column) ordering need the TN form,
// m and k multiples of 4, leading dimensions multiples of 4 and 4-byte (better 16-byte) aligned
// pointers; requiring m_pad and k_pad to be multiples of 16 (zero padding added by the callers:
// the weight at upload, the activations by the quantization kernel) satisfies all of that for every
// n and keeps every row 16-byte aligned.
//
// Caching: one cuBLASLt handle per host thread; each CublasLtInt8Gemm caches, per row count n, its
// matrix layouts and the algorithm returned by cublasLtMatmulAlgoGetHeuristic. The workspace
// (kLtWorkspaceBytes) is owned by the caller (so that one per stream can be shared by all layers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_runtime.h"

namespace sq::cuda {

/// Padding granularity of m and k for the INT8 GEMM (see file comment).
inline constexpr int64_t kInt8GemmAlign = 16;

/// Workspace given to cuBLASLt (preference CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES): 32 MiB, what
/// NVIDIA recommends for Hopper.
inline constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

/// x rounded up to a multiple of kInt8GemmAlign (x ≥ 0).
inline int64_t int8_gemm_pad(int64_t x) { return (x + kInt8GemmAlign - 1) / kInt8GemmAlign * kInt8GemmAlign; }

/// Copies q [rows, cols] row-major INT8 into a zero-filled [rows_pad, cols_pad] row-major matrix
/// (the padded weight layout the INT8 GEMM reads). Throws std::invalid_argument unless
/// 0 ≤ rows ≤ rows_pad and 0 ≤ cols ≤ cols_pad.
inline std::vector<int8_t> pad_int8_matrix(const int8_t* q, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad) {
  if (rows < 0 || cols < 0 || rows > rows_pad || cols > cols_pad)
    throw std::invalid_argument("pad_int8_matrix: [" + std::to_string(rows) + ", " + std::to_string(cols) + "] does not fit in [" +
                                std::to_string(rows_pad) + ", " + std::to_string(cols_pad) + "]");
  std::vector<int8_t> out(size_t(rows_pad) * size_t(cols_pad), int8_t(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols_pad + c)] = q[r * cols + c];
  return out;
}

/// The cuBLASLt INT8 GEMM for one weight shape [m_pad, k_pad]. Not thread-safe (plan cache);
/// move-only.
class CublasLtInt8Gemm {
 public:
  /// Prepares the operation descriptor. Throws std::invalid_argument unless m_pad and k_pad are
  /// positive multiples of kInt8GemmAlign and k_pad ≤ 131072 (so INT32 sums cannot overflow) and
  /// both fit in int32; UnsupportedError without CUDA or device; CudaError when cuBLASLt fails.
  CublasLtInt8Gemm(int64_t m_pad, int64_t k_pad);
  ~CublasLtInt8Gemm();
  CublasLtInt8Gemm(CublasLtInt8Gemm&&) noexcept;
  CublasLtInt8Gemm& operator=(CublasLtInt8Gemm&&) noexcept;

  int64_t m_pad() const { return m_pad_; }
  int64_t k_pad() const { return k_pad_; }

  /// acc [n, m_pad] INT32 (device) = xq [n, k_pad] INT8 (device) · wq [m_pad, k_pad]ᵀ INT8 (device),
  /// all row-major, exact. `workspace` is device memory of `workspace_bytes` (≥ kLtWorkspaceBytes
  /// recommended; it must not be in use by another stream). Enqueued on `stream`. The first call
  /// for a new n queries the cuBLASLt heuristic (host work, cached). Throws std::invalid_argument
  /// for n < 0 or n > INT32_MAX; CudaError naming the shape when cuBLASLt returns no algorithm or
  /// fails.
  void run(const int8_t* wq, const int8_t* xq, int64_t n, int32_t* acc, void* workspace, size_t workspace_bytes,
           Stream stream = {});

 private:
  struct Impl;
  int64_t m_pad_ = 0, k_pad_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sq::cuda
