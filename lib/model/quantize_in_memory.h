// Replace a loaded FP32 model's linears by W8A8 or W4A16 linears in memory (benchmarks, experiments).
#pragma once

#include <string>

#include "model/decoder.h"
#include "model/w4a16_linear.h"
#include "quant/int8_quantize.h"

namespace sq {

/// Replaces every DenseLinear projection of every layer (and the LM head when `include_head`) by a
/// W8A8Linear quantized from its FP32 weight (naive W8A8: no smoothing, dynamic activations only).
/// Throws UsageError for ActQuant::PerTensorStatic (it needs calibrated scales: use sq-convert).
void quantize_linears_w8a8(Decoder& model, WeightGranularity weight, ActQuant act, bool include_head);

/// Replaces every DenseLinear projection of every layer (and the LM head when `include_head`) by a
/// W4A16Linear RTN-quantized from its FP32 weight with group size `group` (32, 64 or 128), symmetric
/// or asymmetric (model/w4a16_linear.h). GPTQ changes the values, not the layout or the kernels, so
/// for speed this model is the one sq-convert --scheme w4a16 writes. Throws std::invalid_argument
/// from W4A16Linear for an unsupported group size or an odd input width.
void quantize_linears_w4a16(Decoder& model, int64_t group, bool asym, bool include_head);

/// Sets the decode activations (W4A16Linear::set_decode_activations) of every W4A16Linear of the
/// model: the layers' projections (MoE experts included) and the LM head. Returns how many run with
/// `a` (layers whose width the INT8 kernel cannot take keep FP32). Throws std::invalid_argument for
/// W4DecodeActivations::Int8 when !w4_int8_decode_supported().
int set_w4a16_decode_activations(Decoder& model, W4DecodeActivations a);

/// The tools' `--w4a16-act fp32|int8` applied to a loaded model: "fp32" leaves it as it is, "int8"
/// sets W4DecodeActivations::Int8 on every W4A16 linear. Throws UsageError when `act` is neither,
/// when this CPU or build cannot run the INT8 kernel, or when no linear of the model (`model_path`,
/// named in the message) can use it.
void apply_w4a16_act_option(Decoder& model, const std::string& act, const std::string& model_path);

}  // namespace sq
