// Tests for HfCheckpointReader (formats/hf_checkpoint.h) and the HfTensorSelection every
// architecture's map_tensors honours (formats/hf_tensor_selection.h): for each of the 14 tiny
// reference checkpoints, a sharded BF16 copy of one, and SmolLM2-135M when $SQKIT_MODELS has it,
// the global tensors plus every layer loaded on its own are exactly the full load (names, shapes,
// bits, config); a part holds nothing outside its selection; the config's refinement from tensor
// values (Llama's all-zero o_proj biases) does not depend on the selection; an out-of-range layer
// is a UsageError naming the layer and the count.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/error.h"
#include "formats/gguf_checkpoint.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "tests/support/expect_error.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "tests/support/real_models.h"

namespace sq::test {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

/// Expects `part` to carry the full load's config, source and format.
void expect_same_header(const Checkpoint& part, const Checkpoint& full, const std::string& what) {
  EXPECT_TRUE(part.config == full.config) << what << ": config differs from the full load's";
  EXPECT_EQ(part.source, full.source) << what;
  EXPECT_EQ(part.format, full.format) << what;
}

/// Loads `dir` whole (load_hf_checkpoint) and in parts (only_globals, then only_layer(l) for every
/// layer) and expects the parts to be disjoint, each within its selection, and together the full
/// load: the same names with the same shapes and bit-identical values.
void expect_parts_make_up_full_load(const std::string& dir) {
  const Checkpoint full = load_hf_checkpoint(dir);
  const HfCheckpointReader reader(dir);
  EXPECT_EQ(reader.dir(), dir);
  EXPECT_TRUE(reader.config() == full.config) << "reader.config() differs from the full load's";
  const int n = full.config.n_layers;
  ASSERT_GT(n, 0);

  std::map<std::string, Tensor> parts;
  auto add = [&](const Checkpoint& part, const std::string& what) {
    expect_same_header(part, full, what);
    EXPECT_FALSE(part.tensors.empty()) << what;
    for (const auto& [name, t] : part.tensors) EXPECT_TRUE(parts.emplace(name, t).second) << name << " loaded twice";
  };
  const Checkpoint globals = reader.load(HfTensorSelection::only_globals());
  for (const auto& [name, t] : globals.tensors) EXPECT_FALSE(starts_with(name, "model.layers.")) << name << " in the globals";
  add(globals, "only_globals()");
  for (int l = 0; l < n; ++l) {
    const Checkpoint layer = reader.load(HfTensorSelection::only_layer(l));
    for (const auto& [name, t] : layer.tensors) EXPECT_TRUE(starts_with(name, names::layer(l))) << name << " in layer " << l;
    add(layer, "only_layer(" + std::to_string(l) + ")");
  }

  ASSERT_EQ(parts.size(), full.tensors.size());
  for (const auto& [name, t] : full.tensors) {
    const auto it = parts.find(name);
    ASSERT_NE(it, parts.end()) << name << " is in no part";
    const Tensor& u = it->second;
    ASSERT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(u.data(), t.data(), size_t(t.numel()) * sizeof(float)), 0) << name << " differs";
  }
}

class HfCheckpointReaderTiny : public ::testing::TestWithParam<const char*> {};

TEST_P(HfCheckpointReaderTiny, GlobalsAndEveryLayerMakeUpTheFullLoad) { expect_parts_make_up_full_load(hf_tiny(GetParam())); }

INSTANTIATE_TEST_SUITE_P(All, HfCheckpointReaderTiny, ::testing::ValuesIn(kHfTinyCheckpoints), HfTinyParamName());

// BF16 shards (the 7B layout: widened per selected tensor, tensors spread over files) of the
// deepest tiny model.
TEST(HfCheckpointReader, ShardedBf16GlobalsAndEveryLayerMakeUpTheFullLoad) {
  ScratchDir dir;
  save_hf_checkpoint(load_hf_checkpoint(hf_tiny("gemma3-text")), dir.file("bf16"), "BF16", 3);
  expect_parts_make_up_full_load(dir.file("bf16"));
}

// F32 tensors stored as they are stay views of the mapping; a folded one (Gemma's 1 + w) is owned.
TEST(HfCheckpointReader, F32TensorsStayViewsOfTheMapping) {
  const HfCheckpointReader llama(hf_tiny("llama-gqa"));
  const Checkpoint layer = llama.load(HfTensorSelection::only_layer(1));
  EXPECT_FALSE(layer.tensors.at("model.layers.1.self_attn.q_proj.weight").owned());
  EXPECT_FALSE(llama.load(HfTensorSelection::only_globals()).tensors.at(names::kEmbed).owned());
  const Checkpoint gemma = HfCheckpointReader(hf_tiny("gemma3-text")).load(HfTensorSelection::only_layer(0));
  EXPECT_TRUE(gemma.tensors.at("model.layers.0.input_layernorm.weight").owned());
}

// Llama with attention_bias: spec.o_bias is decided by the o_proj biases of every layer, whatever
// the selection (all zero: no o_proj bias anywhere; one non-zero value in the last layer: o_bias
// in every part, with the zero biases of the other layers loaded).
TEST(HfCheckpointReader, LlamaOProjBiasIsDecidedByEveryLayer) {
  ScratchDir dir;
  Checkpoint ck = load_hf_checkpoint(hf_tiny("llama-gqa"));
  ModelConfig& c = ck.config;
  ASSERT_GE(c.n_layers, 2);
  c.qkv_bias = true;
  const int64_t q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l)
    for (const auto& [proj, rows] : {std::pair<const char*, int64_t>{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}})
      ck.tensors[names::layer(l) + "self_attn." + proj + ".bias"] = Tensor::zeros({rows});
  const std::string model = dir.file("llama-bias");
  save_hf_checkpoint(ck, model, "F32");  // writes all-zero o_proj biases
  const std::string last_bias = names::layer(c.n_layers - 1) + "self_attn.o_proj.bias";
  {
    const HfCheckpointReader reader(model);
    EXPECT_FALSE(reader.config().spec.o_bias);
    for (int l = 0; l < c.n_layers; ++l) {
      const Checkpoint part = reader.load(HfTensorSelection::only_layer(l));
      EXPECT_FALSE(part.config.spec.o_bias) << "layer " << l;
      EXPECT_FALSE(part.has(names::layer(l) + "self_attn.o_proj.bias")) << "layer " << l;
    }
    EXPECT_FALSE(reader.load(HfTensorSelection::only_globals()).config.spec.o_bias);
  }
  {
    std::vector<SafetensorsOutput> outs;
    const SafetensorsFile f(model + "/model.safetensors");
    for (const auto& name : f.names()) {
      Tensor t = f.load_f32(name).clone();
      if (name == last_bias) t.mutable_data()[0] = 0.5f;
      outs.push_back({name, "F32", t});
    }
    write_safetensors(model + "/model.safetensors", outs);
  }
  const HfCheckpointReader reader(model);
  EXPECT_TRUE(reader.config().spec.o_bias);
  EXPECT_TRUE(reader.load(HfTensorSelection::only_globals()).config.spec.o_bias);
  const Checkpoint first = reader.load(HfTensorSelection::only_layer(0));
  EXPECT_TRUE(first.config.spec.o_bias);
  EXPECT_EQ(first.tensors.at("model.layers.0.self_attn.o_proj.bias").data()[0], 0.0f);
  EXPECT_EQ(reader.load(HfTensorSelection::only_layer(c.n_layers - 1)).tensors.at(last_bias).data()[0], 0.5f);
  expect_parts_make_up_full_load(model);
}

TEST(HfCheckpointReader, OutOfRangeLayersAreUsageErrorsNamingLayerAndCount) {
  const std::string dir = hf_tiny("llama-gqa");
  const HfCheckpointReader reader(dir);
  ASSERT_EQ(reader.config().n_layers, 2);
  const std::vector<std::string> count = {dir, "the checkpoint has 2 layers", "num_hidden_layers = 2"};
  auto with = [&](const std::string& part) {
    std::vector<std::string> parts = count;
    parts.push_back(part);
    return parts;
  };
  expect_error<UsageError>([&] { reader.load(HfTensorSelection::only_layer(2)); }, with("layer 2 is out of range"));
  expect_error<UsageError>([&] { reader.load(HfTensorSelection::only_layer(-1)); }, with("layer -1 is out of range"));
  expect_error<UsageError>([&] { reader.load(HfTensorSelection::only_layer(INT_MAX)); }, with("out of range"));
  expect_error<UsageError>([&] { reader.load(HfTensorSelection{false, 1, 5}); }, with("layers [1, 5) are out of range"));
  expect_error<UsageError>([&] { reader.load(HfTensorSelection{false, 1, 0}); }, with("layers [1, 0) are out of range"));
  expect_error<UsageError>([&] { reader.load(HfTensorSelection{true, 3, HfTensorSelection::kToLastLayer}); },
                           with("layers from 3 on are out of range"));

  // In range: an empty range, and from a layer to the last.
  EXPECT_TRUE(reader.load(HfTensorSelection{false, 2, 2}).tensors.empty());
  const Checkpoint tail = reader.load(HfTensorSelection{false, 1, HfTensorSelection::kToLastLayer});
  EXPECT_FALSE(tail.tensors.empty());
  for (const auto& [name, t] : tail.tensors) EXPECT_TRUE(starts_with(name, names::layer(1))) << name;

  // The message names the architecture's own layer-count key.
  const std::string gpt2 = hf_tiny("gpt2");
  expect_error<UsageError>([&] { HfCheckpointReader(gpt2).load(HfTensorSelection::only_layer(7)); },
                           {gpt2, "layer 7 is out of range", "the checkpoint has 2 layers", "n_layer = 2"});
}

// SmolLM2-135M (30 layers) from its GGUF, written as a 4-shard BF16 Hugging Face checkpoint.
TEST(HfCheckpointReaderSmolLM2, GlobalsAndEveryLayerMakeUpTheFullLoad) {
  const std::string gguf = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (gguf.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found in $SQKIT_MODELS or models/: run bash scripts/fetch-models.sh";
  ScratchDir dir;
  save_hf_checkpoint(load_gguf_checkpoint(gguf), dir.file("smollm2"), "BF16", 4);
  expect_parts_make_up_full_load(dir.file("smollm2"));
}

}  // namespace
}  // namespace sq::test
