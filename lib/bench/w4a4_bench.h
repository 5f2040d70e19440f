// W4A4 (Atom) benchmark (issue #5): the W4A4 mixed-precision GEMM (quant/w4a4_gemm.h) vs sqkit's
// W8A8 INT8 GEMM and OpenBLAS FP32 sgemm, measured side by side in one run.
#pragma once

#include <nlohmann/json.hpp>

namespace sq::bench {

/// For `tokens` × [4096 → 4096] with n_outlier = 128 (in_normal = 3968 = 31 groups of g = 128,
/// Atom's configuration), measures in the same run, with all OpenMP threads (and OpenBLAS' own):
///   - OpenBLAS sgemm (FP32);
///   - W8A8Linear::forward, per-channel weights + per-token dynamic activations (what the
///     w8a8-linear suite measures): activation quantization + INT8 VNNI GEMM + dequantization;
///   - W4A4Linear::forward (g = 128, 128 INT8 outliers): per-token/per-group activation
///     quantization + W4A4 GEMM with the fused per-group rescaling;
///   - the two integer GEMMs alone on pre-quantized activations (PackedInt8Weights::gemm_f32_biased,
///     W4A4Linear::forward_quantized) and the two activation quantizers alone.
/// Items are timed interleaved, one call each per round (≥ 5 rounds and ≥ `min_seconds` per item),
/// so bursts of other load hit all alike; each keeps its fastest call. Rates count 2·m·k·n
/// operations. Prints the table, the ratios W4A4/W8A8 and W4A4/sgemm with the acceptance line
/// (W4A4 linear ≥ 0.8× W8A8 linear and ≥ 3× sgemm, both including activation quantization) and
/// the load average before/after; returns everything as JSON. Throws what the layers throw.
nlohmann::json run_w4a4_bench(int tokens, double min_seconds);

}  // namespace sq::bench
