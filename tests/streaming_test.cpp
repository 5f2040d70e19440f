// Streaming decoding and KV eviction (issue #6): policy parsing, the StreamingLLM mechanism proved
// exactly (sinks = dense while the text fits; cache positions, not text positions; a sink-dependent
// attention pattern kept by sinks and destroyed by window eviction), H2O / Q-Hitter eviction
// choices, constant KV memory, and the tools' options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "eval/streaming.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/mapped_file.h"
#include "formats/tokenizer.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "quant/kv_codec.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_policy.h"
#include "support/cli.h"
#include "support/expect_error.h"
#include "support/process.h"
#include "support/small_config.h"
#include "support/test_data.h"

namespace sq {
namespace {

std::vector<int32_t> story_tokens(size_t n) {
  auto tok = load_tokenizer(test::stories_tokenizer());
  const auto ids = tok->encode(read_file_to_string(test::tinystories_valid()).substr(0, 40000), true, false);
  return std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(std::min(n, ids.size())));
}

/// Per-position NLL of the next token (segment = 1 token).
std::vector<double> stream_nll(const Decoder& m, const std::vector<int32_t>& toks, const std::string& policy,
                               KVSpec kv = {}) {
  StreamingOptions o;
  o.policy = parse_kv_policy(policy);
  o.segment = 1;
  o.kv = kv;
  const StreamingResult r = evaluate_streaming(m, toks, o);
  std::vector<double> nll;
  for (double p : r.segment_ppl) nll.push_back(std::log(p));
  return nll;
}

TEST(KVPolicy, ParsesTheGrammarAndRejectsBadPolicies) {
  EXPECT_EQ(kv_policy_name(parse_kv_policy("sink:4,window:252")), "sink:4,window:252");
  EXPECT_EQ(parse_kv_policy("sink:4,window:252").capacity(100000), 256);
  EXPECT_EQ(kv_policy_name(parse_kv_policy("qhitter:20%,recent:10%,lambda:0.5")), "qhitter:20%,recent:10%,lambda:0.5");
  const KVPolicy r = resolve_kv_policy(parse_kv_policy("h2o:20%,recent:10%"), 256);
  EXPECT_EQ(r.budget, 51);
  EXPECT_EQ(r.recent, 26);
  EXPECT_EQ(parse_kv_policy("dense").kind, KVPolicyKind::Dense);
  EXPECT_EQ(kv_policy_name(parse_kv_policy("recompute:64,stride:16")), "recompute:64,stride:16");
  EXPECT_EQ(parse_kv_policy("recompute:64,stride:16").stride, 16);
  EXPECT_EQ(kv_policy_name(parse_kv_policy("recompute:64,stride:1")), "recompute:64");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"sliding:4", "unknown policy 'sliding'"},
      {"sink:8,window:8", "sink:8 must be smaller than window:8"},
      {"h2o:10,recent:20", "recent:20 is larger than the budget 10"},
      {"qhitter:10,recent:2,lambda:1.5", "lambda must be in [0, 1]"},
      {"qhitter:10,recent:2,lambda:x", "lambda must be a number"},
      {"window:0", "window must be a positive integer"},
      {"window:-3", "window must be a positive integer"},
      {"sink:4", "wrong number of fields"},
      {"sink:4,recent:8", "expected 'window:'"},
      {"h2o:150%,recent:2", "percentage in (0, 100]"},
      {"dense:3", "dense takes no value"},
      {"recompute:8,stride:9", "stride:9 must not exceed recompute:8"},
      {"recompute:8,window:2", "expected 'stride:'"},
      {"recompute:8,stride:0", "stride must be a positive integer"}};
  for (const auto& [text, part] : bad) test::expect_error<UsageError>([&] { parse_kv_policy(text); }, {"--kv-policy '" + text + "'", part});
}

TEST(Streaming, SinkWindowEqualsDenseWhileTheTextFits) {
  const Decoder m = Decoder::from_checkpoint(load_llama2c_checkpoint(test::stories_model()));
  const auto toks = story_tokens(200);
  // 200 tokens < 4 + 252: nothing is evicted, so every prediction is bit-identical.
  EXPECT_EQ(stream_nll(m, toks, "sink:4,window:252"), stream_nll(m, toks, "dense"));
  EXPECT_EQ(stream_nll(m, toks, "h2o:256,recent:16"), stream_nll(m, toks, "dense"));
  // Also with a quantized cache (the same rows are written and read).
  EXPECT_EQ(stream_nll(m, toks, "sink:4,window:252", parse_kv_spec("int4")), stream_nll(m, toks, "dense", parse_kv_spec("int4")));
}

TEST(Streaming, EvictedCachesUseCachePositions) {
  // With one decoder layer, a token's pre-RoPE key and its value depend on the token alone (norm
  // and projections of its embedding). So decoding under sink:2,window:6 must give, at every step,
  // exactly the prediction of a fresh prefill of [sinks + the 5 latest tokens + the current one]
  // at positions 0..7 — that is what "positions are assigned within the cache" means. With text
  // positions the sinks would sit t − 7 positions further away and the logits would differ.
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  Decoder full = Decoder::from_checkpoint(ck);
  ModelConfig c1 = full.config();
  c1.n_layers = 1;
  std::vector<DecoderLayer> one;
  one.push_back(std::move(full.mutable_layers()[0]));
  Decoder m(c1, full.embedding(), std::move(one), full.final_norm(), full.release_lm_head());
  const auto toks = story_tokens(40);
  for (const char* keys : {"post-rope", "pre-rope"}) {
    KVSpec kv;
    kv.keys = std::string(keys) == "pre-rope" ? KVKeyRope::PreRope : KVKeyRope::PostRope;
    const auto nll = stream_nll(m, toks, "sink:2,window:6", kv);
    const int V = c1.vocab_size;
    std::vector<float> logits(static_cast<size_t>(V));
    double worst = 0;
    for (size_t t = 8; t + 1 < toks.size(); ++t) {
      std::vector<int32_t> seq = {toks[0], toks[1]};
      for (size_t j = t - 5; j <= t; ++j) seq.push_back(toks[j]);
      KVCache cache(c1, 8);
      Workspace ws;
      m.forward(seq.data(), 8, cache, ws, logits.data(), LogitsFor::LastToken);
      const double ref = ops::log_sum_exp(logits.data(), V) - logits[size_t(toks[t + 1])];
      worst = std::max(worst, std::fabs(ref - nll[t]));
    }
    // FP32 prefill (BLAS) vs token-by-token decode and re-rotated keys: ~1e-6 in the NLL.
    EXPECT_LT(worst, 1e-4) << keys;
  }
}

TEST(Streaming, StridedRecomputeScoresEachBlockFromOnePrefillOfItsLastWTokens) {
  // recompute:W,stride:K scores predictions [iK, iK + K) from one prefill of the W tokens ending at
  // the block's last position (kv_policy.h); K = 1 is the per-token definition [max(0, t−W+1), t].
  // Checked position by position against direct prefills of exactly those tokens.
  const Decoder m = Decoder::from_checkpoint(load_llama2c_checkpoint(test::stories_model()));
  const auto toks = story_tokens(90);
  const int64_t len = static_cast<int64_t>(toks.size()), W = 24;
  const int V = m.config().vocab_size;
  for (int64_t K : {1, 8, 24}) {
    const auto nll = stream_nll(m, toks, "recompute:24,stride:" + std::to_string(K));
    ASSERT_EQ(static_cast<int64_t>(nll.size()), len - 1);
    double worst = 0;
    for (int64_t t = 0; t + 1 < len; ++t) {
      const int64_t end = std::min((t / K + 1) * K, len - 1) - 1, first = std::max<int64_t>(0, end - W + 1);
      std::vector<float> logits(static_cast<size_t>((end - first + 1) * V));
      KVCache cache(m.config(), W);
      Workspace ws;
      m.forward(toks.data() + first, end - first + 1, cache, ws, logits.data(), LogitsFor::AllTokens);
      const float* row = logits.data() + (t - first) * V;
      const double ref = ops::log_sum_exp(row, V) - row[size_t(toks[size_t(t + 1)])];
      worst = std::max(worst, std::fabs(ref - nll[size_t(t)]));
    }
    // The tested path prefills the block's context and its scored tokens in two calls (the second
    // attending to the cached first part); one call here: FP32 reassociation only, ~1e-6 in the NLL.
    EXPECT_LT(worst, 1e-4) << "stride " << K;
  }
  // Larger strides give shorter contexts on average: the PPL may not fall as K grows at fixed W.
  StreamingOptions o;
  o.segment = 1000;
  double prev = 0;
  for (const char* p : {"recompute:24", "recompute:24,stride:12", "recompute:24,stride:24"}) {
    o.policy = parse_kv_policy(p);
    const double ppl = evaluate_streaming(m, toks, o).ppl;
    EXPECT_GE(ppl, prev * 0.98) << p;  // 2%: a shorter context may still help a few predictions
    prev = ppl;
  }
}

/// A 1-layer model whose every query attends almost only to token 0 ("attention sink"): token 0's
/// key and every query share a large component in the slowest RoPE pair (dims 6,7 of the head:
/// 10000^(−6/8) rad per position, so RoPE barely rotates it), and token 0's value is distinctive.
Decoder sink_model() {
  ModelConfig c = test::small_config(16, 1, 1, 1, 12, 64);
  c.head_dim = 8;  // q/k/v are 8 wide, the residual stream 16
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<float> emb(12 * 16);
  for (int t = 0; t < 12; ++t)
    for (int j = 1; j < 15; ++j) emb[size_t(t * 16 + j)] = nd(rng);
  emb[0 * 16 + 0] = 4.0f;                                 // token 0: the sink feature
  for (int t = 0; t < 12; ++t) emb[size_t(t * 16 + 15)] = 1.0f;  // every token: the query feature
  auto mat = [&](int out, int in, float sd) {
    std::vector<float> w(size_t(out * in));
    std::normal_distribution<float> d(0.0f, sd);
    for (float& x : w) x = d(rng);
    return w;
  };
  std::vector<float> wq = mat(8, 16, 0.05f), wk = mat(8, 16, 0.05f), wv = mat(8, 16, 0.3f), wo = mat(16, 8, 0.3f);
  wq[size_t(6 * 16 + 15)] = 12.0f;  // q[6] ∝ query feature
  wk[size_t(6 * 16 + 0)] = 12.0f;   // k[6] ∝ sink feature
  wv[size_t(0 * 16 + 0)] = 8.0f;    // v of the sink is distinctive
  std::vector<DecoderLayer> layers(1);
  DecoderLayer& L = layers[0];
  L.attn_norm = Tensor::from_vector({16}, std::vector<float>(16, 1.0f));
  L.ffn_norm = Tensor::from_vector({16}, std::vector<float>(16, 1.0f));
  L.q_proj = std::make_unique<DenseLinear>(Tensor::from_vector({8, 16}, wq));
  L.k_proj = std::make_unique<DenseLinear>(Tensor::from_vector({8, 16}, wk));
  L.v_proj = std::make_unique<DenseLinear>(Tensor::from_vector({8, 16}, wv));
  L.o_proj = std::make_unique<DenseLinear>(Tensor::from_vector({16, 8}, wo));
  L.gate_proj = std::make_unique<DenseLinear>(Tensor::zeros({16, 16}));  // FFN off: silu(0)·up = 0
  L.up_proj = std::make_unique<DenseLinear>(Tensor::zeros({16, 16}));
  L.down_proj = std::make_unique<DenseLinear>(Tensor::zeros({16, 16}));
  Tensor e = Tensor::from_vector({12, 16}, emb);
  return Decoder(c, e, std::move(layers), Tensor::from_vector({16}, std::vector<float>(16, 1.0f)),
                    std::make_unique<DenseLinear>(e));
}

TEST(Streaming, SinksPreserveASinkDependentPatternThatWindowEvictionDestroys) {
  const Decoder m = sink_model();
  std::vector<int32_t> toks = {0};
  for (int i = 0; i < 40; ++i) toks.push_back(1 + i % 11);
  // The constructed model really is sink-dominated: with the dense cache the first token receives
  // most of the attention of the last query.
  {
    KVCache cache(m.config(), 64);
    Workspace ws;
    std::vector<double> mass;
    std::vector<float> logits(12);
    m.forward(toks.data(), static_cast<int64_t>(toks.size()) - 1, cache, ws, logits.data(), LogitsFor::None);
    ws.attention_mass = &mass;
    m.forward(&toks.back(), 1, cache, ws, logits.data(), LogitsFor::LastToken);
    EXPECT_GT(mass[0], 0.9) << "token 0 should receive > 90% of the attention";
  }
  const auto dense = stream_nll(m, toks, "dense");
  const auto sink = stream_nll(m, toks, "sink:1,window:7");
  const auto window = stream_nll(m, toks, "window:8");
  const auto h2o = stream_nll(m, toks, "h2o:8,recent:4");
  double d_sink = 0, d_window = 0, d_h2o = 0;
  for (size_t t = 8; t < dense.size(); ++t) {  // after the first eviction
    d_sink = std::max(d_sink, std::fabs(sink[t] - dense[t]));
    d_window = std::max(d_window, std::fabs(window[t] - dense[t]));
    d_h2o = std::max(d_h2o, std::fabs(h2o[t] - dense[t]));
  }
  // Sinks keep the pattern: predictions stay within a small fraction of the change that evicting
  // the sink causes (measured ~100× apart; 10× leaves margin for the model's random weights).
  EXPECT_GT(d_window, 0.5) << "evicting the sink must change the predictions";
  EXPECT_LT(d_sink, 0.1 * d_window);
  EXPECT_LT(d_h2o, 0.1 * d_window) << "H2O must keep the heavy hitter (token 0)";
}

TEST(Streaming, QHitterScoreFollowsAlgorithm1) {
  // 6 cached rows, budget 5, recent 2: the next token needs room, so the cache shrinks to 4 rows:
  // the newest row (with the next token, the recent set) plus the 3 best of candidates 0..4.
  const ModelConfig c = test::small_config(8, 1, 1, 1, 4, 16);
  std::vector<float> k(6 * 8), v(6 * 8);
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 8; ++j) {
      k[size_t(r * 8 + j)] = r == 1 ? 0.5f : float(r + 1) * std::sin(float(j * 7 + r));
      v[size_t(r * 8 + j)] = r == 1 ? -0.25f : float(r + 1) * std::cos(float(j * 5 + r));
    }
  // Independent per-row errors ‖x − decode(encode(x))‖₂ with the int2 codec.
  auto codec = make_kv_codec(parse_kv_spec("int2"), 8, 8, false, nullptr);
  auto err = [&](const float* x) {
    std::vector<uint8_t> b(size_t(codec->row_bytes()));
    std::vector<KVOutlier> sp;
    std::vector<float> d(8);
    codec->encode(x, b.data(), sp);
    codec->decode(b.data(), nullptr, 0, d.data());
    double e = 0;
    for (int j = 0; j < 8; ++j) e += double(x[j] - d[size_t(j)]) * double(x[j] - d[size_t(j)]);
    return std::sqrt(e);
  };
  const std::vector<double> att = {5.0, 0.1, 3.0, 2.0, 4.0, 1.0};
  auto run = [&](const std::string& policy) {
    KVCache cache(c, 8, parse_kv_spec("int2"));
    cache.set_track_quantization_error(true);
    cache.write(0, k.data(), v.data(), 6);
    cache.advance(6);
    for (int r = 0; r < 6; ++r) {
      EXPECT_NEAR(cache.key_quantization_error(r), err(k.data() + r * 8), 1e-6);
      EXPECT_NEAR(cache.value_quantization_error(r), err(v.data() + r * 8), 1e-6);
    }
    KVRowScores s{att};
    evict_for_next_token(parse_kv_policy(policy), cache, s);
    std::vector<int64_t> kept;
    for (int64_t r = 0; r < cache.length(); ++r) kept.push_back(cache.text_position(r));
    EXPECT_EQ(s.attention.size(), kept.size());
    return kept;
  };
  // H2O, and Q-Hitter with λ = 1: drop the two lowest accumulated attentions (rows 1 and 3).
  EXPECT_EQ(run("h2o:5,recent:2"), (std::vector<int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(run("qhitter:5,recent:2,lambda:1"), (std::vector<int64_t>{0, 2, 4, 5}));
  // λ = 0: S = (1 − Ŝ_qk) + (1 − Ŝ_qv) with Ŝ normalized by the candidates' maximum; the two
  // candidates with the largest normalized error sum go. Row 1 is constant: zero error, kept.
  double mk = 0, mv = 0;
  for (int r = 0; r < 5; ++r) {
    mk = std::max(mk, err(k.data() + r * 8));
    mv = std::max(mv, err(v.data() + r * 8));
  }
  std::vector<std::pair<double, int64_t>> score;
  for (int r = 0; r < 5; ++r) score.push_back({(1 - err(k.data() + r * 8) / mk) + (1 - err(v.data() + r * 8) / mv), r});
  std::sort(score.begin(), score.end());
  std::vector<int64_t> expect;
  for (int64_t r = 0; r < 6; ++r)
    if (r != score[0].second && r != score[1].second) expect.push_back(r);
  EXPECT_EQ(err(k.data() + 8), 0.0);
  const auto kept = run("qhitter:5,recent:2,lambda:0");
  EXPECT_EQ(kept, expect);
  EXPECT_NE(std::find(kept.begin(), kept.end(), 1), kept.end());
}

TEST(Streaming, KVMemoryStaysConstantAndStreamingIsReported) {
  const Decoder m = Decoder::from_checkpoint(load_llama2c_checkpoint(test::stories_model()));
  const auto toks = story_tokens(1500);
  StreamingOptions o;
  o.policy = parse_kv_policy("sink:4,window:60");
  o.segment = 250;
  o.kv = parse_kv_spec("int4");
  const StreamingResult r = evaluate_streaming(m, toks, o);
  ASSERT_EQ(r.segment_kv_bytes.size(), 6u);
  // 64 tokens × 5 layers × (K + V) × (16 code bytes + 4 groups × 4 bytes) = 20,480 bytes, flat.
  for (int64_t b : r.segment_kv_bytes) EXPECT_EQ(b, 64 * 5 * 2 * 32);
  EXPECT_EQ(r.peak_kv_bytes, 64 * 5 * 2 * 32);
  EXPECT_EQ(r.peak_kv_rows, 64);
  EXPECT_EQ(r.tokens_scored, static_cast<int64_t>(toks.size()) - 1);
  EXPECT_GT(r.ppl, 3.0);
  EXPECT_LT(r.ppl, 20.0);
}

TEST(Streaming, BlocksCompareWithTheReferenceAsTokenByTokenDoes) {
  // With --reference-model, block streaming (-b) runs the reference's dense decoding in blocks too.
  // The model against itself, dense: both run the same blocks, so KLD is exactly 0 and top-1 1.
  // Under sink:4,window:60 (1,000 tokens, 16 blocks past the fill point) the statistics equal those
  // of token-by-token decoding up to FP32 rounding (per-prediction NLLs differ by ~1e-6 on this
  // model, streaming_architectures_test.cpp; 1e-4 relative on the means and 1e-3 absolute on the
  // top-1 fraction, i.e. one prediction of 999 whose two best tokens tie within rounding).
  const Decoder m = Decoder::from_checkpoint(load_llama2c_checkpoint(test::stories_model()));
  const auto toks = story_tokens(1000);
  auto run = [&](const std::string& policy, int64_t batch) {
    StreamingOptions o;
    o.policy = parse_kv_policy(policy);
    o.batch = batch;
    o.reference = &m;
    return evaluate_streaming(m, toks, o);
  };
  const StreamingResult self = run("dense", 64);
  ASSERT_TRUE(self.comparison);
  EXPECT_EQ(self.comparison->kld_mean, 0.0);
  EXPECT_EQ(self.comparison->kld_max, 0.0);
  EXPECT_EQ(self.comparison->top1_agreement, 1.0);
  EXPECT_EQ(self.comparison->ppl_ref, self.ppl);
  const StreamingResult one = run("sink:4,window:60", 1), blk = run("sink:4,window:60", 64);
  ASSERT_TRUE(one.comparison && blk.comparison);
  EXPECT_GT(one.comparison->kld_mean, 1e-3);  // eviction changes the predictions
  EXPECT_NEAR(blk.comparison->kld_mean, one.comparison->kld_mean, 1e-4 * one.comparison->kld_mean);
  EXPECT_NEAR(blk.comparison->ppl_ref, one.comparison->ppl_ref, 1e-4 * one.comparison->ppl_ref);
  EXPECT_NEAR(blk.ppl, one.ppl, 1e-4 * one.ppl);
  EXPECT_NEAR(blk.comparison->top1_agreement, one.comparison->top1_agreement, 1e-3);
  // Policies that evict by attention (and recompute) have no block form: refused in one line.
  for (const char* p : {"h2o:64,recent:16", "recompute:64"})
    test::expect_error<UsageError>([&] { run(p, 8); }, {"-b 8", "dense, window and sink policies only", "use -b 1"});
}

TEST(StreamingCli, RunAndEvalOptions) {
  const std::string model = test::stories_model(), tok = test::stories_tokenizer();
  auto one_line_exit2 = [](const test::ProcessResult& r, const std::string& part) { test::expect_one_line_exit2(r, part); };
  // sq-run past the model's 512-token context with constant memory.
  const auto run = test::run_process({test::tool("sq-run"), "-m", model, "--tokenizer", tok, "-p", "Once upon a time", "-n", "700",
                                      "--kv-policy", "sink:4,window:60", "--ignore-eos", "--temp", "0.8", "--seed", "3"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_NE(run.err.find("generated 700 tokens"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("peak 81920 bytes (64 tokens)"), std::string::npos) << run.err;  // 64 × 1280 bytes FP32
  one_line_exit2(test::run_process({test::tool("sq-run"), "-m", model, "--tokenizer", tok, "-p", "x", "--kv-policy", "recompute:8"}),
                 "not a generation policy");
  const std::vector<std::string> eval = {test::tool("sq-eval"), "-m", model, "--tokenizer", tok, "-f", test::tinystories_valid(), "-q"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  one_line_exit2(test::run_process(with(eval, {"--protocol", "streaming", "--kv-policy", "sink:300,window:256"})), "sink:300");
  one_line_exit2(test::run_process(with(eval, {"--kv-policy", "window:8"})), "need --protocol streaming");
  test::ScratchDir dir;
  const auto ok = test::run_process(with(eval, {"--protocol", "streaming", "--kv-policy", "sink:4,window:28", "--max-tokens", "300",
                                                "--segment", "100", "--json", dir.file("s.json")}));
  ASSERT_EQ(ok.exit_status, 0) << ok.err;
  const auto j = nlohmann::json::parse(test::read_file(dir.file("s.json")));
  EXPECT_EQ(j["protocol"]["kv_policy"], "sink:4,window:28");
  EXPECT_EQ(j["segments"].size(), 3u);
  EXPECT_EQ(j["kv_cache"]["peak_tokens"], 32);
  EXPECT_EQ(j["tokens_scored"], 299);
  // -b: blocks of tokens give the same PPL (to the 4 printed decimals here) and say so in the JSON.
  const auto blk = test::run_process(with(eval, {"--protocol", "streaming", "--kv-policy", "sink:4,window:28", "--max-tokens", "300",
                                                 "--segment", "100", "-b", "64", "--json", dir.file("b.json")}));
  ASSERT_EQ(blk.exit_status, 0) << blk.err;
  const auto jb = nlohmann::json::parse(test::read_file(dir.file("b.json")));
  EXPECT_EQ(jb["protocol"]["batch_size"], 64);
  EXPECT_NEAR(jb["ppl"].get<double>(), j["ppl"].get<double>(), 1e-4 * j["ppl"].get<double>());
  EXPECT_EQ(jb["kv_cache"]["peak_tokens"], 32);
  one_line_exit2(test::run_process(with(eval, {"-b", "8"})), "need --protocol streaming");
  one_line_exit2(test::run_process(with(eval, {"--protocol", "streaming", "--kv-policy", "h2o:32,recent:8", "-b", "8"})),
                 "dense, window and sink policies only");
  one_line_exit2(test::run_process(with(eval, {"--protocol", "streaming", "-b", "0"})), "at least 1");
}

}  // namespace
}  // namespace sq
