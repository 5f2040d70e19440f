// OPT (transformers models/opt: configuration_opt.py OPTConfig, modeling_opt.py OPTForCausalLM):
// pre-LayerNorm (with biases), learned absolute positions with offset 2, ReLU MLP fc1/fc2, biases
// on every projection, tied head.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// OPTConfig keys: hidden_size, ffn_dim, num_hidden_layers, num_attention_heads (required),
/// vocab_size (50272), max_position_embeddings (2048; the position table has 2 more rows,
/// OPTLearnedPositionalEmbedding's offset), activation_function (relu), enable_bias (true: q/k/v,
/// out_proj, fc1, fc2 biases), tie_word_embeddings (true), bos/eos 2/2. LayerNorm eps is
/// nn.LayerNorm's 1e-5 (OPT has no key for it). Refused by name: do_layer_norm_before false (OPT
/// 350m's post-norm), _remove_final_layer_norm true, word_embed_proj_dim != hidden_size
/// (project_in / project_out), layer_norm_elementwise_affine false.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer("hidden_size", nullptr);
  c.hidden_dim = r.integer("ffn_dim", nullptr);
  c.n_layers = r.integer("num_hidden_layers", nullptr);
  c.n_heads = r.integer("num_attention_heads", nullptr);
  c.n_kv_heads = c.n_heads;
  head_dim(r, c, "hidden_size", "num_attention_heads");
  c.vocab_size = r.integer("vocab_size", 50272);
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.norm_eps = 1e-5f;
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  token_ids(r, c, 2, 2);
  if (!r.boolean("do_layer_norm_before", true)) r.refuse("do_layer_norm_before", "true: post-LayerNorm OPT is not implemented");
  if (r.boolean("_remove_final_layer_norm", false)) r.refuse("_remove_final_layer_norm", "false");
  if (r.integer("word_embed_proj_dim", c.dim) != c.dim)
    r.refuse("word_embed_proj_dim", "hidden_size = " + std::to_string(c.dim) + ": project_in / project_out are not implemented");
  if (!r.boolean("layer_norm_elementwise_affine", true)) r.refuse("layer_norm_elementwise_affine", "true");

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.norm_bias = true;
  s.position = PositionKind::Learned;
  s.learned_position_offset = 2;
  s.mlp_gated = false;
  s.activation = activation(r, "activation_function", "relu");
  const bool bias = r.boolean("enable_bias", true);
  c.qkv_bias = s.o_bias = s.mlp_bias = bias;
}

/// model.decoder.embed_tokens -> model.embed_tokens; embed_positions -> model.embed_positions
/// [max_position_embeddings + 2, d]; final_layer_norm -> model.norm; per layer
/// self_attn_layer_norm -> input_layernorm, self_attn.{q,k,v}_proj, out_proj -> o_proj,
/// final_layer_norm -> post_attention_layernorm, fc1 -> mlp.up_proj, fc2 -> mlp.down_proj.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim;
  const std::string m = "model.decoder.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "embed_tokens.weight", {c.vocab_size, d});
    copy(src, out, names::kEmbedPositions, m + "embed_positions.weight", {int64_t(c.max_seq_len) + 2, d});
    copy(src, out, names::kFinalNorm, m + "final_layer_norm.weight", {d});
    copy(src, out, names::kFinalNormBias, m + "final_layer_norm.bias", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  }
  const bool bias = c.qkv_bias;
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "layers." + std::to_string(l) + ".", p = names::layer(l);
    auto linear = [&](const std::string& to, const std::string& from, int64_t rows, int64_t cols) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {rows, cols});
      if (bias) copy(src, out, p + to + ".bias", s + from + ".bias", {rows});
    };
    for (const auto& [to, from] : {std::pair<const char*, const char*>{"input_layernorm", "self_attn_layer_norm"},
                                   {"post_attention_layernorm", "final_layer_norm"}}) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {d});
      copy(src, out, p + to + ".bias", s + from + ".bias", {d});
    }
    linear("self_attn.q_proj", "self_attn.q_proj", d, d);
    linear("self_attn.k_proj", "self_attn.k_proj", d, d);
    linear("self_attn.v_proj", "self_attn.v_proj", d, d);
    linear("self_attn.o_proj", "self_attn.out_proj", d, d);
    linear("mlp.up_proj", "fc1", h, d);
    linear("mlp.down_proj", "fc2", d, h);
  }
}


/// OPTConfig for `c` (pre-LayerNorm, no projections: do_layer_norm_before true,
/// word_embed_proj_dim = hidden_size); enable_bias covers every projection's bias.
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"OPTForCausalLM"};
  j["model_type"] = "opt";
  j["hidden_size"] = c.dim;
  j["ffn_dim"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["activation_function"] = hf_activation_name(c.spec.activation);
  j["enable_bias"] = c.qkv_bias;
  j["do_layer_norm_before"] = true;
  j["_remove_final_layer_norm"] = false;
  j["word_embed_proj_dim"] = c.dim;
  j["layer_norm_elementwise_affine"] = true;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  j["pad_token_id"] = c.vocab_size > 1 ? 1 : 0;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: model.decoder.* names, out_proj, fc1 / fc2.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "model.decoder.";
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(m + "embed_tokens.weight", names::kEmbed));
  out.push_back(plan_tensor(m + "embed_positions.weight", names::kEmbedPositions));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "layers." + std::to_string(l) + ".", p = names::layer(l);
    for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + "self_attn_layer_norm" + x, p + "input_layernorm" + x));
    for (const char* proj : {"k_proj", "v_proj", "q_proj"}) out.push_back(plan_linear(s + "self_attn." + proj, {p + "self_attn." + proj}));
    out.push_back(plan_linear(s + "self_attn.out_proj", {p + "self_attn.o_proj"}));
    for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + "final_layer_norm" + x, p + "post_attention_layernorm" + x));
    out.push_back(plan_linear(s + "fc1", {p + "mlp.up_proj"}));
    out.push_back(plan_linear(s + "fc2", {p + "mlp.down_proj"}));
  }
  out.push_back(plan_tensor(m + "final_layer_norm.weight", names::kFinalNorm));
  out.push_back(plan_tensor(m + "final_layer_norm.bias", names::kFinalNormBias));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture opt_architecture() {
  HfArchitecture a;
  a.name = "opt";
  a.classes = {"OPTForCausalLM"};
  a.model_types = {"opt"};
  a.base_prefix = "model.";
  a.layer_prefix = "model.decoder.layers.";
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
