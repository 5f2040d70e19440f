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

const char* norm_kind_name(NormKind k) { return k == NormKind::LayerNorm ? "layernorm" : "rmsnorm"; }

const char* position_kind_name(PositionKind k) {
  switch (k) {
    case PositionKind::Alibi: return "alibi";
    case PositionKind::Learned: return "learned";
    case PositionKind::Rope: break;
  }
  return "rope";
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::Gelu: return "gelu";
    case Activation::ReLU: return "relu";
    case Activation::SiLU: break;
  }
  return "silu";
}

bool DecoderSpec::operator==(const DecoderSpec& o) const {
  return norm == o.norm && norm_bias == o.norm_bias && post_attn_norm == o.post_attn_norm &&
         post_ffn_norm == o.post_ffn_norm && qk_norm == o.qk_norm && parallel_residual == o.parallel_residual &&
         shared_input_norm == o.shared_input_norm && position == o.position && rope_dim == o.rope_dim &&
         learned_position_offset == o.learned_position_offset && attn_scale == o.attn_scale && o_bias == o.o_bias &&
         mlp_gated == o.mlp_gated && activation == o.activation && mlp_bias == o.mlp_bias && n_experts == o.n_experts &&
         experts_per_token == o.experts_per_token && embed_scale == o.embed_scale && embed_norm == o.embed_norm &&
         layer_window == o.layer_window && rope_local_theta == o.rope_local_theta;
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  return architecture == o.architecture && spec == o.spec && dim == o.dim && hidden_dim == o.hidden_dim &&
         n_layers == o.n_layers && n_heads == o.n_heads && n_kv_heads == o.n_kv_heads && head_dim == o.head_dim &&
         vocab_size == o.vocab_size && max_seq_len == o.max_seq_len && norm_eps == o.norm_eps &&
         rope_theta == o.rope_theta && rope_scaling == o.rope_scaling && rope_layout == o.rope_layout &&
         tied_embeddings == o.tied_embeddings && qkv_bias == o.qkv_bias && bos_id == o.bos_id && eos_id == o.eos_id;
}

void ModelConfig::require_llama_structure(const std::string& what) const {
  if (!is_llama_structure())
    throw UnsupportedError(what + " supports only the LLaMA layer structure so far; architecture '" + architecture +
                           "' (" + norm_kind_name(spec.norm) + ", " + position_kind_name(spec.position) +
                           (spec.n_experts > 0 ? ", mixture of experts" : "") + ") is not");
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
  if (spec.position == PositionKind::Rope && (rope_dim() % 2 != 0 || rope_dim() > head_dim || spec.rope_dim < 0))
    throw InputError(source + ": rotary dimension must be even and at most head_dim (" + std::to_string(head_dim) + "), got " +
                     std::to_string(rope_dim()));
  if (!spec.layer_window.empty() && static_cast<int>(spec.layer_window.size()) != n_layers)
    throw InputError(source + ": per-layer sliding windows give " + std::to_string(spec.layer_window.size()) +
                     " layers, the model has " + std::to_string(n_layers));
  for (int w : spec.layer_window)
    if (w < 0) throw InputError(source + ": sliding window must be non-negative, got " + std::to_string(w));
  if (spec.n_experts < 0 || (spec.n_experts > 0 && (spec.experts_per_token < 1 || spec.experts_per_token > spec.n_experts)))
    throw InputError(source + ": experts per token (" + std::to_string(spec.experts_per_token) + ") must be in 1.." +
                     std::to_string(spec.n_experts));
  if (spec.n_experts > 0 && !spec.mlp_gated) throw InputError(source + ": mixture of experts needs gated experts");
  if (spec.shared_input_norm && !spec.parallel_residual)
    throw InputError(source + ": a shared input norm needs the parallel residual layout");
  if (spec.learned_position_offset < 0)
    throw InputError(source + ": learned position offset must be non-negative, got " + std::to_string(spec.learned_position_offset));
  if (!(spec.attn_scale >= 0.0f) || !std::isfinite(spec.attn_scale) || !(spec.embed_scale > 0.0f) || !std::isfinite(spec.embed_scale) ||
      !(spec.rope_local_theta >= 0.0f))
    throw InputError(source + ": attention scale, embedding scale and local RoPE base must be finite and positive");
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
  const int64_t d = dim, q = int64_t(n_heads) * head_dim, kv = int64_t(n_kv_heads) * head_dim, h = hidden_dim;
  const int64_t norm = spec.norm_bias ? 2 * d : d;  // weight (+ bias)
  int64_t per_layer = norm /*attn norm*/ + d * q + 2 * d * kv + q * d;
  if (!spec.shared_input_norm) per_layer += norm;  // FFN norm
  if (qkv_bias) per_layer += q + 2 * kv;
  if (spec.o_bias) per_layer += d;
  if (spec.qk_norm) per_layer += 2 * int64_t(head_dim);
  if (spec.post_attn_norm) per_layer += norm;
  if (spec.post_ffn_norm) per_layer += norm;
  const int64_t mlp = (spec.mlp_gated ? 3 : 2) * d * h + (spec.mlp_bias ? (spec.mlp_gated ? 2 : 1) * h + d : 0);
  per_layer += spec.n_experts > 0 ? spec.n_experts * mlp + int64_t(spec.n_experts) * d : mlp;
  int64_t total = int64_t(vocab_size) * d + n_layers * per_layer + norm;
  if (!tied_embeddings) total += int64_t(vocab_size) * d;
  if (spec.embed_norm) total += norm;
  if (spec.position == PositionKind::Learned) total += (int64_t(max_seq_len) + spec.learned_position_offset) * d;
  return total;
}

}  // namespace sq
