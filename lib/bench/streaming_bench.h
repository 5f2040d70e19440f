// Streaming decoding benchmark (issue #6): StreamingLLM's sink + window cache vs the sliding
// window with re-computation, decoding the same tokens of a real model in one run.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace sq::bench {

struct StreamingBenchOptions {
  std::string model, tokenizer, text;  ///< model file (.bin/.sqm/HF dir), tokenizer, text to decode
  int64_t tokens = 2000;               ///< decode the first N tokens of the text (N − 1 predictions)
  int64_t sinks = 4;                   ///< S of sink:S,window:W
  int64_t window = 252;                ///< W of sink:S,window:W; recompute uses S + W (same attention span)
  int rounds = 2;                      ///< measured rounds after one warm-up call each (best kept)
};

/// Decodes the first `tokens` tokens of `text` as one stream (eval/streaming.h, FP32 KV) under
/// sink:S,window:W (one token per step, evicting from a cache of S + W rows) and under
/// recompute:S+W (a fresh prefill of the S + W most recent tokens for every prediction; StreamingLLM
/// §4.5 / Table 5's baseline), both on omp_get_max_threads() threads and interleaved
/// (bench/timing.h, best of `rounds`). Prints tokens/s of each (predictions ÷ best wall seconds),
/// the speedup ratio against StreamingLLM's ≥ 10× claim, both PPLs and peak KV bytes, and the load
/// average; returns them as JSON. Throws what load_model, the tokenizer and evaluate_streaming throw
/// (e.g. UsageError when the text holds fewer than 2 tokens or S ≥ W).
nlohmann::json run_streaming_bench(const StreamingBenchOptions& options);

}  // namespace sq::bench
