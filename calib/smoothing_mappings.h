// SmoothQuant's smoothing as data: which tensor's output channels are divided by the factors s
// ("smooth") and which linears read that output and get their input columns multiplied by s
// ("balance"), per decoder layer — the `mappings` of llm-compressor's SmoothQuantModifier, derived
// from the model's DecoderSpec (core/model_config.h) so that every architecture the decoder runs
// is smoothed by the same code (issue 16, Design: SmoothQuant mappings).
//
// Exactness. Each mapping rewrites  Y = B(f(X))  as  Y = (B diag(s)) (f(X) / s)  where f(X) / s is
// obtained by dividing the smooth tensors along their first dimension:
//   - a norm y = n(x) ⊙ w (+ b): w / s and b / s  (RMSNorm and LayerNorm alike: n(x) does not
//     depend on w or b, so LayerNorm biases are divided too);
//   - a linear y = x Wᵀ (+ b): the rows of W and the entries of b divided by s.
// The balance linears' columns j are multiplied by s[balance_channel[j]] (identity by default).
// Between smooth and balance there may be an operation g with g(z / s) = g(z) / s elementwise:
//   - softmax(QKᵀ)·V is linear in V, so v_proj's output rows → o_proj's input columns is exact; under
//     grouped-query (and multi-query) attention o_proj's input channel (h, i) reads V channel
//     (h / group, i), so one factor per KV channel, shared by the query heads of its group
//     (balance_channel), keeps it exact — the factor is computed from the maxima over the group.
//   - a gated MLP down(act(gate(x)) ⊙ up(x)) is linear in up's output: up → down is exact (gate
//     is untouched, whatever the activation).
//   - a plain MLP down(act(up(x))) is exact only for a positively homogeneous activation,
//     act(z / s) = act(z) / s for s > 0: ReLU is (max(z/s, 0) = max(z, 0)/s), so fc1 → fc2 is
//     mapped for ReLU (OPT); GELU and SiLU are not (gelu(z/2) ≠ gelu(z)/2), so fc1 → fc2 is never
//     mapped for them. smoothing_factors clamps s to [1e-5, 1e5], so factors are always positive.
// Where smoothing sits relative to other layer parts:
//   - post-attention / post-FFN norms (Gemma 2/3) normalize the outputs of o_proj / down_proj, which
//     smoothing leaves unchanged: they neither block pre-norm smoothing nor are smoothed themselves
//     (they feed the residual stream, not a linear).
//   - QK-norm normalizes q and k, the outputs of the balance linears of the input norm: unchanged.
//   - a parallel block with one shared input norm (Falcon): attention and MLP read the same
//     normalized x, so the norm is smoothed once with one factor vector for q, k, v and the MLP's
//     input linears together; with two input norms (GPT-NeoX) each is its own mapping.
//   - mixture of experts: the router reads the FFN input like every expert's gate/up, so it is a
//     balance linear too (otherwise smoothing would change the routing).
// Not mapped (by the default derivation):
//   - up → down of the experts of a mixture: the decoder observes no per-expert hidden activation
//     (model/observer.h has one FfnHidden site per layer), so there are no statistics for them.
//   - fc1 → fc2 of a plain GELU/SiLU MLP (not exact, above).
//   - the final norm → LM head and the embedding norm (the head stays FP32 unless --quantize-head,
//     and no calibration site observes the head's input).
// Every factor computation reads the statistics of the balance linears' input site (LayerStats
// recorded by sq-calibrate; one ChannelStats per ActivationSite).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "calib/smoothquant.h"
#include "core/checkpoint.h"
#include "core/model_config.h"
#include "model/observer.h"

namespace sq {

/// One smoothing mapping of one layer: smooth tensors → balance linears.
struct SmoothingMapping {
  int layer = 0;
  /// The input site of the balance linears, whose calibrated per-channel absmax gives the
  /// activation side of Eq. 3.4 (AttnInput: input norm → q,k,v (+ FFN inputs with a shared norm);
  /// FfnInput: FFN norm → gate/up/fc1/router+experts; AttnOutput: v → o; FfnHidden: up → down).
  ActivationSite site = ActivationSite::AttnInput;
  /// Canonical tensor names divided by s along their first dimension (length C = channels()):
  /// a norm's weight and bias, or a linear's weight (rows) and bias.
  std::vector<std::string> smooth;
  /// Canonical base names (without ".weight") of the linears whose input columns are multiplied
  /// by s; every one reads the output of the smooth tensors. Their biases are untouched.
  std::vector<std::string> balance;
  /// Balance input column j reads smooth channel balance_channel[j]; empty = identity (j → j).
  /// v → o under GQA/MQA: (h, i) → (h / (n_heads / n_kv_heads), i).
  std::vector<int32_t> balance_channel;
};

/// Which mappings a smoothing pass applies: the input norms always (SmoothQuant's recipe), the
/// v → o and up → down mappings only when asked (sq-convert --smooth-vo; up → down has no flag yet).
struct SmoothingSelection {
  bool attn_output = false;  ///< v_proj rows → o_proj columns
  bool ffn_hidden = false;   ///< up_proj (fc1) rows → down_proj (fc2) columns
  bool selects(const SmoothingMapping& m) const;
};

/// The mappings of every layer derived from config.spec, in layer order and per layer in site
/// order attn_input, ffn_input, attn_output, ffn_hidden (the order sq-convert records them).
std::vector<SmoothingMapping> default_smoothing_mappings(const ModelConfig& config);

/// An architecture's own mappings, replacing the derived ones (e.g. for a structure the
/// DecoderSpec cannot express). Registered by ModelConfig::architecture; nullptr removes the
/// override. Register before any smoothing runs (the registry is guarded by a mutex, but a later
/// registration does not change mappings already handed out).
using SmoothingMappingsFn = std::vector<SmoothingMapping> (*)(const ModelConfig& config);
void register_smoothing_mappings(const std::string& architecture, SmoothingMappingsFn fn);

/// The registered mappings of config.architecture, else default_smoothing_mappings(config).
std::vector<SmoothingMapping> smoothing_mappings(const ModelConfig& config);

/// The mappings of `layer` selected by `select`, in order.
std::vector<SmoothingMapping> layer_smoothing_mappings(const ModelConfig& config, int layer, const SmoothingSelection& select);

/// The mapping of `layer` whose balance linears read `site`; throws std::invalid_argument when there
/// is none (e.g. ffn_input under a shared input norm, ffn_hidden of a GELU MLP or of experts).
SmoothingMapping smoothing_mapping_at(const ModelConfig& config, int layer, ActivationSite site);

/// Number of smooth channels C of `m` in `ck` (first dimension of its first smooth tensor).
int64_t mapping_channels(const Checkpoint& ck, const SmoothingMapping& m);

/// Eq. 3.4 factors [C] of mapping `m` from the statistics `stats` of its layer and the current
/// balance weights of `ck`: per balance column j, activation absmax and weight column absmax (over
/// every balance linear) are reduced by max onto smooth channel balance_channel[j], then
/// smoothing_factors. Throws UsageError (from smoothing_factors) when the statistics' width is not
/// the balance linears' input width, std::invalid_argument for a malformed balance_channel.
std::vector<float> mapping_factors(const Checkpoint& ck, const SmoothingMapping& m, const LayerStats& stats, float alpha);

/// The factor of every balance input column: s[balance_channel[j]] (s itself for identity).
std::vector<float> balance_column_factors(const SmoothingMapping& m, const std::vector<float>& s);

/// Folds `s` into `ck`: smooth tensors / s along dimension 0, balance columns × s (each tensor
/// touched is replaced by a private clone first — Tensor copies share storage — so checkpoints and
/// Decoders sharing the old tensors are unchanged; exact in real arithmetic, see the file comment). Throws
/// std::invalid_argument naming the tensor on a length mismatch, std::out_of_range when a tensor
/// is missing.
void apply_mapping(Checkpoint& ck, const SmoothingMapping& m, const std::vector<float>& s);

/// How one layer is smoothed.
struct SmoothingOptions {
  float alpha = 0.5f;            ///< migration strength α (Eq. 3.4)
  SmoothingSelection select;     ///< which mappings beyond the input norms
  /// When set, α of each mapping is searched on `alpha_grid` (the first minimum of this objective
  /// wins) instead of `alpha`. Called with the layer's unsmoothed tensors, the mapping and candidate
  /// factors (sq-convert --alpha auto: output MSE of the W8A8 linears; --awq: of the INT4 linears).
  std::function<double(const Checkpoint& original, const SmoothingMapping& m, const std::vector<float>& s)> alpha_objective;
  /// The α candidates of alpha_objective; empty = SmoothQuant's 0.30, 0.35, …, 0.95.
  std::vector<float> alpha_grid;
  /// The factors of a mapping for one α (from the layer's unsmoothed tensors and its statistics);
  /// empty = SmoothQuant's Eq. 3.4 (mapping_factors). AWQ: awq_mapping_factors (calib/awq.h).
  std::function<std::vector<float>(const Checkpoint& original, const SmoothingMapping& m, const LayerStats& stats, float alpha)> factors;
};

/// sq-convert's smoothing step: smooths every selected mapping of `layer` in `ck` (which holds at
/// least that layer's tensors), factors from `stats` (that layer's calibration statistics) and the
/// layer's weights before any of them was smoothed. Returns one SmoothingGroup per mapping, in
/// mapping order, with its α and factors.
std::vector<SmoothingGroup> smooth_layer(Checkpoint& ck, int layer, const LayerStats& stats, const SmoothingOptions& options);

/// smooth_layer for every layer of `ck` (stats: one LayerStats per layer).
std::vector<SmoothingGroup> smooth_checkpoint(Checkpoint& ck, const std::vector<LayerStats>& stats, const SmoothingOptions& options);

/// One line naming the mapping's tensors without the layer prefix, e.g. LLaMA's
/// "attn_input: input_layernorm.weight -> self_attn.q_proj, self_attn.k_proj, self_attn.v_proj";
/// " (grouped)" is appended when balance columns share smooth channels (v → o under GQA/MQA).
std::string describe_mapping(const SmoothingMapping& m);

}  // namespace sq
