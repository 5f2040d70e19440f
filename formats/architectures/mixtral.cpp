// Mixtral (transformers models/mixtral: configuration_mixtral.py MixtralConfig,
// modeling_mixtral.py MixtralForCausalLM): Llama's attention with a sparse mixture of SwiGLU
// experts, top-k routing by softmax with renormalized weights (MixtralTopKRouter).
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// MixtralConfig keys (configure_llama_like) plus num_local_experts (default 8),
/// num_experts_per_tok (default 2) and sliding_window (default null; every layer).
void configure(const HfConfigReader& r, ModelConfig& c) {
  configure_llama_like(r, c, {.vocab_size = 32000, .max_position_embeddings = 4096 * 32, .rms_norm_eps = 1e-5f, .bos = 1, .eos = 2});
  c.spec.n_experts = r.integer("num_local_experts", 8);
  c.spec.experts_per_token = r.integer("num_experts_per_tok", 2);
  set_windows(c, all_layers(c, r.source()), r.integer("sliding_window", 0), r.source());
}

/// Two layouts of the experts: the checkpoint one (transformers < 5 and what 5 saves),
///   block_sparse_moe.gate.weight [E, d] -> mlp.router.weight
///   block_sparse_moe.experts.{e}.w1 / w3 / w2 -> mlp.experts.{e}.gate_proj / up_proj / down_proj,
/// and transformers 5's fused in-memory one, mlp.gate.weight, mlp.experts.gate_up_proj [E, 2h, d]
/// (per expert [gate; up]) and mlp.experts.down_proj [E, d, h].
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim, E = c.spec.n_experts;
  if (selection.globals) copy_llama_globals(src, c, out);
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string p = names::layer(l);
    copy_llama_norms(src, c, l, out);
    copy_llama_attention(src, c, l, out);
    if (src.has(p + "mlp.experts.gate_up_proj")) {
      copy(src, out, p + "mlp.router.weight", p + "mlp.gate.weight", {E, d});
      const Tensor gate_up = src.get(p + "mlp.experts.gate_up_proj", {E, 2 * h, d});
      const Tensor down = src.get(p + "mlp.experts.down_proj", {E, d, h});
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        const Tensor gu = Tensor::view({2 * h, d}, gate_up.data() + e * 2 * h * d, std::make_shared<const Tensor>(gate_up));
        const auto parts = split_rows(gu, {h, h});
        out[x + "gate_proj.weight"] = parts[0];
        out[x + "up_proj.weight"] = parts[1];
        out[x + "down_proj.weight"] = Tensor::view({d, h}, down.data() + e * d * h, std::make_shared<const Tensor>(down));
      }
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    copy(src, out, p + "mlp.router.weight", m + "gate.weight", {E, d});
    for (int64_t e = 0; e < E; ++e) {
      const std::string from = m + "experts." + std::to_string(e) + ".", to = p + "mlp.experts." + std::to_string(e) + ".";
      copy(src, out, to + "gate_proj.weight", from + "w1.weight", {h, d});
      copy(src, out, to + "up_proj.weight", from + "w3.weight", {h, d});
      copy(src, out, to + "down_proj.weight", from + "w2.weight", {d, h});
    }
  }
}

/// MixtralConfig: the LLaMA keys (sliding_window on every layer or null) plus num_local_experts and
/// num_experts_per_tok.
nlohmann::ordered_json make_config(const ModelConfig& c) {
  ModelConfig dense = c;
  dense.spec.n_experts = dense.spec.experts_per_token = 0;
  dense.spec.mlp_gated = true;
  nlohmann::ordered_json j = llama_like_config_json(dense, "MixtralForCausalLM", "mixtral", true, false);
  j["num_local_experts"] = c.spec.n_experts;
  j["num_experts_per_tok"] = c.spec.experts_per_token;
  check_config_reads_back(j, c);
  return j;
}

/// The checkpoint layout (what transformers 5 saves and converts on load): per layer
/// block_sparse_moe.gate (the router, [E, d]) and block_sparse_moe.experts.{e}.w1 / w3 / w2 (gate /
/// up / down), each expert linear its own module.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l), a = p + "self_attn.", m = p + "block_sparse_moe.";
    out.push_back(plan_tensor(p + "input_layernorm.weight"));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) out.push_back(plan_linear(a + proj));
    out.push_back(plan_tensor(p + "post_attention_layernorm.weight"));
    out.push_back(plan_linear(m + "gate", {p + "mlp.router"}));
    for (int e = 0; e < c.spec.n_experts; ++e) {
      const std::string from = p + "mlp.experts." + std::to_string(e) + ".", to = m + "experts." + std::to_string(e) + ".";
      out.push_back(plan_linear(to + "w1", {from + "gate_proj"}));
      out.push_back(plan_linear(to + "w2", {from + "down_proj"}));
      out.push_back(plan_linear(to + "w3", {from + "up_proj"}));
    }
  }
  out.push_back(plan_tensor(names::kFinalNorm));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture mixtral_architecture() {
  HfArchitecture a;
  a.name = "mixtral";
  a.classes = {"MixtralForCausalLM"};
  a.model_types = {"mixtral"};
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
