// GPT-2 (transformers models/gpt2: configuration_gpt2.py GPT2Config, modeling_gpt2.py
// GPT2LMHeadModel): learned absolute positions, pre-LayerNorm, Conv1D projections stored
// [in, out] with a fused c_attn, GELU (tanh) MLP, biases everywhere, tied head.
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
void map_tensors(const HfTensorSource& src, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim;
  const std::string m = "transformer.";
  copy(src, out, names::kEmbed, m + "wte.weight", {c.vocab_size, d});
  copy(src, out, names::kEmbedPositions, m + "wpe.weight", {c.max_seq_len, d});
  copy(src, out, names::kFinalNorm, m + "ln_f.weight", {d});
  copy(src, out, names::kFinalNormBias, m + "ln_f.bias", {d});
  if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  for (int l = 0; l < c.n_layers; ++l) {
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
  return a;
}

}  // namespace sq::hf
