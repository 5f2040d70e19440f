// Perplexity and generation on the CUDA runner (cuda/cuda_eval.h) and the tools' --device cuda,
// against the CPU on the real stories260K model and TinyStories text. Skip without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "cuda/cuda_eval.h"
#include "cuda/cuda_runtime.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/quantize_in_memory.h"
#include "support/process.h"
#include "support/test_data.h"

namespace sq {
namespace {

struct Stories {
  Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  std::vector<int32_t> tokens;
  Stories() {
    auto tok = load_tokenizer(test::stories_tokenizer());
    const auto ids = tok->encode(read_file_to_string(test::tinystories_valid()), true, false);
    tokens.assign(ids.begin(), ids.end());
  }
};

// Acceptance (issue #7): `sq-eval` PPL on the GPU equals the CPU's within 0.1%. The runners' logits
// agree to a normalized MSE ≲ 1e-8 (FP32; tests/cuda_model_test.cpp), which moves a PPL over 20
// windows by ~1e-6 relative; quantized formats add rounding-boundary flips of single codes
// (INT8 activations, nuq indices) between the two implementations, still far below 0.1%.
TEST(CudaEval, PerplexityMatchesCpuWithinATenthOfAPercent) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Stories s;
  for (const bool w8a8 : {false, true}) {
    Decoder model = Decoder::from_checkpoint(s.ck);
    if (w8a8) quantize_linears_w8a8(model, WeightGranularity::PerChannel, ActQuant::PerToken, false);
    CudaDecoder gpu(model);
    for (const char* kv : {"fp32", "int8", "int4"}) {
      PerplexityOptions o;
      o.ctx = 256;
      o.max_chunks = 20;
      o.kv = parse_kv_spec(kv);
      const PerplexityResult cpu = evaluate_perplexity(model, s.tokens, o);
      const PerplexityResult cuda = evaluate_perplexity_cuda(gpu, s.tokens, o);
      const std::string what = std::string(w8a8 ? "w8a8" : "fp32") + " weights, " + kv + " KV";
      EXPECT_EQ(cuda.chunks, 20) << what;
      EXPECT_EQ(cuda.tokens_scored, cpu.tokens_scored) << what;
      EXPECT_NEAR(cuda.ppl / cpu.ppl, 1.0, 1e-3) << what << ": CPU " << cpu.ppl << ", CUDA " << cuda.ppl;
      // Identical layouts, so identical byte counts.
      EXPECT_DOUBLE_EQ(cuda.kv_bytes_per_token, cpu.kv_bytes_per_token) << what;
    }
  }
}

// Greedy generation: the same tokens on both runners. Greedy decoding flips only when two logits
// are within the runners' difference (~1e-4 absolute); over 48 tokens of this model the top-2 gap
// measured on the CPU is far larger, so any difference is a bug.
TEST(CudaEval, GreedyGenerationMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Stories s;
  const Decoder model = Decoder::from_checkpoint(s.ck);
  CudaDecoder gpu(model);
  const std::vector<int32_t> prompt(s.tokens.begin(), s.tokens.begin() + 8);
  SamplerOptions so;
  so.temperature = 0;
  std::vector<int32_t> a, b;
  Sampler s1(so), s2(so);
  GenerationOptions go;
  go.ignore_eos = true;
  const GenerationStats st_cpu = generate(model, prompt, 48, 256, s1, [&](int32_t, int32_t t) { a.push_back(t); }, go);
  const GenerationStats st_gpu = generate_cuda(gpu, prompt, 48, 256, s2, [&](int32_t, int32_t t) { b.push_back(t); }, go);
  EXPECT_EQ(a, b);
  EXPECT_EQ(st_gpu.generated_tokens, 48);
  EXPECT_EQ(st_gpu.peak_kv_tokens, st_cpu.peak_kv_tokens);
  EXPECT_EQ(st_gpu.peak_kv_bytes, st_cpu.peak_kv_bytes);
  // The context limit stops generation as on the CPU.
  std::vector<int32_t> c;
  Sampler s3(so);
  const GenerationStats full = generate_cuda(gpu, prompt, 100, 20, s3, [&](int32_t, int32_t t) { c.push_back(t); }, go);
  EXPECT_TRUE(full.hit_context_limit);
  EXPECT_EQ(full.peak_kv_tokens, 20);
  // Eviction policies run on the CPU only.
  go.policy = parse_kv_policy("sink:4,window:60");
  Sampler s4(so);
  EXPECT_THROW(generate_cuda(gpu, prompt, 4, 256, s4, [](int32_t, int32_t) {}, go), UsageError);
}

// The tools on a GPU: sq-eval --device cuda reports the CPU's PPL within 0.1% (the acceptance
// check, end to end) and names the device; sq-run --device cuda generates the CPU's greedy text.
TEST(CudaEval, ToolsRunOnTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  using test::run_process;
  using test::tool;
  const std::string dir = ::testing::TempDir();
  double ppl[2] = {0, 0};
  const char* devices[2] = {"cpu", "cuda"};
  for (int i = 0; i < 2; ++i) {
    const std::string json = dir + "/cuda_eval_" + devices[i] + ".json";
    const auto r = run_process({tool("sq-eval"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-f",
                                test::tinystories_valid(), "-c", "256", "--chunks", "40", "-q", "--json", json, "--device",
                                devices[i]});
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(read_file_to_string(json));
    ppl[i] = j.at("ppl").get<double>();
    if (i == 1) {
      EXPECT_NE(j.at("device").get<std::string>().find("cuda ("), std::string::npos);
    }
  }
  EXPECT_NEAR(ppl[1] / ppl[0], 1.0, 1e-3) << "CPU " << ppl[0] << ", CUDA " << ppl[1];

  std::string text[2];
  for (int i = 0; i < 2; ++i) {
    const auto r = run_process({tool("sq-run"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-p",
                                "Once upon a time", "-n", "40", "--temp", "0", "--device", devices[i]});
    ASSERT_EQ(r.exit_status, 0) << r.err;
    text[i] = r.out;
  }
  EXPECT_EQ(text[1], text[0]);
  const auto stream = run_process({tool("sq-eval"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-f",
                                   test::tinystories_valid(), "--protocol", "streaming", "--max-tokens", "600", "--device", "cuda"});
  EXPECT_EQ(stream.exit_status, 2) << stream.err;
  EXPECT_NE(stream.err.find("CPU only"), std::string::npos) << stream.err;
}

}  // namespace
}  // namespace sq
