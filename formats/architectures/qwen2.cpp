// Qwen2 (transformers models/qwen2: configuration_qwen2.py Qwen2Config, modeling_qwen2.py
// Qwen2ForCausalLM): Llama's layout with q/k/v biases, optionally sliding-window layers.
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// Qwen2Config keys (configure_llama_like; bos/eos default 1/2 as sqkit always read them) with
/// q/k/v biases. Windows: sliding_window (default 4096) counts only when use_sliding_window
/// (default false); layer_types, when given, says which layers slide, else layers >=
/// max_window_layers (default 28) do, as Qwen2Config.__post_init__ computes.
void configure(const HfConfigReader& r, ModelConfig& c) {
  configure_llama_like(r, c, {.vocab_size = 151936, .max_position_embeddings = 32768, .rms_norm_eps = 1e-6f, .bos = 1, .eos = 2});
  c.qkv_bias = true;
  const bool use_window = r.boolean("use_sliding_window", false);
  const int window = use_window ? (r.json().contains("sliding_window") ? r.integer("sliding_window", 0) : 4096) : 0;
  std::vector<bool> fallback;
  if (window > 0 && !r.present("layer_types")) {
    fallback = all_layers(c, r.source());
    const int first = r.integer("max_window_layers", 28);
    for (int l = 0; l < c.n_layers && l < first; ++l) fallback[size_t(l)] = false;
  }
  set_windows(c, sliding_layers(r, c, fallback), window, r.source());
}

nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j = llama_like_config_json(c, "Qwen2ForCausalLM", "qwen2", false, false);
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  return j;
}

}  // namespace

HfArchitecture qwen2_architecture() {
  HfArchitecture a;
  a.name = "qwen2";
  a.classes = {"Qwen2ForCausalLM"};
  a.model_types = {"qwen2"};
  a.configure = configure;
  a.map_tensors = map_llama_tensors;
  a.make_config = make_config;
  a.hf_plan = llama_like_hf_plan;
  return a;
}

}  // namespace sq::hf
