#include "core/model_config.h"

#include <cmath>

#include "core/error.h"

namespace sq {

const char* rope_layout_name(RopeLayout layout) {
  return layout == RopeLayout::Interleaved ? "interleaved" : "half-split";
}

const char* rope_scaling_type_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::Linear: return "linear";
    case RopeScalingType::Llama3: return "llama3";
    case RopeScalingType::Default: break;
  }
  return "default";
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int v, const char* name) {
    if (v <= 0) throw InputError(source + ": model config field '" + name + "' must be positive, got " + std::to_string(v));
  };
  positive(dim, "dim");
  positive(hidden_dim, "hidden_dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_seq_len");
  if (n_heads % n_kv_heads != 0)
    throw InputError(source + ": n_heads (" + std::to_string(n_heads) + ") is not a multiple of n_kv_heads (" +
                     std::to_string(n_kv_heads) + ")");
  if (head_dim % 2 != 0)
    throw InputError(source + ": head_dim must be even for RoPE, got " + std::to_string(head_dim));
  if (!(norm_eps > 0.0f)) throw InputError(source + ": norm_eps must be positive");
  if (!(rope_theta > 0.0f)) throw InputError(source + ": rope_theta must be positive");
  if (!rope_scaling.is_default()) {
    const std::string what = source + ": RoPE scaling '" + rope_scaling_type_name(rope_scaling.type) + "': ";
    if (!(rope_scaling.factor > 0.0f) || !std::isfinite(rope_scaling.factor))
      throw InputError(what + "factor must be a finite positive number, got " + std::to_string(rope_scaling.factor));
    if (rope_scaling.type == RopeScalingType::Llama3) {
      if (!(rope_scaling.low_freq_factor > 0.0f))
        throw InputError(what + "low_freq_factor must be positive, got " + std::to_string(rope_scaling.low_freq_factor));
      if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || !std::isfinite(rope_scaling.high_freq_factor))
        throw InputError(what + "high_freq_factor (" + std::to_string(rope_scaling.high_freq_factor) +
                         ") must be finite and greater than low_freq_factor (" + std::to_string(rope_scaling.low_freq_factor) + ")");
      if (rope_scaling.original_max_position_embeddings <= 0)
        throw InputError(what + "original_max_position_embeddings must be positive, got " +
                         std::to_string(rope_scaling.original_max_position_embeddings));
    }
  }
  if (bos_id < 0 || bos_id >= vocab_size || eos_id < 0 || eos_id >= vocab_size)
    throw InputError(source + ": bos/eos token ids (" + std::to_string(bos_id) + ", " + std::to_string(eos_id) +
                     ") outside the vocabulary of " + std::to_string(vocab_size));
}

int64_t ModelConfig::parameter_count() const {
  const int64_t d = dim, q = int64_t(n_heads) * head_dim, kv = int64_t(n_kv_heads) * head_dim;
  int64_t per_layer = d /*attn norm*/ + d * q + 2 * d * kv + q * d + d /*ffn norm*/ + 3 * d * hidden_dim;
  if (qkv_bias) per_layer += q + 2 * kv;
  int64_t total = int64_t(vocab_size) * d + n_layers * per_layer + d;
  if (!tied_embeddings) total += int64_t(vocab_size) * d;
  return total;
}

}  // namespace sq
