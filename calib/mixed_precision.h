// Mixed precision from measured sensitivity (`sq-convert --scheme w4a16 --bits-per-weight B` or
// `--max-kld X`): each quantized linear is stored either in the scheme's 4-bit format (the "low"
// format) or as INT8 rows run with FP32 activations (the "high" format, W8A16,
// model/w8a16_linear.h), chosen to meet a budget with the least KL divergence / the fewest bits.
//
// Sensitivity (the measurement, single_linear_kld): the mean KL divergence to the FP32 model, on
// calibration windows, of the model in which one linear alone is quantized — what
// `sq-eval --sensitivity` measures per layer and per kind, here per linear and on the calibration
// text (never the evaluation text). The assignment assumes the KLDs of different linears add
// (first-order: each linear's error perturbs the logits independently), so the model's KLD is
// estimated as the sum over linears of the chosen format's KLD; docs/results.md compares that
// estimate with the KLD measured on WikiText-2.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/decoder_linears.h"

namespace sq {

/// For every slot in `slots` (linears of `model`, any layers, any order), the mean KL divergence
/// (nats per scored position) between the FP32 model and the model in which that linear alone is
/// replaced by `replacement(slot)`, over every position but the last of each window (positions
/// 0 … n−2, each scored on the full vocabulary by compare_token_logits, eval/kl_divergence.h).
/// Cost: the FP32 model runs once over the windows, keeping every layer's input
/// (4·n_layers·dim bytes per token) and the FP32 logits (4·vocab bytes per scored position);
/// each slot then re-runs its own layer and the layers after it. `progress(done, total)` (may be
/// empty) is called after each slot. Throws std::invalid_argument for no windows or a window
/// shorter than 2 tokens, std::length_error for one longer than the model's context,
/// std::out_of_range for a token id outside the vocabulary (all before any work), InputError naming
/// the linear when its KLD is not finite, and whatever `replacement` throws.
std::vector<double> single_linear_kld(const Decoder& model, const std::vector<std::vector<int32_t>>& windows,
                                      const std::vector<LinearSlot>& slots,
                                      const std::function<std::unique_ptr<Linear>(const LinearSlot&)>& replacement,
                                      const std::function<void(int64_t, int64_t)>& progress = {});

/// The mean KL divergence (as single_linear_kld) between the FP32 model and the model in which
/// every slot in `slots` is replaced by `replacement(slot)` at once — the whole assignment's KLD,
/// interactions included. With one slot it is single_linear_kld's figure. Throws as
/// single_linear_kld.
double replaced_model_kld(const Decoder& model, const std::vector<std::vector<int32_t>>& windows, const std::vector<LinearSlot>& slots,
                          const std::function<std::unique_ptr<Linear>(const LinearSlot&)>& replacement);

/// One linear and its two candidate formats.
struct PrecisionCandidate {
  std::string name;         ///< canonical base name, e.g. "model.layers.3.mlp.down_proj"
  int64_t weights = 0;      ///< out·in
  double bits_low = 0;      ///< storage bits per weight of the low format (codes, scales, zero points)
  double bits_high = 0;     ///< storage bits per weight of the high format (> bits_low)
  double kld_low = 0;       ///< the model's KLD with this linear alone in the low format
  double kld_high = 0;      ///< the same in the high format (≤ kld_low is expected, not required)
};

/// The budget of assign_precision: exactly one of the two is positive.
struct PrecisionBudget {
  double bits_per_weight = 0;  ///< at most this many storage bits per weight over the candidates
  double max_kld = 0;          ///< an estimated KLD (Σ of the chosen formats' KLDs) at most this
};

/// The chosen format of every candidate.
struct PrecisionAssignment {
  std::vector<bool> high;        ///< [candidates]: true = the high format
  double bits_per_weight = 0;    ///< Σ bits / Σ weights of the choice
  double estimated_kld = 0;      ///< Σ over candidates of the chosen format's KLD
};

/// Greedy two-format knapsack: starting from every linear in the low format, linears move to the
/// high format in decreasing order of KLD saved per extra bit, (kld_low − kld_high) / ((bits_high −
/// bits_low)·weights), skipping any whose move saves nothing; with a bits budget every move that
/// still fits is made, with a KLD budget moves stop as soon as the estimate is within it. Ties keep
/// the candidates' order. Throws UsageError (naming --bits-per-weight / --max-kld) when the budget
/// is not exactly one positive value, when the bits budget is below the all-low cost, or when the
/// KLD budget is below the all-high estimate; std::invalid_argument for a candidate with
/// weights ≤ 0 or bits_high ≤ bits_low.
PrecisionAssignment assign_precision(const std::vector<PrecisionCandidate>& candidates, const PrecisionBudget& budget);

/// An assignment checked by measurement.
struct CheckedAssignment {
  PrecisionAssignment assignment;
  double measured_kld = 0;  ///< `measure`'s KLD of the final assignment
  int rounds = 0;           ///< assignments measured
};

/// assign_precision, then the assignment's KLD measured with every linear in its chosen format at
/// once (`measure`, e.g. replaced_model_kld). The sum of single-linear KLDs leaves out how the
/// perturbations interact, so with a KLD budget the budget given to assign_precision is scaled by
/// max_kld / measured and the assignment redone until the measured KLD is within max_kld (each
/// round moves more linears to the high format). A bits budget is measured once and kept.
/// Throws UsageError when the KLD budget is still missed with every useful move made or after 8
/// rounds, and as assign_precision.
CheckedAssignment assign_precision_checked(const std::vector<PrecisionCandidate>& candidates, const PrecisionBudget& budget,
                                           const std::function<double(const PrecisionAssignment&)>& measure);

}  // namespace sq
