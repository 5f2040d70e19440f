// Gemma 3 text (transformers models/gemma3: configuration_gemma3.py Gemma3TextConfig,
// modeling_gemma3.py Gemma3ForCausalLM): local sliding-window and global layers with their own
// RoPE bases, QK-norm, norms before and after attention and FFN, GeGLU (tanh), embedding × √d,
// and (1 + w) RMSNorms (Gemma3RMSNorm), folded into the weights here.
#include <cmath>

#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"
#include "formats/json_limits.h"

namespace sq::hf {
namespace {

/// RoPE per layer type. transformers 5: rope_parameters = {"full_attention": {...},
/// "sliding_attention": {...}} (each a default / linear / llama3 object); transformers 4:
/// rope_theta (global layers, default 1e6), rope_local_base_freq (local layers, default 1e4) and
/// rope_scaling (global layers only). Scaling on the local layers is refused (sqkit applies it to
/// global layers only), as is a partial rotary factor.
void configure_rope(const HfConfigReader& r, ModelConfig& c) {
  const std::string& source = r.source();
  HfRopeObject full, local;
  if (r.present("rope_parameters")) {
    const nlohmann::json& p = r.json().at("rope_parameters");
    if (!p.is_object()) throw InputError(source + ": key 'rope_parameters' must be an object, got " + json_excerpt(p));
    for (auto it = p.begin(); it != p.end(); ++it) {
      if (it.key() != "full_attention" && it.key() != "sliding_attention")
        throw UnsupportedError(source + ": key 'rope_parameters." + it.key() +
                               "' is not supported (expected the per-layer-type objects 'full_attention' and "
                               "'sliding_attention')");
      if (it.value().is_null()) continue;
      (it.key() == "full_attention" ? full : local) =
          parse_hf_rope_object(it.value(), "rope_parameters." + it.key(), source);
    }
  }
  if (r.present("rope_scaling")) {
    const HfRopeObject legacy = parse_hf_rope_object(r.json().at("rope_scaling"), "rope_scaling", source);
    full.scaling = legacy.scaling;
    if (!full.theta) full.theta = legacy.theta;
  }
  for (const auto* o : {&full, &local})
    if (o->partial_rotary_factor && *o->partial_rotary_factor != 1.0)
      throw UnsupportedError(source + ": partial_rotary_factor = " + std::to_string(*o->partial_rotary_factor) +
                             " is not supported for Gemma 3 (expected 1)");
  if (!local.scaling.is_default())
    throw UnsupportedError(source + ": RoPE scaling '" + rope_scaling_type_name(local.scaling.type) +
                           "' on the sliding_attention layers is not supported (expected 'default'; sqkit scales "
                           "the global layers only)");
  c.rope_theta = full.theta ? *full.theta : r.number_f32("rope_theta", 1e6f);
  c.rope_scaling = full.scaling;
  c.spec.rope_local_theta = local.theta ? *local.theta : r.number_f32("rope_local_base_freq", 1e4f);
}

/// Gemma3TextConfig keys and defaults: hidden_size, intermediate_size, num_hidden_layers,
/// num_attention_heads (required), num_key_value_heads (4), head_dim (256), vocab_size (262208),
/// max_position_embeddings (131072), rms_norm_eps (1e-6), hidden_activation
/// (gelu_pytorch_tanh, gated), query_pre_attn_scalar (256: attn_scale = scalar^-0.5),
/// attention_bias (q/k/v/o biases), sliding_window (4096) on the layers layer_types marks
/// "sliding_attention" (absent: every sliding_window_pattern-th layer, default 6, is global),
/// tie_word_embeddings (true), bos/eos 2/1. embed_scale = sqrt(hidden_size) rounded to FP32 (the
/// buffer `torch.tensor(hidden_size**0.5)`). Refused by name: attn_logit_softcapping and
/// final_logit_softcapping other than null, use_bidirectional_attention.
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer("hidden_size", nullptr);
  c.hidden_dim = r.integer("intermediate_size", nullptr);
  c.n_layers = r.integer("num_hidden_layers", nullptr);
  c.n_heads = r.integer("num_attention_heads", nullptr);
  c.n_kv_heads = r.integer("num_key_value_heads", 4);
  c.head_dim = r.integer("head_dim", 256);
  c.vocab_size = r.integer("vocab_size", 262208);
  c.max_seq_len = r.integer("max_position_embeddings", 131072);
  c.norm_eps = r.number_f32("rms_norm_eps", 1e-6f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  token_ids(r, c, 2, 1);
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (r.present(key)) r.refuse(key, "null: logit soft-capping is not implemented");
  if (r.boolean("use_bidirectional_attention", false))
    r.refuse("use_bidirectional_attention", "false: sqkit runs causal decoders");

  DecoderSpec& s = c.spec;
  s.activation = activation(r, "hidden_activation", "gelu_pytorch_tanh");
  s.qk_norm = true;
  s.post_attn_norm = true;
  s.post_ffn_norm = true;
  c.qkv_bias = s.o_bias = r.boolean("attention_bias", false);
  s.attn_scale = float(std::pow(double(r.number_f32("query_pre_attn_scalar", 256.0f)), -0.5));
  s.embed_scale = float(std::sqrt(double(c.dim)));
  configure_rope(r, c);

  std::vector<bool> fallback = all_layers(c, r.source());
  const int pattern = r.integer("sliding_window_pattern", 6);
  for (int l = 0; l < c.n_layers; ++l) fallback[size_t(l)] = pattern <= 0 || (l + 1) % pattern != 0;
  const int window = r.json().contains("sliding_window") ? r.integer("sliding_window", 0) : 4096;
  set_windows(c, sliding_layers(r, c, fallback), window, r.source());
}

/// Canonical names as stored, except the norms: input_layernorm -> input_layernorm;
/// post_attention_layernorm (on the attention output) -> attn_post_norm;
/// pre_feedforward_layernorm (the FFN input norm) -> post_attention_layernorm;
/// post_feedforward_layernorm -> mlp_post_norm; every RMSNorm weight, q_norm / k_norm and
/// model.norm included, becomes 1 + w (one_plus).
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, hd = c.head_dim;
  auto norm = [&](const std::string& to, const std::string& from, int64_t n) { out[to] = one_plus(src.get(from, {n})); };
  if (selection.globals) {
    copy_llama_globals(src, c, out);
    norm(names::kFinalNorm, names::kFinalNorm, d);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string p = names::layer(l);
    norm(p + "input_layernorm.weight", p + "input_layernorm.weight", d);
    norm(p + "attn_post_norm.weight", p + "post_attention_layernorm.weight", d);
    norm(p + "post_attention_layernorm.weight", p + "pre_feedforward_layernorm.weight", d);
    norm(p + "mlp_post_norm.weight", p + "post_feedforward_layernorm.weight", d);
    norm(p + "self_attn.q_norm.weight", p + "self_attn.q_norm.weight", hd);
    norm(p + "self_attn.k_norm.weight", p + "self_attn.k_norm.weight", hd);
    copy_llama_attention(src, c, l, out);
    copy_llama_mlp(src, c, l, out);
  }
}

/// Gemma3TextConfig for `c`: the keys configure reads, RoPE as transformers 5's per-layer-type
/// rope_parameters, layer_types from spec.layer_window (one window for every sliding layer),
/// query_pre_attn_scalar = attn_scale^−2. The embedding scale √hidden_size is implicit in the class
/// (check_config_reads_back refuses another one, and any structure the keys cannot express).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  int window = 0;
  for (int w : c.spec.layer_window) {
    if (w != 0 && window != 0 && w != window)
      throw UnsupportedError("cannot write a Hugging Face Gemma3ForCausalLM config with different sliding windows per layer");
    if (w != 0) window = w;
  }
  nlohmann::ordered_json j;
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["model_type"] = "gemma3_text";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = number_json(c.norm_eps);
  j["hidden_activation"] = hf_activation_name(c.spec.activation);
  // attn_scale = float(scalar^−0.5): the integer scalar when one gives it back (256, head_dim).
  const float scale = c.spec.attn_scale > 0 ? c.spec.attn_scale : float(1.0 / std::sqrt(double(c.head_dim)));
  const double scalar = 1.0 / (double(scale) * double(scale));
  const double whole = std::round(scalar);
  const bool exact = float(std::pow(double(float(whole)), -0.5)) == scale;
  j["query_pre_attn_scalar"] = exact ? nlohmann::ordered_json(int64_t(whole)) : nlohmann::ordered_json(scalar);
  j["attention_bias"] = c.qkv_bias;
  j["sliding_window"] = window > 0 ? window : 4096;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int l = 0; l < c.n_layers; ++l) {
    const bool sliding = !c.spec.layer_window.empty() && c.spec.layer_window[size_t(l)] != 0;
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = std::move(types);
  ModelConfig local = c;
  local.rope_theta = c.spec.rope_local_theta > 0 ? c.spec.rope_local_theta : c.rope_theta;
  local.rope_scaling = RopeScaling{};
  j["rope_parameters"] = {{"full_attention", rope_parameters_json(c, false)}, {"sliding_attention", rope_parameters_json(local, false)}};
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["use_bidirectional_attention"] = false;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  j["pad_token_id"] = 0;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: every norm written as w − 1 (`add`), the four layer norms under
/// their Gemma names, q_norm / k_norm, LLaMA-named q/k/v/o and gate/up/down linears.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l), a = p + "self_attn.";
    out.push_back(plan_tensor(p + "input_layernorm.weight", p + "input_layernorm.weight", -1.0f));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) out.push_back(plan_linear(a + proj));
    out.push_back(plan_tensor(a + "q_norm.weight", a + "q_norm.weight", -1.0f));
    out.push_back(plan_tensor(a + "k_norm.weight", a + "k_norm.weight", -1.0f));
    out.push_back(plan_tensor(p + "post_attention_layernorm.weight", p + "attn_post_norm.weight", -1.0f));
    out.push_back(plan_tensor(p + "pre_feedforward_layernorm.weight", p + "post_attention_layernorm.weight", -1.0f));
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) out.push_back(plan_linear(p + "mlp." + proj));
    out.push_back(plan_tensor(p + "post_feedforward_layernorm.weight", p + "mlp_post_norm.weight", -1.0f));
  }
  out.push_back(plan_tensor(names::kFinalNorm, names::kFinalNorm, -1.0f));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture gemma3_architecture() {
  HfArchitecture a;
  a.name = "gemma3";
  a.classes = {"Gemma3ForCausalLM"};
  a.model_types = {"gemma3_text"};
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
