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
