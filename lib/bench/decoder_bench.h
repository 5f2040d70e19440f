// Issue 16's no-regression check: the generic Decoder (driven by the DecoderSpec) against the
// LLaMA layer loop it replaced, on the same weights, timed interleaved in one run.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sq::bench {

struct DecoderBenchOptions {
  std::string model;         ///< a LLaMA-structure model (any format load_model reads); "" = synthetic 1B-class
  int layers = 4;            ///< layers of the synthetic model
  int tokens = 512;          ///< prefill length
  int decode_steps = 64;     ///< decode steps after a prefill of `tokens`
  double min_seconds = 1.0;  ///< minimum measuring time per contender
};

/// Times FP32 prefill of `tokens` tokens and `decode_steps` single-token steps with (a) Decoder::
/// forward and (b) llama_baseline_forward (lib/bench/llama_baseline.h: the pre-issue-16 LLaMA
/// layer), interleaved (time_interleaved) on the same weights and KV cache type, and checks both
/// give the same logits (max |Δ| printed; they run the same operations, so 0 is expected). Prints
/// tokens/s of each and the ratio Decoder ÷ baseline; returns them as JSON. Throws
/// UnsupportedError for a model that is not the LLaMA structure (the baseline cannot run it).
nlohmann::json run_decoder_bench(const DecoderBenchOptions& options);

}  // namespace sq::bench
