// Mixed precision from measured sensitivity (calib/mixed_precision.h, issue #36 item 3): the
// single-linear KLD equals the KLD of the whole model run with that linear replaced (an
// independent path: Decoder::forward on a modified copy), the greedy assignment equals the brute-
// force optimum where greedy is exact (equal sizes), and sq-convert --bits-per-weight / --max-kld
// write the assignment they print, within the budget, with every bad input refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "calib/mixed_precision.h"
#include "core/error.h"
#include "eval/kl_divergence.h"
#include "model/model_loader.h"
#include "model/w4a16_linear.h"
#include "quant/int4_quantize.h"
#include "runtime/kv_cache.h"
#include "tests/support/cli.h"
#include "tests/support/process.h"
#include "tests/support/scheme_cli_fixture.h"
#include "tests/support/test_data.h"
#include "tests/support/token_windows.h"

namespace sq::test {
namespace {

/// The W4A16 (g32, symmetric, min/max) replacement of an FP32 linear.
std::unique_ptr<Linear> int4_of(const Linear& l) {
  const auto& d = dynamic_cast<const DenseLinear&>(l);
  return std::make_unique<W4A16Linear>(quantize_int4(d.weight().data(), d.weight().dim(0), d.weight().dim(1), 32, false), d.bias());
}

/// The mean KLD over positions 0 … n−2 of `test` against `ref`, each window run whole by forward().
double whole_model_kld(const Decoder& ref, const Decoder& test, const std::vector<std::vector<int32_t>>& windows) {
  const int64_t V = ref.config().vocab_size;
  double sum = 0;
  int64_t count = 0;
  for (const auto& w : windows) {
    const int64_t n = int64_t(w.size());
    std::vector<float> a(size_t(n * V)), b(size_t(n * V));
    KVCache ca(ref.config(), n), cb(test.config(), n);
    Workspace wa, wb;
    ref.forward(w.data(), n, ca, wa, a.data(), LogitsFor::AllTokens);
    test.forward(w.data(), n, cb, wb, b.data(), LogitsFor::AllTokens);
    for (int64_t p = 0; p + 1 < n; ++p, ++count) sum += compare_token_logits(a.data() + p * V, b.data() + p * V, int(V), w[size_t(p + 1)]).kld;
  }
  return sum / double(count);
}

TEST(MixedPrecision, SingleLinearKldEqualsTheWholeModelWithThatLinearReplaced) {
  const LoadedModel ref = load_model(stories_model());
  const ModelConfig& c = ref.model->config();
  const auto windows = random_token_windows(2, 48, c.vocab_size, 7);
  // q of the first layer, v of a middle one, down of the last: the tail re-run starts at each.
  std::vector<LinearSlot> slots;
  for (const LinearSlot& s : decoder_layer_linears(c, 0))
    if (s.role == LinearRole::Q) slots.push_back(s);
  for (const LinearSlot& s : decoder_layer_linears(c, c.n_layers / 2))
    if (s.role == LinearRole::V) slots.push_back(s);
  for (const LinearSlot& s : decoder_layer_linears(c, c.n_layers - 1))
    if (s.role == LinearRole::Down) slots.push_back(s);
  ASSERT_EQ(slots.size(), 3u);
  int64_t calls = 0;
  const std::vector<double> kld = single_linear_kld(
      *ref.model, windows, slots, [&](const LinearSlot& s) { return int4_of(*linear_of(ref.model->layers()[size_t(s.layer)], s)); },
      [&](int64_t done, int64_t total) {
        EXPECT_EQ(done, ++calls);
        EXPECT_EQ(total, 3);
      });
  ASSERT_EQ(kld.size(), 3u);
  EXPECT_EQ(calls, 3);
  for (size_t i = 0; i < slots.size(); ++i) {
    LoadedModel test = load_model(stories_model());
    std::unique_ptr<Linear>& p = linear_slot(test.model->mutable_layers()[size_t(slots[i].layer)], slots[i]);
    p = int4_of(*p);
    const double expected = whole_model_kld(*ref.model, *test.model, windows);
    std::printf("%s: single-linear KLD %.8f, whole model %.8f\n", slots[i].name.c_str(), kld[i], expected);
    EXPECT_GT(expected, 0.0);
    // The same layers on the same rows (forward_layer runs what forward runs), so the two differ by
    // the FP32 rounding of the summation order at most: 1e-6 relative.
    EXPECT_NEAR(kld[i], expected, 1e-6 * expected) << slots[i].name;
  }
  // replaced_model_kld (the whole forward per window) agrees with the single-linear figure for one
  // slot, and with the whole-model path for all three at once.
  for (size_t i = 0; i < slots.size(); ++i) {
    const double one = replaced_model_kld(*ref.model, windows, {slots[i]},
                                          [&](const LinearSlot& s) { return int4_of(*linear_of(ref.model->layers()[size_t(s.layer)], s)); });
    EXPECT_NEAR(one, kld[i], 1e-6 * kld[i]) << slots[i].name;
  }
  {
    LoadedModel test = load_model(stories_model());
    for (const LinearSlot& s : slots) {
      std::unique_ptr<Linear>& p = linear_slot(test.model->mutable_layers()[size_t(s.layer)], s);
      p = int4_of(*p);
    }
    const double all = replaced_model_kld(*ref.model, windows, slots,
                                          [&](const LinearSlot& s) { return int4_of(*linear_of(ref.model->layers()[size_t(s.layer)], s)); });
    const double expected = whole_model_kld(*ref.model, *test.model, windows);
    std::printf("three linears at once: %.8f (sum of single-linear KLDs %.8f)\n", all, kld[0] + kld[1] + kld[2]);
    EXPECT_NEAR(all, expected, 1e-6 * expected);
  }
  // An unchanged linear (a copy of the FP32 weights) costs exactly nothing.
  const std::vector<double> zero = single_linear_kld(*ref.model, windows, {slots[1]}, [&](const LinearSlot& s) -> std::unique_ptr<Linear> {
    const auto& d = dynamic_cast<const DenseLinear&>(*linear_of(ref.model->layers()[size_t(s.layer)], s));
    return std::make_unique<DenseLinear>(d.weight(), d.bias());
  });
  EXPECT_EQ(zero.at(0), 0.0);
  EXPECT_THROW(single_linear_kld(*ref.model, {}, slots, nullptr), std::invalid_argument);
  EXPECT_THROW(single_linear_kld(*ref.model, {{1}}, slots, nullptr), std::invalid_argument);
  EXPECT_THROW(single_linear_kld(*ref.model, {{1, c.vocab_size}}, slots, nullptr), std::out_of_range);
  EXPECT_THROW(single_linear_kld(*ref.model, {std::vector<int32_t>(size_t(c.max_seq_len) + 1, 1)}, slots, nullptr), std::length_error);
  EXPECT_THROW(replaced_model_kld(*ref.model, {{1, -1}}, slots, nullptr), std::out_of_range);
  // A replacement whose outputs are NaN is named, not ranked.
  const auto nan_linear = [&](const LinearSlot& s) -> std::unique_ptr<Linear> {
    const auto& d = dynamic_cast<const DenseLinear&>(*linear_of(ref.model->layers()[size_t(s.layer)], s));
    Tensor w = d.weight().clone();  // Tensor copies share storage
    w.mutable_data()[0] = std::nanf("");
    return std::make_unique<DenseLinear>(w, d.bias());
  };
  try {
    single_linear_kld(*ref.model, windows, {slots[0]}, nan_linear);
    ADD_FAILURE() << "no error for a NaN linear";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(slots[0].name), std::string::npos) << e.what();
  }
}

/// Twelve equal-size candidates with KLD savings in a random order.
std::vector<PrecisionCandidate> equal_candidates() {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.001, 0.05);
  std::vector<PrecisionCandidate> c(12);
  for (size_t i = 0; i < c.size(); ++i) {
    c[i].name = "linear" + std::to_string(i);
    c[i].weights = 1000;
    c[i].bits_low = 4.5;
    c[i].bits_high = 8.032;
    c[i].kld_low = u(rng);
    c[i].kld_high = c[i].kld_low * 0.01;
  }
  return c;
}

/// Σ KLD of the subset `mask` in the high format.
double kld_of(const std::vector<PrecisionCandidate>& c, unsigned mask) {
  double k = 0;
  for (size_t i = 0; i < c.size(); ++i) k += (mask >> i & 1u) ? c[i].kld_high : c[i].kld_low;
  return k;
}

TEST(MixedPrecision, GreedyAssignmentIsTheBruteForceOptimumForEqualSizes) {
  // With equal sizes and bits every move costs the same, so the best k moves are the k largest
  // savings: greedy is exact, and the brute force over all 4,096 subsets must agree.
  const auto c = equal_candidates();
  const double step = (8.032 - 4.5) / 12.0;
  for (int k = 0; k <= 12; ++k) {
    const PrecisionAssignment a = assign_precision(c, {4.5 + k * step + 1e-9, 0});
    double best = 1e9;
    for (unsigned m = 0; m < (1u << 12); ++m)
      if (__builtin_popcount(m) <= k) best = std::min(best, kld_of(c, m));
    EXPECT_EQ(std::count(a.high.begin(), a.high.end(), true), k);
    EXPECT_NEAR(a.estimated_kld, best, 1e-12) << k;
    EXPECT_LE(a.bits_per_weight, 4.5 + k * step + 1e-9);
  }
  // A KLD budget: the fewest moves whose estimate is within it (brute force), and within it.
  double all_low = kld_of(c, 0);
  for (double frac : {0.9, 0.5, 0.2, 0.05}) {
    const double budget = all_low * frac;
    const PrecisionAssignment a = assign_precision(c, {0, budget});
    int fewest = 13;
    for (unsigned m = 0; m < (1u << 12); ++m)
      if (kld_of(c, m) <= budget) fewest = std::min(fewest, __builtin_popcount(m));
    EXPECT_EQ(std::count(a.high.begin(), a.high.end(), true), fewest) << frac;
    EXPECT_LE(a.estimated_kld, budget);
  }
}

TEST(MixedPrecision, CheckedAssignmentTightensUntilTheMeasuredKldIsWithinBudget) {
  // A measurement 30% above the additive estimate (interacting perturbations): the first
  // assignment misses the budget, later rounds move more linears until the measurement is within.
  const auto c = equal_candidates();
  const double budget = kld_of(c, 0) * 0.5;
  const auto measure = [](const PrecisionAssignment& a) { return a.estimated_kld * 1.3; };
  const CheckedAssignment r = assign_precision_checked(c, {0, budget}, measure);
  EXPECT_GT(r.rounds, 1);
  EXPECT_LE(r.measured_kld, budget);
  EXPECT_EQ(r.measured_kld, r.assignment.estimated_kld * 1.3);
  EXPECT_GT(assign_precision(c, {0, budget}).estimated_kld * 1.3, budget);  // the first round alone misses it
  // A bits budget is measured once and kept.
  const CheckedAssignment bits = assign_precision_checked(c, {6.0, 0}, measure);
  EXPECT_EQ(bits.rounds, 1);
  EXPECT_EQ(bits.assignment.high, assign_precision(c, {6.0, 0}).high);
  // A measurement no assignment brings within the budget is refused, naming --max-kld.
  EXPECT_THROW(assign_precision_checked(c, {0, budget}, [](const PrecisionAssignment&) { return 1.0; }), UsageError);
}

TEST(MixedPrecision, BadBudgetsAreRefused) {
  const auto c = equal_candidates();
  EXPECT_THROW(assign_precision(c, {0, 0}), UsageError);
  EXPECT_THROW(assign_precision(c, {6, 0.1}), UsageError);
  EXPECT_THROW(assign_precision(c, {4.4, 0}), UsageError);     // below every linear at 4.5 bits
  EXPECT_THROW(assign_precision(c, {0, 1e-6}), UsageError);   // below every linear at 8 bits
  auto bad = c;
  bad[3].bits_high = bad[3].bits_low;
  EXPECT_THROW(assign_precision(bad, {6, 0}), std::invalid_argument);
  // Every linear in the high format is exactly the high format's bits.
  const PrecisionAssignment all = assign_precision(c, {8.032, 0});
  EXPECT_EQ(std::count(all.high.begin(), all.high.end(), true), 12);
  EXPECT_NEAR(all.bits_per_weight, 8.032, 1e-12);
}

constexpr char kMixedScheme[] = "w4a16";
using MixedCli = SchemeCliTest<kMixedScheme>;

nlohmann::json inspect_json(const std::string& f) {
  const auto r = run_process({tool("sq-inspect"), f, "--json", "--tensors"});
  EXPECT_EQ(r.exit_status, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

/// Storage bits per weight of the quantized linears of layers (codes + steps + zero points), from
/// the file's tensor table.
double linear_bits(const nlohmann::json& j, int* int8_linears) {
  double bytes = 0, weights = 0;
  *int8_linears = 0;
  for (const auto& t : j.at("tensors")) {
    const std::string name = t.at("name");
    if (name.rfind("model.layers.", 0) != 0) continue;
    const std::string dt = t.at("dtype");
    const bool weight = name.ends_with(".weight") && (dt == "I8" || dt == "I4x2" || dt == "U4x2");
    if (weight) {
      int64_t n = 1;
      for (const auto& d : t.at("shape")) n *= d.get<int64_t>();
      weights += double(n);
      if (dt == "I8") ++*int8_linears;
    }
    if (weight || name.ends_with(".weight_scale") || name.ends_with(".weight_zero")) bytes += t.at("raw_bytes").get<double>();
  }
  return 8 * bytes / weights;
}

TEST_F(MixedCli, BitsBudgetIsMetAndThePrintedAssignmentIsTheFile) {
  const std::string pure = dir_->file("g32.sqm"), mixed = dir_->file("g32-mixed6.sqm");
  ASSERT_EQ(convert({"--group-size", "32", "--calib", calib()}, pure).exit_status, 0);
  const auto r = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "--scheme", "w4a16",
                              "--group-size", "32", "--calib", calib(), "--bits-per-weight", "6", "-o", mixed, "-q"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto j = inspect_json(mixed);
  const auto q = j.at("header").at("quantization");
  ASSERT_TRUE(q.contains("mixed_precision")) << q;
  const auto& m = q.at("mixed_precision");
  EXPECT_EQ(q.at("int8_activations"), "fp32");
  int int8 = 0;
  const double bits = linear_bits(j, &int8);
  std::printf("stories260K g32 + --bits-per-weight 6: %d INT8 linears, %.4f bits/weight (header %.4f), estimated KLD %.5f\n", int8, bits,
              m.at("bits_per_weight").get<double>(), m.at("estimated_kld").get<double>());
  EXPECT_EQ(int8, m.at("int8_linears").get<int>());
  EXPECT_GT(int8, 0);
  EXPECT_LE(bits, 6.0);
  // The header's figure is the file's arithmetic (codes, FP16 steps, FP32 INT8 row steps).
  EXPECT_NEAR(bits, m.at("bits_per_weight").get<double>(), 1e-9);
  // Every INT8 linear the header names is I8 in the file and printed by sq-convert.
  for (const auto& l : m.at("linears")) {
    const std::string name = l.at("name");
    bool found = false;
    for (const auto& t : j.at("tensors"))
      if (t.at("name") == name + ".weight") {
        found = true;
        EXPECT_EQ(t.at("dtype"), l.at("format") == "int8" ? "I8" : "I4x2") << name;
      }
    EXPECT_TRUE(found) << name;
  }
  const auto shown = run_process({tool("sq-convert"), "-m", stories_model(), "--tokenizer", stories_tokenizer(), "--scheme", "w4a16",
                                  "--group-size", "32", "--calib", calib(), "--bits-per-weight", "6", "-o", mixed, "-q", "--force"});
  ASSERT_EQ(shown.exit_status, 0) << shown.err;
  EXPECT_NE(shown.out.find(std::to_string(int8) + " of "), std::string::npos) << shown.out;
  for (const auto& l : m.at("linears"))
    if (l.at("format") == "int8") EXPECT_NE(shown.out.find(l.at("name").get<std::string>()), std::string::npos) << shown.out;
  // More bits where they matter most lower the perplexity (measured here: see the printout).
  const double fp32 = ppl(stories_model()), p_pure = ppl(pure), p_mixed = ppl(mixed);
  std::printf("stories260K PPL: FP32 %.4f, W4A16 g32 %.4f, mixed 6 bits %.4f\n", fp32, p_pure, p_mixed);
  EXPECT_LT(p_mixed, p_pure);
}

TEST_F(MixedCli, KldBudgetIsMetOnTheCalibrationWindows) {
  const std::string out = dir_->file("g32-kld.sqm");
  const auto r = convert({"--group-size", "32", "--calib", calib(), "--max-kld", "0.01"}, out);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto m = inspect_json(out).at("header").at("quantization").at("mixed_precision");
  // The budget holds for the KLD measured with every linear in its format on the calibration
  // windows (the estimate alone leaves out interactions).
  EXPECT_LE(m.at("calibration_kld").get<double>(), 0.01) << m;
  EXPECT_GE(m.at("assignment_rounds").get<int>(), 1);
  EXPECT_EQ(m.at("budget").at("max_kld"), 0.01);
  double all_low = 0;
  for (const auto& l : m.at("linears")) all_low += l.at("kld_int4").get<double>();
  std::printf("stories260K g32: estimated KLD all 4-bit %.5f, with --max-kld 0.01 %.5f, measured %.5f (%d INT8 linears, %d rounds)\n",
              all_low, m.at("estimated_kld").get<double>(), m.at("calibration_kld").get<double>(), m.at("int8_linears").get<int>(),
              m.at("assignment_rounds").get<int>());
}

TEST_F(MixedCli, SensitivitiesAreReusedFromAnEarlierFile) {
  // One measurement, two budgets: --sensitivity-from copies the recorded KLDs (no windows are run),
  // so the second file's linears carry the first's figures exactly.
  const std::string first = dir_->file("reuse-a.sqm"), second = dir_->file("reuse-b.sqm"), pure = dir_->file("reuse-pure.sqm");
  ASSERT_EQ(convert({"--group-size", "32", "--calib", calib(), "--bits-per-weight", "5"}, first).exit_status, 0);
  const auto r = convert({"--group-size", "32", "--calib", calib(), "--max-kld", "0.02", "--sensitivity-from", first}, second);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto a = inspect_json(first).at("header").at("quantization").at("mixed_precision");
  const auto b = inspect_json(second).at("header").at("quantization").at("mixed_precision");
  ASSERT_EQ(a.at("linears").size(), b.at("linears").size());
  for (size_t i = 0; i < a.at("linears").size(); ++i) {
    EXPECT_EQ(a.at("linears")[i].at("kld_int4"), b.at("linears")[i].at("kld_int4"));
    EXPECT_EQ(a.at("linears")[i].at("kld_int8_estimate"), b.at("linears")[i].at("kld_int8_estimate"));
  }
  EXPECT_EQ(b.at("sensitivity").at("from"), first);
  EXPECT_LE(b.at("calibration_kld").get<double>(), 0.02);
  // Refused: a file without sensitivities, another 4-bit format, and the input as output.
  ASSERT_EQ(convert({"--group-size", "32"}, pure).exit_status, 0);
  const std::string bad = dir_->file("reuse-bad.sqm");
  expect_error(convert({"--group-size", "32", "--calib", calib(), "--max-kld", "0.02", "--sensitivity-from", pure}, bad),
               "records no sensitivities", bad);
  expect_error(convert({"--group-size", "64", "--calib", calib(), "--max-kld", "0.02", "--sensitivity-from", first}, bad),
               "not this conversion's 4-bit format", bad);
}

TEST_F(MixedCli, BadMixedOptionsAreRefused) {
  const std::string bad = dir_->file("bad-mixed.sqm");
  expect_error(convert({"--calib", calib(), "--bits-per-weight", "6", "--max-kld", "0.1"}, bad), "--bits-per-weight and --max-kld exclude each other", bad);
  expect_error(convert({"--group-size", "32", "--calib", calib(), "--bits-per-weight", "4"}, bad), "is below the scheme's own", bad);
  expect_error(convert({"--bits-per-weight", "6"}, bad), "--bits-per-weight needs --calib", bad);
  expect_error(convert({"--calib", calib(), "--bits-per-weight", "-1"}, bad), "--bits-per-weight must be positive", bad);
  expect_error(convert({"--mixed-windows", "4"}, bad), "--mixed-windows / --sensitivity-from need --bits-per-weight or --max-kld", bad);
  expect_error(convert_stories("w8a8", {"--calib", calib(), "--bits-per-weight", "6"}, bad), "they need --scheme w4a16, not w8a8", bad);
}

}  // namespace
}  // namespace sq::test
