// Recipe step "transform: SmoothQuant smoothing" (calib/recipe.h): per layer, the smoothing factors
// of each smoothed input site (α fixed or --alpha auto) folded into the layer's tensors.
//
// Today this folds through calib/smoothquant.h, whose mappings (input norm → q,k,v; FFN norm →
// gate,up; v → o) are exact only for layers shaped like LLaMA's: no norm biases, a sequential
// residual, a gated MLP without experts (Mistral, Qwen2, Phi-3 and Gemma 3 qualify). Other
// architectures are refused in one line until their smoothing mappings (calib/smoothing_mappings.h,
// issue 16) replace the body of SmoothingStep::apply; convert them with --no-smooth meanwhile.
#pragma once

#include <memory>

#include "calib/recipe.h"

namespace sq {

/// True when calib/smoothquant.h's folds are exact for this layer structure (file comment).
bool llama_smoothing_applies(const ModelConfig& c);

/// Static (O3) activation step of `site`: Δ = calibrated absmax / 127, of the smoothed activation
/// (absmax_j / s_j) when `factors` is given.
float smoothed_static_step(const ModelConfig& c, const LayerStats& st, ActivationSite site, const std::vector<float>* factors);

class SmoothingStep {
 public:
  /// `enabled`: the scheme smooths and options.smooth is set. Checks the architecture, and for
  /// --alpha auto captures the FP32 model's activations on calibration windows.
  SmoothingStep(ConvertInputs& in, bool enabled);
  ~SmoothingStep();
  /// Smooths layer `w` in place (w.tensors, w.smoothing) and records the groups in `summary`.
  void apply(const ConvertInputs& in, LayerWork& w, ConvertSummary& summary) const;

 private:
  bool enabled_ = false;
  std::unique_ptr<class ActivationCapture> capture_;
};

}  // namespace sq
