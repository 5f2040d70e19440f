#include "core/model_config.h"

#include "core/error.h"

namespace sq {

const char* rope_layout_name(RopeLayout layout) {
  return layout == RopeLayout::Interleaved ? "interleaved" : "half-split";
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
