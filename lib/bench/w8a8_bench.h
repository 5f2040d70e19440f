// W8A8 benchmark: INT8 linears (real INT8 GEMMs) vs OpenBLAS FP32 sgemm at LLaMA-7B and SmolLM2-135M
// linear shapes, measured side by side in one run.
#pragma once

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For [tokens × 4096 → 4096] (q/k/v/o), [tokens × 4096 → 11008] (gate/up) and
/// [tokens × 11008 → 4096] (down), and SmolLM2-135M's 576 → 576, 576 → 1536 and 1536 → 576,
/// measures in the same run, with all OpenMP threads:
///   - OpenBLAS sgemm (FP32) of the shape;
///   - W8A8Linear::forward, per-channel weights + per-token dynamic activations (the activation
///     mode of SmoothQuant-O1, the most expensive one): activation quantization + INT8 GEMM +
///     dequantization, FP32 in and out, default backend (Auto);
///   - the same with per-token-group activations (a step per token and block of 32 inputs,
///     ActQuant::PerTokenGroup: quant/int8_gemm_grouped.h), what finer steps cost;
///   - the raw INT8 GEMM only (PackedInt8Weights::gemm_s32 on pre-quantized activations);
///   - the same two through the oneDNN backend (the alternative to sqkit's kernels);
///   - when Auto is not the VNNI kernel (AMX machines), the same two through the VNNI kernel.
/// Rates count 2·m·k·n operations (GFLOP/s for sgemm, GOP/s for INT8). The items are timed
/// interleaved, one call each per round (≥ 5 rounds and ≥ `min_seconds` per item), so bursts of
/// other load on the machine hit all of them alike; each item's fastest call is kept. Prints a
/// table with every rate's ratio to sgemm, the acceptance line (W8A8 linear ≥ 4× sgemm at
/// 4096→4096 and 4096→11008) and the machine's load average (other processes skew wall-clock
/// rates); returns the numbers as JSON. Throws what W8A8Linear / PackedInt8Weights throw.
nlohmann::json run_w8a8_linear_bench(int tokens, double min_seconds);

}  // namespace sq::bench
