// RoPE scaling (issue 14 point 1): the Llama RoPE variants of ../shared/data/reference/hf-tiny run
// exactly as transformers runs them, RoPE settings are read from both `rope_parameters`
// (transformers >= 5) and the legacy `rope_scaling` + `rope_theta`, and every other RoPE setting
// is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/model_loader.h"
#include "runtime/kv_cache.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

std::string tiny(const std::string& name) { return shared_data("reference/hf-tiny/" + name); }

struct LogitDiff {
  double max_abs = 0.0;     ///< max |Δlogit| over every position and vocabulary entry
  int argmax_mismatch = 0;  ///< positions whose argmax differs from the reference's
  int64_t positions = 0;
};

/// Runs the model at `model_path` over `reference.safetensors`' input_ids of the hf-tiny model
/// `name` (one prefill block) and compares all logits with transformers' FP32 logits.
LogitDiff compare_with_reference(const std::string& model_path, const std::string& name) {
  SafetensorsFile ref(tiny(name) + "/reference.safetensors");
  const auto& ids_shape = ref.shape("input_ids");
  EXPECT_EQ(ref.dtype("input_ids"), "I32");
  const int64_t n = ids_shape.at(0);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::memcpy(ids.data(), ref.raw_data("input_ids"), ids.size() * sizeof(int32_t));
  const Tensor expect = ref.load_f32("logits");

  LoadedModel m = load_model(model_path);
  const int64_t vocab = m.model->config().vocab_size;
  EXPECT_EQ(expect.shape(), (std::vector<int64_t>{n, vocab}));
  KVCache cache(m.model->config(), n);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  m.model->forward(ids.data(), n, cache, ws, logits.data(), LogitsFor::AllTokens);

  LogitDiff d;
  d.positions = n;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = logits.data() + t * vocab;
    const float* b = expect.data() + t * vocab;
    for (int64_t v = 0; v < vocab; ++v) d.max_abs = std::max(d.max_abs, std::fabs(double(a[v]) - double(b[v])));
    if (std::max_element(a, a + vocab) - a != std::max_element(b, b + vocab) - b) ++d.argmax_mismatch;
  }
  return d;
}

// Both sides compute in FP32 from the same FP32 weights; they differ only in summation order
// (sgemm blocking vs PyTorch's kernels) and in cos/sin/exp implementations, i.e. by a few FP32 ulps
// per operation, amplified through 2 layers. Logits here are O(1) (|logit| < 3): the default-RoPE
// model agrees to ~1e-6, so 1e-4 is two orders of magnitude of slack for rounding while any RoPE
// frequency error (the unscaled model misses by ~0.1 and more) is far outside it.
constexpr double kLogitTol = 1e-4;

class HfTinyRope : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTinyRope, LogitsMatchTransformers) {
  const LogitDiff d = compare_with_reference(tiny(GetParam()), GetParam());
  std::printf("[ measured ] %s: max |dlogit| = %.3g over %lld positions, %d argmax mismatches\n", GetParam(), d.max_abs,
              static_cast<long long>(d.positions), d.argmax_mismatch);
  EXPECT_LT(d.max_abs, kLogitTol);
  EXPECT_EQ(d.argmax_mismatch, 0);
}

INSTANTIATE_TEST_SUITE_P(Llama, HfTinyRope, ::testing::Values("llama-gqa", "llama-linear-rope", "llama3-rope-scaled"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace sq::test
