// Test helper: small hand-made model configurations (no weights) for unit tests of the KV cache,
// policies and calibration code.
#pragma once

#include "core/model_config.h"

namespace sq::test {

/// A LLaMA config with the given shape: head_dim = dim / n_heads, hidden_dim = `hidden` (default
/// dim), interleaved RoPE with θ = 10000, tied embeddings, no biases.
inline ModelConfig small_config(int dim, int n_layers, int n_heads, int n_kv_heads, int vocab, int max_seq_len,
                                int hidden = 0) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden > 0 ? hidden : dim;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = dim / n_heads;
  c.vocab_size = vocab;
  c.max_seq_len = max_seq_len;
  return c;
}

}  // namespace sq::test
