// Tests for checkpoints written from generated tensors (issue 19, a LLaMA-7B shape larger than RAM):
// the safetensors writer's generated entries (formats/safetensors.h), save_hf_checkpoint_generated
// (formats/hf_checkpoint.h) and the synthetic models (model/synthetic.h).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "model/synthetic.h"
#include "support/expect_error.h"
#include "support/process.h"

namespace {

using sq::test::expect_error;
using sq::test::ScratchDir;

/// A small LLaMA-structured config for the synthetic generators.
sq::ModelConfig tiny_config() {
  sq::ModelConfig c = sq::synthetic_1b_config(3);
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 200;
  c.max_seq_len = 128;
  return c;
}

TEST(SafetensorsWriter, GeneratedEntriesAreWrittenPieceByPieceAndReadBackExactly) {
  // 2.5 pieces: the writer must call the generator three times, at 0, 2^20 and 2^21.
  const int64_t rows = 5, cols = int64_t(1) << 19;
  const int64_t n = rows * cols;
  // Integers in [-125, 125]: exact in BF16 (8 significant bits); period 251, so a misplaced piece shows.
  auto value = [](int64_t i) { return float(i % 251) - 125.0f; };
  std::vector<int64_t> begins;
  ScratchDir dir;
  for (const char* dtype : {"F32", "BF16"}) {
    begins.clear();
    sq::SafetensorsOutput o;
    o.name = "w";
    o.dtype = dtype;
    o.raw_shape = {rows, cols};
    o.generate = [&](int64_t b, int64_t e, float* out) {
      begins.push_back(b);
      for (int64_t i = b; i < e; ++i) out[i - b] = value(i);
    };
    const std::string path = dir.file(std::string(dtype) + ".safetensors");
    sq::write_safetensors(path, {o});
    EXPECT_EQ(begins, (std::vector<int64_t>{0, int64_t(1) << 20, int64_t(1) << 21})) << dtype;
    const sq::SafetensorsFile f(path);
    const sq::Tensor t = f.load_f32("w");
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{rows, cols}));
    EXPECT_EQ(f.info("w").dtype, dtype);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += t.data()[i] != value(i);
    EXPECT_EQ(wrong, 0) << dtype;
    // Widening released the mapped pages (MappedFile::release): the bytes read again the same.
    const sq::Tensor again = f.load_f32("w");
    EXPECT_EQ(std::memcmp(again.data(), t.data(), size_t(n) * sizeof(float)), 0) << dtype;
  }
}

TEST(HfCheckpointWriter, GeneratedTensorsGiveTheFilesOfTheMaterializedCheckpoint) {
  const sq::ModelConfig c = tiny_config();
  for (int shards : {1, 3}) {
    for (const char* dtype : {"F32", "BF16"}) {
      ScratchDir a, b;
      sq::save_hf_checkpoint(sq::make_synthetic_checkpoint(c, 7), a.path(), dtype, shards);
      sq::save_hf_checkpoint_generated(c, sq::synthetic_tensors(c, 7), b.path(), dtype, shards);
      std::vector<std::string> files;
      for (const auto& e : std::filesystem::directory_iterator(a.path())) files.push_back(e.path().filename().string());
      EXPECT_EQ(files.size(), shards == 1 ? 2u : 5u);  // config.json + model.safetensors, or + 3 shards + index
      for (const auto& f : files) EXPECT_EQ(sq::test::read_file(a.file(f)), sq::test::read_file(b.file(f))) << f << " " << dtype;
    }
  }
}

TEST(HfCheckpointWriter, GeneratedTensorsRefuseAMissingTensorAndAFusedPlan) {
  const sq::ModelConfig c = tiny_config();
  ScratchDir dir;
  auto tensors = sq::synthetic_tensors(c);
  tensors.erase(tensors.begin() + 2);  // layer 0's q_proj
  expect_error<sq::InputError>([&] { sq::save_hf_checkpoint_generated(c, tensors, dir.path(), "BF16"); },
                               {"model.layers.0.self_attn.q_proj.weight", "missing"});
  sq::ModelConfig phi3 = c;
  phi3.architecture = "phi3";  // fused qkv_proj and gate_up_proj: not one canonical tensor per file tensor
  expect_error<sq::UnsupportedError>([&] { sq::save_hf_checkpoint_generated(phi3, sq::synthetic_tensors(c), dir.path(), "F32"); },
                                     {"phi3", "qkv_proj"});
  expect_error<sq::UsageError>([&] { sq::save_hf_checkpoint_generated(c, sq::synthetic_tensors(c), dir.path(), "I8"); }, {"I8"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors")));
}

TEST(SyntheticModels, TheSevenBShapeHasLlama7BsParameterCount) {
  // LLaMA-7B: 6,738,415,616 parameters (the count of the released checkpoint: 32 layers of
  // 4·4096² + 3·4096·11008 + 2·4096, the 32000×4096 embedding and LM head, the final norm).
  EXPECT_EQ(sq::synthetic_7b_config(32).parameter_count(), 6738415616);
  int64_t n = 0;
  for (const auto& t : sq::synthetic_tensors(sq::synthetic_7b_config(32))) {
    int64_t k = 1;
    for (int64_t d : t.shape) k *= d;
    n += k;
  }
  EXPECT_EQ(n, 6738415616);
}

TEST(SyntheticModels, PiecesMustStartOnARandomBlock) {
  const auto tensors = sq::synthetic_tensors(tiny_config());
  std::vector<float> piece(100);
  EXPECT_NO_THROW(tensors[0].generate(0, 100, piece.data()));
  EXPECT_THROW(tensors[0].generate(100, 200, piece.data()), std::invalid_argument);
}

}  // namespace
