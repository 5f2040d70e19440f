// CUDA GEMM benchmark (issue #7 acceptance: "W8A8 GEMM at 7B shapes vs cuBLAS FP16 GEMM, target
// ≥ 1.5× on H100"), suite `cuda-gemm` of sq-bench. Device-neutral C++ in lib/cuda (lib/bench does
// not link CUDA); without CUDA or a device it throws before measuring anything.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace sq::bench {

struct CudaGemmBenchOptions {
  std::vector<int64_t> tokens = {1, 16, 512, 2048};  ///< n: rows of the activation (tokens)
  int warmup = 3;                                    ///< untimed calls of every item first
  int reps = 25;                                     ///< timed rounds (median reported), ≥ 20 recommended
};

/// For the LLaMA-7B linear shapes (m, k) ∈ {(4096, 4096) q/k/v/o, (11008, 4096) gate/up,
/// (4096, 11008) down} (y [n, m] = x [n, k] · W [m, k]ᵀ) and every n of `opt.tokens`, times side by
/// side on one stream with CUDA events (warm-up, then `reps` interleaved rounds calling each item
/// once; the median per item is reported):
///   - fp16_gemm:    cuBLAS cublasGemmEx, FP16 in/out, FP32 compute, tensor cores (the baseline);
///   - int8_gemm:    the cuBLASLt INT8 GEMM alone (INT8 in, INT32 out; cuda_int8_gemm.h);
///   - w8a8_linear:  the whole W8A8 device linear (per-channel × per-token): FP32 x → quantize
///                   kernel → INT8 GEMM → dequantization epilogue → FP32 y;
///   - w4a16_linear: the W4A16 device linear (g = 128 symmetric): GEMV for n = 1, tiled GEMM else.
/// Weights are N(0, 0.02²) and activations N(0, 1) from fixed seeds. Prints, per row, the median
/// times, TOPS (2·m·k·n / time) and the speedups fp16 / item, then the acceptance line (INT8 GEMM ≥
/// 1.5× FP16 for n ≥ 512 at all three shapes) with the device name; returns everything as JSON.
/// Throws UnsupportedError ("sq-bench --suite cuda-gemm: ...") without CUDA or device,
/// std::invalid_argument for reps < 1 or n < 1, CudaError when the device fails.
nlohmann::json run_cuda_gemm_bench(const CudaGemmBenchOptions& opt);

}  // namespace sq::bench
