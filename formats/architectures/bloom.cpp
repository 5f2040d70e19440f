// BLOOM (transformers models/bloom: configuration_bloom.py BloomConfig, modeling_bloom.py
// BloomForCausalLM): ALiBi, a LayerNorm right after the embedding, fused per-head
// query_key_value, GELU (tanh form, bloom_gelu_forward) MLP of 4·hidden, biases everywhere.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// BloomConfig keys (with attribute aliases): hidden_size (n_embed), n_layer (num_hidden_layers),
/// n_head (num_attention_heads) required; vocab_size (250880), layer_norm_epsilon (1e-5),
/// tie_word_embeddings (true), bos/eos 1/2. BLOOM has no position limit (ALiBi); max_seq_len is
/// `seq_length` when given, else 2048 (BLOOM's training context). The MLP is 4·hidden_size wide
/// (BloomMLP). Refused by name: apply_residual_connection_post_layernorm true.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer(r.pick({"hidden_size", "n_embed"}), nullptr);
  c.n_layers = r.integer(r.pick({"n_layer", "num_hidden_layers"}), nullptr);
  c.n_heads = r.integer(r.pick({"n_head", "num_attention_heads"}), nullptr);
  c.n_kv_heads = c.n_heads;
  head_dim(r, c, "hidden_size", "n_head");
  c.hidden_dim = 4 * c.dim;
  c.vocab_size = r.integer("vocab_size", 250880);
  c.max_seq_len = r.integer("seq_length", 2048);
  c.norm_eps = r.number_f32("layer_norm_epsilon", 1e-5f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  token_ids(r, c, 1, 2);
  if (r.boolean("apply_residual_connection_post_layernorm", false))
    r.refuse("apply_residual_connection_post_layernorm", "false");

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.norm_bias = true;
  s.position = PositionKind::Alibi;
  s.embed_norm = true;
  s.mlp_gated = false;
  s.activation = Activation::GeluTanh;
  c.qkv_bias = s.o_bias = s.mlp_bias = true;
}

/// transformer.word_embeddings -> model.embed_tokens, word_embeddings_layernorm ->
/// model.embed_norm, ln_f -> model.norm; per layer input_layernorm / post_attention_layernorm as
/// named, self_attention.query_key_value [3d, d] = per head [q_h; k_h; v_h] (BloomAttention._reshape:
/// `view(n_head, 3, head_dim)`), self_attention.dense -> o_proj, mlp.dense_h_to_4h -> up_proj,
/// mlp.dense_4h_to_h -> down_proj.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim;
  const std::string m = "transformer.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "word_embeddings.weight", {c.vocab_size, d});
    copy(src, out, names::kEmbedNorm, m + "word_embeddings_layernorm.weight", {d});
    copy(src, out, names::kEmbedNormBias, m + "word_embeddings_layernorm.bias", {d});
    copy(src, out, names::kFinalNorm, m + "ln_f.weight", {d});
    copy(src, out, names::kFinalNormBias, m + "ln_f.bias", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l);
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      copy(src, out, p + norm + ".weight", s + norm + ".weight", {d});
      copy(src, out, p + norm + ".bias", s + norm + ".bias", {d});
    }
    const auto w = split_qkv_per_head(src.get(s + "self_attention.query_key_value.weight", {3 * d, d}), c.n_heads, c.head_dim);
    const auto b = split_qkv_per_head(src.get(s + "self_attention.query_key_value.bias", {3 * d}), c.n_heads, c.head_dim);
    const char* proj[] = {"q_proj", "k_proj", "v_proj"};
    for (int j = 0; j < 3; ++j) {
      out[p + "self_attn." + proj[j] + ".weight"] = w[size_t(j)];
      out[p + "self_attn." + proj[j] + ".bias"] = b[size_t(j)];
    }
    auto linear = [&](const std::string& to, const std::string& from, int64_t rows, int64_t cols) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {rows, cols});
      copy(src, out, p + to + ".bias", s + from + ".bias", {rows});
    };
    linear("self_attn.o_proj", "self_attention.dense", d, d);
    linear("mlp.up_proj", "mlp.dense_h_to_4h", h, d);
    linear("mlp.down_proj", "mlp.dense_4h_to_h", d, h);
  }
}


/// BloomConfig for `c` (hidden_size, n_layer, n_head, seq_length = max_seq_len; the MLP width
/// 4·hidden_size, ALiBi, biases and GELU-tanh are the class's, check_config_reads_back refuses
/// anything else).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"BloomForCausalLM"};
  j["model_type"] = "bloom";
  j["hidden_size"] = c.dim;
  j["n_layer"] = c.n_layers;
  j["n_head"] = c.n_heads;
  j["vocab_size"] = c.vocab_size;
  j["seq_length"] = c.max_seq_len;
  j["layer_norm_epsilon"] = number_json(c.norm_eps);
  j["apply_residual_connection_post_layernorm"] = false;
  j["pretraining_tp"] = 1;
  j["slow_but_exact"] = false;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: transformer.* names, word_embeddings_layernorm,
/// self_attention.query_key_value = per head [q_h; k_h; v_h] rows (qkv_per_group_rows).
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "transformer.";
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(m + "word_embeddings.weight", names::kEmbed));
  out.push_back(plan_tensor(m + "word_embeddings_layernorm.weight", names::kEmbedNorm));
  out.push_back(plan_tensor(m + "word_embeddings_layernorm.bias", names::kEmbedNormBias));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l), a = p + "self_attn.";
    for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + "input_layernorm" + x, p + "input_layernorm" + x));
    HfPlanEntry qkv = plan_linear(s + "self_attention.query_key_value", {a + "q_proj", a + "k_proj", a + "v_proj"});
    qkv.rows = qkv_per_group_rows(c.n_heads, 1, c.head_dim);
    out.push_back(std::move(qkv));
    out.push_back(plan_linear(s + "self_attention.dense", {a + "o_proj"}));
    for (const char* x : {".weight", ".bias"})
      out.push_back(plan_tensor(s + "post_attention_layernorm" + x, p + "post_attention_layernorm" + x));
    out.push_back(plan_linear(s + "mlp.dense_h_to_4h", {p + "mlp.up_proj"}));
    out.push_back(plan_linear(s + "mlp.dense_4h_to_h", {p + "mlp.down_proj"}));
  }
  out.push_back(plan_tensor(m + "ln_f.weight", names::kFinalNorm));
  out.push_back(plan_tensor(m + "ln_f.bias", names::kFinalNormBias));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture bloom_architecture() {
  HfArchitecture a;
  a.name = "bloom";
  a.classes = {"BloomForCausalLM"};
  a.model_types = {"bloom"};
  a.base_prefix = "transformer.";
  a.layer_prefix = "transformer.h.";
  a.layers_key = "n_layer";
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
