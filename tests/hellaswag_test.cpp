// HellaSwag task accuracy (eval/hellaswag.h, formats/hellaswag_file.h): the task file's parser and
// its errors, the scoring against an independent computation on a model whose logits are set by
// hand, the shared-prefix KV reuse (KVCache::truncate), thread independence, and the reference
// comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "eval/hellaswag.h"
#include "formats/llama2c_checkpoint.h"
#include "model/model_loader.h"
#include "runtime/kv_format.h"
#include <nlohmann/json.hpp>

#include "tests/support/cli.h"
#include "tests/support/expect_error.h"
#include "tests/support/hf_tiny.h"
#include "tests/support/process.h"
#include "ops/library_threads.h"
#include "tests/support/small_config.h"
#include "tests/support/test_data.h"

namespace sq {
namespace {

// ---- The task file -------------------------------------------------------------------------

const char* const kTwoTasks =
    "Roofing: A man is on a roof. he\n"
    "3\n"
    "is using wrap.\n"
    "is ripping tiles off.\n"
    "is holding a cube.\n"
    "starts pulling up roofing.\n"
    "Lifting: A lady walks to a barbell. the lady\n"
    "0\n"
    "stands and lifts it.\n"
    "swings.\n"
    "pulls it forward.\n"
    "pulls a rope.\n";

TEST(HellaswagFile, ParsesSixLinesPerTask) {
  const std::vector<HellaswagTask> t = parse_hellaswag_tasks(kTwoTasks, "hs.txt");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].index, 0);
  EXPECT_EQ(t[0].line, 1);
  EXPECT_EQ(t[0].context, "Roofing: A man is on a roof. he");
  EXPECT_EQ(t[0].gold, 3);
  EXPECT_EQ(t[0].endings[3], "starts pulling up roofing.");
  EXPECT_EQ(t[1].index, 1);
  EXPECT_EQ(t[1].line, 7);
  EXPECT_EQ(t[1].gold, 0);
  EXPECT_EQ(t[1].endings[1], "swings.");
  // CRLF line ends and a missing final newline give the same tasks.
  std::string crlf;
  for (const char* p = kTwoTasks; *p; ++p) crlf += *p == '\n' ? std::string("\r\n") : std::string(1, *p);
  crlf.resize(crlf.size() - 2);
  const std::vector<HellaswagTask> u = parse_hellaswag_tasks(crlf, "hs.txt");
  ASSERT_EQ(u.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(u[i].context, t[i].context);
    EXPECT_EQ(u[i].endings, t[i].endings);
  }
}

TEST(HellaswagFile, MalformedFilesNameTheLine) {
  std::string text = kTwoTasks;
  test::expect_error<InputError>([] { parse_hellaswag_tasks("", "hs.txt"); }, {"hs.txt", "empty"});
  // Wrong gold label (line 8).
  std::string bad = text;
  bad.replace(bad.find("\n0\n"), 3, "\n4\n");
  test::expect_error<InputError>([&] { parse_hellaswag_tasks(bad, "hs.txt"); }, {"hs.txt:8:", "task 1", "'4'"});
  bad = text;
  bad.replace(bad.find("\n3\n"), 3, "\n 3\n");
  test::expect_error<InputError>([&] { parse_hellaswag_tasks(bad, "hs.txt"); }, {"hs.txt:2:", "task 0", "' 3'"});
  // A missing ending: the file ends one line short of the second task.
  bad = text.substr(0, text.rfind("pulls a rope.\n"));
  test::expect_error<InputError>([&] { parse_hellaswag_tasks(bad, "hs.txt"); },
                                 {"hs.txt:7:", "task 1 is incomplete", "5 of its 6 lines", "ending 3 is missing"});
  // An empty ending (line 10).
  bad = text;
  bad.replace(bad.find("swings.\n"), 8, "\n");
  test::expect_error<InputError>([&] { parse_hellaswag_tasks(bad, "hs.txt"); }, {"hs.txt:10:", "ending 1 is empty"});
}

TEST(HellaswagFile, TaskOrders) {
  std::vector<HellaswagTask> all(20);
  for (int i = 0; i < 20; ++i) all[size_t(i)].index = i;
  const auto first = select_hellaswag_tasks(all, 5, TaskOrder::File);
  ASSERT_EQ(first.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(first[size_t(i)].index, i);
  EXPECT_EQ(select_hellaswag_tasks(all, 0, TaskOrder::File).size(), 20u);
  EXPECT_EQ(select_hellaswag_tasks(all, 99, TaskOrder::File).size(), 20u);
  // llama.cpp's draw: a permutation (every task once), deterministic, and not the file order.
  const auto drawn = select_hellaswag_tasks(all, 0, TaskOrder::LlamaCpp);
  std::vector<int> seen(20, 0);
  bool in_order = true;
  for (size_t i = 0; i < drawn.size(); ++i) {
    ++seen[size_t(drawn[i].index)];
    in_order = in_order && drawn[i].index == int64_t(i);
  }
  EXPECT_EQ(seen, std::vector<int>(20, 1));
  EXPECT_FALSE(in_order);
  const auto again = select_hellaswag_tasks(all, 7, TaskOrder::LlamaCpp);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(again[i].index, drawn[i].index);  // a prefix of the same draw
  EXPECT_EQ(parse_task_order("llamacpp"), TaskOrder::LlamaCpp);
  test::expect_error<UsageError>([] { parse_task_order("random"); }, {"--task-order", "'random'"});
}

// ---- Scoring on a model whose logits are set by hand ----------------------------------------

// Token ids of the toy "tokenizer": one id per character of kAlphabet, BOS = 0.
const std::string kAlphabet = "^ abcdefgh";  // '^' stands for BOS (never in a text)
constexpr int kVocab = 10;

std::vector<int> toy_encode(const std::string& text) {
  std::vector<int> ids = {0};
  for (char ch : text) {
    const size_t k = kAlphabet.find(ch);
    if (k == std::string::npos || k == 0) throw std::invalid_argument(std::string("toy tokenizer: no id for '") + ch + "'");
    ids.push_back(int(k));
  }
  return ids;
}

/// A one-layer model whose attention and FFN are off (zero weights), so the logits after token c
/// are the LM head applied to the final RMSNorm of embedding row c: with embedding rows
/// 100·e_c (one-hot, dim = vocab) the norm is √dim·e_c (the 1e-5 epsilon changes it by 4e-9
/// relative), and a head T/√dim gives logits T[:, c] — a bigram table set by hand.
/// T[v][c] = logit of next token v after token c.
Decoder bigram_model(const std::vector<std::vector<float>>& T) {
  const int d = kVocab;
  ModelConfig c = test::small_config(d, 1, 1, 1, kVocab, 64);
  c.tied_embeddings = false;
  std::vector<float> emb(size_t(d * d), 0.0f), head(size_t(d * d));
  for (int t = 0; t < d; ++t) emb[size_t(t * d + t)] = 100.0f;
  for (int v = 0; v < d; ++v)
    for (int k = 0; k < d; ++k) head[size_t(v * d + k)] = T[size_t(v)][size_t(k)] / std::sqrt(float(d));
  std::vector<DecoderLayer> layers(1);
  DecoderLayer& L = layers[0];
  L.attn_norm = Tensor::from_vector({d}, std::vector<float>(size_t(d), 1.0f));
  L.ffn_norm = Tensor::from_vector({d}, std::vector<float>(size_t(d), 1.0f));
  L.q_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.k_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.v_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.o_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.gate_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.up_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  L.down_proj = std::make_unique<DenseLinear>(Tensor::zeros({d, d}));
  return Decoder(c, Tensor::from_vector({d, d}, emb), std::move(layers),
                 Tensor::from_vector({d}, std::vector<float>(size_t(d), 1.0f)),
                 std::make_unique<DenseLinear>(Tensor::from_vector({d, d}, head)));
}

std::vector<std::vector<float>> random_table(unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<std::vector<float>> T(kVocab, std::vector<float>(kVocab));
  for (auto& row : T)
    for (float& x : row) x = nd(rng);
  return T;
}

/// log p(next | prev) from the table, in double (independent of the decoder and of ops).
double table_log_prob(const std::vector<std::vector<float>>& T, int prev, int next) {
  double m = -1e300;
  for (int v = 0; v < kVocab; ++v) m = std::max(m, double(T[size_t(v)][size_t(prev)]));
  double s = 0;
  for (int v = 0; v < kVocab; ++v) s += std::exp(double(T[size_t(v)][size_t(prev)]) - m);
  return double(T[size_t(next)][size_t(prev)]) - m - std::log(s);
}

std::vector<HellaswagSequences> toy_tasks(const std::vector<HellaswagTask>& tasks) {
  std::vector<HellaswagSequences> s;
  for (const HellaswagTask& t : tasks) s.push_back(tokenize_hellaswag_task(t, toy_encode, "toy.txt"));
  return s;
}

HellaswagTask toy_task(int64_t index, const std::string& context, int gold, std::array<std::string, 4> endings) {
  HellaswagTask t;
  t.index = index;
  t.line = 6 * index + 1;
  t.context = context;
  t.gold = gold;
  t.endings = std::move(endings);
  return t;
}

TEST(Hellaswag, CommonPrefixAsLlamaCpp) {
  // Sequences: BOS + context + ' ' + ending. All four endings start with 'c', so the prefix runs
  // into them (llama.cpp compares token sequences, not the context).
  const HellaswagSequences s = tokenize_hellaswag_task(toy_task(0, "ab", 0, {"cd", "ce", "cfg", "ch"}), toy_encode, "t");
  EXPECT_EQ(s.common_prefix, 5);  // ^ a b ' ' c
  EXPECT_EQ(s.tokens[2], (std::vector<int32_t>{0, 2, 3, 1, 4, 7, 8}));
  // One ending a prefix of the others: the prefix is capped so that it keeps one scored token.
  const HellaswagSequences p = tokenize_hellaswag_task(toy_task(0, "ab", 0, {"c", "cd", "ce", "cf"}), toy_encode, "t");
  EXPECT_EQ(p.common_prefix, 4);
}

TEST(Hellaswag, ScoresAreMeanLogProbabilitiesOfTheEndingTokens) {
  const auto T = random_table(7);
  const Decoder m = bigram_model(T);
  const std::vector<HellaswagTask> tasks = {toy_task(0, "ab", 1, {"cd", "ce", "cfg", "ch"}),
                                            toy_task(1, "hag", 2, {"a", "bbb", "cdefgh", "d"}),
                                            toy_task(2, "e", 0, {"c", "cd", "ce", "cf"})};
  const std::vector<HellaswagSequences> seqs = toy_tasks(tasks);
  const HellaswagResult r = evaluate_hellaswag(m, seqs, {});
  ASSERT_EQ(r.tasks.size(), 3u);
  int correct = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::array<double, 4> want{};
    for (size_t e = 0; e < 4; ++e) {
      const auto& t = seqs[i].tokens[e];
      double sum = 0;
      for (size_t k = size_t(seqs[i].common_prefix); k < t.size(); ++k) sum += table_log_prob(T, t[k - 1], t[k]);
      want[e] = sum / double(t.size() - size_t(seqs[i].common_prefix));
      // Logits are FP32 (head T/√10 times √10·(1 − 4e-9)): ~1e-6 absolute on |T| ≲ 8.
      EXPECT_NEAR(r.tasks[i].scores[e], want[e], 2e-5) << "task " << i << " ending " << e;
    }
    const int best = int(std::max_element(want.begin(), want.end()) - want.begin());
    EXPECT_EQ(r.tasks[i].choice, best);
    EXPECT_EQ(r.tasks[i].index, int64_t(i));
    EXPECT_EQ(r.tasks[i].gold, tasks[i].gold);
    correct += best == tasks[i].gold;
  }
  EXPECT_EQ(r.tasks_correct, correct);
  EXPECT_DOUBLE_EQ(r.accuracy, correct / 3.0);
  // Tokens run: each prefix once, each ending but its last token.
  int64_t run = 0;
  for (const auto& s : seqs) {
    run += s.common_prefix;
    for (const auto& t : s.tokens) run += int64_t(t.size()) - s.common_prefix - 1;
  }
  EXPECT_EQ(r.tokens_processed, run);
}

TEST(Hellaswag, KnownAnswers) {
  // After ' ' (id 1) the table strongly prefers 'b' (id 3), after 'b' it prefers 'c': the ending
  // "bc" is the most likely continuation, "bd" next; everything else is far less likely.
  std::vector<std::vector<float>> T(kVocab, std::vector<float>(kVocab, 0.0f));
  T[3][1] = 6.0f;  // ' ' → b
  T[4][3] = 6.0f;  // b → c
  T[5][3] = 3.0f;  // b → d
  const Decoder m = bigram_model(T);
  const std::vector<HellaswagTask> tasks = {toy_task(0, "a", 2, {"e", "bd", "bc", "f"}),   // gold = the best: correct
                                            toy_task(1, "a", 0, {"ge", "bc", "fd", "hh"}),  // gold is not: wrong
                                            toy_task(2, "a", 3, {"ge", "bd", "e", "bc"})};  // correct
  const HellaswagResult r = evaluate_hellaswag(m, toy_tasks(tasks), {});
  EXPECT_EQ(r.tasks[0].choice, 2);
  EXPECT_EQ(r.tasks[1].choice, 1);
  EXPECT_EQ(r.tasks[2].choice, 3);
  EXPECT_EQ(r.tasks_correct, 2);
  EXPECT_DOUBLE_EQ(r.accuracy, 2.0 / 3.0);
  // sqrt(p(1-p)/(N-1)) = sqrt((2/3)(1/3)/2) = 1/3.
  EXPECT_NEAR(r.accuracy_stderr, 1.0 / 3.0, 1e-12);
  EXPECT_LT(r.ci95_low, r.accuracy);
  EXPECT_GT(r.ci95_high, r.accuracy);
}

TEST(Hellaswag, WilsonIntervalAsLlamaCpp) {
  // 250 of 400 correct: the textbook Wilson score interval (p + z²/2n ± z·sqrt(p(1−p)/n +
  // z²/4n²)) / (1 + z²/n) is [57.657901, 67.104292]% (computed in Python); llama.cpp writes the
  // same interval in another algebraic form.
  HellaswagResult r;
  set_hellaswag_accuracy(r, 250, 400);
  EXPECT_NEAR(r.ci95_low * 100, 57.65790058795902, 1e-9);
  EXPECT_NEAR(r.ci95_high * 100, 67.10429205368358, 1e-9);
  EXPECT_NEAR(r.accuracy_stderr, std::sqrt(0.625 * 0.375 / 399), 1e-15);
}

/// `n` tasks of random token ids drawn from std::mt19937(seed): per task a gold index, then a shared
/// prefix (`bos` first when ≥ 0, then prefix_len tokens) and four endings of ending_len tokens each;
/// token ids, prefix and ending lengths uniform over the given closed ranges.
std::vector<HellaswagSequences> random_token_tasks(int n, unsigned seed, std::pair<int, int> token_ids,
                                                   std::pair<int, int> prefix_len, std::pair<int, int> ending_len,
                                                   int32_t bos = -1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(token_ids.first, token_ids.second), plen(prefix_len.first, prefix_len.second),
      elen(ending_len.first, ending_len.second), gold(0, 3);
  std::vector<HellaswagSequences> v;
  for (int i = 0; i < n; ++i) {
    HellaswagSequences s;
    s.index = i;
    s.gold = gold(rng);
    std::vector<int32_t> prefix;
    if (bos >= 0) prefix.push_back(bos);
    for (int k = plen(rng); k > 0; --k) prefix.push_back(tok(rng));
    s.common_prefix = int64_t(prefix.size());
    for (auto& t : s.tokens) {
      t = prefix;
      for (int k = elen(rng); k > 0; --k) t.push_back(tok(rng));
    }
    v.push_back(std::move(s));
  }
  return v;
}

// ---- KVCache::truncate -----------------------------------------------------------------------

TEST(KVCacheTruncate, DropsTheTailAndReusesItsSlotsAndTextPositions) {
  const ModelConfig c = test::small_config(16, 2, 2, 2, 32, 64);
  KVSpec spec = parse_kv_spec("int4");
  spec.sink_fp16 = 2;  // text positions 0 and 1 are FP16 sink rows
  KVCache cache(c, 8, spec);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  auto append = [&](int64_t n) {
    std::vector<float> k(size_t(n * cache.kv_width())), v(k.size());
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    for (int l = 0; l < c.n_layers; ++l) cache.write(l, k.data(), v.data(), n);
    cache.advance(n);
  };
  append(1);
  const KVCacheBytes one = cache.bytes();
  append(5);
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_EQ(cache.tokens_seen(), 1);
  EXPECT_EQ(cache.bytes().total(), one.total());  // the dropped rows' bytes are freed
  append(3);  // rows 1..3 again: row 1 is text position 1, so an FP16 sink row once more
  EXPECT_EQ(cache.text_position(1), 1);
  EXPECT_EQ(cache.text_position(3), 3);
  EXPECT_LT(cache.row_slots()[1], 0);   // sink slot
  EXPECT_GE(cache.row_slots()[2], 0);   // dense slot
  EXPECT_EQ(cache.bytes().sinks, one.sinks * 2);
  cache.truncate(0);
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.bytes().total(), cache.bytes().tables);
  EXPECT_THROW(cache.truncate(1), std::invalid_argument);
}

// ---- The real stories260K model: KV reuse, threads, reference ------------------------------

class StoriesHellaswag : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    checkpoint_ = new Checkpoint(load_llama2c_checkpoint(test::stories_model()));
    model_ = new Decoder(Decoder::from_checkpoint(*checkpoint_));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete checkpoint_;
  }
  /// Random tasks for stories260K (vocabulary 512): BOS, a shared prefix of 20-40 tokens and four
  /// endings of 1-12 tokens.
  static std::vector<HellaswagSequences> random_tasks(int n, unsigned seed) {
    return random_token_tasks(n, seed, {3, 511}, {20, 40}, {1, 12}, /*bos=*/1);
  }
  static Checkpoint* checkpoint_;
  static Decoder* model_;
};
Checkpoint* StoriesHellaswag::checkpoint_ = nullptr;
Decoder* StoriesHellaswag::model_ = nullptr;

TEST_F(StoriesHellaswag, SharedPrefixEqualsRunningEachSequenceWhole) {
  // The batched evaluation (tasks' prefixes in one pass, all endings in another, the prefix's cache
  // reused by each ending) gives the scores of running every sequence alone from an empty cache,
  // as two blocks (prefix, then ending) or as one. Tolerance: the GEMMs run over other row counts
  // (another blocking of the same FP32 sums): logits differ by ~1e-6 relative, the mean
  // log-probabilities by up to ~5e-6 measured on these tasks; 2e-5 bounds it.
  const auto tasks = random_tasks(6, 3);
  ops::ScopedOmpThreads one(1);
  const HellaswagResult r = evaluate_hellaswag(*model_, tasks, {});
  const int V = model_->config().vocab_size;
  for (size_t i = 0; i < tasks.size(); ++i)
    for (size_t e = 0; e < 4; ++e) {
      const auto& t = tasks[i].tokens[e];
      const int64_t c = tasks[i].common_prefix, n = int64_t(t.size());
      KVCache cache(model_->config(), n);
      Workspace ws;
      std::vector<float> first(static_cast<size_t>(V));
      std::vector<float> rows(size_t(std::max<int64_t>(n - c - 1, 1)) * V), whole(size_t(n) * V);
      model_->forward(t.data(), c, cache, ws, first.data(), LogitsFor::LastToken);
      if (n - c - 1 > 0) model_->forward(t.data() + c, n - c - 1, cache, ws, rows.data(), LogitsFor::AllTokens);
      KVCache cache2(model_->config(), n);
      model_->forward(t.data(), n, cache2, ws, whole.data(), LogitsFor::AllTokens);
      auto lp = [&](const float* row, int32_t target) {
        double m = -1e300, s = 0;
        for (int v = 0; v < V; ++v) m = std::max(m, double(row[v]));
        for (int v = 0; v < V; ++v) s += std::exp(double(row[v]) - m);
        return double(row[target]) - m - std::log(s);
      };
      double two = lp(first.data(), t[size_t(c)]);
      double single = lp(whole.data() + size_t(c - 1) * V, t[size_t(c)]);
      for (int64_t k = c + 1; k < n; ++k) {
        two += lp(rows.data() + size_t(k - c - 1) * V, t[size_t(k)]);
        single += lp(whole.data() + size_t(k - 1) * V, t[size_t(k)]);
      }
      two /= double(n - c);
      single /= double(n - c);
      // (Also a double log-softmax here vs ops::log_sum_exp there: ~1e-7 per token.)
      EXPECT_NEAR(r.tasks[i].scores[e], two, 2e-5) << i << "/" << e;
      EXPECT_NEAR(r.tasks[i].scores[e], single, 2e-5) << i << "/" << e;
    }
}

TEST_F(StoriesHellaswag, QuantizedKVCacheReuseMatchesFreshCaches) {
  // A packed int4 cache: dropping an ending's rows and writing the next ending's gives the scores
  // of a fresh cache per sequence. Tolerance: the GEMMs' row counts differ (as above), and a 1e-6
  // change of a key or value flips an int4 code at a rounding boundary now and then (one step is
  // ~1/15 of a group's range). Measured on these tasks, the batch composition alone (each task
  // scored alone vs in this batch, same cache handling) moves a score by up to 5e-4 on an AVX2-only AMD EPYC
  // and 9.3e-3 on an AVX-512/AMX Xeon (its GEMM blocking differs more between row counts; FP32
  // caches 2.4e-6, int8 1.9e-3 there). An ending that saw another ending's rows (the defect this
  // test exists for: the prefix, then ending e+1, then ending e on one int4 cache) moved its score by
  // 0.075 at least. 2.5e-2 sits between the two.
  const auto tasks = random_tasks(4, 11);
  ops::ScopedOmpThreads one(1);
  HellaswagOptions o;
  o.kv = parse_kv_spec("int4");
  const HellaswagResult r = evaluate_hellaswag(*model_, tasks, o);
  for (size_t i = 0; i < tasks.size(); ++i)
    for (size_t e = 0; e < 4; ++e) {
      HellaswagSequences only = tasks[i];
      for (auto& t : only.tokens) t = tasks[i].tokens[e];  // four copies of ending e: fresh prefix each time
      const HellaswagResult s = evaluate_hellaswag(*model_, {only}, o);
      EXPECT_NEAR(r.tasks[i].scores[e], s.tasks[0].scores[0], 2.5e-2) << i << "/" << e;
    }
}

TEST_F(StoriesHellaswag, ThreadCountDoesNotChangeTheResult) {
  const auto tasks = random_tasks(8, 5);
  HellaswagResult one, two;
  {
    ops::ScopedOmpThreads t(1);
    one = evaluate_hellaswag(*model_, tasks, {});
  }
  {
    ops::ScopedOmpThreads t(2);  // tasks on two threads, each single-threaded
    two = evaluate_hellaswag(*model_, tasks, {});
  }
  ASSERT_EQ(one.tasks.size(), two.tasks.size());
  for (size_t i = 0; i < one.tasks.size(); ++i) {
    EXPECT_EQ(one.tasks[i].scores, two.tasks[i].scores);
    EXPECT_EQ(one.tasks[i].choice, two.tasks[i].choice);
  }
  EXPECT_EQ(one.tokens_processed, two.tokens_processed);
}

TEST_F(StoriesHellaswag, ReferenceComparison) {
  const auto tasks = random_tasks(6, 9);
  HellaswagOptions o;
  o.reference = model_;
  const HellaswagResult same = evaluate_hellaswag(*model_, tasks, o);
  ASSERT_TRUE(same.comparison);
  EXPECT_EQ(same.comparison->changed_choices, 0);
  EXPECT_EQ(same.comparison->kld_mean, 0.0);
  EXPECT_DOUBLE_EQ(same.comparison->accuracy, same.accuracy);
  int64_t predictions = 0;
  for (const auto& s : tasks)
    for (const auto& t : s.tokens) predictions += int64_t(t.size()) - s.common_prefix;
  EXPECT_EQ(same.comparison->predictions, predictions);
  // An int2 KV cache under test: positive KLD; the changed choices are counted from the choices.
  o.kv = parse_kv_spec("int2");
  const HellaswagResult q = evaluate_hellaswag(*model_, tasks, o);
  ASSERT_TRUE(q.comparison);
  EXPECT_GT(q.comparison->kld_mean, 0.0);
  int64_t changed = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    EXPECT_EQ(q.tasks[i].reference_choice, same.tasks[i].choice);
    changed += q.tasks[i].choice != same.tasks[i].choice;
  }
  EXPECT_EQ(q.comparison->changed_choices, changed);
  EXPECT_DOUBLE_EQ(q.comparison->accuracy, same.accuracy);
}

TEST_F(StoriesHellaswag, TaskLongerThanTheContextIsRefused) {
  auto tasks = random_tasks(1, 1);
  tasks[0].index = 5;
  tasks[0].line = 31;
  tasks[0].tokens[2].resize(size_t(model_->config().max_seq_len) + 1, 7);
  test::expect_error<UsageError>([&] { evaluate_hellaswag(*model_, tasks, {}); }, {"task 5", "line 31", "trained context"});
  test::expect_error<UsageError>([&] { evaluate_hellaswag(*model_, {}, {}); }, {"no HellaSwag task"});
}

// ---- Every architecture: batched scoring equals whole-sequence forwards ---------------------

class HellaswagArchitecture : public ::testing::TestWithParam<const char*> {};

TEST_P(HellaswagArchitecture, BatchedScoresEqualWholeSequenceForwards) {
  // The batched pass (prefixes, then every ending over its task's prefix cache) against one
  // forward() per whole sequence from an empty cache and transformers-style logits
  // (test::decoder_logits): the same log-probabilities within FP32 rounding of GEMMs over other
  // row counts (tiny models: logits of order 1, ~1e-6 relative), on every architecture's spec
  // (norms, positions, windows, ALiBi, parallel residual, MoE).
  const LoadedModel lm = load_model(test::hf_tiny(GetParam()));
  const Decoder& m = *lm.model;
  const int V = m.config().vocab_size;
  const std::vector<HellaswagSequences> tasks = random_token_tasks(5, 4, {1, V - 1}, {3, 9}, {1, 5});
  const HellaswagResult r = evaluate_hellaswag(m, tasks, {});
  for (size_t i = 0; i < tasks.size(); ++i)
    for (size_t e = 0; e < 4; ++e) {
      const auto& t = tasks[i].tokens[e];
      const std::vector<float> logits = test::decoder_logits(m, t);
      const int64_t c = tasks[i].common_prefix;
      double sum = 0;
      for (int64_t k = c; k < int64_t(t.size()); ++k) {
        const float* row = logits.data() + size_t(k - 1) * size_t(V);
        double mx = -1e300, z = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
        for (int v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
        sum += double(row[t[size_t(k)]]) - mx - std::log(z);
      }
      EXPECT_NEAR(r.tasks[i].scores[e], sum / double(int64_t(t.size()) - c), 1e-4) << GetParam() << " task " << i << " ending " << e;
    }
}

INSTANTIATE_TEST_SUITE_P(All, HellaswagArchitecture, ::testing::ValuesIn(test::kHfTinyCheckpoints), test::HfTinyParamName());

// ---- sq-eval --task hellaswag --------------------------------------------------------------

// Three tasks whose gold ending is the story-like one; the others are word salad stories260K
// (trained on TinyStories) gives a far lower mean log-probability.
const char* const kStoryTasks =
    "Once upon a time, there was a little girl named Lily. She loved to\n"
    "1\n"
    "quantum rhombus fiscal yacht.\n"
    "play outside in the park.\n"
    "zinc tax ledger of bonds.\n"
    "parliament votes on tariffs.\n"
    "One day, a boy named Tim went to the\n"
    "2\n"
    "semiconductor foundry audit.\n"
    "equity derivatives desk.\n"
    "park with his mom.\n"
    "thermodynamic entropy of gas.\n"
    "The cat was very\n"
    "0\n"
    "happy.\n"
    "bureaucratic.\n"
    "geopolitical.\n"
    "amortized.\n";

std::vector<std::string> stories_eval(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {test::tool("sq-eval"), "-m", test::stories_model(), "--tokenizer", test::stories_tokenizer(), "-q"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(HellaswagCli, ScoresAFileAndWritesTheJson) {
  test::ScratchDir dir;
  const std::string tasks = dir.file("hs.txt"), json = dir.file("hs.json");
  test::write_file(tasks, kStoryTasks);
  const test::ProcessResult r =
      test::run_process(stories_eval({"--task", "hellaswag", tasks, "--json", json, "--json-tasks", "-t", "2"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("accuracy  1.0000"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j["accuracy"].get<double>(), 1.0);
  EXPECT_EQ(j["accuracy_stderr"].get<double>(), 0.0);
  EXPECT_EQ(j["tasks_scored"].get<int>(), 3);
  ASSERT_EQ(j["tasks"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& t = j["tasks"][size_t(i)];
    EXPECT_EQ(t["index"].get<int>(), i);
    EXPECT_EQ(t["choice"].get<int>(), t["gold"].get<int>());
    EXPECT_TRUE(t["correct"].get<bool>());
    ASSERT_EQ(t["scores"].size(), 4u);
    for (const auto& x : t["scores"]) EXPECT_LT(x.get<double>(), 0.0);
  }
  // --tasks 2 (llama.cpp's --hellaswag-tasks spelling) scores the first two tasks alike.
  const test::ProcessResult two = test::run_process(
      stories_eval({"--hellaswag", "-f", tasks, "--hellaswag-tasks", "2", "--json", "-", "--json-tasks"}));
  ASSERT_EQ(two.exit_status, 0) << two.err;
  const nlohmann::json k = nlohmann::json::parse(two.out);
  EXPECT_EQ(k["tasks_scored"].get<int>(), 2);
  for (int i = 0; i < 2; ++i)
    for (size_t e = 0; e < 4; ++e)  // batched with 2 tasks instead of 3: GEMMs over other row counts
      EXPECT_NEAR(k["tasks"][size_t(i)]["scores"][e].get<double>(), j["tasks"][size_t(i)]["scores"][e].get<double>(), 2e-5);
  // Quality gates: an accuracy of 1 passes --min-accuracy 1; the reference (itself) drops nothing.
  const test::ProcessResult gate = test::run_process(stories_eval(
      {"--task", "hellaswag", tasks, "--min-accuracy", "1", "--reference-model", test::stories_model(),
            "--max-accuracy-drop", "0", "--max-kld", "0"}));
  EXPECT_EQ(gate.exit_status, 0) << gate.err;
  EXPECT_NE(gate.out.find("0 of 3 tasks differ"), std::string::npos) << gate.out;
}

TEST(HellaswagCli, BrokenGateExitsThree) {
  test::ScratchDir dir;
  const std::string tasks = dir.file("hs.txt");
  std::string swapped = kStoryTasks;  // task 0's gold label now names a word-salad ending
  swapped.replace(swapped.find("\n1\n"), 3, "\n0\n");
  test::write_file(tasks, swapped);
  const test::ProcessResult r = test::run_process(stories_eval({"--task", "hellaswag", tasks, "--min-accuracy", "0.9"}));
  EXPECT_EQ(r.exit_status, 3) << r.err;
  EXPECT_NE(r.err.find("--min-accuracy 0.9: the accuracy is 0.6667"), std::string::npos) << r.err;
}

TEST(HellaswagCli, BadInputIsOneLineAndExitTwo) {
  test::ScratchDir dir;
  const std::string tasks = dir.file("hs.txt"), json = dir.file("out.json");
  std::string bad = kStoryTasks;
  bad.replace(bad.find("\n2\n"), 3, "\n7\n");
  test::write_file(tasks, bad);
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks, "--json", json})),
                              tasks + ":8: task 1: the gold label must be 0, 1, 2 or 3, got '7'", json);
  test::write_file(tasks, std::string(kStoryTasks).substr(0, std::string(kStoryTasks).rfind("amortized.")));
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks})),
                              tasks + ":13: task 2 is incomplete");
  test::write_file(tasks, "");
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks})), "the file is empty");
  test::write_file(tasks, kStoryTasks);
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks, "--tasks", "0"})),
                              "--tasks must be at least 1");
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "winogrande", tasks})),
                              "the only task is 'hellaswag'");
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks, "-c", "64"})),
                              "--ctx does not apply to --task hellaswag");
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag", tasks, "--max-accuracy-drop", "0.1"})),
                              "--max-accuracy-drop needs --reference-model");
  test::expect_one_line_exit2(test::run_process(stories_eval({"-f", tasks, "--tasks", "5"})),
                              "--tasks needs --task hellaswag");
  test::expect_one_line_exit2(test::run_process(stories_eval({"--task", "hellaswag"})),
                              "--task hellaswag needs the task file");
}

}  // namespace
}  // namespace sq
