// W4A16 benchmark (issue #5): group-wise INT4-weight linears (model/w4a16_linear.h) vs OpenBLAS
// FP32 at LLaMA-7B linear shapes, measured side by side in one run.
#pragma once

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For [4096 → 4096] (q/k/v/o) and [4096 → 11008] (gate/up), measures in the same run, with all
/// OpenMP threads (and OpenBLAS' own threads):
///   - batch-1 GEMV (decode): OpenBLAS sgemv on the FP32 weight vs W4A16Linear::forward(n = 1) with
///     g = 128 symmetric and g = 128 asymmetric weights (RTN of the same normal matrix);
///   - 512-token GEMM (prefill, for information): OpenBLAS sgemm vs W4A16Linear::forward(n = 512),
///     g = 128 symmetric.
/// Each item is timed interleaved with the others of its shape, one call per round (≥ 5 rounds
/// (GEMV) / ≥ 3 rounds (GEMM) and ≥ `min_seconds` per item); the fastest call is kept. GEMV rows
/// report the time, the bandwidth over the bytes each format actually reads (FP32: 4·out·in; W4A16:
/// weight_bytes()), the "FP32-equivalent" rate 4·out·in / time and the speedup over sgemv; the
/// acceptance line is the target, W4A16 GEMV ≥ 3× the FP32 GEMV (both shapes, sym and asym).
/// GEMM rows report GFLOP/s (2·m·k·n). Prints a table plus the 1-minute load average before and
/// after (other processes skew wall-clock rates) and returns everything as JSON.
/// Throws what W4A16Linear throws (nothing for these fixed shapes).
nlohmann::json run_w4a16_bench(double min_seconds);

}  // namespace sq::bench
