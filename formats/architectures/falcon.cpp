// Falcon (transformers models/falcon: configuration_falcon.py FalconConfig, modeling_falcon.py
// FalconForCausalLM): fused query_key_value in three layouts (multi-query, per head, per KV group),
// parallel attention + MLP with one or two input LayerNorms, GELU MLP, tied head.
#include "core/error.h"
#include "formats/architectures/architectures.h"
#include "formats/architectures/common.h"

namespace sq::hf {
namespace {

/// FalconConfig keys: hidden_size (legacy n_embed), num_hidden_layers, num_attention_heads
/// (required), ffn_hidden_size (4·hidden_size), vocab_size (65024), max_position_embeddings
/// (2048), layer_norm_epsilon (1e-5), activation (gelu), bias (false: query_key_value, dense and
/// MLP biases), tie_word_embeddings (true), bos/eos 11/11, RoPE (rope_parameters / rope_theta).
/// Attention heads: new_decoder_architecture -> num_kv_heads (default num_attention_heads) in
/// groups; else multi_query (default true) -> one KV head whatever num_kv_heads says; else one
/// per query head. Residual: new_decoder_architecture -> parallel with num_ln_in_parallel_attn
/// (default 2) norms (2: ln_attn / ln_mlp; 1: one shared input_layernorm); else parallel_attn
/// (default true) -> parallel with the shared input_layernorm, or sequential with
/// input_layernorm + post_attention_layernorm. Refused by name: alibi true (Falcon scales the
/// ALiBi bias by 1/√head_dim, which sqkit's ALiBi does not), new_decoder_architecture without
/// parallel_attn (transformers cannot run it either).
void configure(const HfConfigReader& r, ModelConfig& c) {
  c.dim = r.integer(r.pick({"hidden_size", "n_embed"}), nullptr);
  c.n_layers = r.integer(r.pick({"num_hidden_layers", "n_layer"}), nullptr);
  c.n_heads = r.integer(r.pick({"num_attention_heads", "n_head"}), nullptr);
  c.hidden_dim = r.integer("ffn_hidden_size", 4 * c.dim);
  head_dim(r, c, "hidden_size", "num_attention_heads");
  c.vocab_size = r.integer("vocab_size", 65024);
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number_f32("layer_norm_epsilon", 1e-5f);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  token_ids(r, c, 11, 11);
  if (r.boolean("alibi", false)) r.refuse("alibi", "false: Falcon's ALiBi variant is not implemented");
  rope(r, c);

  DecoderSpec& s = c.spec;
  s.norm = NormKind::LayerNorm;
  s.norm_bias = true;  // torch LayerNorm: bias=False only drops the linear biases
  s.mlp_gated = false;
  s.activation = activation(r, "activation", "gelu");
  c.qkv_bias = s.o_bias = s.mlp_bias = r.boolean("bias", false);
  const bool new_arch = r.boolean("new_decoder_architecture", false);
  const bool parallel = r.boolean("parallel_attn", true);
  if (new_arch) {
    if (!parallel) r.refuse("parallel_attn", "true with new_decoder_architecture");
    c.n_kv_heads = r.integer("num_kv_heads", c.n_heads);
    const int norms = r.integer("num_ln_in_parallel_attn", 2);
    if (norms != 1 && norms != 2) r.refuse("num_ln_in_parallel_attn", "1 or 2");
    s.parallel_residual = true;
    s.shared_input_norm = norms == 1;
  } else {
    c.n_kv_heads = r.boolean("multi_query", true) ? 1 : c.n_heads;
    s.parallel_residual = parallel;
    s.shared_input_norm = parallel;
  }
}

/// transformer.word_embeddings -> model.embed_tokens; ln_f -> model.norm; per layer
/// self_attention.query_key_value split per KV group, [q × n_heads/n_kv; k; v] rows
/// (split_qkv_per_group), which covers the three layouts of FalconAttention._split_heads: the new
/// architecture's groups, multi-query ([q (n_heads·hd); k (hd); v (hd)] = one group) and one KV
/// head per query head ([q_h; k_h; v_h] = groups of one),
/// self_attention.dense -> o_proj, mlp.dense_h_to_4h -> up_proj, mlp.dense_4h_to_h -> down_proj;
/// norms input_layernorm (shared or sequential), post_attention_layernorm (sequential), ln_attn /
/// ln_mlp (two parallel norms) -> input_layernorm / post_attention_layernorm.
void map_tensors(const HfTensorSource& src, const HfTensorSelection& selection, ModelConfig& c, CanonicalTensors& out) {
  const int64_t d = c.dim, h = c.hidden_dim, hd = c.head_dim, q = int64_t(c.n_heads) * hd, kv = int64_t(c.n_kv_heads) * hd;
  const std::string m = "transformer.";
  if (selection.globals) {
    copy(src, out, names::kEmbed, m + "word_embeddings.weight", {c.vocab_size, d});
    copy(src, out, names::kFinalNorm, m + "ln_f.weight", {d});
    copy(src, out, names::kFinalNormBias, m + "ln_f.bias", {d});
    if (!c.tied_embeddings) copy(src, out, names::kLmHead, "lm_head.weight", {c.vocab_size, d});
  }
  const bool two_norms = c.spec.parallel_residual && !c.spec.shared_input_norm;
  for (int l = 0; l < c.n_layers; ++l) {
    if (!selection.layer(l)) continue;
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l);
    auto norm = [&](const std::string& to, const std::string& from) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {d});
      copy(src, out, p + to + ".bias", s + from + ".bias", {d});
    };
    if (two_norms) {
      norm("input_layernorm", "ln_attn");
      norm("post_attention_layernorm", "ln_mlp");
    } else {
      norm("input_layernorm", "input_layernorm");
      if (!c.spec.parallel_residual) norm("post_attention_layernorm", "post_attention_layernorm");
    }
    auto split = [&](const Tensor& t) {
      return split_qkv_per_group(t, c.n_kv_heads, c.n_heads / c.n_kv_heads, c.head_dim);
    };
    const char* proj[] = {"q_proj", "k_proj", "v_proj"};
    const auto w = split(src.get(s + "self_attention.query_key_value.weight", {q + 2 * kv, d}));
    for (int j = 0; j < 3; ++j) out[p + "self_attn." + proj[j] + ".weight"] = w[size_t(j)];
    if (c.qkv_bias) {
      const auto b = split(src.get(s + "self_attention.query_key_value.bias", {q + 2 * kv}));
      for (int j = 0; j < 3; ++j) out[p + "self_attn." + proj[j] + ".bias"] = b[size_t(j)];
    }
    auto linear = [&](const std::string& to, const std::string& from, int64_t rows, int64_t cols) {
      copy(src, out, p + to + ".weight", s + from + ".weight", {rows, cols});
      if (c.spec.mlp_bias) copy(src, out, p + to + ".bias", s + from + ".bias", {rows});
    };
    linear("self_attn.o_proj", "self_attention.dense", d, q);
    linear("mlp.up_proj", "mlp.dense_h_to_4h", h, d);
    linear("mlp.down_proj", "mlp.dense_4h_to_h", d, h);
  }
}


/// The FalconConfig layout for `c`: the original (new_decoder_architecture false) when there is
/// one KV head (multi_query) or one per query head and the block is sequential or has one shared
/// input norm; else new_decoder_architecture with num_kv_heads groups and num_ln_in_parallel_attn
/// 1 or 2 (parallel blocks only: check_config_reads_back refuses the rest).
bool original_layout(const ModelConfig& c) {
  return (c.n_kv_heads == 1 || c.n_kv_heads == c.n_heads) && (!c.spec.parallel_residual || c.spec.shared_input_norm);
}

/// FalconConfig for `c` (see original_layout); `bias` covers every linear's bias, RoPE as
/// rope_parameters, alibi false.
nlohmann::ordered_json make_config(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"FalconForCausalLM"};
  j["model_type"] = "falcon";
  j["hidden_size"] = c.dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["ffn_hidden_size"] = c.hidden_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["layer_norm_epsilon"] = number_json(c.norm_eps);
  j["activation"] = hf_activation_name(c.spec.activation);
  j["bias"] = c.qkv_bias;
  j["alibi"] = false;
  if (original_layout(c)) {
    j["new_decoder_architecture"] = false;
    j["multi_query"] = c.n_kv_heads == 1 && c.n_heads > 1;
    j["parallel_attn"] = c.spec.parallel_residual;
    j["num_kv_heads"] = c.n_kv_heads;
  } else {
    j["new_decoder_architecture"] = true;
    j["parallel_attn"] = true;
    j["num_kv_heads"] = c.n_kv_heads;
    j["num_ln_in_parallel_attn"] = c.spec.shared_input_norm ? 1 : 2;
  }
  j["rope_parameters"] = rope_parameters_json(c, false);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  check_config_reads_back(j, c);
  return j;
}

/// The inverse of map_tensors: transformer.* names, query_key_value per KV group [q × n_heads/n_kv;
/// k; v] (qkv_per_group_rows; multi-query is one group, one KV head per query head gives per-head
/// [q_h; k_h; v_h]), norms input_layernorm (+ post_attention_layernorm when sequential) or ln_attn
/// / ln_mlp.
std::vector<HfPlanEntry> hf_plan(const ModelConfig& c) {
  const std::string m = "transformer.";
  const bool two_norms = c.spec.parallel_residual && !c.spec.shared_input_norm;
  std::vector<HfPlanEntry> out;
  out.push_back(plan_tensor(m + "word_embeddings.weight", names::kEmbed));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string s = m + "h." + std::to_string(l) + ".", p = names::layer(l), a = p + "self_attn.";
    auto norm = [&](const std::string& to, const std::string& from) {
      for (const char* x : {".weight", ".bias"}) out.push_back(plan_tensor(s + to + x, p + from + x));
    };
    norm(two_norms ? "ln_attn" : "input_layernorm", "input_layernorm");
    if (two_norms) norm("ln_mlp", "post_attention_layernorm");
    HfPlanEntry qkv = plan_linear(s + "self_attention.query_key_value", {a + "q_proj", a + "k_proj", a + "v_proj"});
    qkv.rows = qkv_per_group_rows(c.n_kv_heads, c.n_heads / c.n_kv_heads, c.head_dim);
    out.push_back(std::move(qkv));
    out.push_back(plan_linear(s + "self_attention.dense", {a + "o_proj"}));
    if (!c.spec.parallel_residual) norm("post_attention_layernorm", "post_attention_layernorm");
    out.push_back(plan_linear(s + "mlp.dense_h_to_4h", {p + "mlp.up_proj"}));
    out.push_back(plan_linear(s + "mlp.dense_4h_to_h", {p + "mlp.down_proj"}));
  }
  out.push_back(plan_tensor(m + "ln_f.weight", names::kFinalNorm));
  out.push_back(plan_tensor(m + "ln_f.bias", names::kFinalNormBias));
  if (!c.tied_embeddings) out.push_back(plan_linear("lm_head"));
  return out;
}

}  // namespace

HfArchitecture falcon_architecture() {
  HfArchitecture a;
  a.name = "falcon";
  a.classes = {"FalconForCausalLM"};
  a.model_types = {"falcon"};
  a.base_prefix = "transformer.";
  a.layer_prefix = "transformer.h.";
  a.configure = configure;
  a.map_tensors = map_tensors;
  a.make_config = make_config;
  a.hf_plan = hf_plan;
  return a;
}

}  // namespace sq::hf
