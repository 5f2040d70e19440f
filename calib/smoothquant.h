// SmoothQuant (Xiao et al. 2023; ../shared/papers/smoothquant-and-streamingllm-thesis.txt ch. 3).
//
// A linear's input X [tokens, C] is divided per channel by a smoothing factor s and the linear's
// input columns are multiplied by it (Eq. 3.3: Y = (X diag(s)⁻¹)(diag(s) W)), which leaves the
// output unchanged while moving activation outliers into the weights. With migration strength α
// (Eq. 3.4):  s_j = max|X_j|^α / max|W_j|^(1−α),  max|W_j| over all linears that read X.
//
// Where the division by s is folded is data: calib/smoothing_mappings.h derives each layer's
// mappings (smooth tensors → balance linears) from the model's DecoderSpec, for every architecture.
// For LLaMA:
//   attn_input (q/k/v)  → divide the input RMSNorm weight (input_layernorm) by s
//   ffn_input (gate/up) → divide post_attention_layernorm by s
//   attn_output (o_proj), with --smooth-vo → divide v_proj's output rows (and bias) by s: the
//     attention output is softmax·V, linear in V, so channel c of V and every o_proj input column
//     reading it (one per query head of that KV group under grouped-query attention) scale exactly.
//   ffn_hidden (down_proj) → up_proj's rows (silu(gate)·up is linear in up); sq-convert does not
//     apply it (as in SmoothQuant's LLaMA recipe).
#pragma once

#include <string>
#include <vector>

#include "calib/activation_stats.h"
#include "core/checkpoint.h"
#include "model/observer.h"

namespace sq {

/// Eq. 3.4 per channel. act_absmax, weight_absmax: [C]. Maxima are clamped below at 1e-5 (zero or
/// denormal channels would otherwise give s = 0 or inf) and s is clamped to [1e-5, 1e5], as in the
/// reference implementation. Throws UsageError when alpha is outside [0, 1] or the lengths differ.
std::vector<float> smoothing_factors(const std::vector<float>& act_absmax, const std::vector<float>& weight_absmax, float alpha);

/// max_i |W[i, j]| over the rows of every [out, in] matrix in `weights` (same `in`): [in].
std::vector<float> weight_column_absmax(const std::vector<const Tensor*>& weights);

/// One smoothed input of one layer.
struct SmoothingGroup {
  int layer = 0;
  ActivationSite site = ActivationSite::AttnInput;
  float alpha = 0.5f;
  std::vector<float> factors;  ///< s [C]
};

/// The linears reading `site` in the LLaMA layer structure (canonical names without ".weight"),
/// e.g. {"...q_proj", ...}. Other structures: smoothing_mapping_at(config, layer, site).balance.
std::vector<std::string> smoothing_linears(int layer, ActivationSite site);

/// Smoothing factors of the mapping of `layer` whose balance linears read `site` (mapping_factors of
/// smoothing_mapping_at(ck.config, layer, site)), from calibrated activation maxima and the
/// checkpoint's (current) weights. For AttnOutput the factors are per KV channel
/// [n_kv_heads*head_dim]: the activation and weight maxima are taken over all query heads that read
/// the same KV channel.
std::vector<float> compute_group_factors(const Checkpoint& ck, const LayerStats& stats, int layer, ActivationSite site,
                                         float alpha);

/// Folds `factors` into the checkpoint: apply_mapping of smoothing_mapping_at(ck.config, layer,
/// site) (the tensors touched are replaced by private clones; exact in real arithmetic). Throws
/// std::invalid_argument when the architecture has no mapping for the site or on a length mismatch.
void apply_smoothing(Checkpoint& ck, int layer, ActivationSite site, const std::vector<float>& factors);

/// Per-channel activation maxima after smoothing (absmax_j / s_j), i.e. what the smoothed
/// activation's calibration statistics would be; AttnOutput factors are expanded per query head.
std::vector<float> smoothed_absmax(const ModelConfig& config, ActivationSite site, const std::vector<float>& absmax,
                                   const std::vector<float>& factors);

}  // namespace sq
