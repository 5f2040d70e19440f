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

/// How RoPE's per-pair inverse frequencies are derived from the base θ: transformers'
/// `rope_type` (modeling_rope_utils.py, ROPE_INIT_FUNCTIONS). core/rope_frequencies.h computes them.
enum class RopeScalingType {
  Default,  ///< plain RoPE (Su et al. 2021): inv_freq_i = θ^(−2i/d)
  Linear,   ///< position interpolation (Chen et al. 2023): inv_freq_i = θ^(−2i/d) / factor
  Llama3,   ///< Llama 3.1 (Meta 2024): low frequencies / factor, high kept, smooth in between
};

/// "default" / "linear" / "llama3" (the `rope_type` strings of transformers).
const char* rope_scaling_type_name(RopeScalingType type);

/// RoPE frequency scaling parameters (transformers' `rope_parameters` / legacy `rope_scaling`).
/// Fields a type does not use keep their defaults, so two equal scalings compare equal.
/// All three supported types have attention_factor 1 in transformers: scaling changes only the
/// rotation angles, never the softmax temperature.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::Default;
  float factor = 1.0f;           ///< linear, llama3: frequency (= context) scale factor
  float low_freq_factor = 1.0f;  ///< llama3: wavelengths above original_max_position_embeddings / this are divided by factor
  float high_freq_factor = 4.0f; ///< llama3: wavelengths below original_max_position_embeddings / this are kept
  int original_max_position_embeddings = 8192;  ///< llama3: the pre-training context length (tokens)

  bool is_default() const { return type == RopeScalingType::Default; }
  // Spelled out (not "= default"): nvcc compiles this header as C++17.
  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position_embeddings == o.original_max_position_embeddings;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

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
  float rope_theta = 10000.0f;  ///< RoPE base θ
  RopeScaling rope_scaling;     ///< RoPE frequency scaling (Default: plain RoPE); see core/rope_frequencies.h
  RopeLayout rope_layout = RopeLayout::Interleaved;
  bool tied_embeddings = true;  ///< LM head shares the token-embedding matrix
  bool qkv_bias = false;        ///< q/k/v projections have biases (Qwen2)
  int bos_id = 1;
  int eos_id = 2;

  /// Throws InputError naming `source` and the offending field when a size is non-positive or
  /// inconsistent (n_heads % n_kv_heads != 0, odd head_dim, ...), or a RoPE scaling parameter is
  /// out of its domain (factor not finite and positive; llama3: low_freq_factor not positive,
  /// high_freq_factor <= low_freq_factor, original_max_position_embeddings not positive).
  void validate(const std::string& source) const;

  /// Number of parameters implied by the shapes (embedding counted once when tied).
  int64_t parameter_count() const;
};

}  // namespace sq
