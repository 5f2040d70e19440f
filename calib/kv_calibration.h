// Offline parameters of KV-cache formats (KVQuant, Hooper et al. 2024): per-layer nuqX codebooks
// from Fisher-weighted exact k-means (§3.3, Eq. 2), per-channel key scaling and outlier thresholds
// (§3.4, §3.7), Q-Norm (§3.5, Eq. 3), with the first sink tokens excluded (§3.6).
#pragma once

#include <string>

#include "model/llama_model.h"
#include "model/sqm_kv_cache.h"

namespace sq {

/// The KV quantization `sq-convert --kv` records for `spec`: uniform and FP32 formats need no
/// calibration (params empty); nuq formats are fitted from the Fisher data of the calibration file
/// `calib_path` (sq-calibrate --fisher). Throws UsageError when a nuq format is requested without
/// --calib, InputError when the file has no Fisher data or does not match `model`.
KVQuantization fit_kv_quantization(const KVSpec& spec, const std::string& calib_path, const LlamaModel& model);

}  // namespace sq
