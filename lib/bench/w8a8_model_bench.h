// W8A8 vs FP32 prefill of the synthetic ~1B-class model, measured side by side in one run.
#pragma once

#include <nlohmann/json.hpp>

namespace sq::bench {

/// Prefill of `tokens` tokens (last-token logits) through the synthetic model of `layers` layers
/// (model/synthetic.h), FP32 (OpenBLAS sgemm) and naive W8A8 (per-channel weights, per-token
/// activations, LM head quantized too: every GEMM INT8). Prints tokens/s and the speed-up
/// (target ≥ 2.5×) and the max |logit| difference; returns JSON.
nlohmann::json run_w8a8_prefill_bench(int layers, int tokens, double min_seconds);

}  // namespace sq::bench
