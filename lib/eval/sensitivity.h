// Per-layer / per-linear-kind quantization sensitivity (`sq-eval --sensitivity`): quantize one unit
// of an FP32 model at a time (one decoder layer's linears, or one kind of linear across all layers),
// measure the KL divergence to the FP32 model on the same tokens (eval/kl_divergence.h) and restore
// it. Definitions: docs/protocols.md, "Quantization sensitivity".
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "eval/perplexity.h"
#include "model/decoder.h"

namespace sq {

/// How each unit is quantized: naive W8A8 (per-channel INT8 weights, dynamic per-token INT8
/// activations, no smoothing) or W4A16 round-to-nearest (symmetric INT4 weights, groups of 128).
enum class SensitivityScheme { W8A8, W4A16 };

/// "w8a8" / "w4a16".
const char* sensitivity_scheme_name(SensitivityScheme s);
/// Parses "w8a8" / "w4a16"; throws UsageError naming --sensitivity-scheme otherwise.
SensitivityScheme parse_sensitivity_scheme(const std::string& name);

/// One quantized unit and what it costs.
struct SensitivityRow {
  std::string unit;     ///< "layer 3" or "q" (kind across all layers)
  int layer = -1;       ///< the layer (per-layer rows), −1 for per-kind rows
  std::string kind;     ///< the kind (per-kind rows), "" for per-layer rows
  int linears = 0;      ///< linears quantized in this unit
  double kld_mean = 0, kld_p99 = 0, top1_agreement = 0;
  double ppl = 0, delta_ppl = 0;  ///< PPL with this unit quantized; minus the FP32 PPL
};

struct SensitivityResult {
  double ppl_ref = 0;                 ///< the FP32 model's PPL on the scored predictions
  int64_t tokens_scored = 0;
  std::vector<SensitivityRow> layers;  ///< sorted by kld_mean, largest first
  std::vector<SensitivityRow> kinds;   ///< sorted by kld_mean, largest first
  double seconds = 0;
};

/// Quantizes, one unit at a time, the projections of `model` (FP32 DenseLinear ones; the MoE router
/// and the LM head stay FP32) with `scheme`, evaluates it against `reference` (the same FP32 model,
/// loaded separately and never modified) under `options` (protocol, ctx, chunks; options.reference
/// is set here) and restores the FP32 linears before the next unit. Units: every layer when
/// `by_layer`, every linear kind (q, k, v, o, gate, up, down; expert linears count as gate/up/down)
/// when `by_kind`. `on_unit` (may be empty) is called after each unit with (done, total).
/// Throws UsageError when the model has no FP32 linear to quantize or the vocabularies differ, and
/// whatever evaluate_perplexity throws.
SensitivityResult evaluate_sensitivity(Decoder& model, const Decoder& reference, const std::vector<int32_t>& tokens,
                                       PerplexityOptions options, SensitivityScheme scheme, bool by_layer, bool by_kind,
                                       const std::function<void(int, int)>& on_unit = {});

}  // namespace sq
