#include "eval/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/error.h"
#include "ops/ops.h"

namespace sq {

namespace {
/// log Σ exp(x_i) entirely in double (exp and sum), for the log-softmax of the KL divergence: the
/// PPL's ops::log_sum_exp sums FP32 exponentials (~1e-7 relative), too coarse for KL values of
/// 1e-4 whose terms cancel.
double log_sum_exp_f64(const float* x, int count) {
  double m = x[0];
  for (int i = 1; i < count; ++i) m = std::max(m, double(x[i]));
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += std::exp(double(x[i]) - m);
  return m + std::log(sum);
}
}  // namespace

TokenComparison compare_token_logits(const float* ref, const float* test, int vocab, int32_t target) {
  if (target < 0 || target >= vocab)
    throw InputError("token id " + std::to_string(target) + " is outside the vocabulary of " + std::to_string(vocab));
  const double lse_ref = log_sum_exp_f64(ref, vocab);
  const double lse_test = log_sum_exp_f64(test, vocab);
  double kld = 0;
  int arg_ref = 0, arg_test = 0;
  for (int v = 0; v < vocab; ++v) {
    const double lr = double(ref[v]) - lse_ref;
    const double lt = double(test[v]) - lse_test;
    kld += std::exp(lr) * (lr - lt);
    if (ref[v] > ref[arg_ref]) arg_ref = v;
    if (test[v] > test[arg_test]) arg_test = v;
  }
  TokenComparison c;
  c.kld = kld;
  c.p_ref = std::exp(double(ref[target]) - lse_ref);
  c.p_test = std::exp(double(test[target]) - lse_test);
  // The NLLs exactly as the PPL computes them (ops::log_sum_exp), so both PPLs use one definition.
  c.nll_ref = ops::log_sum_exp(ref, vocab) - ref[target];
  c.nll_test = ops::log_sum_exp(test, vocab) - test[target];
  c.same_top1 = arg_ref == arg_test;
  return c;
}

double percentile_linear(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) throw InputError("percentile of an empty set");
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  const double p = fraction * double(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double f = p - double(i);
  return (1 - f) * sorted[i] + f * sorted[std::min(i + 1, sorted.size() - 1)];
}

std::pair<double, double> mean_and_stderr(double sum, double sum2, int64_t count) {
  if (count < 1) return {0.0, 0.0};
  const double n = double(count);
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  return {mean, var > 0 && count > 10 ? std::sqrt(var / (n - 1)) : 0.0};
}

ReferenceComparison summarize_comparison(const std::vector<TokenComparison>& tokens,
                                         const std::vector<size_t>& group_sizes) {
  if (tokens.empty()) throw InputError("no token was scored, nothing to compare");
  ReferenceComparison r;
  r.tokens = int64_t(tokens.size());
  double kld = 0, kld2 = 0, nll = 0, nll2 = 0, dp = 0, dp2 = 0;
  int64_t same = 0;
  std::vector<double> values;
  values.reserve(tokens.size());
  size_t group = 0, left = group_sizes.empty() ? tokens.size() : group_sizes[0];
  double gnll = 0, gnll2 = 0;
  for (const TokenComparison& t : tokens) {
    kld += t.kld;
    kld2 += t.kld * t.kld;
    gnll += t.nll_ref;
    gnll2 += t.nll_ref * t.nll_ref;
    if (--left == 0) {
      nll += gnll;
      nll2 += gnll2;
      gnll = gnll2 = 0;
      ++group;
      left = group < group_sizes.size() ? group_sizes[group] : 0;
    }
    const double d = t.p_test - t.p_ref;
    dp += d;
    dp2 += d * d;
    same += t.same_top1 ? 1 : 0;
    values.push_back(t.kld);
  }
  nll += gnll;  // a last group not closed by group_sizes
  nll2 += gnll2;
  const double n = double(r.tokens);
  std::tie(r.kld_mean, r.kld_stderr) = mean_and_stderr(kld, kld2, r.tokens);
  std::sort(values.begin(), values.end());
  r.kld_median = percentile_linear(values, 0.5);
  r.kld_p99 = percentile_linear(values, 0.99);
  r.kld_p999 = percentile_linear(values, 0.999);
  r.kld_max = values.back();
  r.top1_agreement = double(same) / n;
  r.delta_p_mean = dp / n;
  r.delta_p_rms = std::sqrt(dp2 / n);
  // The reference's PPL and its error exactly as PerplexityResult reports the model under test's.
  r.nll_ref_mean = nll / n;
  r.ppl_ref = std::exp(r.nll_ref_mean);
  const double var = nll2 / n - r.nll_ref_mean * r.nll_ref_mean;
  r.ppl_ref_stderr = (var > 0 && n > 1) ? r.ppl_ref * std::sqrt(var / (n - 1)) : 0.0;
  return r;
}

namespace {
std::string fmt(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}
}  // namespace

std::vector<std::string> broken_gates(const QualityGates& g, double ppl_test, double ppl_ref,
                                      const ReferenceComparison* c) {
  std::vector<std::string> broken;
  if (g.max_kld && c && !(c->kld_mean <= *g.max_kld))
    broken.push_back("--max-kld " + fmt(*g.max_kld) + " broken: mean KLD " + fmt(c->kld_mean));
  if (g.max_ppl_ratio) {
    const double ratio = ppl_test / ppl_ref;
    if (!(ratio <= *g.max_ppl_ratio))
      broken.push_back("--max-ppl-ratio " + fmt(*g.max_ppl_ratio) + " broken: PPL ratio " + fmt(ratio) + " (" +
                       fmt(ppl_test) + " / " + fmt(ppl_ref) + ")");
  }
  if (g.min_top1 && c && !(c->top1_agreement >= *g.min_top1))
    broken.push_back("--min-top1 " + fmt(*g.min_top1) + " broken: top-1 agreement " + fmt(c->top1_agreement));
  return broken;
}

}  // namespace sq
