// sq-calibrate's job: sample calibration windows from a text, run the model, record statistics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "calib/activation_stats.h"
#include "model/model_loader.h"

namespace sq {

class Tokenizer;

struct CalibrationOptions {
  std::string text_path;   ///< plain text / JSONL / .zst (formats/text_source.h)
  int64_t samples = 128;   ///< N windows
  int64_t seq_len = 512;   ///< L tokens per window
  uint64_t seed = 42;
  /// Also accumulate GPTQ Hessians H = (2/N)·XᵀX of every linear input (calib/hessian.h; a second
  /// pass over the same windows). Memory: 8·width² bytes per site and layer (4·dim² + dim² ... e.g.
  /// ~1.5 MB for stories260K, ~8 GB for a 1B model with hidden width 5632 and 22 layers).
  bool hessian = false;
  /// Progress: (phase, done, total); phase is "reading" (bytes) or "running" (windows).
  std::function<void(const char*, int64_t, int64_t)> progress;
};

/// Samples N windows of L tokens (calib/window_sampler.h), runs `loaded.model` over them and
/// returns the statistics with their provenance (model fingerprint of `loaded.checkpoint`, text
/// SHA-256, N, L, seed, sqkit version, `created` = now in UTC). Deterministic: the same inputs
/// give bit-identical statistics for any thread count.
/// With options.hessian the layers also carry their Hessians (LayerStats::hessians).
/// Throws UsageError for N < 1, L < 2 or L above the model's context; InputError for bad text.
CalibrationData run_calibration(const LoadedModel& loaded, const Tokenizer& tokenizer, const CalibrationOptions& options);

}  // namespace sq
