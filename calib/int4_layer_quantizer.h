// W4A16 conversion of one decoder layer: every projection's weight to group-wise INT4
// (quant/int4_quantize.h layout) by round-to-nearest or GPTQ (calib/gptq.h), with FP16 scales.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "calib/gptq.h"
#include "core/checkpoint.h"
#include "model/observer.h"
#include "quant/int4_quantize.h"

namespace sq {

/// How sq-convert --scheme w4a16 quantizes weights.
struct Int4Options {
  int group_size = 128;  ///< g ∈ {32, 64, 128}; a ragged last group when g ∤ in (int4_quantize.h)
  bool asym = false;     ///< asymmetric with U4 zero points (else symmetric I4)
  bool gptq = false;     ///< GPTQ (needs Hessians) instead of RTN
  bool act_order = false;  ///< GPTQ: columns by descending diag(H), with static groups (gptq.h)
  double damp = 0.01;    ///< GPTQ dampening λ = damp · mean(diag H)
  /// Each group's scale (and zero point) by the importance-weighted error search of calib/gptq.h
  /// (sq-convert --observer mse, the default: full-range symmetric codes −8…7 with a signed Δ, as
  /// GGML's Q4_0) instead of the min/max rule Δ = absmax/7 (--observer minmax).
  bool scale_search = true;
  /// GGML's Q4_K layout (sq-convert --k-quant): g = 32 with a float minimum, two-level 6-bit scales
  /// per super-block of 256 (quant/q4k_layout.h), by calib/q4k_quantize.h's search (RTN only).
  bool k_quant = false;
};

/// Result of quantizing one projection.
struct Int4Projection {
  std::string name;    ///< e.g. "model.layers.0.self_attn.q_proj"
  Int4Weights weights;
  double hessian_error = 0;  ///< Σ (W−Ŵ)H(W−Ŵ)ᵀ with the H used (0 for RTN without H)
};

/// Throws UsageError for a group size other than 32/64/128 or a bad damp.
void validate_int4_options(const Int4Options& o);

/// Quantizes one linear's weight W [out, in] (`name` for messages) by RTN or GPTQ with the input
/// Hessian H (width² doubles; required with options.gptq, optional for RTN: then hessian_error).
/// `importance` [in]: the scale search's per-column weights for RTN (the calibration's Σx² of the
/// linear's input); without it RTN uses diag(H) when H is given, else uniform weights. GPTQ always
/// uses diag(H). Ignored with scale_search off.
Int4Projection quantize_linear_int4(const Tensor& W, const std::string& name, const Int4Options& o, const std::vector<double>* H,
                                    const std::vector<double>* importance = nullptr);

/// Quantizes every quantized linear of decoder layer `layer` of `ck` (canonical names,
/// core/checkpoint.h), in decoder_layer_linears order (the seven projections in kProjections order
/// for LLaMA; a MoE router is skipped: it stays FP32). Each linear uses the Hessian of its input
/// site (expert gate/up: ffn_input over all tokens; expert down: ffn_hidden pooled over experts). `hessians` [ActivationSite] are the (2/N)XᵀX of
/// each linear input (width² doubles each) — required with options.gptq, optional for RTN (then
/// hessian_error is reported). Both RTN and GPTQ use GPTQ's quantizer with FP16-rounded steps, so
/// the stored weights reproduce exactly what was optimized.
/// Throws UsageError for a bad group size; InputError naming the projection when a Hessian is
/// missing (GPTQ), has the wrong size, or is not positive definite after dampening.
std::vector<Int4Projection> quantize_layer_int4(const Checkpoint& ck, int layer, const Int4Options& options,
                                                const std::array<const std::vector<double>*, kActivationSites>& hessians);

}  // namespace sq
