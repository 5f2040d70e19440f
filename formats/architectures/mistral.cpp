// Mistral (transformers models/mistral: configuration_mistral.py MistralConfig,
// modeling_mistral.py MistralForCausalLM): Llama's layout with a sliding window on every layer.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// MistralConfig keys (configure_llama_like) plus sliding_window: absent = MistralConfig's 4096,
/// null = none; HF masks keys j <= i - window, i.e. spec.layer_window = window on every layer
/// (set_windows: a window >= max_position_embeddings is global).
void configure(const HfConfigReader& r, ModelConfig& c) {
  configure_llama_like(r, c, {.vocab_size = 32000, .max_position_embeddings = 4096 * 32, .rms_norm_eps = 1e-6f, .bos = 1, .eos = 2});
  const int window = r.json().contains("sliding_window") ? r.integer("sliding_window", 0) : 4096;
  set_windows(c, all_layers(c, r.source()), window, r.source());
}

nlohmann::ordered_json make_config(const ModelConfig& c) {
  if (c.qkv_bias) throw UnsupportedError("cannot write a Hugging Face Mistral config with q/k/v biases (MistralConfig has none)");
  return llama_like_config_json(c, "MistralForCausalLM", "mistral", true, false);
}

}  // namespace

HfArchitecture mistral_architecture() {
  HfArchitecture a;
  a.name = "mistral";
  a.classes = {"MistralForCausalLM"};
  a.model_types = {"mistral"};
  a.configure = configure;
  a.map_tensors = map_llama_tensors;
  a.make_config = make_config;
  a.hf_plan = llama_like_hf_plan;
  return a;
}

}  // namespace sq::hf
