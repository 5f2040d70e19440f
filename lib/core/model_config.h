// Hyper-parameters of a LLaMA-family decoder, independent of the file format it came from.
#pragma once

#include <cstdint>
#include <string>

namespace sq {

/// How rotary position embedding pairs the channels of one head (head_dim d).
enum class RopeLayout {
  /// llama2.c / Meta original: pairs (2i, 2i+1), i in [0, d/2).
  Interleaved,
  /// Hugging Face `rotate_half`: pairs (i, i + d/2), i in [0, d/2). HF checkpoints store q/k
  /// projections row-permuted for this layout.
  HalfSplit,
};

/// "interleaved" / "half-split".
const char* rope_layout_name(RopeLayout layout);

/// Architecture hyper-parameters of a LLaMA-family decoder-only model.
/// All sizes are counts (not bytes). Invariants are checked by `validate()`.
struct ModelConfig {
  std::string architecture = "llama";  ///< "llama", "mistral" or "qwen2" (same math; qwen2 has q/k/v biases)
  int dim = 0;              ///< hidden size (embedding width)
  int hidden_dim = 0;       ///< SwiGLU intermediate size
  int n_layers = 0;         ///< decoder layers
  int n_heads = 0;          ///< query heads
  int n_kv_heads = 0;       ///< key/value heads (grouped-query attention when < n_heads)
  int head_dim = 0;         ///< per-head width; dim / n_heads unless the config says otherwise
  int vocab_size = 0;       ///< rows of the token embedding and the LM head
  int max_seq_len = 0;      ///< trained context length (tokens)
  float norm_eps = 1e-5f;   ///< RMSNorm epsilon
  float rope_theta = 10000.0f;  ///< RoPE base
  RopeLayout rope_layout = RopeLayout::Interleaved;
  bool tied_embeddings = true;  ///< LM head shares the token-embedding matrix
  bool qkv_bias = false;        ///< q/k/v projections have biases (Qwen2)
  int bos_id = 1;
  int eos_id = 2;

  /// Throws InputError naming `source` and the offending field when a size is non-positive or
  /// inconsistent (n_heads % n_kv_heads != 0, odd head_dim, ...).
  void validate(const std::string& source) const;

  /// Number of parameters implied by the shapes (embedding counted once when tied).
  int64_t parameter_count() const;
};

}  // namespace sq
