// Atom W4A4 conversion of one decoder layer (Atom [Zhao et al. 2024] §4.1–4.3, §5.1): outlier
// channels chosen by calibration sum of squares and moved last (calib/channel_reorder.h), the
// remaining channels INT4 symmetric in groups, the outliers INT8 (or FP32 for the ablation), weight
// clipping, and GPTQ on the INT4 part with the outlier columns error-compensated and kept last
// (GptqOptions::tail_columns). Activations are quantized at run time (W4A4Linear), with the
// activation clipping ratio chosen here.
//
// `--clip search` (Atom §5.1 "we use a grid search to find optimal clipping factors"): per linear,
// the pair (weight ratio c_w, activation ratio c_a) from kAtomClipGrid × kAtomClipGrid minimizing
// the squared output error Σ (X·Wᵀ − W4A4(X))² on calibration rows X of that linear's input, where
// W4A4(X) is the real W4A4Linear (INT4/INT8 kernel, RTN weights with ratio c_w, dynamic activations
// with c_a); ties go to the earlier grid entry. With GPTQ the weights are then re-quantized by GPTQ
// with the chosen c_w.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "calib/activation_stats.h"
#include "core/checkpoint.h"
#include "model/observer.h"
#include "model/w4a4_linear.h"

namespace sq {

/// Clipping ratios tried by --clip search (weights and activations alike).
inline constexpr std::array<float, 7> kAtomClipGrid = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f};

/// How sq-convert --scheme w4a4-atom quantizes (docs/quantization.md).
struct AtomOptions {
  int64_t outlier_channels = -1;  ///< per linear input: −1 = automatic (atom_outlier_count), else exactly this many
  W4A4OutlierFormat outlier_format = W4A4OutlierFormat::Int8;
  int group_size = 128;           ///< INT4 group size 32, 64, 128 (ragged last group), or 0 = per channel / per token
  std::string clip = "default";   ///< "none" (ratios 1), "default" (weight_clip / act_clip) or "search"
  float weight_clip = kW4A4WeightClip;  ///< used by clip "default", (0, 1]
  float act_clip = kW4A4ActClip;        ///< used by clip "default", (0, 1]
  bool gptq = false;              ///< GPTQ on the INT4 part (needs Hessians)
  bool act_order = false;         ///< GPTQ act-order within the INT4 columns (static groups)
  double damp = 0.01;             ///< GPTQ dampening
};

/// Throws UsageError naming the option for a group size other than 0/32/64/128, a clip mode other
/// than none/default/search, a ratio outside (0, 1], an outlier count < −1, or a bad damp.
void validate_atom_options(const AtomOptions& o);

/// Calibration rows [count, width] of one linear-input site in the producer's channel order.
struct SiteRows {
  std::vector<float> data;
  int64_t width = 0;
  int64_t count() const { return width ? static_cast<int64_t>(data.size()) / width : 0; }
};

/// The clipping ratios used for one linear (and, for --clip search, the objective at the chosen
/// and at the default ratios).
struct AtomClipChoice {
  float weight = 1.0f, act = 1.0f;
  double error = 0, error_default = 0;  ///< Σ squared output error (search only)
};

/// One converted decoder layer.
struct AtomLayer {
  /// Per ActivationSite: the reorder (empty = none, no outliers). AttnInput / AttnOutput / FfnInput
  /// are gathered at run time (each linear's W4A4LinearData::order); FfnHidden is folded into the
  /// gate/up rows (down_proj's data.order is empty).
  std::array<std::vector<int32_t>, kActivationSites> orders;
  std::array<int64_t, kActivationSites> n_outlier{};  ///< outlier channels per site
  /// The quantized linears in decoder_layer_linears order (the seven projections in kProjections
  /// order for LLaMA; no MoE router, which stays FP32): (canonical base name, data with its bias).
  std::vector<std::pair<std::string, W4A4LinearData>> linears;
  std::vector<ActivationSite> sites;  ///< per linear, its input site
  std::vector<AtomClipChoice> clips;  ///< per projection
  std::vector<double> hessian_errors; ///< per projection, Σ(W−Ŵ)H(W−Ŵ)ᵀ in the reordered basis (0 without H)
};

/// Converts decoder layer `layer` of `ck` (canonical FP32 tensors in the original channel order).
///   stats      per-site sum of squares (required when any site has outliers)
///   hessians   [ActivationSite] (2/N)XᵀX in the original channel order (required with o.gptq;
///              optional otherwise, then hessian_errors are reported)
///   rows       [ActivationSite] calibration rows (required with clip "search")
/// Throws UsageError for bad options or an explicit outlier count ≥ a width; InputError naming the
/// projection when a Hessian / the statistics are missing or mis-sized or a Hessian is not positive
/// definite. Biases are kept in FP32 (W4A4LinearData::bias). Expert linears use their site's
/// statistics: gate/up the ffn_input of every token, down the ffn_hidden pooled over experts (one
/// reorder for every expert).
AtomLayer quantize_layer_atom(const Checkpoint& ck, int layer, const AtomOptions& o, const LayerStats* stats,
                              const std::array<const std::vector<double>*, kActivationSites>& hessians,
                              const std::array<const SiteRows*, kActivationSites>& rows);

}  // namespace sq
