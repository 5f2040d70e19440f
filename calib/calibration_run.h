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
  /// Progress: (phase, done, total); phase is "reading" (bytes) or "running" (windows).
  std::function<void(const char*, int64_t, int64_t)> progress;
};

/// Samples N windows of L tokens (calib/window_sampler.h), runs `loaded.model` over them and
/// returns the statistics with their provenance (model fingerprint of `loaded.checkpoint`, text
/// SHA-256, N, L, seed, sqkit version, `created` = now in UTC). Deterministic: the same inputs
/// give bit-identical statistics for any thread count.
/// Throws UsageError for N < 1, L < 2 or L above the model's context; InputError for bad text.
CalibrationData run_calibration(const LoadedModel& loaded, const Tokenizer& tokenizer, const CalibrationOptions& options);

}  // namespace sq
