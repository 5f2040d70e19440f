// Synthetic LLaMA checkpoints with random weights, for benchmarks and tests at realistic shapes.
#pragma once

#include <cstdint>

#include "core/checkpoint.h"

namespace sq {

/// A ~1B-class LLaMA shape (TinyLlama-like): dim 2048, hidden 5632, 32 heads, 4 KV heads,
/// head_dim 64, vocab 32000, context 2048, `n_layers` layers, untied LM head, HalfSplit RoPE.
ModelConfig synthetic_1b_config(int n_layers);

/// A checkpoint of `config` with deterministic pseudo-random weights: linear weights ~ N(0, 1/in),
/// embeddings ~ N(0, 1), norm weights ~ 1 + N(0, 0.02²). Same seed, same bytes.
/// Owned FP32 tensors; memory = 4 bytes × parameter_count.
Checkpoint make_synthetic_checkpoint(const ModelConfig& config, uint64_t seed = 1234);

}  // namespace sq

namespace sq {
/// The outlier experiment of issue #3 (SmoothQuant's motivation made exact): a function-preserving
/// variant of `ck` in which, in every layer, `channels` of both RMSNorm weights (input_layernorm,
/// post_attention_layernorm) are multiplied by `factor` and the matching input columns of the
/// linears they feed (q/k/v; gate/up) divided by it. FP32 outputs are unchanged up to rounding,
/// but those activation channels become `factor`× larger: LLM-like outlier channels.
Checkpoint make_outlier_variant(const Checkpoint& ck, const std::vector<int>& channels, float factor);
}  // namespace sq
