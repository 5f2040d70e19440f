#include "calib/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <omp.h>

#include "calib/window_runner.h"
#include "core/error.h"
#include "eval/kl_divergence.h"
#include "runtime/kv_cache.h"

namespace sq {

namespace {

/// A linear owned elsewhere (the FP32 model's), lent to a layer copy for one measurement.
class BorrowedLinear final : public Linear {
 public:
  explicit BorrowedLinear(const Linear& l) : l_(l) {}
  int64_t in_features() const override { return l_.in_features(); }
  int64_t out_features() const override { return l_.out_features(); }
  void forward(const float* x, int64_t n, float* y) const override { l_.forward(x, n, y); }
  std::string format() const override { return l_.format(); }
  int64_t weight_bytes() const override { return 0; }  // counted by its owner

 private:
  const Linear& l_;
};

/// Checks the windows before any parallel region (an exception must not leave one): at least one,
/// each of 2 … max_seq_len tokens with ids in the vocabulary. `who` names the caller.
void check_windows(const ModelConfig& c, const std::vector<std::vector<int32_t>>& windows, const char* who) {
  if (windows.empty()) throw std::invalid_argument(std::string(who) + ": no calibration windows");
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto& t = windows[w];
    if (t.size() < 2) throw std::invalid_argument(std::string(who) + ": a window of " + std::to_string(t.size()) + " tokens (need ≥ 2)");
    if (static_cast<int64_t>(t.size()) > c.max_seq_len)
      throw std::length_error(std::string(who) + ": window " + std::to_string(w) + " of " + std::to_string(t.size()) +
                              " tokens exceeds the model's context of " + std::to_string(c.max_seq_len));
    for (int32_t id : t)
      if (id < 0 || id >= c.vocab_size)
        throw std::out_of_range(std::string(who) + ": token id " + std::to_string(id) + " in window " + std::to_string(w) +
                                " is outside the vocabulary of " + std::to_string(c.vocab_size));
  }
}

/// One calibration window through the FP32 model: every layer's input and the logits of
/// positions 0 … n−2.
struct ReferenceWindow {
  std::vector<std::vector<float>> inputs;  ///< [n_layers][n·dim]
  std::vector<float> logits;               ///< [(n − 1)·vocab]
};

/// Runs layers l0 … n_layers−1 over x [n, dim] in place, layer l with weights layer_at(l), then
/// writes the logits of rows 0 … n−2 into `logits`. With `keep`, stores each layer's input in
/// (*keep)[l].
void run_tail(const Decoder& model, int l0, const std::function<const DecoderLayer&(int)>& layer_at, std::vector<float>& x, int64_t n,
              float* logits, std::vector<std::vector<float>>* keep = nullptr) {
  const ModelConfig& c = model.config();
  KVCache cache(c, n);
  Workspace ws;
  for (int l = l0; l < c.n_layers; ++l) {
    if (keep) (*keep)[size_t(l)] = x;
    model.forward_layer(l, layer_at(l), x.data(), n, cache, ws);
  }
  model.project(x.data(), n - 1, logits);
}

/// Σ over positions p = 0 … n−2 of window `t` of the KLD of `test` against `ref` (logits [n − 1, V]).
double window_kld_sum(const float* ref, const float* test, int64_t V, const std::vector<int32_t>& t) {
  double sum = 0;
  for (int64_t p = 0; p + 2 <= static_cast<int64_t>(t.size()); ++p)
    sum += compare_token_logits(ref + p * V, test + p * V, static_cast<int>(V), t[size_t(p + 1)]).kld;
  return sum;
}

/// The per-window sums in window order (deterministic for any thread count) over every scored
/// position; throws InputError starting with `what` when the mean is not finite.
double mean_kld(const std::vector<double>& per_window, const std::vector<std::vector<int32_t>>& windows, const std::string& what) {
  int64_t scored = 0;
  for (const auto& t : windows) scored += static_cast<int64_t>(t.size()) - 1;
  const double kld = std::accumulate(per_window.begin(), per_window.end(), 0.0) / double(scored);
  if (!std::isfinite(kld)) throw InputError(what + " is not finite (a non-finite logit)");
  return kld;
}

}  // namespace

std::vector<double> single_linear_kld(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                      const std::vector<LinearSlot>& slots,
                                      const std::function<std::unique_ptr<Linear>(const LinearSlot&)>& replacement,
                                      const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  check_windows(c, windows, "single_linear_kld");
  const int64_t V = c.vocab_size, W = static_cast<int64_t>(windows.size());
  // Small models run one window per thread (their ops are too small to split), as the layer-wise
  // calibration does (calib/window_runner.h); results do not depend on the order.
  const int threads = runs_windows_in_parallel(c) ? omp_get_max_threads() : 1;

  const auto fp32_layer = [&](int l) -> const DecoderLayer& { return model.layers()[size_t(l)]; };
  std::vector<ReferenceWindow> ref(windows.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && W > 1)
  for (int64_t w = 0; w < W; ++w) {
    const std::vector<int32_t>& t = windows[size_t(w)];
    const int64_t n = static_cast<int64_t>(t.size());
    ReferenceWindow& r = ref[size_t(w)];
    r.inputs.resize(size_t(c.n_layers));
    r.logits.resize(size_t((n - 1) * V));
    std::vector<float> x(size_t(n * c.dim));
    model.embed(t.data(), n, x.data());
    run_tail(model, 0, fp32_layer, x, n, r.logits.data(), &r.inputs);
  }

  std::vector<double> kld(slots.size(), 0.0);
  for (size_t i = 0; i < slots.size(); ++i) {
    const LinearSlot& s = slots[i];
    const DecoderLayer& fp32 = model.layers().at(size_t(s.layer));
    DecoderLayer layer = copy_layer_tensors(c, s.layer, fp32);
    for (const LinearSlot& t : decoder_layer_linears(c, s.layer)) {
      const Linear* lin = linear_of(fp32, t);
      if (t.name == s.name) linear_slot(layer, t) = replacement(s);
      else if (lin) linear_slot(layer, t) = std::make_unique<BorrowedLinear>(*lin);
    }
    std::vector<double> per_window(windows.size(), 0.0);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && W > 1)
    for (int64_t w = 0; w < W; ++w) {
      const std::vector<int32_t>& t = windows[size_t(w)];
      const int64_t n = static_cast<int64_t>(t.size());
      const ReferenceWindow& r = ref[size_t(w)];
      std::vector<float> x = r.inputs[size_t(s.layer)];
      std::vector<float> logits(size_t((n - 1) * V));
      run_tail(model, s.layer, [&](int l) -> const DecoderLayer& { return l == s.layer ? layer : fp32_layer(l); }, x, n, logits.data());
      per_window[size_t(w)] = window_kld_sum(r.logits.data(), logits.data(), V, t);
    }
    kld[i] = mean_kld(per_window, windows, s.name + ": the model's KL divergence with this linear replaced");
    if (progress) progress(int64_t(i) + 1, int64_t(slots.size()));
  }
  return kld;
}

double replaced_model_kld(const Decoder& model, const std::vector<std::vector<int32_t>>& windows, const std::vector<LinearSlot>& slots,
                          const std::function<std::unique_ptr<Linear>(const LinearSlot&)>& replacement) {
  const ModelConfig& c = model.config();
  check_windows(c, windows, "replaced_model_kld");
  // The replaced layers: every linear borrowed from the FP32 layer except those in `slots`.
  std::vector<DecoderLayer> layers;
  layers.reserve(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& fp32 = model.layers()[size_t(l)];
    layers.push_back(copy_layer_tensors(c, l, fp32));
    for (const LinearSlot& t : decoder_layer_linears(c, l))
      if (const Linear* lin = linear_of(fp32, t)) linear_slot(layers.back(), t) = std::make_unique<BorrowedLinear>(*lin);
  }
  for (const LinearSlot& s : slots) linear_slot(layers.at(size_t(s.layer)), s) = replacement(s);
  const int64_t V = c.vocab_size, W = static_cast<int64_t>(windows.size());
  const int threads = runs_windows_in_parallel(c) ? omp_get_max_threads() : 1;
  std::vector<double> per_window(windows.size(), 0.0);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && W > 1)
  for (int64_t w = 0; w < W; ++w) {
    const std::vector<int32_t>& t = windows[size_t(w)];
    const int64_t n = static_cast<int64_t>(t.size());
    std::vector<float> ref(size_t((n - 1) * V)), test(size_t((n - 1) * V));
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<float> x(size_t(n * c.dim));
      model.embed(t.data(), n, x.data());
      run_tail(model, 0, [&](int l) -> const DecoderLayer& { return pass == 0 ? model.layers()[size_t(l)] : layers[size_t(l)]; }, x, n,
               (pass == 0 ? ref : test).data());
    }
    per_window[size_t(w)] = window_kld_sum(ref.data(), test.data(), V, t);
  }
  const double kld = mean_kld(per_window, windows, "the model's KL divergence with its linears replaced");
  return kld;
}

PrecisionAssignment assign_precision(const std::vector<PrecisionCandidate>& cand, const PrecisionBudget& budget) {
  if ((budget.bits_per_weight > 0) == (budget.max_kld > 0))
    throw UsageError("mixed precision needs exactly one budget: --bits-per-weight B or --max-kld X (both positive)");
  double weights = 0, bits = 0, kld = 0, bits_all_high = 0, kld_all_high = 0;
  for (const PrecisionCandidate& p : cand) {
    if (p.weights <= 0 || !(p.bits_high > p.bits_low))
      throw std::invalid_argument("assign_precision: candidate '" + p.name + "' needs weights > 0 and bits_high > bits_low");
    weights += double(p.weights);
    bits += p.bits_low * double(p.weights);
    bits_all_high += p.bits_high * double(p.weights);
    kld += p.kld_low;
    kld_all_high += p.kld_high;
  }
  PrecisionAssignment a;
  a.high.assign(cand.size(), false);
  if (cand.empty()) return a;
  if (budget.bits_per_weight > 0 && budget.bits_per_weight * weights < bits * (1 - 1e-12))
    throw UsageError("--bits-per-weight " + std::to_string(budget.bits_per_weight) + " is below the scheme's own " +
                     std::to_string(bits / weights) + " bits per weight (every linear in the low format)");
  if (budget.max_kld > 0 && kld_all_high > budget.max_kld)
    throw UsageError("--max-kld " + std::to_string(budget.max_kld) + " is below the estimate with every linear in the 8-bit format (" +
                     std::to_string(kld_all_high) + ")");
  std::vector<size_t> order(cand.size());
  std::iota(order.begin(), order.end(), size_t(0));
  const auto gain = [&](size_t i) {
    const PrecisionCandidate& p = cand[i];
    return (p.kld_low - p.kld_high) / ((p.bits_high - p.bits_low) * double(p.weights));
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return gain(x) > gain(y); });
  const double bits_cap = budget.bits_per_weight * weights;
  for (size_t i : order) {
    if (budget.max_kld > 0 && kld <= budget.max_kld) break;
    const PrecisionCandidate& p = cand[i];
    if (!(p.kld_low > p.kld_high)) continue;  // the move saves nothing
    const double extra = (p.bits_high - p.bits_low) * double(p.weights);
    if (budget.bits_per_weight > 0 && bits + extra > bits_cap) continue;
    a.high[i] = true;
    bits += extra;
    kld += p.kld_high - p.kld_low;
  }
  a.bits_per_weight = bits / weights;
  a.estimated_kld = kld;
  return a;
}

CheckedAssignment assign_precision_checked(const std::vector<PrecisionCandidate>& cand, const PrecisionBudget& budget,
                                           const std::function<double(const PrecisionAssignment&)>& measure) {
  CheckedAssignment r;
  r.assignment = assign_precision(cand, budget);
  r.measured_kld = measure(r.assignment);
  r.rounds = 1;
  PrecisionBudget b = budget;
  while (budget.max_kld > 0 && r.measured_kld > budget.max_kld) {
    const PrecisionAssignment all = assign_precision(cand, {1e9, 0});  // every move that saves KLD
    if (r.assignment.high == all.high || r.rounds == 8)
      throw UsageError("--max-kld " + std::to_string(budget.max_kld) + " is not met on the calibration windows: " +
                       std::to_string(r.measured_kld) + " with " +
                       std::to_string(std::count(r.assignment.high.begin(), r.assignment.high.end(), true)) + " of " +
                       std::to_string(cand.size()) + " linears in the high format");
    b.max_kld *= budget.max_kld / r.measured_kld;
    try {
      r.assignment = assign_precision(cand, b);
    } catch (const UsageError&) {  // the scaled budget is below the all-high estimate
      r.assignment = all;
    }
    r.measured_kld = measure(r.assignment);
    ++r.rounds;
  }
  return r;
}

}  // namespace sq
