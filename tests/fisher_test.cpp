// K/V Fisher information (calib/fisher.h, sq-calibrate --fisher): the token selection is uniform,
// capped, sorted and deterministic; the stored K/V rows are what an ActivationObserver sees and the
// stored weights are the squared gradients of lib/model/decoder_backward.h; the result does not depend
// on the thread count; and the CLI writes a file whose Fisher data reads back equal to an
// in-process run.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "calib/fisher.h"
#include "calib/window_sampler.h"
#include "core/checkpoint.h"
#include "formats/calibration_h5.h"
#include "formats/llama2c_checkpoint.h"
#include "formats/tokenizer.h"
#include "model/decoder_backward.h"
#include "model/decoder.h"
#include "tests/support/process.h"
#include "tests/support/test_data.h"
#include "ops/library_threads.h"

namespace sq {
namespace {

std::string train_text() { return test::shared_data("tinystories/tinystories-train-2MiB.txt"); }

TEST(FisherTokens, SelectionIsCappedSortedAndDeterministic) {
  // 10 windows of 9 tokens: 10·8 = 80 candidates (position 8, the last, never).
  const auto a = select_fisher_tokens(10, 9, 20, 42);
  ASSERT_EQ(a.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].position, 0);
    EXPECT_LE(a[i].position, 7);
    EXPECT_GE(a[i].window, 0);
    EXPECT_LE(a[i].window, 9);
    if (i > 0) {
      EXPECT_LT(std::make_pair(a[i - 1].window, a[i - 1].position), std::make_pair(a[i].window, a[i].position));
    }
  }
  const auto b = select_fisher_tokens(10, 9, 20, 42), c = select_fisher_tokens(10, 9, 20, 43);
  auto same = [](const std::vector<FisherToken>& x, const std::vector<FisherToken>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].window != y[i].window || x[i].position != y[i].position) return false;
    return true;
  };
  EXPECT_TRUE(same(a, b));
  EXPECT_FALSE(same(a, c));
  // A cap at or above the candidates keeps all of them, in order.
  const auto all = select_fisher_tokens(10, 9, 1000, 42);
  ASSERT_EQ(all.size(), 80u);
  for (int i = 0; i < 80; ++i) {
    EXPECT_EQ(all[size_t(i)].window, i / 8);
    EXPECT_EQ(all[size_t(i)].position, i % 8);
  }
  EXPECT_THROW(select_fisher_tokens(0, 9, 20, 1), std::invalid_argument);
  EXPECT_THROW(select_fisher_tokens(10, 1, 20, 1), std::invalid_argument);
  EXPECT_THROW(select_fisher_tokens(10, 9, 0, 1), std::invalid_argument);
}

TEST(FisherTokens, SelectionIsUniform) {
  // Each of the 80 candidates is kept with probability 20/80 = 1/4 per seed. Over 2,000 seeds its
  // count is Binomial(2000, 1/4): mean 500, σ = 19.4; ±6σ = ±116 makes a false failure over the 80
  // candidates ~1e−7 likely. Position 0 (attention sinks) and window 0 get no special treatment.
  std::vector<int> count(80, 0);
  for (uint64_t seed = 0; seed < 2000; ++seed)
    for (const FisherToken& t : select_fisher_tokens(10, 9, 20, seed)) ++count[size_t(t.window * 8 + t.position)];
  for (int i = 0; i < 80; ++i) {
    EXPECT_GT(count[size_t(i)], 500 - 116) << "candidate " << i;
    EXPECT_LT(count[size_t(i)], 500 + 116) << "candidate " << i;
  }
}

/// Records the pre-RoPE keys and values Decoder::forward shows an observer: [layer] → [n, kvw].
class KVRecorder final : public ActivationObserver {
 public:
  explicit KVRecorder(int layers) : k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers)) {}
  void on_kv(int layer, const float* kp, const float* vp, int64_t n, int64_t width) override {
    k[static_cast<size_t>(layer)].assign(kp, kp + n * width);
    v[static_cast<size_t>(layer)].assign(vp, vp + n * width);
  }
  std::vector<std::vector<float>> k, v;
};

class KVFisher : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ck_ = new Checkpoint(load_llama2c_checkpoint(test::stories_model()));
    model_ = new Decoder(Decoder::from_checkpoint(*ck_));
    auto tok = load_tokenizer(test::stories_tokenizer());
    windows_ = new std::vector<std::vector<int32_t>>(sample_calibration_windows(train_text(), *tok, 6, 64, 11));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ck_;
    delete windows_;
  }
  static Checkpoint* ck_;
  static Decoder* model_;
  static std::vector<std::vector<int32_t>>* windows_;
};
Checkpoint* KVFisher::ck_ = nullptr;
Decoder* KVFisher::model_ = nullptr;
std::vector<std::vector<int32_t>>* KVFisher::windows_ = nullptr;

TEST_F(KVFisher, StoredRowsAreObserverKVAndSquaredGradients) {
  // One thread: collect_kv_fisher runs windows in parallel (one thread per BLAS call), kv_gradients
  // below runs one window with all threads per call, and the rows are compared bit for bit; some
  // OpenBLAS kernels' bits depend on the threads of a call (ops/library_threads.h).
  const sq::ops::ScopedOmpThreads one_thread(1);
  const ModelConfig& c = model_->config();
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim;
  const KVFisherResult r = collect_kv_fisher(*model_, *windows_, 100, 11);  // 100 of 6·63 = 378 candidates
  ASSERT_EQ(r.layers.size(), size_t(c.n_layers));
  const auto kept = select_fisher_tokens(6, 64, 100, 11);
  double loss_sum = 0;
  int rows_checked = 0;
  for (int64_t w = 0; w < 6; ++w) {
    const auto& win = (*windows_)[size_t(w)];
    KVCache cache(c, 64);
    Workspace ws;
    KVRecorder rec(c.n_layers);
    model_->forward(win.data(), 64, cache, ws, nullptr, LogitsFor::None, &rec);
    const KVGradients g = kv_gradients(*model_, win.data(), 64);
    loss_sum += g.loss;
    for (int l = 0; l < c.n_layers; ++l) {
      const KVFisherSamples& s = r.layers[size_t(l)];
      ASSERT_EQ(s.tokens, 100);
      ASSERT_EQ(s.width, kvw);
      ASSERT_EQ(s.keys.size(), size_t(100 * kvw));
      const auto& a = g.layers[size_t(l)];
      // Observer K/V: a forward with fast_exp vs this module's std::exp (decoder_backward_test bounds
      // the difference at 1e−5 of the tensor's largest value; layer 0 is identical).
      double kmax = 0, vmax = 0;
      for (float x : rec.k[size_t(l)]) kmax = std::max(kmax, double(std::fabs(x)));
      for (float x : rec.v[size_t(l)]) vmax = std::max(vmax, double(std::fabs(x)));
      for (int64_t row = 0; row < 100; ++row) {
        EXPECT_EQ(s.windows[size_t(row)], kept[size_t(row)].window);
        EXPECT_EQ(s.positions[size_t(row)], kept[size_t(row)].position);
        if (s.windows[size_t(row)] != w) continue;
        const int64_t t = s.positions[size_t(row)];
        ASSERT_LE(t, 62);
        for (int64_t j = 0; j < kvw; ++j) {
          const size_t at = size_t(row * kvw + j), src = size_t(t * kvw + j);
          EXPECT_NEAR(s.keys[at], rec.k[size_t(l)][src], 1e-5 * kmax);
          EXPECT_NEAR(s.values[at], rec.v[size_t(l)][src], 1e-5 * vmax);
          // The same FP32 computation (this window alone vs. inside collect_kv_fisher): equal.
          EXPECT_EQ(s.keys[at], a.keys[src]);
          EXPECT_EQ(s.keys_fisher[at], a.d_keys[src] * a.d_keys[src]);
          EXPECT_EQ(s.values_fisher[at], a.d_values[src] * a.d_values[src]);
        }
        if (l == 0) ++rows_checked;
      }
    }
  }
  EXPECT_EQ(rows_checked, 100);
  EXPECT_DOUBLE_EQ(r.mean_loss, loss_sum / 6);
  // Some weights must be non-zero and every one finite and ≥ 0.
  double total = 0;
  for (float f : r.layers[0].keys_fisher) {
    EXPECT_TRUE(std::isfinite(f) && f >= 0);
    total += f;
  }
  EXPECT_GT(total, 0.0);
}

TEST_F(KVFisher, OneWindowUncappedSumsTheBackwardsSquaredGradients) {
  const std::vector<std::vector<int32_t>> one(windows_->begin(), windows_->begin() + 1);
  const KVFisherResult r = collect_kv_fisher(*model_, one, 1000, 3);
  const KVGradients g = kv_gradients(*model_, one[0].data(), 64);
  for (size_t l = 0; l < r.layers.size(); ++l) {
    const KVFisherSamples& s = r.layers[l];
    ASSERT_EQ(s.tokens, 63);  // every position but the last
    for (int i = 0; i < 63; ++i) EXPECT_EQ(s.positions[size_t(i)], i);
    double fk = 0, fv = 0, gk = 0, gv = 0;
    for (size_t i = 0; i < s.keys_fisher.size(); ++i) {
      fk += s.keys_fisher[i];
      fv += s.values_fisher[i];
    }
    for (size_t i = 0; i < g.layers[l].d_keys.size(); ++i) {  // all 64 rows (the last one is 0)
      gk += double(g.layers[l].d_keys[i]) * g.layers[l].d_keys[i];
      gv += double(g.layers[l].d_values[i]) * g.layers[l].d_values[i];
    }
    // Sums of ~2,000 FP32 squares in double vs. of their FP32-rounded squares: relative 1e−6.
    EXPECT_NEAR(fk, gk, 1e-6 * gk) << "layer " << l;
    EXPECT_NEAR(fv, gv, 1e-6 * gv) << "layer " << l;
  }
}

TEST_F(KVFisher, ResultDoesNotDependOnTheThreadCount) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const KVFisherResult one = collect_kv_fisher(*model_, *windows_, 50, 5);
  omp_set_num_threads(std::max(2, saved));
  const KVFisherResult many = collect_kv_fisher(*model_, *windows_, 50, 5);
  omp_set_num_threads(saved);
  for (size_t l = 0; l < one.layers.size(); ++l) {
    EXPECT_EQ(one.layers[l].keys, many.layers[l].keys);
    EXPECT_EQ(one.layers[l].keys_fisher, many.layers[l].keys_fisher);
    EXPECT_EQ(one.layers[l].values_fisher, many.layers[l].values_fisher);
    EXPECT_EQ(one.layers[l].positions, many.layers[l].positions);
  }
  EXPECT_EQ(one.mean_loss, many.mean_loss);
}

TEST(SqCalibrateFisher, WritesFisherDataThatReadsBack) {
  test::ScratchDir dir;
  const std::string out = dir.file("fisher.h5");
  const auto r = test::run_process({test::tool("sq-calibrate"), "-m", test::stories_model(), "--tokenizer",
                                    test::stories_tokenizer(), "-f", train_text(), "--samples", "4", "--seq-len", "64",
                                    "--seed", "9", "--fisher", "--fisher-tokens", "100", "-o", out, "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("Fisher information: 100 tokens x 32 K/V channels per layer"), std::string::npos) << r.out;
  const CalibrationData d = read_calibration_h5(out);
  ASSERT_TRUE(d.has_fisher());
  EXPECT_EQ(d.fisher_max_tokens, 100);
  ASSERT_EQ(d.layers.size(), 5u);

  // The file holds exactly what an in-process run over the same windows gives.
  const Checkpoint ck = load_llama2c_checkpoint(test::stories_model());
  const Decoder model = Decoder::from_checkpoint(ck);
  auto tok = load_tokenizer(test::stories_tokenizer());
  const KVFisherResult ref = collect_kv_fisher(model, sample_calibration_windows(train_text(), *tok, 4, 64, 9), 100, 9);
  EXPECT_EQ(d.fisher_mean_loss, ref.mean_loss);
  for (size_t l = 0; l < 5; ++l) {
    const KVFisherSamples& f = d.layers[l].kv_fisher;
    EXPECT_EQ(f.tokens, 100);
    EXPECT_EQ(f.width, 32);
    EXPECT_EQ(f.keys, ref.layers[l].keys);
    EXPECT_EQ(f.keys_fisher, ref.layers[l].keys_fisher);
    EXPECT_EQ(f.values, ref.layers[l].values);
    EXPECT_EQ(f.values_fisher, ref.layers[l].values_fisher);
    EXPECT_EQ(f.positions, ref.layers[l].positions);
    EXPECT_EQ(f.windows, ref.layers[l].windows);
  }

  // Without --fisher the file has no Fisher data.
  const std::string plain = dir.file("plain.h5");
  const auto p = test::run_process({test::tool("sq-calibrate"), "-m", test::stories_model(), "--tokenizer",
                                    test::stories_tokenizer(), "-f", train_text(), "--samples", "2", "--seq-len", "32", "-o",
                                    plain, "-q"});
  ASSERT_EQ(p.exit_status, 0) << p.err;
  EXPECT_FALSE(read_calibration_h5(plain).has_fisher());

  // Bad options: one line on stderr, exit 2, no output file.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--fisher", "--fisher-tokens", "0"}, std::vector<std::string>{"--fisher-tokens", "10"}}) {
    const std::string bad = dir.file("bad.h5");
    std::vector<std::string> argv = {test::tool("sq-calibrate"), "-m", test::stories_model(), "--tokenizer",
                                     test::stories_tokenizer(), "-f", train_text(), "--samples", "2", "--seq-len", "32",
                                     "-o", bad, "-q"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto e = test::run_process(argv);
    EXPECT_EQ(e.exit_status, 2) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
    EXPECT_NE(e.err.find("--fisher-tokens"), std::string::npos) << e.err;
    EXPECT_FALSE(std::filesystem::exists(bad));
  }
  const auto help = test::run_process({test::tool("sq-calibrate"), "--help"});
  EXPECT_NE(help.out.find("--fisher-tokens"), std::string::npos);
}

}  // namespace
}  // namespace sq
