// sq-calibrate's job: sample calibration windows from a text, run the model, record statistics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "calib/activation_stats.h"
#include "calib/fisher.h"
#include "model/layer_stream.h"
#include "model/model_loader.h"

namespace sq {

class Tokenizer;

struct CalibrationOptions {
  std::string text_path;   ///< plain text / JSONL / .zst (formats/text_source.h), or token ids (below)
  /// text_path is a token-ids file (formats/token_ids_file.h; sq-calibrate --token-ids): the windows
  /// are cut from its ids as given (sample_token_id_windows), no tokenizer is used.
  bool token_ids = false;
  int64_t samples = 128;   ///< N windows
  int64_t seq_len = 512;   ///< L tokens per window
  uint64_t seed = 42;
  /// Also accumulate GPTQ Hessians H = (2/N)·XᵀX of every linear input (calib/hessian.h; a second
  /// pass over the same windows). Memory: 8·width² bytes per site and layer (4·dim² + dim² ... e.g.
  /// ~1.5 MB for stories260K, ~8 GB for a 1B model with hidden width 5632 and 22 layers).
  bool hessian = false;
  /// With `hessian` on a streamed model (run_calibration(const LayerStream&, …)): called with each
  /// layer's index and statistics as soon as its Hessians are stored in them, in layer order; the
  /// callee takes the Hessians away (e.g. CalibrationH5Writer::write_hessians, then clears them),
  /// so that one layer's Hessians are held at a time (a LLaMA-7B shape: 1.4 GB, not 44 GB), and
  /// the memory check counts one layer. Not called by the whole-model run.
  std::function<void(int, LayerStats&)> on_layer_hessians;
  /// Also record K/V activations with their diagonal Fisher information (∂L/∂a)² (calib/fisher.h;
  /// a forward + backward pass per window, FP32 models only) for at most `fisher_tokens` sampled
  /// tokens per layer (LayerStats::kv_fisher).
  bool fisher = false;
  int64_t fisher_tokens = kDefaultFisherTokens;  ///< cap on Fisher tokens per layer (calib/fisher.h)
  /// Progress: (phase, done, total); phase is "reading" (bytes), or "running", "hessians",
  /// "fisher" (windows), in that order; a streamed model reports "layers" (layers done, of all)
  /// instead of "running" and "hessians".
  std::function<void(const char*, int64_t, int64_t)> progress;
};

/// Samples N windows of L tokens (calib/window_sampler.h), runs `loaded.model` over them and
/// returns the statistics with their provenance (model fingerprint of `loaded.checkpoint`, text
/// SHA-256, the text's absolute canonical path (calib/calibration_text.h), N, L, seed, sqkit
/// version, `created` = now in UTC; text_format "token_ids" for options.token_ids). `tokenizer` may
/// be null with options.token_ids (it is not used then). Deterministic: the same inputs
/// give bit-identical statistics for any thread count.
/// With options.hessian the layers also carry their Hessians (LayerStats::hessians); with
/// options.fisher their K/V Fisher samples (LayerStats::kv_fisher, CalibrationData::fisher_max_tokens).
/// Throws UsageError for N < 1, L < 2 or L above the model's context, fisher_tokens < 1 with
/// fisher, or options.hessian when every layer's Hessians (8·width² bytes per input site) would
/// exceed 80% of the machine's physical memory (a LLaMA-7B shape: 44 GB); InputError for bad text or token ids (an id outside the model's vocabulary included); UnsupportedError when fisher is asked of a model whose
/// projections are not FP32.
CalibrationData run_calibration(const LoadedModel& loaded, const Tokenizer* tokenizer, const CalibrationOptions& options);

/// run_calibration on a model opened for layer-by-layer work (model/layer_stream.h). A resident
/// model runs run_calibration(model.model(), …). A streamed one (a Hugging Face directory) runs
/// layer by layer (calib/layerwise_runner.h): the windows' hidden states [tokens, dim] are kept,
/// (with options.on_layer_hessians each layer's Hessians are handed over as the layer finishes),
/// and for l = 0, 1, … layer l is read, observed (statistics and, with options.hessian, Hessians in
/// one pass, per-window collectors merged in window order), applied, and released. The statistics
/// and Hessians are bit-identical to run_calibration's on the whole model; the fingerprint hashes
/// the same inventory (every layer's tensors are read once). Memory: the globals, one layer, the
/// hidden states (4·dim bytes per token) and the statistics (with options.hessian: every layer's
/// Hessians, 8·width² bytes per site). A NaN / ±Inf in a layer's output throws NonFiniteError
/// naming the layer and the window. Throws as run_calibration; UsageError for options.fisher on a
/// streamed model (the backward pass needs every layer: open it with stream = false), and for
/// options.hessian on a streamed mixture-of-experts model (expert routing needs the whole model).
CalibrationData run_calibration(const LayerStream& model, const Tokenizer* tokenizer, const CalibrationOptions& options);

}  // namespace sq
