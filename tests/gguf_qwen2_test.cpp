// Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, architecture qwen2; issue 37 part 1), the third real
// model, against Hugging Face transformers run on the same file: tests/data/qwen2.5-coder-1.5b.json,
// written by scripts/gguf_model_reference.py (transformers 5.24 FP32 eager on the weights its GGUF
// loader dequantizes with gguf-py; no weights or full logit rows are stored, 40 KB).
// The model (1.1 GB) is fetched by `scripts/fetch-models.sh qwen2.5-coder-1.5b`; CI does not fetch it,
// so these tests skip there; the opt-in stage scripts/test-qwen.sh runs them and fails on a skip.
// Loading it dequantizes 1.78 G parameters to 7.1 GB of FP32.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/model_loader.h"
#include "runtime/generator.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "tests/support/process.h"
#include "tests/support/real_models.h"
#include "tests/support/test_data.h"

namespace sq::test {
namespace {

constexpr const char* kQwen = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

nlohmann::json reference() {
  return nlohmann::json::parse(read_file_to_string(std::string(SQ_SOURCE_DIR) + "/tests/data/qwen2.5-coder-1.5b.json"));
}

class GgufQwen25 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path(kQwen);
    if (path.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    qwen_ = new LoadedModel(load_model(path));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ measured ] load_model(%s): %.2f s\n", kQwen, s);
  }
  static void TearDownTestSuite() {
    delete qwen_;
    qwen_ = nullptr;
  }
  void SetUp() override {
    if (!qwen_) GTEST_SKIP() << kQwen << " not found (set SQKIT_MODELS or run scripts/fetch-models.sh qwen2.5-coder-1.5b)";
  }
  static LoadedModel* qwen_;
};
LoadedModel* GgufQwen25::qwen_ = nullptr;

// The model card's shape: 28 layers, d = 1536, 12 query heads / 2 KV heads of 128, SwiGLU 8960,
// vocabulary 151,936, an untied head, q/k/v biases (the qwen2 architecture's one difference from
// llama), RoPE θ = 1e6, RMSNorm ε = 1e-6.
TEST_F(GgufQwen25, ConfigFromMetadata) {
  const ModelConfig& c = qwen_->model->config();
  EXPECT_EQ(qwen_->format, "gguf");
  EXPECT_EQ(c.n_layers, 28);
  EXPECT_EQ(c.dim, 1536);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.hidden_dim, 8960);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
}

// Token ids: equal, every id, on the three shared texts (WikiText-2's first 4,000 characters, the
// mixed-script text, the story), and decode(ids) gives the text back.
TEST_F(GgufQwen25, TokenIdsMatchTransformers) {
  const nlohmann::json ref = reference();
  const std::unique_ptr<Tokenizer> tok = open_tokenizer_for(*qwen_, "");
  EXPECT_FALSE(tok->default_add_bos());
  ASSERT_EQ(ref["tokens"].size(), 3u);
  for (const auto& [name, t] : ref["tokens"].items()) {
    const std::string text = t["text"].get<std::string>();
    const std::vector<int> ids = t["ids"].get<std::vector<int>>();
    EXPECT_EQ(tok->encode(text, false, false), ids) << name;
    EXPECT_EQ(tok->decode(ids), text) << name;
  }
}

/// −log softmax(row)[target] and logsumexp(row), in double.
double logsumexp(const float* row, int64_t vocab) {
  double m = row[0];
  for (int64_t v = 1; v < vocab; ++v) m = std::max(m, double(row[v]));
  double s = 0.0;
  for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(row[v]) - m);
  return std::log(s) + m;
}

// Tolerances. Both sides run FP32 arithmetic on bit-identical FP32 weights (the dequantization of
// Q4_K / Q6_K / Q8_0 / Q5_0 is bit-exact against gguf-py, tests/gguf_dequantize_test.cpp); only the
// summation order of the GEMMs (oneDNN's blocking against PyTorch's) and libm differ. The issue's
// acceptance is the mean NLL of the 512-token window within 1e-3 relative of transformers'. The other
// bounds are set from the measurement printed on the [ measured ] line with ≈ 10–25× headroom for other
// BLAS/libm builds, while a real mapping error (a wrong RoPE θ or layout, a missing q/k/v bias, a
// wrong norm ε) moves logits by ≫ 1e-1 and changes argmaxes.
constexpr double kMeanNllRel = 1e-3;    // the acceptance
// Measured on the AMX Xeon (oneDNN brgemm, 2 threads): mean NLL rel 3.6e-8, |ΔNLL| max 1.0e-4,
// top-32 max |Δlogit| 5.3e-5 (of logits up to ≈ 30), max |Δlogsumexp| 1.9e-5.
constexpr double kMaxDnll = 1e-3;       // per position; |ΔNLL| ≤ 2 max|Δlogit|
constexpr double kMaxDlogit = 1e-3;     // over the stored top-32 logits of 17 positions
constexpr double kMaxDlogsumexp = 5e-4;

// One 512-token window of WikiText-2 (prefill, all logits): per-position NLL, the top-32 logits and
// the logsumexp of 17 positions, and the argmax at each, against transformers.
TEST_F(GgufQwen25, WindowLogitsAndNllMatchTransformers) {
  const nlohmann::json ref = reference();
  const nlohmann::json& w = ref["window"];
  const std::vector<int32_t> ids = w["ids"].get<std::vector<int32_t>>();
  const std::vector<double> ref_nll = w["next_token_nll"].get<std::vector<double>>();
  ASSERT_EQ(ids.size(), 512u);
  ASSERT_EQ(ref_nll.size(), 511u);
  const Decoder& model = *qwen_->model;
  const int64_t n = int64_t(ids.size()), vocab = model.config().vocab_size;
  KVCache cache(model.config(), n);
  Workspace ws;
  std::vector<float> logits(size_t(n * vocab));
  const auto t0 = std::chrono::steady_clock::now();
  model.forward(ids.data(), n, cache, ws, logits.data(), LogitsFor::AllTokens);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  double mean_nll = 0, max_dnll = 0, mean_dnll = 0;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const float* row = logits.data() + i * vocab;
    const double nll = logsumexp(row, vocab) - double(row[ids[size_t(i + 1)]]);
    mean_nll += nll / double(n - 1);
    mean_dnll += std::fabs(nll - ref_nll[size_t(i)]) / double(n - 1);
    max_dnll = std::max(max_dnll, std::fabs(nll - ref_nll[size_t(i)]));
  }
  double max_dlogit = 0, max_dlse = 0;
  int argmax_equal = 0, rows = 0;
  for (const auto& r : w["rows"]) {
    const int64_t p = r["position"].get<int64_t>();
    const float* row = logits.data() + p * vocab;
    max_dlse = std::max(max_dlse, std::fabs(logsumexp(row, vocab) - r["logsumexp"].get<double>()));
    const auto& top = r["top"];
    for (const auto& e : top) max_dlogit = std::max(max_dlogit, std::fabs(double(row[e[0].get<int64_t>()]) - e[1].get<double>()));
    if (std::max_element(row, row + vocab) - row == top[0][0].get<int64_t>()) ++argmax_equal;
    ++rows;
  }
  const double ref_mean = w["mean_nll"].get<double>();
  std::printf("[ measured ] Qwen2.5-Coder-1.5B, 512 tokens (prefill %.2f s): mean NLL %.6f vs transformers %.6f "
              "(rel %.2e); |dNLL| mean %.2e max %.2e; top-32 max |dlogit| %.2e; max |dlogsumexp| %.2e; argmax %d/%d\n",
              secs, mean_nll, ref_mean, std::fabs(mean_nll - ref_mean) / ref_mean, mean_dnll, max_dnll, max_dlogit, max_dlse,
              argmax_equal, rows);
  EXPECT_LT(std::fabs(mean_nll - ref_mean) / ref_mean, kMeanNllRel);
  EXPECT_LT(max_dnll, kMaxDnll);
  EXPECT_LT(max_dlogit, kMaxDlogit);
  EXPECT_LT(max_dlse, kMaxDlogsumexp);
  EXPECT_EQ(argmax_equal, rows);
}

// Greedy decoding (prefill, then one-token decode steps through the KV cache): 32 new tokens equal
// transformers' for both prompts (a story, and code: it is a coder model).
TEST_F(GgufQwen25, GreedyMatchesTransformers) {
  const nlohmann::json ref = reference();  // held: a range-for over reference()["greedy"] would dangle
  ASSERT_EQ(ref["greedy"].size(), 2u);
  for (const auto& g : ref["greedy"]) {
    const std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> expected_new = g["new_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(expected_new.size(), 32u);
    SamplerOptions so;
    so.temperature = 0.0f;
    Sampler sampler(so);
    std::vector<int32_t> out;
    GenerationOptions go;
    go.ignore_eos = true;  // the reference generated exactly 32 tokens
    const GenerationStats st = generate(*qwen_->model, prompt, 32, int64_t(prompt.size() + 32), sampler,
                                        [&](int32_t, int32_t t) { out.push_back(t); }, go);
    std::printf("[ measured ] Qwen2.5-Coder-1.5B greedy: prefill %lld tokens %.3f s, %lld decode steps %.3f s (%.2f tokens/s)\n",
                (long long)st.prompt_tokens, st.prefill_seconds, (long long)st.generated_tokens, st.decode_seconds,
                double(st.generated_tokens) / st.decode_seconds);
    EXPECT_EQ(out, expected_new) << g["prompt"].get<std::string>();
  }
}

// The tool end to end (tokenizer from the GGUF's metadata, no BOS): sq-run's greedy text is
// transformers' decoded text.
TEST_F(GgufQwen25, SqRunGreedyTextMatchesTransformers) {
  const nlohmann::json ref = reference();
  const nlohmann::json& g = ref["greedy"][0];
  const std::string prompt = g["prompt"].get<std::string>();
  const ProcessResult r =
      run_process({tool("sq-run"), "-m", qwen_->path, "-p", prompt, "-n", "32", "--temp", "0", "--ignore-eos", "-q"}, 600);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_EQ(r.out, prompt + g["text"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace sq::test
