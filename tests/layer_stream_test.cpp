// Tests for model/layer_stream.h and run_calibration on a streamed model (calib/calibration_run.h):
// a Hugging Face directory calibrated one layer at a time must give what the whole model gives.
#include "model/layer_stream.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "calib/calibration_run.h"
#include "core/error.h"
#include "formats/fingerprint.h"
#include "formats/hf_checkpoint.h"
#include "model/linear.h"
#include "runtime/kv_cache.h"
#include "model/synthetic.h"
#include "support/hf_tiny.h"
#include "support/real_models.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::test::ScratchDir;

/// Expects two ChannelStats to be equal to the last bit (`what` names them in failures).
void expect_same(const sq::ChannelStats& a, const sq::ChannelStats& b, const std::string& what) {
  EXPECT_EQ(a.channels, b.channels) << what;
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.absmax, b.absmax) << what;
  EXPECT_EQ(a.min, b.min) << what;
  EXPECT_EQ(a.max, b.max) << what;
  EXPECT_EQ(a.sum_sq, b.sum_sq) << what;
  EXPECT_EQ(a.tensor_absmax, b.tensor_absmax) << what;
  EXPECT_EQ(a.token_absmax_hist, b.token_absmax_hist) << what;
}

/// Every statistic and Hessian of `a` equals `b`'s exactly, and so do the fingerprints.
void expect_same(const sq::CalibrationData& a, const sq::CalibrationData& b) {
  EXPECT_EQ(a.provenance.model_fingerprint, b.provenance.model_fingerprint);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    const std::string at = "layer " + std::to_string(l);
    ASSERT_EQ(x.inputs.size(), y.inputs.size()) << at;
    for (size_t s = 0; s < x.inputs.size(); ++s) expect_same(x.inputs[s], y.inputs[s], at + " input site " + std::to_string(s));
    EXPECT_EQ(x.output_absmax, y.output_absmax) << at;
    expect_same(x.keys, y.keys, at + " keys");
    expect_same(x.values, y.values, at + " values");
    EXPECT_EQ(x.hessians, y.hessians) << at;
    EXPECT_EQ(x.hessian_tokens, y.hessian_tokens) << at;
  }
}

/// A token-ids file of `n` ids drawn uniformly from [0, vocab) (seeded).
std::string token_ids_file(const ScratchDir& dir, int vocab, int n) { return sq::test::write_random_token_ids(dir, vocab, n, 5); }

class LayerStreamCalibration : public ::testing::TestWithParam<const char*> {};

// The tiny checkpoints cover every architecture's map_tensors selection, norms, biases, positions
// and sliding windows. Hessians are compared too except for the mixture of experts (whose expert
// Hessians need the whole model: the streamed run refuses them, checked below).
TEST_P(LayerStreamCalibration, StreamedLayersGiveTheWholeModelsStatisticsAndHessians) {
  const std::string path = sq::test::hf_tiny(GetParam());
  const sq::LayerStream streamed(path);
  ASSERT_TRUE(streamed.streamed());
  const sq::LayerStream whole(path, false);
  ASSERT_FALSE(whole.streamed());
  EXPECT_EQ(streamed.model().model->layers().size(), whole.model().model->layers().size());

  ScratchDir dir;
  sq::CalibrationOptions o;
  o.token_ids = true;
  o.text_path = token_ids_file(dir, whole.config().vocab_size, 400);
  o.samples = 5;  // more windows than threads: several parallel groups merged in order
  o.seq_len = std::min(24, whole.config().max_seq_len);
  o.hessian = whole.config().spec.n_experts == 0;
  const sq::CalibrationData a = sq::run_calibration(streamed, nullptr, o);
  const sq::CalibrationData b = sq::run_calibration(whole, nullptr, o);
  expect_same(a, b);
  EXPECT_EQ(a.provenance.model_fingerprint, sq::model_fingerprint(whole.model().checkpoint));
  if (!o.hessian) {
    o.hessian = true;
    EXPECT_THROW(sq::run_calibration(streamed, nullptr, o), sq::UsageError);
  }
}

INSTANTIATE_TEST_SUITE_P(HfTiny, LayerStreamCalibration, ::testing::ValuesIn(sq::test::kHfTinyCheckpoints),
                         sq::test::HfTinyParamName());

// From dim 1024 on, windows run one at a time with parallel ops inside (the 7B path) instead of
// one window per thread: the streamed result must still be the whole model's.
TEST(LayerStream, WideModelsStreamedGiveTheWholeModelsStatisticsAndHessians) {
  sq::ModelConfig c = sq::synthetic_1b_config(2);
  c.dim = 1024;
  c.hidden_dim = 1536;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.vocab_size = 300;
  ScratchDir dir;
  sq::save_hf_checkpoint(sq::make_synthetic_checkpoint(c, 3), dir.file("m"), "BF16");
  const sq::LayerStream streamed(dir.file("m")), whole(dir.file("m"), false);
  sq::CalibrationOptions o;
  o.token_ids = true;
  o.text_path = token_ids_file(dir, c.vocab_size, 300);
  o.samples = 3;
  o.seq_len = 32;
  o.hessian = true;
  expect_same(sq::run_calibration(streamed, nullptr, o), sq::run_calibration(whole, nullptr, o));
}

TEST(LayerStream, StreamedLayersAreTheWholeModelsLayersAndNothingElseIsHeld) {
  const std::string path = sq::test::hf_tiny("llama-gqa");
  const sq::LayerStream streamed(path);
  const sq::LayerStream whole(path, false);
  // The streamed model holds the globals only.
  for (const auto& [name, t] : streamed.model().checkpoint.tensors) EXPECT_NE(name.rfind("model.layers.", 0), 0u) << name;
  EXPECT_EQ(streamed.global_shapes(), whole.global_shapes());
  sq::TensorShapes all = streamed.global_shapes();
  for (int l = 0; l < streamed.config().n_layers; ++l) {
    const auto L = streamed.layer(l, &all);
    const auto& R = whole.model().model->layers()[size_t(l)];
    const sq::Tensor& a = dynamic_cast<const sq::DenseLinear&>(*L->q_proj).weight();
    const sq::Tensor& b = dynamic_cast<const sq::DenseLinear&>(*R.q_proj).weight();
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.numel()), std::vector<float>(b.data(), b.data() + b.numel()));
  }
  EXPECT_EQ(sq::model_fingerprint(streamed.config(), all), sq::model_fingerprint(whole.model().checkpoint));
  EXPECT_THROW(streamed.layer(streamed.config().n_layers), std::out_of_range);
  EXPECT_THROW(streamed.layer(-1), std::out_of_range);
}

// A streamed layer's linears keep no packed copy of their weights (model/linear.h): the copy would
// add the layer's FP32 size to the peak that streaming bounds (a 7B layer: 0.8 GB). Running the
// layer leaves packed_bytes() at 0 there, while the whole model's linears pack at their first
// multi-row product.
TEST(LayerStream, StreamedLayersKeepNoPackedWeightCopies) {
  const std::string path = sq::test::hf_tiny("llama-gqa");
  const sq::LayerStream streamed(path);
  const sq::LayerStream whole(path, false);
  const sq::ModelConfig& c = streamed.config();
  const int64_t n = 64;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) tokens[size_t(t)] = int32_t((t * 7 + 1) % c.vocab_size);
  auto dense = [](const std::unique_ptr<sq::Linear>& lin) { return dynamic_cast<const sq::DenseLinear*>(lin.get()); };
  for (const sq::LayerStream* s : {&streamed, &whole}) {
    const bool is_streamed = s == &streamed;
    sq::KVCache cache(c, n);
    sq::Workspace ws;
    std::vector<float> x(static_cast<size_t>(n * c.dim));
    s->model().model->embed(tokens.data(), n, x.data(), 0);
    const auto L = s->layer(0);
    s->model().model->forward_layer(0, *L, x.data(), n, cache, ws);
    for (const auto* lin : {&L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj, &L->gate_proj, &L->up_proj, &L->down_proj}) {
      const sq::DenseLinear* d = dense(*lin);
      ASSERT_NE(d, nullptr);
      EXPECT_EQ(d->prepack(), !is_streamed);
      if (is_streamed) EXPECT_EQ(d->packed_bytes(), 0);
      else if (sq::ops::weight_matmul_pays()) EXPECT_GE(d->packed_bytes(), d->weight().numel() * 4);
      else EXPECT_EQ(d->packed_bytes(), 0);  // no brgemm kernels (AVX2): ops::sgemm, no copy
    }
  }
}

TEST(LayerStream, TheStreamedModelsGlobalsRefuseAWholeForward) {
  const sq::LayerStream streamed(sq::test::hf_tiny("llama-gqa"));
  const sq::Decoder& d = *streamed.model().model;
  sq::KVCache cache(d.config(), 4);
  sq::Workspace ws;
  const int32_t tokens[2] = {1, 2};
  std::vector<float> logits(size_t(2 * d.config().vocab_size));
  EXPECT_THROW(d.forward(tokens, 2, cache, ws, logits.data(), sq::LogitsFor::AllTokens), std::logic_error);
}

TEST(LayerStream, RefusesFisherOnAStreamedModel) {
  const sq::LayerStream streamed(sq::test::hf_tiny("llama-gqa"));
  ScratchDir dir;
  sq::CalibrationOptions o;
  o.token_ids = true;
  o.text_path = token_ids_file(dir, streamed.config().vocab_size, 100);
  o.samples = 2;
  o.seq_len = 8;
  o.fisher = true;
  EXPECT_THROW(sq::run_calibration(streamed, nullptr, o), sq::UsageError);
}

}  // namespace

namespace {

// A GGUF file is streamed too (load_gguf_checkpoint with a selection): SmolLM2-135M (Q4_1 / Q8_0
// blocks, q/k rows restored to the half-split order per layer) calibrated one layer at a time gives
// the whole model's statistics and Hessians to the last bit, and its layers are the whole model's.
TEST(LayerStreamGguf, StreamedGgufGivesTheWholeModelsLayersAndStatistics) {
  const std::string path = sq::test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found (scripts/fetch-models.sh)";
  const sq::LayerStream streamed(path);
  ASSERT_TRUE(streamed.streamed());
  EXPECT_EQ(streamed.model().format, "gguf");
  EXPECT_EQ(streamed.model().default_tokenizer, path);
  const sq::LayerStream whole(path, false);
  ASSERT_FALSE(whole.streamed());
  for (const auto& [name, t] : streamed.model().checkpoint.tensors) EXPECT_NE(name.rfind("model.layers.", 0), 0u) << name;
  for (int l : {0, 17, 29}) {
    const auto a = streamed.layer_weights(l);
    const sq::Checkpoint b = whole.model().checkpoint.layer(l);
    ASSERT_EQ(a.tensors.tensors.size(), b.tensors.size()) << "layer " << l;
    for (const auto& [name, t] : b.tensors) {
      const sq::Tensor& u = a.tensors.tensors.at(name);
      ASSERT_EQ(u.numel(), t.numel()) << name;
      EXPECT_EQ(std::memcmp(u.data(), t.data(), size_t(t.numel()) * 4), 0) << name;
    }
  }
  EXPECT_THROW(streamed.layer(30), std::out_of_range);
  ScratchDir dir;
  sq::CalibrationOptions o;
  o.token_ids = true;
  o.text_path = token_ids_file(dir, whole.config().vocab_size, 300);
  o.samples = 2;
  o.seq_len = 48;
  o.hessian = true;
  expect_same(sq::run_calibration(streamed, nullptr, o), sq::run_calibration(whole, nullptr, o));
}

}  // namespace
