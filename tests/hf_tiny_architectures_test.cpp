// Issue 16 acceptance: for each of the 14 tiny Hugging Face checkpoints of
// ../shared/data/reference/hf-tiny (config.json + model.safetensors saved by transformers, with
// transformers' FP32 logits of a fixed token sequence in reference.safetensors), sqkit's FP32
// logits through load_model -> Decoder equal transformers' within a stated tolerance. Every
// architecture is listed explicitly; a missing folder or file fails (never skips).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/decoder.h"
#include "model/model_loader.h"
#include "runtime/kv_cache.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

namespace fs = std::filesystem;

/// The 14 reference checkpoints (shared/data/reference/README.md, "Tiny architectures").
// Both sides compute in FP32 from the same FP32 weights; they differ only in summation order
// (sgemm blocking vs PyTorch's kernels) and in exp/tanh/erf/cos/sin implementations, i.e. by a
// few FP32 ulps (1.2e-7 relative) per operation, amplified through 2 layers (6 for Gemma 3).
// The logits are O(1) (|logit| < ~5 with these N(0, 0.08²) weights), so the expected difference is
// ~1e-6 .. 1e-5 (the LLaMA-family references agree to ~2e-6, tests/rope_scaling_test.cpp). 1e-4
// leaves a factor of 10 or more for rounding, while every structural mistake this test exists to
// catch — a wrong split of a fused weight, a missing bias, a norm in the wrong place, a wrong
// window, ALiBi slope, RoPE dimension or activation form — moves logits by 1e-2 or more.
// GELU's tanh and erf forms differ by up to ~5e-4 per activation, also far outside it.
constexpr double kLogitTol = 1e-4;
// Gemma 3 amplifies rounding far more: 6 layers whose (1 + w) norm weights lie in [1.5, 2.5],
// four norms per layer, QK-norm feeding sharp softmaxes and an embedding × 8. Measured with an
// independent float64 evaluation of the same weights (outside the repository): merely rounding
// the folded 1 + w weights to FP32 moves its logits by 3.4e-5, and the float64 result differs from
// transformers' FP32 logits by 6e-5 (every other architecture: 1.0e-6 .. 1.7e-6). 5e-4 keeps a
// factor ~8 over that, while a window off by one token moves these logits by 4.9.
constexpr double kGemmaLogitTol = 5e-4;

double tolerance(const std::string& name) { return name == "gemma3-text" ? kGemmaLogitTol : kLogitTol; }

struct Reference {
  std::vector<int32_t> ids;
  Tensor logits;
};

Reference load_reference(const std::string& name) {
  Reference r;
  r.ids = hf_tiny_reference_ids(name);
  r.logits = SafetensorsFile(hf_tiny(name) + "/reference.safetensors").load_f32("logits");
  return r;
}

class HfTinyArchitecture : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTinyArchitecture, LogitsMatchTransformers) {
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const Decoder& model = *m.model;
  const Reference ref = load_reference(name);
  const int64_t n = static_cast<int64_t>(ref.ids.size()), vocab = model.config().vocab_size;
  ASSERT_EQ(ref.logits.shape(), (std::vector<int64_t>{n, vocab}));

  KVCache cache(model.config(), n);
  Workspace ws;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  model.forward(ref.ids.data(), n, cache, ws, logits.data(), LogitsFor::AllTokens);

  double max_abs = 0.0;
  int argmax_mismatch = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits.data() + t * vocab;
    const float* y = ref.logits.data() + t * vocab;
    for (int64_t v = 0; v < vocab; ++v) max_abs = std::max(max_abs, std::fabs(double(x[v]) - double(y[v])));
    // The argmax must agree where the reference's top two are further apart than the tolerance.
    const int64_t ay = std::max_element(y, y + vocab) - y, ax = std::max_element(x, x + vocab) - x;
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v)
      if (v != ay) second = std::max(second, y[v]);
    if (ax != ay && double(y[ay]) - double(second) > 2 * tolerance(name)) ++argmax_mismatch;
  }
  std::printf("[ measured ] %-24s max |dlogit| = %.3g over %lld x %lld logits\n", name.c_str(), max_abs,
              static_cast<long long>(n), static_cast<long long>(vocab));
  EXPECT_LT(max_abs, tolerance(name)) << name;
  EXPECT_EQ(argmax_mismatch, 0) << name;
}

INSTANTIATE_TEST_SUITE_P(All, HfTinyArchitecture, ::testing::ValuesIn(kHfTinyCheckpoints),
                         HfTinyParamName());

// No architecture may go untested: every listed folder has its three files, and every folder on
// disk is listed.
TEST(HfTinyArchitectures, EveryReferenceCheckpointIsPresentAndListed) {
  expect_hf_tiny_listed({std::begin(kHfTinyCheckpoints), std::end(kHfTinyCheckpoints)}, /*files=*/true);
}

}  // namespace
}  // namespace sq::test
