// Recipe step "KV quantizer" (calib/recipe.h): the KV-cache format the model is meant to run with
// (header.kv_cache) and, for the nuq formats, the per-layer codebooks and key scaling fitted by
// calib/kv_calibration.h (model.layers.{l}.kv.* tensors). Architecture-independent: keys and values
// are [tokens, n_kv_heads·head_dim] per layer whatever the positions (RoPE keys pre- or post-RoPE;
// ALiBi and learned-position models have no rotation, so both key modes store the same keys).
#pragma once

#include "calib/recipe.h"

namespace sq {

/// The KV quantization sq-convert records for `spec` (calib/kv_calibration.h fit_kv_quantization),
/// with one addition: nuq formats with uniform weighting (`fisher_weighted` false) on a calibration
/// file without Fisher data (sq-calibrate --fisher runs a backward pass that not every architecture
/// has) take their K/V rows from a forward pass of the FP32 model over the calibration's windows
/// instead (re-drawn from its token ids, or its text with the tokenizer; every k-th token, at most
/// kKVForwardRows per layer, unit weights). With Fisher data it is fit_kv_quantization unchanged.
KVQuantization fit_kv_for_conversion(const KVSpec& spec, const ConvertOptions& o, const LoadedModel& src, bool fisher_weighted);
inline constexpr int64_t kKVForwardRows = 2048;

/// Adds header["kv_cache"] and the nuq tables of `kv` to `out`; nothing for an FP32 cache.
void write_kv_quantization(SqmWriter& out, const KVQuantization& kv, nlohmann::json& header);

}  // namespace sq
