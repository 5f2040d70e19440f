// The FP32 CUDA runner (lib/cuda/cuda_llama_model.h) against LlamaModel::forward on the real
// stories260K model: logits of a prefill (every token) and of decode steps. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_llama_model.h"
#include "cuda/cuda_runtime.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/tokenizer.h"
#include "model/w8a8_linear.h"
#include "support/test_data.h"

namespace sq {
namespace {

/// Σ(a−b)² / Σb²: the normalized mean squared error of `a` against the reference `b`.
double nmse(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return num / den;
}

TEST(CudaModel, Stories260KFp32LogitsMatchCpuPrefillAndDecode) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const LlamaModel model = LlamaModel::from_checkpoint(ck);
  auto tok = load_tokenizer(test::stories_tokenizer());
  const std::vector<int> ids = tok->encode("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.",
                                           true, false);
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  const int64_t n = int64_t(tokens.size()), steps = 6, V = ck.config.vocab_size;
  ASSERT_GT(n, 16);

  KVCache cache(ck.config, n + steps);
  Workspace ws;
  CudaLlamaModel gpu(model);
  CudaKVCache gcache(ck.config, n + steps);
  std::vector<float> ref(size_t(n * V)), got(size_t(n * V));
  model.forward(tokens.data(), n, cache, ws, ref.data(), LogitsFor::AllTokens);
  gpu.forward(tokens.data(), n, gcache, got.data(), LogitsFor::AllTokens);
  EXPECT_EQ(gcache.length(), n);
  // Every op agrees with the CPU to ≤ 2e-5 relative (tests/cuda_ops_test.cpp); through 5 layers,
  // each adding its own rounding to a residual stream of O(1) values, the logits (|logit| ≲ 20)
  // keep a relative RMS error well under 1e-4, i.e. a normalized MSE below 1e-8, and a max error
  // below 1e-3 (2e-5 · 5 layers · 10 for the growth through norms and the LM head of 64-dim rows).
  EXPECT_LT(nmse(got.data(), ref.data(), got.size()), 1e-8);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
  EXPECT_LT(worst, 1e-3);

  // Decode: feed the CPU's greedy tokens to both and compare each step's last-token logits.
  int32_t next = int32_t(std::max_element(ref.end() - V, ref.end()) - (ref.end() - V));
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<float> r1(static_cast<size_t>(V)), g1(static_cast<size_t>(V));
    model.forward(&next, 1, cache, ws, r1.data(), LogitsFor::LastToken);
    gpu.forward(&next, 1, gcache, g1.data(), LogitsFor::LastToken);
    EXPECT_LT(nmse(g1.data(), r1.data(), size_t(V)), 1e-8) << "decode step " << s;
    next = int32_t(std::max_element(r1.begin(), r1.end()) - r1.begin());
  }
  EXPECT_EQ(gcache.length(), n + steps);
  EXPECT_THROW(gpu.forward(&next, 1, gcache, nullptr, LogitsFor::None), std::length_error);
  const int32_t bad = int32_t(V);
  gcache.reset();
  EXPECT_THROW(gpu.forward(&bad, 1, gcache, nullptr, LogitsFor::None), std::out_of_range);
}

TEST(CudaModel, QuantizedLinearsAreRefusedByName) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  LlamaModel model = LlamaModel::from_checkpoint(ck);
  const auto& q = dynamic_cast<const DenseLinear&>(*model.layers()[1].q_proj);
  model.mutable_layers()[1].q_proj = std::make_unique<W8A8Linear>(q.weight(), WeightGranularity::PerChannel, ActQuant::PerToken);
  try {
    CudaLlamaModel gpu(model);
    FAIL() << "a W8A8 model was accepted by the FP32 CUDA runner";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 q_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sq
