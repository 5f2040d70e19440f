// sq-convert's job: smooth (SmoothQuant), quantize and pack a checkpoint into one .sqm file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calib/atom_layer_quantizer.h"
#include "calib/convert_spec.h"  // ConvertScheme, parse_scheme, parse_convert_flags
#include "calib/int4_layer_quantizer.h"
#include "calib/mixed_precision.h"
#include "model/sqm_kv_cache.h"
#include "calib/smoothquant.h"
#include "formats/sqm_file.h"
#include "model/layer_stream.h"
#include "model/model_loader.h"
#include "quant/int8_quantize.h"

namespace sq {

struct ConvertOptions {
  ConvertScheme scheme = ConvertScheme::W8A8;
  std::string calib_path;   ///< sq-calibrate output; required when smoothing or static activations are used
  bool smooth = true;       ///< SmoothQuant smoothing (false: naive W8A8)
  float alpha = 0.5f;       ///< migration strength α (Eq. 3.4)
  /// `--awq` (w4a16): AWQ's activation-aware per-channel scaling before the INT4 quantization
  /// (calib/awq.h): the smoothing mappings (input norms, v → o, up → down) with s = RMS^α, α per
  /// mapping searched on AWQ's grid minimizing the INT4 output error on captured activations.
  bool awq = false;
  bool alpha_auto = false;  ///< per-group grid search of α (0.30…0.95 step 0.05) minimizing output MSE
  bool smooth_vo = false;   ///< also smooth o_proj inputs, folded into v_proj rows
  /// `--rotate hadamard`: QuaRot Hadamard rotations after smoothing (calib/recipe_rotation.h): online
  /// at the down projections' input, offline per head between v and o.
  bool rotate = false;
  WeightGranularity weight = WeightGranularity::PerChannel;
  ActQuant act = ActQuant::PerToken;
  std::string preset;       ///< "O1"/"O2"/"O3" when chosen by preset (recorded in the header)
  bool quantize_head = false;
  /// With quantize_head: the token embedding's format (`--token-embedding-type`, llama-quantize's
  /// option name): "int8" (rows with one FP16-exact step, as Q8_0), "int4" (--scheme w4a16 only: the
  /// linears' group-wise INT4 format, RTN with the scale search, dequantized on lookup; a tied head
  /// then runs as that W4A16 matrix), or "auto" (int4 for w4a16 with an untied head, else int8;
  /// LinearQuantizer::embedding_format).
  std::string token_embedding_type = "auto";
  /// W8A8 with quantize_head: run the INT8 head with FP32 activations (W8A16, as the weight-only
  /// schemes do; rows with FP16-exact steps; header quantization.lm_head_activations "fp32")
  /// instead of per-token INT8 activations (`--head-activations fp32`).
  bool head_fp32_activations = false;
  /// `--calib-text`: the calibration text that --alpha auto, sequential GPTQ Hessians and Atom
  /// --clip search re-read ("" = the calibration file's text_path, resolved by the rule of
  /// calib/calibration_text.h). Either way its SHA-256 must equal the calibration file's text_sha256.
  std::string calib_text;
  int64_t alpha_windows = 8;   ///< calibration windows (of the calibration's seq_len) for --alpha auto
  int64_t alpha_max_rows = 2048;  ///< cap on captured activation rows per site (every k-th token)
  std::string tokenizer_path;  ///< tokenizer file to embed ("" = none)
  /// W4A16: group size, symmetric/asymmetric, RTN or GPTQ (calib/int4_layer_quantizer.h).
  Int4Options int4;
  /// W4A4 (Atom): outliers, group size, clipping, GPTQ (calib/atom_layer_quantizer.h). GPTQ's
  /// act_order/damp/on-off are taken from `atom`, not `int4`.
  AtomOptions atom;
  /// W4A16 mixed precision (calib/mixed_precision.h): a budget (at most one of the two positive;
  /// both 0 = every linear in the scheme's 4-bit format) and how many calibration windows (of the
  /// calibration's seq_len) measure each linear's sensitivity.
  PrecisionBudget mixed;
  int64_t mixed_windows = 2;
  /// mixed_windows was given: with mixed_sensitivity_from, the windows the assignment's KLD is
  /// checked on (else the recorded measurement's count).
  bool mixed_windows_given = false;
  /// `--sensitivity-from`: a .sqm written with a budget from the same source model and 4-bit format
  /// (group size, symmetry, observer) whose recorded sensitivities are reused instead of measured
  /// ("" = measure).
  std::string mixed_sensitivity_from;
  /// Called after each linear's sensitivity is measured: (linears done, total).
  std::function<void(int64_t, int64_t)> mixed_progress;
  /// Where GPTQ's Hessians come from: "sequential" (recomputed layer by layer from the calibration
  /// file's windows — its text, seed, N and L — so each layer sees the outputs of the already
  /// quantized layers before it, as GPTQ §4 / the reference's llama_sequential), "file" (the
  /// FP32-model Hessians that `sq-calibrate --hessian` stored), or "auto" (sequential whenever a
  /// tokenizer is given or the calibration was on token ids (`sq-calibrate --token-ids`: its windows
  /// are re-cut from the ids, no tokenizer needed), else file — never chosen by whether the text happens to be found: a
  /// missing or different text is an error, so the result does not depend on the working directory).
  std::string gptq_hessians = "auto";
  /// W8A8 without --gptq / --no-gptq: GPTQ's weights when the calibration file holds Hessians
  /// (`sq-calibrate --hessian`; they are used as they are, no windows re-run) and the weights are
  /// per channel, round-to-nearest otherwise (the default recipe, docs/quantization.md).
  bool w8a8_gptq_when_hessians = false;
  /// KV-cache format the model is meant to run with (`--kv`), recorded in the header's kv_cache
  /// object; for nuq formats with the per-layer codebooks and key scaling from
  /// calib/kv_calibration.h (written as model.layers.{l}.kv.* tensors).
  KVQuantization kv;
  SqmWriteOptions write;
  /// Called after each decoder layer is written: (layers done, total).
  std::function<void(int64_t, int64_t)> progress;
};

struct ConvertSummary {
  std::vector<SmoothingGroup> groups;  ///< every smoothed input with its α and factors
  /// W4A16: every projection's name and Hessian error (its INT4 weights are written, not kept:
  /// `weights` is empty; a LLaMA-7B shape has 3.4 GB of them).
  std::vector<Int4Projection> int4;
  std::string hessian_source;          ///< W4A16 / W4A4 GPTQ: "sequential" or "file"
  /// W4A16 mixed precision: every quantized linear's measured sensitivity and chosen format (the
  /// header's quantization.mixed_precision object); null without a budget.
  nlohmann::json mixed;
  /// W4A4 (Atom): per quantized linear (layer order, then decoder_layer_linears order) its base name, outlier
  /// channels, clipping ratios (and the --clip search objective) and Hessian-weighted error.
  struct AtomLinear {
    std::string name;
    int64_t n_outlier = 0;
    AtomClipChoice clip;
    double hessian_error = 0;
  };
  std::vector<AtomLinear> atom;
  /// W8A8 with per-tensor weights (O1–O3): the weight rounding error of every quantized linear
  /// summed, as written (per tensor) and as per-channel scales would give it, each input column
  /// weighted by the calibration's Σx² of the (smoothed) input (calibration_weighted) or by 1.
  /// sq-convert warns when per_tensor is far above per_channel. Zero for other schemes.
  struct WeightErrorComparison {
    double per_tensor = 0;
    double per_channel = 0;
    bool calibration_weighted = false;
  };
  WeightErrorComparison w8a8_weight_error;
  /// W8A8 with --gptq: per quantized linear its base name and the Hessian-weighted error
  /// Σ_r (W−Ŵ)ᵣ·H'·(W−Ŵ)ᵣᵀ of GPTQ's weights and of round-to-nearest's (same steps), H' the Hessian
  /// of the linear's smoothed and rotated input (transform_hessian).
  struct W8Gptq {
    std::string name;
    double gptq_error = 0;
    double rtn_error = 0;
  };
  std::vector<W8Gptq> w8a8_gptq;
  uint64_t file_bytes = 0;
};

/// Converts `src` (an FP32 checkpoint from load_model) into the .sqm file `out_path`, one decoder
/// layer at a time (peak memory: one layer's tensors plus, for --alpha auto, the captured
/// activations). W8A8: weights symmetric INT8 (per-channel or per-tensor, Eq. 3.1), activation mode
/// recorded for the runner, per-tensor static steps Δ = absmax/127 of the calibrated (smoothed)
/// activation for O3. LM head and embeddings stay FP32 unless `quantize_head`.
/// W4A16: every projection group-wise INT4 (RTN or GPTQ, options.int4), written as I4x2/U4x2
/// weights + F16 scales (+ U4x2 zero points); embeddings, norms and the LM head stay FP32.
/// W4A4 (Atom): every projection through quantize_layer_atom (options.atom) and written as
/// docs/formats.md describes (I4x2 codes, F16 scales, INT8/FP32 outlier columns, the activation
/// clipping ratio, one I32 reorder per gathered input site); with GPTQ (sequential) or --clip search
/// the calibration windows are run layer by layer through the already-converted W4A4 layers.
/// The calibration text (--alpha auto, sequential GPTQ, --clip search) is options.calib_text or the
/// calibration file's, found and SHA-256-verified by resolve_calibration_text; the header's
/// `calibration.text` names the file actually re-read (else the recorded text_path).
/// Every architecture (DecoderSpec) converts: the recipe steps of calib/recipe.h enumerate each
/// layer's linears from the spec (model/decoder_linears.h); biases stay FP32, a MoE router FP32.
/// SmoothQuant smoothing uses the mappings derived from the spec (calib/smoothing_mappings.h).
/// Throws UsageError (missing --calib, bad α, O3 with --quantize-head, GPTQ without --calib, bad
/// group size, bad W4A4 options, an outlier count ≥ a linear's width, calib_text without --calib or
/// when nothing re-reads the text), InputError (calibration file for another model: fingerprint
/// mismatch; layer count mismatch; GPTQ Hessians missing from the file; a Hessian not positive
/// definite; the calibration text not found or not the recorded one), OutputError.
ConvertSummary convert_model(const LoadedModel& src, const ConvertOptions& options, const std::string& out_path);

/// convert_model on a model opened for layer-by-layer work (model/layer_stream.h). A resident model
/// converts as above. A streamed one (a Hugging Face directory) reads, converts, writes and frees
/// one layer at a time, so memory is the globals, one layer and its quantizer's working set
/// (W4A16 GPTQ at a LLaMA-7B shape: the Hessians of one layer, read from the calibration file one
/// layer at a time or recomputed sequentially); the output is byte-identical to the whole-model
/// conversion. The calibration file's model fingerprint is checked after the last layer (the
/// inventory is complete only then): a mismatch throws InputError and leaves no output. Throws as
/// above, and UsageError for --alpha auto and for a nuq KV format still to be fitted (both run the
/// whole model: open it with stream = false).
ConvertSummary convert_model(const LayerStream& src, const ConvertOptions& options, const std::string& out_path);

}  // namespace sq
