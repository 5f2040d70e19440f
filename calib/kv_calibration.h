// Offline parameters of KV-cache formats (KVQuant, Hooper et al. 2024): per-layer nuqX codebooks
// from Fisher-weighted exact k-means (§3.3, Eq. 2), per-channel key scaling and outlier thresholds
// (§3.4, §3.7), Q-Norm (§3.5, Eq. 3), with the first sink tokens excluded (§3.6).
#pragma once

#include <string>

#include "calib/kv_fisher_samples.h"
#include "model/model_loader.h"
#include "model/sqm_kv_cache.h"

namespace sq {

/// Statistics of one fitted layer (for reports and tests).
struct NuqFitReport {
  int64_t key_values = 0, value_values = 0;      ///< normalized values the codebooks were fitted on
  int64_t key_outliers = 0, value_outliers = 0;  ///< calibration values beyond the thresholds
  double key_cost = 0, value_cost = 0;           ///< Σ F·(a − Q(a))² in the normalized domain (Eq. 2)
};

/// Fits one layer's nuq parameters from its Fisher samples (`spec` must be Nuq):
///  * calibration rows with position < spec.sink_fp16 are skipped (they stay FP16 at run time, §3.6);
///  * post-RoPE keys (ablation) are rotated at their window positions with `config`'s RoPE;
///  * per-channel keys: per channel the thresholds lo/hi are the min/max over the rows, or with
///    outliers p > 0 the p/2 and 1 − p/2 percentiles (kv_percentile); offset = (hi+lo)/2,
///    scale = (hi−lo)/2. Per-token keys and values: kv_token_scaling per row (as the runner does);
///  * normalized values a = (x − offset)/scale with |a| ≤ 1 (outliers excluded) go to
///    fit_nuq_codebook (exact weighted k-means, calib/weighted_kmeans.h) with weight F·scale²: Eq. 2's
///    raw-domain error F·(x − Q(x))² = F·scale²·(a − Q(a))² (scale per channel or per token).
///    `fisher_weighted` = false replaces F by 1 (the unweighted ablation);
///  * Q-Norm: Ĉ = (C − μ₂)·σ₁/σ₂ + μ₁ (Eq. 3), μ₁, σ₁ of the normalized values and μ₂, σ₂ of their
///    quantized values (unweighted), when spec.qnorm.
/// Throws InputError when no rows remain after skipping sinks or all Fisher weights are zero.
NuqLayerParams fit_nuq_layer(const KVSpec& spec, const KVFisherSamples& samples, const ModelConfig& config, int layer,
                             NuqFitReport* report = nullptr, bool fisher_weighted = true);

/// The KV quantization `sq-convert --kv` records for `spec`: uniform and FP32 formats need no
/// calibration (params empty); nuq formats are fitted layer by layer (fit_nuq_layer) from the Fisher
/// data of the calibration file `calib_path` (sq-calibrate --fisher). Throws UsageError when a nuq
/// format is requested without --calib; InputError when the file has no Fisher data, was recorded
/// for another model (fingerprint) or its KV width differs from the model's. `fisher_weighted`: see
/// fit_nuq_layer (sq-convert --kv-weighting uniform sets it false).
KVQuantization fit_kv_quantization(const KVSpec& spec, const std::string& calib_path, const LoadedModel& src,
                                   std::vector<NuqFitReport>* reports = nullptr, bool fisher_weighted = true);

}  // namespace sq
