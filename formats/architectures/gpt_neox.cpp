// GPT-NeoX / Pythia (transformers models/gpt_neox: configuration_gpt_neox.py GPTNeoXConfig,
// modeling_gpt_neox.py GPTNeoXForCausalLM): LayerNorm, partial rotary embedding, fused per-head
// query_key_value, parallel residual with two input norms, GELU MLP, untied embed_out.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// GPTNeoXConfig keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads
/// (required), vocab_size (50432), max_position_embeddings (2048), layer_norm_eps (1e-5),
/// hidden_act (gelu), use_parallel_residual (true: attention and MLP read the same x through
/// input_layernorm and post_attention_layernorm), attention_bias (true: query_key_value and dense
/// biases), tie_word_embeddings (false), bos/eos 0/2, RoPE with partial_rotary_factor (default
/// 0.25; legacy rotary_pct) and θ (legacy rotary_emb_base). The MLP always has biases.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer("hidden_size", nullptr);
  c.hidden_dim = r.integer("intermediate_size", nullptr);
  c.n_layers = r.integer("num_hidden_layers", nullptr);
  c.n_heads = r.integer("num_attention_heads", nullptr);
  c.n_kv_heads = c.n_heads;
  head_dim(r, c, "hidden_size", "num_attention_heads");
  c.vocab_size = r.integer("vocab_size", 50432);
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number_f32("layer_norm_eps", 1e-5f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", false);
  token_ids(r, c, 0, 2);
  HfRopeOptions rope_options;
  rope_options.partial_rotary = true;
  rope_options.default_partial_rotary = 0.25;
  rope_options.legacy_partial_key = "rotary_pct";
  rope_options.legacy_theta_key = "rotary_emb_base";
  rope(r, c, rope_options);

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.norm_bias = true;
  s.parallel_residual = r.boolean("use_parallel_residual", true);
  s.mlp_gated = false;
  s.activation = activation(r, "hidden_act", "gelu");
  s.mlp_bias = true;
  c.qkv_bias = s.o_bias = r.boolean("attention_bias", true);
}

/// gpt_neox.embed_in -> model.embed_tokens; final_layer_norm -> model.norm; embed_out -> lm_head;
/// per layer input_layernorm / post_attention_layernorm as named, attention.query_key_value
/// [3·d, d] = per head [q_h; k_h; v_h] (`view(n_heads, 3·head_dim)`, split_qkv_per_head),
/// attention.dense -> o_proj, mlp.dense_h_to_4h -> up_proj, mlp.dense_4h_to_h -> down_proj.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim, q = int64_t(c.n_heads) * c.head_dim;
  const std::string m = "gpt_neox.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "embed_in.weight", {c.vocab_size, d});
    copy(src, out, names::kFinalNorm, m + "final_layer_norm.weight", {d});
    copy(src, out, names::kFinalNormBias, m + "final_layer_norm.bias", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "embed_out.weight", {c.vocab_size, d});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "layers." + std::to_string(l) + ".", p = names::layer(l);
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      copy(src, out, p + norm + ".weight", s + norm + ".weight", {d});
      copy(src, out, p + norm + ".bias", s + norm + ".bias", {d});
    }
    const auto w = split_qkv_per_head(src.get(s + "attention.query_key_value.weight", {3 * q, d}), c.n_heads, c.head_dim);
    const char* proj[] = {"q_proj", "k_proj", "v_proj"};
    for (int j = 0; j < 3; ++j) out[p + "self_attn." + proj[j] + ".weight"] = w[size_t(j)];
    if (c.qkv_bias) {
      const auto b = split_qkv_per_head(src.get(s + "attention.query_key_value.bias", {3 * q}), c.n_heads, c.head_dim);
      for (int j = 0; j < 3; ++j) out[p + "self_attn." + proj[j] + ".bias"] = b[size_t(j)];
    }
    copy(src, out, p + "self_attn.o_proj.weight", s + "attention.dense.weight", {d, q});
    if (c.spec.o_bias) copy(src, out, p + "self_attn.o_proj.bias", s + "attention.dense.bias", {d});
    copy(src, out, p + "mlp.up_proj.weight", s + "mlp.dense_h_to_4h.weight", {h, d});
    copy(src, out, p + "mlp.up_proj.bias", s + "mlp.dense_h_to_4h.bias", {h});
    copy(src, out, p + "mlp.down_proj.weight", s + "mlp.dense_4h_to_h.weight", {d, h});
    copy(src, out, p + "mlp.down_proj.bias", s + "mlp.dense_4h_to_h.bias", {d});
  }
}


/// GPTNeoXConfig for `c`: RoPE as rope_parameters with partial_rotary_factor; attention_bias
/// covers query_key_value and dense (the MLP always has biases).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPTNeoXForCausalLM"};
  j["model_type"] = "gpt_neox";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["layer_norm_eps"] = number_json(c.norm_eps);
  j["hidden_act"] = hf_activation_name(c.spec.activation);
  j["use_parallel_residual"] = c.spec.parallel_residual;
  j["attention_bias"] = c.qkv_bias;
  j["rope_parameters"] = rope_parameters_json(c, true);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: gpt_neox.* names, query_key_value = per head [q_h; k_h; v_h] rows
/// (qkv_per_group_rows with groups of one head), embed_out for an untied head.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "gpt_neox.";
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(m + "embed_in.weight", names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "layers." + std::to_string(l) + ".", p = names::layer(l), a = p + "self_attn.";
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"})
      for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + norm + x, p + norm + x));
    HfPlanEntry qkv = plan_linear(s + "attention.query_key_value", {a + "q_proj", a + "k_proj", a + "v_proj"});
    qkv.rows = qkv_per_group_rows(c.n_heads, 1, c.head_dim);
    out.push_back(std::move(qkv));
    out.push_back(plan_linear(s + "attention.dense", {a + "o_proj"}));
    out.push_back(plan_linear(s + "mlp.dense_h_to_4h", {p + "mlp.up_proj"}));
    out.push_back(plan_linear(s + "mlp.dense_4h_to_h", {p + "mlp.down_proj"}));
  }
  out.push_back(plan_tensor(m + "final_layer_norm.weight", names::kFinalNorm));
  out.push_back(plan_tensor(m + "final_layer_norm.bias", names::kFinalNormBias));
  if (!c.tied_embeddings) out.push_back(plan_linear("embed_out", {"lm_head"}));
  return out;
}

}  // namespace

HfArchitecture gpt_neox_architecture() {
  HfArchitecture a;
  a.name = "gpt_neox";
  a.classes = {"GPTNeoXForCausalLM"};
  a.model_types = {"gpt_neox"};
  a.base_prefix = "gpt_neox.";
  a.layer_prefix = "gpt_neox.layers.";
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
