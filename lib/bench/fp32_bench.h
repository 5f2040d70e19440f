// FP32 benchmarks of the foundation: sgemm (ops::sgemm, the GEMM of the FP32 linears) at LLaMA-7B linear shapes vs sqkit's prefill
// of a synthetic ~1B-class model, measured side by side in one run.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace sq::bench {

struct Fp32BenchOptions {
  int tokens = 512;          ///< rows of the GEMMs and prompt length of the prefill
  int layers = 4;            ///< decoder layers of the synthetic model
  double min_seconds = 1.0;  ///< minimum measuring time per item
};

/// Runs: sgemm [tokens × 4096 → 4096], [tokens × 4096 → 11008], [tokens × 11008 → 4096] (GFLOP/s,
/// best of repetitions); synthetic-model prefill of `tokens` tokens (tokens/s, effective GFLOP/s
/// counting 2·m·n·k per linear and causal attention's QKᵀ and PV), and the ratio
/// prefill GFLOP/s ÷ sgemm GFLOP/s. Prints a table to stdout; returns the numbers as JSON.
nlohmann::json run_fp32_bench(const Fp32BenchOptions& options);

/// Perplexity throughput of a real model (e.g. stories260K) under the llamacpp protocol at `ctx`:
/// tokens/s as sq-eval reports it. Prints one line; returns JSON.
nlohmann::json run_eval_speed_bench(const std::string& model, const std::string& tokenizer, const std::string& text, int ctx);

}  // namespace sq::bench
