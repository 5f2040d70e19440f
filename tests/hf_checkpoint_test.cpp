// Tests for formats/hf_config.h and formats/hf_checkpoint.h.
#include "formats/hf_checkpoint.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "formats/hf_config.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/safetensors.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using nlohmann::json;
using sq::test::ScratchDir;
using sq::test::expect_error;


/// Expects an InputError that is not an UnsupportedError.
template <typename F>
void expect_input_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception, none thrown";
  } catch (const sq::UnsupportedError& e) {
    ADD_FAILURE() << "expected a plain InputError, got UnsupportedError: " << e.what();
  } catch (const sq::InputError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

json llama_json() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"hidden_size", 64},
              {"intermediate_size", 172},
              {"num_hidden_layers", 5},
              {"num_attention_heads", 8}};
}

// ---- config.json ---------------------------------------------------------------------------------

TEST(HfConfig, LlamaDefaultsMatchTransformers) {
  const sq::ModelConfig c = sq::parse_hf_config(llama_json(), "config.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 8);    // = num_attention_heads
  EXPECT_EQ(c.head_dim, 8);      // hidden / heads
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_EQ(c.norm_eps, 1e-6f);  // LlamaConfig.rms_norm_eps
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_EQ(c.rope_layout, sq::RopeLayout::HalfSplit);
}

TEST(HfConfig, ExplicitValuesAndQwen2) {
  json j = llama_json();
  j["num_key_value_heads"] = 4;
  j["head_dim"] = 16;
  j["vocab_size"] = 512;
  j["max_position_embeddings"] = 512;
  j["rms_norm_eps"] = 1e-5;
  j["rope_theta"] = 500000;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = 3;
  j["eos_token_id"] = {4, 5};  // Llama-3.1 style list: first one
  j["attention_bias"] = true;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  sq::ModelConfig c = sq::parse_hf_config(j, "cfg");
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.qkv_bias);  // Llama attention_bias
  EXPECT_EQ(c.bos_id, 3);
  EXPECT_EQ(c.eos_id, 4);

  json q = llama_json();
  q["architectures"] = {"Qwen2ForCausalLM"};
  q["use_sliding_window"] = false;
  q["sliding_window"] = 131072;  // ignored when use_sliding_window is false (as in HF)
  q["bos_token_id"] = 100;
  q["eos_token_id"] = 101;
  c = sq::parse_hf_config(q, "cfg");
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_seq_len, 32768);
  EXPECT_FALSE(c.tied_embeddings);

  json m = llama_json();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = nullptr;
  c = sq::parse_hf_config(m, "cfg");
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_EQ(c.max_seq_len, 131072);
  m["max_position_embeddings"] = 4096;
  m["sliding_window"] = 4096;  // covers the whole context: accepted
  EXPECT_EQ(sq::parse_hf_config(m, "cfg").max_seq_len, 4096);
}

TEST(HfConfig, UnsupportedArchitectureMessage) {
  json j = llama_json();
  j["architectures"] = {"BertForMaskedLM"};
  try {
    sq::parse_hf_config(j, "config.json");
    FAIL() << "no exception";
  } catch (const sq::UnsupportedError& e) {
    EXPECT_STREQ(e.what(),
                 "config.json: architectures[0] = 'BertForMaskedLM' is not supported (expected LlamaForCausalLM, "
                 "MistralForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM, "
                 "OPTForCausalLM, GPTNeoXForCausalLM, FalconForCausalLM, GPT2LMHeadModel, BloomForCausalLM or "
                 "MptForCausalLM)");
  }
  j.erase("architectures");
  j["model_type"] = "bert";
  expect_error<sq::UnsupportedError>([&] { sq::parse_hf_config(j, "c.json"); },
                                     {"c.json: model_type = 'bert' is not supported", "llama", "gpt2", "mpt"});
}

TEST(HfConfig, MissingRequiredKeyNamesIt) {
  ScratchDir dir;
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    json j = llama_json();
    j.erase(key);
    const std::string path = dir.file("config.json");
    sq::test::write_file(path, j.dump());
    expect_input_error([&] { sq::load_hf_config(path); }, {path, std::string("'") + key + "'", "missing"});
  }
  json j = llama_json();
  j["hidden_size"] = "64";
  expect_input_error([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "'hidden_size'", "integer"});
  j = llama_json();
  j.erase("architectures");
  expect_input_error([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "'architectures'"});
  j["model_type"] = "llama";  // fallback when architectures is absent
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").architecture, "llama");
  const std::string bad = dir.file("bad.json");
  sq::test::write_file(bad, "{\"hidden_size\": ");
  expect_input_error([&] { sq::load_hf_config(bad); }, {bad, "not valid JSON"});
  expect_input_error([&] { sq::load_hf_config(dir.file("none.json")); }, {dir.file("none.json")});
}

TEST(HfConfig, RejectsUnsupportedFeatures) {
  json j = llama_json();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // linear and llama3 are supported (rope_scaling_test.cpp)
  expect_error<sq::UnsupportedError>([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "rope_scaling", "dynamic"});
  j = llama_json();
  j["hidden_act"] = "quick_gelu";
  expect_error<sq::UnsupportedError>([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "hidden_act", "quick_gelu"});
  j = llama_json();
  j["num_key_value_heads"] = 3;  // 8 % 3 != 0: ModelConfig::validate
  expect_input_error([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "n_kv_heads"});
}

// Features the generic decoder runs (issue 16) that sqkit used to refuse: they now configure the
// DecoderSpec instead.
TEST(HfConfig, FormerlyRefusedFeaturesConfigureTheSpec) {
  json j = llama_json();
  j["hidden_act"] = "gelu";
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").spec.activation, sq::Activation::Gelu);
  j = llama_json();
  j["mlp_bias"] = true;
  EXPECT_TRUE(sq::parse_hf_config(j, "c.json").spec.mlp_bias);
  j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["max_position_embeddings"] = 32768;
  j["sliding_window"] = 4096;  // HF masks keys j <= i - 4096 on every layer
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").spec.layer_window, std::vector<int>(5, 4096));
  j.erase("sliding_window");  // MistralConfig's default is 4096, not "none"
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").spec.layer_window, std::vector<int>(5, 4096));
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(sq::parse_hf_config(j, "c.json").spec.layer_window.empty());
  j = llama_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["use_sliding_window"] = true;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 3;  // layers 3 and 4 slide (Qwen2Config.__post_init__)
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").spec.layer_window, (std::vector<int>{0, 0, 0, 16, 16}));
  j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(sq::parse_hf_config(j, "c.json").spec.layer_window, (std::vector<int>{16, 0, 0, 0, 0}));
  j["layer_types"] = {"sliding_attention"};
  expect_input_error([&] { sq::parse_hf_config(j, "c.json"); }, {"c.json", "layer_types", "5"});
}

TEST(HfConfig, JsonRoundTrip) {
  sq::ModelConfig c;
  c.architecture = "qwen2";
  c.dim = 96;
  c.hidden_dim = 200;
  c.n_layers = 3;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 300;
  c.max_seq_len = 128;
  c.norm_eps = 1e-5f;
  c.rope_theta = 1e6f;
  c.tied_embeddings = true;
  c.qkv_bias = true;
  c.bos_id = 7;
  c.eos_id = 8;
  const auto j = sq::make_hf_config_json(c, "bfloat16");
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_NE(j.dump().find("\"rms_norm_eps\":1e-05"), std::string::npos) << j.dump();
  const sq::ModelConfig r = sq::parse_hf_config(json::parse(j.dump()), "x");
  EXPECT_EQ(r.architecture, c.architecture);
  EXPECT_EQ(r.dim, c.dim);
  EXPECT_EQ(r.hidden_dim, c.hidden_dim);
  EXPECT_EQ(r.n_layers, c.n_layers);
  EXPECT_EQ(r.n_heads, c.n_heads);
  EXPECT_EQ(r.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(r.head_dim, c.head_dim);
  EXPECT_EQ(r.vocab_size, c.vocab_size);
  EXPECT_EQ(r.max_seq_len, c.max_seq_len);
  EXPECT_EQ(r.norm_eps, c.norm_eps);
  EXPECT_EQ(r.rope_theta, c.rope_theta);
  EXPECT_EQ(r.tied_embeddings, c.tied_embeddings);
  EXPECT_EQ(r.qkv_bias, c.qkv_bias);
  EXPECT_EQ(r.bos_id, c.bos_id);
  EXPECT_EQ(r.eos_id, c.eos_id);
  c.architecture = "gpt2";
  EXPECT_THROW(sq::make_hf_config_json(c, "float32"), sq::UnsupportedError);
}

// ---- RoPE permutation ----------------------------------------------------------------------------

TEST(HfCheckpoint, PermutationMatchesConvertLlamaWeightsToHf) {
  // 2 heads, head_dim 4, 1 column: row r holds value r. HF permute (view(2, 2, 2, 1).transpose(1, 2)):
  // per head, interleaved rows (0,1,2,3) -> half-split order (0,2,1,3).
  const sq::Tensor w = sq::Tensor::from_vector({8, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  const sq::Tensor p = sq::permute_qk_rows_for_half_split(w, 2, 4);
  EXPECT_EQ(std::vector<float>(p.data(), p.data() + 8), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  // head_dim 6: (0,1,2,3,4,5) -> (0,2,4,1,3,5); the inverse restores the order; rank-1 biases too.
  const sq::Tensor b = sq::Tensor::from_vector({6}, {0, 1, 2, 3, 4, 5});
  const sq::Tensor pb = sq::permute_qk_rows_for_half_split(b, 1, 6);
  EXPECT_EQ(std::vector<float>(pb.data(), pb.data() + 6), (std::vector<float>{0, 2, 4, 1, 3, 5}));
  const sq::Tensor back = sq::permute_qk_rows_for_interleaved(pb, 1, 6);
  EXPECT_EQ(std::vector<float>(back.data(), back.data() + 6), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Whole rows move.
  const sq::Tensor m = sq::Tensor::from_vector({4, 2}, {0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5});
  const sq::Tensor pm = sq::permute_qk_rows_for_half_split(m, 1, 4);
  EXPECT_EQ(std::vector<float>(pm.data(), pm.data() + 8), (std::vector<float>{0, 0.5, 2, 2.5, 1, 1.5, 3, 3.5}));
  expect_input_error([&] { sq::permute_qk_rows_for_half_split(w, 3, 4); }, {"[8, 1]", "12 rows"});
}

// ---- synthetic checkpoints -----------------------------------------------------------------------

sq::ModelConfig small_config(const std::string& arch, bool tied, bool qkv_bias, sq::RopeLayout layout) {
  sq::ModelConfig c;
  c.architecture = arch;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.max_seq_len = 64;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_layout = layout;
  c.tied_embeddings = tied;
  c.qkv_bias = qkv_bias;
  return c;
}

sq::Checkpoint make_checkpoint(const sq::ModelConfig& c, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  sq::Checkpoint ck;
  ck.config = c;
  ck.source = "synthetic";
  ck.format = "test";
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    sq::Tensor t = sq::Tensor::zeros(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data()[i] = dist(rng);
    ck.tensors[name] = t;
  };
  const int64_t d = c.dim, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, h = c.hidden_dim;
  add(sq::names::kEmbed, {c.vocab_size, d});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = sq::names::layer(i);
    add(p + "input_layernorm.weight", {d});
    add(p + "self_attn.q_proj.weight", {q, d});
    add(p + "self_attn.k_proj.weight", {kv, d});
    add(p + "self_attn.v_proj.weight", {kv, d});
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    add(p + "self_attn.o_proj.weight", {d, q});
    add(p + "post_attention_layernorm.weight", {d});
    add(p + "mlp.gate_proj.weight", {h, d});
    add(p + "mlp.up_proj.weight", {h, d});
    add(p + "mlp.down_proj.weight", {d, h});
  }
  add(sq::names::kFinalNorm, {d});
  if (!c.tied_embeddings) add(sq::names::kLmHead, {c.vocab_size, d});
  return ck;
}

bool is_q_or_k(const std::string& name) {
  return name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos;
}

/// Expects `loaded` to equal `original` tensor by tensor (bitwise), undoing the q/k permutation
/// when `original` is interleaved; `round` maps each original value to the stored precision.
template <typename Round>
void expect_same_tensors(const sq::Checkpoint& original, const sq::Checkpoint& loaded, Round round) {
  EXPECT_EQ(loaded.tensors.size(), original.tensors.size());
  const auto& c = original.config;
  for (const auto& [name, t] : original.tensors) {
    ASSERT_TRUE(loaded.has(name)) << name;
    sq::Tensor got = loaded.tensors.at(name);
    ASSERT_EQ(got.shape(), t.shape()) << name;
    if (c.rope_layout == sq::RopeLayout::Interleaved && is_q_or_k(name)) {
      const int heads = name.find("q_proj") != std::string::npos ? c.n_heads : c.n_kv_heads;
      got = sq::permute_qk_rows_for_interleaved(got, heads, c.head_dim);
    }
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got.data()[i]), std::bit_cast<uint32_t>(round(t.data()[i])))
          << name << " element " << i;
  }
}

void expect_same_config(const sq::ModelConfig& a, const sq::ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
}

const auto kIdentity = [](float v) { return v; };

TEST(HfCheckpoint, SyntheticInterleavedRoundTripF32) {
  ScratchDir dir;
  const auto ck = make_checkpoint(small_config("llama", false, false, sq::RopeLayout::Interleaved));
  const std::string out = dir.file("hf");
  sq::save_hf_checkpoint(ck, out, "F32");
  EXPECT_TRUE(std::filesystem::is_regular_file(out + "/config.json"));
  EXPECT_TRUE(std::filesystem::is_regular_file(out + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.index.json"));

  const sq::Checkpoint r = sq::load_hf_checkpoint(out);
  EXPECT_EQ(r.format, "hf-safetensors");
  EXPECT_EQ(r.source, out);
  EXPECT_EQ(r.config.rope_layout, sq::RopeLayout::HalfSplit);
  expect_same_config(r.config, ck.config);
  expect_same_tensors(ck, r, kIdentity);
  EXPECT_FALSE(r.tensors.at(sq::names::kLmHead).owned()) << "F32 tensors are views into the mapping";

  // The written file is HF-layout: k_proj row h*8 + j*4 + i equals the source row h*8 + 2i + j.
  const sq::Tensor& k_src = ck.tensors.at("model.layers.1.self_attn.k_proj.weight");
  const sq::Tensor& k_hf = r.tensors.at("model.layers.1.self_attn.k_proj.weight");
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 4; ++i)
        EXPECT_EQ(k_hf.data()[(h * 8 + j * 4 + i) * 32 + 5], k_src.data()[(h * 8 + 2 * i + j) * 32 + 5]);

  // A HalfSplit checkpoint is written without any permutation.
  const auto hs = make_checkpoint(small_config("mistral", true, false, sq::RopeLayout::HalfSplit), 2);
  sq::save_hf_checkpoint(hs, out, "F32");
  const sq::Checkpoint r2 = sq::load_hf_checkpoint(out);
  expect_same_config(r2.config, hs.config);
  expect_same_tensors(hs, r2, kIdentity);
}

TEST(HfCheckpoint, HalfPrecisionRoundTrips) {
  ScratchDir dir;
  const auto ck = make_checkpoint(small_config("qwen2", true, true, sq::RopeLayout::HalfSplit), 3);
  sq::save_hf_checkpoint(ck, dir.file("bf16"), "BF16");
  sq::save_hf_checkpoint(ck, dir.file("f16"), "F16");
  const auto rb = sq::load_hf_checkpoint(dir.file("bf16"));
  const auto rh = sq::load_hf_checkpoint(dir.file("f16"));
  expect_same_config(rb.config, ck.config);
  expect_same_tensors(ck, rb, [](float v) { return sq::bf16_to_float(sq::float_to_bf16(v)); });
  expect_same_tensors(ck, rh, [](float v) { return sq::half_to_float(sq::float_to_half(v)); });
  EXPECT_EQ(json::parse(sq::test::read_file(dir.file("bf16/config.json")))["torch_dtype"], "bfloat16");
  sq::SafetensorsFile f(dir.file("f16/model.safetensors"));
  EXPECT_EQ(f.dtype("model.layers.0.self_attn.q_proj.bias"), "F16");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_FALSE(f.has(sq::names::kLmHead));  // tied
}

TEST(HfCheckpoint, ShardedRoundTripEqualsSingleFile) {
  ScratchDir dir;
  const auto ck = make_checkpoint(small_config("llama", false, false, sq::RopeLayout::Interleaved), 4);
  sq::save_hf_checkpoint(ck, dir.file("one"), "BF16", 1);
  sq::save_hf_checkpoint(ck, dir.file("two"), "BF16", 2);
  EXPECT_TRUE(std::filesystem::exists(dir.file("two/model-00001-of-00002.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("two/model-00002-of-00002.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("two/model.safetensors")));
  const json index = json::parse(sq::test::read_file(dir.file("two/model.safetensors.index.json")));
  std::set<std::string> shard_names;
  for (const auto& [name, shard] : index["weight_map"].items()) shard_names.insert(shard.get<std::string>());
  EXPECT_EQ(shard_names.size(), 2u);
  EXPECT_EQ(index["weight_map"].size(), ck.tensors.size());
  uint64_t total = 0;
  for (const auto& [name, t] : ck.tensors) total += uint64_t(t.numel()) * 2;
  EXPECT_EQ(index["metadata"]["total_size"], total);

  const auto a = sq::load_hf_checkpoint(dir.file("one"));
  const auto b = sq::load_hf_checkpoint(dir.file("two"));
  expect_same_config(a.config, b.config);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const sq::Tensor& u = b.tensors.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data()[i], u.data()[i]) << name;
  }
  expect_same_tensors(ck, b, [](float v) { return sq::bf16_to_float(sq::float_to_bf16(v)); });

  // Re-saving as a single file removes the index, so the directory is unambiguous.
  sq::save_hf_checkpoint(ck, dir.file("two"), "F32", 1);
  EXPECT_FALSE(std::filesystem::exists(dir.file("two/model.safetensors.index.json")));
  expect_same_tensors(ck, sq::load_hf_checkpoint(dir.file("two")), kIdentity);

  expect_error<sq::UsageError>([&] { sq::save_hf_checkpoint(ck, dir.file("x"), "F32", 0); }, {"0 shards"});
  expect_error<sq::UsageError>([&] { sq::save_hf_checkpoint(ck, dir.file("x"), "I8"); }, {"'I8'"});
}

TEST(HfCheckpoint, LlamaAttentionBiasGetsZeroOProjBias) {
  ScratchDir dir;
  const auto ck = make_checkpoint(small_config("llama", true, true, sq::RopeLayout::Interleaved), 5);
  sq::save_hf_checkpoint(ck, dir.file("m"), "F32");
  const json cfg = json::parse(sq::test::read_file(dir.file("m/config.json")));
  EXPECT_EQ(cfg["attention_bias"], true);
  sq::SafetensorsFile f(dir.file("m/model.safetensors"));
  ASSERT_TRUE(f.has("model.layers.1.self_attn.o_proj.bias"));
  const auto r = sq::load_hf_checkpoint(dir.file("m"));
  expect_same_tensors(ck, r, kIdentity);  // q/k biases permuted back too

  EXPECT_FALSE(r.config.spec.o_bias) << "all-zero o_proj biases keep the LLaMA structure";

  // A non-zero o_proj bias is loaded (spec.o_bias), zeros included on the other layers.
  std::vector<sq::SafetensorsOutput> outs;
  for (const auto& name : f.names()) {
    sq::Tensor t = f.load_f32(name).clone();
    if (name == "model.layers.1.self_attn.o_proj.bias") t.mutable_data()[3] = 0.25f;
    outs.push_back({name, "F32", t});
  }
  sq::write_safetensors(dir.file("m/model.safetensors"), outs);
  const auto b = sq::load_hf_checkpoint(dir.file("m"));
  EXPECT_TRUE(b.config.spec.o_bias);
  EXPECT_EQ(b.tensors.at("model.layers.1.self_attn.o_proj.bias").data()[3], 0.25f);
  EXPECT_EQ(b.tensors.at("model.layers.0.self_attn.o_proj.bias").data()[3], 0.0f);
}

// ---- loader errors -------------------------------------------------------------------------------

class HfCheckpointBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = make_checkpoint(small_config("llama", true, false, sq::RopeLayout::HalfSplit), 6);
    model_ = dir_.file("model");
    sq::save_hf_checkpoint(ck_, model_, "F32");
  }
  /// Rewrites model.safetensors with `edit` applied to the list of tensors.
  template <typename Edit>
  void rewrite(Edit edit) {
    std::vector<sq::SafetensorsOutput> outs;
    for (const auto& [name, t] : ck_.tensors) outs.push_back({name, "F32", t});
    edit(outs);
    sq::write_safetensors(model_ + "/model.safetensors", outs);
  }
  void write_index(const json& weight_map) {
    std::filesystem::remove(model_ + "/model.safetensors");
    sq::test::write_file(model_ + "/model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());
  }
  ScratchDir dir_;
  sq::Checkpoint ck_;
  std::string model_;
};

TEST_F(HfCheckpointBadInput, TiedIgnoresLmHeadAndExtraTensors) {
  rewrite([](auto& outs) {
    outs.push_back({"lm_head.weight", "F32", sq::Tensor::zeros({40, 32})});
    outs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", sq::Tensor::zeros({4})});
  });
  const auto r = sq::load_hf_checkpoint(model_);
  EXPECT_FALSE(r.has("lm_head.weight"));
  EXPECT_FALSE(r.has("model.layers.0.self_attn.rotary_emb.inv_freq"));
  expect_same_tensors(ck_, r, kIdentity);
}

TEST_F(HfCheckpointBadInput, UntiedWithoutLmHead) {
  json cfg = json::parse(sq::test::read_file(model_ + "/config.json"));
  cfg["tie_word_embeddings"] = false;
  sq::test::write_file(model_ + "/config.json", cfg.dump());
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {model_, "'lm_head.weight'", "missing", "[40, 32]"});
}

TEST_F(HfCheckpointBadInput, WrongShapeOrDtype) {
  rewrite([](auto& outs) {
    for (auto& o : outs)
      if (o.name == "model.norm.weight") o.tensor = sq::Tensor::zeros({31});
  });
  expect_input_error([&] { sq::load_hf_checkpoint(model_); },
                     {model_ + "/model.safetensors", "'model.norm.weight'", "[31]", "expected [32]"});
  rewrite([](auto& outs) { std::erase_if(outs, [](auto& o) { return o.name == "model.layers.1.mlp.up_proj.weight"; }); });
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {model_, "'model.layers.1.mlp.up_proj.weight'", "missing"});

  // An I8 tensor under a needed name, in an otherwise complete file (the config's dimensions are
  // checked against the file's layers first): the F32 [32] entry relabelled I8 [32], its first 32
  // bytes kept (a gap after a tensor is allowed).
  rewrite([](auto&) {});
  const std::string file = sq::test::read_file(model_ + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  json header = json::parse(file.substr(8, n));
  header["model.norm.weight"]["dtype"] = "I8";
  const uint64_t begin = header["model.norm.weight"]["data_offsets"][0].get<uint64_t>();
  header["model.norm.weight"]["data_offsets"] = {begin, begin + 32};
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(bytes.data(), &len, 8);
  sq::test::write_file(model_ + "/model.safetensors", bytes + text + file.substr(8 + n));
  expect_error<sq::UnsupportedError>([&] { sq::load_hf_checkpoint(model_); }, {"'model.norm.weight'", "I8"});
}

TEST_F(HfCheckpointBadInput, MissingConfigOrWeights) {
  std::filesystem::remove(model_ + "/config.json");
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {model_ + "/config.json"});
  sq::save_hf_checkpoint(ck_, model_, "F32");
  std::filesystem::remove(model_ + "/model.safetensors");
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {model_, "model.safetensors.index.json"});
  expect_input_error([&] { sq::load_hf_checkpoint(dir_.file("nothing")); }, {dir_.file("nothing")});
}

TEST_F(HfCheckpointBadInput, ConfigProblemsNameTheFile) {
  json cfg = json::parse(sq::test::read_file(model_ + "/config.json"));
  cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  sq::test::write_file(model_ + "/config.json", cfg.dump());
  expect_error<sq::UnsupportedError>([&] { sq::load_hf_checkpoint(model_); },
                                     {model_ + "/config.json", "rope_scaling", "yarn"});
  cfg.erase("rope_scaling");
  cfg.erase("num_hidden_layers");
  sq::test::write_file(model_ + "/config.json", cfg.dump());
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {model_ + "/config.json", "'num_hidden_layers'"});
}

TEST_F(HfCheckpointBadInput, IndexNamesMissingShard) {
  sq::save_hf_checkpoint(ck_, model_, "F32", 2);
  std::filesystem::remove(model_ + "/model-00002-of-00002.safetensors");
  expect_input_error([&] { sq::load_hf_checkpoint(model_); },
                     {model_ + "/model.safetensors.index.json", "'model-00002-of-00002.safetensors'", "does not exist"});
}

TEST_F(HfCheckpointBadInput, IndexShardNamesMustBePlainFileNames) {
  const std::string index = model_ + "/model.safetensors.index.json";
  std::filesystem::rename(model_ + "/model.safetensors", dir_.file("model.safetensors"));
  for (const std::string shard : {"../model.safetensors", "sub/model.safetensors", "..", "/etc/passwd"}) {
    json wm;
    for (const auto& [name, t] : ck_.tensors) wm[name] = shard;
    write_index(wm);
    expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {index, "'" + shard + "'", "plain file name"});
  }
}

TEST_F(HfCheckpointBadInput, IndexMapsTensorToWrongShard) {
  sq::save_hf_checkpoint(ck_, model_, "F32", 2);
  const std::string index = model_ + "/model.safetensors.index.json";
  json j = json::parse(sq::test::read_file(index));
  j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // it is in shard 2
  sq::test::write_file(index, j.dump());
  expect_input_error([&] { sq::load_hf_checkpoint(model_); },
                     {index, "'model.norm.weight'", "model-00001-of-00002.safetensors", "no such tensor"});
  j.erase("weight_map");
  sq::test::write_file(index, j.dump());
  expect_input_error([&] { sq::load_hf_checkpoint(model_); }, {index, "weight_map"});
}

// ---- the real stories260K model ------------------------------------------------------------------

TEST(HfCheckpoint, Stories260KRoundTripThroughHfLayout) {
  const sq::Checkpoint src = sq::load_llama2c_checkpoint(sq::test::stories_model());
  ASSERT_EQ(src.config.rope_layout, sq::RopeLayout::Interleaved);
  ScratchDir dir;
  const std::string out = dir.file("stories260K-hf");
  sq::save_hf_checkpoint(src, out, "F32");
  const sq::Checkpoint hf = sq::load_hf_checkpoint(out);

  expect_same_config(hf.config, src.config);
  EXPECT_EQ(hf.config.dim, 64);
  EXPECT_EQ(hf.config.n_heads, 8);
  EXPECT_EQ(hf.config.n_kv_heads, 4);
  EXPECT_EQ(hf.config.head_dim, 8);
  EXPECT_EQ(hf.config.norm_eps, 1e-5f);
  EXPECT_TRUE(hf.config.tied_embeddings);
  EXPECT_EQ(hf.config.rope_layout, sq::RopeLayout::HalfSplit);
  EXPECT_EQ(hf.config.parameter_count(), 260032);
  // Every tensor equal (q/k after undoing the permutation), nothing extra.
  expect_same_tensors(src, hf, kIdentity);

  // Explicit q_proj row mapping on layer 0: HF row h*8 + j*4 + i == llama2.c row h*8 + 2i + j.
  const sq::Tensor& q_src = src.tensors.at("model.layers.0.self_attn.q_proj.weight");
  const sq::Tensor& q_hf = hf.tensors.at("model.layers.0.self_attn.q_proj.weight");
  ASSERT_EQ(q_hf.shape(), (std::vector<int64_t>{64, 64}));
  int moved = 0;
  for (int h = 0; h < 8; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 4; ++i) {
        const int hf_row = h * 8 + j * 4 + i, src_row = h * 8 + 2 * i + j;
        for (int col = 0; col < 64; ++col)
          ASSERT_EQ(q_hf.data()[hf_row * 64 + col], q_src.data()[src_row * 64 + col]) << hf_row << "," << col;
        if (hf_row != src_row) ++moved;
      }
  EXPECT_EQ(moved, 8 * 6);  // per head only rows 0 (i=0, j=0) and 7 (i=3, j=1) stay in place
  // And the permutation is not the identity on real weights.
  EXPECT_NE(q_hf.data()[1 * 64], q_src.data()[1 * 64]);
}

}  // namespace
