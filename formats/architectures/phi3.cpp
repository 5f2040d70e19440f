// Phi-3 (transformers models/phi3: configuration_phi3.py Phi3Config, modeling_phi3.py
// Phi3ForCausalLM): Llama's structure with fused qkv_proj and gate_up_proj weights.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// Phi3Config keys (configure_llama_like; partial_rotary_factor allowed, Phi3Attention rotates
/// the first int(head_dim × factor) channels) plus sliding_window (default null; every layer).
/// rope_type longrope (Phi-3 128k) is refused by name.
void configure(const HfConfigReader& r, ModelConfig& c) {
  HfRopeOptions rope;
  rope.partial_rotary = true;
  configure_llama_like(r, c, {.vocab_size = 32064, .max_position_embeddings = 4096, .rms_norm_eps = 1e-5f, .bos = 1, .eos = 32000},
                       rope);
  set_windows(c, all_layers(c, r.source()), r.integer("sliding_window", 0), r.source());
}

/// self_attn.qkv_proj [(n_heads + 2·n_kv)·head_dim, d] = [q; k; v] rows (Phi3Attention slices
/// the output at n_heads·head_dim and + n_kv·head_dim); mlp.gate_up_proj [2h, d] = [gate; up]
/// (`chunk(2)`).
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  if (selection.globals) copy_llama_globals(src, c, out);
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string p = names::layer(l), a = p + "self_attn.";
    copy_llama_norms(src, c, l, out);
    const auto qkv = split_rows(src.get(a + "qkv_proj.weight", {q + 2 * kv, d}), {q, kv, kv});
    out[a + "q_proj.weight"] = qkv[0];
    out[a + "k_proj.weight"] = qkv[1];
    out[a + "v_proj.weight"] = qkv[2];
    copy(src, out, a + "o_proj.weight", a + "o_proj.weight", {d, q});
    const auto gate_up = split_rows(src.get(p + "mlp.gate_up_proj.weight", {2 * h, d}), {h, h});
    out[p + "mlp.gate_proj.weight"] = gate_up[0];
    out[p + "mlp.up_proj.weight"] = gate_up[1];
    copy(src, out, p + "mlp.down_proj.weight", p + "mlp.down_proj.weight", {d, h});
  }
}

/// Phi3Config: the LLaMA keys plus partial_rotary_factor (rotated channels / head_dim) and
/// pad_token_id 0 (Phi3Config's default 32000 is outside small vocabularies: nn.Embedding refuses
/// a padding_idx past its rows).
nlohmann::ordered_json make_config(const ModelConfig& c) {
  ModelConfig plain = c;
  plain.spec.rope_dim = 0;
  nlohmann::ordered_json j = llama_like_config_json(plain, "Phi3ForCausalLM", "phi3", true, false);
  if (c.qkv_bias) throw UnsupportedError("cannot write a Hugging Face Phi-3 config with q/k/v biases (Phi3Config has none)");
  j["partial_rotary_factor"] = c.spec.rope_dim > 0 ? double(c.spec.rope_dim) / double(c.head_dim) : 1.0;
  j["pad_token_id"] = 0;
  return j;
}

/// The fused layout of map_tensors: qkv_proj = [q; k; v] rows, gate_up_proj = [gate; up] rows.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l), a = p + "self_attn.", m = p + "mlp.";
    out.push_back(plan_tensor(p + "input_layernorm.weight"));
    out.push_back(plan_linear(a + "qkv_proj", {a + "q_proj", a + "k_proj", a + "v_proj"}));
    out.push_back(plan_linear(a + "o_proj"));
    out.push_back(plan_tensor(p + "post_attention_layernorm.weight"));
    out.push_back(plan_linear(m + "gate_up_proj", {m + "gate_proj", m + "up_proj"}));
    out.push_back(plan_linear(m + "down_proj"));
  }
  out.push_back(plan_tensor(names::kFinalNorm));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture phi3_architecture() {
  HfArchitecture a;
  a.name = "phi3";
  a.classes = {"Phi3ForCausalLM"};
  a.model_types = {"phi3"};
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
