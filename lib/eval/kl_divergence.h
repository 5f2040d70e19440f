// Comparison of a model under test with a reference model on the same tokens (`sq-eval
// --reference-model`): per-token KL divergence KL(P_ref‖P_test), top-1 agreement and the change of
// the correct token's probability, llama.cpp `llama-perplexity --kl-divergence` statistics.
// Definitions: docs/protocols.md, "Comparison with a reference model".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sq {

/// The comparison of one scored prediction (one position's next-token distributions).
struct TokenComparison {
  double kld = 0;        ///< Σ_v p_ref(v) · (log p_ref(v) − log p_test(v)), nats
  double nll_test = 0;   ///< −log p_test(target)
  double nll_ref = 0;    ///< −log p_ref(target)
  double p_test = 0;     ///< p_test(target)
  double p_ref = 0;      ///< p_ref(target)
  bool same_top1 = false;  ///< argmax of both rows equal (ties: the lowest token id)
};

/// Compares the next-token distributions of one position, `ref` and `test` [vocab] FP32 logits,
/// for the correct token `target`. KL, p_test and p_ref come from a log-softmax taken entirely in
/// double (exponentials included); nll_test / nll_ref use the PPL's ops::log_sum_exp, so they equal
/// the perplexity code's NLLs bit for bit. Identical rows give kld exactly 0. Throws InputError when `target` is outside
/// [0, vocab).
TokenComparison compare_token_logits(const float* ref, const float* test, int vocab, int32_t target);

/// The percentile `fraction` (0…1) of `sorted` (ascending, not empty) with linear interpolation
/// between closest ranks at p = fraction·(N − 1), as llama.cpp and NumPy's default: with
/// i = ⌊p⌋, result = (1 − (p − i))·x[i] + (p − i)·x[min(i + 1, N − 1)]. Fractions ≤ 0 give the
/// minimum, ≥ 1 the maximum. Throws InputError when `sorted` is empty.
double percentile_linear(const std::vector<double>& sorted, double fraction);

/// Mean and standard error of a sample from its sum, sum of squares and size, as llama.cpp's
/// `mean_and_uncertainty`: mean = Σx/N, stderr = sqrt((Σx²/N − mean²)/(N − 1)), 0 when that
/// variance is ≤ 0 or N ≤ 10.
std::pair<double, double> mean_and_stderr(double sum, double sum2, int64_t count);

/// Summary statistics of a comparison run (docs/protocols.md).
struct ReferenceComparison {
  int64_t tokens = 0;          ///< scored predictions
  double ppl_ref = 0, ppl_ref_stderr = 0, nll_ref_mean = 0;  ///< the reference's PPL on the same predictions
  double kld_mean = 0, kld_stderr = 0;
  double kld_median = 0, kld_p99 = 0, kld_p999 = 0, kld_max = 0;
  double top1_agreement = 0;   ///< fraction of predictions with equal argmax, in [0, 1]
  double delta_p_mean = 0;     ///< mean of p_test(target) − p_ref(target)
  double delta_p_rms = 0;      ///< sqrt(mean of (p_test(target) − p_ref(target))²)
};

/// Summarizes `tokens` (in text order; sums are taken in that order, so the result does not depend
/// on threads). The reference's NLL sums are first taken over consecutive groups of `group_sizes`
/// tokens (empty: one group), then added: the grouping perplexity uses for the model under test
/// (per chunk), so a model compared with itself gets a bit-identical PPL. Throws InputError when
/// `tokens` is empty.
ReferenceComparison summarize_comparison(const std::vector<TokenComparison>& tokens,
                                         const std::vector<size_t>& group_sizes = {});

/// Quality gates of `sq-eval` (exit status 3 when one is broken). Unset bounds are not checked.
struct QualityGates {
  std::optional<double> max_kld;        ///< --max-kld: mean KLD must be ≤ this
  std::optional<double> max_ppl_ratio;  ///< --max-ppl-ratio: PPL_test / PPL_ref must be ≤ this
  std::optional<double> min_top1;       ///< --min-top1: top-1 agreement must be ≥ this
  bool any() const { return max_kld || max_ppl_ratio || min_top1; }
};

/// The gates `gates` breaks, one sentence each naming the option, the bound and the measured value
/// (empty when all hold). `comparison` may be null when only max_ppl_ratio is set; `ppl_ref` is the
/// reference PPL the ratio uses (from the reference model or --reference-ppl).
std::vector<std::string> broken_gates(const QualityGates& gates, double ppl_test, double ppl_ref,
                                      const ReferenceComparison* comparison);

}  // namespace sq
