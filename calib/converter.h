// sq-convert's job: smooth (SmoothQuant), quantize and pack a checkpoint into one .sqm file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calib/smoothquant.h"
#include "formats/sqm_file.h"
#include "model/model_loader.h"
#include "quant/int8_quantize.h"

namespace sq {

enum class ConvertScheme { F32, F16, BF16, W8A8 };
/// Parses "f32" / "f16" / "bf16" / "w8a8"; throws UsageError otherwise.
ConvertScheme parse_scheme(const std::string& s);
const char* scheme_name(ConvertScheme s);

struct ConvertOptions {
  ConvertScheme scheme = ConvertScheme::W8A8;
  std::string calib_path;   ///< sq-calibrate output; required when smoothing or static activations are used
  bool smooth = true;       ///< SmoothQuant smoothing (false: naive W8A8)
  float alpha = 0.5f;       ///< migration strength α (Eq. 3.4)
  bool alpha_auto = false;  ///< per-group grid search of α (0.30…0.95 step 0.05) minimizing output MSE
  bool smooth_vo = false;   ///< also smooth o_proj inputs, folded into v_proj rows
  WeightGranularity weight = WeightGranularity::PerChannel;
  ActQuant act = ActQuant::PerToken;
  std::string preset;       ///< "O1"/"O2"/"O3" when chosen by preset (recorded in the header)
  bool quantize_head = false;
  std::string alpha_text;   ///< text for --alpha auto (default: the calibration file's text_path)
  int64_t alpha_windows = 8;   ///< calibration windows (of the calibration's seq_len) for --alpha auto
  int64_t alpha_max_rows = 2048;  ///< cap on captured activation rows per site (every k-th token)
  std::string tokenizer_path;  ///< tokenizer file to embed ("" = none)
  SqmWriteOptions write;
  /// Called after each decoder layer is written: (layers done, total).
  std::function<void(int64_t, int64_t)> progress;
};

struct ConvertSummary {
  std::vector<SmoothingGroup> groups;  ///< every smoothed input with its α and factors
  uint64_t file_bytes = 0;
};

/// Converts `src` (an FP32 checkpoint from load_model) into the .sqm file `out_path`, one decoder
/// layer at a time (peak memory: one layer's tensors plus, for --alpha auto, the captured
/// activations). W8A8: weights symmetric INT8 (per-channel or per-tensor, Eq. 3.1), activation mode
/// recorded for the runner, per-tensor static steps Δ = absmax/127 of the calibrated (smoothed)
/// activation for O3. LM head and embeddings stay FP32 unless `quantize_head`.
/// Throws UsageError (missing --calib, bad α, O3 with --quantize-head), InputError (calibration
/// file for another model: fingerprint mismatch; layer count mismatch), OutputError.
ConvertSummary convert_model(const LoadedModel& src, const ConvertOptions& options, const std::string& out_path);

}  // namespace sq
