// GPTQ's factorization benchmark (issue 37, "GPTQ's Cholesky ... at GEMM speed"): the upper
// Cholesky factor of H⁻¹ that gptq_quantize needs (calib/gptq.h gptq_inverse_cholesky: dpotrf of
// the reversed H, dtrtri; 2n³/3 flops) against the reference's sequence (torch cholesky,
// cholesky_inverse, cholesky = dpotrf, dpotri, dpotrf; 4n³/3 flops, what sqkit ran before) and one
// dgemm of the same order (2n³ flops, the rate a "GEMM speed" factorization is held to), side by
// side in one run, all on one thread as gptq_quantize runs them.
//
// Built into sqkit_calib (it calls calib/), not sqkit: see calib/CMakeLists.txt.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For each order n in `orders` (default in sq-bench: 1536 and 8960, Qwen2.5-1.5B's linear input
/// widths; 4096 and 11008 are LLaMA-7B's): a damped Hessian 2XᵀX/T of T = n + 256 Gaussian rows
/// (seed 5), then times gptq_inverse_cholesky, the three-call reference sequence and dgemm (n × n ×
/// n), interleaved (≥ 2 rounds and ≥ `min_seconds` per item, best call kept). Prints seconds,
/// GFLOP/s at the nominal flop counts and each one's time as a multiple of the dgemm's; checks
/// that both factors agree (max |ΔU| / max |U| printed). Returns everything as JSON.
nlohmann::json run_gptq_bench(const std::vector<int64_t>& orders, double min_seconds);

}  // namespace sq::bench
