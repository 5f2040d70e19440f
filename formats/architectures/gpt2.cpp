// GPT-2 (transformers models/gpt2: configuration_gpt2.py GPT2Config, modeling_gpt2.py
// GPT2LMHeadModel): learned absolute positions, pre-LayerNorm, Conv1D projections stored
// [in, out] with a fused c_attn, GELU (tanh) MLP, biases everywhere, tied head.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// GPT2Config keys (each with its attribute alias): n_embd (hidden_size), n_layer
/// (num_hidden_layers), n_head (num_attention_heads) required; n_positions
/// (max_position_embeddings, 1024), vocab_size (50257), n_inner (null: 4·n_embd),
/// layer_norm_epsilon (1e-5), activation_function (gelu_new), scale_attn_weights (true: scores
/// × 1/√head_dim, false: × 1), tie_word_embeddings (true), bos/eos 50256. Refused by name:
/// scale_attn_by_inverse_layer_idx (a per-layer scale), add_cross_attention.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer(r.pick({"n_embd", "hidden_size"}), nullptr);
  c.n_layers = r.integer(r.pick({"n_layer", "num_hidden_layers"}), nullptr);
  c.n_heads = r.integer(r.pick({"n_head", "num_attention_heads"}), nullptr);
  c.n_kv_heads = c.n_heads;
  head_dim(r, c, "n_embd", "n_head");
  c.max_seq_len = r.integer(r.pick({"n_positions", "max_position_embeddings"}), 1024);
  c.vocab_size = r.integer("vocab_size", 50257);
  c.hidden_dim = r.integer("n_inner", 4 * c.dim);
  c.norm_eps = r.number_f32("layer_norm_epsilon", 1e-5f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  token_ids(r, c, 50256, 50256);
  if (r.boolean("scale_attn_by_inverse_layer_idx", false))
    r.refuse("scale_attn_by_inverse_layer_idx", "false: a per-layer attention scale is not implemented");
  if (r.boolean("add_cross_attention", false)) r.refuse("add_cross_attention", "false");

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.norm_bias = true;
  s.position = PositionKind::Learned;
  s.mlp_gated = false;
  s.activation = activation(r, "activation_function", "gelu_new");
  if (!r.boolean("scale_attn_weights", true)) s.attn_scale = 1.0f;
  c.qkv_bias = s.o_bias = s.mlp_bias = true;
}

/// transformer.wte -> model.embed_tokens, wpe -> model.embed_positions [n_positions, d], ln_f ->
/// model.norm; per layer ln_1 -> input_layernorm, ln_2 -> post_attention_layernorm, and every
/// Conv1D weight transposed ([in, out] -> [out, in]): attn.c_attn [d, 3d] -> [q; k; v] rows
/// (`split(n_embd, dim=2)`), attn.c_proj -> o_proj, mlp.c_fc -> up_proj, mlp.c_proj -> down_proj.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim;
  const std::string m = "transformer.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "wte.weight", {c.vocab_size, d});
    copy(src, out, names::kEmbedPositions, m + "wpe.weight", {c.max_seq_len, d});
    copy(src, out, names::kFinalNorm, m + "ln_f.weight", {d});
    copy(src, out, names::kFinalNormBias, m + "ln_f.bias", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l);
    for (const auto& [to, from] : {std::pair<const char*, const char*>{"input_layernorm", "ln_1"},
                                   {"post_attention_layernorm", "ln_2"}}) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {d});
      copy(src, out, p + to + ".bias", s + from + ".bias", {d});
    }
    const auto w = split_rows(transpose(src.get(s + "attn.c_attn.weight", {d, 3 * d})), {d, d, d});
    const auto b = split_rows(src.get(s + "attn.c_attn.bias", {3 * d}), {d, d, d});
    const char* proj[] = {"q_proj", "k_proj", "v_proj"};
    for (int j = 0; j < 3; ++j) {
      out[p + "self_attn." + proj[j] + ".weight"] = w[size_t(j)];
      out[p + "self_attn." + proj[j] + ".bias"] = b[size_t(j)];
    }
    auto conv1d = [&](const std::string& to, const std::string& from, int64_t in, int64_t n_out) {
      out[p + to + ".weight"] = transpose(src.get(s + from + ".weight", {in, n_out}));
      copy(src, out, p + to + ".bias", s + from + ".bias", {n_out});
    };
    conv1d("self_attn.o_proj", "attn.c_proj", d, d);
    conv1d("mlp.up_proj", "mlp.c_fc", d, h);
    conv1d("mlp.down_proj", "mlp.c_proj", h, d);
  }
}


/// GPT2Config for `c`: n_embd, n_layer, n_head, n_positions, n_inner, activation_function,
/// scale_attn_weights (false for a softmax scale of 1).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["n_embd"] = c.dim;
  j["n_layer"] = c.n_layers;
  j["n_head"] = c.n_heads;
  j["n_positions"] = c.max_seq_len;
  j["n_inner"] = c.hidden_dim;
  j["vocab_size"] = c.vocab_size;
  j["layer_norm_epsilon"] = number_json(c.norm_eps);
  j["activation_function"] = c.spec.activation == Activation::GeluTanh ? "gelu_new" : hf_activation_name(c.spec.activation);
  j["scale_attn_weights"] = c.spec.attn_scale != 1.0f;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["add_cross_attention"] = false;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: transformer.* names, every projection a Conv1D (`conv1d`: stored
/// [in, out]; quantized exports refuse it), c_attn = [q; k; v].
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "transformer.";
  std::vector<HfPlanEntry> out;
  auto conv1d = [&](const std::string& name, std::vector<std::string> sources) {
    HfPlanEntry e = plan_linear(name, std::move(sources));
    e.conv1d = true;
    out.push_back(std::move(e));
  };
  out.push_back(plan_tensor(m + "wte.weight", names::kEmbed));
  out.push_back(plan_tensor(m + "wpe.weight", names::kEmbedPositions));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l), a = p + "self_attn.";
    for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + "ln_1" + x, p + "input_layernorm" + x));
    conv1d(s + "attn.c_attn", {a + "q_proj", a + "k_proj", a + "v_proj"});
    conv1d(s + "attn.c_proj", {a + "o_proj"});
    for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + "ln_2" + x, p + "post_attention_layernorm" + x));
    conv1d(s + "mlp.c_fc", {p + "mlp.up_proj"});
    conv1d(s + "mlp.c_proj", {p + "mlp.down_proj"});
  }
  out.push_back(plan_tensor(m + "ln_f.weight", names::kFinalNorm));
  out.push_back(plan_tensor(m + "ln_f.bias", names::kFinalNormBias));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture gpt2_architecture() {
  HfArchitecture a;
  a.name = "gpt2";
  a.classes = {"GPT2LMHeadModel"};
  a.model_types = {"gpt2"};
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
