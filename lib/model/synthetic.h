// Synthetic LLaMA checkpoints with random weights, for benchmarks and tests at realistic shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/checkpoint.h"
#include "formats/hf_checkpoint.h"

namespace sq {

/// A ~1B-class LLaMA shape (TinyLlama-like): dim 2048, hidden 5632, 32 heads, 4 KV heads,
/// head_dim 64, vocab 32000, context 2048, `n_layers` layers, untied LM head, HalfSplit RoPE.
ModelConfig synthetic_1b_config(int n_layers);

/// A LLaMA-7B shape (LLaMA 1, Touvron et al. 2023, Table 2): dim 4096, hidden 11008, 32 heads
/// (multi-head: 32 KV heads), head_dim 128, vocab 32000, context 2048, RMSNorm eps 1e-6,
/// `n_layers` layers (32 in the paper's model), untied LM head, HalfSplit RoPE.
ModelConfig synthetic_7b_config(int n_layers);

/// The tensors of a synthetic LLaMA-structured `config` (canonical names, core/checkpoint.h), in
/// canonical order (embedding, layers 0 … n−1, final norm, head), each generated on demand with deterministic pseudo-random values: linear weights
/// ~ N(0, 1/in), embeddings ~ N(0, 1), norm weights ~ 1 + N(0, 0.02²). Tensor k is drawn from
/// seed + k + 1 in blocks of 2^16 elements, so any piecewise generation (each piece starting at a
/// multiple of 2^16; std::invalid_argument otherwise) gives the same values; same seed, same bytes.
/// Generation is parallel over blocks (OpenMP).
std::vector<GeneratedTensor> synthetic_tensors(const ModelConfig& config, uint64_t seed = 1234);

/// A checkpoint of `config` holding synthetic_tensors(config, seed) in memory.
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
