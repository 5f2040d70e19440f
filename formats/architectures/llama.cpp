// Llama (transformers models/llama: configuration_llama.py LlamaConfig, modeling_llama.py
// LlamaForCausalLM). Its tensor names are sqkit's canonical names.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// LlamaConfig keys (configure_llama_like) plus attention_bias (q/k/v and o_proj biases) and
/// mlp_bias (gate/up/down biases).
void configure(const HfConfigReader& r, ModelConfig& c) {
  configure_llama_like(r, c, {.vocab_size = 32000, .max_position_embeddings = 2048, .rms_norm_eps = 1e-6f, .bos = 1, .eos = 2});
  c.qkv_bias = r.boolean("attention_bias", false);
  c.spec.o_bias = c.qkv_bias;  // map_tensors drops all-zero o_proj biases
  c.spec.mlp_bias = r.boolean("mlp_bias", false);
}

/// Canonical names as stored. With attention_bias, o_proj biases that are all zero (what
/// save_hf_checkpoint writes for a model with q/k/v biases only) leave spec.o_bias false, so such
/// a model keeps the plain LLaMA structure; the biases of every layer decide, whatever `selection`.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  if (c.spec.o_bias) {
    bool nonzero = false;
    for (int l = 0; l < c.n_layers && !nonzero; ++l) {
      const Tensor b = src.get(names::layer(l) + "self_attn.o_proj.bias", {c.dim});
      for (int64_t i = 0; i < b.numel() && !nonzero; ++i) nonzero = b.data()[i] != 0.0f;
    }
    c.spec.o_bias = nonzero;
  }
  map_llama_tensors(src, selection, c, out);
}

nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j = llama_like_config_json(c, "LlamaForCausalLM", "llama", false, true);
  j["attention_bias"] = c.qkv_bias;
  j["mlp_bias"] = false;
  return j;
}

/// attention_bias gives HF's o_proj a bias too: zeros when sqkit's model has none.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  auto out = llama_like_hf_plan(c);
  if (c.qkv_bias)
    for (auto& e : out)
      if (e.linear && e.name.size() > 16 && e.name.compare(e.name.size() - 16, 16, "self_attn.o_proj") == 0) e.zero_bias = true;
  return out;
}

}  // namespace

HfArchitecture llama_architecture() {
  HfArchitecture a;
  a.name = "llama";
  a.classes = {"LlamaForCausalLM"};
  a.model_types = {"llama"};
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
