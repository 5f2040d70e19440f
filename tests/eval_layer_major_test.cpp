// Layer-major perplexity (eval/layer_major.h, evaluate_perplexity_layer_major; issue 37): a model
// read one layer at a time from a Hugging Face directory must score every chunk as the resident
// model does, as the model under test and as the reference, for both protocols and any chunk group
// size; and sq-eval's --layer-major reports the same figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/perplexity.h"
#include "formats/hf_checkpoint.h"
#include "formats/mapped_file.h"
#include "runtime/kv_format.h"
#include "model/layer_stream.h"
#include "model/model_loader.h"
#include "model/synthetic.h"
#include "support/hf_tiny.h"
#include "support/process.h"
#include "support/test_data.h"

namespace {

using sq::test::ScratchDir;

/// n token ids uniform in [0, vocab) (seeded; the same stream for every model of a vocabulary).
std::vector<int32_t> random_tokens(int vocab, int n, unsigned seed = 11) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

/// Exact agreement: both paths run the same forward (embed, forward_layer with a fresh FP32 cache,
/// final norm and LM head) on bit-identical FP32 weights with the same kernels (the streamed
/// layers' plain weights and the resident packed copies run the same oneDNN kernels,
/// model/linear.h; these shapes are below its size threshold anyway), so the sums are equal to the
/// last bit, not merely close.
void expect_same_result(const sq::PerplexityResult& a, const sq::PerplexityResult& b, const std::string& what) {
  EXPECT_EQ(a.tokens_scored, b.tokens_scored) << what;
  EXPECT_EQ(a.chunks, b.chunks) << what;
  EXPECT_EQ(a.chunk_nll, b.chunk_nll) << what;
  EXPECT_EQ(a.nll_mean, b.nll_mean) << what;
  EXPECT_EQ(a.kv_bytes_per_token, b.kv_bytes_per_token) << what;
  ASSERT_EQ(a.comparison.has_value(), b.comparison.has_value()) << what;
  if (a.comparison) {
    EXPECT_EQ(a.comparison->kld_mean, b.comparison->kld_mean) << what;
    EXPECT_EQ(a.comparison->kld_p99, b.comparison->kld_p99) << what;
    EXPECT_EQ(a.comparison->top1_agreement, b.comparison->top1_agreement) << what;
    EXPECT_EQ(a.comparison->ppl_ref, b.comparison->ppl_ref) << what;
  }
}

class LayerMajorEval : public ::testing::TestWithParam<const char*> {};

// Every tiny architecture, streamed from its directory, as the model under test and as the
// reference (of another architecture with the same 320-token vocabulary, so that the KLD is not 0),
// under both protocols, in groups of one chunk and of all chunks.
TEST_P(LayerMajorEval, StreamedModelScoresAsTheResidentModel) {
  const std::string path = sq::test::hf_tiny(GetParam());
  sq::LayerStream streamed(path);
  ASSERT_TRUE(streamed.streamed());
  const sq::LoadedModel resident = sq::load_model(path);
  const sq::LoadedModel other = sq::load_model(sq::test::hf_tiny(std::string(GetParam()) == "llama-gqa" ? "qwen2" : "llama-gqa"));
  ASSERT_EQ(other.model->config().vocab_size, resident.model->config().vocab_size);
  const std::vector<int32_t> tokens = random_tokens(resident.model->config().vocab_size, 5 * 24 + 7);
  for (sq::PplProtocol protocol : {sq::PplProtocol::Windows, sq::PplProtocol::LlamaCpp}) {
    sq::PerplexityOptions o;
    o.protocol = protocol;
    o.ctx = 24;
    const std::string what = std::string(GetParam()) + " " + sq::protocol_name(protocol);
    const sq::PerplexityResult whole = sq::evaluate_perplexity(*resident.model, tokens, o);
    ASSERT_EQ(whole.chunks, 5) << what;
    const sq::EvalModel s{nullptr, &streamed}, ref_other{other.model.get(), nullptr};
    for (int64_t group_bytes : {int64_t(1), int64_t(1) << 30})
      expect_same_result(sq::evaluate_perplexity_layer_major(s, nullptr, tokens, o, group_bytes), whole,
                         what + ", model streamed, group bytes " + std::to_string(group_bytes));

    // As the reference: `other` under test, the streamed model as its reference.
    sq::PerplexityOptions with_ref = o;
    with_ref.reference = resident.model.get();
    const sq::PerplexityResult compared = sq::evaluate_perplexity(*other.model, tokens, with_ref);
    ASSERT_TRUE(compared.comparison);
    // Another architecture's function; the smallest KLD measured is llama3-rope-scaled's against llama-gqa
    // (the same seed for their weights): 0.0049 (windows) and 0.0088 (llamacpp).
    EXPECT_GT(compared.comparison->kld_mean, 1e-3) << what;
    expect_same_result(sq::evaluate_perplexity_layer_major(ref_other, &s, tokens, o, 1), compared, what + ", reference streamed");
    // Both streamed (the same model against itself: the comparison of identical logits).
    const sq::PerplexityResult both = sq::evaluate_perplexity_layer_major(s, &s, tokens, o);
    ASSERT_TRUE(both.comparison);
    EXPECT_EQ(both.comparison->kld_mean, 0.0) << what;
    EXPECT_EQ(both.comparison->top1_agreement, 1.0) << what;
    EXPECT_EQ(both.nll_mean, whole.nll_mean) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(HfTiny, LayerMajorEval, ::testing::ValuesIn(sq::test::kHfTinyCheckpoints), sq::test::HfTinyParamName());

// From dim 1024 on, chunks run one at a time with parallel ops inside (the 7B path).
TEST(LayerMajorEvalWide, StreamedWideModelScoresAsTheResidentModel) {
  sq::ModelConfig c = sq::synthetic_1b_config(2);
  c.dim = 1024;
  c.hidden_dim = 1536;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.vocab_size = 300;
  ScratchDir dir;
  sq::save_hf_checkpoint(sq::make_synthetic_checkpoint(c, 3), dir.file("m"), "BF16");
  sq::LayerStream streamed(dir.file("m"));
  const sq::LoadedModel resident = sq::load_model(dir.file("m"));
  sq::PerplexityOptions o;
  o.protocol = sq::PplProtocol::LlamaCpp;
  o.ctx = 64;
  const std::vector<int32_t> tokens = random_tokens(c.vocab_size, 3 * 64);
  const sq::EvalModel s{nullptr, &streamed};
  const sq::PerplexityResult a = sq::evaluate_perplexity_layer_major(s, nullptr, tokens, o);
  const sq::PerplexityResult b = sq::evaluate_perplexity(*resident.model, tokens, o);
  // Equal up to FP32 rounding only: at this width the resident model's GEMMs may run on its packed
  // copies (another blocking of the same sums). A few ulps of the logits move the mean NLL (≈ 5.7
  // nats, random weights) by < 1e-6 relative; a wrong layer or order moves it by ≫ 1e-3.
  EXPECT_NEAR(a.nll_mean, b.nll_mean, 1e-6 * b.nll_mean);
  EXPECT_EQ(a.tokens_scored, b.tokens_scored);
}

TEST(LayerMajorEvalErrors, QuantizedKvCacheAndBadSidesAreRefused) {
  sq::LayerStream streamed(sq::test::hf_tiny("llama-gqa"));
  sq::PerplexityOptions o;
  o.ctx = 16;
  o.kv = sq::parse_kv_spec("int8");
  const std::vector<int32_t> tokens = random_tokens(streamed.config().vocab_size, 64);
  EXPECT_THROW(sq::evaluate_perplexity_layer_major(sq::EvalModel{nullptr, &streamed}, nullptr, tokens, o), sq::UsageError);
  o.kv = {};
  EXPECT_THROW(sq::evaluate_perplexity_layer_major(sq::EvalModel{}, nullptr, tokens, o), std::invalid_argument);
}

// sq-eval: --layer-major gives the resident run's figures (JSON) and says so; it is refused for the
// streaming protocol (one line, exit 2).
TEST(LayerMajorEvalCli, SqEvalLayerMajorReportsTheSameFigures) {
  ScratchDir dir;
  const std::string path = sq::test::hf_tiny("llama-gqa");
  const std::string ids = sq::test::write_random_token_ids(dir, 320, 200, 3);
  auto run = [&](const std::vector<std::string>& extra, const std::string& json) {
    std::vector<std::string> args = {sq::test::tool("sq-eval"), "-m", path, "--token-ids", ids, "-c", "32", "--protocol", "llamacpp",
                                     "--reference-model", sq::test::hf_tiny("qwen2"), "-q", "--json", dir.file(json)};
    args.insert(args.end(), extra.begin(), extra.end());
    const sq::test::ProcessResult r = sq::test::run_process(args, 120);
    EXPECT_EQ(r.exit_status, 0) << r.err;
    return nlohmann::json::parse(sq::read_file_to_string(dir.file(json)));
  };
  const nlohmann::json a = run({}, "a.json"), b = run({"--layer-major"}, "b.json");
  EXPECT_EQ(a["layer_major"]["model"], false);
  EXPECT_EQ(b["layer_major"]["model"], true);
  EXPECT_EQ(b["layer_major"]["reference"], true);
  EXPECT_EQ(a["nll_mean"], b["nll_mean"]);
  EXPECT_EQ(a["kl_divergence"]["mean"], b["kl_divergence"]["mean"]);
  EXPECT_GT(b["peak_rss_bytes"].get<int64_t>(), 0);
  const sq::test::ProcessResult bad = sq::test::run_process(
      {sq::test::tool("sq-eval"), "-m", path, "--token-ids", ids, "--protocol", "streaming", "--layer-major"}, 60);
  EXPECT_EQ(bad.exit_status, 2);
  EXPECT_NE(bad.err.find("--layer-major applies to"), std::string::npos) << bad.err;
}

}  // namespace
