// Replace a loaded FP32 model's linears by W8A8 linears in memory (benchmarks, experiments).
#pragma once

#include "model/decoder.h"
#include "quant/int8_quantize.h"

namespace sq {

/// Replaces every DenseLinear projection of every layer (and the LM head when `include_head`) by a
/// W8A8Linear quantized from its FP32 weight (naive W8A8: no smoothing, dynamic activations only).
/// Throws UsageError for ActQuant::PerTensorStatic (it needs calibrated scales: use sq-convert).
void quantize_linears_w8a8(Decoder& model, WeightGranularity weight, ActQuant act, bool include_head);

}  // namespace sq
