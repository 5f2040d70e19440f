// The Hugging Face architecture files (formats/architectures/, formats/hf_architecture.h): for each
// reference checkpoint of ../shared/data/reference/hf-tiny, the ModelConfig / DecoderSpec its
// config.json gives and a few canonical tensors checked against the raw safetensors rows they come
// from (fused q/k/v and gate/up splits, Conv1D transposes, Gemma's 1 + w). Independent of the
// decoder: tests/hf_tiny_architectures_test.cpp compares logits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/error.h"
#include "formats/architectures/common.h"
#include "formats/hf_architecture.h"
#include "formats/hf_checkpoint.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "tests/support/expect_error.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string tiny(const std::string& name) { return shared_data("reference/hf-tiny/" + name); }

/// Tensor `tensor` of hf-tiny/`name`/model.safetensors as stored (FP32).
Tensor raw(const std::string& name, const std::string& tensor) {
  static std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
  auto& f = files[name];
  if (!f) f = std::make_shared<SafetensorsFile>(tiny(name) + "/model.safetensors");
  return f->load_f32(tensor);
}

json tiny_config(const std::string& name) { return json::parse(read_file(tiny(name) + "/config.json")); }

/// Expects canonical[r, c] == stored[row(r), c] bitwise for every element (`cols` columns; rank-1
/// tensors have one).
void expect_rows(const Tensor& canonical, const Tensor& stored, const std::function<int64_t(int64_t)>& row,
                 const std::string& what) {
  const int64_t rows = canonical.dim(0), cols = canonical.rank() == 2 ? canonical.dim(1) : 1;
  const int64_t stored_cols = stored.rank() == 2 ? stored.dim(1) : 1;
  ASSERT_EQ(cols, stored_cols) << what;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(std::bit_cast<uint32_t>(canonical.data()[r * cols + c]),
                std::bit_cast<uint32_t>(stored.data()[row(r) * cols + c]))
          << what << " row " << r << " col " << c;
}

/// Expects `a` and `b` to hold the same values bitwise.
void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(a.data()[i]), std::bit_cast<uint32_t>(b.data()[i])) << what << " element " << i;
}

const auto kSame = [](int64_t r) { return r; };

/// Every canonical tensor the config implies is present (what Decoder::from_checkpoint reads)
/// and no stray name is.
void expect_complete(const Checkpoint& ck) {
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  std::set<std::string> want = {names::kEmbed, names::kFinalNorm};
  if (!c.tied_embeddings) want.insert(names::kLmHead);
  if (s.norm_bias) want.insert(names::kFinalNormBias);
  if (s.embed_norm) want.insert(names::kEmbedNorm);
  if (s.embed_norm && s.norm_bias) want.insert(names::kEmbedNormBias);
  if (s.position == PositionKind::Learned) want.insert(names::kEmbedPositions);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = names::layer(l), a = p + "self_attn.";
    auto norm = [&](const std::string& n) {
      want.insert(p + n + ".weight");
      if (s.norm_bias) want.insert(p + n + ".bias");
    };
    norm("input_layernorm");
    if (!s.shared_input_norm) norm("post_attention_layernorm");
    if (s.post_attn_norm) norm("attn_post_norm");
    if (s.post_ffn_norm) norm("mlp_post_norm");
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      want.insert(a + proj + ".weight");
      if (c.qkv_bias) want.insert(a + proj + ".bias");
    }
    want.insert(a + "o_proj.weight");
    if (s.o_bias) want.insert(a + "o_proj.bias");
    if (s.qk_norm) want.insert({a + "q_norm.weight", a + "k_norm.weight"});
    if (s.n_experts > 0) {
      want.insert(p + "mlp.router.weight");
      for (int e = 0; e < s.n_experts; ++e)
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
          want.insert(p + "mlp.experts." + std::to_string(e) + "." + proj + ".weight");
    } else {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        if (!s.mlp_gated && std::string(proj) == "gate_proj") continue;
        want.insert(p + "mlp." + proj + ".weight");
        if (s.mlp_bias) want.insert(p + "mlp." + proj + ".bias");
      }
    }
  }
  std::set<std::string> have;
  for (const auto& [name, t] : ck.tensors) have.insert(name);
  EXPECT_EQ(have, want);
}

// ---- the LLaMA family ------------------------------------------------------------------------------

TEST(HfArchitectureLlama, TinyCheckpointsKeepTheLlamaStructure) {
  for (const char* name : {"llama-gqa", "llama3-rope-scaled", "llama-linear-rope", "qwen2"}) {
    const Checkpoint ck = load_hf_checkpoint(tiny(name));
    const ModelConfig& c = ck.config;
    EXPECT_EQ(c.architecture, std::string(name) == "qwen2" ? "qwen2" : "llama") << name;
    EXPECT_TRUE(c.is_llama_structure()) << name;
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.qkv_bias, std::string(name) == "qwen2");
    EXPECT_FALSE(c.tied_embeddings);
    expect_complete(ck);
    expect_same(ck.tensors.at("model.layers.1.self_attn.k_proj.weight"), raw(name, "model.layers.1.self_attn.k_proj.weight"),
                name);
  }
}

TEST(HfArchitectureMistral, SlidingWindowOnEveryLayer) {
  const Checkpoint ck = load_hf_checkpoint(tiny("mistral-sliding-window"));
  EXPECT_EQ(ck.config.architecture, "mistral");
  EXPECT_EQ(ck.config.spec.layer_window, (std::vector<int>{16, 16}));
  DecoderSpec rest = ck.config.spec;
  rest.layer_window.clear();
  EXPECT_EQ(rest, DecoderSpec{});
  expect_complete(ck);
}

TEST(HfArchitectureMixtral, ExpertsAndRouter) {
  const std::string n = "mixtral-moe";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  EXPECT_EQ(c.architecture, "mixtral");
  EXPECT_EQ(c.spec.n_experts, 4);
  EXPECT_EQ(c.spec.experts_per_token, 2);
  EXPECT_EQ(c.spec.activation, Activation::SiLU);
  EXPECT_TRUE(c.spec.layer_window.empty());  // sliding_window null
  EXPECT_EQ(c.rope_theta, 1e6f);
  expect_complete(ck);
  expect_same(ck.tensors.at("model.layers.1.mlp.router.weight"), raw(n, "model.layers.1.block_sparse_moe.gate.weight"), "router");
  const std::string e = "model.layers.0.block_sparse_moe.experts.2.";
  expect_same(ck.tensors.at("model.layers.0.mlp.experts.2.gate_proj.weight"), raw(n, e + "w1.weight"), "w1");
  expect_same(ck.tensors.at("model.layers.0.mlp.experts.2.up_proj.weight"), raw(n, e + "w3.weight"), "w3");
  expect_same(ck.tensors.at("model.layers.0.mlp.experts.2.down_proj.weight"), raw(n, e + "w2.weight"), "w2");

  // transformers 5's fused in-memory layout maps onto the same experts.
  std::map<std::string, Tensor> fused;
  for (const auto& [name, t] : ck.tensors)
    if (name.find(".mlp.") == std::string::npos) fused[name] = t;
  for (int l = 0; l < 2; ++l) {
    const std::string p = names::layer(l);
    fused[p + "mlp.gate.weight"] = ck.tensors.at(p + "mlp.router.weight");
    Tensor gate_up = Tensor::zeros({4, 256, 64}), down = Tensor::zeros({4, 64, 128});
    for (int x = 0; x < 4; ++x) {
      const std::string xp = p + "mlp.experts." + std::to_string(x) + ".";
      std::memcpy(gate_up.mutable_data() + x * 256 * 64, ck.tensors.at(xp + "gate_proj.weight").data(), 128 * 64 * 4);
      std::memcpy(gate_up.mutable_data() + x * 256 * 64 + 128 * 64, ck.tensors.at(xp + "up_proj.weight").data(), 128 * 64 * 4);
      std::memcpy(down.mutable_data() + x * 64 * 128, ck.tensors.at(xp + "down_proj.weight").data(), 64 * 128 * 4);
    }
    fused[p + "mlp.experts.gate_up_proj"] = gate_up;
    fused[p + "mlp.experts.down_proj"] = down;
  }
  ModelConfig c2 = c;
  CanonicalTensors out;
  hf_architecture_named("mixtral")->map_tensors(HfTensorMap(fused, "fused"), HfTensorSelection::all(), c2, out);
  for (const auto& [name, t] : ck.tensors) expect_same(out.at(name), t, "fused " + name);
}

TEST(HfArchitecturePhi3, FusedQkvAndGateUpAreSplit) {
  const std::string n = "phi3";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_TRUE(c.is_llama_structure());  // partial_rotary_factor 1
  EXPECT_EQ(c.eos_id, 2) << "eos_token_id 32000 lies outside the 320-token vocabulary: ModelConfig's default";
  expect_complete(ck);
  const Tensor qkv = raw(n, "model.layers.1.self_attn.qkv_proj.weight");  // [64 + 32 + 32, 64]
  const std::string a = "model.layers.1.self_attn.";
  expect_rows(ck.tensors.at(a + "q_proj.weight"), qkv, kSame, "q");
  expect_rows(ck.tensors.at(a + "k_proj.weight"), qkv, [](int64_t r) { return 64 + r; }, "k");
  expect_rows(ck.tensors.at(a + "v_proj.weight"), qkv, [](int64_t r) { return 96 + r; }, "v");
  const Tensor gate_up = raw(n, "model.layers.0.mlp.gate_up_proj.weight");  // [2 * 128, 64]
  expect_rows(ck.tensors.at("model.layers.0.mlp.gate_proj.weight"), gate_up, kSame, "gate");
  expect_rows(ck.tensors.at("model.layers.0.mlp.up_proj.weight"), gate_up, [](int64_t r) { return 128 + r; }, "up");
}

// ---- Gemma 3 -------------------------------------------------------------------------------------

TEST(HfArchitectureGemma3, SpecAndFoldedNorms) {
  const std::string n = "gemma3-text";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_EQ(c.n_layers, 6);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(s.layer_window, (std::vector<int>{16, 16, 16, 16, 16, 0}));
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(s.rope_local_theta, 1e4f);
  EXPECT_EQ(s.attn_scale, float(1.0 / std::sqrt(32.0)));  // query_pre_attn_scalar 32
  EXPECT_EQ(s.embed_scale, 8.0f);                         // sqrt(hidden_size 64)
  EXPECT_TRUE(s.post_attn_norm && s.post_ffn_norm && s.qk_norm);
  EXPECT_EQ(s.activation, Activation::GeluTanh);
  EXPECT_TRUE(s.mlp_gated);
  EXPECT_EQ(s.norm, NormKind::RMSNorm);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.eos_id, 1);
  expect_complete(ck);
  // Every RMSNorm weight is 1 + w, computed in FP32 like transformers' `1.0 + w.float()`.
  const std::pair<const char*, const char*> norms[] = {
      {"input_layernorm", "input_layernorm"},
      {"attn_post_norm", "post_attention_layernorm"},
      {"post_attention_layernorm", "pre_feedforward_layernorm"},
      {"mlp_post_norm", "post_feedforward_layernorm"},
      {"self_attn.q_norm", "self_attn.q_norm"},
      {"self_attn.k_norm", "self_attn.k_norm"},
  };
  for (const auto& [to, from] : norms) {
    const Tensor w = raw(n, std::string("model.layers.5.") + from + ".weight");
    const Tensor& folded = ck.tensors.at(std::string("model.layers.5.") + to + ".weight");
    ASSERT_EQ(folded.shape(), w.shape()) << to;
    for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(folded.data()[i], 1.0f + w.data()[i]) << to << " " << i;
  }
  const Tensor final_norm = raw(n, "model.norm.weight");
  EXPECT_EQ(ck.tensors.at(names::kFinalNorm).data()[7], 1.0f + final_norm.data()[7]);
  expect_same(ck.tensors.at("model.layers.2.self_attn.q_proj.weight"), raw(n, "model.layers.2.self_attn.q_proj.weight"), "q");
}

TEST(HfArchitectureGemma3, LegacyRopeKeysAndRefusals) {
  json j = tiny_config("gemma3-text");
  j.erase("rope_parameters");
  j.erase("layer_types");
  j["rope_theta"] = 500000.0;
  j["rope_local_base_freq"] = 20000.0;
  j["sliding_window_pattern"] = 3;
  const ModelConfig c = parse_hf_config(j, "c.json");
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.spec.rope_local_theta, 20000.0f);
  EXPECT_EQ(c.spec.layer_window, (std::vector<int>{16, 16, 0, 16, 16, 0}));

  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    json k = tiny_config("gemma3-text");
    k[key] = 30.0;
    expect_error<UnsupportedError>([&] { parse_hf_config(k, "c.json"); }, {"c.json", key, "30"});
  }
  json k = tiny_config("gemma3-text");
  k["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}};
  expect_error<UnsupportedError>([&] { parse_hf_config(k, "c.json"); }, {"c.json", "sliding_attention", "linear"});
  k = tiny_config("gemma3-text");
  k["rope_parameters"]["full_attention"] = {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}};
  const ModelConfig scaled = parse_hf_config(k, "c.json");  // Gemma 3 4B+: linear scaling on global layers
  EXPECT_EQ(scaled.rope_scaling.type, RopeScalingType::Linear);
  EXPECT_EQ(scaled.rope_scaling.factor, 8.0f);
}

// ---- OPT, GPT-NeoX, Falcon -----------------------------------------------------------------------

TEST(HfArchitectureOpt, LayerNormLearnedPositionsReluMlp) {
  const std::string n = "opt";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "opt");
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_TRUE(s.norm_bias);
  EXPECT_EQ(s.position, PositionKind::Learned);
  EXPECT_EQ(s.learned_position_offset, 2);
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_EQ(s.activation, Activation::ReLU);
  EXPECT_TRUE(c.qkv_bias && s.o_bias && s.mlp_bias);
  EXPECT_FALSE(s.parallel_residual);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.hidden_dim, 128);
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  expect_complete(ck);
  const std::string d = "model.decoder.layers.1.";
  expect_same(ck.tensors.at(names::kEmbedPositions), raw(n, "model.decoder.embed_positions.weight"), "positions");
  EXPECT_EQ(ck.tensors.at(names::kEmbedPositions).shape(), (std::vector<int64_t>{258, 64}));
  expect_same(ck.tensors.at("model.layers.1.mlp.up_proj.weight"), raw(n, d + "fc1.weight"), "fc1");
  expect_same(ck.tensors.at("model.layers.1.mlp.down_proj.bias"), raw(n, d + "fc2.bias"), "fc2 bias");
  expect_same(ck.tensors.at("model.layers.1.self_attn.o_proj.bias"), raw(n, d + "self_attn.out_proj.bias"), "out_proj");
  expect_same(ck.tensors.at("model.layers.1.input_layernorm.bias"), raw(n, d + "self_attn_layer_norm.bias"), "ln");
  expect_same(ck.tensors.at("model.layers.1.post_attention_layernorm.weight"), raw(n, d + "final_layer_norm.weight"), "ln2");
  expect_same(ck.tensors.at(names::kFinalNormBias), raw(n, "model.decoder.final_layer_norm.bias"), "final");

  for (const auto& [key, value] : std::vector<std::pair<const char*, json>>{
           {"do_layer_norm_before", false}, {"word_embed_proj_dim", 32}, {"_remove_final_layer_norm", true}}) {
    json j = tiny_config(n);
    j[key] = value;
    expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json", key, "not supported"});
  }
}

TEST(HfArchitectureGptNeox, PerHeadQkvPartialRotaryParallelResidual) {
  const std::string n = "gpt-neox";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "gpt_neox");
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_TRUE(s.norm_bias);
  EXPECT_TRUE(s.parallel_residual);
  EXPECT_FALSE(s.shared_input_norm);
  EXPECT_EQ(s.rope_dim, 4);  // head_dim 16 × partial_rotary_factor 0.25
  EXPECT_EQ(c.rope_dim(), 4);
  EXPECT_EQ(s.activation, Activation::Gelu);
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_TRUE(c.qkv_bias && s.o_bias && s.mlp_bias);
  EXPECT_FALSE(c.tied_embeddings);
  expect_complete(ck);
  expect_same(ck.tensors.at(names::kLmHead), raw(n, "embed_out.weight"), "embed_out");
  // query_key_value rows: head h holds [q_h; k_h; v_h] of 16 rows each.
  const Tensor w = raw(n, "gpt_neox.layers.1.attention.query_key_value.weight");
  const Tensor b = raw(n, "gpt_neox.layers.1.attention.query_key_value.bias");
  const char* proj[] = {"q_proj", "k_proj", "v_proj"};
  for (int j = 0; j < 3; ++j) {
    auto row = [j](int64_t r) { return (r / 16 * 3 + j) * 16 + r % 16; };
    expect_rows(ck.tensors.at(std::string("model.layers.1.self_attn.") + proj[j] + ".weight"), w, row, proj[j]);
    expect_rows(ck.tensors.at(std::string("model.layers.1.self_attn.") + proj[j] + ".bias"), b, row, proj[j]);
  }
  // Legacy (transformers 4) keys: rotary_pct and rotary_emb_base.
  json j = tiny_config(n);
  j.erase("rope_parameters");
  EXPECT_EQ(parse_hf_config(j, "c.json").spec.rope_dim, 4) << "GPTNeoXConfig's default rotary_pct is 0.25";
  j["rotary_pct"] = 0.5;
  j["rotary_emb_base"] = 20000;
  const ModelConfig legacy = parse_hf_config(j, "c.json");
  EXPECT_EQ(legacy.spec.rope_dim, 8);
  EXPECT_EQ(legacy.rope_theta, 20000.0f);
  j["rotary_pct"] = 1.0;
  EXPECT_EQ(parse_hf_config(j, "c.json").spec.rope_dim, 0);
}

TEST(HfArchitectureFalcon, MultiQuerySharedNorm) {
  const std::string n = "falcon";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "falcon");
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1) << "multi_query: one KV head whatever num_kv_heads (4) says";
  EXPECT_TRUE(s.parallel_residual && s.shared_input_norm);
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_TRUE(s.norm_bias);
  EXPECT_EQ(s.activation, Activation::Gelu);
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_FALSE(c.qkv_bias || s.o_bias || s.mlp_bias);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.hidden_dim, 256);
  EXPECT_EQ(c.bos_id, 11);
  expect_complete(ck);
  const Tensor w = raw(n, "transformer.h.0.self_attention.query_key_value.weight");  // [64 + 16 + 16, 64]
  expect_rows(ck.tensors.at("model.layers.0.self_attn.q_proj.weight"), w, kSame, "q");
  expect_rows(ck.tensors.at("model.layers.0.self_attn.k_proj.weight"), w, [](int64_t r) { return 64 + r; }, "k");
  expect_rows(ck.tensors.at("model.layers.0.self_attn.v_proj.weight"), w, [](int64_t r) { return 80 + r; }, "v");
  expect_same(ck.tensors.at("model.layers.0.input_layernorm.bias"), raw(n, "transformer.h.0.input_layernorm.bias"), "ln");

  json j = tiny_config(n);
  j["alibi"] = true;
  expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json", "alibi", "not supported"});
}

TEST(HfArchitectureFalcon, OtherQkvLayouts) {
  // 4 heads of 2 channels, 1 input column: row r of the fused weight holds the value r.
  const json base = tiny_config("falcon");
  auto load = [&](json patch, int fused_rows, const std::vector<std::string>& norms) {
    json j = base;
    j.merge_patch(patch);
    j["hidden_size"] = 8;
    j["num_hidden_layers"] = 1;
    j["ffn_hidden_size"] = 4;
    ModelConfig c = parse_hf_config(j, "c.json");
    std::map<std::string, Tensor> t;
    std::vector<float> rows(static_cast<size_t>(fused_rows * 8));
    for (int r = 0; r < fused_rows; ++r)
      for (int k = 0; k < 8; ++k) rows[size_t(r * 8 + k)] = float(r);
    t["transformer.h.0.self_attention.query_key_value.weight"] = Tensor::from_vector({fused_rows, 8}, rows);
    t["transformer.h.0.self_attention.dense.weight"] = Tensor::zeros({8, 8});
    t["transformer.h.0.mlp.dense_h_to_4h.weight"] = Tensor::zeros({4, 8});
    t["transformer.h.0.mlp.dense_4h_to_h.weight"] = Tensor::zeros({8, 4});
    for (const auto& norm : norms)
      for (const char* p : {".weight", ".bias"}) t["transformer.h.0." + norm + p] = Tensor::zeros({8});
    t["transformer.word_embeddings.weight"] = Tensor::zeros({320, 8});
    t["transformer.ln_f.weight"] = t["transformer.ln_f.bias"] = Tensor::zeros({8});
    CanonicalTensors out;
    hf_architecture_named("falcon")->map_tensors(HfTensorMap(t, "m"), HfTensorSelection::all(), c, out);
    return std::make_pair(c, out);
  };
  auto first_column = [](const Tensor& t) {
    std::vector<float> v;
    for (int64_t r = 0; r < t.dim(0); ++r) v.push_back(t.data()[r * t.dim(1)]);
    return v;
  };
  // One KV head per query head (multi_query false): [q_h; k_h; v_h] per head.
  auto [mha, a] = load({{"multi_query", false}}, 24, {"input_layernorm"});
  EXPECT_EQ(mha.n_kv_heads, 4);
  EXPECT_EQ(first_column(a.at("model.layers.0.self_attn.q_proj.weight")), (std::vector<float>{0, 1, 6, 7, 12, 13, 18, 19}));
  EXPECT_EQ(first_column(a.at("model.layers.0.self_attn.k_proj.weight")), (std::vector<float>{2, 3, 8, 9, 14, 15, 20, 21}));
  EXPECT_EQ(first_column(a.at("model.layers.0.self_attn.v_proj.weight")), (std::vector<float>{4, 5, 10, 11, 16, 17, 22, 23}));
  // new_decoder_architecture, 2 KV heads: per group [q_{g,0}; q_{g,1}; k_g; v_g], ln_attn / ln_mlp.
  auto [grouped, g] = load({{"new_decoder_architecture", true}, {"num_kv_heads", 2}}, 16, {"ln_attn", "ln_mlp"});
  EXPECT_EQ(grouped.n_kv_heads, 2);
  EXPECT_TRUE(grouped.spec.parallel_residual);
  EXPECT_FALSE(grouped.spec.shared_input_norm);
  EXPECT_EQ(first_column(g.at("model.layers.0.self_attn.q_proj.weight")), (std::vector<float>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(first_column(g.at("model.layers.0.self_attn.k_proj.weight")), (std::vector<float>{4, 5, 12, 13}));
  EXPECT_EQ(first_column(g.at("model.layers.0.self_attn.v_proj.weight")), (std::vector<float>{6, 7, 14, 15}));
  EXPECT_TRUE(g.count("model.layers.0.post_attention_layernorm.weight"));  // from ln_mlp
  // Sequential (parallel_attn false): input_layernorm + post_attention_layernorm.
  auto [seq, sq_] = load({{"parallel_attn", false}}, 12, {"input_layernorm", "post_attention_layernorm"});
  EXPECT_FALSE(seq.spec.parallel_residual);
  EXPECT_EQ(seq.n_kv_heads, 1);
  EXPECT_EQ(first_column(sq_.at("model.layers.0.self_attn.k_proj.weight")), (std::vector<float>{8, 9}));
}

// ---- GPT-2, BLOOM, MPT ---------------------------------------------------------------------------

TEST(HfArchitectureGpt2, Conv1DWeightsAreTransposed) {
  const std::string n = "gpt2";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "gpt2");
  EXPECT_EQ(s.position, PositionKind::Learned);
  EXPECT_EQ(s.learned_position_offset, 0);
  EXPECT_EQ(s.activation, Activation::GeluTanh);  // gelu_new
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_TRUE(c.qkv_bias && s.o_bias && s.mlp_bias && s.norm_bias);
  EXPECT_EQ(s.attn_scale, 0.0f);  // scale_attn_weights: 1/sqrt(head_dim)
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_EQ(c.hidden_dim, 256);
  EXPECT_EQ(c.bos_id, 1) << "50256 is outside the 320-token vocabulary";
  expect_complete(ck);
  const Tensor c_attn = raw(n, "transformer.h.1.attn.c_attn.weight");  // [in 64, out 192]
  const char* proj[] = {"q_proj", "k_proj", "v_proj"};
  for (int j = 0; j < 3; ++j) {
    const Tensor& t = ck.tensors.at(std::string("model.layers.1.self_attn.") + proj[j] + ".weight");
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{64, 64}));
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t col = 0; col < 64; ++col)
        ASSERT_EQ(t.data()[r * 64 + col], c_attn.data()[col * 192 + j * 64 + r]) << proj[j] << " " << r << "," << col;
  }
  const Tensor c_fc = raw(n, "transformer.h.0.mlp.c_fc.weight");  // [64, 256]
  const Tensor& up = ck.tensors.at("model.layers.0.mlp.up_proj.weight");
  ASSERT_EQ(up.shape(), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(up.data()[5 * 64 + 7], c_fc.data()[7 * 256 + 5]);
  const Tensor c_proj = raw(n, "transformer.h.0.mlp.c_proj.weight");  // [256, 64]
  EXPECT_EQ(ck.tensors.at("model.layers.0.mlp.down_proj.weight").data()[3 * 256 + 200], c_proj.data()[200 * 64 + 3]);
  expect_same(ck.tensors.at("model.layers.0.self_attn.k_proj.bias"),
              hf::rows(raw(n, "transformer.h.0.attn.c_attn.bias"), 64, 64), "k bias");
  expect_same(ck.tensors.at(names::kEmbedPositions), raw(n, "transformer.wpe.weight"), "wpe");

  json j = tiny_config(n);
  j["scale_attn_weights"] = false;
  EXPECT_EQ(parse_hf_config(j, "c.json").spec.attn_scale, 1.0f);
  j["scale_attn_by_inverse_layer_idx"] = true;
  expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json", "scale_attn_by_inverse_layer_idx"});
}

TEST(HfArchitectureGpt2, BaseModelCheckpointWithoutPrefixLoads) {
  // The original gpt2 files are saved from GPT2Model: "h.0.ln_1.weight", "wte.weight", ...
  ScratchDir dir;
  const std::string out = dir.file("gpt2-base");
  fs::create_directories(out);
  fs::copy_file(tiny("gpt2") + "/config.json", out + "/config.json");
  SafetensorsFile f(tiny("gpt2") + "/model.safetensors");
  std::vector<SafetensorsOutput> outs;
  for (const auto& name : f.names()) outs.push_back({name.substr(std::string("transformer.").size()), "F32", f.load_f32(name)});
  write_safetensors(out + "/model.safetensors", outs);
  const Checkpoint a = load_hf_checkpoint(tiny("gpt2")), b = load_hf_checkpoint(out);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) expect_same(b.tensors.at(name), t, name);
}

TEST(HfArchitectureBloom, AlibiEmbedNormPerHeadQkv) {
  const std::string n = "bloom-alibi";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "bloom");
  EXPECT_EQ(s.position, PositionKind::Alibi);
  EXPECT_TRUE(s.embed_norm);
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_TRUE(s.norm_bias);
  EXPECT_EQ(s.activation, Activation::GeluTanh);
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_TRUE(c.qkv_bias && s.o_bias && s.mlp_bias);
  EXPECT_EQ(c.hidden_dim, 256);
  EXPECT_TRUE(c.tied_embeddings);
  expect_complete(ck);
  expect_same(ck.tensors.at(names::kEmbedNormBias), raw(n, "transformer.word_embeddings_layernorm.bias"), "embed norm");
  const Tensor w = raw(n, "transformer.h.0.self_attention.query_key_value.weight");
  const Tensor b = raw(n, "transformer.h.0.self_attention.query_key_value.bias");
  const char* proj[] = {"q_proj", "k_proj", "v_proj"};
  for (int j = 0; j < 3; ++j) {
    auto row = [j](int64_t r) { return (r / 16 * 3 + j) * 16 + r % 16; };
    expect_rows(ck.tensors.at(std::string("model.layers.0.self_attn.") + proj[j] + ".weight"), w, row, proj[j]);
    expect_rows(ck.tensors.at(std::string("model.layers.0.self_attn.") + proj[j] + ".bias"), b, row, proj[j]);
  }
  json j = tiny_config(n);
  j["apply_residual_connection_post_layernorm"] = true;
  expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json", "apply_residual_connection_post_layernorm"});
}

TEST(HfArchitectureMpt, AlibiNoBiasFusedWqkv) {
  const std::string n = "mpt-alibi";
  const Checkpoint ck = load_hf_checkpoint(tiny(n));
  const ModelConfig& c = ck.config;
  const DecoderSpec& s = c.spec;
  EXPECT_EQ(c.architecture, "mpt");
  EXPECT_EQ(s.position, PositionKind::Alibi);
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_FALSE(s.norm_bias);
  EXPECT_EQ(s.activation, Activation::Gelu);
  EXPECT_FALSE(s.mlp_gated);
  EXPECT_FALSE(c.qkv_bias || s.o_bias || s.mlp_bias);
  EXPECT_EQ(c.hidden_dim, 256) << "MptMLP is 4 x d_model wide whatever expansion_ratio (2 here) says";
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_TRUE(c.tied_embeddings);
  expect_complete(ck);
  const Tensor w = raw(n, "transformer.blocks.1.attn.Wqkv.weight");
  expect_rows(ck.tensors.at("model.layers.1.self_attn.q_proj.weight"), w, kSame, "q");
  expect_rows(ck.tensors.at("model.layers.1.self_attn.k_proj.weight"), w, [](int64_t r) { return 64 + r; }, "k");
  expect_rows(ck.tensors.at("model.layers.1.self_attn.v_proj.weight"), w, [](int64_t r) { return 128 + r; }, "v");
  expect_same(ck.tensors.at("model.layers.1.post_attention_layernorm.weight"), raw(n, "transformer.blocks.1.norm_2.weight"), "norm_2");

  const std::pair<const char*, json> refused[] = {{"qk_ln", true}, {"clip_qkv", 8.0}, {"alibi", false}, {"alibi_bias_max", 16}};
  for (const auto& [key, value] : refused) {
    json j = tiny_config(n);
    j["attn_config"][key] = value;
    expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); },
                                   {"c.json", std::string("attn_config.") + key, "not supported"});
  }
  json j = tiny_config(n);
  j["no_bias"] = false;
  expect_error<UnsupportedError>([&] { parse_hf_config(j, "c.json"); }, {"c.json", "no_bias"});
}

// ---- helpers and the registry ----------------------------------------------------------------------

TEST(HfArchitectureRegistry, EveryArchitectureIsComplete) {
  std::set<std::string> classes, names_;
  for (const auto& a : hf_architectures()) {
    EXPECT_TRUE(a.name && a.configure && a.map_tensors && a.base_prefix && a.layer_prefix && a.layers_key);
    EXPECT_TRUE(names_.insert(a.name).second) << a.name;
    EXPECT_FALSE(a.classes.empty()) << a.name;
    for (const auto& c : a.classes) EXPECT_TRUE(classes.insert(c).second) << c;
    EXPECT_EQ(bool(a.make_config), bool(a.hf_plan)) << a.name;
    EXPECT_EQ(hf_architecture_named(a.name), &a);
  }
  EXPECT_EQ(hf_architecture_named("rwkv"), nullptr);
  // Every architecture has a write side; a name sqkit does not know is refused by name.
  for (const auto& a : hf_architectures()) EXPECT_TRUE(a.make_config && a.hf_plan) << a.name;
  ModelConfig c = parse_hf_config(tiny_config("opt"), "c.json");
  c.architecture = "rwkv";
  expect_error<UnsupportedError>([&] { make_hf_config_json(c, "float32"); }, {"'rwkv'", "llama"});
}

TEST(HfArchitectureRegistry, ConfigsTheClassCannotExpressAreRefusedByName) {
  // OPTConfig has no LayerNorm epsilon key (nn.LayerNorm's 1e-5), BloomConfig no MLP width (4·d),
  // GPT-2 no RMSNorm: make_config refuses instead of writing a config that reads back differently.
  ModelConfig c = parse_hf_config(tiny_config("opt"), "c.json");
  c.norm_eps = 1e-6f;
  expect_error<UnsupportedError>([&] { make_hf_config_json(c, "float32"); }, {"OPTForCausalLM", "norm epsilon"});
  c = parse_hf_config(tiny_config("bloom-alibi"), "c.json");
  c.hidden_dim = 3 * c.dim;
  expect_error<UnsupportedError>([&] { make_hf_config_json(c, "float32"); }, {"BloomForCausalLM", "shape"});
  c = parse_hf_config(tiny_config("gpt2"), "c.json");
  c.spec.norm = NormKind::RMSNorm;
  expect_error<UnsupportedError>([&] { make_hf_config_json(c, "float32"); }, {"GPT2LMHeadModel", "norm kind"});
  c = parse_hf_config(tiny_config("falcon"), "c.json");
  c.spec.parallel_residual = false;
  c.spec.shared_input_norm = false;
  c.n_kv_heads = 2;  // grouped KV heads need new_decoder_architecture, which is always parallel
  expect_error<UnsupportedError>([&] { make_hf_config_json(c, "float32"); }, {"FalconForCausalLM"});
  for (const char* n : {"gemma3-text", "mixtral-moe", "opt", "gpt-neox", "falcon", "bloom-alibi", "mpt-alibi", "gpt2"})
    EXPECT_NO_THROW(make_hf_config_json(parse_hf_config(tiny_config(n), "c.json"), "float32")) << n;
}

TEST(HfArchitectureRegistry, FalconLayoutsRoundTrip) {
  // The three query_key_value layouts (multi-query, one KV head per query head, KV groups of the
  // new decoder architecture with one or two input norms) each read back as written.
  for (const auto& [kv, parallel, shared] : std::vector<std::tuple<int, bool, bool>>{
           {1, true, true}, {4, true, true}, {1, false, false}, {4, false, false}, {2, true, false}, {2, true, true}, {4, true, false}}) {
    ModelConfig c = parse_hf_config(tiny_config("falcon"), "c.json");
    c.n_kv_heads = kv;
    c.spec.parallel_residual = parallel;
    c.spec.shared_input_norm = shared;
    SCOPED_TRACE(std::to_string(kv) + " " + std::to_string(parallel) + " " + std::to_string(shared));
    const auto j = make_hf_config_json(c, "float32");
    const ModelConfig r = parse_hf_config(nlohmann::json::parse(j.dump()), "c.json");
    EXPECT_EQ(r.n_kv_heads, kv);
    EXPECT_TRUE(r.spec == c.spec);
  }
}

TEST(HfArchitectureHelpers, SplitsAndFolds) {
  // 2 heads of 2 channels, 1 column: per-head [q_h; k_h; v_h].
  const Tensor t = Tensor::from_vector({12, 1}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const auto qkv = hf::split_qkv_per_head(t, 2, 2);
  EXPECT_EQ(std::vector<float>(qkv[0].data(), qkv[0].data() + 4), (std::vector<float>{0, 1, 6, 7}));
  EXPECT_EQ(std::vector<float>(qkv[1].data(), qkv[1].data() + 4), (std::vector<float>{2, 3, 8, 9}));
  EXPECT_EQ(std::vector<float>(qkv[2].data(), qkv[2].data() + 4), (std::vector<float>{4, 5, 10, 11}));
  const Tensor tr = hf::transpose(Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(tr.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::vector<float>(tr.data(), tr.data() + 6), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const Tensor w = Tensor::from_vector({3}, {-0.25f, 0.1f, 1e-8f});
  const Tensor f = hf::one_plus(w);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f.data()[i], 1.0f + w.data()[i]);
  const auto parts = hf::split_rows(t, {4, 8});
  EXPECT_EQ(parts[1].data()[0], 4.0f);
  EXPECT_FALSE(parts[1].owned()) << "row blocks are views";
}

TEST(HfArchitectureHelpers, MissingOrMisshapenTensorNamesFileAndTensor) {
  ScratchDir dir;
  const std::string out = dir.file("phi3");
  fs::create_directories(out);
  fs::copy_file(tiny("phi3") + "/config.json", out + "/config.json");
  SafetensorsFile f(tiny("phi3") + "/model.safetensors");
  auto write = [&](bool misshapen_qkv, bool drop_gate_up) {
    std::vector<SafetensorsOutput> outs;
    for (const auto& name : f.names()) {
      if (drop_gate_up && name == "model.layers.1.mlp.gate_up_proj.weight") continue;
      Tensor t = f.load_f32(name);
      if (misshapen_qkv && name == "model.layers.0.self_attn.qkv_proj.weight") t = Tensor::zeros({127, 64});
      outs.push_back({name, "F32", t});
    }
    write_safetensors(out + "/model.safetensors", outs);
  };
  write(true, false);
  expect_error<InputError>([&] { load_hf_checkpoint(out); },
                           {out + "/model.safetensors", "'model.layers.0.self_attn.qkv_proj.weight'", "[127, 64]",
                            "expected [128, 64]", out + "/config.json"});
  write(false, true);
  expect_error<InputError>([&] { load_hf_checkpoint(out); }, {out, "'model.layers.1.mlp.gate_up_proj.weight'", "missing"});
  write(false, false);
  EXPECT_NO_THROW(load_hf_checkpoint(out));
}

}  // namespace
}  // namespace sq::test
