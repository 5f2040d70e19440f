// MPT (transformers models/mpt: configuration_mpt.py MptConfig / MptAttentionConfig,
// modeling_mpt.py MptForCausalLM): ALiBi, LayerNorms without bias, fused Wqkv, exact-GELU MLP of
// 4·d_model, no biases, tied head.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// MptConfig keys: d_model, n_heads, n_layers (required; aliases hidden_size, num_attention_heads,
/// num_hidden_layers), max_seq_len (2048), vocab_size (50368), layer_norm_epsilon (1e-5),
/// tie_word_embeddings (true), bos/eos (none: ModelConfig's defaults), attn_config.softmax_scale
/// (null: 1/√head_dim). The MLP is 4·d_model wide whatever expansion_ratio says (MptMLP), and
/// transformers always runs ALiBi with alibi_bias_max 8 and no position embedding. Refused by
/// name (transformers would ignore them and compute something else than the checkpoint's model):
/// attn_config.alibi false, alibi_bias_max != 8, qk_ln, clip_qkv, attn_type other than
/// multihead_attention, prefix_lm, no_bias false, logit_scale.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer(r.pick({"d_model", "hidden_size"}), nullptr);
  c.n_heads = r.integer(r.pick({"n_heads", "num_attention_heads"}), nullptr);
  c.n_layers = r.integer(r.pick({"n_layers", "num_hidden_layers"}), nullptr);
  c.n_kv_heads = c.n_heads;
  head_dim(r, c, "d_model", "n_heads");
  c.hidden_dim = 4 * c.dim;
  c.max_seq_len = r.integer("max_seq_len", 2048);
  c.vocab_size = r.integer("vocab_size", 50368);
  c.norm_eps = r.number_f32("layer_norm_epsilon", 1e-5f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  const ModelConfig defaults;
  token_ids(r, c, defaults.bos_id, defaults.eos_id);
  if (!r.boolean("no_bias", true)) r.refuse("no_bias", "true: transformers' MPT has no biases");
  if (r.present("logit_scale")) r.refuse("logit_scale", "null");

  const HfConfigReader a = r.object("attn_config");
  if (!a.boolean("alibi", true)) a.refuse("alibi", "true: MPT with learned positions is not implemented");
  if (a.integer("alibi_bias_max", 8) != 8) a.refuse("alibi_bias_max", "8");
  if (a.boolean("qk_ln", false)) a.refuse("qk_ln", "false");
  if (a.present("clip_qkv")) a.refuse("clip_qkv", "null");
  if (a.string("attn_type", "multihead_attention") != "multihead_attention") a.refuse("attn_type", "'multihead_attention'");
  if (a.boolean("prefix_lm", false)) a.refuse("prefix_lm", "false");

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.position = PositionKind::Alibi;
  s.mlp_gated = false;
  s.activation = Activation::Gelu;
  if (a.present("softmax_scale")) s.attn_scale = a.number_f32("softmax_scale", 0.0f);
}

/// transformer.wte -> model.embed_tokens, norm_f -> model.norm; per layer norm_1 ->
/// input_layernorm, norm_2 -> post_attention_layernorm, attn.Wqkv [3d, d] = [q; k; v] rows
/// (`chunk(3)`), attn.out_proj -> o_proj, ffn.up_proj / ffn.down_proj -> mlp.up_proj / down_proj.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim;
  const std::string m = "transformer.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "wte.weight", {c.vocab_size, d});
    copy(src, out, names::kFinalNorm, m + "norm_f.weight", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "blocks." + std::to_string(l) + ".", p = names::layer(l);
    copy(src, out, p + "input_layernorm.weight", s + "norm_1.weight", {d});
    copy(src, out, p + "post_attention_layernorm.weight", s + "norm_2.weight", {d});
    const auto w = split_rows(src.get(s + "attn.Wqkv.weight", {3 * d, d}), {d, d, d});
    out[p + "self_attn.q_proj.weight"] = w[0];
    out[p + "self_attn.k_proj.weight"] = w[1];
    out[p + "self_attn.v_proj.weight"] = w[2];
    copy(src, out, p + "self_attn.o_proj.weight", s + "attn.out_proj.weight", {d, d});
    copy(src, out, p + "mlp.up_proj.weight", s + "ffn.up_proj.weight", {h, d});
    copy(src, out, p + "mlp.down_proj.weight", s + "ffn.down_proj.weight", {d, h});
  }
}


/// MptConfig for `c`: d_model, n_heads, n_layers, max_seq_len, no_bias true, expansion_ratio 4,
/// attn_config with ALiBi (bias max 8) and softmax_scale (null for 1/√head_dim).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json attn;
  attn["attn_type"] = "multihead_attention";
  attn["attn_impl"] = "torch";
  attn["alibi"] = true;
  attn["alibi_bias_max"] = 8;
  attn["qk_ln"] = false;
  attn["clip_qkv"] = nullptr;
  attn["prefix_lm"] = false;
  attn["softmax_scale"] = c.spec.attn_scale > 0 ? number_json(c.spec.attn_scale) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json j;
  j["architectures"] = {"MptForCausalLM"};
  j["model_type"] = "mpt";
  j["d_model"] = c.dim;
  j["n_heads"] = c.n_heads;
  j["n_layers"] = c.n_layers;
  j["expansion_ratio"] = 4;
  j["max_seq_len"] = c.max_seq_len;
  j["vocab_size"] = c.vocab_size;
  j["layer_norm_epsilon"] = number_json(c.norm_eps);
  j["no_bias"] = true;
  j["logit_scale"] = nullptr;
  j["attn_config"] = std::move(attn);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: transformer.* names, attn.Wqkv = [q; k; v] rows, ffn.up_proj /
/// down_proj, norm_1 / norm_2 / norm_f without biases.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "transformer.";
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(m + "wte.weight", names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "blocks." + std::to_string(l) + ".", p = names::layer(l), a = p + "self_attn.";
    out.push_back(plan_tensor(s + "norm_1.weight", p + "input_layernorm.weight"));
    out.push_back(plan_linear(s + "attn.Wqkv", {a + "q_proj", a + "k_proj", a + "v_proj"}));
    out.push_back(plan_linear(s + "attn.out_proj", {a + "o_proj"}));
    out.push_back(plan_tensor(s + "norm_2.weight", p + "post_attention_layernorm.weight"));
    out.push_back(plan_linear(s + "ffn.up_proj", {p + "mlp.up_proj"}));
    out.push_back(plan_linear(s + "ffn.down_proj", {p + "mlp.down_proj"}));
  }
  out.push_back(plan_tensor(m + "norm_f.weight", names::kFinalNorm));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture mpt_architecture() {
  HfArchitecture a;
  a.name = "mpt";
  a.classes = {"MptForCausalLM"};
  a.model_types = {"mpt"};
  a.base_prefix = "transformer.";
  a.layer_prefix = "transformer.blocks.";
  a.layers_key = "n_layers";
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
