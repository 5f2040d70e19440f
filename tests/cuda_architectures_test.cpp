// Every architecture on the CUDA decoder (issue 41): the 14 tiny Hugging Face checkpoints of
// ../shared/data/reference/hf-tiny run through CudaDecoder (cuda/cuda_decoder.h), i.e. through the
// same run_decoder_layer and DecoderSpec as the CPU Decoder, against the CPU's logits and
// transformers' (prefill, then decode steps), with FP32 caches (post- and pre-RoPE) and an int8
// cache. The device tests skip without a device; the refusal tests run on every machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_decoder.h"
#include "cuda/cuda_runtime.h"
#include "formats/safetensors.h"
#include "model/model_loader.h"
#include "model/w4a4_linear.h"
#include "runtime/kv_cache.h"
#include "tests/support/hf_tiny.h"

namespace sq::test {
namespace {

// The CPU decoder agrees with transformers within 1e-4 (5e-4 for Gemma 3, whose 6 layers of
// (1 + w) norms and QK-norm amplify rounding): tests/hf_tiny_architectures_test.cpp justifies both.
// The device computes the same FP32 expressions in another summation order, with CUDA's expf,
// tanhf, erff, cosf, sinf (≤ 2 ulp) where the CPU has its own (ops::fast_exp ≤ 2e-7 relative): a
// difference of the same kind and size as the CPU's from transformers, so the device gets twice
// the CPU's bound against either reference. A structural mistake (a missing bias, a wrong window,
// ALiBi slope, RoPE width or activation) moves these logits by 1e-2 or more.
double tolerance(const std::string& name) { return 2 * (name == "gemma3-text" ? 5e-4 : 1e-4); }

double max_abs_diff(const float* a, const float* b, int64_t count) {
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  return worst;
}

double nmse(const float* a, const float* ref, int64_t count) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    num += (double(a[i]) - double(ref[i])) * (double(a[i]) - double(ref[i]));
    den += double(ref[i]) * double(ref[i]);
  }
  return num / std::max(den, 1e-30);
}

/// Logits [n, vocab] of `model` on the CPU for `ids` with a cache of format `spec`.
std::vector<float> cpu_logits(const Decoder& model, const std::vector<int32_t>& ids, const KVSpec& spec) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = model.config().vocab_size;
  KVCache cache(model.config(), n, spec);
  Workspace ws;
  std::vector<float> out(static_cast<size_t>(n * V));
  model.forward(ids.data(), n, cache, ws, out.data(), LogitsFor::AllTokens);
  return out;
}

/// Logits [n, vocab] of `gpu`: the first `prefill` tokens as one block, then one decode step per token.
std::vector<float> cuda_logits(CudaDecoder& gpu, const std::vector<int32_t>& ids, int64_t prefill, const KVSpec& spec) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = gpu.config().vocab_size;
  CudaKVCache cache(gpu.config(), n, spec);
  std::vector<float> out(static_cast<size_t>(n * V));
  gpu.forward(ids.data(), prefill, cache, out.data(), LogitsFor::AllTokens);
  for (int64_t t = prefill; t < n; ++t) gpu.forward(ids.data() + t, 1, cache, out.data() + t * V, LogitsFor::LastToken);
  return out;
}

class CudaArchitecture : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaArchitecture, LogitsMatchCpuAndTransformersPrefillAndDecode) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  const LoadedModel m = load_model(hf_tiny(name));
  const Decoder& model = *m.model;
  const std::vector<int32_t> ids = hf_tiny_reference_ids(name);
  const Tensor expect = SafetensorsFile(hf_tiny(name) + "/reference.safetensors").load_f32("logits");
  const int64_t n = static_cast<int64_t>(ids.size()), V = model.config().vocab_size, prefill = n / 2;
  CudaDecoder gpu(model);

  std::vector<KVSpec> fp32_specs{KVSpec{}};
  if (model.config().spec.position == PositionKind::Rope) {
    KVSpec pre;
    pre.keys = KVKeyRope::PreRope;
    fp32_specs.push_back(pre);
  }
  const std::vector<float> cpu = cpu_logits(model, ids, KVSpec{});
  for (const KVSpec& spec : fp32_specs) {
    const std::vector<float> got = cuda_logits(gpu, ids, prefill, spec);
    const std::string what = name + (spec.keys == KVKeyRope::PreRope ? " (pre-RoPE cache)" : " (post-RoPE cache)");
    const double vs_cpu = max_abs_diff(got.data(), cpu.data(), n * V), vs_hf = max_abs_diff(got.data(), expect.data(), n * V);
    std::printf("[ measured ] %-40s max |dlogit| vs CPU %.3g, vs transformers %.3g\n", what.c_str(), vs_cpu, vs_hf);
    EXPECT_LT(vs_cpu, tolerance(name)) << what;
    EXPECT_LT(vs_hf, tolerance(name)) << what;
    int mismatches = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float* a = got.data() + t * V;
      const float* b = cpu.data() + t * V;
      std::vector<float> sorted(b, b + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      // The argmax must agree where the CPU's top two are further apart than the tolerance.
      if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b && sorted[0] - sorted[1] > 2 * tolerance(name))
        ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << what;
  }

  // int8 rows (per-token groups): the device encodes with the CPU codec's expressions, so its rows
  // differ from the CPU's only where rounding-level input differences cross a code boundary. Its
  // error against the FP32 logits is then of the CPU's size: at most twice the CPU's NMSE (plus
  // 1e-9, the FP32 rounding floor of these O(1) logits).
  KVSpec int8;
  int8.kind = KVKind::Int;
  int8.bits = 8;
  const std::vector<float> cpu8 = cpu_logits(model, ids, int8);
  const std::vector<float> got8 = cuda_logits(gpu, ids, prefill, int8);
  const double e_cpu = nmse(cpu8.data(), cpu.data(), n * V), e_gpu = nmse(got8.data(), cpu.data(), n * V);
  std::printf("[ measured ] %-40s int8 KV NMSE vs FP32: CPU %.3g, CUDA %.3g\n", name.c_str(), e_cpu, e_gpu);
  EXPECT_LE(e_gpu, 2 * e_cpu + 1e-9) << name;
}

INSTANTIATE_TEST_SUITE_P(All, CudaArchitecture, ::testing::ValuesIn(kHfTinyCheckpoints), HfTinyParamName());

// Every architecture is accepted by the CUDA decoder: without a device the only refusal is the
// missing device (or CUDA support), never the architecture (the LLaMA-only runner it replaces
// refused every structure other than DecoderSpec's defaults by name).
TEST(CudaArchitectures, NoArchitectureIsRefusedOnlyTheMissingDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (CudaArchitecture runs every architecture on it)";
  for (const char* name : kHfTinyCheckpoints) {
    const LoadedModel m = load_model(hf_tiny(name));
    try {
      CudaDecoder gpu(*m.model);
      ADD_FAILURE() << name << ": CudaDecoder constructed without a device";
    } catch (const UnsupportedError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(cuda_compiled() ? "no CUDA device" : "built without CUDA"), std::string::npos) << name << ": " << msg;
      EXPECT_EQ(msg.find("architecture"), std::string::npos) << name << ": " << msg;
    }
  }
}

// A layer format the device does not run is refused by name before the device is touched, so on
// every machine: here an Atom W4A4 expert of the mixture-of-experts checkpoint.
TEST(CudaArchitectures, UnsupportedExpertFormatIsRefusedByNameWithoutADevice) {
  const LoadedModel m = load_model(hf_tiny("mixtral-moe"));
  Decoder& model = *m.model;
  auto& expert = model.mutable_layers()[1].experts.at(1);
  const auto& dense = dynamic_cast<const DenseLinear&>(*expert.up_proj);
  expert.up_proj = std::make_unique<W4A4Linear>(dense.weight(), 0, 32);
  try {
    CudaDecoder gpu(model);
    FAIL() << "an Atom W4A4 expert was accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 expert 1 up_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sq::test
