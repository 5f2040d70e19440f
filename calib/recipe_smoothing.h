// Recipe step "transform: SmoothQuant smoothing" (calib/recipe.h): per layer, smooth_layer
// (calib/smoothing_mappings.h) folds the factors of each selected mapping of the model's
// DecoderSpec (input norm → q,k,v (+ the FFN inputs under a shared input norm); FFN norm → FFN
// inputs / router + experts; with --smooth-vo v → o) into the layer's tensors, α fixed or searched
// (--alpha auto), for every architecture. With --awq (w4a16) the same mappings carry AWQ's scaling
// (calib/awq.h): every exact mapping, its factors, its α grid and an INT4 output-error objective.
#pragma once

#include <memory>

#include "calib/recipe.h"

namespace sq {

/// Static (O3) activation step of `site`: Δ = calibrated absmax / 127, of the smoothed activation
/// (absmax_j / s_j) when `factors` — one per input channel of the site, as LayerWork::smoothing
/// holds them — is given.
float smoothed_static_step(const LayerStats& st, ActivationSite site, const std::vector<float>* factors);

class SmoothingStep {
 public:
  /// `enabled`: the scheme smooths (W8A8 with options.smooth; W4A16 with options.awq). For --alpha
  /// auto and --awq captures the FP32 model's activations on calibration windows.
  SmoothingStep(ConvertInputs& in, bool enabled);
  ~SmoothingStep();
  /// Smooths layer `w` in place (w.tensors; w.smoothing: for every input site a mapping's balance
  /// linears read, the per-input-channel factors its activations were divided by) and records
  /// the groups (one per mapping) in `summary`.
  void apply(const ConvertInputs& in, LayerWork& w, ConvertSummary& summary) const;

 private:
  bool enabled_ = false;
  std::unique_ptr<class ActivationCapture> capture_;
};

}  // namespace sq
