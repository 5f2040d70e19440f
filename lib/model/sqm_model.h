// Builds a runnable Decoder from a packed .sqm file (formats/sqm_file.h, docs/formats.md).
#pragma once

#include <memory>
#include <string>

#include "formats/sqm_file.h"
#include "model/decoder.h"

namespace sq {

class Tokenizer;

/// Parses the header's "model_config" object (ModelConfig field names) and validates it.
/// "rope_scaling" is optional: absent or null is plain RoPE (files written before RoPE scaling
/// existed), else {"type": "linear" | "llama3", "factor": F} plus, for llama3, "low_freq_factor",
/// "high_freq_factor", "original_max_position_embeddings". Throws InputError naming `source` for
/// a missing or mistyped field, UnsupportedError for an unknown scaling type or key.
/// Throws InputError naming `source` and the missing/invalid field.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);
/// "decoder" is optional: absent is the LLaMA layer structure, else the DecoderSpec with every field
/// (docs/formats.md); a missing or mistyped field is an InputError, an unknown field or enum value an
/// UnsupportedError, each naming `source` and the field.
/// The inverse of model_config_from_json ("rope_scaling" written only when not plain RoPE,
/// "decoder" only when the structure is not LLaMA's, so LLaMA headers are unchanged).
nlohmann::json model_config_to_json(const ModelConfig& c);

/// Builds the model stored in `file` (every tensor its DecoderSpec implies, model/decoder_linears.h):
///  * linears whose `<name>.weight` is I8 become W8A8Linear with `<name>.weight_scale` (F32 [out] =
///    per-channel or [1] = per-tensor), the activation mode from header.quantization.act, and for
///    static activations `<name>.input_scale` (F32 [1], the step Δ);
///  * linears whose `<name>.weight` is I4x2/U4x2 become W4A16Linear, or — when header.quantization.scheme
///    is "w4a4-atom" — W4A4Linear (Atom: INT4 codes, FP16 group scales, INT8 or FP32 outlier columns,
///    activation clipping ratio, and the input site's reorder `model.layers.N.<site>.order`);
///  * F32 / F16 / BF16 tensors are used as FP32 (F32 uncompressed: zero-copy views into the mapping).
/// model_config.n_layers is checked against the layers the tensor index holds
/// (check_layer_count) before anything is allocated per layer.
/// Throws InputError naming the file and tensor for anything missing or inconsistent.
std::unique_ptr<Decoder> build_model_from_sqm(const std::shared_ptr<SqmFile>& file);

/// Throws NonFiniteError "PATH: tensor 'NAME' (F16) holds a non-finite value (inf) at index 3
/// (element [0, 3] of shape [64, 2])" when a floating-point tensor of `file` (F32, F16 or BF16:
/// FP32 weights, norms, W8A8 / INT4 / Atom scales, static input steps, clip ratios, KV tables) has a
/// NaN or ±Inf. One vectorizable pass over those tensors' bytes (integer tensors are skipped).
void check_sqm_finite(const SqmFile& file);

/// The tokenizer embedded in `file` (header.tokenizer.tensor), or nullptr when there is none.
std::unique_ptr<Tokenizer> tokenizer_from_sqm(const SqmFile& file);

}  // namespace sq
